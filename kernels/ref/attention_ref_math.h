// Reference attention math as templates over the storage type T (float for
// the reference backend, double for finite-difference gradient checks).
// Plain loops, double accumulators, one score row materialised at a time.
//
// Semantics (shared with every backend, see kernels/ops.h):
//  * q [T, H, D], k/v [T, Hkv, D], out [T, H, D], lse [T, H]; query head h
//    reads kv head h / (H / Hkv).
//  * Packed varlen: rows cu_seqlens[b]..cu_seqlens[b+1]-1 are sequence b;
//    positions restart at 0 in every sequence; no attention across sequences.
//  * Visible keys of query i (0-based inside its sequence of length n):
//      causal:     max(0, i - window + 1) <= j <= i
//      non-causal: max(0, i - window + 1) <= j <  min(n, i + window)
//    where window <= 0 means unlimited (the non-causal window is symmetric).
//    Attention sinks (causal with a window, sinks > 0): keys j < sinks are
//    visible as well (still j <= i).
//    Every row sees at least its own key, so no row is empty.
//  * scale == 0 means 1/sqrt(D); lse = natural log of sum_j exp(scale q.k_j).
//  * Decode is always causal: new token r of sequence b sits at position
//    cache_len[b] - n_new + r and sees cache positions [lo, pos] (window).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace tandem::kernels::ref {

// Visible keys of query i of a sequence of length n: [0, sink_hi) and
// [lo, hi) (sink_hi <= lo; sink_hi = 0 without sinks). Walk them with
// for (j = FirstKey(r); j < r.hi; j = NextKey(r, j)).
struct KeyRange {
  int lo;
  int hi;
  int sink_hi = 0;
};

inline KeyRange VisibleKeys(const AttentionParams& p, int i, int n) {
  const bool windowed = p.window > 0;
  KeyRange r;
  r.lo = windowed ? std::max(0, i - p.window + 1) : 0;
  if (p.causal) {
    r.hi = i + 1;
  } else {
    r.hi = windowed ? std::min(n, i + p.window) : n;
  }
  r.sink_hi = p.causal && windowed && p.sinks > 0 ? std::min(p.sinks, r.lo) : 0;
  return r;
}

inline int FirstKey(const KeyRange& r) { return r.sink_hi > 0 ? 0 : r.lo; }
inline int NextKey(const KeyRange& r, int j) { return j + 1 == r.sink_hi ? r.lo : j + 1; }

inline double AttentionScale(const AttentionParams& p) {
  return p.scale != 0.f ? static_cast<double>(p.scale) : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
}

template <typename T>
void AttentionForwardT(const AttentionParams& p, const T* q, const T* k, const T* v, const int32_t* cu_seqlens,
                       int num_seqs, T* out, T* lse) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const double scale = AttentionScale(p);
  std::vector<double> s, acc(D);
  for (int b = 0; b < num_seqs; ++b) {
    const int start = cu_seqlens[b];
    const int n = cu_seqlens[b + 1] - start;
    s.resize(n);
    for (int h = 0; h < H; ++h) {
      const int hk = h / group;
      for (int i = b == 0 ? p.skip_query_rows : 0; i < n; ++i) {
        const T* qi = q + (static_cast<int64_t>(start + i) * H + h) * D;
        const KeyRange r = VisibleKeys(p, i, n);
        double m = -INFINITY;
        for (int j = FirstKey(r); j < r.hi; j = NextKey(r, j)) {
          const T* kj = k + (static_cast<int64_t>(start + j) * Hkv + hk) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qi[d]) * double(kj[d]);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = FirstKey(r); j < r.hi; j = NextKey(r, j)) {
          const double pj = std::exp(s[j] - m);
          l += pj;
          const T* vj = v + (static_cast<int64_t>(start + j) * Hkv + hk) * D;
          for (int d = 0; d < D; ++d) acc[d] += pj * double(vj[d]);
        }
        T* oi = out + (static_cast<int64_t>(start + i) * H + h) * D;
        for (int d = 0; d < D; ++d) oi[d] = static_cast<T>(acc[d] / l);
        lse[static_cast<int64_t>(start + i) * H + h] = static_cast<T>(m + std::log(l));
      }
    }
  }
}

