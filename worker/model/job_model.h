// Where a job enters (tandemctl validate, SubmitJob, tandemctl run --local),
// the checks a worker applies before running it, so a job that passes
// validation is one every worker accepts:
// - the inline model.config converted to the worker's ModelConfig and
//   validated with the worker's own limits (model::Validate).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/job.pb.h"
#include "worker/model/config.h"

namespace tandem::model {

// spec.model.config (Hugging Face field names) -> ModelConfig, validated;
// errors name the job-file key (model.config.*).
absl::StatusOr<ModelConfig> ModelConfigFromJob(const tandem::v1::ModelConfig& config);

// Every worker-side check that needs nothing but the spec.
absl::Status CheckJobForWorkers(const tandem::v1::JobSpec& spec);

}  // namespace tandem::model
