// Model: the Llama 3 / Mistral / Qwen2 / Qwen3 style decoder (embedding,
// N x [RMSNorm -> attention (q/k/v/o, optional q/k/v biases, optional
// per-head RMSNorm of q and k (Qwen3), RoPE, GQA, optional per-layer sliding
// window) -> residual -> RMSNorm -> SwiGLU MLP -> residual], final RMSNorm,
// tied or untied LM head) over packed batches, forward and backward.
//
// The forward pass is the shared Decoder (decoder.h); the model adds the
// loss heads (log-probs, entropy, logits) and the backward pass. Parameters
// come from a ParamProvider (param_provider.h) unit by unit, in the flat
// layout of ParamLayout; the model never owns them. Activations
// needed by Backward live in a workspace owned by the model, sized for
// `max_tokens` and grown (never shrunk) only when a larger batch arrives.
//
// Memory: the workspace, the batch's index arrays and the rotary tables live
// in `memory` (kernels/memory.h), the backend's device memory; nullptr means
// a host memory owned by the model (CPU backends). The host never touches
// them: batches are uploaded per call, results downloaded. The public API
// takes and returns HOST arrays (logp, entropy, dlogp, logits); the
// ParamProvider's pointers are DEVICE pointers of `memory`. One Model is used
// by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/activation_checkpointing.h"
#include "worker/model/config.h"
#include "worker/model/decoder.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_provider.h"
#include "worker/model/sequence_parallel.h"

namespace tandem::model {

// A packed batch: T tokens of num_seqs sequences laid end to end.
//   tokens[t]     input token ids
//   targets[t]    the token whose log-probability is computed at row t
//                 (usually tokens[t+1] of the same sequence; any valid id
//                 where the loss mask is 0)
//   positions[t]  position inside its sequence (restarts at 0)
//   cu_seqlens    num_seqs + 1 offsets, cu_seqlens[0] = 0, last = T
struct Batch {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  // Set by SliceBatch (sequence_parallel.h): these rows are one rank's slice
  // of a larger packed batch, and cu_seqlens the local pieces of its
  // sequences. A model with a SequenceAttention takes only such batches.
  std::optional<SequenceSlice> slice;
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  // Appends one sequence: inputs seq[0..n-2], targets seq[1..n-1].
  void AddSequence(std::span<const int32_t> seq);
};

// Options of Model::Backward.
struct BackwardOptions {
  // MeCeFO's cheap mode: every layer's attention sub-block (input RMSNorm,
  // q/k/v, their biases and norms, RoPE, attention, o-proj) is skipped in the
  // backward pass: the residual gradient passes through it unchanged and its
  // parameters get no gradient from this batch. The MLP sub-blocks, the
  // final norm, the LM head and the embedding are differentiated as usual
  // (through that approximate residual gradient).
  bool skip_attention = false;
  // MeCeFO's low-rank FFN weight gradients: r > 0 computes the gradients
  // of every layer's gate, up and down projections through a rank-r
  // projection of the hidden (hidden_size) dimension,
  //   dW_gate ~ dW_gate P P^T,  dW_up ~ dW_up P P^T,  dW_down ~ P P^T dW_down,
  // with P [hidden_size, r] orthonormal columns drawn per layer from
  // low_rank_seed (Gaussian, then Gram-Schmidt in double). Cost per layer
  // about 3 T r (C + I) + 3 C r I multiply-adds instead of 3 T C I. It is a
  // projection, so the relative error of each matrix's gradient is at most
  // 1 and 0 at r >= hidden_size. The gradients that flow on (into the
  // activations) stay exact.
  int low_rank = 0;
  uint64_t low_rank_seed = 0;
};

// Options of Model::ForwardLogprobs.
struct ForwardOptions {
  // MeCeFO's FFN recomputation: the SwiGLU inputs (gate and up projections,
  // 2 T I floats per layer) are not kept for Backward; Backward recomputes
  // them from the stored post-attention residual, with the same kernels on
  // the same inputs, so the gradients are bit-identical to the stored path.
  // Such a forward does not grow the stored-activation buffer.
  bool recompute_mlp = false;
};

class Model {
 public:
  // `ops` and `memory` must outlive the model. When the workspace for
  // `max_tokens` cannot be allocated here, the first Forward* call retries
  // and reports ResourceExhausted.
  Model(const ModelConfig& config, kernels::Ops* ops, int max_tokens = 0, kernels::DeviceMemory* memory = nullptr);
  Model(const Model&) = delete;  // sp_hook_ points at this model
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return decoder_.config(); }
  const ParamLayout& layout() const { return decoder_.layout(); }

