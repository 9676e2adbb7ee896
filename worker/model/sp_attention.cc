#include "worker/model/sp_attention.h"

#include "worker/model/linear_attention_sp.h"

namespace tandem::model {

absl::Status CollectiveSequenceAttention::SoftmaxForward(const kernels::AttentionParams& p, const SequenceSlice& s,
                                                         const float* q, const float* k, const float* v, float* out,
                                                         float* lse) {
  return SoftmaxAttentionSpForward(*group_, *ops_, p, s, q, k, v, out, lse, scratch_, timeout_);
}

absl::Status CollectiveSequenceAttention::SoftmaxBackward(const kernels::AttentionParams& p, const SequenceSlice& s,
                                                          const float* q, const float* k, const float* v,
                                                          const float* out, const float* dout, const float* lse,
                                                          float* dq, float* dk, float* dv) {
  return SoftmaxAttentionSpBackward(*group_, *ops_, p, s, q, k, v, out, dout, lse, dq, dk, dv, scratch_, timeout_);
}

absl::Status CollectiveSequenceAttention::LinearForward(const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                                        const int32_t* local_cu, int num_seqs, const float* q,
                                                        const float* k, const float* v, const float* log_decay,
                                                        float* out) {
  return LinearAttentionSliceForward(*group_, *ops_, p, s, local_cu, num_seqs, q, k, v, log_decay, out, timeout_);
}

absl::Status CollectiveSequenceAttention::LinearBackward(const kernels::LinearAttentionParams& p,
                                                         const SequenceSlice& s, const int32_t* local_cu, int num_seqs,
                                                         const float* q, const float* k, const float* v,
                                                         const float* log_decay, const float* dout, float* dq,
                                                         float* dk, float* dv) {
  return LinearAttentionSliceBackward(*group_, *ops_, p, s, local_cu, num_seqs, q, k, v, log_decay, dout, dq, dk, dv,
                                      timeout_);
}

}  // namespace tandem::model
