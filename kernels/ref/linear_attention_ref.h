// Reference linear attention with decay: the plain recurrence in double
// (ref/linear_attention_ref_math.h). Same contract as
// Ops::linear_attention_* in kernels/ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::ref {

void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                              const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                              const float* initial_state, float* out, float* final_state);
void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                               const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                               const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                               float* dk, float* dv, float* d_log_decay, float* d_initial_state);

}  // namespace tandem::kernels::ref
