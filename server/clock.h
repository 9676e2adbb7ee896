// Clock seam: the coordinator reads time only through this, so tests can
// drive leases and timeouts with a manual clock. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tandem::server {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds (leases, timeouts).
  virtual int64_t NowMs() const = 0;
  // Unix seconds (timestamps shown to users).
  virtual double WallSeconds() const = 0;
};

class SystemClock : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  double WallSeconds() const override {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

// A clock that moves only when told (tests).
class ManualClock : public Clock {
 public:
  explicit ManualClock(int64_t start_ms = 1000000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(); }
  double WallSeconds() const override { return 1.7e9 + now_ms_.load() / 1000.0; }
  void AdvanceMs(int64_t ms) { now_ms_ += ms; }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace tandem::server
