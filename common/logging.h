// Logging setup for every Tandem program: spdlog's default logger writes to
// stderr (and optionally a file). Call once from main before other threads
// start. Tokens and other secrets are never passed to the logger.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace tandem::common {

// level: trace | debug | info | warn | error | off. file: "" for stderr
// only; else also FILE, rotated when it reaches max_file_bytes (FILE.1 ..
// FILE.<max_files> keep the older ones).
inline constexpr size_t kDefaultLogFileBytes = 64 << 20;
inline constexpr size_t kDefaultLogFiles = 5;
absl::Status SetupLogging(const std::string& program, const std::string& level, const std::string& file = "",
                          size_t max_file_bytes = kDefaultLogFileBytes, size_t max_files = kDefaultLogFiles);

}  // namespace tandem::common
