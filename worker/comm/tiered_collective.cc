// MakeTieredCollective: see tiered_collective.h.
#include "worker/comm/tiered_collective.h"

#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::comm {

std::string_view TierName(Tier tier) { return tier == Tier::kIntraNode ? "intra_node" : "inter_node"; }

void TierLedger::Add(Tier tier, CollectiveKind kind, uint64_t sent, uint64_t received) {
  auto& c = cells_[static_cast<int>(tier)][static_cast<int>(kind)];
  c.sent += sent;
  c.received += received;
}

ByteCount TierLedger::bytes(Tier tier, CollectiveKind kind) const {
  const auto& c = cells_[static_cast<int>(tier)][static_cast<int>(kind)];
  return {c.sent.load(), c.received.load(), 0};
}

ByteCount TierLedger::total(Tier tier) const {
  ByteCount t;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const ByteCount b = bytes(tier, static_cast<CollectiveKind>(k));
    t.sent += b.sent;
    t.received += b.received;
  }
  return t;
}

void TierLedger::Reset() {
  for (auto& row : cells_) {
    for (auto& c : row) {
      c.sent = 0;
      c.received = 0;
    }
  }
}

namespace {

class TieredCollective final : public Collective {
 public:
  TieredCollective(std::unique_ptr<Collective> inner, std::vector<std::string> nodes,
                   std::shared_ptr<TierLedger> ledger)
      : Collective(inner->rank(), inner->size()),
        inner_(std::move(inner)),
        nodes_(std::move(nodes)),
        ledger_(std::move(ledger)) {}

  std::string_view backend() const override { return inner_->backend(); }

  absl::Status allreduce(float* data, size_t n, ReduceOp op, Timeout timeout) override {
    return Ring(CollectiveKind::kAllreduce, [&] { return inner_->allreduce(data, n, op, timeout); });
  }
  absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& counts,
                              Timeout timeout) override {
    return Ring(CollectiveKind::kReduceScatter, [&] { return inner_->reduce_scatter(in, out, counts, timeout); });
  }
  absl::Status allgather(const float* in, float* out, const std::vector<size_t>& counts, Timeout timeout) override {
    return Ring(CollectiveKind::kAllgather, [&] { return inner_->allgather(in, out, counts, timeout); });
  }
  absl::Status all_scan(float* data, size_t n, const ScanOp& op, Timeout timeout) override {
    return Ring(CollectiveKind::kAllScan, [&] { return inner_->all_scan(data, n, op, timeout); });
  }
  absl::Status barrier(Timeout timeout) override {
    return Counted(
        CollectiveKind::kBarrier, [&] { return inner_->barrier(timeout); }, [](uint64_t, uint64_t) {});
  }

  absl::Status broadcast(float* data, size_t n, int root, Timeout timeout) override {
    return Counted(
        CollectiveKind::kBroadcast, [&] { return inner_->broadcast(data, n, root, timeout); },
        [&](uint64_t sent, uint64_t received) {
          if (root < 0 || root >= size()) return;
          // Gloo's binomial tree (see gloo_collective.cc): virtual rank v
          // receives from v - lowbit(v) and sends to v + 2^j, j < low.
          const size_t vsize = size();
          const size_t vrank = (rank() + vsize - root) % vsize;
          const int dim = std::bit_width(vsize - 1);
          const int low = vrank == 0 ? dim : std::countr_zero(vrank);
          std::vector<int> children;
          for (int j = 0; j < low; ++j) {
            if (vrank + (size_t{1} << j) < vsize) {
              children.push_back(static_cast<int>((vrank + (size_t{1} << j) + root) % vsize));
            }
          }
          for (int child : children) ledger_->Add(TierTo(child), CollectiveKind::kBroadcast, sent / children.size(), 0);
          if (vrank != 0) {
            const int parent = static_cast<int>((vrank - (size_t{1} << low) + root) % vsize);
            ledger_->Add(TierTo(parent), CollectiveKind::kBroadcast, 0, received);
          }
        });
  }

  absl::Status send(const void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    return Counted(
        CollectiveKind::kSendRecv, [&] { return inner_->send(data, bytes, peer, tag, timeout); },
        [&](uint64_t sent, uint64_t received) {
          if (peer >= 0 && peer < size()) ledger_->Add(TierTo(peer), CollectiveKind::kSendRecv, sent, received);
        });
  }
  absl::Status recv(void* data, size_t bytes, int peer, uint32_t tag, Timeout timeout) override {
    return Counted(
        CollectiveKind::kSendRecv, [&] { return inner_->recv(data, bytes, peer, tag, timeout); },
        [&](uint64_t sent, uint64_t received) {
          if (peer >= 0 && peer < size()) ledger_->Add(TierTo(peer), CollectiveKind::kSendRecv, sent, received);
        });
  }

  void Abort() override { inner_->Abort(); }

 private:
  Tier TierTo(int peer) const { return nodes_[peer] == nodes_[rank()] ? Tier::kIntraNode : Tier::kInterNode; }

  // Ring / chain: sends to rank+1, receives from rank-1.
  template <typename Call>
  absl::Status Ring(CollectiveKind kind, Call&& call) {
    return Counted(kind, std::forward<Call>(call), [&](uint64_t sent, uint64_t received) {
      const int n = size();
      ledger_->Add(TierTo((rank() + 1) % n), kind, sent, 0);
      ledger_->Add(TierTo((rank() + n - 1) % n), kind, 0, received);
    });
  }

  // Runs `call`, adds the inner's delta of `kind` to this object's counts and
  // hands it to `attribute(sent, received)`.
  template <typename Call, typename Attribute>
  absl::Status Counted(CollectiveKind kind, Call&& call, Attribute&& attribute) {
    const ByteCount before = inner_->bytes(kind);
    absl::Status st = call();
    const ByteCount after = inner_->bytes(kind);
    const uint64_t calls = after.calls - before.calls;
    const uint64_t sent = after.sent - before.sent;
    const uint64_t received = after.received - before.received;
    if (calls == 0 && sent == 0 && received == 0) return st;
    CountBytes(kind, sent, received);
    for (uint64_t c = 1; c < calls; ++c) CountBytes(kind, 0, 0);
    if (sent != 0 || received != 0) attribute(sent, received);
    return st;
  }

  std::unique_ptr<Collective> inner_;
  const std::vector<std::string> nodes_;
  const std::shared_ptr<TierLedger> ledger_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeTieredCollective(std::unique_ptr<Collective> inner,
                                                                 std::vector<std::string> member_nodes,
                                                                 std::shared_ptr<TierLedger> ledger) {
  if (inner == nullptr || ledger == nullptr) {
    return absl::InvalidArgumentError("tiered collective: no communicator or ledger");
  }
  if (static_cast<int>(member_nodes.size()) != inner->size()) {
    return absl::InvalidArgumentError(absl::StrCat("tiered collective: ", member_nodes.size(),
                                                   " member nodes for a communicator of ", inner->size(), " ranks"));
  }
  return std::unique_ptr<Collective>(
      std::make_unique<TieredCollective>(std::move(inner), std::move(member_nodes), std::move(ledger)));
}

}  // namespace tandem::comm
