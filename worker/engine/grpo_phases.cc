// GRPO / PPO-clip phases: ROLLOUT, SCORE, LOGPROBS, UPDATE.
//
// Determinism: prompt p of step s is task->Sample(seed', (s-1)*P + p); the
// sampling draws are keyed by (seed'', p*G + g), so the same job produces the
// same trajectories for any number of ranks. Ranks own whole groups
// (RankSlice over prompts; in degraded continuation a block of the full
// job's shares, data_shares.h), so advantages need no communication; loss
// normalisers are global counts (one scalar allreduce per mini-batch).
// With rollout.tp_size > 1 the ranks of a tensor-parallel group generate
// their prompts together (the union of their RankSlices) and each keeps its
// own; the draws are keyed the same way, so the trajectories are those of
// tp_size 1 up to the fp32 order of the sums.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/data_shares.h"
#include "worker/engine/grad_accumulation.h"
#include "worker/engine/phases.h"
#include "worker/engine/reference_policy.h"
#include "worker/engine/spec_convert.h"
#include "worker/rl/grpo.h"
#include "worker/rl/lr_schedule.h"
#include "worker/rollout/spec_options.h"
#include "worker/rollout/tp_gather.h"

namespace tandem::worker {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }
int GroupSize(const JobContext& ctx) { return std::max(1, ctx.spec().rl().group_size()); }

// One optimizer step per RL step: PPO's ratio is exactly 1 at that step.
bool SingleUpdatePerStep(const JobContext& ctx) {
  return std::max(1, ctx.spec().rl().epochs()) == 1 && std::max(1, ctx.spec().rl().mini_batches()) == 1;
}
int64_t PromptsPerStep(const JobContext& ctx) { return std::max(1, ctx.spec().rl().prompts_per_step()); }

model::Batch ToModelBatch(const rl::PackedBatch& p) {
  model::Batch b;
  b.tokens = p.tokens;
  b.targets = p.targets;
  b.positions = p.positions;
  b.cu_seqlens = p.cu_seqlens;
  return b;
}

// Scatters per-trajectory completion-token values into the packed batch's
// target-aligned layout (positions where loss_mask is 1, in order).
void Scatter(const rl::PackedBatch& packed, const std::vector<const std::vector<float>*>& per_traj,
             std::vector<float>& out) {
  out.assign(packed.tokens.size(), 0.f);
  for (int s = 0; s < packed.num_sequences; ++s) {
    size_t c = 0;
    for (int j = packed.cu_seqlens[s]; j < packed.cu_seqlens[s + 1]; ++j) {
      if (packed.loss_mask[j] != 0.f && c < per_traj[s]->size()) out[j] = (*per_traj[s])[c++];
    }
  }
}

// Sum and count of |sampled - training| log-prob over the completion tokens
// that have a sampler log-prob.
void AddMismatch(const rl::PackedBatch& packed, const std::vector<const std::vector<float>*>& sampled,
                 const std::vector<float>& logp, double* sum, double* n) {
  for (int s = 0; s < packed.num_sequences; ++s) {
    size_t c = 0;
    for (int j = packed.cu_seqlens[s]; j < packed.cu_seqlens[s + 1]; ++j) {
      if (packed.loss_mask[j] == 0.f || c >= sampled[s]->size()) continue;
      *sum += std::abs(static_cast<double>((*sampled[s])[c++]) - logp[j]);
      *n += 1;
    }
  }
}

// Gathers the target-aligned values of sequence s back into a vector.
void GatherSeq(const rl::PackedBatch& packed, const float* values, int s, std::vector<float>& out) {
  out.clear();
  for (int j = packed.cu_seqlens[s]; j < packed.cu_seqlens[s + 1]; ++j) {
    if (packed.loss_mask[j] != 0.f) out.push_back(values[j]);
  }
}

// This rank's trajectories (group-major, prompts in order) split by data
// share (data_shares.h): share k's trajectories are [begin, end).
struct ShareTrajectories {
  DataShare share;
  size_t begin = 0, end = 0;
};
std::vector<ShareTrajectories> TrajectoriesByShare(const JobContext& ctx) {
  const size_t G = static_cast<size_t>(GroupSize(ctx));
  const auto shares = MyShares(ctx, PromptsPerStep(ctx));
  const int64_t first = shares.front().range.begin;
  std::vector<ShareTrajectories> out;
  for (const DataShare& s : shares) {
    const size_t b = std::min(ctx.rl.trajectories.size(), static_cast<size_t>(s.range.begin - first) * G);
    const size_t e = std::min(ctx.rl.trajectories.size(), static_cast<size_t>(s.range.end - first) * G);
    out.push_back({s, b, e});
  }
  return out;
}

