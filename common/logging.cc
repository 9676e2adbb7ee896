#include "common/logging.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/rotating_file_sink.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace tandem::common {

absl::Status SetupLogging(const std::string& program, const std::string& level, const std::string& file,
                          size_t max_file_bytes, size_t max_files) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(level.empty() ? "info" : level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("log level '", level, "': allowed: trace, debug, info, warn, error, off"));
  }
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (!file.empty()) {
    try {
      // Rotated by size: FILE, FILE.1 ... FILE.N (oldest dropped).
      sinks.push_back(std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
          file, std::max<size_t>(max_file_bytes, 4096), std::max<size_t>(max_files, 1)));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("log file '", file, "': ", e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(program, sinks.begin(), sinks.end());
  logger->set_level(lvl);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n %t] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace tandem::common
