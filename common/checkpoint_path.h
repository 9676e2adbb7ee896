// Where a job's checkpoint of a step lives: <root>/step-<8 digits>. The
// worker writes there (worker/ckpt) and the coordinator accepts a reported
// checkpoint only at exactly that path, so a report cannot point recovery
// anywhere else.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace tandem::common {

inline std::string CheckpointStepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// The normalized path of step's checkpoint under root.
inline std::string CheckpointStepPath(const std::string& root, int64_t step) {
  return (std::filesystem::path(root) / CheckpointStepDirName(step)).lexically_normal().string();
}

// True when `path` is exactly step's checkpoint directory under root.
inline bool IsCheckpointStepPath(const std::string& path, const std::string& root, int64_t step) {
  if (step <= 0 || root.empty()) return false;
  std::string p = std::filesystem::path(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p == CheckpointStepPath(root, step);
}

}  // namespace tandem::common
