#include "worker/zero/sharded_params.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::zero {

absl::StatusOr<std::unique_ptr<ShardedParams>> ShardedParams::Create(std::vector<Unit> units, comm::Collective* comm,
                                                                     kernels::DeviceMemory* memory,
                                                                     comm::Timeout timeout,
                                                                     std::vector<uint64_t> weights) {
  if (comm == nullptr || memory == nullptr) {
    return absl::InvalidArgumentError("sharded parameters: comm and memory are required");
  }
  if (units.empty()) return absl::InvalidArgumentError("sharded parameters: empty unit table");
  size_t expect = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].offset != expect) {
      return absl::InvalidArgumentError(absl::StrCat("sharded parameters: unit ", u, " starts at ", units[u].offset,
                                                     ", expected ", expect, " (units must be contiguous, in order)"));
    }
    expect += units[u].size;
  }
  if (!weights.empty() && static_cast<int>(weights.size()) != comm->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharded parameters: ", weights.size(), " weights for a world of ", comm->size()));
  }
  for (uint64_t w : weights) {
    if (w == 0) return absl::InvalidArgumentError("sharded parameters: a partition weight is 0");
  }
  auto p =
      std::unique_ptr<ShardedParams>(new ShardedParams(std::move(units), comm, memory, timeout, std::move(weights)));
  if (!p->shard_.AllocateZeroed(memory, std::max<size_t>(p->shard_size_, 1))) {
    return absl::ResourceExhaustedError(absl::StrCat("sharded parameters: out of ", memory->name(),
                                                     " memory allocating the shard (", p->shard_size_ * sizeof(float),
                                                     " bytes)"));
  }
  return p;
}

ShardedParams::ShardedParams(std::vector<Unit> units, comm::Collective* comm, kernels::DeviceMemory* memory,
                             comm::Timeout timeout, std::vector<uint64_t> weights)
    : units_(std::move(units)), weights_(std::move(weights)), comm_(comm), mem_(memory), timeout_(timeout) {
  rank_ = comm_->rank();
  world_ = comm_->size();
  for (const Unit& u : units_) {
    psi_ += u.size;
    max_unit_ = std::max(max_unit_, u.size);
  }
  shard_map_ = ComputeShardMap(units_, rank_, world_, weights_);
  for (const ShardPiece& p : shard_map_) shard_size_ += p.size;
}

void ShardedParams::LoadShard(const float* shard) { shard_.Upload(shard, shard_size_); }

void ShardedParams::CopyShard(float* out) const { shard_.Download(out, shard_size_); }

void ShardedParams::LoadFull(const float* full) {
  for (const ShardPiece& p : shard_map_) {
    shard_.Upload(full + units_[p.unit].offset + p.unit_offset, p.size, p.shard_offset);
  }
}

void ShardedParams::Fail(const absl::Status& s) {
  if (status_.ok() && !s.ok()) status_ = s;
}

float* ShardedParams::TakeBuffer() {
  if (!free_.empty()) {
    float* b = free_.back();
    free_.pop_back();
    return b;
  }
  const size_t n = std::max<size_t>(max_unit_, 1);
  kernels::DeviceArray<float> buf;
  if (!buf.Allocate(mem_, n)) {
    Fail(
        absl::ResourceExhaustedError(absl::StrCat("sharded parameters: out of ", mem_->name(),
                                                  " memory allocating a unit buffer (", n * sizeof(float), " bytes)")));
    return nullptr;
  }
  buffers_.push_back(std::move(buf));
  peak_buffer_bytes_ = std::max(peak_buffer_bytes_, buffer_bytes());
  return buffers_.back().data();
}

const float* ShardedParams::AcquireParams(int unit) {
  if (!status_.ok() || unit < 0 || unit >= static_cast<int>(units_.size())) {
    Fail(absl::InvalidArgumentError(absl::StrCat("sharded parameters: no unit ", unit)));
    return nullptr;
  }
  auto it = held_.find(unit);
  if (it != held_.end()) {
    ++it->second.refs;
    return it->second.buf;
  }
  float* buf = TakeBuffer();
  if (buf == nullptr) return nullptr;
  const ShardPiece& piece = shard_map_[unit];
  absl::Status s = comm_->allgather(shard_.data() + piece.shard_offset, buf,
                                    PieceCounts(units_[unit].size, world_, weights_), timeout_);
  if (!s.ok()) {
    free_.push_back(buf);
    Fail(s);
    return nullptr;
  }
  held_[unit] = Held{buf, 1};
  return buf;
}

void ShardedParams::ReleaseParams(int unit) {
  auto it = held_.find(unit);
  if (it == held_.end()) return;
  if (--it->second.refs > 0) return;
  free_.push_back(it->second.buf);
  held_.erase(it);
}

void ShardedParams::Trim() {
  std::vector<kernels::DeviceArray<float>> keep;
  for (auto& b : buffers_) {
    const bool is_free = std::find(free_.begin(), free_.end(), b.data()) != free_.end();
    if (!is_free) keep.push_back(std::move(b));
  }
  buffers_ = std::move(keep);
  free_.clear();
}

size_t ShardedParams::buffer_bytes() const {
  size_t n = 0;
  for (const auto& b : buffers_) n += b.bytes();
  return n;
}

}  // namespace tandem::zero
