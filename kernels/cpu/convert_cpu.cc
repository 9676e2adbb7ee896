// See convert_cpu.h.
#include "kernels/cpu/convert_cpu.h"

#include <omp.h>

#include <cstring>

#include "kernels/backends.h"

namespace tandem::kernels::cpu {
namespace {
constexpr int64_t kMinParallel = 1 << 16;
}  // namespace

void float_to_bf16(const float* x, uint16_t* y, size_t n) {
  const int64_t nn = static_cast<int64_t>(n);
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);  // NOLINT
#pragma omp parallel for simd num_threads(CpuThreads()) if (nn >= kMinParallel) schedule(static)
  for (int64_t i = 0; i < nn; ++i) {
    const uint32_t b = bits[i];
    const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const uint32_t nan = (b >> 16) | 0x0040u;
    y[i] = static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

void bf16_to_float(const uint16_t* x, float* y, size_t n) {
  const int64_t nn = static_cast<int64_t>(n);
  uint32_t* bits = reinterpret_cast<uint32_t*>(y);  // NOLINT
#pragma omp parallel for simd num_threads(CpuThreads()) if (nn >= kMinParallel) schedule(static)
  for (int64_t i = 0; i < nn; ++i) bits[i] = static_cast<uint32_t>(x[i]) << 16;
}

}  // namespace tandem::kernels::cpu
