// Typed phase failures (common/phase_failure.h): what a worker reports for a
// failed phase's status, and how the coordinator reads a report.
#include "common/phase_failure.h"

#include <gtest/gtest.h>

namespace tandem::common {
namespace {

TEST(PhaseFailureTest, CodesOfTheClusterAreRetryable) {
  EXPECT_EQ(FailureKindOf(absl::AbortedError("job aborted on this worker")), v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_EQ(FailureKindOf(absl::UnavailableError("x")), v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_EQ(FailureKindOf(absl::DeadlineExceededError("x")), v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_EQ(FailureKindOf(absl::CancelledError("x")), v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_EQ(FailureKindOf(absl::ResourceExhaustedError("x")), v1::PHASE_FAILURE_KIND_OUT_OF_MEMORY);
  EXPECT_EQ(FailureKindOf(absl::InvalidArgumentError("x")), v1::PHASE_FAILURE_KIND_BAD_INPUT);
  EXPECT_EQ(FailureKindOf(absl::NotFoundError("x")), v1::PHASE_FAILURE_KIND_BAD_INPUT);
  EXPECT_EQ(FailureKindOf(absl::InternalError("x")), v1::PHASE_FAILURE_KIND_FATAL);
  EXPECT_EQ(FailureKindOf(absl::OkStatus()), v1::PHASE_FAILURE_KIND_UNSPECIFIED);
}

TEST(PhaseFailureTest, MessageWordsDoNotDecideTheKind) {
  EXPECT_EQ(FailureKindOf(absl::InternalError("gloo: collective timed out, connection reset by peer")),
            v1::PHASE_FAILURE_KIND_FATAL);
  EXPECT_EQ(FailureKindOf(absl::UnavailableError("restore from /x: disk gone")), v1::PHASE_FAILURE_KIND_RETRYABLE);
}

TEST(PhaseFailureTest, AnAttachedKindWinsOverTheCodeAndKeepsTheMessage) {
  const absl::Status s =
      WithFailureKind(absl::DataLossError("restore from /x: checksum mismatch"), v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "restore from /x: checksum mismatch");
  EXPECT_EQ(FailureKindOf(s), v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
  EXPECT_EQ(FailureKindOf(WithFailureKind(absl::FailedPreconditionError("communicator broken"),
                                          v1::PHASE_FAILURE_KIND_RETRYABLE)),
            v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_TRUE(WithFailureKind(absl::OkStatus(), v1::PHASE_FAILURE_KIND_FATAL).ok());
}

TEST(PhaseFailureTest, ToPhaseFailureCarriesKindCodeAndMessage) {
  const v1::PhaseFailure f = ToPhaseFailure(absl::DeadlineExceededError("collective timed out after 60 s"), 9);
  EXPECT_EQ(f.kind(), v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_EQ(f.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(f.message(), "collectiv");
  EXPECT_EQ(FailureKindName(v1::PHASE_FAILURE_KIND_RESTORE_FAILED), "restore failed");
}

TEST(PhaseFailureTest, ReportKindFallsBackToTheRetryableFlag) {
  v1::ReportPhaseRequest r;
  r.set_ok(true);
  r.set_retryable(true);
  EXPECT_EQ(ReportFailureKind(r), v1::PHASE_FAILURE_KIND_UNSPECIFIED);
  r.set_ok(false);
  EXPECT_EQ(ReportFailureKind(r), v1::PHASE_FAILURE_KIND_RETRYABLE);
  r.set_retryable(false);
  EXPECT_EQ(ReportFailureKind(r), v1::PHASE_FAILURE_KIND_FATAL);
  r.mutable_failure()->set_kind(v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
  EXPECT_EQ(ReportFailureKind(r), v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
}

}  // namespace
}  // namespace tandem::common
