// The model and the rollout engine on backend device memory: the same code over
// guarded memory (kernels/guarded: the host faults on any device address,
// ops see translated pointers) gives BIT-identical results to the host path
// (plain vectors, MakeHostMemory), for forward log-probs and entropies,
// parameter gradients, logits, and generated tokens and log-probs. Batches
// grow between calls (workspace and KV-cache growth), and exhausted device
// memory is reported as ResourceExhausted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/backends.h"
#include "kernels/guarded/guarded_memory.h"
#include "kernels/memory.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/engine.h"

namespace tandem::model {
namespace {

using nlohmann::json;

// qwen: GQA, q/k/v biases, a sliding-window layer, YaRN, untied head.
// llama: GQA, tied head; with `dynamic_ntk` (training) dynamic NTK RoPE:
// the base changes with the longest sequence, so the rope tables are rebuilt
// and re-uploaded. (Generation uses one base per call, unlike the full
// forward it is checked against: not used there.)
ModelConfig Config(bool qwen, bool dynamic_ntk = true) {
  json j = {
      {"vocab_size", 29},         {"hidden_size", 32},        {"intermediate_size", 40},       {"num_hidden_layers", 3},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
      {"eos_token_id", 2},        {"bos_token_id", 1}};
  if (qwen) {
    j["model_type"] = "qwen2";
    j["sliding_window"] = 5;
    j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    j["tie_word_embeddings"] = false;
  } else {
    j["tie_word_embeddings"] = true;
    if (dynamic_ntk) {
      j["max_position_embeddings"] = 16;
      j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
    }
  }
  auto c = ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Qwen3: per-head q/k norms (their forward rstd and backward scratch in
// the workspace), head_dim 12 against hidden 32 / 4 heads, untied.
ModelConfig Qwen3Config() {
  json j = {{"model_type", "qwen3"},       {"vocab_size", 29},       {"hidden_size", 32},
            {"intermediate_size", 40},     {"num_hidden_layers", 3}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2},    {"head_dim", 12},         {"max_position_embeddings", 64},
            {"rms_norm_eps", 1e-6},        {"eos_token_id", 2},      {"bos_token_id", 1},
            {"tie_word_embeddings", false}};
  auto c = ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<float> RandomParams(const ParamLayout& layout, uint64_t seed) {
  std::vector<float> p(layout.total_floats(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  for (const auto& t : layout.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      const float v = nd(rng);
      p[t.offset + i] = t.kind == TensorView::Kind::kNorm   ? 1.f + 0.1f * v
                        : t.kind == TensorView::Kind::kBias ? 0.1f * v
                                                            : 0.3f * v;
    }
  }
  return p;
}

Batch RandomBatch(const std::vector<int>& lengths, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  for (int n : lengths) {
    std::vector<int32_t> seq(n + 1);
    for (auto& t : seq) t = static_cast<int32_t>(rng() % vocab);
    b.AddSequence(seq);
  }
  return b;
}

// Bitwise equality of two float arrays; reports the first difference.
::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// One training path: a model over a FlatParamProvider whose buffers live in
// `mem` (host memory or guarded device memory).
struct TrainPath {
  TrainPath(const ModelConfig& c, kernels::Ops* ops, kernels::DeviceMemory* mem, const std::vector<float>& params)
      : model(c, ops, 0, mem), mem(mem) {
    const size_t n = model.layout().total_floats();
    EXPECT_TRUE(p.Allocate(mem, n));
    EXPECT_TRUE(g.AllocateZeroed(mem, n));
    p.Upload(params.data(), n);
    pp = std::make_unique<FlatParamProvider>(model.layout(), p.data(), g.data());
  }
  // Forward + masked SFT backward; returns logp and entropy.
  void Step(const Batch& b, const BackwardOptions& bo, std::vector<float>* logp, std::vector<float>* entropy) {
    const size_t T = b.num_tokens();
    logp->assign(T, 0.f);
    entropy->assign(T, 0.f);
    ASSERT_TRUE(model.ForwardLogprobs(b, *pp, logp->data(), entropy->data()).ok());
    std::vector<float> mask(T), dlogp(T);
    for (size_t t = 0; t < T; ++t) mask[t] = t % 3 == 1 ? 0.f : 1.f;
    SftLoss(*logp, mask, dlogp.data());
    ASSERT_TRUE(model.Backward(dlogp.data(), *pp, bo).ok());
  }
  std::vector<float> Grads() const {
    std::vector<float> out(g.size());
    g.Download(out.data(), out.size());
    return out;
  }

  Model model;
  kernels::DeviceMemory* mem;
  kernels::DeviceArray<float> p, g;
  std::unique_ptr<FlatParamProvider> pp;
};

void CheckTraining(const ModelConfig& c, uint64_t seed) {
  const ParamLayout layout(c);
  const std::vector<float> params = RandomParams(layout, seed);
  auto host_mem = kernels::MakeHostMemory();
  auto host_ops = kernels::MakeCpuOps(1);
  auto gmem = kernels::MakeGuardedMemory(size_t{1} << 30);
  auto gops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), gmem.get());
  TrainPath host(c, host_ops.get(), host_mem.get(), params);
  TrainPath dev(c, gops.get(), gmem.get(), params);

  // Small, then larger (workspace growth, longer positions: new rope
  // tables), then small again, one with the attention backward skipped.
  const std::vector<Batch> batches = {RandomBatch({5, 3}, c.vocab_size, 1),
                                      RandomBatch({9, 30, 1, 14}, c.vocab_size, 2), RandomBatch({4}, c.vocab_size, 3)};
  for (size_t i = 0; i < batches.size(); ++i) {
    BackwardOptions bo;
    bo.skip_attention = i == 2;
    std::vector<float> lh, eh, ld, ed;
    host.Step(batches[i], bo, &lh, &eh);
    dev.Step(batches[i], bo, &ld, &ed);
    EXPECT_TRUE(SameBits(lh, ld)) << "logp, batch " << i;
    EXPECT_TRUE(SameBits(eh, ed)) << "entropy, batch " << i;
    EXPECT_TRUE(SameBits(host.Grads(), dev.Grads())) << "grads after batch " << i;
  }
  EXPECT_EQ(dev.model.capacity_tokens(), batches[1].num_tokens());
  EXPECT_GT(dev.model.workspace_bytes(), 0u);

  // Logits (a device buffer per call, downloaded).
  const Batch& b = batches[1];
  std::vector<float> zh(static_cast<size_t>(b.num_tokens()) * c.vocab_size), zd(zh.size());
  ASSERT_TRUE(host.model.ForwardLogits(b, *host.pp, zh.data()).ok());
  ASSERT_TRUE(dev.model.ForwardLogits(b, *dev.pp, zd.data()).ok());
  EXPECT_TRUE(SameBits(zh, zd)) << "logits";
  EXPECT_FALSE(dev.model.Backward(zd.data(), *dev.pp).ok());  // no ForwardLogprobs
  EXPECT_TRUE(gmem->ok()) << gmem->last_error();
}

TEST(ModelDeviceTest, TrainingBitIdenticalQwenUntiedBiasSliding) { CheckTraining(Config(true), 11); }
TEST(ModelDeviceTest, TrainingBitIdenticalLlamaTiedDynamicNtk) { CheckTraining(Config(false), 12); }
TEST(ModelDeviceTest, TrainingBitIdenticalQwen3QkNorm) { CheckTraining(Qwen3Config(), 13); }

void ExpectSameGeneration(const rollout::RolloutResult& a, const rollout::RolloutResult& b) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (size_t s = 0; s < a.sequences.size(); ++s) {
    EXPECT_EQ(a.sequences[s].tokens, b.sequences[s].tokens) << "sequence " << s;
    EXPECT_TRUE(SameBits(a.sequences[s].logprobs, b.sequences[s].logprobs)) << s;
    EXPECT_TRUE(SameBits(a.sequences[s].raw_logprobs, b.sequences[s].raw_logprobs)) << s;
    EXPECT_EQ(a.sequences[s].finish, b.sequences[s].finish) << s;
  }
  EXPECT_EQ(a.kv_pool_bytes, b.kv_pool_bytes);
  EXPECT_EQ(a.kv_peak_bytes, b.kv_peak_bytes);
  EXPECT_EQ(a.generated_tokens, b.generated_tokens);
}

std::vector<rollout::RolloutRequest> Requests(const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<rollout::RolloutRequest> r;
  for (size_t i = 0; i < prompts.size(); ++i) r.push_back({prompts[i], -1, i});
  return r;
}

// Every generated token's raw log-prob equals the full forward's over the
// prompt and the tokens before it (the paged KV cache, its block tables and
// the admission of waiting sequences are right, not just the same on both
// paths).
void ExpectMatchesFullForward(const ModelConfig& c, ParamProvider& pp, const std::vector<std::vector<int32_t>>& prompts,
                              const rollout::RolloutResult& r) {
  auto ops = kernels::MakeCpuOps(1);
  Model model(c, ops.get());
  const int V = c.vocab_size;
  double max_diff = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto& g = r.sequences[s];
    std::vector<int32_t> seq = prompts[s];
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
    Batch b;
    b.cu_seqlens = {0, static_cast<int32_t>(seq.size())};
    for (size_t i = 0; i < seq.size(); ++i) {
      b.tokens.push_back(seq[i]);
      b.targets.push_back(0);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    std::vector<float> logits(seq.size() * V);
    ASSERT_TRUE(model.ForwardLogits(b, pp, logits.data()).ok());
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      const float* row = logits.data() + (prompts[s].size() - 1 + j) * V;
      double mx = row[0], z = 0;
      for (int v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
      for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      const double lp = row[g.tokens[j]] - mx - std::log(z);
      max_diff = std::max(max_diff, std::fabs(g.raw_logprobs[j] - lp));
    }
  }
  EXPECT_LT(max_diff, 1e-4);
}

void CheckGeneration(const ModelConfig& c, uint64_t seed) {
  const ParamLayout layout(c);
  const std::vector<float> params = RandomParams(layout, seed);
  auto host_ops = kernels::MakeCpuOps(1);
  auto gmem = kernels::MakeGuardedMemory(size_t{1} << 30);
  auto gops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), gmem.get());
  kernels::DeviceArray<float> dp;
  ASSERT_TRUE(dp.Allocate(gmem.get(), params.size()));
  dp.Upload(params.data(), params.size());
  std::vector<float> hp = params;
  FlatParamProvider host_pp(layout, hp.data(), nullptr);
  FlatParamProvider dev_pp(layout, dp.data(), nullptr);
  rollout::RolloutEngine host(c, host_ops.get());
  rollout::RolloutEngine dev(c, gops.get(), gmem.get());

