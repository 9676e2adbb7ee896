#include "worker/rollout/kv_plan.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "worker/rollout/kv_pool.h"

namespace tandem::rollout {

absl::StatusOr<KvPlan> PlanKvCache(const KvPlanRequest& r) {
  KvPlan p;
  const int layers = static_cast<int>(r.layers.size());
  const int bs = r.block_size;
  p.has_kv.assign(layers, false);
  p.has_state.assign(layers, false);
  p.windowed.assign(layers, false);
  int kv_layers = 0, windowed_layers = 0, window = 0, sinks = 0;
  for (int l = 0; l < layers; ++l) {
    const model::LayerType& t = r.layers[l];
    p.has_state[l] = t.kind == model::LayerKind::kLinear;
    p.has_kv[l] = !p.has_state[l];
    if (!p.has_kv[l]) continue;
    ++kv_layers;
    p.windowed[l] = (t.kind == model::LayerKind::kWindow || t.kind == model::LayerKind::kSinkWindow) && t.window > 0;
    if (!p.windowed[l]) continue;
    ++windowed_layers;
    window = std::max(window, t.window);
    if (t.kind == model::LayerKind::kSinkWindow) sinks = std::max(sinks, t.sinks);
  }
  const bool two_pools = windowed_layers > 0 && windowed_layers < kv_layers;
  if (windowed_layers < kv_layers && !two_pools) window = sinks = 0;
  if (two_pools) {
    p.windowed_window = window;
    p.windowed_sinks = sinks;
  } else {
    p.windowed.assign(layers, false);
    p.window = window;
    p.sinks = sinks;
  }
  const int sink_blocks = window > 0 ? (sinks + bs - 1) / bs : 0;
  p.state_slots = kv_layers < layers ? std::min<int>(r.max_seqs, static_cast<int>(r.positions.size())) : 0;
  p.state_bytes = static_cast<size_t>(layers - kv_layers) * static_cast<size_t>(p.state_slots) * r.linear_state_floats *
                  sizeof(float);
  // Key summaries serve full layers: pool 1 has none.
  const int pool0_layers = kv_layers - (two_pools ? windowed_layers : 0);
  p.block_bytes = KvPool::BlockBytes(pool0_layers, r.kv_dim, bs, r.dtype, r.summaries);
  p.windowed_block_bytes = two_pools ? KvPool::BlockBytes(windowed_layers, r.kv_dim, bs, r.dtype) : 0;

  // Blocks for every sequence at full length, unshared, per pool, and what
  // the longest sequence needs at least (one row per step).
  int64_t full0 = 0, full1 = 0, least0 = 0, least1 = 0;
  for (int64_t n : r.positions) {
    const int64_t blocks = (n + bs - 1) / bs;
    // A windowed sequence holds at most its sinks, its window and one
    // step's rows; one row per step needs its sinks, window and row.
    const int64_t bounded =
        window > 0 ? std::min<int64_t>(blocks, sink_blocks + (window - 1 + r.max_batch_tokens) / bs + 2) : blocks;
    const int64_t least = window > 0 ? std::min<int64_t>(blocks, sink_blocks + (window - 1) / bs + 2) : blocks;
    full0 += two_pools ? blocks : bounded;
    full1 += two_pools ? bounded : 0;
    least0 = std::max(least0, two_pools ? blocks : least);
    least1 = std::max(least1, two_pools ? least : 0);
  }
  // Blocks of a model without KV layers cost nothing (they only count
  // positions).
  if (r.kv_cache_bytes > 0 && p.state_bytes > r.kv_cache_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rollout.kv_cache_bytes ", r.kv_cache_bytes, " cannot hold the linear-attention states of ", p.state_slots,
        " running sequences (", p.state_bytes, " bytes); raise it or lower rollout.max_seqs"));
  }
  const int64_t block_cap = INT32_MAX / bs;
  int64_t n0 = std::min(full0, block_cap), n1 = std::min(full1, block_cap);
  if (r.kv_cache_bytes > 0 && p.block_bytes > 0) {
    const size_t bytes = r.kv_cache_bytes - p.state_bytes;
    if (!two_pools) {
      n0 = std::min<int64_t>(n0, static_cast<int64_t>(std::min<size_t>(bytes / p.block_bytes, INT64_MAX)));
    } else {
      const double budget = static_cast<double>(bytes);
      const double b0 = static_cast<double>(p.block_bytes), b1 = static_cast<double>(p.windowed_block_bytes);
      const double extra = budget - static_cast<double>(least0) * b0 - static_cast<double>(least1) * b1;
      if (extra < 0) {
        n1 = std::min(n1, least1);
        n0 = std::min<int64_t>(n0, static_cast<int64_t>(std::max(0.0, budget - static_cast<double>(n1) * b1) / b0));
      } else {
        const double more0 = static_cast<double>(full0 - least0), more1 = static_cast<double>(full1 - least1);
        const double share = more0 + more1 > 0 ? std::min(1.0, extra / (more0 * b0 + more1 * b1)) : 0.0;
        n0 = std::min<int64_t>(n0, least0 + static_cast<int64_t>(share * more0));
        n1 = std::min<int64_t>(n1, least1 + static_cast<int64_t>(share * more1));
      }
    }
  }
  p.num_blocks = static_cast<int>(n0);
  p.windowed_blocks = two_pools ? static_cast<int>(std::max<int64_t>(n1, 1)) : 0;
  return p;
}

}  // namespace tandem::rollout
