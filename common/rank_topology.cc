#include "common/rank_topology.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::common {

RankGroups GroupRanksByNode(const std::vector<std::string>& rank_nodes, int rank) {
  std::map<std::string, int> node_index;
  std::vector<int> node_of(rank_nodes.size()), local_of(rank_nodes.size());
  std::vector<int> count;
  for (size_t r = 0; r < rank_nodes.size(); ++r) {
    auto [it, fresh] = node_index.emplace(rank_nodes[r], static_cast<int>(count.size()));
    if (fresh) count.push_back(0);
    node_of[r] = it->second;
    local_of[r] = count[it->second]++;
  }
  RankGroups g;
  g.num_nodes = static_cast<int>(count.size());
  g.node_index = node_of[rank];
  g.local_index = local_of[rank];
  for (size_t r = 0; r < rank_nodes.size(); ++r) {
    if (node_of[r] == g.node_index) g.intra_ranks.push_back(static_cast<int>(r));
    if (local_of[r] == g.local_index) g.inter_ranks.push_back(static_cast<int>(r));
  }
  return g;
}

void FillRankTopology(const std::vector<std::string>& rank_nodes, int rank, tandem::v1::RankTopology* out) {
  out->Clear();
  for (const auto& n : rank_nodes) out->add_rank_nodes(n);
  const RankGroups g = GroupRanksByNode(rank_nodes, rank);
  out->set_num_nodes(g.num_nodes);
  out->set_node_index(g.node_index);
  out->set_local_index(g.local_index);
  for (int r : g.intra_ranks) out->add_intra_ranks(r);
  for (int r : g.inter_ranks) out->add_inter_ranks(r);
}

absl::Status CheckRankTopology(const tandem::v1::RankTopology& t, int rank, int world_size) {
  if (t.rank_nodes_size() != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: rank_nodes has ", t.rank_nodes_size(), " entries for a world of ", world_size));
  }
  for (int r = 0; r < world_size; ++r) {
    if (t.rank_nodes(r).empty()) return absl::InvalidArgumentError(absl::StrCat("topology: rank ", r, " has no node"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("topology: rank ", rank, " outside world ", world_size));
  }
  const RankGroups g = GroupRanksByNode({t.rank_nodes().begin(), t.rank_nodes().end()}, rank);
  const std::vector<int> intra(t.intra_ranks().begin(), t.intra_ranks().end());
  const std::vector<int> inter(t.inter_ranks().begin(), t.inter_ranks().end());
  if (t.num_nodes() != g.num_nodes || t.node_index() != g.node_index || t.local_index() != g.local_index ||
      intra != g.intra_ranks || inter != g.inter_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: groups for rank ", rank, " do not match its nodes (intra [", absl::StrJoin(intra, ","),
                     "] vs [", absl::StrJoin(g.intra_ranks, ","), "], inter [", absl::StrJoin(inter, ","), "] vs [",
                     absl::StrJoin(g.inter_ranks, ","), "])"));
  }
  return absl::OkStatus();
}

absl::Status CheckNodeName(const std::string& node) {
  if (node.empty() || node.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("node: expected 1-128 characters, got ", node.size()));
  }
  for (char c : node) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("node: '", node, "' may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::common
