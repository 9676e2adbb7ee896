// Disaggregated GRPO through the engine: R rollout + T trainer ranks as
// threads of one process over real Gloo (two communicators each).
// - sync coupling: staleness is 0 at every step, nothing is dropped, and the
//   rewards, rollout tokens and losses equal a co-located run with the same
//   seed (prompts and sampling draws are keyed by prompt/sample index, and
//   the rollout rank samples with a bit-exact copy of the trainer's weights);
// - async coupling: staleness never exceeds K, every trajectory of a step is
//   either kept or counted as dropped, and the run still trains (ZeRO-2 over
//   two trainers);
// - a ROLLOUT without its SYNC_WEIGHTS fails naming the phase;
// - tensor-parallel rollout workers (rollout.tp_size 2 over 2 rollout ranks):
//   the same rollout tokens, rewards and losses as tp_size 1, sampled and
//   greedy (log-probs within fp32 reduction order), with each rollout rank
//   receiving only its slice at SYNC_WEIGHTS (weight_sync_bytes below a
//   full copy per rank), on guarded device memory bit for bit as on the
//   cpu; async coupling with TP stays within its staleness bound; a tp_size
//   that does not divide the rollout workers fails SETUP naming both.
#include <cmath>
#include <cstdio>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

using tandem::v1::PHASE_EVAL;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_LOGPROBS;
using tandem::v1::PHASE_ROLLOUT;
using tandem::v1::PHASE_SCORE;
using tandem::v1::PHASE_SFT_STEP;
using tandem::v1::PHASE_SYNC_WEIGHTS;
using tandem::v1::PHASE_UPDATE;

// The engine tests' tiny GRPO job with a short run and a warm start.
JobSpec DisaggSpec(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(),
                   {"name=disagg-test", "train.steps=6", "train.lr=1e-2", "init.sft.steps=8", "init.sft.lr=1e-2"});
  return ParseSpec(TinyGrpoYaml(), overrides);
}

std::vector<std::string> Disagg(int r, int t, const std::string& coupling, int k) {
  return {"cluster.workers=" + std::to_string(r + t),
          "placement.mode=disaggregated",
          "placement.rollout_workers=" + std::to_string(r),
          "placement.train_workers=" + std::to_string(t),
          "placement.coupling=" + coupling,
          "placement.max_staleness=" + std::to_string(k)};
}

double Extra(const ReportPhaseRequest& r, const std::string& key) {
  auto it = r.metrics().extra().find(key);
  return it == r.metrics().extra().end() ? -1 : it->second;
}

struct StepFigures {
  double reward = 0, rollout_tokens = 0, loss = 0;
  double staleness_max = -1, staleness_mean = -1, kept = -1, dropped = -1, uneven = -1, received = -1;
};

StepFigures RlStep(EngineCluster& c, int64_t step, bool disagg) {
  StepFigures f;
  if (disagg) c.RunOk(PHASE_SYNC_WEIGHTS, step);
  auto r = c.RunOk(PHASE_ROLLOUT, step);
  f.rollout_tokens = Extra(r, "rollout_tokens");
  f.staleness_max = Extra(r, "staleness_max");
  f.staleness_mean = Extra(r, "staleness_mean");
  f.kept = Extra(r, "trajectories_kept");
  f.dropped = Extra(r, "trajectories_dropped");
  f.uneven = Extra(r, "trajectories_dropped_uneven");
  f.received = Extra(r, "trajectories_received");
  f.reward = c.RunOk(PHASE_SCORE, step).metrics().reward_mean();
  c.RunOk(PHASE_LOGPROBS, step);
  f.loss = c.RunOk(PHASE_UPDATE, step).metrics().loss();
  return f;
}

constexpr int kWarm = 8;

