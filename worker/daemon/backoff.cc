#include "worker/daemon/backoff.h"

#include <algorithm>
#include <cmath>

namespace tandem::worker {

Backoff::Backoff(BackoffPolicy policy, uint64_t seed) : policy_(policy), rng_(seed) {
  policy_.jitter = std::clamp(policy_.jitter, 0.0, 0.99);
  if (policy_.multiplier < 1.0) policy_.multiplier = 1.0;
  if (policy_.initial.count() < 1) policy_.initial = std::chrono::milliseconds(1);
  if (policy_.max < policy_.initial) policy_.max = policy_.initial;
}

std::chrono::milliseconds Backoff::Next() {
  const double max_ms = static_cast<double>(policy_.max.count());
  // Stop growing the exponent once the cap is reached (no overflow).
  double base = static_cast<double>(policy_.initial.count()) * std::pow(policy_.multiplier, std::min(attempt_, 62));
  base = std::min(base, max_ms);
  ++attempt_;
  std::uniform_real_distribution<double> u(1.0 - policy_.jitter, 1.0 + policy_.jitter);
  const double ms = std::clamp(base * u(rng_), 1.0, max_ms);
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace tandem::worker
