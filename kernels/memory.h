// DeviceMemory: where a backend's tensors live, and the only way to move
// data between them and the host.
//
// Every pointer an Ops method takes is a device pointer of its backend
// (ops.h). Code that drives a backend (the model, ZeRO, generation) owns its
// buffers through a DeviceMemory and never dereferences them on the host;
// host data goes in with CopyToDevice and comes out with CopyToHost. Then
// the same code runs on the CPU backends (host memory: copies are memcpy)
// and on CUDA (cudaMalloc'ed memory).
//
// Implementations:
//   MakeHostMemory()     plain aligned host memory (CPU and reference ops)
//   MakeCudaMemory()     device memory of the current CUDA device
//                        (kernels/backends.h, under TANDEM_HAVE_CUDA)
//   MakeGuardedMemory()  host memory that faults when the host touches it
//                        outside Ops and copies (kernels/guarded/): runs the
//                        device code path on a CPU and proves it keeps the
//                        discipline above.
//
// Ordering: copies and ops are ordered in the order they are issued from
// one thread (CUDA: the legacy default stream). CopyToHost returns once the
// data is on the host, so it waits for the device work issued before it.
//
// Errors: Allocate returns nullptr when memory is exhausted (last_error()
// says why; not sticky: free something and retry). A failed copy or device
// fault is recorded: ok() turns false for good and last_error() keeps the
// first such failure.
// All methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace tandem::kernels {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual const char* name() const = 0;

  // Uninitialised, aligned to 256 bytes; nullptr (and last_error) when out
  // of memory. Allocate(0) returns nullptr without an error.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;

  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void SetZero(void* dst, size_t bytes) = 0;

  // Waits for all device work issued so far; returns ok().
  virtual bool Synchronize() = 0;
  virtual bool ok() const = 0;
  virtual std::string last_error() const = 0;

  // Bytes currently allocated through this object.
  virtual size_t allocated_bytes() const = 0;
};

// Host memory (CPU backends).
std::unique_ptr<DeviceMemory> MakeHostMemory();

// An owned device array of T. Move-only; frees on destruction. A
// default-constructed array is empty and needs no DeviceMemory.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      mem_ = std::exchange(o.mem_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceArray() { reset(); }

  // Replaces the contents with n uninitialised elements; false when out of
  // memory (the array is then empty).
  bool Allocate(DeviceMemory* mem, size_t n) {
    reset();
    mem_ = mem;
    if (n == 0) return true;
    p_ = static_cast<T*>(mem->Allocate(n * sizeof(T)));
    if (p_ == nullptr) return false;
    n_ = n;
    return true;
  }
  // Same, zero-filled.
  bool AllocateZeroed(DeviceMemory* mem, size_t n) {
    if (!Allocate(mem, n)) return false;
    if (n_ > 0) mem_->SetZero(p_, bytes());
    return true;
  }
  void reset() {
    if (p_ != nullptr) mem_->Free(p_);
    p_ = nullptr;
    n_ = 0;
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  size_t bytes() const { return n_ * sizeof(T); }
  DeviceMemory* memory() const { return mem_; }

  // Host <-> device for elements [offset, offset + count).
  void Upload(const T* host, size_t count, size_t offset = 0) {
    if (count > 0) mem_->CopyToDevice(p_ + offset, host, count * sizeof(T));
  }
  void Download(T* host, size_t count, size_t offset = 0) const {
    if (count > 0) mem_->CopyToHost(host, p_ + offset, count * sizeof(T));
  }
  void Zero() {
    if (n_ > 0) mem_->SetZero(p_, bytes());
  }

 private:
  DeviceMemory* mem_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace tandem::kernels
