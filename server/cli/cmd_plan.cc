// tandemctl plan JOB.yaml --topology TOPO.yaml: the cost model of one
// training step (worker/zero/cost_model.h) for a job on a described
// cluster, as a table or (--json / --output json) one JSON object.
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/bandwidth.h"
#include "common/job_spec.h"
#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"
#include "server/cli/job_file.h"
#include "server/cli/topology_file.h"
#include "worker/zero/cost_model.h"
#include "worker/zero/job_plan.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "Usage: tandemctl plan JOB.yaml --topology TOPO.yaml [--set key.path=value ...] [--json]\n"
    "Predicts, for one optimizer step of the job on the cluster TOPO.yaml describes, without\n"
    "running anything:\n"
    "  - the bytes each rank sends per collective kind (allgather, reduce_scatter, allreduce,\n"
    "    send_recv) on each network tier (intra-node, inter-node), following what the ZeRO\n"
    "    stage and the zero.* / train.accumulation / train.precision options send;\n"
    "  - the model-state memory per rank (parameters, compute copies, gradients, optimizer\n"
    "    moments, LoCo error feedback, KL reference);\n"
    "  - the communication time those bytes take at TOPO.yaml's bandwidths (no latency,\n"
    "    no overlap with compute).\n"
    "TOPO.yaml (see configs/topology-2x2.yaml):\n"
    "  nodes: [{name: a, workers: 2}, {name: b, workers: 2}]   # ranks in this order\n"
    "  bandwidth: {intra: 10Gbit, inter: 1Gbit}                 # Gbit, Mbit, GB/s, MB/s\n"
    "The nodes' workers must add up to the job's cluster.workers. Communication is modelled\n"
    "for SFT jobs; for GRPO and PPO jobs only the memory is shown.\n"
    "  --json    one JSON object (the same as --output json)\n";

std::string Kib(uint64_t bytes) { return bytes == 0 ? "0" : FormatBytes(static_cast<int64_t>(bytes)); }

std::string Seconds(double s) {
  if (s <= 0) return "0 s";
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.1f ms", s * 1e3);
  return absl::StrFormat("%.2f s", s);
}

// Option labels for the header line.
std::string Options(const tandem::v1::JobSpec& spec, const zero::PlanInput& in) {
  std::vector<std::string> o = {absl::StrCat("ZeRO stage ", in.stage)};
  if (in.bf16) o.push_back("bf16 compute copy");
  if (in.hpz) o.push_back("hpZ");
  if (in.qwz) o.push_back("qwZ int8");
  if (in.int4) o.push_back(in.error_feedback ? "LoCo int4" : "int4 without error feedback");
  if (in.layer_major) o.push_back("layer-major accumulation");
  if (in.reference) o.push_back(in.shard_reference ? "sharded KL reference" : "KL reference");
  if (spec.train().activation_checkpointing() != "" && spec.train().activation_checkpointing() != "none") {
    o.push_back(absl::StrCat("activation checkpointing ", spec.train().activation_checkpointing()));
  }
  return absl::StrJoin(o, ", ");
}

}  // namespace

