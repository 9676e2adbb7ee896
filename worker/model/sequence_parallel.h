// Sequence parallelism in the model: one packed batch split across the
// ranks of a sequence-parallel group, rank r holding the contiguous rows
// [bounds[r], bounds[r+1]) of it (SliceBounds: near-equal pieces in rank
// order, so every sequence's rows run through the ranks in order and the
// linear layers' running state passes rank to rank).
//
// Everything that is per row (embedding, norms, projections, RoPE with each
// row's own position, MLP, LM head) runs on the local rows unchanged; the
// attention of a layer is the one step that needs other ranks' rows, and
// the model hands it to a SequenceAttention (worker/model/sp_attention.h
// implements it over a Collective). This header has no collective in it, so
// the model keeps no dependency on worker/comm.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"

namespace tandem::model {

struct Batch;

// Where this rank's rows sit in the whole packed batch.
struct SequenceSlice {
  int rank = 0;
  int size = 1;
  int offset = 0;                  // global row of local row 0
  int rows = 0;                    // local rows
  std::vector<int32_t> global_cu;  // cu_seqlens of the whole batch
  int global_rows() const { return global_cu.empty() ? 0 : global_cu.back(); }
  // The local row 0 continues a sequence that began on an earlier rank; the
  // last local row's sequence continues on a later rank.
  bool continues_in() const;
  bool continues_out() const;
};

// size + 1 row bounds of `rows` rows over `size` ranks (the first rows %
// size ranks take one more).
std::vector<int> SliceBounds(int rows, int size);

// Rank `rank`'s slice of `global` (tokens, targets, positions and the local
// pieces of its sequences as cu_seqlens; `slice` set). InvalidArgument when
// the batch has fewer rows than ranks or a bad rank/size.
absl::StatusOr<Batch> SliceBatch(const Batch& global, int rank, int size);

// Attention of one layer over the rows of every rank of the group. Host
// pointers of this rank's rows: q [t, H, D], k/v [t, Hkv, D], out [t, H, D],
// lse [t, H]; t = slice.rows. Every rank calls the same methods in the same
// order (they are collectives). A failure breaks the group (worker/comm's
// contract): the caller reports it and stops.
class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Causal softmax attention (full or sliding window, p.window).
  virtual absl::Status SoftmaxForward(const kernels::AttentionParams& p, const SequenceSlice& s, const float* q,
                                      const float* k, const float* v, float* out, float* lse) = 0;
  // dq, dk, dv of this rank's rows (overwritten).
  virtual absl::Status SoftmaxBackward(const kernels::AttentionParams& p, const SequenceSlice& s, const float* q,
                                       const float* k, const float* v, const float* out, const float* dout,
                                       const float* lse, float* dq, float* dk, float* dv) = 0;
  // Linear attention; log_decay [t, H]; local_cu [num_seqs + 1] the local
  // pieces of the sequences (host).
  virtual absl::Status LinearForward(const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                     const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                     const float* v, const float* log_decay, float* out) = 0;
  virtual absl::Status LinearBackward(const kernels::LinearAttentionParams& p, const SequenceSlice& s,
                                      const int32_t* local_cu, int num_seqs, const float* q, const float* k,
                                      const float* v, const float* log_decay, const float* dout, float* dq, float* dk,
                                      float* dv) = 0;
};

}  // namespace tandem::model
