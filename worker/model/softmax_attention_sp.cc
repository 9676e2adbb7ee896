#include "worker/model/softmax_attention_sp.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::model {

namespace {

// Element counts per rank of a [rows, width] tensor split by SliceBounds.
std::vector<size_t> Counts(const SequenceSlice& s, size_t width) {
  const std::vector<int> bounds = SliceBounds(s.global_rows(), s.size);
  std::vector<size_t> counts(s.size);
  for (int r = 0; r < s.size; ++r) counts[r] = static_cast<size_t>(bounds[r + 1] - bounds[r]) * width;
  return counts;
}

absl::Status CheckSlice(const comm::Collective& group, const SequenceSlice& s) {
  if (s.size != group.size() || s.rank != group.rank()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence parallel: the slice is rank ", s.rank, " of ", s.size,
                                                   ", the group rank ", group.rank(), " of ", group.size()));
  }
  const std::vector<int> bounds = SliceBounds(s.global_rows(), s.size);
  if (s.offset != bounds[s.rank] || s.rows != bounds[s.rank + 1] - bounds[s.rank]) {
    return absl::InvalidArgumentError("sequence parallel: the slice's rows are not SliceBounds' rows");
  }
  return absl::OkStatus();
}

// Global key rows [lo, hi) that global row g sees.
struct Keys {
  int lo, hi;
};
Keys VisibleKeys(const kernels::AttentionParams& p, const std::vector<int32_t>& cu, int g) {
  const int b = static_cast<int>(std::upper_bound(cu.begin(), cu.end(), g) - cu.begin()) - 1;
  int lo = cu[b];
  if (p.window > 0) lo = std::max(lo, g - p.window + 1);
  return {lo, g + 1};
}

float Scale(const kernels::AttentionParams& p) {
  return p.scale != 0.f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
}

absl::Status GatherKv(comm::Collective& group, const SequenceSlice& s, size_t kd, const float* k, const float* v,
                      SoftmaxSpScratch& sc, comm::Timeout timeout) {
  const size_t n = static_cast<size_t>(s.global_rows()) * kd;
  if (sc.k.size() < n) sc.k.resize(n);
  if (sc.v.size() < n) sc.v.resize(n);
  const std::vector<size_t> counts = Counts(s, kd);
  RETURN_IF_ERROR(group.allgather(k, sc.k.data(), counts, timeout));
  return group.allgather(v, sc.v.data(), counts, timeout);
}

}  // namespace

absl::Status SoftmaxAttentionSpForward(comm::Collective& group, const kernels::AttentionParams& p,
                                       const SequenceSlice& s, const float* q, const float* k, const float* v,
                                       float* out, float* lse, SoftmaxSpScratch& sc, comm::Timeout timeout) {
  RETURN_IF_ERROR(CheckSlice(group, s));
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim, group_heads = H / Hkv;
  const size_t kd = static_cast<size_t>(Hkv) * D;
  RETURN_IF_ERROR(GatherKv(group, s, kd, k, v, sc, timeout));
  const float scale = Scale(p);
  const float* K = sc.k.data();
  const float* V = sc.v.data();
  for (int i = 0; i < s.rows; ++i) {
    const int g = s.offset + i;
    const Keys keys = VisibleKeys(p, s.global_cu, g);
    if (sc.row.size() < static_cast<size_t>(keys.hi - keys.lo)) sc.row.resize(keys.hi - keys.lo);
    float* srow = sc.row.data();
    for (int h = 0; h < H; ++h) {
      const int hk = h / group_heads;
      const float* qi = q + (static_cast<size_t>(i) * H + h) * D;
      float m = -INFINITY;
      for (int j = keys.lo; j < keys.hi; ++j) {
        const float* kj = K + (static_cast<size_t>(j) * Hkv + hk) * D;
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot += qi[d] * kj[d];
        srow[j - keys.lo] = dot * scale;
        m = std::max(m, dot * scale);
      }
      float* oi = out + (static_cast<size_t>(i) * H + h) * D;
      std::fill(oi, oi + D, 0.f);
      double l = 0;
      for (int j = keys.lo; j < keys.hi; ++j) {
        const float pj = std::exp(srow[j - keys.lo] - m);
        l += pj;
        const float* vj = V + (static_cast<size_t>(j) * Hkv + hk) * D;
        for (int d = 0; d < D; ++d) oi[d] += pj * vj[d];
      }
      const float inv = static_cast<float>(1.0 / l);
      for (int d = 0; d < D; ++d) oi[d] *= inv;
      lse[static_cast<size_t>(i) * H + h] = m + static_cast<float>(std::log(l));
    }
  }
  return absl::OkStatus();
}

absl::Status SoftmaxAttentionSpBackward(comm::Collective& group, const kernels::AttentionParams& p,
                                        const SequenceSlice& s, const float* q, const float* k, const float* v,
                                        const float* out, const float* dout, const float* lse, float* dq, float* dk,
                                        float* dv, SoftmaxSpScratch& sc, comm::Timeout timeout) {
  RETURN_IF_ERROR(CheckSlice(group, s));
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim, group_heads = H / Hkv;
  const size_t kd = static_cast<size_t>(Hkv) * D;
  RETURN_IF_ERROR(GatherKv(group, s, kd, k, v, sc, timeout));
  const size_t n = static_cast<size_t>(s.global_rows()) * kd;
  if (sc.dk.size() < n) sc.dk.resize(n);
  if (sc.dv.size() < n) sc.dv.resize(n);
  std::fill(sc.dk.begin(), sc.dk.begin() + n, 0.f);
  std::fill(sc.dv.begin(), sc.dv.begin() + n, 0.f);
  const float scale = Scale(p);
  const float* K = sc.k.data();
  const float* V = sc.v.data();
  for (int i = 0; i < s.rows; ++i) {
    const Keys keys = VisibleKeys(p, s.global_cu, s.offset + i);
    for (int h = 0; h < H; ++h) {
      const int hk = h / group_heads;
      const size_t row = static_cast<size_t>(i) * H + h;
      const float* qi = q + row * D;
      const float* oi = out + row * D;
      const float* doi = dout + row * D;
      float* dqi = dq + row * D;
      float di = 0.f;
      for (int d = 0; d < D; ++d) di += doi[d] * oi[d];
      std::fill(dqi, dqi + D, 0.f);
      const float lse_i = lse[row];
      for (int j = keys.lo; j < keys.hi; ++j) {
        const size_t krow = (static_cast<size_t>(j) * Hkv + hk) * D;
        const float* kj = K + krow;
        const float* vj = V + krow;
        float dot = 0.f, dp = 0.f;
        for (int d = 0; d < D; ++d) {
          dot += qi[d] * kj[d];
          dp += doi[d] * vj[d];
        }
        const float pij = std::exp(dot * scale - lse_i);
        const float ds = pij * (dp - di) * scale;
        float* dkj = sc.dk.data() + krow;
        float* dvj = sc.dv.data() + krow;
        for (int d = 0; d < D; ++d) {
          dvj[d] += pij * doi[d];
          dkj[d] += ds * qi[d];
          dqi[d] += ds * kj[d];
        }
      }
    }
  }
  const std::vector<size_t> counts = Counts(s, kd);
  RETURN_IF_ERROR(group.reduce_scatter(sc.dk.data(), dk, counts, timeout));
  return group.reduce_scatter(sc.dv.data(), dv, counts, timeout);
}

}  // namespace tandem::model