  // Writes logp[t] = log p(targets[t] | tokens[..t]) (and the entropy of the
  // predictive distribution when entropy != nullptr) and keeps what
  // Backward needs. logp/entropy: host arrays of T floats. InvalidArgument on
  // a malformed batch, ResourceExhausted when the workspace cannot grow.
  absl::Status ForwardLogprobs(const Batch& batch, ParamProvider& params, float* logp, float* entropy = nullptr,
                               const ForwardOptions& options = {});
  // Gradient of the last ForwardLogprobs: dlogp[T] (host) = dLoss/dlogp. ADDS
  // parameter gradients through AcquireGrads/ReleaseGrads (units L+1..0;
  // the same calls with skip_attention, so ZeRO's collectives match).
  absl::Status Backward(const float* dlogp, ParamProvider& params, const BackwardOptions& options = {});
  // Backward in pieces, for schedules that interleave several models'
  // backward passes layer by layer (layer_major.h). Backward is exactly
  //   BackwardPrepare; BackwardHead; BackwardLayer(L-1..0); BackwardEmbedding
  // and each piece makes the same ParamProvider calls as that part of
  // Backward. Prepare checks and uploads dlogp (nothing acquired on error).
  absl::Status BackwardPrepare(const float* dlogp, const BackwardOptions& options = {});
  // LM head and final norm (units L+1, and 0 when tied).
  void BackwardHead(ParamProvider& params);
  // Decoder layer l (unit l+1).
  void BackwardLayer(int l, ParamProvider& params);
  // The embedding (unit 0); returns the device memory status.
  absl::Status BackwardEmbedding(ParamProvider& params);
  // Full logits [T, V] into a host array (materialised in a device buffer
  // allocated for this call: for tests and evaluation of short batches).
  // Leaves no state for Backward.
  absl::Status ForwardLogits(const Batch& batch, ParamProvider& params, float* logits);

  // What every following forward keeps for Backward and what Backward
  // recomputes (activation_checkpointing.h); log-probs and gradients are
  // bit-identical in every mode. kLayer recomputes the SwiGLU inputs as
  // recompute_mlp does. The next forward lays the workspace out for the
  // mode (one reallocation when it changes).
  void set_activation_checkpointing(ActivationCheckpointing mode) { want_ckpt_ = mode; }
  ActivationCheckpointing activation_checkpointing() const { return want_ckpt_; }

  // Sequence parallelism: batches that are SliceBatch slices (of this
  // group's rank) compute attention through `sp` (nullptr: off); whole
  // batches still run on this rank alone. The parameter gradients Backward
  // adds are this rank's part: their sum over the group is the gradient of
  // the whole batch. Host memory only (FailedPrecondition otherwise, at the
  // next forward). `sp` must outlive its use.
  void SetSequenceAttention(SequenceAttention* sp) { sp_ = sp; }

  // HF-style initialisation into params[layout().total_floats()]:
  // N(0, 0.02) for matrices, ones for norms, zeros for biases and padding.
  // Deterministic in seed (mt19937_64 + Box-Muller).
  void InitParams(uint64_t seed, float* params) const;

  // Device bytes held by the model (workspace, index arrays, rope tables).
  size_t workspace_bytes() const {
    return ws_.bytes() + mlp_.bytes() + low_rank_ws_.bytes() + idx_.bytes() + decoder_.rope_bytes();
  }
  // Bytes of the buffers that hold activations from the forward until the
  // backward, every layer's (the per-layer stores of the workspace's
  // current layout and the stored SwiGLU inputs), as allocated.
  size_t saved_activation_bytes() const { return saved_floats_ * sizeof(float) + mlp_.bytes(); }
  // Every activation byte of the model: the workspace (saved activations
  // and the scratch the forward, recomputation and backward share) and the
  // stored SwiGLU inputs, as allocated.
  size_t activation_bytes() const { return ws_.bytes() + mlp_.bytes(); }
  int capacity_tokens() const { return cap_; }
  kernels::DeviceMemory* memory() const { return decoder_.memory(); }

 private:
  absl::Status CheckBatch(const Batch& b) const;
  // The workspace for t tokens laid out for `mode` (reallocated when it
  // is smaller or laid out for another mode).
  absl::Status EnsureCapacity(int t, ActivationCheckpointing mode);
  // The per-layer SwiGLU inputs (gate_, up_) for t tokens.
  absl::Status EnsureMlpStore(int t);
  // The low-rank scratch (P, X P, and the r x I product) for t tokens.
  absl::Status EnsureLowRank(int t, int r);
  // P [C, r] for `layer`: orthonormal columns from (seed, layer), uploaded.
  void MakeProjection(uint64_t seed, int layer, int r);
  // Checks, grows, uploads the batch and the rope tables.
  absl::Status Prepare(const Batch& batch, ActivationCheckpointing mode);
  // The decoder through the final norm, keeping what the workspace's
  // layout keeps of every layer's activations; recompute_mlp: see
  // ForwardOptions.
  void ForwardHidden(ParamProvider& params, bool recompute_mlp);
  // The activation views of the workspace's layout (per-layer stores with
  // a stride of one layer, scratch with stride 0); recompute_mlp: gate and
  // up in the gradient scratch.
  DecoderActivations Activations(bool recompute_mlp) const;
  DecoderInput Input() const;

