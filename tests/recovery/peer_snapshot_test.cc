// Engine side of recovery: N JobEngines on N threads over real
// Gloo on 127.0.0.1 (tests/engine/engine_test_util.h's pattern). A rank is
// lost after a checkpoint: a fresh engine replaces it, the survivor is
// aborted, and the new generation restores
//  - from peer memory (the replacement receives its shard from rank+1), and
//  - from the disk checkpoint,
// both ending with weights bit-identical to the run that never failed -
// also for a GRPO job with a KL term, whose frozen reference policy travels
// in the peer copies. A peer restore whose copies are missing fails on every
// rank (no hang).
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/engine/engine_test_util.h"
#include "worker/engine/peer_snapshot.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PhaseCommand;

constexpr int kSteps = 6;
constexpr int kCheckpoint = 3;
constexpr int kWarm = 8;  // GRPO: SFT warm-start steps (-1 .. -kWarm)

class Ranks {
 public:
  Ranks(int world, std::string dir, std::string device = "cpu")
      : world_(world), dir_(std::move(dir)), device_(std::move(device)) {
    for (int r = 0; r < world_; ++r) engines_.push_back(Make(r));
  }
  ~Ranks() { Run(tandem::v1::PHASE_TEARDOWN, 0, nullptr); }
  std::unique_ptr<worker::JobEngine> Make(int r) {
    worker::EngineOptions o;
    o.worker_id = absl::StrCat("w", r);
    o.device = device_;
    o.num_threads = 1;
    o.collective_timeout_ms = 20000;
    o.store_factory = [this](const std::string& job, int64_t gen) -> absl::StatusOr<std::unique_ptr<comm::Store>> {
      return std::unique_ptr<comm::Store>(new comm::PrefixStore(job + "/" + std::to_string(gen), &store_));
    };
    return worker::MakeJobEngine(o);
  }
  void Replace(int r) { engines_[r] = Make(r); }  // a fresh worker process
  void AbortAll() {
    for (auto& e : engines_) e->Abort();
  }
  std::vector<RankResult> Setup(const JobSpec& spec, const std::string& restore_from, int64_t peer_step,
                                const std::vector<int>& peer_ranks) {
    ++generation_;
    return Run(tandem::v1::PHASE_SETUP, 0, [&](int r, PhaseCommand& c) {
      auto* a = c.mutable_assignment();
      a->set_job_id("job-r");
      *a->mutable_spec() = spec;
      a->set_rank(r);
      a->set_world_size(world_);
      a->set_generation(generation_);
      a->set_restore_from(restore_from);
      a->set_run_dir(dir_);
      a->set_peer_restore_step(peer_step);
      for (int pr : peer_ranks) a->add_peer_restore_ranks(pr);
    });
  }
  std::vector<RankResult> Run(tandem::v1::Phase phase, int64_t step,
                              const std::function<void(int, PhaseCommand&)>& fill) {
    std::vector<RankResult> out(world_);
    std::vector<std::thread> threads;
    ++command_;
    for (int r = 0; r < world_; ++r) {
      threads.emplace_back([&, r] {
        PhaseCommand c;
        c.set_command_id(absl::StrCat("c", command_));
        c.set_job_id("job-r");
        c.set_generation(generation_);
        c.set_phase(phase);
        c.set_step(step);
        if (fill) fill(r, c);
        out[r].status = engines_[r]->RunPhase(c, &out[r].report);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }
  ReportPhaseRequest RunOk(tandem::v1::Phase phase, int64_t step) {
    auto res = Run(phase, step, nullptr);
    for (int r = 0; r < world_; ++r) {
      EXPECT_TRUE(res[r].status.ok()) << tandem::v1::Phase_Name(phase) << " " << step << " rank " << r << ": "
                                      << res[r].status;
    }
    return res[0].report;
  }

 private:
  const int world_;
  const std::string dir_;
  const std::string device_;
  comm::InMemoryStore store_;
  std::vector<std::unique_ptr<worker::JobEngine>> engines_;
  int64_t generation_ = 0;
  int64_t command_ = 0;
};

JobSpec Spec(int world, int stage, const std::string& dir, bool grpo = false, double kl = 0.05) {
  std::vector<std::string> o = {
      "cluster.workers=" + std::to_string(world), "cluster.zero_stage=" + std::to_string(stage),
      "train.steps=" + std::to_string(kSteps),    "checkpoint.keep=3",
      "checkpoint.dir=" + dir + "/ckpt",          "output_dir=" + dir + "/final"};
  if (grpo) {
    // A short SFT warm start makes rewards vary, so GRPO moves the policy
    // away from its reference (the weights after the warm start) and the
    // KL term - hence the reference - shapes every later update.
    for (std::string x : {"init.sft.lr=1e-2", "train.lr=1e-2"}) o.push_back(x);
    o.push_back("rl.kl_coef=" + std::to_string(kl));
    o.push_back("init.sft.steps=" + std::to_string(kWarm));
  }
  return ParseSpec(grpo ? TinyGrpoYaml() : TinySftYaml(), o);
}

// GRPO's SFT warm start (steps -1 .. -kWarm); nothing for SFT jobs.
void WarmStart(Ranks& ranks, bool grpo) {
  if (!grpo) return;
  for (int w = 1; w <= kWarm; ++w) ranks.RunOk(tandem::v1::PHASE_SFT_STEP, -w);
}

// One training step: SFT_STEP, or GRPO's rollout, score, logprobs, update.
void TrainStep(Ranks& ranks, int64_t s, bool grpo) {
  if (!grpo) {
    ranks.RunOk(tandem::v1::PHASE_SFT_STEP, s);
    return;
  }
  for (auto phase :
       {tandem::v1::PHASE_ROLLOUT, tandem::v1::PHASE_SCORE, tandem::v1::PHASE_LOGPROBS, tandem::v1::PHASE_UPDATE}) {
    ranks.RunOk(phase, s);
  }
}

std::vector<float> Reference(int world, int stage, bool grpo = false, double kl = 0.05) {
  const std::string dir = MakeTempDir("peer-ref");
  std::vector<float> w;
  {
    Ranks ranks(world, dir);
    auto setup = ranks.Setup(Spec(world, stage, dir, grpo, kl), "", 0, {});
    for (auto& s : setup) EXPECT_TRUE(s.status.ok()) << s.status;
    WarmStart(ranks, grpo);
    for (int s = 1; s <= kSteps; ++s) TrainStep(ranks, s, grpo);
    ranks.RunOk(tandem::v1::PHASE_EXPORT, kSteps);
    w = LoadExported(dir + "/final");
  }
  fs::remove_all(dir);
  return w;
}

// Runs to kCheckpoint + 1, loses `lost`, restores (peer or disk), finishes.
std::vector<float> WithFailure(int world, int stage, int lost, bool peer, double* source, bool grpo = false,
                               const std::string& device = "cpu") {
  const std::string dir = MakeTempDir("peer-fail");
  std::vector<float> w;
  {
    Ranks ranks(world, dir, device);
    const JobSpec spec = Spec(world, stage, dir, grpo);
    for (auto& s : ranks.Setup(spec, "", 0, {})) EXPECT_TRUE(s.status.ok()) << s.status;
    WarmStart(ranks, grpo);
    for (int s = 1; s <= kCheckpoint; ++s) TrainStep(ranks, s, grpo);
    auto ck = ranks.Run(tandem::v1::PHASE_CHECKPOINT, kCheckpoint, nullptr);
    for (auto& r : ck) {
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_TRUE(r.report.checkpoint().peer_copy());
    }
    TrainStep(ranks, kCheckpoint + 1, grpo);                 // redone after the failure
    ranks.RunOk(tandem::v1::PHASE_EXPORT, kCheckpoint + 1);  // drains the background write
    ranks.AbortAll();
    ranks.Replace(lost);
    const std::string disk = dir + "/ckpt/step-" + absl::StrFormat("%08d", kCheckpoint);
    auto setup = peer ? ranks.Setup(spec, disk, kCheckpoint, {lost}) : ranks.Setup(spec, disk, 0, {});
    for (auto& s : setup) {
      EXPECT_TRUE(s.status.ok()) << s.status;
      EXPECT_EQ(s.report.setup().restored_step(), kCheckpoint);
    }
    *source = setup[0].report.setup().restore_source();
    for (int s = kCheckpoint + 1; s <= kSteps; ++s) TrainStep(ranks, s, grpo);
    ranks.RunOk(tandem::v1::PHASE_EXPORT, kSteps);
    w = LoadExported(dir + "/final");
  }
  fs::remove_all(dir);
  return w;
}

TEST(PeerSnapshotTest, PeerAndDiskRestoreMatchTheRunThatNeverFailed) {
  for (int stage : {1, 2, 3}) {  // stage 0 with N > 1: see docs/reliability.md (known gap)
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto ref = Reference(2, stage);
    ASSERT_FALSE(ref.empty());
    double source = 0;
    auto peer = WithFailure(2, stage, /*lost=*/1, /*peer=*/true, &source);
    EXPECT_EQ(source, 1);
    EXPECT_EQ(MaxAbsDiff(ref, peer), 0.0);
    auto disk = WithFailure(2, stage, /*lost=*/0, /*peer=*/false, &source);
    EXPECT_EQ(source, 2);
    EXPECT_EQ(MaxAbsDiff(ref, disk), 0.0);
  }
}

TEST(PeerSnapshotTest, ThreeRanksReplacementReceivesFromItsNeighbour) {
  const auto ref = Reference(3, 1);
  double source = 0;
  auto peer = WithFailure(3, 1, /*lost=*/2, /*peer=*/true, &source);
  EXPECT_EQ(source, 1);
  EXPECT_EQ(MaxAbsDiff(ref, peer), 0.0);
}

TEST(PeerSnapshotTest, GrpoWithKlTermRestoresItsReferenceFromPeers) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto ref = Reference(2, stage, /*grpo=*/true);
    ASSERT_FALSE(ref.empty());
    // The test means something only if the KL term changes the result.
    EXPECT_GT(MaxAbsDiff(ref, Reference(2, stage, /*grpo=*/true, /*kl=*/0.0)), 0.0);
    double source = 0;
    auto peer = WithFailure(2, stage, /*lost=*/0, /*peer=*/true, &source, /*grpo=*/true);
    EXPECT_EQ(source, 1);  // peer memory, not the disk fallback
    EXPECT_EQ(MaxAbsDiff(ref, peer), 0.0);
  }
}

// Peer-memory recovery on the device code path (cpu-guarded): the snapshot
// and restore go through the host API and the KL reference is re-uploaded;
// the result equals the cpu run that never failed, bit for bit.
TEST(PeerSnapshotTest, GuardedDevicePeerRestoreMatchesCpu) {
  const auto ref = Reference(2, 3, /*grpo=*/true);
  ASSERT_FALSE(ref.empty());
  double source = 0;
  auto peer = WithFailure(2, 3, /*lost=*/1, /*peer=*/true, &source, /*grpo=*/true, "cpu-guarded");
  EXPECT_EQ(source, 1);
  EXPECT_EQ(MaxAbsDiff(ref, peer), 0.0);
}

TEST(PeerSnapshotTest, SnapshotShardRoundTripsWithTheKlReference) {
  worker::SnapshotShard a;
  a.step = 7;
  a.world = 3;
  a.zero_stage = 2;
  a.rank = 1;
  a.optimizer_steps = 9;
  a.policy_version = 4;
  a.ranges = {{10, 2}, {40, 1}};
  a.params = {1, 2, 3};
  a.exp_avg = {4, 5, 6};
  a.exp_avg_sq = {7, 8, 9};
  a.ref_params = {0.5f, -1.5f, 2.5f};
  worker::SnapshotShard b;
  ASSERT_TRUE(worker::SnapshotShard::Parse(a.Serialize(), &b).ok());
  EXPECT_EQ(b.step, 7);
  EXPECT_EQ(b.rank, 1);
  EXPECT_EQ(b.ref_params, a.ref_params);
  EXPECT_EQ(b.exp_avg_sq, a.exp_avg_sq);
  EXPECT_EQ(b.bytes(), 12 * sizeof(float));
  std::string cut = a.Serialize();
  cut.resize(cut.size() - 4);
  EXPECT_FALSE(worker::SnapshotShard::Parse(cut, &b).ok());
}

TEST(PeerSnapshotTest, MissingCopiesFailEveryRankWithoutHanging) {
  const std::string dir = MakeTempDir("peer-missing");
  {
    Ranks ranks(2, dir);
    const JobSpec spec = Spec(2, 2, dir);
    for (auto& s : ranks.Setup(spec, "", 0, {})) ASSERT_TRUE(s.status.ok()) << s.status;
    ranks.RunOk(tandem::v1::PHASE_SFT_STEP, 1);  // no checkpoint: no copies
    ranks.AbortAll();
    ranks.Replace(0);
    const auto start = std::chrono::steady_clock::now();
    auto setup = ranks.Setup(spec, "", 1, {0});
    for (auto& s : setup) {
      EXPECT_FALSE(s.status.ok());
      EXPECT_NE(std::string(s.status.message()).find("peer restore"), std::string::npos) << s.status;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::enginetest
