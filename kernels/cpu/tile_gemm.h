// The register-blocked AVX2 tile GEMM shared by the fast CPU attention
// kernels (softmax and linear): C[M, N] (+)= sum_k A(m, k) B[k, n], where
// A(m, k) = a[m*am + k*ak] is read by scalar broadcast with arbitrary strides
// (operands are read in place, transposed or not, never copied) and B is a
// row-major panel whose rows are contiguous over n (8-wide vectors). For the
// small tiles of attention (64 x 64 x D) it beats a BLAS call and runs inside
// OpenMP regions, where BLAS must not be called (it would start its own
// threads). Header-only, no state, thread-safe.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::kernels::cpu::tile {

inline __m256i TailMask(int lanes) {
  alignas(32) static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - lanes));
}

// C[MR, 8*NV] (+)= sum_k A(m, k) B[k, :]. A(m, k) = a[m*am + k*ak]
// (broadcast), B rows b + k*ldb. kTail: the last vector holds only the lanes
// set in `tail` (masked loads/stores; used with NV == 1). MR <= 6, NV <= 2:
// 12 accumulators + 2 B vectors + 1 broadcast fit the 16 ymm registers. The
// accumulators are named variables (GCC spills an array of __m256 to the
// stack on every iteration).
template <int MR, int NV, bool kTail>
inline void MicroKernel(int kd, const float* __restrict a, ptrdiff_t am, ptrdiff_t ak, const float* __restrict b,
                        ptrdiff_t ldb, float* __restrict c, ptrdiff_t ldc, bool accumulate, __m256i tail) {
  static_assert(MR >= 1 && MR <= 6 && NV >= 1 && NV <= 2);
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int kk = 0; kk < kd; ++kk) {
    const float* brow = b + kk * ldb;
    const __m256 b0 = kTail ? _mm256_maskload_ps(brow, tail) : _mm256_loadu_ps(brow);
    const __m256 b1 = NV > 1 ? _mm256_loadu_ps(brow + 8) : b0;
    const float* acol = a + kk * ak;
#define TANDEM_ATTN_ROW(m)                                            \
  if constexpr (MR > m) {                                             \
    const __m256 av = _mm256_broadcast_ss(acol + m * am);             \
    c##m##0 = _mm256_fmadd_ps(av, b0, c##m##0);                       \
    if constexpr (NV > 1) c##m##1 = _mm256_fmadd_ps(av, b1, c##m##1); \
  }
    TANDEM_ATTN_ROW(0)
    TANDEM_ATTN_ROW(1)
    TANDEM_ATTN_ROW(2)
    TANDEM_ATTN_ROW(3)
    TANDEM_ATTN_ROW(4)
    TANDEM_ATTN_ROW(5)
#undef TANDEM_ATTN_ROW
  }
  auto put = [&](float* cp, __m256 x) {
    if (kTail) {
      if (accumulate) x = _mm256_add_ps(x, _mm256_maskload_ps(cp, tail));
      _mm256_maskstore_ps(cp, tail, x);
    } else {
      if (accumulate) x = _mm256_add_ps(x, _mm256_loadu_ps(cp));
      _mm256_storeu_ps(cp, x);
    }
  };
#define TANDEM_ATTN_PUT(m)                               \
  if constexpr (MR > m) {                                \
    put(c + m * ldc, c##m##0);                           \
    if constexpr (NV > 1) put(c + m * ldc + 8, c##m##1); \
  }
  TANDEM_ATTN_PUT(0)
  TANDEM_ATTN_PUT(1)
  TANDEM_ATTN_PUT(2)
  TANDEM_ATTN_PUT(3)
  TANDEM_ATTN_PUT(4)
  TANDEM_ATTN_PUT(5)
#undef TANDEM_ATTN_PUT
}

template <int NV, bool kTail>
inline void RowBlocks(int m, int kd, const float* a, ptrdiff_t am, ptrdiff_t ak, const float* b, ptrdiff_t ldb,
                      float* c, ptrdiff_t ldc, bool accumulate, __m256i tail) {
  int m0 = 0;
  for (; m0 + 6 <= m; m0 += 6) {
    MicroKernel<6, NV, kTail>(kd, a + m0 * am, am, ak, b, ldb, c + m0 * ldc, ldc, accumulate, tail);
  }
  const float* ar = a + m0 * am;
  float* cr = c + m0 * ldc;
  switch (m - m0) {
    case 5:
      MicroKernel<5, NV, kTail>(kd, ar, am, ak, b, ldb, cr, ldc, accumulate, tail);
      break;
    case 4:
      MicroKernel<4, NV, kTail>(kd, ar, am, ak, b, ldb, cr, ldc, accumulate, tail);
      break;
    case 3:
      MicroKernel<3, NV, kTail>(kd, ar, am, ak, b, ldb, cr, ldc, accumulate, tail);
      break;
    case 2:
      MicroKernel<2, NV, kTail>(kd, ar, am, ak, b, ldb, cr, ldc, accumulate, tail);
      break;
    case 1:
      MicroKernel<1, NV, kTail>(kd, ar, am, ak, b, ldb, cr, ldc, accumulate, tail);
      break;
    default:
      break;
  }
}

// C[M, N] (+)= A[M, K] B[K, N] with the access pattern of MicroKernel.
inline void TileGemm(int m, int n, int kd, const float* a, ptrdiff_t am, ptrdiff_t ak, const float* b, ptrdiff_t ldb,
                     float* c, ptrdiff_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (kd <= 0) {
    if (!accumulate) {
      for (int i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * n);
    }
    return;
  }
  const __m256i none = _mm256_setzero_si256();
  int n0 = 0;
  for (; n0 + 16 <= n; n0 += 16) {
    RowBlocks<2, false>(m, kd, a, am, ak, b + n0, ldb, c + n0, ldc, accumulate, none);
  }
  if (n0 + 8 <= n) {
    RowBlocks<1, false>(m, kd, a, am, ak, b + n0, ldb, c + n0, ldc, accumulate, none);
    n0 += 8;
  }
  if (n0 < n) {
    RowBlocks<1, true>(m, kd, a, am, ak, b + n0, ldb, c + n0, ldc, accumulate, TailMask(n - n0));
  }
}

}  // namespace tandem::kernels::cpu::tile
