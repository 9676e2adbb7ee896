// Fast CPU attention, FlashAttention-2 style (see attention_cpu.h and
// docs/kernels.md "## Attention").
//
// All matrix work goes through one register-blocked AVX2 micro-kernel,
// C[M, N] (+)= sum_k A(m, k) * B[k, n]: A is read by scalar broadcast with
// arbitrary strides (so q, k, v, dout are read in place, never copied), B is a
// row-major panel whose rows are contiguous over n (8-wide vectors).
//
//  * Forward, per task (sequence, head, tile of kBr query rows): the tile's
//    queries are packed transposed, QT[d][i] (pre-multiplied by
//    scale*log2(e)); for each tile of kBc keys, S^T[j][i] = K_j . QT (lanes =
//    queries), masked (causal / window / sequence end), online softmax in
//    base 2 over the lanes (running max m and sum l per query), O^T[d][i]
//    rescaled by exp2(m_old - m_new) then O^T += V^T P^T. At the end
//    out = O / l and lse = ln(2) * m + ln(l). Only the tile scratch exists.
//  * Backward: Delta_i = rowsum(dO_i * O_i) first. Then, in the default
//    "fused" mode, one task per (sequence, kv head): for each key tile K^T
//    and V^T are packed once; every query row of every head of the GQA group
//    that sees the tile recomputes P = exp2(S*c - lse2) (lanes = keys),
//    dP = dO V^T, dS = P (dP - Delta) * scale, and accumulates
//    dV^T += dO^T P, dK^T += Q^T dS in tile scratch, and dQ += dS K straight
//    into dq (the task owns those dq rows, so there are no atomics).
//    When there are too few (sequence, kv head) tasks for the threads (e.g.
//    one long sequence with one kv head), the backward runs in two passes:
//    dK/dV over (sequence, kv head, key tile) tasks, then dQ over (sequence,
//    head, query tile) tasks that recompute S, P and dP (transposed layout,
//    lanes = queries).
//  * Decode: the forward tile machinery with the tile's rows being the
//    (new token, head of the GQA group) pairs of one (batch, kv head), keys
//    read from the cache in place.
//
// Scratch: per OpenMP thread, thread_local vectors sized by the tiles (a few
// times kBr * max(D, kBc) floats) that grow once and are reused; Delta [T, H]
// (O(T)) in a thread_local vector of the calling thread. Nothing is
// allocated in steady state.
#include "kernels/cpu/attention_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/ref/attention_ref_math.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int kBr = 64;  // query rows per tile
constexpr int kBc = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Below this many multiply-adds a call runs on the calling thread only.
constexpr double kMinParallelWork = 1 << 18;

// ---------------------------------------------------------------------------
// SIMD helpers.

