#include "common/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <yaml-cpp/yaml.h>
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config_table.h"
#include "common/status_util.h"
#include "common/yaml_proto.h"
#include "worker/model/job_model.h"
#include "worker/model/param_layout.h"
#include "worker/model/trainable.h"

namespace tandem::common {
namespace {

using tandem::v1::DeviceKind;
using tandem::v1::JobKind;
using tandem::v1::JobSpec;

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

bool ValidHostPort(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  return absl::SimpleAtoi(s.substr(colon + 1), &port) && port > 0 && port < 65536;
}

absl::Status ValidateModel(const JobSpec& spec) {
  const auto& m = spec.model();
  const bool has_config = m.has_config();
  if (has_config == !m.from().empty()) {
    return Invalid("model", has_config ? "set either config or from, not both"
                                       : "required: set model.config (inline) or model.from (HF model dir)");
  }
  if (!has_config) return absl::OkStatus();
  // The model's own rules (model::Validate), the ones every worker applies.
  auto config = model::ModelConfigFromJob(m.config());
  RETURN_IF_ERROR(config.status());
  const int soft = spec.train().soft_prompt_tokens();
  if (soft > 0) {
    config->tandem_soft_prompt_tokens = soft;
    if (absl::Status st = model::Validate(*config); !st.ok()) {
      return Invalid("train.soft_prompt_tokens",
                     absl::StrCat(soft, " must be below model.config.max_position_embeddings (",
                                  config->max_position_embeddings, ")"));
    }
  }
  if (spec.train().trainable_size() > 0) {
    // The patterns against the model's tensor names (with model.from the
    // worker checks them at SETUP).
    const model::ParamLayout layout(*config);
    RETURN_IF_ERROR(
        model::MatchTrainable(layout, {spec.train().trainable().begin(), spec.train().trainable().end()}).status());
  }
  const auto& c = m.config();
  for (int i = 0; i < spec.rl().stop_token_ids_size(); ++i) {
    if (spec.rl().stop_token_ids(i) >= c.vocab_size()) {
      return Invalid(
          absl::StrCat("rl.stop_token_ids[", i, "]"),
          absl::StrCat(spec.rl().stop_token_ids(i), " must be < model.config.vocab_size = ", c.vocab_size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string KindName(JobKind kind) { return EnumYamlName(tandem::v1::JobKind_descriptor()->FindValueByNumber(kind)); }
std::string DeviceName(DeviceKind device) {
  return EnumYamlName(tandem::v1::DeviceKind_descriptor()->FindValueByNumber(device));
}

JobSpec DefaultJobSpec() {
  JobSpec s;
  SetDefaults(JobSpecTable(), &s);
  return s;
}

void ApplyJobDefaults(JobSpec* spec) {
  ApplyDefaults(JobSpecTable(), spec);
  // Defaults that depend on other keys beyond a copy.
  if (spec->name().empty()) spec->set_name(absl::StrCat(KindName(spec->kind()), "-job"));
  auto* task = spec->mutable_task();
  if (task->name().empty() && task->data().empty() && spec->data().train().empty()) {
    task->set_name("arithmetic");
  }
  if (task->name() == "arithmetic") {
    if (task->op().empty()) task->set_op("add");
    if (task->digits() == 0) task->set_digits(2);
  }
}

// data: and reward: (real data with a tokenizer from model.from).
static absl::Status ValidateData(const JobSpec& spec) {
  const auto& d = spec.data();
  const bool grpo = spec.kind() == tandem::v1::JOB_KIND_GRPO;
  const bool has_data = !d.train().empty();
  const bool any_data_key = !d.eval().empty() || !d.prompt_key().empty() || !d.messages_key().empty() ||
                            !d.answer_key().empty() || !d.response_key().empty() || !d.system_prompt().empty() ||
                            d.chat() || d.max_prompt_tokens() > 0 || d.skip_bad_rows() || d.eval_samples() > 0;
  if (!has_data) {
    if (any_data_key) return Invalid("data.train", "required when other data keys are set");
    if (!spec.reward().type().empty()) return Invalid("reward.type", "only with data.train");
    if (spec.rl().stop_size() > 0) return Invalid("rl.stop", "only with data.train (stop strings need a tokenizer)");
    return absl::OkStatus();
  }
  if (d.prompt_key().empty() == d.messages_key().empty()) {
    return Invalid("data.prompt_key", "set exactly one of data.prompt_key and data.messages_key");
  }
  if (d.chat() && d.prompt_key().empty()) return Invalid("data.chat", "only with data.prompt_key");
  if (spec.model().from().empty()) {
    return Invalid("data.train", "needs model.from: a model directory with its tokenizer.json");
  }
  if (spec.placement().mode() == "disaggregated") {
    return Invalid("data.train", "is not supported with placement.mode: disaggregated yet");
  }
  for (int i = 0; i < spec.rl().stop_size(); ++i) {
    if (spec.rl().stop(i).empty()) return Invalid(absl::StrCat("rl.stop[", i, "]"), "must not be empty");
  }
  if (grpo) {
    if (d.answer_key().empty()) return Invalid("data.answer_key", "required for grpo");
    if (!d.response_key().empty() && spec.init().sft_steps() == 0) {
      return Invalid("data.response_key", "only for sft (or a grpo warm start: init.sft.steps)");
    }
    if (spec.reward().type().empty() && spec.task().reward_service().empty()) {
      return Invalid("reward.type",
                     "required for grpo on data (gsm8k, math, exact, regex), or set task.reward_service");
    }
  } else if (!spec.reward().type().empty()) {
    return Invalid("reward.type", "only for grpo");
  }
  const auto& r = spec.reward();
  if (r.type() == "regex" && r.pattern().empty()) return Invalid("reward.pattern", "required with reward.type: regex");
  if (r.type() != "regex" && !r.pattern().empty()) return Invalid("reward.pattern", "only with reward.type: regex");
  return absl::OkStatus();
}

absl::Status CheckJobSpecKeys(const JobSpec& spec) { return CheckProtoRules(spec, JobSpecTable().options); }

absl::Status ValidateJobSpec(const JobSpec& spec) {
  RETURN_IF_ERROR(CheckJobSpecKeys(spec));
  if (spec.kind() == tandem::v1::JOB_KIND_PPO) {
    return Invalid("kind", "'ppo' is not supported yet; allowed: sft, grpo");
  }
  if (spec.kind() != tandem::v1::JOB_KIND_SFT && spec.kind() != tandem::v1::JOB_KIND_GRPO) {
    return Invalid("kind", "required; allowed: sft, grpo");
  }
  if (!ValidName(spec.name())) {
    return Invalid("name",
                   absl::StrCat("'", spec.name().substr(0, 64), "' must be 1-128 characters of A-Z a-z 0-9 . _ -"));
  }
  RETURN_IF_ERROR(ValidateModel(spec));
  const auto& task = spec.task();
  if (!task.name().empty() && !task.data().empty()) return Invalid("task", "set either name or data, not both");
  const bool has_data = !spec.data().train().empty();
  if (has_data && (!task.name().empty() || !task.data().empty())) {
    return Invalid("data.train", "set either data or task.name/task.data, not both");
  }
  if (!has_data && task.name().empty() && task.data().empty()) {
    return Invalid("task", "required: set task.name, task.data or data.train");
  }
  if (!task.data().empty() && spec.kind() == tandem::v1::JOB_KIND_GRPO) {
    return Invalid("task.data",
                   "is SFT data; grpo needs prompts with reference answers: use data.train "
                   "with data.answer_key and reward.type");
  }
  RETURN_IF_ERROR(ValidateData(spec));
  if (!task.name().empty() && task.name() != "arithmetic") {
    // The worker's task factory refuses these too; say so at submit time.
    if (!task.op().empty()) {
      return Invalid("task.op", absl::StrCat("applies only to the arithmetic task; remove it for ", task.name()));
    }
    if (task.digits() != 0) {
      return Invalid(
          "task.digits",
          absl::StrCat("applies only to the arithmetic task; use task.min_len/task.max_len for ", task.name()));
    }
  }
  if (task.min_len() > task.max_len()) {
    return Invalid("task.min_len", absl::StrCat(task.min_len(), " must be <= task.max_len = ", task.max_len()));
  }
  if (!task.reward_service().empty() && !ValidHostPort(task.reward_service())) {
    return Invalid("task.reward_service", absl::StrCat("'", task.reward_service(), "' must be host:port"));
  }
  const auto& cl = spec.cluster();
  if (cl.min_workers() > cl.workers()) {
    return Invalid("cluster.min_workers",
                   absl::StrCat(cl.min_workers(), " must be <= cluster.workers = ", cl.workers()));
  }
  const auto& pl = spec.placement();
  const bool disaggregated = pl.mode() == "disaggregated";
  if (spec.recovery().degraded()) {
    // Any ZeRO stage: at stages 1-3 a lost rank's shard comes from its
    // neighbour's peer copy (worker/engine/live_restore.h).
    if (disaggregated) return Invalid("recovery.degraded", "is only for placement.mode: colocated");
    if (cl.workers() < 2) return Invalid("recovery.degraded", "needs cluster.workers >= 2");
  } else if (spec.recovery().degraded_cheap_backward()) {
    return Invalid("recovery.degraded_cheap_backward", "only with recovery.degraded: true");
  } else if (spec.recovery().degraded_low_rank() > 0) {
    return Invalid("recovery.degraded_low_rank", "only with recovery.degraded: true");
  }
  if (spec.rollout().kv_cache_bytes() > 0 && spec.rollout().kv_cache_fraction() > 0) {
    return Invalid("rollout.kv_cache_fraction",
                   "set at most one of rollout.kv_cache_bytes and rollout.kv_cache_fraction");
  }
  const auto& zero = spec.zero();
  if (zero.hierarchical_partition()) {
    if (cl.zero_stage() != 3) {
      return Invalid(
          "zero.hierarchical_partition",
          absl::StrCat("needs cluster.zero_stage: 3 (it partitions stage-3 parameters), not ", cl.zero_stage()));
    }
    if (disaggregated) return Invalid("zero.hierarchical_partition", "is only for placement.mode: colocated");
    if (spec.recovery().degraded()) {
      return Invalid("zero.hierarchical_partition",
                     "does not combine with recovery.degraded (its shard layout differs)");
    }
    if (spec.train().trainable_size() > 0) {
      return Invalid("zero.hierarchical_partition", "does not combine with train.trainable (frozen parameters)");
    }
    if (spec.rollout().tp_size() > 1) {
      return Invalid("zero.hierarchical_partition",
                     "does not combine with rollout.tp_size > 1 (the TP slices are gathered from flat shards)");
    }
  }
  if (zero.weight_quantization() == "int8") {
    if (cl.zero_stage() != 3) {
      return Invalid(
          "zero.weight_quantization",
          absl::StrCat("int8 needs cluster.zero_stage: 3 (it quantises stage-3 gathers), not ", cl.zero_stage()));
    }
  }
  if (const auto& zf = spec.train().zenflow(); zf.topk_fraction() > 0) {
    const char* key = "train.zenflow.topk_fraction";
    if (cl.zero_stage() > 2) {
      return Invalid(key, absl::StrCat("runs with cluster.zero_stage 0-2 (the host update needs the owned "
                                       "parameters resident), not ",
                                       cl.zero_stage()));
    }
    if (!spec.train().precision().empty() && spec.train().precision() != "fp32") {
      return Invalid(key, "needs train.precision: fp32");
    }
    if (spec.train().trainable_size() > 0) {
      return Invalid(key, "does not combine with train.trainable (frozen parameters)");
    }
    if (spec.train().accumulation() == "layer_major") {
      return Invalid(key, "does not combine with train.accumulation: layer_major");
    }
    if (cl.sequence_parallel() > 1) return Invalid(key, "does not combine with cluster.sequence_parallel");
    if (zero.hierarchical_partition()) return Invalid(key, "does not combine with zero.hierarchical_partition");
    if (!zero.grad_compression().empty() && zero.grad_compression() != "none") {
      return Invalid(key, "does not combine with zero.grad_compression");
    }
    if (spec.recovery().degraded()) return Invalid(key, "does not combine with recovery.degraded");
    if (disaggregated) return Invalid(key, "is only for placement.mode: colocated");
    if (zf.update_interval() > 0 && zf.select_interval() % zf.update_interval() != 0) {
      return Invalid("train.zenflow.select_interval",
                     absl::StrCat(zf.select_interval(),
                                  " is not a multiple of train.zenflow.update_interval = ", zf.update_interval()));
    }
    if (zf.update_interval() > 0 && zf.full_warm_up_steps() % zf.update_interval() != 0) {
      return Invalid("train.zenflow.full_warm_up_steps",
                     absl::StrCat(zf.full_warm_up_steps(),
                                  " is not a multiple of train.zenflow.update_interval = ", zf.update_interval()));
    }
  }
  if (cl.sequence_parallel() > 1) {
    const int sp = cl.sequence_parallel();
    if (cl.workers() % sp != 0) {
      return Invalid("cluster.sequence_parallel",
                     absl::StrCat(sp, " does not divide cluster.workers = ", cl.workers()));
    }
    if (spec.kind() != tandem::v1::JOB_KIND_SFT) {
      return Invalid("cluster.sequence_parallel", "is for sft jobs only");
    }
    if (cl.device() == tandem::v1::DEVICE_KIND_CUDA) {
      return Invalid("cluster.sequence_parallel", "runs on cpu workers only (host-memory attention)");
    }
    if (spec.recovery().degraded()) {
      return Invalid("cluster.sequence_parallel", "cannot be combined with recovery.degraded");
    }
    if (spec.train().accumulation() == "layer_major") {
      return Invalid("cluster.sequence_parallel", "cannot be combined with train.accumulation: layer_major");
    }
    const std::string& ckpt = spec.train().activation_checkpointing();
    if (!ckpt.empty() && ckpt != "none") {
      return Invalid("cluster.sequence_parallel", "cannot be combined with train.activation_checkpointing");
    }
    if (cl.min_workers() != 0 && cl.min_workers() != cl.workers()) {
      return Invalid("cluster.sequence_parallel",
                     "cannot be combined with cluster.min_workers < cluster.workers (every group needs all its "
                     "ranks)");
    }
  }
  if (cl.shard_by_speed()) {
    if (cl.sequence_parallel() > 1) {
      return Invalid("cluster.shard_by_speed", "cannot be combined with cluster.sequence_parallel > 1");
    }
    if (spec.recovery().degraded()) {
      return Invalid("cluster.shard_by_speed", "cannot be combined with recovery.degraded");
    }
    if (disaggregated) {
      return Invalid("cluster.shard_by_speed", "needs placement.mode: colocated");
    }
    if (spec.rollout().tp_size() > 1) {
      return Invalid("cluster.shard_by_speed", "cannot be combined with rollout.tp_size > 1");
    }
    if (zero.hierarchical_partition()) {
      return Invalid("cluster.shard_by_speed", "cannot be combined with zero.hierarchical_partition");
    }
    if (zero.weight_quantization() == "int8") {
      return Invalid("cluster.shard_by_speed", "cannot be combined with zero.weight_quantization: int8");
    }
    if (zero.grad_compression() == "int4") {
      return Invalid("cluster.shard_by_speed", "cannot be combined with zero.grad_compression: int4");
    }
    if (spec.train().zenflow().topk_fraction() > 0) {
      return Invalid("cluster.shard_by_speed",
                     "cannot be combined with train.zenflow (its row selection assumes the even split)");
    }
  }
  int train_world = cl.workers();
  int rollout_world = cl.workers();
  if (disaggregated) {
    if (spec.kind() != tandem::v1::JOB_KIND_GRPO) {
      return Invalid("placement.mode", "disaggregated is only for grpo jobs");
    }
    if (pl.rollout_workers() < 1 || pl.train_workers() < 1) {
      return Invalid(pl.rollout_workers() < 1 ? "placement.rollout_workers" : "placement.train_workers",
                     "must be >= 1 in disaggregated mode");
    }
    if (pl.rollout_workers() + pl.train_workers() != cl.workers()) {
      return Invalid("placement.rollout_workers",
                     absl::StrCat("rollout_workers + train_workers = ", pl.rollout_workers() + pl.train_workers(),
                                  " must equal cluster.workers = ", cl.workers()));
    }
    train_world = pl.train_workers();
    rollout_world = pl.rollout_workers();
  } else if (pl.rollout_workers() != 0 || pl.train_workers() != 0) {
    return Invalid("placement.rollout_workers", "only for placement.mode: disaggregated");
  }
  const auto& t = spec.train();
  const bool has_sft = spec.kind() == tandem::v1::JOB_KIND_SFT || spec.init().sft_steps() > 0;
  if (spec.kind() == tandem::v1::JOB_KIND_SFT && spec.init().sft_steps() > 0) {
    return Invalid("init.sft.steps", "only for grpo jobs (an sft job trains train.steps steps)");
  }
  if (spec.init().sft_stop_accuracy() > 0 && spec.init().sft_steps() == 0) {
    return Invalid("init.sft.stop_accuracy", "needs a warm start: set init.sft.steps");
  }
  if (has_sft) {
    const int sp = std::max(1, cl.sequence_parallel());
    const int data_world = train_world / sp;
    int64_t per_step = static_cast<int64_t>(t.micro_batch()) * data_world;
    if (t.global_batch() % per_step != 0) {
      return Invalid("train.global_batch", absl::StrCat(t.global_batch(), " is not divisible by train.micro_batch * ",
                                                        sp > 1 ? "data-parallel groups" : "workers", " = ",
                                                        t.micro_batch(), " * ", data_world, " = ", per_step));
    }
  }
  if (spec.kind() == tandem::v1::JOB_KIND_GRPO) {
    const auto& rl = spec.rl();
    const int tp = spec.rollout().tp_size();
    if (spec.rollout().shift_parallel() && tp <= 1) {
      return Invalid("rollout.shift_parallel",
                     "needs rollout.tp_size > 1 (it switches a tensor-parallel group to sequence parallelism)");
    }
    if (spec.rollout().shift_parallel() && disaggregated) {
      return Invalid("rollout.shift_parallel",
                     "is only for placement.mode: colocated (disaggregated rollout workers receive only their "
                     "tensor-parallel slice, not the full weights that sequence-parallel steps need)");
    }
    if (const auto& sp = spec.rollout().sparse(); sp.top_k_blocks() > 0) {
      if (sp.block_size() % spec.rollout().block_size() != 0) {
        return Invalid("rollout.sparse.block_size",
                       absl::StrCat(sp.block_size(), " is not a multiple of rollout.block_size = ",
                                    spec.rollout().block_size(), " (a sparse block is whole KV cache blocks)"));
      }
    }
    if (tp > 1) {
      if (rollout_world % tp != 0) {
        return Invalid(
            "rollout.tp_size",
            absl::StrCat(tp, " does not divide the ", disaggregated ? "placement.rollout_workers" : "workers", " = ",
                         rollout_world, "; tensor-parallel groups are tp_size consecutive ",
                         disaggregated ? "rollout workers" : "workers"));
      }
    }
    if (rl.prompts_per_step() % rollout_world != 0) {
      return Invalid("rl.prompts_per_step",
                     absl::StrCat(rl.prompts_per_step(), " is not divisible by the ",
                                  disaggregated ? "rollout workers" : "workers", " = ", rollout_world));
    }
    int64_t samples = static_cast<int64_t>(rl.prompts_per_step()) * rl.group_size();
    if (samples > (1 << 22)) {
      return Invalid("rl.prompts_per_step", absl::StrCat("prompts_per_step * group_size = ", samples,
                                                         " samples per step is too many (at most 4194304)"));
    }
    int64_t per_rank = samples / train_world;
    if (samples % train_world != 0 || per_rank % rl.mini_batches() != 0) {
      return Invalid("rl.mini_batches",
                     absl::StrCat("samples per rank (prompts_per_step * group_size / train workers = ", samples, " / ",
                                  train_world, ") must be divisible by mini_batches = ", rl.mini_batches()));
    }
    if (rl.clip_high() != 0 && rl.clip_high() < rl.clip()) {
      return Invalid("rl.clip_high", absl::StrCat(rl.clip_high(), " must be >= rl.clip = ", rl.clip()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpecYaml(const std::string& text, const std::vector<std::string>& overrides) {
  const YamlProtoOptions& options = JobSpecTable().options;
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, "job file", kMaxJobFileBytes));
  for (const auto& o : overrides) RETURN_IF_ERROR(ApplyYamlOverride(root, o));
  JobSpec spec = DefaultJobSpec();
  RETURN_IF_ERROR(YamlToProto(root, &spec, options));
  ApplyJobDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path, const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, kMaxJobFileBytes));
  auto spec = ParseJobSpecYaml(text, overrides);
  if (!spec.ok()) return Annotate(spec.status(), path);
  return spec;
}

std::string JobSpecToYaml(const JobSpec& spec) { return ProtoToYaml(spec, JobSpecTable().options); }

}  // namespace tandem::common
