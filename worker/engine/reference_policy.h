// The KL reference policy of GRPO kept sharded (rl.shard_reference): this
// rank's shard in ctx.ref_shard, partitioned like the ZeRO-3 parameters
// (worker/zero/sharded_params.h), instead of the full copy in
// ctx.ref_params. Checkpoints and peer copies store a rank's pieces in
// either case, so both forms restore from the same files.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "worker/engine/job_context.h"

namespace tandem::worker {

// Whether the job keeps its reference sharded (rl.shard_reference).
bool ShardsReference(const JobContext& ctx);
// Makes an empty (zeroed) ctx.ref_shard over the model's units when there
// is none; ResourceExhausted when the shard does not fit.
absl::Status MakeReferenceShard(JobContext& ctx);
// The reference := the current fp32 master weights, as this rank's shard
// (no collective: the optimizer's own pieces).
absl::Status TakeShardedReference(JobContext& ctx);
// This rank's pieces of the reference (ZeroOptimizer::shard_map() order)
// into out; leaves it empty when the job holds no reference.
void CopyReferencePieces(const JobContext& ctx, std::vector<float>* out);

}  // namespace tandem::worker
