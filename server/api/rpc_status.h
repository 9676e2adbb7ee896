// The RPC boundary's one status idiom: a handler returns the first non-OK
// absl::Status of `expr` as a grpc::Status (same canonical code, same
// message). Only for functions that return grpc::Status.
#pragma once

#include "absl/status/status.h"
#include "common/status_util.h"

#define TANDEM_RPC_CHECK(expr)                                                               \
  do {                                                                                       \
    ::absl::Status tandem_rpc_status_ = (expr);                                              \
    if (!tandem_rpc_status_.ok()) return ::tandem::common::ToGrpcStatus(tandem_rpc_status_); \
  } while (0)
