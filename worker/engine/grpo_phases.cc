// GRPO / PPO-clip phases: SCORE, LOGPROBS, UPDATE (ROLLOUT is in
// grpo_rollout.cc).
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
    auto rb = rl::BuildRlBatch(std::span(trajs).subspan(b, e - b), zeros, ctx.config.vocab_size);
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
        auto rb = rl::BuildRlBatch(sub, sub_adv, ctx.config.vocab_size);
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
  return FinishZenFlowStep(ctx, step, m);
}

}  // namespace tandem::worker
