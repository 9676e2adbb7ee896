// Field checks for RPC requests: every error is INVALID_ARGUMENT naming the
// field path ("spec.train.steps: ...", "key: too long ..."). Pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::server {

inline constexpr size_t kMaxIdBytes = 128;

// Ids and names: 1..128 of [A-Za-z0-9._-/:].
inline absl::Status CheckId(const std::string& field, const std::string& value, bool required = true) {
  if (value.empty()) {
    return required ? absl::InvalidArgumentError(absl::StrCat(field, ": required")) : absl::OkStatus();
  }
  if (value.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": too long (", value.size(), " bytes; at most ", kMaxIdBytes, ")"));
  }
  for (char c : value) {
    if (!(absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/' || c == ':')) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": invalid character (allowed: A-Z a-z 0-9 . _ - / :)"));
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckText(const std::string& field, const std::string& value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": too long (", value.size(), " bytes; at most ", max_bytes, ")"));
  }
  return absl::OkStatus();
}

// A one-line text field (host names, addresses, versions, reasons): besides
// the length, no control characters but tab, so a value cannot forge log
// lines or break `tandemctl` tables.
inline absl::Status CheckLine(const std::string& field, const std::string& value, size_t max_bytes) {
  RETURN_IF_ERROR(CheckText(field, value, max_bytes));
  for (unsigned char c : value) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": control character 0x", absl::Hex(c, absl::kZeroPad2),
                                                     " is not allowed (one line of text)"));
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckRange(const std::string& field, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be in [", min, ", ", max, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace tandem::server
