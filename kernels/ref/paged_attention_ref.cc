#include "kernels/ref/paged_attention_ref.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/ref/attention_ref_math.h"

namespace tandem::kernels::ref {

float PagedLoad(const void* pool, KvDtype dtype, int64_t slot, int kd, int e) {
  const int64_t i = slot * kd + e;
  if (dtype == KvDtype::kBF16) return FloatFromBf16(static_cast<const uint16_t*>(pool)[i]);
  return static_cast<const float*>(pool)[i];
}

void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) {
  for (int r = 0; r < t; ++r) {
    assert(slots[r] >= 0 && slots[r] < kv.num_blocks * kv.block_size);
    const int64_t base = static_cast<int64_t>(slots[r]) * kd;
    for (int e = 0; e < kd; ++e) {
      const float kx = k[static_cast<int64_t>(r) * kd + e];
      const float vx = v[static_cast<int64_t>(r) * kd + e];
      if (kv.dtype == KvDtype::kBF16) {
        static_cast<uint16_t*>(kv.k)[base + e] = Bf16FromFloat(kx);
        static_cast<uint16_t*>(kv.v)[base + e] = Bf16FromFloat(vx);
      } else {
        static_cast<float*>(kv.k)[base + e] = kx;
        static_cast<float*>(kv.v)[base + e] = vx;
      }
    }
  }
}

void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                     const int32_t* row_pos, int t, float* out) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  assert(Hkv > 0 && H % Hkv == 0);
  const int KD = Hkv * D;
  const double scale = p.scale != 0.f ? p.scale : 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s;
  for (int r = 0; r < t; ++r) {
    const int pos = row_pos[r];
    const int32_t* table = kv.block_tables + static_cast<int64_t>(row_seq[r]) * kv.max_blocks;
    AttentionParams causal = p;
    causal.causal = true;
    const KeyRange kr = VisibleKeys(causal, pos, pos + 1);
    assert(pos / kv.block_size < kv.max_blocks);
    auto slot = [&](int j) {
      return static_cast<int64_t>(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
    };
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / Hkv);
      const float* qr = q + (static_cast<int64_t>(r) * H + h) * D;
      s.assign(pos + 1, 0.0);
      double mx = -INFINITY;
      for (int j = FirstKey(kr); j <= pos; j = NextKey(kr, j)) {
        double acc = 0;
        for (int e = 0; e < D; ++e) {
          acc += static_cast<double>(qr[e]) * PagedLoad(kv.k, kv.dtype, slot(j), KD, hk * D + e);
        }
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int j = FirstKey(kr); j <= pos; j = NextKey(kr, j)) {
        s[j] = std::exp(s[j] - mx);
        z += s[j];
      }
      float* o = out + (static_cast<int64_t>(r) * H + h) * D;
      for (int e = 0; e < D; ++e) {
        double acc = 0;
        for (int j = FirstKey(kr); j <= pos; j = NextKey(kr, j)) {
          acc += s[j] * PagedLoad(kv.v, kv.dtype, slot(j), KD, hk * D + e);
        }
        o[e] = static_cast<float>(acc / z);
      }
    }
  }
}

}  // namespace tandem::kernels::ref
