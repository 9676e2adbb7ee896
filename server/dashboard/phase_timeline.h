// PhaseTimeline: what each worker ran and when, for the dashboard's phase
// timeline. Fed from the Cluster service: a span opens when a phase command
// is written to a worker's stream and closes when the worker's report
// arrives (start = max(sent, received - reported seconds)); a new command
// to the same worker closes its open span as not ok, and an abort sent to
// any worker closes every open span of the job (a lost worker's too); a
// command sent again (same id) keeps its one span. Times are
// the coordinator's wall clock, so spans of different workers line up.
// Also keeps each worker's last reported memory in use (heartbeats).
// Bounded: at most spans_per_job spans per job (oldest dropped) and
// max_jobs jobs (the least recently active dropped), in memory only.
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/clock.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::server {

struct PhaseSpan {
  std::string worker_id;
  std::string command_id;
  tandem::v1::Phase phase = tandem::v1::PHASE_UNSPECIFIED;
  int64_t step = 0;
  int64_t generation = 0;
  double start = 0;  // unix seconds
  double end = 0;    // 0 while running
  bool ok = true;    // false: the phase failed or was abandoned
  int64_t peak_memory_bytes = 0;
};

class PhaseTimeline {
 public:
  explicit PhaseTimeline(const Clock* clock, size_t spans_per_job = 4096, size_t max_jobs = 32);

  // A command was written to worker_id's stream.
  void CommandSent(const std::string& worker_id, const tandem::v1::WorkerCommand& command);
  // The job manager accepted a report from one of the job's workers.
  void ReportReceived(const tandem::v1::ReportPhaseRequest& report);
  void MemoryReported(const std::string& worker_id, int64_t bytes_in_use);

  // Spans of job_id that end at or after `since` (open ones included), oldest first.
  std::vector<PhaseSpan> Spans(const std::string& job_id, double since) const;
  std::optional<int64_t> MemoryInUse(const std::string& worker_id) const;

 private:
  struct JobSpans {
    std::deque<PhaseSpan> spans;
    uint64_t touched = 0;
  };
  JobSpans* JobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Push(JobSpans* job, PhaseSpan span) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const size_t spans_per_job_;
  const size_t max_jobs_;
  mutable absl::Mutex mu_;
  std::map<std::string, JobSpans> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> memory_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::server
