// Helpers shared by the kernel tests: seeded random tensors and the per-tensor
// relative error max|a - b| / max(max|b|, tiny) used by every comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tandem::kernels::testing {

template <typename T = float>
std::vector<T> RandomVec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

inline std::vector<int32_t> RandomIds(size_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// max|a - b| / max(max|b|, tiny); b is the reference.
template <typename A, typename B>
double RelErr(const A* a, const B* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return INFINITY;
    num = std::max(num, d);
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / std::max(den, 1e-30);
}

template <typename A, typename B>
double RelErr(const std::vector<A>& a, const std::vector<B>& b) {
  return RelErr(a.data(), b.data(), std::min(a.size(), b.size()));
}

}  // namespace tandem::kernels::testing
