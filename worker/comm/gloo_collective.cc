// Gloo backend of Collective: tcp transport bound to the advertised address,
// rendezvous through GlooStore over a PrefixStore, Gloo's own algorithms
// for broadcast (binomial tree) and barrier, and rings over unbound buffers
// for allreduce (reduce-scatter + allgather), reduce-scatter, allgather,
// send/recv, all_scan and all_to_all.
//
// Gloo reports errors by throwing; every call into Gloo is wrapped by Run(),
// which turns exceptions into Status and marks the communicator broken.
// Abort() shuts down (shutdown(2), SHUT_RDWR) the socket of every tcp pair:
// Gloo's device loop then reads end-of-file, signals an error on the pair,
// which wakes every buffer waiting on it, and the peer sees the close too.
// Not quite every one: Gloo 2022 does not signal an unbound buffer whose
// message is already being written (queued behind a full socket) or read
// (partly received when the peer died); such a wait ran to its timeout. So
// the unbound-buffer operations here (send/recv, all_scan, reduce_scatter
// and allgather, which carry ZeRO's large transfers) register their buffers
// while they wait, and Abort() also calls abortWaitSend/abortWaitRecv on
// them: the wait returns false and the operation returns Aborted.
// (The Debian gloo headers lack gloo/common/memory.h, so tcp::Pair cannot be
// named; the socket is found by matching its local address with the pair's
// public address(), which Gloo sets from getsockname() once connected.)
//
// Rendezvous (Connect) is abortable through CollectiveOptions::abort:
//  1. an arrival barrier in the store (every rank sets "arrived/<rank>" and
//     waits for all), polled in short slices (AbortableStore);
//  2. Gloo's connectFullMesh bounded by connect_timeout (every peer is known
//     to be alive by now; Gloo waits 5x the context timeout for a pair, so
//     the context gets connect_timeout / 5), its store waits sliced as well.
//     While it runs, Abort() shuts down the listening sockets this rank
//     published (Gloo's device loop then fails the accept and wakes
//     Pair::connect);
//  3. a Gloo barrier, also bounded by connect_timeout (abortable as any
//     collective). The context then gets the full timeout for later calls.
// An abort during any step returns Aborted within about one slice (200 ms).
//
// One file on purpose: one backend class whose operations share Run(), the
// abort registry of waiting buffers and the ring helpers.
#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <numeric>
#include <stdexcept>

#include <dirent.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/phase_failure.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/backends_internal.h"
#include "worker/comm/gloo_store.h"

namespace tandem::comm {
namespace {

// Shuts down every connected TCP socket of this process whose local address
// (as Gloo prints it) is in `addresses`; with `listening`, listening sockets
// bound to those addresses too.
void ShutdownSockets(const std::vector<std::string>& addresses, bool listening = false) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  std::vector<int> fds;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    fds.push_back(atoi(e->d_name));
  }
  closedir(dir);
  for (int fd : fds) {
    sockaddr_storage local{}, peer{};
    socklen_t len = sizeof(local), plen = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    if (local.ss_family != AF_INET && local.ss_family != AF_INET6) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) {
      int accepting = 0;
      socklen_t alen = sizeof(accepting);
      if (!listening || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &alen) != 0 || accepting == 0) {
        continue;
      }
    }
    std::string name;
    try {
      name = gloo::transport::tcp::Address(reinterpret_cast<sockaddr*>(&local), len).str();
    } catch (const std::exception&) {
      continue;
    }
    for (const auto& a : addresses) {
      if (a == name) {
        shutdown(fd, SHUT_RDWR);
        break;
      }
    }
  }
}

// Slot prefixes for our unbound-buffer traffic (Gloo's own use 0x01-0x0a).
constexpr uint64_t kSendRecvSlot = uint64_t{0xA0} << 56;
constexpr uint64_t kScanSlot = uint64_t{0xA1} << 56;
constexpr uint64_t kReduceScatterSlot = uint64_t{0xA2} << 56;
constexpr uint64_t kAllgatherSlot = uint64_t{0xA3} << 56;
constexpr uint64_t kAllreduceSlot = uint64_t{0xA4} << 56;
constexpr uint64_t kAllToAllSlot = uint64_t{0xA5} << 56;
constexpr size_t kScanBlock = 64 * 1024;  // floats per all_scan block

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

