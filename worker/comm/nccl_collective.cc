// NCCL backend of Collective (built only with CUDA). Pointers passed to it
// are device pointers. The unique id travels through the Store (rank 0 sets
// "<prefix>/nccl/id", others get it). Operations are enqueued on a stream
// owned by the communicator; completion is awaited by polling an event in
// short slices while checking the deadline, Abort() and the communicator's
// async error - on any of these the communicator is aborted
// (ncclCommAbort) and the call fails.
//
// Uneven reduce_scatter / allgather counts use grouped ncclReduce /
// ncclBroadcast; send/recv ignore `tag` (NCCL matches in issue order).
// all_scan is a chain of point-to-point steps, block by block: receive the
// carry from rank - 1, fold this rank's values in on the host (ScanOp's
// combine is host code; the states it carries are small), send the result
// to rank + 1; bytes per rank do not grow with the group.
//
// Ordering: every call first selects the communicator's device (the calling
// thread may be new, e.g. ZeRO's communication thread), records an event on
// the legacy default stream (where CudaOps and MakeCudaMemory issue their
// work, from any thread) and makes the communicator's stream wait for it, so
// NCCL reads the data the compute issued before the call produced. When the
// call returns the data is final.
//
// Host pointers (pageable or pinned host memory, detected with
// cudaPointerGetAttributes) are staged through a device scratch buffer that
// grows to the largest call: copied in before the operation and back after
// it completed, so small host-side reductions (loss sums, counts) work too.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/phase_failure.h"
#include "worker/comm/backends_internal.h"

namespace tandem::comm {
namespace {

constexpr size_t kScanBlock = 64 * 1024;  // floats per all_scan block (as Gloo's)

// NCCL's and its CUDA calls' failures are the cluster's: the job recovers.
absl::Status CudaError(std::string_view what, cudaError_t e) {
  return common::WithFailureKind(
      absl::InternalError(absl::StrCat("nccl: ", std::string(what), ": cuda error ", cudaGetErrorString(e))),
      tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
}

absl::Status NcclError(std::string_view what, ncclResult_t r) {
  return absl::UnavailableError(absl::StrCat("nccl: ", std::string(what), " failed: ", ncclGetErrorString(r)));
}

// OK on success, else the error above: for RETURN_IF_ERROR.
absl::Status CudaStatus(std::string_view what, cudaError_t e) {
  return e == cudaSuccess ? absl::OkStatus() : CudaError(what, e);
}

absl::Status NcclStatus(std::string_view what, ncclResult_t r) {
  return r == ncclSuccess ? absl::OkStatus() : NcclError(what, r);
}

// RAII owners (move-only).
class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  absl::Status Create() {
    RETURN_IF_ERROR(CudaStatus("stream create", cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)));
    return absl::OkStatus();
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  absl::Status Create() {
    RETURN_IF_ERROR(CudaStatus("event create", cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)));
    return absl::OkStatus();
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Device scratch for staging host buffers; grows, never shrinks. Growing
// frees the old buffer (cudaFree waits for the device to be idle).
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() {
    if (p_) cudaFree(p_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    const size_t want = std::max(bytes, capacity_ + capacity_ / 2);
    if (p_ != nullptr) {
      cudaFree(p_);
      p_ = nullptr;
      capacity_ = 0;
    }
    RETURN_IF_ERROR(CudaStatus(absl::StrCat("cudaMalloc of ", want, " bytes for host staging"), cudaMalloc(&p_, want)));
    capacity_ = want;
    return absl::OkStatus();
  }
  char* get() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
  size_t capacity_ = 0;
};

// True for memory NCCL cannot use directly: host memory, registered (pinned)
// or not. Device and managed memory are used in place.
bool IsHostPointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // older runtimes: invalid value for plain host memory
    return true;
  }
  return attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost;
}

// One buffer argument of a call: where NCCL should read/write it.
struct Region {
  const void* host = nullptr;  // the caller's pointer
  size_t bytes = 0;
  bool copy_in = false;   // the operation reads it
  bool copy_out = false;  // the operation writes it
  void* dev = nullptr;    // set by Stage: the caller's pointer or a staging slot
  bool staged = false;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  absl::Status Allocate(size_t bytes) {
    RETURN_IF_ERROR(CudaStatus("cudaMalloc", cudaMalloc(&p_, bytes)));
    RETURN_IF_ERROR(CudaStatus("cudaMemset", cudaMemset(p_, 0, bytes)));
    return absl::OkStatus();
  }
  float* get() const { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
};

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() {
    if (comm_ == nullptr) return;
    if (aborted_) return;
    ncclCommDestroy(comm_);
  }
  ncclComm_t* out() { return &comm_; }
  ncclComm_t get() const { return comm_; }
  void Abort() {
    if (comm_ != nullptr && !aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
    }
  }

