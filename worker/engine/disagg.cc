// Disaggregated mode: communicators, weight sync, rollout ranks (sync and
// async generation) and the trainers' side of the trajectory hand-off.
#include "worker/engine/disagg.h"

#include <chrono>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/phase_failure.h"
#include "worker/engine/phases.h"
#include "worker/engine/spec_convert.h"
#include "worker/rollout/spec_options.h"

namespace tandem::worker {

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

void PutI64(float* at, int64_t v) { std::memcpy(at, &v, sizeof v); }  // two float slots
int64_t GetI64(const float* at) {
  int64_t v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

// Step s's prompts of this rollout rank, generated with `weights`.
absl::StatusOr<disagg::RolloutBatch> GenerateBatch(JobContext& ctx, DisaggState& d, int64_t step,
                                                   std::vector<float>& weights, int64_t version) {
  const auto& spec = ctx.spec();
  const int G = std::max(1, spec.rl().group_size());
  const int64_t P = std::max(1, spec.rl().prompts_per_step());
  const int me = d.global_rank - d.train_world;
  const rl::IndexRange mine = rl::RankSlice(P, me, d.rollout_world);
  // With TP, the group generates the prompts of all its ranks; this rank
  // keeps its own.
  const int tp = d.tp_size;
  rl::IndexRange gen_range = mine;
  if (tp > 1) {
    const int first = me / tp * tp;
    gen_range = {rl::RankSlice(P, first, d.rollout_world).begin, rl::RankSlice(P, first + tp - 1, d.rollout_world).end};
  }
  const size_t own_first = static_cast<size_t>(mine.begin - gen_range.begin) * G;
  const size_t own_count = static_cast<size_t>(mine.size()) * G;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<uint64_t> seq_ids;
  std::vector<int64_t> groups;
  const int32_t bos = ctx.dataset->tokens().bos;
  // The same keys as the co-located ROLLOUT (grpo_phases.cc), so both modes
  // draw the same prompts and samples.
  for (int64_t p = gen_range.begin; p < gen_range.end; ++p) {
    rl::Example ex =
        ctx.task->Sample(DeriveSeed(spec.seed(), kSeedRlPrompts), static_cast<uint64_t>((step - 1) * P + p));
    std::vector<int32_t> ids = ctx.soft_prompt;
    ids.push_back(bos);
    auto enc = model::CharTokenizer::Default().Encode(ex.prompt);
    ids.insert(ids.end(), enc.begin(), enc.end());
    for (int g = 0; g < G; ++g) {
      prompts.push_back(ids);
      seq_ids.push_back(static_cast<uint64_t>(p * G + g));
      groups.push_back(p);
    }
  }
  rollout::RolloutOptions so = rollout::OptionsFromSpec(
      spec, DeriveSeed(spec.seed(), kSeedSampling, static_cast<uint64_t>(step)), ctx.device->capacity_bytes);
  so.stop_ids.assign(spec.rl().stop_token_ids().begin(), spec.rl().stop_token_ids().end());
  so.stop_ids.insert(so.stop_ids.end(), ctx.config.eos_token_ids.begin(), ctx.config.eos_token_ids.end());
  std::vector<rollout::RolloutRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i] = {prompts[i], static_cast<int>(i / G), seq_ids[i]};
  }
  disagg::RolloutBatch batch;
  batch.step = step;
  if (prompts.empty()) return batch;
  float* device_weights = weights.data();
  if (!ctx.device->host_memory()) {
    // One device copy per weights version (the generating thread's own).
    if (d.weights_device_version != version || d.weights_device.size() != weights.size()) {
      if (d.weights_device.size() != weights.size() &&
          !d.weights_device.Allocate(ctx.device->memory.get(), weights.size())) {
        return absl::ResourceExhaustedError(
            absl::StrCat("rollout: cannot allocate ", weights.size() * sizeof(float),
                         " bytes of device memory for the weights: ", ctx.device->memory->last_error()));
      }
      d.weights_device.Upload(weights.data(), weights.size());
      d.weights_device_version = version;
    }
    device_weights = d.weights_device.data();
  }
  const auto t0 = Clock::now();
  absl::StatusOr<rollout::RolloutResult> gen;
  if (tp > 1) {
    model::FlatParamProvider slice(ctx.tp_decoder->slice_layout(), device_weights, nullptr);
    gen = ctx.tp_rollout->Generate(requests, so, slice);
  } else {
    model::FlatParamProvider params(ctx.model->layout(), device_weights, nullptr);
    gen = ctx.rollout->Generate(requests, so, params);
  }
  if (!gen.ok()) return gen.status();
  batch.generate_seconds = Seconds(t0);
  if (gen->sequences.size() != prompts.size()) {
    return absl::InternalError("rollout: the engine returned a different number of sequences than requested");
  }
  for (size_t i = own_first; i < own_first + own_count; ++i) {
    batch.generated_tokens += static_cast<int64_t>(gen->sequences[i].tokens.size());
    rl::Trajectory t;
    t.prompt_ids = std::move(prompts[i]);
    t.completion_ids = std::move(gen->sequences[i].tokens);
    t.logp_sampled = std::move(gen->sequences[i].raw_logprobs);
    t.group = groups[i];
    t.policy_version = version;
    batch.trajectories.push_back(std::move(t));
  }
  return batch;
}

