// Device code of sum_squares and AdamW (launched from optimizer_cuda.cu).
// Kept apart from the host code so the CPU emulation test (kernels/cuda/emu/)
// runs it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kOptThreads = 256;

__global__ void SumSquaresKernel(const float* __restrict__ g, size_t n, double* __restrict__ out) {
  __shared__ double red[32];
  double acc = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double v = g[i];
    acc += v * v;
  }
  acc = BlockSum(acc, red);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

__global__ void AdamwKernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, size_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, float inv_bc1, float inv_bc2) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * inv_bc1;
    const float vhat = vi * inv_bc2;
    const float pi = p[i];
    p[i] = pi - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * pi);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
