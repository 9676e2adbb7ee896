// Live restore (degraded continuation, MeCeFO): when a worker of a job
// with recovery.degraded is lost, the survivors are set up again under the
// next generation with Assignment.live_restore = true and live_restore_step
// = S (the last training phase every rank completed). They keep the state
// they hold in memory instead of restoring from peers or disk: the engine
// takes the live state out of the previous generation's JobContext
// (TakeLiveState, before it is destroyed) and SETUP loads it into the new
// one (LiveRestore).
//
// ZeRO stage 0: every survivor holds the whole state. Stages 1-3: each
// survivor holds its own shard of the old partition (Adam moments; stage 3
// and bf16 also the fp32 parameters; stages 1-2 in fp32 hold the full
// parameters, which are then taken from new rank 0). A lost rank's shard
// comes from the peer copy its old neighbour (old rank + 1) holds
// (peer_snapshot.h): the parameters must be of step S there unless they are
// held in full; Adam moments of an older copy are used as they are (stale
// by S - C steps: an approximation, reported). The pieces are summed into
// full vectors over the new communicator (each element has exactly one
// contributor, so the sums are exact) and re-partitioned for the new
// world. Gradients need nothing: every step starts from zero.
//
// Every rank agrees before anyone loads (allreduces over the new
// communicator): if any rank holds no live state, or one of another step
// than S, or a lost shard has no usable copy, every rank fails SETUP with
// "live restore: ..." and the coordinator falls back to a normal recovery
// from disk (which continues degraded, with a rollback). A rank that
// finished the training step in flight before the failure holds that step
// (live_restore_inflight_step) instead; that is fine when every rank does.
// Report values on success: restored_step = S (or the in-flight step),
// restore_source = 3 (live), restore_seconds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::worker {

struct JobContext;

struct LiveState {
  std::string why_not;  // non-empty: no usable state (e.g. "holds no state of this job")
  std::optional<int64_t> last_trained_step;
  int stage = 0;     // ZeRO stage of the old context
  int old_rank = 0;  // rank and world of the old partition
  int old_world = 1;
  // Stage 0: full, in the model's flat layout. Stages 1-3: `params` full
  // when held in full (else empty); own_params, exp_avg and exp_avg_sq are
  // the old shard (shard_map order of (old_rank, old_world)).
  std::vector<float> params, exp_avg, exp_avg_sq, own_params;
  int64_t zero_steps = 0;       // ZeroOptimizer::step_count (AdamW bias correction)
  int64_t optimizer_steps = 0;  // JobContext::optimizer_steps (lr schedule)
  int64_t policy_version = 0;
  std::vector<float> ref_params;  // GRPO KL reference (empty when none)

  bool usable() const { return why_not.empty(); }
  static LiveState Missing(std::string why) {
    LiveState s;
    s.why_not = std::move(why);
    return s;
  }
};

// Copies the live state out of `old` (whose communicator the caller has
// aborted; no collective is used). Unusable (why_not set) when `old` belongs
// to another job or is disaggregated.
LiveState TakeLiveState(JobContext& old, const std::string& job_id);

// SETUP side, after the new ZeRO optimizer exists: see above. `live` may be
// null (no state taken); on success its buffers are released.
// `inflight_step`, when set, is the training step that was in flight: a rank
// may hold it instead of `step`, provided every rank holds the same one.
absl::Status LiveRestore(JobContext& ctx, int64_t step, std::optional<int64_t> inflight_step, LiveState* live,
                         tandem::v1::ReportPhaseRequest* report);

}  // namespace tandem::worker
