// Blockwise int8 weight quantisation: see quantized_weights.h.
#include "worker/comm/quantized_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tandem::comm {
namespace {

size_t NumBlocks(size_t n) { return (n + kInt8Block - 1) / kInt8Block; }

int8_t* Codes(float* wire, size_t n) { return reinterpret_cast<int8_t*>(wire + NumBlocks(n)); }
const int8_t* Codes(const float* wire, size_t n) { return reinterpret_cast<const int8_t*>(wire + NumBlocks(n)); }

}  // namespace

size_t Int8WireFloats(size_t n) { return NumBlocks(n) + (n + 3) / 4; }

void QuantizeInt8Reference(const float* x, size_t n, float* wire) {
  std::memset(wire, 0, Int8WireFloats(n) * sizeof(float));
  int8_t* codes = Codes(wire, n);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kInt8Block;
    float amax = 0.f;
    for (size_t j = b * kInt8Block; j < std::min(n, (b + 1) * kInt8Block); ++j) amax = std::max(amax, std::fabs(x[j]));
    wire[b] = amax / 127.f;
    if (amax == 0.f) {
      codes[i] = 0;
      continue;
    }
    const float q = std::nearbyint(x[i] * (127.f / amax));
    codes[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
  }
}

void DequantizeInt8Reference(const float* wire, size_t n, float* out) {
  const int8_t* codes = Codes(wire, n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * wire[i / kInt8Block];
}

void QuantizeInt8(const float* __restrict x, size_t n, float* __restrict wire) {
  const size_t nb = NumBlocks(n);
  int8_t* __restrict codes = Codes(wire, n);
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
    for (size_t j = 0; j < len; ++j) {
      cb[j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(xb[j] * inv))));
    }
  }
  // Padding of the last code float.
  const size_t code_bytes = ((n + 3) / 4) * 4;
  std::memset(codes + n, 0, code_bytes - n);
}

void DequantizeInt8(const float* __restrict wire, size_t n, float* __restrict out) {
  const size_t nb = NumBlocks(n);
  const int8_t* __restrict codes = Codes(wire, n);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * kInt8Block, len = std::min(kInt8Block, n - lo);
    const float s = wire[b];
    const int8_t* __restrict cb = codes + lo;
    float* __restrict ob = out + lo;
    for (size_t j = 0; j < len; ++j) ob[j] = static_cast<float>(cb[j]) * s;
  }
}

}  // namespace tandem::comm
