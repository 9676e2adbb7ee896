// Status propagation inside the tokenizer library (which stays free of the
// gRPC-dependent common/status_util.h).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TOK_CONCAT_INNER_(a, b) a##b
#define TOK_CONCAT_(a, b) TOK_CONCAT_INNER_(a, b)

#define TOK_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    ::absl::Status tok_status_ = (expr);           \
    if (!tok_status_.ok()) return tok_status_;     \
  } while (0)

#define TOK_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

#define TOK_ASSIGN_OR_RETURN(lhs, expr) \
  TOK_ASSIGN_OR_RETURN_IMPL_(TOK_CONCAT_(tok_statusor_, __LINE__), lhs, expr)
