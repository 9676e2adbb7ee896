// Reference blockwise int8 quantisation: see quantize_int8_ref.h.
#include "kernels/ref/quantize_int8_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/int8_blocks.h"
#include "kernels/int8_rounding.h"

namespace tandem::kernels::ref {

void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) {
  std::memset(wire, 0, Int8WireFloats(n) * sizeof(float));
  int8_t* codes = reinterpret_cast<int8_t*>(wire + Int8Blocks(n));
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kInt8Block;
    float amax = 0.f;
    for (size_t j = b * kInt8Block; j < std::min(n, (b + 1) * kInt8Block); ++j) amax = std::max(amax, std::fabs(x[j]));
    wire[b] = amax / 127.f;
    if (amax == 0.f) {
      codes[i] = 0;
      continue;
    }
    const float q = Int8Round(x[i] * (127.f / amax), seed, i);
    codes[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
  }
}

void dequantize_int8(const float* wire, size_t n, float* out) {
  const int8_t* codes = reinterpret_cast<const int8_t*>(wire + Int8Blocks(n));
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * wire[i / kInt8Block];
}

}  // namespace tandem::kernels::ref
