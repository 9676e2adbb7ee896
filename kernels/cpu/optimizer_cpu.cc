// See optimizer_cpu.h.
#include "kernels/cpu/optimizer_cpu.h"

#include <immintrin.h>

#include <cmath>

#include "kernels/backends.h"

namespace tandem::kernels::cpu {
namespace {
constexpr int64_t kMinParallel = 1 << 15;
}  // namespace

double sum_squares(const float* g, size_t n) {
  const int64_t nn = static_cast<int64_t>(n);
  double total = 0.0;
#pragma omp parallel for simd num_threads(CpuThreads()) if (nn >= kMinParallel) schedule(static) reduction(+ : total)
  for (int64_t i = 0; i < nn; ++i) {
    const double x = g[i];
    total += x * x;
  }
  return total;
}

void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  // p -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * p)
  const float inv_bc1 = static_cast<float>(1.0 / bc1);
  const float inv_bc2 = static_cast<float>(1.0 / bc2);
  const float one_m_b1 = 1.f - beta1, one_m_b2 = 1.f - beta2;
  const int64_t nn = static_cast<int64_t>(n);
  constexpr int64_t kBlock = 8192;
  const int64_t blocks = (nn + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(CpuThreads()) if (nn >= kMinParallel) schedule(static)
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const int64_t b = bl * kBlock;
    const int64_t e = b + kBlock < nn ? b + kBlock : nn;
    int64_t i = b;
    const __m256 vb1 = _mm256_set1_ps(beta1), vb2 = _mm256_set1_ps(beta2);
    const __m256 v1b1 = _mm256_set1_ps(one_m_b1), v1b2 = _mm256_set1_ps(one_m_b2);
    const __m256 vibc1 = _mm256_set1_ps(inv_bc1), vibc2 = _mm256_set1_ps(inv_bc2);
    const __m256 veps = _mm256_set1_ps(eps), vlr = _mm256_set1_ps(lr);
    const __m256 vwd = _mm256_set1_ps(weight_decay);
    for (; i + 8 <= e; i += 8) {
      const __m256 gi = _mm256_loadu_ps(g + i);
      __m256 mi = _mm256_loadu_ps(m + i);
      __m256 vi = _mm256_loadu_ps(v + i);
      const __m256 pi = _mm256_loadu_ps(p + i);
      mi = _mm256_fmadd_ps(vb1, mi, _mm256_mul_ps(v1b1, gi));
      vi = _mm256_fmadd_ps(vb2, vi, _mm256_mul_ps(_mm256_mul_ps(v1b2, gi), gi));
      _mm256_storeu_ps(m + i, mi);
      _mm256_storeu_ps(v + i, vi);
      const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, vibc2)), veps);
      const __m256 upd = _mm256_fmadd_ps(vwd, pi, _mm256_div_ps(_mm256_mul_ps(mi, vibc1), denom));
      _mm256_storeu_ps(p + i, _mm256_fnmadd_ps(vlr, upd, pi));
    }
    for (; i < e; ++i) {
      const float gi = g[i];
      const float mi = beta1 * m[i] + one_m_b1 * gi;
      const float vi = beta2 * v[i] + one_m_b2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float upd = mi * inv_bc1 / (std::sqrt(vi * inv_bc2) + eps) + weight_decay * p[i];
      p[i] -= lr * upd;
    }
  }
}

}  // namespace tandem::kernels::cpu
