#include "kernels/ref/paged_sparse_ref.h"

#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/ref/paged_attention_ref.h"

namespace tandem::kernels::ref {

void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t, float* summaries) {
  const int hkv = p.num_kv_heads, d = p.head_dim, kd = hkv * d;
  for (int r = 0; r < t; ++r) {
    const int page = slots[r] / kv.block_size, off = slots[r] % kv.block_size;
    for (int h = 0; h < hkv; ++h) {
      float* mx = summaries + (size_t(page) * hkv + h) * 2 * d;
      float* mn = mx + d;
      for (int e = 0; e < d; ++e) {
        for (int j = 0; j <= off; ++j) {
          const float x = PagedLoad(kv.k, kv.dtype, int64_t(page) * kv.block_size + j, kd, h * d + e);
          mx[e] = j == 0 ? x : std::max(mx[e], x);
          mn[e] = j == 0 ? x : std::min(mn[e], x);
        }
      }
    }
  }
}

void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                            const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                            int t, float* out) {
  const int H = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim, kd = hkv * d;
  assert(p.window <= 0 && s.block_size % kv.block_size == 0 && s.recent_blocks >= 1);
  const int m = s.block_size / kv.block_size;
  const double scale = p.scale != 0.f ? p.scale : 1.0 / std::sqrt(double(d));
  std::vector<std::pair<double, int>> scratch;
  std::vector<int> blocks, pos_list;
  std::vector<float> mx(d), mn(d);
  std::vector<double> sc, acc(d);
  for (int r = 0; r < t; ++r) {
    const int pos = row_pos[r];
    const int32_t* table = kv.block_tables + int64_t(row_seq[r]) * kv.max_blocks;
    const int nblk = pos / s.block_size + 1;
    auto slot = [&](int j) { return int64_t(table[j / kv.block_size]) * kv.block_size + j % kv.block_size; };
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / hkv);
      const float* qv = q + (int64_t(r) * H + h) * d;
      SelectBlocksBy(
          s, nblk, [&](int i) { return PagedBlockBound(table, m, summaries, hkv, hk, d, qv, i, mx.data(), mn.data()); },
          &scratch, &blocks);
      pos_list.clear();
      for (int i : blocks) {
        for (int j = i * s.block_size; j < std::min(pos + 1, (i + 1) * s.block_size); ++j) pos_list.push_back(j);
      }
      sc.clear();
      double top = -1e300;
      for (int j : pos_list) {
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += double(qv[e]) * PagedLoad(kv.k, kv.dtype, slot(j), kd, hk * d + e);
        sc.push_back(dot * scale);
        top = std::max(top, sc.back());
      }
      double z = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t n = 0; n < pos_list.size(); ++n) {
        const double w = std::exp(sc[n] - top);
        z += w;
        for (int e = 0; e < d; ++e) acc[e] += w * PagedLoad(kv.v, kv.dtype, slot(pos_list[n]), kd, hk * d + e);
      }
      float* o = out + (int64_t(r) * H + h) * d;
      for (int e = 0; e < d; ++e) o[e] = float(acc[e] / z);
    }
  }
}

}  // namespace tandem::kernels::ref
