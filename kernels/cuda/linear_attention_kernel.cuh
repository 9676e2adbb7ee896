// Device code of linear attention with decay (see linear_attention_cuda.cu):
// the recurrence S_t = exp(g_t) S_{t-1} + k_t^T v_t, out_t = scale q_t S_t,
// one block per (value-column block, head, sequence), one thread per state
// column j (S[:, j] in registers, kMaxDk values), q_t and k_t staged in
// shared memory. Backward in three kernels:
//   * LinAttnDqKernel (forward sweep): dq_t = scale dout_t S_t^T, reduced over
//     the columns by warp shuffles and one atomicAdd per warp and element;
//     also adds <S_T, dS_T> to d_log_decay at the last token.
//   * LinAttnDsKernel (reverse sweep): dS_t = scale q_t^T dout_t +
//     exp(g_{t+1}) dS_{t+1}; dv_t = k_t dS_t (per column, direct),
//     dk_t = dS_t v_t (atomicAdd per warp), d_initial = exp(g_0) dS_0.
//   * LinAttnDecayKernel: dL/db_t = q_t . dq_t - k_t . dk_t (+ the last-token
//     term already in d_log_decay), d_log_decay = its reverse cumsum.
// Kept in a header, apart from the host launch code, so the CPU emulation
// test (kernels/cuda/emu/) runs it without a GPU.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kLinThreads = 64;  // state columns per block

struct LinAttnArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* g;  // nullptr: no decay
  const int32_t* cu;
  const float* initial;  // nullptr: zeros
  const float* dout;     // backward
  const float* d_final;  // backward; nullptr: zeros
  float* out;            // forward
  float* final_state;    // forward; nullptr: not kept
  float* dq;             // backward (zeroed before)
  float* dk;             // backward (zeroed before)
  float* dv;             // backward
  float* dg;             // backward (zeroed before); nullptr: skipped
  float* d_initial;      // backward; nullptr: skipped
  int num_heads;
  int dk_dim;
  int dv_dim;
  float scale;
};

template <typename F>
bool DispatchLinAttn(int key_dim, F&& f) {
  if (key_dim <= 32) {
    f.template operator()<32>();
  } else if (key_dim <= 64) {
    f.template operator()<64>();
  } else if (key_dim <= 128) {
    f.template operator()<128>();
  } else if (key_dim <= 256) {
    f.template operator()<256>();
  } else {
    return false;
  }
  return true;
}

__device__ __forceinline__ float LinDecay(const LinAttnArgs& a, int t, int h) {
  return a.g != nullptr ? expf(a.g[static_cast<size_t>(t) * a.num_heads + h]) : 1.f;
}

// Stages row t of head h of x ([T, H, dim]) in shared memory.
__device__ __forceinline__ void LinStage(const float* x, int t, int h, int H, int dim, float* sh) {
  const float* row = x + (static_cast<size_t>(t) * H + h) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) sh[i] = row[i];
}

template <int kMaxDk>
__global__ void __launch_bounds__(kLinThreads) LinAttnFwdKernel(const LinAttnArgs a) {
  __shared__ float qs[kMaxDk];
  __shared__ float ks[kMaxDk];
  const int h = blockIdx.y, b = blockIdx.z;
  const int j = blockIdx.x * kLinThreads + threadIdx.x;
  const bool col = j < a.dv_dim;
  const int H = a.num_heads, dk = a.dk_dim, dv = a.dv_dim;
  const size_t st = (static_cast<size_t>(b) * H + h) * dk * dv;
  float s[kMaxDk];
#pragma unroll
  for (int i = 0; i < kMaxDk; ++i)
    s[i] = (col && i < dk && a.initial != nullptr) ? a.initial[st + size_t(i) * dv + j] : 0.f;
  for (int t = a.cu[b]; t < a.cu[b + 1]; ++t) {
    LinStage(a.q, t, h, H, dk, qs);
    LinStage(a.k, t, h, H, dk, ks);
    __syncthreads();
    if (col) {
      const float e = LinDecay(a, t, h);
      const float vj = a.v[(static_cast<size_t>(t) * H + h) * dv + j];
      float o = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxDk; ++i) {
        if (i < dk) {
          s[i] = e * s[i] + ks[i] * vj;
          o += qs[i] * s[i];
        }
      }
      a.out[(static_cast<size_t>(t) * H + h) * dv + j] = a.scale * o;
    }
    __syncthreads();
  }
  if (col && a.final_state != nullptr) {
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i)
      if (i < dk) a.final_state[st + size_t(i) * dv + j] = s[i];
  }
}

