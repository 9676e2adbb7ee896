// The cost model (worker/zero/cost_model.h, PlanInputForJob) against the
// bytes the job engine measures: the SFT tiny job on 4 ranks (threads over
// Gloo) placed on 2 nodes of 2, one SFT step after the first (which also
// carries set-up traffic). For each variant and tier, every collective kind
// the model predicts is within 5% of the measured bytes summed over ranks,
// and a kind it predicts as zero carries at most the step's scalar
// reductions (loss, token counts, gradient norm).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/rank_topology.h"
#include "tests/engine/engine_test_util.h"
#include "worker/zero/cost_model.h"
#include "worker/zero/job_plan.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;

constexpr double kScalarBytes = 4096;  // scalar reductions of one step, all ranks

struct Variant {
  std::string name;
  std::vector<std::string> overrides;
};

void CheckVariant(const Variant& v) {
  const std::vector<std::string> nodes = {"a", "a", "b", "b"};
  const std::string dir = MakeTempDir("plan");
  std::vector<std::string> overrides = {"cluster.workers=4", "checkpoint.dir=" + dir + "/ckpt",
                                        "output_dir=" + dir + "/final", "train.steps=3", "train.global_batch=16"};
  overrides.insert(overrides.end(), v.overrides.begin(), v.overrides.end());
  const JobSpec spec = ParseSpec(TinySftYaml(), overrides);
  auto input = zero::PlanInputForJob(spec, nodes);
  ASSERT_TRUE(input.ok()) << input.status();
  auto plan = zero::PlanStep(*input);
  ASSERT_TRUE(plan.ok()) << plan.status();

  EngineCluster cluster(4);
  auto setup = cluster.SetupMembers(spec, {0, 1, 2, 3}, [&](int r, tandem::v1::Assignment& a) {
    common::FillRankTopology(nodes, r, a.mutable_topology());
  });
  for (const auto& r : setup) ASSERT_TRUE(r.status.ok()) << v.name << ": " << r.status;
  cluster.RunOk(tandem::v1::PHASE_SFT_STEP, 1);
  const auto step = cluster.Run(tandem::v1::PHASE_SFT_STEP, 2);
  const char* tiers[2] = {"intra_node", "inter_node"};
  for (int t = 0; t < 2; ++t) {
    double predicted_total = 0, measured_total = 0;
    for (int k = 0; k < zero::kNumPlanKinds; ++k) {
      const std::string kind(zero::PlanKindName(static_cast<zero::PlanKind>(k)));
      double measured = 0;
      for (const auto& r : step) {
        ASSERT_TRUE(r.status.ok()) << v.name << ": " << r.status;
        const auto& extra = r.report.metrics().extra();
        auto it = extra.find(std::string("tier_sent_") + tiers[t] + "_" + kind);
        if (it != extra.end()) measured += it->second;
      }
      const double predicted = static_cast<double>(plan->job_sent[k][t]);
      predicted_total += predicted;
      measured_total += measured;
      if (predicted == 0 && measured == 0) continue;
      std::printf("[plan] %-24s %-10s %-14s predicted %10.0f measured %10.0f (%+.2f%%)\n", v.name.c_str(), tiers[t],
                  kind.c_str(), predicted, measured, predicted > 0 ? 100 * (measured - predicted) / predicted : 0.0);
      if (predicted == 0) {
        EXPECT_LE(measured, kScalarBytes) << v.name << " " << tiers[t] << " " << kind;
      } else {
        EXPECT_NEAR(measured, predicted, 0.05 * predicted) << v.name << " " << tiers[t] << " " << kind;
      }
    }
    EXPECT_NEAR(measured_total, predicted_total, 0.05 * predicted_total + kScalarBytes) << v.name << " " << tiers[t];
  }
  fs::remove_all(dir);
}

// global_batch 16 on 4 ranks, micro_batch 2: M = 2.
TEST(CostModelEngine, Stage3Flat) { CheckVariant({"stage 3", {"cluster.zero_stage=3"}}); }
TEST(CostModelEngine, Stage3Hpz) {
  CheckVariant({"hpZ", {"cluster.zero_stage=3", "zero.hierarchical_partition=true"}});
}
TEST(CostModelEngine, Stage3HpzQwz) {
  CheckVariant(
      {"hpZ+qwZ", {"cluster.zero_stage=3", "zero.hierarchical_partition=true", "zero.weight_quantization=int8"}});
}
TEST(CostModelEngine, Stage3HpzQwzLoco) {
  CheckVariant({"hpZ+qwZ+LoCo",
                {"cluster.zero_stage=3", "zero.hierarchical_partition=true", "zero.weight_quantization=int8",
                 "zero.grad_compression=int4"}});
}
TEST(CostModelEngine, Stage3QwzLocoFlat) {
  CheckVariant(
      {"qwZ+LoCo flat", {"cluster.zero_stage=3", "zero.weight_quantization=int8", "zero.grad_compression=int4"}});
}
// global_batch 16, micro_batch 1: M = 4.
TEST(CostModelEngine, Stage3LayerMajorM4) {
  CheckVariant(
      {"layer-major M=4",
       {"cluster.zero_stage=3", "train.accumulation=layer_major", "train.global_batch=16", "train.micro_batch=1"}});
}
TEST(CostModelEngine, Stage3MicroBatchesM4) {
  CheckVariant({"stage 3 M=4", {"cluster.zero_stage=3", "train.global_batch=16", "train.micro_batch=1"}});
}
TEST(CostModelEngine, Stage3Tied) {
  CheckVariant({"stage 3 tied", {"cluster.zero_stage=3", "model.config.tie_word_embeddings=true"}});
}
TEST(CostModelEngine, Stage3TiedLayerMajor) {
  CheckVariant({"stage 3 tied layer-major",
                {"cluster.zero_stage=3", "model.config.tie_word_embeddings=true", "train.accumulation=layer_major"}});
}
TEST(CostModelEngine, Stage3Bf16) { CheckVariant({"stage 3 bf16", {"cluster.zero_stage=3", "train.precision=bf16"}}); }
TEST(CostModelEngine, Stage0) { CheckVariant({"stage 0", {"cluster.zero_stage=0"}}); }
TEST(CostModelEngine, Stage0LayerMajor) {
  CheckVariant({"stage 0 layer-major", {"cluster.zero_stage=0", "train.accumulation=layer_major"}});
}
TEST(CostModelEngine, Stage0Loco) {
  CheckVariant({"stage 0 LoCo", {"cluster.zero_stage=0", "zero.grad_compression=int4"}});
}
TEST(CostModelEngine, Stage1) { CheckVariant({"stage 1", {"cluster.zero_stage=1"}}); }
TEST(CostModelEngine, Stage2) { CheckVariant({"stage 2", {"cluster.zero_stage=2"}}); }
TEST(CostModelEngine, Stage2Bf16) { CheckVariant({"stage 2 bf16", {"cluster.zero_stage=2", "train.precision=bf16"}}); }

}  // namespace
}  // namespace tandem::enginetest
