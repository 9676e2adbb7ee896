// Safetensors reading/writing, model directories, and every bad-file case.
#include <gtest/gtest.h>

#include <unistd.h>

#include <limits>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/file_util.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tandem_st_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& f) const { return (dir_ / f).string(); }

  // Writes a raw safetensors file: header JSON text + data bytes.
  void WriteRaw(const std::string& path, const std::string& header, const std::string& data, int64_t claimed_len = -1) {
    std::string out(8, '\0');
    const uint64_t n = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out += header;
    out += data;
    std::ofstream(path, std::ios::binary) << out;
  }

  ModelConfig TinyConfig(bool tied = false, bool qwen = false) {
    json j = {{"model_type", qwen ? "qwen2" : "llama"},
              {"vocab_size", 37},
              {"hidden_size", 16},
              {"intermediate_size", 24},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"max_position_embeddings", 64},
              {"tie_word_embeddings", tied}};
    auto c = ParseConfigJson(j.dump());
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, Conversions) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(Bf16ToF32(0xc2f7)), 0xc2f7);
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_EQ(F16ToF32(0x8000), -0.0f);
  // Round to nearest even.
  float f;
  uint32_t bits = 0x3f808000;  // exactly half way between 0x3f80 and 0x3f81
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(F32ToBf16(f), 0x3f80);
  bits = 0x3f818000;
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(F32ToBf16(f), 0x3f82);
}

TEST_F(SafetensorsTest, ModelDirRoundTripExact) {
  for (bool tied : {false, true}) {
    for (bool qwen : {false, true}) {
      ModelConfig c = TinyConfig(tied, qwen);
      Model m(c, nullptr);
      std::vector<float> p(m.layout().total_floats());
      m.InitParams(7, p.data());
      // Make biases and norms non-trivial too.
      std::mt19937 rng(1);
      std::normal_distribution<float> nd;
      for (const auto& t : m.layout().tensors()) {
        if (t.kind != TensorView::Kind::kMatrix) {
          for (size_t i = 0; i < t.numel; ++i) p[t.offset + i] = nd(rng);
        }
      }
      const std::string d = P("m");
      CharTokenizer tok = CharTokenizer::Default();
      ASSERT_TRUE(SaveModelDir(d, c, p.data(), nullptr).ok());
      auto loaded = LoadModelDir(d);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->params.size(), p.size());
      EXPECT_EQ(0, std::memcmp(loaded->params.data(), p.data(), p.size() * 4)) << "tied=" << tied << " qwen=" << qwen;
      EXPECT_EQ(ToConfigJson(loaded->config), ToConfigJson(c));
      EXPECT_FALSE(loaded->tokenizer.has_value());
      fs::remove_all(d);
    }
  }
}

