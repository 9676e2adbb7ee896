// What `tandemctl run --local` reports about its run: DIR/events.jsonl with
// its progress lines (RunEvents), the TensorBoard event files
// (TensorBoardScalars), the per-step figures of DIR/metrics.jsonl and the
// final summary (DIR/summary.json and the text on stdout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "server/cli/job_follow.h"
#include "server/cli/tensorboard_log.h"
#include "server/cli/worker_supervisor.h"
#include "tandem/v1/control.pb.h"

namespace tandem::cli {

// DIR/events.jsonl: one JSON object per line - the supervisor's exits and
// restarts (source "tandemctl") and the job's state, worker and recovery
// events (source "coordinator") - each also shown as a progress line (on
// stderr with --output json). Thread safe: the supervisor thread and the
// main thread both report.
class RunEvents {
 public:
  RunEvents(const std::filesystem::path& file, ProgressPrinter* progress, bool json)
      : out_(file, std::ios::trunc), progress_(progress), json_(json) {}

  void Supervisor(const SupervisorEvent& e);
  void Job(const tandem::v1::JobEvent& ev);

 private:
  // `always`: shown on stderr with --output json too.
  void Write(const nlohmann::json& j, const std::string& line, bool always);

  absl::Mutex mu_;
  std::ofstream out_ ABSL_GUARDED_BY(mu_);
  ProgressPrinter* const progress_;
  const bool json_;
};

// The run's TensorBoard event files (tensorboard_log.h); a file that cannot
// be written costs the TensorBoard view, never the run: one warning.
class TensorBoardScalars {
 public:
  explicit TensorBoardScalars(const std::filesystem::path& dir);
  void Record(const nlohmann::json& step);

 private:
  static void Warn(const absl::Status& st);
  std::unique_ptr<TensorBoardLog> log_;
};

// Merges a later report of the same step into an earlier one (EVAL adds accuracy).
void MergeStep(tandem::v1::StepMetrics* into, const tandem::v1::StepMetrics& from);

// One line of metrics.jsonl (int64 fields as numbers).
nlohmann::json StepJson(const tandem::v1::StepMetrics& m);

// Writes DIR/summary.json and prints the summary: one JSON line on stdout
// with `json_output`, else a few lines of text.
void PrintSummary(const tandem::v1::Job& job, const std::map<int64_t, tandem::v1::StepMetrics>& steps,
                  const std::filesystem::path& dir, double wall_seconds, const std::vector<SupervisorEvent>& restarts,
                  const std::vector<SupervisorEvent>& down, bool json_output);

}  // namespace tandem::cli