template <int kMaxDk>
__global__ void __launch_bounds__(kLinThreads) LinAttnDqKernel(const LinAttnArgs a) {
  __shared__ float ks[kMaxDk];
  const int h = blockIdx.y, b = blockIdx.z;
  const int j = blockIdx.x * kLinThreads + threadIdx.x;
  const bool col = j < a.dv_dim;
  const int lane = threadIdx.x % kWarp;
  const int H = a.num_heads, dk = a.dk_dim, dv = a.dv_dim;
  const size_t st = (static_cast<size_t>(b) * H + h) * dk * dv;
  float s[kMaxDk];
#pragma unroll
  for (int i = 0; i < kMaxDk; ++i)
    s[i] = (col && i < dk && a.initial != nullptr) ? a.initial[st + size_t(i) * dv + j] : 0.f;
  const int t0 = a.cu[b], t1 = a.cu[b + 1];
  for (int t = t0; t < t1; ++t) {
    LinStage(a.k, t, h, H, dk, ks);
    __syncthreads();
    const size_t row = static_cast<size_t>(t) * H + h;
    const float e = LinDecay(a, t, h);
    const float vj = col ? a.v[row * dv + j] : 0.f;
    const float doj = col ? a.dout[row * dv + j] : 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i) {
      if (i < dk) {
        s[i] = e * s[i] + ks[i] * vj;
        const float part = WarpSum(doj * s[i]);
        if (lane == 0) atomicAdd(&a.dq[row * dk + i], a.scale * part);
      }
    }
    __syncthreads();
  }
  if (a.dg != nullptr && a.g != nullptr && a.d_final != nullptr && t1 > t0) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i)
      if (col && i < dk) acc += s[i] * a.d_final[st + size_t(i) * dv + j];
    acc = WarpSum(acc);
    if (lane == 0) atomicAdd(&a.dg[static_cast<size_t>(t1 - 1) * H + h], acc);
  }
}

template <int kMaxDk>
__global__ void __launch_bounds__(kLinThreads) LinAttnDsKernel(const LinAttnArgs a) {
  __shared__ float qs[kMaxDk];
  __shared__ float ks[kMaxDk];
  const int h = blockIdx.y, b = blockIdx.z;
  const int j = blockIdx.x * kLinThreads + threadIdx.x;
  const bool col = j < a.dv_dim;
  const int lane = threadIdx.x % kWarp;
  const int H = a.num_heads, dk = a.dk_dim, dv = a.dv_dim;
  const size_t st = (static_cast<size_t>(b) * H + h) * dk * dv;
  float ds[kMaxDk];
#pragma unroll
  for (int i = 0; i < kMaxDk; ++i)
    ds[i] = (col && i < dk && a.d_final != nullptr) ? a.d_final[st + size_t(i) * dv + j] : 0.f;
  const int t0 = a.cu[b], t1 = a.cu[b + 1];
  for (int t = t1 - 1; t >= t0; --t) {
    LinStage(a.q, t, h, H, dk, qs);
    LinStage(a.k, t, h, H, dk, ks);
    __syncthreads();
    const size_t row = static_cast<size_t>(t) * H + h;
    const float next = t + 1 < t1 ? LinDecay(a, t + 1, h) : 1.f;
    const float vj = col ? a.v[row * dv + j] : 0.f;
    const float doj = col ? a.dout[row * dv + j] : 0.f;
    float dvj = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i) {
      if (i < dk) {
        ds[i] = col ? next * ds[i] + a.scale * qs[i] * doj : 0.f;
        dvj += ks[i] * ds[i];
        const float part = WarpSum(ds[i] * vj);
        if (lane == 0) atomicAdd(&a.dk[row * dk + i], part);
      }
    }
    if (col) a.dv[row * dv + j] = dvj;
    __syncthreads();
  }
  if (col && a.d_initial != nullptr) {
    const float first = t1 > t0 ? LinDecay(a, t0, h) : 1.f;
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i)
      if (i < dk) a.d_initial[st + size_t(i) * dv + j] = first * ds[i];
  }
}

// One thread per (sequence, head): d_log_decay = reverse cumsum of
// q . dq - k . dk (+ what the dq kernel put there).
__global__ void LinAttnDecayKernel(const LinAttnArgs a, int num_seqs) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= num_seqs * a.num_heads) return;
  const int b = idx / a.num_heads, h = idx % a.num_heads;
  const int dk = a.dk_dim;
  float run = 0.f;
  for (int t = a.cu[b + 1] - 1; t >= a.cu[b]; --t) {
    const size_t row = static_cast<size_t>(t) * a.num_heads + h;
    float acc = a.dg[row];
    for (int i = 0; i < dk; ++i) acc += a.q[row * dk + i] * a.dq[row * dk + i] - a.k[row * dk + i] * a.dk[row * dk + i];
    run += acc;
    a.dg[row] = run;
  }
}

__global__ void LinAttnZeroKernel(float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) x[i] = 0.f;
}

}  // namespace
}  // namespace tandem::kernels::cuda
