// Backoff: capped exponential backoff with multiplicative jitter, for the
// worker's reconnect loop and report retries. Delay n (0-based) is
// min(max, initial * multiplier^n) scaled by a factor drawn uniformly from
// [1 - jitter, 1 + jitter] (then capped again at max). Not thread safe: one
// owner per instance.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace tandem::worker {

struct BackoffPolicy {
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{10000};
  double multiplier = 2.0;
  double jitter = 0.2;  // 0 = none; must be in [0, 1)
};

class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy, uint64_t seed = std::random_device{}());
  // The delay to wait before the next attempt; advances the attempt count.
  std::chrono::milliseconds Next();
  // Back to the initial delay (after a success).
  void Reset() { attempt_ = 0; }
  int attempt() const { return attempt_; }

 private:
  BackoffPolicy policy_;
  std::mt19937_64 rng_;
  int attempt_ = 0;
};

}  // namespace tandem::worker
