// The tokenizer.json components one at a time, on small hand-made files
// whose expected ids follow from Hugging Face tokenizers' rules (split
// behaviors, Metaspace prepend schemes, added-token stripping, byte
// fallback, templates, decoders, clean-up); plus thread safety and large
// inputs on the real Qwen3 tokenizer.
#include <gtest/gtest.h>

#include <thread>

#include "nlohmann/json.hpp"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/hf_tokenizer.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// A BPE tokenizer over `tokens` (id = position) with `merges`.
json Make(const std::vector<std::string>& tokens, const json& merges) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  json j = {
      {"version", "1.0"},      {"truncation", nullptr},    {"padding", nullptr},        {"added_tokens", json::array()},
      {"normalizer", nullptr}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  return j;
}

HfTokenizer Load(const json& j, const json& config = json()) {
  auto t = HfTokenizer::FromJson(j.dump(), config.is_null() ? "" : config.dump());
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) std::abort();
  return std::move(*t);
}

json Split(const std::string& pattern, const std::string& behavior, bool invert = false, bool regex = false) {
  return {{"type", "Split"},
          {"pattern", {{regex ? "Regex" : "String", pattern}}},
          {"behavior", behavior},
          {"invert", invert}};
}

json AddedToken(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
                bool normalized = false) {
  return {{"id", id},         {"content", content},       {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

TEST(Bpe, MergesByRankLeftmostFirst) {
  // 0 a, 1 b, 2 ab, 3 bb, 4 abb: "abb": a+b (rank 1) vs b+b (rank 0) -> a, bb.
  json j = Make({"a", "b", "ab", "bb", "abb"}, {"b b", "a b", "a bb"});
  EXPECT_EQ(Load(j).Encode("abb"), (Ids{4}));
  // Equal ranks: the leftmost pair merges first: "bbb" -> bb, b.
  EXPECT_EQ(Load(j).Encode("bbb"), (Ids{3, 1}));
  // Pairs and "a b" strings are the same merges; "#version" lines are skipped.
  json pairs = Make({"a", "b", "ab", "bb", "abb"}, json::parse(R"(["#version: 0.2", ["b", "b"], "a b", ["a", "bb"]])"));
  EXPECT_EQ(Load(pairs).Encode("abbbb"), (Ids{4, 3}));
}

TEST(Bpe, IgnoreMergesTakesWholeTokens) {
  // With merges only, "abc" ends as ab + c; ignore_merges takes "abc" as is.
  json j = Make({"a", "b", "c", "ab", "abc"}, {"a b"});
  EXPECT_EQ(Load(j).Encode("abc"), (Ids{3, 2}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(Load(j).Encode("abc"), (Ids{4}));
  EXPECT_EQ(Load(j).Encode("abcab"), (Ids{3, 2, 3}));
}

TEST(Bpe, ByteFallbackUnkAndFuse) {
  std::vector<std::string> tokens = {"<unk>", "a"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
  }
  json j = Make(tokens, json::array());
  j["model"]["byte_fallback"] = true;
  j["model"]["unk_token"] = "<unk>";
  // "é" is not a token: its bytes C3 A9 are.
  EXPECT_EQ(Load(j).Encode("a\u00e9"), (Ids{1, 2 + 0xC3, 2 + 0xA9}));
  // Without byte fallback: one unk per unknown character, fused when fuse_unk.
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(Load(j).Encode("\u00e9\u00e9a\u00e9"), (Ids{0, 0, 1, 0}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(Load(j).Encode("\u00e9\u00e9a\u00e9"), (Ids{0, 1, 0}));
  // Without an unk token unknown characters are dropped.
  j["model"]["unk_token"] = nullptr;
  EXPECT_EQ(Load(j).Encode("\u00e9a"), (Ids{1}));
}

TEST(Bpe, SubwordPrefixAndSuffix) {
  // A merge joins "a" and "##b" into "ab" (the prefix of the right part goes).
  json j = Make({"a", "##b", "##c", "ab"}, json::array());
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_EQ(Load(j).Encode("abc"), (Ids{0, 1, 2}));
  j["model"]["merges"] = {"a ##b"};
  EXPECT_EQ(Load(j).Encode("abc"), (Ids{3, 2}));
  json k = Make({"a", "c</w>", "a</w>"}, json::array());
  k["model"]["end_of_word_suffix"] = "</w>";
  EXPECT_EQ(Load(k).Encode("ac"), (Ids{0, 1}));
  EXPECT_EQ(Load(k).Encode("a"), (Ids{2}));
}

TEST(Split, Behaviors) {
  // 0 a, 1 -, 2 b, 3 a-, 4 -b, 5 a-b, 6 --
  json base = Make({"a", "-", "b", "a-", "-b", "a-b", "--"}, {"a -", "a- b", "- b", "- -"});
  auto encode = [&](const json& pre, const std::string& text) {
    json j = base;
    j["pre_tokenizer"] = pre;
    return Load(j).Encode(text);
  };
  EXPECT_EQ(Load(base).Encode("a-b"), (Ids{5}));
  EXPECT_EQ(encode(Split("-", "Isolated"), "a-b"), (Ids{0, 1, 2}));
  EXPECT_EQ(encode(Split("-", "Removed"), "a-b"), (Ids{0, 2}));
  EXPECT_EQ(encode(Split("-", "MergedWithPrevious"), "a-b"), (Ids{3, 2}));
  EXPECT_EQ(encode(Split("-", "MergedWithNext"), "a-b"), (Ids{0, 4}));
  EXPECT_EQ(encode(Split("-", "Isolated"), "a--b"), (Ids{0, 1, 1, 2}));
  EXPECT_EQ(encode(Split("-", "Contiguous"), "a--b"), (Ids{0, 6, 2}));
  // invert swaps matches and the rest: Removed then keeps only the matches.
  EXPECT_EQ(encode(Split("-", "Removed", true), "a-b-"), (Ids{1, 1}));
  // Invert does not change Isolated.
  EXPECT_EQ(encode(Split("-", "Isolated", true), "a-b"), (Ids{0, 1, 2}));
  EXPECT_EQ(encode(Split("[ab]", "Isolated", false, true), "ab-"), (Ids{0, 2, 1}));
  // A Sequence applies its pre-tokenizers in turn.
  json seq = {{"type", "Sequence"}, {"pretokenizers", {Split("b", "Removed"), Split("-", "MergedWithPrevious")}}};
  EXPECT_EQ(encode(seq, "a-ba"), (Ids{3, 0}));
}

TEST(ByteLevel, PrefixSpaceAndGpt2Regex) {
  // Byte-level characters: Ġ is the space.
  json j = Make({"h", "i", "\u0120", "\u0120h", "\u0120hi", "hi", "!"}, {"\u0120 h", "\u0120h i", "h i"});
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(Load(j).Encode("hi hi!"), (Ids{5, 4, 6}));
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(Load(j).Encode("hi hi!"), (Ids{4, 4, 6}));
  EXPECT_EQ(Load(j).Encode(" hi"), (Ids{4}));
  j["pre_tokenizer"]["use_regex"] = false;
  j["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(Load(j).Encode("hi hi!"), (Ids{5, 4, 6}));
}

TEST(Metaspace, PrependSchemesAndSplit) {
  const std::string m = "\u2581";
  // 0 ▁, 1 a, 2 b, 3 ▁a, 4 ▁b, 5 <s>, 6 a▁, 7 ▁a▁b
  json j = Make({m, "a", "b", m + "a", m + "b", "<s>", "a" + m, m + "a" + m + "b"},
                {m + " a", m + " b", "a " + m, m + "a " + m + "b"});
  j["added_tokens"] = {AddedToken(5, "<s>", true)};
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(Load(j).Encode("a b"), (Ids{3, 4}));
  EXPECT_EQ(Load(j).Encode("<s>a"), (Ids{5, 3}));
  j["pre_tokenizer"]["prepend_scheme"] = "first";
  EXPECT_EQ(Load(j).Encode("a b"), (Ids{3, 4}));
  EXPECT_EQ(Load(j).Encode("<s>a"), (Ids{5, 1}));
  j["pre_tokenizer"]["prepend_scheme"] = "never";
  EXPECT_EQ(Load(j).Encode("a b"), (Ids{1, 4}));
  // Without split the whole text is one word.
  j["pre_tokenizer"]["prepend_scheme"] = "always";
  j["pre_tokenizer"]["split"] = false;
  EXPECT_EQ(Load(j).Encode("a b"), (Ids{7}));
  // Legacy files say add_prefix_space instead of prepend_scheme.
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"add_prefix_space", false}};
  EXPECT_EQ(Load(j).Encode("a b"), (Ids{1, 4}));
  // The decoder drops the replacement characters of the first token.
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}};
  EXPECT_EQ(Load(j).Decode(Ids{3, 4, 7}), "a b a b");
  j["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(Load(j).Decode(Ids{3, 4}), " a b");
}

TEST(Normalizer, UnicodeFormsPrependReplace) {
  // 0 é (NFC), 1 e, 2 U+0301, 3 fi, 4 ▁, 5 x, 6 ﬁ
  json j = Make({"\u00e9", "e", "\u0301", "fi", "\u2581", "x", "\ufb01", "f", "i"}, {"f i"});
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(Load(j).Encode("e\u0301"), (Ids{0}));
  j["normalizer"] = {{"type", "NFD"}};
  EXPECT_EQ(Load(j).Encode("\u00e9"), (Ids{1, 2}));
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(Load(j).Encode("\ufb01"), (Ids{3}));
  j["normalizer"] = {{"type", "NFKD"}};
  EXPECT_EQ(Load(j).Encode("\u00e9\ufb01"), (Ids{1, 2, 3}));
  j["normalizer"] = nullptr;
  EXPECT_EQ(Load(j).Encode("\ufb01"), (Ids{6}));
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "\u2581"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  EXPECT_EQ(Load(j).Encode("x x"), (Ids{4, 5, 4, 5}));
  EXPECT_EQ(Load(j).Encode(""), (Ids{}));
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "x"}};
  EXPECT_EQ(Load(j).Encode("e12e3"), (Ids{1, 5, 1, 5}));
}

TEST(AddedTokens, LongestLeftmostMatchAndStripping) {
  // 0 a, 1 " ", 2 <x>, 3 <x><y>, 4 <y>
  json j = Make({"a", " ", "<x>", "<x><y>", "<y>"}, json::array());
  j["added_tokens"] = {AddedToken(2, "<x>", true), AddedToken(3, "<x><y>", true), AddedToken(4, "<y>", false)};
  EXPECT_EQ(Load(j).Encode("a<x><y>a<x>a<y>"), (Ids{0, 3, 0, 2, 0, 4}));
  EXPECT_EQ(Load(j).Encode("a <x> a"), (Ids{0, 1, 2, 1, 0}));
  j["added_tokens"][0]["lstrip"] = true;
  EXPECT_EQ(Load(j).Encode("a \t <x> a"), (Ids{0, 2, 1, 0}));
  j["added_tokens"][0]["rstrip"] = true;
  EXPECT_EQ(Load(j).Encode("a  <x>\n a"), (Ids{0, 2, 0}));
  // split_special_tokens: special tokens in the text are plain text.
  json c = {{"split_special_tokens", true}};
  json k = Make({"a", "<", "x", ">", "<x>", "<y>"}, json::array());
  k["added_tokens"] = {AddedToken(4, "<x>", true), AddedToken(5, "<y>", false)};
  EXPECT_EQ(Load(k, c).Encode("<x><y>"), (Ids{1, 2, 3, 5}));
  EXPECT_EQ(Load(k).Encode("<x><y>"), (Ids{4, 5}));
}

TEST(AddedTokens, NormalizedTokensMatchNormalizedText) {
  // "x y" is normalized to "x-y" (Replace), and matched there.
  json j = Make({"x", "y", "-", "x-y"}, json::array());
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "-"}};
  j["model"]["vocab"].erase("x-y");
  j["added_tokens"] = {AddedToken(3, "x y", false, false, false, true)};
  HfTokenizer t = Load(j);
  EXPECT_EQ(t.Encode("x yx-y"), (Ids{3, 3}));
  EXPECT_EQ(t.TokenToId("x y"), 3);
}

TEST(PostProcessor, TemplateAndConfigOverride) {
  json j = Make({"<s>", "</s>", "a"}, json::array());
  j["added_tokens"] = {AddedToken(0, "<s>", true), AddedToken(1, "</s>", true)};
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}})");
  EXPECT_EQ(Load(j).Encode("aa"), (Ids{0, 2, 2, 1}));
  EXPECT_EQ(Load(j).Encode("aa", false), (Ids{2, 2}));
  EXPECT_EQ(Load(j).Encode(""), (Ids{0, 1}));
  // tokenizer_config.json's add_bos_token / add_eos_token replace it.
  json c = {
      {"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}, {"add_bos_token", true}, {"add_eos_token", false}};
  EXPECT_EQ(Load(j, c).Encode("a"), (Ids{0, 2}));
  c["add_bos_token"] = false;
  c["add_eos_token"] = true;
  EXPECT_EQ(Load(j, c).Encode("a"), (Ids{2, 1}));
  // Sequence of post-processors; ByteLevel adds nothing.
  json seq = j;
  seq["post_processor"] = {{"type", "Sequence"},
                           {"processors", {{{"type", "ByteLevel"}, {"trim_offsets", false}}, j["post_processor"]}}};
  EXPECT_EQ(Load(seq).Encode("a"), (Ids{0, 2, 1}));
}

TEST(Config, SpecialIdsAndChatTemplates) {
  json j = Make({"<s>", "</s>", "<pad>", "a"}, json::array());
  j["added_tokens"] = {AddedToken(0, "<s>", true), AddedToken(1, "</s>", true), AddedToken(2, "<pad>", false)};
  json c = {{"bos_token", "<s>"},
            {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}, {"lstrip", false}}},
            {"pad_token", "<pad>"},
            {"unk_token", nullptr},
            {"chat_template", {{{"name", "default"}, {"template", "T1"}}, {{"name", "tool_use"}, {"template", "T2"}}}},
            {"additional_special_tokens", {"<pad>"}},
            {"model_max_length", 4096}};
  HfTokenizer t = Load(j, c);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.pad_id(), 2);
  EXPECT_EQ(t.unk_id(), std::nullopt);
  EXPECT_EQ(t.chat_template(), "T1");
  EXPECT_EQ(t.chat_templates().at("tool_use"), "T2");
  EXPECT_TRUE(t.IsSpecial(2));
  EXPECT_FALSE(t.IsSpecial(3));
  EXPECT_EQ(t.vocab_size(), 4);
  EXPECT_EQ(t.IdToToken(3), "a");
  EXPECT_EQ(t.IdToToken(4), std::nullopt);
  EXPECT_EQ(t.TokenToId("</s>"), 1);
  EXPECT_EQ(t.TokenToId("b"), std::nullopt);
  EXPECT_EQ(Load(j).chat_template(), "");
  EXPECT_EQ(Load(j).bos_id(), std::nullopt);
}

