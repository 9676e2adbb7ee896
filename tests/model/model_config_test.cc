// Config parsing/validation, parameter layout and the char tokenizer.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <filesystem>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/job_model.h"
#include "worker/model/model_commands.h"
#include "worker/model/param_layout.h"
#include "worker/model/tokenizer.h"

namespace tandem::model {
namespace {

using nlohmann::json;

json BaseJson() {
  return json{{"model_type", "llama"},
              {"vocab_size", 100},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"max_position_embeddings", 128},
              {"tie_word_embeddings", false},
              {"bos_token_id", 1},
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
  // HF Qwen2Config's default max_window_layers is 28: with 2 layers, none
  // slides.
  j["use_sliding_window"] = true;
  j.erase("max_window_layers");
  c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_window_layers, 28);
  EXPECT_EQ(c->LayerWindow(1), -1);
  // layer_types wins.
  j["layer_types"] = {"sliding_attention", "full_attention"};
  c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerWindow(0), 16);
  EXPECT_EQ(c->LayerWindow(1), -1);
}

// config.json of meta-llama/Llama-3.2-1B as published.
constexpr char kLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(ConfigTest, Llama3RopeScaling) {
  auto c = ParseConfigJson(kLlama32Config);
  ASSERT_TRUE(c.ok()) << c.status();
  const kernels::RopeConfig r = c->Rope();
  EXPECT_EQ(r.type, kernels::RopeType::kLlama3);
  EXPECT_EQ(r.factor, 32.0);
  EXPECT_EQ(r.low_freq_factor, 1.0);
  EXPECT_EQ(r.high_freq_factor, 4.0);
  EXPECT_EQ(r.original_max_position, 8192);
  EXPECT_EQ(r.head_dim, 64);
  EXPECT_EQ(ParameterCount(*c), 1235814400);  // Llama 3.2 1B
  // Round trip keeps every llama3 key.
  const std::string out = ToConfigJson(*c);
  const json j = json::parse(out);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["low_freq_factor"], 1.0);
  EXPECT_EQ(j["rope_scaling"]["high_freq_factor"], 4.0);
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 8192);
  auto c2 = ParseConfigJson(out);
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(ToConfigJson(*c2), out);
}

// config.json of mistralai/Mistral-7B-v0.1 and Mistral-7B-v0.3 as published.
constexpr char kMistral01Config[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";
constexpr char kMistral03Config[] = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 32768})";

TEST(ConfigTest, Mistral7B) {
  auto v1 = ParseConfigJson(kMistral01Config);
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->model_type, "mistral");
  EXPECT_EQ(v1->HeadDim(), 128);
  EXPECT_EQ(v1->KvHeads(), 8);
  EXPECT_FALSE(v1->HasQkvBias());
  for (int l = 0; l < 32; ++l) EXPECT_EQ(v1->LayerWindow(l), 4096) << l;
  EXPECT_EQ(ParameterCount(*v1), 7241732096);  // Mistral 7B
  ParamLayout layout(*v1);
  EXPECT_NE(layout.Find("lm_head.weight"), nullptr);
  EXPECT_EQ(layout.Find("model.layers.31.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{1024, 4096}));

  auto v3 = ParseConfigJson(kMistral03Config);
  ASSERT_TRUE(v3.ok()) << v3.status();
  for (int l = 0; l < 32; ++l) EXPECT_EQ(v3->LayerWindow(l), -1) << l;
  EXPECT_EQ(v3->rope_theta, 1e6);
  EXPECT_EQ(ParameterCount(*v3), 7248023552);

  // Written back for HF: the architecture, and sliding_window explicit
  // (null stays null: MistralConfig would default an absent key to 4096).
  for (const auto* c : {&*v1, &*v3}) {
    const json j = json::parse(ToConfigJson(*c));
    EXPECT_EQ(j["architectures"], json::array({"MistralForCausalLM"}));
    EXPECT_EQ(j["model_type"], "mistral");
    ASSERT_TRUE(j.contains("sliding_window"));
    EXPECT_EQ(j["sliding_window"], c == &*v1 ? json(4096) : json(nullptr));
    EXPECT_EQ(j["attention_bias"], false);
    auto back = ParseConfigJson(j.dump());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->LayerWindow(0), c->LayerWindow(0));
  }

  // HF defaults: an absent sliding_window is 4096 for Mistral; attention_bias
  // does not give Mistral biases.
  json j = json::parse(kMistral03Config);
  j.erase("sliding_window");
  j["attention_bias"] = true;
  auto d = ParseConfigJson(j.dump());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->LayerWindow(5), 4096);
  EXPECT_FALSE(d->HasQkvBias());
}

