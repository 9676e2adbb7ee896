#include "kernels/ref/linear_attention_ref.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "kernels/ref/linear_attention_ref_math.h"

namespace tandem::kernels::ref {

void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                              const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                              const float* initial_state, float* out, float* final_state) {
  assert(p.num_heads > 0 && p.key_dim > 0 && p.value_dim > 0);
  assert(num_seqs <= 0 || cu_seqlens[num_seqs] <= t);
  (void)t;
  if (num_seqs <= 0) return;
  // final_state may alias initial_state: read a copy.
  std::vector<float> init;
  if (initial_state != nullptr && initial_state == final_state) {
    init.assign(initial_state, initial_state + size_t(num_seqs) * p.num_heads * p.key_dim * p.value_dim);
    initial_state = init.data();
  }
  LinearAttentionForwardT<float>(p, q, k, v, log_decay, cu_seqlens, num_seqs, initial_state, out, final_state);
}

void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                               const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                               const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                               float* dk, float* dv, float* d_log_decay, float* d_initial_state) {
  assert(p.num_heads > 0 && p.key_dim > 0 && p.value_dim > 0);
  // Rows outside every sequence get zero gradients.
  const size_t rows = size_t(t) * p.num_heads;
  std::fill(dq, dq + rows * p.key_dim, 0.f);
  std::fill(dk, dk + rows * p.key_dim, 0.f);
  std::fill(dv, dv + rows * p.value_dim, 0.f);
  if (log_decay != nullptr && d_log_decay != nullptr) std::fill(d_log_decay, d_log_decay + rows, 0.f);
  if (num_seqs <= 0) return;
  LinearAttentionBackwardT<float>(p, q, k, v, log_decay, cu_seqlens, num_seqs, initial_state, dout, d_final_state, dq,
                                  dk, dv, d_log_decay, d_initial_state);
}

}  // namespace tandem::kernels::ref
