// See rope_cpu.h.
#include "kernels/cpu/rope_cpu.h"

#include <cstddef>

#include "kernels/backends.h"

namespace tandem::kernels::cpu {

void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                bool inverse) {
  const int half = d / 2;
  const float sign = inverse ? -1.f : 1.f;
  const bool par = static_cast<size_t>(t) * nh * d >= (1u << 14) && t > 1;
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
  for (int i = 0; i < t; ++i) {
    const float* cr = cos + static_cast<size_t>(positions[i]) * half;
    const float* sr = sin + static_cast<size_t>(positions[i]) * half;
    for (int h = 0; h < nh; ++h) {
      float* x1 = x + (static_cast<size_t>(i) * nh + h) * d;
      float* x2 = x1 + half;
#pragma omp simd
      for (int j = 0; j < half; ++j) {
        const float a = x1[j], b = x2[j];
        const float c = cr[j], s = sign * sr[j];
        x1[j] = a * c - b * s;
        x2[j] = b * c + a * s;
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
