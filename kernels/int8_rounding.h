// The rounding rule of blockwise int8 quantisation (kernels/int8_blocks.h),
// shared by the reference, CPU, CUDA and emulated CUDA kernels so they
// produce the same codes bit for bit.
//
// seed == kInt8RoundNearest rounds to nearest (ties to even). Any other seed
// rounds stochastically and without bias: value i of a piece (its index from
// the piece's start) scaled to y = x * (127 / max |x|) becomes floor(y) + 1
// when u(seed, i) < y - floor(y), else floor(y), where u is a counter-based
// hash of (seed, i) (splitmix64) mapped to a multiple of 2^-24 in [0, 1).
// The expected code is y (to 2^-24), the error stays below one grid step,
// and the codes depend only on (x, seed), so every rank and backend that
// quantises a piece with the same seed produces the same wire.
// Header-only, usable from host and device code.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_INT8_HD __host__ __device__ __forceinline__
#else
#define TANDEM_INT8_HD inline
#endif

namespace tandem::kernels {

inline constexpr uint64_t kInt8RoundNearest = 0;

// splitmix64 finaliser.
TANDEM_INT8_HD uint64_t Int8Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A seed from its parts, never kInt8RoundNearest.
TANDEM_INT8_HD uint64_t Int8SeedFrom(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t s = Int8Mix64(a + 0x9E3779B97F4A7C15ull);
  s = Int8Mix64(s ^ (b + 0x632BE59BD9B4E019ull));
  s = Int8Mix64(s ^ (c + 0x8CB92BA72F3D8DD7ull));
  s = Int8Mix64(s ^ (d + 0xD1B54A32D192ED03ull));
  return s == kInt8RoundNearest ? 1 : s;
}

// The uniform draw of value i: a multiple of 2^-24 in [0, 1) (exact in float).
TANDEM_INT8_HD float Int8Uniform(uint64_t seed, size_t i) {
  const uint64_t h = Int8Mix64(seed + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<float>(static_cast<uint32_t>(h >> 40)) * (1.f / 16777216.f);
}

// The code of y = x * (127 / max |x|) (finite, |y| <= 127 up to rounding),
// value i of the piece, before the clamp to [-127, 127].
TANDEM_INT8_HD float Int8Round(float y, uint64_t seed, size_t i) {
#if defined(__CUDA_ARCH__)
  if (seed == kInt8RoundNearest) return rintf(y);
  const float f = floorf(y);
#else
  if (seed == kInt8RoundNearest) return std::nearbyint(y);
  const float f = std::floor(y);
#endif
  return Int8Uniform(seed, i) < y - f ? f + 1.f : f;
}

}  // namespace tandem::kernels
