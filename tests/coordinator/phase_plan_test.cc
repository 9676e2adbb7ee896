#include "server/jobs/phase_plan.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::server {
namespace {

std::string Render(const std::vector<PlannedPhase>& phases) {
  std::vector<std::string> parts;
  for (const auto& p : phases) parts.push_back(absl::StrCat(PhaseUpperName(p.phase), "(", p.step, ")"));
  return absl::StrJoin(parts, " ");
}

TEST(PhasePlanTest, Sft) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_SFT);
  spec.mutable_train()->set_steps(4);
  spec.mutable_train()->set_eval_every(3);
  spec.mutable_checkpoint()->set_every(2);
  PhasePlan plan(spec);
  EXPECT_EQ(Render(plan.All()),
            "SETUP(0) SFT_STEP(1) SFT_STEP(2) CHECKPOINT(2) SFT_STEP(3) EVAL(3) SFT_STEP(4) EVAL(4) "
            "CHECKPOINT(4) EXPORT(4) TEARDOWN(4)");
}

TEST(PhasePlanTest, GrpoWithWarmStart) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  spec.mutable_train()->set_steps(2);
  spec.mutable_init()->set_sft_steps(2);
  PhasePlan plan(spec);
  EXPECT_EQ(Render(plan.All()),
            "SETUP(0) SFT_STEP(-1) SFT_STEP(-2) EVAL(0) ROLLOUT(1) SCORE(1) LOGPROBS(1) UPDATE(1) "
            "ROLLOUT(2) SCORE(2) LOGPROBS(2) UPDATE(2) EVAL(2) EXPORT(2) TEARDOWN(2)");
  EXPECT_EQ(plan.KindOf(1), UnitKind::kWarmup);
  EXPECT_TRUE(plan.Unit(1)[0].warmup);
  EXPECT_EQ(plan.KindOf(3), UnitKind::kBaseline);
  EXPECT_EQ(plan.StepOf(4), 1);
}

TEST(PhasePlanTest, DisaggregatedSyncsWeights) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  spec.mutable_train()->set_steps(1);
  spec.mutable_placement()->set_mode("disaggregated");
  spec.mutable_checkpoint()->set_every(1);
  PhasePlan plan(spec);
  EXPECT_EQ(Render(plan.All()),
            "SETUP(0) EVAL(0) SYNC_WEIGHTS(1) ROLLOUT(1) SCORE(1) LOGPROBS(1) UPDATE(1) EVAL(1) CHECKPOINT(1) "
            "EXPORT(1) TEARDOWN(1)");
}

TEST(PhasePlanTest, CursorWalksTheWholePlanAndHugeJobsNeedNoList) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  spec.mutable_train()->set_steps(3);
  spec.mutable_train()->set_eval_every(2);
  PhasePlan plan(spec);
  std::vector<PlannedPhase> walked;
  PhaseCursor c;
  for (int guard = 0; guard < 1000; ++guard) {
    auto p = plan.At(c);
    if (!p) break;
    walked.push_back(*p);
    c = plan.Next(c);
  }
  EXPECT_EQ(Render(walked), Render(plan.All()));
  spec.mutable_train()->set_steps(1000000000);
  PhasePlan huge(spec);
  EXPECT_EQ(huge.num_units(), 1000000000 + 4);
  EXPECT_EQ(Render(huge.Unit(huge.num_units() - 3)),
            "ROLLOUT(1000000000) SCORE(1000000000) LOGPROBS(1000000000) UPDATE(1000000000) EVAL(1000000000)");
  EXPECT_FALSE(huge.At({huge.num_units(), 0}).has_value());
}

}  // namespace
}  // namespace tandem::server