TEST(Decoder, Chains) {
  std::vector<std::string> tokens = {"\u2581a", "\u2581", "b", "<s>"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
  }
  auto byte = [](int b) { return 4 + b; };
  json j = Make(tokens, json::array());
  j["added_tokens"] = {AddedToken(3, "<s>", true)};
  // Llama 2 / Mistral.
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  HfTokenizer t = Load(j);
  EXPECT_EQ(t.Decode(Ids{0, 1, 2}), "a b");
  EXPECT_EQ(t.Decode(Ids{3, 0, byte(0xE4), byte(0xB8), byte(0xAD), 2}), "<s> a\u4e2db");
  EXPECT_EQ(t.Decode(Ids{3, 0}, true), "a");
  // An invalid run of bytes gives one U+FFFD per byte (Hugging Face's rule).
  EXPECT_EQ(t.Decode(Ids{byte(0x41), byte(0xE4), byte(0xB8), 2}), "\ufffd\ufffd\ufffdb");
  // Ids no token has are skipped.
  EXPECT_EQ(t.Decode(Ids{0, 100000, -5, 2}), "ab");
  // No decoder: tokens joined by spaces.
  j["decoder"] = nullptr;
  EXPECT_EQ(Load(j).Decode(Ids{0, 2}), "\u2581a b");
  // Strip from both ends.
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "Fuse"},
      {"type": "Strip", "content": "b", "start": 2, "stop": 1}]})");
  EXPECT_EQ(Load(j).Decode(Ids{2, 2, 2, 0, 2, 2}), "b\u2581ab");
}

