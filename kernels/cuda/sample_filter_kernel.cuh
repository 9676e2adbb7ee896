// Device code of Ops::sample_filtered (launched from sample_filter_cuda.cu;
// kept apart so the CPU emulation test runs it): one 256-thread block per
// row, the rule of kernels/sample_filter_row.h without a sort.
//
// The descending order of the penalised logits z is the order of a 32-bit
// key (the float's bits made monotone, -0 folded onto +0), ties by id. Every
// filter keeps a prefix of that order, written as a cut (K, m): the tokens
// with key > K and the m lowest ids of key K. Each cut is found by bisection
// on the key value, one pass over the row per step (at most 32 steps):
//   top-k: the largest K with count(key >= K) >= k;
//   top-p: the largest K with mass(key >= K) >= top_p * total, then m from
//          the group's equal probabilities;
//   min-p: a floor on p (p is monotone in the key), applied in every later
//          pass;
//   draw:  the largest K with mass(key >= K) > u * total, then the rank in
//          the tie group, found by one pass over contiguous id ranges.
// The repetition penalty marks the seen ids in a bitmap in dynamic shared
// memory ((V + 31) / 32 words; 19 KiB at V = 151936). Cost per row: about
// 100 passes over V in the worst case (all filters on), each reading the
// row (from L2 after the first) and computing exp in double for the mass
// passes: O(V log2(2^32)) work against O(V log V) for a sort, with no
// scratch in global memory. Sums are per-thread strided then a fixed-order
// tree, so results are deterministic; they differ from the host's in-order
// sums only in rounding, so a draw within rounding of a boundary may pick
// the neighbouring token.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kFilterThreads = 256;

struct FilterArgs {
  const float* logits;
  int v;
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float penalty;
  const int32_t* seen_offsets;  // null: no penalty
  const int32_t* seen;
  const double* uniforms;
  int32_t* ids;
  float* logp_sample;
  float* logp_raw;
};

// The arguments of one Ops::sample_filtered call (the penalty only when it is
// on and the seen ids are given), shared by CudaOps and the emulator.
inline FilterArgs MakeFilterArgs(const float* logits, int v, const SampleFilter& f, const int32_t* seen_offsets,
                                 const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                                 float* logp_raw) {
  const bool pen = f.repetition_penalty != 1.f && seen_offsets != nullptr && seen != nullptr;
  return FilterArgs{logits,
                    v,
                    f.temperature,
                    f.top_k,
                    f.top_p,
                    f.min_p,
                    f.repetition_penalty,
                    pen ? seen_offsets : nullptr,
                    pen ? seen : nullptr,
                    uniforms,
                    ids,
                    logp_sample,
                    logp_raw};
}

// Dynamic shared memory of a launch: the seen-id bitmap, (V + 31) / 32 words.
inline size_t FilterSharedBytes(const FilterArgs& a) {
  return a.seen_offsets ? static_cast<size_t>((a.v + 31) / 32) * sizeof(uint32_t) : 0;
}