// config.json of Qwen/Qwen3-0.6B as published.
constexpr char kQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

TEST(ConfigTest, Qwen3) {
  auto c = ParseConfigJson(kQwen3Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->HasQkNorm());
  EXPECT_FALSE(c->HasQkvBias());
  EXPECT_EQ(c->HeadDim(), 128);  // not hidden / heads = 64
  EXPECT_EQ(c->Rope().head_dim, 128);
  EXPECT_EQ(c->LayerWindow(27), -1);
  EXPECT_EQ(ParameterCount(*c), 596049920);  // Qwen3-0.6B
  ParamLayout l(*c);
  EXPECT_TRUE(l.tied());
  EXPECT_EQ(l.Find("model.layers.3.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{2048, 1024}));
  EXPECT_EQ(l.Find("model.layers.3.self_attn.o_proj.weight")->shape, (std::vector<int64_t>{1024, 2048}));
  const TensorView* qn = l.Find("model.layers.27.self_attn.q_norm.weight");
  ASSERT_NE(qn, nullptr);
  EXPECT_EQ(qn->shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(qn->kind, TensorView::Kind::kNorm);
  EXPECT_EQ(qn->unit, l.layer_unit(27));
  EXPECT_EQ(l.Find("model.layers.0.self_attn.k_norm.weight")->shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(l.layer(0).q_norm, l.Find("model.layers.0.self_attn.q_norm.weight")->offset_in_unit);
  EXPECT_EQ(l.Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  size_t sum = 0;
  for (const auto& t : l.tensors()) sum += t.numel;
  EXPECT_EQ(static_cast<int64_t>(sum), ParameterCount(*c));

  const json j = json::parse(ToConfigJson(*c));
  EXPECT_EQ(j["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_EQ(j["max_window_layers"], 28);
  EXPECT_EQ(j["sliding_window"], nullptr);
  EXPECT_EQ(j["tie_word_embeddings"], true);

  // Untied, with attention_bias: both honoured (HF Qwen3Attention).
  json u = json::parse(kQwen3Config);
  u["tie_word_embeddings"] = false;
  u["attention_bias"] = true;
  auto cu = ParseConfigJson(u.dump());
  ASSERT_TRUE(cu.ok()) << cu.status();
  ParamLayout lu(*cu);
  EXPECT_NE(lu.Find("lm_head.weight"), nullptr);
  EXPECT_NE(lu.Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_NE(lu.Find("model.layers.0.self_attn.q_norm.weight"), nullptr);
}

struct BadCase {
  const char* name;
  std::function<void(json&)> mutate;
  const char* expect;  // substring of the message
};

TEST(ConfigTest, RejectsBadConfigsNamingTheKey) {
  const std::vector<BadCase> cases = {
      {"heads not dividing hidden",
       [](json& j) {
         j["num_attention_heads"] = 5;
         j["num_key_value_heads"] = 5;
       },
       "num_attention_heads"},
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
      {"unknown rope type",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "su"}, {"factor", 2}};
       },
       "rope_scaling.rope_type"},
      {"rope type missing",
       [](json& j) {
         j["rope_scaling"] = {{"factor", 2}};
       },
       "rope_scaling"},
      {"rope factor < 1",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.5}};
       },
       "rope_scaling.factor"},
      {"layer_types length", [](json& j) { j["layer_types"] = {"full_attention"}; }, "layer_types"},
      {"layer_types value",
       [](json& j) {
         j["layer_types"] = {"full_attention", "local"};
       },
       "layer_types"},
      {"sliding without window",
       [](json& j) {
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       "sliding_window"},
      {"eos out of vocab", [](json& j) { j["eos_token_id"] = 100; }, "eos_token_id"},
      {"bos negative", [](json& j) { j["bos_token_id"] = -5; }, "bos_token_id"},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"mlp bias", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias"},
      {"tokenizer kind", [](json& j) { j["tokenizer"] = "bpe"; }, "tokenizer"},
      {"char vocab too small",
       [](json& j) {
         j["tokenizer"] = "char";
         j["vocab_size"] = 50;
       },
       "vocab_size"},
      {"max pos zero", [](json& j) { j["max_position_embeddings"] = 0; }, "max_position_embeddings"},
      {"llama3 without low_freq_factor",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 64}};
       },
       "rope_scaling.low_freq_factor"},
      {"llama3 without original",
       [](json& j) {
         j["rope_scaling"] = {
             {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
       },
       "rope_scaling.original_max_position_embeddings"},
      {"llama3 without factor",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 64}};
       },
       "rope_scaling.factor"},
      {"llama3 high <= low",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 4.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 64}};
       },
       "rope_scaling.high_freq_factor"},
      {"llama3 low <= 0",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 0.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 64}};
       },
       "rope_scaling.low_freq_factor"},
      {"low_freq_factor with linear",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}};
       },
       "rope_scaling.low_freq_factor"},
      {"longrope",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
       },
       "rope_scaling.short_factor"},
      {"unknown model type", [](json& j) { j["model_type"] = "gemma"; }, "model_type"},
      {"partial rotary", [](json& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor"},
      {"rope_parameters",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
       },
       "rope_parameters"},
      {"eos list past 32 bits",
       [](json& j) {
         j["eos_token_id"] = {2, int64_t{1} << 40};
       },
       "is out of range"},
  };
  for (const BadCase& bc : cases) {
    json j = BaseJson();
    bc.mutate(j);
    auto c = ParseConfigJson(j.dump());
    ASSERT_FALSE(c.ok()) << bc.name;
    EXPECT_NE(c.status().message().find(bc.expect), std::string::npos) << bc.name << ": " << c.status().message();
  }
  auto dup = ParseConfigJson(R"({"model_type": "llama", "vocab_size": 32, "vocab_size": 64})");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("key 'vocab_size' appears twice"), std::string::npos) << dup.status();
  EXPECT_FALSE(ParseConfigJson("{not json").ok());
  EXPECT_FALSE(ParseConfigJson("[1,2]").ok());
  EXPECT_FALSE(ParseConfigJson("").ok());
}

