#include "common/job_spec.h"

#include <set>

#include <google/protobuf/descriptor.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "common/yaml_proto.h"

namespace tandem::common {
namespace {

using tandem::v1::DeviceKind;
using tandem::v1::JobKind;
using tandem::v1::JobSpec;

constexpr double kMaxSteps = 1e9;
constexpr double kMaxWorkers = 4096;
constexpr double kMaxVocab = 1 << 21;

// Every key's constraint. Paths are proto paths (init.sft_steps is the
// file's init.sft.steps). Keep docs/job-spec.md in sync.
const YamlProtoOptions& JobOptions() {
  static const YamlProtoOptions* options = [] {
    auto* o = new YamlProtoOptions;
    o->max_text_bytes = kMaxJobFileBytes;
    o->rules = {
        {.path = "name", .max_len = 128},
        {.path = "kind", .min = 1},
        {.path = "recovery.replacement_timeout_ms", .min = 0, .max = 86400000},
        {.path = "recovery.max_recoveries", .min = 0, .max = 10000},
        {.path = "recovery.degraded_low_rank", .min = 0, .max = 65536},
        // model.config: Hugging Face config.json names.
        {.path = "model.config.model_type", .one_of = {"", "llama", "mistral", "qwen2", "qwen3"}},
        {.path = "model.config.head_dim", .min = 0, .max = 1024},
        {.path = "model.config.vocab_size", .min = 2, .max = kMaxVocab},
        {.path = "model.config.hidden_size", .min = 1, .max = 65536},
        {.path = "model.config.intermediate_size", .min = 1, .max = 262144},
        {.path = "model.config.num_hidden_layers", .min = 1, .max = 1024},
        {.path = "model.config.num_attention_heads", .min = 1, .max = 1024},
        {.path = "model.config.num_key_value_heads", .min = 1, .max = 1024},
        {.path = "model.config.rms_norm_eps", .min = 0, .max = 1, .min_exclusive = true},
        {.path = "model.config.rope_theta", .min = 0, .max = 1e12, .min_exclusive = true},
        {.path = "model.config.rope_scaling.rope_type",
         .one_of = {"", "default", "linear", "dynamic", "yarn", "llama3"}},
        {.path = "model.config.rope_scaling.factor", .min = 0, .max = 1e6},
        {.path = "model.config.rope_scaling.original_max_position_embeddings", .min = 0, .max = 1 << 24},
        {.path = "model.config.rope_scaling.beta_fast", .min = 0, .max = 1e6},
        {.path = "model.config.rope_scaling.beta_slow", .min = 0, .max = 1e6},
        {.path = "model.config.rope_scaling.attention_factor", .min = 0, .max = 1e6},
        {.path = "model.config.rope_scaling.low_freq_factor", .min = 0, .max = 1e6},
        {.path = "model.config.rope_scaling.high_freq_factor", .min = 0, .max = 1e6},
        {.path = "model.config.max_position_embeddings", .min = 1, .max = 1 << 24},
        {.path = "model.config.sliding_window_layers", .min = 0, .max = 1023, .max_len = 1024},
        {.path = "model.config.sliding_window", .min = 0, .max = 1 << 24},
        {.path = "model.config.tokenizer", .one_of = {"", "char"}},
        {.path = "model.config.bos_token_id", .min = 0, .max = kMaxVocab},
        {.path = "model.config.eos_token_id", .min = 0, .max = kMaxVocab},
        {.path = "model.config.pad_token_id", .min = 0, .max = kMaxVocab},
        {.path = "task.name", .one_of = {"", "arithmetic", "sort", "reverse", "count"}},
        {.path = "task.op", .one_of = {"", "add", "mul"}},
        {.path = "task.digits", .min = 0, .max = 9},  // 0: unset (arithmetic: 2)
        {.path = "task.min_len", .min = 1, .max = 256},
        {.path = "task.max_len", .min = 1, .max = 256},
        {.path = "task.eval_size", .min = 0, .max = 1e6},
        {.path = "task.format_reward", .min = 0, .max = 100},
        {.path = "task.partial_reward", .min = 0, .max = 1},
        {.path = "task.reward_service", .max_len = 256},
        {.path = "task.reward_timeout_ms", .min = 1, .max = 3.6e6},
        {.path = "train.steps", .min = 1, .max = kMaxSteps},
        {.path = "train.lr", .min = 0, .max = 10, .min_exclusive = true},
        {.path = "train.global_batch", .min = 1, .max = 1 << 20},
        {.path = "train.micro_batch", .min = 1, .max = 1 << 20},
        {.path = "train.warmup_steps", .min = 0, .max = kMaxSteps},
        {.path = "train.min_lr_ratio", .min = 0, .max = 1},
        {.path = "train.weight_decay", .min = 0, .max = 10},
        {.path = "train.beta1", .min = 0, .max = 0.999999},
        {.path = "train.beta2", .min = 0, .max = 0.999999},
        {.path = "train.eps", .min = 0, .max = 1, .min_exclusive = true},
        {.path = "train.grad_clip", .min = 0, .max = 1e6},
        {.path = "train.eval_every", .min = 0, .max = kMaxSteps},
        {.path = "train.seq_len", .min = 0, .max = 1 << 24},
        {.path = "train.precision", .one_of = {"fp32", "bf16"}},
        {.path = "zero.grad_compression", .one_of = {"none", "int4"}},
        {.path = "rl.group_size", .min = 2, .max = 4096},
        {.path = "rl.prompts_per_step", .min = 1, .max = 1 << 20},
        {.path = "rl.clip", .min = 0, .max = 10, .min_exclusive = true},
        {.path = "rl.clip_high", .min = 0, .max = 10},
        {.path = "rl.kl_coef", .min = 0, .max = 1000},
        {.path = "rl.max_new_tokens", .min = 1, .max = 1 << 20},
        {.path = "rl.temperature", .min = 0, .max = 100},
        {.path = "rl.top_p", .min = 0, .max = 1, .min_exclusive = true},
        {.path = "rl.top_k", .min = 0, .max = kMaxVocab},
        {.path = "rl.epochs", .min = 1, .max = 1000},
        {.path = "rl.mini_batches", .min = 1, .max = 1 << 20},
        {.path = "rl.loss_agg", .one_of = {"token", "sequence"}},
        {.path = "rl.stop_token_ids", .min = 0, .max = kMaxVocab, .max_len = 64},
        {.path = "rl.stop", .max_len = 16},
        {.path = "data.max_prompt_tokens", .min = 0, .max = 1 << 24},
        {.path = "data.prompt_overflow", .one_of = {"drop", "truncate"}},
        {.path = "data.eval_samples", .min = 0, .max = 1024},
        {.path = "data.prompt_key", .max_len = 256},
        {.path = "data.messages_key", .max_len = 256},
        {.path = "data.answer_key", .max_len = 256},
        {.path = "data.response_key", .max_len = 256},
        {.path = "data.system_prompt", .max_len = 65536},
        {.path = "reward.type", .one_of = {"", "gsm8k", "math", "exact", "regex"}},
        {.path = "reward.format_reward", .min = 0, .max = 100},
        {.path = "init.sft_steps", .min = 0, .max = kMaxSteps},
        {.path = "init.sft_lr", .min = 0, .max = 10},
        {.path = "init.sft_stop_accuracy", .min = 0, .max = 1},
        {.path = "placement.mode", .one_of = {"colocated", "disaggregated"}},
        {.path = "placement.rollout_workers", .min = 0, .max = kMaxWorkers},
        {.path = "placement.train_workers", .min = 0, .max = kMaxWorkers},
        {.path = "placement.coupling", .one_of = {"sync", "async"}},
        {.path = "placement.max_staleness", .min = 0, .max = 1000},
        {.path = "cluster.workers", .min = 1, .max = kMaxWorkers},
        {.path = "cluster.device", .min = 1},
        {.path = "cluster.zero_stage", .min = 0, .max = 3},
        {.path = "cluster.min_workers", .min = 0, .max = kMaxWorkers},
        {.path = "cluster.threads_per_worker", .min = 0, .max = 1024},
        {.path = "checkpoint.every", .min = 0, .max = kMaxSteps},
        {.path = "checkpoint.keep", .min = 1, .max = 1000},
        {.path = "priority", .min = -1000, .max = 1000},
    };
    o->aliases["model.config.rope_scaling"] = {{"type", "rope_type"}};
    // Keys of HF config.json files that carry no information for us.
    o->ignored["model.config"] = {"architectures", "torch_dtype", "transformers_version",
                                  "use_cache", "initializer_range", "hidden_act",
                                  "attention_dropout", "use_sliding_window", "max_window_layers",
                                  "pretraining_tp", "mlp_bias", "_name_or_path"};
    o->virtual_maps["init"] = {{"sft", {{"steps", "sft_steps"}, {"lr", "sft_lr"}, {"stop_accuracy", "sft_stop_accuracy"}}}};
    return o;
  }();
  return *options;
}

// Fields whose zero is a legal setting although their default is not zero:
// ApplyJobDefaults leaves a zero there.
const std::set<std::string>& ZeroIsLiteral() {
  static const auto* s = new std::set<std::string>{
      "seed", "rl.kl_coef", "rl.temperature", "train.grad_clip", "train.beta1",
      "train.min_lr_ratio", "rl.scale_rewards", "placement.max_staleness", "data.shuffle", "zero.error_feedback"};
  return *s;
}

void FillZeros(const google::protobuf::Message& defaults, google::protobuf::Message* msg,
               const std::string& path) {
  using google::protobuf::FieldDescriptor;
  const auto* d = defaults.GetDescriptor();
  const auto* rd = defaults.GetReflection();
  const auto* r = msg->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    std::string fp = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (rd->HasField(defaults, f)) FillZeros(rd->GetMessage(defaults, f), r->MutableMessage(msg, f), fp);
      continue;
    }
    if (ZeroIsLiteral().count(fp)) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        if (r->GetInt32(*msg, f) == 0) {
          r->SetInt32(msg, f, rd->GetInt32(defaults, f));
        }
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        if (r->GetInt64(*msg, f) == 0) {
          r->SetInt64(msg, f, rd->GetInt64(defaults, f));
        }
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        if (r->GetUInt64(*msg, f) == 0) {
          r->SetUInt64(msg, f, rd->GetUInt64(defaults, f));
        }
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        if (r->GetDouble(*msg, f) == 0) {
          r->SetDouble(msg, f, rd->GetDouble(defaults, f));
        }
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        if (!r->GetBool(*msg, f)) {
          r->SetBool(msg, f, rd->GetBool(defaults, f));
        }
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (r->GetString(*msg, f).empty()) {
          r->SetString(msg, f, rd->GetString(defaults, f));
        }
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        if (r->GetEnumValue(*msg, f) == 0) {
          r->SetEnumValue(msg, f, rd->GetEnumValue(defaults, f));
        }
        break;
      default: break;
    }
  }
}

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
  const auto& c = m.config();
  if (c.head_dim() > 0) {
    if (c.head_dim() % 2 != 0) {
      return Invalid("model.config.head_dim",
                     absl::StrCat(c.head_dim(), " must be even (rotary embeddings)"));
    }
  } else if (c.hidden_size() % c.num_attention_heads() != 0) {
    return Invalid("model.config.hidden_size",
                   absl::StrCat(c.hidden_size(), " is not divisible by num_attention_heads = ",
                                c.num_attention_heads()));
  } else if ((c.hidden_size() / c.num_attention_heads()) % 2 != 0) {
    return Invalid("model.config.hidden_size",
                   absl::StrCat("head size ", c.hidden_size() / c.num_attention_heads(),
                                " must be even (rotary embeddings)"));
  }
  if (c.num_key_value_heads() > c.num_attention_heads() ||
      c.num_attention_heads() % c.num_key_value_heads() != 0) {
    return Invalid("model.config.num_key_value_heads",
                   absl::StrCat(c.num_key_value_heads(), " must divide num_attention_heads = ",
                                c.num_attention_heads()));
  }
  std::set<int> seen;
  for (int layer : c.sliding_window_layers()) {
    if (layer >= c.num_hidden_layers()) {
      return Invalid("model.config.sliding_window_layers",
                     absl::StrCat("layer ", layer, " out of range [0, ", c.num_hidden_layers(), ")"));
    }
    if (!seen.insert(layer).second) {
      return Invalid("model.config.sliding_window_layers", absl::StrCat("layer ", layer, " listed twice"));
    }
  }
  if (!c.sliding_window_layers().empty() && c.sliding_window() <= 0) {
    return Invalid("model.config.sliding_window", "must be >= 1 when sliding_window_layers is set");
  }
  for (auto [name, id] : {std::pair<const char*, int>{"bos_token_id", c.bos_token_id()},
                          {"eos_token_id", c.eos_token_id()},
                          {"pad_token_id", c.pad_token_id()}}) {
    if (id >= c.vocab_size()) {
      return Invalid(absl::StrCat("model.config.", name),
                     absl::StrCat(id, " must be < vocab_size = ", c.vocab_size()));
    }
  }
  for (int i = 0; i < spec.rl().stop_token_ids_size(); ++i) {
    if (spec.rl().stop_token_ids(i) >= c.vocab_size()) {
      return Invalid(absl::StrCat("rl.stop_token_ids[", i, "]"),
                     absl::StrCat(spec.rl().stop_token_ids(i), " must be < model.config.vocab_size = ",
                                  c.vocab_size()));
    }
  }
  if (!c.rope_scaling().rope_type().empty() && c.rope_scaling().rope_type() != "default" &&
      c.rope_scaling().factor() <= 0) {
    return Invalid("model.config.rope_scaling.factor",
                   absl::StrCat("must be > 0 for rope_type ", c.rope_scaling().rope_type()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string KindName(JobKind kind) {
  return EnumYamlName(tandem::v1::JobKind_descriptor()->FindValueByNumber(kind));
}
std::string DeviceName(DeviceKind device) {
  return EnumYamlName(tandem::v1::DeviceKind_descriptor()->FindValueByNumber(device));
}

JobSpec DefaultJobSpec() {
  JobSpec s;
  s.set_seed(1);
  auto* task = s.mutable_task();
  // op and digits (arithmetic only) are defaulted in ApplyJobDefaults.
  task->set_min_len(3);
  task->set_max_len(8);
  task->set_eval_size(100);
  task->set_reward_timeout_ms(10000);
  auto* t = s.mutable_train();
  t->set_steps(100);
  t->set_lr(1e-3);
  t->set_global_batch(16);
  t->set_micro_batch(4);
  t->set_min_lr_ratio(0.1);
  t->set_beta1(0.9);
  t->set_beta2(0.95);
  t->set_eps(1e-8);
  t->set_grad_clip(1.0);
  t->set_precision("fp32");
  s.mutable_zero()->set_grad_compression("none");
  s.mutable_zero()->set_error_feedback(true);
  auto* rl = s.mutable_rl();
  rl->set_group_size(8);
  rl->set_prompts_per_step(8);
  rl->set_clip(0.2);
  rl->set_kl_coef(0.01);
  rl->set_max_new_tokens(16);
  rl->set_temperature(1.0);
  rl->set_top_p(1.0);
  rl->set_epochs(1);
  rl->set_mini_batches(1);
  rl->set_scale_rewards(true);
  rl->set_loss_agg("token");
  s.mutable_init();
  auto* data = s.mutable_data();
  data->set_prompt_overflow("drop");
  data->set_shuffle(true);
  auto* p = s.mutable_placement();
  p->set_mode("colocated");
  p->set_coupling("sync");
  p->set_max_staleness(1);
  auto* c = s.mutable_cluster();
  c->set_workers(1);
  c->set_device(tandem::v1::DEVICE_KIND_CPU);
  auto* ck = s.mutable_checkpoint();
  ck->set_keep(3);
  return s;
}

void ApplyJobDefaults(JobSpec* spec) {
  FillZeros(DefaultJobSpec(), spec, "");
  if (spec->name().empty()) spec->set_name(absl::StrCat(KindName(spec->kind()), "-job"));
  if (spec->model().has_config()) {
    auto* c = spec->mutable_model()->mutable_config();
    if (c->num_key_value_heads() == 0) c->set_num_key_value_heads(c->num_attention_heads());
    if (c->rms_norm_eps() == 0) c->set_rms_norm_eps(1e-5);
    if (c->rope_theta() == 0) c->set_rope_theta(10000.0);
    if (c->max_position_embeddings() == 0) c->set_max_position_embeddings(2048);
    if (c->tokenizer().empty()) c->set_tokenizer("char");
  }
  auto* task = spec->mutable_task();
  if (task->name().empty() && task->data().empty() && spec->data().train().empty()) {
    task->set_name("arithmetic");
  }
  if (task->name() == "arithmetic") {
    if (task->op().empty()) task->set_op("add");
    if (task->digits() == 0) task->set_digits(2);
  }
  if (spec->rl().clip_high() == 0) spec->mutable_rl()->set_clip_high(spec->rl().clip());
  if (spec->init().sft_lr() == 0) spec->mutable_init()->set_sft_lr(spec->train().lr());
  if (spec->cluster().min_workers() == 0) spec->mutable_cluster()->set_min_workers(spec->cluster().workers());
}

// data: and reward: (real data with a tokenizer from model.from).
static absl::Status ValidateData(const JobSpec& spec) {
  const auto& d = spec.data();
  const bool grpo = spec.kind() == tandem::v1::JOB_KIND_GRPO;
  const bool has_data = !d.train().empty();
  const bool any_data_key = !d.eval().empty() || !d.prompt_key().empty() || !d.messages_key().empty() ||
                            !d.answer_key().empty() || !d.response_key().empty() ||
                            !d.system_prompt().empty() || d.chat() || d.max_prompt_tokens() > 0 ||
                            d.skip_bad_rows() || d.eval_samples() > 0;
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
      return Invalid("reward.type", "required for grpo on data (gsm8k, math, exact, regex), or set task.reward_service");
    }
  } else if (!spec.reward().type().empty()) {
    return Invalid("reward.type", "only for grpo");
  }
  const auto& r = spec.reward();
  if (r.type() == "regex" && r.pattern().empty()) return Invalid("reward.pattern", "required with reward.type: regex");
  if (r.type() != "regex" && !r.pattern().empty()) return Invalid("reward.pattern", "only with reward.type: regex");
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  const YamlProtoOptions& options = JobOptions();
  RETURN_IF_ERROR(CheckProtoRules(spec, options));
  if (spec.kind() == tandem::v1::JOB_KIND_PPO) {
    return Invalid("kind", "'ppo' is not supported yet; allowed: sft, grpo");
  }
  if (spec.kind() != tandem::v1::JOB_KIND_SFT && spec.kind() != tandem::v1::JOB_KIND_GRPO) {
    return Invalid("kind", "required; allowed: sft, grpo");
  }
  if (!ValidName(spec.name())) {
    return Invalid("name", absl::StrCat("'", spec.name().substr(0, 64),
                                        "' must be 1-128 characters of A-Z a-z 0-9 . _ -"));
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
    return Invalid("task.data", "is SFT data; grpo needs prompts with reference answers: use data.train "
                                "with data.answer_key and reward.type");
  }
  RETURN_IF_ERROR(ValidateData(spec));
  if (!task.name().empty() && task.name() != "arithmetic") {
    // The worker's task factory refuses these too; say so at submit time.
    if (!task.op().empty()) {
      return Invalid("task.op", absl::StrCat("applies only to the arithmetic task; remove it for ", task.name()));
    }
    if (task.digits() != 0) {
      return Invalid("task.digits", absl::StrCat("applies only to the arithmetic task; use task.min_len/task.max_len for ",
                                                 task.name()));
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
    int64_t per_step = static_cast<int64_t>(t.micro_batch()) * train_world;
    if (t.global_batch() % per_step != 0) {
      return Invalid("train.global_batch",
                     absl::StrCat(t.global_batch(), " is not divisible by train.micro_batch * workers = ",
                                  t.micro_batch(), " * ", train_world, " = ", per_step));
    }
  }
  if (spec.kind() == tandem::v1::JOB_KIND_GRPO) {
    const auto& rl = spec.rl();
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
                     absl::StrCat("samples per rank (prompts_per_step * group_size / train workers = ",
                                  samples, " / ", train_world, ") must be divisible by mini_batches = ",
                                  rl.mini_batches()));
    }
    if (rl.clip_high() != 0 && rl.clip_high() < rl.clip()) {
      return Invalid("rl.clip_high", absl::StrCat(rl.clip_high(), " must be >= rl.clip = ", rl.clip()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpecYaml(const std::string& text, const std::vector<std::string>& overrides) {
  const YamlProtoOptions& options = JobOptions();
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

std::string JobSpecToYaml(const JobSpec& spec) { return ProtoToYaml(spec, JobOptions()); }

}  // namespace tandem::common
