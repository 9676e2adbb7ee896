#include "worker/model/linear_attention_sp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/base/status_macros.h"

namespace tandem::model {

comm::ScanOp StateScan(std::vector<float> decay) {
  comm::ScanOp op;
  op.identity = 0.f;
  op.combine = [decay = std::move(decay)](const float* carry_in, const float* mine, float* carry_out, size_t offset,
                                          size_t count) {
    for (size_t i = 0; i < count; ++i) {
      carry_out[i] = decay[offset + i] * carry_in[i] + mine[i];
    }
  };
  return op;
}

namespace {

// exp(sum of this rank's log decays) per head, broadcast over Dk x Dv.
std::vector<float> ChunkDecay(const kernels::LinearAttentionParams& p, const float* log_decay, int t) {
  const int H = p.num_heads;
  const size_t per_head = size_t(p.key_dim) * p.value_dim;
  std::vector<float> decay(H * per_head, 1.f);
  if (log_decay == nullptr) return decay;
  for (int h = 0; h < H; ++h) {
    double sum = 0;
    for (int r = 0; r < t; ++r) sum += log_decay[size_t(r) * H + h];
    std::fill(decay.begin() + h * per_head, decay.begin() + (h + 1) * per_head, static_cast<float>(std::exp(sum)));
  }
  return decay;
}

// The state entering this rank's chunk; `scratch_out` [t, H, Dv] is written.
absl::Status EntryState(comm::Collective& group, kernels::Ops& ops, const kernels::LinearAttentionParams& p,
                        const float* q, const float* k, const float* v, const float* log_decay, int t,
                        float* scratch_out, std::vector<float>* state, comm::Timeout timeout) {
  state->assign(size_t(p.num_heads) * p.key_dim * p.value_dim, 0.f);
  const int32_t cu[2] = {0, t};
  if (t > 0) {
    ops.linear_attention_forward(p, q, k, v, log_decay, cu, 1, t, nullptr, scratch_out, state->data());
  }
  return group.all_scan(state->data(), state->size(), StateScan(ChunkDecay(p, log_decay, t)), timeout);
}

constexpr uint32_t kStateGradTag = 0x5c0;

}  // namespace

absl::Status LinearAttentionSpForward(comm::Collective& group, kernels::Ops& ops,
                                      const kernels::LinearAttentionParams& p, const float* q, const float* k,
                                      const float* v, const float* log_decay, int t, float* out,
                                      comm::Timeout timeout) {
  std::vector<float> state;
  RETURN_IF_ERROR(EntryState(group, ops, p, q, k, v, log_decay, t, out, &state, timeout));
  if (t > 0) {
    const int32_t cu[2] = {0, t};
    ops.linear_attention_forward(p, q, k, v, log_decay, cu, 1, t, state.data(), out, nullptr);
  }
  return absl::OkStatus();
}

absl::Status LinearAttentionSpBackward(comm::Collective& group, kernels::Ops& ops,
                                       const kernels::LinearAttentionParams& p, const float* q, const float* k,
                                       const float* v, const float* log_decay, int t, const float* dout, float* dq,
                                       float* dk, float* dv, float* d_log_decay, comm::Timeout timeout) {
  const int32_t cu[2] = {0, t};
  const size_t rows = size_t(t) * p.num_heads;
  std::vector<float> scratch(rows * p.value_dim), entry;
  RETURN_IF_ERROR(EntryState(group, ops, p, q, k, v, log_decay, t, scratch.data(), &entry, timeout));
  // The local part of the gradient w.r.t. the entry state (outputs of this
  // chunk only).
  std::vector<float> local(entry.size(), 0.f), grad(entry.size(), 0.f);
  if (t > 0) {
    ops.linear_attention_backward(p, q, k, v, log_decay, cu, 1, t, entry.data(), dout, nullptr, dq, dk, dv, d_log_decay,
                                  local.data());
  }
  // Running state gradient from the last rank to the first: grad = the
  // gradient of the state this rank leaves.
  const int r = group.rank(), n = group.size();
  const size_t bytes = grad.size() * sizeof(float);
  if (r + 1 < n) RETURN_IF_ERROR(group.recv(grad.data(), bytes, r + 1, kStateGradTag, timeout));
  if (r > 0) {
    const std::vector<float> decay = ChunkDecay(p, log_decay, t);
    std::vector<float> up(grad.size());
    for (size_t i = 0; i < up.size(); ++i) up[i] = local[i] + decay[i] * grad[i];
    RETURN_IF_ERROR(group.send(up.data(), bytes, r - 1, kStateGradTag, timeout));
  }
  if (t > 0) {
    ops.linear_attention_backward(p, q, k, v, log_decay, cu, 1, t, entry.data(), dout, grad.data(), dq, dk, dv,
                                  d_log_decay, nullptr);
  }
  return absl::OkStatus();
}

namespace {

// The per-sequence initial states [num_seqs, S] of a slice: the entry state
// for the first piece when it continues a sequence, zeros elsewhere.
void SliceInitial(const SequenceSlice& s, int num_seqs, const std::vector<float>& entry, std::vector<float>* init) {
  init->assign(size_t(num_seqs) * entry.size(), 0.f);
  if (s.continues_in()) std::copy(entry.begin(), entry.end(), init->begin());
}

// The state entering this slice's first piece (scanned over the group) and
// the decay this slice applies to the state it passes on.
absl::Status SliceEntry(comm::Collective& group, kernels::Ops& ops, const kernels::LinearAttentionParams& p,
                        const SequenceSlice& s, const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                        const float* v, const float* log_decay, float* scratch_out, std::vector<float>* entry,
                        std::vector<float>* decay, comm::Timeout timeout) {
  const size_t S = size_t(p.num_heads) * p.key_dim * p.value_dim;
  std::vector<float> finals(size_t(num_seqs) * S, 0.f);
  ops.linear_attention_forward(p, q, k, v, log_decay, local_cu, num_seqs, s.rows, nullptr, scratch_out, finals.data());
  entry->assign(S, 0.f);
  const bool through = s.continues_in() && s.continues_out() && num_seqs == 1;
  if (s.continues_out()) std::copy(finals.end() - S, finals.end(), entry->begin());
  *decay = through ? ChunkDecay(p, log_decay, s.rows) : std::vector<float>(S, 0.f);
  return group.all_scan(entry->data(), S, StateScan(*decay), timeout);
}

}  // namespace

absl::Status LinearAttentionSliceForward(comm::Collective& group, kernels::Ops& ops,
                                         const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                         const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                         const float* v, const float* log_decay, float* out, comm::Timeout timeout) {
  std::vector<float> entry, decay, init;
  RETURN_IF_ERROR(SliceEntry(group, ops, p, s, local_cu, num_seqs, q, k, v, log_decay, out, &entry, &decay, timeout));
  SliceInitial(s, num_seqs, entry, &init);
  ops.linear_attention_forward(p, q, k, v, log_decay, local_cu, num_seqs, s.rows, init.data(), out, nullptr);
  return absl::OkStatus();
}

absl::Status LinearAttentionSliceBackward(comm::Collective& group, kernels::Ops& ops,
                                          const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                          const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                          const float* v, const float* log_decay, const float* dout, float* dq,
                                          float* dk, float* dv, comm::Timeout timeout) {
  const size_t S = size_t(p.num_heads) * p.key_dim * p.value_dim;
  std::vector<float> scratch(size_t(s.rows) * p.num_heads * p.value_dim), entry, decay, init;
  RETURN_IF_ERROR(
      SliceEntry(group, ops, p, s, local_cu, num_seqs, q, k, v, log_decay, scratch.data(), &entry, &decay, timeout));
  SliceInitial(s, num_seqs, entry, &init);
  // The local part of the gradient w.r.t. the entry state.
  std::vector<float> d_init(size_t(num_seqs) * S, 0.f), grad(S, 0.f);
  ops.linear_attention_backward(p, q, k, v, log_decay, local_cu, num_seqs, s.rows, init.data(), dout, nullptr, dq, dk,
                                dv, nullptr, d_init.data());
  if (!s.continues_in()) std::fill(d_init.begin(), d_init.begin() + S, 0.f);
  const int r = group.rank(), n = group.size();
  const size_t bytes = S * sizeof(float);
  if (r + 1 < n) RETURN_IF_ERROR(group.recv(grad.data(), bytes, r + 1, kStateGradTag, timeout));
  if (r > 0) {
    std::vector<float> up(S);
    for (size_t i = 0; i < S; ++i) up[i] = d_init[i] + decay[i] * grad[i];
    RETURN_IF_ERROR(group.send(up.data(), bytes, r - 1, kStateGradTag, timeout));
  }
  std::vector<float> d_final(size_t(num_seqs) * S, 0.f);
  if (s.continues_out()) std::copy(grad.begin(), grad.end(), d_final.end() - S);
  ops.linear_attention_backward(p, q, k, v, log_decay, local_cu, num_seqs, s.rows, init.data(), dout, d_final.data(),
                                dq, dk, dv, nullptr, nullptr);
  return absl::OkStatus();
}

}  // namespace tandem::model
