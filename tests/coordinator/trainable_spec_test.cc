// The train.trainable job key: default, patterns checked against an inline
// model's tensor names at submit, bad input.
#include <gtest/gtest.h>

#include "common/job_spec.h"

namespace tandem::common {
namespace {

constexpr char kInline[] =
    "kind: sft\n"
    "model: {config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,\n"
    "                 num_attention_heads: 4}}\n"
    "task: {name: sort}\n";
constexpr char kFrom[] = "kind: sft\nmodel: {from: /m}\ntask: {name: sort}\n";

std::string ErrorOf(const char* base, std::vector<std::string> overrides) {
  auto spec = ParseJobSpecYaml(base, overrides);
  if (spec.ok()) return "OK";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

TEST(TrainableSpecTest, DefaultIsEveryParameter) {
  auto spec = ParseJobSpecYaml(kInline);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().trainable_size(), 0);
}

TEST(TrainableSpecTest, PatternsMatchingTensorsAreKept) {
  auto spec = ParseJobSpecYaml(kInline, {"train.trainable=[\"model.layers.*.mlp.*\", model.norm.weight]"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->train().trainable_size(), 2);
  EXPECT_EQ(spec->train().trainable(0), "model.layers.*.mlp.*");
  EXPECT_EQ(ErrorOf(kInline, {"train.trainable=[\"model.layers.[01].self_attn.?_proj.weight\"]"}), "OK");
}

TEST(TrainableSpecTest, PatternThatMatchesNothingIsNamed) {
  const std::string e = ErrorOf(kInline, {"train.trainable=[\"model.layers.*.mlp.*\", \"model.layers.7.*\"]"});
  EXPECT_EQ(e.rfind("train.trainable: ", 0), 0u) << e;
  EXPECT_NE(e.find("\"model.layers.7.*\""), std::string::npos) << e;
  EXPECT_NE(e.find("matches no parameter"), std::string::npos) << e;
  // With model.from the worker checks the names at SETUP.
  EXPECT_EQ(ErrorOf(kFrom, {"train.trainable=[\"model.layers.7.*\"]"}), "OK");
}

TEST(TrainableSpecTest, BadInputIsRefused) {
  const std::string empty = ErrorOf(kInline, {"train.trainable=[]"});
  EXPECT_EQ(empty.rfind("train.trainable: ", 0), 0u) << empty;
  EXPECT_NE(empty.find("empty list"), std::string::npos) << empty;
  EXPECT_NE(ErrorOf(kInline, {"train.trainable=[\"\"]"}).find("empty pattern"), std::string::npos);
  EXPECT_NE(ErrorOf(kInline, {"train.trainable=model.norm.weight"}).find("a list"), std::string::npos);
  EXPECT_NE(ErrorOf(kInline, {"train.trainable=[{a: 1}]"}).find("train.trainable"), std::string::npos);
}

}  // namespace
}  // namespace tandem::common
