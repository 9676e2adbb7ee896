// Degraded continuation (MeCeFO): a worker of a recovery.degraded
// job dies; the survivors are set up again at the next generation with
// live_restore (their in-memory state of the last completed training step)
// and logical data shares (each computes its own share plus the lost
// rank's), with no rollback. Checks:
//  - SFT, 3 ranks, rank 1 dies during step 4: the survivors' steps 4..8 and,
//    after the replacement joins through a normal checkpoint restore, steps
//    9..14 give the fault-free run's losses (relative diff <= 1e-5);
//  - GRPO (KL on, SFT warm start), 2 ranks -> 1 survivor after step 2:
//    steps 3-4 match (and run with the cheap backward);
//  - live_restore with the wrong step, or with a rank that holds no state,
//    fails SETUP on every rank with "live restore: ..."; so does a logical
//    share that no rank computes;
//  - the cheap backward (skip attention, recompute the MLP on taken-over
//    shares) runs, differs from the exact run and the loss keeps falling;
//  - low-rank MLP gradients (recovery.degraded_low_rank): the loss keeps
//    falling, the departure from the exact run shrinks with the rank;
//  - GRPO with rollout.tp_size 2: the survivor of the TP group rolls out at
//    tp_size 1 while degraded and the job goes back to TP when it grows
//    back; rewards and losses equal a fault-free tp_size 1 run (fp32
//    summation order apart);
//  - ZeRO stages 1-3: the survivors re-partition their shards and the lost
//    rank's peer copy; with a copy of the live step the run matches the
//    fault-free one; an older copy gives stale moments at stage 2 and is
//    refused at stage 3.
// Prints the largest differences.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_LOGPROBS;
using tandem::v1::PHASE_ROLLOUT;
using tandem::v1::PHASE_SCORE;
using tandem::v1::PHASE_SFT_STEP;
using tandem::v1::PHASE_UPDATE;

constexpr int kW = 3;
constexpr int kSteps = 14;
constexpr int kFailAfter = 3;  // rank 1 dies during step 4
constexpr int kGrowBack = 8;   // checkpoint after step 8; the replacement joins

JobSpec SftSpec(const std::string& dir, bool cheap, int low_rank = 0, int stage = 0) {
  return ParseSpec(TinySftYaml(),
                   {"cluster.workers=" + std::to_string(kW), "cluster.zero_stage=" + std::to_string(stage),
                    "train.steps=" + std::to_string(kSteps), "recovery.degraded=true",
                    std::string("recovery.degraded_cheap_backward=") + (cheap ? "true" : "false"),
                    "recovery.degraded_low_rank=" + std::to_string(low_rank), "checkpoint.dir=" + dir + "/ckpt"});
}

// The survivors of 3 ranks after old rank `lost` died: old ranks in order
// become new ranks 0, 1; the survivor before the lost rank (or after it,
// for rank 0) takes over its logical share.
std::vector<int> Survivors(int lost) {
  std::vector<int> s;
  for (int r = 0; r < kW; ++r) {
    if (r != lost) s.push_back(r);
  }
  return s;
}

std::function<void(int, tandem::v1::Assignment&)> LiveRestore(int64_t step, int logical_world,
                                                              const std::vector<int>& survivors) {
  return [=](int rank, tandem::v1::Assignment& a) {
    a.set_live_restore(true);
    a.set_live_restore_step(step);
    a.set_logical_world_size(logical_world);
    // Contiguous blocks: each survivor from its own logical rank up to the
    // next survivor's.
    const int own = survivors[rank];
    const int begin = rank == 0 ? 0 : own;
    const int end = rank + 1 < static_cast<int>(survivors.size()) ? survivors[rank + 1] : logical_world;
    a.set_logical_rank_begin(begin);
    a.set_logical_rank_end(end);
    a.set_own_logical_rank(own);
  };
}

