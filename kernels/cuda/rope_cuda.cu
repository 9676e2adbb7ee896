// Rotary position embedding (HF rotate_half layout) applied in place, with
// cos/sin tables [max_pos, D/2] already on the device; `inverse` applies the
// transpose rotation (backward). One thread per (token, head, pair).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RopeKernel(float* __restrict__ x, const int32_t* __restrict__ positions, size_t rows, int nh, int half,
                           const float* __restrict__ cos, const float* __restrict__ sin, float sign) {
  const size_t n = rows * half;  // rows = t * nh
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = i / half;
    const int j = static_cast<int>(i % half);
    const size_t tok = row / nh;
    const size_t tab = static_cast<size_t>(positions[tok]) * half + j;
    const float c = cos[tab];
    const float s = sign * sin[tab];
    float* xr = x + row * (2 * half);
    const float x1 = xr[j];
    const float x2 = xr[j + half];
    xr[j] = x1 * c - x2 * s;
    xr[j + half] = x2 * c + x1 * s;
  }
}

}  // namespace
}  // namespace cuda

void CudaOps::rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                         bool inverse) {
  if (t <= 0 || nh <= 0 || d <= 0) return;
  if (d % 2 != 0) return Fail("rope_apply", "head_dim must be even");
  const size_t rows = static_cast<size_t>(t) * nh;
  const size_t n = rows * (d / 2);
  cuda::RopeKernel<<<cuda::GridFor(n, cuda::kThreads), cuda::kThreads>>>(x, positions, rows, nh, d / 2, cos, sin,
                                                                         inverse ? -1.f : 1.f);
  Check(cudaGetLastError(), "rope_apply");
}

}  // namespace tandem::kernels
