// Status helpers: propagation macros for absl::Status / absl::StatusOr and
// the one conversion between absl::Status and grpc::Status used at RPC
// boundaries (the canonical codes are the same numbers).
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"

namespace tandem::common {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes the message of a non-OK status with `context: ` (a breadcrumb).
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace tandem::common

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

#ifndef RETURN_IF_ERROR
#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    ::absl::Status tandem_status_ = (expr);                    \
    if (!tandem_status_.ok()) return tandem_status_;           \
  } while (0)
#endif

#define TANDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#ifndef ASSIGN_OR_RETURN
#define ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(    \
      TANDEM_STATUS_CONCAT_(tandem_statusor_, __LINE__), lhs, expr)
#endif