// The lost engine never answers step `step`: the survivors start it and
// block in the gradient allreduce until the coordinator aborts them.
void FailDuringStep(EngineCluster& c, const std::vector<int>& survivors, int64_t step) {
  std::vector<RankResult> out(survivors.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < survivors.size(); ++i) {
    threads.emplace_back([&, i] {
      tandem::v1::PhaseCommand cmd;
      cmd.set_command_id("fail-" + std::to_string(step) + "-" + std::to_string(i));
      cmd.set_job_id("job-1");
      cmd.set_generation(c.generation());
      cmd.set_phase(PHASE_SFT_STEP);
      cmd.set_step(step);
      out[i].status = c.engine(survivors[i]).RunPhase(cmd, &out[i].report);
    });
  }
  // Time for the survivors to reach the gradient allreduce, where the abort
  // is meant to find them. What is checked is that nothing completes there
  // (the step its peer never ran must not finish); the survivors' arrival
  // writes no store key and sends no report, so there is nothing to wait on.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int r = 0; r < c.world(); ++r) c.engine(r).Abort();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_FALSE(out[i].status.ok()) << "survivor " << i << " finished a step its peer never ran";
    EXPECT_EQ(common::FailureKindOf(out[i].status), tandem::v1::PHASE_FAILURE_KIND_RETRYABLE) << out[i].status;
  }
}

void WaitForCheckpoint(const std::string& root, int64_t step) {
  const std::string manifest = ckpt::FinalDir(root, step) + "/manifest.json";
  for (int i = 0; i < 200 && !fs::exists(manifest); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(manifest)) << manifest;
}

const std::vector<double>& FaultFreeLosses() {
  static const std::vector<double>* losses = [] {
    auto* out = new std::vector<double>;
    const std::string dir = MakeTempDir("degraded-base");
    EngineCluster c(kW);
    c.SetupOk(SftSpec(dir, false));
    for (int s = 1; s <= kSteps; ++s) out->push_back(c.RunOk(PHASE_SFT_STEP, s).metrics().loss());
    fs::remove_all(dir);
    return out;
  }();
  return *losses;
}

// Runs the degraded scenario; losses[s-1] for every step.
// At ZeRO stages 1-3, `copy_step` is the step of the checkpoint (and peer
// copies) taken before the failure.
std::vector<double> DegradedRun(bool cheap, int lost, bool grow_back, const std::string& device = "cpu",
                                int low_rank = 0, int stage = 0, int copy_step = kFailAfter,
                                std::string* setup_line = nullptr) {
  const std::string dir = MakeTempDir("degraded");
  const JobSpec spec = SftSpec(dir, cheap, low_rank, stage);
  std::vector<double> losses(kSteps, 0.0);
  EngineCluster c(kW, "job-1", device);
  c.SetupOk(spec);
  for (int s = 1; s <= kFailAfter; ++s) {
    losses[s - 1] = c.RunOk(PHASE_SFT_STEP, s).metrics().loss();
    if (stage > 0 && s == copy_step) {
      c.RunOk(PHASE_CHECKPOINT, s);
      WaitForCheckpoint(dir + "/ckpt", s);
    }
  }
  const std::vector<int> survivors = Survivors(lost);
  FailDuringStep(c, survivors, kFailAfter + 1);
  auto res = c.SetupMembers(spec, survivors, LiveRestore(kFailAfter, kW, survivors));
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_TRUE(res[r].status.ok()) << "live SETUP rank " << r << ": " << res[r].status;
    if (setup_line != nullptr && r == 0 && res[r].report.log_lines_size() > 0) {
      for (const auto& line : res[r].report.log_lines()) {
        if (line.find("kept the live state") != std::string::npos) *setup_line = line;
      }
    }
    EXPECT_EQ(res[r].report.setup().restore_source(), tandem::v1::RESTORE_SOURCE_LIVE);
    EXPECT_EQ(res[r].report.setup().restored_step(), kFailAfter);
    EXPECT_GT(res[r].report.setup().restore_seconds(), 0);
    EXPECT_TRUE(HasLine(res[r].report, "kept the live state of step 3")) << r;
  }
  const int last_degraded = grow_back ? kGrowBack : kSteps;
  for (int s = kFailAfter + 1; s <= last_degraded; ++s) {
    losses[s - 1] = c.RunOk(PHASE_SFT_STEP, s).metrics().loss();
  }
  if (grow_back) {
    // The replacement joins: a normal checkpoint at a step boundary, then a
    // normal recovery of all 3 ranks from it.
    c.RunOk(PHASE_CHECKPOINT, kGrowBack);
    WaitForCheckpoint(dir + "/ckpt", kGrowBack);
    auto rep = c.SetupOk(spec, ckpt::FinalDir(dir + "/ckpt", kGrowBack));
    EXPECT_EQ(rep.setup().restored_step(), kGrowBack);
    for (int s = kGrowBack + 1; s <= kSteps; ++s) {
      losses[s - 1] = c.RunOk(PHASE_SFT_STEP, s).metrics().loss();
    }
  }
  fs::remove_all(dir);
  return losses;
}

