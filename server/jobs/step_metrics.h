// Step metrics: how the coordinator folds the phases' reports of one step
// into the StepMetrics that "step" events and Job.latest carry, and the
// one-line summary users see. Pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "tandem/v1/job.pb.h"

namespace tandem::server {

// Folds one phase's metrics into the step's: non-zero figures replace,
// switch_seconds add up, peak memory is the maximum, extra entries replace,
// and phase_seconds keep the first value of a name (the coordinator's own
// timing of a phase is recorded before the engine's finer breakdown).
void MergeMetrics(tandem::v1::StepMetrics* acc, const tandem::v1::StepMetrics& m);

// "step 3/10 loss 0.1234 reward 0.5000 ..." (zero figures left out).
std::string StepSummary(const tandem::v1::StepMetrics& m, int64_t total_steps);

// Adds one rank's per-tier collective bytes ("tier_sent_*" extras) into the
// job-wide sums "job_tier_sent_*" of `acc` (every rank's report, every phase
// of the step).
void AddTierBytes(tandem::v1::StepMetrics* acc, const tandem::v1::StepMetrics& rank_metrics);

// A warm-start step's report that the model reached init.sft.stop_accuracy
// (every rank computes the same allreduced probe).
bool WarmStartHeld(const tandem::v1::StepMetrics& m);

// The warm start's teacher-forced exact-match probe ("0.750"; "?" if absent).
std::string TeacherForcedExact(const tandem::v1::StepMetrics& m);

}  // namespace tandem::server
