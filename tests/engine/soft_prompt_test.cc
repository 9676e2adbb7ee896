// Prompt tuning through the job engine (train.soft_prompt_tokens, the tiny
// SFT job, ranks as threads over Gloo):
//  - with train.trainable: [tandem.soft_prompt] only the soft prompt
//    trains: every other weight leaves the job bit-identical, the loss
//    falls, and the exported model carries the soft prompt
//    (tandem_soft_prompt_tokens, tensor tandem.soft_prompt);
//  - 2 ranks at ZeRO-3 equal 1 rank within fp32 reduction order, and a
//    checkpoint at step k resumed equals the uninterrupted run bit for bit;
//  - the exported model runs again as model.from (its own soft prompt,
//    the same number given or 0), a different number is refused, and a
//    model without one gets its soft prompt re-laid from its embeddings;
//  - GRPO trains the soft prompt alone too, and its tensor-parallel
//    rollouts equal tp_size 1.
#include <string>

#include <cmath>
#include <cstring>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"

namespace tandem::enginetest {
namespace {

namespace fs = std::filesystem;
using tandem::v1::PHASE_CHECKPOINT;
using tandem::v1::PHASE_EXPORT;
using tandem::v1::PHASE_SFT_STEP;

constexpr int kK = 4;  // checkpoint step; runs end at 2k
constexpr int kSoft = 4;
const char kTrainSoft[] = "train.trainable=[tandem.soft_prompt]";

JobSpec Spec(int world, int stage, const std::string& dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {
      "cluster.workers=" + std::to_string(world), "cluster.zero_stage=" + std::to_string(stage),
      "train.steps=" + std::to_string(2 * kK),    "train.lr=0.05",
      "checkpoint.dir=" + dir + "/ckpt",          "output_dir=" + dir + "/final"};
  o.insert(o.end(), extra.begin(), extra.end());
  return ParseSpec(TinySftYaml(), o);
}

struct Trace {
  std::vector<double> losses;
  model::LoadedModel exported;
};

// SETUP (optionally restoring), steps first..last (checkpoint after
// ckpt_step), export; the exported model stays in dir/final.
Trace RunJob(int world, const JobSpec& spec, const std::string& dir, int first, int last, int ckpt_step = 0,
             const std::string& restore = "") {
  Trace t;
  EngineCluster cluster(world, restore.empty() ? "job-soft" : "job-soft-resume");
  cluster.SetupOk(spec, restore);
  for (int s = first; s <= last; ++s) {
    t.losses.push_back(cluster.RunOk(PHASE_SFT_STEP, s).metrics().loss());
    if (s == ckpt_step) cluster.RunOk(PHASE_CHECKPOINT, s);
  }
  cluster.RunOk(PHASE_EXPORT, last);
  auto m = model::LoadModelDir(dir + "/final");
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) t.exported = std::move(*m);
  return t;
}

// Floats of `a` and `b` (one layout) that differ outside [lo, hi).
size_t DiffOutside(const std::vector<float>& a, const std::vector<float>& b, size_t lo, size_t hi) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if ((i < lo || i >= hi) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++n;
  }
  return n;
}

TEST(SoftPromptEngineTest, OnlyTheSoftPromptTrainsAndTheModelCarriesIt) {
  const std::string dir = MakeTempDir("soft-train");
  const JobSpec spec = Spec(1, 0, dir, {"train.soft_prompt_tokens=" + std::to_string(kSoft), kTrainSoft});
  const Trace start = RunJob(1, spec, dir, 1, 0);  // the initial weights
  const Trace run = RunJob(1, spec, dir, 1, 2 * kK);
  ASSERT_EQ(run.exported.config.tandem_soft_prompt_tokens, kSoft);
  const model::ParamLayout layout(run.exported.config);
  const model::TensorView* soft = layout.Find("tandem.soft_prompt");
  ASSERT_NE(soft, nullptr);
  EXPECT_EQ(DiffOutside(start.exported.params, run.exported.params, soft->offset, soft->offset + soft->numel), 0u);
  EXPECT_GT(DiffOutside(start.exported.params, run.exported.params, 0, 0), 0u) << "the soft prompt did not move";
  EXPECT_LT(run.losses.back(), run.losses.front());
  // The base weights are those of the same seed without a soft prompt.
  const Trace plain = RunJob(1, Spec(1, 0, dir), dir, 1, 0);
  const model::ParamLayout plain_layout(plain.exported.config);
  for (const model::TensorView& t : plain_layout.tensors()) {
    const model::TensorView* u = layout.Find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(std::memcmp(&plain.exported.params[t.offset], &start.exported.params[u->offset], t.numel * 4), 0)
        << t.name;
  }
  fs::remove_all(dir);
}

