// PlanKvCache: one pool when every KV layer is full or every one windowed,
// a pool of their own for windowed layers beside full ones, budgets split
// so the longest sequence always fits, and the KV bytes of a 16k-token
// generation with LongGen's layer pattern on a Llama-3-8B shape.
#include "worker/rollout/kv_plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "worker/rollout/kv_pool.h"
#include "worker/rollout/scheduler.h"

namespace tandem::rollout {
namespace {

using model::LayerKind;
using model::LayerType;

const LayerType kFull{};
const LayerType kLinear{LayerKind::kLinear};
LayerType Window(int n) { return {LayerKind::kWindow, n, 0}; }
LayerType SinkWindow(int s, int n) { return {LayerKind::kSinkWindow, n, s}; }

KvPlanRequest Request(std::vector<LayerType> layers, std::vector<int64_t> positions) {
  KvPlanRequest r;
  r.layers = std::move(layers);
  r.kv_dim = 16;
  r.linear_state_floats = 64;
  r.positions = std::move(positions);
  r.block_size = 4;
  r.max_batch_tokens = 8;
  return r;
}

TEST(KvPlanTest, OnePoolUnlessWindowedLayersSitBesideFullOnes) {
  auto full = PlanKvCache(Request({kFull, kFull}, {40, 10}));
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->num_blocks, 10 + 3);
  EXPECT_EQ(full->windowed_blocks, 0);
  EXPECT_EQ(full->window, 0);
  // Every KV layer windowed: one pool that gives blocks back, bounded by
  // the window and one step's rows: (4 - 1 + 8) / 4 + 2 = 4.
  auto win = PlanKvCache(Request({Window(4), kLinear, Window(3)}, {40, 10}));
  ASSERT_TRUE(win.ok());
  EXPECT_EQ(win->windowed_blocks, 0);
  EXPECT_EQ(win->window, 4);
  EXPECT_EQ(win->num_blocks, 4 + 3);
  EXPECT_EQ(win->state_slots, 2);
  EXPECT_EQ(win->state_bytes, 2 * 64 * sizeof(float));
  // Beside a full layer: pool 0 holds the full layer at full length, pool
  // 1 the two windowed layers bounded (sink block + 4 for the 40-position
  // sequence).
  auto mixed = PlanKvCache(Request({Window(4), kFull, SinkWindow(2, 4)}, {40, 10}));
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->window, 0);
  EXPECT_EQ(mixed->windowed_window, 4);
  EXPECT_EQ(mixed->windowed_sinks, 2);
  EXPECT_EQ(mixed->windowed, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(mixed->num_blocks, 13);
  EXPECT_EQ(mixed->windowed_blocks, 5 + 3);
  EXPECT_EQ(mixed->block_bytes, KvPool::BlockBytes(1, 16, 4, kernels::KvDtype::kF32));
  EXPECT_EQ(mixed->windowed_block_bytes, KvPool::BlockBytes(2, 16, 4, kernels::KvDtype::kF32));
}

// A budget: each pool first gets what the longest sequence needs (10 full
// blocks, 1 + 0 + 2 windowed ones), then the rest in proportion.
TEST(KvPlanTest, BudgetKeepsTheLongestSequenceInEachPool) {
  KvPlanRequest r = Request({Window(4), kFull, SinkWindow(2, 4)}, {40, 40, 40});
  const size_t b0 = KvPool::BlockBytes(1, 16, 4, kernels::KvDtype::kF32);
  const size_t b1 = KvPool::BlockBytes(2, 16, 4, kernels::KvDtype::kF32);
  r.kv_cache_bytes = 10 * b0 + 3 * b1;
  auto least = PlanKvCache(r);
  ASSERT_TRUE(least.ok());
  EXPECT_EQ(least->num_blocks, 10);
  EXPECT_EQ(least->windowed_blocks, 3);
  EXPECT_LE(least->bytes(), r.kv_cache_bytes);
  // Room for 20 more full-layer blocks' bytes: the 20 full blocks and 12
  // windowed ones still wanted share it in proportion.
  r.kv_cache_bytes += 20 * b0;
  auto more = PlanKvCache(r);
  ASSERT_TRUE(more.ok());
  EXPECT_GT(more->num_blocks, 10);
  EXPECT_GT(more->windowed_blocks, 3);
  EXPECT_LE(more->bytes(), r.kv_cache_bytes);
  // Room for everything: each pool at full length, no more.
  r.kv_cache_bytes = 1 << 30;
  auto all = PlanKvCache(r);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->num_blocks, 30);
  EXPECT_EQ(all->windowed_blocks, 15);
  // Short of the least: pool 1 keeps its least, pool 0 is short (the
  // scheduler refuses the sequence by name).
  r.kv_cache_bytes = 10 * b0 + 3 * b1 - 1;
  auto short_of = PlanKvCache(r);
  ASSERT_TRUE(short_of.ok());
  EXPECT_EQ(short_of->windowed_blocks, 3);
  EXPECT_EQ(short_of->num_blocks, 9);
}