// Every rank contributes `payload` (rollout ranks: a packed batch; trainers:
// nothing); every rank receives every rank's payload.
absl::StatusOr<std::vector<std::vector<float>>> Exchange(JobContext& ctx, DisaggState& d,
                                                         const std::vector<float>& payload) {
  const int world = d.global_world;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  float mine;
  std::memcpy(&mine, &n, sizeof n);
  std::vector<float> counts_f(world);
  if (absl::Status st = d.all->allgather(&mine, counts_f.data(), std::vector<size_t>(world, 1), ctx.timeout);
      !st.ok()) {
    return st;
  }
  std::vector<size_t> counts(world);
  size_t total = 0;
  for (int r = 0; r < world; ++r) {
    uint32_t c;
    std::memcpy(&c, &counts_f[r], sizeof c);
    counts[r] = c;
    total += c;
  }
  std::vector<float> all(total);
  if (absl::Status st = d.all->allgather(payload.data(), all.data(), counts, ctx.timeout); !st.ok()) return st;
  std::vector<std::vector<float>> out(world);
  size_t offset = 0;
  for (int r = 0; r < world; ++r) {
    out[r].assign(all.begin() + offset, all.begin() + offset + counts[r]);
    offset += counts[r];
  }
  return out;
}

// Tag of the per-rank slices of a tensor-parallel weight sync on "all".
constexpr uint32_t kSyncSliceTag = 0x5359;

