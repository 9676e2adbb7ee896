// Early returns on error for functions that return absl::Status or
// absl::StatusOr<T>:
//
//   RETURN_IF_ERROR(WriteHeader(out));
//   ASSIGN_OR_RETURN(auto config, ParseConfig(text));  // declares config
//   ASSIGN_OR_RETURN(existing, Count(rows));           // assigns
//   ASSIGN_OR_RETURN((auto [first, second]), Split(s));  // parenthesise an
//                                                      // lhs with commas
//
// RETURN_IF_ERROR is one statement (safe under an unbraced if/else).
// ASSIGN_OR_RETURN expands to several statements: use it where a
// declaration may stand, never as the body of an unbraced if. Each use
// declares its own temporary (named with __COUNTER__), so uses may share a
// line and nest inside lambdas without shadowing. The expression is
// evaluated once; on success the value is moved into lhs.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_BASE_CONCAT_INNER_(a, b) a##b
#define TANDEM_BASE_CONCAT_(a, b) TANDEM_BASE_CONCAT_INNER_(a, b)

// Removes one pair of parentheses around `x`, if it has them:
// (auto [a, b]) -> auto [a, b]; auto x -> auto x.
#define TANDEM_BASE_UNPAREN_(x) TANDEM_BASE_UNPAREN_ESC_(TANDEM_BASE_UNPAREN_ISH_ x)
#define TANDEM_BASE_UNPAREN_ISH_(...) TANDEM_BASE_UNPAREN_ISH_ __VA_ARGS__
#define TANDEM_BASE_UNPAREN_ESC_(...) TANDEM_BASE_UNPAREN_ESC2_(__VA_ARGS__)
#define TANDEM_BASE_UNPAREN_ESC2_(...) TANDEM_BASE_UNPAREN_VAN##__VA_ARGS__
#define TANDEM_BASE_UNPAREN_VANTANDEM_BASE_UNPAREN_ISH_

#define TANDEM_RETURN_IF_ERROR_IMPL_(tmp, ...)                        \
  do {                                                                \
    if (::absl::Status tmp = (__VA_ARGS__); !tmp.ok()) [[unlikely]] { \
      return tmp;                                                     \
    }                                                                 \
  } while (false)

#define RETURN_IF_ERROR(...) \
  TANDEM_RETURN_IF_ERROR_IMPL_(TANDEM_BASE_CONCAT_(tandem_base_status_, __COUNTER__), __VA_ARGS__)

#define TANDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, ...) \
  auto tmp = (__VA_ARGS__);                          \
  if (!tmp.ok()) [[unlikely]] {                      \
    return std::move(tmp).status();                  \
  }                                                  \
  TANDEM_BASE_UNPAREN_(lhs) = *std::move(tmp)

#define ASSIGN_OR_RETURN(lhs, ...) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_BASE_CONCAT_(tandem_base_statusor_, __COUNTER__), lhs, __VA_ARGS__)
