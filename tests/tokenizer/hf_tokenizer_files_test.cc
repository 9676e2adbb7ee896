// Bad and hostile tokenizer.json / tokenizer_config.json files: each gives an
// error that says what is wrong and where (its JSON path), never a crash;
// anything outside what the tokenizer implements is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/hf_tokenizer.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

// A small valid byte-level-free BPE tokenizer: characters a, b, c, -, " "
// and the merges a+b, ab+c.
json Base() {
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 7, "content": "<s>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
              "continuing_subword_prefix": null, "end_of_word_suffix": null,
              "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "-": 3, " ": 4, "ab": 5, "abc": 6, "<s>": 7},
              "merges": ["a b", ["ab", "c"]]}
  })");
}

// The error message of loading j (with config c), or "OK".
std::string Error(const json& j, const json& c = json()) {
  auto t = HfTokenizer::FromJson(j.dump(), c.is_null() ? "" : c.dump());
  return t.ok() ? "OK" : std::string(t.status().message());
}

#define EXPECT_ERROR(expr, text) EXPECT_PRED_FORMAT2(::testing::IsSubstring, text, expr)

TEST(TokenizerFiles, BaseLoads) {
  auto t = HfTokenizer::FromJson(Base().dump());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Encode("abc-ab"), (std::vector<int32_t>{6, 3, 5}));
}

TEST(TokenizerFiles, NotJson) {
  const std::string full = Base().dump();
  for (size_t cut : {size_t{0}, size_t{1}, full.size() / 3, full.size() - 1}) {
    auto t = HfTokenizer::FromJson(full.substr(0, cut));
    ASSERT_FALSE(t.ok());
    EXPECT_ERROR(std::string(t.status().message()), "tokenizer.json: not valid JSON");
  }
  EXPECT_ERROR(Error(json::array()), "(top level): expected an object, got an array");
  EXPECT_ERROR(Error(json(3)), "expected an object");
  auto t = HfTokenizer::FromJson(Base().dump(), "{\"bos_token\": ");
  ASSERT_FALSE(t.ok());
  EXPECT_ERROR(std::string(t.status().message()), "tokenizer_config.json: not valid JSON");
}

TEST(TokenizerFiles, RealFileTruncated) {
  const std::string dir = testing::ModelDir(testing::kRealTokenizers[2]);
  ASSERT_FALSE(dir.empty());
  const std::string full = testing::ReadText(dir + "/tokenizer.json");
  auto t = HfTokenizer::FromJson(full.substr(0, full.size() / 2));
  ASSERT_FALSE(t.ok());
  EXPECT_ERROR(std::string(t.status().message()), "not valid JSON");
}

TEST(TokenizerFiles, WrongTypes) {
  json j = Base();
  j["model"]["vocab"] = json::array();
  EXPECT_ERROR(Error(j), "model.vocab: expected an object, got an array");
  j = Base();
  j["model"]["vocab"]["a"] = "0";
  EXPECT_ERROR(Error(j), "model.vocab[\"a\"]: expected an integer, got a string");
  j = Base();
  j["model"]["merges"] = json::object();
  EXPECT_ERROR(Error(j), "model.merges: expected an array, got an object");
  j = Base();
  j["model"]["merges"][1] = 5;
  EXPECT_ERROR(Error(j), "model.merges[1]: expected \"a b\" or [\"a\", \"b\"], got an integer");
  j = Base();
  j["model"]["merges"][0] = "a  b";
  EXPECT_ERROR(Error(j), "model.merges[0]: \"a  b\" is not two tokens separated by one space");
  j = Base();
  j["model"]["byte_fallback"] = "yes";
  EXPECT_ERROR(Error(j), "model.byte_fallback: expected a boolean, got a string");
  j = Base();
  j["added_tokens"] = json::object();
  EXPECT_ERROR(Error(j), "added_tokens: expected an array, got an object");
  j = Base();
  j["added_tokens"][0]["id"] = "7";
  EXPECT_ERROR(Error(j), "added_tokens[0].id: expected an integer, got a string");
  j = Base();
  j["normalizer"] = {{"type", 3}};
  EXPECT_ERROR(Error(j), "normalizer.type: expected a string, got an integer");
  j = Base();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", "x"}};
  EXPECT_ERROR(Error(j), "pre_tokenizer.pretokenizers: expected an array, got a string");
  j = Base();
  j["pre_tokenizer"] = {{"type", "Split"}, {"behavior", "Isolated"}};
  EXPECT_ERROR(Error(j), "pre_tokenizer.pattern is missing");
  j = Base();
  j["pre_tokenizer"] = json::parse(
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(a"},
          "behavior": "Isolated", "invert": false}]})");
  EXPECT_ERROR(Error(j), "pre_tokenizer.pretokenizers[0].pattern.Regex: regex does not compile");
  j = Base();
  j["pre_tokenizer"] =
      json::parse(R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false})");
  EXPECT_ERROR(Error(j), "pre_tokenizer.behavior \"Sideways\" is not supported");
  j = Base();
  j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  EXPECT_ERROR(Error(j), "decoder.content: expected exactly one character");
  j = Base();
  j["model"].erase("vocab");
  EXPECT_ERROR(Error(j), "model.vocab is missing");
  j = Base();
  j.erase("model");
  EXPECT_ERROR(Error(j), "tokenizer.json: model is missing");
}

