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
  const int KD = Hkv * D;
  const float scale = p.scale != 0.f ? p.scale : 1.f / std::sqrt(static_cast<float>(D));
  const int64_t ntasks = static_cast<int64_t>(t) * Hkv;
  double work = 0;
  for (int r = 0; r < t; ++r) work += static_cast<double>(row_pos[r] + 1) * H * D;
#pragma omp parallel for num_threads(CpuThreads()) if (work >= kMinParallelWork) schedule(dynamic, 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int r = static_cast<int>(task / Hkv);
    const int hk = static_cast<int>(task % Hkv);
    const int pos = row_pos[r];
    const int lo = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
    const int32_t* table = kv.block_tables + static_cast<int64_t>(row_seq[r]) * kv.max_blocks;
    alignas(64) float acc[kMaxGroup][kMaxD];
    alignas(64) float kbuf[kMaxBlock * kMaxD];
    alignas(64) float vbuf[kMaxBlock * kMaxD];
    float m[kMaxGroup], l[kMaxGroup], s[kMaxBlock];
    const float* qh[kMaxGroup];
    for (int g = 0; g < group; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.f;
      std::fill(acc[g], acc[g] + D, 0.f);
      qh[g] = q + (static_cast<int64_t>(r) * H + hk * group + g) * D;
    }
    for (int b = lo / bs; b <= pos / bs; ++b) {
      const int j0 = std::max(lo, b * bs), j1 = std::min(pos, b * bs + bs - 1);
      const int n = j1 - j0 + 1;
      const int64_t slot = static_cast<int64_t>(table[b]) * bs + (j0 - b * bs);
      int ks = 0, vs = 0;
      const float* kb = BlockRows(kv.k, kv.dtype, slot, n, KD, hk * D, D, kbuf, &ks);
      const float* vb = BlockRows(kv.v, kv.dtype, slot, n, KD, hk * D, D, vbuf, &vs);
      for (int g = 0; g < group; ++g) {
        const float* qg = qh[g];
        float mx = m[g];
        for (int i = 0; i < n; ++i) {
          const float* kr = kb + static_cast<int64_t>(i) * ks;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int e = 0; e < D; ++e) dot += qg[e] * kr[e];
          s[i] = dot * scale;
          mx = std::max(mx, s[i]);
        }
        const float alpha = ExpScalar(m[g] - mx);
        float sum = l[g] * alpha;
        float* a = acc[g];
#pragma omp simd
        for (int e = 0; e < D; ++e) a[e] *= alpha;
        int i = 0;
        const __m256 vmx = _mm256_set1_ps(mx);
        for (; i + 8 <= n; i += 8) {
          _mm256_storeu_ps(s + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmx)));
        }
        for (; i < n; ++i) s[i] = ExpScalar(s[i] - mx);
        for (i = 0; i < n; ++i) {
          const float pr = s[i];
          sum += pr;
          const float* vr = vb + static_cast<int64_t>(i) * vs;
#pragma omp simd
          for (int e = 0; e < D; ++e) a[e] += pr * vr[e];
        }
        m[g] = mx;
        l[g] = sum;
      }
    }
    for (int g = 0; g < group; ++g) {
      const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
      float* o = out + (static_cast<int64_t>(r) * H + hk * group + g) * D;
      for (int e = 0; e < D; ++e) o[e] = acc[g][e] * inv;
    }
  }
}

}  // namespace tandem::kernels::cpu
