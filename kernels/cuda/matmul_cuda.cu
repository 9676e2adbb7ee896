// matmul on cuBLAS: row-major C = alpha op(A) op(B) + beta C computed as the
// column-major product C^T = op(B)^T op(A)^T (operands swapped, no copies).
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {

void CudaOps::matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                     const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // C = beta * C (BLAS semantics; beta == 0 writes zeros).
    for (int i = 0; i < m; ++i) {
      if (beta == 0.f) {
        Check(cudaMemsetAsync(c + static_cast<size_t>(i) * ldc, 0, sizeof(float) * n, 0), "matmul k=0 memset");
      }
    }
    if (beta != 0.f && beta != 1.f) {
      for (int i = 0; i < m; ++i) {
        scale(c + static_cast<size_t>(i) * ldc, beta, static_cast<size_t>(n));
      }
    }
    return;
  }
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  Check(cublasSgemm(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc), "matmul cublasSgemm");
}

}  // namespace tandem::kernels
