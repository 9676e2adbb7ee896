#include "server/jobs/phase_commands.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/rank_topology.h"
#include "server/store/kv_store.h"

namespace tandem::server {

tandem::v1::PhaseCommand MakePhaseCommand(const tandem::v1::Job& job, PhaseCursor cursor, const PlannedPhase& phase,
                                          bool unplanned, int64_t deadline_ms) {
  tandem::v1::PhaseCommand cmd;
  cmd.set_command_id(unplanned ? absl::StrCat(job.id(), "/g", job.generation(), "/u", cursor.unit, "/x",
                                              PhaseName(phase.phase), phase.step)
                               : absl::StrCat(job.id(), "/g", job.generation(), "/u", cursor.unit, "/p", cursor.sub));
  cmd.set_job_id(job.id());
  cmd.set_generation(job.generation());
  cmd.set_phase(phase.phase);
  cmd.set_step(phase.step);
  cmd.set_deadline_ms(deadline_ms);
  return cmd;
}

tandem::v1::WorkerCommand CommandForRank(const tandem::v1::Job& job, const tandem::v1::DriverState& state,
                                         const tandem::v1::PhaseCommand& inflight, int rank,
                                         const std::string& runs_dir, const std::vector<std::string>& rank_nodes) {
  tandem::v1::WorkerCommand command;
  auto* cmd = command.mutable_phase();
  *cmd = inflight;
  if (cmd->phase() == tandem::v1::PHASE_SETUP) {
    const auto& spec = job.spec();
    auto* a = cmd->mutable_assignment();
    a->set_job_id(job.id());
    *a->mutable_spec() = spec;
    a->set_rank(rank);
    a->set_world_size(job.worker_ids_size());
    a->set_generation(job.generation());
    a->set_store_prefix(KvStore::ScopeName(job.id(), job.generation()));
    if (spec.placement().mode() == "disaggregated") {
      a->set_role(rank < spec.placement().train_workers() ? "train" : "rollout");
    }
    const auto& rec = job.recovery();
    a->set_restore_from(!state.restore_from().empty() ? state.restore_from() : spec.resume_from());
    if (state.peer_restore_step() > 0) {
      a->set_peer_restore_step(state.peer_restore_step());
      for (int pr : state.peer_restore_ranks()) a->add_peer_restore_ranks(pr);
    }
    if (state.live_restore() && state.has_last_trained()) {
      a->set_live_restore(true);
      a->set_live_restore_step(state.last_trained_step());
      if (state.has_inflight_trained()) {
        a->set_live_restore_allow_inflight(true);
        a->set_live_restore_inflight_step(state.inflight_trained_step());
      }
    }
    const int logical_world = rec.degraded_logical_world();
    if (logical_world > 0 && state.logical_begin_size() == job.worker_ids_size() &&
        state.logical_own_size() == job.worker_ids_size()) {
      a->set_logical_world_size(logical_world);
      a->set_logical_rank_begin(state.logical_begin(rank));
      a->set_logical_rank_end(rank + 1 < state.logical_begin_size() ? state.logical_begin(rank + 1) : logical_world);
      a->set_own_logical_rank(state.logical_own(rank));
    }
    if (static_cast<int>(rank_nodes.size()) == job.worker_ids_size()) {
      common::FillRankTopology(rank_nodes, rank, a->mutable_topology());
    }
    std::error_code ec;
    a->set_run_dir((std::filesystem::absolute(runs_dir, ec) / job.id()).string());
  }
  return command;
}

}  // namespace tandem::server
