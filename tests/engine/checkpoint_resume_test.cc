// Checkpoints through the engine: PHASE_CHECKPOINT at step k,
// restore in PHASE_SETUP and continue to 2k.
//  - same world size and stage: bit-identical final weights and losses;
//  - different N / stage (resharding): losses continue within fp32 tolerance;
//  - corruption of the newest checkpoint (flipped byte, truncated shard,
//    missing shard): restoring from the root falls back to the previous one
//    and the SETUP report's log lines say so;
//  - retention keeps the newest K.
#include <cstdio>
#include <cstring>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_FLUSH_CHECKPOINTS;
using tandem::v1::PHASE_SFT_STEP;

constexpr int kK = 4;  // checkpoint step; runs end at 2k

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Trace {
  std::vector<double> losses;  // index s-1 for step s (only steps run)
  std::vector<float> weights;
};

JobSpec Spec(int world, int stage, const std::string& dir, int keep = 3) {
  return ParseSpec(TinySftYaml(),
                   {"cluster.workers=" + std::to_string(world), "cluster.zero_stage=" + std::to_string(stage),
                    "train.steps=" + std::to_string(2 * kK), "checkpoint.keep=" + std::to_string(keep),
                    "checkpoint.dir=" + dir + "/ckpt", "output_dir=" + dir + "/final"});
}

// Runs steps first..last (checkpointing after each step in `ckpt_steps`,
// and waiting for the write with PHASE_FLUSH_CHECKPOINTS after those in
// `flush_steps`), then exports.
Trace RunSteps(EngineCluster& cluster, const std::string& dir, int first, int last, const std::vector<int>& ckpt_steps,
               std::vector<std::string>* published = nullptr, const std::vector<int>& flush_steps = {}) {
  Trace t;
  t.losses.assign(last, 0.0);
  // Checkpoints publish in the background; rank 0's next report (any phase)
  // carries each one's step, directory and size on disk (every file in it).
  auto note = [&](const ReportPhaseRequest& rep) {
    for (const auto& c : rep.checkpoints()) {
      EXPECT_EQ(c.path(), ckpt::FinalDir(fs::path(c.path()).parent_path(), c.step()));
      uint64_t on_disk = 0;
      for (const auto& e : fs::directory_iterator(c.path())) on_disk += fs::file_size(e.path());
      EXPECT_GT(c.bytes(), 0);
      EXPECT_EQ(static_cast<uint64_t>(c.bytes()), on_disk) << c.path();
      if (published) published->push_back(c.path());
    }
  };
  for (int s = first; s <= last; ++s) {
    auto step = cluster.RunOk(PHASE_SFT_STEP, s);
    note(step);
    t.losses[s - 1] = step.metrics().loss();
    if (std::find(ckpt_steps.begin(), ckpt_steps.end(), s) != ckpt_steps.end()) {
      auto rep = cluster.RunOk(PHASE_CHECKPOINT, s);
      EXPECT_TRUE(rep.has_checkpoint());
      EXPECT_GT(rep.checkpoint().snapshot_bytes(), 0);
      note(rep);
    }
    if (std::find(flush_steps.begin(), flush_steps.end(), s) != flush_steps.end()) {
      // Written and reported by now (with the CHECKPOINT report or this one).
      note(cluster.RunOk(PHASE_FLUSH_CHECKPOINTS, s));
      if (published) {
        EXPECT_EQ(published->empty() ? "" : published->back(), ckpt::FinalDir(dir + "/ckpt", s));
      }
    }
  }
  note(cluster.RunOk(PHASE_EXPORT, last));
  t.weights = LoadExported(dir + "/final");
  return t;
}

TEST(CheckpointResumeTest, SameWorldResumeIsBitIdentical) {
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{2, 3}}) {
    const std::string dir = MakeTempDir("resume");
    Trace full;
    std::vector<std::string> published;
    {
      EngineCluster cluster(world);
      cluster.SetupOk(Spec(world, stage, dir));
      full = RunSteps(cluster, dir, 1, 2 * kK, {kK}, &published);
    }
    const std::string ck = ckpt::FinalDir(dir + "/ckpt", kK);
    ASSERT_TRUE(fs::exists(ck + "/manifest.json"));
    ASSERT_EQ(published.size(), 1u);
    EXPECT_EQ(published[0], ck);
    fs::remove_all(dir + "/final");

    EngineCluster again(world, "job-resume");
    auto rep = again.SetupOk(Spec(world, stage, dir), ck);
    EXPECT_EQ(rep.setup().restored_step(), kK);
    EXPECT_TRUE(HasLine(rep, "restored step 4"));
    Trace resumed = RunSteps(again, dir, kK + 1, 2 * kK, {});
    for (int s = kK + 1; s <= 2 * kK; ++s) {
      EXPECT_EQ(resumed.losses[s - 1], full.losses[s - 1]) << "N=" << world << " step " << s;
    }
    ASSERT_EQ(resumed.weights.size(), full.weights.size());
    EXPECT_EQ(std::memcmp(resumed.weights.data(), full.weights.data(), full.weights.size() * sizeof(float)), 0)
        << "N=" << world << " stage " << stage << ": final weights differ, max "
        << MaxAbsDiff(resumed.weights, full.weights);
    std::printf("[resume] N=%d stage=%d: final weights bit-identical after restore at step %d\n", world, stage, kK);
    fs::remove_all(dir);
  }
}