// Decodes each sequence as it is generated and says when its text contains
// one of rl.stop (matched on the streaming decoder's settled text).
class StopStrings {
 public:
  StopStrings(const JobContext& ctx, size_t n) : stops_(ctx.spec().rl().stop().begin(), ctx.spec().rl().stop().end()) {
    if (stops_.empty() || !ctx.tokenizer) return;
    for (size_t i = 0; i < n; ++i) decoders_.push_back(ctx.tokenizer->NewStreamDecoder(/*skip_special_tokens=*/true));
    texts_.resize(n);
  }
  bool active() const { return !decoders_.empty(); }
  bool Add(size_t i, int32_t id) {
    const std::string piece = decoders_[i]->Add(id);
    if (piece.empty()) return false;
    std::string& text = texts_[i];
    // Only the new text and the longest stop's length before it can hold a
    // new match.
    size_t longest = 0;
    for (const auto& s : stops_) longest = std::max(longest, s.size());
    const size_t from = text.size() > longest ? text.size() - longest : 0;
    text += piece;
    return rl::FindStopString(std::string_view(text).substr(from), stops_) != std::string_view::npos;
  }

 private:
  std::vector<std::string> stops_;
  std::vector<std::unique_ptr<text::StreamDecoder>> decoders_;
  std::vector<std::string> texts_;
};

// pad: the provider runs collectives per forward (the sharded reference),
// so every rank runs the most forwards any rank runs (padding forwards over
// a two-token batch, results dropped).
absl::Status ComputeLogprobs(JobContext& ctx, model::ParamProvider& params, std::vector<std::vector<float>>& out,
                             bool pad = false) {
  auto& trajs = ctx.rl.trajectories;
  out.assign(trajs.size(), {});
  const int micro = std::max(1, ctx.spec().train().micro_batch());
  std::vector<float> logp;
  // Micro-batches within each share: the batches of the full-size job.
  std::vector<std::pair<size_t, size_t>> batches;
  for (const auto& st : TrajectoriesByShare(ctx)) {
    for (size_t b = st.begin; b < st.end; b += micro) batches.emplace_back(b, std::min(st.end, b + micro));
  }
  // Every rank learns how many forwards the busiest one runs before the
  // first forward's collectives.
  int64_t passes = static_cast<int64_t>(batches.size());
  if (pad) {
    auto most = MaxOverRanks(ctx, passes);
    if (!most.ok()) return most.status();
    passes = *most;
  }
  for (const auto& [b, e] : batches) {
    std::vector<double> zeros(e - b, 0.0);
    auto rb = rl::BuildRlBatch(std::span(trajs).subspan(b, e - b), zeros);
    if (!rb.ok()) return rb.status();
    model::Batch batch = ToModelBatch(rb->packed);
    logp.assign(batch.num_tokens(), 0.f);
    if (absl::Status st = ctx.model->ForwardLogprobs(batch, params, logp.data()); !st.ok()) return st;
    if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
    for (size_t s = 0; s < e - b; ++s) GatherSeq(rb->packed, logp.data(), s, out[b + s]);
  }
  model::Batch filler;
  filler.AddSequence(std::vector<int32_t>{0, 0, 0});
  for (int64_t p = static_cast<int64_t>(batches.size()); p < passes; ++p) {
    logp.assign(filler.num_tokens(), 0.f);
    if (absl::Status st = ctx.model->ForwardLogprobs(filler, params, logp.data()); !st.ok()) return st;
  }
  return absl::OkStatus();
}
}  // namespace

rl::CompletionText DecodeResponse(const JobContext& ctx, std::span<const int32_t> ids) {
  if (ctx.task) return rl::DecodeCompletion(ids, model::CharTokenizer::Default());
  std::vector<std::string> stops(ctx.spec().rl().stop().begin(), ctx.spec().rl().stop().end());
  return rl::DecodeCompletion(ids, *ctx.tokenizer, ctx.stop_ids, stops);
}

// Entering a tensor-parallel rollout: this rank's TP slice of the weights,
// gathered from the ZeRO parameter shards (only the floats the slice needs
// cross the wire), in device memory; bf16 jobs round it as the compute copy.
absl::Status EnterTpRollout(JobContext& ctx, rollout::TpGatherStats* stats) {
  if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
  std::vector<float> shard(ctx.zero->shard_size());
  ctx.zero->CopyParamShard(shard.data());
  std::vector<float> slice(ctx.tp_decoder->slice_layout().total_floats());
  auto gathered = rollout::GatherTpSlice(*ctx.collective, ctx.config, ctx.tp_decoder->tp_size(), ctx.zero->units(),
                                         shard.data(), slice.data(), ctx.timeout);
  if (!gathered.ok()) return gathered.status();
  *stats = *gathered;
  kernels::DeviceMemory* mem = ctx.device->memory.get();
  if (!ctx.tp_slice.Allocate(mem, slice.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("rollout: cannot allocate the tensor-parallel slice (",
                                                     slice.size() * sizeof(float), " bytes) in ", mem->name(),
                                                     " memory"));
  }
  ctx.tp_slice.Upload(slice.data(), slice.size());
  if (ctx.zero->precision() == zero::Precision::kBf16) {
    kernels::DeviceArray<uint16_t> half;
    if (!half.Allocate(mem, slice.size())) {
      ctx.tp_slice.reset();
      return absl::ResourceExhaustedError("rollout: cannot allocate the bf16 copy of the tensor-parallel slice");
    }
    ctx.device->ops->float_to_bf16(ctx.tp_slice.data(), half.data(), slice.size());
    ctx.device->ops->bf16_to_float(half.data(), ctx.tp_slice.data(), slice.size());
  }
  return absl::OkStatus();
}