TEST(TokenizerFiles, BadIds) {
  json j = Base();
  j["model"]["vocab"]["a"] = -1;
  EXPECT_ERROR(Error(j), "model.vocab[\"a\"]: -1 is out of range [0, 16777215]");
  j = Base();
  j["model"]["vocab"]["a"] = 1e30;
  EXPECT_ERROR(Error(j), "model.vocab[\"a\"]: expected an integer, got a number");
  j = Base();
  j["model"]["vocab"]["a"] = 18446744073709551615ULL;
  EXPECT_ERROR(Error(j), "model.vocab[\"a\"]: 18446744073709551615 is out of range");
  j = Base();
  j["model"]["vocab"]["a"] = 16777215;
  EXPECT_ERROR(Error(j), "model.vocab: ids go up to 16777215 but there are only 8 tokens");
  j = Base();
  j["added_tokens"][0]["id"] = 16000000;
  EXPECT_ERROR(Error(j), "added_tokens[0]: \"<s>\" has id 7 in model.vocab, not 16000000");
  j = Base();
  j["model"]["vocab"].erase("<s>");
  j["added_tokens"][0]["id"] = 16000000;
  EXPECT_ERROR(Error(j), "added_tokens: ids go up to 16000000 but there are only 8 tokens");
  j = Base();
  j["added_tokens"][0]["id"] = 2;
  EXPECT_ERROR(Error(j), "added_tokens[0]: \"<s>\" has id 7 in model.vocab, not 2");
  j = Base();
  j["model"]["vocab"].erase("<s>");
  j["added_tokens"][0]["id"] = 2;
  EXPECT_ERROR(Error(j), "added_tokens[0]: id 2 is \"c\" in model.vocab, not \"<s>\"");
  j = Base();
  j["added_tokens"].push_back(j["added_tokens"][0]);
  j["added_tokens"][1]["content"] = "<t>";
  EXPECT_ERROR(Error(j), "added_tokens[1]: id 7 is already \"<s>\"");
  j = Base();
  j["added_tokens"].push_back(j["added_tokens"][0]);
  j["added_tokens"][1]["id"] = 8;
  EXPECT_ERROR(Error(j), "added_tokens[1]: \"<s>\" is listed twice");
  j = Base();
  j["added_tokens"][0]["content"] = "";
  EXPECT_ERROR(Error(j), "added_tokens[0].content is empty");
}

TEST(TokenizerFiles, DuplicateVocabulary) {
  // The same token twice: only visible in the text, not in a parsed object.
  std::string text = Base().dump();
  const std::string key = "\"abc\":6";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"abc\":6,\"abc\":9");
  auto t = HfTokenizer::FromJson(text);
  ASSERT_FALSE(t.ok());
  EXPECT_ERROR(std::string(t.status().message()), "duplicate key \"abc\" in model.vocab");
  json j = Base();
  j["model"]["vocab"]["abc"] = 5;
  EXPECT_ERROR(Error(j), "model.vocab: \"ab\" and \"abc\" both have id 5");
}