  const std::vector<std::vector<int32_t>> small = {{1, 5, 9}, {1, 20}, {1, 3, 4, 7, 8, 11}};
  const std::vector<std::vector<int32_t>> large = {{1, 5, 9, 13},
                                                   {1},
                                                   {1, 3, 4, 7, 8, 11, 12, 17, 19, 21, 22},
                                                   {1, 6, 6},
                                                   {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17},
                                                   {1, 28, 27}};
  rollout::RolloutOptions greedy;
  greedy.sampling.greedy = true;
  greedy.max_new_tokens = 9;
  greedy.block_size = 4;
  greedy.max_batch_tokens = 8;  // chunked prefill beside decode rows
  rollout::RolloutOptions sampled;
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_k = 12;
  sampled.sampling.top_p = 0.95f;
  sampled.sampling.seed = 7;
  sampled.max_new_tokens = 14;
  sampled.stop_ids = {2, 3, 7, 11};  // EOS 2 and others: sequences leave at different steps
  sampled.max_seqs = 4;              // later sequences wait for a free slot
  int stops = 0, lengths = 0;
  // Small first, then larger (KV cache and scratch growth), then small again.
  for (const auto* prompts : {&small, &large, &small}) {
    for (const auto* so : {&greedy, &sampled}) {
      auto h = host.Generate(Requests(*prompts), *so, host_pp);
      auto d = dev.Generate(Requests(*prompts), *so, dev_pp);
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(d.ok()) << d.status();
      ExpectSameGeneration(*h, *d);
      ExpectMatchesFullForward(c, host_pp, *prompts, *h);
      for (const auto& g : d->sequences) {
        (g.finish == rollout::Finish::kStop ? stops : lengths) += 1;
      }
    }
  }
  EXPECT_GT(stops, 0);
  EXPECT_GT(lengths, 0);
  EXPECT_EQ(dev.held_bytes(), host.held_bytes());
  dev.Release();
  EXPECT_EQ(dev.held_bytes(), 0u);
  EXPECT_EQ(gmem->allocated_bytes(), dp.bytes());  // the engine freed everything
  EXPECT_TRUE(gmem->ok()) << gmem->last_error();
}