absl::Status Rollout(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  if (!ctx.train_data && !ctx.task) {
    return absl::FailedPreconditionError("ROLLOUT needs prompts with reference answers: set data.train or task.name");
  }
  if (!ctx.tokenizer) {
    return absl::FailedPreconditionError(
        "ROLLOUT needs a tokenizer (model.from with tokenizer.json, or the char tokenizer)");
  }
  const auto& spec = ctx.spec();
  const int G = GroupSize(ctx);
  const int64_t P = PromptsPerStep(ctx);
  const rl::IndexRange mine = MyRange(ctx, P);
  // Tensor-parallel rollout: the TP group generates the prompts of all its
  // ranks (each rank runs the same batches over its slice); each rank keeps
  // its own.
  const int tp = ctx.tp_decoder != nullptr ? ctx.tp_decoder->tp_size() : 1;
  rl::IndexRange gen_range = mine;
  if (tp > 1) {
    const int first = ctx.rank / tp * tp;
    gen_range = {rl::RankSlice(P, first, ctx.world).begin, rl::RankSlice(P, first + tp - 1, ctx.world).end};
  }
  const size_t own_first = static_cast<size_t>(mine.begin - gen_range.begin) * G;
  const size_t own_count = static_cast<size_t>(mine.size()) * G;
  ctx.rl = RlStepState{};
  ctx.rl.step = step;
  // The frozen reference policy of the KL term is the model RL starts from
  // (after any SFT warm start); host memory, full copy - or, with
  // rl.shard_reference, this rank's shard of it. Checkpoints keep it.
  if (spec.rl().kl_coef() > 0 && ctx.ref_params.empty() && !ctx.ref_shard) {
    if (spec.rl().shard_reference()) {
      if (absl::Status st = TakeShardedReference(ctx); !st.ok()) return st;
    } else {
      ctx.ref_params.assign(ctx.model->layout().total_floats(), 0.f);
      ctx.ref_device.reset();
      if (absl::Status st = ctx.zero->GatherFull(ctx.ref_params.data()); !st.ok()) return st;
    }
  }

  std::vector<std::vector<int32_t>> prompts;
  std::vector<uint64_t> seq_ids;
  const uint64_t prompt_seed = DeriveSeed(spec.seed(), kSeedRlPrompts);
  for (int64_t p = gen_range.begin; p < gen_range.end; ++p) {
    const bool own = p >= mine.begin && p < mine.end;
    const uint64_t flat = static_cast<uint64_t>((step - 1) * P + p);
    std::vector<int32_t> ids;
    rl::Example ex;
    if (ctx.train_data) {
      // Global order over the rows: the same for every world size.
      const auto& rows = ctx.train_data->rows();
      const rl::TextRow& row = rows[rl::DataOrder(prompt_seed, rows.size(), spec.data().shuffle(), flat)];
      ids = row.prompt_ids;
      ex.prompt = row.prompt;
      ex.answer = row.answer;
      if (own) ctx.rl.rows.push_back(&row);
    } else {
      ex = ctx.task->Sample(prompt_seed, flat);
      ids = {ctx.dataset->tokens().bos};
      auto enc = ctx.tokenizer->Encode(ex.prompt, /*add_special_tokens=*/false);
      if (!enc.ok()) return enc.status();
      ids.insert(ids.end(), enc->begin(), enc->end());
    }
    for (int g = 0; g < G; ++g) {
      prompts.push_back(ids);
      seq_ids.push_back(static_cast<uint64_t>(p * G + g));
    }
    if (!own) continue;
    ctx.rl.examples.push_back(std::move(ex));
    ctx.rl.prompt_index.push_back(p);
  }

  // Enter inference: gather weights once (ZeRO-3), optionally offload the
  // optimizer state; leave: free both. Timed as the switch cost.
  const auto t_enter = Clock::now();
  if (spec.rl().offload_optimizer()) {
    if (absl::Status st = ctx.zero->OffloadOptimizerState(); !st.ok()) return st;
  }
  rollout::TpGatherStats tp_gather;
  if (tp > 1) {
    if (absl::Status st = EnterTpRollout(ctx, &tp_gather); !st.ok()) return st;
  } else {
    if (absl::Status st = ctx.zero->BeginInference(); !st.ok()) return st;
  }
  const double enter_s = Seconds(t_enter);

  rollout::RolloutOptions so = rollout::OptionsFromSpec(
      spec, DeriveSeed(spec.seed(), kSeedSampling, static_cast<uint64_t>(step)), ctx.device->capacity_bytes);
  so.stop_ids = ctx.stop_ids;
  StopStrings stops(ctx, prompts.size());
  if (stops.active()) so.stop_check = [&stops](size_t i, int32_t id) { return stops.Add(i, id); };
  // One request per sample: the G samples of a prompt share its prefill.
  std::vector<rollout::RolloutRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i] = {prompts[i], static_cast<int>(i / G), seq_ids[i]};
  }
  const auto t_gen = Clock::now();
  absl::StatusOr<rollout::RolloutResult> gen = rollout::RolloutResult{};
  rollout::TpStats tp_stats;
  if (tp > 1) {
    model::FlatParamProvider slice(ctx.tp_decoder->slice_layout(), ctx.tp_slice.data(), nullptr);
    ctx.tp_decoder->ResetStats();
    if (!prompts.empty()) gen = ctx.tp_rollout->Generate(requests, so, slice);
    tp_stats = ctx.tp_decoder->stats();
  } else if (!prompts.empty()) {
    gen = ctx.rollout->Generate(requests, so, ctx.zero->inference_view());
  }
  const double gen_s = Seconds(t_gen);

  const auto t_leave = Clock::now();
  ctx.rollout->Release();
  if (tp > 1) {
    ctx.tp_rollout->Release();
    ctx.tp_slice.reset();
  } else {
    ctx.zero->EndInference();
  }
  if (spec.rl().offload_optimizer()) {
    if (absl::Status st = ctx.zero->RestoreOptimizerState(); !st.ok()) return st;
  }
  const double leave_s = Seconds(t_leave);
  if (!gen.ok()) return gen.status();

  if (!prompts.empty() && gen->sequences.size() != prompts.size()) {
    return absl::InternalError("rollout: the engine returned a different number of sequences than requested");
  }
  const std::vector<rollout::RolloutSequence> own_seqs(
      gen->sequences.begin() + static_cast<std::ptrdiff_t>(std::min(own_first, gen->sequences.size())),
      gen->sequences.begin() + static_cast<std::ptrdiff_t>(std::min(own_first + own_count, gen->sequences.size())));
  for (size_t i = 0; i < own_seqs.size(); ++i) {
    rl::Trajectory t;
    t.prompt_ids = prompts[own_first + i];
    t.completion_ids = own_seqs[i].tokens;
    t.logp_sampled = own_seqs[i].raw_logprobs;
    t.group = ctx.rl.prompt_index[i / G];
    t.policy_version = ctx.policy_version;
    ctx.rl.trajectories.push_back(std::move(t));
  }
  // Response lengths and how many hit max_new_tokens without ending.
  double len_sum = 0, len_max = 0, truncated = 0;
  for (const auto& g : own_seqs) {
    len_sum += static_cast<double>(g.tokens.size());
    len_max = std::max(len_max, static_cast<double>(g.tokens.size()));
    truncated += g.finish == rollout::Finish::kLength ? 1 : 0;
  }
  auto global_max = MaxOverRanks(ctx, static_cast<int64_t>(len_max));
  if (!global_max.ok()) return global_max.status();
  // Each token counted once: by the rank that keeps its sequence.
  std::vector<double> sums = {len_sum,
                              gen_s,
                              len_sum,
                              truncated,
                              static_cast<double>(own_seqs.size()),
                              static_cast<double>(tp_gather.bytes_received),
                              static_cast<double>(tp_gather.full_gather_bytes),
                              tp_stats.allreduce_seconds,
                              tp_stats.exposed_seconds};
  if (absl::Status st = AllreduceSum(ctx, sums); !st.ok()) return st;
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_switch_seconds(enter_s + leave_s);
  (*m->mutable_extra())["rollout_tokens"] = sums[0];
  (*m->mutable_extra())["rollout_tokens_per_s"] = sums[1] > 0 ? sums[0] / (sums[1] / ctx.world) : 0;
  (*m->mutable_extra())["kv_cache_bytes"] = static_cast<double>(gen->kv_pool_bytes);
  (*m->mutable_extra())["kv_cache_peak_bytes"] = static_cast<double>(gen->kv_peak_bytes);
  (*m->mutable_extra())["rollout_prefill_tokens_saved"] = static_cast<double>(gen->scheduler.prompt_tokens_saved);
  (*m->mutable_extra())["rollout_preemptions"] = static_cast<double>(gen->scheduler.preemptions);
  (*m->mutable_extra())["response_length_mean"] = sums[4] > 0 ? sums[2] / sums[4] : 0;
  (*m->mutable_extra())["response_length_max"] = static_cast<double>(*global_max);
  (*m->mutable_extra())["truncated_fraction"] = sums[4] > 0 ? sums[3] / sums[4] : 0;
  if (tp > 1) {
    // The switch into the rollout: bytes the TP slices took from the ZeRO
    // shards vs what a full gather on every rank would move (all ranks).
    (*m->mutable_extra())["rollout_tp_size"] = tp;
    (*m->mutable_extra())["rollout_switch_bytes"] = sums[5];
    (*m->mutable_extra())["rollout_switch_full_gather_bytes"] = sums[6];
    (*m->mutable_extra())["rollout_tp_allreduce_s"] = sums[7] / ctx.world;
    (*m->mutable_extra())["rollout_tp_hidden_share"] = sums[7] > 0 ? std::max(0.0, 1.0 - sums[8] / sums[7]) : 0;
  }
  if (ctx.train_data) {
    (*m->mutable_extra())["prompts_dropped"] = static_cast<double>(ctx.train_data->stats().prompts_dropped);
    (*m->mutable_extra())["prompts_truncated"] = static_cast<double>(ctx.train_data->stats().prompts_truncated);
    (*m->mutable_extra())["data_bad_rows_skipped"] = static_cast<double>(ctx.train_data->stats().bad_rows_skipped);
  }
  (*report->mutable_values())["switch_enter_s"] = enter_s;
  (*report->mutable_values())["switch_leave_s"] = leave_s;
  return absl::OkStatus();
}