void SyncMatchesColocated(const char* kl) {
  constexpr int kSteps = 4;
  std::vector<StepFigures> colo, dis;
  double acc_colo = -1, acc_dis = -1;
  for (bool disagg : {false, true}) {
    EngineCluster c(disagg ? 2 : 1, disagg ? "job-disagg" : "job-colo");
    auto ov = disagg ? Disagg(1, 1, "sync", 0) : std::vector<std::string>{};
    ov.push_back("rl.kl_coef=" + std::string(kl));
    c.SetupOk(DisaggSpec(ov));
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    auto& out = disagg ? dis : colo;
    for (int s = 1; s <= kSteps; ++s) out.push_back(RlStep(c, s, disagg));
    (disagg ? acc_dis : acc_colo) = c.RunOk(PHASE_EVAL, kSteps).metrics().accuracy();
  }
  for (int i = 0; i < kSteps; ++i) {
    std::printf(
        "[disagg-sync kl %s] step %d: reward %.4f / %.4f, tokens %.0f / %.0f, loss %.6g / %.6g "
        "(co-located / disaggregated), staleness max %.0f, dropped %.0f\n",
        kl, i + 1, colo[i].reward, dis[i].reward, colo[i].rollout_tokens, dis[i].rollout_tokens, colo[i].loss,
        dis[i].loss, dis[i].staleness_max, dis[i].dropped);
    EXPECT_EQ(dis[i].staleness_max, 0) << "step " << i + 1;
    EXPECT_EQ(dis[i].staleness_mean, 0) << "step " << i + 1;
    EXPECT_EQ(dis[i].dropped, 0) << "step " << i + 1;
    EXPECT_EQ(dis[i].kept, 16) << "step " << i + 1;
    EXPECT_EQ(dis[i].rollout_tokens, colo[i].rollout_tokens) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(dis[i].reward, colo[i].reward) << "step " << i + 1;
    EXPECT_LE(RelDiff(dis[i].loss, colo[i].loss), 1e-6) << "step " << i + 1;
  }
  EXPECT_DOUBLE_EQ(acc_dis, acc_colo);
}

TEST(DisaggEngineTest, SyncHasZeroStalenessAndMatchesColocated) { SyncMatchesColocated("0"); }
TEST(DisaggEngineTest, SyncWithKlMatchesColocated) { SyncMatchesColocated("0.01"); }

// The device code path in disaggregated mode: rollout ranks keep a device
// copy of each weights version, trainers reduce over a guarded
// communicator. cpu-guarded gives the cpu run's figures bit for bit (sync,
// KL on), and an async run with a generation thread completes.
TEST(DisaggEngineTest, GuardedDeviceMatchesCpu) {
  constexpr int kSteps = 3;
  std::vector<StepFigures> runs[2];
  double accuracy[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    const std::string device = i == 0 ? "cpu" : "cpu-guarded";
    EngineCluster c(2, "job-disagg-" + device, device);
    auto ov = Disagg(1, 1, "sync", 0);
    ov.push_back("rl.kl_coef=0.01");
    c.SetupOk(DisaggSpec(ov));
    for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    for (int s = 1; s <= kSteps; ++s) runs[i].push_back(RlStep(c, s, true));
    accuracy[i] = c.RunOk(PHASE_EVAL, kSteps).metrics().accuracy();
  }
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(runs[0][s].rollout_tokens, runs[1][s].rollout_tokens) << "step " << s + 1;
    EXPECT_EQ(runs[0][s].reward, runs[1][s].reward) << "step " << s + 1;
    EXPECT_EQ(runs[0][s].loss, runs[1][s].loss) << "step " << s + 1;
  }
  EXPECT_EQ(accuracy[0], accuracy[1]);
}

TEST(DisaggEngineTest, AsyncOnGuardedDeviceCompletes) {
  EngineCluster c(3, "job-async-guarded", "cpu-guarded");
  auto ov = Disagg(1, 2, "async", 1);
  ov.push_back("cluster.zero_stage=2");
  c.SetupOk(DisaggSpec(ov));
  for (int w = 1; w <= 2; ++w) c.RunOk(PHASE_SFT_STEP, -w);
  for (int s = 1; s <= 3; ++s) {
    StepFigures f = RlStep(c, s, true);
    EXPECT_EQ(f.received, 16) << "step " << s;
  }
}

TEST(DisaggEngineTest, AsyncStalenessNeverExceedsBoundAndDropsAreCounted) {
  constexpr int kSteps = 6, kBound = 1;
  // One rollout rank, two trainers with ZeRO-2 over their own communicator.
  EngineCluster c(3, "job-async");
  const std::string dir = MakeTempDir("disagg-async");
  auto ov = Disagg(1, 2, "async", kBound);
  ov.push_back("cluster.zero_stage=2");
  ov.push_back("output_dir=" + dir + "/final");
  c.SetupOk(DisaggSpec(ov));
  for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
  double stale_steps = 0;
  for (int s = 1; s <= kSteps; ++s) {
    StepFigures f = RlStep(c, s, true);
    std::printf(
        "[disagg-async] step %d: staleness max %.0f mean %.2f, kept %.0f dropped %.0f (uneven %.0f) "
        "of %.0f, reward %.4f\n",
        s, f.staleness_max, f.staleness_mean, f.kept, f.dropped, f.uneven, f.received, f.reward);
    ASSERT_GE(f.staleness_max, 0) << "ROLLOUT reports no staleness at step " << s;
    EXPECT_LE(f.staleness_max, kBound) << "step " << s;
    EXPECT_LE(f.staleness_mean, f.staleness_max) << "step " << s;
    EXPECT_EQ(f.received, 16) << "step " << s;
    EXPECT_EQ(f.kept + f.dropped + f.uneven, f.received) << "step " << s;
    if (f.staleness_max > 0) ++stale_steps;
  }
  std::printf("[disagg-async] %.0f of %d steps trained on trajectories of an older policy (overlap)\n", stale_steps,
              kSteps);
  EXPECT_GE(c.RunOk(PHASE_EVAL, kSteps).metrics().accuracy(), 0);
  c.RunOk(PHASE_EXPORT, kSteps);
  EXPECT_FALSE(LoadExported(dir + "/final").empty());
  std::filesystem::remove_all(dir);
}