TEST(Decoder, ByteLevelRepairsInvalidUtf8) {
  // Ġ is the space, and U+0100..U+0143 stand for the other non-printable bytes.
  // (byte 0xAD is not printable: U+0143 stands for it.)
  json j = Make({"a", "\u0120", "\u00e4", "\u00b8", "\u0143", "\u00ff", "<|x|>", "\u4e2d"}, json::array());
  j["added_tokens"] = {AddedToken(6, "<|x|>", true)};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  HfTokenizer t = Load(j);
  EXPECT_EQ(t.Decode(Ids{0, 1, 2, 3, 4}), "a \u4e2d");
  EXPECT_EQ(t.Decode(Ids{2, 3, 0}), "\ufffda");  // one U+FFFD for the truncated sequence
  EXPECT_EQ(t.Decode(Ids{5, 0}), "\ufffda");
  EXPECT_EQ(t.Decode(Ids{6, 1, 0}), "<|x|> a");
  EXPECT_EQ(t.Decode(Ids{6, 1, 0}, true), " a");
  // A token whose characters are not all byte characters stands for itself.
  EXPECT_EQ(t.Decode(Ids{7, 0}), "\u4e2da");
}

TEST(Decoder, CleanUpTokenizationSpaces) {
  EXPECT_EQ(CleanUpTokenizationSpaces("Hello , world . Isn 't it ? I 'm , you 're ! a ' b"),
            "Hello, world. Isn 't it? I'm, you're! a'b");
  json j = Make({"a", " ", "."}, json::array());
  EXPECT_EQ(Load(j).Decode(Ids{0, 1, 2}), "a   .");  // no decoder: joined with spaces
  j["decoder"] = {{"type", "Fuse"}};
  EXPECT_EQ(Load(j).Decode(Ids{0, 1, 2}), "a .");
  EXPECT_EQ(Load(j, {{"clean_up_tokenization_spaces", true}}).Decode(Ids{0, 1, 2}), "a.");
}

