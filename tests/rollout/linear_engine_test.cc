// RolloutEngine with linear-attention layers (hybrid models): each running
// sequence keeps a recurrent state in place of a KV cache in those layers.
// Greedy tokens equal recomputing the training model's full forward at
// every step; tokens do not depend on batch composition, prompt sharing
// (the state forks with the prompt's blocks), chunking or a KV budget that
// preempts; linear layers hold no KV blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout {
namespace {

using model::ModelConfig;

// 4 heads of 8 (linear layers need as many KV heads as heads), 3 layers.
ModelConfig HybridConfig(const std::vector<std::string>& types) {
  nlohmann::json j = {{"vocab_size", 29},
                      {"hidden_size", 32},
                      {"intermediate_size", 40},
                      {"num_hidden_layers", static_cast<int>(types.size())},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 4},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-5},
                      {"eos_token_id", 2},
                      {"bos_token_id", 1},
                      {"tandem_layer_types", types}};
  auto c = model::ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

const std::vector<std::string> kHybrid = {"linear", "full", "window:4"};

struct Fixture {
  Fixture(const std::vector<std::string>& types, kernels::Ops* ops_in)
      : config(HybridConfig(types)), ops(ops_in), m(config, ops) {
    params.assign(m.layout().total_floats(), 0.f);
    std::mt19937_64 rng(23);
    std::normal_distribution<float> nd;
    for (const auto& t : m.layout().tensors()) {
      for (size_t i = 0; i < t.numel; ++i) {
        const float v = nd(rng);
        params[t.offset + i] = t.kind == model::TensorView::Kind::kNorm ? 1.f + 0.1f * v : 0.3f * v;
      }
    }
    pp = std::make_unique<model::FlatParamProvider>(m.layout(), params.data(), nullptr);
  }
  ModelConfig config;
  kernels::Ops* ops;
  model::Model m;
  std::vector<float> params;
  std::unique_ptr<model::FlatParamProvider> pp;
};

// Groups of G samples of four prompts (lengths 1..11).
std::vector<RolloutRequest> Requests(int G) {
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 5, 9, 13}, {1, 20}, {1, 3, 4, 7, 8, 11, 12, 17, 19, 21, 22}, {1}};
  std::vector<RolloutRequest> r;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int g = 0; g < G; ++g) r.push_back({prompts[p], static_cast<int>(p), p * G + g});
  }
  return r;
}

RolloutOptions Small() {
  RolloutOptions o;
  o.max_new_tokens = 10;
  o.block_size = 4;
  o.max_batch_tokens = 7;  // prompts split into chunks, mixed with decode rows
  o.sampling.greedy = true;
  return o;
}

RolloutOptions Sampled() {
  RolloutOptions o = Small();
  o.sampling.greedy = false;
  o.sampling.temperature = 0.9f;
  o.sampling.top_k = 12;
  o.sampling.seed = 7;
  return o;
}

std::vector<std::vector<int32_t>> Tokens(const RolloutResult& r) {
  std::vector<std::vector<int32_t>> t;
  for (const auto& s : r.sequences) t.push_back(s.tokens);
  return t;
}

void ExpectGreedyMatchesFullForward(Fixture& f, const RolloutOptions& o) {
  RolloutEngine eng(f.config, f.ops);
  const auto reqs = Requests(2);
  auto res = eng.Generate(reqs, o, *f.pp);
  ASSERT_TRUE(res.ok()) << res.status();
  const int V = f.config.vocab_size;
  for (size_t s = 0; s < reqs.size(); ++s) {
    const auto& g = res->sequences[s];
    ASSERT_EQ(g.tokens.size(), 10u);
    std::vector<int32_t> seq = reqs[s].prompt;
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end() - 1);
    model::Batch b;
    b.cu_seqlens = {0, static_cast<int32_t>(seq.size())};
    for (size_t i = 0; i < seq.size(); ++i) {
      b.tokens.push_back(seq[i]);
      b.targets.push_back(0);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    std::vector<float> logits(seq.size() * static_cast<size_t>(V));
    ASSERT_TRUE(f.m.ForwardLogits(b, *f.pp, logits.data()).ok());
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      const float* row = logits.data() + (reqs[s].prompt.size() - 1 + j) * V;
      int arg = 0;
      for (int v = 1; v < V; ++v) {
        if (row[v] > row[arg]) arg = v;
      }
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(row[v] - row[arg]);
      EXPECT_EQ(g.tokens[j], arg) << "sequence " << s << " token " << j;
      EXPECT_NEAR(g.raw_logprobs[j], row[g.tokens[j]] - row[arg] - std::log(z), 1e-4)
          << "sequence " << s << " token " << j;
    }
  }
  EXPECT_GT(res->scheduler.prompt_tokens_saved, 0);
}

TEST(LinearRolloutTest, GreedyMatchesFullForward) {
  auto ref = kernels::MakeReferenceOps();
  auto cpu = kernels::MakeCpuOps(0);
  for (kernels::Ops* ops : {ref.get(), cpu.get()}) {
    // Hybrid with a full layer; linear only; linear + window (blocks behind
    // the window are given back).
    for (const auto& types : {kHybrid, std::vector<std::string>{"linear", "linear"},
                              std::vector<std::string>{"linear", "window:4", "linear"}}) {
      SCOPED_TRACE(testing::Message() << ops->name() << " " << types.size() << " layers");
      Fixture f(types, ops);
      ExpectGreedyMatchesFullForward(f, Small());
      RolloutOptions one_chunk = Small();
      one_chunk.max_batch_tokens = 4096;  // whole prompts in one run
      ExpectGreedyMatchesFullForward(f, one_chunk);
    }
  }
}

