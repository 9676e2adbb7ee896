// See paged_attention_cpu.h.
#include "kernels/cpu/paged_attention_cpu.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/backends.h"
#include "kernels/bf16.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/ref/paged_attention_ref.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int kMaxD = 256;
constexpr int kMaxGroup = 32;
constexpr int kMaxBlock = 64;
constexpr double kMinParallelWork = 1 << 16;

// Rows [row, row + n) of a pool (kd floats apart), columns [col, col + d),
// as float: a pointer into an fp32 pool, or widened into `buf` [n, d].
const float* BlockRows(const void* pool, KvDtype dtype, int64_t slot, int n, int kd, int col, int d, float* buf,
                       int* stride) {
  if (dtype == KvDtype::kF32) {
    *stride = kd;
    return static_cast<const float*>(pool) + slot * kd + col;
  }
  const uint16_t* src = static_cast<const uint16_t*>(pool) + slot * kd + col;
  for (int i = 0; i < n; ++i) {
    for (int e = 0; e < d; ++e) buf[i * d + e] = FloatFromBf16(src[static_cast<int64_t>(i) * kd + e]);
  }
  *stride = d;
  return buf;
}

// Four dot products of D floats at once: q against keys k0..k3; one
// horizontal reduction for the four.
template <int D>
inline __m128 Dot4(const __m256* q, const float* k0, const float* k1, const float* k2, const float* k3) {
  __m256 a0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(k0)), a1 = _mm256_mul_ps(q[0], _mm256_loadu_ps(k1));
  __m256 a2 = _mm256_mul_ps(q[0], _mm256_loadu_ps(k2)), a3 = _mm256_mul_ps(q[0], _mm256_loadu_ps(k3));
  for (int c = 1; c < D / 8; ++c) {
    a0 = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(k0 + 8 * c), a0);
    a1 = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(k1 + 8 * c), a1);
    a2 = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(k2 + 8 * c), a2);
    a3 = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(k3 + 8 * c), a3);
  }
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

template <int D>
inline float Dot1(const __m256* q, const float* k) {
  __m256 a = _mm256_mul_ps(q[0], _mm256_loadu_ps(k));
  for (int c = 1; c < D / 8; ++c) a = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(k + 8 * c), a);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// One task (row r, kv head hk): every query head of the kv head, block by
// block with an online softmax. With the head width fixed at compile time
// (kD = 32, 64, 128) a query head and its output accumulator live in
// registers and four keys share one horizontal reduction; kD = 0 is the
// generic loop over p.head_dim.
template <int kD>
void AttendTask(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* table, int r, int hk,
                int pos, float scale, float* out) {
  constexpr int kWidth = kD > 0 ? kD : kMaxD;  // stack buffers
  const int D = kD > 0 ? kD : p.head_dim;
  const int H = p.num_heads, Hkv = p.num_kv_heads, group = H / Hkv, bs = kv.block_size, KD = Hkv * D;
  const int lo = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
  alignas(64) float acc[kMaxGroup][kWidth];
  alignas(64) float kbuf[kMaxBlock * kWidth];
  alignas(64) float vbuf[kMaxBlock * kWidth];
  alignas(32) float s[kMaxBlock + 4];
  float m[kMaxGroup], l[kMaxGroup];
  for (int g = 0; g < group; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
    std::fill(acc[g], acc[g] + D, 0.f);
  }
  // Attention sinks below the window: positions [0, sink_hi), then [lo, pos].
  const int sink_hi = p.window > 0 ? std::min(p.sinks, lo) : 0;
  for (int seg = sink_hi > 0 ? 0 : 1; seg < 2; ++seg) {
    const int first = seg == 0 ? 0 : lo, last = seg == 0 ? sink_hi - 1 : pos;
    for (int b = first / bs; b <= last / bs; ++b) {
      const int j0 = std::max(first, b * bs), j1 = std::min(last, b * bs + bs - 1);
      const int n = j1 - j0 + 1;
      const int64_t slot = static_cast<int64_t>(table[b]) * bs + (j0 - b * bs);
      int ks = 0, vs = 0;
      const float* kb = BlockRows(kv.k, kv.dtype, slot, n, KD, hk * D, D, kbuf, &ks);
      const float* vb = BlockRows(kv.v, kv.dtype, slot, n, KD, hk * D, D, vbuf, &vs);
      for (int g = 0; g < group; ++g) {
        const float* qg = q + (static_cast<int64_t>(r) * H + hk * group + g) * D;
        int i = 0;
        if constexpr (kD > 0) {
          __m256 qv[kD / 8];
          for (int c = 0; c < kD / 8; ++c) qv[c] = _mm256_loadu_ps(qg + 8 * c);
          const __m128 vscale = _mm_set1_ps(scale);
          for (; i + 4 <= n; i += 4) {
            const float* k0 = kb + static_cast<int64_t>(i) * ks;
            _mm_storeu_ps(s + i, _mm_mul_ps(Dot4<kD>(qv, k0, k0 + ks, k0 + 2 * ks, k0 + 3 * ks), vscale));
          }
          for (; i < n; ++i) s[i] = Dot1<kD>(qv, kb + static_cast<int64_t>(i) * ks) * scale;
        } else {
          for (; i < n; ++i) {
            const float* kr = kb + static_cast<int64_t>(i) * ks;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int e = 0; e < D; ++e) dot += qg[e] * kr[e];
            s[i] = dot * scale;
          }
        }
        float mx = m[g];
        for (i = 0; i < n; ++i) mx = std::max(mx, s[i]);
        const float alpha = ExpScalar(m[g] - mx);
        const __m256 vmx = _mm256_set1_ps(mx);
        for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmx)));
        for (; i < n; ++i) s[i] = ExpScalar(s[i] - mx);
        float sum = l[g] * alpha;
        float* a = acc[g];
        if constexpr (kD > 0) {
          __m256 av[kD / 8];
          const __m256 valpha = _mm256_set1_ps(alpha);
          for (int c = 0; c < kD / 8; ++c) av[c] = _mm256_mul_ps(_mm256_load_ps(a + 8 * c), valpha);
          for (i = 0; i < n; ++i) {
            sum += s[i];
            const __m256 pr = _mm256_set1_ps(s[i]);
            const float* vr = vb + static_cast<int64_t>(i) * vs;
            for (int c = 0; c < kD / 8; ++c) av[c] = _mm256_fmadd_ps(pr, _mm256_loadu_ps(vr + 8 * c), av[c]);
          }
          for (int c = 0; c < kD / 8; ++c) _mm256_store_ps(a + 8 * c, av[c]);
        } else {
#pragma omp simd
          for (int e = 0; e < D; ++e) a[e] *= alpha;
          for (i = 0; i < n; ++i) {
            const float pr = s[i];
            sum += pr;
            const float* vr = vb + static_cast<int64_t>(i) * vs;
#pragma omp simd
            for (int e = 0; e < D; ++e) a[e] += pr * vr[e];
          }
        }
        m[g] = mx;
        l[g] = sum;
      }
    }
  }
  for (int g = 0; g < group; ++g) {
    const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
    float* o = out + (static_cast<int64_t>(r) * H + hk * group + g) * D;
    for (int e = 0; e < D; ++e) o[e] = acc[g][e] * inv;
  }
}

}  // namespace

