// Runs the reference tokenizer (@huggingface/tokenizers, pure JS) over a list
// of strings and writes their ids and the decoding of those ids.
//   node reference.cjs TOKENIZERS_CJS MODEL_DIR INPUT.json OUTPUT.json
// INPUT.json: a JSON list of strings. OUTPUT.json: {"ids": [[...], ...],
// "decoded": ["...", ...]} in the same order ("" for an empty id list, which
// the reference refuses to decode).
'use strict';
const fs = require('fs');
const path = require('path');

const [cjs, modelDir, inputPath, outputPath] = process.argv.slice(2);
if (!outputPath) {
  process.stderr.write('usage: node reference.cjs TOKENIZERS_CJS MODEL_DIR INPUT.json OUTPUT.json\n');
  process.exit(2);
}
const { Tokenizer } = require(path.resolve(cjs));
const readJson = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
const configPath = path.join(modelDir, 'tokenizer_config.json');
const config = fs.existsSync(configPath) ? readJson(configPath) : {};
const tokenizer = new Tokenizer(readJson(path.join(modelDir, 'tokenizer.json')), config);

const texts = readJson(inputPath);
const ids = [];
const decoded = [];
for (const text of texts) {
  const e = tokenizer.encode(text).ids;
  ids.push(e);
  decoded.push(e.length === 0 ? '' : tokenizer.decode(e));
}
fs.writeFileSync(outputPath, JSON.stringify({ ids, decoded }));
