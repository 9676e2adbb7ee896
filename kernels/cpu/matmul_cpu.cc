// cblas_sgemm, split across the OpenMP threads; see matmul_cpu.h.
#include "kernels/cpu/matmul_cpu.h"

#include <cblas.h>
#include <omp.h>

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::cpu {
namespace {

// Below this many multiply-adds a product runs on one thread: waking the
// team costs more than it saves.
constexpr int64_t kMinSplitWork = int64_t{1} << 17;
// Column slices are multiples of this (whole micro-kernel panels).
constexpr int kAlign = 16;

void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

// [lo, hi) of part t of `total` split in `parts`, boundaries multiples of
// `align` (the last part takes the rest).
void Part(int total, int parts, int t, int align, int* lo, int* hi) {
  auto at = [&](int i) { return static_cast<int>(static_cast<int64_t>(total) * i / parts / align * align); };
  *lo = at(t);
  *hi = t + 1 == parts ? total : at(t + 1);
}

}  // namespace

void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // C = beta * C (BLAS semantics; beta == 0 writes zeros).
    for (int i = 0; i < m; ++i) {
      float* cr = c + static_cast<size_t>(i) * ldc;
      for (int j = 0; j < n; ++j) cr[j] = beta == 0.f ? 0.f : beta * cr[j];
    }
    return;
  }
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t work = static_cast<int64_t>(m) * n * k;
  const bool by_columns = n >= kAlign * threads;
  const bool by_rows = !by_columns && m >= 8 * threads;
  if (threads <= 1 || work < kMinSplitWork || (!by_columns && !by_rows)) {
    Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int lo = 0, hi = 0;
    if (by_columns) {
      Part(n, nt, t, kAlign, &lo, &hi);
      if (hi > lo) {
        const float* bs = trans_b ? b + static_cast<size_t>(lo) * ldb : b + lo;
        Sgemm(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, bs, ldb, beta, c + lo, ldc);
      }
    } else {
      Part(m, nt, t, 1, &lo, &hi);
      if (hi > lo) {
        const float* as = trans_a ? a + lo : a + static_cast<size_t>(lo) * lda;
        Sgemm(trans_a, trans_b, hi - lo, n, k, alpha, as, lda, b, ldb, beta, c + static_cast<size_t>(lo) * ldc, ldc);
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
