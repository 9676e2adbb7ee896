// The rollout engine's options from a job spec: rl.* (max_new_tokens,
// temperature, top_p, top_k, stop ids) and rollout.* (KV cache, batching,
// min_p, repetition penalty), with the defaults of zero values. The job
// file's ranges are checked by common/job_spec.cc; what is left here is
// resolved, not rejected.
#pragma once

#include <cstdint>

#include "tandem/v1/job.pb.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout {

RolloutOptions OptionsFromSpec(const tandem::v1::JobSpec& spec, uint64_t seed);

}  // namespace tandem::rollout
