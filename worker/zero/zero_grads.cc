// ZeroOptimizer: gradient buffers and their reduction (stages 2-3
// reduce-scatter per unit on the communication thread).
#include "worker/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status_macros.h"
#include "worker/zero/zero_internal.h"

namespace tandem::zero {

// ---- gradients ---------------------------------------------------------------

float* ZeroOptimizer::AcquireGrads(int unit) {
  const Unit& u = options_.units[unit];
  if (options_.stage < 2 && !frozen_) {
    if (unit_reduce()) {
      TANDEM_CHECK(!unit_reduced_[unit]);  // released (and reduced) once per step
      ++full_grad_refs_[unit];
    }
    return grads_full_.data() + u.offset;
  }
  auto it = grads_open_.find(unit);
  if (it != grads_open_.end()) {
    ++it->second->refs;
    return it->second->mem.data();
  }
  // The pool grows to kMaxGradBuffers before any buffer is reused, so its
  // size (memory()) does not depend on how fast reduce-scatters finish.
  // Then: a buffer that is not open and whose reduce-scatter finished, else
  // wait for one in flight.
  std::shared_ptr<GradBuf> buf;
  if (grad_bufs_.size() < kMaxGradBuffers) {
    auto fresh = std::make_shared<GradBuf>();
    if (fresh->mem.Allocate(mem_, std::max<size_t>(max_unit_, 1))) {
      buf = fresh;
      grad_bufs_.push_back(buf);
    }
    // Out of memory: reuse one below, if there is one.
  }
  for (auto& b : grad_bufs_) {
    if (buf) break;
    if (!b->open && (!b->task || worker_->Done(b->task))) buf = b;
  }
  if (!buf) {
    for (auto& b : grad_bufs_) {
      if (!b->open) {
        Fail(worker_->Wait(b->task));
        buf = b;
        break;
      }
    }
  }
  if (!buf) {
    Fail(AllocError("a unit gradient buffer", std::max<size_t>(max_unit_, 1) * sizeof(float)));
    return nullptr;
  }
  buf->task.reset();
  buf->open = true;
  buf->refs = 1;
  mem_->SetZero(buf->mem.data(), u.size * sizeof(float));
  grads_open_[unit] = buf;
  return buf->mem.data();
}

void ZeroOptimizer::ReleaseGrads(int unit) {
  if (options_.stage < 2 && !frozen_) {
    if (!unit_reduce() || full_grad_refs_[unit] == 0 || --full_grad_refs_[unit] > 0) return;
    // The unit's gradient is complete for this step: allreduce it now.
    unit_reduced_[unit] = 1;
    const Unit& u = options_.units[unit];
    float* g = grads_full_.data() + u.offset;
    comm::Collective* comm = options_.comm;
    const comm::Timeout timeout = options_.timeout;
    worker_->Submit([=]() { return comm->allreduce(g, u.size, comm::ReduceOp::kSum, timeout); });
    return;
  }
  auto it = grads_open_.find(unit);
  if (it == grads_open_.end()) return;
  std::shared_ptr<GradBuf> buf = it->second;
  if (--buf->refs > 0) return;
  grads_open_.erase(it);
  buf->open = false;
  if (frozen_ && options_.stage < 2) {
    // Frozen parameters, stages 0-1: add the trainable ranges into the
    // compact gradients (reduced in Step).
    for (const TrainRange& r : all_ranges_[unit]) {
      options_.ops->add_inplace(grads_full_.data() + r.global, buf->mem.data() + r.unit_offset, r.size);
    }
    return;
  }
  // Frozen parameters: a unit without trainable elements is not reduced.
  if (frozen_ && all_ranges_[unit].empty()) return;
  const ShardPiece piece = MyPiece(unit);
  const std::vector<size_t> counts = UnitCounts(unit);
  const float* in = buf->mem.data();
  float* piece_out = rs_piece_.data();
  comm::Collective* comm = options_.comm;
  kernels::Ops* ops = comm_ops();
  const comm::Timeout timeout = options_.timeout;
  const bool int4 = int4_grads();
  if (frozen_) {
    // Only this rank's trainable ranges of the piece are accumulated.
    const std::vector<TrainRange>* mine = &my_ranges_[unit];
    float* shard = grad_shard_.data();
    buf->task = worker_->Submit([=]() -> absl::Status {
      RETURN_IF_ERROR(comm->reduce_scatter(in, piece_out, counts, timeout));
      for (const TrainRange& r : *mine) {
        ops->add_inplace(shard + r.shard, piece_out + (r.unit_offset - piece.unit_offset), r.size);
      }
      return absl::OkStatus();
    });
    return;
  }
  float* acc = grad_shard_.data() + piece.shard_offset;
  const bool hierarchical = hpz();
  buf->task = worker_->Submit([=, this]() -> absl::Status {
    absl::Status s = hierarchical ? HierarchicalReduceScatter(unit, in, piece_out)
                     : int4       ? Int4ReduceScatter(unit, in, piece_out)
                                  : comm->reduce_scatter(in, piece_out, counts, timeout);
    if (!s.ok()) return s;
    if (piece.size > 0) ops->add_inplace(acc, piece_out, piece.size);
    return absl::OkStatus();
  });
}

void ZeroOptimizer::ZeroGrads() {
  Fail(Drain());
  grads_full_.Zero();
  grad_shard_.Zero();
  std::fill(full_grad_refs_.begin(), full_grad_refs_.end(), 0);
  std::fill(unit_reduced_.begin(), unit_reduced_.end(), 0);
}

absl::Status ZeroOptimizer::ReduceRemainingUnits() {
  std::fill(full_grad_refs_.begin(), full_grad_refs_.end(), 0);
  const bool none = std::none_of(unit_reduced_.begin(), unit_reduced_.end(), [](char r) { return r != 0; });
  if (none) return ReduceFullGrads();
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (size_t i = 0; i < options_.units.size(); ++i) {
    if (unit_reduced_[i]) continue;
    float* g = grads_full_.data() + options_.units[i].offset;
    const size_t n = options_.units[i].size;
    RETURN_IF_ERROR(worker_->Run([&] { return comm->allreduce(g, n, comm::ReduceOp::kSum, timeout); }));
  }
  std::fill(unit_reduced_.begin(), unit_reduced_.end(), 0);
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::Drain() {
  absl::Status s = worker_->Drain();
  // Prefetched but never acquired units are dropped.
  for (auto it = gathered_.begin(); it != gathered_.end();) {
    if (it->second->refs == 0) {
      ReturnBuffer(it->second->buf);
      if (it->second->packed != nullptr) free_packed_.push_back(it->second->packed);
      it = gathered_.erase(it);
    } else {
      ++it;
    }
  }
  return s;
}

}  // namespace tandem::zero
