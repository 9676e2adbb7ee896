// PHASE_CHECKPOINT and restore.
//
// The phase copies this rank's shard (parameters, Adam moments) to host
// memory - the only time the step is blocked - and hands the write to the
// job's AsyncWriter. Each rank writes its shard into step-N.partial/, then
// announces {file, bytes, xxh64} through the rendezvous store; rank 0 waits
// for every announcement, writes the manifest and publishes the directory
// (rename + fsync), then applies retention; the job's abort ends its waits
// (the checkpoint is then not published). The coordinator learns of the
// published checkpoint (step, directory, size on disk: every shard plus the
// manifest) from ReportPhaseRequest.checkpoints in rank 0's next report.
#include <chrono>
#include <filesystem>

#include "absl/strings/str_join.h"
#include "common/checkpoint_path.h"
#include "nlohmann/json.hpp"
#include "worker/ckpt/checkpoint.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/store.h"
#include "worker/engine/peer_snapshot.h"
#include "worker/engine/phases.h"
#include "worker/engine/reference_policy.h"

namespace tandem::worker {

namespace {
using Clock = std::chrono::steady_clock;

std::vector<ckpt::Range> OwnedRanges(const zero::ZeroOptimizer& z) {
  std::vector<ckpt::Range> out;
  for (const auto& p : z.shard_map()) {
    if (p.size == 0) continue;
    out.push_back({z.units()[p.unit].offset + p.unit_offset, p.size});
  }
  return out;
}

std::string ConfigHash(const JobContext& ctx) {
  std::string bytes;
  ctx.spec().model().SerializeToString(&bytes);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(ckpt::Xxh64(bytes.data(), bytes.size())));
  return buf;
}
// The job's train.trainable patterns as the manifest records them.
std::string TrainableText(const JobContext& ctx) {
  const auto& patterns = ctx.spec().train().trainable();
  return absl::StrJoin(patterns.begin(), patterns.end(), ", ");
}

// Where the data stream continues after `step`: for text data the epoch and
// position (within the epoch) of the next sample, and the row count.
std::string DataCursorText(const JobContext& ctx, int64_t step) {
  std::string out = "step=" + std::to_string(step);
  if (!ctx.train_data || step <= 0) return out;
  const auto& spec = ctx.spec();
  const uint64_t per_step = spec.kind() == tandem::v1::JOB_KIND_GRPO
                                ? static_cast<uint64_t>(std::max(1, spec.rl().prompts_per_step()))
                                : static_cast<uint64_t>(std::max(1, spec.train().global_batch()));
  const rl::DataCursor c =
      rl::CursorAt(static_cast<uint64_t>(step) * per_step, static_cast<uint64_t>(ctx.train_data->size()));
  return out + " epoch=" + std::to_string(c.epoch) + " position=" + std::to_string(c.position) +
         " rows=" + std::to_string(ctx.train_data->size());
}

}  // namespace

absl::Status FinishCheckpoints(JobContext& ctx, ReportPhaseRequest* report, bool wait) {
  absl::Status st;
  if (wait && ctx.writer) st = ctx.writer->WaitIdle();
  std::lock_guard<std::mutex> lock(ctx.published_mu);
  for (auto& published : ctx.published) {
    report->add_log_lines("checkpoint published: " + published.path());
    *report->add_checkpoints() = std::move(published);
  }
  ctx.published.clear();
  return st;
}

