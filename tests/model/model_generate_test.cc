// Generation (the rollout engine, worker/rollout/engine.h, with the model
// configs of worker/model): paged KV-cache decoding equals recomputing the
// full forward at every step; sampling is independent of batching and of
// the engine's batching options; stop ids; cache accounting; layers the
// engine cannot run are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/layer_types.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"
#include "worker/model/soft_prompt.h"
#include "worker/rollout/engine.h"

namespace tandem::model {
namespace {

using nlohmann::json;

// qwen: Qwen2 biases, a sliding layer, YaRN. llama: tied. The others:
// Qwen3 (q/k norms, head_dim 12 against hidden 32 / 4 heads, tied or
// untied), Mistral (window on every layer), Llama 3 rope scaling past the
// original context.
ModelConfig Config(const std::string& kind) {
  json j = {
      {"vocab_size", 29},         {"hidden_size", 32},        {"intermediate_size", 40},       {"num_hidden_layers", 3},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
      {"eos_token_id", 2},        {"bos_token_id", 1}};
  if (kind == "qwen3_tied" || kind == "qwen3_untied") {
    j["model_type"] = "qwen3";
    j["head_dim"] = 12;
    j["tie_word_embeddings"] = kind == "qwen3_tied";
    j["rope_theta"] = 1e6;
  } else if (kind == "mistral") {
    j["model_type"] = "mistral";
    j["sliding_window"] = 4;
  } else if (kind == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8}};
  } else if (kind == "soft") {
    j["tandem_soft_prompt_tokens"] = 3;
  } else if (kind == "sinks") {
    j["tandem_layer_types"] = {"sink:2+window:3", "full", "sink:1+window:2"};
  } else if (kind == "qwen") {
    j["model_type"] = "qwen2";
    j["sliding_window"] = 5;
    j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  } else {
    j["tie_word_embeddings"] = true;
  }
  auto c = ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<float> RandomParams(const Model& m, uint64_t seed) {
  std::vector<float> p(m.layout().total_floats(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  for (const auto& t : m.layout().tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      float v = nd(rng);
      p[t.offset + i] = t.kind == TensorView::Kind::kNorm   ? 1.f + 0.1f * v
                        : t.kind == TensorView::Kind::kBias ? 0.1f * v
                                                            : 0.3f * v;
    }
  }
  return p;
}

using rollout::Finish;
using rollout::RolloutEngine;
using rollout::RolloutOptions;
using rollout::RolloutRequest;
using rollout::RolloutResult;

// One request per prompt; stream i (or ids[i]) keys prompt i's draws.
std::vector<RolloutRequest> Requests(const std::vector<std::vector<int32_t>>& prompts,
                                     const std::vector<uint64_t>& ids = {}) {
  std::vector<RolloutRequest> r;
  for (size_t i = 0; i < prompts.size(); ++i) r.push_back({prompts[i], -1, ids.empty() ? i : ids[i]});
  return r;
}

absl::StatusOr<RolloutResult> Generate(RolloutEngine& gen, const std::vector<std::vector<int32_t>>& prompts,
                                       const RolloutOptions& o, ParamProvider& pp,
                                       const std::vector<uint64_t>& ids = {}) {
  return gen.Generate(Requests(prompts, ids), o, pp);
}

RolloutOptions Greedy(int max_new_tokens) {
  RolloutOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = max_new_tokens;
  return o;
}

void CheckAgainstFullForward(kernels::Ops* ops, const std::string& kind, int block_size = 4) {
  const ModelConfig c = Config(kind);
  Model model(c, ops);
  std::vector<float> p = RandomParams(model, 3 + kind.size());
  FlatParamProvider pp(model.layout(), p.data(), nullptr);
  RolloutEngine gen(c, ops);
  std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 13}, {1, 20}, {1, 3, 4, 7, 8, 11, 12, 17, 19}};
  // A soft prompt runs in front of every prompt (ids V, V + 1, ...).
  for (auto& p : prompts) {
    const std::vector<int32_t> soft = SoftPromptIds(c);
    p.insert(p.begin(), soft.begin(), soft.end());
  }
  RolloutOptions so = Greedy(10);
  so.block_size = block_size;
  so.max_batch_tokens = 5;  // chunked prefill beside decode rows
  auto res = Generate(gen, prompts, so, pp);
  ASSERT_TRUE(res.ok()) << res.status();
  const int V = c.vocab_size;
  double max_diff = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto& g = res->sequences[s];
    ASSERT_EQ(g.tokens.size(), 10u);
    EXPECT_EQ(g.finish, Finish::kLength);
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      // Full forward over prompt + generated[0..j-1].
      std::vector<int32_t> seq = prompts[s];
      seq.insert(seq.end(), g.tokens.begin(), g.tokens.begin() + j);
      Batch b;
      b.cu_seqlens = {0, static_cast<int32_t>(seq.size())};
      for (size_t i = 0; i < seq.size(); ++i) {
        b.tokens.push_back(seq[i]);
        b.targets.push_back(0);
        b.positions.push_back(static_cast<int32_t>(i));
      }
      std::vector<float> logits(seq.size() * V);
      ASSERT_TRUE(model.ForwardLogits(b, pp, logits.data()).ok());
      const float* row = logits.data() + (seq.size() - 1) * V;
      int arg = 0;
      double mx = row[0], z = 0;
      for (int v = 1; v < V; ++v)
        if (row[v] > row[arg]) arg = v;
      mx = row[arg];
      for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      const double lp = row[g.tokens[j]] - mx - std::log(z);
      EXPECT_EQ(g.tokens[j], arg) << "sequence " << s << " step " << j;
      EXPECT_NEAR(g.raw_logprobs[j], lp, 1e-4) << "sequence " << s << " step " << j;
      EXPECT_EQ(g.logprobs[j], 0.f);
      max_diff = std::max(max_diff, std::fabs(g.raw_logprobs[j] - lp));
    }
  }
  std::printf("[generate %s %s] max |logprob(KV cache) - logprob(full forward)| = %.3g\n", ops->name(), kind.c_str(),
              max_diff);
  // With no budget the cache holds every sequence at full length, in
  // blocks: ceil((prompt + 10) / block_size) each, per layer; windowed and
  // sink layers (their own pool beside full layers) at most their sinks'
  // blocks, the widest window and one step's rows:
  // ceil(sinks / block_size) + (window - 1 + max_batch_tokens) / block_size + 2.
  int window = 0, sinks = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerType t = LayerTypeOf(c, l);
    if (t.kind != LayerKind::kWindow && t.kind != LayerKind::kSinkWindow) continue;
    window = std::max(window, t.window);
    sinks = std::max(sinks, t.sinks);
  }
  size_t full_blocks = 0, windowed_blocks = 0;
  for (const auto& p : prompts) {
    const size_t n = (p.size() + 10 + block_size - 1) / block_size;
    full_blocks += n;
    windowed_blocks += std::min<size_t>(
        n, (sinks + block_size - 1) / block_size + (window - 1 + so.max_batch_tokens) / block_size + 2);
  }
  size_t layer_blocks = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerType t = LayerTypeOf(c, l);
    const bool windowed = t.kind == LayerKind::kWindow || t.kind == LayerKind::kSinkWindow;
    layer_blocks += windowed ? windowed_blocks : full_blocks;
  }
  const size_t expect_bytes = 2ull * layer_blocks * block_size * c.KvHeads() * c.HeadDim() * sizeof(float);
  EXPECT_EQ(res->kv_pool_bytes, expect_bytes);
  EXPECT_LE(res->kv_peak_bytes, res->kv_pool_bytes);
  gen.Release();
  EXPECT_EQ(gen.held_bytes(), 0u);
}