TEST(DegradedContinuationTest, SftLossesMatchFaultFreeRun) {
  const auto& base = FaultFreeLosses();
  ASSERT_EQ(base.size(), static_cast<size_t>(kSteps));
  for (int lost : {1, 0}) {
    const auto run = DegradedRun(/*cheap=*/false, lost, /*grow_back=*/true);
    double worst = 0;
    int worst_step = 0;
    for (int s = 1; s <= kSteps; ++s) {
      const double d = RelDiff(run[s - 1], base[s - 1]);
      if (d > worst) {
        worst = d;
        worst_step = s;
      }
      EXPECT_LE(d, 1e-5) << "lost rank " << lost << ", step " << s << ": " << run[s - 1] << " vs " << base[s - 1];
    }
    std::printf(
        "[degraded] SFT W=3, rank %d lost in step %d, 2 ranks for steps %d-%d, 3 again from %d: "
        "largest loss rel diff vs fault-free %.3g (step %d)\n",
        lost, kFailAfter + 1, kFailAfter + 1, kGrowBack, kGrowBack + 1, worst, worst_step);
  }
}

TEST(DegradedContinuationTest, CheapBackwardRunsAndLossKeepsFalling) {
  const auto& base = FaultFreeLosses();
  const auto run = DegradedRun(/*cheap=*/true, /*lost=*/1, /*grow_back=*/false);
  double worst = 0;
  for (int s = kFailAfter + 1; s <= kSteps; ++s) worst = std::max(worst, RelDiff(run[s - 1], base[s - 1]));
  const double early = (run[3] + run[4] + run[5]) / 3;  // steps 4-6
  const double late = (run[kSteps - 3] + run[kSteps - 2] + run[kSteps - 1]) / 3;
  std::printf(
      "[degraded] SFT cheap backward: loss steps 4-6 %.4f -> steps %d-%d %.4f (exact run %.4f); "
      "largest rel diff vs exact %.3g\n",
      early, kSteps - 2, kSteps, late, (base[kSteps - 3] + base[kSteps - 2] + base[kSteps - 1]) / 3, worst);
  EXPECT_LT(late, early);
  EXPECT_GT(worst, 1e-6) << "the cheap backward changed nothing: is it applied?";
  EXPECT_LE(run[3], base[3] * (1 + 1e-5)) << "step 4's loss comes before any cheap update";
}

// ZeRO stages 1-3: the survivors re-partition the old shards, the lost
// rank's from its neighbour's peer copy of step 3 (the live step), and the
// run matches the fault-free one (stage 0's; the stages differ only in the
// order of fp32 sums) before and after growing back.
TEST(DegradedContinuationTest, ShardedStagesMatchFaultFreeRun) {
  const auto& base = FaultFreeLosses();
  for (int stage : {1, 2, 3}) {
    for (int lost : {1, 0}) {
      std::string line;
      const auto run = DegradedRun(/*cheap=*/false, lost, /*grow_back=*/true, "cpu", 0, stage, kFailAfter, &line);
      EXPECT_NE(line.find("re-partitioned from 3 ZeRO-" + std::to_string(stage) + " shards (lost old rank(s) " +
                          std::to_string(lost) + " from peer copies)"),
                std::string::npos)
          << line;
      double worst = 0;
      for (int s = 1; s <= kSteps; ++s) {
        const double d = RelDiff(run[s - 1], base[s - 1]);
        worst = std::max(worst, d);
        EXPECT_LE(d, 1e-5) << "stage " << stage << ", lost rank " << lost << ", step " << s << ": " << run[s - 1]
                           << " vs " << base[s - 1];
      }
      std::printf(
          "[degraded] SFT ZeRO-%d W=3, rank %d lost in step %d, grown back after step %d: largest loss "
          "rel diff vs fault-free %.3g\n",
          stage, lost, kFailAfter + 1, kGrowBack, worst);
    }
  }
}

