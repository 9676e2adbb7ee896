// The train.zenflow.* job keys: defaults, ranges and the combinations
// ZenFlow refuses, each with an error naming the key.
#include <gtest/gtest.h>

#include "common/job_spec.h"

namespace tandem::common {
namespace {

constexpr char kBase[] = "kind: sft\nmodel: {from: /m}\ntask: {name: sort}\n";

std::string ErrorOf(std::vector<std::string> overrides) {
  auto spec = ParseJobSpecYaml(kBase, overrides);
  if (spec.ok()) return "OK";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

void ExpectError(std::vector<std::string> overrides, const std::string& key, const std::string& words) {
  const std::string e = ErrorOf(overrides);
  EXPECT_EQ(e.rfind(key + ": ", 0), 0u) << e;
  EXPECT_NE(e.find(words), std::string::npos) << e;
}

TEST(ZenFlowSpecTest, DefaultsAreOff) {
  auto spec = ParseJobSpecYaml(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().zenflow().topk_fraction(), 0);
  EXPECT_EQ(spec->train().zenflow().update_interval(), 4);
  EXPECT_EQ(spec->train().zenflow().select_interval(), 8);
  EXPECT_EQ(spec->train().zenflow().full_warm_up_steps(), 0);
  auto on = ParseJobSpecYaml(std::string(kBase) +
                             "train: {zenflow: {topk_fraction: 0.1, update_interval: 2, select_interval: 6}}\n"
                             "cluster: {zero_stage: 2, workers: 2}\n");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_DOUBLE_EQ(on->train().zenflow().topk_fraction(), 0.1);
  EXPECT_EQ(on->train().zenflow().update_interval(), 2);
  EXPECT_EQ(on->train().zenflow().select_interval(), 6);
  EXPECT_EQ(ErrorOf({"train.zenflow.topk_fraction=1"}), "OK");
}

TEST(ZenFlowSpecTest, BadValues) {
  ExpectError({"train.zenflow.topk_fraction=1.5"}, "train.zenflow.topk_fraction", "1");
  ExpectError({"train.zenflow.topk_fraction=-0.1"}, "train.zenflow.topk_fraction", "0");
  ExpectError({"train.zenflow.topk_fraction=lots"}, "train.zenflow.topk_fraction", "");
  ExpectError({"train.zenflow.update_interval=-1"}, "train.zenflow.update_interval", "1");
  ExpectError({"train.zenflow.select_interval=-2"}, "train.zenflow.select_interval", "1");
  ExpectError({"train.zenflow.topk_fraction=0.1", "train.zenflow.update_interval=4", "train.zenflow.select_interval=6"},
              "train.zenflow.select_interval", "not a multiple of train.zenflow.update_interval");
  ExpectError({"train.zenflow.full_warm_up_steps=-4"}, "train.zenflow.full_warm_up_steps", "0");
  ExpectError({"train.zenflow.full_warm_up_steps=1e12"}, "train.zenflow.full_warm_up_steps", "");
  ExpectError({"train.zenflow.topk_fraction=0.1", "train.zenflow.full_warm_up_steps=6"},
              "train.zenflow.full_warm_up_steps", "not a multiple of train.zenflow.update_interval");
  EXPECT_EQ(ErrorOf({"train.zenflow.topk_fraction=0.1", "train.zenflow.full_warm_up_steps=100"}), "OK");
  const std::string unknown = ErrorOf({"train.zenflow.topk=0.1"});
  EXPECT_NE(unknown.find("unknown key"), std::string::npos) << unknown;
}

TEST(ZenFlowSpecTest, RefusedCombinations) {
  const std::string on = "train.zenflow.topk_fraction=0.1";
  const std::string key = "train.zenflow.topk_fraction";
  ExpectError({on, "cluster.zero_stage=3"}, key, "cluster.zero_stage 0-2");
  ExpectError({on, "train.precision=bf16"}, key, "fp32");
  ExpectError({on, "train.accumulation=layer_major"}, key, "layer_major");
  ExpectError({on, "zero.grad_compression=int4"}, key, "grad_compression");
  ExpectError({on, "cluster.shard_by_speed=true"}, "cluster.shard_by_speed", "train.zenflow");
  // Off, the same combinations are fine.
  EXPECT_EQ(ErrorOf({"cluster.zero_stage=3"}), "OK");
  EXPECT_EQ(ErrorOf({"train.precision=bf16"}), "OK");
}

}  // namespace
}  // namespace tandem::common
