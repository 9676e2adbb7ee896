#include "worker/engine/compute_device.h"

#include <unistd.h>

#if defined(TANDEM_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "kernels/backends.h"
#include "kernels/guarded/guarded_memory.h"
#include "worker/comm/guarded_collective.h"

namespace tandem::worker {
namespace {

size_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeDevice>> MakeComputeDevice(std::string_view device, int threads) {
  auto d = std::make_unique<ComputeDevice>();
  d->name = device.empty() ? "cpu" : std::string(device);
  if (d->name == "cpu") {
    d->memory = kernels::MakeHostMemory();
    d->ops = kernels::MakeCpuOps(threads);
    d->comm_ops = kernels::MakeCpuOps(threads);
    d->capacity_bytes = PhysicalMemoryBytes();
    return d;
  }
  if (d->name == "cpu-guarded") {
    // Address space only (MAP_NORESERVE); a host with strict overcommit
    // may refuse the default 16 GiB, so step down before giving up.
    std::unique_ptr<kernels::GuardedMemory> guarded;
    for (size_t gib : {16, 4, 1}) {
      guarded = kernels::MakeGuardedMemory(gib << 30);
      if (guarded->capacity() > 0) break;
    }
    if (guarded->capacity() == 0) {
      return absl::ResourceExhaustedError("device cpu-guarded: " + guarded->last_error());
    }
    d->guarded = guarded.get();
    d->capacity_bytes = guarded->capacity();
    d->memory = std::move(guarded);
    d->ops = kernels::MakeGuardedOps(kernels::MakeCpuOps(threads), d->guarded);
    d->comm_ops = kernels::MakeGuardedOps(kernels::MakeCpuOps(threads), d->guarded);
    return d;
  }
  if (d->name == "cuda") {
#if defined(TANDEM_HAVE_CUDA)
    if (!kernels::CudaDeviceAvailable()) {
      return absl::FailedPreconditionError(
          "device cuda: no CUDA device is visible to this worker (check CUDA_VISIBLE_DEVICES and "
          "nvidia-smi)");
    }
    d->memory = kernels::MakeCudaMemory();
    d->ops = kernels::MakeCudaOps();
    d->comm_ops = kernels::MakeCudaOps();
    if (d->memory == nullptr || d->ops == nullptr || d->comm_ops == nullptr) {
      return absl::FailedPreconditionError("device cuda: could not initialise the CUDA backend");
    }
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      return absl::FailedPreconditionError("device cuda: cudaMemGetInfo failed");
    }
    d->capacity_bytes = total_bytes;
    return d;
#else
    return absl::FailedPreconditionError(
        "device cuda: this worker was built without CUDA (configure with nvcc on the PATH or at "
        "/usr/local/cuda/bin/nvcc); use device: cpu");
#endif
  }
  return absl::InvalidArgumentError("device: expected cpu, cuda or cpu-guarded, got '" + d->name + "'");
}

absl::StatusOr<std::unique_ptr<comm::Collective>> MakeDeviceCollective(ComputeDevice& device, comm::Store& store,
                                                                       int rank, int world,
                                                                       const comm::CollectiveOptions& options) {
  if (device.name == "cuda") return comm::MakeCollective("nccl", store, rank, world, options);
  auto gloo = comm::MakeCollective("gloo", store, rank, world, options);
  if (!gloo.ok() || device.guarded == nullptr) return gloo;
  return comm::MakeGuardedCollective(std::move(*gloo), device.guarded);
}

}  // namespace tandem::worker