TEST(TokenizerFiles, DeepNestingIsRefused) {
  // Normalizers nest (Sequence of Sequence ...) and load recursively: a
  // hostile file nested 50000 deep overflowed the stack.
  std::string text = Base().dump();
  const std::string key = "\"normalizer\":null";
  ASSERT_NE(text.find(key), std::string::npos);
  std::string deep;
  for (int i = 0; i < 50000; ++i) deep += "{\"type\":\"Sequence\",\"normalizers\":[";
  deep += "{\"type\":\"Lowercase\"}";
  for (int i = 0; i < 50000; ++i) deep += "]}";
  text.replace(text.find(key), key.size(), "\"normalizer\":" + deep);
  auto t = HfTokenizer::FromJson(text);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "tokenizer.json: nested deeper than 64 levels");
  auto c = HfTokenizer::FromJson(Base().dump(), "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "tokenizer_config.json: nested deeper than 64 levels");
}

TEST(TokenizerFiles, MergesNamingUnknownTokens) {
  json j = Base();
  j["model"]["merges"][0] = "a x";
  EXPECT_ERROR(Error(j), "model.merges[0]: \"x\" is not in model.vocab");
  j = Base();
  j["model"]["merges"][1] = json::array({"q", "c"});
  EXPECT_ERROR(Error(j), "model.merges[1]: \"q\" is not in model.vocab");
  j = Base();
  j["model"]["merges"].push_back("b c");
  EXPECT_ERROR(Error(j), "model.merges[2]: the merged token \"bc\" is not in model.vocab");
  j = Base();
  j["model"]["unk_token"] = "<unk>";
  EXPECT_ERROR(Error(j), "model.unk_token \"<unk>\" is not in model.vocab");
}

TEST(TokenizerFiles, UnsupportedComponentsAreRefusedByName) {
  json j = Base();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_ERROR(Error(j), "normalizer.type \"BertNormalizer\" is not supported (supported: NFC");
  j = Base();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}};
  EXPECT_ERROR(Error(j), "normalizer.normalizers[0].type \"Lowercase\" is not supported");
  j = Base();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_ERROR(Error(j), "pre_tokenizer.type \"Whitespace\" is not supported");
  j = Base();
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_ERROR(Error(j), "pre_tokenizer.type \"Digits\" is not supported");
  j = Base();
  j["model"]["type"] = "WordPiece";
  EXPECT_ERROR(Error(j), "model.type \"WordPiece\" is not supported (supported: BPE)");
  j = Base();
  j["model"]["type"] = "Unigram";
  EXPECT_ERROR(Error(j), "model.type \"Unigram\" is not supported");
  j = Base();
  j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}};
  EXPECT_ERROR(Error(j), "decoder.type \"WordPiece\" is not supported");
  j = Base();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  EXPECT_ERROR(Error(j), "post_processor.type \"RobertaProcessing\" is not supported");
  j = Base();
  j["truncation"] = {{"max_length", 512}};
  EXPECT_ERROR(Error(j), "truncation is set: it is not supported");
  j = Base();
  j["padding"] = {{"strategy", "BatchLongest"}};
  EXPECT_ERROR(Error(j), "padding is set: it is not supported");
  j = Base();
  j["extra"] = 1;
  EXPECT_ERROR(Error(j), "tokenizer.json: extra is not supported (unknown field)");
  j = Base();
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"colour", "red"}};
  EXPECT_ERROR(Error(j), "decoder.colour is not supported (unknown field)");
  j = Base();
  j["model"]["dropout"] = 0.1;
  EXPECT_ERROR(Error(j), "model.dropout 0.1 is not supported");
  j = Base();
  j["added_tokens"][0]["single_word"] = true;
  EXPECT_ERROR(Error(j), "added_tokens[0].single_word true is not supported");
  j = Base();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "pair": [], "special_tokens": {}})");
  EXPECT_ERROR(Error(j), "post_processor.single[1]: the single template can only hold sequence A");
  j = Base();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<cls>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {}})");
  EXPECT_ERROR(Error(j), "post_processor.single[0]: \"<cls>\" is not in post_processor.special_tokens");
  j = Base();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [99], "tokens": ["<s>"]}}})");
  EXPECT_ERROR(Error(j), "post_processor.special_tokens.<s>.ids[0]: no token has id 99");
}

