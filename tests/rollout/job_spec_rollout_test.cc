// rollout.* job keys: bad values are rejected naming the key; good ones
// reach the engine's options (zero values take the defaults).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "worker/rollout/spec_options.h"

namespace tandem {
namespace {

const char kJob[] = R"(
name: grpo-rollout
kind: grpo
seed: 1
model: {config: {vocab_size: 128, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                 num_attention_heads: 4, num_key_value_heads: 2}}
task: {name: arithmetic, op: add, digits: 2}
train: {steps: 2, lr: 1.0e-4, global_batch: 16, micro_batch: 8}
rl: {group_size: 8, prompts_per_step: 2, max_new_tokens: 8, temperature: 0.7, top_p: 0.9, top_k: 5}
cluster: {workers: 1, device: cpu}
)";

std::string ErrorOf(std::vector<std::string> overrides) {
  auto spec = common::ParseJobSpecYaml(kJob, overrides);
  if (spec.ok()) return "OK";
  return std::string(spec.status().message());
}

TEST(JobSpecRolloutTest, BadValuesNameTheKey) {
  EXPECT_EQ(ErrorOf({}), "OK");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"rollout.kv_cache_bytes=-1", "rollout.kv_cache_bytes"},
      {"rollout.kv_dtype=fp8", "rollout.kv_dtype"},
      {"rollout.block_size=0.5", "rollout.block_size"},
      {"rollout.block_size=4096", "rollout.block_size"},
      {"rollout.max_batch_tokens=-3", "rollout.max_batch_tokens"},
      {"rollout.max_seqs=-1", "rollout.max_seqs"},
      {"rollout.min_p=1", "rollout.min_p"},
      {"rollout.repetition_penalty=-2", "rollout.repetition_penalty"},
      {"rollout.no_prompt_sharing=maybe", "rollout.no_prompt_sharing"},
      {"rollout.kv_bytes=5", "rollout.kv_bytes: unknown key"},
      {"rollout.kv_cache_fraction=-0.1", "rollout.kv_cache_fraction"},
      {"rollout.kv_cache_fraction=0.99", "rollout.kv_cache_fraction"},
      {"rollout.kv_cache_fraction=1.5", "rollout.kv_cache_fraction"},
      {"rollout.kv_cache_fraction=half", "rollout.kv_cache_fraction"},
      {"rollout.shift_parallel=maybe", "rollout.shift_parallel"},
      {"rollout.shift_parallel=true", "rollout.shift_parallel: needs rollout.tp_size > 1"},
      {"rollout.shift_threshold_tokens=0", "rollout.shift_threshold_tokens"},
      {"rollout.shift_threshold_tokens=2000000", "rollout.shift_threshold_tokens"},
      {"rollout.shift_threshold_tokens=many", "rollout.shift_threshold_tokens"},
      {"rollout.sparse.top_k_blocks=-1", "rollout.sparse.top_k_blocks"},
      {"rollout.sparse.top_k_blocks=2.5", "rollout.sparse.top_k_blocks"},
      {"rollout.sparse.top_k_blocks=99999999999", "rollout.sparse.top_k_blocks"},
      {"rollout.sparse.block_size=0", "rollout.sparse.block_size"},
      {"rollout.sparse.block_size=100000", "rollout.sparse.block_size"},
      {"rollout.sparse.sink_blocks=-1", "rollout.sparse.sink_blocks"},
      {"rollout.sparse.recent_blocks=0", "rollout.sparse.recent_blocks"},
      {"rollout.sparse.top_blocks=4", "rollout.sparse.top_blocks: unknown key"},
  };
  for (const auto& [set, want] : bad) {
    const std::string err = ErrorOf({set});
    EXPECT_EQ(err.rfind(want, 0), 0u) << set << " -> " << err;
  }
}

