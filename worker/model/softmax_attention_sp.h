// Sequence-parallel causal softmax attention (full and sliding-window
// layers) by all-gather of K/V: the rows of one packed batch lie across the
// ranks of a group in rank order (sequence_parallel.h). Each rank
//   forward:  gathers every rank's k and v (allgather, rank order = row
//             order), then computes the attention of its own query rows over
//             the keys each row sees (same sequence, position <= its own,
//             within the window);
//   backward: gathers k and v again, accumulates dq of its rows and the
//             dk/dv contributions of its rows to every key row, and
//             reduce-scatters dk/dv back to the ranks that own the keys.
// Semantics equal kernels/ops.h attention_forward/attention_backward (query
// head h reads kv head h / (H / Hkv), scale 0 = 1/sqrt(D), lse natural log);
// tests/comm/softmax_attention_sp_test.cc compares with the reference
// kernels. Bytes per rank: about 2 (N-1)/N T Hkv D floats each way in the
// forward, and the same again plus the reduce-scatter in the backward.
// Host memory only; `scratch` is grown and reused across calls (nothing else
// is allocated once it is large enough). Errors are the collective's.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/model/sequence_parallel.h"

namespace tandem::model {

// Reusable buffers of the two functions below.
struct SoftmaxSpScratch {
  std::vector<float> k, v, dk, dv, row;
};

absl::Status SoftmaxAttentionSpForward(comm::Collective& group, const kernels::AttentionParams& p,
                                       const SequenceSlice& s, const float* q, const float* k, const float* v,
                                       float* out, float* lse, SoftmaxSpScratch& scratch, comm::Timeout timeout);

absl::Status SoftmaxAttentionSpBackward(comm::Collective& group, const kernels::AttentionParams& p,
                                        const SequenceSlice& s, const float* q, const float* k, const float* v,
                                        const float* out, const float* dout, const float* lse, float* dq, float* dk,
                                        float* dv, SoftmaxSpScratch& scratch, comm::Timeout timeout);

}  // namespace tandem::model
