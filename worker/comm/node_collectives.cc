// MakeNodeCollectives, HierarchicalAllreduce: see node_collectives.h.
#include "worker/comm/node_collectives.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rank_topology.h"

namespace tandem::comm {
namespace {

absl::StatusOr<std::unique_ptr<Collective>> MakeGroup(std::string_view backend, Store& store,
                                                      const std::vector<std::string>& rank_nodes,
                                                      const std::vector<int>& members, int rank,
                                                      const CollectiveOptions& options, const std::string& suffix,
                                                      std::shared_ptr<TierLedger> ledger) {
  int group_rank = -1;
  std::vector<std::string> nodes;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank) group_rank = static_cast<int>(i);
    nodes.push_back(rank_nodes[members[i]]);
  }
  if (group_rank < 0) return absl::InternalError(absl::StrCat("node groups: rank ", rank, " not in its ", suffix));
  CollectiveOptions o = options;
  o.prefix = absl::StrCat(options.prefix, "/", suffix);
  auto made = MakeCollective(backend, store, group_rank, static_cast<int>(members.size()), o);
  if (!made.ok()) {
    return absl::Status(made.status().code(), absl::StrCat("node groups (", suffix, "): ", made.status().message()));
  }
  return MakeTieredCollective(std::move(*made), std::move(nodes), std::move(ledger));
}

}  // namespace

absl::StatusOr<NodeCollectives> MakeNodeCollectives(std::string_view backend, Store& store,
                                                    const std::vector<std::string>& rank_nodes, int rank,
                                                    const CollectiveOptions& options,
                                                    std::shared_ptr<TierLedger> ledger) {
  if (rank < 0 || rank >= static_cast<int>(rank_nodes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("node groups: rank ", rank, " outside ", rank_nodes.size(), " ranks"));
  }
  const common::RankGroups g = common::GroupRanksByNode(rank_nodes, rank);
  NodeCollectives out;
  out.num_nodes = g.num_nodes;
  std::map<std::string, int> per_node;
  for (const auto& n : rank_nodes) ++per_node[n];
  for (const auto& [node, count] : per_node) out.uniform = out.uniform && count == per_node.begin()->second;
  ASSIGN_OR_RETURN(out.intra, MakeGroup(backend, store, rank_nodes, g.intra_ranks, rank, options,
                                        absl::StrCat("intra", g.node_index), ledger));
  ASSIGN_OR_RETURN(out.inter, MakeGroup(backend, store, rank_nodes, g.inter_ranks, rank, options,
                                        absl::StrCat("inter", g.local_index), ledger));
  return out;
}

absl::Status HierarchicalAllreduce(const NodeCollectives& groups, float* data, size_t n, float* scratch,
                                   Timeout timeout) {
  if (!groups.uniform) {
    return absl::FailedPreconditionError(
        "hierarchical allreduce: nodes hold different numbers of ranks; use the flat allreduce");
  }
  Collective& intra = *groups.intra;
  const std::vector<size_t> counts = SplitEven(n, intra.size());
  const size_t mine = counts[intra.rank()];
  RETURN_IF_ERROR(intra.reduce_scatter(data, scratch, counts, timeout));
  RETURN_IF_ERROR(groups.inter->allreduce(scratch, mine, ReduceOp::kSum, timeout));
  return intra.allgather(scratch, data, counts, timeout);
}

}  // namespace tandem::comm