TEST(GenerateTest, KvCacheMatchesFullForwardReference) {
  auto ops = kernels::MakeReferenceOps();
  CheckAgainstFullForward(ops.get(), "qwen");
  CheckAgainstFullForward(ops.get(), "llama");
  CheckAgainstFullForward(ops.get(), "qwen", /*block_size=*/1);
  CheckAgainstFullForward(ops.get(), "llama", /*block_size=*/16);
}

TEST(GenerateTest, KvCacheMatchesFullForwardCpu) {
  auto ops = kernels::MakeCpuOps(0);
  CheckAgainstFullForward(ops.get(), "qwen");
  CheckAgainstFullForward(ops.get(), "llama");
}

TEST(GenerateTest, KvCacheMatchesFullForwardQwen3MistralLlama3) {
  auto ref = kernels::MakeReferenceOps();
  auto cpu = kernels::MakeCpuOps(0);
  for (const char* kind : {"qwen3_tied", "qwen3_untied", "mistral", "llama3"}) {
    SCOPED_TRACE(kind);
    CheckAgainstFullForward(ref.get(), kind);
    CheckAgainstFullForward(cpu.get(), kind);
  }
}

// The soft prompt's rows (ids past the vocabulary) read tandem.soft_prompt
// in the paged engine as in the training forward; a repetition penalty
// skips them (they have no logit).
TEST(GenerateTest, KvCacheMatchesFullForwardBehindASoftPrompt) {
  auto ref = kernels::MakeReferenceOps();
  auto cpu = kernels::MakeCpuOps(0);
  CheckAgainstFullForward(ref.get(), "soft");
  CheckAgainstFullForward(cpu.get(), "soft", 1);
  const ModelConfig c = Config("soft");
  Model model(c, ref.get());
  std::vector<float> p = RandomParams(model, 9);
  FlatParamProvider pp(model.layout(), p.data(), nullptr);
  RolloutEngine gen(c, ref.get());
  RolloutOptions o = Greedy(6);
  o.sampling.repetition_penalty = 1.3f;
  auto res = Generate(gen, {{29, 30, 31, 1, 5}}, o, pp);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->sequences[0].tokens.size(), 6u);
  auto past = Generate(gen, {{32, 1}}, o, pp);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("token id 32 outside [0, 32)"), std::string::npos) << past.status();
}

