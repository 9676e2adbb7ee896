// SFT with cluster.sequence_parallel (ranks as threads, engines as in a
// worker): a hybrid model (full, window:5 and linear layers) trained for 8
// steps with N = 2 and 3 ranks in one sequence-parallel group, and with 4
// ranks as 2 groups of 2 (2 data-parallel groups), at ZeRO stage 0 and
// (2 and 4 ranks) at stages 1-3, gives the same per-step
// loss as one rank (relative difference <= 1e-5 per step) and the same
// final weights (max abs difference <= 1e-5 * max |w|). Bad values of the
// key are refused at parse time with the key's name. A checkpoint resumes
// bit for bit at stages 0, 2 and 3.
#include <cstdio>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"

namespace tandem::enginetest {
namespace {

constexpr int kSteps = 8;

std::string HybridSftYaml() {
  return R"(
name: sp-test
kind: sft
seed: 5
model:
  config: {vocab_size: 99, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3,
           num_attention_heads: 4, num_key_value_heads: 4, max_position_embeddings: 32,
           tokenizer: char, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0,
           tandem_layer_types: [full, "window:5", linear]}
task: {name: arithmetic, op: add, digits: 2, eval_size: 12}
train: {steps: 8, lr: 3.0e-3, global_batch: 12, micro_batch: 2, warmup_steps: 2, seq_len: 16}
cluster: {workers: 1, zero_stage: 0, threads_per_worker: 1}
checkpoint: {every: 0, keep: 3}
)";
}

struct RunResult {
  std::vector<double> losses;
  std::vector<float> weights;
  double sp_allgather_bytes = 0;  // the last step's, from the group communicator
};

RunResult RunSft(int world, int sp, int stage = 0) {
  RunResult out;
  const std::string dir = MakeTempDir("sp");
  const JobSpec spec = ParseSpec(
      HybridSftYaml(), {"cluster.workers=" + std::to_string(world), "cluster.sequence_parallel=" + std::to_string(sp),
                        "cluster.zero_stage=" + std::to_string(stage), "output_dir=" + dir + "/final"});
  EngineCluster cluster(world);
  cluster.SetupOk(spec);
  for (int s = 1; s <= kSteps; ++s) {
    const auto m = cluster.RunOk(tandem::v1::PHASE_SFT_STEP, s).metrics();
    out.losses.push_back(m.loss());
    const auto it = m.extra().find("sp_bytes_sent_allgather");
    out.sp_allgather_bytes = it == m.extra().end() ? 0 : it->second;
  }
  cluster.RunOk(tandem::v1::PHASE_EXPORT, kSteps);
  out.weights = LoadExported(dir + "/final");
  std::filesystem::remove_all(dir);
  return out;
}

class SftSequenceParallelTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(SftSequenceParallelTest, SameLossAndWeightsAsOneRank) {
  const auto [world, sp, stage] = GetParam();
  static const RunResult* base = new RunResult(RunSft(1, 1));
  ASSERT_EQ(base->losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(base->losses.back(), base->losses.front());
  const RunResult run = RunSft(world, sp, stage);
  ASSERT_EQ(run.losses.size(), base->losses.size());
  EXPECT_GT(run.sp_allgather_bytes, 0) << "the sequence-parallel group gathered no K/V";
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double d = RelDiff(run.losses[s], base->losses[s]);
    worst = std::max(worst, d);
    EXPECT_LE(d, 1e-5) << "step " << s + 1 << ": loss " << run.losses[s] << " vs " << base->losses[s];
  }
  const double wdiff = MaxAbsDiff(run.weights, base->weights);
  double wmax = 0;
  for (float w : base->weights) wmax = std::max(wmax, std::fabs(static_cast<double>(w)));
  EXPECT_LE(wdiff, 1e-5 * std::max(1.0, wmax));
  std::printf(
      "[sft sp] workers %d sequence_parallel %d zero_stage %d: largest per-step loss rel diff %.3g, weights max abs "
      "diff %.3g\n",
      world, sp, stage, worst, wdiff);
}

INSTANTIATE_TEST_SUITE_P(Groups, SftSequenceParallelTest,
                         ::testing::Values(std::make_tuple(2, 2, 0), std::make_tuple(3, 3, 0), std::make_tuple(4, 2, 0),
                                           std::make_tuple(2, 2, 1), std::make_tuple(2, 2, 2), std::make_tuple(2, 2, 3),
                                           std::make_tuple(4, 2, 2), std::make_tuple(4, 2, 3)),
                         [](const auto& info) {
                           return absl::StrCat("W", std::get<0>(info.param), "_SP", std::get<1>(info.param), "_Z",
                                               std::get<2>(info.param));
                         });

// A checkpoint of a sequence-parallel job (taken at step 4 of 8) resumes in
// a fresh cluster to the same losses and final weights, bit for bit, as the
// uninterrupted run, at ZeRO stages 0, 2 and 3.
TEST(SftSequenceParallelResumeTest, ResumeEqualsUninterrupted) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "zero_stage " << stage);
    const std::string dir = MakeTempDir("sp-resume");
    const JobSpec spec =
        ParseSpec(HybridSftYaml(),
                  {"cluster.workers=2", "cluster.sequence_parallel=2", absl::StrCat("cluster.zero_stage=", stage),
                   "checkpoint.dir=" + dir + "/ckpt", "output_dir=" + dir + "/final"});
    std::vector<double> full;
    std::vector<float> full_weights;
    {
      EngineCluster c(2, "job-sp");
      c.SetupOk(spec);
      for (int s = 1; s <= kSteps; ++s) {
        full.push_back(c.RunOk(tandem::v1::PHASE_SFT_STEP, s).metrics().loss());
        if (s == 4) {
          c.RunOk(tandem::v1::PHASE_CHECKPOINT, s);
          c.RunOk(tandem::v1::PHASE_FLUSH_CHECKPOINTS, s);
        }
      }
      c.RunOk(tandem::v1::PHASE_EXPORT, kSteps);
      full_weights = LoadExported(dir + "/final");
    }
    std::filesystem::remove_all(dir + "/final");
    EngineCluster again(2, "job-sp-resume");
    auto rep = again.SetupOk(spec, ckpt::FinalDir(dir + "/ckpt", 4));
    EXPECT_EQ(rep.setup().restored_step(), 4);
    for (int s = 5; s <= kSteps; ++s) {
      EXPECT_EQ(again.RunOk(tandem::v1::PHASE_SFT_STEP, s).metrics().loss(), full[s - 1]) << "step " << s;
    }
    again.RunOk(tandem::v1::PHASE_EXPORT, kSteps);
    EXPECT_EQ(MaxAbsDiff(LoadExported(dir + "/final"), full_weights), 0.0);
    std::filesystem::remove_all(dir);
  }
}