// A peer copy older than the live step: at stage 2 the parameters are held
// in full (exact) and only the lost shard's Adam moments are stale, which is
// reported; the run stays close and the loss keeps falling. At stage 3 the
// lost parameters exist only in that old copy: every rank fails SETUP with
// "live restore: ..." (the coordinator then restores from disk).
TEST(DegradedContinuationTest, StaleCopyIsApproximateAtStage2AndRefusedAtStage3) {
  const auto& base = FaultFreeLosses();
  std::string line;
  const auto run = DegradedRun(false, /*lost=*/1, /*grow_back=*/false, "cpu", 0, /*stage=*/2, /*copy_step=*/2, &line);
  EXPECT_NE(line.find("their Adam moments are of step 2, 1 step(s) stale"), std::string::npos) << line;
  double worst = 0;
  for (int s = 1; s <= kSteps; ++s) worst = std::max(worst, RelDiff(run[s - 1], base[s - 1]));
  EXPECT_LE(worst, 1e-2);
  EXPECT_LT(run[kSteps - 1], run[kFailAfter]);
  std::printf("[degraded] SFT ZeRO-2, lost shard's moments 1 step stale: largest loss rel diff vs fault-free %.3g\n",
              worst);

  const std::string dir = MakeTempDir("degraded-stale3");
  const JobSpec spec = SftSpec(dir, false, 0, /*stage=*/3);
  EngineCluster c(kW);
  c.SetupOk(spec);
  for (int s = 1; s <= kFailAfter; ++s) {
    c.RunOk(PHASE_SFT_STEP, s);
    if (s == 2) {
      c.RunOk(PHASE_CHECKPOINT, s);
      WaitForCheckpoint(dir + "/ckpt", s);
    }
  }
  for (int r = 0; r < kW; ++r) c.engine(r).Abort();
  const auto survivors = Survivors(1);
  auto res = c.SetupMembers(spec, survivors, LiveRestore(kFailAfter, kW, survivors));
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_FALSE(res[r].status.ok()) << r;
    EXPECT_NE(res[r].status.message().find(
                  "live restore: old rank 1's shard: its parameters are only in a peer copy of step 2, not 3"),
              std::string::npos)
        << res[r].status;
  }
  fs::remove_all(dir);
}

// MeCeFO's low-rank MLP weight gradients on the taken-over share: the loss
// keeps falling at every rank, the run departs from the exact one less as
// the rank grows, and at rank = hidden_size (32) it is the exact run up to
// rounding.
TEST(DegradedContinuationTest, LowRankFfnGradientsStillLowerTheLoss) {
  const auto& base = FaultFreeLosses();
  std::vector<double> worst_by_rank;
  for (int r : {2, 8, 32}) {
    const auto run = DegradedRun(/*cheap=*/false, /*lost=*/1, /*grow_back=*/false, "cpu", r);
    double worst = 0;
    for (int s = kFailAfter + 1; s <= kSteps; ++s) worst = std::max(worst, RelDiff(run[s - 1], base[s - 1]));
    const double early = (run[3] + run[4] + run[5]) / 3;
    const double late = (run[kSteps - 3] + run[kSteps - 2] + run[kSteps - 1]) / 3;
    std::printf(
        "[degraded] SFT low-rank MLP gradients, rank %2d of 32: loss steps 4-6 %.4f -> steps %d-%d %.4f; "
        "largest loss rel diff vs exact %.3g\n",
        r, early, kSteps - 2, kSteps, late, worst);
    EXPECT_LT(late, early) << "rank " << r;
    EXPECT_LE(run[3], base[3] * (1 + 1e-5)) << "step 4's loss comes before any low-rank update";
    worst_by_rank.push_back(worst);
  }
  EXPECT_GT(worst_by_rank[0], 1e-6) << "rank 2 changed nothing: is it applied?";
  EXPECT_GT(worst_by_rank[0], worst_by_rank[2]);
  EXPECT_LE(worst_by_rank[2], 1e-5) << "full rank must be the exact run";
}

