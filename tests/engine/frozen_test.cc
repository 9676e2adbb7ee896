// train.trainable through the job engine (the tiny SFT job, ranks as
// threads over Gloo):
//  - patterns that match every tensor: losses and weights bit-identical to
//    the job without the key;
//  - a subset: the frozen tensors leave training byte-identical, the SETUP
//    report's gradient and optimizer bytes shrink to the trainable share;
//  - every stage in fp32 and bf16, on the cpu and cpu-guarded devices
//    (bit-identical);
//  - checkpoint at step k and resume: bit-identical to the uninterrupted
//    run; resuming with other patterns is refused with a clear error.
#include <cstdio>
#include <cstring>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/job_model.h"
#include "worker/model/param_layout.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_SFT_STEP;

constexpr int kK = 3;  // checkpoint step; runs end at 2k
const char kMlp[] = "train.trainable=[\"model.layers.*.mlp.*\", model.norm.weight]";

JobSpec Spec(int world, int stage, const std::string& dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"cluster.workers=" + std::to_string(world),
                                "cluster.zero_stage=" + std::to_string(stage), "train.steps=" + std::to_string(2 * kK),
                                "checkpoint.dir=" + dir + "/ckpt", "output_dir=" + dir + "/final"};
  o.insert(o.end(), extra.begin(), extra.end());
  return ParseSpec(TinySftYaml(), o);
}

struct Trace {
  std::vector<double> losses;
  std::vector<float> weights;
  ReportPhaseRequest setup;                // rank 0's
  std::vector<ReportPhaseRequest> setups;  // every rank's
};

// SETUP (optionally restoring), steps first..last (checkpoint after
// ckpt_step), export.
Trace RunJob(int world, const JobSpec& spec, const std::string& dir, int first, int last, int ckpt_step = 0,
             const std::string& restore = "", const std::string& device = "cpu") {
  Trace t;
  EngineCluster cluster(world, restore.empty() ? "job-frozen" : "job-frozen-resume", device);
  for (auto& r : cluster.Setup(spec, restore)) {
    EXPECT_TRUE(r.status.ok()) << r.status;
    t.setups.push_back(r.report);
  }
  t.setup = t.setups[0];
  for (int s = first; s <= last; ++s) {
    t.losses.push_back(cluster.RunOk(PHASE_SFT_STEP, s).metrics().loss());
    if (s == ckpt_step) cluster.RunOk(PHASE_CHECKPOINT, s);
  }
  cluster.RunOk(PHASE_EXPORT, last);
  t.weights = LoadExported(dir + "/final");
  fs::remove_all(dir + "/final");
  return t;
}

double Value(const ReportPhaseRequest& r, const std::string& key) {
  auto it = r.values().find(key);
  EXPECT_NE(it, r.values().end()) << key;
  return it == r.values().end() ? -1 : it->second;
}

// The sum of a SETUP value over the ranks.
double Sum(const Trace& t, const std::string& key) {
  double sum = 0;
  for (const auto& r : t.setups) sum += Value(r, key);
  return sum;
}

TEST(FrozenEngineTest, EveryTensorTrainableIsBitIdentical) {
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{2, 3}}) {
    const std::string dir = MakeTempDir("frozen-all");
    const Trace plain = RunJob(world, Spec(world, stage, dir), dir, 1, 2 * kK);
    const Trace star = RunJob(world, Spec(world, stage, dir, {"train.trainable=[\"*\"]"}), dir, 1, 2 * kK);
    EXPECT_EQ(star.losses, plain.losses) << "N=" << world << " stage " << stage;
    ASSERT_EQ(star.weights.size(), plain.weights.size());
    EXPECT_EQ(std::memcmp(star.weights.data(), plain.weights.data(), plain.weights.size() * sizeof(float)), 0);
    EXPECT_EQ(Value(star.setup, "grad_bytes"), Value(plain.setup, "grad_bytes"));
    fs::remove_all(dir);
  }
}

