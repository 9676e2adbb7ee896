// ZeroOptimizer: hierarchical partition (hpZ) and int8 weight gathers
// (qwZ) at stage 3; see zero_optimizer.h.
#include <algorithm>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/cpu/quantize_int8_cpu.h"
#include "kernels/int8_blocks.h"
#include "kernels/int8_rounding.h"
#include "worker/zero/zero_internal.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

size_t Sum(const std::vector<size_t>& v, size_t end) {
  return std::accumulate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(end), size_t{0});
}

}  // namespace

size_t ZeroOptimizer::WireFloats(size_t n) const {
  if (qwz()) return kernels::Int8WireFloats(n);
  if (bf16()) return (n + 1) / 2;
  return n;
}

std::vector<size_t> ZeroOptimizer::WireCounts(const std::vector<size_t>& counts) const {
  std::vector<size_t> w(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) w[i] = WireFloats(counts[i]);
  return w;
}

absl::StatusOr<WeightQuantization> ParseWeightQuantization(std::string_view name) {
  if (name.empty() || name == "none") return WeightQuantization::kNone;
  if (name == "int8") return WeightQuantization::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("zero.weight_quantization \"", std::string(name), "\" (expected none or int8)"));
}

std::vector<ShardPiece> ComputeHierarchicalShardMap(const std::vector<Unit>& units, int local, int locals, int node,
                                                    int nodes) {
  std::vector<ShardPiece> map;
  size_t shard_offset = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const std::vector<size_t> chunks = comm::SplitEven(units[u].size, locals);
    const std::vector<size_t> subs = comm::SplitEven(chunks[local], nodes);
    const size_t offset = Sum(chunks, local) + Sum(subs, node);
    map.push_back(ShardPiece{static_cast<int>(u), offset, subs[node], shard_offset});
    shard_offset += subs[node];
  }
  return map;
}

absl::Status ZeroOptimizer::CheckHierarchical() {
  if (hpz()) {
    if (options_.stage != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zero.hierarchical_partition needs ZeRO stage 3 (cluster.zero_stage: 3), not stage ", options_.stage));
    }
    if (options_.intra == nullptr || options_.inter == nullptr) {
      return absl::InvalidArgumentError("zero.hierarchical_partition needs the intra- and inter-node communicators");
    }
    if (options_.intra->size() * options_.inter->size() != world_) {
      return absl::InvalidArgumentError(absl::StrCat("zero.hierarchical_partition: ", options_.inter->size(),
                                                     " nodes x ", options_.intra->size(), " ranks is not the world of ",
                                                     world_, " (every node needs the same number of workers)"));
    }
  }
  if (qwz()) {
    if (options_.stage != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zero.weight_quantization int8 needs ZeRO stage 3 (cluster.zero_stage: 3), not stage ", options_.stage));
    }
  }
  return absl::OkStatus();
}

std::vector<size_t> ZeroOptimizer::ChunkCounts(int unit) const {
  return comm::SplitEven(options_.units[unit].size, locals_);
}

std::vector<size_t> ZeroOptimizer::SubCounts(int unit, int l) const {
  return comm::SplitEven(ChunkCounts(unit)[l], nodes_);
}

size_t ZeroOptimizer::ChunkOffset(int unit, int l) const { return Sum(ChunkCounts(unit), l); }

std::vector<size_t> ZeroOptimizer::FlatWireCounts(int unit) const { return WireCounts(UnitCounts(unit)); }

size_t ZeroOptimizer::ChunkWireFloats(int unit, int l) const {
  const std::vector<size_t> w = WireCounts(SubCounts(unit, l));
  return Sum(w, w.size());
}

std::vector<size_t> ZeroOptimizer::ChunkWireCounts(int unit) const {
  std::vector<size_t> w(locals_);
  for (int l = 0; l < locals_; ++l) w[l] = ChunkWireFloats(unit, l);
  return w;
}

