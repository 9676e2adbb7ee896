// MakeCudaMemory: DeviceMemory over cudaMalloc'ed memory of one CUDA device
// (the current device when it is made).
//
// Ordering: every copy and SetZero runs on the legacy default stream, the
// stream CudaOps issues its kernels on, so they are ordered with the ops
// issued from any thread. CopyToHost returns once the data is on the host;
// CopyToDevice from pageable host memory returns once the source may be
// reused. Each call first selects the device (the calling thread may be new,
// e.g. a ZeRO communication thread).
//
// Errors: a failed CUDA call records "cuda: <call>: <CUDA error string>"
// (first one kept; ok() turns false). Allocate failure returns nullptr and
// records the byte count.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "kernels/allocation_ledger.h"
#include "kernels/backends.h"
#include "kernels/memory.h"

namespace tandem::kernels {
namespace {

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {}

  const char* name() const override { return "cuda"; }

  void* Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    if (!Select("cudaMalloc")) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      ledger_.set_failure("cuda: out of memory allocating " + std::to_string(bytes) +
                          " bytes: " + cudaGetErrorString(err));
      return nullptr;
    }
    ledger_.Add(p, bytes);
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    ledger_.Remove(p);
    if (Select("cudaFree")) Check(cudaFree(p), "cudaFree");
  }

  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || !Select("cudaMemcpy")) return;
    // Synchronous copy (legacy default stream): `src` may be reused at once,
    // pinned or not.
    Check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
  }

  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || !Select("cudaMemcpy")) return;
    Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
  }

  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || !Select("cudaMemcpy")) return;
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy), "cudaMemcpy device to device");
  }

  void SetZero(void* dst, size_t bytes) override {
    if (bytes == 0 || !Select("cudaMemset")) return;
    Check(cudaMemsetAsync(dst, 0, bytes, cudaStreamLegacy), "cudaMemset");
  }

  bool Synchronize() override {
    if (Select("cudaStreamSynchronize")) {
      Check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
    }
    return ok();
  }

  bool ok() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.empty();
  }
  std::string last_error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.empty() ? ledger_.failure() : error_;
  }
  size_t allocated_bytes() const override { return ledger_.total(); }

 private:
  bool Select(const char* what) { return Check(cudaSetDevice(device_), what); }

  // Records a failure; true when err is cudaSuccess.
  bool Check(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return true;
    cudaGetLastError();
    RecordError(std::string("cuda: ") + what + ": " + cudaGetErrorString(err));
    return false;
  }

  void RecordError(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = std::move(e);
  }

  const int device_;
  AllocationLedger ledger_;
  mutable std::mutex mu_;
  std::string error_;  // sticky (ok() false)
};

}  // namespace

std::unique_ptr<DeviceMemory> MakeCudaMemory() {
  if (!CudaDeviceAvailable()) return nullptr;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaMemory>(device);
}

}  // namespace tandem::kernels
