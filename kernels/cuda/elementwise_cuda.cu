// Elementwise ops: SwiGLU forward/backward, residual add, bias add and its
// column-sum backward, scale. Grid-stride loops, fp32 math (expf, no fast
// math).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void SwigluForwardKernel(const float* __restrict__ gate, const float* __restrict__ up, size_t n,
                                    float* __restrict__ h) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    h[i] = g * Sigmoid(g) * up[i];
  }
}

__global__ void SwigluBackwardKernel(const float* __restrict__ dh, const float* __restrict__ gate,
                                     const float* __restrict__ up, size_t n, float* __restrict__ dgate,
                                     float* __restrict__ dup) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float s = Sigmoid(g);
    const float d = dh[i];
    dgate[i] = d * up[i] * s * (1.f + g * (1.f - s));
    dup[i] = d * g * s;
  }
}

__global__ void AddKernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, size_t rows, int cols) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

// Column sums: block (x: 256 columns, y: a chunk of kRowsPerBlock rows), one
// atomicAdd per column per block.
constexpr int kRowsPerBlock = 64;

__global__ void BiasBackwardKernel(const float* __restrict__ dy, int rows, int cols, float* __restrict__ dbias) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.y * kRowsPerBlock;
  const int r1 = min(rows, r0 + kRowsPerBlock);
  float acc = 0.f;
  for (int r = r0; r < r1; ++r) acc += dy[static_cast<size_t>(r) * cols + col];
  atomicAdd(dbias + col, acc);
}

__global__ void ScaleKernel(float* __restrict__ x, float s, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

}  // namespace
}  // namespace cuda

void CudaOps::swiglu_forward(const float* gate, const float* up, size_t n, float* h) {
  if (n == 0) return;
  const unsigned blocks = cuda::GridFor(n, cuda::kThreads);
  cuda::SwigluForwardKernel<<<blocks, cuda::kThreads>>>(gate, up, n, h);
  Check(cudaGetLastError(), "swiglu_forward");
}

void CudaOps::swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate, float* dup) {
  if (n == 0) return;
  cuda::SwigluBackwardKernel<<<cuda::GridFor(n, cuda::kThreads), cuda::kThreads>>>(dh, gate, up, n, dgate, dup);
  Check(cudaGetLastError(), "swiglu_backward");
}

void CudaOps::add_inplace(float* y, const float* x, size_t n) {
  if (n == 0) return;
  cuda::AddKernel<<<cuda::GridFor(n, cuda::kThreads), cuda::kThreads>>>(y, x, n);
  Check(cudaGetLastError(), "add_inplace");
}

void CudaOps::add_bias(float* y, const float* bias, int rows, int cols) {
  if (rows <= 0 || cols <= 0) return;
  const size_t n = static_cast<size_t>(rows) * cols;
  cuda::AddBiasKernel<<<cuda::GridFor(n, cuda::kThreads), cuda::kThreads>>>(y, bias, static_cast<size_t>(rows), cols);
  Check(cudaGetLastError(), "add_bias");
}

void CudaOps::bias_backward(const float* dy, int rows, int cols, float* dbias) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid((cols + cuda::kThreads - 1) / cuda::kThreads, (rows + cuda::kRowsPerBlock - 1) / cuda::kRowsPerBlock);
  cuda::BiasBackwardKernel<<<grid, cuda::kThreads>>>(dy, rows, cols, dbias);
  Check(cudaGetLastError(), "bias_backward");
}

void CudaOps::scale(float* x, float s, size_t n) {
  if (n == 0) return;
  cuda::ScaleKernel<<<cuda::GridFor(n, cuda::kThreads), cuda::kThreads>>>(x, s, n);
  Check(cudaGetLastError(), "scale");
}

}  // namespace tandem::kernels
