// MB/s of the pure-JS Hugging Face tokenizer (@huggingface/tokenizers) on
// the documents bench_tokenizer --write-docs saved: the same input, the same
// best-of-N timing, by wall time and by the process's CPU time.
//   node bench/tokenizer/js_reference_bench.cjs TOKENIZERS_CJS MODEL_DIR DOCS.json [REPEAT]
'use strict';
const fs = require('fs');
const path = require('path');

const [cjs, modelDir, docsPath, repeatArg] = process.argv.slice(2);
if (!docsPath) {
  process.stderr.write('usage: node js_reference_bench.cjs TOKENIZERS_CJS MODEL_DIR DOCS.json [REPEAT]\n');
  process.exit(2);
}
const repeat = Number(repeatArg || 3);
const { Tokenizer } = require(path.resolve(cjs));
const readJson = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
let t0 = process.hrtime.bigint();
const configPath = path.join(modelDir, 'tokenizer_config.json');
const tokenizer = new Tokenizer(readJson(path.join(modelDir, 'tokenizer.json')),
                                fs.existsSync(configPath) ? readJson(configPath) : {});
const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
const docs = readJson(docsPath);
let bytes = 0;
for (const d of docs) bytes += Buffer.byteLength(d, 'utf8');
let best = Infinity;
let bestCpu = Infinity;
let tokens = 0;
const cpuSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};
for (let r = 0; r < repeat; ++r) {
  tokens = 0;
  t0 = process.hrtime.bigint();
  const c = cpuSeconds();
  for (const d of docs) tokens += tokenizer.encode(d).ids.length;
  bestCpu = Math.min(bestCpu, cpuSeconds() - c);
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(`reference ${modelDir}\n${docs.length} documents, ${(bytes / 1e6).toFixed(2)} MB, ${tokens} tokens`);
console.log(`load ${loadS.toFixed(2)} s; encode best of ${repeat}: ${best.toFixed(3)} s = ` +
            `${(bytes / 1e6 / best).toFixed(2)} MB/s, ${(tokens / 1e6 / best).toFixed(3)} M tokens/s (node ${process.version})`);
console.log(`by CPU time: ${bestCpu.toFixed(3)} s = ${(bytes / 1e6 / bestCpu).toFixed(2)} MB/s`);