TEST(SoftPromptEngineTest, TwoRanksEqualOneAndResumeIsBitIdentical) {
  const std::string dir = MakeTempDir("soft-ranks");
  const std::vector<std::string> soft = {"train.soft_prompt_tokens=" + std::to_string(kSoft), kTrainSoft};
  const Trace one = RunJob(1, Spec(1, 0, dir, soft), dir, 1, 2 * kK);
  const Trace two = RunJob(2, Spec(2, 3, dir, soft), dir, 1, 2 * kK);
  ASSERT_EQ(one.losses.size(), two.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) EXPECT_NEAR(one.losses[i], two.losses[i], 1e-5) << "step " << i + 1;
  EXPECT_LT(MaxAbsDiff(one.exported.params, two.exported.params), 1e-5);
  const Trace full = RunJob(2, Spec(2, 3, dir, soft), dir, 1, 2 * kK, kK);
  const Trace resumed = RunJob(2, Spec(2, 3, dir, soft), dir, kK + 1, 2 * kK, 0, ckpt::FinalDir(dir + "/ckpt", kK));
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(kK));
  for (int i = 0; i < kK; ++i) EXPECT_EQ(full.losses[kK + i], resumed.losses[i]) << "step " << kK + 1 + i;
  EXPECT_EQ(DiffOutside(full.exported.params, resumed.exported.params, 0, 0), 0u);
  fs::remove_all(dir);
}

TEST(SoftPromptEngineTest, ModelDirsKeepOrGainASoftPrompt) {
  const std::string dir = MakeTempDir("soft-from");
  const std::string tuned = dir + "/tuned", base = dir + "/base";
  RunJob(1, Spec(1, 0, dir, {"train.soft_prompt_tokens=3", kTrainSoft}), dir, 1, 2);
  fs::rename(dir + "/final", tuned);
  RunJob(1, Spec(1, 0, dir), dir, 1, 0);
  fs::rename(dir + "/final", base);
  auto from = [&](const std::string& path, const std::string& kind_yaml, std::vector<std::string> extra) {
    std::string yaml = kind_yaml;
    const size_t a = yaml.find("model:"), b = yaml.find("task:");
    yaml.replace(a, b - a, "model: {from: " + path + "}\n");
    extra.push_back("output_dir=" + dir + "/final");
    return ParseSpec(yaml, extra);
  };
  EngineCluster cluster(1, "job-soft-from");
  // The model's own soft prompt, with the key at 0 or at the same number.
  for (const char* key : {"train.soft_prompt_tokens=0", "train.soft_prompt_tokens=3"}) {
    cluster.SetupOk(from(tuned, TinySftYaml(), {key}));
    EXPECT_GT(cluster.RunOk(PHASE_SFT_STEP, 1).metrics().loss(), 0);
  }
  auto other = cluster.Setup(from(tuned, TinySftYaml(), {"train.soft_prompt_tokens=5"}));
  ASSERT_FALSE(other[0].status.ok());
  EXPECT_NE(other[0].status.message().find("already has a soft prompt of 3 tokens"), std::string::npos)
      << other[0].status;
  // A model without one gains it: its rows start as vocabulary embeddings.
  cluster.SetupOk(from(base, TinySftYaml(), {"train.soft_prompt_tokens=2", kTrainSoft}));
  cluster.RunOk(PHASE_EXPORT, 0);
  auto gained = model::LoadModelDir(dir + "/final");
  ASSERT_TRUE(gained.ok()) << gained.status();
  EXPECT_EQ(gained->config.tandem_soft_prompt_tokens, 2);
  const model::ParamLayout layout(gained->config);
  const model::TensorView* soft = layout.Find("tandem.soft_prompt");
  const model::TensorView* embed = layout.Find("model.embed_tokens.weight");
  const int64_t V = embed->shape[0], C = embed->shape[1];
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t id = (2 * i + 1) * V / 4;
    EXPECT_EQ(std::memcmp(&gained->params[soft->offset + i * C], &gained->params[embed->offset + id * C], C * 4), 0)
        << "row " << i;
  }
  fs::remove_all(dir);
}