TEST(SftSequenceParallelSpecTest, RefusesBadValues) {
  struct Case {
    std::vector<std::string> set;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"cluster.workers=2", "cluster.sequence_parallel=3"}, "does not divide cluster.workers"},
      {{"cluster.workers=2", "cluster.sequence_parallel=-2"}, "cluster.sequence_parallel"},
      {{"cluster.workers=2", "cluster.sequence_parallel=2", "cluster.device=cuda"}, "cpu workers only"},
      {{"cluster.workers=2", "cluster.sequence_parallel=2", "recovery.degraded=true"}, "recovery.degraded"},
      {{"cluster.workers=2", "cluster.sequence_parallel=2", "cluster.min_workers=1"}, "min_workers"},
      {{"cluster.workers=4", "cluster.sequence_parallel=2", "train.micro_batch=4"}, "data-parallel groups"},
  };
  for (const Case& c : cases) {
    auto spec = common::ParseJobSpecYaml(HybridSftYaml(), c.set);
    ASSERT_FALSE(spec.ok()) << c.set.back();
    EXPECT_NE(spec.status().message().find(c.want), std::string::npos) << spec.status();
    // The message names the key (or, for the batch arithmetic, train.global_batch).
    const std::string msg(spec.status().message());
    EXPECT_TRUE(msg.find("cluster.sequence_parallel") != std::string::npos ||
                msg.find("train.global_batch") != std::string::npos)
        << msg;
  }
  EXPECT_TRUE(common::ParseJobSpecYaml(HybridSftYaml(), {"cluster.workers=4", "cluster.sequence_parallel=2"}).ok());
}

}  // namespace
}  // namespace tandem::enginetest
