#include "worker/model/linear_attention_sp.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <utility>

#include "common/base/status_macros.h"
#include "kernels/ref/linear_attention_ref_math.h"

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

// The state a piece of rows [r0, r1) leaves when it starts from zeros, one
// GEMM per head instead of a forward: F = sum_t w_t k_t^T v_t with
// w_t = exp(sum of the log decays of rows (t, r1)).
void PieceFinalState(kernels::Ops& ops, const kernels::LinearAttentionParams& p, const float* k, const float* v,
                     const float* log_decay, int r0, int r1, float* state) {
  const int H = p.num_heads, Dk = p.key_dim, Dv = p.value_dim, n = r1 - r0;
  const size_t per_head = size_t(Dk) * Dv;
  if (n <= 0) {
    std::fill(state, state + H * per_head, 0.f);
    return;
  }
  std::vector<float> ks(size_t(n) * Dk);
  for (int h = 0; h < H; ++h) {
    double after = 0;  // log decay of the rows after t
    for (int t = r1 - 1; t >= r0; --t) {
      const float w = static_cast<float>(std::exp(after));
      const float* kr = k + (size_t(t) * H + h) * Dk;
      float* dst = ks.data() + size_t(t - r0) * Dk;
      for (int x = 0; x < Dk; ++x) dst[x] = w * kr[x];
      if (log_decay != nullptr) after += log_decay[size_t(t) * H + h];
    }
    ops.matmul(true, false, Dk, Dv, n, 1.f, ks.data(), Dk, v + (size_t(r0) * H + h) * Dv, H * Dv, 0.f,
               state + h * per_head, Dv);
  }
}

// out[t] += scale * exp(sum of the log decays of rows [r0, t]) q_t E for the
// rows [r0, r1) of a piece that entered with state E (the part of the
// output the local forward from zeros left out; the recurrence is linear in
// its initial state).
void AddEntryContribution(kernels::Ops& ops, const kernels::LinearAttentionParams& p, const float* q,
                          const float* log_decay, int r0, int r1, const float* entry, float* out) {
  const int H = p.num_heads, Dk = p.key_dim, Dv = p.value_dim, n = r1 - r0;
  if (n <= 0) return;
  const double scale = kernels::ref::LinearAttentionScale(p);
  std::vector<float> qs(size_t(n) * Dk);
  for (int h = 0; h < H; ++h) {
    double upto = 0;
    for (int t = r0; t < r1; ++t) {
      if (log_decay != nullptr) upto += log_decay[size_t(t) * H + h];
      const float c = static_cast<float>(scale * std::exp(upto));
      const float* qr = q + (size_t(t) * H + h) * Dk;
      float* dst = qs.data() + size_t(t - r0) * Dk;
      for (int x = 0; x < Dk; ++x) dst[x] = c * qr[x];
    }
    ops.matmul(false, false, n, Dv, Dk, 1.f, qs.data(), Dk, entry + h * size_t(Dk) * Dv, Dv, 1.f,
               out + (size_t(r0) * H + h) * Dv, H * Dv);
  }
}

// The gradient G of the state a piece of rows [r0, r1) leaves reaches its
// keys and values through F = ... + sum_t w_t k_t^T v_t (w_t as in
// PieceFinalState): dk_t += w_t v_t G^T, dv_t += w_t k_t G (one GEMM each
// per head; queries and outputs do not see F). The backward is linear in
// G, so this equals running it again with G as the final state's gradient.
void AddFinalStateGradient(kernels::Ops& ops, const kernels::LinearAttentionParams& p, const float* k, const float* v,
                           const float* log_decay, int r0, int r1, const float* grad, float* dk, float* dv) {
  const int H = p.num_heads, Dk = p.key_dim, Dv = p.value_dim, n = r1 - r0;
  if (n <= 0) return;
  std::vector<float> ks(size_t(n) * Dk), vs(size_t(n) * Dv);
  for (int h = 0; h < H; ++h) {
    double after = 0;
    for (int t = r1 - 1; t >= r0; --t) {
      const float w = static_cast<float>(std::exp(after));
      const float* kr = k + (size_t(t) * H + h) * Dk;
      const float* vr = v + (size_t(t) * H + h) * Dv;
      for (int x = 0; x < Dk; ++x) ks[size_t(t - r0) * Dk + x] = w * kr[x];
      for (int x = 0; x < Dv; ++x) vs[size_t(t - r0) * Dv + x] = w * vr[x];
      if (log_decay != nullptr) after += log_decay[size_t(t) * H + h];
    }
    const float* g = grad + h * size_t(Dk) * Dv;
    ops.matmul(false, true, n, Dk, Dv, 1.f, vs.data(), Dv, g, Dv, 1.f, dk + (size_t(r0) * H + h) * Dk, H * Dk);
    ops.matmul(false, false, n, Dv, Dk, 1.f, ks.data(), Dk, g, Dv, 1.f, dv + (size_t(r0) * H + h) * Dv, H * Dv);
  }
}

