// Layer-major backward (Lamy-Poirier, "Layered gradient accumulation"):
// the backward passes of M micro-batches, each forwarded by its own Model
// (so every micro-batch's activations are kept), run layer by layer from the
// last layer: LM head and final norm of every micro-batch, then layer L-1 of
// every micro-batch, ..., then every embedding. Each unit's parameters and
// gradients are held across all M micro-batches, so a ParamProvider sees
// ONE ReleaseGrads per unit per call: ZeRO-2/3 reduce-scatter each unit's
// gradient once (not M times), stage 3 gathers each unit once for the
// backward, and the reduction of layer l runs on the provider's
// communication thread while layer l-1 is differentiated.
//
// Gradients: each unit's gradient buffer receives the micro-batches'
// contributions in micro-batch order, the order Backward called M times
// uses, except the tied embedding / LM head unit (all heads first, then all
// embeddings). What the provider then does with the local sum (one
// reduction instead of M) sets the final rounding; see docs/parallelism.md.
//
// Memory: M models' workspaces (activations of M micro-batches at once).
#pragma once

#include <span>

#include "absl/status/status.h"
#include "worker/model/model.h"
#include "worker/model/param_provider.h"

namespace tandem::model {

// Runs the backward of models[m] (each after its ForwardLogprobs) with
// dlogp[m] and options[m], layer-major. All models share one config; the
// three spans have equal, non-zero length. InvalidArgument on mismatched
// inputs, FailedPrecondition when a model has no forward to differentiate
// (nothing acquired then); otherwise the device memory status.
absl::Status LayerMajorBackward(std::span<Model* const> models, std::span<const float* const> dlogp,
                                std::span<const BackwardOptions> options, ParamProvider& params);

}  // namespace tandem::model
