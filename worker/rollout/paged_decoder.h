// PagedDecoder: BatchForward on one device, the decoder stack of
// worker/model/decoder.h (the same parameters, layout, norms, RoPE and
// attention options) with its attention over a paged KV cache
// (Ops::paged_kv_write, Ops::paged_attention; in full-attention layers
// Ops::paged_sparse_attention when the batch asks for it). Linear-attention
// layers write no KV: each run of a sequence's rows continues its recurrent
// state (Ops::linear_attention_forward, the training kernel, from the state
// slot of the KvPool). One scratch buffer per
// activation, shared by every layer and grown by Reserve; Forward allocates
// nothing. One thread at a time.
#pragma once

#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/decoder.h"
#include "worker/rollout/batch_forward.h"

namespace tandem::rollout {

class PagedDecoder final : public BatchForward {
 public:
  // `ops` and `memory` must outlive the decoder (memory: the backend's).
  PagedDecoder(const model::ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory);

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
  size_t linear_state_floats() const override;

  const model::DecoderDims& dims() const { return decoder_.dims(); }

 private:
  void Layer(const float* P, int l, KvPool& kv, const ForwardBatch& b);
  // The post-attention norm and SwiGLU MLP, added into x_.
  void Mlp(const float* P, const model::LayerOffsets& o, int T);
  // Linear attention of layer l over the batch's runs, states in `kv`.
  void LinearAttention(int l, KvPool& kv, const ForwardBatch& b);

  model::Decoder decoder_;
  kernels::Ops* ops_;
  int rows_cap_ = 0, out_cap_ = 0;
  kernels::DeviceArray<float> x_, xn_, q_, qraw_, k_, kraw_, v_, attn_, rstd_, gate_, up_, h_, hn_, logits_;
  kernels::DeviceArray<float> state_;  // [outs, state floats]: the runs' states (linear layers)
};

}  // namespace tandem::rollout
