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