// 2^x on 8 lanes: round-to-nearest range reduction, Cephes exp2f degree-6
// polynomial on [-0.5, 0.5] (relative error ~2e-7). x <= -127 (and -inf)
// gives exactly 0; x is clamped at 127 above.
inline __m256 Exp2x8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-127.f));
  x = _mm256_min_ps(x, _mm256_set1_ps(127.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  // n = -127 builds the bit pattern 0 (exactly 0.0f).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

using tile::TileGemm;

// Thread-local scratch that grows to the largest request and is reused.
float* Scratch(std::vector<float>& buf, size_t floats) {
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

struct ForwardScratch {
  std::vector<float> qt, st, ot, m, l, alpha, lo, hi, sink;
};

ForwardScratch& ThreadForwardScratch(int d) {
  thread_local ForwardScratch s;
  const size_t dd = static_cast<size_t>(std::max(d, 1));
  Scratch(s.qt, dd * kBr);
  Scratch(s.st, static_cast<size_t>(kBc) * kBr);
  Scratch(s.ot, dd * kBr);
  Scratch(s.m, kBr);
  Scratch(s.l, kBr);
  Scratch(s.alpha, kBr);
  Scratch(s.lo, kBr);
  Scratch(s.hi, kBr);
  Scratch(s.sink, kBr);
  return s;
}

// One forward query tile: up to kBr rows with their own query/output
// pointers and visible keys [0, sink_hi) and [lo, hi) (indices into the kv
// rows that start at kbase/vbase, row stride kv_stride).
struct QueryTile {
  int rows = 0;
  const float* q[kBr];
  float* o[kBr];
  float* lse[kBr];  // entries may be nullptr
  int lo[kBr];
  int hi[kBr];
  int sink_hi[kBr];  // attention sinks below the window (0: none)
};

inline void SetKeys(QueryTile* t, int i, const ref::KeyRange& kr) {
  t->lo[i] = kr.lo;
  t->hi[i] = kr.hi;
  t->sink_hi[i] = kr.sink_hi;
}

void ForwardTile(const QueryTile& t, int d, const float* kbase, const float* vbase, ptrdiff_t kv_stride, float c) {
  ForwardScratch& s = ThreadForwardScratch(d);
  float* __restrict qt = s.qt.data();
  float* __restrict st = s.st.data();
  float* __restrict ot = s.ot.data();
  float* __restrict mrow = s.m.data();
  float* __restrict lrow = s.l.data();
  float* __restrict alpha = s.alpha.data();
  float* __restrict lof = s.lo.data();
  float* __restrict hif = s.hi.data();
  float* __restrict sinkf = s.sink.data();
  const int rows = t.rows;
  const int lanes = (rows + 7) & ~7;
  int min_lo = t.lo[0], jend = t.hi[0];
  int max_lo = t.lo[0], min_hi = t.hi[0], max_sink = 0;
  for (int i = 0; i < kBr; ++i) {
    if (i < rows) {
      const float* qi = t.q[i];
      for (int x = 0; x < d; ++x) qt[x * kBr + i] = qi[x] * c;
      lof[i] = static_cast<float>(t.lo[i]);
      hif[i] = static_cast<float>(t.hi[i]);
      sinkf[i] = static_cast<float>(t.sink_hi[i]);
      min_lo = std::min(min_lo, t.lo[i]);
      jend = std::max(jend, t.hi[i]);
      max_lo = std::max(max_lo, t.lo[i]);
      min_hi = std::min(min_hi, t.hi[i]);
      max_sink = std::max(max_sink, t.sink_hi[i]);
    } else {
      // Padding lanes: never output; in full tiles they compute on zeros.
      for (int x = 0; x < d; ++x) qt[x * kBr + i] = 0.f;
      lof[i] = 0.f;
      hif[i] = 0.f;  // padding lanes see nothing
      sinkf[i] = 0.f;
    }
    mrow[i] = -INFINITY;
    lrow[i] = 0.f;
  }
  std::memset(ot, 0, sizeof(float) * d * kBr);
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  const int jbegin = max_sink > 0 ? 0 : min_lo;
  for (int j0 = jbegin; j0 < jend; j0 += kBc) {
    const int cols = std::min(kBc, jend - j0);
    if (j0 >= max_sink && j0 + cols <= min_lo) continue;  // between the sinks and every window
    // Every row sees every key of the tile: no masking needed.
    const bool full_tile = max_lo <= j0 && j0 + cols <= min_hi;
    // S^T[j][i] = K_j . QT[:, i]
    TileGemm(cols, lanes, d, kbase + j0 * kv_stride, kv_stride, 1, qt, kBr, st, kBr, false);
    for (int i0 = 0; i0 < lanes; i0 += 8) {
      const __m256 lo = _mm256_loadu_ps(lof + i0);
      const __m256 hi = _mm256_loadu_ps(hif + i0);
      const __m256 sk = _mm256_loadu_ps(sinkf + i0);
      const __m256 m_old = _mm256_loadu_ps(mrow + i0);
      __m256 mx = neg_inf;
      if (full_tile) {
        for (int j = 0; j < cols; ++j) {
          mx = _mm256_max_ps(mx, _mm256_loadu_ps(st + j * kBr + i0));
        }
      } else {
        for (int j = 0; j < cols; ++j) {
          const __m256 jf = _mm256_set1_ps(static_cast<float>(j0 + j));
          const __m256 vis =
              _mm256_or_ps(_mm256_and_ps(_mm256_cmp_ps(jf, lo, _CMP_GE_OQ), _mm256_cmp_ps(jf, hi, _CMP_LT_OQ)),
                           _mm256_cmp_ps(jf, sk, _CMP_LT_OQ));
          float* sp = st + j * kBr + i0;
          const __m256 sv = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(sp), vis);
          _mm256_storeu_ps(sp, sv);
          mx = _mm256_max_ps(mx, sv);
        }
      }
      const __m256 m_new = _mm256_max_ps(m_old, mx);
      // Rows that have seen no key yet keep m = -inf; subtract 0 for them.
      const __m256 m_use = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
      const __m256 al = Exp2x8(_mm256_sub_ps(m_old, m_use));
      __m256 sum = _mm256_setzero_ps();
      for (int j = 0; j < cols; ++j) {
        float* sp = st + j * kBr + i0;
        const __m256 pv = Exp2x8(_mm256_sub_ps(_mm256_loadu_ps(sp), m_use));
        _mm256_storeu_ps(sp, pv);
        sum = _mm256_add_ps(sum, pv);
      }
      _mm256_storeu_ps(lrow + i0, _mm256_fmadd_ps(_mm256_loadu_ps(lrow + i0), al, sum));
      _mm256_storeu_ps(mrow + i0, m_new);
      _mm256_storeu_ps(alpha + i0, al);
    }
    // O^T *= alpha (per query lane), then O^T[x][i] += sum_j V[j][x] P^T[j][i].
    for (int x = 0; x < d; ++x) {
      float* orow = ot + x * kBr;
      for (int i0 = 0; i0 < lanes; i0 += 8) {
        _mm256_storeu_ps(orow + i0, _mm256_mul_ps(_mm256_loadu_ps(orow + i0), _mm256_loadu_ps(alpha + i0)));
      }
    }
    TileGemm(d, lanes, cols, vbase + j0 * kv_stride, 1, kv_stride, st, kBr, ot, kBr, true);
  }
  for (int i = 0; i < rows; ++i) {
    const float inv = 1.f / lrow[i];
    float* oi = t.o[i];
    for (int x = 0; x < d; ++x) oi[x] = ot[x * kBr + i] * inv;
    if (t.lse[i] != nullptr) *t.lse[i] = mrow[i] * kLn2 + std::log(lrow[i]);
  }
}

// Per-call task index: (sequence, tile) prefix counts, kept in a
// thread_local vector of the calling thread (grows once).
struct TileIndex {
  std::vector<int64_t> prefix;  // prefix[b] = tiles in sequences < b
  int64_t total = 0;
};

void BuildTileIndex(const int32_t* cu, int num_seqs, int tile, TileIndex* idx) {
  if (idx->prefix.size() < static_cast<size_t>(num_seqs) + 1) {
    idx->prefix.resize(num_seqs + 1);
  }
  idx->prefix[0] = 0;
  for (int b = 0; b < num_seqs; ++b) {
    const int n = cu[b + 1] - cu[b];
    idx->prefix[b + 1] = idx->prefix[b] + (n + tile - 1) / tile;
  }
  idx->total = idx->prefix[num_seqs];
}

// Maps x in [0, total) to (sequence, tile): tiles are handed out from the
// last (largest causal work) to the first within each sequence.
inline void LocateTile(const TileIndex& idx, int num_seqs, int64_t x, int* b, int* tile) {
  const int64_t* p = idx.prefix.data();
  const int64_t* it = std::upper_bound(p, p + num_seqs + 1, x);
  *b = static_cast<int>(it - p) - 1;
  const int64_t ntiles = p[*b + 1] - p[*b];
  *tile = static_cast<int>(ntiles - 1 - (x - p[*b]));
}

// Queries of a sequence of length n that see at least one key of [j0, j1).
inline ref::KeyRange VisibleQueries(const AttentionParams& p, int j0, int j1, int n) {
  const bool windowed = p.window > 0;
  ref::KeyRange r;
  if (p.causal) {
    r.lo = j0;
  } else {
    r.lo = windowed ? std::max(0, j0 - p.window + 1) : 0;
  }
  r.hi = windowed ? std::min(n, j1 - 1 + p.window) : n;
  if (p.causal && windowed && j0 < p.sinks) r.hi = n;  // a sink key: every later query
  return r;
}

inline float ScaleOf(const AttentionParams& p) { return static_cast<float>(ref::AttentionScale(p)); }

// ---------------------------------------------------------------------------
// Backward.

struct BackwardScratch {
  std::vector<float> kt, vt, dkt, dvt, s, ds, qt, dot, dqt, lse2, delta, lo, hi, sink;
};

BackwardScratch& ThreadBackwardScratch(int d) {
  thread_local BackwardScratch s;
  const size_t dd = static_cast<size_t>(std::max(d, 1));
  const size_t tile = static_cast<size_t>(std::max(kBr, kBc));
  Scratch(s.kt, dd * kBc);
  Scratch(s.vt, dd * kBc);
  Scratch(s.dkt, dd * kBc);
  Scratch(s.dvt, dd * kBc);
  Scratch(s.s, tile * tile);
  Scratch(s.ds, tile * tile);
  Scratch(s.qt, dd * kBr);
  Scratch(s.dot, dd * kBr);
  Scratch(s.dqt, dd * kBr);
  Scratch(s.lse2, kBr);
  Scratch(s.delta, kBr);
  Scratch(s.lo, kBr);
  Scratch(s.hi, kBr);
  Scratch(s.sink, kBr);
  return s;
}

struct BackwardArgs {
  AttentionParams p;
  const float* q;
  const float* k;
  const float* v;
  const float* dout;
  const float* lse;
  const float* delta;  // [T, H]
  float* dq;
  float* dk;
  float* dv;
  float c;  // scale * log2(e)
  float scale;
};

// dK, dV (and, when with_dq, dQ += ...) for the key tile [j0, j0+cols) of
// sequence (start, n), kv head hk: loops over every head of the GQA group and
// every query row that sees the tile.
void BackwardKeyTile(const BackwardArgs& a, int start, int n, int hk, int j0, int cols, bool with_dq) {
  const AttentionParams& p = a.p;
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const ptrdiff_t qs = static_cast<ptrdiff_t>(H) * D;
  const ptrdiff_t ks = static_cast<ptrdiff_t>(Hkv) * D;
  BackwardScratch& s = ThreadBackwardScratch(D);
  float* __restrict kt = s.kt.data();
  float* __restrict vt = s.vt.data();
  float* __restrict dkt = s.dkt.data();
  float* __restrict dvt = s.dvt.data();
  float* __restrict sp = s.s.data();
  float* __restrict dsp = s.ds.data();
  const float* kblk = a.k + (static_cast<ptrdiff_t>(start) + j0) * ks + hk * D;
  const float* vblk = a.v + (static_cast<ptrdiff_t>(start) + j0) * ks + hk * D;
  for (int j = 0; j < cols; ++j) {
    for (int x = 0; x < D; ++x) {
      kt[x * kBc + j] = kblk[j * ks + x];
      vt[x * kBc + j] = vblk[j * ks + x];
    }
  }
  for (int x = 0; x < D; ++x) {
    for (int j = cols; j < kBc; ++j) kt[x * kBc + j] = vt[x * kBc + j] = 0.f;
  }
  std::memset(dkt, 0, sizeof(float) * D * kBc);
  std::memset(dvt, 0, sizeof(float) * D * kBc);
  ref::KeyRange qr = VisibleQueries(p, j0, j0 + cols, n);
  // Whole query tiles of key-only rows are skipped (the tiles keep their
  // bounds, so the sums run in the same order).
  if (start == 0 && p.skip_query_rows > qr.lo) qr.lo += (p.skip_query_rows - qr.lo) / kBr * kBr;
  const int jvecs = (cols + 7) / 8;
  // Scratch tiles are computed on whole 8-lane vectors (no masked
  // loads/stores, which are slow on AMD); the extra lanes are never output.
  const int cols8 = jvecs * 8;
  const __m256 jbase = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 cv = _mm256_set1_ps(a.c);
  const __m256 scv = _mm256_set1_ps(a.scale);
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    for (int i0 = qr.lo; i0 < qr.hi; i0 += kBr) {
      const int rows = std::min(kBr, qr.hi - i0);
      const ptrdiff_t row0 = static_cast<ptrdiff_t>(start) + i0;
      const float* qblk = a.q + row0 * qs + h * D;
      const float* doblk = a.dout + row0 * qs + h * D;
      // S = Q K^T, dP = dO V^T (lanes = keys).
      TileGemm(rows, cols8, D, qblk, qs, 1, kt, kBc, sp, kBc, false);
      TileGemm(rows, cols8, D, doblk, qs, 1, vt, kBc, dsp, kBc, false);
      for (int i = 0; i < rows; ++i) {
        const ref::KeyRange kr = ref::VisibleKeys(p, i0 + i, n);
        // Visible lanes: kr.lo <= j0 + lane < kr.hi, lane < cols.
        const __m256 lo = _mm256_set1_ps(static_cast<float>(kr.lo - j0));
        const __m256 hi = _mm256_set1_ps(static_cast<float>(std::min(kr.hi - j0, cols)));
        const __m256 sk = _mm256_set1_ps(static_cast<float>(std::min(kr.sink_hi - j0, cols)));
        const ptrdiff_t r = (row0 + i) * H + h;
        const __m256 l2 = _mm256_set1_ps(a.lse[r] * kLog2e);
        const __m256 di = _mm256_set1_ps(a.delta[r]);
        float* srow = sp + i * kBc;
        float* dsrow = dsp + i * kBc;
        // Lanes past `cols` are never read by the GEMMs below.
        const bool full_row = kr.lo <= j0 && j0 + cols <= kr.hi;
        for (int jv = 0; jv < jvecs; ++jv) {
          __m256 pv = Exp2x8(_mm256_fmsub_ps(_mm256_loadu_ps(srow + 8 * jv), cv, l2));
          if (!full_row) {
            const __m256 jf = _mm256_add_ps(jbase, _mm256_set1_ps(8.f * jv));
            const __m256 window = _mm256_and_ps(_mm256_cmp_ps(jf, lo, _CMP_GE_OQ), _mm256_cmp_ps(jf, hi, _CMP_LT_OQ));
            pv = _mm256_and_ps(pv, _mm256_or_ps(window, _mm256_cmp_ps(jf, sk, _CMP_LT_OQ)));
          }
          _mm256_storeu_ps(srow + 8 * jv, pv);
          const __m256 dpv = _mm256_loadu_ps(dsrow + 8 * jv);
          _mm256_storeu_ps(dsrow + 8 * jv, _mm256_mul_ps(_mm256_mul_ps(pv, _mm256_sub_ps(dpv, di)), scv));
        }
      }
      // dV^T[x][j] += sum_i dO[i][x] P[i][j]; dK^T[x][j] += sum_i Q[i][x] dS[i][j].
      TileGemm(D, cols8, rows, doblk, 1, qs, sp, kBc, dvt, kBc, true);
      TileGemm(D, cols8, rows, qblk, 1, qs, dsp, kBc, dkt, kBc, true);
      if (with_dq) {
        // dQ[i][x] += sum_j dS[i][j] K[j][x]  (this task owns these dq rows)
        TileGemm(rows, D, cols, dsp, kBc, 1, kblk, ks, a.dq + row0 * qs + h * D, qs, true);
      }
    }
  }
  float* dkblk = a.dk + (static_cast<ptrdiff_t>(start) + j0) * ks + hk * D;
  float* dvblk = a.dv + (static_cast<ptrdiff_t>(start) + j0) * ks + hk * D;
  for (int j = 0; j < cols; ++j) {
    for (int x = 0; x < D; ++x) {
      dkblk[j * ks + x] = dkt[x * kBc + j];
      dvblk[j * ks + x] = dvt[x * kBc + j];
    }
  }
}

// dQ for query tile [i0, i0+rows) of head h (two-pass mode): lanes =
// queries, recomputes S^T, P^T, dP^T for every key tile the rows see.
void BackwardQueryTile(const BackwardArgs& a, int start, int n, int h, int i0, int rows) {
  const AttentionParams& p = a.p;
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int hk = h / (H / Hkv);
  const ptrdiff_t qs = static_cast<ptrdiff_t>(H) * D;
  const ptrdiff_t ks = static_cast<ptrdiff_t>(Hkv) * D;
  BackwardScratch& s = ThreadBackwardScratch(D);
  float* __restrict qt = s.qt.data();
  float* __restrict dot = s.dot.data();
  float* __restrict dqt = s.dqt.data();
  float* __restrict st = s.s.data();
  float* __restrict dst = s.ds.data();
  float* __restrict l2 = s.lse2.data();
  float* __restrict dl = s.delta.data();
  float* __restrict lof = s.lo.data();
  float* __restrict hif = s.hi.data();
  float* __restrict sinkf = s.sink.data();
  const ptrdiff_t row0 = static_cast<ptrdiff_t>(start) + i0;
  int min_lo = n, jend = 0, max_sink = 0;
  for (int i = 0; i < kBr; ++i) {
    if (i < rows) {
      const float* qi = a.q + (row0 + i) * qs + h * D;
      const float* doi = a.dout + (row0 + i) * qs + h * D;
      for (int x = 0; x < D; ++x) {
        qt[x * kBr + i] = qi[x];
        dot[x * kBr + i] = doi[x];
      }
      const ptrdiff_t r = (row0 + i) * H + h;
      l2[i] = a.lse[r] * kLog2e;
      dl[i] = a.delta[r];
      const ref::KeyRange kr = ref::VisibleKeys(p, i0 + i, n);
      lof[i] = static_cast<float>(kr.lo);
      hif[i] = static_cast<float>(kr.hi);
      sinkf[i] = static_cast<float>(kr.sink_hi);
      min_lo = std::min(min_lo, kr.lo);
      jend = std::max(jend, kr.hi);
      max_sink = std::max(max_sink, kr.sink_hi);
    } else {
      for (int x = 0; x < D; ++x) qt[x * kBr + i] = dot[x * kBr + i] = 0.f;
      l2[i] = dl[i] = lof[i] = hif[i] = sinkf[i] = 0.f;
    }
  }
  std::memset(dqt, 0, sizeof(float) * D * kBr);
  const int lanes = (rows + 7) & ~7;
  const __m256 cv = _mm256_set1_ps(a.c);
  const __m256 scv = _mm256_set1_ps(a.scale);
  const float* kseq = a.k + static_cast<ptrdiff_t>(start) * ks + hk * D;
  const float* vseq = a.v + static_cast<ptrdiff_t>(start) * ks + hk * D;
  const int jbegin = max_sink > 0 ? 0 : min_lo;
  for (int j0 = jbegin; j0 < jend; j0 += kBc) {
    const int cols = std::min(kBc, jend - j0);
    if (j0 >= max_sink && j0 + cols <= min_lo) continue;  // between the sinks and every window
    TileGemm(cols, lanes, D, kseq + j0 * ks, ks, 1, qt, kBr, st, kBr, false);
    TileGemm(cols, lanes, D, vseq + j0 * ks, ks, 1, dot, kBr, dst, kBr, false);
    for (int j = 0; j < cols; ++j) {
      const __m256 jf = _mm256_set1_ps(static_cast<float>(j0 + j));
      for (int i = 0; i < lanes; i += 8) {
        const __m256 vis = _mm256_or_ps(_mm256_and_ps(_mm256_cmp_ps(jf, _mm256_loadu_ps(lof + i), _CMP_GE_OQ),
                                                      _mm256_cmp_ps(jf, _mm256_loadu_ps(hif + i), _CMP_LT_OQ)),
                                        _mm256_cmp_ps(jf, _mm256_loadu_ps(sinkf + i), _CMP_LT_OQ));
        __m256 pv = Exp2x8(_mm256_fmsub_ps(_mm256_loadu_ps(st + j * kBr + i), cv, _mm256_loadu_ps(l2 + i)));
        pv = _mm256_and_ps(pv, vis);
        const __m256 dpv = _mm256_loadu_ps(dst + j * kBr + i);
        _mm256_storeu_ps(dst + j * kBr + i,
                         _mm256_mul_ps(_mm256_mul_ps(pv, _mm256_sub_ps(dpv, _mm256_loadu_ps(dl + i))), scv));
      }
    }
    // dQ^T[x][i] += sum_j K[j][x] dS^T[j][i]
    TileGemm(D, lanes, cols, kseq + j0 * ks, 1, ks, dst, kBr, dqt, kBr, true);
  }
  for (int i = 0; i < rows; ++i) {
    float* dqi = a.dq + (row0 + i) * qs + h * D;
    for (int x = 0; x < D; ++x) dqi[x] = dqt[x * kBr + i];
  }
}

}  // namespace