absl::Status Score(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  if (ctx.rl.step != step ||
      ctx.rl.trajectories.size() != ctx.rl.examples.size() * static_cast<size_t>(GroupSize(ctx))) {
    return absl::FailedPreconditionError("SCORE for step " + std::to_string(step) + " without its ROLLOUT");
  }
  const int G = GroupSize(ctx);
  auto& trajs = ctx.rl.trajectories;
  // The reward sees decoded text: ids before the first stop id, special
  // tokens skipped, cut before a stop string.
  std::vector<rl::CompletionText> texts(trajs.size());
  for (size_t i = 0; i < trajs.size(); ++i) texts[i] = DecodeResponse(ctx, trajs[i].completion_ids);
  double reward_sum = 0, correct = 0, well_formed = 0, chars = 0;
  for (const auto& t : texts) chars += static_cast<double>(t.text.size());
  if (ctx.reward_client) {
    std::vector<rl::RewardRequestItem> items(trajs.size());
    for (size_t i = 0; i < trajs.size(); ++i) {
      const rl::Example& ex = ctx.rl.examples[i / G];
      items[i].prompt = ex.prompt;
      items[i].reference = ex.answer;
      items[i].completion = texts[i].text;
      items[i].completion_ids = trajs[i].completion_ids;
      items[i].terminated = texts[i].terminated;
      if (!ctx.rl.rows.empty()) items[i].fields = ctx.rl.rows[i / G]->fields;
    }
    auto rewards = ctx.reward_client->Score(items, step);
    if (!rewards.ok()) return rewards.status();
    for (size_t i = 0; i < trajs.size(); ++i) trajs[i].reward = (*rewards)[i];
  }
  for (size_t i = 0; i < trajs.size(); ++i) {
    const rl::Example& ex = ctx.rl.examples[i / G];
    rl::RewardResult r;
    if (ctx.task) {
      r = ctx.task->Reward(ex, texts[i].text, texts[i].terminated);
    } else if (ctx.reward) {
      r = ctx.reward->Score(texts[i].text, ex.answer);
    }
    if (!ctx.reward_client) trajs[i].reward = r.reward;
    correct += r.correct ? 1 : 0;
    well_formed += r.well_formed ? 1 : 0;
    reward_sum += trajs[i].reward;
  }
  ctx.rl.scored = true;
  // A sample of what the policy writes, for `tandemctl logs`.
  for (size_t i = 0; i < trajs.size() && i < 2 && ctx.rank == 0; ++i) {
    const rl::Example& ex = ctx.rl.examples[i / G];
    if (ctx.task) {
      report->add_log_lines("step " + std::to_string(step) + " sample: " + ex.prompt + texts[i].text +
                            (texts[i].terminated ? "" : "...") + " (answer " + ex.answer + ", reward " +
                            std::to_string(trajs[i].reward) + ")");
    } else {
      std::string extracted = "none";
      if (ctx.reward) {
        if (auto a = ctx.reward->ExtractAnswer(texts[i].text)) extracted = "'" + *a + "'";
      }
      report->add_log_lines("step " + std::to_string(step) + " sample response (decoded, " +
                            std::to_string(trajs[i].completion_ids.size()) + " tokens" +
                            (texts[i].terminated ? "" : ", cut at max_new_tokens") + "): '" +
                            texts[i].text.substr(0, 400) + "' answer " + extracted + ", reference '" +
                            ex.answer.substr(0, 200) + "', reward " + std::to_string(trajs[i].reward));
    }
  }
  std::vector<double> sums = {reward_sum, correct, static_cast<double>(trajs.size()), well_formed, chars};
  if (absl::Status st = AllreduceSum(ctx, sums); !st.ok()) return st;
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_reward_mean(sums[2] > 0 ? sums[0] / sums[2] : 0);
  (*m->mutable_extra())["rollout_accuracy"] = sums[2] > 0 ? sums[1] / sums[2] : 0;
  if (!ctx.task) {
    (*m->mutable_extra())["well_formed_fraction"] = sums[2] > 0 ? sums[3] / sums[2] : 0;
    // Bytes of decoded response text the reward saw (special tokens skipped).
    (*m->mutable_extra())["response_chars_mean"] = sums[2] > 0 ? sums[4] / sums[2] : 0;
  }
  return absl::OkStatus();
}

