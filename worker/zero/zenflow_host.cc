// ZenFlowHostUpdater: the ZenFlow host thread (see zenflow_host.h).
#include "worker/zero/zenflow_host.h"

#include <algorithm>
#include <chrono>

#include "common/base/check.h"
#include "kernels/ref/ref_math.h"

namespace tandem::zero {

ZenFlowHostUpdater::ZenFlowHostUpdater() : thread_([this] { Loop(); }) {}

ZenFlowHostUpdater::~ZenFlowHostUpdater() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ZenFlowHostUpdater::Submit(const Job& job) {
  TANDEM_CHECK(!busy_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    has_job_ = true;
  }
  busy_ = true;
  cv_.notify_all();
}

double ZenFlowHostUpdater::Wait() {
  if (!busy_) return 0;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_job_; });
  busy_ = false;
  return seconds_;
}

void ZenFlowHostUpdater::Compute(const Job& job) {
  for (const ZenFlowHostUpdater::Run& r : *job.runs) {
    float* g = job.acc + r.opt;
    for (size_t i = 0; i < r.len; ++i) g[i] *= job.grad_scale;
    kernels::ref::adamw_step<float>(job.p + r.opt, g, job.m + r.opt, job.v + r.opt, r.len, job.lr, job.beta1, job.beta2,
                                    job.eps, job.weight_decay, job.step);
    std::fill(g, g + r.len, 0.0f);
  }
}

void ZenFlowHostUpdater::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return has_job_ || stop_; });
    if (stop_) return;
    const Job job = job_;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    Compute(job);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    seconds_ = seconds;
    has_job_ = false;
    cv_.notify_all();
  }
}

}  // namespace tandem::zero
