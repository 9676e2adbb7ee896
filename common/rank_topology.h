// Ranks grouped by node: which ranks share a machine (the fast intra-node
// tier) and which talk across machines (the inter-node tier).
//
// Nodes are numbered in the order of their first rank. A rank's local index
// is its position among its node's ranks in rank order. The intra-node group
// of a rank is its node's ranks; its inter-node group is the ranks with the
// same local index on every node that has one (at most one rank per node).
// Both list ranks ascending. Pure functions; any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::common {

struct RankGroups {
  int num_nodes = 1;
  int node_index = 0;
  int local_index = 0;
  std::vector<int> intra_ranks;  // this rank's node, ascending
  std::vector<int> inter_ranks;  // same local index on every node, ascending
};

// rank_nodes[r] is the node of rank r; 0 <= rank < rank_nodes.size().
RankGroups GroupRanksByNode(const std::vector<std::string>& rank_nodes, int rank);

// Fills `out` for `rank` (the coordinator, at SETUP).
void FillRankTopology(const std::vector<std::string>& rank_nodes, int rank, tandem::v1::RankTopology* out);

// The worker's check of what it was given: the node list has world_size
// entries, none empty, and the groups are the ones GroupRanksByNode gives.
// InvalidArgument naming the field otherwise.
absl::Status CheckRankTopology(const tandem::v1::RankTopology& topology, int rank, int world_size);

// A --node value: 1-128 characters of [A-Za-z0-9._-].
absl::Status CheckNodeName(const std::string& node);

}  // namespace tandem::common
