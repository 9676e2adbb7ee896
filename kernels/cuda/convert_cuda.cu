// CUDA fp32 <-> bf16 conversion: grid-stride loops over kernels/bf16.h's
// host/device functions, so the bits equal the CPU backends' bits.
#include "kernels/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {
namespace cuda {
namespace {

constexpr int kConvertThreads = 256;

__global__ void FloatToBf16Kernel(const float* __restrict__ x, uint16_t* __restrict__ y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = Bf16FromFloat(x[i]);
  }
}

__global__ void Bf16ToFloatKernel(const uint16_t* __restrict__ x, float* __restrict__ y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = FloatFromBf16(x[i]);
  }
}

}  // namespace
}  // namespace cuda

void CudaOps::float_to_bf16(const float* x, uint16_t* y, size_t n) {
  if (n == 0) return;
  cuda::FloatToBf16Kernel<<<cuda::GridFor(n, cuda::kConvertThreads), cuda::kConvertThreads>>>(x, y, n);
  Check(cudaGetLastError(), "float_to_bf16");
}

void CudaOps::bf16_to_float(const uint16_t* x, float* y, size_t n) {
  if (n == 0) return;
  cuda::Bf16ToFloatKernel<<<cuda::GridFor(n, cuda::kConvertThreads), cuda::kConvertThreads>>>(x, y, n);
  Check(cudaGetLastError(), "bf16_to_float");
}

}  // namespace tandem::kernels
