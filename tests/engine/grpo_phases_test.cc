// GRPO phases through the engine: ROLLOUT -> SCORE -> LOGPROBS ->
// UPDATE in order on a tiny model; a phase out of order fails naming the
// phase; resident memory does not grow over 50 phase cycles; a short seeded
// run (SFT warm start, then GRPO) improves reward; N=1 and N=2 produce the
// same trajectories (rewards, rollout tokens, losses), N=2 at ZeRO stage 3;
// a GRPO run restored from its checkpoint ends bit-identical.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/engine/memory_probe.h"

namespace tandem::enginetest {
namespace {

using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_LOGPROBS;
using tandem::v1::PHASE_ROLLOUT;
using tandem::v1::PHASE_SCORE;
using tandem::v1::PHASE_SFT_STEP;
using tandem::v1::PHASE_UPDATE;

struct StepFigures {
  double reward = 0, accuracy = 0, rollout_tokens = 0, loss = 0;
};

StepFigures RlStep(EngineCluster& c, int64_t step) {
  StepFigures f;
  auto r = c.RunOk(PHASE_ROLLOUT, step);
  f.rollout_tokens = r.metrics().extra().contains("rollout_tokens") ? r.metrics().extra().at("rollout_tokens") : -1;
  auto s = c.RunOk(PHASE_SCORE, step);
  f.reward = s.metrics().reward_mean();
  f.accuracy = s.metrics().extra().at("rollout_accuracy");
  c.RunOk(PHASE_LOGPROBS, step);
  f.loss = c.RunOk(PHASE_UPDATE, step).metrics().loss();
  return f;
}

TEST(GrpoPhasesTest, PhasesInOrderAndOutOfOrderFailsNamingPhase) {
  EngineCluster c(1);
  c.SetupOk(ParseSpec(TinyGrpoYaml(), {}));
  // UPDATE before anything of step 1.
  auto res = c.Run(PHASE_UPDATE, 1);
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_NE(res[0].status.message().find("UPDATE"), std::string::npos) << res[0].status;
  EXPECT_EQ(common::FailureKindOf(res[0].status), tandem::v1::PHASE_FAILURE_KIND_FATAL);
  c.RunOk(PHASE_ROLLOUT, 1);
  // LOGPROBS before SCORE.
  res = c.Run(PHASE_LOGPROBS, 1);
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_NE(res[0].status.message().find("LOGPROBS"), std::string::npos) << res[0].status;
  c.RunOk(PHASE_SCORE, 1);
  // UPDATE without LOGPROBS.
  res = c.Run(PHASE_UPDATE, 1);
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_NE(res[0].status.message().find("UPDATE for step 1 without LOGPROBS"), std::string::npos) << res[0].status;
  c.RunOk(PHASE_LOGPROBS, 1);
  auto up = c.RunOk(PHASE_UPDATE, 1);
  EXPECT_EQ(up.metrics().extra().at("policy_version"), 1);
  // SCORE of a step whose ROLLOUT did not run.
  res = c.Run(PHASE_SCORE, 2);
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_NE(res[0].status.message().find("SCORE for step 2 without its ROLLOUT"), std::string::npos) << res[0].status;
  // A phase for a job the worker does not hold.
  tandem::v1::PhaseCommand cmd;
  cmd.set_command_id("other");
  cmd.set_job_id("not-this-job");
  cmd.set_phase(PHASE_ROLLOUT);
  cmd.set_step(1);
  ReportPhaseRequest rep;
  EXPECT_EQ(c.engine(0).RunPhase(cmd, &rep).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GrpoPhasesTest, MemoryDoesNotGrowOver50Cycles) {
  EngineCluster c(1);
  // Offloading the optimizer state exercises the switch path too.
  c.SetupOk(ParseSpec(TinyGrpoYaml(), {"rl.offload_optimizer=true", "train.steps=60"}));
  constexpr int kWarmup = 5, kCycles = 50;
  int64_t after_warmup = 0, peak = 0;
  for (int s = 1; s <= kWarmup + kCycles; ++s) {
    RlStep(c, s);
    if (s == kWarmup) after_warmup = worker::CurrentRssBytes();
    if (s > kWarmup) peak = std::max(peak, worker::CurrentRssBytes());
  }
  const int64_t end = worker::CurrentRssBytes();
  std::printf(
      "[grpo-memory] RSS after %d warm-up cycles %.2f MiB, max over the next %d "
      "%.2f MiB, at the end %.2f MiB\n",
      kWarmup, after_warmup / 1048576.0, kCycles, peak / 1048576.0, end / 1048576.0);
  ASSERT_GT(after_warmup, 0);
  // Small slack for allocator noise; a leak of one trajectory batch per
  // cycle would exceed it.
  EXPECT_LE(end, after_warmup + 2 * 1048576) << "RSS grew across phase cycles";
}

TEST(GrpoPhasesTest, SeededRunImprovesReward) {
  EngineCluster c(1);
  // A short SFT warm start teaches part of the answer format; GRPO then
  // raises the reward (format + correctness) within 40 steps.
  constexpr int kWarm = 15, kSteps = 40;
  c.SetupOk(ParseSpec(TinyGrpoYaml(), {"init.sft.steps=" + std::to_string(kWarm), "init.sft.lr=1e-2", "train.lr=1e-2",
                                       "rl.prompts_per_step=8", "train.steps=" + std::to_string(kSteps)}));
  for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
  std::vector<double> rewards;
  for (int s = 1; s <= kSteps; ++s) rewards.push_back(RlStep(c, s).reward);
  auto mean = [&](int b, int e) {
    double t = 0;
    for (int i = b; i < e; ++i) t += rewards[i];
    return t / (e - b);
  };
  const double first = mean(0, 6), last = mean(kSteps - 6, kSteps);
  std::printf("[grpo-reward] mean reward steps 1-6 %.3f, steps %d-%d %.3f\n", first, kSteps - 5, kSteps, last);
  EXPECT_GT(last, first + 0.1);
}

TEST(GrpoPhasesTest, OldLogprobsComeFromTheUpdateForwardOnlyWithOneOptimizerStep) {
  // One epoch of one mini-batch: LOGPROBS computes nothing, UPDATE's ratio
  // is exactly 1 and it reports the sampler mismatch itself.
  for (const char* minis : {"1", "2"}) {
    SCOPED_TRACE(std::string("rl.mini_batches=") + minis);
    EngineCluster c(1);
    c.SetupOk(ParseSpec(TinyGrpoYaml(), {std::string("rl.mini_batches=") + minis, "rl.prompts_per_step=4"}));
    c.RunOk(PHASE_ROLLOUT, 1);
    c.RunOk(PHASE_SCORE, 1);
    auto lp = c.RunOk(PHASE_LOGPROBS, 1);
    auto up = c.RunOk(PHASE_UPDATE, 1);
    const bool single = std::string(minis) == "1";
    EXPECT_EQ(lp.metrics().extra().contains("logprob_mismatch_mean"), !single);
    EXPECT_EQ(up.metrics().extra().contains("logprob_mismatch_mean"), single);
    const auto& with_mismatch = single ? up : lp;
    EXPECT_LT(with_mismatch.metrics().extra().at("logprob_mismatch_mean"), 1e-4);
    if (single) {
      EXPECT_EQ(up.metrics().extra().at("ratio_mean"), 1.0);
      EXPECT_EQ(up.metrics().extra().at("clip_fraction"), 0.0);
    }
  }
}

TEST(GrpoPhasesTest, WarmStartStopAccuracyHoldsTheModel) {
  // Run A (stop accuracy 1: reported, never reached) finds the best probe
  // fraction of a warm start; run B stops at that fraction. On 2 ranks at
  // ZeRO-2, B equals A step for step until A first reaches it; from that
  // step on every step of B holds (no update, so the probe's verdict stays).
  constexpr int kWarm = 200;
  auto spec = [&](double stop) {
    return ParseSpec(TinyGrpoYaml(),
                     {"init.sft.steps=" + std::to_string(kWarm), "init.sft.lr=1e-2", "model.config.hidden_size=64",
                      "model.config.intermediate_size=172", "cluster.workers=2", "cluster.zero_stage=2",
                      "init.sft.stop_accuracy=" + std::to_string(stop)});
  };
  EngineCluster a(2, "job-a");
  a.SetupOk(spec(1.0));
  std::vector<double> loss_a, exact_a;
  for (int w = 1; w <= kWarm; ++w) {
    const auto m = a.RunOk(PHASE_SFT_STEP, -w).metrics();
    EXPECT_EQ(m.extra().at("warm_start_held"), 0) << "step " << -w;
    loss_a.push_back(m.loss());
    exact_a.push_back(m.extra().at("teacher_forced_exact"));
  }
  const double stop = *std::max_element(exact_a.begin(), exact_a.end());
  ASSERT_GT(stop, 0) << "the tiny model never got a probe example exact: raise kWarm";
  const int first = static_cast<int>(std::find(exact_a.begin(), exact_a.end(), stop) - exact_a.begin()) + 1;
  ASSERT_LT(first, kWarm) << "the best probe fraction came only at the last step: raise kWarm";

  EngineCluster b(2, "job-b");
  b.SetupOk(spec(stop));
  for (int w = 1; w <= kWarm; ++w) {
    const auto m = b.RunOk(PHASE_SFT_STEP, -w).metrics();
    const bool hold = m.extra().at("warm_start_held") == 1;
    EXPECT_EQ(hold, w >= first) << "step " << -w;
    if (w <= first) {
      EXPECT_EQ(m.extra().at("teacher_forced_exact"), exact_a[w - 1]) << "step " << -w;
    }
    if (w < first) {
      EXPECT_EQ(m.loss(), loss_a[w - 1]) << "step " << -w << ": B differs from A before its stop";
    }
    if (hold) {
      EXPECT_EQ(m.lr(), 0) << "step " << -w;
      EXPECT_EQ(m.grad_norm(), 0) << "step " << -w;
      EXPECT_EQ(m.extra().at("teacher_forced_exact"), stop) << "step " << -w << ": held weights changed";
    }
  }
  std::printf("[warm-start-hold] probe fraction %.4f first at warm-start step %d of %d; held from there\n", stop,
              -first, kWarm);
}

TEST(GrpoPhasesTest, SameTrajectoriesForOneAndTwoRanks) {
  std::vector<StepFigures> one, two;
  for (int world : {1, 2}) {
    EngineCluster c(world);
    // N=2 runs ZeRO-3 (weights gathered for the rollout) against N=1 stage 0.
    c.SetupOk(ParseSpec(TinyGrpoYaml(), {"init.sft.steps=15", "init.sft.lr=1e-2",
                                         "cluster.zero_stage=" + std::to_string(world == 2 ? 3 : 0)}));
    for (int w = 1; w <= 15; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    auto& out = world == 1 ? one : two;
    for (int s = 1; s <= 6; ++s) out.push_back(RlStep(c, s));
  }
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].rollout_tokens, two[i].rollout_tokens) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(one[i].reward, two[i].reward) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(one[i].accuracy, two[i].accuracy) << "step " << i + 1;
    EXPECT_LE(RelDiff(one[i].loss, two[i].loss), 1e-4) << "step " << i + 1;
    std::printf(
        "[grpo-determinism] step %zu: reward %.4f / %.4f, tokens %.0f / %.0f, "
        "loss %.6g / %.6g (N=1 stage 0 / N=2 stage 3)\n",
        i + 1, one[i].reward, two[i].reward, one[i].rollout_tokens, two[i].rollout_tokens, one[i].loss, two[i].loss);
  }
}

// Determinism for RL: CHECKPOINT after GRPO step 2, continue to 4;
// a second cluster restored from that checkpoint redoes steps 3-4 with the
// same rollouts, rewards and final weights, bit for bit.
TEST(GrpoPhasesTest, RestoredRunIsBitIdentical) {
  const std::string dir = MakeTempDir("grpo-ckpt");
  const JobSpec spec =
      ParseSpec(TinyGrpoYaml(), {"init.sft.steps=3", "init.sft.lr=1e-2", "cluster.zero_stage=2", "train.steps=4",
                                 "checkpoint.dir=" + dir + "/ckpt", "output_dir=" + dir + "/final"});
  std::vector<StepFigures> first;
  std::vector<float> full;
  {
    EngineCluster c(2);
    c.SetupOk(spec);
    for (int w = 1; w <= 3; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    for (int s = 1; s <= 4; ++s) {
      first.push_back(RlStep(c, s));
      if (s == 2) c.RunOk(PHASE_CHECKPOINT, s);
    }
    c.RunOk(PHASE_EXPORT, 4);
    full = LoadExported(dir + "/final");
  }
  std::filesystem::remove_all(dir + "/final");
  EngineCluster again(2, "job-grpo-resume");
  auto rep = again.SetupOk(spec, ckpt::FinalDir(dir + "/ckpt", 2));
  EXPECT_EQ(rep.setup().restored_step(), 2);
  for (int s = 3; s <= 4; ++s) {
    const StepFigures f = RlStep(again, s);
    EXPECT_EQ(f.reward, first[s - 1].reward) << "step " << s;
    EXPECT_EQ(f.rollout_tokens, first[s - 1].rollout_tokens) << "step " << s;
    EXPECT_EQ(f.loss, first[s - 1].loss) << "step " << s;
  }
  again.RunOk(PHASE_EXPORT, 4);
  const std::vector<float> resumed = LoadExported(dir + "/final");
  ASSERT_EQ(resumed.size(), full.size());
  EXPECT_EQ(std::memcmp(resumed.data(), full.data(), full.size() * sizeof(float)), 0)
      << "max diff " << MaxAbsDiff(resumed, full);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::enginetest
