// The phases a worker executes for its job. Each fills `report` (metrics on
// rank 0 carry the job-global figures: every rank computes them through
// collectives, rank 0's report is the one the coordinator keeps).
#pragma once

#include <span>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"
#include "worker/engine/engine.h"
#include "worker/engine/job_context.h"

namespace tandem::worker {

using tandem::v1::ReportPhaseRequest;

struct LiveState;  // live_restore.h

// `live`: the previous generation's state when assignment.live_restore
// (null otherwise, or when the engine held none).
absl::Status SetupJob(const EngineOptions& options, const tandem::v1::Assignment& assignment, JobContext& ctx,
                      ReportPhaseRequest* report, LiveState* live = nullptr);
absl::Status SftStep(JobContext& ctx, int64_t step, ReportPhaseRequest* report);
absl::Status Evaluate(JobContext& ctx, int64_t step, ReportPhaseRequest* report);
absl::Status Rollout(JobContext& ctx, int64_t step, ReportPhaseRequest* report);
absl::Status Score(JobContext& ctx, int64_t step, ReportPhaseRequest* report);
absl::Status Logprobs(JobContext& ctx, int64_t step, ReportPhaseRequest* report);
absl::Status Update(JobContext& ctx, int64_t step, ReportPhaseRequest* report);
absl::Status ExportModel(JobContext& ctx, ReportPhaseRequest* report);
absl::Status Checkpoint(JobContext& ctx, int64_t step, ReportPhaseRequest* report);

// Loads a checkpoint (a step directory, or a root whose newest valid
// checkpoint is used) into the ZeRO state; says in the report what it did.
// own_checkpoint: one of this job's (recovery): it must lie at the job's
// path of its manifest's step and match the model's config hash.
absl::Status RestoreCheckpoint(JobContext& ctx, const std::string& path, bool own_checkpoint,
                               ReportPhaseRequest* report);
// Waits for background checkpoint writes; moves published paths into report.
absl::Status FinishCheckpoints(JobContext& ctx, ReportPhaseRequest* report, bool wait);

// Largest `value` over all ranks (small integers).
absl::StatusOr<int64_t> MaxOverRanks(JobContext& ctx, int64_t value);

// Puts this rank's bytes sent per collective kind since the previous call
// into m->extra["bytes_sent_<kind>"] (kinds it used) and resets the counts.
// Called once per training step (the coordinator sums them over ranks).
void ReportCollectiveBytes(JobContext& ctx, tandem::v1::StepMetrics* m);

// ZenFlow (train.zenflow): at the job's last training step, waits for and
// applies the host update in flight (collective: every rank calls), so the
// final evaluation and export see complete parameters; then puts the host
// update seconds since the start (zenflow_host_update_s, of which
// zenflow_host_hidden_s overlapped device work and zenflow_host_wait_s was
// waited for), the host update count and the important fraction into
// m->extra. No-op without ZenFlow.
absl::Status FinishZenFlowStep(JobContext& ctx, int64_t step, tandem::v1::StepMetrics* m);

// Sums `values` over all ranks in place (no-op for one rank).
absl::Status AllreduceSum(JobContext& ctx, std::vector<double>& values);

// The response text a reward sees: built-in tasks decode up to the char
// tokenizer's eos; text data decodes up to the first stop id with special
// tokens skipped and cuts before the first rl.stop string.
rl::CompletionText DecodeResponse(const JobContext& ctx, std::span<const int32_t> ids);

}  // namespace tandem::worker
