// Linear-attention layers in a rollout step. A step's rows are runs of
// consecutive positions of one sequence each (ForwardBatch::chunk_*); a
// linear layer has no KV cache, and each run continues its sequence's
// recurrent state kept in a state slot of the KvPool.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/rollout/batch_forward.h"

namespace tandem::rollout {

// Runs over rows [0, rows) of q/k/v: run i is rows [rows_device[i],
// rows_device[i + 1]) (device, num + 1 entries), continues the state in
// slot[i] and starts at position start[i] (slot and start: host).
struct LinearRuns {
  int num = 0;
  const int32_t* rows_device = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* start = nullptr;
};

// The batch's runs (ForwardBatch::chunk_*).
LinearRuns RunsOf(const ForwardBatch& b);

// out [rows, H * Dv] = linear attention of q, k, v [rows, H * D] over the
// runs: each run's state is gathered from `pool` into `states` [num,
// state_floats] (zeros for a run from position 0), one kernel call updates
// them in place, and they are scattered back to their slots.
void RunLinearAttention(kernels::Ops* ops, kernels::DeviceMemory* mem, const kernels::LinearAttentionParams& p,
                        const float* q, const float* k, const float* v, const float* log_decay, int rows,
                        const LinearRuns& runs, float* pool, size_t state_floats, float* states, float* out);

// The runs of rows [r0, r0 + n) of a batch (a half of a split step),
// renumbered from row 0: a run cut at r0 continues at position start + the
// rows before r0, from the state its first part left in its slot. Writes
// the row offsets (host, num + 1) and the slots and starts into the given
// vectors (capacity reserved by the caller: nothing allocates when it
// holds b.num_chunks + 1) and returns the run count.
int SliceRuns(const ForwardBatch& b, int r0, int n, std::vector<int32_t>* rows, std::vector<int32_t>* slot,
              std::vector<int32_t>* start);

}  // namespace tandem::rollout
