#include "common/base/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace {

absl::StatusOr<int> Half(int n) {
  if (n % 2 != 0) return absl::InvalidArgumentError("odd");
  return n / 2;
}

absl::Status Check(int n) { return n < 0 ? absl::OutOfRangeError("negative") : absl::OkStatus(); }

absl::Status CheckBoth(int a, int b, int* reached) {
  RETURN_IF_ERROR(Check(a));
  *reached = 1;
  RETURN_IF_ERROR(Check(b));
  *reached = 2;
  return absl::OkStatus();
}

TEST(ReturnIfError, ReturnsTheFirstErrorAndStops) {
  int reached = 0;
  EXPECT_TRUE(CheckBoth(1, 2, &reached).ok());
  EXPECT_EQ(reached, 2);
  reached = 0;
  EXPECT_EQ(CheckBoth(-1, 2, &reached), absl::OutOfRangeError("negative"));
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(CheckBoth(1, -2, &reached), absl::OutOfRangeError("negative"));
  EXPECT_EQ(reached, 1);
}

absl::StatusOr<std::string> Describe(int n) {
  RETURN_IF_ERROR(Check(n));  // a Status into a StatusOr
  return std::to_string(n);
}

TEST(ReturnIfError, WorksInFunctionsReturningStatusOr) {
  EXPECT_EQ(*Describe(3), "3");
  EXPECT_EQ(Describe(-3).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ReturnIfError, IsOneStatementUnderAnUnbracedIfElse) {
  auto f = [](bool first, int n) -> absl::Status {
    if (first) RETURN_IF_ERROR(Check(n));
    else return absl::CancelledError("else branch");
    return absl::OkStatus();
  };
  EXPECT_TRUE(f(true, 1).ok());
  EXPECT_EQ(f(true, -1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f(false, 1).code(), absl::StatusCode::kCancelled);
}

TEST(ReturnIfError, EvaluatesTheExpressionOnce) {
  int calls = 0;
  auto f = [&]() -> absl::Status {
    RETURN_IF_ERROR([&] {
      ++calls;
      return Check(-1);
    }());
    return absl::OkStatus();
  };
  EXPECT_FALSE(f().ok());
  EXPECT_EQ(calls, 1);
}

TEST(ReturnIfError, NestsInsideItsOwnExpression) {
  // Compiled with -Wshadow: each use has its own temporary.
  auto f = [](int n) -> absl::Status {
    RETURN_IF_ERROR([n]() -> absl::Status {
      RETURN_IF_ERROR(Check(n));
      return Check(n - 10);
    }());
    return absl::OkStatus();
  };
  EXPECT_TRUE(f(10).ok());
  EXPECT_EQ(f(-1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f(5).code(), absl::StatusCode::kOutOfRange);
}

absl::StatusOr<int> Quarter(int n) {
  ASSIGN_OR_RETURN(auto half, Half(n));  // declares
  int quarter = -1;
  ASSIGN_OR_RETURN(quarter, Half(half));  // assigns an existing variable
  return quarter;
}

TEST(AssignOrReturn, DeclaresOrAssignsAndReturnsErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(7).status(), absl::InvalidArgumentError("odd"));
  EXPECT_EQ(Quarter(6).status(), absl::InvalidArgumentError("odd"));
}

absl::Status TwoOnOneLine(int a, int b, int* sum) {
  // Two uses on one line need two temporaries.
  ASSIGN_OR_RETURN(int x, Half(a));
  ASSIGN_OR_RETURN(int y, Half(b));
  *sum = x + y;
  return absl::OkStatus();
}

TEST(AssignOrReturn, UsesOnOneLineDoNotCollide) {
  int sum = 0;
  EXPECT_TRUE(TwoOnOneLine(4, 6, &sum).ok());
  EXPECT_EQ(sum, 5);
  EXPECT_FALSE(TwoOnOneLine(4, 5, &sum).ok());
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int n) {
  if (n < 0) return absl::InvalidArgumentError("negative");
  return std::make_unique<int>(n);
}

absl::StatusOr<int> Unbox(int n) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(n));  // move-only value
  return *box;
}

TEST(AssignOrReturn, MovesMoveOnlyValues) {
  EXPECT_EQ(*Unbox(4), 4);
  EXPECT_FALSE(Unbox(-4).ok());
}

absl::StatusOr<std::pair<int, int>> Split(int n) {
  RETURN_IF_ERROR(Check(n));
  return std::pair<int, int>(n / 10, n % 10);
}

absl::StatusOr<int> SumOfDigits(int n) {
  ASSIGN_OR_RETURN((auto [tens, ones]), Split(n));  // a parenthesised lhs
  ASSIGN_OR_RETURN((std::pair<int, int> again), Split(n));
  return tens + ones + again.first - again.first;
}

TEST(AssignOrReturn, TakesAParenthesisedLhsWithCommas) {
  EXPECT_EQ(*SumOfDigits(47), 11);
  EXPECT_EQ(SumOfDigits(-1).status().code(), absl::StatusCode::kOutOfRange);
}

template <typename A, typename B>
absl::StatusOr<int> Width(int n) {
  return static_cast<int>(sizeof(A) + sizeof(B)) + n;
}

absl::StatusOr<int> TemplateCall() {
  ASSIGN_OR_RETURN(int w, Width<int, char>(1));  // a comma outside parentheses
  return w;
}

TEST(AssignOrReturn, TakesAnExpressionWithTopLevelCommas) {
  EXPECT_EQ(*TemplateCall(), static_cast<int>(sizeof(int) + sizeof(char)) + 1);
}

}  // namespace
