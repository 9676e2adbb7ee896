// ZenFlow (train.zenflow.*) through the job engine, N ranks as threads over
// Gloo:
//  * topk_fraction = 1 gives bit-identical weights to plain AdamW at ZeRO
//    stages 0 and 2 (the host thread never gets a row);
//  * topk_fraction = 0.1, update_interval = 4 on configs/sft-arith-tiny.yaml
//    (ZeRO-2, 2 workers, the first 120 steps): the loss falls and its final
//    value (mean of the last 10 steps) stays within 8% of plain AdamW's
//    (measured +5.2%), with host updates that ran and were measured;
//  * a checkpoint carries the host state (accumulated gradient, selection,
//    complete moments): a resumed run equals the uninterrupted one bit for
//    bit;
//  * the cpu-guarded device (device memory the host cannot touch) runs it.
#include <cstdio>
#include <filesystem>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_FLUSH_CHECKPOINTS;
using tandem::v1::PHASE_SFT_STEP;

struct RunResult {
  std::vector<double> losses;
  std::vector<float> weights;
  tandem::v1::StepMetrics last;
};

std::vector<std::string> Overrides(int world, int stage, double topk, const std::string& dir) {
  return {"cluster.workers=" + std::to_string(world),
          "cluster.zero_stage=" + std::to_string(stage),
          "train.zenflow.topk_fraction=" + std::to_string(topk),
          "train.zenflow.update_interval=4",
          "train.zenflow.select_interval=4",
          "train.steps=12",
          "checkpoint.dir=" + dir + "/ckpt",
          "output_dir=" + dir + "/final"};
}

// Steps first..last of the tiny SFT job (checkpoint after ckpt_step), then
// the export.
RunResult RunSteps(EngineCluster& c, const std::string& dir, int first, int last, int ckpt_step = 0) {
  RunResult out;
  for (int s = first; s <= last; ++s) {
    out.last = c.RunOk(PHASE_SFT_STEP, s).metrics();
    out.losses.push_back(out.last.loss());
    if (s == ckpt_step) {
      c.RunOk(PHASE_CHECKPOINT, s);
      c.RunOk(PHASE_FLUSH_CHECKPOINTS, s);
    }
  }
  c.RunOk(PHASE_EXPORT, last);
  out.weights = LoadExported(dir + "/final");
  return out;
}

RunResult RunTiny(int world, int stage, double topk, const std::string& device = "cpu", int warm_up = 0) {
  const std::string dir = MakeTempDir("zenflow");
  EngineCluster c(world, "job-zenflow", device);
  std::vector<std::string> o = Overrides(world, stage, topk, dir);
  o.push_back("train.zenflow.full_warm_up_steps=" + std::to_string(warm_up));
  c.SetupOk(ParseSpec(TinySftYaml(), o));
  RunResult r = RunSteps(c, dir, 1, 12);
  fs::remove_all(dir);
  return r;
}

TEST(ZenFlowEngine, TopkOneEqualsAdamW) {
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{2, 2}}) {
    const RunResult plain = RunTiny(world, stage, 0);
    const RunResult zf = RunTiny(world, stage, 1.0);
    ASSERT_EQ(plain.weights.size(), zf.weights.size());
    EXPECT_EQ(MaxAbsDiff(plain.weights, zf.weights), 0.0) << "N=" << world << " stage " << stage;
    for (size_t s = 0; s < plain.losses.size(); ++s) {
      EXPECT_EQ(plain.losses[s], zf.losses[s]) << "N=" << world << " stage " << stage << " step " << s + 1;
    }
    EXPECT_EQ(zf.last.extra().at("zenflow_important_fraction"), 1.0);
    EXPECT_EQ(zf.last.extra().at("zenflow_host_updates"), 0.0);
  }
}

