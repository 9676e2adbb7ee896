// GuardedMemory: see guarded_memory.h.
#include "kernels/guarded/guarded_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace tandem::kernels {
namespace {

constexpr size_t kAlign = 256;

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

GuardedMemory::GuardedMemory(size_t capacity_bytes) : capacity_(RoundUp(capacity_bytes, size_t{1} << 21)) {
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* dev = mmap(nullptr, capacity_, PROT_NONE, kFlags, -1, 0);
  void* real = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, kFlags, -1, 0);
  if (dev == MAP_FAILED || real == MAP_FAILED) {
    error_ = "guarded: cannot reserve " + std::to_string(capacity_) + " bytes: " + std::strerror(errno);
    if (dev != MAP_FAILED) munmap(dev, capacity_);
    if (real != MAP_FAILED) munmap(real, capacity_);
    capacity_ = 0;
    return;
  }
  device_ = static_cast<char*>(dev);
  real_ = static_cast<char*>(real);
  free_[0] = capacity_;
}

GuardedMemory::~GuardedMemory() {
  if (device_ != nullptr) munmap(device_, capacity_);
  if (real_ != nullptr) munmap(real_, capacity_);
}

void* GuardedMemory::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t need = RoundUp(bytes, kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t off = it->first;
    const size_t len = it->second;
    free_.erase(it);
    if (len > need) free_[off + need] = len - need;
    live_[off] = Span{bytes, need};
    allocated_ += bytes;
    return device_ + off;
  }
  // Not sticky: the caller sees nullptr and may free memory and retry.
  alloc_error_ = "guarded: out of memory allocating " + std::to_string(bytes) + " bytes (capacity " +
                 std::to_string(capacity_) + ", allocated " + std::to_string(allocated_) + ")";
  return nullptr;
}

void GuardedMemory::Free(void* p) {
  if (p == nullptr) return;
  if (!Contains(p)) Die("Free", p, "is not a device pointer");
  const size_t off = static_cast<size_t>(static_cast<char*>(p) - device_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(off);
  if (it == live_.end()) {
    Die("Free", p, "is not a live allocation (double free?)");
  }
  const size_t len = it->second.reserved;
  allocated_ -= it->second.bytes;
  live_.erase(it);
  // Insert [off, off + len) into the free list, merging with neighbours.
  size_t start = off, length = len;
  auto next = free_.lower_bound(off);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    free_.erase(next);
  }
  free_[start] = length;
  // Return the pages of [off, off + len) to the OS: those wholly inside the
  // coalesced free range (a page shared with a live allocation stays).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t lo = std::max(off / page * page, RoundUp(start, page));
  const size_t hi = std::min(RoundUp(off + len, page), (start + length) / page * page);
  if (hi > lo) madvise(real_ + lo, hi - lo, MADV_DONTNEED);
}

bool GuardedMemory::Contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return device_ != nullptr && c >= device_ && c < device_ + capacity_;
}

void GuardedMemory::Die(const char* what, const void* p, const std::string& why) const {
  std::fprintf(stderr, "guarded: %s: %p %s\n", what, p, why.c_str());
  std::fflush(stderr);
  std::abort();
}

void* GuardedMemory::Real(const void* p, size_t bytes, const char* what, bool allow_host) const {
  if (p == nullptr) return nullptr;
  if (!Contains(p)) {
    if (allow_host) return const_cast<void*>(p);
    Die(what, p, "is not a device pointer");
  }
  const size_t off = static_cast<size_t>(static_cast<const char*>(p) - device_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(off);
    if (it != live_.begin()) {
      --it;
      const size_t end = it->first + it->second.bytes;
      // bytes == 0: any address in [start, end] (one past the end is legal).
      if (off <= end && bytes <= end - off) return real_ + off;
    }
  }
  Die(what, p,
      "[+" + std::to_string(bytes) +
          " bytes] is not inside a live allocation (out of bounds or use "
          "after free)");
}

void GuardedMemory::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (Contains(src)) Die("CopyToDevice src", src, "is a device pointer");
  std::memmove(Real(dst, bytes, "CopyToDevice dst"), src, bytes);
}

void GuardedMemory::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (Contains(dst)) Die("CopyToHost dst", dst, "is a device pointer");
  std::memmove(dst, Real(src, bytes, "CopyToHost src"), bytes);
}

void GuardedMemory::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  void* d = Real(dst, bytes, "CopyOnDevice dst");
  const void* s = Real(src, bytes, "CopyOnDevice src");
  std::memmove(d, s, bytes);
}

void GuardedMemory::SetZero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  std::memset(Real(dst, bytes, "SetZero dst"), 0, bytes);
}

bool GuardedMemory::ok() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_.empty();
}

std::string GuardedMemory::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_.empty() ? alloc_error_ : error_;
}

size_t GuardedMemory::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

std::unique_ptr<GuardedMemory> MakeGuardedMemory(size_t capacity_bytes) {
  return std::make_unique<GuardedMemory>(capacity_bytes);
}

}  // namespace tandem::kernels
