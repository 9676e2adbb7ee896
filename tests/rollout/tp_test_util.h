// Shared by the tensor-parallel rollout tests: small models of four
// families with random weights, a request set with shared prompts, engine
// options with chunked prefill, TP=1 runs and the token / log-prob
// comparison.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout::tptest {

// Ranks run as threads of one process; when one aborts, a peer's write to
// its closed socket must fail with EPIPE, not kill the test: ignore SIGPIPE
// as tandem-worker does.
inline const bool kSigpipeIgnored = [] {
  signal(SIGPIPE, SIG_IGN);
  return true;
}();

using model::ModelConfig;

// llama: tied; qwen: biases, a sliding layer, YaRN; qwen3: q/k norms;
// mistral: a window on every layer; sinks: windows of 4 on every layer, two
// of them beside attention sinks (5 and 2); hybrid: a full layer between a
// window of 4 and a window of 4 with 2 sinks; linear: linear attention
// (whose decay depends on the head) beside a full and a window layer, 4 kv
// heads. 4 heads, 2 kv heads (linear: 4), I = 40.
inline ModelConfig Config(const std::string& kind, int intermediate = 40) {
  nlohmann::json j = {{"vocab_size", 29},
                      {"hidden_size", 32},
                      {"intermediate_size", intermediate},
                      {"num_hidden_layers", 3},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-5},
                      {"eos_token_id", 2},
                      {"bos_token_id", 1}};
  if (kind == "qwen3") {
    j["model_type"] = "qwen3";
    j["head_dim"] = 12;
  } else if (kind == "mistral") {
    j["model_type"] = "mistral";
    j["sliding_window"] = 4;
  } else if (kind == "sinks") {
    j["tandem_layer_types"] = {"sink:5+window:4", "window:4", "sink:2+window:4"};
  } else if (kind == "hybrid") {
    j["tandem_layer_types"] = {"window:4", "full", "sink:2+window:4"};
  } else if (kind == "linear") {
    j["num_key_value_heads"] = 4;
    j["tandem_layer_types"] = {"linear", "full", "window:4"};
  } else if (kind == "qwen") {
    j["model_type"] = "qwen2";
    j["sliding_window"] = 5;
    j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  } else {
    j["tie_word_embeddings"] = true;
  }
  auto c = model::ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

inline std::vector<float> RandomParams(const ModelConfig& config, uint64_t seed) {
  const model::ParamLayout layout(config);
  std::vector<float> params(layout.total_floats(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  for (const auto& t : layout.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      const float v = nd(rng);
      params[t.offset + i] = t.kind == model::TensorView::Kind::kNorm   ? 1.f + 0.1f * v
                             : t.kind == model::TensorView::Kind::kBias ? 0.1f * v
                                                                        : 0.3f * v;
    }
  }
  return params;
}

inline std::vector<RolloutRequest> Requests(int G) {
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 5, 9, 13}, {1, 20}, {1, 3, 4, 7, 8, 11, 12, 17, 19, 21, 22}, {1}};
  std::vector<RolloutRequest> r;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int g = 0; g < G; ++g) r.push_back({prompts[p], static_cast<int>(p), p * G + g});
  }
  return r;
}

inline RolloutOptions Small(bool greedy) {
  RolloutOptions o;
  o.max_new_tokens = 10;
  o.block_size = 4;
  o.max_batch_tokens = 7;  // chunked prefill mixed with decode rows
  o.sampling.greedy = greedy;
  if (!greedy) {
    o.sampling.temperature = 0.9f;
    o.sampling.seed = 42;
  }
  return o;
}

enum class Kernels { kReference, kCpu };

inline std::unique_ptr<kernels::Ops> MakeOps(Kernels k) {
  return k == Kernels::kReference ? kernels::MakeReferenceOps() : kernels::MakeCpuOps(1);
}

inline RolloutResult RunTp1(const ModelConfig& config, const std::vector<float>& params, const RolloutOptions& o,
                            Kernels k) {
  auto ops = MakeOps(k);
  const model::ParamLayout layout(config);
  std::vector<float> p = params;
  model::FlatParamProvider pp(layout, p.data(), nullptr);
  RolloutEngine eng(config, ops.get());
  auto res = eng.Generate(Requests(2), o, pp);
  EXPECT_TRUE(res.ok()) << res.status();
  return res.ok() ? *res : RolloutResult{};
}

inline void ExpectSameTokens(const RolloutResult& a, const RolloutResult& b, double logprob_tol) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (size_t s = 0; s < a.sequences.size(); ++s) {
    const auto& x = a.sequences[s];
    const auto& y = b.sequences[s];
    EXPECT_EQ(x.tokens, y.tokens) << "sequence " << s;
    ASSERT_EQ(x.raw_logprobs.size(), y.raw_logprobs.size());
    for (size_t j = 0; j < x.raw_logprobs.size(); ++j) {
      EXPECT_NEAR(x.raw_logprobs[j], y.raw_logprobs[j], logprob_tol) << "sequence " << s << " token " << j;
      EXPECT_NEAR(x.logprobs[j], y.logprobs[j], logprob_tol) << "sequence " << s << " token " << j;
    }
  }
}

// Within the fp32 reduction-order tolerance: |log p(TP=2) - log p(TP=1)|.
constexpr double kLogprobTol = 1e-4;

}  // namespace tandem::rollout::tptest
