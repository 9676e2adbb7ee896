// GradAccumulator: how a training phase accumulates one optimizer step's
// gradient over its passes (micro-batches), per train.accumulation.
//   micro_batch  every pass runs forward and backward on ctx.model at once.
//   layer_major  pass i runs its forward on its own model (ctx.model, then
//                ctx.micro_models, made on first use and kept for the job),
//                so every pass's activations stay alive; Finish() runs the
//                backward of all passes layer by layer
//                (worker/model/layer_major.h), each unit's gradient reduced
//                once per step.
// Use: ZeroGrads; per pass NextModel() -> ForwardLogprobs -> Backward(dlogp);
// Finish(); Step. Job thread only.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/model.h"

namespace tandem::worker {

struct JobContext;

// train.accumulation == "layer_major".
bool LayerMajorAccumulation(const JobContext& ctx);

class GradAccumulator {
 public:
  explicit GradAccumulator(JobContext& ctx);
  GradAccumulator(const GradAccumulator&) = delete;
  GradAccumulator& operator=(const GradAccumulator&) = delete;

  // The model the next pass's forward runs on.
  model::Model& NextModel();
  // The gradient of the pass just forwarded on NextModel(): applied now
  // (micro_batch) or copied and kept for Finish (layer_major).
  absl::Status Backward(std::span<const float> dlogp, const model::BackwardOptions& options = {});
  // Layer-major: the backward of every kept pass; no-op otherwise.
  absl::Status Finish();

 private:
  JobContext& ctx_;
  bool layer_major_;
  std::vector<model::Model*> models_;
  std::vector<std::vector<float>> dlogp_;
  std::vector<model::BackwardOptions> options_;
};

}  // namespace tandem::worker
