// PHASE_SETUP: model, data, communicator, ZeRO state; identical on every
// rank except for the shard each keeps.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/phase_failure.h"
#include "common/rank_topology.h"
#include "worker/comm/grpc_store.h"
#include "worker/engine/data_shares.h"
#include "worker/engine/disagg.h"
#include "worker/engine/live_restore.h"
#include "worker/engine/peer_snapshot.h"
#include "worker/engine/phases.h"
#include "worker/engine/spec_convert.h"
#include "worker/engine/speed_shares.h"
#include "worker/model/job_model.h"
#include "worker/model/safetensors.h"
#include "worker/model/soft_prompt.h"
#include "worker/model/sp_attention.h"
#include "worker/model/trainable.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::worker {

namespace {

// A restore that failed for its own reasons (a damaged checkpoint, copies
// that do not fit) is RESTORE_FAILED: the coordinator tries the next source.
// A failure of the cluster while restoring stays RETRYABLE.
absl::Status RestoreFailure(const absl::Status& st) {
  if (common::FailureKindOf(st) == tandem::v1::PHASE_FAILURE_KIND_RETRYABLE) return st;
  return common::WithFailureKind(st, tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
}

// data.train / data.eval: JSONL rows through the model's tokenizer.
absl::Status BuildTextData(JobContext& ctx, const rl::SftTokens& sft_tokens) {
  const auto& spec = ctx.spec();
  const auto& d = spec.data();
  if (!ctx.tokenizer) {
    return absl::FailedPreconditionError("data.train: the model directory (model.from) has no tokenizer.json");
  }
  const bool grpo = spec.kind() == tandem::v1::JOB_KIND_GRPO;
  rl::TextDataOptions o;
  o.prompt_key = d.prompt_key();
  o.messages_key = d.messages_key();
  o.answer_key = d.answer_key();
  o.response_key = d.response_key();
  o.system_prompt = d.system_prompt();
  o.chat = d.chat();
  o.need_answer = grpo;
  o.need_response = !grpo || spec.init().sft_steps() > 0;
  o.max_prompt_tokens = d.max_prompt_tokens();
  o.truncate_overflow = d.prompt_overflow() == "truncate";
  o.skip_bad_rows = d.skip_bad_rows();
  o.max_sequence_tokens = o.need_response ? sft_tokens.seq_len : 0;
  auto train = rl::TextDataset::Load(d.train(), o, *ctx.tokenizer);
  if (!train.ok()) return train.status();
  ctx.train_data.emplace(std::move(*train));
  if (!d.eval().empty()) {
    rl::TextDataOptions eo = o;
    eo.field = "data.eval";
    eo.need_response = false;
    // SFT evaluates the loss on eval responses: the same length bound.
    eo.max_sequence_tokens = grpo ? 0 : o.max_sequence_tokens;
    auto eval = rl::TextDataset::Load(d.eval(), eo, *ctx.tokenizer);
    if (!eval.ok()) return eval.status();
    ctx.eval_data.emplace(std::move(*eval));
  }
  if (o.need_response) {
    std::vector<rl::SftExample> examples;
    examples.reserve(ctx.train_data->rows().size());
    for (const rl::TextRow& row : ctx.train_data->rows()) {
      examples.push_back({row.prompt_ids, row.response_ids});
    }
    rl::SftTokens t = sft_tokens;
    t.bos = -1;  // the prompt ids carry what the tokenizer and template add
    auto ds = rl::SftDataset::FromExamples(std::move(examples), t, DeriveSeed(spec.seed(), kSeedSftData), d.shuffle());
    if (!ds.ok()) return ds.status();
    ctx.dataset.emplace(std::move(*ds));
  }
  if (!spec.reward().type().empty()) {
    rl::RewardOptions ro;
    ro.type = spec.reward().type();
    ro.pattern = spec.reward().pattern();
    ro.format_reward = spec.reward().format_reward();
    ro.format_pattern = spec.reward().format_pattern();
    auto r = rl::VerifiableReward::Create(ro);
    if (!r.ok()) return r.status();
    ctx.reward = std::move(*r);
  }
  const auto& st = ctx.train_data->stats();
  if (ctx.rank == 0) {
    std::string line = "data.train: " + std::to_string(st.rows) + " rows";
    if (st.bad_rows_skipped > 0) {
      line += ", " + std::to_string(st.bad_rows_skipped) + " bad rows skipped (first: " + st.first_bad_row + ")";
    }
    if (st.prompts_dropped > 0) line += ", " + std::to_string(st.prompts_dropped) + " long prompts dropped";
    if (st.prompts_truncated > 0) line += ", " + std::to_string(st.prompts_truncated) + " long prompts truncated";
    if (ctx.eval_data) line += "; data.eval: " + std::to_string(ctx.eval_data->size()) + " rows";
    ctx.data_log = line;
  }
  return absl::OkStatus();
}

// rollout.tp_size > 1: this rank's TP group (consecutive ranks of ctx.world:
// the workers, or the rollout workers in disaggregated mode) and the engine
// over the tensor-parallel forward. A degraded continuation (survivors
// holding a lost rank's logical share) rolls out at tp_size 1 until the job
// is whole again: a TP group that lost a rank cannot run, and tp_size 1
// gives the same tokens.
absl::Status SetupTpRollout(JobContext& ctx, const comm::CollectiveOptions& co, kernels::DeviceMemory* memory,
                            ReportPhaseRequest* report) {
  const auto& r = ctx.spec().rollout();
  const int tp = r.tp_size();
  if (tp <= 1 || ctx.spec().kind() != tandem::v1::JOB_KIND_GRPO) return absl::OkStatus();
  if (ctx.assignment.logical_world_size() > 0) {
    report->add_log_lines(absl::StrCat("rank ", ctx.rank, ": degraded continuation: rollout at tp_size 1 (not ", tp,
                                       ") until the job is whole again"));
    return absl::OkStatus();
  }
  if (ctx.world % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rollout.tp_size ", tp, " does not divide the workers (", ctx.world,
                                                   "); tensor-parallel groups are tp_size consecutive workers"));
  }
  // Fails before the rendezvous when the model does not split.
  if (auto slice = rollout::TpSliceConfig(ctx.config, tp); !slice.ok()) return slice.status();
  comm::CollectiveOptions tco = co;
  tco.prefix = absl::StrCat(co.prefix, "-tp", ctx.rank / tp);
  auto group = MakeDeviceCollective(*ctx.device, *ctx.store, ctx.rank % tp, tp, tco);
  if (!group.ok()) return group.status();
  ctx.tp_group = std::move(*group);
  rollout::TpOptions to;
  to.overlap = r.tp_overlap();
  to.shift = r.shift_parallel();
  to.shift_threshold_tokens = r.shift_threshold_tokens();
  to.timeout = ctx.timeout;
  auto dec = rollout::TpDecoder::Create(ctx.config, ctx.tp_group.get(), ctx.device->ops.get(), memory, to);
  if (!dec.ok()) return dec.status();
  ctx.tp_decoder = dec->get();
  ctx.tp_rollout = std::make_unique<rollout::RolloutEngine>(std::move(*dec), ctx.device->ops.get());
  return absl::OkStatus();
}

// Prompt tuning: train.soft_prompt_tokens gives the model a soft prompt
// (a loaded model's weights re-laid with it), or names the one it has.
absl::Status ApplySoftPrompt(const tandem::v1::JobSpec& spec, model::ModelConfig* config, std::vector<float>* full) {
  const int want = spec.train().soft_prompt_tokens(), has = config->tandem_soft_prompt_tokens;
  if (want > 0 && has > 0 && want != has) {
    return absl::InvalidArgumentError(absl::StrCat("train.soft_prompt_tokens: ", want,
                                                   ", but the model already has a soft prompt of ", has,
                                                   " tokens (tandem_soft_prompt_tokens); give ", has, " or 0"));
  }
  if (want == 0 || has > 0) return absl::OkStatus();
  if (full->empty()) {  // initialized later, soft prompt included
    config->tandem_soft_prompt_tokens = want;
    if (absl::Status st = model::Validate(*config); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("train.soft_prompt_tokens: ", st.message()));
    }
    return absl::OkStatus();
  }
  model::ModelConfig with;
  auto params = model::AddSoftPrompt(*config, *full, want, &with);
  if (!params.ok())
    return absl::InvalidArgumentError(absl::StrCat("train.soft_prompt_tokens: ", params.status().message()));
  *config = with;
  *full = std::move(*params);
  return absl::OkStatus();
}

