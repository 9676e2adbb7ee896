// Sequence-parallel causal softmax attention (full and sliding-window
// layers) by all-gather of K/V: the rows of one packed batch lie across the
// ranks of a group in rank order (sequence_parallel.h). Each rank
//   forward:  gathers every rank's k and v (allgather, rank order = row
//             order), then runs the attention kernel (ops) over its own
//             rows, preceded by the earlier rows of the sequence it begins
//             inside (back to the window's reach) as zero-query padding
//             rows whose outputs it drops;
//   backward: gathers k and v again, runs the attention backward over the
//             same rows (padding rows with zero output gradient add nothing
//             to dK/dV), and reduce-scatters dK/dV back to the ranks that
//             own the keys.
// Semantics equal kernels/ops.h attention_forward/attention_backward (query
// head h reads kv head h / (H / Hkv), scale 0 = 1/sqrt(D), lse natural log);
// tests/comm/softmax_attention_sp_test.cc compares with the reference
// kernels. Bytes per rank: about 2 (N-1)/N T Hkv D floats each way in the
// forward, and the same again plus the reduce-scatter in the backward.
// Host memory only; `scratch` is grown and reused across calls (nothing else
// is allocated once it is large enough). The padding rows are keys only
// (AttentionParams::skip_query_rows): the kernels skip their whole query
// tiles, so rank r computes about its own rows' attention and the padding
// costs the K/V gather. Ranks are not balanced: the later a rank's rows,
// the more keys they see. Errors are the collective's.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/model/sequence_parallel.h"

namespace tandem::model {

// Reusable buffers of the two functions below.
struct SoftmaxSpScratch {
  std::vector<float> k, v, dk, dv, q, out, dout, dq, lse;
};

absl::Status SoftmaxAttentionSpForward(comm::Collective& group, kernels::Ops& ops, const kernels::AttentionParams& p,
                                       const SequenceSlice& s, const float* q, const float* k, const float* v,
                                       float* out, float* lse, SoftmaxSpScratch& scratch, comm::Timeout timeout);

absl::Status SoftmaxAttentionSpBackward(comm::Collective& group, kernels::Ops& ops, const kernels::AttentionParams& p,
                                        const SequenceSlice& s, const float* q, const float* k, const float* v,
                                        const float* out, const float* dout, const float* lse, float* dq, float* dk,
                                        float* dv, SoftmaxSpScratch& scratch, comm::Timeout timeout);

}  // namespace tandem::model
