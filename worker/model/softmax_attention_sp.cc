#include "worker/model/softmax_attention_sp.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::model {

namespace {

// Element counts per rank of a [rows, width] tensor split by the slice's
// bounds.
std::vector<size_t> Counts(const SequenceSlice& s, size_t width) {
  const std::vector<int>& bounds = s.bounds;
  std::vector<size_t> counts(s.size);
  for (int r = 0; r < s.size; ++r) counts[r] = static_cast<size_t>(bounds[r + 1] - bounds[r]) * width;
  return counts;
}

absl::Status CheckSlice(const comm::Collective& group, const SequenceSlice& s) {
  if (s.size != group.size() || s.rank != group.rank()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence parallel: the slice is rank ", s.rank, " of ", s.size,
                                                   ", the group rank ", group.rank(), " of ", group.size()));
  }
  const std::vector<int>& bounds = s.bounds;
  if (bounds.size() != static_cast<size_t>(s.size) + 1 || bounds.front() != 0 || bounds.back() != s.global_rows() ||
      !std::is_sorted(bounds.begin(), bounds.end()) || s.offset != bounds[s.rank] ||
      s.rows != bounds[s.rank + 1] - bounds[s.rank]) {
    return absl::InvalidArgumentError("sequence parallel: the slice's rows are not its bounds' rows");
  }
  return absl::OkStatus();
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

// The rows this rank's attention kernel runs over: every local row plus, in
// front, the rows [first, offset) of the sequence the slice begins inside
// (as far back as the window reaches), whose keys the first local rows see;
// those padding rows get zero queries (their outputs are dropped) and zero
// output gradients (they add nothing to dK/dV). `cu` is the local
// cu_seqlens with the padding added to the first piece.
struct Padded {
  int first = 0;  // global row of padded row 0
  int pad = 0;    // padding rows
  std::vector<int32_t> cu;
};
Padded PadRows(const kernels::AttentionParams& p, const SequenceSlice& s) {
  Padded out;
  const std::vector<int32_t>& cu = s.global_cu;
  const int b = static_cast<int>(std::upper_bound(cu.begin(), cu.end(), s.offset) - cu.begin()) - 1;
  out.first = cu[b];
  // With attention sinks the sequence's first rows stay visible: pad from
  // its start.
  if (p.window > 0 && p.sinks <= 0) out.first = std::max(out.first, s.offset - (p.window - 1));
  out.pad = s.offset - out.first;
  out.cu.push_back(0);
  const int hi = s.offset + s.rows;
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] <= s.offset) continue;  // sequences that end before this slice
    const int end = std::min<int>(cu[i], hi) - s.offset + out.pad;
    if (end > out.cu.back()) out.cu.push_back(end);
  }
  return out;
}

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

absl::Status SoftmaxAttentionSpForward(comm::Collective& group, kernels::Ops& ops, const kernels::AttentionParams& p,
                                       const SequenceSlice& s, const float* q, const float* k, const float* v,
                                       float* out, float* lse, SoftmaxSpScratch& sc, comm::Timeout timeout) {
  RETURN_IF_ERROR(CheckSlice(group, s));
  const size_t hd = static_cast<size_t>(p.num_heads) * p.head_dim;
  const size_t kd = static_cast<size_t>(p.num_kv_heads) * p.head_dim;
  RETURN_IF_ERROR(GatherKv(group, s, kd, k, v, sc, timeout));
  const Padded pr = PadRows(p, s);
  const int rows = pr.pad + s.rows;
  if (pr.pad == 0) {
    ops.attention_forward(p, q, sc.k.data() + size_t(pr.first) * kd, sc.v.data() + size_t(pr.first) * kd, pr.cu.data(),
                          static_cast<int>(pr.cu.size()) - 1, rows, out, lse);
    return absl::OkStatus();
  }
  Grow(sc.q, rows * hd);
  Grow(sc.out, rows * hd);
  Grow(sc.lse, static_cast<size_t>(rows) * p.num_heads);
  std::fill(sc.q.begin(), sc.q.begin() + pr.pad * hd, 0.f);
  std::copy(q, q + s.rows * hd, sc.q.begin() + pr.pad * hd);
  kernels::AttentionParams padded = p;
  padded.skip_query_rows = pr.pad;  // the kernel skips their query tiles
  ops.attention_forward(padded, sc.q.data(), sc.k.data() + size_t(pr.first) * kd, sc.v.data() + size_t(pr.first) * kd,
                        pr.cu.data(), static_cast<int>(pr.cu.size()) - 1, rows, sc.out.data(), sc.lse.data());
  std::copy(sc.out.begin() + pr.pad * hd, sc.out.begin() + rows * hd, out);
  std::copy(sc.lse.begin() + static_cast<size_t>(pr.pad) * p.num_heads,
            sc.lse.begin() + static_cast<size_t>(rows) * p.num_heads, lse);
  return absl::OkStatus();
}

