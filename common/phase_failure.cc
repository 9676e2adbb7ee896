#include "common/phase_failure.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::common {

namespace {

constexpr char kKindPayload[] = "type.tandem.dev/tandem.v1.PhaseFailureKind";

}  // namespace

absl::Status WithFailureKind(absl::Status status, tandem::v1::PhaseFailureKind kind) {
  if (!status.ok()) status.SetPayload(kKindPayload, absl::Cord(std::to_string(static_cast<int>(kind))));
  return status;
}

absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&out](absl::string_view type_url, const absl::Cord& payload) { out.SetPayload(type_url, payload); });
  return out;
}

tandem::v1::PhaseFailureKind FailureKindOf(const absl::Status& status) {
  if (status.ok()) return tandem::v1::PHASE_FAILURE_KIND_UNSPECIFIED;
  if (auto payload = status.GetPayload(kKindPayload)) {
    int kind = 0;
    if (absl::SimpleAtoi(std::string(*payload), &kind) && tandem::v1::PhaseFailureKind_IsValid(kind) &&
        kind != tandem::v1::PHASE_FAILURE_KIND_UNSPECIFIED) {
      return static_cast<tandem::v1::PhaseFailureKind>(kind);
    }
  }
  switch (status.code()) {
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return tandem::v1::PHASE_FAILURE_KIND_RETRYABLE;
    case absl::StatusCode::kResourceExhausted:
      return tandem::v1::PHASE_FAILURE_KIND_OUT_OF_MEMORY;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return tandem::v1::PHASE_FAILURE_KIND_BAD_INPUT;
    default:
      return tandem::v1::PHASE_FAILURE_KIND_FATAL;
  }
}

tandem::v1::PhaseFailure ToPhaseFailure(const absl::Status& status, size_t max_message_chars) {
  tandem::v1::PhaseFailure failure;
  if (status.ok()) return failure;
  failure.set_kind(FailureKindOf(status));
  failure.set_code(static_cast<int>(status.code()));
  failure.set_message(std::string(status.message().substr(0, max_message_chars)));
  return failure;
}

tandem::v1::PhaseFailureKind ReportFailureKind(const tandem::v1::ReportPhaseRequest& report) {
  if (report.ok()) return tandem::v1::PHASE_FAILURE_KIND_UNSPECIFIED;
  if (report.failure().kind() != tandem::v1::PHASE_FAILURE_KIND_UNSPECIFIED) return report.failure().kind();
  return report.retryable() ? tandem::v1::PHASE_FAILURE_KIND_RETRYABLE : tandem::v1::PHASE_FAILURE_KIND_FATAL;
}

std::string FailureKindName(tandem::v1::PhaseFailureKind kind) {
  std::string name = tandem::v1::PhaseFailureKind_Name(kind);
  if (name.rfind("PHASE_FAILURE_KIND_", 0) == 0) name = name.substr(19);
  for (char& c : name) c = c == '_' ? ' ' : absl::ascii_tolower(c);
  return name;
}

}  // namespace tandem::common
