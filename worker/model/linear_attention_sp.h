// Sequence-parallel linear attention (ZeCO): one long sequence split across
// the ranks of a group in rank order, rank r holding tokens
// [t_r, t_r + T_r). Each rank
//   1. computes the state its chunk leaves from a zero state, F_r (one GEMM
//      per head over decay-weighted keys, not a forward),
//   2. passes the running state along the ranks with all_scan, combining
//      per element: S_in(r+1) = exp(sum of rank r's log decays, per head)
//      S_in(r) + F_r (bytes per rank: one state, whatever the group size),
//      on a thread of its own while this thread runs the local forward of
//      its chunk from a zero state (the scan's chain overlaps that work),
//   3. adds what the state it received contributes to its outputs:
//      scale x exp(cumulative log decay of row t) q_t S_in (the recurrence is
//      linear in its initial state; one GEMM per head).
// The result equals a single-rank forward of the whole sequence within fp32
// rounding (tests/comm/linear_attention_sp_test.cc). Host memory only (a CPU
// Ops backend; the collective reads host floats). Not thread-safe beyond
// the collective's own rules; errors are the collective's.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/model/sequence_parallel.h"

namespace tandem::model {

// all_scan operator of linear-attention states: carry_out = decay * carry_in
// + mine, element by element (decay [n], this rank's).
comm::ScanOp StateScan(std::vector<float> decay);

// q, k [t, H, Dk], v and out [t, H, Dv], log_decay [t, H] (nullptr = none):
// this rank's tokens. t may be 0 on some ranks.
absl::Status LinearAttentionSpForward(comm::Collective& group, kernels::Ops& ops,
                                      const kernels::LinearAttentionParams& p, const float* q, const float* k,
                                      const float* v, const float* log_decay, int t, float* out, comm::Timeout timeout);

// The backward of LinearAttentionSpForward: dout [t, H, Dv] of this rank's
// tokens; writes dq, dk [t, H, Dk], dv [t, H, Dv] and d_log_decay [t, H]
// (skipped when nullptr). Each rank recomputes the state entering its chunk
// (the forward's all_scan), takes the local part of the gradient w.r.t. that
// state (a backward with no incoming state gradient), passes the running
// state gradient from the last rank to the first (one state each way per
// rank, point to point: G_{r-1} = local_r + decay_r G_r), then runs its
// backward with the state it entered from and the gradient of the state it
// left. Equals the single-rank backward within fp32 rounding.
absl::Status LinearAttentionSpBackward(comm::Collective& group, kernels::Ops& ops,
                                       const kernels::LinearAttentionParams& p, const float* q, const float* k,
                                       const float* v, const float* log_decay, int t, const float* dout, float* dq,
                                       float* dk, float* dv, float* d_log_decay, comm::Timeout timeout);

// The same over a slice of a packed batch of several sequences
// (sequence_parallel.h): this rank's rows are the local pieces local_cu
// [num_seqs + 1] of the global sequences. Only the first piece can continue
// a sequence from the rank before (it enters with the scanned state) and
// only the last can continue on the next rank (its state is what this rank
// folds into the scan; a rank whose rows hold a sequence start passes its
// last piece's state on with decay 0, so the chain restarts there). The
// backward passes the state gradient back the same way: one chunked
// backward with the entry state, then the received state gradient's part
// of dk and dv as GEMMs (the backward is linear in it). log_decay [t, H]
// may be nullptr; no log-decay gradient.
absl::Status LinearAttentionSliceForward(comm::Collective& group, kernels::Ops& ops,
                                         const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                         const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                         const float* v, const float* log_decay, float* out, comm::Timeout timeout);
absl::Status LinearAttentionSliceBackward(comm::Collective& group, kernels::Ops& ops,
                                          const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                          const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                          const float* v, const float* log_decay, const float* dout, float* dq,
                                          float* dk, float* dv, comm::Timeout timeout);

}  // namespace tandem::model
