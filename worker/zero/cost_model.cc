// PlanStep, PredictCommTime: see cost_model.h.
#include "worker/zero/cost_model.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::zero {
namespace {

constexpr int kIntra = 0, kInter = 1;

size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

// Replays the collectives of one step over every communicator of the job
// and adds each rank's sent bytes to its row, by the tier of the peer.
class Replay {
 public:
  explicit Replay(const std::vector<std::string>& nodes) : nodes_(nodes), sent_(nodes.size()) {}

  // Ring allgather of counts[i] floats from member i: member i sends every
  // piece but member i+1's.
  void Allgather(const std::vector<int>& members, const std::vector<size_t>& counts) {
    const int n = static_cast<int>(members.size());
    if (n < 2 || Sum(counts) == 0) return;
    for (int i = 0; i < n; ++i) {
      const uint64_t bytes = 4 * (Sum(counts) - counts[(i + 1) % n]);
      Add(members, i, (i + 1) % n, PlanKind::kAllgather, bytes);
    }
  }
  // Ring reduce-scatter to counts[i] floats on member i: member i sends
  // every piece but its own.
  void ReduceScatter(const std::vector<int>& members, const std::vector<size_t>& counts) {
    const int n = static_cast<int>(members.size());
    if (n < 2 || Sum(counts) == 0) return;
    for (int i = 0; i < n; ++i) Add(members, i, (i + 1) % n, PlanKind::kReduceScatter, 4 * (Sum(counts) - counts[i]));
  }
  // Ring allreduce of `floats` values (reduce-scatter then allgather).
  void Allreduce(const std::vector<int>& members, size_t floats) {
    const uint64_t n = members.size();
    if (n < 2 || floats == 0) return;
    const uint64_t bytes = 2 * (n - 1) * (4 * static_cast<uint64_t>(floats)) / n;
    for (size_t i = 0; i < n; ++i)
      Add(members, static_cast<int>(i), static_cast<int>((i + 1) % n), PlanKind::kAllreduce, bytes);
  }
  // LoCo's exchange: member i sends member p's piece, int4, to p.
  void Int4ReduceScatter(const std::vector<int>& members, const std::vector<size_t>& counts) {
    const int n = static_cast<int>(members.size());
    if (n < 2) return;
    for (int i = 0; i < n; ++i) {
      for (int p = 0; p < n; ++p) {
        if (p != i && counts[p] > 0) Add(members, i, p, PlanKind::kSendRecv, PlanInt4WireBytes(counts[p]));
      }
    }
  }
  // LoCo's allreduce: the exchange, then an allgather of the owners' int4
  // sums, each padded to whole floats.
  void Int4Allreduce(const std::vector<int>& members, size_t floats) {
    const int n = static_cast<int>(members.size());
    if (n < 2 || floats == 0) return;
    const std::vector<size_t> counts = PlanSplitEven(floats, n);
    Int4ReduceScatter(members, counts);
    std::vector<size_t> wire(n);
    for (int j = 0; j < n; ++j) wire[j] = (PlanInt4WireBytes(counts[j]) + 3) / 4;
    Allgather(members, wire);
  }

  std::vector<TierKindBytes>& sent() { return sent_; }

 private:
  void Add(const std::vector<int>& members, int from, int to, PlanKind kind, uint64_t bytes) {
    const int a = members[from], b = members[to];
    sent_[a][static_cast<int>(kind)][nodes_[a] == nodes_[b] ? kIntra : kInter] += bytes;
  }

