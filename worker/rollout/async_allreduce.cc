// The communication thread of the two-half overlap (async_allreduce.h).
#include "worker/rollout/async_allreduce.h"

#include <chrono>

#include "common/base/check.h"

namespace tandem::rollout {

AsyncAllreduce::AsyncAllreduce(comm::Collective* comm) : comm_(comm), thread_([this] { Loop(); }) {}

AsyncAllreduce::~AsyncAllreduce() {
  (void)Wait();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void AsyncAllreduce::Start(float* data, size_t n, comm::Timeout timeout) {
  absl::MutexLock lock(&mu_);
  TANDEM_CHECK(!has_work_);
  data_ = data;
  n_ = n;
  timeout_ = timeout;
  status_ = absl::OkStatus();
  has_work_ = true;
}

absl::Status AsyncAllreduce::Wait() {
  absl::MutexLock lock(&mu_);
  auto finished = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !has_work_; };
  mu_.Await(absl::Condition(&finished));
  return status_;
}

bool AsyncAllreduce::pending() const {
  absl::MutexLock lock(&mu_);
  return has_work_;
}

double AsyncAllreduce::busy_seconds() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

void AsyncAllreduce::Loop() {
  for (;;) {
    float* data;
    size_t n;
    comm::Timeout timeout;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || (has_work_ && !running_); };
      mu_.Await(absl::Condition(&ready));
      if (!has_work_) return;  // stop_ with nothing pending
      running_ = true;
      data = data_;
      n = n_;
      timeout = timeout_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = comm_->allreduce(data, n, comm::ReduceOp::kSum, timeout);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    absl::MutexLock lock(&mu_);
    status_ = std::move(st);
    busy_ += dt;
    running_ = false;
    has_work_ = false;
  }
}

}  // namespace tandem::rollout
