// Device code of blockwise int8 quantisation (kernels/int8_blocks.h format;
// launched from quantize_int8_cuda.cu). One thread block of kInt8Block
// threads per quantisation block (grid-stride over blocks): a block-wide
// max of |x|, then one code per thread. The scale, the multiplier 127 / max
// and the rounding (kernels/int8_rounding.h) are the reference's float
// operations, so the bits equal the CPU backends'. Kept apart from the host
// code so the CPU emulation test (kernels/cuda/emu/) runs it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/int8_blocks.h"
#include "kernels/int8_rounding.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kQuantThreads = static_cast<int>(kInt8Block);

__global__ void __launch_bounds__(kQuantThreads)
    QuantizeInt8Kernel(const float* __restrict__ x, size_t n, float* __restrict__ wire, uint64_t seed) {
  __shared__ float red[32];
  const size_t nb = Int8Blocks(n);
  int8_t* codes = reinterpret_cast<int8_t*>(wire + nb);
  // Every thread of a block runs the same iterations (BlockMax has barriers).
  for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const size_t i = b * kInt8Block + threadIdx.x;
    const float xi = i < n ? x[i] : 0.f;
    const float amax = BlockMax(fabsf(xi), red);
    if (threadIdx.x == 0) wire[b] = amax / 127.f;
    if (i < n) {
      float q = 0.f;
      if (amax != 0.f) q = fminf(127.f, fmaxf(-127.f, Int8Round(xi * (127.f / amax), seed, i)));
      codes[i] = static_cast<int8_t>(q);
    }
  }
  // Padding of the last code float.
  const size_t pad = n + threadIdx.x;
  if (blockIdx.x == 0 && threadIdx.x < 3 && pad < (n + 3) / 4 * 4) codes[pad] = 0;
}

__global__ void DequantizeInt8Kernel(const float* __restrict__ wire, size_t n, float* __restrict__ out) {
  const int8_t* codes = reinterpret_cast<const int8_t*>(wire + Int8Blocks(n));
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<float>(codes[i]) * wire[i / kInt8Block];
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
