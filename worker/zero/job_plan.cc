// PlanInputForJob: see job_plan.h.
#include "worker/zero/job_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/job_model.h"
#include "worker/model/param_layout.h"

namespace tandem::zero {

absl::StatusOr<PlanInput> PlanInputForJob(const tandem::v1::JobSpec& spec, std::vector<std::string> rank_nodes) {
  const int world = spec.cluster().workers();
  if (static_cast<int>(rank_nodes.size()) != world) {
    return absl::InvalidArgumentError(absl::StrCat("the topology has ", rank_nodes.size(),
                                                   " workers, the job asks for ", world, " (cluster.workers)"));
  }
  if (spec.train().trainable_size() > 0) {
    return absl::InvalidArgumentError("frozen parameters (train.trainable) are not modelled");
  }
  if (spec.cluster().sequence_parallel() > 1) {
    return absl::InvalidArgumentError("sequence parallelism (cluster.sequence_parallel) is not modelled");
  }
  auto config = model::JobModelConfig(spec);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("the model's shape (model.config, or a readable model.from/config.json): ",
                                     config.status().message()));
  }
  const model::ParamLayout layout(*config);
  PlanInput in;
  for (int u = 0; u < layout.num_units(); ++u) in.unit_sizes.push_back(layout.unit_size(u));
  in.tied = layout.tied();
  in.rank_nodes = std::move(rank_nodes);
  in.stage = spec.cluster().zero_stage();
  in.bf16 = spec.train().precision() == "bf16";
  in.hpz = spec.zero().hierarchical_partition();
  in.qwz = spec.zero().weight_quantization() == "int8";
  in.int4 = spec.zero().grad_compression() == "int4";
  in.error_feedback = spec.zero().error_feedback();
  in.layer_major = spec.train().accumulation() == "layer_major";
  // Each rank's share of the global batch, in micro-batches (stages 2-3 pad
  // every rank to the largest share).
  const int64_t share = (static_cast<int64_t>(spec.train().global_batch()) + world - 1) / std::max(world, 1);
  const int64_t micro = std::max(1, spec.train().micro_batch());
  in.micro_batches = static_cast<int>(std::max<int64_t>(1, (share + micro - 1) / micro));
  const bool rl = spec.kind() == tandem::v1::JOB_KIND_GRPO || spec.kind() == tandem::v1::JOB_KIND_PPO;
  in.reference = rl && spec.rl().kl_coef() > 0;
  in.shard_reference = spec.rl().shard_reference();
  return in;
}

}  // namespace tandem::zero
