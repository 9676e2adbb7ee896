// train.accumulation: layer_major through the job engine (N = 2 ranks as
// threads over Gloo, tests/engine's harness):
//  * The SFT tiny job (3 micro-batches per rank and step) follows the
//    micro_batch job: losses within 1e-4 relative, final weights within
//    1e-4, at stages 0 and 3; at stage 3 a step reduce-scatters 1/3 of the
//    bytes.
//  * The GRPO tiny job (SFT warm start, then GRPO) still learns with it.
//  * A bad value is rejected at parse time with the key in the message.
#include <cstdio>
#include <filesystem>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;

constexpr int kMicro = 3;  // global_batch 12 / (micro_batch 2 x 2 ranks)

struct RunResult {
  std::vector<double> losses;
  std::vector<float> weights;
  tandem::v1::StepMetrics last;
};

double Extra(const tandem::v1::StepMetrics& m, const std::string& key) {
  return m.extra().contains(key) ? m.extra().at(key) : 0.0;
}

RunResult RunSft(int stage, const std::string& accumulation) {
  RunResult out;
  const std::string dir = MakeTempDir("layer-major");
  EngineCluster cluster(2);
  cluster.SetupOk(ParseSpec(TinySftYaml(), {"cluster.workers=2", "cluster.zero_stage=" + std::to_string(stage),
                                            "train.accumulation=" + accumulation, "output_dir=" + dir + "/final"}));
  const int steps = 10;
  for (int s = 1; s <= steps; ++s) {
    out.last = cluster.RunOk(tandem::v1::PHASE_SFT_STEP, s).metrics();
    out.losses.push_back(out.last.loss());
  }
  cluster.RunOk(tandem::v1::PHASE_EXPORT, steps);
  out.weights = LoadExported(dir + "/final");
  fs::remove_all(dir);
  return out;
}

TEST(LayerMajorEngine, SftFollowsMicroBatchAccumulation) {
  for (int stage : {0, 3}) {
    const RunResult plain = RunSft(stage, "micro_batch");
    const RunResult lm = RunSft(stage, "layer_major");
    ASSERT_EQ(plain.losses.size(), lm.losses.size());
    double worst = 0;
    for (size_t s = 0; s < plain.losses.size(); ++s) worst = std::max(worst, RelDiff(lm.losses[s], plain.losses[s]));
    const double rs_plain = Extra(plain.last, "bytes_sent_reduce_scatter");
    const double rs_lm = Extra(lm.last, "bytes_sent_reduce_scatter");
    std::printf(
        "[layer-major-engine] N=2 stage %d: loss %.5f -> %.5f (layer-major %.5f -> %.5f), largest per-step rel "
        "diff %.3g, max |w diff| %.3g; last step reduce_scatter bytes %.0f -> %.0f, allgather %.0f -> %.0f, "
        "allreduce %.0f -> %.0f\n",
        stage, plain.losses.front(), plain.losses.back(), lm.losses.front(), lm.losses.back(), worst,
        MaxAbsDiff(lm.weights, plain.weights), rs_plain, rs_lm, Extra(plain.last, "bytes_sent_allgather"),
        Extra(lm.last, "bytes_sent_allgather"), Extra(plain.last, "bytes_sent_allreduce"),
        Extra(lm.last, "bytes_sent_allreduce"));
    EXPECT_LT(plain.losses.back(), plain.losses.front());
    EXPECT_LE(worst, 1e-4) << "stage " << stage;
    EXPECT_LE(MaxAbsDiff(lm.weights, plain.weights), 1e-4) << "stage " << stage;
    if (stage == 3) {
      EXPECT_GT(rs_plain, 0);
      EXPECT_EQ(rs_plain, kMicro * rs_lm);
    }
  }
}

TEST(LayerMajorEngine, GrpoStillLearns) {
  EngineCluster c(2);
  constexpr int kWarm = 15, kSteps = 40;
  c.SetupOk(ParseSpec(TinyGrpoYaml(),
                      {"init.sft.steps=" + std::to_string(kWarm), "init.sft.lr=1e-2", "train.lr=1e-2",
                       "rl.prompts_per_step=8", "cluster.workers=2", "cluster.zero_stage=3", "train.micro_batch=2",
                       "train.accumulation=layer_major", "train.steps=" + std::to_string(kSteps)}));
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
  std::printf("[layer-major-grpo] N=2 stage 3: mean reward steps 1-6 %.3f, steps %d-%d %.3f\n", first, kSteps - 5,
              kSteps, last);
  EXPECT_GT(last, first + 0.1);
}

TEST(LayerMajorEngine, BadValueIsRejected) {
  auto spec = common::ParseJobSpecYaml(TinySftYaml(), {"train.accumulation=layer"});
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("train.accumulation"), std::string::npos) << spec.status();
  auto ok = common::ParseJobSpecYaml(TinySftYaml(), {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->train().accumulation(), "micro_batch");
}

}  // namespace
}  // namespace tandem::enginetest
