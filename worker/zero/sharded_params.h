// ShardedParams: a frozen parameter vector (the KL reference policy of GRPO)
// partitioned like the ZeRO parameters - rank r keeps piece r of every unit
// (ComputeShardMap, zero_optimizer.h) - and a read-only ParamProvider over
// it that allgathers a unit into a unit-sized buffer when the model
// acquires it and gives the buffer back when the model releases it. A
// forward over it holds one shard (Psi / N floats) and at most two unit
// buffers (a layer, and unit 0 when the embeddings are tied to the LM head)
// instead of the full Psi floats. The gathered unit holds the very bits of
// the full vector, so log-probs equal those over a full copy bit for bit.
//
// Collectives: every AcquireParams is an allgather on the calling thread
// over `comm`, so every rank runs the same forwards (same units in the same
// order), and nothing else may use `comm` meanwhile (drain the
// ZeroOptimizer first). Buffers live in `memory` (device pointers, as the
// model reads them); the Load/Copy calls take host arrays.
//
// Errors: ParamProvider calls cannot return a Status: a failed allgather or
// allocation is kept in status() (sticky; AcquireParams returns nullptr);
// check it after each forward. One thread at a time.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "worker/comm/collective.h"
#include "worker/model/param_provider.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {

class ShardedParams final : public model::ParamProvider {
 public:
  // `comm` and `memory` are not owned and must outlive the object. The
  // shard starts zeroed. InvalidArgument for an empty or non-contiguous
  // unit table; ResourceExhausted when the shard cannot be allocated.
  // `weights`: the ZeRO partition's (ZeroOptions.partition_weights; empty =
  // the even split), so shards load from the optimizer's.
  static absl::StatusOr<std::unique_ptr<ShardedParams>> Create(std::vector<Unit> units, comm::Collective* comm,
                                                               kernels::DeviceMemory* memory, comm::Timeout timeout,
                                                               std::vector<uint64_t> weights = {});
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  // This rank's shard in shard_map() order (host, shard_size() floats):
  // what ZeroOptimizer::CopyParamShard gives over the same units.
  void LoadShard(const float* shard);
  void CopyShard(float* out) const;
  // This rank's pieces of a full host vector (num_params() floats).
  void LoadFull(const float* full);

  const float* AcquireParams(int unit) override;
  void ReleaseParams(int unit) override;
  float* AcquireGrads(int) override { return nullptr; }  // frozen
  void ReleaseGrads(int) override {}

  // Frees the unit buffers no unit holds (the shard stays).
  void Trim();

  const std::vector<ShardPiece>& shard_map() const { return shard_map_; }
  size_t shard_size() const { return shard_size_; }
  size_t num_params() const { return psi_; }
  size_t shard_bytes() const { return shard_.bytes(); }
  // Bytes of the unit buffers now allocated, and the most ever allocated.
  size_t buffer_bytes() const;
  size_t peak_buffer_bytes() const { return peak_buffer_bytes_; }
  absl::Status status() const { return status_; }

 private:
  struct Held {
    float* buf = nullptr;
    int refs = 0;
  };
  ShardedParams(std::vector<Unit> units, comm::Collective* comm, kernels::DeviceMemory* memory, comm::Timeout timeout,
                std::vector<uint64_t> weights);
  float* TakeBuffer();
  void Fail(const absl::Status& s);

  std::vector<Unit> units_;
  std::vector<uint64_t> weights_;
  comm::Collective* comm_;
  kernels::DeviceMemory* mem_;
  comm::Timeout timeout_;
  int rank_ = 0, world_ = 1;
  size_t psi_ = 0, max_unit_ = 0, shard_size_ = 0;
  std::vector<ShardPiece> shard_map_;
  kernels::DeviceArray<float> shard_;
  std::vector<kernels::DeviceArray<float>> buffers_;
  std::vector<float*> free_;
  std::map<int, Held> held_;
  size_t peak_buffer_bytes_ = 0;
  absl::Status status_;
};

}  // namespace tandem::zero
