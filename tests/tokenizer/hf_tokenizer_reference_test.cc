// Ids identical to the Hugging Face reference tokenizer (the pure-JS
// @huggingface/tokenizers, run under Node.js at test time) on the real Qwen3,
// Llama 3 and Llama 2 tokenizer files, over the checked-in corpus and
// deterministic random text; and decode(encode(x)) equal to the reference's.
// Two variants of the real files cover what they do not use themselves:
// the GPT-2 ByteLevel pre-tokenizer with add_prefix_space and added tokens
// with lstrip / rstrip / normalized (on Qwen3's vocabulary), and the
// Metaspace pre-tokenizer with prepend_scheme "first" (on Llama 2's).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/hf_tokenizer.h"
#include "worker/tokenizer/normalizer.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

enum class Variant { kAsIs, kGpt2StrippedTokens, kMetaspaceFirst };

struct Case {
  const char* name;
  testing::RealTokenizer files;
  Variant variant;
  // decode(encode(x)) == NFC(x) for every text (byte-level after an NFC
  // normalizer, no clean-up, no prefix space added).
  bool lossless_up_to_nfc;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const Case kCases[] = {
    {"qwen3", testing::kRealTokenizers[0], Variant::kAsIs, true},
    {"llama3", testing::kRealTokenizers[1], Variant::kAsIs, false},
    {"llama2", testing::kRealTokenizers[2], Variant::kAsIs, false},
    {"qwen3_gpt2_stripped_tokens", testing::kRealTokenizers[0], Variant::kGpt2StrippedTokens, false},
    {"llama2_metaspace_first", testing::kRealTokenizers[2], Variant::kMetaspaceFirst, false},
};

// Writes the variant of the files in `dir` to a temporary directory.
std::string WriteVariant(const std::string& dir, Variant variant) {
  namespace fs = std::filesystem;
  json j = json::parse(testing::ReadText(dir + "/tokenizer.json"));
  if (variant == Variant::kGpt2StrippedTokens) {
    j["pre_tokenizer"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
    for (json& t : j["added_tokens"]) {
      if (t["content"] == "<|im_start|>") t["lstrip"] = t["rstrip"] = true;
      if (t["content"] == "<|im_end|>") t["normalized"] = true;
      if (t["content"] == "</think>") t["rstrip"] = true;
    }
  } else {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  }
  const fs::path out = fs::path(::testing::TempDir()) /
                       ("tok_variant_" + std::to_string(::getpid()) + "_" + std::to_string(static_cast<int>(variant)));
  fs::create_directories(out);
  std::ofstream(out / "tokenizer.json") << j.dump();
  fs::copy_file(dir + "/tokenizer_config.json", out / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  return out.string();
}

class ReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceTest, IdsAndDecodingMatchReference) {
  std::string dir = testing::ModelDir(GetParam().files);
  ASSERT_FALSE(dir.empty());
  if (GetParam().variant != Variant::kAsIs) dir = WriteVariant(dir, GetParam().variant);
  auto tok = HfTokenizer::LoadDir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();

  std::vector<std::string> texts = testing::Corpus();
  const size_t corpus_size = texts.size();
  for (std::string& t : testing::RandomTexts(20260101, 1500)) texts.push_back(std::move(t));
  testing::ReferenceOutput ref;
  ASSERT_TRUE(testing::RunReference(dir, texts, &ref));

  auto nfc_normalizer = Normalizer::FromJson(json{{"type", "NFC"}}, "nfc");
  ASSERT_TRUE(nfc_normalizer.ok());
  int id_mismatches = 0, decode_mismatches = 0, lossy = 0;
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ids = tok->Encode(texts[i]);
    tokens += ids.size();
    const char* where = i < corpus_size ? "corpus" : "random";
    if (ids != ref.ids[i] && ++id_mismatches <= 10) {
      ADD_FAILURE() << where << " text " << i << ": " << json(texts[i]).dump()
                    << "\n  ours: " << testing::IdsToString(ids) << "\n  ref:  " << testing::IdsToString(ref.ids[i]);
    }
    const std::string decoded = tok->Decode(ref.ids[i]);
    if (decoded != ref.decoded[i] && ++decode_mismatches <= 10) {
      ADD_FAILURE() << where << " text " << i << " decodes to " << json(decoded).dump() << ", reference "
                    << json(ref.decoded[i]).dump();
    }
    if (GetParam().lossless_up_to_nfc) {
      std::string buffer;
      const std::string nfc(nfc_normalizer->Normalize(texts[i], &buffer));
      if (tok->Decode(ids) != nfc && ++lossy <= 10) {
        ADD_FAILURE() << where << " text " << i << " does not survive encode + decode";
      }
    }
  }
  EXPECT_EQ(id_mismatches, 0) << "of " << texts.size() << " texts";
  EXPECT_EQ(decode_mismatches, 0) << "of " << texts.size() << " texts";
  EXPECT_EQ(lossy, 0) << "of " << texts.size() << " texts";
  EXPECT_GT(tokens, 20000u);  // the comparison covered real work
  if (GetParam().variant != Variant::kAsIs) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Real, ReferenceTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::tokenizer
