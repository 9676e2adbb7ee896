// MakeHostMemory: DeviceMemory over plain host memory (CPU backends).
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/allocation_ledger.h"
#include "kernels/memory.h"

namespace tandem::kernels {
namespace {

constexpr size_t kAlign = 256;
// Buffers of at least two huge pages are aligned to one and advised as huge
// pages: a large activation or KV buffer is first touched in one step, and
// each 4 KiB page fault costs the most in a virtual machine.
constexpr size_t kHugePage = size_t{2} << 20;

class HostMemory final : public DeviceMemory {
 public:
  const char* name() const override { return "host"; }

  void* Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const bool huge = bytes >= 2 * kHugePage;
    const size_t align = huge ? kHugePage : kAlign;
    void* p = nullptr;
    if (bytes <= SIZE_MAX - align) {  // the rounding below cannot wrap
      const size_t rounded = (bytes + align - 1) / align * align;
      p = std::aligned_alloc(align, rounded);
      if (huge && p != nullptr) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: ignore failure
    }
    if (p == nullptr) {
      ledger_.set_failure("host: out of memory allocating " + std::to_string(bytes) + " bytes");
      return nullptr;
    }
    ledger_.Add(p, bytes);
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    ledger_.Remove(p);
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
  std::string last_error() const override { return ledger_.failure(); }
  size_t allocated_bytes() const override { return ledger_.total(); }

 private:
  AllocationLedger ledger_;
};

}  // namespace

std::unique_ptr<DeviceMemory> MakeHostMemory() { return std::make_unique<HostMemory>(); }

}  // namespace tandem::kernels
