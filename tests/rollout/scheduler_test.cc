// Scheduler: continuous batching under a token budget, chunked prefill,
// preemption when the cache is full, shared prompts. Driven without a
// model: every sampled token is 7, and a sequence stops after its own
// length.
#include "worker/rollout/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

namespace tandem::rollout {
namespace {

struct Trace {
  std::vector<int> steps_rows;
  std::map<int, int> finish_step;  // sequence -> step it finished in
  int max_rows = 0;
};

// Appends the token 7 to the sampled sequence; finishes it once it has
// lengths[seq] tokens (returns whether it did).
bool AppendSample(Scheduler& sch, int seq, const std::vector<int>& lengths) {
  sch.Append(seq, 7);
  if (sch.generated(seq) < lengths[seq]) return false;
  sch.Finish(seq);
  return true;
}

// Runs the scheduler to the end; sequence s stops after lengths[s] tokens.
Trace Drive(Scheduler& sch, const std::vector<int>& lengths) {
  Trace run;
  Scheduler::Step step;
  for (int guard = 0; guard < 100000 && sch.Schedule(&step); ++guard) {
    EXPECT_GT(step.rows, 0);
    run.steps_rows.push_back(step.rows);
    run.max_rows = std::max(run.max_rows, step.rows);
    sch.Commit(step);
    for (const auto& s : step.samples) {
      if (AppendSample(sch, s.seq, lengths)) run.finish_step[s.seq] = static_cast<int>(run.steps_rows.size());
    }
  }
  return run;
}

TEST(SchedulerTest, AdmitsNewSequencesAsOthersFinish) {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  o.max_seqs = 2;
  Scheduler sch(o);
  std::vector<int> lengths = {20, 2, 2, 2};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(sch.Add({1, 2, 3}, -1, 20).ok());
  Trace run = Drive(sch, lengths);
  // The short ones run beside the long one, one after the other: all done
  // well before the long one ends (a static batch would wait for it).
  EXPECT_LT(run.finish_step[3], run.finish_step[0]);
  EXPECT_EQ(static_cast<int>(run.steps_rows.size()), 20);
  EXPECT_EQ(sch.blocks().free_blocks(), 64);
}

TEST(SchedulerTest, TokenBudgetChunksThePrefill) {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_batch_tokens = 5;
  Scheduler sch(o);
  std::vector<int32_t> prompt(12, 3);
  ASSERT_TRUE(sch.Add(prompt, -1, 3).ok());
  ASSERT_TRUE(sch.Add(prompt, -1, 3).ok());
  Trace run = Drive(sch, {3, 3});
  EXPECT_LE(run.max_rows, 5);
  EXPECT_EQ(sch.stats().prefill_tokens, 24);
  EXPECT_EQ(sch.stats().preemptions, 0);
}

TEST(SchedulerTest, PreemptsTheNewestWhenTheCacheIsFull) {
  SchedulerOptions o;
  o.num_blocks = 6;  // 24 positions for 3 sequences of up to 14
  o.block_size = 4;
  o.max_batch_tokens = 64;
  Scheduler sch(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sch.Add({1, 2, 3, 4}, -1, 10).ok());
  Trace run = Drive(sch, {10, 10, 10});
  EXPECT_GT(sch.stats().preemptions, 0);
  EXPECT_GT(sch.stats().recomputed_tokens, 0);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(sch.generated(s), 10);
  EXPECT_EQ(sch.blocks().free_blocks(), 6);
  EXPECT_LE(sch.blocks().peak_used_blocks(), 6);
}

TEST(SchedulerTest, RejectsASequenceLargerThanTheCache) {
  SchedulerOptions o;
  o.num_blocks = 2;
  o.block_size = 4;
  Scheduler sch(o);
  auto r = sch.Add({1, 2, 3}, -1, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rollout.kv_cache_bytes"), std::string::npos);
}

TEST(SchedulerTest, SharedPromptIsPrefilledOnceAndCopiedOnWrite) {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  Scheduler sch(o);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};  // last block half full
  for (int g = 0; g < 4; ++g) ASSERT_TRUE(sch.Add(prompt, /*group=*/0, 3).ok());
  Scheduler::Step step;
  ASSERT_TRUE(sch.Schedule(&step));
  EXPECT_EQ(step.rows, 6);  // one prefill for the group
  ASSERT_EQ(step.samples.size(), 4u);
  for (const auto& s : step.samples) EXPECT_EQ(s.row, 5);
  sch.Commit(step);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(sch.table(s)[0], sch.table(0)[0]);
  EXPECT_EQ(sch.blocks().ref_count(sch.table(0)[1]), 4);
  for (const auto& s : step.samples) sch.Append(s.seq, 7);
  ASSERT_TRUE(sch.Schedule(&step));
  EXPECT_EQ(step.rows, 4);
  EXPECT_EQ(step.copies.size(), 3u);  // the last writer owns the block
  sch.Commit(step);
  for (const auto& s : step.samples) sch.Append(s.seq, 7);
  EXPECT_EQ(sch.stats().prefill_tokens, 6);
  EXPECT_EQ(sch.stats().prompt_tokens_saved, 18);
  for (int s = 1; s < 4; ++s) EXPECT_NE(sch.table(s)[1], sch.table(0)[1]);
}

TEST(SchedulerTest, ALateSampleForksTheRunningSiblingsPrompt) {
  // max_seqs 2: the group's first two samples prefill once; the other two
  // wait. When sample 1 finishes, sample 2 forks sample 0's prompt blocks
  // and recomputes only the prompt's last position (one row, its logits
  // give the first token; the shared half-full block is copied first).
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  o.max_seqs = 2;
  Scheduler sch(o);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  for (int g = 0; g < 4; ++g) ASSERT_TRUE(sch.Add(prompt, /*group=*/0, 20).ok());
  const std::vector<int> lengths = {12, 1, 3, 2};
  Scheduler::Step step;
  ASSERT_TRUE(sch.Schedule(&step));
  EXPECT_EQ(step.rows, 6);
  ASSERT_EQ(step.samples.size(), 2u);
  sch.Commit(step);
  for (const auto& s : step.samples) AppendSample(sch, s.seq, lengths);
  // Sample 1 is done: sample 0 decodes, sample 2 joins with one row.
  ASSERT_TRUE(sch.Schedule(&step));
  EXPECT_EQ(step.rows, 2);
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.chunks[1].seq, 2);
  EXPECT_EQ(step.chunks[1].start, 5);
  EXPECT_EQ(step.chunks[1].n, 1);
  EXPECT_EQ(sch.table(2)[0], sch.table(0)[0]);  // the full prompt block is shared
  EXPECT_EQ(step.copies.size(), 1u);            // sample 2 copies the half-full one before writing 5
  sch.Commit(step);
  for (const auto& s : step.samples) AppendSample(sch, s.seq, lengths);
  const Trace rest = Drive(sch, lengths);
  EXPECT_FALSE(rest.steps_rows.empty());
  // One prefill of 6 rows, then 1 row for each late sample.
  EXPECT_EQ(sch.stats().prefill_tokens, 6 + 1 + 1);
  EXPECT_EQ(sch.stats().prompt_tokens_saved, 6 + 5 + 5);
}

// Two pools: the full layers' pool keeps every block of a sequence, the
// windowed layers' pool gives back those behind the window (4 positions,
// blocks of 4: at most 3 held per sequence), so two sequences of 9 + 40
// positions run in 6 windowed blocks beside 24 full ones (the last token's
// k/v is never computed).
TEST(SchedulerTest, WindowedPoolGivesBlocksBackBesideAFullPool) {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  o.windowed = {6, 4, 0};
  Scheduler sch(o);
  ASSERT_EQ(sch.num_pools(), 2);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(sch.Add({1, 2, 3, 4, 5, 6, 7, 8, 9}, -1, 40).ok());
  const std::vector<int> lengths = {40, 40};
  Scheduler::Step step;
  for (int guard = 0; guard < 1000 && sch.Schedule(&step); ++guard) {
    ASSERT_GT(step.rows, 0);
    sch.Commit(step);
    for (int s = 0; s < 2; ++s) {
      const BlockTable& full = sch.table(s, 0);
      const BlockTable& win = sch.table(s, 1);
      EXPECT_EQ(full.size(), win.size());
      EXPECT_EQ(std::count(full.begin(), full.end(), -1), 0);
      EXPECT_LE(win.size() - std::count(win.begin(), win.end(), -1), 3u);
    }
    for (const auto& smp : step.samples) AppendSample(sch, smp.seq, lengths);
  }
  EXPECT_EQ(sch.generated(0), 40);
  EXPECT_EQ(sch.generated(1), 40);
  EXPECT_EQ(sch.blocks(0).peak_used_blocks(), 24);
  EXPECT_LE(sch.blocks(1).peak_used_blocks(), 6);
  EXPECT_EQ(sch.blocks(0).free_blocks(), 64);
  EXPECT_EQ(sch.blocks(1).free_blocks(), 6);
}

// A shared prompt forks both tables; the first writes into its partly
// filled last block copy it in each pool, and every copy names its pool.
TEST(SchedulerTest, SharedPromptIsCopiedOnWriteInBothPools) {
  SchedulerOptions o;
  o.num_blocks = 32;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  o.windowed = {32, 8, 0};
  Scheduler sch(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sch.Add({1, 2, 3, 4, 5, 6}, 0, 4).ok());
  Scheduler::Step step;
  ASSERT_TRUE(sch.Schedule(&step));
  EXPECT_EQ(step.rows, 6);  // the prompt once
  EXPECT_EQ(step.forks.size(), 2u);
  sch.Commit(step);
  for (int s = 0; s < 3; ++s) sch.Append(s, 7);
  for (int pool = 0; pool < 2; ++pool) {
    EXPECT_EQ(sch.table(1, pool), sch.table(0, pool));
    EXPECT_EQ(sch.blocks(pool).ref_count(sch.table(0, pool)[1]), 3);
  }
  ASSERT_TRUE(sch.Schedule(&step));
  EXPECT_EQ(step.rows, 3);
  int per_pool[2] = {0, 0};
  for (const BlockCopy& c : step.copies) ++per_pool[c.pool];
  EXPECT_EQ(per_pool[0], 2);  // the last writer owns the block
  EXPECT_EQ(per_pool[1], 2);
  for (int pool = 0; pool < 2; ++pool) {
    EXPECT_EQ(sch.table(1, pool)[0], sch.table(0, pool)[0]);
    EXPECT_NE(sch.table(1, pool)[1], sch.table(0, pool)[1]);
  }
}

// A late sample forks a running sibling's prompt only while the sibling
// still holds the window its first position reads: prompt of 9 (blocks
// 0-2), window 4, 2 running at once. The third sample starts at position 8
// and reads blocks 1 and 2: after one generated token the long sibling
// holds them (fork, 8 positions saved); after four it gave block 1 back
// (the prompt is computed again).
TEST(SchedulerTest, LateSampleForksOnlyWhileTheSiblingHoldsItsWindow) {
  for (const bool holds : {true, false}) {
    SchedulerOptions o;
    o.num_blocks = 64;
    o.block_size = 4;
    o.max_batch_tokens = 64;
    o.max_seqs = 2;
    o.windowed = {32, 4, 0};
    Scheduler sch(o);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(sch.Add({1, 2, 3, 4, 5, 6, 7, 8, 9}, 0, 20).ok());
    Drive(sch, {20, holds ? 1 : 4, 3});
    EXPECT_EQ(sch.generated(2), 3);
    EXPECT_EQ(sch.stats().prompt_tokens_saved, holds ? 9 + 8 : 9) << "holds " << holds;
    EXPECT_EQ(sch.stats().prefill_tokens, holds ? 9 + 1 : 9 + 9) << "holds " << holds;
  }
}

// A sequence must fit in each pool: one whose window does not fit the
// windowed pool is refused, naming the windowed layers.
TEST(SchedulerTest, RejectsASequenceLargerThanTheWindowedPool) {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.windowed = {2, 8, 0};  // a window of 8 needs (8 - 1) / 4 + 2 = 3
  Scheduler sch(o);
  auto r = sch.Add({1, 2, 3, 4, 5, 6, 7, 8, 9}, -1, 20);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("windowed layers"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace tandem::rollout
