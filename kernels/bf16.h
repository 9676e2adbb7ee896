// bfloat16 storage rules shared by every backend (host and device code).
//
// A bf16 value is stored as the upper 16 bits of an IEEE fp32 (uint16_t).
//  * fp32 -> bf16: round to nearest, ties to even, on the bit pattern;
//    finite values that round past the largest bf16 become +-Inf (IEEE);
//    +-Inf stay +-Inf; NaN stays NaN (sign and top 7 payload bits kept,
//    quiet bit set, so a NaN never turns into Inf); fp32 denormals round to
//    bf16 denormals (same exponent range) or to a signed zero.
//  * bf16 -> fp32: exact (the low 16 bits become zero).
// Every backend converts with these two functions, so the bits are the same
// on every rank and device.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_BF16_HD __host__ __device__ __forceinline__
#else
#define TANDEM_BF16_HD inline
#endif

namespace tandem::kernels {

TANDEM_BF16_HD uint16_t Bf16FromFloat(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

TANDEM_BF16_HD float FloatFromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace tandem::kernels