// The reference backend computes each row alone, so tokens compare exactly.
TEST(LinearRolloutTest, SameTokensForAnyBatchCompositionSharingOrBudget) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f(kHybrid, ops.get());
  for (const RolloutOptions& base : {Small(), Sampled()}) {
    RolloutEngine eng(f.config, f.ops);
    const auto reqs = Requests(3);
    auto all = eng.Generate(reqs, base, *f.pp);
    ASSERT_TRUE(all.ok()) << all.status();
    const auto want = Tokens(*all);
    EXPECT_EQ(all->scheduler.prompt_tokens_saved, 2 * 18);
    for (size_t s = 0; s < reqs.size(); ++s) {
      auto one = eng.Generate({reqs[s]}, base, *f.pp);
      ASSERT_TRUE(one.ok());
      EXPECT_EQ(one->sequences[0].tokens, want[s]) << "sequence " << s;
    }
    std::vector<RolloutRequest> rev(reqs.rbegin(), reqs.rend());
    auto r = eng.Generate(rev, base, *f.pp);
    ASSERT_TRUE(r.ok());
    for (size_t s = 0; s < reqs.size(); ++s) EXPECT_EQ(r->sequences[reqs.size() - 1 - s].tokens, want[s]);
    for (int variant = 0; variant < 5; ++variant) {
      RolloutOptions o = base;
      if (variant == 0) o.share_prompts = false;
      if (variant == 1) o.max_seqs = 1;
      if (variant == 2) o.max_batch_tokens = 4096;
      if (variant == 3) o.max_batch_tokens = 1;  // one position per step
      if (variant == 4) o.static_batch = true;
      auto v = eng.Generate(reqs, o, *f.pp);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(Tokens(*v), want) << "variant " << variant;
    }
  }
}

// Under a budget of a few blocks the newest sequences are preempted and
// recomputed from position 0 (their state included), with the same tokens.
TEST(LinearRolloutTest, TinyBudgetPreemptsAndRecomputesWithSameTokens) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f(kHybrid, ops.get());
  RolloutEngine eng(f.config, f.ops);
  const auto reqs = Requests(3);
  for (bool share : {true, false}) {
    RolloutOptions base = Sampled();
    base.share_prompts = share;
    auto big = eng.Generate(reqs, base, *f.pp);
    ASSERT_TRUE(big.ok()) << big.status();
    EXPECT_EQ(big->scheduler.preemptions, 0);
    RolloutOptions tiny = base;
    // 7 blocks of 4 in the two KV layers (the longest sequence needs 6),
    // after the states of the running sequences.
    const size_t state = static_cast<size_t>(reqs.size()) * 4 * 8 * 8 * sizeof(float);
    tiny.kv_cache_bytes = state + 7 * KvPool::BlockBytes(2, 4 * 8, 4, kernels::KvDtype::kF32);
    auto small = eng.Generate(reqs, tiny, *f.pp);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(small->num_blocks, 7);
    EXPECT_EQ(small->state_bytes, state);
    EXPECT_GT(small->scheduler.preemptions, 0);
    EXPECT_GT(small->scheduler.recomputed_tokens, 0);
    EXPECT_LE(small->kv_peak_bytes, tiny.kv_cache_bytes);
    EXPECT_EQ(Tokens(*small), Tokens(*big)) << "share " << share;
  }
}

// Linear layers hold no KV blocks: a block costs the two softmax layers
// only, and the states are one per running sequence.
TEST(LinearRolloutTest, LinearLayersHoldStatesNotKvBlocks) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f(kHybrid, ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Small();
  o.max_seqs = 5;
  auto r = eng.Generate(Requests(2), o, *f.pp);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t state = 5 * 4 * 8 * 8 * sizeof(float);  // 5 slots, H x D x D
  EXPECT_EQ(r->state_bytes, state);
  EXPECT_EQ(r->kv_pool_bytes, state + r->num_blocks * KvPool::BlockBytes(2, 4 * 8, 4, kernels::KvDtype::kF32));
  EXPECT_LE(r->scheduler.max_running, 5);
  // A model of linear layers only: no KV at all, states alone.
  Fixture g({"linear", "linear"}, ops.get());
  RolloutEngine eng2(g.config, g.ops);
  auto s = eng2.Generate(Requests(2), o, *g.pp);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kv_pool_bytes, 2 * state);
  // A budget below the states is refused by name.
  o.kv_cache_bytes = state - 1;
  auto low = eng.Generate(Requests(2), o, *f.pp);
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find("rollout.kv_cache_bytes"), std::string::npos) << low.status();
  EXPECT_NE(low.status().message().find("rollout.max_seqs"), std::string::npos) << low.status();
}

TEST(LinearRolloutTest, SinkLayersAreRefusedByName) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f({"linear", "sink:2+window:4"}, ops.get());
  RolloutEngine eng(f.config, f.ops);
  auto r = eng.Generate(Requests(1), Small(), *f.pp);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("layer 1"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace tandem::rollout