// GRPO behind a soft prompt (after a short SFT warm-up, so that rewards
// vary): rollouts, log-probs and the update all run with the prompt in
// front and the RL steps move it; the tensor-parallel rollout (the soft
// prompt replicated in every slice) gives the same tokens, rewards and
// losses as tp_size 1.
TEST(SoftPromptEngineTest, GrpoMovesTheSoftPromptAndTpEqualsTp1) {
  constexpr int kInit = 40;
  const std::string dir = MakeTempDir("soft-grpo");
  auto spec = [&](int tp) {
    return ParseSpec(TinyGrpoYaml(), {"cluster.workers=2", "cluster.zero_stage=3", "train.soft_prompt_tokens=3",
                                      "rollout.tp_size=" + std::to_string(tp),
                                      "init.sft.steps=" + std::to_string(kInit), "output_dir=" + dir + "/final"});
  };
  std::vector<float> start;
  std::vector<std::vector<double>> figures(2);
  model::LoadedModel end;
  for (int tp : {1, 2}) {
    EngineCluster c(2, "job-soft-grpo-" + std::to_string(tp));
    c.SetupOk(spec(tp));
    for (int w = 1; w <= kInit; ++w) c.RunOk(PHASE_SFT_STEP, -w);
    if (tp == 1) {
      c.RunOk(PHASE_EXPORT, 0);
      auto m = model::LoadModelDir(dir + "/final");
      ASSERT_TRUE(m.ok()) << m.status();
      start = m->params;
    }
    for (int s = 1; s <= 3; ++s) {
      auto r = c.RunOk(tandem::v1::PHASE_ROLLOUT, s);
      ASSERT_TRUE(r.metrics().extra().contains("rollout_tokens"));
      figures[tp - 1].push_back(r.metrics().extra().at("rollout_tokens"));
      figures[tp - 1].push_back(c.RunOk(tandem::v1::PHASE_SCORE, s).metrics().reward_mean());
      c.RunOk(tandem::v1::PHASE_LOGPROBS, s);
      figures[tp - 1].push_back(c.RunOk(tandem::v1::PHASE_UPDATE, s).metrics().loss());
    }
    if (tp == 1) {
      c.RunOk(PHASE_EXPORT, 3);
      auto m = model::LoadModelDir(dir + "/final");
      ASSERT_TRUE(m.ok()) << m.status();
      end = std::move(*m);
    }
  }
  ASSERT_EQ(figures[0].size(), figures[1].size());
  double rewards = 0;
  for (size_t i = 0; i < figures[0].size(); ++i) {
    EXPECT_NEAR(figures[0][i], figures[1][i], 1e-5 * (1 + std::fabs(figures[0][i]))) << "figure " << i;
    if (i % 3 == 1) rewards += figures[0][i];
  }
  EXPECT_GT(rewards, 0) << "no reward to learn from";
  // The RL steps moved the soft prompt (its gradient flows through the
  // rollout's prompts into the update).
  const model::ParamLayout layout(end.config);
  const model::TensorView* soft = layout.Find("tandem.soft_prompt");
  ASSERT_NE(soft, nullptr);
  const size_t all = DiffOutside(start, end.params, 0, 0);
  const size_t outside = DiffOutside(start, end.params, soft->offset, soft->offset + soft->numel);
  EXPECT_GT(all - outside, 0u) << "the soft prompt did not move";
  fs::remove_all(dir);
}

// At SETUP: a soft prompt that leaves the task's examples no room in
// train.seq_len (16 here) is refused naming both keys, and one that leaves
// no room at all says so.
TEST(SoftPromptEngineTest, SetupRefusesASoftPromptThatCrowdsOutTheExamples) {
  EngineCluster cluster(1, "job-soft-crowded");
  for (const auto& [soft, what] : {std::pair{10, "train.seq_len"}, std::pair{15, "leaves no room"}}) {
    auto res = cluster.Setup(ParseSpec(TinySftYaml(), {"train.soft_prompt_tokens=" + std::to_string(soft)}));
    ASSERT_FALSE(res[0].status.ok()) << soft;
    const std::string msg(res[0].status.message());
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.soft_prompt_tokens"), std::string::npos) << msg;
  }
}

TEST(SoftPromptEngineTest, SpecRefusesASoftPromptThatFillsTheContext) {
  auto huge = common::ParseJobSpecYaml(TinySftYaml(), {"train.soft_prompt_tokens=60000"});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("max_position_embeddings"), std::string::npos) << huge.status();
  auto negative = common::ParseJobSpecYaml(TinySftYaml(), {"train.soft_prompt_tokens=-1"});
  ASSERT_FALSE(negative.ok());
  // Without the key the pattern names a tensor the model does not have.
  auto pattern = common::ParseJobSpecYaml(TinySftYaml(), {kTrainSoft});
  ASSERT_FALSE(pattern.ok());
  EXPECT_NE(pattern.status().message().find("tandem.soft_prompt"), std::string::npos) << pattern.status();
  EXPECT_TRUE(common::ParseJobSpecYaml(TinySftYaml(), {"train.soft_prompt_tokens=2", kTrainSoft}).ok());
}

}  // namespace
}  // namespace tandem::enginetest
