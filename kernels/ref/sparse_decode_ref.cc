#include "kernels/ref/sparse_decode_ref.h"

#include <cmath>
#include <limits>

namespace tandem::kernels::ref {

void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cap, const int32_t* cache_len,
                         int bs, int first_block, float* summaries) {
  const int hkv = p.num_kv_heads, d = p.head_dim;
  const int nblk_cap = (cap + bs - 1) / bs;
  for (int b = 0; b < batch; ++b) {
    const int len = std::min(cache_len[b], cap);
    for (int i = std::max(0, first_block); i * bs < len; ++i) {
      for (int h = 0; h < hkv; ++h) {
        float* mx = summaries + ((size_t(b) * nblk_cap + i) * hkv + h) * 2 * d;
        float* mn = mx + d;
        for (int e = 0; e < d; ++e) {
          mx[e] = -std::numeric_limits<float>::infinity();
          mn[e] = std::numeric_limits<float>::infinity();
        }
        for (int r = i * bs; r < std::min(len, (i + 1) * bs); ++r) {
          const float* kr = k_cache + ((size_t(b) * cap + r) * hkv + h) * d;
          for (int e = 0; e < d; ++e) {
            mx[e] = std::max(mx[e], kr[e]);
            mn[e] = std::min(mn[e], kr[e]);
          }
        }
      }
    }
  }
}

void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                             const float* k_cache, const float* v_cache, int cap, const int32_t* cache_len,
                             const float* summaries, float* out) {
  const int H = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  const double scale = p.scale != 0.f ? p.scale : 1.0 / std::sqrt(double(d));
  const int nblk_cap = (cap + s.block_size - 1) / s.block_size;
  std::vector<std::pair<double, int>> scratch;
  std::vector<int> blocks;
  std::vector<double> sc, acc(d);
  for (int b = 0; b < batch; ++b) {
    const int len = std::min(cache_len[b], cap);
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / hkv);
      const float* qv = q + (size_t(b) * H + h) * d;
      SelectBlocks(s, len, hkv, hk, d, qv, summaries + size_t(b) * nblk_cap * hkv * 2 * d, &scratch, &blocks);
      sc.clear();
      double mx = -1e300;
      for (int i : blocks)
        for (int r = i * s.block_size; r < std::min(len, (i + 1) * s.block_size); ++r) {
          const float* kr = k_cache + ((size_t(b) * cap + r) * hkv + hk) * d;
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += double(qv[e]) * kr[e];
          sc.push_back(dot * scale);
          mx = std::max(mx, sc.back());
        }
      double z = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      size_t n = 0;
      for (int i : blocks)
        for (int r = i * s.block_size; r < std::min(len, (i + 1) * s.block_size); ++r) {
          const double w = std::exp(sc[n++] - mx);
          z += w;
          const float* vr = v_cache + ((size_t(b) * cap + r) * hkv + hk) * d;
          for (int e = 0; e < d; ++e) acc[e] += w * vr[e];
        }
      float* o = out + (size_t(b) * H + h) * d;
      for (int e = 0; e < d; ++e) o[e] = float(z > 0 ? acc[e] / z : 0.0);
    }
  }
}

}  // namespace tandem::kernels::ref
