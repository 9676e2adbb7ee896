// AsyncWriter: one background thread that runs checkpoint writes in order,
// so a training step only pays for copying its shard to host memory.
// Owned by the job; the destructor drains the queue and joins the thread.
// Submit/WaitIdle from one thread (the job thread).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace tandem::ckpt {

class AsyncWriter {
 public:
  AsyncWriter();
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Queues `work`; it runs after everything queued before it.
  void Submit(std::function<absl::Status()> work);
  // Blocks until the queue is empty; returns the first error since the last
  // WaitIdle (then clears it).
  absl::Status WaitIdle();
  // Completed writes and the first error so far without blocking.
  int64_t completed() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<absl::Status()>> queue_;
  bool running_ = false;  // a work item is executing
  bool stop_ = false;
  int64_t completed_ = 0;
  absl::Status error_;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace tandem::ckpt
