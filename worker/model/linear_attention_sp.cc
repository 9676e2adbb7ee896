#include "worker/model/linear_attention_sp.h"

#include <cmath>
#include <utility>

#include "common/base/status_macros.h"

namespace tandem::model {

comm::ScanOp StateScan(std::vector<float> decay) {
  comm::ScanOp op;
  op.identity = 0.f;
  op.combine = [decay = std::move(decay)](const float* carry_in, const float* mine,
                                          float* carry_out, size_t offset, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      carry_out[i] = decay[offset + i] * carry_in[i] + mine[i];
    }
  };
  return op;
}

absl::Status LinearAttentionSpForward(comm::Collective& group, kernels::Ops& ops,
                                      const kernels::LinearAttentionParams& p,
                                      const float* q, const float* k, const float* v,
                                      const float* log_decay, int t, float* out,
                                      comm::Timeout timeout) {
  const int H = p.num_heads;
  const size_t per_head = size_t(p.key_dim) * p.value_dim;
  std::vector<float> state(H * per_head, 0.f), decay(H * per_head, 1.f);
  const int32_t cu[2] = {0, t};
  if (t > 0) {
    // The chunk's own state from zero (its outputs are recomputed below).
    ops.linear_attention_forward(p, q, k, v, log_decay, cu, 1, t, nullptr, out,
                                 state.data());
    if (log_decay != nullptr) {
      for (int h = 0; h < H; ++h) {
        double sum = 0;
        for (int r = 0; r < t; ++r) sum += log_decay[size_t(r) * H + h];
        std::fill(decay.begin() + h * per_head, decay.begin() + (h + 1) * per_head,
                  static_cast<float>(std::exp(sum)));
      }
    }
  }
  RETURN_IF_ERROR(group.all_scan(state.data(), state.size(), StateScan(std::move(decay)),
                                 timeout));
  if (t > 0) {
    ops.linear_attention_forward(p, q, k, v, log_decay, cu, 1, t, state.data(), out,
                                 nullptr);
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
