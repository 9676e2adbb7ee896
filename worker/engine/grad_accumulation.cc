// GradAccumulator: micro-batch or layer-major gradient accumulation over a
// training step's passes (see grad_accumulation.h).
#include "worker/engine/grad_accumulation.h"

#include <utility>

#include "common/base/status_macros.h"
#include "worker/engine/job_context.h"
#include "worker/model/layer_major.h"

namespace tandem::worker {

bool LayerMajorAccumulation(const JobContext& ctx) { return ctx.spec().train().accumulation() == "layer_major"; }

GradAccumulator::GradAccumulator(JobContext& ctx) : ctx_(ctx), layer_major_(LayerMajorAccumulation(ctx)) {}

model::Model& GradAccumulator::NextModel() {
  if (!layer_major_) return *ctx_.model;
  const size_t pass = models_.size();
  if (pass == 0) return *ctx_.model;
  while (ctx_.micro_models.size() < pass) {
    ctx_.micro_models.push_back(
        std::make_unique<model::Model>(ctx_.config, ctx_.device->ops.get(), 0, ctx_.model->memory()));
    ctx_.micro_models.back()->set_activation_checkpointing(ctx_.model->activation_checkpointing());
  }
  return *ctx_.micro_models[pass - 1];
}

absl::Status GradAccumulator::Backward(std::span<const float> dlogp, const model::BackwardOptions& options) {
  if (!layer_major_) return ctx_.model->Backward(dlogp.data(), *ctx_.zero, options);
  models_.push_back(&NextModel());
  dlogp_.emplace_back(dlogp.begin(), dlogp.end());
  options_.push_back(options);
  return absl::OkStatus();
}

absl::Status GradAccumulator::Finish() {
  if (!layer_major_) return absl::OkStatus();
  if (models_.empty()) {
    // No pass on this rank: release every unit once anyway, in backward
    // order, so this rank issues the same per-unit reductions as the others.
    const model::ParamLayout& layout = ctx_.model->layout();
    for (int u = layout.num_units() - 1; u >= 0; --u) {
      ctx_.zero->AcquireGrads(u);
      ctx_.zero->ReleaseGrads(u);
    }
    return ctx_.zero->status();
  }
  std::vector<const float*> grads;
  grads.reserve(dlogp_.size());
  for (const auto& d : dlogp_) grads.push_back(d.data());
  absl::Status s = model::LayerMajorBackward(models_, grads, options_, *ctx_.zero);
  models_.clear();
  dlogp_.clear();
  options_.clear();
  return s;
}

}  // namespace tandem::worker