TEST(FrozenEngineTest, FrozenTensorsStayAndMemoryShrinks) {
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{2, 3}}) {
    const std::string dir = MakeTempDir("frozen-subset");
    // The initial weights: an export before any step.
    std::vector<float> init;
    {
      EngineCluster cluster(world, "job-init");
      cluster.SetupOk(Spec(world, stage, dir));
      cluster.RunOk(PHASE_EXPORT, 0);
      init = LoadExported(dir + "/final");
      fs::remove_all(dir + "/final");
    }
    const Trace plain = RunJob(world, Spec(world, stage, dir), dir, 1, 2 * kK);
    const Trace frozen = RunJob(world, Spec(world, stage, dir, {kMlp}), dir, 1, 2 * kK);
    const model::ParamLayout layout(*model::ModelConfigFromJob(Spec(world, stage, dir).model().config()));
    ASSERT_EQ(frozen.weights.size(), layout.total_floats());
    ASSERT_EQ(init.size(), layout.total_floats());
    size_t trainable = 0;
    for (const auto& t : layout.tensors()) {
      const bool train = t.name.find(".mlp.") != std::string::npos || t.name == "model.norm.weight";
      const bool same = std::memcmp(frozen.weights.data() + t.offset, init.data() + t.offset, t.numel * 4) == 0;
      if (train) {
        trainable += t.numel;
        EXPECT_FALSE(same) << t.name << " did not train";
      } else {
        EXPECT_TRUE(same) << t.name << " changed while frozen";
      }
    }
    EXPECT_EQ(Value(frozen.setup, "trainable_params"), static_cast<double>(trainable));
    const double psi = Value(plain.setup, "trainable_params");
    EXPECT_EQ(Value(frozen.setup, "param_bytes"), Value(plain.setup, "param_bytes"));
    // Gradients and moments of the trainable elements only: T and 2T
    // floats on every rank at stage 0; at stage 3 the ranks' shares add up
    // to them (each rank owns the trainable elements of its pieces).
    const double ranks = stage == 0 ? world : 1;
    EXPECT_EQ(Sum(frozen, "grad_bytes"), 4.0 * trainable * ranks);
    EXPECT_EQ(Sum(frozen, "optimizer_bytes"), 8.0 * trainable * ranks);
    EXPECT_EQ(Sum(frozen, "param_bytes"), Sum(plain, "param_bytes"));
    for (size_t r = 0; r < frozen.setups.size(); ++r) {
      std::printf(
          "[frozen] N=%d stage %d rank %zu: trainable %zu of %.0f params; grads %.0f -> %.0f B, optimizer %.0f -> "
          "%.0f B, params %.0f B\n",
          world, stage, r, trainable, psi, Value(plain.setups[r], "grad_bytes"), Value(frozen.setups[r], "grad_bytes"),
          Value(plain.setups[r], "optimizer_bytes"), Value(frozen.setups[r], "optimizer_bytes"),
          Value(frozen.setups[r], "param_bytes"));
    }
    EXPECT_LT(frozen.losses.back(), frozen.losses.front());
    fs::remove_all(dir);
  }
}

// Every stage in fp32 and bf16 on the cpu-guarded device (every buffer in
// device memory that faults on host access) equals the cpu device bit for
// bit, and the frozen fp32 masters stay byte-identical.
TEST(FrozenEngineTest, StagesPrecisionsAndGuardedDevice) {
  const std::string dir = MakeTempDir("frozen-device");
  std::vector<float> init;
  {
    EngineCluster cluster(2, "job-init");
    cluster.SetupOk(Spec(2, 0, dir));
    cluster.RunOk(PHASE_EXPORT, 0);
    init = LoadExported(dir + "/final");
    fs::remove_all(dir + "/final");
  }
  const model::ParamLayout layout(*model::ModelConfigFromJob(Spec(2, 0, dir).model().config()));
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string precision : {"fp32", "bf16"}) {
      const std::string what = "stage " + std::to_string(stage) + " " + precision;
      const JobSpec spec = Spec(2, stage, dir, {kMlp, "train.precision=" + precision});
      const Trace cpu = RunJob(2, spec, dir, 1, kK);
      const Trace guarded = RunJob(2, spec, dir, 1, kK, 0, "", "cpu-guarded");
      EXPECT_EQ(guarded.losses, cpu.losses) << what;
      ASSERT_EQ(guarded.weights.size(), cpu.weights.size()) << what;
      EXPECT_EQ(std::memcmp(guarded.weights.data(), cpu.weights.data(), cpu.weights.size() * sizeof(float)), 0) << what;
      for (const auto& t : layout.tensors()) {
        const bool train = t.name.find(".mlp.") != std::string::npos || t.name == "model.norm.weight";
        const bool same = std::memcmp(cpu.weights.data() + t.offset, init.data() + t.offset, t.numel * 4) == 0;
        EXPECT_NE(same, train) << what << ": " << t.name;
      }
    }
  }
  fs::remove_all(dir);
}

TEST(FrozenEngineTest, ResumeIsBitIdenticalAndOtherPatternsAreRefused) {
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{2, 3}}) {
    const std::string dir = MakeTempDir("frozen-resume");
    const Trace full = RunJob(world, Spec(world, stage, dir, {kMlp}), dir, 1, 2 * kK, kK);
    const std::string ck = ckpt::FinalDir(dir + "/ckpt", kK);
    ASSERT_TRUE(fs::exists(ck + "/manifest.json"));
    const Trace resumed = RunJob(world, Spec(world, stage, dir, {kMlp}), dir, kK + 1, 2 * kK, 0, ck);
    EXPECT_EQ(resumed.setup.setup().restored_step(), kK);
    for (int s = kK + 1; s <= 2 * kK; ++s) {
      EXPECT_EQ(resumed.losses[s - kK - 1], full.losses[s - 1]) << "N=" << world << " step " << s;
    }
    ASSERT_EQ(resumed.weights.size(), full.weights.size());
    EXPECT_EQ(std::memcmp(resumed.weights.data(), full.weights.data(), full.weights.size() * sizeof(float)), 0)
        << "N=" << world << " stage " << stage << ": max diff " << MaxAbsDiff(resumed.weights, full.weights);

    for (const std::vector<std::string>& other :
         {std::vector<std::string>{}, std::vector<std::string>{"train.trainable=[\"model.layers.*.mlp.*\"]"}}) {
      EngineCluster again(world, "job-frozen-other");
      auto res = again.Setup(Spec(world, stage, dir, other), ck);
      ASSERT_FALSE(res[0].status.ok());
      const std::string msg(res[0].status.message());
      EXPECT_NE(msg.find("written with train.trainable [model.layers.*.mlp.*, model.norm.weight]"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("resume with the same patterns"), std::string::npos) << msg;
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace tandem::enginetest
