// The rollout engine with top-k block-sparse attention (rollout.sparse):
// with every block chosen it generates the dense engine's tokens; with few
// blocks its tokens still do not depend on batch composition, prompt
// sharing or preemption (page summaries are copied with copy-on-write
// blocks and rebuilt on recomputation); summaries count in the KV budget;
// bad options are refused by name; a tensor-parallel forward refuses it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/rollout/tp_test_util.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout {
namespace {

using tptest::Config;

struct Model {
  explicit Model(const std::string& kind, kernels::Ops* ops_in)
      : config(Config(kind)),
        ops(ops_in),
        layout(config),
        params(tptest::RandomParams(config, 5 + kind.size())),
        pp(layout, params.data(), nullptr) {}
  model::ModelConfig config;
  kernels::Ops* ops;
  model::ParamLayout layout;
  std::vector<float> params;
  model::FlatParamProvider pp;
};

// Long enough for many sparse blocks: blocks of 4 (or 8) positions, 1 sink,
// 1 recent and 1 chosen block out of up to 13.
RolloutOptions SparseOptions(bool greedy, int block = 4) {
  RolloutOptions o = tptest::Small(greedy);
  o.max_new_tokens = 40;
  o.sparse = kernels::SparseDecodeParams{block, 1, 1, 1};
  return o;
}

using enginetest::Tokens;

TEST(SparseEngineTest, AllBlocksChosenGenerateTheDenseTokens) {
  auto ops = kernels::MakeCpuOps(1);
  for (const char* kind : {"llama", "qwen", "qwen3"}) {
    SCOPED_TRACE(kind);
    Model m(kind, ops.get());
    RolloutEngine eng(m.config, m.ops);
    RolloutOptions dense = SparseOptions(true);
    dense.sparse.reset();
    RolloutOptions all = SparseOptions(true);
    all.sparse->top_k_blocks = 1000;
    auto a = eng.Generate(tptest::Requests(2), dense, m.pp);
    auto b = eng.Generate(tptest::Requests(2), all, m.pp);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    tptest::ExpectSameTokens(*a, *b, tptest::kLogprobTol);
  }
}

// The reference backend computes each row alone, so tokens compare exactly.
TEST(SparseEngineTest, SameTokensForAnyBatchSharingOrBudget) {
  auto ops = kernels::MakeReferenceOps();
  Model m("llama", ops.get());
  const auto reqs = tptest::Requests(3);
  for (int block : {4, 8}) {
    for (bool greedy : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "block " << block << (greedy ? " greedy" : " sampled"));
      RolloutEngine eng(m.config, m.ops);
      const RolloutOptions base = SparseOptions(greedy, block);
      auto all = eng.Generate(reqs, base, m.pp);
      ASSERT_TRUE(all.ok()) << all.status();
      const auto want = Tokens(*all);
      EXPECT_GT(all->scheduler.prompt_tokens_saved, 0);
      // Sparse attention is on: the log-probs differ from dense ones.
      RolloutOptions dense = base;
      dense.sparse.reset();
      auto d = eng.Generate(reqs, dense, m.pp);
      ASSERT_TRUE(d.ok());
      double diff = 0;
      for (size_t s = 0; s < reqs.size(); ++s) {
        const size_t n = std::min(d->sequences[s].raw_logprobs.size(), all->sequences[s].raw_logprobs.size());
        for (size_t j = 0; j < n; ++j) {
          diff = std::max(diff, double(std::abs(d->sequences[s].raw_logprobs[j] - all->sequences[s].raw_logprobs[j])));
        }
      }
      EXPECT_GT(diff, 1e-3);
      for (size_t s = 0; s < reqs.size(); s += 4) {
        auto one = eng.Generate({reqs[s]}, base, m.pp);
        ASSERT_TRUE(one.ok());
        EXPECT_EQ(one->sequences[0].tokens, want[s]) << "sequence " << s;
      }
      for (int variant = 0; variant < 3; ++variant) {
        RolloutOptions o = base;
        if (variant == 0) o.share_prompts = false;
        if (variant == 1) o.max_batch_tokens = 4096;
        // 16 blocks of 4: preemption and recomputation.
        if (variant == 2) o.kv_cache_bytes = 16 * KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32, true);
        auto v = eng.Generate(reqs, o, m.pp);
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_EQ(Tokens(*v), want) << "variant " << variant;
        if (variant == 2) {
          EXPECT_EQ(v->num_blocks, 16);
          EXPECT_GT(v->scheduler.preemptions, 0);
        }
      }
    }
  }
}

TEST(SparseEngineTest, SummariesCountInTheKvCache) {
  auto ops = kernels::MakeCpuOps(1);
  Model m("llama", ops.get());
  RolloutEngine eng(m.config, m.ops);
  auto r = eng.Generate(tptest::Requests(2), SparseOptions(true), m.pp);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t block = KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32, true);
  EXPECT_EQ(block, KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32) + 3 * 2 * 16 * sizeof(float));
  EXPECT_EQ(r->kv_pool_bytes, size_t(r->num_blocks) * block);
  EXPECT_EQ(r->kv_peak_bytes % block, 0u);
}

TEST(SparseEngineTest, BadOptionsAreRefusedByName) {
  auto ops = kernels::MakeCpuOps(1);
  Model m("llama", ops.get());
  RolloutEngine eng(m.config, m.ops);
  const std::vector<std::pair<kernels::SparseDecodeParams, std::string>> bad = {
      {{6, 1, 1, 1}, "rollout.sparse.block_size 6 is not a multiple of rollout.block_size 4"},
      {{2, 1, 1, 1}, "rollout.sparse.block_size 2 is not a multiple"},
      {{4, 0, 1, 1}, "rollout.sparse needs top_k_blocks >= 1"},
      {{4, 1, -1, 1}, "rollout.sparse needs"},
      {{4, 1, 1, 0}, "rollout.sparse needs"},
  };
  for (const auto& [s, want] : bad) {
    RolloutOptions o = SparseOptions(true);
    o.sparse = s;
    auto r = eng.Generate(tptest::Requests(1), o, m.pp);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace tandem::rollout
