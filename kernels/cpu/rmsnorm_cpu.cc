// See rmsnorm_cpu.h.
#include "kernels/cpu/rmsnorm_cpu.h"

#include <omp.h>

#include <cmath>
#include <cstddef>

#include "kernels/backends.h"

namespace tandem::kernels::cpu {

void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) {
  const bool par = static_cast<size_t>(t) * c >= (1u << 14) && t > 1;
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
  for (int i = 0; i < t; ++i) {
    const float* xr = x + static_cast<size_t>(i) * c;
    float* yr = y + static_cast<size_t>(i) * c;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < c; ++j) ss += xr[j] * xr[j];
    const float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss) / c + static_cast<double>(eps)));
    rstd[i] = r;
#pragma omp simd
    for (int j = 0; j < c; ++j) yr[j] = xr[j] * r * w[j];
  }
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                      float* dw, float* partial, int num_threads) {
  const bool par = static_cast<size_t>(t) * c >= (1u << 14) && t > 1;
#pragma omp parallel num_threads(num_threads) if (par)
  {
    const int nth = omp_get_num_threads();
    float* mine = partial + static_cast<size_t>(omp_get_thread_num()) * c;
#pragma omp simd
    for (int j = 0; j < c; ++j) mine[j] = 0.f;
#pragma omp for schedule(static)
    for (int i = 0; i < t; ++i) {
      const size_t off = static_cast<size_t>(i) * c;
      const float* dyr = dy + off;
      const float* xr = x + off;
      float* dxr = dx + off;
      const float r = rstd[i];
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int j = 0; j < c; ++j) dot += dyr[j] * w[j] * xr[j];
      const float coef = r * r * dot / c;
#pragma omp simd
      for (int j = 0; j < c; ++j) {
        dxr[j] = r * (dyr[j] * w[j] - xr[j] * coef);
        mine[j] += dyr[j] * xr[j] * r;
      }
    }
    // Implicit barrier above: every partial row is complete.
#pragma omp for schedule(static)
    for (int j = 0; j < c; ++j) {
      float acc = 0.f;
      for (int th = 0; th < nth; ++th) acc += partial[static_cast<size_t>(th) * c + j];
      dw[j] += acc;
    }
  }
}

}  // namespace tandem::kernels::cpu
