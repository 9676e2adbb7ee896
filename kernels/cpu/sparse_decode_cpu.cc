#include "kernels/cpu/sparse_decode_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/backends.h"
#include "kernels/ref/sparse_decode_ref.h"

namespace tandem::kernels::cpu {

void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cap, const int32_t* cache_len,
                         int bs, int first_block, float* summaries) {
  const int hkv = p.num_kv_heads, d = p.head_dim;
  const int nblk_cap = (cap + bs - 1) / bs;
  const int first = std::max(0, first_block);
  const int tasks = batch * std::max(0, nblk_cap - first);
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (double(tasks) * bs * hkv * d >= (1 << 18))
  for (int task = 0; task < tasks; ++task) {
    const int b = task / (nblk_cap - first), i = first + task % (nblk_cap - first);
    const int len = std::min(cache_len[b], cap);
    if (i * bs >= len) continue;
    for (int h = 0; h < hkv; ++h) {
      float* mx = summaries + ((size_t(b) * nblk_cap + i) * hkv + h) * 2 * d;
      float* mn = mx + d;
      std::fill(mx, mx + d, -std::numeric_limits<float>::infinity());
      std::fill(mn, mn + d, std::numeric_limits<float>::infinity());
      for (int r = i * bs; r < std::min(len, (i + 1) * bs); ++r) {
        const float* kr = k_cache + ((size_t(b) * cap + r) * hkv + h) * d;
#pragma omp simd
        for (int e = 0; e < d; ++e) {
          mx[e] = std::max(mx[e], kr[e]);
          mn[e] = std::min(mn[e], kr[e]);
        }
      }
    }
  }
}

void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                             const float* k_cache, const float* v_cache, int cap, const int32_t* cache_len,
                             const float* summaries, float* out) {
  const int H = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  const float scale = p.scale != 0.f ? p.scale : 1.f / std::sqrt(float(d));
  const int nblk_cap = (cap + s.block_size - 1) / s.block_size;
  const int tasks = batch * H;
  const double work = double(tasks) * (s.top_k_blocks + s.sink_blocks + s.recent_blocks) * s.block_size * d * 2;
#pragma omp parallel for schedule(dynamic) num_threads(CpuThreads()) if (work >= (1 << 18) && tasks > 1)
  for (int task = 0; task < tasks; ++task) {
    thread_local std::vector<std::pair<double, int>> scratch;
    thread_local std::vector<int> blocks;
    thread_local std::vector<float> sc, acc;
    const int b = task / H, h = task % H, hk = h / (H / hkv);
    const int len = std::min(cache_len[b], cap);
    const float* qv = q + (size_t(b) * H + h) * d;
    ref::SelectBlocks(s, len, hkv, hk, d, qv, summaries + size_t(b) * nblk_cap * hkv * 2 * d, &scratch, &blocks);
    sc.clear();
    float mx = -std::numeric_limits<float>::infinity();
    for (int i : blocks) {
      for (int r = i * s.block_size; r < std::min(len, (i + 1) * s.block_size); ++r) {
        const float* kr = k_cache + ((size_t(b) * cap + r) * hkv + hk) * d;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int e = 0; e < d; ++e) dot += qv[e] * kr[e];
        sc.push_back(dot * scale);
        mx = std::max(mx, sc.back());
      }
    }
    acc.assign(d, 0.f);
    float z = 0.f;
    size_t n = 0;
    for (int i : blocks) {
      for (int r = i * s.block_size; r < std::min(len, (i + 1) * s.block_size); ++r) {
        const float w = std::exp(sc[n++] - mx);
        z += w;
        const float* vr = v_cache + ((size_t(b) * cap + r) * hkv + hk) * d;
        float* a = acc.data();
#pragma omp simd
        for (int e = 0; e < d; ++e) a[e] += w * vr[e];
      }
    }
    float* o = out + (size_t(b) * H + h) * d;
    const float inv = z > 0.f ? 1.f / z : 0.f;
    for (int e = 0; e < d; ++e) o[e] = acc[e] * inv;
  }
}

}  // namespace tandem::kernels::cpu
