#include "server/cli/tensorboard_log.h"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::cli {
namespace fs = std::filesystem;

Scalars StepScalars(const nlohmann::json& step) {
  Scalars out;
  if (!step.is_object()) return out;
  for (const auto& [key, value] : step.items()) {
    if (key == "step" || key == "wall_time") continue;
    if (value.is_number()) {
      out.emplace_back(key, value.get<double>());
    } else if (value.is_object()) {
      for (const auto& [sub, v] : value.items()) {
        if (v.is_number()) out.emplace_back(absl::StrCat(key, "/", sub), v.get<double>());
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::unique_ptr<TensorBoardLog>> TensorBoardLog::Create(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && absl::StartsWith(entry.path().filename().string(), "events.out.tfevents.")) {
      fs::remove(entry.path(), ec);
    }
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSIGN_OR_RETURN(auto writer, TfEventsWriter::Create(dir, now));
  return std::unique_ptr<TensorBoardLog>(new TensorBoardLog(std::move(writer)));
}

absl::Status TensorBoardLog::Record(const nlohmann::json& step) {
  if (!step.is_object() || !step.contains("step") || !step["step"].is_number_integer()) {
    return absl::InvalidArgumentError("a metrics.jsonl object without an integer step");
  }
  const int64_t n = step["step"].get<int64_t>();
  double wall_time = 0;
  if (step.contains("wall_time") && step["wall_time"].is_number()) wall_time = step["wall_time"].get<double>();
  if (wall_time <= 0) {
    wall_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  auto& written = written_[n];
  Scalars fresh;
  for (const auto& [tag, value] : StepScalars(step)) {
    auto it = written.find(tag);
    if (it != written.end() && it->second == value) continue;
    written[tag] = value;
    fresh.emplace_back(tag, value);
  }
  return writer_->Write(wall_time, n, fresh);
}

}  // namespace tandem::cli