  Decoder decoder_;
  DecoderDims d_;               // decoder_.dims()
  kernels::Ops* ops_;           // decoder_.ops()
  kernels::DeviceMemory* mem_;  // decoder_.memory()
  int lm_chunk_;

  // The current batch on the device: one array [tokens T | targets T |
  // positions T | cu_seqlens nseq+1], staged in idx_host_ (reused).
  int T_ = 0;
  int nseq_ = 0;
  kernels::DeviceArray<int32_t> idx_;
  std::vector<int32_t> idx_host_;
  const int32_t *tokens_ = nullptr, *targets_ = nullptr, *positions_ = nullptr, *cu_ = nullptr;
  bool have_forward_ = false;
  bool recomputed_mlp_ = false;  // the last forward kept no gate_/up_
  // The backward in progress (BackwardPrepare): its options and low rank.
  BackwardOptions bw_options_;
  int bw_rank_ = 0;

  // Workspace (one device allocation) and views into it, sized for cap_
  // tokens and laid out for ckpt_: per-layer stores for what the mode
  // keeps, one layer's slot for what it recomputes (the *_stride_ members
  // are 0 then). saved_floats_: the per-layer stores' floats.
  int cap_ = 0;
  ActivationCheckpointing ckpt_ = ActivationCheckpointing::kNone;
  ActivationCheckpointing want_ckpt_ = ActivationCheckpointing::kNone;
  size_t saved_floats_ = 0;
  bool keep_mid_ = true, keep_core_ = true;
  kernels::DeviceArray<float> ws_;
  float *logp_ = nullptr, *entropy_ = nullptr, *dlogp_ = nullptr;
  // Per layer: q and k after RoPE (and the q/k norms), v, ...
  float *x_ = nullptr, *xmid_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *lse_ = nullptr,
        *gate_ = nullptr, *up_ = nullptr, *rstd1_ = nullptr, *rstd2_ = nullptr, *rstdf_ = nullptr, *xnf_ = nullptr;
  // Per layer, with q/k norms: their rstd [T, H] and [T, Hkv].
  float *rstdq_ = nullptr, *rstdk_ = nullptr;
  // Scratch (also used by backward).
  float *xn_ = nullptr, *hact_ = nullptr, *dres_ = nullptr, *dtmp_ = nullptr, *dxn_ = nullptr, *dattn_ = nullptr,
        *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *dh_ = nullptr, *dgate_ = nullptr, *dup_ = nullptr,
        *rstd_tmp_ = nullptr, *lm_scratch_ = nullptr, *dup2_ = nullptr;
  // Stored SwiGLU inputs, L T I floats each (gate_, up_ point into it),
  // sized for mlp_cap_ tokens; only forwards that keep them grow it.
  int mlp_cap_ = 0;
  kernels::DeviceArray<float> mlp_;
  // Low-rank scratch: lr_p_ [C, r], lr_a_ [T, r], lr_b_ [I, r].
  int lr_cap_ = 0, lr_rank_ = 0;
  kernels::DeviceArray<float> low_rank_ws_;
  float *lr_p_ = nullptr, *lr_a_ = nullptr, *lr_b_ = nullptr;
  std::vector<float> lr_host_;
  // Scratch with q/k norms: q and k before the norm (the backward
  // recomputes them from the layer input) and their gradients.
  float *qraw_ = nullptr, *kraw_ = nullptr, *dqraw_ = nullptr, *dkraw_ = nullptr;
  bool qk_norm_ = false;

  // Sequence parallelism: the attention, the current batch's slice and its
  // local cu_seqlens on the host, and the first error of the attention
  // calls (forward, recomputation, backward).
  class SpHook : public AttentionHook {
   public:
    explicit SpHook(Model* m) : m_(m) {}
    void Attend(int layer, const float* q, const float* k, const float* v, float* out, float* lse) override;

   private:
    Model* m_;
  };
  SequenceAttention* sp_ = nullptr;
  bool sliced_ = false;  // the current batch is a slice
  SequenceSlice slice_;
  std::vector<int32_t> local_cu_;
  absl::Status sp_status_;
  mutable SpHook sp_hook_{this};
};

// Masked mean negative log-likelihood: loss = -sum(mask*logp)/sum(mask);
// writes dlogp[t] = -mask[t]/sum(mask) (0 everywhere when the mask is 0).
float SftLoss(std::span<const float> logp, std::span<const float> mask, float* dlogp);

}  // namespace tandem::model
