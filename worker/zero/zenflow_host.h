// ZenFlowHostUpdater: the host thread of the ZenFlow optimizer
// (zenflow.h). It owns one thread (started by the constructor, stopped and
// joined by the destructor) that runs one submitted job at a time: AdamW on
// host arrays over a list of element runs, with the mean of an accumulated
// gradient, after which it zeroes the accumulator's runs.
//
// Threads: Submit, Wait and busy() are called from one thread (the job
// thread). Between Submit and Wait the host thread reads the runs vector and
// writes the runs' elements of acc, p, m and v; the caller must not touch
// them (other elements are free). The hot loop allocates nothing.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::zero {

class ZenFlowHostUpdater {
 public:
  // A contiguous range of elements: [opt, opt + len) in the host arrays
  // (the optimizer-state coordinates), [param, param + len) in the device
  // parameters.
  struct Run {
    size_t opt = 0;
    size_t param = 0;
    size_t len = 0;
  };
  struct Job {
    const std::vector<Run>* runs = nullptr;
    float* acc = nullptr;  // accumulated gradient; zeroed over the runs
    float* p = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    float grad_scale = 1;  // acc * grad_scale is the gradient (1/count: the mean)
    float lr = 0;
    float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
    int64_t step = 1;  // bias-correction step of the host moments
  };

  ZenFlowHostUpdater();
  ~ZenFlowHostUpdater();
  ZenFlowHostUpdater(const ZenFlowHostUpdater&) = delete;
  ZenFlowHostUpdater& operator=(const ZenFlowHostUpdater&) = delete;

  // Hands a job to the host thread (checked: none in flight).
  void Submit(const Job& job);
  bool busy() const { return busy_; }
  // Waits for the job in flight; returns the seconds the host thread spent
  // computing it (0 when none was in flight).
  double Wait();

 private:
  void Loop();
  static void Compute(const Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  bool has_job_ = false;  // guarded by mu_: submitted, not yet finished
  bool stop_ = false;     // guarded by mu_
  Job job_;               // guarded by mu_
  double seconds_ = 0;    // guarded by mu_
  bool busy_ = false;     // job thread only
  std::thread thread_;    // last: started after the fields above exist
};

}  // namespace tandem::zero
