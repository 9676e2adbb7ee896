// Sub-communicators per node group, and the hierarchical allreduce over them.
//
// A job's ranks grouped by node (common/rank_topology.h) get two more
// communicators beside the flat one: `intra` (this node's ranks; its rank is
// the local index) and `inter` (the ranks with the same local index on every
// node; its rank is the node's position among them). Both are wrapped for
// tier accounting into the job's TierLedger, so intra traffic counts as
// intra-node and inter traffic as inter-node.
//
// Every rank calls MakeNodeCollectives (intra rendezvous first, then inter;
// keys under options.prefix + "/intra<node>" and "/inter<local index>").
// Backend "gloo" (host memory) or "nccl" (device memory, options.device):
// each group is a communicator of its own (NCCL: its own unique id under
// its group's key, its own communicator and stream), so the groups' calls
// never match each other's.
// Failure: the rendezvous status of the first group that failed.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"
#include "worker/comm/tiered_collective.h"

namespace tandem::comm {

struct NodeCollectives {
  std::unique_ptr<Collective> intra;
  std::unique_ptr<Collective> inter;
  int num_nodes = 1;
  // Every node has the same number of ranks (hierarchical collectives need it).
  bool uniform = true;
};

absl::StatusOr<NodeCollectives> MakeNodeCollectives(std::string_view backend, Store& store,
                                                    const std::vector<std::string>& rank_nodes, int rank,
                                                    const CollectiveOptions& options,
                                                    std::shared_ptr<TierLedger> ledger);

// Sum-allreduce of data[0..n) in three steps: reduce-scatter inside the node,
// allreduce of this rank's piece across nodes, allgather inside the node.
// Each inter-node link carries 2(M-1)/M * n/L floats each way (M nodes, L
// ranks per node) instead of the flat ring's share of 2(N-1)/N * n.
// `scratch` holds at least n/L + 1 floats. Needs groups.uniform
// (FailedPrecondition otherwise). Sums in a different order than the flat
// ring: equal within fp32 reduction-order tolerance.
absl::Status HierarchicalAllreduce(const NodeCollectives& groups, float* data, size_t n, float* scratch,
                                   Timeout timeout);

}  // namespace tandem::comm
