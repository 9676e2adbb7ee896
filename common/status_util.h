// Status helpers: the propagation macros of common/base/status_macros.h and
// the one conversion between absl::Status and grpc::Status used at RPC
// boundaries (the canonical codes are the same numbers).
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"

namespace tandem::common {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes the message of a non-OK status with `context: ` (a breadcrumb).
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace tandem::common
