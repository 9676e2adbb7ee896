// The rollout engine's options from a job spec: rl.* (max_new_tokens,
// temperature, top_p, top_k) and rollout.* (KV cache, batching, min_p,
// repetition penalty), with the defaults of zero values. Stop ids are the
// caller's. The job file's ranges are checked by common/job_spec.cc; what is
// left here is resolved, not rejected.
//
// memory_bytes: the memory rollout.kv_cache_fraction is a fraction of (the
// device's total on CUDA, physical memory on CPU); the budget is at least
// one byte when the fraction is set, so a tiny budget fails with the
// engine's error naming the key instead of meaning "no budget".
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/v1/job.pb.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout {

RolloutOptions OptionsFromSpec(const tandem::v1::JobSpec& spec, uint64_t seed, size_t memory_bytes);

}  // namespace tandem::rollout
