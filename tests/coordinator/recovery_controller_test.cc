// Recovery controller steps over a job's typed state (pure): giving up,
// the restore plan (peer memory vs disk, degraded mode ending), the
// degraded restore source, and where the plan continues after SETUP.
#include "server/recovery/recovery_controller.h"

#include <gtest/gtest.h>

namespace tandem::server {
namespace {

TEST(RecoveryControllerTest, BeginAttemptCountsAndGivesUp) {
  RecoveryPolicy policy;
  policy.max_recoveries = 2;
  tandem::v1::RecoveryStatus status;
  tandem::v1::DriverState state;
  state.set_peer_failed(true);
  bool continuing = true;
  EXPECT_FALSE(BeginAttempt(policy, "lost", 10.0, 7, &status, &state, &continuing));
  EXPECT_FALSE(continuing);
  EXPECT_EQ(status.recoveries(), 1);
  EXPECT_EQ(status.started_at(), 10.0);
  EXPECT_EQ(state.steps_before(), 7);
  EXPECT_FALSE(state.peer_failed());
  // A second attempt of the same recovery keeps its start.
  EXPECT_FALSE(BeginAttempt(policy, "again", 20.0, 9, &status, &state, &continuing));
  EXPECT_TRUE(continuing);
  EXPECT_EQ(status.started_at(), 10.0);
  EXPECT_EQ(state.steps_before(), 7);
  auto give_up = BeginAttempt(policy, "third", 30.0, 9, &status, &state, &continuing);
  ASSERT_TRUE(give_up);
  EXPECT_EQ(*give_up, "third (giving up after 2 recoveries)");
}

TEST(RecoveryControllerTest, PlanRestorePrefersANewerPeerCopyAndEndsDegradedMode) {
  RecoveryPolicy policy;
  RankPlan plan{{"w-9", "w-2"}, {0}, true};
  tandem::v1::RecoveryStatus status;
  status.set_degraded_logical_world(2);
  tandem::v1::DriverState state;
  state.set_peer_copy_step(6);
  state.set_peer_copy_world(2);
  state.add_logical_begin(0);
  RestorePlan r = PlanRestore(policy, plan, 2, {"/ck/step-4", 4}, false, &status, &state);
  EXPECT_TRUE(r.peer);
  EXPECT_TRUE(r.was_degraded);
  EXPECT_EQ(r.source, "step 6 from peer memory");
  EXPECT_EQ(state.peer_restore_step(), 6);
  ASSERT_EQ(state.peer_restore_ranks_size(), 1);
  EXPECT_EQ(state.restore_from(), "/ck/step-4");
  EXPECT_EQ(status.degraded_logical_world(), 0);
  EXPECT_EQ(state.logical_begin_size(), 0);
  EXPECT_EQ(state.peer_copy_step(), 0);
  // An older copy than the disk checkpoint: disk.
  state.set_peer_copy_step(2);
  state.set_peer_copy_world(2);
  r = PlanRestore(policy, plan, 2, {"/ck/step-4", 4}, true, &status, &state);
  EXPECT_FALSE(r.peer);
  EXPECT_EQ(r.source, "step 4 from disk /ck/step-4");
  EXPECT_EQ(status.grow_backs(), 1);
  r = PlanRestore(policy, plan, 2, {}, false, &status, &state);
  EXPECT_EQ(r.source, "from scratch (no checkpoint)");
}

TEST(RecoveryControllerTest, DegradedKeepsLiveStateUnlessThatFailed) {
  tandem::v1::DriverState state;
  state.set_has_last_trained(true);
  state.set_last_trained_step(5);
  EXPECT_EQ(PlanDegradedRestore({"/ck/step-4", 4}, &state), "the survivors' live state of step 5 (no rollback)");
  EXPECT_TRUE(state.live_restore());
  EXPECT_EQ(state.restore_from(), "");
  state.set_live_failed(true);
  EXPECT_EQ(PlanDegradedRestore({"/ck/step-4", 4}, &state), "step 4 from disk /ck/step-4");
  EXPECT_FALSE(state.live_restore());
  EXPECT_EQ(state.restore_from(), "/ck/step-4");
}

TEST(RecoveryControllerTest, ResumeAfterSetupContinuesAfterTheRestoredStep) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_SFT);
  spec.mutable_train()->set_steps(10);
  const PhasePlan plan(spec);
  tandem::v1::DriverState state;
  SetupResume r = ResumeAfterSetup(plan, {1, 0}, 4, 6, &state);
  EXPECT_FALSE(r.live);
  EXPECT_EQ(r.restored_step, 4);
  EXPECT_EQ(r.job_step, 4);
  EXPECT_EQ(r.cursor.unit, plan.UnitOfStep(5));
  EXPECT_TRUE(state.has_last_trained());
  // Live state: continue right after the last trained phase.
  state.set_live_restore(true);
  state.set_last_trained_step(6);
  state.set_last_trained_next_unit(7);
  r = ResumeAfterSetup(plan, {1, 0}, -1, 6, &state);
  EXPECT_TRUE(r.live);
  EXPECT_EQ(r.restored_step, 6);
  EXPECT_EQ(r.cursor.unit, 7);
  // Nothing restored: from the plan's start.
  tandem::v1::DriverState fresh;
  r = ResumeAfterSetup(plan, {1, 0}, -1, 0, &fresh);
  EXPECT_EQ(r.restored_step, -1);
  EXPECT_EQ(r.cursor.unit, 1);
  tandem::v1::RecoveryStatus status;
  status.set_started_at(3);
  FinishRecovery(2, &status, &state);
  EXPECT_EQ(status.steps_redone_total(), 2);
  EXPECT_EQ(status.started_at(), 0);
  EXPECT_FALSE(state.live_restore());
}

}  // namespace
}  // namespace tandem::server
