// Fast CPU blockwise int8 quantisation: see quantize_int8_cpu.h.
#include "kernels/cpu/quantize_int8_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/int8_blocks.h"
#include "kernels/int8_rounding.h"

namespace tandem::kernels::cpu {
void quantize_int8(const float* __restrict x, size_t n, float* __restrict wire, uint64_t seed) {
  const size_t nb = Int8Blocks(n);
  int8_t* __restrict codes = reinterpret_cast<int8_t*>(wire + nb);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kInt8Block, len = std::min(kInt8Block, n - lo);
    const float* __restrict xb = x + lo;
    float amax = 0.f;
    for (size_t j = 0; j < len; ++j) amax = std::max(amax, std::fabs(xb[j]));
    wire[b] = amax / 127.f;
    int8_t* __restrict cb = codes + lo;
    if (amax == 0.f) {
      std::memset(cb, 0, len);
      continue;
    }
    const float inv = 127.f / amax;
    if (seed == kInt8RoundNearest) {
      for (size_t j = 0; j < len; ++j) {
        cb[j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(xb[j] * inv))));
      }
    } else {
      for (size_t j = 0; j < len; ++j) {
        cb[j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, Int8Round(xb[j] * inv, seed, lo + j))));
      }
    }
  }
  // Padding of the last code float.
  const size_t code_bytes = ((n + 3) / 4) * 4;
  std::memset(codes + n, 0, code_bytes - n);
}

void dequantize_int8(const float* __restrict wire, size_t n, float* __restrict out) {
  const size_t nb = Int8Blocks(n);
  const int8_t* __restrict codes = reinterpret_cast<const int8_t*>(wire + nb);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kInt8Block, len = std::min(kInt8Block, n - lo);
    const float s = wire[b];
    const int8_t* __restrict cb = codes + lo;
    float* __restrict ob = out + lo;
    for (size_t j = 0; j < len; ++j) ob[j] = static_cast<float>(cb[j]) * s;
  }
}

}  // namespace tandem::kernels::cpu
