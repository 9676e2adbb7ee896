// GuardedMemory: a DeviceMemory on the CPU whose "device" addresses the host
// cannot touch, and MakeGuardedOps, the Ops wrapper that can.
//
// Proves the device discipline of kernels/memory.h without a GPU: device
// addresses live in a PROT_NONE reservation, so any host read or write of one
// faults (SIGSEGV), like dereferencing a cudaMalloc'ed pointer on the host.
// The data lives in a second (read/write) mapping at the same offset; copies
// and the guarded Ops translate device addresses to it with Real().
//
// Allocation: first fit over the reservation, 256-byte aligned; Free returns
// the pages to the OS (madvise). Real() checks that the range lies inside one
// live allocation and aborts otherwise (out of bounds, use after free), as an
// illegal address would on a GPU. Both reservations are MAP_NORESERVE: the
// capacity costs address space only. All methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/memory.h"
#include "kernels/ops.h"

namespace tandem::kernels {

class GuardedMemory final : public DeviceMemory {
 public:
  // Reserves capacity_bytes of address space twice (virtual only).
  explicit GuardedMemory(size_t capacity_bytes = size_t{16} << 30);
  ~GuardedMemory() override;
  GuardedMemory(const GuardedMemory&) = delete;
  GuardedMemory& operator=(const GuardedMemory&) = delete;

  const char* name() const override { return "guarded"; }
  void* Allocate(size_t bytes) override;
  void Free(void* p) override;
  // dst (CopyToDevice), src (CopyToHost) and both sides of CopyOnDevice /
  // SetZero's dst must be device pointers; the host side is ordinary memory.
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  void SetZero(void* dst, size_t bytes) override;
  bool Synchronize() override { return ok(); }
  bool ok() const override;
  std::string last_error() const override;
  size_t allocated_bytes() const override;

  // Real (host-accessible) address of device range [p, p + bytes); p must lie
  // in one live allocation (bytes == 0 checks p only). nullptr stays nullptr.
  // A pointer outside the reservation: if `allow_host` returns it unchanged,
  // otherwise prints "guarded: <what>: <ptr> is not a device pointer" to
  // stderr and aborts (a bug, like an illegal address on a GPU).
  void* Real(const void* p, size_t bytes, const char* what, bool allow_host = false) const;
  // Inside the reservation (live or not).
  bool Contains(const void* p) const;
  size_t capacity() const { return capacity_; }

 private:
  [[noreturn]] void Die(const char* what, const void* p, const std::string& why) const;

  size_t capacity_ = 0;
  char* device_ = nullptr;  // PROT_NONE reservation
  char* real_ = nullptr;    // PROT_READ|PROT_WRITE, same offsets

  mutable std::mutex mu_;
  struct Span {
    size_t bytes;     // requested
    size_t reserved;  // rounded up to the alignment
  };
  std::map<size_t, size_t> free_;  // offset -> length, coalesced
  std::map<size_t, Span> live_;    // offset -> live allocation
  size_t allocated_ = 0;
  std::string error_;        // sticky (ok() false)
  std::string alloc_error_;  // the last failed Allocate (not sticky)
};

std::unique_ptr<GuardedMemory> MakeGuardedMemory(size_t capacity_bytes = size_t{16} << 30);

// Ops over guarded pointers: translates every pointer argument (with the
// extent the op reads or writes) and calls `inner` (a CPU backend). Host
// pointers passed to it abort with the argument's name. `memory` must
// outlive the returned object. name() is "guarded(<inner name>)".
std::unique_ptr<Ops> MakeGuardedOps(std::unique_ptr<Ops> inner, GuardedMemory* memory);

}  // namespace tandem::kernels