absl::Status ZeroOptimizer::AllocateHierarchicalState() {
  const int n = static_cast<int>(options_.units.size());
  if (qwz()) {
    for (int u = 0; u < n; ++u) {
      const std::vector<size_t> w = hpz() ? ChunkWireCounts(u) : FlatWireCounts(u);
      qw_packed_floats_ = std::max(qw_packed_floats_, Sum(w, w.size()));
    }
  }
  if (!hpz()) return absl::OkStatus();
  size_t secondary = 0, chunks = 0, max_chunk = 1;
  for (int u = 0; u < n; ++u) {
    secondary_off_.push_back(secondary);
    chunk_off_.push_back(chunks);
    const size_t chunk = ChunkCounts(u)[local_];
    secondary += ChunkWireFloats(u, local_);
    chunks += chunk;
    max_chunk = std::max(max_chunk, chunk);
  }
  if (!secondary_.AllocateZeroed(mem_, std::max<size_t>(secondary, 1))) {
    return AllocError("the secondary (hpZ) parameter copy", secondary * sizeof(float));
  }
  if (!chunk_buf_.AllocateZeroed(mem_, max_chunk)) return AllocError("the hpZ chunk buffer", max_chunk * sizeof(float));
  return absl::OkStatus();
}

void ZeroOptimizer::FillSecondary(const float* full_host) {
  std::vector<float> wire;  // InitFromFull only
  for (size_t u = 0; u < options_.units.size(); ++u) {
    const int unit = static_cast<int>(u);
    const float* chunk = full_host + options_.units[u].offset + ChunkOffset(unit, local_);
    if (!qwz() && !bf16()) {
      secondary_.Upload(chunk, ChunkCounts(unit)[local_], secondary_off_[u]);
      continue;
    }
    // Each owner's piece encoded on its own, on the host: the bits its
    // owner's refresh produces on any backend (int8 and bf16 conversions
    // are bit-identical across backends).
    wire.assign(ChunkWireFloats(unit, local_), 0.f);
    float* w = wire.data();
    int node = 0;
    for (size_t sub : SubCounts(unit, local_)) {
      if (qwz()) {
        kernels::cpu::quantize_int8(chunk, sub, w, QuantSeed(step_, unit, node * locals_ + local_));
      } else {
        uint16_t* bits = reinterpret_cast<uint16_t*>(w);
        for (size_t i = 0; i < sub; ++i) bits[i] = kernels::Bf16FromFloat(chunk[i]);
      }
      chunk += sub;
      w += WireFloats(sub);
      ++node;
    }
    secondary_.Upload(wire.data(), wire.size(), secondary_off_[u]);
  }
}

absl::Status ZeroOptimizer::RefreshSecondary() {
  if (!hpz()) return absl::OkStatus();
  comm::Collective* inter = options_.inter;
  const comm::Timeout timeout = options_.timeout;
  kernels::Ops* ops = comm_ops();
  const int64_t step = step_;
  RETURN_IF_ERROR(worker_->Run([&]() -> absl::Status {
    for (size_t u = 0; u < options_.units.size(); ++u) {
      const int unit = static_cast<int>(u);
      const ShardPiece& piece = shard_map_[u];
      const float* mine = param_shard_.data() + piece.shard_offset;
      float* chunk = secondary_.data() + secondary_off_[u];
      const std::vector<size_t> subs = SubCounts(unit, local_);
      if (!qwz() && !bf16()) {
        RETURN_IF_ERROR(inter->allgather(mine, chunk, subs, timeout));
        continue;
      }
      // Each owner encodes its piece into its slot (bf16: the odd padding
      // half stays zero from allocation) and the slots are gathered.
      const std::vector<size_t> wire = WireCounts(subs);
      float* slot = chunk + Sum(wire, node_);
      if (qwz()) {
        ops->quantize_int8(mine, piece.size, slot, QuantSeed(step, unit, node_ * locals_ + local_));
      } else {
        ops->float_to_bf16(mine, reinterpret_cast<uint16_t*>(slot), piece.size);
      }
      RETURN_IF_ERROR(inter->allgather(slot, chunk, wire, timeout));
    }
    return absl::OkStatus();
  }));
  return MemoryStatus();
}

uint64_t ZeroOptimizer::QuantSeed(int64_t step, int unit, int owner) const {
  return kernels::Int8SeedFrom(options_.weight_quantization_seed, static_cast<uint64_t>(step),
                               static_cast<uint64_t>(unit), static_cast<uint64_t>(owner));
}