void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const float c = ScaleOf(p) * kLog2e;
  // thread_local of the calling thread; the OpenMP workers reach it through
  // this reference (naming a thread_local inside the region would give each
  // worker its own, empty, instance).
  thread_local TileIndex idx_storage;
  const TileIndex& idx = idx_storage;
  BuildTileIndex(cu_seqlens, num_seqs, kBr, &idx_storage);
  const int64_t ntasks = idx.total * H;
  const ptrdiff_t qs = static_cast<ptrdiff_t>(H) * D;
  const ptrdiff_t ks = static_cast<ptrdiff_t>(Hkv) * D;
  const bool par = static_cast<double>(ntasks) * kBr * kBr * D >= kMinParallelWork;
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(dynamic, 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    int b, tile;
    LocateTile(idx, num_seqs, task / H, &b, &tile);
    const int h = static_cast<int>(task % H);
    const int start = cu_seqlens[b];
    const int n = cu_seqlens[b + 1] - start;
    const int i0 = tile * kBr;
    QueryTile qt;
    qt.rows = std::min(kBr, n - i0);
    if (b == 0 && i0 + qt.rows <= p.skip_query_rows) continue;  // key-only rows
    for (int i = 0; i < qt.rows; ++i) {
      const ptrdiff_t row = static_cast<ptrdiff_t>(start) + i0 + i;
      qt.q[i] = q + row * qs + h * D;
      qt.o[i] = out + row * qs + h * D;
      qt.lse[i] = lse + row * H + h;
      SetKeys(&qt, i, ref::VisibleKeys(p, i0 + i, n));
    }
    const ptrdiff_t kv0 = static_cast<ptrdiff_t>(start) * ks + (h / group) * D;
    ForwardTile(qt, D, k + kv0, v + kv0, ks, c);
  }
}

