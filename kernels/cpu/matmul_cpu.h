// Fast CPU GEMM: row-major C = alpha op(A) op(B) + beta C through OpenBLAS
// cblas_sgemm (its own pthreads, limited by SetCpuThreads). Never call it
// from inside an OpenMP parallel region.
#pragma once

namespace tandem::kernels::cpu {

void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc);

}  // namespace tandem::kernels::cpu
