// The zero.* job keys and the worker's node setting: defaults and bad input.
#include <gtest/gtest.h>

#include "common/daemon_config.h"
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

TEST(ZeroSpecTest, DefaultsAreThePlainPath) {
  auto spec = ParseJobSpecYaml(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->zero().grad_compression(), "none");
  EXPECT_TRUE(spec->zero().error_feedback());
  auto loco = ParseJobSpecYaml(std::string(kBase) + "zero: {grad_compression: int4, error_feedback: false}\n");
  ASSERT_TRUE(loco.ok()) << loco.status();
  EXPECT_EQ(loco->zero().grad_compression(), "int4");
  EXPECT_FALSE(loco->zero().error_feedback());
}

TEST(ZeroSpecTest, BadValuesSayWhatIsAllowed) {
  const std::string bad = ErrorOf({"zero.grad_compression=int3"});
  EXPECT_EQ(bad.rfind("zero.grad_compression: ", 0), 0u) << bad;
  EXPECT_NE(bad.find("int4"), std::string::npos) << bad;
  const std::string feedback = ErrorOf({"zero.error_feedback=maybe"});
  EXPECT_EQ(feedback.rfind("zero.error_feedback: ", 0), 0u) << feedback;
  const std::string unknown = ErrorOf({"zero.compression=int4"});
  EXPECT_NE(unknown.find("unknown key"), std::string::npos) << unknown;
}

TEST(ZeroSpecTest, HierarchicalPartitionAndWeightQuantization) {
  auto spec = ParseJobSpecYaml(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->zero().hierarchical_partition());
  EXPECT_EQ(spec->zero().weight_quantization(), "none");
  auto on = ParseJobSpecYaml(std::string(kBase) +
                             "cluster: {zero_stage: 3}\n"
                             "zero: {hierarchical_partition: true, weight_quantization: int8}\n");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->zero().hierarchical_partition());
  EXPECT_EQ(on->zero().weight_quantization(), "int8");
  const std::string bad = ErrorOf({"zero.weight_quantization=int4"});
  EXPECT_EQ(bad.rfind("zero.weight_quantization: ", 0), 0u) << bad;
  EXPECT_NE(bad.find("int8"), std::string::npos) << bad;
  const std::string flag = ErrorOf({"zero.hierarchical_partition=sometimes"});
  EXPECT_EQ(flag.rfind("zero.hierarchical_partition: ", 0), 0u) << flag;
}

// Across keys (ParseJobSpecYaml and ValidateJobSpec): both need ZeRO stage 3;
// both run in fp32 and bf16, on the cpu and cuda devices; hpZ stays refused
// with the layouts it does not serve.
TEST(ZeroSpecTest, HierarchicalAndInt8WeightsNeedStage3) {
  const std::string job =
      "kind: sft\nmodel:\n  config: {vocab_size: 99, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,"
      " num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, tokenizer: char,"
      " bos_token_id: 1, eos_token_id: 2, pad_token_id: 0}\ntask: {name: arithmetic}\n"
      "cluster: {workers: 4}\n";
  auto error = [&](std::vector<std::string> overrides) -> std::string {
    auto spec = ParseJobSpecYaml(job, overrides);
    if (!spec.ok()) return "parse: " + std::string(spec.status().message());
    absl::Status st = ValidateJobSpec(*spec);
    return st.ok() ? "OK" : std::string(st.message());
  };
  EXPECT_EQ(error({"cluster.zero_stage=3", "zero.hierarchical_partition=true", "zero.weight_quantization=int8"}), "OK");
  const std::string stage = error({"cluster.zero_stage=2", "zero.hierarchical_partition=true"});
  EXPECT_NE(stage.find("zero.hierarchical_partition"), std::string::npos) << stage;
  EXPECT_NE(stage.find("zero_stage: 3"), std::string::npos) << stage;
  EXPECT_EQ(error({"cluster.zero_stage=3", "zero.hierarchical_partition=true", "train.precision=bf16"}), "OK");
  EXPECT_EQ(error({"cluster.zero_stage=3", "zero.weight_quantization=int8", "train.precision=bf16"}), "OK");
  EXPECT_EQ(error({"cluster.zero_stage=3", "zero.hierarchical_partition=true", "zero.weight_quantization=int8",
                   "train.precision=bf16", "cluster.device=cuda"}),
            "OK");
  EXPECT_EQ(error({"cluster.zero_stage=3", "zero.weight_quantization=int8", "cluster.device=cuda"}), "OK");
  const std::string precision =
      error({"cluster.zero_stage=3", "zero.hierarchical_partition=true", "train.precision=fp16"});
  EXPECT_NE(precision.find("train.precision"), std::string::npos) << precision;
  const std::string tp =
      error({"cluster.zero_stage=3", "zero.hierarchical_partition=true", "train.precision=bf16", "rollout.tp_size=2"});
  EXPECT_NE(tp.find("zero.hierarchical_partition"), std::string::npos) << tp;
  EXPECT_NE(tp.find("tp_size"), std::string::npos) << tp;
  const std::string degraded = error(
      {"cluster.zero_stage=3", "zero.hierarchical_partition=true", "train.precision=bf16", "recovery.degraded=true"});
  EXPECT_NE(degraded.find("recovery.degraded"), std::string::npos) << degraded;
  const std::string int8_bf16 =
      error({"cluster.zero_stage=2", "zero.weight_quantization=int8", "train.precision=bf16"});
  EXPECT_NE(int8_bf16.find("zero_stage: 3"), std::string::npos) << int8_bf16;
  const std::string int8 = error({"cluster.zero_stage=1", "zero.weight_quantization=int8"});
  EXPECT_NE(int8.find("zero.weight_quantization"), std::string::npos) << int8;
  EXPECT_NE(int8.find("zero_stage: 3"), std::string::npos) << int8;
}

TEST(WorkerNodeTest, NodeIsAConfigKeyWithALengthLimit) {
  auto c = LoadWorkerConfig("", {"node=rack1-a"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node(), "rack1-a");
  auto empty = LoadWorkerConfig("", {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->node(), "");  // the daemon fills in the host name
  auto long_name = LoadWorkerConfig("", {"node=" + std::string(129, 'x')});
  ASSERT_FALSE(long_name.ok());
  EXPECT_NE(long_name.status().message().find("node"), std::string::npos) << long_name.status();
}

}  // namespace
}  // namespace tandem::common
