#include "worker/engine/live_restore.h"

#include <chrono>
#include <cmath>

#include "worker/engine/job_context.h"
#include "worker/engine/peer_snapshot.h"
#include "worker/engine/phases.h"

namespace tandem::worker {

namespace {
using Clock = std::chrono::steady_clock;

size_t ShardSize(const std::vector<zero::ShardPiece>& pieces) {
  size_t n = 0;
  for (const auto& p : pieces) n += p.size;
  return n;
}

// Stages 1-3: the old partition's pieces, the survivors' own shards and the
// lost ranks' peer copies, summed into full vectors over the new
// communicator. Every rank computes the same verdict from the same sums.
absl::Status GatherOldShards(JobContext& ctx, int64_t step, const LiveState& live, std::vector<float>* params,
                             std::vector<float>* m, std::vector<float>* v, std::string* note) {
  const int w = live.old_world;
  const size_t psi = ctx.zero->num_params();
  const auto& units = ctx.zero->units();
  const bool full_params = !live.params.empty();
  // [alive by old rank | copies held of it | step of that copy]
  std::vector<double> info(3 * static_cast<size_t>(w), 0.0);
  info[live.old_rank] = 1;
  const SnapshotShard* copy = nullptr;
  if (ctx.peer != nullptr && ctx.peer->job_id() == ctx.assignment.job_id() && ctx.peer->neighbour()) {
    const SnapshotShard& n = *ctx.peer->neighbour();
    if (n.world == w && n.zero_stage == live.stage && n.rank == (live.old_rank + w - 1) % w) {
      copy = &n;
      info[w + n.rank] = 1;
      info[2 * w + n.rank] = static_cast<double>(n.step);
    }
  }
  if (absl::Status st = AllreduceSum(ctx, info); !st.ok()) return st;
  std::string problem;
  std::vector<int> lost;
  int64_t oldest_copy = step;
  for (int r = 0; r < w; ++r) {
    if (info[r] > 0.5) continue;
    lost.push_back(r);
    const std::string who = "old rank " + std::to_string(r) + "'s shard";
    if (info[w + r] < 0.5) {
      problem = who + " has no peer copy (old rank " + std::to_string((r + 1) % w) + " is lost too or holds none)";
      break;
    }
    const auto copy_step = static_cast<int64_t>(std::llround(info[2 * w + r]));
    if (copy_step > step) {
      problem =
          who + ": the peer copy is of step " + std::to_string(copy_step) + ", newer than " + std::to_string(step);
      break;
    }
    if (!full_params && copy_step != step) {
      problem = who + ": its parameters are only in a peer copy of step " + std::to_string(copy_step) + ", not " +
                std::to_string(step);
      break;
    }
    oldest_copy = std::min(oldest_copy, copy_step);
  }
  if (!problem.empty()) return absl::FailedPreconditionError("live restore: " + problem);

  params->assign(psi, 0.f);
  m->assign(psi, 0.f);
  v->assign(psi, 0.f);
  if (full_params) {
    if (ctx.rank == 0) std::copy(live.params.begin(), live.params.end(), params->begin());
  }
  for (const auto& piece : zero::ComputeShardMap(units, live.old_rank, w)) {
    const size_t dst = units[piece.unit].offset + piece.unit_offset;
    if (!full_params) std::copy_n(live.own_params.data() + piece.shard_offset, piece.size, params->data() + dst);
    std::copy_n(live.exp_avg.data() + piece.shard_offset, piece.size, m->data() + dst);
    std::copy_n(live.exp_avg_sq.data() + piece.shard_offset, piece.size, v->data() + dst);
  }
  if (copy != nullptr && info[copy->rank] < 0.5) {
    size_t pos = 0;
    for (const auto& r : copy->ranges) {
      if (!full_params) std::copy_n(copy->params.data() + pos, r.count, params->data() + r.offset);
      std::copy_n(copy->exp_avg.data() + pos, r.count, m->data() + r.offset);
      std::copy_n(copy->exp_avg_sq.data() + pos, r.count, v->data() + r.offset);
      pos += r.count;
    }
  }
  // One contributor per element: the sums are the values, bit for bit.
  if (ctx.world > 1) {
    if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
    for (std::vector<float>* buf : {params, m, v}) {
      if (absl::Status st = ctx.collective->allreduce(buf->data(), psi, comm::ReduceOp::kSum, ctx.timeout); !st.ok()) {
        return st;
      }
    }
  }
  std::string ranks;
  for (int r : lost) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  *note = ", re-partitioned from " + std::to_string(w) + " ZeRO-" + std::to_string(live.stage) +
          " shards (lost old rank(s) " + ranks + " from peer copies";
  if (oldest_copy < step) {
    *note += "; their Adam moments are of step " + std::to_string(oldest_copy) + ", " +
             std::to_string(step - oldest_copy) + " step(s) stale";
  }
  *note += ")";
  return absl::OkStatus();
}
}  // namespace

LiveState TakeLiveState(JobContext& old, const std::string& job_id) {
  if (old.assignment.job_id() != job_id) {
    return LiveState::Missing("holds no state of this job");
  }
  if (old.disagg) return LiveState::Missing("held a disaggregated context (live state needs co-located)");
  if (!old.zero) return LiveState::Missing("held no training state");
  if (old.ref_shard) {
    return LiveState::Missing("held a sharded KL reference (rl.shard_reference), which a live restore cannot reshard");
  }
  // The optimizer's communication thread must be idle before we read; its
  // error (the aborted collective) is expected and changes nothing: the
  // state is the one of the last completed step.
  (void)old.zero->Drain();
  LiveState s;
  s.stage = old.zero->stage();
  s.old_rank = old.rank;
  s.old_world = old.world;
  const size_t psi = old.zero->num_params();
  if (s.stage == 0) {
    s.params.resize(psi);
    s.exp_avg.resize(psi);
    s.exp_avg_sq.resize(psi);
    if (absl::Status st = old.zero->CopyFullState(s.params.data(), s.exp_avg.data(), s.exp_avg_sq.data()); !st.ok()) {
      return LiveState::Missing(std::string(st.message()));
    }
  } else {
    if (old.zero->step_incomplete()) {
      return LiveState::Missing(
          "stopped inside an optimizer step (its shard is updated, the parameter allgather is not)");
    }
    const size_t shard = old.zero->shard_size();
    s.exp_avg.resize(shard);
    s.exp_avg_sq.resize(shard);
    old.zero->CopyOptimizerShard(s.exp_avg.data(), s.exp_avg_sq.data());
    s.params.resize(psi);
    if (!old.zero->CopyResidentParams(s.params.data()).ok()) {
      s.params = std::vector<float>();
      s.own_params.resize(shard);
      old.zero->CopyParamShard(s.own_params.data());
    }
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
  const int stage = ctx.zero->stage();
  std::string problem;
  if (live == nullptr) {
    problem = me + " holds no live state";
  } else if (!live->usable()) {
    problem = me + " " + live->why_not;
  } else if (!live->last_trained_step) {
    problem = me + " holds no completed training step (its last one stopped between optimizer steps)";
  } else if (*live->last_trained_step != step && *live->last_trained_step != inflight_step) {
    problem = me + " holds step " + std::to_string(*live->last_trained_step) + ", not " + std::to_string(step) +
              (inflight_step ? " or " + std::to_string(*inflight_step) : "");
  } else if (live->stage != stage) {
    problem = me + " holds a ZeRO stage " + std::to_string(live->stage) + " state, the job runs stage " +
              std::to_string(stage);
  } else if (!live->ref_params.empty() && live->ref_params.size() != psi) {
    problem = me + " holds a KL reference of " + std::to_string(live->ref_params.size()) +
              " parameters, the model has " + std::to_string(psi);
  } else if (stage == 0) {
    if (live->params.size() != psi || live->exp_avg.size() != psi || live->exp_avg_sq.size() != psi) {
      problem = me + " holds a state of " + std::to_string(live->params.size()) + " parameters, the model has " +
                std::to_string(psi);
    }
  } else {
    const size_t shard = ShardSize(zero::ComputeShardMap(ctx.zero->units(), live->old_rank, live->old_world));
    if ((live->params.size() != psi && live->own_params.size() != shard) || live->exp_avg.size() != shard ||
        live->exp_avg_sq.size() != shard) {
      problem = me + " holds a shard that does not fit the model's partition for " + std::to_string(live->old_world) +
                " ranks";
    }
  }
  // Everyone agrees before anyone loads (a collective below must not leave
  // the others waiting).
  const bool holds_inflight = problem.empty() && inflight_step && *live->last_trained_step == *inflight_step;
  const double old_world = problem.empty() ? live->old_world : 0;
  std::vector<double> failures = {problem.empty() ? 0.0 : 1.0, holds_inflight ? 1.0 : 0.0, old_world,
                                  old_world * old_world};
  if (absl::Status st = AllreduceSum(ctx, failures); !st.ok()) return st;
  if (!problem.empty()) return absl::FailedPreconditionError("live restore: " + problem);
  if (failures[0] > 0) {
    return absl::FailedPreconditionError("live restore: " + std::to_string(static_cast<int>(failures[0] + 0.5)) +
                                         " rank(s) hold no live state of step " + std::to_string(step));
  }
  if (std::fabs(ctx.world * failures[3] - failures[2] * failures[2]) > 0.5) {
    return absl::FailedPreconditionError("live restore: the ranks held partitions of different world sizes");
  }
  const int at_inflight = static_cast<int>(failures[1] + 0.5);
  if (at_inflight != 0 && at_inflight != ctx.world) {
    return absl::FailedPreconditionError(
        "live restore: " + std::to_string(at_inflight) + " of " + std::to_string(ctx.world) +
        " rank(s) finished step " + std::to_string(*inflight_step) + ", the others hold step " + std::to_string(step));
  }
  if (at_inflight == ctx.world) step = *inflight_step;
  // The full vectors: held by every rank at stage 0; re-assembled from the
  // old shards at stages 1-3.
  std::string note;
  if (stage != 0) {
    std::vector<float> params, m, v;
    if (absl::Status st = GatherOldShards(ctx, step, *live, &params, &m, &v, &note); !st.ok()) return st;
    live->params = std::move(params);
    live->exp_avg = std::move(m);
    live->exp_avg_sq = std::move(v);
    live->own_params = std::vector<float>();
  }
  // Every rank loads its pieces of the new partition from the full vectors
  // (identical on every rank); the allgathers rebuild what its stage keeps
  // in full.
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
  auto* setup = report->mutable_setup();
  setup->set_restored(true);
  setup->set_restored_step(step);
  setup->set_restore_source(tandem::v1::RESTORE_SOURCE_LIVE);
  setup->set_restore_seconds(secs);
  const auto& a = ctx.assignment;
  std::string shares;
  if (a.logical_world_size() > 0) {
    shares = ", computing shares [" + std::to_string(a.logical_rank_begin()) + ", " +
             std::to_string(a.logical_rank_end()) + ") of " + std::to_string(a.logical_world_size()) + " (own " +
             std::to_string(a.own_logical_rank()) + ")";
  }
  report->add_log_lines("kept the live state of step " + std::to_string(step) + " (degraded continuation, " +
                        std::to_string(ctx.world) + " ranks" + shares + note + ") in " + std::to_string(secs) + " s");
  return absl::OkStatus();
}

}  // namespace tandem::worker
