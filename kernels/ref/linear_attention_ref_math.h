// Reference linear attention with decay as templates over the storage type T
// (float for the reference backend, double for finite-difference checks):
// the plain recurrence, one token at a time, double accumulators.
//
//   S_t = exp(g_t) S_{t-1} + k_t^T v_t     (S [Dk, Dv] per sequence and head)
//   out_t = scale * q_t S_t
//
// Backward, from the same recurrence run in reverse (dS_t = gradient of the
// loss w.r.t. S_t, dS_last = d_final_state):
//   dS_t = scale q_t^T dout_t + exp(g_{t+1}) dS_{t+1}
//   dq_t = scale dout_t S_t^T,  dk_t = dS_t v_t,  dv_t = k_t dS_t
//   dg_t = exp(g_t) <S_{t-1}, dS_t>,  d_initial = exp(g_0) dS_0
// The reference keeps every state of a (sequence, head) in memory: O(T Dk Dv),
// fine for test sizes.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace tandem::kernels::ref {

inline double LinearAttentionScale(const LinearAttentionParams& p) {
  return p.scale != 0.f ? double(p.scale) : 1.0 / std::sqrt(double(p.key_dim));
}

template <typename T>
void LinearAttentionForwardT(const LinearAttentionParams& p, const T* q, const T* k, const T* v, const T* g,
                             const int32_t* cu, int num_seqs, const T* initial_state, T* out, T* final_state) {
  const int H = p.num_heads, Dk = p.key_dim, Dv = p.value_dim;
  const double scale = LinearAttentionScale(p);
  std::vector<double> s(size_t(Dk) * Dv);
  for (int b = 0; b < num_seqs; ++b) {
    for (int h = 0; h < H; ++h) {
      const size_t st = (size_t(b) * H + h) * Dk * Dv;
      for (size_t e = 0; e < s.size(); ++e) s[e] = initial_state != nullptr ? double(initial_state[st + e]) : 0.0;
      for (int t = cu[b]; t < cu[b + 1]; ++t) {
        const double decay = g != nullptr ? std::exp(double(g[size_t(t) * H + h])) : 1.0;
        const T* kt = k + (size_t(t) * H + h) * Dk;
        const T* vt = v + (size_t(t) * H + h) * Dv;
        const T* qt = q + (size_t(t) * H + h) * Dk;
        for (int i = 0; i < Dk; ++i)
          for (int j = 0; j < Dv; ++j)
            s[size_t(i) * Dv + j] = decay * s[size_t(i) * Dv + j] + double(kt[i]) * double(vt[j]);
        T* ot = out + (size_t(t) * H + h) * Dv;
        for (int j = 0; j < Dv; ++j) {
          double acc = 0;
          for (int i = 0; i < Dk; ++i) acc += double(qt[i]) * s[size_t(i) * Dv + j];
          ot[j] = T(scale * acc);
        }
      }
      if (final_state != nullptr)
        for (size_t e = 0; e < s.size(); ++e) final_state[st + e] = T(s[e]);
    }
  }
}

template <typename T>
void LinearAttentionBackwardT(const LinearAttentionParams& p, const T* q, const T* k, const T* v, const T* g,
                              const int32_t* cu, int num_seqs, const T* initial_state, const T* dout, const T* d_final,
                              T* dq, T* dk, T* dv, T* dg, T* d_initial) {
  const int H = p.num_heads, Dk = p.key_dim, Dv = p.value_dim;
  const size_t ns = size_t(Dk) * Dv;
  const double scale = LinearAttentionScale(p);
  std::vector<double> states, ds(ns);
  for (int b = 0; b < num_seqs; ++b) {
    const int t0 = cu[b], n = cu[b + 1] - cu[b];
    for (int h = 0; h < H; ++h) {
      auto gate = [&](int t) { return g != nullptr ? std::exp(double(g[size_t(t) * H + h])) : 1.0; };
      const size_t st = (size_t(b) * H + h) * ns;
      // states[r + 1] = S after token r of the sequence; states[0] = initial.
      states.assign(ns * (n + 1), 0.0);
      if (initial_state != nullptr)
        for (size_t e = 0; e < ns; ++e) states[e] = double(initial_state[st + e]);
      for (int r = 0; r < n; ++r) {
        const int t = t0 + r;
        const double decay = gate(t);
        const T* kt = k + (size_t(t) * H + h) * Dk;
        const T* vt = v + (size_t(t) * H + h) * Dv;
        const double* prev = &states[ns * r];
        double* cur = &states[ns * (r + 1)];
        for (int i = 0; i < Dk; ++i)
          for (int j = 0; j < Dv; ++j)
            cur[size_t(i) * Dv + j] = decay * prev[size_t(i) * Dv + j] + double(kt[i]) * double(vt[j]);
      }
      for (size_t e = 0; e < ns; ++e) ds[e] = d_final != nullptr ? double(d_final[st + e]) : 0.0;
      for (int r = n - 1; r >= 0; --r) {
        const int t = t0 + r;
        if (r < n - 1) {
          const double next = gate(t + 1);
          for (double& x : ds) x *= next;
        }
        const T* qt = q + (size_t(t) * H + h) * Dk;
        const T* kt = k + (size_t(t) * H + h) * Dk;
        const T* vt = v + (size_t(t) * H + h) * Dv;
        const T* dot = dout + (size_t(t) * H + h) * Dv;
        for (int i = 0; i < Dk; ++i)
          for (int j = 0; j < Dv; ++j) ds[size_t(i) * Dv + j] += scale * double(qt[i]) * double(dot[j]);
        const double* cur = &states[ns * (r + 1)];
        const double* prev = &states[ns * r];
        for (int i = 0; i < Dk; ++i) {
          double aq = 0, ak = 0;
          for (int j = 0; j < Dv; ++j) {
            aq += double(dot[j]) * cur[size_t(i) * Dv + j];
            ak += ds[size_t(i) * Dv + j] * double(vt[j]);
          }
          dq[(size_t(t) * H + h) * Dk + i] = T(scale * aq);
          dk[(size_t(t) * H + h) * Dk + i] = T(ak);
        }
        for (int j = 0; j < Dv; ++j) {
          double av = 0;
          for (int i = 0; i < Dk; ++i) av += double(kt[i]) * ds[size_t(i) * Dv + j];
          dv[(size_t(t) * H + h) * Dv + j] = T(av);
        }
        if (g != nullptr && dg != nullptr) {
          double acc = 0;
          for (size_t e = 0; e < ns; ++e) acc += prev[e] * ds[e];
          dg[size_t(t) * H + h] = T(gate(t) * acc);
        }
      }
      if (d_initial != nullptr) {
        const double first = n > 0 ? gate(t0) : 1.0;
        for (size_t e = 0; e < ns; ++e) d_initial[st + e] = T(first * ds[e]);
      }
    }
  }
}

}  // namespace tandem::kernels::ref