  const std::vector<std::string>& nodes_;
  std::vector<TierKindBytes> sent_;
};

// Gathers of each unit per step at stage 3 (see the header comment).
std::vector<uint64_t> GathersPerUnit(const PlanInput& in) {
  const size_t units = in.unit_sizes.size();
  const uint64_t m = in.micro_batches;
  std::vector<uint64_t> g(units, in.layer_major ? m + 1 : 2 * m);
  if (in.tied) {
    g.front() = in.layer_major ? 2 * m + 2 : 3 * m + 1;
    g.back() = in.layer_major ? m + 1 : 2 * m;
  } else {
    g.front() = m + 1;
    g.back() = in.layer_major ? 2 * m + 1 : 3 * m;
  }
  return g;
}

std::vector<size_t> Int8Wire(const std::vector<size_t>& counts) {
  std::vector<size_t> w(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) w[i] = PlanInt8WireFloats(counts[i]);
  return w;
}

std::vector<size_t> Halves(const std::vector<size_t>& counts) {
  std::vector<size_t> w(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) w[i] = (counts[i] + 1) / 2;
  return w;
}

absl::Status CheckInput(const PlanInput& in) {
  if (in.unit_sizes.size() < 2) return absl::InvalidArgumentError("cost model: the model has fewer than two units");
  if (in.rank_nodes.empty()) return absl::InvalidArgumentError("cost model: no ranks");
  if (in.stage < 0 || in.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.zero_stage ", in.stage, " (expected 0-3)"));
  }
  if (in.micro_batches < 1) return absl::InvalidArgumentError("cost model: fewer than one micro-batch per rank");
  if ((in.hpz || in.qwz) && in.stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(in.hpz ? "zero.hierarchical_partition" : "zero.weight_quantization",
                                                   " needs ZeRO stage 3, not stage ", in.stage));
  }
  if ((in.hpz || in.qwz) && in.bf16) {
    return absl::InvalidArgumentError(
        "zero.hierarchical_partition and zero.weight_quantization need train.precision fp32");
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view PlanKindName(PlanKind kind) {
  switch (kind) {
    case PlanKind::kAllreduce:
      return "allreduce";
    case PlanKind::kReduceScatter:
      return "reduce_scatter";
    case PlanKind::kAllgather:
      return "allgather";
    case PlanKind::kBroadcast:
      return "broadcast";
    case PlanKind::kSendRecv:
      return "send_recv";
  }
  return "?";
}

std::vector<size_t> PlanSplitEven(size_t n, int parts) {
  std::vector<size_t> counts(parts, n / parts);
  for (size_t i = 0; i < n % parts; ++i) counts[i] += 1;
  return counts;
}

size_t PlanInt8WireFloats(size_t n) { return (n + 255) / 256 + (n + 3) / 4; }

size_t PlanInt4WireBytes(size_t n) { return (n + 1) / 2 + 4 * ((n + 63) / 64); }

absl::StatusOr<StepPlan> PlanStep(const PlanInput& in) {
  if (absl::Status s = CheckInput(in); !s.ok()) return s;
  const int world = static_cast<int>(in.rank_nodes.size());
  StepPlan plan;

  // Node groups: nodes in the order of their first rank; local index = a
  // rank's position on its node (common/rank_topology.h).
  std::map<std::string, int> node_index;
  std::vector<std::vector<int>> node_ranks;
  std::vector<int> local_of(world);
  for (int r = 0; r < world; ++r) {
    auto [it, fresh] = node_index.emplace(in.rank_nodes[r], static_cast<int>(node_ranks.size()));
    if (fresh) node_ranks.emplace_back();
    local_of[r] = static_cast<int>(node_ranks[it->second].size());
    node_ranks[it->second].push_back(r);
  }
  const int nodes = static_cast<int>(node_ranks.size());
  bool uniform = true;
  for (const auto& n : node_ranks) uniform = uniform && n.size() == node_ranks.front().size();
  const int locals = static_cast<int>(node_ranks.front().size());
  plan.num_nodes = nodes;
  plan.ranks_per_node = uniform ? locals : 0;
  if (in.hpz && !uniform) {
    return absl::InvalidArgumentError("zero.hierarchical_partition needs the same number of workers on every node");
  }
  std::vector<std::vector<int>> inter_groups(uniform ? locals : 0);
  for (int l = 0; l < static_cast<int>(inter_groups.size()); ++l) {
    for (const auto& n : node_ranks) inter_groups[l].push_back(n[l]);
  }
  std::vector<int> flat(world);
  std::iota(flat.begin(), flat.end(), 0);

  Replay replay(in.rank_nodes);
  const size_t units = in.unit_sizes.size();
  const uint64_t m = in.micro_batches;
  const bool int4 = in.int4 && world > 1;
  size_t psi = 0;
  for (size_t s : in.unit_sizes) psi += s;

  // Gradient reductions.
  if (in.stage <= 1) {
    if (int4) {
      for (size_t u : in.unit_sizes) replay.Int4Allreduce(flat, u);
    } else if (in.layer_major) {
      for (size_t u : in.unit_sizes) replay.Allreduce(flat, u);
    } else {
      replay.Allreduce(flat, psi);
    }
  } else {
    // Per unit, once per micro-batch (layer-major: once per step).
    const uint64_t times = in.layer_major ? 1 : m;
    for (uint64_t t = 0; t < times; ++t) {
      for (size_t u : in.unit_sizes) {
        if (in.hpz) {
          const std::vector<size_t> chunks = PlanSplitEven(u, locals);
          for (const auto& n : node_ranks) replay.ReduceScatter(n, chunks);
          for (int l = 0; l < locals; ++l) {
            const std::vector<size_t> subs = PlanSplitEven(chunks[l], nodes);
            if (int4) {
              replay.Int4ReduceScatter(inter_groups[l], subs);
            } else {
              replay.ReduceScatter(inter_groups[l], subs);
            }
          }
        } else if (int4) {
          replay.Int4ReduceScatter(flat, PlanSplitEven(u, world));
        } else {
          replay.ReduceScatter(flat, PlanSplitEven(u, world));
        }
      }
    }
  }
  // Stages 1-2: the updated pieces go to every rank after the step.
  if (in.stage == 1 || in.stage == 2) {
    for (size_t u : in.unit_sizes) {
      const std::vector<size_t> counts = PlanSplitEven(u, world);
      replay.Allgather(flat, in.bf16 ? Halves(counts) : counts);
    }
  }
  // Stage 3: unit gathers for forward and backward, and the hpZ refresh.
  if (in.stage == 3) {
    const std::vector<uint64_t> gathers = GathersPerUnit(in);
    for (size_t i = 0; i < units; ++i) {
      const size_t u = in.unit_sizes[i];
      for (uint64_t t = 0; t < gathers[i]; ++t) {
        if (in.hpz) {
          const std::vector<size_t> chunks = PlanSplitEven(u, locals);
          std::vector<size_t> counts = chunks;
          if (in.qwz) {
            for (int l = 0; l < locals; ++l) counts[l] = Sum(Int8Wire(PlanSplitEven(chunks[l], nodes)));
          }
          for (const auto& n : node_ranks) replay.Allgather(n, counts);
        } else {
          const std::vector<size_t> counts = PlanSplitEven(u, world);
          replay.Allgather(flat, in.qwz ? Int8Wire(counts) : in.bf16 ? Halves(counts) : counts);
        }
      }
      if (in.hpz) {
        const std::vector<size_t> chunks = PlanSplitEven(u, locals);
        for (int l = 0; l < locals; ++l) {
          const std::vector<size_t> subs = PlanSplitEven(chunks[l], nodes);
          replay.Allgather(inter_groups[l], in.qwz ? Int8Wire(subs) : subs);
        }
      }
    }
  }
  plan.rank_sent = std::move(replay.sent());
  for (const auto& r : plan.rank_sent) {
    for (int k = 0; k < kNumPlanKinds; ++k) {
      for (int t = 0; t < 2; ++t) plan.job_sent[k][t] += r[k][t];
    }
  }

  // Memory of rank 0 (its pieces are the largest: SplitEven puts the
  // remainders first).
  uint64_t shard = 0, chunk = 0, secondary = 0;
  for (size_t u : in.unit_sizes) {
    if (in.hpz) {
      const std::vector<size_t> chunks = PlanSplitEven(u, locals);
      const std::vector<size_t> subs = PlanSplitEven(chunks[0], nodes);
      shard += subs[0];
      chunk += chunks[0];
      secondary += in.qwz ? Sum(Int8Wire(subs)) : chunks[0];
    } else {
      shard += PlanSplitEven(u, world)[0];
    }
  }
  MemoryPlan& mem = plan.memory;
  const bool master_sharded = in.stage == 3 || (in.bf16 && in.stage >= 1);
  mem.params = 4 * (master_sharded ? shard : psi);
  if (in.bf16) mem.compute = 2 * (in.stage == 3 ? shard : psi);
  if (in.hpz) mem.compute += 4 * secondary;
  mem.gradients = 4 * (in.stage >= 2 ? shard : psi);
  mem.optimizer = 8 * (in.stage >= 1 ? shard : psi);
  if (int4 && in.error_feedback) {
    mem.grad_error = in.hpz ? 4 * chunk : 4 * psi + (in.stage <= 1 ? 4 * shard : 0);
  }
  if (in.reference) mem.reference = 4 * (in.shard_reference ? PlanSplitEven(psi, world)[0] : psi);
  mem.total = mem.params + mem.compute + mem.gradients + mem.optimizer + mem.grad_error + mem.reference;
  return plan;
}

CommTime PredictCommTime(const StepPlan& plan, const std::vector<std::string>& rank_nodes, double intra_bytes_per_s,
                         double inter_bytes_per_s) {
  CommTime t;
  std::map<std::string, double> node_inter;
  for (size_t r = 0; r < plan.rank_sent.size() && r < rank_nodes.size(); ++r) {
    double intra = 0, inter = 0;
    for (int k = 0; k < kNumPlanKinds; ++k) {
      intra += static_cast<double>(plan.rank_sent[r][k][kIntra]);
      inter += static_cast<double>(plan.rank_sent[r][k][kInter]);
    }
    node_inter[rank_nodes[r]] += inter;
    if (intra_bytes_per_s > 0) t.intra_seconds = std::max(t.intra_seconds, intra / intra_bytes_per_s);
  }
  for (const auto& [node, bytes] : node_inter) {
    if (inter_bytes_per_s > 0) t.inter_seconds = std::max(t.inter_seconds, bytes / inter_bytes_per_s);
  }
  t.total_seconds = t.intra_seconds + t.inter_seconds;
  return t;
}

}  // namespace tandem::zero
