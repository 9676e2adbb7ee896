// TpDecoder: BatchForward for one rank of a tensor-parallel group (Megatron
// layout, tp_slice.h). The rank runs the decoder of its slice (H/T query
// heads, Hkv/T key/value heads, I/T MLP columns) over a paged KV cache that
// holds only its heads (kv_dim() = Hkv/T * D); the attention-out and
// MLP-down products are partial sums that one sum all-reduce per block
// completes, followed by the residual add and the next RMSNorm:
//
//   xn = RMSNorm(x)  ->  part = Attn_t(xn) Wo_t^T  ->  allreduce(part)
//   x += part; xn = RMSNorm_post(x)  ->  part = SwiGLU_t(xn) Wdown_t^T
//   ->  allreduce(part)  ->  x += part; xn = RMSNorm_next(x)  ...
//
// The parameters a Forward gets are the slice's (the flat layout of
// TpSliceConfig; SliceFromFull or GatherTpSlice builds them). Every rank of
// the group runs the same batches in the same order and gets the same
// logits, up to the order of the fp32 sums (the all-reduce gives every rank
// the same bits).
//
// Two-half overlap (TokenWeave; TpOptions.overlap): the batch's rows are
// split into two halves A (first) and B; the all-reduce of one half runs on
// a communication thread (async_allreduce.h) while the other half computes,
// and each all-reduce is followed by the residual add and RMSNorm of its
// rows. Rows are independent except that a row attends over the k/v of its
// sequence's earlier rows, which the scheduler places before it, so A's
// attention never needs B's rows. The result equals the unsplit path up to
// the matmul kernels' blocking over a different row count (bit for bit with
// the reference kernels).
//
// Scratch as PagedDecoder: grown by Reserve, Forward allocates nothing. One
// thread at a time; the Collective is used by this decoder alone between
// Reserve and Release (in overlap mode, from its communication thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/model/decoder.h"
#include "worker/rollout/async_allreduce.h"
#include "worker/rollout/batch_forward.h"

namespace tandem::rollout {

struct TpOptions {
  // Split batches of at least overlap_min_rows rows into two halves whose
  // communication overlaps the other half's compute.
  bool overlap = false;
  int overlap_min_rows = 2;
  comm::Timeout timeout{60000};
};

// Communication of the forwards since the decoder was made or ResetStats.
struct TpStats {
  int64_t forwards = 0;
  int64_t allreduces = 0;
  uint64_t allreduce_bytes = 0;  // payload (floats x 4) summed
  double allreduce_seconds = 0;  // inside all-reduce calls (either thread)
  double exposed_seconds = 0;    // the compute thread waiting for them
  double forward_seconds = 0;
  // Share of the all-reduce time the compute did not wait for.
  double hidden_share() const {
    return allreduce_seconds > 0 ? std::max(0.0, 1.0 - exposed_seconds / allreduce_seconds) : 0.0;
  }
};

class TpDecoder final : public BatchForward {
 public:
  // config: the FULL model's config; group: this rank's TP group (its size
  // is the TP size; nullptr = TP size 1); ops, memory and group must
  // outlive the decoder. Errors as TpSliceConfig.
  static absl::StatusOr<std::unique_ptr<TpDecoder>> Create(const model::ModelConfig& config, comm::Collective* group,
                                                           kernels::Ops* ops, kernels::DeviceMemory* memory,
                                                           TpOptions options = {});

  absl::Status Reserve(int rows, int outs, int positions) override;
  absl::Status Forward(model::ParamProvider& params, KvPool& kv, const ForwardBatch& batch) override;
  const float* logits() const override { return logits_.data(); }
  float* mutable_logits() override { return logits_.data(); }
  void Release() override;
  int num_layers() const override { return decoder_.dims().L; }
  int kv_dim() const override { return decoder_.dims().KD; }
  int vocab() const override { return decoder_.dims().V; }
  int hidden() const override { return decoder_.dims().C; }
  int max_positions() const override { return decoder_.config().max_position_embeddings; }
  const model::LayerType& layer_type(int layer) const override { return decoder_.layer_type(layer); }
  kernels::DeviceMemory* memory() const override { return decoder_.memory(); }
  size_t scratch_bytes() const override;

  int tp_size() const { return group_ == nullptr ? 1 : group_->size(); }
  int tp_rank() const { return group_ == nullptr ? 0 : group_->rank(); }
  // The slice's layout: what Forward's ParamProvider serves.
  const model::ParamLayout& slice_layout() const { return decoder_.layout(); }
  const TpStats& stats() const { return stats_; }
  void ResetStats() { stats_ = TpStats{}; }

 private:
  TpDecoder(const model::ModelConfig& slice_config, comm::Collective* group, kernels::Ops* ops,
            kernels::DeviceMemory* memory, TpOptions options);

  // Rows [r0, r0 + n) of one layer's blocks; each writes its partial sum to
  // part_. Finish adds the reduced part_ rows into x_ and, with a norm
  // weight, writes RMSNorm(x_) to xn_.
  void AttnPart(const float* P, int l, KvPool& kv, const ForwardBatch& b, int r0, int n);
  void MlpPart(const float* P, int l, int r0, int n);
  void Finish(int r0, int n, const float* norm);
  // Sum all-reduce of part_ rows [r0, r0 + n): on this thread, or started
  // on the communication thread and waited for.
  absl::Status ReduceNow(int r0, int n);
  void ReduceStart(int r0, int n);
  absl::Status ReduceWait();
  absl::Status Layers(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b);
  absl::Status LayersOverlapped(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b);

  model::Decoder decoder_;
  kernels::Ops* ops_;
  comm::Collective* group_;
  TpOptions options_;
  std::unique_ptr<AsyncAllreduce> async_;
  TpStats stats_;
  int rows_cap_ = 0, out_cap_ = 0;
  kernels::DeviceArray<float> x_, xn_, q_, qraw_, k_, kraw_, v_, attn_, rstd_, gate_, up_, h_, part_, hn_, logits_;
};

}  // namespace tandem::rollout
