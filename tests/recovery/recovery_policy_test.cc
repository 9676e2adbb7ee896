// Recovery policy (server/recovery/policy.h): pure decisions, no processes.
#include <gtest/gtest.h>

#include "server/jobs/phase_plan.h"
#include "server/recovery/policy.h"

namespace tandem::server {
namespace {

TEST(RecoveryPolicyTest, SurvivorsKeepRanksAndRestartedWorkersTakeTheirOwn) {
  const std::vector<std::string> old = {"w-1", "w-2", "w-3"};
  const std::map<std::string, std::string> names = {{"w-1", "a"}, {"w-2", "b"}, {"w-3", "c"}};
  // w-2 died and came back as w-2 (same name, idle) while w-9 is also idle.
  auto plan = PlanRanks(old, names, {"w-1", "w-3"}, {{"w-9", "z"}, {"w-2", "b"}}, 3);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->worker_ids, (std::vector<std::string>{"w-1", "w-2", "w-3"}));
  EXPECT_EQ(plan->replaced_ranks, (std::vector<int>{1}));
  EXPECT_TRUE(plan->same_world);
  // A spare fills rank 0.
  plan = PlanRanks(old, names, {"w-2", "w-3"}, {{"w-9", "z"}}, 3);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->worker_ids, (std::vector<std::string>{"w-9", "w-2", "w-3"}));
  // Too few.
  EXPECT_FALSE(PlanRanks(old, names, {"w-3"}, {{"w-9", "z"}}, 3));
  // Elastic: survivors first, in old rank order.
  plan = PlanRanks(old, names, {"w-3", "w-1"}, {}, 2);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->worker_ids, (std::vector<std::string>{"w-1", "w-3"}));
  EXPECT_FALSE(plan->same_world);
}

TEST(RecoveryPolicyTest, PeerRestoreNeedsTheHolderAndTheSameWorld) {
  RankPlan plan;
  plan.worker_ids = {"a", "b", "c"};
  plan.replaced_ranks = {1};
  EXPECT_TRUE(PeerRestorePossible(plan, 3, 4, 3));
  EXPECT_FALSE(PeerRestorePossible(plan, 3, 0, 3));  // no copies yet
  EXPECT_FALSE(PeerRestorePossible(plan, 3, 4, 2));  // copies of another world
  plan.replaced_ranks = {1, 2};                      // rank 1's holder (2) is gone too
  EXPECT_FALSE(PeerRestorePossible(plan, 3, 4, 3));
  plan.replaced_ranks = {0, 2};  // 0 held by 1, 2 held by 0 (replaced)
  EXPECT_FALSE(PeerRestorePossible(plan, 3, 4, 3));
  plan.replaced_ranks = {};
  EXPECT_TRUE(PeerRestorePossible(plan, 3, 4, 3));  // transient failure: own copies
  plan.same_world = false;
  EXPECT_FALSE(PeerRestorePossible(plan, 3, 4, 3));
}

TEST(RecoveryPolicyTest, NewestGoodCheckpointIsChosen) {
  std::vector<tandem::v1::CheckpointRecord> recs(3);
  recs[0].set_step(2);
  recs[0].set_path("/nonexistent/step-00000002");
  recs[1].set_step(6);
  recs[1].set_path("/nonexistent/step-00000006");
  recs[2].set_step(4);
  recs[2].set_path("/nonexistent/step-00000004");
  EXPECT_EQ(ChooseCheckpoint(recs, {})->step(), 6);
  EXPECT_EQ(ChooseCheckpoint(recs, {"/nonexistent/step-00000006"})->step(), 4);
  EXPECT_FALSE(ChooseCheckpoint(recs, {recs[0].path(), recs[1].path(), recs[2].path()}));
  EXPECT_EQ(StepFromCheckpointPath("/r/j-000001/checkpoints/step-00000020"), 20);
  EXPECT_EQ(StepFromCheckpointPath("/r/step-00000020/"), 20);
  EXPECT_EQ(StepFromCheckpointPath("/r/other"), -1);
}

TEST(RecoveryPolicyTest, PlanResumesAfterTheRestoredStep) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  spec.mutable_train()->set_steps(5);
  spec.mutable_init()->set_sft_steps(2);
  spec.mutable_checkpoint()->set_every(2);
  PhasePlan plan(spec);
  // units: 0 setup, 1-2 warm start, 3 baseline, 4..8 steps 1..5, 9 export
  EXPECT_EQ(plan.UnitOfStep(1), 4);
  EXPECT_EQ(plan.StepOf(plan.UnitOfStep(3)), 3);
  EXPECT_EQ(plan.KindOf(plan.UnitOfStep(6)), UnitKind::kExport);
  tandem::v1::CoordinatorConfig config;
  spec.mutable_cluster()->set_workers(4);
  spec.mutable_cluster()->set_min_workers(2);
  spec.mutable_recovery()->set_replacement_timeout_ms(1234);
  config.set_max_recoveries(3);
  auto p = EffectiveRecoveryPolicy(config, spec);
  EXPECT_EQ(p.replacement_timeout_ms, 1234);
  EXPECT_EQ(p.max_recoveries, 3);
  EXPECT_EQ(p.min_workers, 2);
  EXPECT_TRUE(p.peer_copies);
}

TEST(RecoveryPolicyTest, DegradedSharesGoToTheSurvivorBefore) {
  // Normal layout, 4 ranks: rank 2 lost -> rank 1 computes shares 1-2.
  auto s = DegradedShares({}, {}, {0, 1, 3}, 4);
  EXPECT_EQ(s.begin, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(s.own, (std::vector<int>{0, 1, 3}));
  // Rank 0 lost: the first survivor takes the prefix.
  s = DegradedShares({}, {}, {1, 2}, 3);
  EXPECT_EQ(s.begin, (std::vector<int>{0, 2}));
  EXPECT_EQ(s.own, (std::vector<int>{1, 2}));
  // Already degraded (shares 0-1 | 2 | 3 on 3 ranks): the middle one dies.
  s = DegradedShares({0, 2, 3}, {1, 2, 3}, {0, 2}, 3);
  EXPECT_EQ(s.begin, (std::vector<int>{0, 3}));
  EXPECT_EQ(s.own, (std::vector<int>{1, 3}));
  // Only one survivor: it computes everything.
  s = DegradedShares({}, {}, {1}, 2);
  EXPECT_EQ(s.begin, (std::vector<int>{0}));
  EXPECT_EQ(s.own, (std::vector<int>{1}));
}

}  // namespace
}  // namespace tandem::server
