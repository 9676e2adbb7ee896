#include "worker/engine/reference_policy.h"

#include <algorithm>

namespace tandem::worker {

bool ShardsReference(const JobContext& ctx) { return ctx.spec().rl().shard_reference(); }

absl::Status MakeReferenceShard(JobContext& ctx) {
  if (ctx.ref_shard) return absl::OkStatus();
  auto shard = zero::ShardedParams::Create(ctx.zero->units(), ctx.collective.get(), ctx.device->memory.get(),
                                           ctx.timeout, ctx.zero->partition_weights());
  if (!shard.ok()) return shard.status();
  ctx.ref_shard = std::move(*shard);
  ctx.ref_params.clear();
  ctx.ref_device.reset();
  return absl::OkStatus();
}

absl::Status TakeShardedReference(JobContext& ctx) {
  if (absl::Status st = MakeReferenceShard(ctx); !st.ok()) return st;
  if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
  std::vector<float> shard(ctx.zero->shard_size());
  ctx.zero->CopyParamShard(shard.data());
  ctx.ref_shard->LoadShard(shard.data());
  return absl::OkStatus();
}

void CopyReferencePieces(const JobContext& ctx, std::vector<float>* out) {
  out->clear();
  if (ctx.ref_shard) {
    out->resize(ctx.ref_shard->shard_size());
    ctx.ref_shard->CopyShard(out->data());
    return;
  }
  if (ctx.ref_params.empty()) return;
  const auto& units = ctx.zero->units();
  for (const zero::ShardPiece& p : ctx.zero->shard_map()) {
    const float* src = ctx.ref_params.data() + units[p.unit].offset + p.unit_offset;
    out->insert(out->end(), src, src + p.size);
  }
}

}  // namespace tandem::worker