absl::Status Checkpoint(JobContext& ctx, int64_t step, ReportPhaseRequest* report) {
  if (ctx.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        "checkpoint.every is set but there is no checkpoint directory: set checkpoint.dir");
  }
  // A previous write must be done before its memory is reused and so that
  // checkpoints publish in order.
  if (absl::Status st = FinishCheckpoints(ctx, report, /*wait=*/true); !st.ok()) return st;
  if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
  // ZenFlow: the host update in flight is applied and the host moments
  // written back, so parameters and moments are complete.
  if (absl::Status st = ctx.zero->SyncHostUpdates(); !st.ok()) return st;

  const auto t0 = Clock::now();
  ckpt::ShardState state;
  state.rank = ctx.rank;
  state.ranges = OwnedRanges(*ctx.zero);
  const size_t n = ctx.zero->shard_size();
  std::vector<float> params(n), m(n), v(n);
  ctx.zero->CopyParamShard(params.data());
  ctx.zero->CopyOptimizerShard(m.data(), v.data());
  state.arrays.emplace_back("params", std::move(params));
  state.arrays.emplace_back("exp_avg", std::move(m));
  state.arrays.emplace_back("exp_avg_sq", std::move(v));
  if (ctx.zero->has_grad_error()) {
    // Int4 gradients: the quantisation error the ranks still owe (collective).
    std::vector<float> e(n);
    if (absl::Status st = ctx.zero->CopyGradErrorShard(e.data()); !st.ok()) return st;
    state.arrays.emplace_back("grad_error", std::move(e));
  }
  if (ctx.zero->has_zenflow()) {
    // ZenFlow: the accumulated gradient of the unimportant rows and the
    // selection (1 = important).
    std::vector<float> acc(n), important(n);
    ctx.zero->CopyZenFlowShard(acc.data(), important.data());
    state.arrays.emplace_back("zenflow_acc", std::move(acc));
    state.arrays.emplace_back("zenflow_important", std::move(important));
  }
  if (std::vector<float> ref; (CopyReferencePieces(ctx, &ref), !ref.empty())) {
    // The KL reference policy (GRPO): this rank's pieces of it.
    state.arrays.emplace_back("ref_params", std::move(ref));
  }
  const double blocked = std::chrono::duration<double>(Clock::now() - t0).count();
  double snapshot_bytes = 0;  // this rank's host copy, not the checkpoint's size on disk
  for (const auto& array : state.arrays) {
    snapshot_bytes += static_cast<double>(array.second.size() * sizeof(float));
  }
  if (ctx.peer != nullptr && ctx.world > 1 && !ctx.spec().recovery().no_peer_copies()) {
    // Gemini-style copy to the neighbour's host memory (peer_snapshot.h).
    SnapshotShard own;
    own.step = step;
    own.world = ctx.world;
    own.zero_stage = ctx.zero->stage();
    own.rank = ctx.rank;
    own.optimizer_steps = ctx.optimizer_steps;
    own.policy_version = ctx.policy_version;
    own.ranges = state.ranges;
    own.params = state.arrays[0].second;
    own.exp_avg = state.arrays[1].second;
    own.exp_avg_sq = state.arrays[2].second;
    if (absl::Status st = ExchangePeerCopies(ctx, std::move(own), report); !st.ok()) return st;
  }

  ckpt::Manifest manifest;
  manifest.step = step;
  manifest.world_size = ctx.world;
  manifest.zero_stage = ctx.zero->stage();
  manifest.generation = ctx.assignment.generation();
  manifest.policy_version = ctx.policy_version;
  manifest.optimizer_steps = ctx.optimizer_steps;
  manifest.total_floats = ctx.zero->num_params();
  manifest.config_hash = ConfigHash(ctx);
  // Every random draw is a pure function of (seed, stream, step, index):
  // the seed and the step are the whole RNG state and data cursor.
  manifest.rng_state = "counter:seed=" + std::to_string(ctx.spec().seed());
  manifest.data_cursor = DataCursorText(ctx, step);
  manifest.trainable = TrainableText(ctx);

  if (!ctx.writer) ctx.writer = std::make_unique<ckpt::AsyncWriter>();
  const std::string root = ctx.checkpoint_root;
  const int keep = ctx.spec().checkpoint().keep();
  const int world = ctx.world;
  comm::Store* store = ctx.store.get();
  // The job's abort ends the writer's store waits: rank 0 would otherwise
  // wait the whole timeout for the announcement of a rank that died
  // mid-write, and so would whatever drains this writer next (the SETUP of
  // the next generation, a degraded survivor's included).
  std::shared_ptr<comm::AbortSignal> abort = ctx.abort;
  JobContext* c = &ctx;
  ctx.writer->Submit(
      [state = std::move(state), manifest, root, keep, world, store, abort, c, step]() mutable -> absl::Status {
        comm::AbortableStore abortable(store, abort);
        const auto w0 = Clock::now();
        const std::string dir = ckpt::PartialDir(root, step);
        auto info = ckpt::WriteShard(dir, world, state);
        if (!info.ok()) return info.status();
        const std::string prefix = "ckpt/" + std::to_string(step);
        if (absl::Status st =
                abortable.Set(prefix + "/shard/" + std::to_string(state.rank), ckpt::ShardAnnouncement(*info));
            !st.ok())
          return st;
        // Rank 0 writes the manifest and publishes, so that its reports (the
        // ones the coordinator keeps) carry the checkpoint path.
        if (state.rank != 0) return absl::OkStatus();
        for (int r = 0; r < world; ++r) {
          auto v = abortable.Get(prefix + "/shard/" + std::to_string(r), std::chrono::seconds(60));
          if (!v.ok()) return v.status();
          auto shard = ckpt::ParseShardAnnouncement(*v, r, world);
          if (!shard.ok()) return shard.status();
          manifest.shards.push_back(*shard);
        }
        manifest.extra["write_seconds"] = std::chrono::duration<double>(Clock::now() - w0).count();
        if (absl::Status st = ckpt::WriteManifest(dir, manifest); !st.ok()) return st;
        auto bytes = ckpt::CheckpointBytes(dir, manifest);
        if (!bytes.ok()) return bytes.status();
        if (absl::Status st = ckpt::Publish(root, step); !st.ok()) return st;
        if (absl::Status st = ckpt::ApplyRetention(root, keep); !st.ok()) return st;
        tandem::v1::PublishedCheckpoint published;
        published.set_step(step);
        published.set_path(ckpt::FinalDir(root, step));
        published.set_bytes(static_cast<int64_t>(*bytes));
        std::lock_guard<std::mutex> lock(c->published_mu);
        c->published.push_back(std::move(published));
        return absl::OkStatus();
      });
  report->mutable_checkpoint()->set_blocked_seconds(blocked);
  report->mutable_checkpoint()->set_snapshot_bytes(static_cast<int64_t>(snapshot_bytes));
  report->mutable_metrics()->set_step(step);
  return absl::OkStatus();
}

