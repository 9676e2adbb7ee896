// ZeroOptimizer: gradient buffers and their reduction (stages 2-3
// reduce-scatter per unit on the communication thread).
#include "worker/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/zero/zero_internal.h"

namespace tandem::zero {

// ---- gradients ---------------------------------------------------------------

float* ZeroOptimizer::AcquireGrads(int unit) {
  const Unit& u = options_.units[unit];
  if (options_.stage < 2) return grads_full_.data() + u.offset;
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
  if (options_.stage < 2) return;
  auto it = grads_open_.find(unit);
  if (it == grads_open_.end()) return;
  std::shared_ptr<GradBuf> buf = it->second;
  if (--buf->refs > 0) return;
  grads_open_.erase(it);
  buf->open = false;
  const ShardPiece piece = MyPiece(unit);
  const std::vector<size_t> counts = UnitCounts(unit);
  const float* in = buf->mem.data();
  float* piece_out = rs_piece_.data();
  float* acc = grad_shard_.data() + piece.shard_offset;
  comm::Collective* comm = options_.comm;
  kernels::Ops* ops = comm_ops();
  const comm::Timeout timeout = options_.timeout;
  const bool int4 = int4_grads();
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
