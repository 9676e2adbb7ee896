// Activation checkpointing: which per-layer activations a training forward
// keeps for the backward, and which the backward recomputes (the job key
// train.activation_checkpointing). The recomputation makes the forward's
// very kernel calls on the same inputs, so log-probs and gradients are
// bit-identical in every mode; only memory and time change.
//
//   none       every layer keeps its input x, the attention residual xmid,
//              q, k, v (after biases, q/k norms and RoPE), the attention
//              output and its log-sum-exp, the RMSNorm reciprocal stds (and,
//              with q/k norms, theirs) and the SwiGLU inputs gate and up.
//   selective  every layer keeps x, xmid, both RMSNorm reciprocal stds and
//              the SwiGLU inputs gate and up (the MLP's inputs cost two of a
//              layer's three large matmuls to recompute); the attention
//              internals (q, k, v, the attention output, its log-sum-exp,
//              the q/k norms' stds) live in one layer's scratch and the
//              backward recomputes them from x (input norm, q/k/v
//              projections, RoPE, attention: no o-projection, no MLP).
//   layer      every layer keeps only its input x (the residual stream,
//              hidden_size floats per token); the backward recomputes the
//              layer's attention sub-block into one layer's scratch and its
//              SwiGLU inputs from xmid, then differentiates it.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::model {

enum class ActivationCheckpointing { kNone, kSelective, kLayer };

// "none" | "selective" | "layer" ("" = none); InvalidArgument naming the
// value and the choices otherwise.
absl::StatusOr<ActivationCheckpointing> ParseActivationCheckpointing(std::string_view name);
const char* ActivationCheckpointingName(ActivationCheckpointing mode);

}  // namespace tandem::model