// The per-worker memory estimate follows ZeRO sharding and the shapes.
TEST(MemoryEstimateTest, FollowsZeroStagesAndShapes) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 4096;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 1 << 24;
  const int64_t p = ParameterCount(c);
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_SFT);
  spec.mutable_cluster()->set_workers(4);
  spec.mutable_train()->set_micro_batch(2);
  spec.mutable_train()->set_seq_len(256);
  spec.mutable_cluster()->set_zero_stage(0);
  auto e0 = EstimateJobMemory(spec, c);
  EXPECT_EQ(e0.params, 4 * p);
  EXPECT_EQ(e0.gradients, 4 * p);
  EXPECT_EQ(e0.optimizer, 8 * p);
  EXPECT_EQ(e0.kv_cache, 0);
  EXPECT_LT(e0.rope, 1 << 20);  // by positions in use, not max_position_embeddings
  spec.mutable_cluster()->set_zero_stage(3);
  auto e3 = EstimateJobMemory(spec, c);
  EXPECT_EQ(e3.optimizer, 2 * p);
  EXPECT_EQ(e3.gradients, p);
  EXPECT_LT(e3.params, 2 * p);
  EXPECT_LT(e3.total, e0.total);
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  spec.mutable_rl()->set_kl_coef(0.01);
  spec.mutable_rl()->set_prompts_per_step(8);
  spec.mutable_rl()->set_group_size(8);
  spec.mutable_rl()->set_max_new_tokens(256);
  auto rl = EstimateJobMemory(spec, c);
  EXPECT_EQ(rl.reference, 4 * p);
  EXPECT_EQ(rl.kv_cache, int64_t{4} * 2 * 16 * 512 * 8 * 8 * 128);  // 16 sequences per rank
  EXPECT_NE(rl.Describe().find("kv cache"), std::string::npos) << rl.Describe();
  // Linear-attention layers: a state per sequence instead of KV.
  ModelConfig hybrid = c;
  hybrid.tandem_layer_types = {"linear", "full", "linear", "full", "linear", "full", "linear", "full"};
  auto rh = EstimateJobMemory(spec, hybrid);
  EXPECT_EQ(rh.kv_cache, int64_t{4} * 2 * 16 * 512 * 4 * 8 * 128 + int64_t{4} * 16 * 4 * 8 * 128 * 128);
  // Window layers: their window and one step's rows (64 + 128 of 512).
  ModelConfig windowed = c;
  windowed.tandem_layer_types = {"full", "window:64", "full", "window:64", "full", "window:64", "full", "window:64"};
  spec.mutable_rollout()->set_max_batch_tokens(128);
  auto rw = EstimateJobMemory(spec, windowed);
  EXPECT_EQ(rw.kv_cache, int64_t{4} * 2 * 16 * (4 * 512 + 4 * (64 + 128)) * 8 * 128);
  spec.mutable_rollout()->set_max_batch_tokens(0);
  // Absurd shapes saturate instead of wrapping.
  spec.mutable_train()->set_micro_batch(1 << 30);
  spec.mutable_train()->set_seq_len(1 << 30);
  EXPECT_EQ(EstimateJobMemory(spec, c).total, INT64_MAX);
}

