// ZeroOptimizer's ZenFlow glue: creation over the owned range, the device
// view, the host sync and the checkpoint state (see zenflow.h).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {

absl::Status ZeroOptimizer::CreateZenFlow() {
  const ZenFlowOptions& zf = options_.zenflow;
  if (zf.topk_fraction == 0) return absl::OkStatus();
  const int stage = options_.stage;
  if (stage > 2) {
    return absl::InvalidArgumentError(absl::StrCat("zenflow: runs at ZeRO stages 0-2, not ", stage));
  }
  if (bf16()) return absl::InvalidArgumentError("zenflow: needs fp32 precision");
  if (frozen_) return absl::InvalidArgumentError("zenflow: does not combine with frozen parameters");
  if (hpz()) return absl::InvalidArgumentError("zenflow: does not combine with the hierarchical partition");
  if (options_.grad_compression != GradCompression::kNone) {
    return absl::InvalidArgumentError("zenflow: does not combine with int4 gradient compression");
  }
  if (options_.reduce_on_release) {
    return absl::InvalidArgumentError("zenflow: does not combine with reduce_on_release (layer-major accumulation)");
  }
  std::vector<ZenFlowSegment> segments;
  if (stage == 0) {
    // One segment: the device calls at top-k 1 are plain AdamW's single call.
    segments.push_back({0, 0, 0, 0, psi_});
  } else {
    for (const ShardPiece& p : shard_map_) {
      if (p.size == 0) continue;
      const size_t global = options_.units[p.unit].offset + p.unit_offset;
      segments.push_back({global, p.shard_offset, global, stage == 1 ? global : p.shard_offset, p.size});
    }
  }
  ZenFlowAdamW a;
  a.beta1 = options_.adamw.beta1;
  a.beta2 = options_.adamw.beta2;
  a.eps = options_.adamw.eps;
  a.weight_decay = options_.adamw.weight_decay;
  auto z = ZenFlow::Create(zf, a, std::move(segments), opt_size());
  if (!z.ok()) return z.status();
  zenflow_ = std::move(*z);
  return absl::OkStatus();
}

ZenFlowDevice ZeroOptimizer::ZenFlowView() {
  ZenFlowDevice d;
  d.ops = options_.ops;
  d.mem = mem_;
  d.p = params_full_.data();
  d.g = options_.stage == 2 ? grad_shard_.data() : grads_full_.data();
  d.moments_on_host = offloaded_;
  d.m = offloaded_ ? m_host_.data() : m_.data();
  d.v = offloaded_ ? v_host_.data() : v_.data();
  return d;
}

absl::Status ZeroOptimizer::SyncHostUpdates() {
  if (!zenflow_) return absl::OkStatus();
  if (!status_.ok()) return status_;
  if (absl::Status s = Drain(); !s.ok()) return s;
  zenflow_->Sync(ZenFlowView());
  // Stages 1-2: every rank applied its own pieces (all ranks reach this
  // point at the same step, so all call the collective).
  if (options_.stage > 0) {
    if (absl::Status s = AllgatherParams(); !s.ok()) return s;
  }
  return MemoryStatus();
}

void ZeroOptimizer::CopyZenFlowShard(float* acc, float* important) const {
  const size_t n = opt_size();
  std::vector<float> a(n), imp(n);
  zenflow_->CopyState(a.data(), imp.data());
  for (const ShardPiece& p : shard_map_) {
    std::copy_n(a.data() + OptOffset(p), p.size, acc + p.shard_offset);
    std::copy_n(imp.data() + OptOffset(p), p.size, important + p.shard_offset);
  }
}

void ZeroOptimizer::LoadZenFlowState(const float* acc_full, const float* important_full) {
  if (!zenflow_) return;
  const size_t n = opt_size();
  std::vector<float> a(n), imp(n);
  for (const ShardPiece& p : shard_map_) {
    if (options_.stage == 0) break;
    const size_t global = options_.units[p.unit].offset + p.unit_offset;
    std::copy_n(acc_full + global, p.size, a.data() + p.shard_offset);
    std::copy_n(important_full + global, p.size, imp.data() + p.shard_offset);
  }
  if (options_.stage == 0) {
    std::copy_n(acc_full, n, a.data());
    std::copy_n(important_full, n, imp.data());
  }
  zenflow_->LoadState(ZenFlowView(), a.data(), imp.data(), step_);
}

}  // namespace tandem::zero
