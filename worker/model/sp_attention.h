// CollectiveSequenceAttention: the model's SequenceAttention
// (sequence_parallel.h) over one Collective, the sequence-parallel group:
// softmax layers by all-gather of K/V (softmax_attention_sp.h), linear
// layers by the ZeCO all-scan of the running state (linear_attention_sp.h).
// `group` and `ops` (a host-memory backend) must outlive it; one thread at a
// time.
#pragma once

#include "worker/comm/collective.h"
#include "worker/model/sequence_parallel.h"
#include "worker/model/softmax_attention_sp.h"

namespace tandem::model {

class CollectiveSequenceAttention : public SequenceAttention {
 public:
  CollectiveSequenceAttention(comm::Collective* group, kernels::Ops* ops, comm::Timeout timeout)
      : group_(group), ops_(ops), timeout_(timeout) {}

  int rank() const override { return group_->rank(); }
  // Host bytes of the gathered K/V and their gradients, as allocated.
  size_t scratch_bytes() const {
    const SoftmaxSpScratch& s = scratch_;
    return sizeof(float) * (s.k.capacity() + s.v.capacity() + s.dk.capacity() + s.dv.capacity() + s.q.capacity() +
                            s.out.capacity() + s.dout.capacity() + s.dq.capacity() + s.lse.capacity());
  }
  int size() const override { return group_->size(); }
  absl::Status SoftmaxForward(const kernels::AttentionParams& p, const SequenceSlice& s, const float* q, const float* k,
                              const float* v, float* out, float* lse) override;
  absl::Status SoftmaxBackward(const kernels::AttentionParams& p, const SequenceSlice& s, const float* q,
                               const float* k, const float* v, const float* out, const float* dout, const float* lse,
                               float* dq, float* dk, float* dv) override;
  absl::Status LinearForward(const kernels::LinearAttentionParams& p, const SequenceSlice& s, const int32_t* local_cu,
                             int num_seqs, const float* q, const float* k, const float* v, const float* log_decay,
                             float* out) override;
  absl::Status LinearBackward(const kernels::LinearAttentionParams& p, const SequenceSlice& s, const int32_t* local_cu,
                              int num_seqs, const float* q, const float* k, const float* v, const float* log_decay,
                              const float* dout, float* dq, float* dk, float* dv) override;

 private:
  comm::Collective* group_;
  kernels::Ops* ops_;
  comm::Timeout timeout_;
  SoftmaxSpScratch scratch_;
};

}  // namespace tandem::model
