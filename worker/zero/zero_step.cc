// ZeroOptimizer::Step: gradient reduction (stages 0-1), global norm,
// clipping, AdamW, parameter re-gather.
#include "worker/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/zero/zero_internal.h"

namespace tandem::zero {

// ---- step ----------------------------------------------------------------------

absl::Status ZeroOptimizer::AllreduceNormSquared(double* sum_sq) {
  // A double as two floats (hi + lo) so the sum keeps ~double precision;
  // they travel through a 2-float device buffer.
  const float hi = static_cast<float>(*sum_sq);
  float pair[2] = {hi, static_cast<float>(*sum_sq - hi)};
  norm_buf_.Upload(pair, 2);
  float* dev = norm_buf_.data();
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  absl::Status s = worker_->Run([&] { return comm->allreduce(dev, 2, comm::ReduceOp::kSum, timeout); });
  if (!s.ok()) return s;
  norm_buf_.Download(pair, 2);
  if (absl::Status m = MemoryStatus(); !m.ok()) return m;
  *sum_sq = static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::AllgatherParams() {
  if (options_.stage == 3) {
    // hpZ: the secondary copy follows the loaded shards.
    if (!hpz()) return absl::OkStatus();
    if (absl::Status s = Drain(); !s.ok()) return s;
    return RefreshSecondary();
  }
  if (bf16()) {
    if (absl::Status s = Drain(); !s.ok()) return s;
    // Stage 0: rebuild the full masters first, then the compute copy.
    if (options_.stage == 0 && world_ > 1) {
      comm::Collective* comm = options_.comm;
      const comm::Timeout timeout = options_.timeout;
      for (size_t u = 0; u < options_.units.size(); ++u) {
        float* full = params_full_.data() + options_.units[u].offset;
        const float* mine = full + shard_map_[u].unit_offset;
        const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
        absl::Status s = worker_->Run([&] { return comm->allgather(mine, full, counts, timeout); });
        if (!s.ok()) return s;
      }
    }
    return RefreshComputeFull();
  }
  if (world_ == 1) return MemoryStatus();
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (size_t u = 0; u < options_.units.size(); ++u) {
    const Unit& unit = options_.units[u];
    float* full = params_full_.data() + unit.offset;
    const float* mine = full + shard_map_[u].unit_offset;
    const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
    absl::Status s = worker_->Run([&] { return comm->allgather(mine, full, counts, timeout); });
    if (!s.ok()) return s;
  }
  return MemoryStatus();
}

absl::Status ZeroOptimizer::AllgatherOptimizerState() {
  if (options_.stage != 0 || world_ == 1) return absl::OkStatus();
  if (absl::Status s = Drain(); !s.ok()) return s;
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  if (offloaded_) {
    return absl::FailedPreconditionError("zero: AllgatherOptimizerState while the optimizer state is offloaded");
  }
  for (kernels::DeviceArray<float>* state : {&m_, &v_}) {
    if (frozen_) {
      // The compact moments: each rank's trainable elements of a unit are
      // contiguous there, in rank order.
      for (size_t u = 0; u < options_.units.size(); ++u) {
        const std::vector<size_t>& counts = t_counts_[u];
        if (all_ranges_[u].empty()) continue;
        size_t mine = 0;
        for (int r = 0; r < rank_; ++r) mine += counts[r];
        float* full = state->data() + t_unit_offset_[u];
        absl::Status s = worker_->Run([&] { return comm->allgather(full + mine, full, counts, timeout); });
        if (!s.ok()) return s;
      }
      continue;
    }
    for (size_t u = 0; u < options_.units.size(); ++u) {
      float* full = state->data() + options_.units[u].offset;
      const float* mine = full + shard_map_[u].unit_offset;
      const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
      absl::Status s = worker_->Run([&] { return comm->allgather(mine, full, counts, timeout); });
      if (!s.ok()) return s;
    }
  }
  return MemoryStatus();
}

absl::StatusOr<StepResult> ZeroOptimizer::Step(float lr, float max_grad_norm) {
  if (!status_.ok()) return status_;
  if (offloaded_) {
    return absl::FailedPreconditionError(
        "zero: Step while the optimizer state is offloaded "
        "(call RestoreOptimizerState first)");
  }
  if (absl::Status s = Drain(); !s.ok()) {
    Fail(s);
    return s;
  }
  kernels::Ops* ops = options_.ops;
  const int stage = options_.stage;
  const AdamWConfig& a = options_.adamw;

  if (stage <= 1 && world_ > 1) {
    absl::Status s = unit_reduce() ? ReduceRemainingUnits() : ReduceFullGrads();
    if (!s.ok()) {
      Fail(s);
      return s;
    }
  }
  if (frozen_) {
    StepResult result;
    if (absl::Status s = FrozenStepUpdate(lr, max_grad_norm, &result); !s.ok()) {
      Fail(s);
      return s;
    }
    return result;
  }
  double sum_sq = 0;
  if (stage == 0) {
    sum_sq = ops->sum_squares(grads_full_.data(), psi_);
  } else {
    if (stage == 1) {
      for (const auto& p : shard_map_) {
        sum_sq += ops->sum_squares(grads_full_.data() + options_.units[p.unit].offset + p.unit_offset, p.size);
      }
    } else {
      sum_sq = ops->sum_squares(grad_shard_.data(), shard_size_);
    }
    if (world_ > 1) {
      absl::Status s = AllreduceNormSquared(&sum_sq);
      if (!s.ok()) {
        Fail(s);
        return s;
      }
    }
  }
  StepResult result;
  result.grad_norm = std::sqrt(std::max(sum_sq, 0.0));
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (result.grad_norm + 1e-6);
    if (coef < 1.0) result.clip_scale = coef;
  }
  const float scale = static_cast<float>(result.clip_scale);
  ++step_;
  if (zenflow_) {
    // The split update (zenflow.h) over the clipped owned gradient.
    if (stage == 0) {
      if (scale != 1.f) ops->scale(grads_full_.data(), scale, psi_);
    } else {
      for (const auto& p : shard_map_) {
        if (p.size == 0 || scale == 1.f) continue;
        ops->scale(stage == 1 ? grads_full_.data() + options_.units[p.unit].offset + p.unit_offset
                              : grad_shard_.data() + p.shard_offset,
                   scale, p.size);
      }
    }
    if (absl::Status s = zenflow_->Step(ZenFlowView(), lr, step_); !s.ok()) {
      Fail(s);
      return s;
    }
    if (stage > 0) {
      step_incomplete_ = true;
      if (absl::Status s = AllgatherParams(); !s.ok()) {
        Fail(s);
        return s;
      }
      step_incomplete_ = false;
    }
  } else if (stage == 0) {
    if (scale != 1.f) ops->scale(grads_full_.data(), scale, psi_);
    ops->adamw_step(params_full_.data(), grads_full_.data(), m_.data(), v_.data(), psi_, lr, a.beta1, a.beta2, a.eps,
                    a.weight_decay, step_);
  } else if (stage == 1 || stage == 2) {
    for (const auto& p : shard_map_) {
      if (p.size == 0) continue;
      const size_t full_off = options_.units[p.unit].offset + p.unit_offset;
      float* g = stage == 1 ? grads_full_.data() + full_off : grad_shard_.data() + p.shard_offset;
      if (scale != 1.f) ops->scale(g, scale, p.size);
      ops->adamw_step(MasterPiece(p), g, m_.data() + p.shard_offset, v_.data() + p.shard_offset, p.size, lr, a.beta1,
                      a.beta2, a.eps, a.weight_decay, step_);
    }
    // fp32: allgather the updated pieces; bf16: allgather their bf16 copy.
    step_incomplete_ = true;
    if (absl::Status s = bf16() ? RefreshComputeFull() : AllgatherParams(); !s.ok()) {
      Fail(s);
      return s;
    }
    step_incomplete_ = false;
  } else {
    if (scale != 1.f) ops->scale(grad_shard_.data(), scale, shard_size_);
    ops->adamw_step(param_shard_.data(), grad_shard_.data(), m_.data(), v_.data(), shard_size_, lr, a.beta1, a.beta2,
                    a.eps, a.weight_decay, step_);
    if (bf16()) RefreshComputeShard();
    if (absl::Status s = RefreshSecondary(); !s.ok()) {
      Fail(s);
      return s;
    }
  }
  if (bf16() && stage == 0) {
    if (absl::Status s = RefreshComputeFull(); !s.ok()) {
      Fail(s);
      return s;
    }
  }
  if (absl::Status s = MemoryStatus(); !s.ok()) {
    Fail(s);
    return s;
  }
  return result;
}

}  // namespace tandem::zero