// TP weight sync: trainer t sends each rollout rank j with j % T == t the
// slice of TP rank j % tp_size (cut from `full`), followed by the header.
absl::Status SendSlices(JobContext& ctx, DisaggState& d, const std::vector<float>& full, int64_t step) {
  std::vector<float> buf;
  for (int j = ctx.rank; j < d.rollout_world; j += d.train_world) {
    const rollout::TpSliceMap& map = d.tp_maps[j % d.tp_size];
    buf.assign(map.slice_floats + 4, 0.f);
    rollout::SliceFromFull(map, full.data(), buf.data());
    PutI64(&buf[map.slice_floats], ctx.policy_version);
    PutI64(&buf[map.slice_floats + 2], step);
    if (absl::Status st =
            d.all->send(buf.data(), buf.size() * sizeof(float), d.train_world + j, kSyncSliceTag, ctx.timeout);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status SyncWeights(JobContext& ctx, DisaggState& d, int64_t step, ReportPhaseRequest* report) {
  const auto t0 = Clock::now();
  const size_t psi = ctx.model->layout().total_floats();
  const bool tp = d.tp_size > 1;
  // What one rollout rank receives: the full weights, or its TP slice.
  const size_t n = tp && d.role == DisaggRole::kRollout ? d.tp_maps[ctx.rank % d.tp_size].slice_floats : psi;
  std::vector<float> buf(n + 4);
  if (d.role == DisaggRole::kTrain) {
    if (absl::Status st = ctx.zero->GatherFull(buf.data()); !st.ok()) return st;
    // The frozen KL reference is the policy RL starts from (after any warm
    // start), as in the co-located ROLLOUT; checkpoints keep it.
    if (ctx.spec().rl().kl_coef() > 0 && ctx.ref_params.empty()) {
      ctx.ref_params.assign(buf.begin(), buf.begin() + psi);
      ctx.ref_device.reset();
    }
    PutI64(&buf[psi], ctx.policy_version);
    PutI64(&buf[psi + 2], step);
  }
  if (tp) {
    if (d.role == DisaggRole::kTrain) {
      if (absl::Status st = SendSlices(ctx, d, buf, step); !st.ok()) return st;
    } else if (absl::Status st = d.all->recv(buf.data(), buf.size() * sizeof(float), ctx.rank % d.train_world,
                                             kSyncSliceTag, ctx.timeout);
               !st.ok()) {
      return st;
    }
  } else if (absl::Status st = d.all->broadcast(buf.data(), buf.size(), 0, ctx.timeout); !st.ok()) {
    return st;
  }
  const int64_t version = GetI64(&buf[n]);
  if (GetI64(&buf[n + 2]) != step) {
    return absl::InternalError(
        absl::StrCat("SYNC_WEIGHTS for step ", step, " received the weights of step ", GetI64(&buf[n + 2])));
  }
  if (d.role == DisaggRole::kRollout) {
    buf.resize(n);
    {
      std::lock_guard<std::mutex> lock(d.mu);
      d.weights = std::make_shared<std::vector<float>>(std::move(buf));
      d.weights_version = version;
      d.synced_step = step;
      if (tp && d.threaded()) {
        // A generating step n uses a sync step >= n - K agreed by its TP
        // group, and this rank has synced at most step n: keep K + 1.
        d.slice_history[step] = {version, d.weights};
        while (d.slice_history.begin()->first < step - d.max_staleness) d.slice_history.erase(d.slice_history.begin());
      }
    }
    if (d.threaded()) d.StartOrWake(ctx);
  }
  auto* m = report->mutable_metrics();
  m->set_step(step);
  // Job-wide (every rank reports the same figures): the bytes the rollout
  // ranks received, against a full copy for each, and their mean per rank.
  double sync_floats = 0;
  for (int j = 0; j < d.rollout_world; ++j) {
    sync_floats += static_cast<double>(tp ? d.tp_maps[j % d.tp_size].slice_floats : psi);
  }
  (*m->mutable_extra())["sync_weights_bytes"] = sync_floats * sizeof(float) / d.rollout_world;
  (*m->mutable_extra())["sync_weights_seconds"] = Seconds(t0);
  (*m->mutable_extra())["weight_sync_bytes"] = sync_floats * sizeof(float);
  (*m->mutable_extra())["weight_sync_full_bytes"] = static_cast<double>(psi * sizeof(float)) * d.rollout_world;
  if (tp) (*m->mutable_extra())["rollout_tp_size"] = d.tp_size;
  (*report->mutable_values())["policy_version"] = static_cast<double>(version);
  return absl::OkStatus();
}

absl::Status RolloutRankRollout(JobContext& ctx, DisaggState& d, int64_t step, ReportPhaseRequest* report) {
  absl::StatusOr<disagg::RolloutBatch> batch;
  if (d.threaded()) {
    batch = d.TakeBatch(step, ctx.timeout);
  } else {
    std::shared_ptr<std::vector<float>> w;
    int64_t version, synced;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      w = d.weights;
      version = d.weights_version;
      synced = d.synced_step;
    }
    if (synced != step) {
      batch = absl::FailedPreconditionError(
          absl::StrCat("ROLLOUT for step ", step, " without its SYNC_WEIGHTS (newest: step ", synced, ")"));
    } else {
      batch = GenerateBatch(ctx, d, step, *w, version);
    }
  }
  if (!batch.ok()) {
    // Take part in the exchange with nothing, so the trainers fail at once
    // instead of waiting for the collective timeout.
    Exchange(ctx, d, {}).status().IgnoreError();
    return batch.status();
  }
  auto got = Exchange(ctx, d, disagg::Pack(*batch));
  if (!got.ok()) return got.status();
  auto* m = report->mutable_metrics();
  m->set_step(step);
  (*m->mutable_extra())["rollout_tokens"] = static_cast<double>(batch->generated_tokens);
  if (d.tp_size > 1) (*m->mutable_extra())["rollout_tp_size"] = d.tp_size;
  (*report->mutable_values())["generate_seconds"] = batch->generate_seconds;
  return absl::OkStatus();
}

absl::Status TrainerRollout(JobContext& ctx, DisaggState& d, int64_t step, ReportPhaseRequest* report) {
  if (!ctx.task || !ctx.tokenizer || !ctx.dataset) {
    return absl::FailedPreconditionError("ROLLOUT needs a built-in task and the char tokenizer");
  }
  const auto& spec = ctx.spec();
  const int G = std::max(1, spec.rl().group_size());
  const int64_t P = std::max(1, spec.rl().prompts_per_step());
  ctx.rl = RlStepState{};
  ctx.rl.step = step;
  const auto t0 = Clock::now();
  auto got = Exchange(ctx, d, {});
  if (!got.ok()) return got.status();
  const double wait_s = Seconds(t0);
  std::vector<rl::Trajectory> all;
  std::map<int, int64_t> group_versions;  // TP group -> policy version
  double tokens = 0, gen_seconds = 0;
  for (int r = d.train_world; r < d.global_world; ++r) {
    if ((*got)[r].empty()) {
      return absl::FailedPreconditionError(absl::StrCat("ROLLOUT for step ", step, ": rollout rank ", r,
                                                        " sent no trajectories (it failed; see its report)"));
    }
    auto batch = disagg::Unpack((*got)[r]);
    if (!batch.ok()) return batch.status();
    if (batch->step != step) {
      return absl::InternalError(
          absl::StrCat("ROLLOUT for step ", step, ": rollout rank ", r, " sent the batch of step ", batch->step));
    }
    if (d.tp_size > 1 && !batch->trajectories.empty()) {
      // The ranks of a TP group ran one forward: one weights version.
      const int group = (r - d.train_world) / d.tp_size;
      const int64_t v = batch->trajectories.front().policy_version;
      auto [it, fresh] = group_versions.emplace(group, v);
      if (!fresh && it->second != v) {
        return absl::InternalError(absl::StrCat("ROLLOUT for step ", step, ": the ranks of tensor-parallel group ",
                                                group, " generated with policy versions ", it->second, " and ", v));
      }
    }
    tokens += static_cast<double>(batch->generated_tokens);
    gen_seconds += batch->generate_seconds;
    for (auto& t : batch->trajectories) all.push_back(std::move(t));
  }
  const int64_t bound = d.async ? d.max_staleness : 0;
  auto sel = disagg::SelectForTrainer(std::move(all), ctx.policy_version, bound, G, ctx.rank, ctx.world);
  if (!sel.ok()) return sel.status();
  if (!d.async && (sel->dropped_stale > 0 || sel->max_staleness != 0)) {
    return absl::InternalError(absl::StrCat("sync coupling: ", sel->dropped_stale,
                                            " trajectories were not generated by the current policy version ",
                                            ctx.policy_version));
  }
  ctx.rl.trajectories = std::move(sel->mine);
  for (size_t i = 0; i < ctx.rl.trajectories.size(); i += G) {
    const int64_t p = ctx.rl.trajectories[i].group;
    ctx.rl.examples.push_back(
        ctx.task->Sample(DeriveSeed(spec.seed(), kSeedRlPrompts), static_cast<uint64_t>((step - 1) * P + p)));
    ctx.rl.prompt_index.push_back(p);
  }
  auto* m = report->mutable_metrics();
  m->set_step(step);
  m->set_switch_seconds(0);  // nothing switches: rollout runs elsewhere
  auto& x = *m->mutable_extra();
  x["rollout_tokens"] = tokens;
  const double mean_gen = gen_seconds / std::max(1, d.rollout_world);
  x["rollout_tokens_per_s"] = mean_gen > 0 ? tokens / mean_gen : 0;
  x["rollout_wait_seconds"] = wait_s;  // trainers idle for trajectories
  x["staleness_max"] = static_cast<double>(sel->max_staleness);
  x["staleness_mean"] = sel->mean_staleness;
  x["trajectories_received"] = static_cast<double>(sel->received);
  x["trajectories_kept"] = static_cast<double>(sel->kept);
  x["trajectories_dropped"] = static_cast<double>(sel->dropped_stale);
  x["trajectories_dropped_uneven"] = static_cast<double>(sel->dropped_uneven);
  x["policy_version"] = static_cast<double>(ctx.policy_version);
  if (d.tp_size > 1) x["rollout_tp_size"] = d.tp_size;
  return absl::OkStatus();
}

}  // namespace

DisaggState::~DisaggState() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DisaggState::Abort() {
  if (all) all->Abort();
  {
    std::lock_guard<std::mutex> lock(mu);
    stop_ = true;
  }
  cv_.notify_all();
}

void DisaggState::StartOrWake(JobContext& ctx) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!thread_.joinable()) {
      next_step_ = synced_step;
      thread_ = std::thread([this, &ctx] { GenerateLoop(&ctx); });
    }
  }
  cv_.notify_all();
}