absl::Status BuildData(JobContext& ctx) {
  const auto& spec = ctx.spec();
  const auto& task = spec.task();
  rl::SftTokens tokens;
  tokens.vocab_size = ctx.config.vocab_size;
  tokens.bos = ctx.config.bos_token_id >= 0 ? ctx.config.bos_token_id : 1;
  tokens.eos = ctx.config.Eos() >= 0 ? ctx.config.Eos() : 2;
  if (ctx.tokenizer && ctx.tokenizer->eos() && *ctx.tokenizer->eos() < ctx.config.vocab_size) {
    tokens.eos = *ctx.tokenizer->eos();
  }
  tokens.seq_len = spec.train().seq_len() > 0 ? spec.train().seq_len() : ctx.config.max_position_embeddings;
  // A soft prompt takes the first positions of every sequence.
  tokens.seq_len -= static_cast<int>(ctx.soft_prompt.size());
  if (tokens.seq_len < 2) {
    return absl::InvalidArgumentError(absl::StrCat("train.soft_prompt_tokens: a soft prompt of ",
                                                   ctx.soft_prompt.size(), " tokens leaves no room in sequences of ",
                                                   tokens.seq_len + ctx.soft_prompt.size(),
                                                   " positions (train.seq_len or max_position_embeddings)"));
  }
  const bool is_char = ctx.tokenizer && ctx.tokenizer->kind() == "char";
  const model::CharTokenizer char_tok = model::CharTokenizer::Default();
  const model::CharTokenizer* tok = is_char ? &char_tok : nullptr;
  if (!spec.data().train().empty()) {
    if (absl::Status st = BuildTextData(ctx, tokens); !st.ok()) return st;
  } else if (!task.name().empty()) {
    if (tok == nullptr) {
      return absl::InvalidArgumentError("task." + task.name() +
                                        ": built-in tasks need the char tokenizer (model.config.tokenizer: char)");
    }
    auto t = rl::MakeTask(ToTaskOptions(task));
    if (!t.ok()) return t.status();
    ctx.task = std::shared_ptr<const rl::Task>(std::move(*t));
    auto ds = rl::SftDataset::FromTask(ctx.task, *tok, tokens, DeriveSeed(spec.seed(), kSeedSftData));
    if (!ds.ok()) return ds.status();
    ctx.dataset.emplace(std::move(*ds));
  } else if (!task.data().empty()) {
    if (spec.kind() == tandem::v1::JOB_KIND_GRPO) {
      return absl::InvalidArgumentError(
          "task.data: GRPO needs prompts with reference answers: use the data section (data.train, "
          "data.prompt_key or data.messages_key, data.answer_key) and reward.type");
    }
    auto ds = rl::SftDataset::FromJsonlFile(task.data(), tok, tokens, DeriveSeed(spec.seed(), kSeedSftData));
    if (!ds.ok()) return ds.status();
    ctx.dataset.emplace(std::move(*ds));
  }
  if (!task.reward_service().empty()) {
    rl::RewardClientOptions ro;
    ro.address = task.reward_service();
    ro.timeout_ms = task.reward_timeout_ms();
    ro.job_id = ctx.assignment.job_id();
    auto rc = rl::RewardClient::Create(ro);
    if (!rc.ok()) return rc.status();
    ctx.reward_client = std::move(*rc);
  }
  return absl::OkStatus();
}

