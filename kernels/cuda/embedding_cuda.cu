// Token embedding: gather forward, atomicAdd scatter backward.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One block row (grid.y) per token, threads over channels.
__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ ids, const float* __restrict__ table, int c,
                                       float* __restrict__ out) {
  const int t = blockIdx.y;
  const size_t row = static_cast<size_t>(ids[t]) * c;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
    out[static_cast<size_t>(t) * c + j] = table[row + j];
  }
}

__global__ void EmbeddingBackwardKernel(const int32_t* __restrict__ ids, const float* __restrict__ dout, int c,
                                        float* __restrict__ dtable) {
  const int t = blockIdx.y;
  const size_t row = static_cast<size_t>(ids[t]) * c;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
    atomicAdd(dtable + row + j, dout[static_cast<size_t>(t) * c + j]);
  }
}

dim3 EmbeddingGrid(int t, int c) {
  int x = (c + kThreads - 1) / kThreads;
  if (x > 64) x = 64;
  return dim3(x, t);
}

}  // namespace
}  // namespace cuda

void CudaOps::embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) {
  if (t <= 0 || c <= 0) return;
  // grid.y is limited to 65535: launch in slices of tokens.
  for (int t0 = 0; t0 < t; t0 += 65535) {
    const int n = t - t0 < 65535 ? t - t0 : 65535;
    cuda::EmbeddingForwardKernel<<<cuda::EmbeddingGrid(n, c), cuda::kThreads>>>(ids + t0, table, c,
                                                                                out + static_cast<size_t>(t0) * c);
  }
  Check(cudaGetLastError(), "embedding_forward");
}

void CudaOps::embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) {
  if (t <= 0 || c <= 0) return;
  for (int t0 = 0; t0 < t; t0 += 65535) {
    const int n = t - t0 < 65535 ? t - t0 : 65535;
    cuda::EmbeddingBackwardKernel<<<cuda::EmbeddingGrid(n, c), cuda::kThreads>>>(
        ids + t0, dout + static_cast<size_t>(t0) * c, c, dtable);
  }
  Check(cudaGetLastError(), "embedding_backward");
}

}  // namespace tandem::kernels
