// Fast CPU linear attention with decay (see linear_attention_cpu.h and
// docs/kernels.md "## Linear attention").
//
// Per (sequence, head) task, chunks of kChunk tokens with b_r the cumulative
// log decay inside the chunk (b_r = g_0 + ... + g_r) and S0 the state
// entering it:
//   out_r = s exp(b_r) q_r S0 + s sum_{j<=r} exp(b_r - b_j) (q_r . k_j) v_j
//   S_end = exp(b_L) S0 + sum_j exp(b_L - b_j) k_j^T v_j
// Every exponent is <= 0 when g <= 0 (no exp(-b) factor is ever formed), so
// strong decay underflows to 0 instead of overflowing.
// Backward, chunks in reverse with dS the gradient w.r.t. the chunk's end
// state (M = the masked, decayed dout V^T; A = the masked, decayed Q K^T):
//   dq = s exp(b_r) dout S0^T + M K,   dk = M^T Q + exp(b_L - b_j) v_j dS^T
//   dv = A^T dout + exp(b_L - b_j) k_j dS
//   dS0 = s sum_r exp(b_r) q_r^T dout_r + exp(b_L) dS
// and the decay gradient from the identity (b = cumulative log decay of the
// whole sequence): dL/db_r = q_r . dq_r - k_r . dk_r (+ <S_T, dS_T> at the
// last token), dg = reverse cumulative sum of dL/db over the sequence.
// The chunk entry states come from a forward recomputation (O(T/64 Dk Dv)
// per task). Scratch: thread_local vectors that grow once.
#include "kernels/cpu/linear_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cpu/tile_gemm.h"