TEST(GenerateTest, SamplingIndependentOfBatching) {
  auto ops = kernels::MakeReferenceOps();
  const ModelConfig c = Config("qwen");
  Model model(c, ops.get());
  std::vector<float> p = RandomParams(model, 9);
  FlatParamProvider pp(model.layout(), p.data(), nullptr);
  RolloutEngine gen(c, ops.get());
  const std::vector<std::vector<int32_t>> prompts = {{1, 5}, {1, 6, 7}, {1, 8, 9, 10}};
  RolloutOptions so;
  so.sampling.temperature = 1.3f;
  so.sampling.top_k = 12;
  so.sampling.top_p = 0.9f;
  so.sampling.seed = 77;
  so.max_new_tokens = 12;
  auto all = Generate(gen, prompts, so, pp);
  ASSERT_TRUE(all.ok()) << all.status();
  for (size_t s = 0; s < prompts.size(); ++s) {
    const uint64_t id = s;
    auto one = Generate(gen, {prompts[s]}, so, pp, {id});
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one->sequences[0].tokens, all->sequences[s].tokens) << s;
    for (size_t j = 0; j < one->sequences[0].tokens.size(); ++j) {
      EXPECT_NEAR(one->sequences[0].logprobs[j], all->sequences[s].logprobs[j], 1e-5);
      EXPECT_NEAR(one->sequences[0].raw_logprobs[j], all->sequences[s].raw_logprobs[j], 1e-5);
      EXPECT_LE(all->sequences[s].logprobs[j], 0.f);
    }
  }
  auto again = Generate(gen, prompts, so, pp);
  for (size_t s = 0; s < prompts.size(); ++s) {
    EXPECT_EQ(again->sequences[s].tokens, all->sequences[s].tokens);
  }
  // The engine's batching options change nothing: one sequence at a time, one
  // row per step, other block sizes.
  for (int variant = 0; variant < 4; ++variant) {
    RolloutOptions v = so;
    if (variant == 0) v.max_seqs = 1;
    if (variant == 1) v.max_batch_tokens = 1;
    if (variant == 2) v.block_size = 1;
    if (variant == 3) v.block_size = 64;
    auto r = Generate(gen, prompts, v, pp);
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t s = 0; s < prompts.size(); ++s) {
      EXPECT_EQ(r->sequences[s].tokens, all->sequences[s].tokens) << "variant " << variant << " sequence " << s;
    }
  }
  so.sampling.seed = 78;
  auto other = Generate(gen, prompts, so, pp);
  bool differs = false;
  for (size_t s = 0; s < prompts.size(); ++s) differs |= other->sequences[s].tokens != all->sequences[s].tokens;
  EXPECT_TRUE(differs);

  // Temperature 1, no filtering: the sampling distribution is the model's.
  RolloutOptions plain;
  plain.max_new_tokens = 6;
  plain.sampling.seed = 5;
  auto pl = Generate(gen, prompts, plain, pp);
  for (const auto& g : pl->sequences)
    for (size_t j = 0; j < g.tokens.size(); ++j) EXPECT_NEAR(g.logprobs[j], g.raw_logprobs[j], 1e-5);

  // top_k = 1 and a tiny top_p are greedy.
  auto gr = Generate(gen, prompts, Greedy(6), pp);
  RolloutOptions k1 = plain;
  k1.sampling.top_k = 1;
  auto r1 = Generate(gen, prompts, k1, pp);
  RolloutOptions p0 = plain;
  p0.sampling.top_p = 1e-6f;
  auto r2 = Generate(gen, prompts, p0, pp);
  for (size_t s = 0; s < prompts.size(); ++s) {
    EXPECT_EQ(r1->sequences[s].tokens, gr->sequences[s].tokens);
    EXPECT_EQ(r2->sequences[s].tokens, gr->sequences[s].tokens);
    for (float lp : r1->sequences[s].logprobs) EXPECT_NEAR(lp, 0.f, 1e-6);
  }
}