// The live restore, the taken-over shares (cheap backward included) and
// the grow-back checkpoint on the device code path: cpu-guarded gives the
// cpu run's losses bit for bit.
TEST(DegradedContinuationTest, GuardedDeviceMatchesCpu) {
  const auto cpu = DegradedRun(/*cheap=*/true, /*lost=*/1, /*grow_back=*/true, "cpu");
  const auto guarded = DegradedRun(/*cheap=*/true, /*lost=*/1, /*grow_back=*/true, "cpu-guarded");
  ASSERT_EQ(cpu.size(), guarded.size());
  for (size_t s = 0; s < cpu.size(); ++s) EXPECT_EQ(cpu[s], guarded[s]) << "step " << s + 1;
}

TEST(DegradedContinuationTest, WrongStepFailsEveryRank) {
  const std::string dir = MakeTempDir("degraded-wrong");
  const JobSpec spec = SftSpec(dir, false);
  EngineCluster c(kW);
  c.SetupOk(spec);
  for (int s = 1; s <= 2; ++s) c.RunOk(PHASE_SFT_STEP, s);
  for (int r = 0; r < kW; ++r) c.engine(r).Abort();
  const auto survivors = Survivors(1);
  auto res = c.SetupMembers(spec, survivors, LiveRestore(3, kW, survivors));
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_FALSE(res[r].status.ok()) << r;
    EXPECT_EQ(res[r].status.message().rfind("live restore: ", 0), 0u) << res[r].status;
    EXPECT_NE(res[r].status.message().find("holds step 2, not 3"), std::string::npos) << res[r].status;
    EXPECT_EQ(common::FailureKindOf(res[r].status), tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
  }
  // The state was not lost to anything but the failed SETUP: a normal
  // recovery (here: a fresh start) works on the same engines.
  c.SetupOk(spec);
  c.RunOk(PHASE_SFT_STEP, 1);
  fs::remove_all(dir);
}

// Every survivor finished the step in flight (a collective after the
// optimizer step broke): the coordinator allows that step, SETUP keeps it and
// reports it.
TEST(DegradedContinuationTest, InflightStepIsAcceptedWhenEveryRankHoldsIt) {
  const std::string dir = MakeTempDir("degraded-inflight");
  const JobSpec spec = SftSpec(dir, false);
  EngineCluster c(kW);
  c.SetupOk(spec);
  for (int s = 1; s <= 3; ++s) c.RunOk(PHASE_SFT_STEP, s);
  for (int r = 0; r < kW; ++r) c.engine(r).Abort();
  const auto survivors = Survivors(2);
  auto live = LiveRestore(2, kW, survivors);
  auto res = c.SetupMembers(spec, survivors, [&](int rank, tandem::v1::Assignment& a) {
    live(rank, a);
    a.set_live_restore_allow_inflight(true);
    a.set_live_restore_inflight_step(3);
  });
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_TRUE(res[r].status.ok()) << res[r].status;
    EXPECT_EQ(res[r].report.setup().restored_step(), 3.0);
  }
  c.RunOk(PHASE_SFT_STEP, 4);
  fs::remove_all(dir);
}

