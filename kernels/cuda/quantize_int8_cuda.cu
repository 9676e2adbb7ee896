// CUDA blockwise int8 quantisation (qwZ weight gathers on the device): the
// launches of quantize_int8_kernel.cuh.
#include <algorithm>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/quantize_int8_kernel.cuh"

namespace tandem::kernels {

void CudaOps::quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(Int8Blocks(n), 65535u * 8u));
  cuda::QuantizeInt8Kernel<<<blocks, cuda::kQuantThreads>>>(x, n, wire, seed);
  Check(cudaGetLastError(), "quantize_int8");
}

void CudaOps::dequantize_int8(const float* wire, size_t n, float* out) {
  if (n == 0) return;
  cuda::DequantizeInt8Kernel<<<cuda::GridFor(n, 256), 256>>>(wire, n, out);
  Check(cudaGetLastError(), "dequantize_int8");
}

}  // namespace tandem::kernels
