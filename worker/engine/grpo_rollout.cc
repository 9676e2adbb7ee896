// GRPO's ROLLOUT phase: the prompts of this rank (or of its tensor-parallel
// group) through the rollout engine, stop strings on the decoded text, and
// the phase's metrics. The other GRPO phases are in grpo_phases.cc; the
// determinism rules are in its header comment.
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
int64_t PromptsPerStep(const JobContext& ctx) { return std::max(1, ctx.spec().rl().prompts_per_step()); }

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

}  // namespace

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
  if (ctx.spec().rollout().shift_parallel()) {
    // Sequence-parallel steps run the full model on every rank: a full
    // gather beside the slice (every rank takes part).
    std::vector<float> full(ctx.tp_decoder->full_layout().total_floats());
    if (absl::Status st = ctx.zero->GatherFull(full.data()); !st.ok()) return st;
    if (!ctx.tp_full.Allocate(mem, full.size())) {
      ctx.tp_slice.reset();
      return absl::ResourceExhaustedError(absl::StrCat("rollout.shift_parallel: cannot allocate the full weights (",
                                                       full.size() * sizeof(float), " bytes) beside the slice in ",
                                                       mem->name(), " memory; turn it off or raise rollout.tp_size"));
    }
    ctx.tp_full.Upload(full.data(), full.size());
    if (ctx.zero->precision() == zero::Precision::kBf16) {
      kernels::DeviceArray<uint16_t> half;
      if (!half.Allocate(mem, full.size())) {
        ctx.tp_slice.reset();
        ctx.tp_full.reset();
        return absl::ResourceExhaustedError("rollout: cannot allocate the bf16 copy of the full weights");
      }
      ctx.device->ops->float_to_bf16(ctx.tp_full.data(), half.data(), full.size());
      ctx.device->ops->bf16_to_float(half.data(), ctx.tp_full.data(), full.size());
    }
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
    ids.insert(ids.begin(), ctx.soft_prompt.begin(), ctx.soft_prompt.end());
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
    requests[i].prompt = prompts[i];
    requests[i].group = static_cast<int>(i / G);
    requests[i].stream = seq_ids[i];
  }
  const auto t_gen = Clock::now();
  absl::StatusOr<rollout::RolloutResult> gen = rollout::RolloutResult{};
  rollout::TpStats tp_stats;
  if (tp > 1) {
    model::FlatParamProvider slice(ctx.tp_decoder->slice_layout(), ctx.tp_slice.data(), nullptr);
    model::FlatParamProvider full(ctx.tp_decoder->full_layout(), ctx.tp_full.data(), nullptr);
    ctx.tp_decoder->SetFullParams(ctx.tp_full.empty() ? nullptr : &full);
    ctx.tp_decoder->ResetStats();
    if (!prompts.empty()) gen = ctx.tp_rollout->Generate(requests, so, slice);
    tp_stats = ctx.tp_decoder->stats();
    ctx.tp_decoder->SetFullParams(nullptr);
  } else if (!prompts.empty()) {
    gen = ctx.rollout->Generate(requests, so, ctx.zero->inference_view());
  }
  const double gen_s = Seconds(t_gen);

  const auto t_leave = Clock::now();
  ctx.rollout->Release();
  if (tp > 1) {
    ctx.tp_rollout->Release();
    ctx.tp_slice.reset();
    ctx.tp_full.reset();
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
  if (gen->state_bytes > 0) {
    (*m->mutable_extra())["rollout_state_bytes"] = static_cast<double>(gen->state_bytes);
  }
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
    if (spec.rollout().shift_parallel()) {
      // Steps and rows of each mode (every rank of a group runs the same
      // steps: this rank's counts), and the full copy each rank holds.
      (*m->mutable_extra())["rollout_tp_steps"] = static_cast<double>(tp_stats.tp_steps);
      (*m->mutable_extra())["rollout_sp_steps"] = static_cast<double>(tp_stats.sp_steps);
      (*m->mutable_extra())["rollout_tp_step_tokens"] = static_cast<double>(tp_stats.tp_rows);
      (*m->mutable_extra())["rollout_sp_step_tokens"] = static_cast<double>(tp_stats.sp_rows);
      (*m->mutable_extra())["rollout_sp_comm_s"] = tp_stats.sp_comm_seconds;
      (*m->mutable_extra())["rollout_shift_full_copy_bytes"] =
          static_cast<double>(ctx.tp_decoder->full_layout().total_floats() * sizeof(float));
    }
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

}  // namespace tandem::worker
