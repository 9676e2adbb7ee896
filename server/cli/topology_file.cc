// ParseTopology, LoadTopologyFile: see topology_file.h.
#include "server/cli/topology_file.h"

#include <set>

#include <yaml-cpp/yaml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bandwidth.h"
#include "common/base/status_macros.h"
#include "common/rank_topology.h"
#include "common/yaml_proto.h"

namespace tandem::cli {
namespace {

constexpr size_t kMaxTopologyBytes = 1 << 20;
constexpr int kMaxWorkersPerNode = 4096;
constexpr int kMaxWorkers = 65536;

absl::Status Bad(const std::string& what, const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", key, ": ", why));
}

// Only `allowed` keys, each a scalar key.
absl::Status CheckKeys(const YAML::Node& map, const std::string& what, const std::string& where,
                       const std::set<std::string>& allowed) {
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) return Bad(what, where, "keys must be plain names");
    const std::string key = kv.first.Scalar();
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) absl::StrAppend(&list, list.empty() ? "" : ", ", a);
      return Bad(what, where.empty() ? key : absl::StrCat(where, ".", key),
                 absl::StrCat("unknown key (expected ", list, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Scalar(const YAML::Node& map, const std::string& key, const std::string& what,
                                   const std::string& where) {
  const YAML::Node v = map[key];
  if (!v) return Bad(what, where, "missing");
  if (!v.IsScalar()) return Bad(what, where, "expected a single value");
  return v.Scalar();
}

}  // namespace

int Topology::workers() const {
  int n = 0;
  for (const auto& node : nodes) n += node.workers;
  return n;
}

std::vector<std::string> Topology::RankNodes() const {
  std::vector<std::string> out;
  for (const auto& node : nodes) out.insert(out.end(), node.workers, node.name);
  return out;
}

absl::StatusOr<Topology> ParseTopology(const std::string& text, const std::string& what) {
  ASSIGN_OR_RETURN(YAML::Node root, common::ParseYaml(text, what, kMaxTopologyBytes));
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(what, ": expected a map with nodes and bandwidth"));
  RETURN_IF_ERROR(CheckKeys(root, what, "", {"nodes", "bandwidth"}));
  Topology topo;
  const YAML::Node nodes = root["nodes"];
  if (!nodes) return Bad(what, "nodes", "missing (a list of {name, workers})");
  if (!nodes.IsSequence() || nodes.size() == 0)
    return Bad(what, "nodes", "expected a non-empty list of {name, workers}");
  std::set<std::string> seen;
  int total = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string where = absl::StrCat("nodes[", i, "]");
    const YAML::Node n = nodes[i];
    if (!n.IsMap()) return Bad(what, where, "expected {name: NAME, workers: N}");
    RETURN_IF_ERROR(CheckKeys(n, what, where, {"name", "workers"}));
    Topology::Node node;
    ASSIGN_OR_RETURN(node.name, Scalar(n, "name", what, where + ".name"));
    if (absl::Status s = common::CheckNodeName(node.name); !s.ok()) {
      return Bad(what, where + ".name", std::string(s.message()));
    }
    if (!seen.insert(node.name).second) {
      return Bad(what, where + ".name", absl::StrCat("node '", node.name, "' is listed twice"));
    }
    ASSIGN_OR_RETURN(std::string workers, Scalar(n, "workers", what, where + ".workers"));
    int64_t count = 0;
    if (!absl::SimpleAtoi(workers, &count) || count < 1 || count > kMaxWorkersPerNode) {
      return Bad(what, where + ".workers",
                 absl::StrCat("'", workers, "': expected a whole number from 1 to ", kMaxWorkersPerNode));
    }
    node.workers = static_cast<int>(count);
    total += node.workers;
    if (total > kMaxWorkers) return Bad(what, "nodes", absl::StrCat("more than ", kMaxWorkers, " workers in all"));
    topo.nodes.push_back(std::move(node));
  }
  if (const YAML::Node bw = root["bandwidth"]; bw) {
    if (!bw.IsMap()) return Bad(what, "bandwidth", "expected {intra: BANDWIDTH, inter: BANDWIDTH}");
    RETURN_IF_ERROR(CheckKeys(bw, what, "bandwidth", {"intra", "inter"}));
    for (const char* tier : {"intra", "inter"}) {
      const std::string where = absl::StrCat("bandwidth.", tier);
      ASSIGN_OR_RETURN(std::string value, Scalar(bw, tier, what, where));
      auto bytes = common::ParseBandwidth(value);
      if (!bytes.ok()) return Bad(what, where, std::string(bytes.status().message()));
      (std::string(tier) == "intra" ? topo.intra_bytes_per_s : topo.inter_bytes_per_s) = *bytes;
    }
    topo.has_bandwidth = true;
  }
  return topo;
}

absl::StatusOr<Topology> LoadTopologyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, common::ReadTextFile(path, kMaxTopologyBytes));
  return ParseTopology(text, path);
}

}  // namespace tandem::cli