// Runs `local` on this thread while the state scan runs on its own (the
// ZeCO overlap: the intra-chunk work does not wait for the chain).
absl::Status ScanWhile(comm::Collective& group, float* state, size_t n, const comm::ScanOp& op, comm::Timeout timeout,
                       const std::function<void()>& local) {
  absl::Status scanned;
  std::thread scan([&] { scanned = group.all_scan(state, n, op, timeout); });
  local();
  scan.join();
  return scanned;
}

// The state entering this rank's chunk (all of its rows one piece).
absl::Status EntryState(comm::Collective& group, kernels::Ops& ops, const kernels::LinearAttentionParams& p,
                        const float* k, const float* v, const float* log_decay, int t, std::vector<float>* state,
                        comm::Timeout timeout) {
  state->assign(size_t(p.num_heads) * p.key_dim * p.value_dim, 0.f);
  PieceFinalState(ops, p, k, v, log_decay, 0, t, state->data());
  return group.all_scan(state->data(), state->size(), StateScan(ChunkDecay(p, log_decay, t)), timeout);
}

constexpr uint32_t kStateGradTag = 0x5c0;

}  // namespace

absl::Status LinearAttentionSpForward(comm::Collective& group, kernels::Ops& ops,
                                      const kernels::LinearAttentionParams& p, const float* q, const float* k,
                                      const float* v, const float* log_decay, int t, float* out,
                                      comm::Timeout timeout) {
  std::vector<float> state(size_t(p.num_heads) * p.key_dim * p.value_dim);
  PieceFinalState(ops, p, k, v, log_decay, 0, t, state.data());
  const int32_t cu[2] = {0, t};
  RETURN_IF_ERROR(ScanWhile(group, state.data(), state.size(), StateScan(ChunkDecay(p, log_decay, t)), timeout, [&] {
    if (t > 0) ops.linear_attention_forward(p, q, k, v, log_decay, cu, 1, t, nullptr, out, nullptr);
  }));
  AddEntryContribution(ops, p, q, log_decay, 0, t, state.data(), out);
  return absl::OkStatus();
}

absl::Status LinearAttentionSpBackward(comm::Collective& group, kernels::Ops& ops,
                                       const kernels::LinearAttentionParams& p, const float* q, const float* k,
                                       const float* v, const float* log_decay, int t, const float* dout, float* dq,
                                       float* dk, float* dv, float* d_log_decay, comm::Timeout timeout) {
  const int32_t cu[2] = {0, t};
  std::vector<float> entry;
  RETURN_IF_ERROR(EntryState(group, ops, p, k, v, log_decay, t, &entry, timeout));
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

// The state this slice folds into the scan (its last piece's, from zeros,
// when that piece continues on the next rank) and the decay it applies to
// the state it passes on (0 unless one piece runs through the slice).
void SliceScanInput(kernels::Ops& ops, const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                    const int32_t* local_cu, int num_seqs, const float* k, const float* v, const float* log_decay,
                    std::vector<float>* entry, std::vector<float>* decay) {
  const size_t S = size_t(p.num_heads) * p.key_dim * p.value_dim;
  entry->assign(S, 0.f);
  if (s.continues_out()) {
    PieceFinalState(ops, p, k, v, log_decay, local_cu[num_seqs - 1], local_cu[num_seqs], entry->data());
  }
  const bool through = s.continues_in() && s.continues_out() && num_seqs == 1;
  *decay = through ? ChunkDecay(p, log_decay, s.rows) : std::vector<float>(S, 0.f);
}

}  // namespace

absl::Status LinearAttentionSliceForward(comm::Collective& group, kernels::Ops& ops,
                                         const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                         const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                         const float* v, const float* log_decay, float* out, comm::Timeout timeout) {
  std::vector<float> entry, decay;
  SliceScanInput(ops, p, s, local_cu, num_seqs, k, v, log_decay, &entry, &decay);
  // Every piece from zeros while the scan runs; then the first piece adds
  // what its entry state contributes.
  RETURN_IF_ERROR(ScanWhile(group, entry.data(), entry.size(), StateScan(decay), timeout, [&] {
    ops.linear_attention_forward(p, q, k, v, log_decay, local_cu, num_seqs, s.rows, nullptr, out, nullptr);
  }));
  if (s.continues_in()) AddEntryContribution(ops, p, q, log_decay, local_cu[0], local_cu[1], entry.data(), out);
  return absl::OkStatus();
}

absl::Status LinearAttentionSliceBackward(comm::Collective& group, kernels::Ops& ops,
                                          const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                          const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                          const float* v, const float* log_decay, const float* dout, float* dq,
                                          float* dk, float* dv, comm::Timeout timeout) {
  const size_t S = size_t(p.num_heads) * p.key_dim * p.value_dim;
  std::vector<float> entry, decay, init;
  SliceScanInput(ops, p, s, local_cu, num_seqs, k, v, log_decay, &entry, &decay);
  RETURN_IF_ERROR(group.all_scan(entry.data(), S, StateScan(decay), timeout));
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
  if (s.continues_out()) {
    AddFinalStateGradient(ops, p, k, v, log_decay, local_cu[num_seqs - 1], local_cu[num_seqs], grad.data(), dk, dv);
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