// The KL reference as the model reads it: ctx.ref_params itself on host
// memory, else a device copy made once per reference (ref_device).
absl::StatusOr<float*> RefParamsOnDevice(JobContext& ctx) {
  if (ctx.device->host_memory()) return ctx.ref_params.data();
  if (ctx.ref_device.size() != ctx.ref_params.size()) {
    if (!ctx.ref_device.Allocate(ctx.device->memory.get(), ctx.ref_params.size())) {
      return absl::ResourceExhaustedError("KL reference: cannot allocate " +
                                          std::to_string(ctx.ref_params.size() * sizeof(float)) +
                                          " bytes of device memory: " + ctx.device->memory->last_error());
    }
    ctx.ref_device.Upload(ctx.ref_params.data(), ctx.ref_params.size());
  }
  return ctx.ref_device.data();
}

absl::Status Logprobs(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  if (ctx.rl.step != step || !ctx.rl.scored) {
    return absl::FailedPreconditionError("LOGPROBS for step " + std::to_string(step) + " without ROLLOUT and SCORE");
  }
  // Old policy = the weights that generated the rollout (no update since).
  // With a single optimizer step per RL step (one epoch, one mini-batch)
  // those are the weights of the update's own forward: the ratio is exactly
  // 1 there, and UPDATE takes the old log-probs from that forward instead of
  // a second pass over every trajectory here.
  ctx.rl.old_is_current = SingleUpdatePerStep(ctx);
  ctx.rl.logp_old.clear();
  if (!ctx.rl.old_is_current) {
    if (absl::Status st = ComputeLogprobs(ctx, *ctx.zero, ctx.rl.logp_old); !st.ok()) return st;
    // Train/inference mismatch: the sampler's log-prob of each sampled token
    // against the training forward's, on the same weights. Near zero unless
    // the generation and training paths disagree.
    double diff_sum = 0, diff_n = 0;
    for (size_t i = 0; i < ctx.rl.trajectories.size(); ++i) {
      const auto& sampled = ctx.rl.trajectories[i].logp_sampled;
      const auto& old = ctx.rl.logp_old[i];
      for (size_t t = 0; t < sampled.size() && t < old.size(); ++t) {
        diff_sum += std::abs(static_cast<double>(sampled[t]) - old[t]);
        diff_n += 1;
      }
    }
    std::vector<double> diff = {diff_sum, diff_n};
    if (absl::Status st = AllreduceSum(ctx, diff); !st.ok()) return st;
    (*report->mutable_metrics()->mutable_extra())["logprob_mismatch_mean"] = diff[1] > 0 ? diff[0] / diff[1] : 0;
  }
  if (ctx.ref_shard) {
    // Unit by unit over the collective the optimizer uses: drain it first.
    if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
    absl::Status st = ComputeLogprobs(ctx, *ctx.ref_shard, ctx.rl.logp_ref, /*pad=*/true);
    if (st.ok()) st = ctx.ref_shard->status();
    ctx.ref_shard->Trim();
    if (!st.ok()) return st;
  } else if (!ctx.ref_params.empty()) {
    auto ref_weights = RefParamsOnDevice(ctx);
    if (!ref_weights.ok()) return ref_weights.status();
    model::FlatParamProvider ref(ctx.model->layout(), *ref_weights, nullptr);
    if (absl::Status st = ComputeLogprobs(ctx, ref, ctx.rl.logp_ref); !st.ok()) return st;
  }
  ctx.rl.have_logprobs = true;
  report->mutable_metrics()->set_step(step);
  return absl::OkStatus();
}