TEST(ModelDeviceTest, GenerationIdenticalQwen) { CheckGeneration(Config(true, false), 21); }
TEST(ModelDeviceTest, GenerationIdenticalLlama) { CheckGeneration(Config(false, false), 22); }
TEST(ModelDeviceTest, GenerationIdenticalQwen3) { CheckGeneration(Qwen3Config(), 23); }

TEST(ModelDeviceTest, ExhaustedDeviceMemoryIsResourceExhausted) {
  const ModelConfig c = Config(true);
  const ParamLayout layout(c);
  const std::vector<float> params = RandomParams(layout, 5);
  {
    // Params fit, a 4096-token workspace does not.
    auto gmem = kernels::MakeGuardedMemory(size_t{4} << 20);
    auto gops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), gmem.get());
    kernels::DeviceArray<float> dp, dg;
    ASSERT_TRUE(dp.Allocate(gmem.get(), params.size()));
    ASSERT_TRUE(dg.AllocateZeroed(gmem.get(), params.size()));
    dp.Upload(params.data(), params.size());
    FlatParamProvider pp(layout, dp.data(), dg.data());
    Model model(c, gops.get(), 0, gmem.get());
    const Batch big =
        RandomBatch({63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
                     63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
                     63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63},
                    c.vocab_size, 9);
    std::vector<float> logp(big.num_tokens());
    const absl::Status s = model.ForwardLogprobs(big, pp, logp.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(model.capacity_tokens(), 0);
    EXPECT_FALSE(model.Backward(logp.data(), pp).ok());
  }
  {
    auto gmem = kernels::MakeGuardedMemory(size_t{1} << 20);
    auto gops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), gmem.get());
    std::vector<float> hp = params;  // unused: the KV cache fails first
    FlatParamProvider pp(layout, hp.data(), nullptr);
    rollout::RolloutEngine gen(c, gops.get(), gmem.get());
    rollout::RolloutOptions so;
    so.sampling.greedy = true;
    so.max_new_tokens = 4000;
    auto r = gen.Generate(Requests({{1, 2, 3}, {4, 5}}), so, pp);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_EQ(gen.held_bytes(), 0u);
  }
}

}  // namespace
}  // namespace tandem::model
