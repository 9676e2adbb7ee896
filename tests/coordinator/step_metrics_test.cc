#include "server/jobs/step_metrics.h"

#include <gtest/gtest.h>

#include "server/jobs/phase_commands.h"

namespace tandem::server {
namespace {

TEST(StepMetricsTest, MergeKeepsNonZeroFiguresAndTheFirstPhaseTime) {
  tandem::v1::StepMetrics acc;
  (*acc.mutable_phase_seconds())["rollout"] = 2.0;  // the coordinator's timing
  tandem::v1::StepMetrics rollout;
  rollout.set_reward_mean(0.5);
  rollout.set_switch_seconds(0.25);
  rollout.set_peak_memory_bytes(100);
  (*rollout.mutable_phase_seconds())["rollout"] = 1.5;
  (*rollout.mutable_phase_seconds())["rollout_enter"] = 0.1;
  MergeMetrics(&acc, rollout);
  tandem::v1::StepMetrics update;
  update.set_loss(0.75);
  update.set_switch_seconds(0.5);
  update.set_peak_memory_bytes(50);
  (*update.mutable_extra())["clip_fraction"] = 0.1;
  MergeMetrics(&acc, update);
  EXPECT_EQ(acc.reward_mean(), 0.5);  // a zero in a later phase does not erase it
  EXPECT_EQ(acc.loss(), 0.75);
  EXPECT_EQ(acc.switch_seconds(), 0.75);
  EXPECT_EQ(acc.peak_memory_bytes(), 100);
  EXPECT_EQ(acc.phase_seconds().at("rollout"), 2.0);
  EXPECT_EQ(acc.phase_seconds().at("rollout_enter"), 0.1);
  EXPECT_EQ(acc.extra().at("clip_fraction"), 0.1);
}

TEST(StepMetricsTest, SummaryLeavesOutZeroFigures) {
  tandem::v1::StepMetrics m;
  m.set_step(3);
  m.set_loss(0.123456);
  m.set_tokens_per_s(1234.4);
  EXPECT_EQ(StepSummary(m, 10), "step 3/10 loss 0.1235 tokens/s 1234");
  EXPECT_FALSE(WarmStartHeld(m));
  EXPECT_EQ(TeacherForcedExact(m), "?");
  (*m.mutable_extra())["warm_start_held"] = 1;
  (*m.mutable_extra())["teacher_forced_exact"] = 0.75;
  EXPECT_TRUE(WarmStartHeld(m));
  EXPECT_EQ(TeacherForcedExact(m), "0.750");
}

TEST(PhaseCommandsTest, IdsAreDeterministicAndSetupCarriesTheAssignment) {
  tandem::v1::Job job;
  job.set_id("j-000007");
  job.set_generation(3);
  job.add_worker_ids("w-1");
  job.add_worker_ids("w-2");
  tandem::v1::DriverState state;
  state.set_restore_from("/ckpt/step-00000004");
  const auto step = MakePhaseCommand(job, {5, 2}, {tandem::v1::PHASE_UPDATE, 4}, false, 1000);
  EXPECT_EQ(step.command_id(), "j-000007/g3/u5/p2");
  EXPECT_EQ(step.deadline_ms(), 1000);
  const auto extra = MakePhaseCommand(job, {5, 0}, {tandem::v1::PHASE_CHECKPOINT, 4}, true, 1000);
  EXPECT_EQ(extra.command_id(), "j-000007/g3/u5/xcheckpoint4");
  const auto setup = MakePhaseCommand(job, {0, 0}, {tandem::v1::PHASE_SETUP, 0}, false, 1000);
  const auto command = CommandForRank(job, state, setup, 1, "/runs");
  const auto& a = command.phase().assignment();
  EXPECT_EQ(a.rank(), 1);
  EXPECT_EQ(a.world_size(), 2);
  EXPECT_EQ(a.generation(), 3);
  EXPECT_EQ(a.restore_from(), "/ckpt/step-00000004");
  EXPECT_EQ(a.run_dir(), "/runs/j-000007");
  EXPECT_FALSE(CommandForRank(job, state, step, 1, "/runs").phase().has_assignment());
}

}  // namespace
}  // namespace tandem::server
