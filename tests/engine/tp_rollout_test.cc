// GRPO with tensor-parallel rollouts (rollout.tp_size) through the engine:
// two ranks as one TP group of 2 produce the same rollouts, rewards and
// losses as tp_size 1 (sampling keyed by the same seeds; log-probs within
// fp32 reduction order), with the slices gathered from ZeRO-3 shards moving
// fewer bytes than a full gather; so do shift-parallel rollouts (steps
// switched to sequence parallelism by row count); bad sizes and keys are
// refused at submit and at setup with the key and the size named.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

using tandem::v1::PHASE_LOGPROBS;
using tandem::v1::PHASE_ROLLOUT;
using tandem::v1::PHASE_SCORE;
using tandem::v1::PHASE_SFT_STEP;
using tandem::v1::PHASE_UPDATE;

struct StepFigures {
  double reward = 0, accuracy = 0, rollout_tokens = 0, loss = 0;
  std::map<std::string, double> extra;
};

StepFigures RlStep(EngineCluster& c, int64_t step) {
  StepFigures f;
  auto r = c.RunOk(PHASE_ROLLOUT, step);
  f.extra.insert(r.metrics().extra().begin(), r.metrics().extra().end());
  f.rollout_tokens = f.extra.count("rollout_tokens") ? f.extra["rollout_tokens"] : -1;
  auto s = c.RunOk(PHASE_SCORE, step);
  f.reward = s.metrics().reward_mean();
  f.accuracy = s.metrics().extra().at("rollout_accuracy");
  c.RunOk(PHASE_LOGPROBS, step);
  f.loss = c.RunOk(PHASE_UPDATE, step).metrics().loss();
  return f;
}

TEST(TpRolloutTest, Tp2OnTwoWorkersEqualsTp1) {
  std::vector<StepFigures> one, two;
  for (int tp : {1, 2}) {
    EngineCluster c(2);
    c.SetupOk(ParseSpec(TinyGrpoYaml(), {"init.sft.steps=15", "init.sft.lr=1e-2", "cluster.workers=2",
                                         "cluster.zero_stage=3", "rollout.tp_size=" + std::to_string(tp)}));
    for (int w = 1; w <= 15; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    auto& out = tp == 1 ? one : two;
    for (int s = 1; s <= 4; ++s) out.push_back(RlStep(c, s));
  }
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(one[i].rollout_tokens, two[i].rollout_tokens);
    EXPECT_DOUBLE_EQ(one[i].reward, two[i].reward);
    EXPECT_DOUBLE_EQ(one[i].accuracy, two[i].accuracy);
    EXPECT_LE(RelDiff(one[i].loss, two[i].loss), 1e-4);
    EXPECT_EQ(one[i].extra.count("rollout_tp_size"), 0u);
    EXPECT_EQ(two[i].extra["rollout_tp_size"], 2);
    const double moved = two[i].extra["rollout_switch_bytes"], full = two[i].extra["rollout_switch_full_gather_bytes"];
    EXPECT_GT(moved, 0);
    EXPECT_LT(moved, full);
    EXPECT_GE(two[i].extra["rollout_tp_hidden_share"], 0);
    EXPECT_LE(two[i].extra["rollout_tp_hidden_share"], 1);
    std::printf(
        "[tp-rollout] step %zu: reward %.4f / %.4f, tokens %.0f / %.0f, loss %.6g / %.6g (tp 1 / tp 2); "
        "switch bytes %.0f vs full gather %.0f\n",
        i + 1, one[i].reward, two[i].reward, one[i].rollout_tokens, two[i].rollout_tokens, one[i].loss, two[i].loss,
        moved, full);
  }
}