TEST(ZenFlowEngine, TinySftConfigTracksAdamW) {
  auto base = common::LoadJobSpecFile(std::string(TANDEM_SOURCE_DIR) + "/configs/sft-arith-tiny.yaml");
  ASSERT_TRUE(base.ok()) << base.status();
  constexpr int kSteps = 120, kTail = 10;
  auto run = [&](double topk) {
    JobSpec spec = *base;
    spec.mutable_train()->set_steps(kSteps);
    spec.mutable_checkpoint()->set_every(0);
    spec.mutable_train()->mutable_zenflow()->set_topk_fraction(topk);
    spec.mutable_train()->mutable_zenflow()->set_update_interval(4);
    spec.mutable_train()->mutable_zenflow()->set_select_interval(8);
    EngineCluster c(spec.cluster().workers(), "job-zenflow-sft");
    c.SetupOk(spec);
    RunResult out;
    for (int s = 1; s <= kSteps; ++s) {
      out.last = c.RunOk(PHASE_SFT_STEP, s).metrics();
      out.losses.push_back(out.last.loss());
    }
    return out;
  };
  auto tail = [&](const RunResult& r) {
    double t = 0;
    for (int i = kSteps - kTail; i < kSteps; ++i) t += r.losses[i];
    return t / kTail;
  };
  const RunResult adamw = run(0);
  const RunResult zf = run(0.1);
  const auto& x = zf.last.extra();
  std::printf(
      "[zenflow-sft] configs/sft-arith-tiny.yaml, %d steps, ZeRO-2 N=2: final loss (mean of the last %d) AdamW "
      "%.4f, ZenFlow k=0.1 S=4 %.4f (%+.2f%%); important fraction %.3f; %d host updates, host %.4f s, hidden %.4f s, "
      "waited %.4f s\n",
      kSteps, kTail, tail(adamw), tail(zf), 100 * (tail(zf) - tail(adamw)) / tail(adamw),
      x.at("zenflow_important_fraction"), static_cast<int>(x.at("zenflow_host_updates")), x.at("zenflow_host_update_s"),
      x.at("zenflow_host_hidden_s"), x.at("zenflow_host_wait_s"));
  EXPECT_LT(tail(zf), 0.8 * zf.losses.front());
  // Measured +5.2% at 120 steps (the unimportant rows lag one host
  // interval while the loss still falls fast); the bound guards that.
  EXPECT_LE(RelDiff(tail(zf), tail(adamw)), 0.08);
  EXPECT_EQ(x.at("zenflow_host_updates"), kSteps / 4);
  EXPECT_GT(x.at("zenflow_host_update_s"), 0);
  EXPECT_LE(x.at("zenflow_host_hidden_s"), x.at("zenflow_host_update_s"));
  EXPECT_LT(x.at("zenflow_important_fraction"), 0.2);
}

TEST(ZenFlowEngine, ResumeEqualsUninterrupted) {
  // Checkpoint at step 6: between host hand-overs (4, 8), with one host
  // update in flight and two steps accumulated.
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{2, 2}}) {
    const std::string dir = MakeTempDir("zenflow-resume");
    RunResult full;
    {
      EngineCluster c(world, "job-zenflow");
      c.SetupOk(ParseSpec(TinySftYaml(), Overrides(world, stage, 0.25, dir)));
      full = RunSteps(c, dir, 1, 12, /*ckpt_step=*/6);
    }
    const std::string ck = ckpt::FinalDir(dir + "/ckpt", 6);
    auto loaded = ckpt::LoadCheckpoint(ck);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->arrays.contains("zenflow_acc"));
    ASSERT_TRUE(loaded->arrays.contains("zenflow_important"));
    double mass = 0, important = 0;
    for (float a : loaded->arrays.at("zenflow_acc")) mass += std::fabs(a);
    for (float i : loaded->arrays.at("zenflow_important")) important += i;
    EXPECT_GT(mass, 0) << "two steps of gradient are accumulated at step 6";
    EXPECT_LT(important, 0.5 * static_cast<double>(loaded->arrays.at("zenflow_important").size()));
    fs::remove_all(dir + "/final");
    EngineCluster again(world, "job-zenflow-resume");
    auto rep = again.SetupOk(ParseSpec(TinySftYaml(), Overrides(world, stage, 0.25, dir)), ck);
    EXPECT_EQ(rep.setup().restored_step(), 6);
    const RunResult resumed = RunSteps(again, dir, 7, 12);
    for (int s = 7; s <= 12; ++s) {
      EXPECT_EQ(resumed.losses[s - 7], full.losses[s - 1]) << "N=" << world << " step " << s;
    }
    EXPECT_EQ(MaxAbsDiff(resumed.weights, full.weights), 0.0) << "N=" << world << " stage " << stage;
    fs::remove_all(dir);
  }
}