void DisaggState::GenerateLoop(JobContext* ctx) {
  const int64_t last = ctx->spec().train().steps();
  while (true) {
    std::shared_ptr<std::vector<float>> w;
    int64_t version = 0, step = 0, synced = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      // At most max_staleness steps ahead of the newest weights: a batch of
      // step n starts with weights of step >= n - K, and is trained at step n
      // by a trainer at most K versions further.
      cv_.wait(lock, [&] { return stop_ || (next_step_ <= last && next_step_ <= synced_step + max_staleness); });
      if (stop_) return;
      w = weights;
      version = weights_version;
      step = next_step_;
      synced = synced_step;
    }
    if (tp_size > 1) {
      // The ranks of the TP group generate step `step` with one weights
      // version: the newest sync step they all hold (>= step - K, since each
      // waited for that above).
      float agreed = static_cast<float>(synced);
      absl::Status st = ctx->tp_group->allreduce(&agreed, 1, comm::ReduceOp::kMin, ctx->timeout);
      std::lock_guard<std::mutex> lock(mu);
      auto it = st.ok() ? slice_history.find(static_cast<int64_t>(agreed)) : slice_history.end();
      if (it == slice_history.end()) {
        error_ = st.ok() ? absl::InternalError(absl::StrCat("async rollout: the weights of step ", agreed,
                                                            " agreed by the tensor-parallel group are gone"))
                         : st;
        cv_.notify_all();
        return;
      }
      version = it->second.first;
      w = it->second.second;
    }
    auto batch = GenerateBatch(*ctx, *this, step, *w, version);
    std::lock_guard<std::mutex> lock(mu);
    if (!batch.ok()) {
      error_ = batch.status();
      cv_.notify_all();
      return;
    }
    ready_.push_back(std::move(*batch));
    ++next_step_;
    cv_.notify_all();
  }
}

