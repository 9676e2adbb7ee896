// The cluster a job is planned for (tandemctl plan --topology TOPO.yaml):
//
//   nodes:                       # in rank order: a node's workers take
//     - {name: a, workers: 2}    # consecutive ranks
//     - {name: b, workers: 2}
//   bandwidth: {intra: 10Gbit, inter: 1Gbit}   # optional
//
// Strict: unknown keys, missing keys, duplicate node names, node names
// outside [A-Za-z0-9._-]{1,128}, worker counts outside 1-4096 (and 65536
// in all) and bandwidths ParseBandwidth refuses are InvalidArgument errors
// that name the file and the key.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

struct Topology {
  struct Node {
    std::string name;
    int workers = 0;
  };
  std::vector<Node> nodes;
  bool has_bandwidth = false;
  double intra_bytes_per_s = 0;
  double inter_bytes_per_s = 0;

  int workers() const;
  // Node of each rank: every node's workers in a row, in file order.
  std::vector<std::string> RankNodes() const;
};

// `what` names the text in errors (the file name).
absl::StatusOr<Topology> ParseTopology(const std::string& text, const std::string& what);
absl::StatusOr<Topology> LoadTopologyFile(const std::string& path);

}  // namespace tandem::cli