TEST(GenerateTest, StopsAtStopIdsAndValidates) {
  auto ops = kernels::MakeReferenceOps();
  const ModelConfig c = Config("llama");
  Model model(c, ops.get());
  std::vector<float> p = RandomParams(model, 10);
  FlatParamProvider pp(model.layout(), p.data(), nullptr);
  RolloutEngine gen(c, ops.get());
  RolloutOptions so = Greedy(8);
  auto base = Generate(gen, {{1, 4, 6}, {1, 7}}, so, pp);
  ASSERT_TRUE(base.ok());
  const auto& t0 = base->sequences[0].tokens;
  // Stop at the third token of sequence 0.
  so.stop_ids = {t0[2]};
  auto stopped = Generate(gen, {{1, 4, 6}, {1, 7}}, so, pp);
  ASSERT_TRUE(stopped.ok());
  const auto& s0 = stopped->sequences[0];
  const size_t first = std::find(t0.begin(), t0.end(), t0[2]) - t0.begin();
  EXPECT_EQ(s0.tokens.size(), first + 1);
  EXPECT_EQ(s0.finish, Finish::kStop);
  // Sequence 1 continues unaffected by sequence 0 leaving the batch (up to
  // its own stop).
  const auto& b1 = base->sequences[1].tokens;
  const auto& s1 = stopped->sequences[1].tokens;
  ASSERT_LE(s1.size(), b1.size());
  EXPECT_TRUE(std::equal(s1.begin(), s1.end(), b1.begin()));

  EXPECT_FALSE(Generate(gen, {}, so, pp).ok());
  EXPECT_FALSE(Generate(gen, {{}}, so, pp).ok());
  EXPECT_FALSE(Generate(gen, {{1, 99}}, so, pp).ok());
  RolloutOptions bad;
  bad.sampling.temperature = 0.f;
  EXPECT_FALSE(Generate(gen, {{1}}, bad, pp).ok());
  bad = RolloutOptions();
  bad.sampling.top_p = 0.f;
  EXPECT_FALSE(Generate(gen, {{1}}, bad, pp).ok());
}

// Attention-sink layers: the paged cache gives each its sinks and window
// (blocks of 1, 4 and 16 put the sinks in one or several blocks).
TEST(GenerateTest, KvCacheMatchesFullForwardWithSinkLayers) {
  auto ref = kernels::MakeReferenceOps();
  auto cpu = kernels::MakeCpuOps(0);
  for (int block_size : {1, 4, 16}) {
    CheckAgainstFullForward(ref.get(), "sinks", block_size);
    CheckAgainstFullForward(cpu.get(), "sinks", block_size);
  }
}

}  // namespace
}  // namespace tandem::model
