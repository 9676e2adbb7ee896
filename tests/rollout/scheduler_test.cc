// Scheduler: continuous batching under a token budget, chunked prefill,
// preemption when the cache is full, shared prompts. Driven without a
// model: every sampled token is 7, and a sequence stops after its own
// length.
#include "worker/rollout/scheduler.h"

#include <gtest/gtest.h>

#include <map>

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

}  // namespace
}  // namespace tandem::rollout
