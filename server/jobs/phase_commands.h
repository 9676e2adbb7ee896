// Phase commands: what the coordinator sends each rank for the phase in
// flight. Command ids are deterministic ("<job>/g<generation>/u<unit>/p<sub>",
// "/x<phase><step>" for an unplanned phase), so a phase re-issued after a
// coordinator restart or a re-attach carries the same id and a worker that
// already ran it answers from its cached report. SETUP carries each rank's
// Assignment: spec, rank and world, rendezvous scope (from the Job), restore
// source and degraded shares (from the driver's DriverState). Pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "server/jobs/phase_plan.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/driver_state.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

// The phase command at `cursor` (or the unplanned `phase` when `unplanned`).
tandem::v1::PhaseCommand MakePhaseCommand(const tandem::v1::Job& job, PhaseCursor cursor, const PlannedPhase& phase,
                                          bool unplanned, int64_t deadline_ms);

// The command for `rank`: `inflight`, plus the Assignment for SETUP.
// `rank_nodes` (the node of each rank, when known) becomes the SETUP
// assignment's topology.
tandem::v1::WorkerCommand CommandForRank(const tandem::v1::Job& job, const tandem::v1::DriverState& state,
                                         const tandem::v1::PhaseCommand& inflight, int rank,
                                         const std::string& runs_dir, const std::vector<std::string>& rank_nodes = {});

}  // namespace tandem::server
