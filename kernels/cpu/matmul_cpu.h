// Fast CPU GEMM: row-major C = alpha op(A) op(B) + beta C through OpenBLAS
// cblas_sgemm. OpenBLAS runs single-threaded (SetCpuThreads sets it to 1);
// a product large enough to share is split into column (or, for narrow
// ones, row) slices across the OpenMP threads, each slice one cblas_sgemm
// on its thread. One thread pool for the whole CPU backend: OpenBLAS's own
// worker threads would spin (sched_yield) while OpenMP ran the rest of a
// step, which costs the most at decode, where a step is many small calls,
// and under OpenMP's default wait policy. Each output element's K-reduction
// is the one a single call computes, whatever the split. Inside an OpenMP
// parallel region it runs on the calling thread.
#pragma once

namespace tandem::kernels::cpu {

void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc);

}  // namespace tandem::kernels::cpu