int CmdPlan(const Args& args) {
  int code = 0;
  auto p = ParseOrUsage(args, {{"set", "topology"}, {"json"}, {}}, kUsage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: plan needs exactly one job file\n\n" << kUsage;
    return kExitUsage;
  }
  if (!p->Has("topology")) {
    std::cerr << "tandemctl: plan needs --topology TOPO.yaml\n\n" << kUsage;
    return kExitUsage;
  }
  const bool json = p->Has("json") || p->Get("output") == "json";
  auto spec = LoadJobForCli(p->positional[0], *p);
  if (!spec.ok()) {
    std::cerr << "tandemctl: invalid job: " << spec.status().message() << "\n";
    return kExitUsage;
  }
  auto topo = LoadTopologyFile(p->Get("topology"));
  if (!topo.ok()) {
    std::cerr << "tandemctl: invalid topology: " << topo.status().message() << "\n";
    return kExitUsage;
  }
  const int world = spec->cluster().workers();
  if (topo->workers() != world) {
    std::cerr << "tandemctl: " << p->Get("topology") << " has " << topo->workers() << " worker(s) on "
              << topo->nodes.size() << " node(s), the job asks for " << world
              << " (cluster.workers): describe the job's workers, or plan another count with --set cluster.workers="
              << topo->workers() << "\n";
    return kExitUsage;
  }
  auto input = zero::PlanInputForJob(*spec, topo->RankNodes());
  if (!input.ok()) {
    std::cerr << "tandemctl: cannot plan the job: " << input.status().message() << "\n";
    return kExitUsage;
  }
  const zero::PlanInput& in = *input;
  const bool sft = spec->kind() == tandem::v1::JOB_KIND_SFT;
  auto plan = zero::PlanStep(in);
  if (!plan.ok()) {
    std::cerr << "tandemctl: cannot plan the job: " << plan.status().message() << "\n";
    return kExitUsage;
  }
  size_t psi = 0;
  for (size_t u : in.unit_sizes) psi += u;
  const zero::CommTime time = topo->has_bandwidth ? zero::PredictCommTime(*plan, in.rank_nodes, topo->intra_bytes_per_s,
                                                                          topo->inter_bytes_per_s)
                                                  : zero::CommTime{};
  const char* kTierNames[2] = {"intra_node", "inter_node"};
  const zero::MemoryPlan& mem = plan->memory;

  if (json) {
    nlohmann::json j;
    j["job"] = spec->name();
    j["kind"] = common::KindName(spec->kind());
    j["workers"] = world;
    j["nodes"] = topo->nodes.size();
    j["parameters"] = psi;
    j["units"] = in.unit_sizes.size();
    j["zero_stage"] = in.stage;
    j["micro_batches"] = in.micro_batches;
    j["communication_modelled"] = sft;
    if (sft) {
      nlohmann::json job = nlohmann::json::object(), per_rank = nlohmann::json::object();
      uint64_t tier_total[2] = {0, 0};
      for (int k = 0; k < zero::kNumPlanKinds; ++k) {
        const auto& b = plan->job_sent[k];
        if (b[0] == 0 && b[1] == 0) continue;
        const std::string kind(zero::PlanKindName(static_cast<zero::PlanKind>(k)));
        for (int t = 0; t < 2; ++t) {
          job[kind][kTierNames[t]] = b[t];
          per_rank[kind][kTierNames[t]] = static_cast<double>(b[t]) / world;
          tier_total[t] += b[t];
        }
      }
      j["job_bytes_sent"] = job;
      j["rank_bytes_sent_mean"] = per_rank;
      j["job_bytes_sent_total"] = {{"intra_node", tier_total[0]}, {"inter_node", tier_total[1]}};
      if (topo->has_bandwidth) {
        j["bandwidth_bytes_per_s"] = {{"intra_node", topo->intra_bytes_per_s}, {"inter_node", topo->inter_bytes_per_s}};
        j["comm_seconds"] = {
            {"intra_node", time.intra_seconds}, {"inter_node", time.inter_seconds}, {"total", time.total_seconds}};
      }
    }
    j["memory_bytes_per_rank"] = {
        {"params", mem.params},       {"compute_copies", mem.compute}, {"gradients", mem.gradients},
        {"optimizer", mem.optimizer}, {"grad_error", mem.grad_error},  {"reference", mem.reference},
        {"total", mem.total}};
    std::cout << j.dump() << "\n";
    return kExitOk;
  }

  std::vector<std::string> nodes;
  for (const auto& n : topo->nodes) nodes.push_back(absl::StrCat(n.name, ": ", n.workers));
  std::cout << "job " << spec->name() << " (" << common::KindName(spec->kind()) << "), " << world << " workers on "
            << topo->nodes.size() << " node(s) (" << absl::StrJoin(nodes, ", ") << ")\n"
            << "model: " << psi << " parameters in " << in.unit_sizes.size() << " units; " << Options(*spec, in)
            << (sft ? absl::StrCat("; ", in.micro_batches, " micro-batch(es) per rank per step") : "") << "\n\n";
  if (sft) {
    std::cout << "bytes sent per optimizer step, per rank (mean over ranks):\n";
    std::vector<std::vector<std::string>> rows = {{"KIND", "INTRA-NODE", "INTER-NODE"}};
    uint64_t total[2] = {0, 0};
    for (int k = 0; k < zero::kNumPlanKinds; ++k) {
      const auto& b = plan->job_sent[k];
      if (b[0] == 0 && b[1] == 0) continue;
      rows.push_back(
          {std::string(zero::PlanKindName(static_cast<zero::PlanKind>(k))), Kib(b[0] / world), Kib(b[1] / world)});
      total[0] += b[0];
      total[1] += b[1];
    }
    rows.push_back({"total", Kib(total[0] / world), Kib(total[1] / world)});
    rows.push_back({"job total", Kib(total[0]), Kib(total[1])});
    std::cout << Table(rows) << "\n";
    if (topo->has_bandwidth) {
      std::cout << "predicted communication time per step at intra " << common::FormatBandwidth(topo->intra_bytes_per_s)
                << ", inter " << common::FormatBandwidth(topo->inter_bytes_per_s) << ": " << Seconds(time.total_seconds)
                << " (intra-node " << Seconds(time.intra_seconds) << ", inter-node " << Seconds(time.inter_seconds)
                << "; bandwidth only: no latency, no overlap with compute)\n\n";
    } else {
      std::cout << "(no bandwidth in " << p->Get("topology") << ": no time predicted)\n\n";
    }
  } else {
    std::cout << "communication: modelled for SFT jobs only\n\n";
  }
  std::vector<std::vector<std::string>> rows = {{"MODEL STATE PER RANK", "BYTES"}};
  auto row = [&](const char* name, uint64_t b) {
    if (b > 0) rows.push_back({name, FormatBytes(static_cast<int64_t>(b))});
  };
  row("parameters (fp32 masters)", mem.params);
  row("compute copies (bf16, hpZ secondary)", mem.compute);
  row("gradients", mem.gradients);
  row("optimizer moments", mem.optimizer);
  row("LoCo error feedback", mem.grad_error);
  row("KL reference", mem.reference);
  row("total", mem.total);
  std::cout << Table(rows);
  return kExitOk;
}

}  // namespace tandem::cli
