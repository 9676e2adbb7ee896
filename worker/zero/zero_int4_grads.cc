// ZeroOptimizer: gradient reductions (stages 0-1 allreduce; the int4
// variants of both reductions) and the error-feedback buffers and their
// checkpoint shards.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/zero/zero_internal.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {

absl::StatusOr<GradCompression> ParseGradCompression(std::string_view name) {
  if (name.empty() || name == "none") return GradCompression::kNone;
  if (name == "int4") return GradCompression::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("zero.grad_compression \"", std::string(name), "\" (expected none or int4)"));
}

absl::Status ZeroOptimizer::AllocateInt4State() {
  if (hpz()) {
    // Int4 on the inter-node tier only: the chunk's pieces, errors by chunk.
    const size_t chunk = chunk_buf_.size();
    qx_ = std::make_unique<comm::QuantizedExchange>(chunk, nodes_);
    q_in_.assign(chunk, 0.f);
    q_out_.assign(chunk / nodes_ + 1, 0.f);
    const size_t total =
        chunk_off_.empty() ? 0 : chunk_off_.back() + ChunkCounts(static_cast<int>(chunk_off_.size()) - 1)[local_];
    if (options_.error_feedback) grad_error_.assign(total, 0.f);
    return absl::OkStatus();
  }
  const size_t unit = std::max<size_t>(max_unit_, 1);
  qx_ = std::make_unique<comm::QuantizedExchange>(unit, world_);
  q_in_.assign(unit, 0.f);
  q_out_.assign(unit / world_ + 1, 0.f);
  if (options_.error_feedback) {
    grad_error_.assign(psi_, 0.f);
    if (options_.stage <= 1) owner_error_.assign(shard_size_, 0.f);
  }
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::ReduceFullGrads() {
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  if (!int4_grads()) {
    // grads_full_ holds Psi elements, or the T trainable ones.
    float* grads = grads_full_.data();
    const size_t n = grads_full_.size();
    return worker_->Run([&] { return comm->allreduce(grads, n, comm::ReduceOp::kSum, timeout); });
  }
  // Unit by unit through the host staging buffer; each unit's pieces are
  // the shard map's, so owner_error_ is indexed like the shard.
  return worker_->Run([&]() -> absl::Status {
    const bool feedback = !grad_error_.empty();
    for (size_t u = 0; u < options_.units.size(); ++u) {
      const Unit& unit = options_.units[u];
      if (unit.size == 0) continue;
      float* dev = grads_full_.data() + unit.offset;
      mem_->CopyToHost(q_in_.data(), dev, unit.size * sizeof(float));
      RETURN_IF_ERROR(qx_->Allreduce(*comm, q_in_.data(), unit.size,
                                     feedback ? grad_error_.data() + unit.offset : nullptr,
                                     feedback ? owner_error_.data() + shard_map_[u].shard_offset : nullptr, timeout));
      mem_->CopyToDevice(dev, q_in_.data(), unit.size * sizeof(float));
    }
    return absl::OkStatus();
  });
}

absl::Status ZeroOptimizer::Int4ReduceScatter(int unit, const float* in, float* piece) {
  const Unit& u = options_.units[unit];
  const ShardPiece& mine = MyPiece(unit);
  mem_->CopyToHost(q_in_.data(), in, u.size * sizeof(float));
  RETURN_IF_ERROR(qx_->ReduceScatter(*options_.comm, q_in_.data(),
                                     grad_error_.empty() ? nullptr : grad_error_.data() + u.offset, q_out_.data(),
                                     UnitCounts(unit), options_.timeout));
  if (mine.size > 0) mem_->CopyToDevice(piece, q_out_.data(), mine.size * sizeof(float));
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::CopyGradErrorShard(float* out) {
  if (grad_error_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Drain());
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  // Host buffers: Gloo (and the guarded wrapper) take host pointers.
  return worker_->Run([&]() -> absl::Status {
    for (size_t u = 0; u < options_.units.size(); ++u) {
      const Unit& unit = options_.units[u];
      const ShardPiece& p = shard_map_[u];
      if (unit.size == 0) continue;
      if (hpz()) {
        // The chunk's owed mass lives on the ranks of this local index.
        RETURN_IF_ERROR(options_.inter->reduce_scatter(grad_error_.data() + chunk_off_[u], out + p.shard_offset,
                                                       SubCounts(static_cast<int>(u), local_), timeout));
        continue;
      }
      RETURN_IF_ERROR(comm->reduce_scatter(grad_error_.data() + unit.offset, out + p.shard_offset,
                                           UnitCounts(static_cast<int>(u)), timeout));
      if (!owner_error_.empty()) {
        for (size_t i = 0; i < p.size; ++i) out[p.shard_offset + i] += owner_error_[p.shard_offset + i];
      }
    }
    return absl::OkStatus();
  });
}

void ZeroOptimizer::LoadGradErrorShard(const float* in) {
  if (grad_error_.empty()) return;
  std::fill(grad_error_.begin(), grad_error_.end(), 0.f);
  std::fill(owner_error_.begin(), owner_error_.end(), 0.f);
  for (const auto& p : shard_map_) {
    const size_t at = hpz() ? chunk_off_[p.unit] + p.unit_offset - ChunkOffset(p.unit, local_)
                            : options_.units[p.unit].offset + p.unit_offset;
    std::copy_n(in + p.shard_offset, p.size, grad_error_.data() + at);
  }
}

}  // namespace tandem::zero
