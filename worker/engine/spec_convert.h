// Conversions from the job contract (tandem.v1 protos) to the engine's
// plain-C++ option structs. Pure functions; errors name the job-file key.
#pragma once

#include "absl/status/statusor.h"
#include "tandem/v1/job.pb.h"
#include "worker/model/config.h"
#include "worker/rl/tasks.h"

namespace tandem::worker {

// spec.task -> rl::TaskOptions (validated later by rl::MakeTask).
rl::TaskOptions ToTaskOptions(const tandem::v1::TaskSpec& task);

// Stream keys that separate the random draws of the job's parts, so SFT
// data, RL prompts, sampling and evaluation never share draws.
uint64_t DeriveSeed(uint64_t seed, uint64_t stream, uint64_t index = 0);
enum SeedStream : uint64_t {
  kSeedInit = 1,
  kSeedSftData = 2,
  kSeedRlPrompts = 3,
  kSeedSampling = 4,
  kSeedEval = 5,
  kSeedWeightQuantization = 6,
};

}  // namespace tandem::worker