namespace tandem::kernels::cpu {
namespace {

using tile::TileGemm;

constexpr int kChunk = 64;
// Below this many multiply-adds a call runs on the calling thread only.
constexpr double kMinParallelWork = 1 << 18;

float Scale(const LinearAttentionParams& p) { return p.scale != 0.f ? p.scale : 1.f / std::sqrt(float(p.key_dim)); }

float* Grow(std::vector<float>& buf, size_t floats) {
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

// One (sequence, head): pointers at the sequence's first row of this head;
// row strides qs (q, k, dq, dk), vs (v, out, dv, dout), gs (log decay).
struct Task {
  const float* q;
  const float* k;
  const float* v;
  const float* g;  // nullptr: no decay
  int n;           // tokens
  ptrdiff_t qs, vs, gs;
};

// b[r] = g_0 + ... + g_r over the chunk's rows.
void Cumsum(const Task& t, int c0, int len, float* b) {
  float acc = 0.f;
  for (int r = 0; r < len; ++r) {
    if (t.g != nullptr) acc += t.g[(c0 + r) * t.gs];
    b[r] = acc;
  }
}

// kt[d * len + j] = k_j[d] (times exp(b_L - b_j) when `decayed`).
void PackKT(const Task& t, int c0, int len, int dk, const float* b, bool decayed, float* kt) {
  for (int j = 0; j < len; ++j) {
    const float* kj = t.k + (c0 + j) * t.qs;
    const float e = decayed ? std::exp(b[len - 1] - b[j]) : 1.f;
    for (int d = 0; d < dk; ++d) kt[d * len + j] = kj[d] * e;
  }
}

// a[r][j] = scale exp(b_r - b_j) a[r][j] for j <= r, 0 above the diagonal.
void MaskDecay(int len, const float* b, float scale, float* a) {
  for (int r = 0; r < len; ++r) {
    float* row = a + r * len;
    for (int j = 0; j <= r; ++j) row[j] *= scale * std::exp(b[r] - b[j]);
    for (int j = r + 1; j < len; ++j) row[j] = 0.f;
  }
}

// s = exp(b_L) s + sum_j exp(b_L - b_j) k_j^T v_j; kt scratch [dk, len].
void AdvanceState(const Task& t, int c0, int len, int dk, int dv, const float* b, float* kt, float* s) {
  const float el = std::exp(b[len - 1]);
  if (el != 1.f)
    for (int e = 0; e < dk * dv; ++e) s[e] *= el;
  PackKT(t, c0, len, dk, b, true, kt);
  TileGemm(dk, dv, len, kt, len, 1, t.v + c0 * t.vs, t.vs, s, dv, true);
}

struct ForwardScratch {
  std::vector<float> kt, a, b;
};

// Runs the chunks of one task; s holds the entering state and leaves with
// the final one.
void ForwardTask(const Task& t, int dk, int dv, float scale, float* out, float* s) {
  thread_local ForwardScratch sc;
  float* kt = Grow(sc.kt, size_t(dk) * kChunk);
  float* a = Grow(sc.a, size_t(kChunk) * kChunk);
  float* b = Grow(sc.b, kChunk);
  for (int c0 = 0; c0 < t.n; c0 += kChunk) {
    const int len = std::min(kChunk, t.n - c0);
    const float* qc = t.q + c0 * t.qs;
    float* oc = out + c0 * t.vs;
    Cumsum(t, c0, len, b);
    // Inter-chunk: out_r = s exp(b_r) q_r S0.
    TileGemm(len, dv, dk, qc, t.qs, 1, s, dv, oc, t.vs, false);
    for (int r = 0; r < len; ++r) {
      const float e = scale * std::exp(b[r]);
      for (int j = 0; j < dv; ++j) oc[r * t.vs + j] *= e;
    }
    // Intra-chunk: out += (mask(Q K^T) decayed) V.
    PackKT(t, c0, len, dk, b, false, kt);
    TileGemm(len, len, dk, qc, t.qs, 1, kt, len, a, len, false);
    MaskDecay(len, b, scale, a);
    TileGemm(len, dv, len, a, len, 1, t.v + c0 * t.vs, t.vs, oc, t.vs, true);
    AdvanceState(t, c0, len, dk, dv, b, kt, s);
  }
}

struct BackwardScratch {
  std::vector<float> states, kt, vt, a, m, b, s0t, dst, ds, tmp, dos;
};

// Backward of one task: dq, dk, dv rows written; db (the gradient w.r.t. the
// cumulative log decay, rows at stride t.gs) written when db != nullptr;
// ds enters as d_final (or zeros) and leaves as d_initial.
void BackwardTask(const Task& t, int dk, int dv, float scale, const float* initial, const float* dout, float* dq,
                  float* dkk, float* dvv, float* db, float* ds, const float* d_final) {
  thread_local BackwardScratch sc;
  const int nch = (t.n + kChunk - 1) / kChunk;
  const size_t ns = size_t(dk) * dv;
  float* states = Grow(sc.states, ns * (nch + 1));
  float* kt = Grow(sc.kt, size_t(dk) * kChunk);
  float* vt = Grow(sc.vt, size_t(dv) * kChunk);
  float* a = Grow(sc.a, size_t(kChunk) * kChunk);
  float* m = Grow(sc.m, size_t(kChunk) * kChunk);
  float* b = Grow(sc.b, kChunk);
  float* s0t = Grow(sc.s0t, ns);
  float* dst = Grow(sc.dst, ns);
  float* tmp = Grow(sc.tmp, size_t(kChunk) * std::max(dk, dv));
  float* dos = Grow(sc.dos, size_t(kChunk) * dv);
  // Chunk entry states: states[c] enters chunk c; states[nch] is the last.
  if (initial != nullptr) {
    std::memcpy(states, initial, ns * sizeof(float));
  } else {
    std::memset(states, 0, ns * sizeof(float));
  }
  for (int c = 0; c < nch; ++c) {
    const int c0 = c * kChunk, len = std::min(kChunk, t.n - c0);
    std::memcpy(states + ns * (c + 1), states + ns * c, ns * sizeof(float));
    Cumsum(t, c0, len, b);
    AdvanceState(t, c0, len, dk, dv, b, kt, states + ns * (c + 1));
  }
  for (int c = nch - 1; c >= 0; --c) {
    const int c0 = c * kChunk, len = std::min(kChunk, t.n - c0);
    const float* s0 = states + ns * c;
    const float *qc = t.q + c0 * t.qs, *kc = t.k + c0 * t.qs, *vc = t.v + c0 * t.vs, *doc = dout + c0 * t.vs;
    float *dqc = dq + c0 * t.qs, *dkc = dkk + c0 * t.qs, *dvc = dvv + c0 * t.vs;
    Cumsum(t, c0, len, b);
    const float bl = b[len - 1];
    // dq = s exp(b_r) dout_r S0^T + M K.
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j) s0t[j * dk + i] = s0[i * dv + j];
    TileGemm(len, dk, dv, doc, t.vs, 1, s0t, dk, dqc, t.qs, false);
    for (int r = 0; r < len; ++r) {
      const float e = scale * std::exp(b[r]);
      for (int i = 0; i < dk; ++i) dqc[r * t.qs + i] *= e;
    }
    for (int r = 0; r < len; ++r)
      for (int j = 0; j < dv; ++j) vt[j * len + r] = vc[r * t.vs + j];
    TileGemm(len, len, dv, doc, t.vs, 1, vt, len, m, len, false);
    MaskDecay(len, b, scale, m);
    TileGemm(len, dk, len, m, len, 1, kc, t.qs, dqc, t.qs, true);
    // dk = M^T Q + exp(b_L - b_j) v_j dS^T.
    TileGemm(len, dk, len, m, 1, len, qc, t.qs, dkc, t.qs, false);
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j) dst[j * dk + i] = ds[i * dv + j];
    TileGemm(len, dk, dv, vc, t.vs, 1, dst, dk, tmp, dk, false);
    for (int r = 0; r < len; ++r) {
      const float e = std::exp(bl - b[r]);
      for (int i = 0; i < dk; ++i) dkc[r * t.qs + i] += e * tmp[r * dk + i];
    }
    // dv = A^T dout + exp(b_L - b_j) k_j dS.
    PackKT(t, c0, len, dk, b, false, kt);
    TileGemm(len, len, dk, qc, t.qs, 1, kt, len, a, len, false);
    MaskDecay(len, b, scale, a);
    TileGemm(len, dv, len, a, 1, len, doc, t.vs, dvc, t.vs, false);
    TileGemm(len, dv, dk, kc, t.qs, 1, ds, dv, tmp, dv, false);
    for (int r = 0; r < len; ++r) {
      const float e = std::exp(bl - b[r]);
      for (int j = 0; j < dv; ++j) dvc[r * t.vs + j] += e * tmp[r * dv + j];
    }
    if (db != nullptr) {
      for (int r = 0; r < len; ++r) {
        double acc = 0;
        for (int i = 0; i < dk; ++i)
          acc += double(qc[r * t.qs + i]) * dqc[r * t.qs + i] - double(kc[r * t.qs + i]) * dkc[r * t.qs + i];
        db[(c0 + r) * t.gs] = float(acc);
      }
    }
    // dS0 = s sum_r exp(b_r) q_r^T dout_r + exp(b_L) dS.
    for (int r = 0; r < len; ++r) {
      const float e = scale * std::exp(b[r]);
      for (int j = 0; j < dv; ++j) dos[r * dv + j] = e * doc[r * t.vs + j];
    }
    const float el = std::exp(bl);
    if (el != 1.f)
      for (size_t e = 0; e < ns; ++e) ds[e] *= el;
    TileGemm(dk, dv, len, qc, 1, t.qs, dos, dv, ds, dv, true);
  }
  if (db != nullptr && t.n > 0) {
    // The last state's own dependence on b_T, then dg = reverse cumsum.
    if (d_final != nullptr) {
      double acc = 0;
      const float* sl = states + ns * nch;
      for (size_t e = 0; e < ns; ++e) acc += double(sl[e]) * d_final[e];
      db[(t.n - 1) * t.gs] += float(acc);
    }
    double run = 0;
    for (int r = t.n - 1; r >= 0; --r) {
      run += db[r * t.gs];
      db[r * t.gs] = float(run);
    }
  }
}

Task MakeTask(const LinearAttentionParams& p, const float* q, const float* k, const float* v, const float* g,
              const int32_t* cu, int b, int h) {
  const int H = p.num_heads;
  const size_t row = size_t(cu[b]) * H + h;
  return Task{
      q + row * p.key_dim, k + row * p.key_dim,      v + row * p.value_dim,      g != nullptr ? g + row : nullptr,
      cu[b + 1] - cu[b],   ptrdiff_t(H) * p.key_dim, ptrdiff_t(H) * p.value_dim, ptrdiff_t(H)};
}

double Work(const LinearAttentionParams& p, int t) {
  return double(t) * p.num_heads * p.key_dim * (p.value_dim + kChunk) * 2;
}

}  // namespace

