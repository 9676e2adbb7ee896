// Device code of the FlashAttention-2 style backward (see
// attention_bwd_cuda.cu). Kept in a header, apart from the host launch code,
// so the CPU emulation test (kernels/cuda/emu/) can run it without a GPU.
#pragma once

#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

// One warp per (token, head) row.
__global__ void AttnDeltaKernel(const float* __restrict__ out, const float* __restrict__ dout, size_t rows, int d,
                                float* __restrict__ delta) {
  const size_t warps_total = static_cast<size_t>(gridDim.x) * (blockDim.x / kWarp);
  const int lane = threadIdx.x % kWarp;
  for (size_t r = blockIdx.x * static_cast<size_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; r < rows;
       r += warps_total) {
    const float* o = out + r * d;
    const float* g = dout + r * d;
    float acc = 0.f;
    for (int j = lane; j < d; j += kWarp) acc += o[j] * g[j];
    acc = WarpSum(acc);
    if (lane == 0) delta[r] = acc;
  }
}

template <int kMaxD, int kBr, int kBc>
constexpr size_t BwdSmemBytes() {
  return sizeof(float) * (static_cast<size_t>(2 * kBc + 2 * kBr) * (kMaxD + 1) + 2 * kBr * (kBc + 1) + 2 * kBr);
}

