// ZeroOptimizer: checkpoint access (shards of params and moments), full
// state copies, optimizer offload.
#include "worker/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/zero/zero_internal.h"

namespace tandem::zero {

// ---- checkpoint access ---------------------------------------------------------

void ZeroOptimizer::CopyParamShard(float* out) const {
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    mem_->CopyToHost(out + p.shard_offset, MasterPiece(p), p.size * sizeof(float));
  }
}

void ZeroOptimizer::LoadParamShard(const float* in) {
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    mem_->CopyToDevice(MasterPiece(p), in + p.shard_offset, p.size * sizeof(float));
  }
  // Stage 3 refreshes its compute shard here; stages 0-2 in
  // AllgatherParams(), which every rank calls next.
  if (bf16() && options_.stage == 3) RefreshComputeShard();
}

void ZeroOptimizer::CopyOptimizerShard(float* m_out, float* v_out) const {
  if (frozen_) {
    // Frozen elements have no moments: they read as 0.
    std::fill_n(m_out, shard_size_, 0.f);
    std::fill_n(v_out, shard_size_, 0.f);
    for (const auto& ranges : my_ranges_) {
      for (const TrainRange& r : ranges) {
        const size_t src = TrainOpt(r);
        if (offloaded_) {
          std::copy_n(m_host_.begin() + src, r.size, m_out + r.shard_offset);
          std::copy_n(v_host_.begin() + src, r.size, v_out + r.shard_offset);
        } else {
          m_.Download(m_out + r.shard_offset, r.size, src);
          v_.Download(v_out + r.shard_offset, r.size, src);
        }
      }
    }
    return;
  }
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    const size_t src = OptOffset(p);
    if (offloaded_) {
      std::copy_n(m_host_.begin() + src, p.size, m_out + p.shard_offset);
      std::copy_n(v_host_.begin() + src, p.size, v_out + p.shard_offset);
    } else {
      m_.Download(m_out + p.shard_offset, p.size, src);
      v_.Download(v_out + p.shard_offset, p.size, src);
    }
  }
}

void ZeroOptimizer::LoadOptimizerShard(const float* m_in, const float* v_in) {
  // New moments invalidate ZenFlow's host state (LoadZenFlowState restores
  // it from a checkpoint).
  if (zenflow_) zenflow_->Reset();
  // Stage 0 keeps full moments: each rank loads its pieces; the others stay
  // as they were (callers load every rank's shard, see docs/parallelism.md).
  if (frozen_) {
    for (const auto& ranges : my_ranges_) {
      for (const TrainRange& r : ranges) {
        const size_t dst = TrainOpt(r);
        if (offloaded_) {
          std::copy_n(m_in + r.shard_offset, r.size, m_host_.begin() + dst);
          std::copy_n(v_in + r.shard_offset, r.size, v_host_.begin() + dst);
        } else {
          m_.Upload(m_in + r.shard_offset, r.size, dst);
          v_.Upload(v_in + r.shard_offset, r.size, dst);
        }
      }
    }
    return;
  }
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    const size_t dst = OptOffset(p);
    if (offloaded_) {
      std::copy_n(m_in + p.shard_offset, p.size, m_host_.begin() + dst);
      std::copy_n(v_in + p.shard_offset, p.size, v_host_.begin() + dst);
    } else {
      m_.Upload(m_in + p.shard_offset, p.size, dst);
      v_.Upload(v_in + p.shard_offset, p.size, dst);
    }
  }
}

absl::Status ZeroOptimizer::CopyFullState(float* params, float* m, float* v) const {
  if (options_.stage != 0) {
    return absl::FailedPreconditionError("the full state is only held at ZeRO stage 0");
  }
  params_full_.Download(params, psi_);
  if (frozen_) {
    // Moments by parameter; frozen elements have none (0).
    std::fill_n(m, psi_, 0.f);
    std::fill_n(v, psi_, 0.f);
    for (const auto& ranges : all_ranges_) {
      for (const TrainRange& r : ranges) {
        const size_t dst = options_.units[r.unit].offset + r.unit_offset;
        if (offloaded_) {
          std::copy_n(m_host_.begin() + r.global, r.size, m + dst);
          std::copy_n(v_host_.begin() + r.global, r.size, v + dst);
        } else {
          m_.Download(m + dst, r.size, r.global);
          v_.Download(v + dst, r.size, r.global);
        }
      }
    }
    return MemoryStatus();
  }
  if (offloaded_) {
    std::copy(m_host_.begin(), m_host_.end(), m);
    std::copy(v_host_.begin(), v_host_.end(), v);
  } else {
    m_.Download(m, psi_);
    v_.Download(v, psi_);
  }
  return MemoryStatus();
}

absl::Status ZeroOptimizer::CopyResidentParams(float* params) const {
  if (master_sharded()) {
    return absl::FailedPreconditionError("the fp32 parameters are sharded (ZeRO stage 3, or bf16 at stages 1-3)");
  }
  params_full_.Download(params, psi_);
  return MemoryStatus();
}

absl::Status ZeroOptimizer::OffloadOptimizerState() {
  if (offloaded_) return absl::OkStatus();
  if (absl::Status s = Drain(); !s.ok()) return s;
  m_host_.resize(m_.size());
  v_host_.resize(v_.size());
  m_.Download(m_host_.data(), m_.size());
  v_.Download(v_host_.data(), v_.size());
  if (absl::Status s = MemoryStatus(); !s.ok()) {
    m_host_ = std::vector<float>();
    v_host_ = std::vector<float>();
    return s;
  }
  m_.reset();
  v_.reset();
  offloaded_ = true;
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::RestoreOptimizerState() {
  if (!offloaded_) return absl::OkStatus();
  const size_t n = opt_size();
  if (!m_.Allocate(mem_, n) || !v_.Allocate(mem_, n)) {
    m_.reset();
    v_.reset();
    return AllocError("the optimizer moments", 2 * n * sizeof(float));
  }
  m_.Upload(m_host_.data(), n);
  v_.Upload(v_host_.data(), n);
  if (absl::Status s = MemoryStatus(); !s.ok()) return s;
  m_host_ = std::vector<float>();
  v_host_ = std::vector<float>();
  offloaded_ = false;
  return absl::OkStatus();
}

}  // namespace tandem::zero
