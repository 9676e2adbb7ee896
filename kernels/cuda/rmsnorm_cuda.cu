// RMSNorm forward/backward: one block per row with warp + block reductions;
// dw by a separate column kernel (one atomicAdd per column per row chunk).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/rmsnorm_kernel.cuh"

namespace tandem::kernels {

void CudaOps::rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) {
  if (t <= 0 || c <= 0) return;
  cuda::RmsnormForwardKernel<<<t, cuda::RowThreads(c)>>>(x, w, c, eps, y, rstd);
  Check(cudaGetLastError(), "rmsnorm_forward");
}

void CudaOps::rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c,
                               float* dx, float* dw) {
  if (t <= 0 || c <= 0) return;
  cuda::RmsnormBackwardDxKernel<<<t, cuda::RowThreads(c)>>>(dy, x, w, rstd, c, dx);
  Check(cudaGetLastError(), "rmsnorm_backward dx");
  const dim3 grid((c + cuda::kDwThreads - 1) / cuda::kDwThreads, (t + cuda::kDwRows - 1) / cuda::kDwRows);
  cuda::RmsnormBackwardDwKernel<<<grid, cuda::kDwThreads>>>(dy, x, rstd, t, c, dw);
  Check(cudaGetLastError(), "rmsnorm_backward dw");
}

}  // namespace tandem::kernels
