// Cost model of one ZeRO training step: the bytes every rank sends per
// collective kind and network tier, the model-state memory per rank, and a
// bandwidth-only estimate of the communication time.
//
// The byte counts follow what ZeroOptimizer and the model send, call by
// call, on the Gloo algorithms the tier ledger (worker/comm/tiered_collective.h)
// accounts for: ring allgather / reduce-scatter / allreduce sending to the
// next rank of the communicator, LoCo's pairwise send/recv exchange, and the
// per-node communicators of hpZ (worker/comm/node_collectives.h). For an SFT
// step with M micro-batches per rank:
//   stages 0-1: one fp32 allreduce of the gradients at the step (layer-major:
//     one per unit as its gradient completes; LoCo: per unit, an int4
//     exchange plus an allgather of the int4 sums);
//   stages 2-3: one reduce-scatter per unit per micro-batch (layer-major:
//     per step); LoCo: the int4 exchange instead (with hpZ: fp32 inside the
//     node, int4 across nodes);
//   stages 1-2: an allgather of every unit after the optimizer step (bf16:
//     of the bf16 compute copy);
//   stage 3: the unit gathers of forward and backward (below), fp32, bf16,
//     or int8 with scales (qwZ); with hpZ inside the node, plus the refresh
//     of the secondary copy across nodes after the optimizer step.
// Stage-3 gathers per step (L layers; unit 0 = embeddings, unit L+1 = final
// norm and, untied, the LM head), from the prefetch order of the decoder:
//   untied:              unit 0: M + 1, layers: 2M,    unit L+1: 3M
//   tied:                unit 0: 3M + 1, layers: 2M,   unit L+1: 2M
//   untied, layer-major: unit 0: M + 1, layers: M + 1, unit L+1: 2M + 1
//   tied, layer-major:   unit 0: 2M + 2, layers: M + 1, unit L+1: M + 1
// (the final unit is gathered again for the LM head after the final norm
// released it; the backward of layer 0 prefetches unit 0, which the next
// micro-batch's forward reuses and the step's end drops).
// Scalar reductions (loss, token counts, gradient norm: tens of bytes) are
// left out. Ranks sit on nodes as `rank_nodes` says (the coordinator orders
// a job's workers by name).
//
// Pure functions; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::zero {

enum class PlanKind { kAllreduce = 0, kReduceScatter, kAllgather, kBroadcast, kSendRecv };
inline constexpr int kNumPlanKinds = 5;
// The names of the step metrics and /metrics: "allreduce", "reduce_scatter",
// "allgather", "broadcast", "send_recv".
std::string_view PlanKindName(PlanKind kind);

struct PlanInput {
  std::vector<size_t> unit_sizes;       // floats per unit, in model order
  bool tied = false;                    // the LM head is unit 0's embeddings
  std::vector<std::string> rank_nodes;  // node of each rank; size = world
  int stage = 0;                        // ZeRO stage 0-3
  bool bf16 = false;                    // train.precision bf16
  bool hpz = false;                     // zero.hierarchical_partition
  bool qwz = false;                     // zero.weight_quantization int8
  bool int4 = false;                    // zero.grad_compression int4
  bool error_feedback = true;           // zero.error_feedback
  bool layer_major = false;             // train.accumulation layer_major
  int micro_batches = 1;                // M: forward/backward passes per rank per step
  bool reference = false;               // a KL reference policy is held
  bool shard_reference = false;         // rl.shard_reference
};

// Bytes sent in one step, [kind][tier] (tier 0 intra-node, 1 inter-node).
using TierKindBytes = std::array<std::array<uint64_t, 2>, kNumPlanKinds>;

// Model state of one rank (the largest shard, rank 0), bytes.
struct MemoryPlan {
  uint64_t params = 0;      // fp32 masters (full or shard)
  uint64_t compute = 0;     // bf16 compute copy and the hpZ secondary copy
  uint64_t gradients = 0;   // fp32 gradients (full or shard)
  uint64_t optimizer = 0;   // Adam moments m and v
  uint64_t grad_error = 0;  // LoCo error feedback
  uint64_t reference = 0;   // KL reference policy
  uint64_t total = 0;
};

struct StepPlan {
  std::vector<TierKindBytes> rank_sent;  // per rank
  TierKindBytes job_sent{};              // summed over ranks
  MemoryPlan memory;
  int num_nodes = 1;
  int ranks_per_node = 1;  // when uniform (hpZ needs it)
};

// InvalidArgument naming the option when the input cannot run (hpZ without
// stage 3 or with unequal nodes, qwZ without stage 3, an empty model, ...).
absl::StatusOr<StepPlan> PlanStep(const PlanInput& in);

// Seconds of communication per step from bandwidths (bytes/s): for each
// node, its ranks' inter-node bytes share the node's link; intra-node bytes
// are timed per rank. The slowest node's inter-node time plus the slowest
// rank's intra-node time: no latency, no overlap with compute.
struct CommTime {
  double intra_seconds = 0;
  double inter_seconds = 0;
  double total_seconds = 0;
};
CommTime PredictCommTime(const StepPlan& plan, const std::vector<std::string>& rank_nodes, double intra_bytes_per_s,
                         double inter_bytes_per_s);

// Wire sizes the collectives use (worker/comm): SplitEven pieces, int8
// weights with fp32 scales, int4 gradients with fp32 scales.
std::vector<size_t> PlanSplitEven(size_t n, int parts);
size_t PlanInt8WireFloats(size_t n);
size_t PlanInt4WireBytes(size_t n);

}  // namespace tandem::zero
