// MakeGuardedCollective: see guarded_collective.h.
#include "worker/comm/guarded_collective.h"

#include <array>
#include <numeric>
#include <utility>

namespace tandem::comm {
namespace {

class GuardedCollective final : public Collective {
 public:
  GuardedCollective(std::unique_ptr<Collective> inner, kernels::GuardedMemory* memory)
      : Collective(inner->rank(), inner->size()), inner_(std::move(inner)), mem_(memory) {}

  std::string_view backend() const override { return inner_->backend(); }

  absl::Status allreduce(float* data, size_t n, ReduceOp op, Timeout timeout) override {
    float* d = F(data, n, "allreduce data");
    return Counted([&] { return inner_->allreduce(d, n, op, timeout); });
  }

  absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& counts,
                              Timeout timeout) override {
    const float* i = F(in, Sum(counts), "reduce_scatter in");
    float* o = F(out, Mine(counts), "reduce_scatter out");
    return Counted([&] { return inner_->reduce_scatter(i, o, counts, timeout); });
  }

  absl::Status allgather(const float* in, float* out, const std::vector<size_t>& counts, Timeout timeout) override {
    const float* i = F(in, Mine(counts), "allgather in");
    float* o = F(out, Sum(counts), "allgather out");
    return Counted([&] { return inner_->allgather(i, o, counts, timeout); });
  }

  absl::Status broadcast(float* data, size_t n, int root, Timeout timeout) override {
    float* d = F(data, n, "broadcast data");
    return Counted([&] { return inner_->broadcast(d, n, root, timeout); });
  }

  absl::Status barrier(Timeout timeout) override {
    return Counted([&] { return inner_->barrier(timeout); });
  }

  absl::Status send(const void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    const void* d = mem_->Real(data, bytes, "send data", /*allow_host=*/true);
    return Counted([&] { return inner_->send(d, bytes, peer, tag, timeout); });
  }

  absl::Status recv(void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    void* d = mem_->Real(data, bytes, "recv data", /*allow_host=*/true);
    return Counted([&] { return inner_->recv(d, bytes, peer, tag, timeout); });
  }

  absl::Status all_scan(float* data, size_t n, const ScanOp& op, Timeout timeout) override {
    float* d = F(data, n, "all_scan data");
    return Counted([&] { return inner_->all_scan(d, n, op, timeout); });
  }

  absl::Status alltoall(const float* in, const std::vector<size_t>& send_counts, float* out,
                        const std::vector<size_t>& recv_counts, Timeout timeout) override {
    const float* i = F(in, Sum(send_counts), "all_to_all in");
    float* o = F(out, Sum(recv_counts), "all_to_all out");
    return Counted([&] { return inner_->alltoall(i, send_counts, o, recv_counts, timeout); });
  }

  void Abort() override { inner_->Abort(); }

 private:
  using Snapshot = std::array<ByteCount, kNumCollectiveKinds>;

  Snapshot Take() const {
    Snapshot s;
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      s[k] = inner_->bytes(static_cast<CollectiveKind>(k));
    }
    return s;
  }

  // Runs `call` and adds the inner's per-kind byte and call deltas to ours.
  template <typename Call>
  absl::Status Counted(Call&& call) {
    const Snapshot before = Take();
    absl::Status st = call();
    const Snapshot after = Take();
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      const uint64_t calls = after[k].calls - before[k].calls;
      const uint64_t sent = after[k].sent - before[k].sent;
      const uint64_t received = after[k].received - before[k].received;
      if (calls == 0 && sent == 0 && received == 0) continue;
      const auto kind = static_cast<CollectiveKind>(k);
      CountBytes(kind, sent, received);
      for (uint64_t c = 1; c < calls; ++c) CountBytes(kind, 0, 0);
    }
    return st;
  }

  float* F(float* p, size_t n, const char* what) const {
    return static_cast<float*>(mem_->Real(p, n * sizeof(float), what, /*allow_host=*/true));
  }
  const float* F(const float* p, size_t n, const char* what) const {
    return static_cast<const float*>(mem_->Real(p, n * sizeof(float), what, /*allow_host=*/true));
  }
  static size_t Sum(const std::vector<size_t>& counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }
  size_t Mine(const std::vector<size_t>& counts) const {
    const size_t r = static_cast<size_t>(rank());
    return r < counts.size() ? counts[r] : 0;
  }

  std::unique_ptr<Collective> inner_;
  kernels::GuardedMemory* mem_;
};

}  // namespace

std::unique_ptr<Collective> MakeGuardedCollective(std::unique_ptr<Collective> inner, kernels::GuardedMemory* memory) {
  return std::make_unique<GuardedCollective>(std::move(inner), memory);
}

}  // namespace tandem::comm
