// See swiglu_cpu.h.
#include "kernels/cpu/swiglu_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/backends.h"
#include "kernels/cpu/simd_math.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int64_t kBlock = 4096;  // elements per OpenMP work item

inline __m256 Sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

inline float SigmoidScalar(float g) { return 1.f / (1.f + ExpScalar(-g)); }

void ForwardRange(const float* gate, const float* up, int64_t b, int64_t e, float* h) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = Sigmoid8(g);
    _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up + i)));
  }
  for (; i < e; ++i) h[i] = gate[i] * SigmoidScalar(gate[i]) * up[i];
}

void BackwardRange(const float* dh, const float* gate, const float* up, int64_t b, int64_t e, float* dgate,
                   float* dup) {
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 d = _mm256_loadu_ps(dh + i);
    const __m256 u = _mm256_loadu_ps(up + i);
    const __m256 s = Sigmoid8(g);
    // dgate = dh * u * s * (1 + g (1 - s)); dup = dh * g * s
    const __m256 t = _mm256_fmadd_ps(g, _mm256_sub_ps(one, s), one);
    const __m256 ds = _mm256_mul_ps(d, s);
    _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(ds, u), t));
    _mm256_storeu_ps(dup + i, _mm256_mul_ps(ds, g));
  }
  for (; i < e; ++i) {
    const float g = gate[i], s = SigmoidScalar(g), d = dh[i];
    dgate[i] = d * up[i] * s * (1.f + g * (1.f - s));
    dup[i] = d * g * s;
  }
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, size_t n, float* h) {
  const int64_t nn = static_cast<int64_t>(n);
  const int64_t blocks = (nn + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(CpuThreads()) if (blocks > 2) schedule(static)
  for (int64_t bl = 0; bl < blocks; ++bl) ForwardRange(gate, up, bl * kBlock, std::min(nn, (bl + 1) * kBlock), h);
}

void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate, float* dup) {
  const int64_t nn = static_cast<int64_t>(n);
  const int64_t blocks = (nn + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(CpuThreads()) if (blocks > 2) schedule(static)
  for (int64_t bl = 0; bl < blocks; ++bl)
    BackwardRange(dh, gate, up, bl * kBlock, std::min(nn, (bl + 1) * kBlock), dgate, dup);
}

}  // namespace tandem::kernels::cpu
