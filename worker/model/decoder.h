// Decoder: the forward pass of the Llama 3 / Mistral / Qwen2 / Qwen3 style
// decoder stack, shared by training and log-probs (Model) and by generation
// (the rollout engine, worker/rollout):
//
//   embedding -> N x [RMSNorm -> q/k/v (+ biases) (-> per-head RMSNorm of q
//   and k, Qwen3) -> RoPE -> attention (packed causal varlen, optional
//   per-layer sliding window; or one new token per sequence over a KV cache;
//   or linear attention with a fixed per-head decay in `linear` layers,
//   layer_types.h)
//   -> o-proj -> residual -> RMSNorm -> SwiGLU MLP -> residual]
//   -> final RMSNorm (-> LM head logits)
//
// The decoder owns what both users need the same way: the configuration,
// the parameter layout, the device memory (a host memory of its own when
// none is given) and the rotary tables. It owns no activations: each
// forward says where they go (DecoderActivations), per layer slices that a
// backward reads again or one scratch buffer that every layer reuses, so a
// forward allocates nothing. Parameters come from a ParamProvider unit by
// unit (param_provider.h). All pointers are device pointers of memory().
// A forward returns nothing: a device error sticks in memory() and
// MemoryStatus() reports it; inputs are checked by the callers (Model,
// PagedDecoder), so a malformed DecoderInput is a bug and aborts. One thread
// at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/config.h"
#include "worker/model/layer_types.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_provider.h"

namespace tandem::model {

// The sizes of a config, named as in the kernels' comments.
struct DecoderDims {
  explicit DecoderDims(const ModelConfig& config);
  int C;    // hidden size
  int H;    // query heads
  int Hkv;  // key/value heads
  int D;    // head dim
  int I;    // intermediate (MLP) size
  int V;    // vocabulary
  int L;    // layers
  int HD;   // H * D
  int KD;   // Hkv * D
};

// One activation for every layer: layer l's is at base + l * stride. Stride
// 0: one buffer that every layer overwrites.
struct LayerBuffer {
  float* base = nullptr;
  size_t stride = 0;
  float* at(int layer) const { return base + static_cast<size_t>(layer) * stride; }
};

// Where a forward of `rows` tokens writes its activations (row-major).
struct DecoderActivations {
  // Residual stream [rows, C]: layer l reads x.at(l) and writes x.at(l + 1)
  // (with stride 0, in place). x.at(0) receives the embeddings.
  LayerBuffer x;
  // Residual after the attention block [rows, C]; may equal x (in place).
  LayerBuffer xmid;
  // Queries [rows, HD], keys and values [rows, KD] as the attention reads
  // them (after biases, q/k norms and RoPE).
  LayerBuffer q, k, v;
  // Attention output [rows, HD] and its log-sum-exp [rows, H] (packed
  // attention only).
  LayerBuffer attn, lse;
  // RMSNorm reciprocal std of the attention and MLP inputs [rows].
  LayerBuffer rstd_in, rstd_post;
  // SwiGLU inputs [rows, I].
  LayerBuffer gate, up;
  // With q/k norms (Qwen3): the projections before the norms [rows, HD] and
  // [rows, KD], and the norms' reciprocal std [rows, H] and [rows, Hkv].
  LayerBuffer q_raw, k_raw, rstd_q, rstd_k;
  float* xn = nullptr;    // scratch [rows, C] (normed layer inputs)
  float* hact = nullptr;  // scratch [rows, I] (SwiGLU output)
};

// A KV cache: per layer [slots, capacity, Hkv, D]. New rows are written
// with a scatter-add (Ops::embedding_backward), so rows at and past each
// slot's length must hold zeros.
struct KvCache {
  std::span<kernels::DeviceArray<float>> k, v;  // one array per layer
  int capacity = 0;                             // rows per slot
};

// Replaces the attention kernels of packed forwards (sequence parallelism:
// the model's SequenceAttention). Called once per layer, in layer order,
// with that layer's q, k, v (after RoPE) and where its output and (softmax
// layers) log-sum-exp go. Errors are the hook's to keep.
class AttentionHook {
 public:
  virtual ~AttentionHook() = default;
  virtual void Attend(int layer, const float* q, const float* k, const float* v, float* out, float* lse) = 0;
};

// The tokens of one forward (device arrays).
struct DecoderInput {
  int rows = 0;
  const int32_t* tokens = nullptr;     // [rows]
  const int32_t* positions = nullptr;  // [rows]
  // Packed causal attention over num_seqs sequences laid end to end:
  // cu [num_seqs + 1] offsets. nullptr: decode, one new token per row over
  // its slot of `cache` (then required).
  const int32_t* cu = nullptr;
  int num_seqs = 0;
  // Optional: each row's k/v are written to cache row kv_rows[r] (slot *
  // capacity + position); decode attends over cache_len[r] rows of the
  // row's slot, the new token included.
  const KvCache* cache = nullptr;
  const int32_t* kv_rows = nullptr;    // [rows]
  const int32_t* cache_len = nullptr;  // [rows], decode only
  // Optional (packed forwards only): computes every layer's attention.
  AttentionHook* attention = nullptr;
};

// The final RMSNorm's output.
struct DecoderOutput {
  int rows = 0;                     // rows normalised
  const int32_t* select = nullptr;  // [rows] rows of the last layer to take
                                    // (gathered through acts.xn); nullptr:
                                    // rows 0..rows-1
  float* xn = nullptr;              // [rows, C]
  float* rstd = nullptr;            // [rows]
};

class Decoder {
 public:
  // `ops` and `memory` must outlive the decoder; memory nullptr: a host
  // memory owned by the decoder.
  Decoder(const ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory);
  Decoder(Decoder&&) = default;
  Decoder& operator=(Decoder&&) = default;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  const DecoderDims& dims() const { return dims_; }
  kernels::Ops* ops() const { return ops_; }
  kernels::DeviceMemory* memory() const { return mem_; }