TEST(DegradedContinuationTest, RankWithoutStateFailsEveryRank) {
  const std::string dir = MakeTempDir("degraded-nostate");
  const JobSpec spec = SftSpec(dir, false);
  EngineCluster c(kW + 1);  // engine 3 is an idle worker that never ran the job
  for (const auto& r : c.SetupMembers(spec, {0, 1, 2})) ASSERT_TRUE(r.status.ok()) << r.status;
  for (int s = 1; s <= 2; ++s) c.RunOk(PHASE_SFT_STEP, s);
  for (int r = 0; r < kW; ++r) c.engine(r).Abort();
  auto res = c.SetupMembers(spec, {0, 3}, LiveRestore(2, kW, {0, 2}));
  ASSERT_EQ(res.size(), 2u);
  for (const auto& r : res) {
    ASSERT_FALSE(r.status.ok());
    EXPECT_EQ(r.status.message().rfind("live restore: ", 0), 0u) << r.status;
  }
  EXPECT_NE(res[0].status.message().find("1 rank(s) hold no live state of step 2"), std::string::npos) << res[0].status;
  EXPECT_NE(res[1].status.message().find("rank 1 holds no state of this job"), std::string::npos) << res[1].status;
  fs::remove_all(dir);
}

TEST(DegradedContinuationTest, UncoveredShareFailsEveryRank) {
  const std::string dir = MakeTempDir("degraded-gap");
  EngineCluster c(2);
  // Shares 0 and 2 of 3 assigned, share 1 to nobody.
  auto res = c.SetupMembers(SftSpec(dir, false), {0, 1}, [](int rank, tandem::v1::Assignment& a) {
    a.set_logical_world_size(kW);
    a.set_logical_rank_begin(rank == 0 ? 0 : 2);
    a.set_logical_rank_end(rank == 0 ? 1 : 3);
    a.set_own_logical_rank(rank == 0 ? 0 : 2);
  });
  for (const auto& r : res) {
    ASSERT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find("logical share 1 of 3 is assigned to 0 ranks"), std::string::npos) << r.status;
  }
  fs::remove_all(dir);
}

// Rank 1 dies during a checkpoint write, before it announced its shard:
// rank 0's background writer waits for that announcement. The abort of the
// old generation ends that wait, so the survivor's degraded SETUP (which
// drains the old writer) starts at once instead of after the store timeout,
// and the checkpoint is not published.
TEST(DegradedContinuationTest, PeerLostDuringACheckpointWriteDoesNotHoldTheSurvivor) {
  const std::string dir = MakeTempDir("degraded-ckpt");
  // No peer copies: rank 0's CHECKPOINT phase then needs nothing of rank 1
  // but its announcement, which the background writer waits for.
  const JobSpec spec = ParseSpec(TinySftYaml(), {"cluster.workers=2", "cluster.zero_stage=0", "recovery.degraded=true",
                                                 "recovery.no_peer_copies=true", "checkpoint.dir=" + dir + "/ckpt"});
  EngineCluster c(2);
  c.SetupOk(spec);
  for (int s = 1; s <= 2; ++s) c.RunOk(PHASE_SFT_STEP, s);
  tandem::v1::PhaseCommand cmd;
  cmd.set_command_id("checkpoint-2-rank-0");
  cmd.set_job_id("job-1");
  cmd.set_generation(c.generation());
  cmd.set_phase(PHASE_CHECKPOINT);
  cmd.set_step(2);
  ReportPhaseRequest report;
  ASSERT_TRUE(c.engine(0).RunPhase(cmd, &report).ok());  // the write goes on in the background
  // Rank 0's writer has announced its shard and waits for rank 1's.
  ASSERT_TRUE(c.AwaitKey("job-1", c.generation(), "ckpt/2/shard/0")) << "rank 0 never announced its shard";
  for (int r = 0; r < 2; ++r) c.engine(r).Abort();
  const auto t0 = std::chrono::steady_clock::now();
  auto res = c.SetupMembers(spec, {0}, LiveRestore(2, 2, {0}));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_LT(seconds, 5.0) << "the survivor's SETUP waited for the lost rank's checkpoint announcement";
  EXPECT_FALSE(fs::exists(ckpt::FinalDir(dir + "/ckpt", 2) + "/manifest.json"));
  c.RunOk(PHASE_SFT_STEP, 3);
  std::printf("[degraded] survivor's SETUP after a peer lost mid-checkpoint: %.2f s\n", seconds);
  fs::remove_all(dir);
}