// cluster.sequence_parallel: the group of consecutive ranks this rank
// belongs to, its communicator (its own store prefix per group) and the
// model's sequence-parallel attention over it. The job spec's checks ran at
// submit; the ones that depend on this worker (world, device) run here.
absl::Status SetupSequenceParallel(JobContext& ctx, const comm::CollectiveOptions& co) {
  const int sp = std::max(1, ctx.spec().cluster().sequence_parallel());
  if (sp == 1) return absl::OkStatus();
  if (ctx.world % sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.sequence_parallel: ", sp, " does not divide the world size ", ctx.world));
  }
  if (std::string_view(ctx.device->memory->name()) != "host") {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.sequence_parallel: runs on host memory (cpu workers); "
                     "this worker's memory is ",
                     ctx.device->memory->name()));
  }
  ctx.sp_size = sp;
  ctx.sp_rank = ctx.rank % sp;
  ctx.slice_cost = model::SliceCostOf(ctx.config);
  comm::CollectiveOptions o = co;
  o.prefix = absl::StrCat(co.prefix, "-sp", ctx.rank / sp);
  auto group = comm::MakeCollective("gloo", *ctx.store, ctx.sp_rank, sp, o);
  if (!group.ok()) return group.status();
  ctx.sp_group = std::move(*group);
  ctx.sp_attention =
      std::make_unique<model::CollectiveSequenceAttention>(ctx.sp_group.get(), ctx.device->ops.get(), ctx.timeout);
  ctx.model->SetSequenceAttention(ctx.sp_attention.get());
  return absl::OkStatus();
}

}  // namespace

