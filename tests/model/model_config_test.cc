// Config parsing/validation, parameter layout and the char tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/model_commands.h"
#include "worker/model/param_layout.h"
#include "worker/model/tokenizer.h"

namespace tandem::model {
namespace {

using nlohmann::json;

json BaseJson() {
  return json{{"model_type", "llama"},     {"vocab_size", 100},
              {"hidden_size", 32},         {"intermediate_size", 48},
              {"num_hidden_layers", 2},    {"num_attention_heads", 4},
              {"num_key_value_heads", 2},  {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},     {"max_position_embeddings", 128},
              {"tie_word_embeddings", false}, {"bos_token_id", 1},
              {"eos_token_id", 2}};
}

TEST(ConfigTest, ParsesHfConfig) {
  json j = BaseJson();
  j["architectures"] = {"LlamaForCausalLM"};
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->HeadDim(), 8);
  EXPECT_EQ(c->KvHeads(), 2);
  EXPECT_TRUE(c->has_rope_scaling);
  EXPECT_EQ(c->rope_scaling.rope_type, "linear");
  EXPECT_EQ(c->Rope().type, kernels::RopeType::kLinear);
  EXPECT_EQ(c->LayerWindow(0), -1);
  EXPECT_FALSE(c->HasQkvBias());
  // Round trip through ToConfigJson.
  auto c2 = ParseConfigJson(ToConfigJson(*c));
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(ToConfigJson(*c2), ToConfigJson(*c));
}

TEST(ConfigTest, EosListAndKvDefault) {
  json j = BaseJson();
  j.erase("num_key_value_heads");
  j["eos_token_id"] = {2, 3};
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->KvHeads(), 4);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2, 3}));
}

TEST(ConfigTest, Qwen2SlidingWindowRules) {
  json j = BaseJson();
  j["model_type"] = "qwen2";
  j["sliding_window"] = 16;
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 1;
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->HasQkvBias());
  EXPECT_EQ(c->LayerWindow(0), -1);
  EXPECT_EQ(c->LayerWindow(1), 16);
  j["use_sliding_window"] = false;
  c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->LayerWindow(1), -1);
  // layer_types wins.
  j["layer_types"] = {"sliding_attention", "full_attention"};
  c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerWindow(0), 16);
  EXPECT_EQ(c->LayerWindow(1), -1);
}

struct BadCase {
  const char* name;
  std::function<void(json&)> mutate;
  const char* expect;  // substring of the message
};