// Shift parallelism: with a threshold of 1 every step runs
// sequence-parallel; with 12 the prompts' prefill steps do and the decode
// steps run tensor-parallel. Both give tp_size 1's rollouts, rewards and
// losses.
TEST(TpRolloutTest, ShiftParallelOnTwoWorkersEqualsTp1) {
  std::vector<std::vector<StepFigures>> runs;
  for (const std::string& extra : {std::string("rollout.tp_size=1"), std::string("rollout.shift_threshold_tokens=1"),
                                   std::string("rollout.shift_threshold_tokens=12")}) {
    std::vector<std::string> sets = {"init.sft.steps=15", "init.sft.lr=1e-2", "cluster.workers=2",
                                     "cluster.zero_stage=3", extra};
    if (extra != "rollout.tp_size=1") {
      sets.push_back("rollout.tp_size=2");
      sets.push_back("rollout.shift_parallel=true");
    }
    EngineCluster c(2);
    c.SetupOk(ParseSpec(TinyGrpoYaml(), sets));
    for (int w = 1; w <= 15; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    runs.emplace_back();
    for (int s = 1; s <= 2; ++s) runs.back().push_back(RlStep(c, s));
  }
  for (size_t k = 1; k < runs.size(); ++k) {
    for (size_t i = 0; i < runs[0].size(); ++i) {
      SCOPED_TRACE("run " + std::to_string(k) + " step " + std::to_string(i + 1));
      const StepFigures& a = runs[0][i];
      StepFigures& b = runs[k][i];
      EXPECT_EQ(a.rollout_tokens, b.rollout_tokens);
      EXPECT_DOUBLE_EQ(a.reward, b.reward);
      EXPECT_DOUBLE_EQ(a.accuracy, b.accuracy);
      EXPECT_LE(RelDiff(a.loss, b.loss), 1e-4);
      EXPECT_GT(b.extra["rollout_sp_steps"], 0);
      EXPECT_GT(b.extra["rollout_sp_step_tokens"], 0);
      EXPECT_GT(b.extra["rollout_shift_full_copy_bytes"], 0);
      if (k == 1) {
        EXPECT_EQ(b.extra["rollout_tp_steps"], 0);
      } else {
        EXPECT_GT(b.extra["rollout_tp_steps"], 0);
      }
      std::printf("[tp-rollout] shift run %zu step %zu: sp steps %.0f (%.0f rows), tp steps %.0f (%.0f rows)\n", k,
                  i + 1, b.extra["rollout_sp_steps"], b.extra["rollout_sp_step_tokens"], b.extra["rollout_tp_steps"],
                  b.extra["rollout_tp_step_tokens"]);
    }
  }
}

TEST(TpRolloutTest, SpecRefusesShiftParallelWithoutTensorParallelism) {
  auto no_tp = common::ParseJobSpecYaml(TinyGrpoYaml(), {"cluster.workers=2", "rollout.shift_parallel=true"});
  ASSERT_FALSE(no_tp.ok());
  EXPECT_NE(no_tp.status().message().find("rollout.shift_parallel"), std::string::npos) << no_tp.status();
  EXPECT_NE(no_tp.status().message().find("needs rollout.tp_size > 1"), std::string::npos) << no_tp.status();
  for (const char* bad : {"rollout.shift_threshold_tokens=-1", "rollout.shift_threshold_tokens=2000000"}) {
    auto range = common::ParseJobSpecYaml(
        TinyGrpoYaml(), {"cluster.workers=2", "rollout.tp_size=2", "rollout.shift_parallel=true", bad});
    ASSERT_FALSE(range.ok()) << bad;
    EXPECT_NE(range.status().message().find("rollout.shift_threshold_tokens"), std::string::npos) << range.status();
  }
  EXPECT_TRUE(
      common::ParseJobSpecYaml(TinyGrpoYaml(), {"cluster.workers=2", "rollout.tp_size=2", "rollout.shift_parallel=true",
                                                "rollout.shift_threshold_tokens=32"})
          .ok());
}

TEST(TpRolloutTest, SpecRefusesATpSizeThatDoesNotDivideTheWorkers) {
  auto bad = common::ParseJobSpecYaml(TinyGrpoYaml(), {"cluster.workers=2", "rollout.tp_size=3"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rollout.tp_size"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("does not divide the workers = 2"), std::string::npos) << bad.status();
  auto range = common::ParseJobSpecYaml(TinyGrpoYaml(), {"rollout.tp_size=2000"});
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("rollout.tp_size"), std::string::npos) << range.status();
  EXPECT_TRUE(common::ParseJobSpecYaml(TinyGrpoYaml(), {"cluster.workers=2", "rollout.tp_size=2"}).ok());
}

TEST(TpRolloutTest, SpecTakesTpInDisaggregatedAndDegradedJobs) {
  const std::vector<std::string> disagg = {"cluster.workers=3", "placement.mode=disaggregated",
                                           "placement.rollout_workers=2", "placement.train_workers=1",
                                           "rollout.tp_size=2"};
  auto ok = common::ParseJobSpecYaml(TinyGrpoYaml(), disagg);
  EXPECT_TRUE(ok.ok()) << ok.status();
  // The TP groups are made of rollout workers: 2 does not divide 1.
  auto uneven = common::ParseJobSpecYaml(
      TinyGrpoYaml(), {"cluster.workers=3", "placement.mode=disaggregated", "placement.rollout_workers=1",
                       "placement.train_workers=2", "rollout.tp_size=2"});
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("rollout.tp_size"), std::string::npos) << uneven.status();
  EXPECT_NE(uneven.status().message().find("does not divide the placement.rollout_workers = 1"), std::string::npos)
      << uneven.status();
  // Disaggregated rollout workers hold only their slice: no shift parallelism.
  auto shift = disagg;
  shift.push_back("rollout.shift_parallel=true");
  auto no_shift = common::ParseJobSpecYaml(TinyGrpoYaml(), shift);
  ASSERT_FALSE(no_shift.ok());
  EXPECT_NE(no_shift.status().message().find("rollout.shift_parallel: is only for placement.mode: colocated"),
            std::string::npos)
      << no_shift.status();
  auto async = disagg;
  async.insert(async.end(), {"placement.coupling=async", "placement.max_staleness=1"});
  auto k1 = common::ParseJobSpecYaml(TinyGrpoYaml(), async);
  EXPECT_TRUE(k1.ok()) << k1.status();
  auto degraded =
      common::ParseJobSpecYaml(TinyGrpoYaml(), {"cluster.workers=2", "rollout.tp_size=2", "recovery.degraded=true"});
  EXPECT_TRUE(degraded.ok()) << degraded.status();
}

TEST(TpRolloutTest, SetupRefusesAModelWhoseKvHeadsDoNotSplit) {
  // The tiny model has 2 key/value heads: 4 ranks in one group cannot split them.
  EngineCluster c(4);
  auto res = c.Setup(ParseSpec(TinyGrpoYaml(), {"cluster.workers=4", "rollout.tp_size=4"}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(res[r].status.ok()) << "rank " << r;
    EXPECT_NE(res[r].status.message().find("num_key_value_heads (2)"), std::string::npos) << res[r].status;
  }
}

}  // namespace
}  // namespace tandem::enginetest