TEST(Encode, InvalidUtf8IsRepaired) {
  json j = Make({"a", "\ufffd"}, json::array());
  HfTokenizer t = Load(j);
  EXPECT_EQ(t.Encode("a\xff"
                     "a\xe4\xb8"),
            (Ids{0, 1, 0, 1}));
  std::string repaired;
  AppendUtf8Lossy(
      "\xf0\x9f\x98"
      "x\xc3\xa9\xed\xa0\x80",
      &repaired);
  EXPECT_EQ(repaired, "\ufffdx\u00e9\ufffd\ufffd\ufffd");
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));
}

class QwenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = testing::ModelDir(testing::kRealTokenizers[0]);
    if (dir.empty()) return;
    auto t = HfTokenizer::LoadDir(dir);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = new HfTokenizer(std::move(*t));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(tok_, nullptr) << "the Qwen3 tokenizer did not load"; }
  static HfTokenizer* tok_;
};
HfTokenizer* QwenTest::tok_ = nullptr;

TEST_F(QwenTest, ConcurrentEncodeMatchesSerial) {
  std::vector<std::string> texts = testing::Corpus();
  for (std::string& t : testing::RandomTexts(99, 300)) texts.push_back(std::move(t));
  std::vector<Ids> expected;
  for (const std::string& t : texts) expected.push_back(tok_->Encode(t));
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 7 + static_cast<size_t>(w) * 13 + static_cast<size_t>(round)) % texts.size();
          if (tok_->Encode(texts[k]) != expected[k]) ++wrong[static_cast<size_t>(w)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST_F(QwenTest, LargeInputsRoundTrip) {
  const std::vector<std::string> texts = {std::string(1 << 20, ' '), std::string(1 << 20, 'a'),
                                          std::string(1 << 19, '\n'), [] {
                                            std::string s;
                                            for (int i = 0; i < 100000; ++i) s += "\u4e2d\u6587 \U0001F600 123 ";
                                            return s;
                                          }()};
  for (const std::string& text : texts) {
    const Ids ids = tok_->Encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok_->Decode(ids), text);
  }
}

}  // namespace
}  // namespace tandem::tokenizer
