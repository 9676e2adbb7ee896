// Where a job enters (tandemctl validate, SubmitJob, tandemctl run --local),
// the checks a worker applies before running it, so a job that passes
// validation is one every worker accepts:
// - the inline model.config converted to the worker's ModelConfig and
//   validated with the worker's own limits (model::Validate);
// - an estimate of the memory one worker needs for the job, which the
//   coordinator compares with what its workers report.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include <cstdint>
#include <string>
#include "tandem/v1/job.pb.h"
#include "worker/model/config.h"

namespace tandem::model {

// spec.model.config (Hugging Face field names) -> ModelConfig, validated by
// the model's own rules (model::Validate): the one check of a job's inline
// model config, called by common::ValidateJobSpec (coordinator, tandemctl)
// and by the worker's SETUP. Errors name the job-file key
// ("model.config.num_key_value_heads: 3 must divide ...").
absl::StatusOr<ModelConfig> ModelConfigFromJob(const tandem::v1::ModelConfig& config);

// Every worker-side check that needs nothing but the spec.
absl::Status CheckJobForWorkers(const tandem::v1::JobSpec& spec);

// Bytes one worker (rank) holds for the job, by part. An estimate from the
// shapes (ZeRO stage, batch, sequence, rollout sizes), meant to catch jobs
// that cannot fit, not to plan to the byte. Sums saturate at INT64_MAX.
struct MemoryEstimate {
  int64_t params = 0;  // fp32 masters (and a bf16 compute copy)
  int64_t gradients = 0;
  int64_t optimizer = 0;    // Adam moments
  int64_t reference = 0;    // frozen reference policy (KL)
  int64_t activations = 0;  // kept for backward, one micro-batch
  int64_t logits = 0;       // logits and their gradient, one micro-batch
  int64_t kv_cache = 0;     // rollout generation
  int64_t rope = 0;         // rotary tables
  int64_t total = 0;
  std::string Describe() const;  // "34.2 GiB (params 1.0 GiB, ...)"
};
MemoryEstimate EstimateJobMemory(const tandem::v1::JobSpec& spec, const ModelConfig& config);
// The job's model config: inline, or read from model.from/config.json when
// that directory is readable here (NotFound otherwise).
absl::StatusOr<ModelConfig> JobModelConfig(const tandem::v1::JobSpec& spec);

}  // namespace tandem::model
