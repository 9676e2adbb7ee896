// Internal to worker/zero: the optimizer's per-unit temporaries, shared by
// its source files (zero_optimizer.cc, zero_grads.cc, zero_step.cc,
// zero_checkpoint.cc).
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/memory.h"
#include "worker/zero/comm_worker.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {

// InvalidArgument when options.trainable is not a table of sorted, disjoint,
// non-empty ranges inside the units (or frozen elements meet int4).
absl::Status CheckTrainable(const ZeroOptions& options);
// InvalidArgument when options.partition_weights is not one positive weight
// per rank, or meets hpZ, qwZ or int4 gradients.
absl::Status CheckPartitionWeights(const ZeroOptions& options);

inline constexpr size_t kMaxGatherBuffers = 4;  // stage 3: current, prefetched, unit 0
inline constexpr size_t kMaxGradBuffers = 3;    // stage 2/3: unit 0, current, in flight

struct ZeroOptimizer::Gather {
  int unit = 0;
  float* buf = nullptr;     // what the model reads (fp32, device)
  float* packed = nullptr;  // bf16 stage 3: the packed bf16 allgather target
  std::shared_ptr<CommWorker::Task> task;
  int refs = 0;
};

struct ZeroOptimizer::GradBuf {
  kernels::DeviceArray<float> mem;
  int refs = 0;  // open AcquireGrads on it
  bool open = false;
  std::shared_ptr<CommWorker::Task> task;  // reduce-scatter in flight
};

}  // namespace tandem::zero