void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) {
  const bool par = static_cast<double>(t) * kd >= kMinParallelWork;
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
  for (int r = 0; r < t; ++r) {
    const int64_t dst = static_cast<int64_t>(slots[r]) * kd;
    const float* kr = k + static_cast<int64_t>(r) * kd;
    const float* vr = v + static_cast<int64_t>(r) * kd;
    if (kv.dtype == KvDtype::kF32) {
      std::memcpy(static_cast<float*>(kv.k) + dst, kr, sizeof(float) * kd);
      std::memcpy(static_cast<float*>(kv.v) + dst, vr, sizeof(float) * kd);
    } else {
      uint16_t* kd16 = static_cast<uint16_t*>(kv.k) + dst;
      uint16_t* vd16 = static_cast<uint16_t*>(kv.v) + dst;
      for (int e = 0; e < kd; ++e) {
        kd16[e] = Bf16FromFloat(kr[e]);
        vd16[e] = Bf16FromFloat(vr[e]);
      }
    }
  }
}

void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                     const int32_t* row_pos, int t, float* out) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int group = H / Hkv;
  const int bs = kv.block_size;
  if (D > kMaxD || group > kMaxGroup || bs > kMaxBlock) {
    return ref::paged_attention(p, kv, q, row_seq, row_pos, t, out);
  }
  const float scale = p.scale != 0.f ? p.scale : 1.f / std::sqrt(static_cast<float>(D));
  const int64_t ntasks = static_cast<int64_t>(t) * Hkv;
  double work = 0;
  for (int r = 0; r < t; ++r) work += static_cast<double>(row_pos[r] + 1) * H * D;
#pragma omp parallel for num_threads(CpuThreads()) if (work >= kMinParallelWork) schedule(dynamic, 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int r = static_cast<int>(task / Hkv);
    const int hk = static_cast<int>(task % Hkv);
    const int32_t* table = kv.block_tables + static_cast<int64_t>(row_seq[r]) * kv.max_blocks;
    switch (D) {
      case 32:
        AttendTask<32>(p, kv, q, table, r, hk, row_pos[r], scale, out);
        break;
      case 64:
        AttendTask<64>(p, kv, q, table, r, hk, row_pos[r], scale, out);
        break;
      case 128:
        AttendTask<128>(p, kv, q, table, r, hk, row_pos[r], scale, out);
        break;
      default:
        AttendTask<0>(p, kv, q, table, r, hk, row_pos[r], scale, out);
    }
  }
}

}  // namespace tandem::kernels::cpu