absl::Status RestoreCheckpoint(JobContext& ctx, const std::string& path, bool own_checkpoint,
                               ReportPhaseRequest* report) {
  absl::StatusOr<ckpt::LoadedCheckpoint> loaded;
  if (std::filesystem::exists(path + "/manifest.json")) {
    loaded = ckpt::LoadCheckpoint(path);
  } else {
    std::vector<std::string> skipped;
    loaded = ckpt::LoadLatestValid(path, &skipped);
    for (const auto& s : skipped) {
      report->add_log_lines("checkpoint skipped (falling back to an older one): " + s);
    }
    report->mutable_setup()->set_checkpoints_skipped(static_cast<int64_t>(skipped.size()));
  }
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(), "restore from " + path + ": " + std::string(loaded.status().message()));
  }
  const auto& m = loaded->manifest;
  // Text data: the order is a function of (seed, step, rows), so the same
  // file continues exactly where the checkpoint stopped; another file would
  // silently change the order.
  if (ctx.train_data && m.data_cursor.find(" rows=") != std::string::npos &&
      m.data_cursor.substr(m.data_cursor.find(" rows=")) !=
          DataCursorText(ctx, m.step).substr(DataCursorText(ctx, m.step).find(" rows="))) {
    return absl::FailedPreconditionError("restore from " + loaded->dir + ": its data cursor '" + m.data_cursor +
                                         "' does not match data.train ('" + DataCursorText(ctx, m.step) +
                                         "'): the data file changed, so the order would not continue");
  }
  if (own_checkpoint) {
    // The job's own checkpoint (chosen by the coordinator): it lies at the
    // job's path of its step and was written for this model.
    if (!common::IsCheckpointStepPath(loaded->dir, ctx.checkpoint_root, m.step)) {
      return absl::DataLossError("restore from " + loaded->dir + ": its manifest says step " + std::to_string(m.step) +
                                 ", which lives at " +
                                 common::CheckpointStepPath(ctx.checkpoint_root, std::max<int64_t>(m.step, 1)));
    }
    if (!m.config_hash.empty() && m.config_hash != ConfigHash(ctx)) {
      return absl::DataLossError("restore from " + loaded->dir +
                                 ": written for another model configuration (config_hash " + m.config_hash +
                                 ", this job's is " + ConfigHash(ctx) + ")");
    }
  } else if (!m.config_hash.empty() && m.config_hash != ConfigHash(ctx)) {
    report->add_log_lines("resume from " + loaded->dir +
                          ": the checkpoint was written for a different model section of the job spec; "
                          "its shapes match, continuing");
  }
  if (m.trainable != TrainableText(ctx)) {
    // The moments of tensors that change between frozen and trainable
    // would not match the step count.
    auto shown = [](const std::string& t) { return t.empty() ? std::string("every parameter") : "[" + t + "]"; };
    return absl::FailedPreconditionError(
        "restore from " + loaded->dir + ": written with train.trainable " + shown(m.trainable) +
        ", this job has train.trainable " + shown(TrainableText(ctx)) +
        "; resume with the same patterns (to train other tensors from these weights, export them and start "
        "from model.from)");
  }
  if (m.total_floats != ctx.zero->num_params()) {
    return absl::FailedPreconditionError("restore from " + loaded->dir + ": checkpoint has " +
                                         std::to_string(m.total_floats) + " parameters, the job's model has " +
                                         std::to_string(ctx.zero->num_params()));
  }
  auto find = [&](const char* name) -> const std::vector<float>* {
    auto it = loaded->arrays.find(name);
    return it == loaded->arrays.end() ? nullptr : &it->second;
  };
  const auto* params = find("params");
  const auto* mom1 = find("exp_avg");
  const auto* mom2 = find("exp_avg_sq");
  if (params == nullptr || mom1 == nullptr || mom2 == nullptr) {
    return absl::DataLossError("restore from " + loaded->dir + ": checkpoint lacks params/exp_avg/exp_avg_sq");
  }
  // Reshard: take this rank's pieces of the full arrays.
  const auto ranges = OwnedRanges(*ctx.zero);
  const size_t n = ctx.zero->shard_size();
  std::vector<float> p(n), a(n), b(n);
  size_t pos = 0;
  for (const auto& r : ranges) {
    std::copy_n(params->data() + r.offset, r.count, p.data() + pos);
    std::copy_n(mom1->data() + r.offset, r.count, a.data() + pos);
    std::copy_n(mom2->data() + r.offset, r.count, b.data() + pos);
    pos += r.count;
  }
  ctx.zero->LoadParamShard(p.data());
  if (absl::Status st = ctx.zero->AllgatherParams(); !st.ok()) return st;
  ctx.zero->LoadOptimizerShard(a.data(), b.data());
  if (absl::Status st = ctx.zero->AllgatherOptimizerState(); !st.ok()) return st;
  if (const auto* err = find("grad_error"); err != nullptr && ctx.zero->has_grad_error()) {
    std::vector<float> e(n);
    pos = 0;
    for (const auto& r : ranges) {
      std::copy_n(err->data() + r.offset, r.count, e.data() + pos);
      pos += r.count;
    }
    ctx.zero->LoadGradErrorShard(e.data());
  }
  if (const auto* ref = find("ref_params"); ref != nullptr && ShardsReference(ctx)) {
    // Sharded: this rank's pieces only.
    if (absl::Status st = MakeReferenceShard(ctx); !st.ok()) return st;
    std::vector<float> e(n);
    pos = 0;
    for (const auto& r : ranges) {
      std::copy_n(ref->data() + r.offset, r.count, e.data() + pos);
      pos += r.count;
    }
    ctx.ref_shard->LoadShard(e.data());
  } else if (ref != nullptr) {
    ctx.ref_params = *ref;
    ctx.ref_device.reset();
    ctx.ref_shard.reset();
  }
  ctx.zero->set_step_count(m.optimizer_steps);
  if (ctx.zero->has_zenflow()) {
    const auto* acc = find("zenflow_acc");
    const auto* important = find("zenflow_important");
    if (acc != nullptr && important != nullptr) {
      ctx.zero->LoadZenFlowState(acc->data(), important->data());
    } else {
      report->add_log_lines("restore from " + loaded->dir +
                            ": no ZenFlow state in the checkpoint; the rows are selected afresh at the next step");
    }
  }
  ctx.optimizer_steps = m.optimizer_steps;
  ctx.policy_version = m.policy_version;
  report->mutable_setup()->set_restored(true);
  report->mutable_setup()->set_restored_step(m.step);
  report->add_log_lines("restored step " + std::to_string(m.step) + " from " + loaded->dir + " (written by " +
                        std::to_string(m.world_size) + " ranks, ZeRO stage " + std::to_string(m.zero_stage) + ")");
  return absl::OkStatus();
}

}  // namespace tandem::worker
