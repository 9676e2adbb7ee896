// Collective: one communicator of `size` ranks (c10d ProcessGroup-like).
// Backends: Gloo over TCP (CPU memory) and NCCL (device memory; only when
// built with CUDA). Make one with MakeCollective.
//
// Contract:
// - Every rank issues the same collectives in the same order (a collective
//   is matched by its position in that order, not by a name).
// - Every call takes a timeout; a call that cannot finish in time returns
//   DeadlineExceeded (or Unavailable when a peer went away). After any failed
//   call the communicator is broken: later calls fail fast with
//   FailedPrecondition; build a new one (next generation) to continue.
// - Abort() may be called from any thread: every call waiting then returns
//   Aborted promptly and so does every later call.
// - Reductions are element-wise over float32. Zero-length calls succeed
//   without communicating (every rank must agree on the length).
// - Error messages start with the backend and operation:
//   "gloo: allreduce failed: ...".
// - Byte accounting: bytes this rank put on / took off the wire per kind,
//   as the algorithm actually moves them (ring allreduce sends
//   2(N-1)/N * bytes), summed since the last ResetBytes().
//
// Thread safety: collectives are called from one thread at a time
// (bytes()/ResetBytes()/Abort() from any thread).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/store.h"

namespace tandem::comm {

using Timeout = std::chrono::milliseconds;

enum class ReduceOp { kSum, kMax, kMin };

enum class CollectiveKind {
  kAllreduce = 0,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kBarrier,
  kSendRecv,
  kAllScan,
  kAllToAll,
};
inline constexpr int kNumCollectiveKinds = 8;
std::string_view CollectiveKindName(CollectiveKind kind);

struct ByteCount {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t calls = 0;
};

// The operator of all_scan. The chain carries a running value ("carry")
// from rank 0 to rank N-1; rank r folds its own values into it:
//   carry_out[i] = combine(carry_in[i], mine[i])
// computed by `combine(carry_in, mine, carry_out, offset, count)` on one block
// of `count` elements starting at element `offset` of the vector.
// Rank 0 starts from `identity` in every element. For an associative
// element-wise operator this is the exclusive prefix scan.
struct ScanOp {
  using Combine =
      std::function<void(const float* carry_in, const float* mine, float* carry_out, size_t offset, size_t count)>;
  float identity = 0.f;
  Combine combine;

  // carry_out = carry_in + mine.
  static ScanOp Sum();
  // Linear recurrence (linear attention states): state_r = decay * state_{r-1}
  // + x_r with this rank's `decay`; rank r receives state_{r-1}, rank 0
  // receives 0.
  static ScanOp Affine(float decay);
};

class Collective {
 public:
  virtual ~Collective() = default;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  virtual std::string_view backend() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // In-place: data[0..n) becomes the reduction over ranks.
  virtual absl::Status allreduce(float* data, size_t n, ReduceOp op, Timeout timeout) = 0;
  // `in` has sum(counts) elements on every rank; rank r receives the summed
  // counts[r] elements at offset sum(counts[<r]) into `out` (counts[r]
  // elements). Uneven counts allowed. `in` and `out` must not overlap.
  virtual absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& counts,
                                      Timeout timeout) = 0;
  // Rank r contributes counts[r] elements from `in`; `out` receives all
  // ranks' elements, rank by rank (sum(counts) elements). `in` may alias
  // out + sum(counts[<r]).
  virtual absl::Status allgather(const float* in, float* out, const std::vector<size_t>& counts, Timeout timeout) = 0;
  virtual absl::Status broadcast(float* data, size_t n, int root, Timeout timeout) = 0;
  virtual absl::Status barrier(Timeout timeout) = 0;
  // Point-to-point; a send matches the recv with the same (peer, tag) in
  // order. send is a rendezvous: it returns once the peer has posted the
  // matching recv and the data left this buffer (so two ranks that both send
  // first deadlock until the timeout - order them).
  virtual absl::Status send(const void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) = 0;
  virtual absl::Status recv(void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) = 0;
  // Exclusive scan along the rank chain, block by block (bytes per rank do
  // not grow with N): data[0..n) becomes the carry after ranks 0..r-1.
  virtual absl::Status all_scan(float* data, size_t n, const ScanOp& op, Timeout timeout) = 0;
  // Personalised exchange: `in` holds send_counts[t] elements for each rank
  // t, rank by rank; `out` receives recv_counts[s] elements from each rank
  // s, rank by rank (this rank's own piece is copied). Uneven and zero
  // counts allowed; every rank's send_counts[t] must equal rank t's
  // recv_counts[r]. `in` and `out` must not overlap. A backend without it
  // returns Unimplemented naming the backend.
  virtual absl::Status alltoall(const float* in, const std::vector<size_t>& send_counts, float* out,
                                const std::vector<size_t>& recv_counts, Timeout timeout);

