// Recovery controller steps over a job's typed state (pure): giving up,
// choosing the members while waiting for replacements, the restore plan (peer memory vs disk, degraded mode ending),
// the degraded restore source, and where the plan continues after SETUP.
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

TEST(RecoveryControllerTest, ChooseMembersWaitsPlansAndFails) {
  RecoveryPolicy policy;
  policy.replacement_timeout_ms = 5000;
  policy.min_workers = 3;  // not elastic
  MemberWait wait;
  wait.old_ids = {"w-1", "w-2", "w-3"};
  wait.old_names = {{"w-1", "a"}, {"w-2", "b"}, {"w-3", "c"}};
  wait.survivors = {"w-1", "w-3"};
  wait.full = 3;
  // Rank 1 is missing and nobody is idle: wait for one.
  MemberChoice c = ChooseMembers(policy, wait, "worker b lost");
  EXPECT_EQ(c.kind, MemberChoice::Kind::kWait);
  EXPECT_EQ(c.missing, 1);
  EXPECT_FALSE(c.plan);
  // A spare registers: it takes rank 1.
  wait.idle = {{"w-9", "spare"}};
  c = ChooseMembers(policy, wait, "worker b lost");
  ASSERT_EQ(c.kind, MemberChoice::Kind::kPlan);
  ASSERT_TRUE(c.plan);
  EXPECT_EQ(c.plan->worker_ids, (std::vector<std::string>{"w-1", "w-9", "w-3"}));
  // No spare and the deadline passed: the job fails with the counts.
  wait.idle.clear();
  wait.deadline_passed = true;
  c = ChooseMembers(policy, wait, "worker b lost");
  ASSERT_EQ(c.kind, MemberChoice::Kind::kFail);
  EXPECT_EQ(c.fail_reason, "worker b lost; no replacement worker within 5s (2 of 3 workers left, 0 idle)");
  // An elastic job (min_workers 2) goes on with the two survivors.
  policy.min_workers = 2;
  c = ChooseMembers(policy, wait, "worker b lost");
  ASSERT_EQ(c.kind, MemberChoice::Kind::kPlan);
  EXPECT_EQ(c.plan->worker_ids.size(), 2u);
  // ... but not with one.
  wait.survivors = {"w-1"};
  c = ChooseMembers(policy, wait, "worker b lost");
  ASSERT_EQ(c.kind, MemberChoice::Kind::kFail);
  EXPECT_EQ(c.fail_reason,
            "worker b lost; no replacement worker within 5s (1 of 3 workers left, 0 idle, min_workers 2)");
  // Before the deadline an elastic job still waits for full size.
  wait.deadline_passed = false;
  c = ChooseMembers(policy, wait, "worker b lost");
  EXPECT_EQ(c.kind, MemberChoice::Kind::kWait);
  EXPECT_EQ(c.missing, 2);
}

}  // namespace
}  // namespace tandem::server
