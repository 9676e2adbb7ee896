// Sequence parallelism in the model: one packed batch split across the
// ranks of a sequence-parallel group, rank r holding the contiguous rows
// [bounds[r], bounds[r+1]) of it, in rank order, so every sequence's rows
// run through the ranks in order and the linear layers' running state
// passes rank to rank. The bounds give each rank an equal share of the
// estimated work (SliceCost): a row's attention grows with the keys it
// sees, so with causal layers the later rows of a long sequence weigh more
// and their ranks hold fewer of them (causal load balancing within the
// contiguous order).
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
#include "worker/model/layer_types.h"

namespace tandem::model {

struct Batch;
struct ModelConfig;

// Where this rank's rows sit in the whole packed batch.
struct SequenceSlice {
  int rank = 0;
  int size = 1;
  int offset = 0;                  // global row of local row 0
  int rows = 0;                    // local rows
  std::vector<int32_t> global_cu;  // cu_seqlens of the whole batch
  std::vector<int> bounds;         // size + 1 row bounds of every rank
  int global_rows() const { return global_cu.empty() ? 0 : global_cu.back(); }
  // The local row 0 continues a sequence that began on an earlier rank; the
  // last local row's sequence continues on a later rank.
  bool continues_in() const;
  bool continues_out() const;
};

// size + 1 row bounds of `rows` rows over `size` ranks (the first rows %
// size ranks take one more).
std::vector<int> SliceBounds(int rows, int size);

// The estimated work of one row in a forward and backward, in flops: a
// fixed part (projections, MLP, LM head, linear attention) and, per
// softmax layer, a part per key the row sees (QK^T and PV).
struct SliceCost {
  double per_row = 1.0;
  double per_key = 0.0;            // per key and softmax layer
  std::vector<LayerType> softmax;  // the softmax layers' types
  // The row at position `pos` of its sequence.
  double Row(int pos) const;
};

// A model's SliceCost from its dimensions and layer types.
SliceCost SliceCostOf(const ModelConfig& config);

// size + 1 row bounds over the packed batch `cu` (cu_seqlens) that give
// every rank about the same cost, each at least one row; `cost` with
// per_key 0 gives SliceBounds' even split.
std::vector<int> BalancedSliceBounds(const std::vector<int32_t>& cu, int size, const SliceCost& cost);

// Rank `rank`'s slice of `global` (tokens, targets, positions and the local
// pieces of its sequences as cu_seqlens; `slice` set, its bounds those of
// BalancedSliceBounds). InvalidArgument when the batch has fewer rows than
// ranks or a bad rank/size.
absl::StatusOr<Batch> SliceBatch(const Batch& global, int rank, int size, const SliceCost& cost = {});

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