TEST(TokenizerFiles, BadConfig) {
  EXPECT_ERROR(Error(Base(), {{"eos_token", "</s>"}}),
               "tokenizer_config.json: eos_token \"</s>\" is not a token of tokenizer.json");
  EXPECT_ERROR(Error(Base(), {{"bos_token", 3}}),
               "tokenizer_config.json: bos_token: expected a string, an object with \"content\"");
  EXPECT_ERROR(Error(Base(), {{"add_bos_token", true}}),
               "tokenizer_config.json: add_bos_token is true but bos_token is not set");
  EXPECT_ERROR(Error(Base(), {{"add_bos_token", "yes"}}),
               "tokenizer_config.json: add_bos_token: expected a boolean, got a string");
  EXPECT_ERROR(Error(Base(), {{"chat_template", 5}}),
               "tokenizer_config.json: chat_template: expected a string or a list");
  EXPECT_ERROR(Error(Base(), {{"additional_special_tokens", {"<x>"}}}),
               "additional_special_tokens[0] \"<x>\" is not a token of tokenizer.json");
  EXPECT_ERROR(Error(Base(), {{"added_tokens_decoder", {{"7", {{"content", "<t>"}}}}}}),
               "added_tokens_decoder.7: \"<t>\" does not match tokenizer.json (id 7 is \"<s>\")");
  EXPECT_ERROR(Error(Base(), {{"added_tokens_decoder", {{"9", {{"content", "<t>"}}}}}}), "(id 9 is unused)");
  EXPECT_ERROR(Error(Base(), json::array()), "tokenizer_config.json: (top level): expected an object");
}

TEST(TokenizerFiles, LoadDirErrors) {
  namespace fs = std::filesystem;
  auto missing = HfTokenizer::LoadDir("/nonexistent/tokenizer-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_ERROR(std::string(missing.status().message()), "/nonexistent/tokenizer-dir does not exist");
  const fs::path dir = fs::path(::testing::TempDir()) / ("tok_files_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto empty = HfTokenizer::LoadDir(dir.string());
  ASSERT_FALSE(empty.ok());
  EXPECT_ERROR(std::string(empty.status().message()), "cannot read " + (dir / "tokenizer.json").string());
  std::ofstream(dir / "tokenizer.json") << Base().dump();
  std::ofstream(dir / "tokenizer_config.json") << "{\"eos_token\": {\"content\": \"<s>\"}}";
  std::ofstream(dir / "chat_template.jinja") << "{{ messages }}";
  auto ok = HfTokenizer::LoadDir(dir.string());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->eos_id(), 7);
  EXPECT_EQ(ok->chat_template(), "{{ messages }}");
  std::ofstream(dir / "tokenizer_config.json") << "{\"eos_token\": \"<none>\"}";
  auto bad = HfTokenizer::LoadDir(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_ERROR(std::string(bad.status().message()), dir.string() + ": tokenizer_config.json: eos_token \"<none>\"");
  fs::remove_all(dir);
}

// Random damage to a valid file (flipped, deleted and inserted bytes) never
// crashes loading; whatever loads still encodes and decodes.
TEST(TokenizerFiles, DamagedFilesNeverCrash) {
  json j = Base();
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "-"}]})");
  j["pre_tokenizer"] = json::parse(R"j({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\s+(?!\\S)"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})j");
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  const std::string text = j.dump();
  testing::Rng rng(7);
  const std::string alphabet = "{}[]\":,0123456789-eE.tfnul \\abc<>";
  int loaded = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string damaged = text;
    const size_t edits = 1 + rng.Below(4);
    for (size_t e = 0; e < edits && !damaged.empty(); ++e) {
      const size_t pos = rng.Below(damaged.size());
      switch (rng.Below(3)) {
        case 0:
          damaged[pos] = alphabet[rng.Below(alphabet.size())];
          break;
        case 1:
          damaged.erase(pos, 1 + rng.Below(8));
          break;
        default:
          damaged.insert(pos, 1, alphabet[rng.Below(alphabet.size())]);
          break;
      }
    }
    auto t = HfTokenizer::FromJson(damaged);
    if (!t.ok()) {
      EXPECT_FALSE(t.status().message().empty());
      continue;
    }
    ++loaded;
    const std::vector<int32_t> ids = t->Encode("abc ab-c <s>ca\xff");
    (void)t->Decode(ids);
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace tandem::tokenizer