struct RlFigures {
  double loss = 0, reward = 0, kl = 0;
};

RlFigures RlStep(EngineCluster& c, int64_t step) {
  RlFigures f;
  c.RunOk(PHASE_ROLLOUT, step);
  f.reward = c.RunOk(PHASE_SCORE, step).metrics().reward_mean();
  c.RunOk(PHASE_LOGPROBS, step);
  auto up = c.RunOk(PHASE_UPDATE, step);
  f.loss = up.metrics().loss();
  f.kl = up.metrics().kl();
  return f;
}

// Rank 1 dies after the UPDATE of `step`; rank 0 goes on alone with both
// logical shares (live restore, no rollback).
void ContinueOnRankZero(EngineCluster& c, const JobSpec& spec, int64_t step) {
  for (int r = 0; r < 2; ++r) c.engine(r).Abort();
  auto res = c.SetupMembers(spec, {0}, [step](int, tandem::v1::Assignment& a) {
    a.set_live_restore(true);
    a.set_live_restore_step(step);
    a.set_logical_world_size(2);
    a.set_logical_rank_begin(0);
    a.set_logical_rank_end(2);
    a.set_own_logical_rank(0);
  });
  ASSERT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(res[0].report.setup().restore_source(), tandem::v1::RESTORE_SOURCE_LIVE);
}

TEST(DegradedContinuationTest, GrpoSurvivorMatchesFaultFreeRun) {
  constexpr int kRl = 4, kRlFail = 2;
  constexpr int kWarm = 15;  // an SFT warm start, so that rewards vary and GRPO learns
  const JobSpec spec =
      ParseSpec(TinyGrpoYaml(), {"cluster.workers=2", "recovery.degraded=true", "train.steps=4",
                                 "init.sft.steps=" + std::to_string(kWarm), "init.sft.lr=1e-2", "train.lr=1e-2"});
  std::vector<RlFigures> base, run;
  {
    EngineCluster c(2);
    c.SetupOk(spec);
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    for (int s = 1; s <= kRl; ++s) base.push_back(RlStep(c, s));
  }
  {
    EngineCluster c(2);
    c.SetupOk(spec);
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    for (int s = 1; s <= kRlFail; ++s) run.push_back(RlStep(c, s));
    ASSERT_NO_FATAL_FAILURE(ContinueOnRankZero(c, spec, kRlFail));
    for (int s = kRlFail + 1; s <= kRl; ++s) run.push_back(RlStep(c, s));
  }
  double worst = 0;
  for (int s = 1; s <= kRl; ++s) {
    const auto& a = run[s - 1];
    const auto& b = base[s - 1];
    for (double d : {RelDiff(a.loss, b.loss), RelDiff(a.reward, b.reward), RelDiff(a.kl, b.kl)}) {
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-5) << "step " << s << ": loss " << a.loss << " vs " << b.loss << ", reward " << a.reward << " vs "
                         << b.reward << ", kl " << a.kl << " vs " << b.kl;
    }
  }
  // The cheap backward on the taken-over share runs through GRPO too.
  {
    JobSpec cheap = spec;
    cheap.mutable_recovery()->set_degraded_cheap_backward(true);
    EngineCluster c(2);
    c.SetupOk(cheap);
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    for (int s = 1; s <= kRlFail; ++s) RlStep(c, s);
    ASSERT_NO_FATAL_FAILURE(ContinueOnRankZero(c, cheap, kRlFail));
    for (int s = kRlFail + 1; s <= kRl; ++s) {
      const RlFigures f = RlStep(c, s);
      EXPECT_TRUE(std::isfinite(f.loss) && std::isfinite(f.kl)) << "cheap GRPO step " << s;
    }
  }
  EXPECT_GT(base.back().kl, 0) << "the KL reference must be in use";
  EXPECT_NE(base.back().loss, 0) << "the update must do something";
  std::printf("[degraded] GRPO W=2 -> 1 survivor after step %d: largest rel diff (loss, reward, kl) %.3g\n", kRlFail,
              worst);
}

