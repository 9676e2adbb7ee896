// PHASE_SFT_STEP and PHASE_EVAL.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/engine/data_shares.h"
#include "worker/engine/grad_accumulation.h"
#include "worker/engine/phases.h"
#include "worker/engine/spec_convert.h"
#include "worker/rl/lr_schedule.h"
#include "worker/rollout/spec_options.h"

namespace tandem::worker {

namespace {
double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Counts the examples of a packed batch whose every completion token has
// probability > 1/2 (so it is also the greedy choice): exact match under
// teacher forcing.
void CountTeacherForcedExact(const rl::PackedBatch& p, const std::vector<float>& logp, double* exact,
                             double* examples) {
  const float log_half = std::log(0.5f);
  for (size_t s = 0; s + 1 < p.cu_seqlens.size(); ++s) {
    bool any = false, all = true;
    for (int32_t t = p.cu_seqlens[s]; t < p.cu_seqlens[s + 1]; ++t) {
      if (p.loss_mask[t] == 0.f) continue;
      any = true;
      all = all && logp[t] > log_half;
    }
    *examples += any ? 1 : 0;
    *exact += any && all ? 1 : 0;
  }
}

// The data shares of a training step: under sequence parallelism the ranks
// of a group take the same examples (the group is one data-parallel rank,
// rank / sp_size of world / sp_size) and each computes its slice of every
// micro-batch.
std::vector<DataShare> TrainShares(const JobContext& ctx, int64_t total) {
  if (ctx.sp_size <= 1) return MyShares(ctx, total);
  const int dp_rank = ctx.rank / ctx.sp_size, dp_world = ctx.world / ctx.sp_size;
  return {DataShare{dp_rank, rl::RankSlice(total, dp_rank, dp_world), false}};
}

model::Batch ToModelBatch(const rl::PackedBatch& p) {
  model::Batch b;
  b.tokens = p.tokens;
  b.targets = p.targets;
  b.positions = p.positions;
  b.cu_seqlens = p.cu_seqlens;
  return b;
}
}  // namespace

absl::Status AllreduceSum(JobContext& ctx, std::vector<double>& values) {
  if (ctx.world == 1 || values.empty()) return absl::OkStatus();
  // The optimizer's communication thread must be idle before we use the
  // communicator directly (zero_optimizer.h).
  if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
  // Exact for integer counts and adequate for metrics: sums in float after
  // splitting each double into a high and a low float part.
  std::vector<float> buf(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const float hi = static_cast<float>(values[i]);
    buf[2 * i] = hi;
    buf[2 * i + 1] = static_cast<float>(values[i] - hi);
  }
  absl::Status st = ctx.collective->allreduce(buf.data(), buf.size(), comm::ReduceOp::kSum, ctx.timeout);
  if (!st.ok()) return st;
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<double>(buf[2 * i]) + buf[2 * i + 1];
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MaxOverRanks(JobContext& ctx, int64_t value) {
  if (ctx.world == 1) return value;
  if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
  float v = static_cast<float>(value);
  absl::Status st = ctx.collective->allreduce(&v, 1, comm::ReduceOp::kMax, ctx.timeout);
  if (!st.ok()) return st;
  return static_cast<int64_t>(v);
}

namespace {
// The fraction of `global`'s examples, over all ranks, that the model gets
// exact under teacher forcing (forward only; each rank its own shares).
absl::StatusOr<double> ProbeExactFraction(JobContext& ctx, const std::vector<rl::SftExample>& global) {
  double exact = 0, examples = 0;
  std::vector<float> logp;
  const int64_t micro = std::max(1, ctx.spec().train().micro_batch());
  for (const DataShare& share : MyShares(ctx, static_cast<int64_t>(global.size()))) {
    for (const rl::IndexRange& mb : rl::MicroBatches(share.range, micro)) {
      std::vector<rl::SftExample> ex(global.begin() + mb.begin, global.begin() + mb.end);
      rl::PackedBatch packed = rl::PackSft(ex, ctx.dataset->tokens().bos, ctx.dataset->tokens().eos, ctx.soft_prompt);
      model::Batch batch = ToModelBatch(packed);
      logp.assign(batch.num_tokens(), 0.f);
      if (absl::Status st = ctx.model->ForwardLogprobs(batch, *ctx.zero, logp.data()); !st.ok()) return st;
      if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
      CountTeacherForcedExact(packed, logp, &exact, &examples);
    }
  }
  std::vector<double> counts = {exact, examples};
  if (absl::Status st = AllreduceSum(ctx, counts); !st.ok()) return st;
  return counts[1] > 0 ? counts[0] / counts[1] : 0.0;
}
}  // namespace

absl::Status SftStep(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  const auto start = std::chrono::steady_clock::now();
  if (!ctx.dataset) {
    return absl::FailedPreconditionError("SFT needs data: set task.name (a built-in task) or task.data (a JSONL file)");
  }
  const auto& spec = ctx.spec();
  const bool warm_start = step < 0;  // GRPO warm start steps are negative
  const int64_t data_step = warm_start ? -step - 1 : step - 1;
  const int64_t global_batch = spec.train().global_batch();
  const int64_t micro = spec.train().micro_batch();

  // The global loss normaliser: every rank counts the whole step's loss
  // tokens, so the gradient is the same for any world size.
  const auto global = ctx.dataset->GlobalBatch(data_step, global_batch);
  const int64_t loss_tokens = rl::CountLossTokens(global);
  if (loss_tokens == 0) {
    return absl::InvalidArgumentError("step has no completion tokens to train on");
  }
  const float inv = 1.f / static_cast<float>(loss_tokens);

  // A warm start with a stop accuracy holds (no forward, backward or
  // optimizer step) once the warm start's first batch, a fixed probe, is
  // exact often enough under teacher forcing. The probe depends on the
  // weights alone, so a held model stays held, with no state to carry
  // through checkpoints and recoveries.
  const double stop_accuracy = warm_start ? spec.init().sft_stop_accuracy() : 0;
  double probe_exact = 0;
  if (stop_accuracy > 0) {
    auto probe = ProbeExactFraction(ctx, ctx.dataset->GlobalBatch(0, global_batch));
    if (!probe.ok()) return probe.status();
    probe_exact = *probe;
  }
  const bool hold = stop_accuracy > 0 && probe_exact >= stop_accuracy;

  double loss_sum = 0, tokens = 0;
  std::vector<float> logp, dlogp;
  // Gradients accumulate over this step's micro-batches only.
  ctx.zero->ZeroGrads();
  if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
  // ZeRO-2/3 pair every forward/backward with collectives: in degraded mode
  // (a rank took over no share) and with speed-proportional shares a rank
  // that computes fewer micro-batches than another pads with zero-weight
  // passes over a one-token batch.
  const auto compute_start = std::chrono::steady_clock::now();
  int64_t padding = 0;
  if (ctx.zero->stage() >= 2 && (ctx.assignment.logical_world_size() > 0 || !ctx.speeds.empty())) {
    int64_t local = 0;
    for (const DataShare& share : MyShares(ctx, hold ? 0 : global_batch)) {
      local += static_cast<int64_t>(rl::MicroBatches(share.range, micro).size());
    }
    auto most = MaxOverRanks(ctx, local);
    if (!most.ok()) return most.status();
    padding = *most - local;
  }
  GradAccumulator acc(ctx);  // train.accumulation
  for (int64_t i = 0; i < padding; ++i) {
    model::Batch batch;
    const int32_t seq[2] = {ctx.dataset->tokens().bos, ctx.dataset->tokens().eos};
    batch.AddSequence(seq);
    logp.assign(batch.num_tokens(), 0.f);
    dlogp.assign(batch.num_tokens(), 0.f);
    if (absl::Status st = acc.NextModel().ForwardLogprobs(batch, *ctx.zero, logp.data()); !st.ok()) return st;
    if (absl::Status st = acc.Backward(dlogp); !st.ok()) return st;
    if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
  }
  // One share at a time (data_shares.h), so a micro-batch never mixes this
  // rank's own examples with a taken-over share's.
  for (const DataShare& share : TrainShares(ctx, hold ? 0 : global_batch)) {
    const model::ForwardOptions fo = ShareForward(ctx, share);
    int64_t pass = 0;
    for (const rl::IndexRange& mb : rl::MicroBatches(share.range, micro)) {
      const model::BackwardOptions bo = ShareBackward(ctx, share, data_step, pass++);
      std::vector<rl::SftExample> ex(global.begin() + mb.begin, global.begin() + mb.end);
      rl::PackedBatch packed = rl::PackSft(ex, ctx.dataset->tokens().bos, ctx.dataset->tokens().eos, ctx.soft_prompt);
      model::Batch batch = ToModelBatch(packed);
      // Under sequence parallelism: this rank's rows [offset, offset + t).
      int offset = 0;
      if (ctx.sp_size > 1) {
        auto slice = model::SliceBatch(batch, ctx.sp_rank, ctx.sp_size, ctx.slice_cost);
        if (!slice.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("cluster.sequence_parallel: micro-batch of ",
                                                         batch.num_tokens(), " tokens: ", slice.status().message()));
        }
        batch = std::move(*slice);
        offset = batch.slice->offset;
      }
      const int t = batch.num_tokens();
      logp.assign(t, 0.f);
      dlogp.assign(t, 0.f);
      if (absl::Status st = acc.NextModel().ForwardLogprobs(batch, *ctx.zero, logp.data(), nullptr, fo); !st.ok())
        return st;
      for (int i = 0; i < t; ++i) {
        const float mask = packed.loss_mask[offset + i];
        if (mask != 0.f) {
          loss_sum -= static_cast<double>(logp[i]) * mask;
          dlogp[i] = -mask * inv;
        }
      }
      if (absl::Status st = acc.Backward(dlogp, bo); !st.ok()) return st;
      if (absl::Status st = ctx.zero->status(); !st.ok()) return st;
      tokens += t;
    }
  }
  if (absl::Status st = acc.Finish(); !st.ok()) return st;
  if (absl::Status st = ctx.zero->status(); !st.ok()) return st;

  const double compute_seconds = Seconds(compute_start);
  const double lr_base = warm_start ? spec.init().sft_lr() : spec.train().lr();
  rl::LrSchedule sched;
  sched.lr = lr_base;
  sched.warmup_steps = spec.train().warmup_steps();
  sched.total_steps = warm_start ? spec.init().sft_steps() : spec.train().steps();
  sched.min_lr_ratio = spec.train().min_lr_ratio();
  const double lr = sched.At(data_step);
  double grad_norm = 0;
  if (!hold) {
    auto stats = ctx.zero->Step(static_cast<float>(lr), static_cast<float>(spec.train().grad_clip()));
    if (!stats.ok()) return stats.status();
    grad_norm = stats->grad_norm;
    ctx.optimizer_steps++;
  }
  ctx.policy_version++;
  ctx.last_trained_step = step;  // the state is step's now, whatever follows

  // Loss, tokens, then each rank's forward/backward seconds in its slot.
  std::vector<double> sums(2 + ctx.world, 0.0);
  sums[0] = loss_sum;
  sums[1] = tokens;
  sums[2 + ctx.rank] = compute_seconds;
  if (absl::Status st = AllreduceSum(ctx, sums); !st.ok()) return st;
  const double seconds = Seconds(start);
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_loss(hold ? 0 : sums[0] / static_cast<double>(loss_tokens));
  m->set_lr(hold ? 0 : lr);
  m->set_grad_norm(grad_norm);
  m->set_tokens_per_s(sums[1] / seconds);
  if (warm_start) (*m->mutable_extra())["warmup"] = 1;
  // The slowest and fastest rank's forward/backward time (before the
  // optimizer step): in degraded mode, the survivor that took over a share
  // against one that did not.
  (*m->mutable_extra())["compute_seconds_max"] = *std::max_element(sums.begin() + 2, sums.end());
  (*m->mutable_extra())["compute_seconds_min"] = *std::min_element(sums.begin() + 2, sums.end());
  if (stop_accuracy > 0) {
    (*m->mutable_extra())["teacher_forced_exact"] = probe_exact;
    (*m->mutable_extra())["warm_start_held"] = hold ? 1 : 0;
  }
  ReportCollectiveBytes(ctx, m);
  if (!warm_start) {
    if (absl::Status st = FinishZenFlowStep(ctx, step, m); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status FinishZenFlowStep(JobContext& ctx, int64_t step, tandem::v1::StepMetrics* m) {
  if (!ctx.zero->has_zenflow()) return absl::OkStatus();
  if (step == ctx.spec().train().steps()) {
    if (absl::Status st = ctx.zero->SyncHostUpdates(); !st.ok()) return st;
  }
  const zero::ZenFlowStats& z = *ctx.zero->zenflow_stats();
  auto& x = *m->mutable_extra();
  x["zenflow_host_update_s"] = z.host_update_s;
  x["zenflow_host_hidden_s"] = z.host_hidden_s;
  x["zenflow_host_wait_s"] = z.host_wait_s;
  x["zenflow_host_updates"] = static_cast<double>(z.host_updates);
  x["zenflow_important_fraction"] = z.important_fraction;
  return absl::OkStatus();
}

void ReportCollectiveBytes(JobContext& ctx, tandem::v1::StepMetrics* m) {
  for (int k = 0; k < comm::kNumCollectiveKinds; ++k) {
    auto kind = static_cast<comm::CollectiveKind>(k);
    auto b = ctx.collective->bytes(kind);
    if (b.calls == 0) continue;
    (*m->mutable_extra())[std::string("bytes_sent_") + std::string(comm::CollectiveKindName(kind))] =
        static_cast<double>(b.sent);
  }
  ctx.collective->ResetBytes();
  // The sequence-parallel group's own communicator: "sp_bytes_sent_<kind>".
  if (ctx.sp_group) {
    for (int k = 0; k < comm::kNumCollectiveKinds; ++k) {
      const auto kind = static_cast<comm::CollectiveKind>(k);
      const auto b = ctx.sp_group->bytes(kind);
      if (b.calls == 0) continue;
      (*m->mutable_extra())[absl::StrCat("sp_bytes_sent_", std::string(comm::CollectiveKindName(kind)))] =
          static_cast<double>(b.sent);
    }
    ctx.sp_group->ResetBytes();
  }
  // Per tier: "tier_sent_<tier>" and "tier_sent_<tier>_<kind>" (what this
  // rank sent; the coordinator sums the ranks into "job_tier_sent_*").
  for (int t = 0; t < comm::kNumTiers; ++t) {
    const auto tier = static_cast<comm::Tier>(t);
    const std::string prefix = absl::StrCat("tier_sent_", std::string(comm::TierName(tier)));
    (*m->mutable_extra())[prefix] = static_cast<double>(ctx.tier_bytes->total(tier).sent);
    for (int k = 0; k < comm::kNumCollectiveKinds; ++k) {
      const auto kind = static_cast<comm::CollectiveKind>(k);
      const uint64_t sent = ctx.tier_bytes->bytes(tier, kind).sent;
      if (sent == 0) continue;
      (*m->mutable_extra())[absl::StrCat(prefix, "_", std::string(comm::CollectiveKindName(kind)))] =
          static_cast<double>(sent);
    }
  }
  ctx.tier_bytes->Reset();
}

namespace {
// EVAL's greedy generation: the rollout engine with the job's rollout.*
// budget and batching, argmax decoding, the job's stop ids.
rollout::RolloutOptions GreedyEvalOptions(const JobContext& ctx, int max_new_tokens) {
  rollout::RolloutOptions o = rollout::OptionsFromSpec(ctx.spec(), 0, ctx.device->capacity_bytes);
  o.sampling = rollout::SamplingParams{};
  o.sampling.greedy = true;
  o.max_new_tokens = max_new_tokens;
  o.stop_ids = ctx.stop_ids;
  return o;
}

// GRPO on text data: pass@1 (greedy) on data.eval, and with
// data.eval_samples = k > 0 the mean accuracy of k samples per prompt at
// rl.temperature (mean@k).
absl::Status EvaluateTextData(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  const auto& spec = ctx.spec();
  const auto& rows = ctx.eval_data->rows();
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(rows.size()), spec.task().eval_size());
  const rl::IndexRange mine = MyRange(ctx, n);
  const int k = spec.data().eval_samples();
  std::vector<rollout::RolloutRequest> prompts;
  for (int64_t i = mine.begin; i < mine.end; ++i) {
    std::vector<int32_t> ids = ctx.soft_prompt;
    ids.insert(ids.end(), rows[i].prompt_ids.begin(), rows[i].prompt_ids.end());
    prompts.push_back({std::move(ids), -1, static_cast<uint64_t>(i)});
  }
  double correct = 0, sampled_correct = 0, sampled = 0;
  if (!prompts.empty()) {
    if (absl::Status st = ctx.zero->BeginInference(); !st.ok()) return st;
    auto gen =
        ctx.rollout->Generate(prompts, GreedyEvalOptions(ctx, spec.rl().max_new_tokens()), ctx.zero->inference_view());
    absl::StatusOr<rollout::RolloutResult> samples = rollout::RolloutResult{};
    if (gen.ok() && k > 0) {
      // k samples of each prompt, one group per prompt (a shared prefill).
      std::vector<rollout::RolloutRequest> many;
      for (size_t i = 0; i < prompts.size(); ++i) {
        for (int j = 0; j < k; ++j) {
          many.push_back({prompts[i].prompt, static_cast<int>(i),
                          static_cast<uint64_t>((mine.begin + static_cast<int64_t>(i)) * k + j)});
        }
      }
      rollout::RolloutOptions ss =
          rollout::OptionsFromSpec(spec, DeriveSeed(spec.seed(), kSeedEval, static_cast<uint64_t>(step + (1 << 30))),
                                   ctx.device->capacity_bytes);
      ss.stop_ids = ctx.stop_ids;
      samples = ctx.rollout->Generate(many, ss, ctx.zero->inference_view());
    }
    ctx.zero->EndInference();
    ctx.rollout->Release();
    if (!gen.ok()) return gen.status();
    if (!samples.ok()) return samples.status();
    auto score = [&](const rollout::RolloutSequence& g, const rl::TextRow& row) {
      rl::CompletionText text = DecodeResponse(ctx, g.tokens);
      return ctx.reward && ctx.reward->Score(text.text, row.answer).correct ? 1.0 : 0.0;
    };
    for (size_t i = 0; i < prompts.size(); ++i) correct += score(gen->sequences[i], rows[mine.begin + i]);
    for (size_t j = 0; j < samples->sequences.size(); ++j) {
      sampled_correct += score(samples->sequences[j], rows[mine.begin + static_cast<int64_t>(j) / k]);
      sampled += 1;
    }
  }
  std::vector<double> sums = {correct, static_cast<double>(prompts.size()), sampled_correct, sampled};
  if (absl::Status st = AllreduceSum(ctx, sums); !st.ok()) return st;
  const double acc = sums[1] > 0 ? sums[0] / sums[1] : 0;
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_accuracy(acc);
  (*m->mutable_extra())["eval_pass_at_1"] = acc;
  if (k > 0) (*m->mutable_extra())["eval_mean_at_k"] = sums[3] > 0 ? sums[2] / sums[3] : 0;
  (*report->mutable_values())["accuracy"] = acc;
  (*report->mutable_values())["eval_examples"] = sums[1];
  return absl::OkStatus();
}
// SFT on text data: the training loss on data.eval's responses (mean over
// response tokens and eos, as SFT_STEP counts it) and the fraction of rows
// whose whole response is the greedy continuation (every token's
// probability > 1/2 under teacher forcing). Full weights are gathered once
// (BeginInference), so ranks with different numbers of rows issue no
// per-layer collectives.
absl::Status EvaluateTextLoss(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  const auto& spec = ctx.spec();
  std::vector<rl::SftExample> rows;
  const int64_t limit = spec.task().eval_size();
  for (const rl::TextRow& row : ctx.eval_data->rows()) {
    if (static_cast<int64_t>(rows.size()) >= limit) break;
    if (!row.response_ids.empty()) rows.push_back({row.prompt_ids, row.response_ids});
  }
  if (rows.empty()) {
    report->add_log_lines("eval skipped: data.eval has no rows with a response (data.response_key)");
    return absl::OkStatus();
  }
  const rl::IndexRange mine = MyRange(ctx, static_cast<int64_t>(rows.size()));
  const int64_t micro = std::max(1, spec.train().micro_batch());
  double nll = 0, tokens = 0, exact = 0, examples = 0;
  if (absl::Status st = ctx.zero->BeginInference(); !st.ok()) return st;
  std::vector<float> logp;
  absl::Status st;
  for (const rl::IndexRange& mb : rl::MicroBatches(mine, micro)) {
    std::vector<rl::SftExample> ex(rows.begin() + mb.begin, rows.begin() + mb.end);
    rl::PackedBatch packed = rl::PackSft(ex, ctx.dataset->tokens().bos, ctx.dataset->tokens().eos, ctx.soft_prompt);
    model::Batch batch = ToModelBatch(packed);
    logp.assign(batch.num_tokens(), 0.f);
    st = ctx.model->ForwardLogprobs(batch, ctx.zero->inference_view(), logp.data());
    if (!st.ok()) break;
    for (int i = 0; i < batch.num_tokens(); ++i) {
      if (packed.loss_mask[i] == 0.f) continue;
      nll -= static_cast<double>(logp[i]);
      tokens += 1;
    }
    CountTeacherForcedExact(packed, logp, &exact, &examples);
  }
  ctx.zero->EndInference();
  if (!st.ok()) return st;
  std::vector<double> sums = {nll, tokens, exact, examples};
  if (absl::Status s = AllreduceSum(ctx, sums); !s.ok()) return s;
  const double exact_fraction = sums[3] > 0 ? sums[2] / sums[3] : 0;
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_accuracy(exact_fraction);
  (*m->mutable_extra())["eval_loss"] = sums[1] > 0 ? sums[0] / sums[1] : 0;
  (*m->mutable_extra())["eval_exact_match"] = exact_fraction;
  (*report->mutable_values())["accuracy"] = exact_fraction;
  (*report->mutable_values())["eval_examples"] = sums[3];
  return absl::OkStatus();
}
}  // namespace

absl::Status Evaluate(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  if (ctx.eval_data && ctx.reward) return EvaluateTextData(ctx, step, report);
  if (ctx.eval_data && ctx.dataset && ctx.spec().kind() == tandem::v1::JOB_KIND_SFT) {
    return EvaluateTextLoss(ctx, step, report);
  }
  if (!ctx.task) {
    report->add_log_lines("eval skipped: nothing to score against (a built-in task, or data.eval with reward.type)");
    return absl::OkStatus();
  }
  const auto& spec = ctx.spec();
  const int n = spec.task().eval_size();
  const auto examples = ctx.task->EvalExamples(DeriveSeed(spec.seed(), kSeedEval), n);
  const rl::IndexRange mine = MyRange(ctx, n);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = mine.begin; i < mine.end; ++i) {
    std::vector<int32_t> p = ctx.soft_prompt;
    p.push_back(ctx.dataset->tokens().bos);
    auto enc = model::CharTokenizer::Default().Encode(examples[i].prompt);
    p.insert(p.end(), enc.begin(), enc.end());
    prompts.push_back(std::move(p));
  }
  std::vector<rollout::RolloutRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) requests.push_back({prompts[i], -1, i});
  double correct = 0;
  if (!prompts.empty()) {
    if (absl::Status st = ctx.zero->BeginInference(); !st.ok()) return st;
    auto gen = ctx.rollout->Generate(requests, GreedyEvalOptions(ctx, ctx.task->max_answer_chars() + 1),
                                     ctx.zero->inference_view());
    ctx.zero->EndInference();
    ctx.rollout->Release();
    if (!gen.ok()) return gen.status();
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto text = DecodeResponse(ctx, gen->sequences[i].tokens);
      auto r = ctx.task->Reward(examples[mine.begin + i], text.text, text.terminated);
      correct += r.correct ? 1 : 0;
    }
  }
  std::vector<double> sums = {correct, static_cast<double>(prompts.size())};
  if (absl::Status st = AllreduceSum(ctx, sums); !st.ok()) return st;
  const double acc = sums[1] > 0 ? sums[0] / sums[1] : 0;
  report->mutable_metrics()->set_step(step);
  report->mutable_metrics()->set_accuracy(acc);
  (*report->mutable_values())["accuracy"] = acc;
  (*report->mutable_values())["eval_examples"] = sums[1];
  return absl::OkStatus();
}

}  // namespace tandem::worker