__device__ __forceinline__ uint32_t FilterKey(float x) {
  if (x == 0.f) x = 0.f;  // -0 ties with +0, as on the host
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float FilterKeyValue(uint32_t k) {
  const uint32_t b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

// A product rounded once (no fused multiply-add), as the host computes it.
__device__ __forceinline__ double FilterMul(double a, double b) {
#if defined(TANDEM_CUDA_EMULATION)
  return a * b;
#else
  return __dmul_rn(a, b);
#endif
}

// Fixed-order block sums (every thread calls them; all get the total).
__device__ double FilterSum(double x, int c, double* sd, int* sc, int* c_out) {
  const int t = threadIdx.x;
  sd[t] = x;
  sc[t] = c;
  __syncthreads();
  for (int stride = kFilterThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
      sd[t] += sd[t + stride];
      sc[t] += sc[t + stride];
    }
    __syncthreads();
  }
  const double r = sd[0];
  *c_out = sc[0];
  __syncthreads();
  return r;
}

__global__ void SampleFilterKernel(FilterArgs a) {
  __shared__ double s_d[kFilterThreads];
  __shared__ int s_c[kFilterThreads];
  __shared__ float s_f[kFilterThreads];
  __shared__ float s_g[kFilterThreads];
  TANDEM_DYNAMIC_SMEM(smem);
  uint32_t* bits = reinterpret_cast<uint32_t*>(smem);
  const int row = blockIdx.x;
  const int t = threadIdx.x;
  const int v = a.v;
  const float* l = a.logits + static_cast<size_t>(row) * v;

  const bool pen = a.penalty != 1.f && a.seen_offsets != nullptr && a.seen != nullptr;
  if (pen) {
    const int words = (v + 31) / 32;
    for (int w = t; w < words; w += kFilterThreads) bits[w] = 0u;
    __syncthreads();
    const int b = a.seen_offsets[row], e = a.seen_offsets[row + 1];
    for (int j = b + t; j < e; j += kFilterThreads) {
      const int32_t tok = a.seen[j];
      if (tok >= 0 && tok < v) atomicOr(bits + (tok >> 5), 1u << (tok & 31));
    }
    __syncthreads();
  }
  auto Z = [&](int i) {
    float x = l[i];
    if (pen && ((bits[i >> 5] >> (i & 31)) & 1u)) x = x > 0 ? x / a.penalty : x * a.penalty;
    return x;
  };

  // Raw max (for lse) and the penalised argmax, lowest id on ties.
  float mx = -INFINITY, zb = -INFINITY;
  int arg = v;
  if (t < v) {
    mx = l[t];
    zb = Z(t);
    arg = t;
  }
  for (int i = t + kFilterThreads; i < v; i += kFilterThreads) {
    mx = fmaxf(mx, l[i]);
    const float x = Z(i);
    if (x > zb) {
      zb = x;
      arg = i;
    }
  }
  s_f[t] = mx;
  s_g[t] = zb;
  s_c[t] = arg;
  __syncthreads();
  for (int stride = kFilterThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
      s_f[t] = fmaxf(s_f[t], s_f[t + stride]);
      const float og = s_g[t + stride];
      const int oa = s_c[t + stride];
      if (og > s_g[t] || (og == s_g[t] && oa < s_c[t])) {
        s_g[t] = og;
        s_c[t] = oa;
      }
    }
    __syncthreads();
  }
  const double gmax = s_f[0];
  const float zarg = s_g[0];
  const int argmax = s_c[0] < v ? s_c[0] : 0;
  __syncthreads();
  double part = 0;
  for (int i = t; i < v; i += kFilterThreads) part += exp(static_cast<double>(l[i]) - gmax);
  int unused = 0;
  const double lse = gmax + log(FilterSum(part, 0, s_d, s_c, &unused));

  if (!(a.temperature > 0.f)) {
    if (t == 0) {
      a.ids[row] = argmax;
      a.logp_sample[row] = 0.f;
      a.logp_raw[row] = static_cast<float>(l[argmax] - lse);
    }
    return;
  }

  const double inv_t = 1.0 / a.temperature;
  const double zmax = FilterMul(static_cast<double>(zarg), inv_t);
  auto P = [&](float x) { return exp(FilterMul(static_cast<double>(x), inv_t) - zmax); };
  double floor_p = 0;  // min-p floor (p_arg = 1), applied once set
  // Mass (p >= floor_p only) and count of the tokens with key >= lo.
  auto Pass = [&](uint64_t lo, bool with_mass, int* count) {
    double m = 0;
    int c = 0;
    for (int i = t; i < v; i += kFilterThreads) {
      const float x = Z(i);
      if (FilterKey(x) < lo) continue;
      if (with_mass) {
        const double p = P(x);
        if (p < floor_p) continue;
        m += p;
      }
      ++c;
    }
    return FilterSum(m, c, s_d, s_c, count);
  };

  // The cut (K, m); `cut` false keeps every token.
  bool cut = false;
  uint32_t cut_key = 0;
  int cut_m = 0;
  auto GroupSize = [&](uint32_t g) {
    if (cut && g == cut_key) return cut_m;
    int ge = 0, gt = 0;
    Pass(g, false, &ge);
    Pass(static_cast<uint64_t>(g) + 1, false, &gt);
    return ge - gt;
  };
  auto CutMass = [&]() {
    int c = 0;
    if (!cut) return Pass(0, true, &c);
    double m = Pass(static_cast<uint64_t>(cut_key) + 1, true, &c);
    const double pk = P(FilterKeyValue(cut_key));
    if (pk >= floor_p) m += cut_m * pk;
    return m;
  };
  const uint64_t kTop = uint64_t{1} << 32;
  // The largest key K in [lo, 2^32) whose mass(key >= K) reaches `target`
  // (exceeds it when strict); *mass_above gets the mass of the keys > K.
  auto BisectMass = [&](uint64_t lo, double target, bool strict, double* mass_above) {
    uint64_t hi = kTop;
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      int c = 0;
      const double ms = Pass(mid, true, &c);
      if (strict ? ms > target : ms >= target) {
        lo = mid;
      } else {
        hi = mid;
        *mass_above = ms;
      }
    }
    return lo;
  };

  if (a.top_k > 0 && a.top_k < v) {
    uint64_t lo = 0, hi = kTop;
    int cnt_hi = 0;
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      int c = 0;
      Pass(mid, false, &c);
      if (c >= a.top_k) {
        lo = mid;
      } else {
        hi = mid;
        cnt_hi = c;
      }
    }
    cut = true;
    cut_key = static_cast<uint32_t>(lo);
    cut_m = a.top_k - cnt_hi;
  }
  if (a.top_p < 1.f) {
    const double x_target = static_cast<double>(a.top_p) * CutMass();
    double mass_hi = 0;
    const uint32_t g = static_cast<uint32_t>(BisectMass(cut ? cut_key : 0, x_target, false, &mass_hi));
    const int gsize = GroupSize(g);
    const double need = (x_target - mass_hi) / P(FilterKeyValue(g));
    const int j = !(need > 1.0) ? 1 : (need >= gsize ? gsize : static_cast<int>(ceil(need)));
    cut = true;
    cut_key = g;
    cut_m = j;
  }
  if (a.min_p > 0.f) floor_p = static_cast<double>(a.min_p);

  // The draw.
  const double total = CutMass();
  const double target = a.uniforms[row] * total;
  // Lowest key still kept.
  uint32_t kmin = 0xffffffffu;
  {
    const double pk = cut ? P(FilterKeyValue(cut_key)) : 0.0;
    for (int i = t; i < v; i += kFilterThreads) {
      const float x = Z(i);
      const uint32_t k = FilterKey(x);
      if (cut && k < cut_key) continue;
      if (cut && k == cut_key && (cut_m <= 0 || pk < floor_p)) continue;
      if (P(x) < floor_p) continue;
      if (k < kmin) kmin = k;
    }
    reinterpret_cast<uint32_t*>(s_c)[t] = kmin;
    __syncthreads();
    for (int stride = kFilterThreads / 2; stride > 0; stride >>= 1) {
      if (t < stride) {
        uint32_t* s = reinterpret_cast<uint32_t*>(s_c);
        if (s[t + stride] < s[t]) s[t] = s[t + stride];
      }
      __syncthreads();
    }
    kmin = reinterpret_cast<uint32_t*>(s_c)[0];
    __syncthreads();
  }
  double mass_hi = 0;
  int rank;
  const uint32_t g = static_cast<uint32_t>(target < total ? BisectMass(kmin, target, true, &mass_hi) : kmin);
  const int gsize = GroupSize(g);
  const double pg = P(FilterKeyValue(g));
  if (target < total) {
    const double before = (target - mass_hi) / pg;
    rank = !(before > 0) ? 0 : (before >= gsize - 1 ? gsize - 1 : static_cast<int>(before));
  } else {
    rank = gsize - 1;  // rounding left no crossing: the last kept token
  }

  // The rank-th lowest id of key g: counts over contiguous id ranges.
  const int chunk = (v + kFilterThreads - 1) / kFilterThreads;
  const int cb = min(v, t * chunk), ce = min(v, cb + chunk);
  int mine = 0;
  for (int i = cb; i < ce; ++i) mine += FilterKey(Z(i)) == g;
  s_c[t] = mine;
  __syncthreads();
  if (t == 0) {
    int before = 0, owner = kFilterThreads - 1;
    for (int c = 0; c < kFilterThreads; ++c) {
      if (rank < before + s_c[c]) {
        owner = c;
        break;
      }
      before += s_c[c];
    }
    int left = rank - before, pick = v - 1;
    const int ob = min(v, owner * chunk), oe = min(v, ob + chunk);
    for (int i = ob; i < oe; ++i) {
      if (FilterKey(Z(i)) != g) continue;
      pick = i;
      if (left-- == 0) break;
    }
    a.ids[row] = pick;
    a.logp_sample[row] = static_cast<float>(log(pg / total));
    a.logp_raw[row] = static_cast<float>(l[pick] - lse);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
