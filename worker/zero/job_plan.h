// The cost model's input (cost_model.h) for a job spec on ranks placed on
// nodes: the model's units from its config (inline, or model.from's
// config.json), the ZeRO stage and options, and the micro-batches per rank
// of an SFT step. Used by tandemctl plan and its tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/job.pb.h"
#include "worker/zero/cost_model.h"

namespace tandem::zero {

// InvalidArgument when rank_nodes does not hold cluster.workers entries or
// the job uses what the model leaves out (train.trainable,
// cluster.sequence_parallel > 1); NotFound when the model's config cannot
// be read here.
absl::StatusOr<PlanInput> PlanInputForJob(const tandem::v1::JobSpec& spec, std::vector<std::string> rank_nodes);

}  // namespace tandem::zero
