// Device code of Ops::sample_logits (launched from sample_cuda.cu; kept apart
// so the CPU emulation test runs it): one 256-thread block per row. Thread t
// owns the contiguous chunk [t*chunk, (t+1)*chunk) of the vocabulary:
//   1. max and argmax (lowest id on ties) by a shared-memory reduction;
//   2. per-chunk sums of exp(l - mx) and of p_i = exp(l/T - mx/T), in double;
//   3. thread 0 adds the chunk sums in order (z), finds the chunk where the
//      running sum passes u * z, and walks that chunk element by element.
// The rule is kernels/sample_row.h's; only the summation order differs.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kSampleThreads = 256;

__global__ void SampleRowKernel(const float* __restrict__ logits, int v, float temperature,
                                const double* __restrict__ uniforms, int32_t* __restrict__ ids,
                                float* __restrict__ logp_sample, float* __restrict__ logp_raw) {
  __shared__ float s_max[kSampleThreads];
  __shared__ int s_arg[kSampleThreads];
  __shared__ double s_sum[kSampleThreads];
  __shared__ double s_z[kSampleThreads];
  const int row = blockIdx.x;
  const int t = threadIdx.x;
  const float* l = logits + static_cast<size_t>(row) * v;
  const int chunk = (v + kSampleThreads - 1) / kSampleThreads;
  const int begin = min(v, t * chunk);
  const int end = min(v, begin + chunk);

  float mx = -INFINITY;
  int arg = v;  // "none" sorts after every real id
  for (int i = begin; i < end; ++i) {
    if (l[i] > mx) {
      mx = l[i];
      arg = i;
    }
  }
  s_max[t] = mx;
  s_arg[t] = arg;
  __syncthreads();
  for (int stride = kSampleThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
      const float om = s_max[t + stride];
      const int oa = s_arg[t + stride];
      if (om > s_max[t] || (om == s_max[t] && oa < s_arg[t])) {
        s_max[t] = om;
        s_arg[t] = oa;
      }
    }
    __syncthreads();
  }
  const double gmax = s_max[0];
  const bool greedy = !(temperature > 0.f);
  const double inv_t = greedy ? 0.0 : 1.0 / temperature;
  const double zmax = gmax * inv_t;
  double sum = 0, z = 0;
  for (int i = begin; i < end; ++i) {
    sum += exp(static_cast<double>(l[i]) - gmax);
    if (!greedy) z += exp(l[i] * inv_t - zmax);
  }
  s_sum[t] = sum;
  s_z[t] = z;
  __syncthreads();
  if (t != 0) return;
  double total = 0, ztotal = 0;
  for (int c = 0; c < kSampleThreads; ++c) {
    total += s_sum[c];
    ztotal += s_z[c];
  }
  const double lse = gmax + log(total);
  int chosen = s_arg[0] < v ? s_arg[0] : 0;  // all -inf/NaN: id 0, as the host
  float lp = 0.f;
  if (!greedy) {
    const double target = uniforms[row] * ztotal;
    double acc = 0;
    chosen = v - 1;
    double p_chosen = exp(l[v - 1] * inv_t - zmax);
    bool found = false;
    for (int c = 0; c < kSampleThreads && !found; ++c) {
      if (!(target < acc + s_z[c])) {
        acc += s_z[c];
        continue;
      }
      // This chunk holds the crossing; if rounding makes the element walk
      // miss it, its last element is taken.
      const int cb = min(v, c * chunk), ce = min(v, cb + chunk);
      for (int i = cb; i < ce; ++i) {
        const double p = exp(l[i] * inv_t - zmax);
        acc += p;
        chosen = i;
        p_chosen = p;
        if (target < acc) break;
      }
      found = true;
    }
    lp = static_cast<float>(log(p_chosen / ztotal));
  }
  ids[row] = chosen;
  logp_sample[row] = lp;
  logp_raw[row] = static_cast<float>(l[chosen] - lse);
}

}  // namespace
}  // namespace tandem::kernels::cuda
