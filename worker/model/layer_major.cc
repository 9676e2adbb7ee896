// Layer-major backward over several micro-batches (see layer_major.h).
#include "worker/model/layer_major.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::model {

absl::Status LayerMajorBackward(std::span<Model* const> models, std::span<const float* const> dlogp,
                                std::span<const BackwardOptions> options, ParamProvider& pp) {
  if (models.empty() || dlogp.size() != models.size() || options.size() != models.size()) {
    return absl::InvalidArgumentError(absl::StrCat("layer-major backward: ", models.size(), " models, ", dlogp.size(),
                                                   " gradients and ", options.size(),
                                                   " option sets (need equal, non-zero counts)"));
  }
  const ParamLayout& layout = models[0]->layout();
  for (Model* m : models) {
    if (m->layout().total_floats() != layout.total_floats() || m->layout().num_units() != layout.num_units()) {
      return absl::InvalidArgumentError("layer-major backward: the models have different parameter layouts");
    }
  }
  for (size_t m = 0; m < models.size(); ++m) RETURN_IF_ERROR(models[m]->BackwardPrepare(dlogp[m], options[m]));

  const int fu = layout.final_unit();
  const bool tied = layout.tied();
  // Head: unit L+1 (and the tied unit 0, held until the embeddings).
  pp.AcquireParams(fu);
  pp.AcquireGrads(fu);
  if (tied) {
    pp.AcquireParams(0);
    pp.AcquireGrads(0);
  }
  for (Model* m : models) m->BackwardHead(pp);
  if (tied) pp.ReleaseParams(0);
  pp.ReleaseGrads(fu);
  pp.ReleaseParams(fu);

  const int layers = layout.num_units() - 2;
  for (int l = layers - 1; l >= 0; --l) {
    const int unit = layout.layer_unit(l);
    pp.AcquireParams(unit);
    pp.AcquireGrads(unit);
    pp.Prefetch(unit - 1);
    for (Model* m : models) m->BackwardLayer(l, pp);
    pp.ReleaseGrads(unit);  // the unit's gradient is complete: one reduction
    pp.ReleaseParams(unit);
  }

  if (!tied) pp.AcquireGrads(0);
  absl::Status status;
  for (Model* m : models) status.Update(m->BackwardEmbedding(pp));
  pp.ReleaseGrads(0);
  return status;
}

}  // namespace tandem::model
