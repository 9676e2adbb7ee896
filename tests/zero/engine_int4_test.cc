// LoCo and node tiers through the job engine (the SFT tiny job of
// tests/engine, N ranks as threads over Gloo):
//  * zero.grad_compression: int4 with error feedback tracks the fp32 job
//    (final loss within 2%) at stages 0 and 3; without error feedback the
//    weights end further from the fp32 job's.
//  * The checkpoint carries the error shards ("grad_error") and a job
//    resumes from it on another world size.
//  * The GRPO tiny job still learns with int4 gradients.
//  * The step metrics split the bytes by tier from the assignment's topology.
#include <cstdio>
#include <filesystem>

#include "common/rank_topology.h"
#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  std::vector<double> losses;
  std::vector<float> weights;
  tandem::v1::StepMetrics last;
};

JobSpec Spec(int world, int stage, const std::string& compression, bool feedback, const std::string& dir) {
  return ParseSpec(
      TinySftYaml(),
      {"cluster.workers=" + std::to_string(world), "cluster.zero_stage=" + std::to_string(stage),
       "zero.grad_compression=" + compression, std::string("zero.error_feedback=") + (feedback ? "true" : "false"),
       "checkpoint.dir=" + dir + "/ckpt", "output_dir=" + dir + "/final"});
}

RunResult RunSft(int world, int stage, const std::string& compression, bool feedback) {
  RunResult out;
  const std::string dir = MakeTempDir("int4");
  EngineCluster cluster(world);
  cluster.SetupOk(Spec(world, stage, compression, feedback, dir));
  const int steps = 20;
  for (int s = 1; s <= steps; ++s) {
    out.last = cluster.RunOk(tandem::v1::PHASE_SFT_STEP, s).metrics();
    out.losses.push_back(out.last.loss());
  }
  cluster.RunOk(tandem::v1::PHASE_EXPORT, steps);
  out.weights = LoadExported(dir + "/final");
  fs::remove_all(dir);
  return out;
}

TEST(Int4Engine, SftTracksFp32WithErrorFeedback) {
  for (int stage : {0, 3}) {
    const RunResult fp32 = RunSft(2, stage, "none", true);
    const RunResult loco = RunSft(2, stage, "int4", true);
    const RunResult plain = RunSft(2, stage, "int4", false);
    EXPECT_LT(fp32.losses.back(), fp32.losses.front());
    std::printf(
        "[int4-engine] N=2 stage %d: final loss fp32 %.5f, int4+EF %.5f (%.2f%%), int4 no EF %.5f "
        "(%.2f%%); max |w - w_fp32| %.3g vs %.3g; bytes sent by rank 0 in the last step: fp32 "
        "reduce_scatter %.0f allreduce %.0f, int4 send_recv %.0f allgather %.0f\n",
        stage, fp32.losses.back(), loco.losses.back(), 100 * RelDiff(loco.losses.back(), fp32.losses.back()),
        plain.losses.back(), 100 * RelDiff(plain.losses.back(), fp32.losses.back()),
        MaxAbsDiff(loco.weights, fp32.weights), MaxAbsDiff(plain.weights, fp32.weights),
        fp32.last.extra().contains("bytes_sent_reduce_scatter") ? fp32.last.extra().at("bytes_sent_reduce_scatter")
                                                                : 0.0,
        fp32.last.extra().contains("bytes_sent_allreduce") ? fp32.last.extra().at("bytes_sent_allreduce") : 0.0,
        loco.last.extra().contains("bytes_sent_send_recv") ? loco.last.extra().at("bytes_sent_send_recv") : 0.0,
        loco.last.extra().contains("bytes_sent_allgather") ? loco.last.extra().at("bytes_sent_allgather") : 0.0);
    EXPECT_LE(RelDiff(loco.losses.back(), fp32.losses.back()), 0.02) << "stage " << stage;
    // Without error feedback the weights end further from the fp32 job's.
    EXPECT_LT(MaxAbsDiff(loco.weights, fp32.weights), MaxAbsDiff(plain.weights, fp32.weights)) << "stage " << stage;
    EXPECT_GT(loco.last.extra().at("bytes_sent_send_recv"), 0);
  }
}

