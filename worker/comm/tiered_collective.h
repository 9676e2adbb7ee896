// Byte accounting per network tier (intra-node, inter-node).
//
// TieredCollective wraps a communicator whose ranks sit on known nodes and
// adds every call's bytes to a TierLedger, split by the tier of the link each
// byte crossed. The split follows the algorithms the Gloo backend runs:
// rings and the scan chain send to rank+1 and receive from rank-1, broadcast
// is a binomial tree (each edge carries the whole buffer), send/recv use the
// named peer. NCCL chooses its own rings; the same model is applied to it.
// A job's communicators (flat, intra-node, inter-node) share one ledger, so
// the step metrics see every byte once.
//
// The wrapper forwards status, timeouts and Abort() unchanged, and keeps the
// per-kind counts of Collective as well. Thread safety: as Collective; the
// ledger may be read and reset from any thread.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/comm/collective.h"

namespace tandem::comm {

enum class Tier { kIntraNode = 0, kInterNode = 1 };
inline constexpr int kNumTiers = 2;
// "intra_node" | "inter_node".
std::string_view TierName(Tier tier);

class TierLedger {
 public:
  void Add(Tier tier, CollectiveKind kind, uint64_t sent, uint64_t received);
  ByteCount bytes(Tier tier, CollectiveKind kind) const;
  ByteCount total(Tier tier) const;
  void Reset();

 private:
  struct Cell {
    std::atomic<uint64_t> sent{0}, received{0};
  };
  std::array<std::array<Cell, kNumCollectiveKinds>, kNumTiers> cells_;
};

// member_nodes[i] is the node of the communicator's rank i (size() entries).
// Fails (InvalidArgument) when the list does not match inner's size.
absl::StatusOr<std::unique_ptr<Collective>> MakeTieredCollective(std::unique_ptr<Collective> inner,
                                                                 std::vector<std::string> member_nodes,
                                                                 std::shared_ptr<TierLedger> ledger);

}  // namespace tandem::comm
