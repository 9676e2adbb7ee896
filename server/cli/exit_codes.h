// tandemctl exit codes, the contract scripts rely on (docs/operations.md):
//   0 ok / job SUCCEEDED        1 job FAILED or a runtime error
//   2 usage or invalid input    3 job CANCELLED (or run --local interrupted)
//   4 cannot reach the coordinator          5 authentication / permission
// ExitCodeFor maps an RPC status to one of them.
#pragma once

#include <grpcpp/support/status.h>

namespace tandem::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailed = 1,
  kExitUsage = 2,
  kExitCancelled = 3,
  kExitUnreachable = 4,
  kExitAuth = 5,
};

inline int ExitCodeFor(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnreachable;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return kExitAuth;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

}  // namespace tandem::cli
