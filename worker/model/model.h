// Model: the Llama 3 / Qwen2 style decoder (embedding, N x [RMSNorm ->
// attention (q/k/v/o, RoPE, GQA, optional per-layer sliding window, optional
// q/k/v biases) -> residual -> RMSNorm -> SwiGLU MLP -> residual], final
// RMSNorm, tied or untied LM head) over packed batches, forward and backward.
//
// Parameters come from a ParamProvider (param_provider.h) unit by unit, in
// the flat layout of ParamLayout; the model never owns them. Activations
// needed by Backward live in a workspace owned by the model, sized for
// `max_tokens` and grown (never shrunk) only when a larger batch arrives.
// All buffers are host memory: use a CPU backend (MakeCpuOps or
// MakeReferenceOps). One Model is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_provider.h"

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
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  // Appends one sequence: inputs seq[0..n-2], targets seq[1..n-1].
  void AddSequence(std::span<const int32_t> seq);
};

// Options of Model::Backward.
struct BackwardOptions {
  // MeCeFO's cheap mode: every layer's attention sub-block (input RMSNorm,
  // q/k/v and their biases, RoPE, attention, o-proj) is skipped in the
  // backward pass: the residual gradient passes through it unchanged and its
  // parameters get no gradient from this batch. The MLP sub-blocks, the
  // final norm, the LM head and the embedding are differentiated as usual
  // (through that approximate residual gradient).
  bool skip_attention = false;
};

class Model {
 public:
  Model(const ModelConfig& config, kernels::Ops* ops, int max_tokens = 0);

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }

  // Writes logp[t] = log p(targets[t] | tokens[..t]) (and the entropy of the
  // predictive distribution when entropy != nullptr) and keeps what
  // Backward needs. InvalidArgument on a malformed batch.
  absl::Status ForwardLogprobs(const Batch& batch, ParamProvider& params,
                               float* logp, float* entropy = nullptr);
  // Gradient of the last ForwardLogprobs: dlogp[T] = dLoss/dlogp. ADDS
  // parameter gradients through AcquireGrads/ReleaseGrads (units L+1..0;
  // the same calls with skip_attention, so ZeRO's collectives match).
  absl::Status Backward(const float* dlogp, ParamProvider& params,
                        const BackwardOptions& options = {});
  // Full logits [T, V] (materialised: for tests and evaluation of short
  // batches). Leaves no state for Backward.
  absl::Status ForwardLogits(const Batch& batch, ParamProvider& params,
                             float* logits);

  // HF-style initialisation into params[layout().total_floats()]:
  // N(0, 0.02) for matrices, ones for norms, zeros for biases and padding.
  // Deterministic in seed (mt19937_64 + Box-Muller).
  void InitParams(uint64_t seed, float* params) const;

  size_t workspace_bytes() const { return ws_.capacity() * sizeof(float); }
  int capacity_tokens() const { return cap_; }

 private:
  absl::Status CheckBatch(const Batch& b) const;
  void EnsureCapacity(int t);
  void EnsureRope(int max_position);
  void ForwardHidden(ParamProvider& params);  // through the final norm
  kernels::AttentionParams Attn(int layer) const;

  ModelConfig config_;
  ParamLayout layout_;
  kernels::Ops* ops_;
  int C_, H_, Hkv_, D_, I_, V_, L_, HD_, KD_;
  int lm_chunk_;

  // Copy of the current batch.
  int T_ = 0;
  int nseq_ = 0;
  std::vector<int32_t> tokens_, targets_, positions_, cu_;
  bool have_forward_ = false;

  // Rotary tables.
  std::vector<float> cos_, sin_;
  int rope_rows_ = 0;
  int rope_seq_key_ = -1;

  // Workspace (one allocation) and views into it, sized for cap_ tokens.
  int cap_ = 0;
  std::vector<float> ws_;
  float *x_ = nullptr, *xmid_ = nullptr, *q_ = nullptr, *k_ = nullptr,
        *v_ = nullptr, *attn_ = nullptr, *lse_ = nullptr, *gate_ = nullptr,
        *up_ = nullptr, *rstd1_ = nullptr, *rstd2_ = nullptr,
        *rstdf_ = nullptr, *xnf_ = nullptr;
  // Scratch (also used by backward).
  float *xn_ = nullptr, *hact_ = nullptr, *dres_ = nullptr, *dtmp_ = nullptr,
        *dxn_ = nullptr, *dattn_ = nullptr, *dq_ = nullptr, *dk_ = nullptr,
        *dv_ = nullptr, *dh_ = nullptr, *dgate_ = nullptr, *dup_ = nullptr,
        *rstd_tmp_ = nullptr, *lm_scratch_ = nullptr;
};

// Masked mean negative log-likelihood: loss = -sum(mask*logp)/sum(mask);
// writes dlogp[t] = -mask[t]/sum(mask) (0 everywhere when the mask is 0).
float SftLoss(std::span<const float> logp, std::span<const float> mask,
              float* dlogp);

}  // namespace tandem::model
