// Device code of RMSNorm (launched from rmsnorm_cuda.cu). Kept apart
// from the host code so the CPU emulation test (kernels/cuda/emu/) runs it
// without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

int RowThreads(int c) {
  if (c >= 1024) return 256;
  if (c >= 256) return 128;
  return 64;
}

__global__ void RmsnormForwardKernel(const float* __restrict__ x, const float* __restrict__ w, int c, float eps,
                                     float* __restrict__ y, float* __restrict__ rstd) {
  __shared__ float red[32];
  const size_t off = static_cast<size_t>(blockIdx.x) * c;
  const float* xr = x + off;
  float ss = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) ss += xr[j] * xr[j];
  ss = BlockSum(ss, red);
  const float r = 1.f / sqrtf(ss / static_cast<float>(c) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int j = threadIdx.x; j < c; j += blockDim.x) y[off + j] = xr[j] * r * w[j];
}

// dx_j = r (dy_j w_j - x_j r^2 dot / C), dot = sum_i dy_i w_i x_i.
__global__ void RmsnormBackwardDxKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                        const float* __restrict__ w, const float* __restrict__ rstd, int c,
                                        float* __restrict__ dx) {
  __shared__ float red[32];
  const size_t off = static_cast<size_t>(blockIdx.x) * c;
  float dot = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) dot += dy[off + j] * w[j] * x[off + j];
  dot = BlockSum(dot, red);
  const float r = rstd[blockIdx.x];
  const float coef = r * r * dot / static_cast<float>(c);
  for (int j = threadIdx.x; j < c; j += blockDim.x) dx[off + j] = r * (dy[off + j] * w[j] - x[off + j] * coef);
}

constexpr int kDwThreads = 256;
constexpr int kDwRows = 64;

__global__ void RmsnormBackwardDwKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                        const float* __restrict__ rstd, int t, int c, float* __restrict__ dw) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= c) return;
  const int r0 = blockIdx.y * kDwRows;
  const int r1 = min(t, r0 + kDwRows);
  float acc = 0.f;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * c + col;
    acc += dy[i] * x[i] * rstd[r];
  }
  atomicAdd(dw + col, acc);
}

}  // namespace
}  // namespace tandem::kernels::cuda
