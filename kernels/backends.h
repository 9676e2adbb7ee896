// Factories for the op backends. See kernels/ops.h for the contract.
#pragma once

#include <memory>

#include "kernels/memory.h"
#include "kernels/ops.h"

namespace tandem::kernels {

// Plain loops with double accumulators: slow, obviously correct. The
// yardstick every other backend is tested against.
std::unique_ptr<Ops> MakeReferenceOps();

// Fast CPU backend: OpenBLAS GEMM, OpenMP over rows/heads, SIMD-friendly
// loops, no allocation in steady state. `num_threads` <= 0 means all cores.
// OpenBLAS and OpenMP are both limited to num_threads (never oversubscribed).
std::unique_ptr<Ops> MakeCpuOps(int num_threads = 0);

// Sets the thread count used by OpenMP regions and OpenBLAS in this process.
void SetCpuThreads(int num_threads);
int CpuThreads();

#if defined(TANDEM_HAVE_CUDA)
// CUDA backend (cuBLAS for GEMM). Pointers passed to it are device pointers.
// Returns nullptr when no CUDA device is present.
std::unique_ptr<Ops> MakeCudaOps();
bool CudaDeviceAvailable();
// DeviceMemory over cudaMalloc of the current CUDA device (kernels/memory.h;
// copies on the legacy default stream, where CudaOps runs). Returns nullptr
// when no CUDA device is present.
std::unique_ptr<DeviceMemory> MakeCudaMemory();
#endif

}  // namespace tandem::kernels