TEST(Int4Engine, CheckpointCarriesTheErrorAndReshards) {
  const std::string dir = MakeTempDir("int4ckpt");
  {
    EngineCluster cluster(2);
    cluster.SetupOk(Spec(2, 3, "int4", true, dir));
    for (int s = 1; s <= 4; ++s) cluster.RunOk(tandem::v1::PHASE_SFT_STEP, s);
    cluster.RunOk(tandem::v1::PHASE_CHECKPOINT, 4);
    cluster.RunOk(tandem::v1::PHASE_FLUSH_CHECKPOINTS, 4);
  }
  const std::string ck = ckpt::FinalDir(dir + "/ckpt", 4);
  auto loaded = ckpt::LoadCheckpoint(ck);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->arrays.contains("grad_error"));
  double mass = 0;
  for (float e : loaded->arrays.at("grad_error")) mass += std::fabs(e);
  EXPECT_GT(mass, 0) << "the ranks owe some quantisation error after 4 steps";
  EngineCluster again(3, "job-int4-resume");
  auto rep = again.SetupOk(Spec(3, 3, "int4", true, dir), ck);
  EXPECT_EQ(rep.setup().restored_step(), 4);
  const double loss = again.RunOk(tandem::v1::PHASE_SFT_STEP, 5).metrics().loss();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  fs::remove_all(dir);
}

// The GRPO tiny job (a short SFT warm start, then 40 GRPO steps, as
// tests/engine GrpoPhasesTest.SeededRunImprovesReward) still learns with
// int4 gradients on N = 2 at stage 3.
TEST(Int4Engine, GrpoStillLearns) {
  EngineCluster c(2);
  constexpr int kWarm = 15, kSteps = 40;
  c.SetupOk(ParseSpec(TinyGrpoYaml(), {"init.sft.steps=" + std::to_string(kWarm), "init.sft.lr=1e-2", "train.lr=1e-2",
                                       "rl.prompts_per_step=8", "cluster.workers=2", "cluster.zero_stage=3",
                                       "zero.grad_compression=int4", "train.steps=" + std::to_string(kSteps)}));
  for (int w = 1; w <= kWarm; ++w) c.RunOk(tandem::v1::PHASE_SFT_STEP, -w);
  std::vector<double> rewards;
  for (int s = 1; s <= kSteps; ++s) {
    c.RunOk(tandem::v1::PHASE_ROLLOUT, s);
    rewards.push_back(c.RunOk(tandem::v1::PHASE_SCORE, s).metrics().reward_mean());
    c.RunOk(tandem::v1::PHASE_LOGPROBS, s);
    c.RunOk(tandem::v1::PHASE_UPDATE, s);
  }
  auto mean = [&](int b, int e) {
    double t = 0;
    for (int i = b; i < e; ++i) t += rewards[i];
    return t / (e - b);
  };
  const double first = mean(0, 6), last = mean(kSteps - 6, kSteps);
  std::printf("[int4-grpo] N=2 stage 3: mean reward steps 1-6 %.3f, steps %d-%d %.3f\n", first, kSteps - 5, kSteps,
              last);
  EXPECT_GT(last, first + 0.1);
}

// Two ranks on two nodes: every byte crosses nodes; on one node none does.
TEST(TierBytesEngine, StepMetricsSplitBytesByTier) {
  for (const auto& nodes : {std::vector<std::string>{"a", "b"}, std::vector<std::string>{"a", "a"}}) {
    const std::string dir = MakeTempDir("tiers");
    EngineCluster cluster(2);
    auto setup = cluster.SetupMembers(Spec(2, 3, "none", true, dir), {0, 1}, [&](int r, tandem::v1::Assignment& a) {
      common::FillRankTopology(nodes, r, a.mutable_topology());
    });
    for (const auto& r : setup) ASSERT_TRUE(r.status.ok()) << r.status;
    const auto m = cluster.RunOk(tandem::v1::PHASE_SFT_STEP, 1).metrics();
    double sent = 0;
    for (const auto& [k, v] : m.extra()) {
      if (k.rfind("bytes_sent_", 0) == 0) sent += v;
    }
    const double inter = m.extra().at("tier_sent_inter_node"), intra = m.extra().at("tier_sent_intra_node");
    std::printf("[tiers] nodes %s,%s: sent %.0f, intra %.0f, inter %.0f\n", nodes[0].c_str(), nodes[1].c_str(), sent,
                intra, inter);
    EXPECT_GT(sent, 0);
    EXPECT_EQ(intra + inter, sent);
    EXPECT_EQ(nodes[0] == nodes[1] ? inter : intra, 0);
    fs::remove_all(dir);
  }
  // A topology that does not match the ranks fails SETUP with its reason.
  const std::string dir = MakeTempDir("tiers-bad");
  EngineCluster cluster(2);
  auto setup = cluster.SetupMembers(Spec(2, 3, "none", true, dir), {0, 1}, [&](int r, tandem::v1::Assignment& a) {
    common::FillRankTopology({"a", "b"}, 1 - r, a.mutable_topology());
  });
  EXPECT_FALSE(setup[0].status.ok());
  EXPECT_NE(setup[0].status.message().find("topology"), std::string::npos) << setup[0].status;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::enginetest
