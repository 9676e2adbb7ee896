// Logging setup for every Tandem program: spdlog's default logger writes to
// stderr (and optionally a file). Call once from main before other threads
// start. Tokens and other secrets are never passed to the logger.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace tandem::common {

// level: trace | debug | info | warn | error | off. file: "" for stderr only.
absl::Status SetupLogging(const std::string& program, const std::string& level,
                          const std::string& file = "");

}  // namespace tandem::common