template <int kMaxD, int kBr, int kBc>
__global__ void __launch_bounds__(kAttnThreads) AttnBwdKernel(const AttnBwdArgs a) {
  constexpr int kRi = kBr / 16;  // query rows per thread
  constexpr int kCi = kBc / 16;  // key rows per thread (dK, dV ownership)
  constexpr int kCj = kBc / 16;  // key columns per thread (score tiles)
  constexpr int kDj = kMaxD / 16;
  constexpr int kLd = kMaxD + 1;
  constexpr int kLp = kBc + 1;
  TANDEM_DYNAMIC_SMEM(smem);
  float* ks = smem;
  float* vs = ks + kBc * kLd;
  float* qs = vs + kBc * kLd;
  float* dos = qs + kBr * kLd;
  float* ps = dos + kBr * kLd;
  float* dss = ps + kBr * kLp;
  float* lse_s = dss + kBr * kLp;
  float* delta_s = lse_s + kBr;

  int seq, tile;
  if (!FindTile(a.cu_seqlens, a.num_seqs, kBc, blockIdx.x, &seq, &tile)) return;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  const int kb = tile * kBc;
  const int hk = blockIdx.y;
  const int group = a.num_heads / a.num_kv_heads;
  const int d = a.head_dim;
  const int tid = threadIdx.x;
  const int tx = tid & 15;
  const int ty = tid >> 4;
  const size_t q_stride = static_cast<size_t>(a.num_heads) * d;
  const size_t kv_stride = static_cast<size_t>(a.num_kv_heads) * d;
  const size_t kv_off = static_cast<size_t>(start) * kv_stride + static_cast<size_t>(hk) * d;

  for (int idx = tid; idx < kBc * d; idx += kAttnThreads) {
    const int r = idx / d;
    const int c = idx - r * d;
    const int row = kb + r;
    const bool in = row < len;
    ks[r * kLd + c] = in ? a.k[kv_off + row * kv_stride + c] : 0.f;
    vs[r * kLd + c] = in ? a.v[kv_off + row * kv_stride + c] : 0.f;
  }

  float dk[kCi][kDj], dv[kCi][kDj];
#pragma unroll
  for (int i = 0; i < kCi; ++i)
#pragma unroll
    for (int j = 0; j < kDj; ++j) {
      dk[i][j] = 0.f;
      dv[i][j] = 0.f;
    }

  int q_lo, q_hi;
  QueryRange(kb, min(kb + kBc, len) - 1, len, a.causal, a.window, a.sinks, &q_lo, &q_hi);
  // Whole query tiles of key-only rows are skipped (uniform per block).
  const int q_first = seq == 0 ? max((q_lo / kBr) * kBr, (a.skip_query_rows / kBr) * kBr) : (q_lo / kBr) * kBr;
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    const size_t q_off = static_cast<size_t>(start) * q_stride + static_cast<size_t>(h) * d;
    for (int qb = q_first; qb < q_hi; qb += kBr) {
      __syncthreads();  // previous tile's readers are done
      for (int idx = tid; idx < kBr * d; idx += kAttnThreads) {
        const int r = idx / d;
        const int c = idx - r * d;
        const int row = qb + r;
        const bool in = row < len;
        qs[r * kLd + c] = in ? a.q[q_off + row * q_stride + c] : 0.f;
        dos[r * kLd + c] = in ? a.dout[q_off + row * q_stride + c] : 0.f;
      }
      for (int r = tid; r < kBr; r += kAttnThreads) {
        const int row = qb + r;
        const size_t li = static_cast<size_t>(start + row) * a.num_heads + h;
        lse_s[r] = row < len ? a.lse[li] : 0.f;
        delta_s[r] = row < len ? a.delta[li] : 0.f;
      }
      __syncthreads();

      float s[kRi][kCj], dp[kRi][kCj];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kCj; ++j) {
          s[i][j] = 0.f;
          dp[i][j] = 0.f;
        }
      for (int dd = 0; dd < d; ++dd) {
        float qv[kRi], ov[kRi], kv[kCj], vv[kCj];
#pragma unroll
        for (int i = 0; i < kRi; ++i) {
          qv[i] = qs[(ty + 16 * i) * kLd + dd];
          ov[i] = dos[(ty + 16 * i) * kLd + dd];
        }
#pragma unroll
        for (int j = 0; j < kCj; ++j) {
          kv[j] = ks[(tx + 16 * j) * kLd + dd];
          vv[j] = vs[(tx + 16 * j) * kLd + dd];
        }
#pragma unroll
        for (int i = 0; i < kRi; ++i)
#pragma unroll
          for (int j = 0; j < kCj; ++j) {
            s[i][j] = fmaf(qv[i], kv[j], s[i][j]);
            dp[i][j] = fmaf(ov[i], vv[j], dp[i][j]);
          }
      }
#pragma unroll
      for (int i = 0; i < kRi; ++i) {
        const int r = ty + 16 * i;
        const int qi = qb + r;
#pragma unroll
        for (int j = 0; j < kCj; ++j) {
          const int c = tx + 16 * j;
          const int kj = kb + c;
          const bool vis = qi < len && kj < len && Visible(qi, kj, a.causal, a.window, a.sinks);
          const float p = vis ? expf(s[i][j] * a.scale - lse_s[r]) : 0.f;
          ps[r * kLp + c] = p;
          dss[r * kLp + c] = p * (dp[i][j] - delta_s[r]) * a.scale;
        }
      }
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q (scale folded into dS).
      for (int r = 0; r < kBr; ++r) {
        float pv[kCi], dsv[kCi], ov[kDj], qv[kDj];
#pragma unroll
        for (int i = 0; i < kCi; ++i) {
          pv[i] = ps[r * kLp + ty + 16 * i];
          dsv[i] = dss[r * kLp + ty + 16 * i];
        }
#pragma unroll
        for (int j = 0; j < kDj; ++j) {
          ov[j] = dos[r * kLd + tx + 16 * j];
          qv[j] = qs[r * kLd + tx + 16 * j];
        }
#pragma unroll
        for (int i = 0; i < kCi; ++i)
#pragma unroll
          for (int j = 0; j < kDj; ++j) {
            dv[i][j] = fmaf(pv[i], ov[j], dv[i][j]);
            dk[i][j] = fmaf(dsv[i], qv[j], dk[i][j]);
          }
      }

      // dQ[r] += dS[r, :] K (this key tile's share), atomically.
      float dq[kRi][kDj];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kDj; ++j) dq[i][j] = 0.f;
      for (int c = 0; c < kBc; ++c) {
        float dsv[kRi], kv[kDj];
#pragma unroll
        for (int i = 0; i < kRi; ++i) dsv[i] = dss[(ty + 16 * i) * kLp + c];
#pragma unroll
        for (int j = 0; j < kDj; ++j) kv[j] = ks[c * kLd + tx + 16 * j];
#pragma unroll
        for (int i = 0; i < kRi; ++i)
#pragma unroll
          for (int j = 0; j < kDj; ++j) dq[i][j] = fmaf(dsv[i], kv[j], dq[i][j]);
      }
#pragma unroll
      for (int i = 0; i < kRi; ++i) {
        const int qi = qb + ty + 16 * i;
        if (qi >= len) continue;
        float* dqrow = a.dq + q_off + static_cast<size_t>(qi) * q_stride;
#pragma unroll
        for (int j = 0; j < kDj; ++j) {
          const int col = tx + 16 * j;
          if (col < d) atomicAdd(dqrow + col, dq[i][j]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kCi; ++i) {
    const int kj = kb + ty + 16 * i;
    if (kj >= len) continue;
    const size_t off = kv_off + static_cast<size_t>(kj) * kv_stride;
#pragma unroll
    for (int j = 0; j < kDj; ++j) {
      const int col = tx + 16 * j;
      if (col < d) {
        a.dk[off + col] = dk[i][j];
        a.dv[off + col] = dv[i][j];
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
