// Device helpers shared by the CUDA kernels: warp/block reductions and grid
// sizing. Header-only, included by .cu files only (no logging here: fmt does
// not compile under nvcc in C++20).
#pragma once

#if !defined(TANDEM_CUDA_EMULATION)
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>

// Dynamic shared memory of a kernel; the CPU emulation (kernels/cuda/emu/)
// supplies its own block-wide buffer.
#if defined(TANDEM_CUDA_EMULATION)
#define TANDEM_DYNAMIC_SMEM(name) float* name = ::tandem_emu::DynamicSmem()
#else
#define TANDEM_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif

namespace tandem::kernels::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double WarpSum(double v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; every thread gets the result. `shared` holds at
// least 32 elements. blockDim.x must be a multiple of 32. Ends with a barrier
// so `shared` can be reused right after.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = WarpSum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = lane < nwarps ? shared[lane] : T(0);
  r = WarpSum(r);
  __syncthreads();
  return r;
}

__device__ __forceinline__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = WarpMax(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared[lane] : -INFINITY;
  r = WarpMax(r);
  __syncthreads();
  return r;
}

// Blocks for a grid-stride loop over n elements (capped; the loop covers the
// rest).
inline unsigned GridFor(size_t n, int threads, unsigned cap = 65535u * 8u) {
  size_t blocks = (n + threads - 1) / threads;
  if (blocks == 0) blocks = 1;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks);
}

}  // namespace tandem::kernels::cuda
