// Counter-based randomness for the RL and SFT data paths.
//
// Every random draw in Tandem's data path is a pure function of
// (seed, index, stream): there is no shared generator state, so any rank,
// any world size and any replay computes the same values. Mix() hashes the
// triple with splitmix64; CounterRng walks a private counter from that key.
// CounterRng is a small value type (not thread-safe; do not share one).
#pragma once

#include <cstdint>

namespace tandem::rl {

// splitmix64 finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Key for (seed, index, stream); different streams give independent draws.
constexpr uint64_t Mix(uint64_t seed, uint64_t index, uint64_t stream = 0) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ index) ^ (stream * 0xd6e8feb86659fd93ULL + 0x2545f4914f6cdd1dULL));
}

// Private generator over the counter sequence Mix(key, 0), Mix(key, 1), ...
class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t Next() { return SplitMix64(key_ ^ SplitMix64(counter_++)); }
  // Uniform in [0, n); n > 0. Lemire's multiply-shift (bias < n / 2^64).
  uint64_t Uniform(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64); }
  // Uniform in [lo, hi] (inclusive).
  int64_t UniformInt(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Uniform(static_cast<uint64_t>(hi - lo) + 1));
  }
  // Uniform double in [0, 1) with 53 random bits.
  double UniformDouble() { return (Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace tandem::rl
