// Status propagation inside the chat-template library (which links no
// gRPC, so it does not use common/status_util.h).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CT_CONCAT_INNER_(a, b) a##b
#define CT_CONCAT_(a, b) CT_CONCAT_INNER_(a, b)

#define CT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status ct_status_ = (expr);      \
    if (!ct_status_.ok()) return ct_status_; \
  } while (0)

#define CT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

#define CT_ASSIGN_OR_RETURN(lhs, expr) \
  CT_ASSIGN_OR_RETURN_IMPL_(CT_CONCAT_(ct_statusor_, __LINE__), lhs, expr)

#include <string_view>

#include "absl/strings/string_view.h"

namespace tandem::chat_template {
// Debian's Abseil has its own string_view type: absl::StrCat needs this.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace tandem::chat_template
