// PlanKvCache: how a rollout lays out its KV cache, before anything is
// allocated. Linear-attention layers keep one recurrent state per running
// sequence (taken from the budget first); the other layers read paged KV
// blocks. Sliding-window and sink layers give back the blocks behind the
// widest window as sequences grow (keeping the blocks of the most sinks of
// any layer): alone they share the one pool, beside full-attention layers
// they get a pool of their own (pool 1), so that the full layers' blocks do
// not hold theirs. Without a budget each pool holds every sequence at full
// length; with one, each pool first gets what the longest sequence needs
// at least and the rest is shared in proportion to what every sequence at
// full length needs beyond that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/model/layer_types.h"

namespace tandem::rollout {

// What a rollout asks of the cache.
struct KvPlanRequest {
  std::vector<model::LayerType> layers;  // every layer's attention type
  int kv_dim = 0;                        // k (or v) floats per row and layer
  size_t linear_state_floats = 0;        // per sequence and linear layer
  std::vector<int64_t> positions;        // each sequence at full length
  size_t kv_cache_bytes = 0;             // 0: room for every sequence
  kernels::KvDtype dtype = kernels::KvDtype::kF32;
  int block_size = 16;
  int max_batch_tokens = 2048;  // rows per step
  int max_seqs = 256;
  bool summaries = false;  // key summaries for sparse attention (full layers)
};

struct KvPlan {
  std::vector<bool> has_kv;     // per layer: reads paged blocks
  std::vector<bool> has_state;  // per layer: a recurrent state per sequence
  std::vector<bool> windowed;   // per layer: in pool 1
  int window = 0;               // pool 0 gives blocks back behind it (one pool)
  int sinks = 0;
  int windowed_window = 0;  // pool 1's window and sinks
  int windowed_sinks = 0;
  int state_slots = 0;
  size_t state_bytes = 0;
  size_t block_bytes = 0;           // one block of pool 0, over its layers
  size_t windowed_block_bytes = 0;  // one block of pool 1
  int num_blocks = 0;
  int windowed_blocks = 0;  // 0: one pool

  // The cache's bytes: both pools and the states.
  size_t bytes() const {
    return static_cast<size_t>(num_blocks) * block_bytes + static_cast<size_t>(windowed_blocks) * windowed_block_bytes +
           state_bytes;
  }
};

// InvalidArgument when the budget cannot hold the linear-attention states
// (a budget too small for the blocks is the scheduler's error).
absl::StatusOr<KvPlan> PlanKvCache(const KvPlanRequest& r);

}  // namespace tandem::rollout