absl::Status SetupJob(const EngineOptions& options, const tandem::v1::Assignment& assignment, JobContext& ctx,
                      ReportPhaseRequest* report, LiveState* live) {
  ctx.assignment = assignment;
  // The engine reads the spec with every default applied (a coordinator of
  // another version may leave keys it does not know at zero) and every key
  // in its range; the coordinator checked the rest at submit.
  common::ApplyJobDefaults(ctx.assignment.mutable_spec());
  if (absl::Status st = common::CheckJobSpecKeys(ctx.spec()); !st.ok()) {
    return absl::InvalidArgumentError("spec." + std::string(st.message()));
  }
  ctx.rank = assignment.rank();
  ctx.world = assignment.world_size();
  const auto& spec = ctx.spec();
  if (ctx.world < 1 || ctx.rank < 0 || ctx.rank >= ctx.world) {
    return absl::InvalidArgumentError("assignment: rank " + std::to_string(ctx.rank) + " outside world of " +
                                      std::to_string(ctx.world));
  }
  if (absl::Status st = ValidateShares(assignment); !st.ok()) return st;

  const bool wants_cuda = spec.cluster().device() == tandem::v1::DEVICE_KIND_CUDA;
  if (wants_cuda != (options.device == "cuda")) {
    // The scheduler matches device kinds; say so rather than silently
    // computing on another device.
    return absl::FailedPreconditionError("cluster.device: the job asks for " +
                                         std::string(wants_cuda ? "cuda" : "cpu") + " but this worker runs device '" +
                                         options.device + "'");
  }

  // Model config and initial weights.
  std::vector<float> full;
  if (!spec.model().from().empty()) {
    auto loaded = model::LoadModelDir(spec.model().from());
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(), "model.from: " + std::string(loaded.status().message()));
    }
    ctx.config = loaded->config;
    full = std::move(loaded->params);
    auto tok = text::LoadModelTokenizer(spec.model().from());
    if (tok.ok()) {
      ctx.tokenizer = *tok;
    } else if (tok.status().code() != absl::StatusCode::kNotFound) {
      return absl::Status(tok.status().code(), "model.from: " + std::string(tok.status().message()));
    }
    auto gen_eos = text::GenerationConfigEosIds(spec.model().from());
    if (!gen_eos.ok()) {
      return absl::Status(gen_eos.status().code(), "model.from: " + std::string(gen_eos.status().message()));
    }
    ctx.stop_ids = *gen_eos;
  } else {
    auto cfg = model::ModelConfigFromJob(spec.model().config());
    if (!cfg.ok()) return cfg.status();
    ctx.config = *cfg;
    if (ctx.config.tokenizer == "char") ctx.tokenizer = text::MakeCharTokenizer();
  }
  if (absl::Status st = ApplySoftPrompt(spec, &ctx.config, &full); !st.ok()) return st;
  ctx.soft_prompt = model::SoftPromptIds(ctx.config);
  if (ctx.tokenizer && ctx.config.vocab_size < ctx.tokenizer->vocab_size()) {
    return absl::InvalidArgumentError("model: vocab_size " + std::to_string(ctx.config.vocab_size) +
                                      " is smaller than the " + std::string(ctx.tokenizer->kind()) + " tokenizer's " +
                                      std::to_string(ctx.tokenizer->vocab_size()) +
                                      " (its ids would fall outside the embedding)");
  }
  // Generation stops at every eos id the model's files name.
  for (int e : ctx.config.eos_token_ids) ctx.stop_ids.push_back(e);
  if (ctx.tokenizer && ctx.tokenizer->eos()) ctx.stop_ids.push_back(*ctx.tokenizer->eos());
  for (int32_t id : spec.rl().stop_token_ids()) ctx.stop_ids.push_back(id);
  std::sort(ctx.stop_ids.begin(), ctx.stop_ids.end());
  ctx.stop_ids.erase(std::unique(ctx.stop_ids.begin(), ctx.stop_ids.end()), ctx.stop_ids.end());
  for (int32_t id : ctx.stop_ids) {
    if (id < 0 || id >= ctx.config.vocab_size) {
      return absl::InvalidArgumentError("model: eos id " + std::to_string(id) + " is outside the vocabulary of " +
                                        std::to_string(ctx.config.vocab_size));
    }
  }

  const int threads =
      spec.cluster().threads_per_worker() > 0 ? spec.cluster().threads_per_worker() : options.num_threads;
  auto device = MakeComputeDevice(options.device, threads);
  if (!device.ok()) return device.status();
  ctx.device = std::move(*device);
  kernels::DeviceMemory* memory = ctx.device->memory.get();
  ctx.model = std::make_unique<model::Model>(ctx.config, ctx.device->ops.get(), 0, memory);
  auto checkpointing = model::ParseActivationCheckpointing(spec.train().activation_checkpointing());
  if (!checkpointing.ok()) return checkpointing.status();
  ctx.model->set_activation_checkpointing(*checkpointing);
  ctx.rollout = std::make_unique<rollout::RolloutEngine>(ctx.config, ctx.device->ops.get(), memory);
  const auto& layout = ctx.model->layout();
  if (full.empty()) {
    full.assign(layout.total_floats(), 0.f);
    ctx.model->InitParams(DeriveSeed(spec.seed(), kSeedInit), full.data());
  }

  if (absl::Status st = BuildData(ctx); !st.ok()) {
    if (ctx.soft_prompt.empty() || st.message().find("seq_len") == absl::string_view::npos) return st;
    return absl::Status(st.code(), absl::StrCat(st.message(),
                                                " (what is left of train.seq_len or "
                                                "max_position_embeddings after the soft prompt's ",
                                                ctx.soft_prompt.size(), " tokens, train.soft_prompt_tokens)"));
  }

  // Communicator: rendezvous through the coordinator's store, scoped by
  // (job, generation).
  ctx.timeout = comm::Timeout(options.collective_timeout_ms);
  absl::StatusOr<std::unique_ptr<comm::Store>> store;
  if (options.store_factory) {
    store = options.store_factory(assignment.job_id(), assignment.generation());
  } else {
    comm::GrpcStoreOptions so;
    so.target = options.coordinator_address;
    so.job_id = assignment.job_id();
    so.generation = assignment.generation();
    so.token = options.auth_token;
    if (options.worker_credential) so.worker_credential = options.worker_credential();
    so.ca_path = options.tls_ca;
    so.cert_path = options.tls_cert;
    so.key_path = options.tls_key;
    store = comm::MakeGrpcStore(so);
  }
  if (!store.ok()) return store.status();
  ctx.store = std::move(*store);
  comm::CollectiveOptions co;
  co.address = options.data_address;
  co.timeout = ctx.timeout;
  co.prefix = "gloo";
  co.abort = ctx.abort;  // the engine's Abort() ends a rendezvous in progress
  if (spec.placement().mode() == "disaggregated") {
    // Trainers continue below over their own communicator; rollout ranks
    // keep full weights and no optimizer (disagg.h).
    auto role = SetupDisaggregated(ctx, co);
    if (!role.ok()) return role.status();
    if (*role == DisaggRole::kRollout) {
      if (absl::Status st = SetupTpRollout(ctx, co, memory, report); !st.ok()) return st;
      return FinishRolloutSetup(ctx, std::move(full), report);
    }
  } else {
    if (assignment.has_topology()) {
      if (absl::Status st = common::CheckRankTopology(assignment.topology(), ctx.rank, ctx.world); !st.ok()) {
        return st;
      }
      ctx.rank_nodes.assign(assignment.topology().rank_nodes().begin(), assignment.topology().rank_nodes().end());
    } else {
      ctx.rank_nodes.assign(ctx.world, "");
    }
    auto coll = MakeDeviceCollective(*ctx.device, *ctx.store, ctx.rank, ctx.world, co);
    if (!coll.ok()) return coll.status();
    auto tiered = comm::MakeTieredCollective(std::move(*coll), ctx.rank_nodes, ctx.tier_bytes);
    if (!tiered.ok()) return tiered.status();
    ctx.collective = std::move(*tiered);
    if (absl::Status st = SetupTpRollout(ctx, co, memory, report); !st.ok()) return st;
    if (spec.zero().hierarchical_partition()) {
      if (ctx.device->guarded != nullptr) {
        return absl::InvalidArgumentError("zero.hierarchical_partition runs on the cpu and cuda devices, not guarded");
      }
      auto groups = comm::MakeNodeCollectives(ctx.device->name == "cuda" ? "nccl" : "gloo", *ctx.store, ctx.rank_nodes,
                                              ctx.rank, co, ctx.tier_bytes);
      if (!groups.ok()) return groups.status();
      if (!groups->uniform) {
        return absl::FailedPreconditionError(
            "zero.hierarchical_partition needs the same number of workers on every node (tandem-worker --node)");
      }
      ctx.nodes = std::move(*groups);
    }
  }

  if (absl::Status st = SetupSequenceParallel(ctx, co); !st.ok()) return st;
  if (spec.cluster().shard_by_speed()) {
    if (ctx.sp_size > 1 || assignment.logical_world_size() > 0 || ctx.tp_group || ctx.disagg) {
      return absl::InvalidArgumentError(
          "cluster.shard_by_speed does not combine with sequence parallelism, degraded continuation, "
          "tensor-parallel rollouts or disaggregated placement");
    }
    if (absl::Status st = ExchangeSpeeds(ctx, options.speed, report); !st.ok()) return st;
  }

  // ZeRO state over the model's units.
  zero::ZeroOptions zo;
  zo.stage = spec.cluster().zero_stage();
  const auto& train = spec.train();
  if (train.beta1() > 0) zo.adamw.beta1 = static_cast<float>(train.beta1());
  if (train.beta2() > 0) zo.adamw.beta2 = static_cast<float>(train.beta2());
  if (train.eps() > 0) zo.adamw.eps = static_cast<float>(train.eps());
  zo.adamw.weight_decay = static_cast<float>(train.weight_decay());
  auto precision = zero::ParsePrecision(train.precision());
  if (!precision.ok()) return precision.status();
  zo.precision = *precision;
  auto compression = zero::ParseGradCompression(spec.zero().grad_compression());
  if (!compression.ok()) return compression.status();
  zo.grad_compression = *compression;
  zo.error_feedback = spec.zero().error_feedback();
  zo.reduce_on_release = train.accumulation() == "layer_major";
  auto weights = zero::ParseWeightQuantization(spec.zero().weight_quantization());
  if (!weights.ok()) return weights.status();
  zo.weight_quantization = *weights;
  zo.weight_quantization_seed = DeriveSeed(spec.seed(), kSeedWeightQuantization);
  zo.hierarchical_partition = spec.zero().hierarchical_partition();
  if (ctx.nodes) {
    zo.intra = ctx.nodes->intra.get();
    zo.inter = ctx.nodes->inter.get();
  }
  zo.timeout = ctx.timeout;
  if (!ctx.speeds.empty()) zo.partition_weights = comm::SpeedWeights(ctx.speeds);
  for (int u = 0; u < layout.num_units(); ++u) {
    zo.units.push_back({layout.unit_offset(u), layout.unit_size(u)});
  }
  // train.trainable: the frozen tensors get no gradients nor moments.
  auto trainable = model::TrainableRanges(layout, {train.trainable().begin(), train.trainable().end()});
  if (!trainable.ok()) return trainable.status();
  for (const auto& unit : *trainable) {
    auto& ranges = zo.trainable.emplace_back();
    for (const model::UnitRange& r : unit) ranges.push_back({r.offset, r.size});
  }
  if (const auto& zf = train.zenflow(); zf.topk_fraction() > 0) {
    // ZenFlow ranks the rows of every 2-D weight.
    zo.zenflow.topk_fraction = zf.topk_fraction();
    zo.zenflow.update_interval = zf.update_interval();
    zo.zenflow.select_interval = zf.select_interval();
    zo.zenflow.full_warm_up_steps = zf.full_warm_up_steps();
    for (const model::TensorView& t : layout.tensors()) {
      if (t.kind != model::TensorView::Kind::kMatrix || t.shape.size() != 2) continue;
      zo.zenflow.matrices.push_back({t.offset, static_cast<size_t>(t.shape[0]), static_cast<size_t>(t.shape[1])});
    }
  }
  zo.comm = ctx.collective.get();
  zo.ops = ctx.device->ops.get();
  zo.comm_ops = ctx.device->comm_ops.get();
  zo.memory = memory;
  auto z = zero::ZeroOptimizer::Create(zo);
  if (!z.ok()) return z.status();
  ctx.zero = std::move(*z);
  if (absl::Status st = ctx.zero->InitFromFull(full.data()); !st.ok()) return st;

  if (assignment.logical_world_size() > 0) {
    // Every logical share must be computed by exactly one rank (a gap would
    // silently drop data); all ranks see the same counts, so all agree.
    std::vector<double> owners(assignment.logical_world_size(), 0.0);
    for (int l = assignment.logical_rank_begin(); l < assignment.logical_rank_end(); ++l) owners[l] = 1;
    if (absl::Status st = AllreduceSum(ctx, owners); !st.ok()) return st;
    for (size_t l = 0; l < owners.size(); ++l) {
      if (owners[l] != 1) {
        return absl::InvalidArgumentError("assignment: logical share " + std::to_string(l) + " of " +
                                          std::to_string(owners.size()) + " is assigned to " +
                                          std::to_string(static_cast<int>(owners[l])) + " ranks (must be exactly 1)");
      }
    }
  }

  ctx.checkpoint_root = spec.checkpoint().dir();
  if (ctx.checkpoint_root.empty() && !assignment.run_dir().empty()) {
    ctx.checkpoint_root = assignment.run_dir() + "/checkpoints";
  }
  const std::string restore = !assignment.restore_from().empty() ? assignment.restore_from() : spec.resume_from();
  const auto restore_start = std::chrono::steady_clock::now();
  if (assignment.live_restore()) {
    // Degraded continuation: the survivors keep their live state.
    if (absl::Status st = LiveRestore(ctx, assignment.live_restore_step(),
                                      assignment.live_restore_allow_inflight()
                                          ? std::optional<int64_t>(assignment.live_restore_inflight_step())
                                          : std::nullopt,
                                      live, report);
        !st.ok())
      return RestoreFailure(st);
  } else if (assignment.peer_restore_step() > 0) {
    std::vector<int> ranks(assignment.peer_restore_ranks().begin(), assignment.peer_restore_ranks().end());
    if (absl::Status st = RestoreFromPeers(ctx, assignment.peer_restore_step(), ranks, report); !st.ok()) {
      return RestoreFailure(st);
    }
    ctx.last_trained_step = assignment.peer_restore_step();
  } else if (!restore.empty()) {
    // The coordinator also names the job's resume_from as restore_from
    // (when the job has no checkpoint of its own yet): that one is the
    // user's checkpoint, written by another job, wherever it lies.
    const bool own_checkpoint = !assignment.restore_from().empty() && assignment.restore_from() != spec.resume_from();
    if (absl::Status st = RestoreCheckpoint(ctx, restore, own_checkpoint, report); !st.ok()) {
      return RestoreFailure(st);
    }
    auto* result = report->mutable_setup();
    result->set_restore_source(tandem::v1::RESTORE_SOURCE_DISK);
    result->set_restore_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - restore_start).count());
    // A checkpoint of step s holds the state after training phase s.
    if (result->restored()) ctx.last_trained_step = result->restored_step();
  }
  auto mem = ctx.zero->memory();
  (*report->mutable_values())["param_bytes"] = static_cast<double>(mem.param_bytes);
  (*report->mutable_values())["grad_bytes"] = static_cast<double>(mem.grad_bytes);
  (*report->mutable_values())["optimizer_bytes"] = static_cast<double>(mem.optimizer_bytes);
  (*report->mutable_values())["trainable_params"] = static_cast<double>(ctx.zero->num_trainable());
  (*report->mutable_values())["compute_bytes"] = static_cast<double>(mem.compute_bytes);
  // Everything this job holds in the device's memory (model workspace,
  // ZeRO state, KV cache once generated).
  (*report->mutable_values())["device_bytes"] = static_cast<double>(ctx.device->memory->allocated_bytes());
  (*report->mutable_values())["num_params"] = static_cast<double>(model::ParameterCount(ctx.config));
  if (!ctx.data_log.empty()) report->add_log_lines(ctx.data_log);
  if (ctx.train_data) {
    const auto& st = ctx.train_data->stats();
    (*report->mutable_values())["data_rows"] = static_cast<double>(st.rows);
    (*report->mutable_values())["data_bad_rows_skipped"] = static_cast<double>(st.bad_rows_skipped);
    (*report->mutable_values())["prompts_dropped"] = static_cast<double>(st.prompts_dropped);
    (*report->mutable_values())["prompts_truncated"] = static_cast<double>(st.prompts_truncated);
  }
  report->add_log_lines("rank " + std::to_string(ctx.rank) + "/" + std::to_string(ctx.world) + ": model with " +
                        std::to_string(model::ParameterCount(ctx.config)) + " parameters, ZeRO stage " +
                        std::to_string(zo.stage) + ", device " + ctx.device->name);
  return absl::OkStatus();
}

}  // namespace tandem::worker
