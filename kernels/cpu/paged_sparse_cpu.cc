// See paged_sparse_cpu.h.
#include "kernels/cpu/paged_sparse_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backends.h"
#include "kernels/bf16.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/ref/paged_sparse_ref.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int kMaxD = 256;
constexpr int kMaxPage = 64;
constexpr double kMinParallelWork = 1 << 16;

// Row `slot` of a pool (kd floats apart), columns [col, col + d), as float.
const float* PoolRow(const void* pool, KvDtype dtype, int64_t slot, int kd, int col, int d, float* buf) {
  if (dtype == KvDtype::kF32) return static_cast<const float*>(pool) + slot * kd + col;
  const uint16_t* src = static_cast<const uint16_t*>(pool) + slot * kd + col;
  for (int e = 0; e < d; ++e) buf[e] = FloatFromBf16(src[e]);
  return buf;
}

}  // namespace

void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t, float* summaries) {
  const int hkv = p.num_kv_heads, d = p.head_dim, kd = hkv * d;
  if (d > kMaxD) return ref::paged_key_summaries(p, kv, slots, t, summaries);
#pragma omp parallel for num_threads(CpuThreads()) if (double(t) * kd >= kMinParallelWork && hkv > 1)
  for (int h = 0; h < hkv; ++h) {
    alignas(64) float buf[kMaxD];
    for (int r = 0; r < t; ++r) {
      // A later row of this call on the same page recomputes it anyway.
      const int page = slots[r] / kv.block_size, off = slots[r] % kv.block_size;
      if (r + 1 < t && slots[r + 1] / kv.block_size == page && slots[r + 1] % kv.block_size > off) continue;
      float* mx = summaries + (size_t(page) * hkv + h) * 2 * d;
      float* mn = mx + d;
      const int64_t base = int64_t(page) * kv.block_size;
      const float* x = PoolRow(kv.k, kv.dtype, base, kd, h * d, d, buf);
      std::copy(x, x + d, mx);
      std::copy(x, x + d, mn);
      for (int j = 1; j <= off; ++j) {
        x = PoolRow(kv.k, kv.dtype, base + j, kd, h * d, d, buf);
#pragma omp simd
        for (int e = 0; e < d; ++e) {
          mx[e] = std::max(mx[e], x[e]);
          mn[e] = std::min(mn[e], x[e]);
        }
      }
    }
  }
}

void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                            const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                            int t, float* out) {
  const int H = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim, kd = hkv * d;
  const int bs = kv.block_size;
  if (d > kMaxD || bs > kMaxPage) {
    return ref::paged_sparse_attention(p, s, kv, summaries, q, row_seq, row_pos, t, out);
  }
  const int m = s.block_size / bs, group = H / hkv;
  const float scale = p.scale != 0.f ? p.scale : 1.f / std::sqrt(float(d));
  const int64_t tasks = int64_t(t) * hkv;
  const double per_row = double(s.top_k_blocks + s.sink_blocks + s.recent_blocks) * s.block_size * d * 2;
  double work = 0;
  for (int r = 0; r < t; ++r) work += std::min(per_row, double(row_pos[r] + 1) * d * 2) * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(CpuThreads()) if (work >= kMinParallelWork && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    thread_local std::vector<std::pair<double, int>> scratch;
    thread_local std::vector<int> blocks;
    thread_local std::vector<float> block_sum;  // the candidate blocks' combined max / min
    alignas(64) float acc[kMaxD], kbuf[kMaxD], vbuf[kMaxD], sc[kMaxPage];
    const int r = int(task / hkv), hk = int(task % hkv);
    const int pos = row_pos[r];
    const int32_t* table = kv.block_tables + int64_t(row_seq[r]) * kv.max_blocks;
    const int nblk = pos / s.block_size + 1;
    // Candidates as ref::SelectBlocksBy: after the sinks, before the recent
    // blocks; their pages are combined once for the kv head's query heads.
    const int sink_end = std::min(nblk, std::max(0, s.sink_blocks));
    const int recent_begin = std::max(sink_end, nblk - std::max(0, s.recent_blocks));
    block_sum.resize(size_t(nblk) * 2 * d);
    for (int i = sink_end; i < recent_begin; ++i) {
      float* mx = block_sum.data() + size_t(i) * 2 * d;
      float* mn = mx + d;
      for (int j = 0; j < m; ++j) {
        const float* sm = summaries + (size_t(table[i * m + j]) * hkv + hk) * 2 * d;
        for (int e = 0; e < d; ++e) {
          mx[e] = j == 0 ? sm[e] : std::max(mx[e], sm[e]);
          mn[e] = j == 0 ? sm[d + e] : std::min(mn[e], sm[d + e]);
        }
      }
    }
    for (int g = 0; g < group; ++g) {
      const int h = hk * group + g;
      const float* qv = q + (int64_t(r) * H + h) * d;
      ref::SelectBlocksBy(
          s, nblk,
          [&](int i) {
            const float* mx = block_sum.data() + size_t(i) * 2 * d;
            return ref::BlockBound(qv, mx, mx + d, d);
          },
          &scratch, &blocks);
      float top = -INFINITY, z = 0.f;
      std::fill(acc, acc + d, 0.f);
      for (int i : blocks) {
        // The block's pages, each up to the row's position.
        for (int pg = i * m; pg < (i + 1) * m && pg * bs <= pos; ++pg) {
          const int n = std::min(bs, pos + 1 - pg * bs);
          const int64_t base = int64_t(table[pg]) * bs;
          float page_top = top;
          for (int j = 0; j < n; ++j) {
            const float* kr = PoolRow(kv.k, kv.dtype, base + j, kd, hk * d, d, kbuf);
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int e = 0; e < d; ++e) dot += qv[e] * kr[e];
            sc[j] = dot * scale;
            page_top = std::max(page_top, sc[j]);
          }
          const float alpha = ExpScalar(top - page_top);
          z *= alpha;
#pragma omp simd
          for (int e = 0; e < d; ++e) acc[e] *= alpha;
          for (int j = 0; j < n; ++j) {
            const float w = ExpScalar(sc[j] - page_top);
            z += w;
            const float* vr = PoolRow(kv.v, kv.dtype, base + j, kd, hk * d, d, vbuf);
#pragma omp simd
            for (int e = 0; e < d; ++e) acc[e] += w * vr[e];
          }
          top = page_top;
        }
      }
      float* o = out + (int64_t(r) * H + h) * d;
      const float inv = z > 0.f ? 1.f / z : 0.f;
      for (int e = 0; e < d; ++e) o[e] = acc[e] * inv;
    }
  }
}

}  // namespace tandem::kernels::cpu