absl::Status SoftmaxAttentionSpBackward(comm::Collective& group, kernels::Ops& ops, const kernels::AttentionParams& p,
                                        const SequenceSlice& s, const float* q, const float* k, const float* v,
                                        const float* out, const float* dout, const float* lse, float* dq, float* dk,
                                        float* dv, SoftmaxSpScratch& sc, comm::Timeout timeout) {
  RETURN_IF_ERROR(CheckSlice(group, s));
  const size_t hd = static_cast<size_t>(p.num_heads) * p.head_dim;
  const size_t kd = static_cast<size_t>(p.num_kv_heads) * p.head_dim;
  const size_t H = p.num_heads;
  RETURN_IF_ERROR(GatherKv(group, s, kd, k, v, sc, timeout));
  const Padded pr = PadRows(p, s);
  const int rows = pr.pad + s.rows;
  const size_t n = static_cast<size_t>(s.global_rows()) * kd;
  Grow(sc.dk, n);
  Grow(sc.dv, n);
  std::fill(sc.dk.begin(), sc.dk.begin() + n, 0.f);
  std::fill(sc.dv.begin(), sc.dv.begin() + n, 0.f);
  float* dk_rows = sc.dk.data() + size_t(pr.first) * kd;
  float* dv_rows = sc.dv.data() + size_t(pr.first) * kd;
  const float* k_rows = sc.k.data() + size_t(pr.first) * kd;
  const float* v_rows = sc.v.data() + size_t(pr.first) * kd;
  const int ns = static_cast<int>(pr.cu.size()) - 1;
  if (pr.pad == 0) {
    ops.attention_backward(p, q, k_rows, v_rows, out, dout, lse, pr.cu.data(), ns, rows, dq, dk_rows, dv_rows);
  } else {
    // Padding rows: zero query, output and output gradient, lse 0 (their
    // probabilities are finite and multiply zero gradients).
    const size_t pad_hd = pr.pad * hd, rows_hd = rows * hd;
    for (std::vector<float>* b : {&sc.q, &sc.out, &sc.dout, &sc.dq}) Grow(*b, rows_hd);
    Grow(sc.lse, rows * H);
    std::fill(sc.q.begin(), sc.q.begin() + pad_hd, 0.f);
    std::fill(sc.out.begin(), sc.out.begin() + pad_hd, 0.f);
    std::fill(sc.dout.begin(), sc.dout.begin() + pad_hd, 0.f);
    std::fill(sc.lse.begin(), sc.lse.begin() + pr.pad * H, 0.f);
    std::copy(q, q + s.rows * hd, sc.q.begin() + pad_hd);
    std::copy(out, out + s.rows * hd, sc.out.begin() + pad_hd);
    std::copy(dout, dout + s.rows * hd, sc.dout.begin() + pad_hd);
    std::copy(lse, lse + s.rows * H, sc.lse.begin() + pr.pad * H);
    kernels::AttentionParams padded = p;
    padded.skip_query_rows = pr.pad;
    ops.attention_backward(padded, sc.q.data(), k_rows, v_rows, sc.out.data(), sc.dout.data(), sc.lse.data(),
                           pr.cu.data(), ns, rows, sc.dq.data(), dk_rows, dv_rows);
    std::copy(sc.dq.begin() + pad_hd, sc.dq.begin() + rows_hd, dq);
  }
  const std::vector<size_t> counts = Counts(s, kd);
  RETURN_IF_ERROR(group.reduce_scatter(sc.dk.data(), dk, counts, timeout));
  return group.reduce_scatter(sc.dv.data(), dv, counts, timeout);
}

}  // namespace tandem::model
