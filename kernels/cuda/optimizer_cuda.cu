// Optimizer-side ops: sum of squares (double accumulation, for global-norm
// clipping) and the fused AdamW step (bias corrections computed on the host
// in double).
#include <cmath>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/optimizer_kernel.cuh"

namespace tandem::kernels {

double CudaOps::sum_squares(const float* g, size_t n) {
  if (n == 0) return 0.0;
  if (!Check(cudaMemsetAsync(reduce_slot_, 0, sizeof(double), 0), "sum_squares memset")) {
    return 0.0;
  }
  cuda::SumSquaresKernel<<<cuda::GridFor(n, cuda::kOptThreads, 1024), cuda::kOptThreads>>>(g, n, reduce_slot_);
  Check(cudaGetLastError(), "sum_squares");
  double host = 0.0;
  Check(cudaMemcpy(&host, reduce_slot_, sizeof(double), cudaMemcpyDeviceToHost), "sum_squares copy");
  return host;
}

void CudaOps::adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int64_t step) {
  if (n == 0) return;
  if (step < 1) return Fail("adamw_step", "step must be >= 1");
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  cuda::AdamwKernel<<<cuda::GridFor(n, cuda::kOptThreads), cuda::kOptThreads>>>(
      p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, static_cast<float>(1.0 / bc1), static_cast<float>(1.0 / bc2));
  Check(cudaGetLastError(), "adamw_step");
}

}  // namespace tandem::kernels
