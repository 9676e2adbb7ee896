// Live restore (degraded continuation, issue 6 / MeCeFO): when a worker of a
// job with recovery.degraded is lost, the survivors are set up again under
// the next generation with Assignment.live_restore = true and
// live_restore_step = S (the last training phase every rank completed). They
// keep the state they hold in memory instead of restoring from peers or
// disk: the engine takes the live state out of the previous generation's
// JobContext (TakeLiveState, before it is destroyed) and SETUP loads it
// into the new one (LiveRestore).
//
// Only a ZeRO stage 0, co-located context of the same job has a live state
// (every rank holds the full parameters and moments). Every rank agrees
// before anyone loads (an allreduce of failures over the new communicator):
// if any rank holds no live state, or one of another step than S, every
// rank fails SETUP with "live restore: ..." and the coordinator falls back
// to a normal recovery. A rank that finished the training step in flight
// before the failure holds that step (live_restore_inflight_step) instead;
// that is fine when every rank does. Report values on success: restored_step = S (or the in-flight step),
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
  std::vector<float> params, exp_avg, exp_avg_sq;  // full, in the model's flat layout
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
// to another job, is not ZeRO stage 0 or is disaggregated.
LiveState TakeLiveState(JobContext& old, const std::string& job_id);

// SETUP side, after the new ZeRO optimizer exists: see above. `live` may be
// null (no state taken); on success its buffers are released.
// `inflight_step`, when set, is the training step that was in flight: a rank
// may hold it instead of `step`, provided every rank holds the same one.
absl::Status LiveRestore(JobContext& ctx, int64_t step, std::optional<int64_t> inflight_step, LiveState* live,
                         tandem::v1::ReportPhaseRequest* report);

}  // namespace tandem::worker