TEST_F(SafetensorsTest, Bf16SaveAndF16Load) {
  ModelConfig c = TinyConfig();
  Model m(c, nullptr);
  std::vector<float> p(m.layout().total_floats());
  m.InitParams(3, p.data());
  ASSERT_TRUE(SaveModelDir(P("bf"), c, p.data(), nullptr, {.dtype = StDtype::kBF16}).ok());
  auto loaded = LoadModelDir(P("bf"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(loaded->params[i], Bf16ToF32(F32ToBf16(p[i]))) << i;
  }
  // A hand-written F16 + F64 file (as other tools write them).
  const ParamLayout& l = m.layout();
  json h = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  std::vector<float> expect(l.total_floats(), 0.f);
  int k = 0;
  for (const auto& t : l.tensors()) {
    const bool f64 = (k++ % 2) == 1;
    const size_t begin = data.size();
    for (size_t i = 0; i < t.numel; ++i) {
      if (f64) {
        const double v = 0.001 * static_cast<double>(i % 97) - 0.03;
        data.append(reinterpret_cast<const char*>(&v), 8);
        expect[t.offset + i] = static_cast<float>(v);
      } else {
        const uint16_t v = static_cast<uint16_t>(0x3000 + (i % 2000));  // positive halves
        data.append(reinterpret_cast<const char*>(&v), 2);
        expect[t.offset + i] = F16ToF32(v);
      }
    }
    h[t.name] = {{"dtype", f64 ? "F64" : "F16"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  fs::create_directories(P("f16"));
  WriteRaw(P("f16/model.safetensors"), h.dump(), data);
  std::ofstream(P("f16/config.json")) << ToConfigJson(c);
  auto l16 = LoadModelDir(P("f16"));
  ASSERT_TRUE(l16.ok()) << l16.status();
  EXPECT_EQ(0, std::memcmp(l16->params.data(), expect.data(), expect.size() * 4));
}

TEST_F(SafetensorsTest, ShardedIndex) {
  ModelConfig c = TinyConfig();
  Model m(c, nullptr);
  std::vector<float> p(m.layout().total_floats());
  m.InitParams(5, p.data());
  std::vector<StTensorToWrite> a, b;
  json wm;
  int k = 0;
  for (const auto& t : m.layout().tensors()) {
    const bool first = (k++ % 2) == 0;
    (first ? a : b).push_back({t.name, t.shape, p.data() + t.offset});
    wm[t.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  fs::create_directories(P("sh"));
  ASSERT_TRUE(WriteSafetensors(P("sh/model-00001-of-00002.safetensors"), a, {}).ok());
  ASSERT_TRUE(WriteSafetensors(P("sh/model-00002-of-00002.safetensors"), b, {}).ok());
  std::ofstream(P("sh/model.safetensors.index.json")) << json{{"metadata", json::object()}, {"weight_map", wm}}.dump();
  std::ofstream(P("sh/config.json")) << ToConfigJson(c);
  auto loaded = LoadModelDir(P("sh"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(0, std::memcmp(loaded->params.data(), p.data(), p.size() * 4));
}

// Random values in every tensor (norms and biases too).
std::vector<float> RandomParams(const ParamLayout& l, uint64_t seed) {
  std::vector<float> p(l.total_floats(), 0.f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (const auto& t : l.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) p[t.offset + i] = nd(rng);
  }
  return p;
}

json ReadJson(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? json::parse(*text) : json();
}

// Above max_shard_bytes the weights are split as HF's save_pretrained
// splits them; the directory loads back bit for bit; a later save into the
// same directory removes the weight files it does not use.
TEST_F(SafetensorsTest, ExportShardsLikeHf) {
  json cj = {{"model_type", "qwen3"},    {"vocab_size", 37},       {"hidden_size", 16},
             {"intermediate_size", 24},  {"num_hidden_layers", 3}, {"num_attention_heads", 4},
             {"num_key_value_heads", 2}, {"head_dim", 6},          {"tie_word_embeddings", false},
             {"bos_token_id", 1},        {"eos_token_id", {2, 3}}, {"pad_token_id", 0}};
  auto parsed = ParseConfigJson(cj.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ModelConfig c = *parsed;
  const ParamLayout l(c);
  const std::vector<float> p = RandomParams(l, 9);
  const std::string d = P("export");
  const uint64_t limit = 2000;  // bytes: 3-5 tensors a shard, the embedding alone
  ASSERT_TRUE(SaveModelDir(d, c, p.data(), nullptr, {.max_shard_bytes = limit}).ok());

  EXPECT_FALSE(fs::exists(d + "/model.safetensors"));
  const json index = ReadJson(d + "/model.safetensors.index.json");
  uint64_t total = 0;
  for (const auto& t : l.tensors()) total += t.numel * 4;
  EXPECT_EQ(index["metadata"]["total_size"], total);
  const json& wm = index["weight_map"];
  EXPECT_EQ(wm.size(), l.tensors().size());
  std::set<std::string> files;
  for (auto it = wm.begin(); it != wm.end(); ++it) files.insert(it.value().get<std::string>());
  const size_t n = files.size();
  ASSERT_GE(n, 3u);
  size_t i = 0;
  std::string previous_last;
  for (const std::string& f : files) {
    char want[64];
    std::snprintf(want, sizeof(want), "model-%05zu-of-%05zu.safetensors", ++i, n);
    EXPECT_EQ(f, want);
    auto st = SafetensorsFile::Open(d + "/" + f);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->metadata().at("format"), "pt");
    uint64_t bytes = 0;
    for (const auto& [name, info] : st->tensors()) {
      EXPECT_EQ(wm[name], f) << name;
      bytes += info.end - info.begin;
    }
    EXPECT_TRUE(bytes <= limit || st->tensors().size() == 1) << f << ": " << bytes << " bytes";
  }
  // Layout order: the embedding starts the first shard, the head ends the last.
  EXPECT_EQ(wm["model.embed_tokens.weight"], *files.begin());
  EXPECT_EQ(wm["lm_head.weight"], *files.rbegin());

  auto loaded = LoadModelDir(d);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(0, std::memcmp(loaded->params.data(), p.data(), p.size() * 4));
  EXPECT_EQ(ToConfigJson(loaded->config), ToConfigJson(c));
  const json config = ReadJson(d + "/config.json");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(config["head_dim"], 6);
  EXPECT_EQ(config["eos_token_id"], json::array({2, 3}));
  const json gen = ReadJson(d + "/generation_config.json");
  EXPECT_EQ(gen,
            (json{{"_from_model_config", true}, {"bos_token_id", 1}, {"eos_token_id", {2, 3}}, {"pad_token_id", 0}}));

  // Under the default limit (HF's 5 GB): one file; the shards and the index go.
  EXPECT_EQ(kDefaultMaxShardBytes, 5000000000u);
  ASSERT_TRUE(SaveModelDir(d, c, p.data(), nullptr).ok());
  EXPECT_TRUE(fs::exists(d + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(d + "/model.safetensors.index.json"));
  for (const std::string& f : files) EXPECT_FALSE(fs::exists(d + "/" + f)) << f;
  loaded = LoadModelDir(d);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(0, std::memcmp(loaded->params.data(), p.data(), p.size() * 4));
  // And back to shards (BF16 this time): model.safetensors goes, since a
  // loader would prefer it to the index.
  ASSERT_TRUE(SaveModelDir(d, c, p.data(), nullptr, {.dtype = StDtype::kBF16, .max_shard_bytes = limit / 2}).ok());
  EXPECT_FALSE(fs::exists(d + "/model.safetensors"));
  loaded = LoadModelDir(d);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (size_t k = 0; k < p.size(); ++k) {
    ASSERT_EQ(loaded->params[k], Bf16ToF32(F32ToBf16(p[k]))) << k;
  }
  EXPECT_EQ(ReadJson(d + "/config.json")["torch_dtype"], "bfloat16");
  EXPECT_EQ(ReadJson(d + "/model.safetensors.index.json")["metadata"]["total_size"], total / 2);
  // Tied: no lm_head.weight is written.
  ModelConfig tied = c;
  tied.tie_word_embeddings = true;
  const ParamLayout lt(tied);
  const std::vector<float> pt = RandomParams(lt, 10);
  ASSERT_TRUE(SaveModelDir(P("tied"), tied, pt.data(), nullptr, {.max_shard_bytes = limit}).ok());
  EXPECT_FALSE(ReadJson(P("tied/model.safetensors.index.json"))["weight_map"].contains("lm_head.weight"));
  loaded = LoadModelDir(P("tied"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(0, std::memcmp(loaded->params.data(), pt.data(), pt.size() * 4));
}

// A model loaded from an HF directory takes its tokenizer files and its
// generation_config.json along.
TEST_F(SafetensorsTest, ExportCopiesSourceTokenizerAndGenerationConfig) {
  const ModelConfig c = TinyConfig();
  const ParamLayout l(c);
  const std::vector<float> p = RandomParams(l, 3);
  const std::string src = P("src");
  fs::create_directories(src);
  const std::string tokenizer = R"({"version": "1.0", "model": {"type": "BPE", "vocab": {}}})";
  const std::string tokenizer_config = R"({"tokenizer_class": "PreTrainedTokenizerFast"})";
  std::ofstream(src + "/tokenizer.json") << tokenizer;
  std::ofstream(src + "/tokenizer_config.json") << tokenizer_config;
  std::ofstream(src + "/generation_config.json")
      << R"({"do_sample": true, "temperature": 0.7, "eos_token_id": [5, 6]})";
  ModelConfig with_ids = c;
  with_ids.bos_token_id = 1;
  with_ids.eos_token_ids = {2};
  const std::string out = P("out");
  CharTokenizer chars = CharTokenizer::Default();
  ASSERT_TRUE(SaveModelDir(out, with_ids, p.data(), &chars, {.source_dir = src}).ok());
  EXPECT_EQ(*ReadFileToString(out + "/tokenizer.json"), tokenizer);
  EXPECT_EQ(*ReadFileToString(out + "/tokenizer_config.json"), tokenizer_config);
  EXPECT_FALSE(fs::exists(out + "/special_tokens_map.json"));  // not in the source
  const json gen = ReadJson(out + "/generation_config.json");
  EXPECT_EQ(gen["temperature"], 0.7);
  EXPECT_EQ(gen["do_sample"], true);
  EXPECT_EQ(gen["eos_token_id"], json::array({5, 6}));  // the source's
  EXPECT_EQ(gen["bos_token_id"], 1);                    // added
  EXPECT_FALSE(gen.contains("_from_model_config"));
  auto loaded = LoadModelDir(out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->tokenizer.has_value());  // a foreign tokenizer: ids only
  EXPECT_EQ(0, std::memcmp(loaded->params.data(), p.data(), p.size() * 4));

  // Without a source tokenizer, the char tokenizer is written.
  const std::string out2 = P("out2");
  ASSERT_TRUE(SaveModelDir(out2, c, p.data(), &chars).ok());
  EXPECT_EQ(*ReadFileToString(out2 + "/tokenizer.json"), chars.ToJson());

  // A damaged generation_config.json in the source is an error naming it.
  std::ofstream(src + "/generation_config.json") << "{\"eos_token_id\": ";
  const absl::Status bad = SaveModelDir(P("out3"), c, p.data(), nullptr, {.source_dir = src});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("generation_config.json"), std::string::npos) << bad;
}

// Every bad single file: the error is clean and says what is wrong.
TEST_F(SafetensorsTest, BadFiles) {
  const std::string good_header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
  const std::string data(24, '\0');
  WriteRaw(P("good.safetensors"), good_header, data);
  auto good = SafetensorsFile::Open(P("good.safetensors"));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->tensors().size(), 2u);
  EXPECT_EQ(good->metadata().at("format"), "pt");

  struct Case {
    const char* name;
    std::function<void(const std::string&)> write;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"empty", [&](const std::string& p) { std::ofstream(p, std::ios::binary) << ""; }, "shorter than the 8-byte"},
      {"5 bytes", [&](const std::string& p) { std::ofstream(p, std::ios::binary) << "abcde"; },
       "shorter than the 8-byte"},
      {"header past end", [&](const std::string& p) { WriteRaw(p, good_header, data, 1 << 20); }, "past the end"},
      {"huge header length", [&](const std::string& p) { WriteRaw(p, good_header, data, int64_t{1} << 62); },
       "past the end"},
      {"truncated data", [&](const std::string& p) { WriteRaw(p, good_header, data.substr(0, 20)); }, "out of range"},
      {"invalid json", [&](const std::string& p) { WriteRaw(p, "{\"a\": [1, 2", data); }, "not valid JSON"},
      {"json not object", [&](const std::string& p) { WriteRaw(p, "[1,2]", data); }, "not an object"},
      {"unknown dtype",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", data); },
       "unknown dtype"},
      {"unsupported dtype",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", data); },
       "not supported"},
      {"offsets out of range",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data); },
       "out of range"},
      {"offsets reversed",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data); },
       "begin > end"},
      {"offsets overlapping",
       [&](const std::string& p) {
         WriteRaw(
             p,
             R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
             data);
       },
       "overlap"},
      {"size mismatch",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data); },
       "needs 12"},
      {"negative shape",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", data); },
       "non-negative"},
      {"negative offset",
       [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", data); },
       "non-negative"},
      {"missing dtype", [&](const std::string& p) { WriteRaw(p, R"({"a":{"shape":[1],"data_offsets":[0,4]}})", data); },
       "missing dtype"},
      {"bad metadata", [&](const std::string& p) { WriteRaw(p, R"({"__metadata__":{"x":1}})", data); }, "__metadata__"},
      // Two readers could pick different entries of a duplicated key.
      {"duplicate tensor",
       [&](const std::string& p) {
         WriteRaw(
             p,
             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
             data);
       },
       "key 'a' appears twice"},
      {"duplicate field",
       [&](const std::string& p) {
         WriteRaw(p, R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", data);
       },
       "key 'dtype' appears twice"},
      {"deep nesting", [&](const std::string& p) { WriteRaw(p, std::string(100, '[') + std::string(100, ']'), data); },
       "nested deeper"},
  };
  for (const Case& c : cases) {
    const std::string path = P("bad.safetensors");
    c.write(path);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << c.name << ": " << f.status().message();
  }
  auto missing = SafetensorsFile::Open(P("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// JSON nested a million deep parses (nlohmann does not recurse) but printing
// it in the error message would overflow the stack: refused at parse time,
// in the header and in model.safetensors.index.json.
TEST_F(SafetensorsTest, DeeplyNestedJsonIsRefused) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  WriteRaw(P("deep.safetensors"), R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", "");
  auto f = SafetensorsFile::Open(P("deep.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("nested deeper than 64 levels"), std::string::npos) << f.status();
  // Up to the limit is fine.
  const std::string shape = std::string(62, '[') + "1" + std::string(62, ']');
  WriteRaw(P("nested.safetensors"), R"({"a":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,4]}})",
           std::string(4, '\0'));
  f = SafetensorsFile::Open(P("nested.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("is not a list of non-negative integers"), std::string::npos) << f.status();

  const ModelConfig c = TinyConfig();
  fs::create_directories(P("dir"));
  std::ofstream(P("dir/config.json")) << ToConfigJson(c);
  std::ofstream(P("dir/model.safetensors.index.json")) << R"({"weight_map": )" + deep + "}";
  auto m = LoadModelDir(P("dir"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.safetensors.index.json: nested deeper than 64 levels"), std::string::npos)
      << m.status();
}

// Model-directory level errors: missing/extra tensors, wrong shapes,
// impossible config.json.
TEST_F(SafetensorsTest, BadModelDirs) {
  ModelConfig c = TinyConfig();
  Model m(c, nullptr);
  std::vector<float> p(m.layout().total_floats());
  m.InitParams(1, p.data());
  std::vector<StTensorToWrite> all;
  for (const auto& t : m.layout().tensors()) all.push_back({t.name, t.shape, p.data() + t.offset});
  auto make = [&](const std::string& name, std::vector<StTensorToWrite> tensors, const std::string& config_json) {
    fs::create_directories(P(name));
    EXPECT_TRUE(WriteSafetensors(P(name + "/model.safetensors"), tensors, {{"format", "pt"}}).ok());
    std::ofstream(P(name + "/config.json")) << config_json;
    return LoadModelDir(P(name));
  };
  const std::string cj = ToConfigJson(c);
  ASSERT_TRUE(make("ok", all, cj).ok());

  auto no_norm = all;
  no_norm.erase(
      std::remove_if(no_norm.begin(), no_norm.end(), [](const auto& t) { return t.name == "model.norm.weight"; }),
      no_norm.end());
  auto r = make("missing", no_norm, cj);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing tensor(s) model.norm.weight"), std::string::npos) << r.status();

  auto extra = all;
  std::vector<float> junk(16, 1.f);
  extra.push_back({"model.layers.2.mlp.up_proj.weight", {4, 4}, junk.data()});
  r = make("extra", extra, cj);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unexpected tensor 'model.layers.2.mlp.up_proj.weight'"), std::string::npos)
      << r.status();

  // Ignored HF buffers are fine.
  auto inv = all;
  inv.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {2}, junk.data()});
  EXPECT_TRUE(make("invfreq", inv, cj).ok());

  auto wrong = all;
  for (auto& t : wrong) {
    if (t.name == "model.layers.1.self_attn.k_proj.weight") t.shape = {16, 8};  // same numel, wrong shape
  }
  r = make("shape", wrong, cj);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has shape [16, 8] but config.json implies [8, 16]"), std::string::npos)
      << r.status();

  // Config says a bigger hidden size than the file holds.
  json bigger = json::parse(cj);
  bigger["intermediate_size"] = 32;
  r = make("cfgshape", all, bigger.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config.json implies"), std::string::npos) << r.status();

  json impossible = json::parse(cj);
  impossible["num_attention_heads"] = 3;
  impossible["head_dim"] = nullptr;
  impossible.erase("head_dim");
  impossible["num_key_value_heads"] = 3;
  r = make("imp1", all, impossible.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_attention_heads"), std::string::npos) << r.status();
  impossible = json::parse(cj);
  impossible["num_key_value_heads"] = 3;
  r = make("imp2", all, impossible.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_key_value_heads"), std::string::npos) << r.status();
  r = make("badjson", all, "{\"vocab_size\": ");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status();

  fs::create_directories(P("empty"));
  std::ofstream(P("empty/config.json")) << cj;
  r = LoadModelDir(P("empty"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  r = LoadModelDir(P("nodir"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
}

// A weight that is NaN or Inf poisons every step: refused when loading.
TEST_F(SafetensorsTest, NonFiniteWeightsAreRefused) {
  ModelConfig c = TinyConfig();
  Model m(c, nullptr);
  std::vector<float> params(m.layout().total_floats(), 0.5f);
  ASSERT_TRUE(SaveModelDir(P("ok"), c, params.data(), nullptr).ok());
  ASSERT_TRUE(LoadModelDir(P("ok")).ok());
  for (float poison : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    params[7] = poison;
    ASSERT_TRUE(SaveModelDir(P("bad"), c, params.data(), nullptr).ok());
    auto loaded = LoadModelDir(P("bad"));
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(loaded.status().message().find("non-finite values (NaN or Inf; first at 7)"), std::string::npos)
        << loaded.status();
  }
}

// Temp files: fresh unpredictable names, never followed through a symlink.
TEST_F(SafetensorsTest, AtomicWriteNeverFollowsAPlantedSymlink) {
  ASSERT_TRUE(WriteFileAtomic(P("target"), "secret").ok());
  // Whatever an attacker guesses for the temp name, plant links there.
  for (int i = 0; i < 64; ++i) {
    fs::create_symlink(P("target"), P("x.txt.tmp." + std::to_string(::getpid()) + "." + std::to_string(i)));
  }
  fs::create_symlink(P("target"), P("x.txt.tmp." + std::to_string(::getpid())));
  ASSERT_TRUE(WriteFileAtomic(P("x.txt"), "mine").ok());
  EXPECT_EQ(*ReadFileToString(P("target")), "secret");
  EXPECT_EQ(*ReadFileToString(P("x.txt")), "mine");
}

TEST_F(SafetensorsTest, AtomicWriteLeavesNoTempFiles) {
  ASSERT_TRUE(WriteFileAtomic(P("x.txt"), "hello").ok());
  ASSERT_TRUE(WriteFileAtomic(P("x.txt"), "world").ok());
  auto s = ReadFileToString(P("x.txt"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "world");
  int n = 0;
  for (auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++n;
  }
  EXPECT_EQ(n, 1);
  EXPECT_FALSE(WriteFileAtomic(P("no/such/dir/x"), "a").ok());
}

}  // namespace
}  // namespace tandem::model