  // Rotary tables for positions 0..positions-1 (grown by doubling; rebuilt
  // when dynamic-NTK scaling changes the base). ResourceExhausted when the
  // tables cannot be allocated.
  absl::Status EnsureRope(int positions);
  void ReleaseRope();
  const float* rope_cos() const { return cos_d_.data(); }
  const float* rope_sin() const { return sin_d_.data(); }
  size_t rope_bytes() const { return cos_d_.bytes() + sin_d_.bytes(); }

  // Embedding, every layer and the final norm (units 0..L+1, each acquired,
  // used and released in order). EnsureRope must cover the positions.
  void Forward(ParamProvider& params, const DecoderInput& in, const DecoderActivations& acts,
               const DecoderOutput& out) const;
  // logits [rows, V] = xn W_head^T (the LM head unit acquired for the call).
  void Logits(ParamProvider& params, const float* xn, int rows, float* logits) const;

  // q, k (and v unless nullptr) = projections of xn (+ biases), rows rows;
  // P: the layer's unit.
  void ProjectQkv(const float* P, const LayerOffsets& o, int rows, const float* xn, float* q, float* k, float* v) const;
  kernels::AttentionParams Attention(int layer) const;
  // Layer l's type (layer_types.h) and, for linear layers, the kernel's
  // options and the log decay [rows, H] (EnsureLinearDecay must cover the
  // rows; a no-op without linear layers; ResourceExhausted when the buffer
  // cannot be allocated).
  const LayerType& layer_type(int layer) const { return layer_types_[layer]; }
  bool has_linear_layers() const;
  kernels::LinearAttentionParams LinearAttention() const;
  absl::Status EnsureLinearDecay(int rows);
  const float* LinearDecay(int rows) const;
  // The model's index of this decoder's first head: a tensor-parallel
  // slice runs heads [h, h + H) of the model, and a linear layer's decay
  // depends on the model's head index. Set before EnsureLinearDecay.
  void set_first_head(int h) { first_head_ = h; }
  // InternalError naming `who` when the device memory has failed.
  absl::Status MemoryStatus(const char* who) const;

  // How much of a layer's forward RecomputeLayer runs again.
  enum class LayerPart {
    // The attention core: input RMSNorm (xn, rstd_in), q/k/v with their
    // biases, norms and RoPE, attention (attn, lse). The residual is not
    // touched.
    kAttentionCore,
    // The core, then the o-projection into xmid: the whole attention
    // sub-block. The MLP sub-block is not run.
    kAttentionBlock,
  };
  // Runs the first part of layer `layer`'s forward again with the very
  // kernel calls of Forward, reading acts.x.at(layer) and writing the
  // buffers `part` names (packed causal batches only: `in.cu` set, no
  // cache). P: the layer's unit. On the same inputs and buffers it writes
  // the same bits as the forward did.
  void RecomputeLayer(const float* P, int layer, const DecoderInput& in, const DecoderActivations& acts,
                      LayerPart part) const;

 private:
  // The attention sub-block of layer l; stops after the attention core
  // unless `block`.
  void AttentionBlock(const float* P, int l, const DecoderInput& in, const DecoderActivations& acts, bool block) const;
  void Layer(const float* P, int layer, const DecoderInput& in, const DecoderActivations& acts) const;

  ModelConfig config_;
  ParamLayout layout_;
  DecoderDims dims_;
  kernels::Ops* ops_;
  std::unique_ptr<kernels::DeviceMemory> owned_memory_;
  kernels::DeviceMemory* mem_;
  float eps_;

  // Rotary tables: built on the host, uploaded when they change.
  std::vector<float> cos_, sin_;
  kernels::DeviceArray<float> cos_d_, sin_d_;
  int rope_rows_ = 0;
  int rope_key_ = -1;

  std::vector<LayerType> layer_types_;
  // Log decay of linear layers [rows, H], grown by doubling.
  kernels::DeviceArray<float> linear_decay_;
  int linear_decay_rows_ = 0;
  int first_head_ = 0;
};

}  // namespace tandem::model
