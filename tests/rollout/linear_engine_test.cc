// RolloutEngine with linear-attention layers (hybrid models): each running
// sequence keeps a recurrent state in place of a KV cache in those layers.
// Greedy tokens equal recomputing the training model's full forward at
// every step; tokens do not depend on batch composition, prompt sharing
// (the state forks with the prompt's blocks), chunking or a KV budget that
// preempts; linear layers hold no KV blocks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "tests/rollout/engine_test_util.h"
#include "tests/rollout/tp_test_util.h"
#include "worker/model/config.h"
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

struct Fixture : enginetest::ModelFixture {
  Fixture(const std::vector<std::string>& types, kernels::Ops* ops) : ModelFixture(HybridConfig(types), ops, 23) {}
};

using enginetest::ExpectGreedyMatchesFullForward;
using enginetest::Tokens;
using tptest::Requests;  // groups of G samples of 4 prompts (lengths 1..11)

RolloutOptions Small() { return tptest::Small(/*greedy=*/true); }

RolloutOptions Sampled() {
  RolloutOptions o = tptest::Small(/*greedy=*/false);
  o.sampling.top_k = 12;
  return o;
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
    // 14 blocks of 4 of one layer, after the states of the running
    // sequences: the full layer's pool gets the 6 the longest sequence
    // needs, the window layer's 2, and the rest in proportion (3 and 2).
    const size_t state = static_cast<size_t>(reqs.size()) * 4 * 8 * 8 * sizeof(float);
    tiny.kv_cache_bytes = state + 14 * KvPool::BlockBytes(1, 4 * 8, 4, kernels::KvDtype::kF32);
    auto small = eng.Generate(reqs, tiny, *f.pp);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(small->num_blocks, 9);
    EXPECT_EQ(small->windowed_blocks, 4);
    EXPECT_EQ(small->state_bytes, state);
    EXPECT_GT(small->scheduler.preemptions, 0);
    EXPECT_GT(small->scheduler.recomputed_tokens, 0);
    EXPECT_LE(small->kv_peak_bytes, tiny.kv_cache_bytes);
    EXPECT_EQ(Tokens(*small), Tokens(*big)) << "share " << share;
  }
}

// Linear layers hold no KV blocks: a block costs the softmax layers only
// (the full and the window layer, each in its pool), and the states are
// one per running sequence.
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
  EXPECT_EQ(r->kv_pool_bytes,
            state + (r->num_blocks + r->windowed_blocks) * KvPool::BlockBytes(1, 4 * 8, 4, kernels::KvDtype::kF32));
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

// Attention-sink layers beside linear and full ones: the paged cache gives
// them their sinks and window, the training forward the same rows.
TEST(LinearRolloutTest, SinkLayersMatchFullForward) {
  auto ref = kernels::MakeReferenceOps();
  auto cpu = kernels::MakeCpuOps(0);
  for (kernels::Ops* ops : {ref.get(), cpu.get()}) {
    SCOPED_TRACE(ops->name());
    Fixture f({"linear", "sink:2+window:4", "full"}, ops);
    ExpectGreedyMatchesFullForward(f, Small());
  }
}

}  // namespace
}  // namespace tandem::rollout
