// CommWorker: runs submitted collectives on one owned thread, in
// submission order (ZeroOptimizer's communication thread). Submit/Wait/
// Done/Run/Drain from the job thread; the tasks run on the worker thread.
// Destruction stops after the queue is empty and joins.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem::zero {

// Runs submitted collectives on one owned thread, in submission order.
class CommWorker {
 public:
  struct Task {
    std::function<absl::Status()> fn;
    absl::Status status;
    bool done = false;
  };

  CommWorker() : thread_([this] { Loop(); }) {}
  ~CommWorker() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  std::shared_ptr<Task> Submit(std::function<absl::Status()> fn) {
    auto task = std::make_shared<Task>();
    task->fn = std::move(fn);
    absl::MutexLock lock(&mu_);
    queue_.push_back(task);
    return task;
  }

  absl::Status Wait(const std::shared_ptr<Task>& task) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return task->done; };
    mu_.Await(absl::Condition(&done));
    return task->status;
  }

  bool Done(const std::shared_ptr<Task>& task) {
    absl::MutexLock lock(&mu_);
    return task->done;
  }

  absl::Status Run(std::function<absl::Status()> fn) { return Wait(Submit(std::move(fn))); }

  // Waits until the queue is empty; returns the first error of any task.
  absl::Status Drain() {
    absl::MutexLock lock(&mu_);
    auto idle = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return queue_.empty() && !running_; };
    mu_.Await(absl::Condition(&idle));
    return first_error_;
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stop_ and nothing left
        task = queue_.front();
        queue_.pop_front();
        running_ = true;
      }
      absl::Status s = task->fn();
      absl::MutexLock lock(&mu_);
      task->status = s;
      task->done = true;
      running_ = false;
      if (!s.ok() && first_error_.ok()) first_error_ = s;
    }
  }

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Task>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace tandem::zero
