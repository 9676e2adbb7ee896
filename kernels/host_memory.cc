// MakeHostMemory: DeviceMemory over plain host memory (CPU backends).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kernels/memory.h"

namespace tandem::kernels {
namespace {

constexpr size_t kAlign = 256;

class HostMemory final : public DeviceMemory {
 public:
  const char* name() const override { return "host"; }

  void* Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      // Not sticky: the caller sees nullptr and may free memory and retry.
      std::lock_guard<std::mutex> lock(mu_);
      error_ = "host: out of memory allocating " + std::to_string(bytes) + " bytes";
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
    allocated_ += bytes;
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        allocated_ -= it->second;
        sizes_.erase(it);
      }
    }
    std::free(p);
  }

  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void SetZero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }

  // Host copies cannot fail.
  bool Synchronize() override { return true; }
  bool ok() const override { return true; }
  std::string last_error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  size_t allocated_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  size_t allocated_ = 0;
  std::string error_;  // the last failed Allocate
};

}  // namespace

std::unique_ptr<DeviceMemory> MakeHostMemory() {
  return std::make_unique<HostMemory>();
}

}  // namespace tandem::kernels