TEST(KvPlanTest, BudgetBelowTheStatesIsRefusedByName) {
  KvPlanRequest r = Request({kLinear, kFull}, {40, 10});
  r.kv_cache_bytes = 2 * 64 * sizeof(float) - 1;
  auto p = PlanKvCache(r);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("rollout.kv_cache_bytes"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("rollout.max_seqs"), std::string::npos) << p.status();
}

// LongGen's pattern on a Llama-3-8B shape (32 layers, 8 KV heads of 128,
// fp32 KV, blocks of 16): full attention in layers 11-21,
// sink:64+window:960 elsewhere. One 16384-position generation: the pools
// as planned, and the blocks the scheduler actually holds at its peak.
TEST(KvPlanTest, LongGenPatternHoldsLessKvAt16kTokens) {
  std::vector<LayerType> full_only(32, kFull), longgen(32, SinkWindow(64, 960));
  for (int l = 11; l <= 21; ++l) longgen[l] = kFull;
  KvPlanRequest r;
  r.kv_dim = 8 * 128;
  r.positions = {16384};
  r.block_size = 16;
  r.max_batch_tokens = 512;
  r.layers = full_only;
  auto dense = PlanKvCache(r);
  r.layers = longgen;
  auto hybrid = PlanKvCache(r);
  ASSERT_TRUE(dense.ok() && hybrid.ok());
  const double mib = 1024.0 * 1024.0;
  EXPECT_EQ(dense->bytes(), size_t{4096} << 20);
  EXPECT_EQ(hybrid->num_blocks, 1024);
  EXPECT_EQ(hybrid->windowed_blocks, 4 + (960 - 1 + 512) / 16 + 2);

  // The scheduler's peak: prompt 16, 16368 new tokens, 512 rows a step.
  SchedulerOptions so;
  so.num_blocks = hybrid->num_blocks;
  so.block_size = 16;
  so.max_batch_tokens = 512;
  so.windowed = {hybrid->windowed_blocks, hybrid->windowed_window, hybrid->windowed_sinks};
  Scheduler sch(so);
  ASSERT_TRUE(sch.Add(std::vector<int32_t>(16, 1), -1, 16384 - 16).ok());
  Scheduler::Step step;
  for (int guard = 0; guard < 20000 && sch.Schedule(&step); ++guard) {
    sch.Commit(step);
    for (const auto& s : step.samples) {
      sch.Append(s.seq, 7);
      if (sch.generated(s.seq) == 16384 - 16) sch.Finish(s.seq);
    }
  }
  ASSERT_EQ(sch.generated(0), 16384 - 16);
  const size_t peak = static_cast<size_t>(sch.blocks(0).peak_used_blocks()) * hybrid->block_bytes +
                      static_cast<size_t>(sch.blocks(1).peak_used_blocks()) * hybrid->windowed_block_bytes;
  std::printf(
      "[longgen] 16384 positions: full attention %.0f MiB; LongGen pattern: pools %.1f MiB "
      "(%d + %d blocks), peak in use %.1f MiB (%d + %d blocks), %.1f%% less than full\n",
      dense->bytes() / mib, hybrid->bytes() / mib, hybrid->num_blocks, hybrid->windowed_blocks, peak / mib,
      sch.blocks(0).peak_used_blocks(), sch.blocks(1).peak_used_blocks(),
      100.0 * (1.0 - static_cast<double>(peak) / static_cast<double>(dense->bytes())));
  // The sinks' 4 blocks, the window's 60 and the row's block (and the one
  // being filled).
  EXPECT_LE(sch.blocks(1).peak_used_blocks(), 4 + 960 / 16 + 2);
  // LongGen reports 62% less; the block granularity costs a little.
  EXPECT_LT(static_cast<double>(peak), 0.40 * static_cast<double>(dense->bytes()));
}

}  // namespace
}  // namespace tandem::rollout
