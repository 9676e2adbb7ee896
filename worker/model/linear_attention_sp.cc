#include "worker/model/linear_attention_sp.h"

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

}  // namespace tandem::model