// Integers that do not fit an int are refused, not cut to 32 bits (an eos
// id of 2^32 + 2 would pass as 2), and messages show the value as written.
TEST(ConfigTest, IntegersBeyondIntAreRefused) {
  json j = BaseJson();
  j["eos_token_id"] = {2, 4294967298LL};
  auto c = ParseConfigJson(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'eos_token_id' = 4294967298 is out of range"), std::string::npos) << c.status();
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

// A YAML model config goes through the job file's reader: errors name the key.
TEST(ConfigTest, YamlConfigErrorsNameTheKey) {
  const std::string path = ::testing::TempDir() + "/model_config_errors.yaml";
  auto error_of = [&](const std::string& text) {
    std::ofstream(path) << text;
    auto c = LoadModelConfigFile(path);
    return c.ok() ? std::string("OK") : std::string(c.status().message());
  };
  const std::string base =
      "vocab_size: 128\nhidden_size: 32\nintermediate_size: 64\nnum_hidden_layers: 1\n"
      "num_attention_heads: 4\n";
  EXPECT_EQ(error_of(base), "OK");
  EXPECT_EQ(error_of(base + "hidden_layers: 2\n").rfind(path + ": hidden_layers: unknown key; allowed: ", 0), 0u)
      << error_of(base + "hidden_layers: 2\n");
  EXPECT_EQ(error_of("vocab_size: abc\n"), path + ": vocab_size: expected an integer, got 'abc'");
  EXPECT_EQ(error_of(base + "num_key_value_heads: 3\n"),
            path + ": model.config.num_key_value_heads: 3 must divide num_attention_heads (4)");
  EXPECT_NE(error_of("vocab_size: [1\n").find("malformed YAML"), std::string::npos) << error_of("vocab_size: [1\n");
  EXPECT_EQ(error_of("- 1\n"), path + ": YAML must be a mapping");
  std::remove(path.c_str());
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

// tandem_soft_prompt_tokens: the soft prompt follows the embeddings
// unpadded (id V + i reads row i), in offset order, counts in the
// parameters, survives config.json, and bad values are refused by name.
TEST(LayoutTest, SoftPromptFollowsTheEmbeddings) {
  json j = BaseJson();
  j["vocab_size"] = 61;  // V * C not a multiple of the alignment
  j["hidden_size"] = 40;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["tandem_soft_prompt_tokens"] = 5;
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tandem_soft_prompt_tokens, 5);
  const ParamLayout l(*c);
  const TensorView* soft = l.Find("tandem.soft_prompt");
  const TensorView* embed = l.Find("model.embed_tokens.weight");
  ASSERT_NE(soft, nullptr);
  EXPECT_EQ(&l.tensors()[1], soft);  // offset order
  EXPECT_EQ(soft->shape, (std::vector<int64_t>{5, 40}));
  EXPECT_EQ(soft->unit, 0);
  EXPECT_EQ(soft->offset, embed->offset + 61u * 40u);
  EXPECT_LE(soft->offset_in_unit + soft->numel, l.unit_size(0));
  EXPECT_EQ(l.unit_size(0) % kAlignFloats, 0u);
  size_t sum = 0;
  for (const auto& t : l.tensors()) sum += t.numel;
  EXPECT_EQ(static_cast<int64_t>(sum), ParameterCount(*c));
  auto again = ParseConfigJson(ToConfigJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tandem_soft_prompt_tokens, 5);
  // Without the key: no tensor, and the key is not written.
  j.erase("tandem_soft_prompt_tokens");
  auto plain = ParseConfigJson(j.dump());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(ParamLayout(*plain).Find("tandem.soft_prompt"), nullptr);
  EXPECT_EQ(ToConfigJson(*plain).find("tandem_soft_prompt_tokens"), std::string::npos);
  for (const json& bad : {json(-1), json(2.5), json("4"), json(128), json(int64_t{1} << 40)}) {
    j["tandem_soft_prompt_tokens"] = bad;
    auto r = ParseConfigJson(j.dump());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("tandem_soft_prompt_tokens"), std::string::npos) << r.status();
  }
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
