// Invariant checks: TANDEM_CHECK(cond) and TANDEM_CHECK_OK(status) write
// "file:line: check failed: <condition>" (and the status) to stderr and
// abort the process when the invariant does not hold.
//
// For the program's own invariants only (a broken one is a bug in Tandem):
// input from users, files, peers or devices is checked and reported as an
// absl::Status, never with these. Always on, in every build type; the
// condition is evaluated exactly once.
//
//   TANDEM_CHECK(rows <= capacity_);
//   TANDEM_CHECK_OK(store.Put(key, value));  // absl::Status or StatusOr<T>
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::base::internal {

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition);
[[noreturn]] void CheckOkFailed(const char* file, int line, const char* expression, const absl::Status& status);

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace tandem::base::internal

#define TANDEM_CHECK(cond)                                              \
  do {                                                                  \
    if (!(cond)) [[unlikely]] {                                         \
      ::tandem::base::internal::CheckFailed(__FILE__, __LINE__, #cond); \
    }                                                                   \
  } while (false)

#define TANDEM_CHECK_OK_IMPL_(tmp, expr)                                                                           \
  do {                                                                                                             \
    if (const auto& tmp = (expr); !tmp.ok()) [[unlikely]] {                                                        \
      ::tandem::base::internal::CheckOkFailed(__FILE__, __LINE__, #expr, ::tandem::base::internal::StatusOf(tmp)); \
    }                                                                                                              \
  } while (false)

#define TANDEM_CHECK_CONCAT_INNER_(a, b) a##b
#define TANDEM_CHECK_CONCAT_(a, b) TANDEM_CHECK_CONCAT_INNER_(a, b)
#define TANDEM_CHECK_OK(expr) TANDEM_CHECK_OK_IMPL_(TANDEM_CHECK_CONCAT_(tandem_base_check_, __COUNTER__), expr)
