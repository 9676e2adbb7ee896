// ZeroOptimizer with frozen parameters: the compact trainable tables, the
// check of ZeroOptions.trainable, and Step's norm and AdamW over the
// compact gradients (see "Frozen parameters" in zero_optimizer.h).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/zero/zero_internal.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {

absl::Status CheckTrainable(const ZeroOptions& options) {
  if (options.trainable.empty()) return absl::OkStatus();
  if (options.trainable.size() != options.units.size()) {
    return absl::InvalidArgumentError(absl::StrCat("zero: trainable table has ", options.trainable.size(),
                                                   " units, the model has ", options.units.size()));
  }
  size_t total = 0;
  for (size_t u = 0; u < options.units.size(); ++u) {
    size_t end = 0;
    for (const Unit& r : options.trainable[u]) {
      if (r.offset < end || r.size == 0 || r.offset > options.units[u].size ||
          r.size > options.units[u].size - r.offset) {
        return absl::InvalidArgumentError(absl::StrCat("zero: trainable range [", r.offset, ", +", r.size, ") of unit ",
                                                       u, " (size ", options.units[u].size,
                                                       ") is empty, out of order, overlapping or outside the unit"));
      }
      end = r.offset + r.size;
      total += r.size;
    }
  }
  if (total == 0) return absl::InvalidArgumentError("zero: no trainable parameters");
  size_t psi = 0;
  for (const Unit& u : options.units) psi += u.size;
  if (total < psi && options.grad_compression == GradCompression::kInt4) {
    return absl::InvalidArgumentError("zero: frozen parameters are not supported with int4 gradient compression");
  }
  if (total < psi && options.hierarchical_partition) {
    return absl::InvalidArgumentError("zero: frozen parameters are not supported with the hierarchical partition");
  }
  if (total < psi && options.reduce_on_release) {
    return absl::InvalidArgumentError(
        "zero: frozen parameters are not supported with layer-major accumulation (reduce_on_release)");
  }
  return absl::OkStatus();
}

void ZeroOptimizer::BuildTrainable() {
  const std::vector<Unit>& units = options_.units;
  frozen_ = false;
  if (options_.trainable.empty()) return;
  size_t total = 0;
  for (const auto& ranges : options_.trainable) {
    for (const Unit& r : ranges) total += r.size;
  }
  if (total == psi_) return;  // everything trainable: the plain path
  frozen_ = true;
  const size_t n_units = units.size();
  all_ranges_.assign(n_units, {});
  my_ranges_.assign(n_units, {});
  t_unit_offset_.assign(n_units, 0);
  t_counts_.assign(n_units, std::vector<size_t>(world_, 0));
  size_t global = 0, shard = 0;
  for (size_t u = 0; u < n_units; ++u) {
    t_unit_offset_[u] = global;
    // Every rank's piece of this unit, for the per-rank trainable counts.
    for (int r = 0; r < world_; ++r) {
      const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
      size_t begin = 0;
      for (int q = 0; q < r; ++q) begin += counts[q];
      const size_t end = begin + counts[r];
      for (const Unit& t : options_.trainable[u]) {
        const size_t a = std::max(begin, t.offset), b = std::min(end, t.offset + t.size);
        if (a < b) t_counts_[u][r] += b - a;
      }
    }
    const ShardPiece& piece = shard_map_[u];
    const size_t p_begin = piece.unit_offset, p_end = piece.unit_offset + piece.size;
    for (const Unit& t : options_.trainable[u]) {
      all_ranges_[u].push_back(TrainRange{static_cast<int>(u), t.offset, t.size, global, 0, 0});
      const size_t a = std::max(p_begin, t.offset), b = std::min(p_end, t.offset + t.size);
      if (a < b) {
        my_ranges_[u].push_back(TrainRange{static_cast<int>(u), a, b - a, global + (a - t.offset), shard,
                                           piece.shard_offset + (a - p_begin)});
        shard += b - a;
      }
      global += t.size;
    }
  }
  t_psi_ = global;
  t_shard_size_ = shard;
}

absl::Status ZeroOptimizer::FrozenStepUpdate(float lr, float max_grad_norm, StepResult* result) {
  kernels::Ops* ops = options_.ops;
  const int stage = options_.stage;
  const AdamWConfig& a = options_.adamw;
  // Stages 0-1: grads_full_ holds all T summed gradients; stages 2-3:
  // grad_shard_ holds this rank's.
  double sum_sq = 0;
  if (stage == 0) {
    sum_sq = ops->sum_squares(grads_full_.data(), t_psi_);
  } else {
    if (stage == 1) {
      for (const auto& ranges : my_ranges_) {
        for (const TrainRange& r : ranges) sum_sq += ops->sum_squares(grads_full_.data() + r.global, r.size);
      }
    } else {
      sum_sq = ops->sum_squares(grad_shard_.data(), t_shard_size_);
    }
    if (world_ > 1) RETURN_IF_ERROR(AllreduceNormSquared(&sum_sq));
  }
  result->grad_norm = std::sqrt(std::max(sum_sq, 0.0));
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (result->grad_norm + 1e-6);
    if (coef < 1.0) result->clip_scale = coef;
  }
  const float scale = static_cast<float>(result->clip_scale);
  ++step_;
  const auto& ranges_by_unit = stage == 0 ? all_ranges_ : my_ranges_;
  for (const auto& ranges : ranges_by_unit) {
    for (const TrainRange& r : ranges) {
      float* g = stage <= 1 ? grads_full_.data() + r.global : grad_shard_.data() + r.shard;
      if (scale != 1.f) ops->scale(g, scale, r.size);
      const size_t o = TrainOpt(r);
      ops->adamw_step(MasterAt(r), g, m_.data() + o, v_.data() + o, r.size, lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                      step_);
    }
  }
  if (stage == 1 || stage == 2) {
    // fp32: allgather the updated pieces; bf16: allgather their bf16 copy.
    step_incomplete_ = true;
    RETURN_IF_ERROR(bf16() ? RefreshComputeFull() : AllgatherParams());
    step_incomplete_ = false;
  } else if (stage == 3) {
    if (bf16()) RefreshComputeShard();
  } else if (bf16()) {
    RETURN_IF_ERROR(RefreshComputeFull());
  }
  return MemoryStatus();
}

}  // namespace tandem::zero
