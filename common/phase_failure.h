// Typed phase failures: a failed phase's absl::Status becomes the report's
// PhaseFailure { kind, code, message }, and the coordinator acts on the kind
// alone. Code that knows why it failed attaches the kind to its status
// (WithFailureKind, a status payload; the message is unchanged); any other
// status is classified by its canonical code. Pure functions.
#pragma once

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::common {

// `status` with `kind` attached (an OK status stays OK).
absl::Status WithFailureKind(absl::Status status, tandem::v1::PhaseFailureKind kind);

// `status` with its message prefixed by `prefix`; code and payloads (the
// attached kind) kept.
absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix);

// The attached kind, else by code: ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED
// and CANCELLED are the cluster's (RETRYABLE); INVALID_ARGUMENT and
// NOT_FOUND are the job's input (BAD_INPUT); anything else is FATAL.
// UNSPECIFIED for an OK status.
tandem::v1::PhaseFailureKind FailureKindOf(const absl::Status& status);

// The report form of a non-OK status; the message is cut to max_message_chars.
tandem::v1::PhaseFailure ToPhaseFailure(const absl::Status& status, size_t max_message_chars = 64 * 1024);

// A report's failure kind: UNSPECIFIED when it succeeded, else failure.kind,
// else (a worker that sends no kind) RETRYABLE or FATAL by its `retryable`.
tandem::v1::PhaseFailureKind ReportFailureKind(const tandem::v1::ReportPhaseRequest& report);

// "retryable", "restore failed", ... (messages and logs).
std::string FailureKindName(tandem::v1::PhaseFailureKind kind);

}  // namespace tandem::common
