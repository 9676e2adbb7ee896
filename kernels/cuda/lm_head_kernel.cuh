// Device code of the LM head row kernels (launched from lm_head_cuda.cu).
// Kept apart from the host code so the CPU emulation test (kernels/cuda/emu/)
// runs it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kLmThreads = 256;

__global__ void LogprobRowKernel(const float* __restrict__ logits, int v, const int32_t* __restrict__ targets,
                                 float* __restrict__ logp, float* __restrict__ entropy) {
  __shared__ float red[32];
  const float* row = logits + static_cast<size_t>(blockIdx.x) * v;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = BlockMax(mx, red);
  float sum = 0.f, sum_el = 0.f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float s = row[j] - mx;
    const float e = expf(s);
    sum += e;
    sum_el += e * s;
  }
  sum = BlockSum(sum, red);
  sum_el = BlockSum(sum_el, red);
  if (threadIdx.x == 0) {
    const float log_sum = logf(sum);  // lse - mx
    const int tg = targets[blockIdx.x];
    logp[blockIdx.x] = (tg >= 0 && tg < v) ? row[tg] - mx - log_sum : 0.f;
    // H = lse - E[l] = log_sum - E[l - mx]
    if (entropy != nullptr) entropy[blockIdx.x] = log_sum - sum_el / sum;
  }
}

__global__ void DlogitsRowKernel(float* __restrict__ logits, int v, const int32_t* __restrict__ targets,
                                 const float* __restrict__ dlogp) {
  __shared__ float red[32];
  float* row = logits + static_cast<size_t>(blockIdx.x) * v;
  const int tg = targets[blockIdx.x];
  const float g = (tg >= 0 && tg < v) ? dlogp[blockIdx.x] : 0.f;
  if (g == 0.f) {
    for (int j = threadIdx.x; j < v; j += blockDim.x) row[j] = 0.f;
    return;
  }
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = BlockMax(mx, red);
  float sum = 0.f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) sum += expf(row[j] - mx);
  sum = BlockSum(sum, red);
  const float inv = 1.f / sum;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float p = expf(row[j] - mx) * inv;
    row[j] = g * ((j == tg ? 1.f : 0.f) - p);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
