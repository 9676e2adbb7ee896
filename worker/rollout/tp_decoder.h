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
// attention never needs B's rows. In a linear-attention layer a run of a
// sequence's rows cut by the split continues in B from the state A left in
// its slot (linear_runs.h). The result equals the unsplit path up to
// the matmul kernels' blocking over a different row count (bit for bit with
// the reference kernels).
//
// Shift parallelism (TpOptions.shift; tp_decoder_shift.cc): a step of at
// least shift_threshold_tokens rows runs sequence-parallel instead. Rank r
// takes the contiguous rows comm::SplitEven(rows, T)[r] and runs the FULL
// model on them (full weights on every rank, SetFullParams), except
// attention: the q/k/v of each rank's rows are projected per head slice and
// exchanged by one all-to-all, so rank t attends for ITS heads over every
// row of the step and reads and writes the same KV blocks as in TP mode; a
// second all-to-all returns each rank its rows' attention output. No
// all-reduce; one all-gather of the residual rows at the end gives every
// rank every row for the logits. The KV-cache layout is the same in both
// modes, so a sequence prefilled in SP steps decodes in TP steps. Results
// equal TP mode up to the order of the fp32 sums.
//
// Scratch as PagedDecoder: grown by Reserve, Forward allocates nothing. One
// thread at a time; the Collective is used by this decoder alone between
// Reserve and Release (in overlap mode, from its communication thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/model/decoder.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/async_allreduce.h"
#include "worker/rollout/batch_forward.h"
#include "worker/rollout/linear_runs.h"

namespace tandem::rollout {

struct TpOptions {
  // Split batches of at least overlap_min_rows rows into two halves whose
  // communication overlaps the other half's compute.
  bool overlap = false;
  int overlap_min_rows = 2;
  // Run steps of at least shift_threshold_tokens rows sequence-parallel
  // (needs SetFullParams; no effect at TP size 1).
  bool shift = false;
  int shift_threshold_tokens = 256;
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
  // Forwards and rows run in each mode (tensor- or sequence-parallel), and
  // the sequence-parallel steps' all-to-all and all-gather traffic.
  int64_t tp_steps = 0, sp_steps = 0;
  int64_t tp_rows = 0, sp_rows = 0;
  int64_t sp_collectives = 0;
  uint64_t sp_bytes = 0;  // payload sent and received by this rank
  double sp_comm_seconds = 0;
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
  int input_vocab() const override { return decoder_.dims().V + decoder_.config().tandem_soft_prompt_tokens; }
  int hidden() const override { return decoder_.dims().C; }
  int max_positions() const override { return decoder_.config().max_position_embeddings; }
  const model::LayerType& layer_type(int layer) const override { return decoder_.layer_type(layer); }
  kernels::DeviceMemory* memory() const override { return decoder_.memory(); }
  size_t scratch_bytes() const override;
  bool supports_sparse() const override { return true; }
  // This rank's heads' state: linear layers split by heads like softmax ones.
  size_t linear_state_floats() const override;

  int tp_size() const { return group_ == nullptr ? 1 : group_->size(); }
  int tp_rank() const { return group_ == nullptr ? 0 : group_->rank(); }
  // The slice's layout: what Forward's ParamProvider serves.
  const model::ParamLayout& slice_layout() const { return decoder_.layout(); }
  // The full model's parameters (its flat layout, full_layout()) for
  // sequence-parallel steps; must outlive the forwards that use it. A
  // sequence-parallel step without it fails with FailedPrecondition.
  void SetFullParams(model::ParamProvider* full) { full_ = full; }
  const model::ParamLayout& full_layout() const { return full_layout_; }
  // Whether a step of `rows` rows runs sequence-parallel.
  bool ShiftStep(int rows) const { return options_.shift && tp_size() > 1 && rows >= options_.shift_threshold_tokens; }
  const TpStats& stats() const { return stats_; }
  void ResetStats() { stats_ = TpStats{}; }

 private:
  TpDecoder(const model::ModelConfig& config, const model::ModelConfig& slice_config, comm::Collective* group,
            kernels::Ops* ops, kernels::DeviceMemory* memory, TpOptions options);

  // Rows [r0, r0 + n) of one layer's blocks; each writes its partial sum to
  // part_. Finish adds the reduced part_ rows into x_ and, with a norm
  // weight, writes RMSNorm(x_) to xn_.
  void AttnPart(const float* P, int l, KvPool& kv, const ForwardBatch& b, int r0, int n);
  // From this rank's heads' projected q/k/v of rows [r0, r0 + n) (in
  // qraw_/kraw_ with q/k norms, else q_/k_; v_): the norms, RoPE, the KV
  // write and paged attention into attn_. q_norm/k_norm: nullptr without.
  void Attend(const float* q_norm, const float* k_norm, int l, KvPool& kv, const ForwardBatch& b, int r0, int n);
  // The runs of rows [r0, r0 + n) for a linear layer: the batch's own for
  // the whole batch, else a half's (SplitRuns).
  LinearRuns RunsFor(const ForwardBatch& b, int r0, int n) const;
  // The linear-layer runs of halves [0, m) and [m, rows), one upload.
  void SplitRuns(const ForwardBatch& b, int m);
  void MlpPart(const float* P, int l, int r0, int n);
  void Finish(int r0, int n, const float* norm);
  // Sum all-reduce of part_ rows [r0, r0 + n): on this thread, or started
  // on the communication thread and waited for.
  absl::Status ReduceNow(int r0, int n);
  void ReduceStart(int r0, int n);
  absl::Status ReduceWait();
  absl::Status Layers(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b);
  absl::Status LayersOverlapped(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b);
  // Sequence-parallel layers over the full parameters, then the all-gather
  // that leaves every row's residual in x_ (tp_decoder_shift.cc).
  absl::Status LayersShifted(model::ParamProvider& full, KvPool& kv, const ForwardBatch& b);
  absl::Status ShiftExchange(const float* in, const std::vector<size_t>& send, float* out,
                             const std::vector<size_t>& recv);
  // Scratch of sequence-parallel steps of up to `rows` rows.
  bool ReserveShift(int rows, size_t* bytes);

  model::Decoder decoder_;
  model::ParamLayout full_layout_;
  model::DecoderDims full_dims_;
  kernels::Ops* ops_;
  comm::Collective* group_;
  model::ParamProvider* full_ = nullptr;
  TpOptions options_;
  std::unique_ptr<AsyncAllreduce> async_;
  TpStats stats_;
  int rows_cap_ = 0, out_cap_ = 0;
  kernels::DeviceArray<float> x_, xn_, q_, qraw_, k_, kraw_, v_, attn_, rstd_, gate_, up_, h_, part_, hn_, logits_;
  // Linear layers: the runs' states [outs, state floats], and each half's
  // runs (row offsets on the device and the host, slots, starts).
  kernels::DeviceArray<float> state_;
  kernels::DeviceArray<int32_t> half_rows_d_;
  std::vector<int32_t> half_rows_[2], half_slot_[2], half_start_[2];
  int half_num_[2] = {0, 0};
  int half_r0_ = -1;
  // Sequence-parallel steps: this rank's rows' q/k/v per destination, the
  // step's rows of this rank's heads as received, this rank's rows'
  // attention output of every head, and the full-width MLP activations.
  int shift_cap_ = 0;
  kernels::DeviceArray<float> sp_send_, sp_recv_, sp_attn_, sp_gate_, sp_up_, sp_h_;
  std::vector<size_t> sp_rows_, sp_offs_, sp_send_counts_, sp_recv_counts_;
};

}  // namespace tandem::rollout