TEST(DisaggEngineTest, RolloutWithoutSyncFailsNamingThePhase) {
  EngineCluster c(2, "job-nosync");
  c.SetupOk(DisaggSpec(Disagg(1, 1, "sync", 0)));
  c.RunOk(PHASE_SYNC_WEIGHTS, 1);
  auto res = c.Run(PHASE_ROLLOUT, 2);
  ASSERT_FALSE(res[1].status.ok());
  EXPECT_NE(res[1].status.message().find("ROLLOUT for step 2 without its SYNC_WEIGHTS"), std::string::npos)
      << res[1].status;
  ASSERT_FALSE(res[0].status.ok());  // the trainer learns at once, not by a timeout
  EXPECT_NE(res[0].status.message().find("rollout rank 1 sent no trajectories"), std::string::npos) << res[0].status;
}

struct TpStepFigures {
  double reward = 0, rollout_tokens = 0, loss = 0, mismatch = -1, sync_bytes = -1, sync_full_bytes = -1;
  double tp_size = -1;
};

// Two rollout ranks (one TP group at tp 2) and one trainer; two
// mini-batches, so LOGPROBS runs its own forward and reports the sampler's
// log-prob mismatch against it.
std::vector<TpStepFigures> TpRun(int tp, const std::vector<std::string>& extra, int steps,
                                 const std::string& device = "cpu") {
  EngineCluster c(3, "job-disagg-tp" + std::to_string(tp) + "-" + device, device);
  auto ov = Disagg(2, 1, "sync", 0);
  ov.push_back("rollout.tp_size=" + std::to_string(tp));
  ov.push_back("rl.mini_batches=2");
  ov.insert(ov.end(), extra.begin(), extra.end());
  c.SetupOk(DisaggSpec(ov));
  for (int w = 1; w <= kWarm; ++w) c.RunOk(PHASE_SFT_STEP, -w);
  std::vector<TpStepFigures> out;
  for (int s = 1; s <= steps; ++s) {
    TpStepFigures f;
    auto sync = c.RunOk(PHASE_SYNC_WEIGHTS, s);
    f.sync_bytes = Extra(sync, "weight_sync_bytes");
    f.sync_full_bytes = Extra(sync, "weight_sync_full_bytes");
    auto r = c.RunOk(PHASE_ROLLOUT, s);
    f.rollout_tokens = Extra(r, "rollout_tokens");
    f.tp_size = Extra(r, "rollout_tp_size");
    f.reward = c.RunOk(PHASE_SCORE, s).metrics().reward_mean();
    f.mismatch = Extra(c.RunOk(PHASE_LOGPROBS, s), "logprob_mismatch_mean");
    f.loss = c.RunOk(PHASE_UPDATE, s).metrics().loss();
    out.push_back(f);
  }
  return out;
}

void TpMatchesTp1(const std::string& label, const std::vector<std::string>& extra) {
  constexpr int kSteps = 3;
  const auto one = TpRun(1, extra, kSteps);
  const auto two = TpRun(2, extra, kSteps);
  ASSERT_EQ(one.size(), two.size());
  for (int i = 0; i < kSteps; ++i) {
    SCOPED_TRACE(label + " step " + std::to_string(i + 1));
    std::printf(
        "[disagg-tp %s] step %d: reward %.4f / %.4f, tokens %.0f / %.0f, loss %.6g / %.6g, log-prob mismatch "
        "%.3g / %.3g (tp 1 / tp 2); weight sync bytes %.0f / %.0f (full copies %.0f)\n",
        label.c_str(), i + 1, one[i].reward, two[i].reward, one[i].rollout_tokens, two[i].rollout_tokens, one[i].loss,
        two[i].loss, one[i].mismatch, two[i].mismatch, one[i].sync_bytes, two[i].sync_bytes, two[i].sync_full_bytes);
    EXPECT_GT(one[i].rollout_tokens, 0);
    EXPECT_EQ(one[i].rollout_tokens, two[i].rollout_tokens);
    EXPECT_DOUBLE_EQ(one[i].reward, two[i].reward);
    EXPECT_LE(RelDiff(one[i].loss, two[i].loss), 1e-4);
    // Both samplers against the same training forward: the TP sampler's
    // log-probs differ from tp 1's by fp32 summation order only.
    ASSERT_GE(one[i].mismatch, 0);
    ASSERT_GE(two[i].mismatch, 0);
    EXPECT_LE(std::abs(one[i].mismatch - two[i].mismatch), 1e-4);
    EXPECT_EQ(one[i].tp_size, -1);
    EXPECT_EQ(two[i].tp_size, 2);
    EXPECT_EQ(one[i].sync_bytes, one[i].sync_full_bytes);
    EXPECT_EQ(two[i].sync_full_bytes, one[i].sync_full_bytes);
    EXPECT_GT(two[i].sync_bytes, 0);
    EXPECT_LT(two[i].sync_bytes, two[i].sync_full_bytes);
  }
}