 private:
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(int rank, int size, int device) : Collective(rank, size), device_(device) {}

  absl::Status Init(Store& store, const CollectiveOptions& options) {
    RETURN_IF_ERROR(CudaStatus("cudaSetDevice", cudaSetDevice(device_)));
    // The unique-id wait is abortable (options.abort); ncclCommInitRank is not.
    AbortableStore abortable(&store, options.abort);
    PrefixStore scoped(options.prefix + "/nccl", &abortable);
    ncclUniqueId id;
    if (rank() == 0) {
      RETURN_IF_ERROR(NcclStatus("ncclGetUniqueId", ncclGetUniqueId(&id)));
      RETURN_IF_ERROR(scoped.Set("id", std::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
    } else {
      auto v = scoped.Get("id", options.timeout);
      if (!v.ok()) {
        return common::WithFailureKind(common::WithPrefix(v.status(), "nccl: rendezvous failed: "),
                                       tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
      }
      if (v->size() != sizeof(id)) {
        return common::WithFailureKind(absl::DataLossError("nccl: rendezvous failed: bad unique id"),
                                       tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
      }
      std::memcpy(&id, v->data(), sizeof(id));
    }
    RETURN_IF_ERROR(NcclStatus("ncclCommInitRank", ncclCommInitRank(comm_.out(), size(), id, rank())));
    RETURN_IF_ERROR(stream_.Create());
    RETURN_IF_ERROR(done_.Create());
    RETURN_IF_ERROR(ready_.Create());
    return scratch_.Allocate(sizeof(float));
  }

  std::string_view backend() const override { return "nccl"; }

  absl::Status allreduce(float* data, size_t n, ReduceOp op, Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("allreduce"));
    if (n == 0) return absl::OkStatus();
    Region d{data, n * 4, true, true};
    RETURN_IF_ERROR(Begin("allreduce", {&d}));
    RETURN_IF_ERROR(
        NcclStatus("allreduce", ncclAllReduce(d.dev, d.dev, n, ncclFloat, ToNccl(op), comm_.get(), stream_.get())));
    const uint64_t moved = 2 * (size() - 1) * n * 4 / size();
    return Finish("allreduce", CollectiveKind::kAllreduce, moved, moved, timeout, {&d});
  }

  absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& counts,
                              Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("reduce_scatter"));
    if (counts.size() != static_cast<size_t>(size())) {
      return absl::InvalidArgumentError("nccl: reduce_scatter failed: counts");
    }
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    if (total == 0) return absl::OkStatus();
    Region ri{in, total * 4, true, false};
    Region ro{out, counts[rank()] * 4, false, true};
    RETURN_IF_ERROR(Begin("reduce_scatter", {&ri, &ro}));
    in = static_cast<const float*>(ri.dev);
    out = static_cast<float*>(ro.dev);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    if (even) {
      RETURN_IF_ERROR(NcclStatus(
          "reduce_scatter", ncclReduceScatter(in, out, counts[0], ncclFloat, ncclSum, comm_.get(), stream_.get())));
    } else {
      RETURN_IF_ERROR(NcclStatus("reduce_scatter", ncclGroupStart()));
      size_t off = 0;
      for (int r = 0; r < size(); ++r) {
        if (counts[r] > 0) {
          ncclResult_t res = ncclReduce(in + off, out, counts[r], ncclFloat, ncclSum, r, comm_.get(), stream_.get());
          if (res != ncclSuccess) {
            ncclGroupEnd();
            return NcclError("reduce_scatter", res);
          }
        }
        off += counts[r];
      }
      RETURN_IF_ERROR(NcclStatus("reduce_scatter", ncclGroupEnd()));
    }
    const uint64_t moved = (size() - 1) * total * 4 / size();
    return Finish("reduce_scatter", CollectiveKind::kReduceScatter, moved, moved, timeout, {&ri, &ro});
  }

  absl::Status allgather(const float* in, float* out, const std::vector<size_t>& counts, Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("allgather"));
    if (counts.size() != static_cast<size_t>(size())) {
      return absl::InvalidArgumentError("nccl: allgather failed: counts");
    }
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    if (total == 0) return absl::OkStatus();
    // `in` may alias out + offset: a host `in` inside a host `out` is staged
    // as part of `out` (copied in whole), keeping the aliasing.
    const char* in_c = reinterpret_cast<const char*>(in);
    const char* out_c = reinterpret_cast<const char*>(out);
    const bool alias = in_c >= out_c && in_c < out_c + total * 4;
    Region ri{in, counts[rank()] * 4, true, false};
    Region ro{out, total * 4, false, true};
    if (alias && IsHostPointer(out)) {
      ro.copy_in = true;
      RETURN_IF_ERROR(Begin("allgather", {&ro}));
      ri.dev = static_cast<char*>(ro.dev) + (in_c - out_c);
    } else if (auto s = Begin("allgather", {&ri, &ro}); !s.ok()) {
      return s;
    }
    in = static_cast<const float*>(ri.dev);
    out = static_cast<float*>(ro.dev);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    if (even) {
      RETURN_IF_ERROR(
          NcclStatus("allgather", ncclAllGather(in, out, counts[0], ncclFloat, comm_.get(), stream_.get())));
    } else {
      RETURN_IF_ERROR(NcclStatus("allgather", ncclGroupStart()));
      size_t off = 0;
      for (int r = 0; r < size(); ++r) {
        if (counts[r] > 0) {
          const float* src = r == rank() ? in : out + off;
          ncclResult_t res = ncclBroadcast(src, out + off, counts[r], ncclFloat, r, comm_.get(), stream_.get());
          if (res != ncclSuccess) {
            ncclGroupEnd();
            return NcclError("allgather", res);
          }
        }
        off += counts[r];
      }
      RETURN_IF_ERROR(NcclStatus("allgather", ncclGroupEnd()));
    }
    const uint64_t sent = (size() - 1) * total * 4 / size();
    return Finish("allgather", CollectiveKind::kAllgather, sent, (total - counts[rank()]) * 4, timeout, {&ro});
  }