struct ReshardCase {
  int from_world, from_stage, to_world, to_stage;
};

void CheckReshard(const std::vector<ReshardCase>& cases) {
  for (const ReshardCase& c : cases) {
    const std::string dir = MakeTempDir("reshard");
    Trace full;
    {
      EngineCluster cluster(c.from_world);
      cluster.SetupOk(Spec(c.from_world, c.from_stage, dir));
      full = RunSteps(cluster, dir, 1, 2 * kK, {kK});
    }
    fs::remove_all(dir + "/final");
    EngineCluster again(c.to_world, "job-reshard");
    auto rep = again.SetupOk(Spec(c.to_world, c.to_stage, dir), dir + "/ckpt");
    EXPECT_EQ(rep.setup().restored_step(), kK);
    Trace resumed = RunSteps(again, dir, kK + 1, 2 * kK, {});
    double worst = 0;
    for (int s = kK + 1; s <= 2 * kK; ++s) {
      const double d = RelDiff(resumed.losses[s - 1], full.losses[s - 1]);
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-5) << "step " << s << ": " << resumed.losses[s - 1] << " vs " << full.losses[s - 1];
    }
    const double wdiff = MaxAbsDiff(resumed.weights, full.weights);
    EXPECT_LE(wdiff, 1e-5);
    std::printf("[reshard] N=%d stage %d -> N=%d stage %d: loss rel diff %.3g, weights %.3g\n", c.from_world,
                c.from_stage, c.to_world, c.to_stage, worst, wdiff);
    fs::remove_all(dir);
  }
}

TEST(CheckpointResumeTest, ReshardAcrossWorldsAndStages) {
  CheckReshard({{2, 1, 1, 3}, {2, 2, 3, 2}, {3, 3, 2, 1}, {2, 3, 1, 0}});
}

// Restoring into ZeRO stage 0 with more than one rank loses most of the Adam
// moments: ZeroOptimizer::LoadOptimizerShard (worker/zero) loads only this
// rank's pieces into the full stage-0 moments and leaves the rest at zero,
// and its API offers no way to load the other ranks' pieces. The same-N
// resume of a stage-0 job with N > 1 is hit too. Needs a worker/zero change
// (e.g. stage 0 loading full moments); enable when fixed.
TEST(CheckpointResumeTest, RestoreIntoStageZeroWithSeveralRanks) { CheckReshard({{2, 2, 3, 0}, {2, 0, 2, 0}}); }

// Writes checkpoints at steps 2 and 4 with N=2, then corrupts step 4 in each
// way and restores from the root.
TEST(CheckpointResumeTest, CorruptNewestFallsBackToPrevious) {
  const std::string dir = MakeTempDir("corrupt");
  Trace full;
  {
    EngineCluster cluster(2);
    cluster.SetupOk(Spec(2, 2, dir));
    full = RunSteps(cluster, dir, 1, kK, {2, kK});
  }
  const std::string root = dir + "/ckpt";
  const std::string shard = ckpt::FinalDir(root, kK) + "/" + ckpt::ShardFileName(1, 2);
  ASSERT_TRUE(fs::exists(shard));
  const std::string good = dir + "/good";
  fs::copy(root, good, fs::copy_options::recursive);

  const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> damages = {
      {"flipped byte",
       [](const std::string& f) {
         std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
         io.seekg(static_cast<std::streamoff>(fs::file_size(f) / 2));
         char ch = 0;
         io.read(&ch, 1);
         ch = static_cast<char>(ch ^ 0x40);
         io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
         io.write(&ch, 1);
       }},
      {"truncated", [](const std::string& f) { fs::resize_file(f, fs::file_size(f) - 100); }},
      {"missing", [](const std::string& f) { fs::remove(f); }},
  };
  for (const auto& [what, damage] : damages) {
    fs::remove_all(root);
    fs::copy(good, root, fs::copy_options::recursive);
    damage(shard);
    EngineCluster again(2, "job-corrupt");
    auto rep = again.SetupOk(Spec(2, 2, dir), root);
    ASSERT_TRUE(rep.setup().restored()) << what;
    EXPECT_EQ(rep.setup().restored_step(), 2) << what;
    EXPECT_EQ(rep.setup().checkpoints_skipped(), 1) << what;
    EXPECT_TRUE(HasLine(rep, "checkpoint skipped (falling back to an older one): " + ckpt::FinalDir(root, kK))) << what;
    EXPECT_TRUE(HasLine(rep, "restored step 2")) << what;
    std::string lines;
    for (const auto& l : rep.log_lines()) lines += "  " + l + "\n";
    std::printf("[corrupt] %s shard -> SETUP log:\n%s", what.c_str(), lines.c_str());
    // Training continues from step 2 exactly as before.
    EXPECT_EQ(again.RunOk(PHASE_SFT_STEP, 3).metrics().loss(), full.losses[2]) << what;

    // Naming the corrupt step directory itself is an error, not a fallback.
    if (what != "missing") {
      EngineCluster direct(2, "job-direct");
      auto res = direct.Setup(Spec(2, 2, dir), ckpt::FinalDir(root, kK));
      ASSERT_FALSE(res[0].status.ok()) << what;
      // The coordinator marks the checkpoint bad and falls back on this kind.
      EXPECT_EQ(common::FailureKindOf(res[0].status), tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED) << what;
      EXPECT_NE(res[0].status.message().find(ckpt::ShardFileName(1, 2)), std::string::npos) << res[0].status;
    }
  }
  fs::remove_all(dir);
}

