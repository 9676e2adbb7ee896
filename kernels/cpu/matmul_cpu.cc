// cblas_sgemm wrapper; see matmul_cpu.h.
#include "kernels/cpu/matmul_cpu.h"

#include <cblas.h>

#include <cstddef>

namespace tandem::kernels::cpu {

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
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

}  // namespace tandem::kernels::cpu
