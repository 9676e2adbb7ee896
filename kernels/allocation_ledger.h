// AllocationLedger: the bytes behind each live allocation of a DeviceMemory
// (for allocated_bytes()) and the message of the last failed Allocate (not
// sticky). Thread-safe; shared by the host and CUDA memories.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace tandem::kernels {

class AllocationLedger {
 public:
  void Add(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
    total_ += bytes;
  }
  void Remove(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    total_ -= it->second;
    sizes_.erase(it);
  }
  size_t total() const {
    std::lock_guard<std::mutex> lock(mu_);
    return total_;
  }
  void set_failure(std::string message) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = std::move(message);
  }
  std::string failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  size_t total_ = 0;
  std::string failure_;
};

}  // namespace tandem::kernels