absl::StatusOr<disagg::RolloutBatch> DisaggState::TakeBatch(int64_t step, comm::Timeout timeout) {
  std::unique_lock<std::mutex> lock(mu);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    while (!ready_.empty() && ready_.front().step < step) ready_.pop_front();
    if (!ready_.empty()) {
      if (ready_.front().step != step) {
        return absl::InternalError(
            absl::StrCat("async rollout: wanted the batch of step ", step, ", have step ", ready_.front().step));
      }
      disagg::RolloutBatch b = std::move(ready_.front());
      ready_.pop_front();
      return b;
    }
    if (!error_.ok()) return common::WithPrefix(error_, "async rollout: ");
    if (stop_) return absl::AbortedError("async rollout aborted");
    if (!thread_.joinable()) {
      return absl::FailedPreconditionError(absl::StrCat("ROLLOUT for step ", step, " before any SYNC_WEIGHTS"));
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return absl::DeadlineExceededError(
          absl::StrCat("async rollout: no batch of step ", step, " within ", timeout.count(), " ms"));
    }
  }
}

absl::StatusOr<DisaggRole> SetupDisaggregated(JobContext& ctx, const comm::CollectiveOptions& base) {
  const auto& spec = ctx.spec();
  const auto& pl = spec.placement();
  auto d = std::make_shared<DisaggState>();
  d->global_rank = ctx.rank;
  d->global_world = ctx.world;
  d->train_world = pl.train_workers();
  d->rollout_world = pl.rollout_workers();
  d->async = pl.coupling() == "async";
  d->max_staleness = d->async ? pl.max_staleness() : 0;
  if (d->train_world < 1 || d->rollout_world < 1 || d->train_world + d->rollout_world != ctx.world) {
    return absl::InvalidArgumentError(absl::StrCat("placement: rollout_workers (", d->rollout_world,
                                                   ") + train_workers (", d->train_world,
                                                   ") must be >= 1 each and equal the job's world of ", ctx.world));
  }
  const int64_t P = spec.rl().prompts_per_step();
  if (P % d->train_world != 0 || P % d->rollout_world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rl.prompts_per_step: ", P, " must be divisible by placement.train_workers (", d->train_world,
                     ") and placement.rollout_workers (", d->rollout_world, ") in disaggregated mode"));
  }
  d->tp_size = std::max(1, spec.rollout().tp_size());
  if (d->tp_size > 1) {
    if (d->rollout_world % d->tp_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rollout.tp_size ", d->tp_size, " does not divide placement.rollout_workers (", d->rollout_world,
                       "); tensor-parallel groups are tp_size consecutive rollout workers"));
    }
    for (int t = 0; t < d->tp_size; ++t) {
      auto map = rollout::MakeTpSliceMap(ctx.config, t, d->tp_size);
      if (!map.ok()) return map.status();
      d->tp_maps.push_back(std::move(*map));
    }
  }
  d->role = ctx.rank < d->train_world ? DisaggRole::kTrain : DisaggRole::kRollout;
  const std::string role_name = d->role == DisaggRole::kTrain ? "train" : "rollout";
  if (!ctx.assignment.role().empty() && ctx.assignment.role() != role_name) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: rank ", ctx.rank, " has role '", ctx.assignment.role(),
                                                   "' but the placement makes it '", role_name, "'"));
  }
  comm::CollectiveOptions co = base;
  co.prefix = base.prefix + "-all";
  auto all = comm::MakeCollective("gloo", *ctx.store, ctx.rank, ctx.world, co);
  if (!all.ok()) return all.status();
  d->all = std::move(*all);
  if (d->role == DisaggRole::kTrain) {
    co.prefix = base.prefix + "-train";
    // The trainers' ZeRO communicator works on device memory.
    auto train = MakeDeviceCollective(*ctx.device, *ctx.store, ctx.rank, d->train_world, co);
    if (!train.ok()) return train.status();
    ctx.collective = std::move(*train);
    ctx.world = d->train_world;
  } else {
    ctx.rank = ctx.rank - d->train_world;
    ctx.world = d->rollout_world;
  }
  const DisaggRole role = d->role;
  ctx.disagg = std::move(d);
  return role;
}