ReduceFn PickReduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return &gloo::sum<float>;
    case ReduceOp::kMax:
      return &gloo::max<float>;
    case ReduceOp::kMin:
      return &gloo::min<float>;
  }
  return &gloo::sum<float>;
}

class GlooCollective final : public Collective {
 public:
  GlooCollective(int rank, int size, Timeout timeout) : Collective(rank, size), default_timeout_(timeout) {}

  ~GlooCollective() override {
    // No abort callback runs once this returns.
    abort_registration_.Reset();
    // Destroy the context (pairs) before the device that runs their loop.
    context_.reset();
    device_.reset();
  }

  absl::Status Connect(Store& store, const CollectiveOptions& options) {
    // Aborting the signal aborts this communicator, during the rendezvous
    // and for its whole life.
    abort_registration_ = AbortSignal::Register(options.abort, [this] { Abort(); });
    AbortableStore abortable(&store, options.abort);
    PrefixStore scoped(options.prefix + "/gloo", &abortable);
    const std::string where = absl::StrCat("rank ", rank(), " of ", size(), ", address ", options.address);
    if (size() > 1) {
      // Every rank arrives before anyone connects, so the connect below
      // only waits for peers that are known to be alive.
      absl::Status st = scoped.Set(absl::StrCat("arrived/", rank()), "1");
      if (st.ok()) {
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r) keys.push_back(absl::StrCat("arrived/", r));
        st = scoped.Wait(keys, options.timeout);
      }
      if (!st.ok()) {
        if (aborted_ || absl::IsAborted(st)) return AbortedRendezvous(where);
        return absl::Status(
            st.code(), absl::StrCat("gloo: rendezvous failed (", where, "): not every rank arrived: ", st.message()));
      }
    }
    const Timeout connect_timeout = std::min(options.timeout, options.connect_timeout);
    // Gloo's tcp::Pair waits up to 5x the context timeout for a connect; the
    // store waits inside connectFullMesh use connect_timeout itself.
    const Timeout pair_timeout = std::max(Timeout(100), connect_timeout / 5);
    ListenRecordingStore gloo_store(this, &scoped, connect_timeout);
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.address;
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank(), size());
      context->setTimeout(pair_timeout);
      context->connectFullMesh(gloo_store, device_);
      context->setTimeout(options.timeout);
      {
        absl::MutexLock lock(&abort_mu_);
        context_ = context;
        listen_addresses_.clear();
      }
      if (aborted_) return AbortedRendezvous(where);
      // Nobody leaves (and maybe closes its pairs) before all have connected
      // (every rank is connecting by now, so connect_timeout bounds it too).
      if (size() > 1) {
        gloo::BarrierOptions barrier(context);
        barrier.setTimeout(connect_timeout);
        gloo::barrier(barrier);
      }
    } catch (const std::exception& e) {
      if (aborted_) return AbortedRendezvous(where);
      return absl::UnavailableError(absl::StrCat("gloo: rendezvous failed (", where, "): ", e.what()));
    }
    if (aborted_) return AbortedRendezvous(where);
    return absl::OkStatus();
  }

  std::string_view backend() const override { return "gloo"; }

  absl::Status allreduce(float* data, size_t n, ReduceOp op, Timeout timeout) override {
    return Run("allreduce", [&]() -> absl::Status {
      if (n == 0) return absl::OkStatus();
      if (size() == 1) {
        CountBytes(CollectiveKind::kAllreduce, 0, 0);
        return absl::OkStatus();
      }
      // Ring reduce-scatter, then ring allgather, in place (abortable; with
      // two ranks the sums are exactly those of any other algorithm).
      const int ranks = size();
      std::vector<size_t> counts(ranks, n / ranks), offs(ranks, 0);
      for (size_t i = 0; i < n % ranks; ++i) ++counts[i];
      for (int i = 1; i < ranks; ++i) offs[i] = offs[i - 1] + counts[i - 1];
      RingReduceScatter(data, offs, counts, PickReduce(op), kAllreduceSlot, timeout);
      RingAllgather(data, offs, counts, kAllreduceSlot, timeout);
      const uint64_t bytes = n * sizeof(float);
      const uint64_t moved = 2 * (size() - 1) * bytes / size();
      CountBytes(CollectiveKind::kAllreduce, moved, moved);
      return absl::OkStatus();
    });
  }

  absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& counts,
                              Timeout timeout) override {
    return Run("reduce_scatter", [&]() -> absl::Status {
      if (counts.size() != static_cast<size_t>(size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo: reduce_scatter failed: ", counts.size(), " counts for ", size(), " ranks"));
      }
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      size_t offset = 0;
      for (int r = 0; r < rank(); ++r) offset += counts[r];
      if (total == 0) return absl::OkStatus();
      if (size() == 1) {
        std::memcpy(out, in, total * sizeof(float));
        CountBytes(CollectiveKind::kReduceScatter, 0, 0);
        return absl::OkStatus();
      }
      // Ring reduce-scatter over unbound buffers. Gloo 2022's
      // ReduceScatterHalvingDoubling is not used: it hung or returned wrong
      // sums for uneven counts (N = 3, 4) and returns wrong elements at
      // 128-256 MiB even with equal counts (bench_collectives #wrong), and
      // it cannot take a per-call timeout.
      const int n = size(), r = rank();
      std::vector<size_t> offs(n, 0);
      for (int i = 1; i < n; ++i) offs[i] = offs[i - 1] + counts[i - 1];
      work_.assign(in, in + total);
      const auto [sent, received] =
          RingReduceScatter(work_.data(), offs, counts, &gloo::sum<float>, kReduceScatterSlot, timeout);
      if (counts[r] > 0) {
        std::memcpy(out, work_.data() + offs[r], counts[r] * sizeof(float));
      }
      CountBytes(CollectiveKind::kReduceScatter, sent, received);
      return absl::OkStatus();
    });
  }
  absl::Status allgather(const float* in, float* out, const std::vector<size_t>& counts, Timeout timeout) override {
    return Run("allgather", [&]() -> absl::Status {
      if (counts.size() != static_cast<size_t>(size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo: allgather failed: ", counts.size(), " counts for ", size(), " ranks"));
      }
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      size_t offset = 0;
      for (int r = 0; r < rank(); ++r) offset += counts[r];
      if (total == 0) return absl::OkStatus();
      const size_t mine = counts[rank()];
      if (size() == 1) {
        if (in != out && mine > 0) {
          std::memmove(out, in, mine * sizeof(float));
        }
        CountBytes(CollectiveKind::kAllgather, 0, 0);
        return absl::OkStatus();
      }
      if (in != out + offset && mine > 0) {
        std::memmove(out + offset, in, mine * sizeof(float));
      }
      const int n = size();
      std::vector<size_t> offs(n, 0);
      for (int i = 1; i < n; ++i) offs[i] = offs[i - 1] + counts[i - 1];
      const auto [sent, received] = RingAllgather(out, offs, counts, kAllgatherSlot, timeout);
      CountBytes(CollectiveKind::kAllgather, sent, received);
      return absl::OkStatus();
    });
  }

  // Every peer's piece is posted at once over two unbound buffers (one over
  // `in`, one over `out`), then each send and receive is waited for; the
  // buffers are registered for Abort() like the rings'. (gloo::alltoallv
  // does the same exchange but its waits cannot be aborted.)
  absl::Status alltoall(const float* in, const std::vector<size_t>& send_counts, float* out,
                        const std::vector<size_t>& recv_counts, Timeout timeout) override {
    return Run("all_to_all", [&]() -> absl::Status {
      const size_t n = size();
      if (send_counts.size() != n || recv_counts.size() != n) {
        return absl::InvalidArgumentError(absl::StrCat("gloo: all_to_all failed: ", send_counts.size(), " send and ",
                                                       recv_counts.size(), " receive counts for ", n, " ranks"));
      }
      const int r = rank();
      if (send_counts[r] != recv_counts[r]) {
        return absl::InvalidArgumentError(absl::StrCat("gloo: all_to_all failed: this rank sends itself ",
                                                       send_counts[r], " elements but receives ", recv_counts[r]));
      }
      std::vector<size_t> soff(n, 0), roff(n, 0);
      for (size_t i = 1; i < n; ++i) {
        soff[i] = soff[i - 1] + send_counts[i - 1];
        roff[i] = roff[i - 1] + recv_counts[i - 1];
      }
      const size_t send_total = soff[n - 1] + send_counts[n - 1];
      const size_t recv_total = roff[n - 1] + recv_counts[n - 1];
      if (send_counts[r] > 0) {
        std::memcpy(out + roff[r], in + soff[r], send_counts[r] * sizeof(float));
      }
      uint64_t sent = 0, received = 0;
      if (n > 1 && (send_total > send_counts[r] || recv_total > recv_counts[r])) {
        auto in_buf = context_->createUnboundBuffer(const_cast<float*>(in), std::max<size_t>(send_total, 1) * 4);
        auto out_buf = context_->createUnboundBuffer(out, std::max<size_t>(recv_total, 1) * 4);
        WaitingBuffers waiting(this, {in_buf.get(), out_buf.get()});
        int sends = 0, recvs = 0;
        for (size_t i = 1; i < n; ++i) {
          const int to = static_cast<int>((r + i) % n), from = static_cast<int>((r + n - i) % n);
          if (send_counts[to] > 0) {
            in_buf->send(to, kAllToAllSlot, soff[to] * 4, send_counts[to] * 4);
            sent += send_counts[to] * 4;
            ++sends;
          }
          if (recv_counts[from] > 0) {
            out_buf->recv(from, kAllToAllSlot, roff[from] * 4, recv_counts[from] * 4);
            received += recv_counts[from] * 4;
            ++recvs;
          }
        }
        for (int i = 0; i < recvs; ++i) WaitRecv(*out_buf, timeout);
        for (int i = 0; i < sends; ++i) WaitSend(*in_buf, timeout);
      }
      CountBytes(CollectiveKind::kAllToAll, sent, received);
      return absl::OkStatus();
    });
  }

  absl::Status broadcast(float* data, size_t n, int root, Timeout timeout) override {
    return Run("broadcast", [&]() -> absl::Status {
      if (root < 0 || root >= size()) {
        return absl::InvalidArgumentError(absl::StrCat("gloo: broadcast failed: bad root ", root));
      }
      if (n == 0) return absl::OkStatus();
      if (size() == 1) {
        CountBytes(CollectiveKind::kBroadcast, 0, 0);
        return absl::OkStatus();
      }
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, n);
      opts.setRoot(root);
      opts.setTimeout(timeout);
      gloo::broadcast(opts);
      // Binomial tree rooted at `root`: count this rank's children.
      const size_t vsize = size();
      const size_t vrank = (rank() + vsize - root) % vsize;
      const int dim = std::bit_width(vsize - 1);
      const int low = vrank == 0 ? dim : std::countr_zero(vrank);
      uint64_t children = 0;
      for (int j = 0; j < low; ++j) {
        if (vrank + (size_t{1} << j) < vsize) ++children;
      }
      const uint64_t bytes = n * sizeof(float);
      CountBytes(CollectiveKind::kBroadcast, children * bytes, vrank == 0 ? 0 : bytes);
      return absl::OkStatus();
    });
  }

  absl::Status barrier(Timeout timeout) override {
    return Run("barrier", [&]() -> absl::Status {
      if (size() == 1) {
        CountBytes(CollectiveKind::kBarrier, 0, 0);
        return absl::OkStatus();
      }
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
      CountBytes(CollectiveKind::kBarrier, 0, 0);
      return absl::OkStatus();
    });
  }

  absl::Status send(const void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    return Run("send", [&]() -> absl::Status {
      if (peer < 0 || peer >= size() || peer == rank()) {
        return absl::InvalidArgumentError(absl::StrCat("gloo: send failed: bad peer ", peer));
      }
      if (bytes == 0) return absl::OkStatus();
      auto buf = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
      WaitingBuffers waiting(this, {buf.get()});
      buf->send(peer, kSendRecvSlot | tag);
      WaitSend(*buf, timeout);
      CountBytes(CollectiveKind::kSendRecv, bytes, 0);
      return absl::OkStatus();
    });
  }

  absl::Status recv(void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    return Run("recv", [&]() -> absl::Status {
      if (peer < 0 || peer >= size() || peer == rank()) {
        return absl::InvalidArgumentError(absl::StrCat("gloo: recv failed: bad peer ", peer));
      }
      if (bytes == 0) return absl::OkStatus();
      auto buf = context_->createUnboundBuffer(data, bytes);
      WaitingBuffers waiting(this, {buf.get()});
      buf->recv(peer, kSendRecvSlot | tag);
      WaitRecv(*buf, timeout);
      CountBytes(CollectiveKind::kSendRecv, 0, bytes);
      return absl::OkStatus();
    });
  }

  absl::Status all_scan(float* data, size_t n, const ScanOp& op, Timeout timeout) override {
    return Run("all_scan", [&]() -> absl::Status {
      if (!op.combine) {
        return absl::InvalidArgumentError("gloo: all_scan failed: ScanOp has no combine function");
      }
      if (n == 0) return absl::OkStatus();
      const int r = rank();
      const bool has_prev = r > 0;
      const bool has_next = r + 1 < size();
      if (!has_next && !has_prev) {
        std::fill(data, data + n, op.identity);
        return absl::OkStatus();
      }
      std::vector<float> mine;
      if (has_next) mine.assign(data, data + n);
      std::unique_ptr<gloo::transport::UnboundBuffer> in_buf;
      if (has_prev) in_buf = context_->createUnboundBuffer(data, n * 4);
      // Two send buffers so block b+1 is computed while b is in flight.
      std::vector<float> out_mem[2];
      std::unique_ptr<gloo::transport::UnboundBuffer> out_buf[2];
      bool out_busy[2] = {false, false};
      const size_t block = std::min(n, kScanBlock);
      if (has_next) {
        for (int k = 0; k < 2; ++k) {
          out_mem[k].resize(block);
          out_buf[k] = context_->createUnboundBuffer(out_mem[k].data(), block * sizeof(float));
        }
      }
      WaitingBuffers waiting(this, {in_buf.get(), out_buf[0].get(), out_buf[1].get()});
      std::vector<float> identity;
      if (!has_prev) identity.assign(block, op.identity);
      const size_t blocks = (n + block - 1) / block;
      for (size_t b = 0; b < blocks; ++b) {
        const size_t off = b * block;
        const size_t cnt = std::min(block, n - off);
        const float* carry_in;
        if (has_prev) {
          in_buf->recv(r - 1, kScanSlot, off * 4, cnt * 4);
          WaitRecv(*in_buf, timeout);
          carry_in = data + off;
        } else {
          carry_in = identity.data();
        }
        if (has_next) {
          const int k = b % 2;
          if (out_busy[k]) WaitSend(*out_buf[k], timeout);
          op.combine(carry_in, mine.data() + off, out_mem[k].data(), off, cnt);
          out_buf[k]->send(r + 1, kScanSlot, 0, cnt * 4);
          out_busy[k] = true;
        }
        if (!has_prev) std::fill(data + off, data + off + cnt, op.identity);
      }
      for (int k = 0; k < 2; ++k) {
        if (out_busy[k]) WaitSend(*out_buf[k], timeout);
      }
      CountBytes(CollectiveKind::kAllScan, has_next ? n * 4 : 0, has_prev ? n * 4 : 0);
      return absl::OkStatus();
    });
  }

  void Abort() override {
    aborted_ = true;
    {
      absl::MutexLock lock(&waiting_mu_);
      for (gloo::transport::UnboundBuffer* b : waiting_) {
        b->abortWaitSend();
        b->abortWaitRecv();
      }
    }
    absl::MutexLock lock(&abort_mu_);
    if (!context_) {
      // Still connecting: wake the pairs waiting for their peer to connect.
      ShutdownSockets(listen_addresses_, /*listening=*/true);
      return;
    }
    std::vector<std::string> addresses;
    for (int i = 0; i < size(); ++i) {
      if (i == rank()) continue;
      auto& pair = context_->getPair(i);
      if (pair) addresses.push_back(pair->address().str());
    }
    ShutdownSockets(addresses);
  }

 private:
  // The store Gloo's connectFullMesh uses: forwards to a GlooStore and
  // records the listening addresses this rank publishes (its own key holds
  // one address per peer, equal sizes), so Abort() can shut them down.
  class ListenRecordingStore final : public gloo::rendezvous::Store {
   public:
    ListenRecordingStore(GlooCollective* owner, comm::Store* store, Timeout timeout)
        : owner_(owner), store_(store, timeout) {}
    void set(const std::string& key, const std::vector<char>& data) override {
      if (key == std::to_string(owner_->rank()) && owner_->size() > 1) {
        const size_t each = data.size() / (owner_->size() - 1);
        std::vector<std::string> addresses;
        for (size_t off = 0; each > 0 && off + each <= data.size(); off += each) {
          try {
            std::vector<char> one(data.begin() + off, data.begin() + off + each);
            addresses.push_back(gloo::transport::tcp::Address(one).str());
          } catch (const std::exception&) {
            // Not a tcp address we can parse: nothing to shut down.
          }
        }
        absl::MutexLock lock(&owner_->abort_mu_);
        owner_->listen_addresses_ = std::move(addresses);
        if (owner_->aborted_) throw ::gloo::IoException("rendezvous aborted");
      }
      store_.set(key, data);
    }
    // Waits use this store's timeout (connect_timeout), not the context's
    // (shorter, see Connect).
    std::vector<char> get(const std::string& key) override { return store_.get(key); }
    void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& /*timeout*/) override {
      store_.wait(keys);
    }

   private:
    GlooCollective* const owner_;
    GlooStore store_;
  };

  static absl::Status AbortedRendezvous(const std::string& where) {
    return absl::AbortedError(absl::StrCat("gloo: rendezvous aborted (", where, ")"));
  }

  // Ring reduce-scatter in place over `work` (chunk i at offs[i], counts[i]
  // floats): step s sends this rank's partial of chunk r-s-1 to the next
  // rank and reduces the previous rank's partial of chunk r-s-2 into its
  // own; after N-1 steps chunk r holds every rank's contribution. Returns
  // (bytes sent, bytes received). Throws on failure, like Gloo (see Run).
  std::pair<uint64_t, uint64_t> RingReduceScatter(float* work, const std::vector<size_t>& offs,
                                                  const std::vector<size_t>& counts, ReduceFn reduce, uint64_t slot,
                                                  Timeout timeout) {
    const int n = size(), r = rank();
    size_t total = 0, max_count = 0;
    for (size_t c : counts) {
      total += c;
      max_count = std::max(max_count, c);
    }
    if (scratch_.size() < max_count) scratch_.resize(max_count);
    auto work_buf = context_->createUnboundBuffer(work, total * 4);
    auto recv_buf = context_->createUnboundBuffer(scratch_.data(), std::max<size_t>(max_count, 1) * 4);
    WaitingBuffers waiting(this, {work_buf.get(), recv_buf.get()});
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    uint64_t sent = 0, received = 0;
    for (int step = 0; step < n - 1; ++step) {
      const int si = ((r - step - 1) % n + n) % n;
      const int ri = ((r - step - 2) % n + n) % n;
      if (counts[si] > 0) work_buf->send(next, slot, offs[si] * 4, counts[si] * 4);
      if (counts[ri] > 0) {
        recv_buf->recv(prev, slot, 0, counts[ri] * 4);
        WaitRecv(*recv_buf, timeout);
        float* dst = work + offs[ri];
        reduce(dst, dst, scratch_.data(), counts[ri]);
        received += counts[ri] * 4;
      }
      if (counts[si] > 0) {
        WaitSend(*work_buf, timeout);
        sent += counts[si] * 4;
      }
    }
    return {sent, received};
  }

  // Ring allgather in place over `out` (this rank's chunk already at
  // offs[r]): step s passes chunk r-s on to the next rank and takes chunk
  // r-s-1 from the previous one. Returns (bytes sent, bytes received).
  std::pair<uint64_t, uint64_t> RingAllgather(float* out, const std::vector<size_t>& offs,
                                              const std::vector<size_t>& counts, uint64_t slot, Timeout timeout) {
    const int n = size(), r = rank();
    size_t total = 0;
    for (size_t c : counts) total += c;
    auto buf = context_->createUnboundBuffer(out, total * 4);
    WaitingBuffers waiting(this, {buf.get()});
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    uint64_t sent = 0, received = 0;
    for (int step = 0; step < n - 1; ++step) {
      const int si = ((r - step) % n + n) % n;
      const int ri = ((r - step - 1) % n + n) % n;
      if (counts[si] > 0) buf->send(next, slot, offs[si] * 4, counts[si] * 4);
      if (counts[ri] > 0) {
        buf->recv(prev, slot, offs[ri] * 4, counts[ri] * 4);
        WaitRecv(*buf, timeout);
        received += counts[ri] * 4;
      }
      if (counts[si] > 0) {
        WaitSend(*buf, timeout);
        sent += counts[si] * 4;
      }
    }
    return {sent, received};
  }

  // The unbound buffers of one operation, registered for Abort() while the
  // operation may wait on them (RAII; null entries are ignored). Throws
  // (like Gloo, caught by Run) when the communicator is already aborted, so
  // an abort never slips between the check in Run() and the registration.
  class WaitingBuffers {
   public:
    WaitingBuffers(GlooCollective* owner, std::initializer_list<gloo::transport::UnboundBuffer*> buffers)
        : owner_(owner) {
      absl::MutexLock lock(&owner_->waiting_mu_);
      if (owner_->aborted_) throw AbortedWait();
      for (auto* b : buffers) {
        if (b != nullptr) mine_.push_back(b);
      }
      owner_->waiting_.insert(owner_->waiting_.end(), mine_.begin(), mine_.end());
    }
    ~WaitingBuffers() {
      absl::MutexLock lock(&owner_->waiting_mu_);
      for (auto* b : mine_) {
        auto it = std::find(owner_->waiting_.begin(), owner_->waiting_.end(), b);
        if (it != owner_->waiting_.end()) owner_->waiting_.erase(it);
      }
    }
    WaitingBuffers(const WaitingBuffers&) = delete;
    WaitingBuffers& operator=(const WaitingBuffers&) = delete;

   private:
    GlooCollective* owner_;
    std::vector<gloo::transport::UnboundBuffer*> mine_;
  };

  struct AbortedWait : std::runtime_error {
    AbortedWait() : std::runtime_error("wait aborted") {}
  };
  // Gloo's waits return false when abortWait*() woke them.
  static void WaitRecv(gloo::transport::UnboundBuffer& b, Timeout timeout) {
    if (!b.waitRecv(timeout)) throw AbortedWait();
  }
  static void WaitSend(gloo::transport::UnboundBuffer& b, Timeout timeout) {
    if (!b.waitSend(timeout)) throw AbortedWait();
  }

  template <typename F>
  absl::Status Run(std::string_view op, F&& fn) {
    if (aborted_) {
      return absl::AbortedError(absl::StrCat("gloo: ", std::string(op), " failed: communicator aborted"));
    }
    if (broken_) {
      // The cluster's failure: the job recovers with a new communicator.
      return common::WithFailureKind(
          absl::FailedPreconditionError(absl::StrCat("gloo: ", std::string(op),
                                                     " failed: communicator broken by an earlier error (", first_error_,
                                                     "); create a new one")),
          tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
    }
    try {
      return fn();
    } catch (const std::exception& e) {
      broken_ = true;
      first_error_ = e.what();
      absl::StatusCode code = absl::StatusCode::kUnavailable;
      if (aborted_) {
        code = absl::StatusCode::kAborted;
      } else if (absl::StrContains(e.what(), "imed out") || absl::StrContains(e.what(), "timeout")) {
        code = absl::StatusCode::kDeadlineExceeded;
      }
      return absl::Status(code, absl::StrCat("gloo: ", std::string(op), " failed: ", e.what()));
    }
  }

  const Timeout default_timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
  std::string first_error_;
  std::vector<float> work_;     // reduce_scatter partial sums
  std::vector<float> scratch_;  // reduce_scatter receive buffer
  absl::Mutex waiting_mu_;
  std::vector<gloo::transport::UnboundBuffer*> waiting_ ABSL_GUARDED_BY(waiting_mu_);
  absl::Mutex abort_mu_;
  // Listening addresses published while connecting (guarded by abort_mu_).
  std::vector<std::string> listen_addresses_;
  AbortSignal::Registration abort_registration_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(Store& store, int rank, int size,
                                                               const CollectiveOptions& options) {
  auto c = std::make_unique<GlooCollective>(rank, size, options.timeout);
  RETURN_IF_ERROR(c->Connect(store, options));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace tandem::comm