TEST(JobSpecRolloutTest, OptionsFromTheSpec) {
  auto spec = common::ParseJobSpecYaml(kJob);
  ASSERT_TRUE(spec.ok()) << spec.status();
  rollout::RolloutOptions d = rollout::OptionsFromSpec(*spec, 9, 1 << 30);
  EXPECT_EQ(d.max_new_tokens, 8);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.9f);
  EXPECT_EQ(d.sampling.top_k, 5);
  EXPECT_EQ(d.sampling.seed, 9u);
  EXPECT_EQ(d.sampling.min_p, 0.f);
  EXPECT_EQ(d.sampling.repetition_penalty, 1.f);
  EXPECT_EQ(d.kv_cache_bytes, 0u);
  EXPECT_EQ(d.kv_dtype, kernels::KvDtype::kF32);
  EXPECT_EQ(d.block_size, 16);
  EXPECT_TRUE(d.share_prompts);
  auto set = common::ParseJobSpecYaml(
      kJob, {"rollout.kv_cache_bytes=1000000", "rollout.kv_dtype=bf16", "rollout.block_size=32",
             "rollout.max_batch_tokens=256", "rollout.max_seqs=64", "rollout.no_prompt_sharing=true",
             "rollout.min_p=0.05", "rollout.repetition_penalty=1.2"});
  ASSERT_TRUE(set.ok()) << set.status();
  rollout::RolloutOptions o = rollout::OptionsFromSpec(*set, 9, 1 << 30);
  EXPECT_EQ(o.kv_cache_bytes, 1000000u);
  EXPECT_EQ(o.kv_dtype, kernels::KvDtype::kBF16);
  EXPECT_EQ(o.block_size, 32);
  EXPECT_EQ(o.max_batch_tokens, 256);
  EXPECT_EQ(o.max_seqs, 64);
  EXPECT_FALSE(o.share_prompts);
  EXPECT_FLOAT_EQ(o.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(o.sampling.repetition_penalty, 1.2f);
  EXPECT_FALSE(d.sparse.has_value());
  EXPECT_FALSE(o.sparse.has_value());
}

// rollout.sparse: off by default; its blocks are whole KV cache blocks.
TEST(JobSpecRolloutTest, SparseAttention) {
  auto on = common::ParseJobSpecYaml(kJob, {"rollout.sparse.top_k_blocks=8"});
  ASSERT_TRUE(on.ok()) << on.status();
  rollout::RolloutOptions o = rollout::OptionsFromSpec(*on, 9, 1 << 30);
  ASSERT_TRUE(o.sparse.has_value());
  EXPECT_EQ(o.sparse->top_k_blocks, 8);
  EXPECT_EQ(o.sparse->block_size, 64);
  EXPECT_EQ(o.sparse->sink_blocks, 1);
  EXPECT_EQ(o.sparse->recent_blocks, 2);
  auto set = common::ParseJobSpecYaml(kJob, {"rollout.sparse.top_k_blocks=3", "rollout.sparse.block_size=32",
                                             "rollout.sparse.sink_blocks=0", "rollout.sparse.recent_blocks=1"});
  ASSERT_TRUE(set.ok()) << set.status();
  o = rollout::OptionsFromSpec(*set, 9, 1 << 30);
  ASSERT_TRUE(o.sparse.has_value());
  EXPECT_EQ(o.sparse->block_size, 32);
  EXPECT_EQ(o.sparse->sink_blocks, 0);
  EXPECT_EQ(o.sparse->recent_blocks, 1);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"rollout.sparse.top_k_blocks=8", "rollout.sparse.block_size=40"},
       "rollout.sparse.block_size: 40 is not a multiple of rollout.block_size = 16"},
  };
  for (const auto& [sets, want] : bad) {
    const std::string err = ErrorOf(sets);
    EXPECT_EQ(err.rfind(want, 0), 0u) << sets[0] << " -> " << err;
  }
}

// rollout.kv_cache_fraction: of the memory the worker passes; exclusive
// with rollout.kv_cache_bytes.
TEST(JobSpecRolloutTest, KvCacheFraction) {
  auto spec = common::ParseJobSpecYaml(kJob, {"rollout.kv_cache_fraction=0.25"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(rollout::OptionsFromSpec(*spec, 9, 4000000).kv_cache_bytes, 1000000u);
  // A fraction of almost nothing is still a budget (the engine then names
  // the key when a sequence cannot fit), never "no budget".
  EXPECT_EQ(rollout::OptionsFromSpec(*spec, 9, 2).kv_cache_bytes, 1u);
  const std::string both = ErrorOf({"rollout.kv_cache_fraction=0.25", "rollout.kv_cache_bytes=1000000"});
  EXPECT_EQ(both.rfind("rollout.kv_cache_fraction", 0), 0u) << both;
  EXPECT_NE(both.find("rollout.kv_cache_bytes"), std::string::npos) << both;
  EXPECT_EQ(ErrorOf({"rollout.kv_cache_fraction=0.95"}), "OK");
  EXPECT_EQ(ErrorOf({"rollout.kv_cache_fraction=0"}), "OK");
}

}  // namespace
}  // namespace tandem