  // Makes every waiting and later call fail with Aborted. Any thread.
  virtual void Abort() = 0;

  ByteCount bytes(CollectiveKind kind) const;
  ByteCount total_bytes() const;
  void ResetBytes();

 protected:
  Collective(int rank, int size) : rank_(rank), size_(size) {}
  void CountBytes(CollectiveKind kind, uint64_t sent, uint64_t received);

 private:
  struct AtomicCount {
    std::atomic<uint64_t> sent{0}, received{0}, calls{0};
  };
  const int rank_;
  const int size_;
  std::array<AtomicCount, kNumCollectiveKinds> counts_;
};

struct CollectiveOptions {
  // Interface address this rank's data connections bind to (the address the
  // worker advertises); 127.0.0.1 in tests.
  std::string address = "127.0.0.1";
  // Rendezvous timeout and the default for operations without their own.
  Timeout timeout{30000};
  // Key prefix in the store (one per communicator / generation).
  std::string prefix = "comm";
  // CUDA device for the NCCL backend.
  int device = 0;
  // Optional: aborting it makes a rendezvous in progress return Aborted
  // promptly (within about 200 ms; Gloo), and aborts the communicator made
  // from these options for its whole life (as Abort() does). Shared so the
  // caller can keep it where another thread can reach it.
  std::shared_ptr<AbortSignal> abort;
  // Gloo: once every rank has arrived in the store, the pairwise TCP
  // connects and the barrier after them must each finish within
  // min(timeout, connect_timeout); a peer that died after arriving costs
  // about this much, not `timeout` (Gloo alone waits up to 5x `timeout`).
  Timeout connect_timeout{10000};
};

// backend: "gloo" or "nccl". Rendezvous happens here (blocks until every rank
// has joined, options.timeout passes, or options.abort is aborted). `store` need only live through this
// call.
absl::StatusOr<std::unique_ptr<Collective>> MakeCollective(std::string_view backend, Store& store, int rank, int size,
                                                           const CollectiveOptions& options);

// Element counts of splitting n into `parts` near-equal contiguous pieces
// (the first n % parts pieces get one more).
std::vector<size_t> SplitEven(size_t n, int parts);

// Integer weights for SplitWeighted: speeds (finite, > 0) scaled so the
// largest is 2^20 and rounded to nearest, at least 1. Every rank that
// converts the same speeds gets the same integers (one division and one
// power-of-two product per element, no fused operations), so the splits
// below agree bit for bit across ranks and machines.
std::vector<uint64_t> SpeedWeights(const std::vector<double>& speeds);

// Element counts of splitting n into weights.size() contiguous pieces
// proportional to the integer weights (all > 0): each piece first gets
// `min_each` (when n >= parts * min_each; otherwise min_each is taken as 0),
// then the remaining R elements go as floor(R * w_i / W) (W = sum of the
// weights) and the R - sum(floors) elements left over go one each to the
// pieces with the largest remainders R * w_i mod W, ties to the lower index
// (Hamilton's largest-remainder method, in integers). Equal weights give
// SplitEven(n, parts).
std::vector<size_t> SplitWeighted(size_t n, const std::vector<uint64_t>& weights, size_t min_each = 0);

}  // namespace tandem::comm
