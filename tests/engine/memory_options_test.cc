// The memory options through the engine (2 ranks as threads, ZeRO stage 3,
// the tiny GRPO job with kl_coef > 0): train.activation_checkpointing
// (selective, layer) and rl.shard_reference each run the same GRPO steps as
// the plain job - rewards, rollout tokens and losses equal bit for bit,
// since the recomputed gradients and the gathered reference log-probs are
// bit-identical -; a run with the sharded reference restored from its
// checkpoint ends bit-identical; bad values of the keys are refused at
// parse time naming the key.
#include <cstring>
#include <filesystem>

#include "tests/engine/engine_test_util.h"
#include "worker/ckpt/checkpoint.h"

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
  double reward = 0, rollout_tokens = 0, loss = 0;
};

StepFigures RlStep(EngineCluster& c, int64_t step) {
  StepFigures f;
  auto r = c.RunOk(PHASE_ROLLOUT, step);
  f.rollout_tokens = r.metrics().extra().contains("rollout_tokens") ? r.metrics().extra().at("rollout_tokens") : -1;
  f.reward = c.RunOk(PHASE_SCORE, step).metrics().reward_mean();
  c.RunOk(PHASE_LOGPROBS, step);
  f.loss = c.RunOk(PHASE_UPDATE, step).metrics().loss();
  return f;
}

std::vector<StepFigures> RunJob(const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {"init.sft.steps=4", "init.sft.lr=1e-2", "cluster.zero_stage=3"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  EngineCluster c(2);
  c.SetupOk(ParseSpec(TinyGrpoYaml(), overrides));
  for (int w = 1; w <= 4; ++w) c.RunOk(PHASE_SFT_STEP, -w);
  std::vector<StepFigures> out;
  for (int s = 1; s <= 3; ++s) out.push_back(RlStep(c, s));
  return out;
}

void ExpectSame(const std::vector<StepFigures>& a, const std::vector<StepFigures>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].reward, b[i].reward) << what << " step " << i + 1;
    EXPECT_EQ(a[i].rollout_tokens, b[i].rollout_tokens) << what << " step " << i + 1;
    EXPECT_EQ(a[i].loss, b[i].loss) << what << " step " << i + 1;
  }
}

TEST(MemoryOptionsTest, EachOptionRunsTheSameGrpoStepsAsThePlainJob) {
  const std::vector<StepFigures> plain = RunJob({});
  ExpectSame(plain, RunJob({"train.activation_checkpointing=selective"}), "selective");
  ExpectSame(plain, RunJob({"train.activation_checkpointing=layer"}), "layer");
  ExpectSame(plain, RunJob({"rl.shard_reference=true"}), "shard_reference");
  ExpectSame(plain, RunJob({"rl.shard_reference=true", "train.activation_checkpointing=layer"}), "both");
}

TEST(MemoryOptionsTest, ShardedReferenceRestoresBitIdentical) {
  const std::string dir = MakeTempDir("memory-ckpt");
  const JobSpec spec = ParseSpec(
      TinyGrpoYaml(), {"init.sft.steps=3", "init.sft.lr=1e-2", "cluster.zero_stage=3", "rl.shard_reference=true",
                       "train.steps=4", "checkpoint.dir=" + dir + "/ckpt", "output_dir=" + dir + "/final"});
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
  EngineCluster again(2, "job-memory-resume");
  auto rep = again.SetupOk(spec, ckpt::FinalDir(dir + "/ckpt", 2));
  EXPECT_EQ(rep.setup().restored_step(), 2);
  for (int s = 3; s <= 4; ++s) {
    const StepFigures f = RlStep(again, s);
    EXPECT_EQ(f.reward, first[s - 1].reward) << "step " << s;
    EXPECT_EQ(f.loss, first[s - 1].loss) << "step " << s;
  }
  again.RunOk(PHASE_EXPORT, 4);
  const std::vector<float> resumed = LoadExported(dir + "/final");
  ASSERT_EQ(resumed.size(), full.size());
  EXPECT_EQ(std::memcmp(resumed.data(), full.data(), full.size() * sizeof(float)), 0);
  std::filesystem::remove_all(dir);
}

TEST(MemoryOptionsTest, BadValuesAreRefusedNamingTheKey) {
  for (const char* bad : {"train.activation_checkpointing=full", "train.activation_checkpointing=Layer",
                          "train.activation_checkpointing=1"}) {
    auto spec = common::ParseJobSpecYaml(TinyGrpoYaml(), {bad});
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_NE(spec.status().message().find("train.activation_checkpointing"), std::string::npos) << spec.status();
  }
  auto spec = common::ParseJobSpecYaml(TinyGrpoYaml(), {"rl.shard_reference=maybe"});
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("rl.shard_reference"), std::string::npos) << spec.status();
}

}  // namespace
}  // namespace tandem::enginetest