absl::Status Update(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  if (ctx.rl.step != step || !ctx.rl.have_logprobs) {
    return absl::FailedPreconditionError("UPDATE for step " + std::to_string(step) + " without LOGPROBS");
  }
  const auto start = Clock::now();
  const auto& spec = ctx.spec();
  const auto& rlspec = spec.rl();
  const int G = GroupSize(ctx);
  const int64_t P = PromptsPerStep(ctx);
  auto& trajs = ctx.rl.trajectories;

  std::vector<double> rewards(trajs.size());
  for (size_t i = 0; i < trajs.size(); ++i) rewards[i] = trajs[i].reward;
  rl::AdvantageOptions ao;
  ao.group_size = G;
  ao.scale_by_std = rlspec.scale_rewards();
  auto adv = rl::GroupAdvantages(rewards, ao);
  if (!adv.ok()) return adv.status();

  rl::PolicyLossOptions lo;
  lo.clip_low = rlspec.clip() > 0 ? rlspec.clip() : 0.2;
  lo.clip_high = rlspec.clip_high() > 0 ? rlspec.clip_high() : lo.clip_low;
  lo.kl_coef = rlspec.kl_coef();
  lo.aggregation = rlspec.loss_agg() == "sequence" ? rl::LossAggregation::kSequence : rl::LossAggregation::kToken;
  const int epochs = std::max(1, rlspec.epochs());
  const int minis = std::max(1, rlspec.mini_batches());
  const int micro = std::max(1, spec.train().micro_batch());
  const auto prompt_parts = rl::SplitEven(P, minis);

  rl::LrSchedule sched;
  sched.lr = spec.train().lr();
  sched.warmup_steps = spec.train().warmup_steps();
  sched.total_steps = std::max<int64_t>(1, spec.train().steps()) * epochs * minis;
  sched.min_lr_ratio = spec.train().min_lr_ratio();

  const bool old_is_current = ctx.rl.old_is_current;
  double mismatch_sum = 0, mismatch_n = 0;  // sampler vs training forward (see Logprobs)
  double loss_sum = 0, kl_sum = 0, clip_sum = 0, ratio_sum = 0, tok_sum = 0, grad_norm = 0;
  double lr = 0;
  int updates = 0;
  std::vector<float> logp_new, old_tok, ref_tok, adv_tok;
  for (int e = 0; e < epochs; ++e) {
    for (int k = 0; k < minis; ++k) {
      // This rank's trajectories whose prompt falls in global part k, by
      // data share; passes (micro-batches) never mix shares.
      std::vector<size_t> idx;
      struct Pass {
        size_t begin, end;         // into idx
        model::ForwardOptions fo;  // the share's options (data_shares.h)
        model::BackwardOptions bo;
      };
      std::vector<Pass> passes;
      for (const auto& st : TrajectoriesByShare(ctx)) {
        const size_t first = idx.size();
        for (size_t i = st.begin; i < st.end; ++i) {
          const int64_t p = trajs[i].group;
          if (p >= prompt_parts[k].begin && p < prompt_parts[k].end) idx.push_back(i);
        }
        for (size_t b = first; b < idx.size(); b += micro) {
          const int64_t n = static_cast<int64_t>(passes.size());
          passes.push_back({b, std::min(idx.size(), b + micro), ShareForward(ctx, st.share),
                            ShareBackward(ctx, st.share, step, (e * minis + k) * 100000 + n)});
        }
      }
      double tokens = 0, seqs = 0;
      for (size_t i : idx) {
        tokens += static_cast<double>(trajs[i].completion_ids.size());
        seqs += trajs[i].completion_ids.empty() ? 0 : 1;
      }
      std::vector<double> norm = {tokens, seqs};
      if (absl::Status st = AllreduceSum(ctx, norm); !st.ok()) return st;
      const double normaliser = lo.aggregation == rl::LossAggregation::kToken ? norm[0] : norm[1];
      if (normaliser <= 0) continue;
      // Gradients accumulate over this mini-batch's micro-batches only.
      ctx.zero->ZeroGrads();
      if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
      // ZeRO-2/3 pair every forward/backward with collectives, so every rank
      // runs the same number of passes: ranks with fewer trajectories in this
      // mini-batch run zero-weight passes (dlogp = 0) on their first one.
      const int64_t local_passes = static_cast<int64_t>(passes.size());
      auto max_passes = MaxOverRanks(ctx, local_passes);
      if (!max_passes.ok()) return max_passes.status();
      GradAccumulator acc(ctx);  // train.accumulation
      for (int64_t pass = 0; pass < *max_passes; ++pass) {
        const bool padding = pass >= local_passes;
        const size_t b = padding ? 0 : passes[pass].begin;
        const size_t e2 = padding ? std::min<size_t>(1, trajs.size()) : passes[pass].end;
        const model::ForwardOptions fo = padding ? model::ForwardOptions{} : passes[pass].fo;
        const model::BackwardOptions bo = padding ? model::BackwardOptions{} : passes[pass].bo;
        if (padding && trajs.empty()) {
          return absl::InternalError("rank has no trajectory to pad its passes with");
        }
        std::vector<rl::Trajectory> sub;
        std::vector<double> sub_adv;
        std::vector<const std::vector<float>*> old_ptr, ref_ptr, sampled_ptr;
        for (size_t j = b; j < e2; ++j) {
          const size_t t = padding ? j : idx[j];
          sub.push_back(trajs[t]);
          sub_adv.push_back((*adv)[t]);
          if (old_is_current) {
            sampled_ptr.push_back(&trajs[t].logp_sampled);
          } else {
            old_ptr.push_back(&ctx.rl.logp_old[t]);
          }
          if (!ctx.rl.logp_ref.empty()) ref_ptr.push_back(&ctx.rl.logp_ref[t]);
        }
        auto rb = rl::BuildRlBatch(sub, sub_adv);
        if (!rb.ok()) return rb.status();
        model::Batch batch = ToModelBatch(rb->packed);
        logp_new.assign(batch.num_tokens(), 0.f);
        if (absl::Status st = acc.NextModel().ForwardLogprobs(batch, *ctx.zero, logp_new.data(), nullptr, fo); !st.ok())
          return st;
        if (old_is_current) {
          if (!padding) AddMismatch(rb->packed, sampled_ptr, logp_new, &mismatch_sum, &mismatch_n);
        } else {
          Scatter(rb->packed, old_ptr, old_tok);
        }
        if (!ref_ptr.empty()) Scatter(rb->packed, ref_ptr, ref_tok);
        rl::PolicyLossInput<float> in;
        in.logp_new = logp_new;
        in.logp_old = old_is_current ? logp_new : old_tok;  // the same weights: r = 1
        if (!ref_ptr.empty()) in.logp_ref = ref_tok;
        in.advantages = rb->advantages;
        in.mask = rb->packed.loss_mask;
        in.cu_seqlens = rb->packed.cu_seqlens;
        auto loss = rl::PolicyLoss(in, lo, normaliser);
        if (!loss.ok()) return loss.status();
        if (padding) {
          std::fill(loss->dlogp.begin(), loss->dlogp.end(), 0.f);
          loss->loss = loss->kl_sum = loss->clipped_sum = loss->ratio_sum = 0;
          loss->masked_tokens = 0;
        }
        if (absl::Status st = acc.Backward(loss->dlogp, bo); !st.ok()) return st;
        if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
        loss_sum += loss->loss;
        kl_sum += loss->kl_sum;
        clip_sum += loss->clipped_sum;
        ratio_sum += loss->ratio_sum;
        tok_sum += loss->masked_tokens;
      }
      if (absl::Status st = acc.Finish(); !st.ok()) return st;
      if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
      // RL steps have their own schedule (the warm start's steps do not count).
      lr = sched.At((step - 1) * epochs * minis + updates);
      auto stats = ctx.zero->Step(static_cast<float>(lr), static_cast<float>(spec.train().grad_clip()));
      if (!stats.ok()) return stats.status();
      grad_norm = stats->grad_norm;
      ctx.optimizer_steps++;
      updates++;
      ctx.last_trained_step.reset();  // between this step's optimizer steps
    }
  }
  ctx.policy_version++;
  ctx.last_trained_step = step;
  std::vector<double> sums = {loss_sum, kl_sum, clip_sum, ratio_sum, tok_sum, mismatch_sum, mismatch_n};
  if (absl::Status st = AllreduceSum(ctx, sums); !st.ok()) return st;
  if (old_is_current && sums[6] > 0) {
    (*report->mutable_metrics()->mutable_extra())["logprob_mismatch_mean"] = sums[5] / sums[6];
  }
  const double seconds = Seconds(start);
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_loss(updates > 0 ? sums[0] / updates : 0);
  m->set_kl(sums[4] > 0 ? sums[1] / sums[4] : 0);
  m->set_lr(lr);
  m->set_grad_norm(grad_norm);
  m->set_tokens_per_s(seconds > 0 ? sums[4] / seconds : 0);
  (*m->mutable_extra())["clip_fraction"] = sums[4] > 0 ? sums[2] / sums[4] : 0;
  (*m->mutable_extra())["ratio_mean"] = sums[4] > 0 ? sums[3] / sums[4] : 0;
  (*m->mutable_extra())["policy_version"] = static_cast<double>(ctx.policy_version);
  ReportCollectiveBytes(ctx, m);  // the step's rollout, scoring, log-prob and update traffic
  return absl::OkStatus();
}

}  // namespace tandem::worker
