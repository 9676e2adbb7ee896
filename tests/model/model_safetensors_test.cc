// Safetensors reading/writing, model directories, and every bad-file case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

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
    dir_ = fs::temp_directory_path() /
           ("tandem_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& f) const { return (dir_ / f).string(); }

  // Writes a raw safetensors file: header JSON text + data bytes.
  void WriteRaw(const std::string& path, const std::string& header,
                const std::string& data, int64_t claimed_len = -1) {
    std::string out(8, '\0');
    const uint64_t n = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out += header;
    out += data;
    std::ofstream(path, std::ios::binary) << out;
  }

  ModelConfig TinyConfig(bool tied = false, bool qwen = false) {
    json j = {{"model_type", qwen ? "qwen2" : "llama"}, {"vocab_size", 37},
              {"hidden_size", 16}, {"intermediate_size", 24},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
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
      EXPECT_EQ(0, std::memcmp(loaded->params.data(), p.data(), p.size() * 4))
          << "tied=" << tied << " qwen=" << qwen;
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
  ASSERT_TRUE(SaveModelDir(P("bf"), c, p.data(), nullptr, StDtype::kBF16).ok());
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
    h[t.name] = {{"dtype", f64 ? "F64" : "F16"}, {"shape", t.shape},
                 {"data_offsets", {begin, data.size()}}};
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

  struct Case { const char* name; std::function<void(const std::string&)> write; const char* expect; };
  const std::vector<Case> cases = {
      {"empty", [&](const std::string& p) { std::ofstream(p, std::ios::binary) << ""; }, "shorter than the 8-byte"},
      {"5 bytes", [&](const std::string& p) { std::ofstream(p, std::ios::binary) << "abcde"; }, "shorter than the 8-byte"},
      {"header past end", [&](const std::string& p) { WriteRaw(p, good_header, data, 1 << 20); }, "past the end"},
      {"huge header length", [&](const std::string& p) { WriteRaw(p, good_header, data, int64_t{1} << 62); }, "past the end"},
      {"truncated data", [&](const std::string& p) { WriteRaw(p, good_header, data.substr(0, 20)); }, "out of range"},
      {"invalid json", [&](const std::string& p) { WriteRaw(p, "{\"a\": [1, 2", data); }, "not valid JSON"},
      {"json not object", [&](const std::string& p) { WriteRaw(p, "[1,2]", data); }, "not an object"},
      {"unknown dtype", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", data); }, "unknown dtype"},
      {"unsupported dtype", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", data); }, "not supported"},
      {"offsets out of range", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data); }, "out of range"},
      {"offsets reversed", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data); }, "begin > end"},
      {"offsets overlapping", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", data); }, "overlap"},
      {"size mismatch", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data); }, "needs 12"},
      {"negative shape", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", data); }, "non-negative"},
      {"negative offset", [&](const std::string& p) { WriteRaw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", data); }, "non-negative"},
      {"missing dtype", [&](const std::string& p) { WriteRaw(p, R"({"a":{"shape":[1],"data_offsets":[0,4]}})", data); }, "missing dtype"},
      {"bad metadata", [&](const std::string& p) { WriteRaw(p, R"({"__metadata__":{"x":1}})", data); }, "__metadata__"},
  };
  for (const Case& c : cases) {
    const std::string path = P("bad.safetensors");
    c.write(path);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << f.status().message();
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
  EXPECT_NE(m.status().message().find("weight_map"), std::string::npos) << m.status();
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
  auto make = [&](const std::string& name, std::vector<StTensorToWrite> tensors,
                  const std::string& config_json) {
    fs::create_directories(P(name));
    EXPECT_TRUE(WriteSafetensors(P(name + "/model.safetensors"), tensors, {{"format", "pt"}}).ok());
    std::ofstream(P(name + "/config.json")) << config_json;
    return LoadModelDir(P(name));
  };
  const std::string cj = ToConfigJson(c);
  ASSERT_TRUE(make("ok", all, cj).ok());

  auto no_norm = all;
  no_norm.erase(std::remove_if(no_norm.begin(), no_norm.end(),
                               [](const auto& t) { return t.name == "model.norm.weight"; }),
                no_norm.end());
  auto r = make("missing", no_norm, cj);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing tensor(s) model.norm.weight"), std::string::npos) << r.status();

  auto extra = all;
  std::vector<float> junk(16, 1.f);
  extra.push_back({"model.layers.2.mlp.up_proj.weight", {4, 4}, junk.data()});
  r = make("extra", extra, cj);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unexpected tensor 'model.layers.2.mlp.up_proj.weight'"), std::string::npos) << r.status();

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
  EXPECT_NE(r.status().message().find("has shape [16, 8] but config.json implies [8, 16]"), std::string::npos) << r.status();

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

TEST_F(SafetensorsTest, AtomicWriteLeavesNoTempFiles) {
  ASSERT_TRUE(WriteFileAtomic(P("x.txt"), "hello").ok());
  ASSERT_TRUE(WriteFileAtomic(P("x.txt"), "world").ok());
  auto s = ReadFileToString(P("x.txt"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "world");
  int n = 0;
  for (auto& e : fs::directory_iterator(dir_)) { (void)e; ++n; }
  EXPECT_EQ(n, 1);
  EXPECT_FALSE(WriteFileAtomic(P("no/such/dir/x"), "a").ok());
}

}  // namespace
}  // namespace tandem::model
