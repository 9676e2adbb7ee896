#include "worker/rollout/linear_runs.h"

#include <algorithm>

#include "common/base/check.h"

namespace tandem::rollout {

LinearRuns RunsOf(const ForwardBatch& b) { return {b.num_chunks, b.chunk_rows, b.chunk_slot, b.chunk_start}; }

void RunLinearAttention(kernels::Ops* ops, kernels::DeviceMemory* mem, const kernels::LinearAttentionParams& p,
                        const float* q, const float* k, const float* v, const float* log_decay, int rows,
                        const LinearRuns& runs, float* pool, size_t state_floats, float* states, float* out) {
  TANDEM_CHECK(runs.num > 0 && pool != nullptr);
  const size_t n = state_floats;
  for (int i = 0; i < runs.num; ++i) {
    float* s = states + i * n;
    if (runs.start[i] == 0) {
      mem->SetZero(s, n * sizeof(float));
    } else {
      mem->CopyOnDevice(s, pool + static_cast<size_t>(runs.slot[i]) * n, n * sizeof(float));
    }
  }
  ops->linear_attention_forward(p, q, k, v, log_decay, runs.rows_device, runs.num, rows, states, out, states);
  for (int i = 0; i < runs.num; ++i) {
    mem->CopyOnDevice(pool + static_cast<size_t>(runs.slot[i]) * n, states + i * n, n * sizeof(float));
  }
}

int SliceRuns(const ForwardBatch& b, int r0, int n, std::vector<int32_t>* rows, std::vector<int32_t>* slot,
              std::vector<int32_t>* start) {
  TANDEM_CHECK(b.chunk_rows_host != nullptr);
  rows->clear();
  slot->clear();
  start->clear();
  const int r1 = r0 + n;
  int end = 0;
  for (int i = 0; i < b.num_chunks; ++i) {
    const int a = std::max(b.chunk_rows_host[i], r0), e = std::min(b.chunk_rows_host[i + 1], r1);
    if (a >= e) continue;
    rows->push_back(a - r0);
    slot->push_back(b.chunk_slot[i]);
    start->push_back(b.chunk_start[i] + (a - b.chunk_rows_host[i]));
    end = e - r0;
  }
  rows->push_back(end);
  return static_cast<int>(slot->size());
}

}  // namespace tandem::rollout
