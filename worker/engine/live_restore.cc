#include "worker/engine/live_restore.h"

#include <chrono>

#include "worker/engine/job_context.h"
#include "worker/engine/phases.h"

namespace tandem::worker {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

LiveState TakeLiveState(JobContext& old, const std::string& job_id) {
  if (old.assignment.job_id() != job_id) {
    return LiveState::Missing("holds no state of this job");
  }
  if (old.disagg) return LiveState::Missing("held a disaggregated context (live state needs co-located)");
  if (!old.zero || old.zero->stage() != 0) {
    return LiveState::Missing("held no ZeRO stage 0 state (live state needs every rank to hold all of it)");
  }
  // The optimizer's communication thread must be idle before we read; its
  // error (the aborted collective) is expected and changes nothing at stage 0.
  (void)old.zero->Drain();
  LiveState s;
  const size_t psi = old.zero->num_params();
  s.params.resize(psi);
  s.exp_avg.resize(psi);
  s.exp_avg_sq.resize(psi);
  if (absl::Status st = old.zero->CopyFullState(s.params.data(), s.exp_avg.data(), s.exp_avg_sq.data());
      !st.ok()) {
    return LiveState::Missing(std::string(st.message()));
  }
  s.last_trained_step = old.last_trained_step;
  s.zero_steps = old.zero->step_count();
  s.optimizer_steps = old.optimizer_steps;
  s.policy_version = old.policy_version;
  s.ref_params = std::move(old.ref_params);
  return s;
}

absl::Status LiveRestore(JobContext& ctx, int64_t step, std::optional<int64_t> inflight_step, LiveState* live,
                         tandem::v1::ReportPhaseRequest* report) {
  const auto t0 = Clock::now();
  const std::string me = "rank " + std::to_string(ctx.rank);
  const size_t psi = ctx.zero->num_params();
  std::string problem;
  if (ctx.zero->stage() != 0) {
    problem = "needs cluster.zero_stage: 0";
  } else if (live == nullptr) {
    problem = me + " holds no live state";
  } else if (!live->usable()) {
    problem = me + " " + live->why_not;
  } else if (!live->last_trained_step) {
    problem = me + " holds no completed training step (its last one stopped between optimizer steps)";
  } else if (*live->last_trained_step != step && *live->last_trained_step != inflight_step) {
    problem = me + " holds step " + std::to_string(*live->last_trained_step) + ", not " + std::to_string(step) +
              (inflight_step ? " or " + std::to_string(*inflight_step) : "");
  } else if (live->params.size() != psi || live->exp_avg.size() != psi || live->exp_avg_sq.size() != psi ||
             (!live->ref_params.empty() && live->ref_params.size() != psi)) {
    problem = me + " holds a state of " + std::to_string(live->params.size()) + " parameters, the model has " +
              std::to_string(psi);
  }
  // Everyone agrees before anyone loads (a collective below must not leave
  // the others waiting).
  const bool holds_inflight = problem.empty() && inflight_step && *live->last_trained_step == *inflight_step;
  std::vector<double> failures = {problem.empty() ? 0.0 : 1.0, holds_inflight ? 1.0 : 0.0};
  if (absl::Status st = AllreduceSum(ctx, failures); !st.ok()) return st;
  if (!problem.empty()) return absl::FailedPreconditionError("live restore: " + problem);
  if (failures[0] > 0) {
    return absl::FailedPreconditionError("live restore: " + std::to_string(static_cast<int>(failures[0] + 0.5)) +
                                         " rank(s) hold no live state of step " + std::to_string(step));
  }
  const int at_inflight = static_cast<int>(failures[1] + 0.5);
  if (at_inflight != 0 && at_inflight != ctx.world) {
    return absl::FailedPreconditionError("live restore: " + std::to_string(at_inflight) + " of " +
                                         std::to_string(ctx.world) + " rank(s) finished step " +
                                         std::to_string(*inflight_step) + ", the others hold step " +
                                         std::to_string(step));
  }
  if (at_inflight == ctx.world) step = *inflight_step;
  // Every rank loads its pieces of the full vectors it holds (parameters and
  // moments); the allgathers rebuild the full replicas, identical on every
  // rank (the survivors' replicas were identical already).
  const size_t shard = ctx.zero->shard_size();
  std::vector<float> p(shard), m(shard), v(shard);
  const auto& units = ctx.zero->units();
  for (const auto& piece : ctx.zero->shard_map()) {
    const size_t src = units[piece.unit].offset + piece.unit_offset;
    std::copy_n(live->params.data() + src, piece.size, p.data() + piece.shard_offset);
    std::copy_n(live->exp_avg.data() + src, piece.size, m.data() + piece.shard_offset);
    std::copy_n(live->exp_avg_sq.data() + src, piece.size, v.data() + piece.shard_offset);
  }
  ctx.zero->LoadParamShard(p.data());
  if (absl::Status st = ctx.zero->AllgatherParams(); !st.ok()) return st;
  ctx.zero->LoadOptimizerShard(m.data(), v.data());
  if (absl::Status st = ctx.zero->AllgatherOptimizerState(); !st.ok()) return st;
  ctx.zero->set_step_count(live->zero_steps);
  ctx.optimizer_steps = live->optimizer_steps;
  ctx.policy_version = live->policy_version;
  ctx.ref_params = std::move(live->ref_params);
  ctx.ref_device.reset();
  ctx.last_trained_step = step;
  *live = LiveState::Missing("already restored");  // frees the copies
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  (*report->mutable_values())["restored_step"] = static_cast<double>(step);
  (*report->mutable_values())["restore_source"] = 3;  // live
  (*report->mutable_values())["restore_seconds"] = secs;
  const auto& a = ctx.assignment;
  std::string shares;
  if (a.logical_world_size() > 0) {
    shares = ", computing shares [" + std::to_string(a.logical_rank_begin()) + ", " +
             std::to_string(a.logical_rank_end()) + ") of " + std::to_string(a.logical_world_size()) +
             " (own " + std::to_string(a.own_logical_rank()) + ")";
  }
  report->add_log_lines("kept the live state of step " + std::to_string(step) + " (degraded continuation, " +
                        std::to_string(ctx.world) + " ranks" + shares + ") in " + std::to_string(secs) + " s");
  return absl::OkStatus();
}

}  // namespace tandem::worker