// dq, dk, dv overwritten. Uses the saved out and lse like the fast kernels:
// P = exp(S - lse), D_i = rowsum(dO_i * O_i), dS = P * (dP - D_i).
template <typename T>
void AttentionBackwardT(const AttentionParams& p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                        const T* lse, const int32_t* cu_seqlens, int num_seqs, int t, T* dq, T* dk, T* dv) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const double scale = AttentionScale(p);
  // Double accumulators for dk/dv over the whole batch (O(T) memory).
  std::vector<double> dk_acc(static_cast<size_t>(t) * Hkv * D, 0.0);
  std::vector<double> dv_acc(static_cast<size_t>(t) * Hkv * D, 0.0);
  std::vector<double> dq_acc(D);
  // Rows outside every sequence (t > cu_seqlens[num_seqs]) get zeros.
  std::fill(dq, dq + static_cast<size_t>(t) * H * D, T(0));
  for (int b = 0; b < num_seqs; ++b) {
    const int start = cu_seqlens[b];
    const int n = cu_seqlens[b + 1] - start;
    for (int h = 0; h < H; ++h) {
      const int hk = h / group;
      for (int i = b == 0 ? p.skip_query_rows : 0; i < n; ++i) {
        const int64_t row = static_cast<int64_t>(start + i) * H + h;
        const T* qi = q + row * D;
        const T* oi = out + row * D;
        const T* doi = dout + row * D;
        double di = 0;
        for (int d = 0; d < D; ++d) di += double(doi[d]) * double(oi[d]);
        const double lse_i = double(lse[row]);
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        const KeyRange r = VisibleKeys(p, i, n);
        for (int j = FirstKey(r); j < r.hi; j = NextKey(r, j)) {
          const int64_t krow = static_cast<int64_t>(start + j) * Hkv + hk;
          const T* kj = k + krow * D;
          const T* vj = v + krow * D;
          double dot = 0, dp = 0;
          for (int d = 0; d < D; ++d) {
            dot += double(qi[d]) * double(kj[d]);
            dp += double(doi[d]) * double(vj[d]);
          }
          const double pij = std::exp(dot * scale - lse_i);
          const double ds = pij * (dp - di) * scale;
          double* dkj = dk_acc.data() + krow * D;
          double* dvj = dv_acc.data() + krow * D;
          for (int d = 0; d < D; ++d) {
            dvj[d] += pij * double(doi[d]);
            dkj[d] += ds * double(qi[d]);
            dq_acc[d] += ds * double(kj[d]);
          }
        }
        for (int d = 0; d < D; ++d) dq[row * D + d] = static_cast<T>(dq_acc[d]);
      }
    }
  }
  for (size_t x = 0; x < dk_acc.size(); ++x) {
    dk[x] = static_cast<T>(dk_acc[x]);
    dv[x] = static_cast<T>(dv_acc[x]);
  }
}

template <typename T>
void DecodeAttentionT(const AttentionParams& p, const T* q, int batch, int n_new, const T* k_cache, const T* v_cache,
                      int cache_capacity, const int32_t* cache_len, T* out) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const double scale = AttentionScale(p);
  std::vector<double> s, acc(D);
  AttentionParams causal = p;
  causal.causal = true;
  for (int b = 0; b < batch; ++b) {
    const int len = cache_len[b];
    const T* kb = k_cache + static_cast<int64_t>(b) * cache_capacity * Hkv * D;
    const T* vb = v_cache + static_cast<int64_t>(b) * cache_capacity * Hkv * D;
    s.resize(len);
    for (int r = 0; r < n_new; ++r) {
      const int pos = len - n_new + r;
      const KeyRange kr = VisibleKeys(causal, pos, len);
      for (int h = 0; h < H; ++h) {
        const int hk = h / group;
        const int64_t row = (static_cast<int64_t>(b) * n_new + r) * H + h;
        const T* qi = q + row * D;
        double m = -INFINITY;
        for (int j = FirstKey(kr); j < kr.hi; j = NextKey(kr, j)) {
          const T* kj = kb + (static_cast<int64_t>(j) * Hkv + hk) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qi[d]) * double(kj[d]);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = FirstKey(kr); j < kr.hi; j = NextKey(kr, j)) {
          const double pj = std::exp(s[j] - m);
          l += pj;
          const T* vj = vb + (static_cast<int64_t>(j) * Hkv + hk) * D;
          for (int d = 0; d < D; ++d) acc[d] += pj * double(vj[d]);
        }
        for (int d = 0; d < D; ++d) out[row * D + d] = static_cast<T>(acc[d] / l);
      }
    }
  }
}

}  // namespace tandem::kernels::ref
