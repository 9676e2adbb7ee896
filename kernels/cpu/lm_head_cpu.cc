// See lm_head_cpu.h.
#include "kernels/cpu/lm_head_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/backends.h"
#include "kernels/cpu/matmul_cpu.h"
#include "kernels/cpu/simd_math.h"

namespace tandem::kernels::cpu {
namespace {

float RowMax(const float* l, int v) {
  int j = 0;
  float mx = -INFINITY;
  if (v >= 8) {
    __m256 m8 = _mm256_loadu_ps(l);
    for (j = 8; j + 8 <= v; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(l + j));
    mx = HMax8(m8);
  }
  for (; j < v; ++j) mx = std::max(mx, l[j]);
  return mx;
}

// s = sum exp(l - mx); sel = sum exp(l - mx) * (l - mx).
void RowSumExp(const float* l, int v, float mx, float* s, float* sel) {
  const __m256 m8 = _mm256_set1_ps(mx);
  __m256 s8 = _mm256_setzero_ps(), e8 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= v; j += 8) {
    const __m256 z = _mm256_sub_ps(_mm256_loadu_ps(l + j), m8);
    const __m256 e = Exp8(z);
    s8 = _mm256_add_ps(s8, e);
    e8 = _mm256_fmadd_ps(e, z, e8);
  }
  float ss = HSum8(s8), se = HSum8(e8);
  for (; j < v; ++j) {
    const float z = l[j] - mx;
    const float e = ExpScalar(z);
    ss += e;
    se += e * z;
  }
  *s = ss;
  *sel = se;
}

// l <- dlogp * (onehot(tg) - softmax(l)), in place.
void RowDlogits(float* l, int v, int tg, float g) {
  if (g == 0.f || tg < 0 || tg >= v) {
    std::memset(l, 0, sizeof(float) * v);
    return;
  }
  const float mx = RowMax(l, v);
  const __m256 m8 = _mm256_set1_ps(mx);
  __m256 s8 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= v; j += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(l + j), m8));
    _mm256_storeu_ps(l + j, e);
    s8 = _mm256_add_ps(s8, e);
  }
  float s = HSum8(s8);
  for (; j < v; ++j) {
    l[j] = ExpScalar(l[j] - mx);
    s += l[j];
  }
  const float k = -g / s;
  const __m256 k8 = _mm256_set1_ps(k);
  for (j = 0; j + 8 <= v; j += 8) _mm256_storeu_ps(l + j, _mm256_mul_ps(_mm256_loadu_ps(l + j), k8));
  for (; j < v; ++j) l[j] *= k;
  l[tg] += g;
}

}  // namespace

void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                              int chunk_tokens, float* scratch, float* logp, float* entropy) {
  const int chunk = std::max(1, chunk_tokens);
  for (int t0 = 0; t0 < t; t0 += chunk) {
    const int n = std::min(chunk, t - t0);
    matmul(false, true, n, v, c, 1.f, h + static_cast<size_t>(t0) * c, c, w, c, 0.f, scratch, v);
    const bool par = n > 1 && static_cast<size_t>(n) * v >= (1u << 14);
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
    for (int r = 0; r < n; ++r) {
      const float* l = scratch + static_cast<size_t>(r) * v;
      const float mx = RowMax(l, v);
      float s, sel;
      RowSumExp(l, v, mx, &s, &sel);
      const float log_s = std::log(s);
      const int tg = targets[t0 + r];
      logp[t0 + r] = (tg >= 0 && tg < v) ? (l[tg] - mx) - log_s : 0.f;
      if (entropy) entropy[t0 + r] = log_s - sel / s;
    }
  }
}

void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t, int c,
                               int v, int chunk_tokens, float* scratch, float* dh, float* dw) {
  const int chunk = std::max(1, chunk_tokens);
  for (int t0 = 0; t0 < t; t0 += chunk) {
    const int n = std::min(chunk, t - t0);
    const float* hc = h + static_cast<size_t>(t0) * c;
    bool any = false;
    for (int r = 0; r < n; ++r) any |= dlogp[t0 + r] != 0.f;
    if (!any) {  // nothing trained in this chunk: dh rows are zero
      std::memset(dh + static_cast<size_t>(t0) * c, 0, sizeof(float) * static_cast<size_t>(n) * c);
      continue;
    }
    matmul(false, true, n, v, c, 1.f, hc, c, w, c, 0.f, scratch, v);
    const bool par = n > 1 && static_cast<size_t>(n) * v >= (1u << 14);
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
    for (int r = 0; r < n; ++r) RowDlogits(scratch + static_cast<size_t>(r) * v, v, targets[t0 + r], dlogp[t0 + r]);
    // dh_chunk [n, C] = dlogits [n, V] . W [V, C]
    matmul(false, false, n, c, v, 1.f, scratch, v, w, c, 0.f, dh + static_cast<size_t>(t0) * c, c);
    // dW [V, C] += dlogits^T [V, n] . h_chunk [n, C]
    matmul(true, false, v, c, n, 1.f, scratch, v, hc, c, 1.f, dw, c);
  }
}

}  // namespace tandem::kernels::cpu