absl::Status FinishRolloutSetup(JobContext& ctx, std::vector<float> initial, ReportPhaseRequest* report) {
  DisaggState& d = *ctx.disagg;
  if (d.tp_size > 1) {
    const rollout::TpSliceMap& map = d.tp_maps[ctx.rank % d.tp_size];
    std::vector<float> slice(map.slice_floats);
    rollout::SliceFromFull(map, initial.data(), slice.data());
    initial = std::move(slice);
  }
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.weights = std::make_shared<std::vector<float>>(std::move(initial));
    d.weights_version = 0;
  }
  (*report->mutable_values())["param_bytes"] = static_cast<double>(d.weights->size() * sizeof(float));
  (*report->mutable_values())["num_params"] = static_cast<double>(model::ParameterCount(ctx.config));
  report->add_log_lines(absl::StrCat("rank ", d.global_rank, "/", d.global_world, ": rollout worker ", ctx.rank, "/",
                                     d.rollout_world, " (", d.async ? "async" : "sync", " coupling",
                                     d.async ? absl::StrCat(", max staleness ", d.max_staleness) : "",
                                     d.tp_size > 1 ? absl::StrCat(", tensor-parallel rank ", ctx.rank % d.tp_size, "/",
                                                                  d.tp_size, " of group ", ctx.rank / d.tp_size)
                                                   : "",
                                     "), model with ", model::ParameterCount(ctx.config), " parameters"));
  return absl::OkStatus();
}

std::optional<absl::Status> RunDisaggPhase(JobContext& ctx, const tandem::v1::PhaseCommand& cmd,
                                           ReportPhaseRequest* report) {
  DisaggState& d = *ctx.disagg;
  const int64_t step = cmd.step();
  switch (cmd.phase()) {
    case tandem::v1::PHASE_SYNC_WEIGHTS:
      return SyncWeights(ctx, d, step, report);
    case tandem::v1::PHASE_ROLLOUT:
      return d.role == DisaggRole::kTrain ? TrainerRollout(ctx, d, step, report)
                                          : RolloutRankRollout(ctx, d, step, report);
    default:
      break;
  }
  if (d.role == DisaggRole::kRollout) {
    // SFT warm start, SCORE, LOGPROBS, UPDATE, EVAL, CHECKPOINT, EXPORT: the
    // trainers' work.
    report->mutable_metrics()->set_step(step);
    return absl::OkStatus();
  }
  if (cmd.phase() == tandem::v1::PHASE_UPDATE && ctx.rl.step == step && ctx.rl.have_logprobs &&
      ctx.rl.trajectories.empty()) {
    // Every trainer holds the same number of groups, so all skip together;
    // the policy version stays.
    report->mutable_metrics()->set_step(step);
    (*report->mutable_metrics()->mutable_extra())["update_skipped"] = 1;
    (*report->mutable_metrics()->mutable_extra())["policy_version"] = static_cast<double>(ctx.policy_version);
    report->add_log_lines(absl::StrCat("step ", step, ": every trajectory was dropped as stale; no update"));
    return absl::OkStatus();
  }
  return std::nullopt;
}

}  // namespace tandem::worker