  absl::Status broadcast(float* data, size_t n, int root, Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("broadcast"));
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError("nccl: broadcast failed: bad root");
    }
    if (n == 0) return absl::OkStatus();
    Region d{data, n * 4, true, true};
    RETURN_IF_ERROR(Begin("broadcast", {&d}));
    RETURN_IF_ERROR(
        NcclStatus("broadcast", ncclBroadcast(d.dev, d.dev, n, ncclFloat, root, comm_.get(), stream_.get())));
    // Ring broadcast: every rank but the last in the ring forwards once.
    const int vrank = (rank() - root + size()) % size();
    return Finish("broadcast", CollectiveKind::kBroadcast, vrank + 1 < size() ? n * 4 : 0, vrank > 0 ? n * 4 : 0,
                  timeout, {&d});
  }

  absl::Status barrier(Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("barrier"));
    RETURN_IF_ERROR(Begin("barrier", {}));
    RETURN_IF_ERROR(NcclStatus(
        "barrier", ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclFloat, ncclSum, comm_.get(), stream_.get())));
    return Finish("barrier", CollectiveKind::kBarrier, 0, 0, timeout, {});
  }

  absl::Status send(const void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    BusyScope busy(this);
    return Send(data, bytes, peer, CollectiveKind::kSendRecv, timeout);
  }

  absl::Status recv(void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    BusyScope busy(this);
    return Recv(data, bytes, peer, CollectiveKind::kSendRecv, timeout);
  }

  // One NCCL group of a send and a receive per peer; this rank's own piece
  // is a device copy on the same stream.
  absl::Status alltoall(const float* in, const std::vector<size_t>& send_counts, float* out,
                        const std::vector<size_t>& recv_counts, Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("all_to_all"));
    const size_t n = size();
    if (send_counts.size() != n || recv_counts.size() != n) {
      return absl::InvalidArgumentError("nccl: all_to_all failed: counts");
    }
    const int me = rank();
    if (send_counts[me] != recv_counts[me]) {
      return absl::InvalidArgumentError("nccl: all_to_all failed: this rank's own send and receive counts differ");
    }
    std::vector<size_t> soff(n, 0), roff(n, 0);
    for (size_t i = 1; i < n; ++i) {
      soff[i] = soff[i - 1] + send_counts[i - 1];
      roff[i] = roff[i - 1] + recv_counts[i - 1];
    }
    const size_t send_total = soff[n - 1] + send_counts[n - 1];
    const size_t recv_total = roff[n - 1] + recv_counts[n - 1];
    if (send_total == 0 && recv_total == 0) return absl::OkStatus();
    Region ri{in, send_total * 4, true, false};
    Region ro{out, recv_total * 4, false, true};
    RETURN_IF_ERROR(Begin("all_to_all", {&ri, &ro}));
    const float* din = static_cast<const float*>(ri.dev);
    float* dout = static_cast<float*>(ro.dev);
    if (send_counts[me] > 0) {
      const cudaError_t e = cudaMemcpyAsync(dout + roff[me], din + soff[me], send_counts[me] * 4,
                                            cudaMemcpyDeviceToDevice, stream_.get());
      if (e != cudaSuccess) return Broken(CudaError("all_to_all", e));
    }
    uint64_t sent = 0, received = 0;
    RETURN_IF_ERROR(NcclStatus("all_to_all", ncclGroupStart()));
    for (size_t p = 0; p < n; ++p) {
      if (static_cast<int>(p) == me) continue;
      ncclResult_t res = ncclSuccess;
      if (send_counts[p] > 0) {
        res = ncclSend(din + soff[p], send_counts[p], ncclFloat, static_cast<int>(p), comm_.get(), stream_.get());
        sent += send_counts[p] * 4;
      }
      if (res == ncclSuccess && recv_counts[p] > 0) {
        res = ncclRecv(dout + roff[p], recv_counts[p], ncclFloat, static_cast<int>(p), comm_.get(), stream_.get());
        received += recv_counts[p] * 4;
      }
      if (res != ncclSuccess) {
        ncclGroupEnd();
        return NcclError("all_to_all", res);
      }
    }
    RETURN_IF_ERROR(NcclStatus("all_to_all", ncclGroupEnd()));
    return Finish("all_to_all", CollectiveKind::kAllToAll, sent, received, timeout, {&ro});
  }

  absl::Status all_scan(float* data, size_t n, const ScanOp& op, Timeout timeout) override {
    BusyScope busy(this);
    RETURN_IF_ERROR(Check("all_scan"));
    if (n == 0) return absl::OkStatus();
    const bool host = IsHostPointer(data);
    const int r = rank(), last = size() - 1;
    const size_t block = std::min(n, kScanBlock);
    std::vector<float> mine(block), carry(block), out(block);
    for (size_t off = 0; off < n; off += block) {
      const size_t count = std::min(block, n - off);
      const size_t bytes = count * sizeof(float);
      // A device copy on the legacy stream: after the compute that produced it.
      if (host) {
        std::memcpy(mine.data(), data + off, bytes);
      } else if (cudaError_t e = cudaMemcpy(mine.data(), data + off, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess) {
        return Broken(CudaError("all_scan", e));
      }
      if (r == 0) {
        std::fill(carry.begin(), carry.begin() + count, op.identity);
      } else {
        RETURN_IF_ERROR(Recv(carry.data(), bytes, r - 1, CollectiveKind::kAllScan, timeout));
      }
      if (r < last) {
        op.combine(carry.data(), mine.data(), out.data(), off, count);
        RETURN_IF_ERROR(Send(out.data(), bytes, r + 1, CollectiveKind::kAllScan, timeout));
      }
      if (host) {
        std::memcpy(data + off, carry.data(), bytes);
      } else if (cudaError_t e = cudaMemcpy(data + off, carry.data(), bytes, cudaMemcpyHostToDevice);
                 e != cudaSuccess) {
        return Broken(CudaError("all_scan", e));
      }
    }
    return absl::OkStatus();
  }

  void Abort() override {
    aborted_ = true;  // the polling loop aborts the communicator
    if (!busy_) AbortComm();
  }

 private:
  absl::Status Check(std::string_view op) {
    if (aborted_) {
      return absl::AbortedError(absl::StrCat("nccl: ", std::string(op), " failed: communicator aborted"));
    }
    if (broken_) {
      return common::WithFailureKind(
          absl::FailedPreconditionError(
              absl::StrCat("nccl: ", std::string(op), " failed: communicator broken by an earlier error")),
          tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
    }
    return absl::OkStatus();
  }

  // Marks a call in progress (Abort() then leaves the communicator to the
  // call); on exit, aborts the communicator if Abort() came meanwhile.
  class BusyScope {
   public:
    explicit BusyScope(NcclCollective* c) : c_(c) { c_->busy_ = true; }
    ~BusyScope() {
      c_->busy_ = false;
      if (c_->aborted_) c_->AbortComm();
    }
    BusyScope(const BusyScope&) = delete;
    BusyScope& operator=(const BusyScope&) = delete;

   private:
    NcclCollective* c_;
  };

  // A failure before or around the enqueue: the ranks may now disagree on
  // the call sequence, so the communicator is broken (and aborted, so peers
  // waiting on this rank fail instead of hanging).
  // Point to point, counted under `kind` (the caller holds a BusyScope).
  absl::Status Send(const void* data, size_t bytes, int peer, CollectiveKind kind, Timeout timeout) {
    RETURN_IF_ERROR(Check("send"));
    if (peer < 0 || peer >= size() || peer == rank()) {
      return absl::InvalidArgumentError("nccl: send failed: bad peer");
    }
    if (bytes == 0) return absl::OkStatus();
    Region d{data, bytes, true, false};
    RETURN_IF_ERROR(Begin("send", {&d}));
    RETURN_IF_ERROR(NcclStatus("send", ncclSend(d.dev, bytes, ncclChar, peer, comm_.get(), stream_.get())));
    return Finish("send", kind, bytes, 0, timeout, {});
  }

  absl::Status Recv(void* data, size_t bytes, int peer, CollectiveKind kind, Timeout timeout) {
    RETURN_IF_ERROR(Check("recv"));
    if (peer < 0 || peer >= size() || peer == rank()) {
      return absl::InvalidArgumentError("nccl: recv failed: bad peer");
    }
    if (bytes == 0) return absl::OkStatus();
    Region d{data, bytes, false, true};
    RETURN_IF_ERROR(Begin("recv", {&d}));
    RETURN_IF_ERROR(NcclStatus("recv", ncclRecv(d.dev, bytes, ncclChar, peer, comm_.get(), stream_.get())));
    return Finish("recv", kind, 0, bytes, timeout, {&d});
  }

  absl::Status Broken(absl::Status s) {
    broken_ = true;
    AbortComm();
    return s;
  }

  // Selects the device, orders the communicator's stream after the work
  // issued on the legacy default stream, and stages host regions (assigns
  // each region's `dev`; copies the copy_in ones to the device).
  absl::Status Begin(std::string_view op, std::initializer_list<Region*> regions) {
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) e = cudaEventRecord(ready_.get(), cudaStreamLegacy);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_.get(), ready_.get(), 0);
    if (e != cudaSuccess) return Broken(CudaError(op, e));
    size_t need = 0;
    for (Region* r : regions) {
      r->staged = r->host != nullptr && r->bytes > 0 && IsHostPointer(r->host);
      if (r->staged) need += (r->bytes + 255) / 256 * 256;
    }
    if (need > 0) {
      if (auto s = staging_.Reserve(need); !s.ok()) return Broken(s);
    }
    size_t offset = 0;
    for (Region* r : regions) {
      if (!r->staged) {
        r->dev = const_cast<void*>(r->host);
        continue;
      }
      r->dev = staging_.get() + offset;
      offset += (r->bytes + 255) / 256 * 256;
      if (r->copy_in) {
        // Pageable memory is copied out of the caller's buffer before the
        // call returns; pinned memory is read in stream order (before the
        // operation completes, which Finish waits for).
        e = cudaMemcpyAsync(r->dev, r->host, r->bytes, cudaMemcpyHostToDevice, stream_.get());
        if (e != cudaSuccess) return Broken(CudaError(op, e));
      }
    }
    return absl::OkStatus();
  }

  void AbortComm() {
    std::call_once(abort_once_, [&] { comm_.Abort(); });
  }

  // Waits for the enqueued work in slices; counts bytes on success.
  // Then copies the staged copy_out regions back to the host.
  absl::Status Finish(std::string_view op, CollectiveKind kind, uint64_t sent, uint64_t received, Timeout timeout,
                      std::initializer_list<const Region*> regions) {
    cudaError_t e = cudaEventRecord(done_.get(), stream_.get());
    if (e != cudaSuccess) {
      broken_ = true;
      return CudaError(op, e);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      e = cudaEventQuery(done_.get());
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) {
        broken_ = true;
        AbortComm();
        return CudaError(op, e);
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_.get(), &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = true;
        AbortComm();
        return NcclError(op, async);
      }
      if (aborted_) {
        broken_ = true;
        AbortComm();
        return absl::AbortedError(absl::StrCat("nccl: ", std::string(op), " failed: communicator aborted"));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        broken_ = true;
        AbortComm();
        return absl::DeadlineExceededError(
            absl::StrCat("nccl: ", std::string(op), " failed: timed out after ", timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // The operation is complete: copying back does not block on NCCL.
    bool copied = false;
    for (const Region* r : regions) {
      if (!r->staged || !r->copy_out) continue;
      e = cudaMemcpyAsync(const_cast<void*>(r->host), r->dev, r->bytes, cudaMemcpyDeviceToHost, stream_.get());
      if (e != cudaSuccess) return Broken(CudaError(op, e));
      copied = true;
    }
    if (copied) {
      e = cudaStreamSynchronize(stream_.get());
      if (e != cudaSuccess) return Broken(CudaError(op, e));
    }
    CountBytes(kind, sent, received);
    return absl::OkStatus();
  }

  const int device_;
  // Declaration order = reverse destruction order: buffers and events go
  // before the communicator.
  Communicator comm_;
  Stream stream_;
  Event done_;
  Event ready_;  // recorded on the legacy stream at the start of each call
  DeviceBuffer scratch_;
  StagingBuffer staging_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
  std::atomic<bool> busy_{false};
  std::once_flag abort_once_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(Store& store, int rank, int size,
                                                               const CollectiveOptions& options) {
  auto c = std::make_unique<NcclCollective>(rank, size, options.device);
  RETURN_IF_ERROR(c->Init(store, options));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace tandem::comm