TEST(DegradedContinuationTest, TpGroupFallsBackToTp1AndBackToTp) {
  constexpr int kRl = 5, kRlFail = 2, kGrow = 3, kWarm = 15;
  const std::string dir = MakeTempDir("degraded-tp");
  const std::vector<std::string> common = {"cluster.workers=2",
                                           "recovery.degraded=true",
                                           "train.steps=" + std::to_string(kRl),
                                           "init.sft.steps=" + std::to_string(kWarm),
                                           "init.sft.lr=1e-2",
                                           "train.lr=1e-2",
                                           "checkpoint.dir=" + dir + "/ckpt"};
  auto with_tp = [&](int tp) {
    auto ov = common;
    ov.push_back("rollout.tp_size=" + std::to_string(tp));
    return ParseSpec(TinyGrpoYaml(), ov);
  };
  auto tp_of = [](const ReportPhaseRequest& r) {
    auto it = r.metrics().extra().find("rollout_tp_size");
    return it == r.metrics().extra().end() ? 1.0 : it->second;
  };
  std::vector<RlFigures> base, run;
  std::vector<double> tp_sizes;
  {
    EngineCluster c(2);
    c.SetupOk(with_tp(1));
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    for (int s = 1; s <= kRl; ++s) base.push_back(RlStep(c, s));
  }
  {
    const JobSpec spec = with_tp(2);
    EngineCluster c(2);
    c.SetupOk(spec);
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    auto step = [&](int s) {
      RlFigures f;
      tp_sizes.push_back(tp_of(c.RunOk(PHASE_ROLLOUT, s)));
      f.reward = c.RunOk(PHASE_SCORE, s).metrics().reward_mean();
      c.RunOk(PHASE_LOGPROBS, s);
      auto up = c.RunOk(PHASE_UPDATE, s);
      f.loss = up.metrics().loss();
      f.kl = up.metrics().kl();
      run.push_back(f);
    };
    for (int s = 1; s <= kRlFail; ++s) step(s);
    // Rank 1 (TP rank 1 of the only group) is lost: rank 0 continues alone.
    for (int r = 0; r < 2; ++r) c.engine(r).Abort();
    auto res = c.SetupMembers(spec, {0}, [](int, tandem::v1::Assignment& a) {
      a.set_live_restore(true);
      a.set_live_restore_step(kRlFail);
      a.set_logical_world_size(2);
      a.set_logical_rank_begin(0);
      a.set_logical_rank_end(2);
      a.set_own_logical_rank(0);
    });
    ASSERT_TRUE(res[0].status.ok()) << res[0].status;
    EXPECT_TRUE(HasLine(res[0].report, "degraded continuation: rollout at tp_size 1 (not 2)"));
    for (int s = kRlFail + 1; s <= kGrow; ++s) step(s);
    // The replacement joins through a checkpoint: TP again.
    c.RunOk(PHASE_CHECKPOINT, kGrow);
    WaitForCheckpoint(dir + "/ckpt", kGrow);
    c.SetupOk(spec, ckpt::FinalDir(dir + "/ckpt", kGrow));
    for (int s = kGrow + 1; s <= kRl; ++s) step(s);
  }
  ASSERT_EQ(run.size(), base.size());
  const std::vector<double> want_tp = {2, 2, 1, 2, 2};
  EXPECT_EQ(tp_sizes, want_tp);
  double worst = 0;
  for (int s = 1; s <= kRl; ++s) {
    const auto& a = run[s - 1];
    const auto& b = base[s - 1];
    EXPECT_DOUBLE_EQ(a.reward, b.reward) << "step " << s;
    for (double d : {RelDiff(a.loss, b.loss), RelDiff(a.kl, b.kl)}) {
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-4) << "step " << s << ": loss " << a.loss << " vs " << b.loss << ", kl " << a.kl << " vs "
                         << b.kl;
    }
  }
  std::printf(
      "[degraded] GRPO tp 2 -> 1 survivor at tp 1 -> grown back to tp 2: largest rel diff (loss, kl) %.3g "
      "against tp 1 without a fault\n",
      worst);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::enginetest
