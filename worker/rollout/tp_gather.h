// GatherTpSlice: entering a rollout, each rank builds its tensor-parallel
// slice (tp_slice.h) straight from the ZeRO parameter shards, moving only
// the floats its slice needs that other ranks own, never the full model
// (the 3D-HybridEngine idea).
//
// The ZeRO world (`world`, N ranks) holds the flat parameters partitioned by
// zero::ComputeShardMap(units, rank, N); TP groups are consecutive ranks
// (rank r is TP rank r % tp_size of group r / tp_size; N % tp_size == 0).
// Every rank sends each peer the pieces of its shard that the peer's slice
// maps, in the slice's order, and receives its own the same way (one
// send/recv pair per peer pair, in a fixed global pair order, so no two
// ranks wait on each other). Every rank calls it (collective).
//
// Host buffers: `shard` is this rank's shard in shard-map order (what
// ZeroOptimizer::CopyParamShard writes), `slice` receives
// TpSliceMap::slice_floats floats (padding zero). Errors: InvalidArgument
// for shapes or sizes that do not divide (TpSliceConfig's messages) or a
// unit table that does not match the model; a failed send/recv returns the
// Collective's error (the communicator is then broken).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/collective.h"
#include "worker/model/config.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::rollout {

struct TpGatherStats {
  uint64_t bytes_received = 0;     // from peers (the slice's floats others own)
  uint64_t bytes_sent = 0;         // to peers
  uint64_t full_gather_bytes = 0;  // what an allgather of the full model brings to this rank
  uint64_t slice_bytes = 0;        // the slice (fp32)
  double seconds = 0;
};

absl::StatusOr<TpGatherStats> GatherTpSlice(comm::Collective& world, const model::ModelConfig& config, int tp_size,
                                            const std::vector<zero::Unit>& units, const float* shard, float* slice,
                                            comm::Timeout timeout);

}  // namespace tandem::rollout