TEST(ZenFlowEngine, WarmUpStepsArePlainAdamW) {
  // A warm-up as long as the run: every step is AdamW's, bit for bit; a
  // warm-up of 4: AdamW's losses up to step 5 (step 5's loss is computed
  // before its update), then the split.
  const RunResult plain = RunTiny(2, 2, 0);
  const RunResult whole = RunTiny(2, 2, 0.1, "cpu", 12);
  EXPECT_EQ(MaxAbsDiff(plain.weights, whole.weights), 0.0);
  EXPECT_EQ(whole.last.extra().at("zenflow_host_updates"), 0.0);
  EXPECT_EQ(whole.last.extra().at("zenflow_important_fraction"), 1.0);
  const RunResult four = RunTiny(2, 2, 0.1, "cpu", 4);
  for (int s = 1; s <= 5; ++s) EXPECT_EQ(four.losses[s - 1], plain.losses[s - 1]) << "step " << s;
  EXPECT_GT(MaxAbsDiff(plain.weights, four.weights), 0.0);
  EXPECT_EQ(four.last.extra().at("zenflow_host_updates"), 2.0);  // handed over at 8 and 12 (the last step syncs)
  EXPECT_LT(four.last.extra().at("zenflow_important_fraction"), 0.2);
}

TEST(ZenFlowEngine, ResumeInAndAfterTheWarmUpEqualsUninterrupted) {
  for (int ckpt_step : {2, 6}) {
    const std::string dir = MakeTempDir("zenflow-warm-resume");
    std::vector<std::string> o = Overrides(2, 2, 0.25, dir);
    o.push_back("train.zenflow.full_warm_up_steps=4");
    RunResult full;
    {
      EngineCluster c(2, "job-zenflow");
      c.SetupOk(ParseSpec(TinySftYaml(), o));
      full = RunSteps(c, dir, 1, 12, ckpt_step);
    }
    fs::remove_all(dir + "/final");
    EngineCluster again(2, "job-zenflow-resume");
    auto rep = again.SetupOk(ParseSpec(TinySftYaml(), o), ckpt::FinalDir(dir + "/ckpt", ckpt_step));
    EXPECT_EQ(rep.setup().restored_step(), ckpt_step);
    const RunResult resumed = RunSteps(again, dir, ckpt_step + 1, 12);
    for (int s = ckpt_step + 1; s <= 12; ++s) {
      EXPECT_EQ(resumed.losses[s - ckpt_step - 1], full.losses[s - 1]) << "checkpoint " << ckpt_step << " step " << s;
    }
    EXPECT_EQ(MaxAbsDiff(resumed.weights, full.weights), 0.0) << "checkpoint " << ckpt_step;
    fs::remove_all(dir);
  }
}

TEST(ZenFlowEngine, GuardedDeviceRunsIt) {
  const RunResult cpu = RunTiny(2, 2, 0.25, "cpu");
  const RunResult guarded = RunTiny(2, 2, 0.25, "cpu-guarded");
  std::printf("[zenflow-guarded] ZeRO-2 N=2 k=0.25: final loss cpu %.5f guarded %.5f; max |w diff| %.3g\n",
              cpu.losses.back(), guarded.losses.back(), MaxAbsDiff(cpu.weights, guarded.weights));
  EXPECT_TRUE(std::isfinite(guarded.losses.back()));
  EXPECT_LE(RelDiff(guarded.losses.back(), cpu.losses.back()), 1e-4);
  EXPECT_GT(guarded.last.extra().at("zenflow_host_updates"), 0);
}

}  // namespace
}  // namespace tandem::enginetest
