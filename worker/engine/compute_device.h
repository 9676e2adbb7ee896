// ComputeDevice: the backend a worker computes on for one job - its op
// instances, the memory its buffers live in and the collective backend that
// reaches that memory.
//
//   "cpu"          fast CPU ops, host memory, Gloo
//   "cuda"         CUDA ops (cuBLAS), cudaMalloc'ed memory, NCCL; needs a
//                  build with CUDA and a visible GPU
//   "cpu-guarded"  a debugging device: the CPU ops over GuardedMemory
//                  (kernels/guarded/), whose device addresses fault on any
//                  host access, and Gloo through a translating wrapper. It
//                  runs the same buffer discipline as "cuda" on a machine
//                  without a GPU; results equal "cpu" bit for bit.
//
// Destroy the model, rollout engine and ZeRO state before the ComputeDevice
// whose memory they hold (JobContext declares it first).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"

namespace tandem::kernels {
class GuardedMemory;
}

namespace tandem::worker {

struct ComputeDevice {
  std::string name;  // cpu | cuda | cpu-guarded
  std::unique_ptr<kernels::DeviceMemory> memory;
  kernels::GuardedMemory* guarded = nullptr;  // == memory for cpu-guarded
  std::unique_ptr<kernels::Ops> ops;          // the job thread's
  std::unique_ptr<kernels::Ops> comm_ops;     // ZeRO's communication thread's
  // The memory rollout.kv_cache_fraction is of: the GPU's total (cuda),
  // physical memory (cpu), the guarded space (cpu-guarded).
  size_t capacity_bytes = 0;
  bool host_memory() const { return name == "cpu"; }
};

// `device`: a name above ("" = cpu). `threads`: CPU compute threads (0 =
// all cores). FailedPrecondition when the device cannot be used here (no
// CUDA in this build, no GPU visible), InvalidArgument for an unknown name.
absl::StatusOr<std::unique_ptr<ComputeDevice>> MakeComputeDevice(std::string_view device, int threads);

// The job's communicator for `device`: Gloo for cpu, Gloo behind the
// translating wrapper for cpu-guarded, NCCL for cuda.
absl::StatusOr<std::unique_ptr<comm::Collective>> MakeDeviceCollective(ComputeDevice& device, comm::Store& store,
                                                                       int rank, int world,
                                                                       const comm::CollectiveOptions& options);

}  // namespace tandem::worker
