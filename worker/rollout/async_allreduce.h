// AsyncAllreduce: one owned communication thread that runs one in-place sum
// all-reduce at a time on a Collective, so the caller computes while it runs
// (the tensor-parallel decoder's two-half overlap, tp_decoder.h).
//
// Start hands over a buffer (which must stay untouched until Wait returns);
// Wait blocks until it is reduced and returns its status. At most one
// all-reduce is pending: Start with one pending is a bug and aborts. Start,
// Wait and the destructor are called from one thread (the owner's); while
// one is pending the owner must not use the Collective itself. Nothing is
// allocated per call. The destructor waits for a pending all-reduce (bounded
// by its timeout) and joins the thread.
#pragma once

#include <cstddef>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/collective.h"

namespace tandem::rollout {

class AsyncAllreduce {
 public:
  // `comm` must outlive this object.
  explicit AsyncAllreduce(comm::Collective* comm);
  ~AsyncAllreduce();
  AsyncAllreduce(const AsyncAllreduce&) = delete;
  AsyncAllreduce& operator=(const AsyncAllreduce&) = delete;

  void Start(float* data, size_t n, comm::Timeout timeout);
  // OK at once when none is pending.
  absl::Status Wait();
  bool pending() const;
  // Seconds the thread spent inside all-reduce calls, in total.
  double busy_seconds() const;

 private:
  void Loop();

  comm::Collective* const comm_;
  mutable absl::Mutex mu_;
  bool has_work_ ABSL_GUARDED_BY(mu_) = false;  // handed over, not yet finished
  bool running_ ABSL_GUARDED_BY(mu_) = false;   // taken by the thread
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  float* data_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t n_ ABSL_GUARDED_BY(mu_) = 0;
  comm::Timeout timeout_ ABSL_GUARDED_BY(mu_){0};
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  double busy_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tandem::rollout
