// SFT jobs with train.precision: bf16 through the job engine (N ranks as N
// threads over Gloo): bf16 compute copies with fp32 masters (ZeRO,
// docs/parallelism.md). The per-step loss of N = 1, 2 at stages 0, 1, 3
// matches N = 1 stage 0 bf16 within 1e-5 relative and the fp32 job within a
// bf16 tolerance (2e-2); evaluation and export work; the export holds the fp32
// masters; the setup report shows the sharded masters. A bad value of the
// key is rejected with a message naming it.
#include <cstdio>
#include <cstring>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

constexpr int kSteps = 20;

struct RunResult {
  std::vector<double> losses;
  std::vector<float> weights;
  double param_bytes = 0, num_params = 0;
};

RunResult RunSft(const std::string& precision, int world, int stage) {
  RunResult out;
  const std::string dir = MakeTempDir("bf16");
  const JobSpec spec =
      ParseSpec(TinySftYaml(), {"cluster.workers=" + std::to_string(world),
                                "cluster.zero_stage=" + std::to_string(stage), "train.steps=" + std::to_string(kSteps),
                                "train.precision=" + precision, "output_dir=" + dir + "/final"});
  EXPECT_EQ(spec.train().precision(), precision);
  EngineCluster cluster(world);
  auto setup = cluster.Setup(spec);
  for (const auto& r : setup) EXPECT_TRUE(r.status.ok()) << r.status;
  out.param_bytes = setup[0].report.values().at("param_bytes");
  out.num_params = setup[0].report.values().at("num_params");
  for (int s = 1; s <= kSteps; ++s) {
    out.losses.push_back(cluster.RunOk(tandem::v1::PHASE_SFT_STEP, s).metrics().loss());
  }
  cluster.RunOk(tandem::v1::PHASE_EVAL, kSteps);
  cluster.RunOk(tandem::v1::PHASE_EXPORT, kSteps);
  out.weights = LoadExported(dir + "/final");
  std::filesystem::remove_all(dir);
  return out;
}

TEST(ZeroBf16Engine, SftMatchesAcrossRanksStagesAndFp32) {
  const RunResult fp32 = RunSft("fp32", 1, 0);
  const RunResult base = RunSft("bf16", 1, 0);
  ASSERT_EQ(base.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(base.losses.back(), base.losses.front());
  double worst_fp32 = 0;
  for (int s = 0; s < kSteps; ++s) worst_fp32 = std::max(worst_fp32, RelDiff(base.losses[s], fp32.losses[s]));
  std::printf("[bf16-engine] N=1 stage 0: loss %.5f -> %.5f (fp32 %.5f -> %.5f), rel diff to fp32 %.3g\n",
              base.losses.front(), base.losses.back(), fp32.losses.front(), fp32.losses.back(), worst_fp32);
  EXPECT_LE(worst_fp32, 2e-2);
  EXPECT_GT(worst_fp32, 0) << "bf16 compute copy not in effect";
  // The export holds the fp32 masters (off the bf16 grid).
  size_t off_grid = 0;
  for (float w : base.weights) {
    uint32_t b;
    std::memcpy(&b, &w, 4);
    off_grid += (b & 0xffffu) != 0;
  }
  EXPECT_GT(off_grid, base.weights.size() / 2);

  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{2, 0}, {2, 1}, {2, 3}}) {
    const RunResult run = RunSft("bf16", world, stage);
    ASSERT_EQ(run.losses.size(), base.losses.size());
    double worst = 0, worst_f = 0;
    for (int s = 0; s < kSteps; ++s) {
      worst = std::max(worst, RelDiff(run.losses[s], base.losses[s]));
      worst_f = std::max(worst_f, RelDiff(run.losses[s], fp32.losses[s]));
      EXPECT_LE(RelDiff(run.losses[s], base.losses[s]), 1e-5)
          << "N=" << world << " stage " << stage << " step " << s + 1;
    }
    std::printf(
        "[bf16-engine] N=%d stage %d: largest per-step loss rel diff %.3g (vs fp32 %.3g), "
        "final masters max abs diff %.3g; rank 0 fp32 master bytes %.0f (%.2f Psi)\n",
        world, stage, worst, worst_f, MaxAbsDiff(run.weights, base.weights), run.param_bytes,
        run.param_bytes / run.num_params);
    EXPECT_LE(worst_f, 2e-2);
    // Stages 1-3 keep only this rank's share of the fp32 masters.
    const double want = stage == 0 ? 4 * run.num_params : 4 * run.num_params / world;
    EXPECT_NEAR(run.param_bytes, want, 0.05 * want + 4096);
  }
}

TEST(ZeroBf16Engine, BadPrecisionIsRejected) {
  auto spec = common::ParseJobSpecYaml(TinySftYaml(), {"train.precision=fp16"});
  ASSERT_FALSE(spec.ok());
  const std::string msg(spec.status().message());
  EXPECT_NE(msg.find("train.precision"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  auto def = common::ParseJobSpecYaml(TinySftYaml(), {});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->train().precision(), "fp32");
}

}  // namespace
}  // namespace tandem::enginetest