// Recovery restores only the job's own checkpoints: the directory of the
// manifest's step under the job's checkpoint root, written for its model.
TEST(CheckpointResumeTest, RecoveryRefusesCheckpointsFromElsewhere) {
  const std::string dir = MakeTempDir("elsewhere");
  {
    EngineCluster cluster(1);
    cluster.SetupOk(Spec(1, 0, dir));
    RunSteps(cluster, dir, 1, 2, {2}, nullptr, {2});
  }
  const std::string own = ckpt::FinalDir(dir + "/ckpt", 2);
  ASSERT_TRUE(fs::exists(own + "/manifest.json"));
  // A valid checkpoint copied elsewhere, and one renamed to another step.
  const std::string copied = dir + "/evil/step-99999999";
  fs::create_directories(dir + "/evil");
  fs::copy(own, copied, fs::copy_options::recursive);
  const std::string renamed = ckpt::FinalDir(dir + "/ckpt", 7);
  fs::copy(own, renamed, fs::copy_options::recursive);
  for (const std::string& path : {copied, renamed}) {
    EngineCluster again(1, "job-elsewhere");
    auto res = again.Setup(Spec(1, 0, dir), path);
    ASSERT_FALSE(res[0].status.ok()) << path;
    EXPECT_EQ(res[0].status.code(), absl::StatusCode::kDataLoss) << res[0].status;
    EXPECT_EQ(common::FailureKindOf(res[0].status), tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
    EXPECT_NE(res[0].status.message().find("its manifest says step 2, which lives at " +
                                           fs::path(own).lexically_normal().string()),
              std::string::npos)
        << res[0].status;
  }
  // The job's own resume_from is a checkpoint of another job: wherever it
  // lies, it restores when the coordinator names it as restore_from too.
  {
    JobSpec spec = Spec(1, 0, dir);
    spec.set_resume_from(copied);
    EngineCluster again(1, "job-resume-from");
    auto rep = again.SetupOk(spec, copied);
    EXPECT_EQ(rep.setup().restored_step(), 2);
  }
  // A checkpoint of the right shape written for another model section.
  fs::remove_all(renamed);
  {
    auto j = nlohmann::json::parse(ReadAll(own + "/manifest.json"));
    j["config_hash"] = "0123456789abcdef";
    j.erase("checksum");
    const std::string text = j.dump();
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(ckpt::Xxh64(text.data(), text.size())));
    j["checksum"] = sum;
    std::ofstream(own + "/manifest.json") << j.dump(2);
  }
  EngineCluster again(1, "job-elsewhere-2");
  auto res = again.Setup(Spec(1, 0, dir), own);
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_NE(res[0].status.message().find("written for another model configuration"), std::string::npos)
      << res[0].status;
  fs::remove_all(dir);
}

TEST(CheckpointResumeTest, RetentionKeepsNewestK) {
  const std::string dir = MakeTempDir("retention");
  std::vector<std::string> published;
  {
    EngineCluster cluster(2);
    cluster.SetupOk(Spec(2, 1, dir, /*keep=*/2));
    RunSteps(cluster, dir, 1, 5, {1, 2, 3, 4, 5}, &published, /*flush_steps=*/{2, 4});
  }
  const std::string root = dir + "/ckpt";
  std::vector<std::string> every;  // each one reported once, in order
  for (int s = 1; s <= 5; ++s) every.push_back(ckpt::FinalDir(root, s));
  EXPECT_EQ(published, every);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{ckpt::StepDirName(4), ckpt::StepDirName(5)}));
  auto list = ckpt::ListCheckpoints(root);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].first, 5);
  auto m = ckpt::ReadManifest(list[0].second);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->world_size, 2);
  EXPECT_EQ(m->zero_stage, 1);
  EXPECT_EQ(m->optimizer_steps, 5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::enginetest