absl::Status ZeroOptimizer::GatherUnitForCompute(int unit, float* dst, float* packed, int64_t step) {
  const comm::Timeout timeout = options_.timeout;
  kernels::Ops* ops = comm_ops();
  if (hpz() && !qwz() && !bf16()) {
    return options_.intra->allgather(secondary_.data() + secondary_off_[unit], dst, ChunkCounts(unit), timeout);
  }
  // The element counts of the encoded pieces, in gathered order.
  std::vector<size_t> pieces;
  if (hpz()) {
    RETURN_IF_ERROR(
        options_.intra->allgather(secondary_.data() + secondary_off_[unit], packed, ChunkWireCounts(unit), timeout));
    for (int l = 0; l < locals_; ++l) {
      for (size_t sub : SubCounts(unit, l)) pieces.push_back(sub);
    }
  } else {
    // Flat qwZ: every rank quantises its piece into its slot.
    pieces = UnitCounts(unit);
    const std::vector<size_t> wire = WireCounts(pieces);
    const ShardPiece& piece = MyPiece(unit);
    float* slot = packed + Sum(wire, rank_);
    ops->quantize_int8(param_shard_.data() + piece.shard_offset, piece.size, slot, QuantSeed(step, unit, rank_));
    RETURN_IF_ERROR(options_.comm->allgather(slot, packed, wire, timeout));
  }
  const float* in = packed;
  float* out = dst;
  for (size_t c : pieces) {
    if (qwz()) {
      ops->dequantize_int8(in, c, out);
    } else {
      ops->bf16_to_float(reinterpret_cast<const uint16_t*>(in), out, c);
    }
    in += WireFloats(c);
    out += c;
  }
  if (qwz() && bf16()) {
    // The compute sees bf16 weights: the dequantised unit rounded to bf16
    // (through the packed buffer, which holds max_unit / 2 floats or more).
    const size_t n = options_.units[unit].size;
    ops->float_to_bf16(dst, reinterpret_cast<uint16_t*>(packed), n);
    ops->bf16_to_float(reinterpret_cast<const uint16_t*>(packed), dst, n);
  }
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::GatherUnitExact(int unit, float* dst) {
  const comm::Timeout timeout = options_.timeout;
  const float* mine = param_shard_.data() + shard_map_[unit].shard_offset;
  if (!hpz()) return options_.comm->allgather(mine, dst, UnitCounts(unit), timeout);
  if (!qwz() && !bf16()) {
    // The fp32 secondary copy equals the masters.
    return options_.intra->allgather(secondary_.data() + secondary_off_[unit], dst, ChunkCounts(unit), timeout);
  }
  RETURN_IF_ERROR(options_.inter->allgather(mine, chunk_buf_.data(), SubCounts(unit, local_), timeout));
  return options_.intra->allgather(chunk_buf_.data(), dst, ChunkCounts(unit), timeout);
}

absl::Status ZeroOptimizer::HierarchicalReduceScatter(int unit, const float* in, float* piece) {
  const comm::Timeout timeout = options_.timeout;
  const std::vector<size_t> chunks = ChunkCounts(unit);
  const std::vector<size_t> subs = SubCounts(unit, local_);
  RETURN_IF_ERROR(options_.intra->reduce_scatter(in, chunk_buf_.data(), chunks, timeout));
  if (!int4_grads()) return options_.inter->reduce_scatter(chunk_buf_.data(), piece, subs, timeout);
  // LoCo on the inter-node tier, through the host staging buffers.
  const size_t chunk = chunks[local_];
  mem_->CopyToHost(q_in_.data(), chunk_buf_.data(), chunk * sizeof(float));
  RETURN_IF_ERROR(qx_->ReduceScatter(*options_.inter, q_in_.data(),
                                     grad_error_.empty() ? nullptr : grad_error_.data() + chunk_off_[unit],
                                     q_out_.data(), subs, timeout));
  if (subs[node_] > 0) mem_->CopyToDevice(piece, q_out_.data(), subs[node_] * sizeof(float));
  return absl::OkStatus();
}

}  // namespace tandem::zero