TEST(ConfigTest, RejectsBadConfigsNamingTheKey) {
  const std::vector<BadCase> cases = {
      {"heads not dividing hidden", [](json& j) { j["num_attention_heads"] = 5; j["num_key_value_heads"] = 5; }, "num_attention_heads"},
      {"kv heads not dividing heads", [](json& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads"},
      {"zero kv heads", [](json& j) { j["num_key_value_heads"] = 0; }, "num_key_value_heads"},
      {"negative vocab", [](json& j) { j["vocab_size"] = -1; }, "vocab_size"},
      {"missing vocab", [](json& j) { j.erase("vocab_size"); }, "vocab_size"},
      {"huge vocab", [](json& j) { j["vocab_size"] = 100000000; }, "vocab_size"},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, "num_hidden_layers"},
      {"zero intermediate", [](json& j) { j["intermediate_size"] = 0; }, "intermediate_size"},
      {"hidden as string", [](json& j) { j["hidden_size"] = "32"; }, "hidden_size"},
      {"odd head dim", [](json& j) { j["head_dim"] = 7; }, "head_dim"},
      {"bad eps", [](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
      {"bad theta", [](json& j) { j["rope_theta"] = -1; }, "rope_theta"},
      {"unknown rope type", [](json& j) { j["rope_scaling"] = {{"rope_type", "su"}, {"factor", 2}}; }, "rope_scaling.rope_type"},
      {"rope type missing", [](json& j) { j["rope_scaling"] = {{"factor", 2}}; }, "rope_scaling"},
      {"rope factor < 1", [](json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.5}}; }, "rope_scaling.factor"},
      {"layer_types length", [](json& j) { j["layer_types"] = {"full_attention"}; }, "layer_types"},
      {"layer_types value", [](json& j) { j["layer_types"] = {"full_attention", "local"}; }, "layer_types"},
      {"sliding without window", [](json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; }, "sliding_window"},
      {"eos out of vocab", [](json& j) { j["eos_token_id"] = 100; }, "eos_token_id"},
      {"bos negative", [](json& j) { j["bos_token_id"] = -5; }, "bos_token_id"},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"mlp bias", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias"},
      {"tokenizer kind", [](json& j) { j["tokenizer"] = "bpe"; }, "tokenizer"},
      {"char vocab too small", [](json& j) { j["tokenizer"] = "char"; j["vocab_size"] = 50; }, "vocab_size"},
      {"max pos zero", [](json& j) { j["max_position_embeddings"] = 0; }, "max_position_embeddings"},
  };
  for (const BadCase& bc : cases) {
    json j = BaseJson();
    bc.mutate(j);
    auto c = ParseConfigJson(j.dump());
    ASSERT_FALSE(c.ok()) << bc.name;
    EXPECT_NE(c.status().message().find(bc.expect), std::string::npos)
        << bc.name << ": " << c.status().message();
  }
  EXPECT_FALSE(ParseConfigJson("{not json").ok());
  EXPECT_FALSE(ParseConfigJson("[1,2]").ok());
  EXPECT_FALSE(ParseConfigJson("").ok());
}

// Integers that do not fit an int are refused, not cut to 32 bits (an eos
// id of 2^32 + 2 would pass as 2), and messages show the value as written.
TEST(ConfigTest, IntegersBeyondIntAreRefused) {
  json j = BaseJson();
  j["eos_token_id"] = {2, 4294967298LL};
  auto c = ParseConfigJson(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'eos_token_id' = 4294967298 is out of range"), std::string::npos)
      << c.status();
  j = BaseJson();
  j["vocab_size"] = 18446744073709551615ULL;
  c = ParseConfigJson(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'vocab_size' = 18446744073709551615 is out of range"), std::string::npos)
      << c.status();
  j = BaseJson();
  j["hidden_size"] = 32.0;  // integral floats are integers
  EXPECT_TRUE(ParseConfigJson(j.dump()).ok());
}

// JSON nested a million deep parses (nlohmann does not recurse) but printing
// it in the error message ("must be an integer, got ...") would overflow
// the stack: refused at parse time. Same for the char tokenizer's file.
TEST(ConfigTest, DeeplyNestedJsonIsRefused) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  auto c = ParseConfigJson(R"({"vocab_size": )" + deep + "}");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nested deeper than 64 levels"), std::string::npos) << c.status();
  auto t = CharTokenizer::FromJson(R"({"type": "char", "vocab": )" + deep + "}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("not a JSON object"), std::string::npos) << t.status();
}

TEST(ConfigTest, YamlConfigs) {
  for (const char* name : {"tiny", "config-a", "config-b"}) {
    auto c = LoadModelConfigFile(std::string(TANDEM_SOURCE_DIR) + "/configs/models/" + name + ".yaml");
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto tiny = LoadModelConfigFile(std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml");
  EXPECT_EQ(tiny->vocab_size, 99);
  EXPECT_EQ(tiny->tokenizer, "char");
  EXPECT_EQ(tiny->hidden_size, 64);
}

TEST(LayoutTest, LlamaUntied) {
  auto c = ParseConfigJson(BaseJson().dump());
  ASSERT_TRUE(c.ok());
  ParamLayout l(*c);
  EXPECT_EQ(l.num_units(), 4);
  // 2 layers x 12 tensors... : embed + 2*9 + norm + lm_head
  EXPECT_EQ(l.tensors().size(), 1u + 2 * 9 + 2);
  const TensorView* q = l.Find("model.layers.1.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(q->unit, 2);
  EXPECT_EQ(l.Find("model.layers.0.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(l.Find("model.layers.0.mlp.down_proj.weight")->shape, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(l.Find("lm_head.weight")->unit, 3);
  EXPECT_EQ(l.Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_FALSE(l.tied());
  size_t sum = 0;
  for (const auto& t : l.tensors()) {
    sum += t.numel;
    EXPECT_EQ(t.offset % kAlignFloats, 0u) << t.name;
    EXPECT_EQ(t.offset, l.unit_offset(t.unit) + t.offset_in_unit);
    EXPECT_LE(t.offset_in_unit + t.numel, l.unit_size(t.unit));
  }
  EXPECT_EQ(static_cast<int64_t>(sum), ParameterCount(*c));
  EXPECT_GE(l.total_floats(), sum);
  EXPECT_EQ(l.unit_offset(3) + l.unit_size(3), l.total_floats());
}

TEST(LayoutTest, Qwen2Tied) {
  json j = BaseJson();
  j["model_type"] = "qwen2";
  j["tie_word_embeddings"] = true;
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok());
  ParamLayout l(*c);
  EXPECT_TRUE(l.tied());
  EXPECT_EQ(l.Find("lm_head.weight"), nullptr);
  EXPECT_EQ(l.lm_head_unit(), 0);
  EXPECT_EQ(l.lm_head_offset(), l.embed_offset());
  ASSERT_NE(l.Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(l.Find("model.layers.0.self_attn.k_proj.bias")->shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(l.tensors().size(), 1u + 2 * 12 + 1);
  size_t sum = 0;
  for (const auto& t : l.tensors()) sum += t.numel;
  EXPECT_EQ(static_cast<int64_t>(sum), ParameterCount(*c));
}

TEST(TokenizerTest, RoundTripAndSpecials) {
  CharTokenizer t = CharTokenizer::Default();
  EXPECT_EQ(t.vocab_size(), 99);
  const std::string text = "Hello, world! 12+34=46\n~";
  auto ids = t.Encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 3 + ('H' - 32));
  EXPECT_EQ(ids[ids.size() - 2], 98);
  EXPECT_EQ(t.Decode(ids), text);
  std::vector<int32_t> with_specials = {t.bos(), 3, t.pad(), 4, t.eos(), 500, -1};
  EXPECT_EQ(t.Decode(with_specials), " !");
  EXPECT_FALSE(t.EncodeOrError("tab\there").ok());
  EXPECT_EQ(t.Encode("\t")[0], t.Encode("?")[0]);
  auto ok = t.EncodeOrError("abc");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, t.Encode("abc"));
  const auto dir = std::filesystem::temp_directory_path() / "tandem_tok_test";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(t.Save(dir.string()).ok());
  auto loaded = CharTokenizer::Load(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->Encode(text), ids);
  EXPECT_FALSE(CharTokenizer::FromJson("{\"type\":\"bpe\"}").ok());
  EXPECT_FALSE(CharTokenizer::FromJson("nope").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::model
