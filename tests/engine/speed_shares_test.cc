// Speed-proportional shards (cluster.shard_by_speed) through the engine:
//  - the rounding rule (SpeedCounts / comm::SplitWeighted) on its own;
//  - SFT with speeds {1, 3} (and {1, 2, 5}) gives the same per-step losses
//    and final weights as the even split within fp32 reduction-order
//    tolerance at ZeRO stages 0-3, and the stage-3 partition follows the
//    speeds (per-rank parameter bytes);
//  - GRPO with speeds {1, 3} at stages 0 and 3 matches the even split;
//  - checkpoints reshard between the even and the proportional layout;
//  - without hints every rank calibrates; bad hints fail SETUP clearly;
//  - incompatible job options are refused at submit.
#include <chrono>
#include <cstdio>

#include "kernels/backends.h"
#include "kernels/memory.h"
#include "tests/engine/engine_test_util.h"
#include "worker/comm/collective.h"
#include "worker/engine/speed_shares.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_FLUSH_CHECKPOINTS;
using tandem::v1::PHASE_SFT_STEP;

constexpr int kSteps = 8;

TEST(SpeedCountsTest, RoundingRule) {
  using worker::SpeedCounts;
  // Equal speeds: the even split.
  EXPECT_EQ(comm::SplitWeighted(10, {5, 5, 5}), comm::SplitEven(10, 3));
  EXPECT_EQ(comm::SplitWeighted(11, {2, 2, 2, 2}), comm::SplitEven(11, 4));
  // One item each first, then 12 - 2 = 10 split 1:4 -> 2 / 8.
  EXPECT_EQ(SpeedCounts(12, {1, 4}), (std::vector<int64_t>{3, 9}));
  // 12 - 3 = 9 split 1:1:2 -> 2.25 / 2.25 / 4.5: the left-over item goes to
  // the largest remainder.
  EXPECT_EQ(SpeedCounts(12, {1, 1, 2}), (std::vector<int64_t>{3, 3, 6}));
  // Equal remainders: the lower ranks first.
  EXPECT_EQ(SpeedCounts(7, {1, 1, 1, 1}), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(SpeedCounts(12, {1.0, 1.0}), (std::vector<int64_t>{6, 6}));
  // Every rank gets at least one item, however slow.
  EXPECT_EQ(SpeedCounts(4, {1e-3, 1e3, 1e3, 1e3}), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(SpeedCounts(5, {1e-3, 1, 1}), (std::vector<int64_t>{1, 2, 2}));
  // Fewer items than ranks: the minimum is dropped, nothing is lost.
  EXPECT_EQ(SpeedCounts(1, {1, 3}), (std::vector<int64_t>{0, 1}));
  // Sums are exact for many shapes.
  for (int64_t total : {0, 1, 7, 12, 100, 12345}) {
    for (const std::vector<double>& speeds : std::vector<std::vector<double>>{{1, 3}, {0.5, 2, 7}, {9, 1, 1, 1}}) {
      int64_t sum = 0;
      for (int64_t c : SpeedCounts(total, speeds)) sum += c;
      EXPECT_EQ(sum, total);
    }
  }
  // Integer weights: the largest speed maps to 2^20.
  EXPECT_EQ(comm::SpeedWeights({1, 4}), (std::vector<uint64_t>{262144, 1048576}));
  EXPECT_TRUE(worker::CheckSpeed(2.5, "x").ok());
  for (double bad : {0.0, -1.0, std::nan(""), 1e300, std::numeric_limits<double>::infinity()}) {
    EXPECT_FALSE(worker::CheckSpeed(bad, "x").ok()) << bad;
  }
}

struct SpeedRun {
  std::vector<double> losses;
  std::vector<float> weights;
  std::vector<double> param_bytes;  // per rank, from SETUP
};

std::vector<std::string> SftOverrides(int world, int stage, const std::string& dir, bool by_speed) {
  return {
      "cluster.workers=" + std::to_string(world), "cluster.zero_stage=" + std::to_string(stage),
      "train.steps=" + std::to_string(kSteps),    "cluster.shard_by_speed=" + std::string(by_speed ? "true" : "false"),
      "checkpoint.dir=" + dir + "/ckpt",          "output_dir=" + dir + "/final"};
}

SpeedRun RunSft(int world, int stage, const std::vector<double>& speeds) {
  SpeedRun out;
  const std::string dir = MakeTempDir("speed");
  const JobSpec spec = ParseSpec(TinySftYaml(), SftOverrides(world, stage, dir, !speeds.empty()));
  EngineCluster cluster(world, "job-1", "cpu", speeds);
  auto setup = cluster.Setup(spec);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(setup[r].status.ok()) << setup[r].status;
    out.param_bytes.push_back(setup[r].report.values().at("param_bytes"));
  }
  if (!speeds.empty()) {
    EXPECT_TRUE(HasLine(setup[0].report, "shard_by_speed: rank speeds ["));
  }
  for (int s = 1; s <= kSteps; ++s) out.losses.push_back(cluster.RunOk(PHASE_SFT_STEP, s).metrics().loss());
  cluster.RunOk(PHASE_EXPORT, kSteps);
  out.weights = LoadExported(dir + "/final");
  fs::remove_all(dir);
  return out;
}

void ExpectSame(const SpeedRun& run, const SpeedRun& base, const std::string& what) {
  ASSERT_EQ(run.losses.size(), base.losses.size());
  double worst = 0;
  for (size_t s = 0; s < base.losses.size(); ++s) {
    worst = std::max(worst, RelDiff(run.losses[s], base.losses[s]));
    EXPECT_LE(RelDiff(run.losses[s], base.losses[s]), 1e-5) << what << " step " << s + 1;
  }
  double wmax = 0;
  for (float w : base.weights) wmax = std::max(wmax, std::fabs(static_cast<double>(w)));
  const double wdiff = MaxAbsDiff(run.weights, base.weights);
  EXPECT_LE(wdiff, 1e-5 * std::max(1.0, wmax)) << what;
  std::printf("[speed] %s: largest loss rel diff %.3g, final weights max abs diff %.3g\n", what.c_str(), worst, wdiff);
}

class SpeedSftTest : public ::testing::TestWithParam<int> {};

TEST_P(SpeedSftTest, SameAsEvenSplit) {
  const int stage = GetParam();
  const SpeedRun even = RunSft(2, stage, {});
  const SpeedRun fast = RunSft(2, stage, {1, 3});
  ExpectSame(fast, even, "N=2 speeds {1,3} stage " + std::to_string(stage));
  if (stage == 3) {
    // The parameter shard follows the speeds: about 1 : 3.
    const double ratio = fast.param_bytes[1] / fast.param_bytes[0];
    EXPECT_NEAR(ratio, 3.0, 0.1) << fast.param_bytes[0] << " vs " << fast.param_bytes[1];
    EXPECT_NEAR(even.param_bytes[1] / even.param_bytes[0], 1.0, 0.05);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, SpeedSftTest, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

TEST(SpeedSftTest, ThreeRanksStageThree) {
  const SpeedRun even = RunSft(3, 3, {});
  const SpeedRun fast = RunSft(3, 3, {1, 2, 5});
  ExpectSame(fast, even, "N=3 speeds {1,2,5} stage 3");
  EXPECT_GT(fast.param_bytes[2], 4 * fast.param_bytes[0]);
}

std::vector<double> GrpoLosses(int stage, const std::vector<double>& speeds) {
  const JobSpec spec = ParseSpec(
      TinyGrpoYaml(), {"cluster.workers=2", "cluster.zero_stage=" + std::to_string(stage), "rl.prompts_per_step=8",
                       std::string("cluster.shard_by_speed=") + (speeds.empty() ? "false" : "true")});
  EngineCluster c(2, "job-1", "cpu", speeds);
  c.SetupOk(spec);
  std::vector<double> out;
  for (int step = 1; step <= 3; ++step) {
    out.push_back(c.RunOk(tandem::v1::PHASE_ROLLOUT, step).metrics().extra().at("rollout_tokens"));
    out.push_back(c.RunOk(tandem::v1::PHASE_SCORE, step).metrics().reward_mean());
    c.RunOk(tandem::v1::PHASE_LOGPROBS, step);
    out.push_back(c.RunOk(tandem::v1::PHASE_UPDATE, step).metrics().loss());
  }
  return out;
}

TEST(SpeedGrpoTest, SameAsEvenSplit) {
  for (int stage : {0, 3}) {
    const auto even = GrpoLosses(stage, {});
    const auto fast = GrpoLosses(stage, {1, 3});
    ASSERT_EQ(even.size(), fast.size());
    for (size_t i = 0; i < even.size(); ++i) {
      EXPECT_NEAR(fast[i], even[i], 1e-5 * std::max(1.0, std::fabs(even[i]))) << "stage " << stage << " value " << i;
    }
  }
}

// Checkpoint at step kSteps/2 in one layout, resume in the other: the
// resumed losses follow the uninterrupted run.
void CheckReshard(const std::vector<double>& from_speeds, const std::vector<double>& to_speeds, int stage) {
  const std::string dir = MakeTempDir("speed-reshard");
  std::vector<double> full;
  {
    EngineCluster c(2, "job-1", "cpu", from_speeds);
    c.SetupOk(ParseSpec(TinySftYaml(), SftOverrides(2, stage, dir, !from_speeds.empty())));
    for (int s = 1; s <= kSteps; ++s) {
      full.push_back(c.RunOk(PHASE_SFT_STEP, s).metrics().loss());
      if (s == kSteps / 2) {
        c.RunOk(PHASE_CHECKPOINT, s);
        c.RunOk(PHASE_FLUSH_CHECKPOINTS, s);
      }
    }
  }
  EngineCluster again(2, "job-again", "cpu", to_speeds);
  auto rep = again.SetupOk(ParseSpec(TinySftYaml(), SftOverrides(2, stage, dir, !to_speeds.empty())), dir + "/ckpt");
  EXPECT_EQ(rep.setup().restored_step(), kSteps / 2);
  for (int s = kSteps / 2 + 1; s <= kSteps; ++s) {
    const double loss = again.RunOk(PHASE_SFT_STEP, s).metrics().loss();
    EXPECT_LE(RelDiff(loss, full[s - 1]), 1e-5) << "stage " << stage << " step " << s;
  }
  fs::remove_all(dir);
}

TEST(SpeedCheckpointTest, ProportionalToEvenAndBack) {
  CheckReshard({1, 3}, {}, 2);
  CheckReshard({}, {3, 1}, 3);
  CheckReshard({1, 3}, {1, 3}, 1);
}

TEST(SpeedSetupTest, CalibratesWithoutHints) {
  const std::string dir = MakeTempDir("speed-cal");
  EngineCluster c(2);
  auto res = c.Setup(ParseSpec(TinySftYaml(), SftOverrides(2, 1, dir, true)));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(res[r].status.ok()) << res[r].status;
    EXPECT_EQ(res[r].report.values().at("speed_calibrated"), 1);
    EXPECT_GT(res[r].report.values().at("speed"), 0);
  }
  EXPECT_TRUE(HasLine(res[0].report, "calibrated, GFLOP/s"));
  c.RunOk(PHASE_SFT_STEP, 1);
  fs::remove_all(dir);
}

TEST(SpeedSetupTest, CalibrationSpansMoreThanTwoQuotaPeriods) {
  // A CFS CPU quota stalls a throttled process once per period (100 ms by
  // default); the calibration must time long enough to include the stalls.
  auto ops = kernels::MakeCpuOps(1);
  auto memory = kernels::MakeHostMemory();
  const auto t0 = std::chrono::steady_clock::now();
  auto speed = worker::CalibrateSpeed(*ops, *memory);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(speed.ok()) << speed.status();
  EXPECT_GT(*speed, 0);
  EXPECT_LE(*speed, worker::kMaxSpeed);
  EXPECT_GE(seconds, worker::kCalibrationSeconds);
  EXPECT_GE(worker::kCalibrationSeconds, 0.2);
}

TEST(SpeedSetupTest, OneHintMissingMeansEveryRankCalibrates) {
  const std::string dir = MakeTempDir("speed-mixed");
  EngineCluster c(2, "job-1", "cpu", {4.0, 0.0});
  auto res = c.Setup(ParseSpec(TinySftYaml(), SftOverrides(2, 0, dir, true)));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(res[r].status.ok()) << res[r].status;
    EXPECT_EQ(res[r].report.values().at("speed_calibrated"), 1);
  }
  fs::remove_all(dir);
}

TEST(SpeedSetupTest, BadHintFailsSetup) {
  for (double bad : {-1.0, std::nan(""), 1e9}) {
    const std::string dir = MakeTempDir("speed-bad");
    EngineCluster c(2, "job-1", "cpu", {bad, 1.0});
    auto res = c.Setup(ParseSpec(TinySftYaml(), SftOverrides(2, 0, dir, true)));
    ASSERT_FALSE(res[0].status.ok()) << bad;
    EXPECT_NE(res[0].status.message().find("--speed"), std::string::npos) << res[0].status;
    fs::remove_all(dir);
  }
}

TEST(SpeedSpecTest, IncompatibleOptionsRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"cluster.workers=2", "cluster.sequence_parallel=2"}, "sequence_parallel"},
      {{"cluster.workers=2", "recovery.degraded=true"}, "recovery.degraded"},
      {{"cluster.workers=2", "cluster.zero_stage=3", "zero.hierarchical_partition=true"}, "hierarchical_partition"},
      {{"cluster.workers=2", "zero.grad_compression=int4"}, "int4"},
      {{"cluster.workers=2", "cluster.zero_stage=3", "zero.weight_quantization=int8"}, "int8"},
  };
  for (const auto& [overrides, needle] : cases) {
    std::vector<std::string> o = overrides;
    o.push_back("cluster.shard_by_speed=true");
    auto spec = common::ParseJobSpecYaml(TinySftYaml(), o);
    ASSERT_FALSE(spec.ok()) << needle;
    EXPECT_NE(spec.status().message().find("cluster.shard_by_speed"), std::string::npos) << spec.status();
    EXPECT_NE(spec.status().message().find(needle), std::string::npos) << spec.status();
  }
  auto ok = common::ParseJobSpecYaml(TinySftYaml(), {"cluster.workers=2", "cluster.shard_by_speed=true"});
  EXPECT_TRUE(ok.ok()) << ok.status();
}

}  // namespace
}  // namespace tandem::enginetest
