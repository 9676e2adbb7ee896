// Timing helper for the kernel benchmark programs: after a warm-up call,
// times individual calls until `min_seconds` have passed (at least
// `min_calls`) and returns the FASTEST call in seconds. The minimum, not the
// mean: these machines are shared, and a call that was not preempted is the
// one that measures the kernel.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

namespace tandem::kernels::bench {

inline double TimeIt(const std::function<void()>& fn, double min_seconds = 0.5, int min_calls = 5) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up (page faults, thread pools)
  double best = 1e30, total = 0;
  for (int calls = 0; calls < min_calls || total < min_seconds; ++calls) {
    const auto t0 = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

}  // namespace tandem::kernels::bench
