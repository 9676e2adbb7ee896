// AVX2/FMA helpers shared by the fast CPU kernels (the build targets
// x86-64-v3, so AVX2 and FMA are always present).
//
// Exp8: Cephes-style expf on 8 lanes (range reduction by ln 2, degree-6
// polynomial, exponent by bit construction). Relative error <= 2 ulp for
// inputs in [-87, 88]; inputs below -87.3 return exactly 0 (so -inf and large
// negative softmax scores vanish), inputs above 88 saturate at exp(88).
// GCC does not vectorise std::exp without -ffast-math, hence the intrinsics.
#pragma once

#include <immintrin.h>

#include <cmath>

namespace tandem::kernels::cpu {

inline __m256 Exp8(__m256 x_in) {
  const __m256 hi = _mm256_set1_ps(88.0f);
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 zero_below = _mm256_set1_ps(-87.33654f);  // ln(FLT_MIN)
  __m256 x = _mm256_min_ps(_mm256_max_ps(x_in, lo), hi);
  // n = floor(x / ln2 + 0.5)
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  // r = x - n ln2 (ln2 split in two for accuracy)
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  // 2^n
  __m256i e = _mm256_cvttps_epi32(fx);
  e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  const __m256 below = _mm256_cmp_ps(x_in, zero_below, _CMP_LT_OQ);
  return _mm256_andnot_ps(below, y);
}

// Scalar twin of Exp8 for loop tails (same saturation rules).
inline float ExpScalar(float x) {
  if (x < -87.33654f) return 0.f;
  return std::exp(x > 88.f ? 88.f : x);
}

// Horizontal reductions of 8 lanes.
inline float HSum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HMax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace tandem::kernels::cpu
