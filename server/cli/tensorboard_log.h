// The scalars of metrics.jsonl as TensorBoard event files in the run
// directory (tfevents_writer.h), so `tensorboard --logdir runs/` shows a
// run while it trains. A step's scalars are its metrics.jsonl object
// flattened: top-level numbers keep their key ("loss"), the numbers of a
// nested map are "map/key" ("phase_seconds/update"); "step" and
// "wall_time" are the event's own fields. A step reported again with more
// or changed figures (an evaluation adds accuracy) writes only the scalars
// that are new or changed, so the last value per (tag, step) is the one in
// metrics.jsonl. Not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "server/cli/tfevents_writer.h"

namespace tandem::cli {

// The scalars of one metrics.jsonl object, sorted by tag.
Scalars StepScalars(const nlohmann::json& step);

class TensorBoardLog {
 public:
  // Removes DIR's earlier event files (metrics.jsonl starts afresh too) and
  // opens a new one.
  static absl::StatusOr<std::unique_ptr<TensorBoardLog>> Create(const std::filesystem::path& dir);

  // `step`: the metrics.jsonl object of one step, merged so far.
  absl::Status Record(const nlohmann::json& step);
  const std::filesystem::path& path() const { return writer_->path(); }

 private:
  explicit TensorBoardLog(std::unique_ptr<TfEventsWriter> writer) : writer_(std::move(writer)) {}

  std::unique_ptr<TfEventsWriter> writer_;
  std::map<int64_t, std::map<std::string, double>> written_;  // by step, by tag
};

}  // namespace tandem::cli
