// Following a job until it ends: GetJob, then the WatchJob stream; when the
// stream breaks (coordinator restart, network), reconnect with backoff and
// resume (events already seen are skipped by the caller's step bookkeeping).
// Gives up with UNAVAILABLE after `unreachable_limit` without contact.
// Cancellation (Ctrl-C) from another thread through a Canceller. Also the
// progress printer used by `watch` and `run --local`.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/cli/control_client.h"

namespace tandem::cli {

// Lets a signal thread cancel the RPC in progress. Thread safe.
class Canceller {
 public:
  void Cancel();
  bool cancelled() const;
  // Registers ctx for cancellation (nullptr to clear); cancels at once when
  // Cancel() already happened.
  void Track(grpc::ClientContext* ctx);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
};

using JobEventFn = std::function<void(const tandem::v1::Job& job, const tandem::v1::JobEvent& ev)>;

// Returns OK with *final_job in a terminal state; CANCELLED when cancel fired;
// the RPC error otherwise (NOT_FOUND, UNAUTHENTICATED, UNAVAILABLE, ...).
grpc::Status FollowJob(ControlClient& client, const std::string& job_id, bool from_start, const JobEventFn& on_event,
                       Canceller* cancel, tandem::v1::Job* final_job,
                       std::chrono::seconds unreachable_limit = std::chrono::seconds(60));

// Live progress on stdout: one rewritten line on a terminal, otherwise one
// line per step at most every `min_interval_s` (the last step always).
// Thread safe: `run --local` prints restarts from its supervisor thread.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(double min_interval_s = 1.0);
  void Step(const tandem::v1::Job& job, const tandem::v1::StepMetrics& m);
  void Message(const std::string& text);  // a full line (state changes, ...)
  void Finish();                          // ends a pending \r line

 private:
  absl::Mutex mu_;
  const bool tty_;
  const double min_interval_s_;
  double last_print_ ABSL_GUARDED_BY(mu_) = 0;
  bool line_open_ ABSL_GUARDED_BY(mu_) = false;
  std::string pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::cli