TEST(DisaggEngineTest, TpRolloutWorkersSampleAsTp1) { TpMatchesTp1("sampled", {}); }
TEST(DisaggEngineTest, TpRolloutWorkersGreedyAsTp1) { TpMatchesTp1("greedy", {"rl.top_k=1"}); }

// The device code path of TP rollout workers (a device copy of the slice,
// the TP group over a guarded communicator) gives the cpu run's figures
// bit for bit.
TEST(DisaggEngineTest, TpRolloutWorkersOnGuardedDeviceMatchCpu) {
  constexpr int kSteps = 2;
  const auto cpu = TpRun(2, {}, kSteps);
  const auto guarded = TpRun(2, {}, kSteps, "cpu-guarded");
  ASSERT_EQ(cpu.size(), guarded.size());
  for (int i = 0; i < kSteps; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(cpu[i].rollout_tokens, guarded[i].rollout_tokens);
    EXPECT_EQ(cpu[i].reward, guarded[i].reward);
    EXPECT_EQ(cpu[i].loss, guarded[i].loss);
    EXPECT_EQ(cpu[i].mismatch, guarded[i].mismatch);
    EXPECT_EQ(guarded[i].tp_size, 2);
  }
}

// Async with TP: the ranks of the group agree on one weights version per
// step (the trainers fail a step whose group batches carry two), staleness
// stays within K and every trajectory is accounted for.
TEST(DisaggEngineTest, AsyncTpRolloutWorkersStayWithinTheBound) {
  constexpr int kSteps = 5, kBound = 1;
  EngineCluster c(3, "job-async-tp");
  auto ov = Disagg(2, 1, "async", kBound);
  ov.push_back("rollout.tp_size=2");
  c.SetupOk(DisaggSpec(ov));
  for (int w = 1; w <= 2; ++w) c.RunOk(PHASE_SFT_STEP, -w);
  for (int s = 1; s <= kSteps; ++s) {
    StepFigures f = RlStep(c, s, true);
    std::printf("[disagg-async-tp] step %d: staleness max %.0f, kept %.0f dropped %.0f of %.0f, reward %.4f\n", s,
                f.staleness_max, f.kept, f.dropped, f.received, f.reward);
    EXPECT_LE(f.staleness_max, kBound) << "step " << s;
    EXPECT_GE(f.staleness_max, 0) << "step " << s;
    EXPECT_EQ(f.received, 16) << "step " << s;
    EXPECT_EQ(f.kept + f.dropped + f.uneven, f.received) << "step " << s;
  }
}

TEST(DisaggEngineTest, TpSizeMustDivideTheRolloutWorkers) {
  // The submit-time check is bypassed (the spec is edited after parsing),
  // so SETUP's own check answers, on every rank.
  EngineCluster c(4, "job-disagg-badtp");
  auto ov = Disagg(3, 1, "sync", 0);
  ov.push_back("rl.prompts_per_step=6");
  auto spec = DisaggSpec(ov);
  spec.mutable_rollout()->set_tp_size(2);
  auto res = c.Setup(spec);
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(res[r].status.ok()) << "rank " << r;
    EXPECT_NE(res[r].status.message().find("rollout.tp_size 2 does not divide placement.rollout_workers (3)"),
              std::string::npos)
        << res[r].status;
  }
}

TEST(DisaggEngineTest, PlacementMustSplitPromptsOverTrainers) {
  EngineCluster c(3, "job-badsplit");
  auto spec = DisaggSpec(Disagg(1, 2, "sync", 0));
  spec.mutable_rl()->set_prompts_per_step(3);
  auto res = c.Setup(spec);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(res[r].status.ok()) << "rank " << r;
    EXPECT_NE(res[r].status.message().find("rl.prompts_per_step"), std::string::npos) << res[r].status;
  }
}

}  // namespace
}  // namespace tandem::enginetest