void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                        const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t, float* dq,
                        float* dk, float* dv) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const int used = cu_seqlens[num_seqs];
  const ptrdiff_t qs = static_cast<ptrdiff_t>(H) * D;
  const ptrdiff_t ks = static_cast<ptrdiff_t>(Hkv) * D;
  // Rows outside every sequence: zero gradients.
  if (t > used) {
    std::memset(dq + used * qs, 0, sizeof(float) * (t - used) * qs);
    std::memset(dk + used * ks, 0, sizeof(float) * (t - used) * ks);
    std::memset(dv + used * ks, 0, sizeof(float) * (t - used) * ks);
  }
  thread_local std::vector<float> delta_buf;
  float* delta = Scratch(delta_buf, static_cast<size_t>(std::max(used, 1)) * H);
  const int64_t nrows = static_cast<int64_t>(used) * H;
  const int threads = CpuThreads();
#pragma omp parallel for num_threads(threads) if (nrows * D >= kMinParallelWork) schedule(static)
  for (int64_t r = 0; r < nrows; ++r) {
    const float* o = out + r * D;
    const float* g = dout + r * D;
    __m256 acc = _mm256_setzero_ps();
    int x = 0;
    for (; x + 8 <= D; x += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(o + x), _mm256_loadu_ps(g + x), acc);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    double sum = 0;
    for (int l = 0; l < 8; ++l) sum += lanes[l];
    for (; x < D; ++x) sum += double(o[x]) * double(g[x]);
    delta[r] = static_cast<float>(sum);
  }
  BackwardArgs a{p, q, k, v, dout, lse, delta, dq, dk, dv, ScaleOf(p) * kLog2e, ScaleOf(p)};
  // Fused single pass when the (sequence, kv head) tasks balance over the
  // threads: the largest must be at most 1/(2*threads) of the total work.
  double total = 0, largest = 0;
  for (int b = 0; b < num_seqs; ++b) {
    const double n = cu_seqlens[b + 1] - cu_seqlens[b];
    total += n * n * Hkv;
    largest = std::max(largest, n * n);
  }
  const bool par = total * group * D >= kMinParallelWork;
  const bool fused = threads == 1 || !par || largest * 2 * threads <= total;
  if (fused) {
    const int64_t ntasks = static_cast<int64_t>(num_seqs) * Hkv;
#pragma omp parallel for num_threads(threads) if (par) schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      const int b = static_cast<int>(task / Hkv);
      const int hk = static_cast<int>(task % Hkv);
      const int start = cu_seqlens[b];
      const int n = cu_seqlens[b + 1] - start;
      for (int i = 0; i < n; ++i) {
        std::memset(dq + (static_cast<ptrdiff_t>(start) + i) * qs + hk * group * D, 0, sizeof(float) * group * D);
      }
      for (int j0 = 0; j0 < n; j0 += kBc) {
        BackwardKeyTile(a, start, n, hk, j0, std::min(kBc, n - j0), true);
      }
    }
    return;
  }
  thread_local TileIndex kidx_storage, qidx_storage;  // see attention_forward
  const TileIndex& kidx = kidx_storage;
  const TileIndex& qidx = qidx_storage;
  BuildTileIndex(cu_seqlens, num_seqs, kBc, &kidx_storage);
  BuildTileIndex(cu_seqlens, num_seqs, kBr, &qidx_storage);
  const int64_t nk = kidx.total * Hkv;
  const int64_t nq = qidx.total * H;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < nk; ++task) {
      int b, tile;
      // Key tiles from the first (most causal work) to the last.
      LocateTile(kidx, num_seqs, task / Hkv, &b, &tile);
      const int start = cu_seqlens[b];
      const int n = cu_seqlens[b + 1] - start;
      const int ntiles = (n + kBc - 1) / kBc;
      const int j0 = (ntiles - 1 - tile) * kBc;
      BackwardKeyTile(a, start, n, static_cast<int>(task % Hkv), j0, std::min(kBc, n - j0), false);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nq; ++task) {
      int b, tile;
      LocateTile(qidx, num_seqs, task / H, &b, &tile);
      const int start = cu_seqlens[b];
      const int n = cu_seqlens[b + 1] - start;
      const int i0 = tile * kBr;
      const int rows = std::min(kBr, n - i0);
      if (b == 0 && i0 + rows <= p.skip_query_rows) continue;  // key-only rows
      BackwardQueryTile(a, start, n, static_cast<int>(task % H), i0, rows);
    }
  }
}