void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                              const float* log_decay, const int32_t* cu, int num_seqs, int t,
                              const float* initial_state, float* out, float* final_state) {
  if (num_seqs <= 0) return;
  const int H = p.num_heads, dk = p.key_dim, dv = p.value_dim;
  const float scale = Scale(p);
  const size_t ns = size_t(dk) * dv;
  const int tasks = num_seqs * H;
#pragma omp parallel for schedule(dynamic) num_threads(CpuThreads()) if (Work(p, t) >= kMinParallelWork && tasks > 1)
  for (int task = 0; task < tasks; ++task) {
    const int b = task / H, h = task % H;
    thread_local std::vector<float> state;
    float* s = Grow(state, ns);
    const size_t off = size_t(task) * ns;
    if (initial_state != nullptr) {
      std::memcpy(s, initial_state + off, ns * sizeof(float));
    } else {
      std::memset(s, 0, ns * sizeof(float));
    }
    const Task tk = MakeTask(p, q, k, v, log_decay, cu, b, h);
    ForwardTask(tk, dk, dv, scale, out + (size_t(cu[b]) * H + h) * dv, s);
    if (final_state != nullptr) std::memcpy(final_state + off, s, ns * sizeof(float));
  }
}

void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                               const float* log_decay, const int32_t* cu, int num_seqs, int t,
                               const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                               float* dk, float* dv, float* d_log_decay, float* d_initial_state) {
  const int H = p.num_heads, kd = p.key_dim, vd = p.value_dim;
  const float scale = Scale(p);
  const size_t ns = size_t(kd) * vd;
  const int end = num_seqs > 0 ? cu[num_seqs] : 0;
  float* db = log_decay != nullptr ? d_log_decay : nullptr;
  // Rows outside every sequence get zero gradients.
  if (t > end) {
    const size_t r0 = size_t(end) * H, rows = size_t(t - end) * H;
    std::memset(dq + r0 * kd, 0, rows * kd * sizeof(float));
    std::memset(dk + r0 * kd, 0, rows * kd * sizeof(float));
    std::memset(dv + r0 * vd, 0, rows * vd * sizeof(float));
    if (db != nullptr) std::memset(db + r0, 0, rows * sizeof(float));
  }
  if (num_seqs <= 0) return;
  const int tasks = num_seqs * H;
#pragma omp parallel for schedule(dynamic) num_threads(CpuThreads()) if (Work(p, t) >= kMinParallelWork && tasks > 1)
  for (int task = 0; task < tasks; ++task) {
    const int b = task / H, h = task % H;
    thread_local std::vector<float> dstate;
    float* ds = Grow(dstate, ns);
    const size_t off = size_t(task) * ns;
    const float* dfin = d_final_state != nullptr ? d_final_state + off : nullptr;
    if (dfin != nullptr) {
      std::memcpy(ds, dfin, ns * sizeof(float));
    } else {
      std::memset(ds, 0, ns * sizeof(float));
    }
    const Task tk = MakeTask(p, q, k, v, log_decay, cu, b, h);
    const size_t row = size_t(cu[b]) * H + h;
    BackwardTask(tk, kd, vd, scale, initial_state != nullptr ? initial_state + off : nullptr, dout + row * vd,
                 dq + row * kd, dk + row * kd, dv + row * vd, db != nullptr ? db + row : nullptr, ds, dfin);
    if (d_initial_state != nullptr) std::memcpy(d_initial_state + off, ds, ns * sizeof(float));
  }
}

}  // namespace tandem::kernels::cpu
