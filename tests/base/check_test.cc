#include "common/base/check.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace {

TEST(Check, PassingChecksDoNothingAndEvaluateOnce) {
  int calls = 0;
  TANDEM_CHECK(++calls == 1);
  TANDEM_CHECK_OK([&] {
    ++calls;
    return absl::OkStatus();
  }());
  TANDEM_CHECK_OK(absl::StatusOr<int>(3));
  EXPECT_EQ(calls, 2);
}

TEST(CheckDeathTest, FailingCheckNamesFileLineAndCondition) {
  const int rows = 3, capacity = 2;
  EXPECT_DEATH(TANDEM_CHECK(rows <= capacity), "check_test\\.cc:[0-9]+: check failed: rows <= capacity");
}

TEST(CheckDeathTest, FailingCheckOkNamesTheStatus) {
  EXPECT_DEATH(TANDEM_CHECK_OK(absl::DataLossError("torn page")),
               "check_test\\.cc:[0-9]+: check failed: .*DataLossError.* is OK: "
               "DATA_LOSS: torn page");
  EXPECT_DEATH(TANDEM_CHECK_OK(absl::StatusOr<int>(absl::NotFoundError("no key"))),
               "check failed: .* is OK: NOT_FOUND: no key");
}

TEST(Check, IsOneStatementUnderAnUnbracedIfElse) {
  int branch = 0;
  if (branch == 0) TANDEM_CHECK(branch == 0);
  else branch = 2;
  EXPECT_EQ(branch, 0);
}

}  // namespace