void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                      const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const float c = ScaleOf(p) * kLog2e;
  const int rows_per_kv = n_new * group;  // (new token, head) pairs
  const int chunks = (rows_per_kv + kBr - 1) / kBr;
  const int64_t ntasks = static_cast<int64_t>(batch) * Hkv * chunks;
  const ptrdiff_t ks = static_cast<ptrdiff_t>(Hkv) * D;
  AttentionParams causal = p;
  causal.causal = true;
  double work = 0;
  for (int b = 0; b < batch; ++b) work += static_cast<double>(cache_len[b]) * n_new * H * D;
#pragma omp parallel for num_threads(CpuThreads()) if (work >= kMinParallelWork) schedule(dynamic, 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int chunk = static_cast<int>(task % chunks);
    const int hk = static_cast<int>((task / chunks) % Hkv);
    const int b = static_cast<int>(task / (static_cast<int64_t>(chunks) * Hkv));
    const int len = cache_len[b];
    QueryTile qt;
    const int first = chunk * kBr;
    qt.rows = std::min(kBr, rows_per_kv - first);
    for (int i = 0; i < qt.rows; ++i) {
      const int r = (first + i) / group;
      const int h = hk * group + (first + i) % group;
      const ptrdiff_t row = (static_cast<ptrdiff_t>(b) * n_new + r) * H + h;
      qt.q[i] = q + row * D;
      qt.o[i] = out + row * D;
      qt.lse[i] = nullptr;
      SetKeys(&qt, i, ref::VisibleKeys(causal, len - n_new + r, len));
    }
    const ptrdiff_t kv0 = static_cast<ptrdiff_t>(b) * cache_capacity * ks + hk * D;
    ForwardTile(qt, D, k_cache + kv0, v_cache + kv0, ks, c);
  }
}

}  // namespace tandem::kernels::cpu
