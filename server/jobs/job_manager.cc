#include "server/jobs/job_manager.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/checkpoint_path.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/phase_failure.h"
#include "common/status_util.h"
#include "server/recovery/policy.h"
#include "worker/model/job_model.h"
#include "server/scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using tandem::v1::Job;
using tandem::v1::JobState;
using tandem::v1::StepMetrics;

namespace {

// Checkpoint records kept per job (the newest) when checkpoint.keep is 0.
constexpr int64_t kMaxCheckpointRecordsPerJob = 1000;
// How often finished jobs are checked against the retention settings.
constexpr double kPruneEverySeconds = 30;

constexpr int64_t kMaxLogLinesPerJob = 200000;

void MergeMetrics(StepMetrics* acc, const StepMetrics& m) {
  auto take = [](double v, double* dst) {
    if (v != 0) *dst = v;
  };
  double v;
  v = acc->loss(); take(m.loss(), &v); acc->set_loss(v);
  v = acc->reward_mean(); take(m.reward_mean(), &v); acc->set_reward_mean(v);
  v = acc->accuracy(); take(m.accuracy(), &v); acc->set_accuracy(v);
  v = acc->kl(); take(m.kl(), &v); acc->set_kl(v);
  v = acc->tokens_per_s(); take(m.tokens_per_s(), &v); acc->set_tokens_per_s(v);
  v = acc->lr(); take(m.lr(), &v); acc->set_lr(v);
  v = acc->grad_norm(); take(m.grad_norm(), &v); acc->set_grad_norm(v);
  acc->set_switch_seconds(acc->switch_seconds() + m.switch_seconds());
  acc->set_peak_memory_bytes(std::max(acc->peak_memory_bytes(), m.peak_memory_bytes()));
  for (const auto& [k, val] : m.extra()) (*acc->mutable_extra())[k] = val;
  // The coordinator's own timing goes into phase_seconds; the engine's
  // finer breakdown (e.g. "rollout_enter") is kept under its own names.
  for (const auto& [k, val] : m.phase_seconds()) {
    if (!acc->phase_seconds().contains(k)) (*acc->mutable_phase_seconds())[k] = val;
  }
}

std::string StepSummary(const StepMetrics& m, int64_t total) {
  std::string s = absl::StrCat("step ", m.step(), "/", total);
  if (m.loss() != 0) absl::StrAppend(&s, absl::StrFormat(" loss %.4f", m.loss()));
  if (m.reward_mean() != 0) absl::StrAppend(&s, absl::StrFormat(" reward %.4f", m.reward_mean()));
  if (m.accuracy() != 0) absl::StrAppend(&s, absl::StrFormat(" accuracy %.3f", m.accuracy()));
  if (m.tokens_per_s() != 0) absl::StrAppend(&s, absl::StrFormat(" tokens/s %.0f", m.tokens_per_s()));
  return s;
}

// A warm-start step's report that the model reached init.sft.stop_accuracy
// (worker/engine/sft_phases.cc): every rank computes the same allreduced probe.
bool WarmStartHeld(const StepMetrics& m) {
  auto it = m.extra().find("warm_start_held");
  return it != m.extra().end() && it->second == 1;
}

std::string TeacherForcedExact(const StepMetrics& m) {
  auto it = m.extra().find("teacher_forced_exact");
  return it == m.extra().end() ? std::string("?") : absl::StrFormat("%.3f", it->second);
}

}  // namespace

bool IsTerminal(JobState state) {
  return state == tandem::v1::JOB_STATE_SUCCEEDED || state == tandem::v1::JOB_STATE_FAILED ||
         state == tandem::v1::JOB_STATE_CANCELLED;
}

std::string JobStateName(JobState state) {
  std::string name = tandem::v1::JobState_Name(state);
  if (name.rfind("JOB_STATE_", 0) == 0) name = name.substr(10);
  return absl::AsciiStrToLower(name);
}

JobManager::JobManager(const tandem::v1::CoordinatorConfig& config, StateStore* store, Membership* membership,
                       KvStore* kv, const Clock* clock)
    : config_(config), store_(store), membership_(membership), kv_(kv), clock_(clock) {}

JobManager::~JobManager() { Shutdown(); }

bool JobManager::loaded() const {
  absl::MutexLock lock(&mu_);
  return loaded_;
}

absl::Status JobManager::Load() {
  ASSIGN_OR_RETURN(auto stored, store_->LoadJobs());
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<JobRecord*, std::string>> quarantined;
  for (auto& s : stored) {
    auto r = std::make_unique<JobRecord>();
    r->job = std::move(s.job);
    r->cursor = s.cursor;
    r->seq = s.seq;
    // A stored job this coordinator cannot run (written by another version,
    // or damaged) fails with the reason instead of taking the coordinator
    // down on every start.
    absl::Status valid = tandem::v1::JobState_IsValid(r->job.state())
                             ? common::ValidateJobSpec(r->job.spec())
                             : absl::InvalidArgumentError(absl::StrCat("unknown state ", r->job.state()));
    if (valid.ok() && r->cursor.unit < 0) valid = absl::InvalidArgumentError("negative phase cursor");
    if (valid.ok()) {
      r->plan = std::make_unique<PhasePlan>(r->job.spec());
    } else {
      tandem::v1::JobSpec defaults;
      common::ApplyJobDefaults(&defaults);
      r->plan = std::make_unique<PhasePlan>(defaults);
      if (!tandem::v1::JobState_IsValid(r->job.state()) || !IsTerminal(r->job.state())) {
        quarantined.emplace_back(r.get(), std::string(valid.message()));
      }
    }
    ASSIGN_OR_RETURN(r->last_event_seq, store_->LastEventSeq(r->job.id()));
    // The per-job log cap counts what is stored, across restarts.
    ASSIGN_OR_RETURN(r->log_lines, store_->CountLogs(r->job.id()));
    std::string id = r->job.id();
    jobs_[id] = std::move(r);
  }
  for (auto& [r, why] : quarantined) {
    spdlog::error("job {}: quarantined: {}", r->job.id(), why);
    r->job.clear_worker_ids();  // never sends it commands
    FinishLocked(r, tandem::v1::JOB_STATE_FAILED,
                 absl::StrCat("quarantined when the coordinator started: its stored spec is not valid: ", why));
  }
  PruneFinishedLocked();
  last_prune_ = clock_->WallSeconds();
  loaded_ = true;
  spdlog::info("loaded {} jobs from {}", jobs_.size(), store_->path());
  return absl::OkStatus();
}

void JobManager::Start() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : jobs_) {
    if (r->job.state() == tandem::v1::JOB_STATE_RUNNING || r->job.state() == tandem::v1::JOB_STATE_RECOVERING) {
      EventLocked(r.get(), "state", "coordinator restarted: waiting for the job's workers to re-attach");
      StartRunnerLocked(r.get());
    }
  }
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !scheduler_.joinable()) return;
    stopping_ = true;
    changed_.SignalAll();
  }
  if (scheduler_.joinable()) scheduler_.join();
  std::vector<std::thread> runners;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, r] : jobs_) {
      if (r->runner.joinable()) runners.push_back(std::move(r->runner));
    }
  }
  for (auto& t : runners) t.join();
}

JobManager::JobRecord* JobManager::FindLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::Status JobManager::PersistLocked(const JobRecord& r) {
  absl::Status s = store_->PutJob(r.job, r.cursor, r.seq);
  if (!s.ok()) spdlog::error("persist job {}: {}", r.job.id(), s.ToString());
  NoteStoreWrite(s);
  return s;
}

void JobManager::NoteStoreWrite(const absl::Status& s) {
  store_error_ = s.ok() ? "" : std::string(s.message());
}

std::string JobManager::StoreError() const {
  absl::MutexLock lock(&mu_);
  return store_error_;
}

void JobManager::EventLocked(JobRecord* r, const std::string& kind, const std::string& message,
                             const StepMetrics* metrics) {
  tandem::v1::JobEvent e;
  e.set_job_id(r->job.id());
  e.set_time(clock_->WallSeconds());
  e.set_kind(kind);
  e.set_message(message);
  e.set_state(r->job.state());
  if (metrics) *e.mutable_metrics() = *metrics;
  auto seq = store_->AppendEvent(e);
  NoteStoreWrite(seq.status());
  if (!seq.ok()) {
    spdlog::error("job {} event: {}", r->job.id(), seq.status().ToString());
    return;
  }
  r->last_event_seq = *seq;
  if (kind != "step") LogLocked(r, "coordinator", {message});
  changed_.SignalAll();
}

void JobManager::LogLocked(JobRecord* r, const std::string& source, const std::vector<std::string>& lines) {
  if (lines.empty() || r->log_lines >= kMaxLogLinesPerJob) return;
  std::vector<tandem::v1::LogLine> out;
  const double now = clock_->WallSeconds();
  for (const auto& text : lines) {
    if (r->log_lines >= kMaxLogLinesPerJob) {
      tandem::v1::LogLine l;
      l.set_time(now);
      l.set_source("coordinator");
      l.set_text(absl::StrCat("log limit of ", kMaxLogLinesPerJob, " lines reached; further lines dropped"));
      out.push_back(l);
      break;
    }
    tandem::v1::LogLine l;
    l.set_time(now);
    l.set_source(source);
    l.set_text(text);
    out.push_back(std::move(l));
    r->log_lines++;
  }
  auto s = store_->AppendLogs(r->job.id(), std::move(out));
  if (!s.ok()) spdlog::error("job {} logs: {}", r->job.id(), s.status().ToString());
}

absl::Status JobManager::CheckMemoryFits(const tandem::v1::JobSpec& spec) const {
  auto config = model::JobModelConfig(spec);
  if (!config.ok()) return absl::OkStatus();  // model.from not readable here: the workers check
  int64_t largest = 0;
  for (const auto& w : membership_->List()) {
    if (w.device() != spec.cluster().device() || w.state() == tandem::v1::WORKER_STATE_LOST ||
        w.state() == tandem::v1::WORKER_STATE_GONE) {
      continue;
    }
    largest = std::max(largest, w.memory_bytes());
  }
  if (largest <= 0) return absl::OkStatus();  // no such worker yet: nothing to compare with
  const model::MemoryEstimate need = model::EstimateJobMemory(spec, *config);
  if (need.total <= largest) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the job needs about ", need.Describe(), " per worker; the largest ", common::DeviceName(spec.cluster().device()),
      " worker has ", absl::StrFormat("%.1f GiB", static_cast<double>(largest) / (1 << 30)),
      ": use more workers with a higher cluster.zero_stage, or a smaller train.micro_batch / train.seq_len / model"));
}

absl::StatusOr<Job> JobManager::Submit(tandem::v1::JobSpec spec) {
  common::ApplyJobDefaults(&spec);
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  RETURN_IF_ERROR(model::CheckJobForWorkers(spec));
  RETURN_IF_ERROR(CheckMemoryFits(spec));
  auto next = store_->NextJobSeq();
  if (!next.ok()) {
    absl::MutexLock lock(&mu_);
    NoteStoreWrite(next.status());
    return absl::UnavailableError(absl::StrCat("the job was not accepted: ", next.status().message()));
  }
  const int64_t seq = *next;
  auto r = std::make_unique<JobRecord>();
  r->seq = seq;
  Job& job = r->job;
  job.set_id(absl::StrFormat("j-%06d", seq));
  std::error_code ec;
  std::string run_dir = (std::filesystem::absolute(config_.runs_dir(), ec) / job.id()).string();
  if (spec.output_dir().empty()) spec.set_output_dir(run_dir + "/final");
  if (spec.checkpoint().dir().empty()) spec.mutable_checkpoint()->set_dir(run_dir + "/checkpoints");
  *job.mutable_spec() = spec;
  job.set_state(tandem::v1::JOB_STATE_PENDING);
  job.set_reason("waiting for the scheduler");
  job.set_total_steps(spec.train().steps());
  job.set_created_at(clock_->WallSeconds());
  job.set_output_dir(spec.output_dir());
  r->plan = std::make_unique<PhasePlan>(spec);
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("coordinator is shutting down");
  JobRecord* rec = r.get();
  if (absl::Status s = PersistLocked(*rec); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("the job was not accepted: ", s.message()));
  }
  jobs_[job.id()] = std::move(r);
  EventLocked(rec, "state",
              absl::StrCat("submitted ", common::KindName(spec.kind()), " job '", spec.name(), "' (",
                           spec.cluster().workers(), " ", common::DeviceName(spec.cluster().device()),
                           " worker", spec.cluster().workers() == 1 ? "" : "s", ", ", spec.train().steps(),
                           " steps)"));
  schedule_requested_ = true;
  changed_.SignalAll();
  return rec->job;
}

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return r->job;
}

std::vector<Job> JobManager::List(JobState filter, int limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<const JobRecord*> recs;
  for (const auto& [id, r] : jobs_) {
    if (filter == tandem::v1::JOB_STATE_UNSPECIFIED || r->job.state() == filter) recs.push_back(r.get());
  }
  std::sort(recs.begin(), recs.end(), [](auto* a, auto* b) { return a->seq > b->seq; });  // newest first
  std::vector<Job> out;
  for (auto* r : recs) {
    if (static_cast<int>(out.size()) >= limit) break;
    out.push_back(r->job);
  }
  return out;
}

std::vector<Job> JobManager::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<Job> out;
  for (const auto& [id, r] : jobs_) out.push_back(r->job);
  return out;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  if (IsTerminal(r->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ", JobStateName(r->job.state())));
  }
  std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  if (absl::Status s = PersistLocked(*r); !s.ok()) {
    // Not durable: a restarted coordinator would run the job again.
    return absl::UnavailableError(absl::StrCat("cannot record the cancellation: ", s.message(),
                                               " (free space or fix the disk, then retry)"));
  }
  if (r->job.state() == tandem::v1::JOB_STATE_PENDING) {
    FinishLocked(r, tandem::v1::JOB_STATE_CANCELLED, why);
  } else {
    r->cancel_requested = true;
    r->cancel_reason = why;
    changed_.SignalAll();
  }
  return r->job;
}

absl::StatusOr<int64_t> JobManager::LastEventSeq(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return r->last_event_seq;
}

absl::Status JobManager::NextEvents(const std::string& job_id, int64_t after_seq, int64_t wait_ms,
                                    std::vector<StoredEvent>* out, bool* finished) {
  bool terminal = false;
  int64_t last = 0;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = FindLocked(job_id);
    if (r == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return r->last_event_seq > after_seq || stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(wait_ms));
    terminal = IsTerminal(r->job.state());
    last = r->last_event_seq;
  }
  ASSIGN_OR_RETURN(*out, store_->ListEvents(job_id, after_seq, 256));
  int64_t got = out->empty() ? after_seq : out->back().seq;
  *finished = terminal && got >= last;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<tandem::v1::LogLine>> JobManager::Logs(const std::string& job_id, int64_t after_seq,
                                                                  int limit) const {
  {
    absl::MutexLock lock(&mu_);
    if (FindLocked(job_id) == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  return store_->ListLogs(job_id, after_seq, limit);
}

absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> JobManager::Checkpoints(const std::string& job_id) const {
  {
    absl::MutexLock lock(&mu_);
    if (FindLocked(job_id) == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  return store_->ListCheckpoints(job_id);
}

int64_t JobManager::JobGenerationFor(const std::string& job_id, const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  if (r == nullptr || !r->fail_reason.empty()) return -1;
  if (r->job.state() != tandem::v1::JOB_STATE_RUNNING && r->job.state() != tandem::v1::JOB_STATE_RECOVERING) return -1;
  const auto& ids = r->job.worker_ids();
  if (std::find(ids.begin(), ids.end(), worker_id) == ids.end()) return -1;
  return r->job.generation();
}

bool JobManager::ScopeActive(const std::string& job_id, int64_t generation) const {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  return r != nullptr && !IsTerminal(r->job.state()) && r->job.state() != tandem::v1::JOB_STATE_PENDING &&
         r->job.generation() == generation;
}

void JobManager::NotifyScheduler() {
  absl::MutexLock lock(&mu_);
  schedule_requested_ = true;
  changed_.SignalAll();
}

absl::Status JobManager::OnReport(const tandem::v1::ReportPhaseRequest& report) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(report.job_id());
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", report.job_id(), "'"));
  const auto& ids = r->job.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), report.worker_id());
  // Nothing in a report is used before its sender is known to be a member.
  if (it == ids.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", report.worker_id(), " is not part of job ", report.job_id()));
  }
  const std::string& root = r->job.spec().checkpoint().dir();
  for (int i = 0; i < report.checkpoints_size(); ++i) {
    const auto& c = report.checkpoints(i);
    if (!common::IsCheckpointStepPath(c.path(), root, c.step())) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoints[", i, "]: path '", c.path(), "' of step ", c.step(),
                                                     " is not the job's checkpoint directory of that step (",
                                                     common::CheckpointStepPath(root, std::max<int64_t>(c.step(), 1)),
                                                     ")"));
    }
  }
  // A published checkpoint is complete whoever of the members reports it
  // (any rank, any phase: the background write finishes later), even from an
  // old generation or with a phase that failed after it was published.
  if (!IsTerminal(r->job.state())) {
    for (const auto& published : report.checkpoints()) RecordCheckpointLocked(r, report.generation(), published);
  }
  const int rank = static_cast<int>(it - ids.begin());
  std::vector<std::string> lines(report.log_lines().begin(), report.log_lines().end());
  LogLocked(r, absl::StrCat("rank", rank), lines);
  if (IsTerminal(r->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", r->job.id(), " is ", JobStateName(r->job.state()), ": drop its state"));
  }
  if (report.generation() != r->job.generation()) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", report.generation(), " is stale; job ",
                                                      r->job.id(), " is at generation ", r->job.generation()));
  }
  if (!r->inflight || r->inflight->command_id() != report.command_id()) {
    spdlog::debug("job {}: ignoring report for {} (not in flight)", r->job.id(), report.command_id());
    return absl::OkStatus();
  }
  if (r->reports.count(rank)) return absl::OkStatus();  // duplicate (re-sent command)
  r->reports[rank] = report;
  // A communicator failure (a peer died, a collective timed out or was
  // aborted) is the cluster's, not the job's: recover without waiting for
  // the other ranks, which may hang on the dead peer until aborted.
  if (common::ReportFailureKind(report) == tandem::v1::PHASE_FAILURE_KIND_RETRYABLE) {
    RequestRecoveryLocked(r,
                          absl::StrCat(report.step() != 0 ? absl::StrCat("step ", report.step(), " ") : "",
                                       "phase ", PhaseUpperName(report.phase()), " failed on worker ",
                                       report.worker_id(), " (rank ", rank, "): ", report.error()),
                          "");
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

void JobManager::RecordCheckpointLocked(JobRecord* r, int64_t generation,
                                        const tandem::v1::PublishedCheckpoint& published) {
  tandem::v1::CheckpointRecord rec;
  rec.set_job_id(r->job.id());
  rec.set_step(published.step());
  rec.set_path(published.path());
  rec.set_generation(generation);
  rec.set_world_size(r->job.worker_ids_size());
  rec.set_bytes(published.bytes());
  rec.set_time(clock_->WallSeconds());
  auto existing = store_->HasCheckpoint(rec);
  if (existing.ok() && *existing) return;
  absl::Status s = store_->AddCheckpoint(rec);
  if (!s.ok()) spdlog::error("job {} checkpoint record: {}", r->job.id(), s.ToString());
  // Rank 0 applies checkpoint.keep right after publishing (ckpt::ApplyRetention):
  // list only what is still on disk. Without a keep the catalogue still
  // holds only the newest kMaxCheckpointRecordsPerJob (older ones stay on disk).
  {
    const int64_t keep = r->job.spec().checkpoint().keep();
    s = store_->PruneCheckpoints(r->job.id(), keep > 0 ? std::min(keep, kMaxCheckpointRecordsPerJob)
                                                       : kMaxCheckpointRecordsPerJob);
    if (!s.ok()) spdlog::error("job {} checkpoint records: {}", r->job.id(), s.ToString());
  }
  // A path rewritten by a redo is good again.
  auto* bad = r->job.mutable_recovery()->mutable_bad_checkpoints();
  bad->erase(std::remove(bad->begin(), bad->end(), rec.path()), bad->end());
  EventLocked(r, "checkpoint", absl::StrCat("checkpoint of step ", rec.step(), " at ", rec.path()));
}

void JobManager::OnWorkerLost(const LostWorker& lost) {
  absl::MutexLock lock(&mu_);
  if (lost.job_id.empty()) return;
  JobRecord* r = FindLocked(lost.job_id);
  if (r == nullptr || IsTerminal(r->job.state()) || !r->fail_reason.empty()) return;
  const auto& ids = r->job.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), lost.worker_id);
  if (it == ids.end()) return;  // no longer a member (already replaced)
  int rank = static_cast<int>(it - ids.begin());
  const std::string what = absl::StrCat("worker ", lost.worker_id,
                                        lost.name.empty() ? "" : absl::StrCat(" (", lost.name, ")"), " rank ", rank,
                                        " lost: ", lost.reason);
  EventLocked(r, "worker", what);
  // A worker that dies while restoring a checkpoint may have been killed by
  // it (a file damaged in a way the loader does not catch): the second loss
  // restoring the same checkpoint marks it bad, and recovery falls back to
  // the one before.
  auto* rec = r->job.mutable_recovery();
  if (r->inflight && r->inflight->phase() == tandem::v1::PHASE_SETUP && !rec->restore_from().empty()) {
    const std::string path = rec->restore_from();
    const auto& bad = rec->bad_checkpoints();
    if (++r->restore_losses[path] >= 2 && std::find(bad.begin(), bad.end(), path) == bad.end()) {
      rec->add_bad_checkpoints(path);
      EventLocked(r, "recovery",
                  absl::StrCat("checkpoint ", path, " is unusable (", r->restore_losses[path],
                               " workers were lost while restoring it): falling back to the previous one"));
    }
  }
  RequestRecoveryLocked(r, what, lost.worker_id);
}

void JobManager::OnWorkerPreempting(const std::string& worker_id, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  if (r == nullptr || IsTerminal(r->job.state())) return;
  const auto& ids = r->job.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), worker_id);
  if (it == ids.end() || r->preempting.count(worker_id)) return;
  r->preempting.insert(worker_id);
  EventLocked(r, "worker", absl::StrCat("worker ", worker_id, " rank ", it - ids.begin(),
                                        " is being preempted: handing it over at the next step boundary"));
  changed_.SignalAll();
}

void JobManager::RequestRecoveryLocked(JobRecord* r, const std::string& reason, const std::string& suspect) {
  if (IsTerminal(r->job.state()) || !r->fail_reason.empty()) return;
  r->grow_back = false;  // a loss overrides a planned grow back
  if (!suspect.empty()) r->suspects.insert(suspect);
  // While the driver is choosing the new members it sees every loss itself.
  if (r->choosing_members) return;
  if (r->recover_reason.empty()) {
    r->recover_reason = reason;
    r->recover_requested_at = clock_->WallSeconds();
    spdlog::warn("job {}: recovering: {}", r->job.id(), reason);
  }
  changed_.SignalAll();
}

void JobManager::OnWorkerAttached(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : jobs_) {
    if ((r->job.state() != tandem::v1::JOB_STATE_RUNNING && r->job.state() != tandem::v1::JOB_STATE_RECOVERING) ||
        !r->inflight) {
      continue;
    }
    const auto& ids = r->job.worker_ids();
    auto it = std::find(ids.begin(), ids.end(), worker_id);
    if (it == ids.end()) continue;
    int rank = static_cast<int>(it - ids.begin());
    if (!r->reports.count(rank)) membership_->Resend(worker_id, CommandForRank(*r, rank));
  }
}

tandem::v1::WorkerCommand JobManager::CommandForRank(const JobRecord& r, int rank) const {
  tandem::v1::WorkerCommand command;
  auto* cmd = command.mutable_phase();
  *cmd = *r.inflight;
  if (cmd->phase() == tandem::v1::PHASE_SETUP) {
    const auto& spec = r.job.spec();
    auto* a = cmd->mutable_assignment();
    a->set_job_id(r.job.id());
    *a->mutable_spec() = spec;
    a->set_rank(rank);
    a->set_world_size(r.job.worker_ids_size());
    a->set_generation(r.job.generation());
    a->set_store_prefix(KvStore::ScopeName(r.job.id(), r.job.generation()));
    if (spec.placement().mode() == "disaggregated") {
      a->set_role(rank < spec.placement().train_workers() ? "train" : "rollout");
    }
    const auto& rec = r.job.recovery();
    a->set_restore_from(!rec.restore_from().empty() ? rec.restore_from() : spec.resume_from());
    if (rec.peer_restore_step() > 0) {
      a->set_peer_restore_step(rec.peer_restore_step());
      for (int pr : rec.peer_restore_ranks()) a->add_peer_restore_ranks(pr);
    }
    if (rec.live_restore() && rec.has_last_trained()) {
      a->set_live_restore(true);
      a->set_live_restore_step(rec.last_trained_step());
      if (rec.has_inflight_trained()) {
        a->set_live_restore_allow_inflight(true);
        a->set_live_restore_inflight_step(rec.inflight_trained_step());
      }
    }
    const int logical_world = rec.degraded_logical_world();
    if (logical_world > 0 && rec.logical_begin_size() == r.job.worker_ids_size() &&
        rec.logical_own_size() == r.job.worker_ids_size()) {
      a->set_logical_world_size(logical_world);
      a->set_logical_rank_begin(rec.logical_begin(rank));
      a->set_logical_rank_end(rank + 1 < rec.logical_begin_size() ? rec.logical_begin(rank + 1) : logical_world);
      a->set_own_logical_rank(rec.logical_own(rank));
    }
    std::error_code ec;
    a->set_run_dir((std::filesystem::absolute(config_.runs_dir(), ec) / r.job.id()).string());
  }
  return command;
}

void JobManager::FinishLocked(JobRecord* r, JobState state, const std::string& reason) {
  const auto& ids = r->job.worker_ids();
  std::vector<std::string> workers(ids.begin(), ids.end());
  if (state != tandem::v1::JOB_STATE_SUCCEEDED) {
    for (const auto& w : workers) {
      tandem::v1::WorkerCommand abort;
      abort.set_abort_job(r->job.id());
      membership_->Send(w, abort).IgnoreError();
    }
  }
  membership_->Release(r->job.id(), workers);
  kv_->DropJob(r->job.id());
  r->inflight.reset();
  r->job.set_state(state);
  r->job.set_reason(reason);
  r->job.set_finished_at(clock_->WallSeconds());
  PersistLocked(*r);
  std::string message = absl::StrCat("job ", JobStateName(state));
  if (!reason.empty()) absl::StrAppend(&message, ": ", reason);
  EventLocked(r, "state", message);
  spdlog::info("job {}: {}", r->job.id(), message);
  schedule_requested_ = true;
}

void JobManager::StartRunnerLocked(JobRecord* r) {
  if (r->runner.joinable()) {
    if (!r->runner_done) return;
    r->runner.join();
  }
  r->runner_done = false;
  r->runner = std::thread([this, r] { RunJob(r); });
}

void JobManager::RunJob(JobRecord* r) {
  while (true) {
    PlannedPhase phase;
    std::vector<std::string> workers;
    std::vector<tandem::v1::WorkerCommand> commands;
    int64_t timeout_ms = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      if (r->cancel_requested) {
        FinishLocked(r, tandem::v1::JOB_STATE_CANCELLED, r->cancel_reason);
        break;
      }
      if (!r->fail_reason.empty()) {
        FinishLocked(r, tandem::v1::JOB_STATE_FAILED, r->fail_reason);
        break;
      }
      if (!r->recover_reason.empty()) {
        RecoverLocked(r);
        continue;
      }
      if (HandlePreemptionLocked(r)) continue;
      if (HandleGrowBackLocked(r)) continue;
      auto at = r->extra ? r->extra : r->plan->At(r->cursor);
      if (!at) {
        FinishLocked(r, tandem::v1::JOB_STATE_SUCCEEDED, "");
        break;
      }
      phase = *at;
      timeout_ms = phase.phase == tandem::v1::PHASE_SETUP ? config_.setup_timeout_ms() : config_.phase_timeout_ms();
      tandem::v1::PhaseCommand cmd;
      cmd.set_command_id(r->extra ? absl::StrCat(r->job.id(), "/g", r->job.generation(), "/u", r->cursor.unit, "/x",
                                                 PhaseName(phase.phase), phase.step)
                                  : absl::StrCat(r->job.id(), "/g", r->job.generation(), "/u", r->cursor.unit, "/p",
                                                 r->cursor.sub));
      cmd.set_job_id(r->job.id());
      cmd.set_generation(r->job.generation());
      cmd.set_phase(phase.phase);
      cmd.set_step(phase.step);
      cmd.set_deadline_ms(timeout_ms);
      r->inflight = cmd;
      r->inflight_started = absl::Now();
      r->reports.clear();
      workers.assign(r->job.worker_ids().begin(), r->job.worker_ids().end());
      for (size_t rank = 0; rank < workers.size(); ++rank) {
        commands.push_back(CommandForRank(*r, static_cast<int>(rank)));
      }
    }
    for (size_t rank = 0; rank < workers.size(); ++rank) {
      membership_->Send(workers[rank], std::move(commands[rank])).IgnoreError();
    }
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = r->inflight_started + absl::Milliseconds(timeout_ms);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || r->cancel_requested || !r->fail_reason.empty() || !r->recover_reason.empty() ||
             r->reports.size() == workers.size();
    };
    mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
    if (stopping_) break;
    if (r->cancel_requested || !r->fail_reason.empty() || !r->recover_reason.empty()) continue;
    const std::string where =
        absl::StrCat(phase.step != 0 ? absl::StrCat("step ", phase.step, " ") : "", "phase ",
                     PhaseUpperName(phase.phase));
    if (r->reports.size() != workers.size()) {
      std::vector<std::string> missing;
      std::string suspect;
      for (size_t rank = 0; rank < workers.size(); ++rank) {
        if (!r->reports.count(static_cast<int>(rank))) {
          missing.push_back(absl::StrCat(workers[rank], " (rank ", rank, ")"));
          r->suspects.insert(workers[rank]);
          suspect = workers[rank];
        }
      }
      RequestRecoveryLocked(r,
                            absl::StrCat(where, " timed out after ",
                                         absl::FormatDuration(absl::Milliseconds(timeout_ms)), " waiting for ",
                                         absl::StrJoin(missing, ", ")),
                            suspect);
      continue;
    }
    auto* rec = r->job.mutable_recovery();
    for (const auto& [rank, rep] : r->reports) {
      if (rep.ok()) continue;
      const std::string what = absl::StrCat(where, " failed on worker ", workers[rank], " (rank ", rank, "): ",
                                            rep.error().empty() ? "no message" : rep.error());
      const bool in_recovery = rec->started_at() > 0;
      if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && rec->live_restore() && !rec->live_failed()) {
        rec->set_live_failed(true);
        EventLocked(r, "recovery", absl::StrCat("live-state restore failed (", what, "): restoring from disk"));
        RequestRecoveryLocked(r, what, "");
      } else if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && rec->peer_restore_step() > 0 &&
          !rec->peer_failed()) {
        rec->set_peer_failed(true);
        EventLocked(r, "recovery", absl::StrCat("peer-memory restore failed (", what, "): falling back to disk"));
        RequestRecoveryLocked(r, what, "");
      } else if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && !rec->restore_from().empty() &&
                 common::ReportFailureKind(rep) == tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED) {
        const std::string bad = rec->restore_from();
        rec->add_bad_checkpoints(bad);
        EventLocked(r, "recovery",
                    absl::StrCat("checkpoint ", bad, " is unusable (", rep.error(), "): falling back to the previous one"));
        RequestRecoveryLocked(r, what, "");
      } else {
        r->fail_reason = what;
      }
      break;
    }
    if (!r->fail_reason.empty() || !r->recover_reason.empty()) continue;
    CompletePhaseLocked(r, phase);
  }
  absl::MutexLock lock(&mu_);
  r->runner_done = true;
}

bool JobManager::HandlePreemptionLocked(JobRecord* r) {
  if (r->preempting.empty() || r->extra || r->job.state() != tandem::v1::JOB_STATE_RUNNING) return false;
  // Step boundary: the cursor starts a unit after SETUP.
  if (r->cursor.sub != 0 || r->cursor.unit == 0) return false;
  const auto& ids = r->job.worker_ids();
  std::vector<std::string> leaving;
  for (const auto& w : r->preempting) {
    if (std::find(ids.begin(), ids.end(), w) != ids.end()) leaving.push_back(w);
  }
  if (leaving.empty()) {
    r->preempting.clear();
    return false;
  }
  const RecoveryPolicy policy = EffectiveRecoveryPolicy(config_, r->job.spec());
  const int64_t step = r->job.step();
  int64_t newest = r->job.recovery().peer_copy_step();
  auto records = store_->ListCheckpoints(r->job.id());
  if (records.ok()) {
    for (const auto& c : *records) newest = std::max(newest, c.step());
  }
  const bool fits = r->last_checkpoint_seconds * 1000.0 <= static_cast<double>(policy.preempt_checkpoint_budget_ms);
  if (step > 0 && step > newest && r->preempt_checkpoint_step != step && fits &&
      !r->job.spec().checkpoint().dir().empty()) {
    r->preempt_checkpoint_step = step;
    r->extra = PlannedPhase{tandem::v1::PHASE_CHECKPOINT, step};
    EventLocked(r, "checkpoint", absl::StrCat("checkpoint of step ", step, " before handing over preempted worker ",
                                              absl::StrJoin(leaving, ", ")));
    return false;  // the driver issues it now
  }
  std::string reason = absl::StrCat("worker ", absl::StrJoin(leaving, ", "), " preempted (SIGTERM)");
  if (step > newest && !fits) {
    absl::StrAppend(&reason, "; no checkpoint: the last one took ",
                    absl::StrFormat("%.1f s", r->last_checkpoint_seconds), ", over the ",
                    policy.preempt_checkpoint_budget_ms, " ms budget");
  }
  for (const auto& w : leaving) r->suspects.insert(w);
  r->preempting.clear();
  RequestRecoveryLocked(r, reason, "");
  return true;
}

bool JobManager::HandleGrowBackLocked(JobRecord* r) {
  if (r->extra || r->job.state() != tandem::v1::JOB_STATE_RUNNING || !r->recover_reason.empty()) return false;
  // A step boundary right after a training step, with a training step next.
  if (r->cursor.sub != 0 || r->cursor.unit < 1 || r->plan->KindOf(r->cursor.unit - 1) != UnitKind::kStep ||
      r->plan->KindOf(r->cursor.unit) != UnitKind::kStep) {
    return false;
  }
  const auto& spec = r->job.spec();
  const int full = std::max(1, spec.cluster().workers());
  const int current = r->job.worker_ids_size();
  if (current >= full || spec.placement().mode() == "disaggregated") return false;
  int idle = 0;
  for (const auto& w : membership_->Idle()) idle += w.device() == spec.cluster().device() ? 1 : 0;
  const bool degraded = r->job.recovery().degraded_logical_world() > 0;
  // A degraded job's shares are re-split only to the full size.
  if (idle == 0 || (degraded && current + idle < full)) return false;
  const int64_t step = r->job.step();
  int64_t newest = -1;
  auto records = store_->ListCheckpoints(r->job.id());
  if (records.ok()) {
    const auto& bad_list = r->job.recovery().bad_checkpoints();
    auto usable = ChooseCheckpoint(*records, std::set<std::string>(bad_list.begin(), bad_list.end()));
    if (usable) newest = usable->step();
  }
  if (newest < step) {
    // The state must be on disk first: the new world restores (reshards) it.
    const int every = spec.checkpoint().every();
    const bool planned_checkpoint = every > 0 && step % every == 0;
    if (!planned_checkpoint && r->grow_checkpoint_step != step) {
      r->grow_checkpoint_step = step;
      r->extra = PlannedPhase{tandem::v1::PHASE_CHECKPOINT, step};
      EventLocked(r, "checkpoint", absl::StrCat("checkpoint of step ", step, " before growing back to ",
                                                std::min(full, current + idle), " of ", full, " ranks"));
      return false;  // the driver issues it now
    }
    if (r->grow_flush_step != step) {
      r->grow_flush_step = step;
      r->extra = PlannedPhase{tandem::v1::PHASE_FLUSH_CHECKPOINTS, step};
      return false;
    }
    return false;  // flushed and still not recorded: the write failed; try after the next step
  }
  r->grow_target = std::min(full, current + idle);
  r->recover_reason = absl::StrCat("growing back from ", current, " to ", r->grow_target, " of ", full,
                                   " ranks (idle workers available)");
  r->recover_requested_at = clock_->WallSeconds();
  r->grow_back = true;
  spdlog::info("job {}: {}", r->job.id(), r->recover_reason);
  return true;
}

bool JobManager::RecoverDegradedLocked(JobRecord* r, const std::vector<std::string>& old_ids,
                                       const std::set<std::string>& survivors) {
  if (survivors.empty()) return false;
  auto* rec = r->job.mutable_recovery();
  const int logical_world =
      rec->degraded_logical_world() > 0 ? rec->degraded_logical_world() : static_cast<int>(old_ids.size());
  std::vector<int> surviving_ranks;
  std::vector<std::string> ids;
  for (size_t i = 0; i < old_ids.size(); ++i) {
    if (!survivors.count(old_ids[i])) continue;
    surviving_ranks.push_back(static_cast<int>(i));
    ids.push_back(old_ids[i]);
  }
  const std::vector<int> old_begin(rec->logical_begin().begin(), rec->logical_begin().end());
  const std::vector<int> old_own(rec->logical_own().begin(), rec->logical_own().end());
  const LogicalShares shares =
      DegradedShares(rec->degraded_logical_world() > 0 ? old_begin : std::vector<int>{},
                     rec->degraded_logical_world() > 0 ? old_own : std::vector<int>{}, surviving_ranks,
                     static_cast<int>(old_ids.size()));
  if (absl::Status s = membership_->Reassign(r->job.id(), ids); !s.ok()) {
    spdlog::info("job {}: degraded reassign: {} (normal recovery instead)", r->job.id(), s.ToString());
    return false;
  }
  std::vector<std::string> leaving;
  for (const auto& id : old_ids) {
    if (!survivors.count(id)) leaving.push_back(id);
  }
  membership_->Release(r->job.id(), leaving);
  if (rec->detect_seconds() == 0) {
    double detect = 0;
    for (const auto& id : leaving) {
      auto info = membership_->Get(id);
      if (info.ok() && info->last_heartbeat() > 0) detect = std::max(detect, rec->started_at() - info->last_heartbeat());
    }
    rec->set_detect_seconds(std::max(0.0, detect));
  }
  const bool was_degraded = rec->degraded_logical_world() > 0;
  rec->set_degraded_logical_world(logical_world);
  rec->clear_logical_begin();
  rec->clear_logical_own();
  for (size_t i = 0; i < shares.begin.size(); ++i) {
    rec->add_logical_begin(shares.begin[i]);
    rec->add_logical_own(shares.own[i]);
  }
  if (!was_degraded) rec->set_degraded_since_step(r->job.step() + 1);
  // Restore source: the live state (no rollback), else disk, else scratch.
  std::string source;
  rec->set_peer_restore_step(0);
  rec->clear_peer_restore_ranks();
  rec->set_restore_from("");
  if (!rec->live_failed() && rec->has_last_trained()) {
    rec->set_live_restore(true);
    source = absl::StrCat("the survivors' live state of step ", rec->last_trained_step(), " (no rollback)");
  } else {
    rec->set_live_restore(false);
    std::set<std::string> bad(rec->bad_checkpoints().begin(), rec->bad_checkpoints().end());
    std::optional<tandem::v1::CheckpointRecord> disk;
    auto records = store_->ListCheckpoints(r->job.id());
    if (records.ok()) disk = ChooseCheckpoint(*records, bad);
    if (disk) {
      rec->set_restore_from(disk->path());
      source = absl::StrCat("step ", disk->step(), " from disk ", disk->path());
    } else if (!r->job.spec().resume_from().empty() && !bad.count(r->job.spec().resume_from())) {
      rec->set_restore_from(r->job.spec().resume_from());
      source = absl::StrCat("disk ", r->job.spec().resume_from());
    } else {
      source = "from scratch (no training step completed yet)";
    }
  }
  rec->set_peer_copy_step(0);
  rec->set_peer_copy_world(0);
  r->job.clear_worker_ids();
  for (const auto& id : ids) r->job.add_worker_ids(id);
  r->cursor = {};
  r->suspects.clear();
  for (const auto& id : leaving) r->preempting.erase(id);
  PersistLocked(*r);
  std::vector<std::string> blocks;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int end = i + 1 < shares.begin.size() ? shares.begin[i + 1] : logical_world;
    blocks.push_back(absl::StrCat("rank ", i, " (", ids[i], ") shares ", shares.begin[i], "-", end - 1));
  }
  EventLocked(r, "recovery",
              absl::StrCat("degraded: generation ", r->job.generation(), " continues on ", ids.size(), " of ",
                           logical_world, " ranks without waiting (", absl::StrJoin(blocks, ", "),
                           r->job.spec().recovery().degraded_cheap_backward()
                               ? "; cheap backward (no attention backward, MLP recomputed) for taken-over shares"
                               : "",
                           r->job.spec().recovery().degraded_low_rank() > 0
                               ? absl::StrCat("; rank-", r->job.spec().recovery().degraded_low_rank(),
                                              " MLP weight gradients for taken-over shares")
                               : "",
                           "); restoring ", source));
  return true;
}

void JobManager::RecoverLocked(JobRecord* r) {
  const RecoveryPolicy policy = EffectiveRecoveryPolicy(config_, r->job.spec());
  auto* rec = r->job.mutable_recovery();
  const std::string reason = r->recover_reason;
  r->recover_reason.clear();
  const bool grow = r->grow_back;
  r->grow_back = false;
  if (rec->recoveries() >= policy.max_recoveries) {
    r->fail_reason = absl::StrCat(reason, " (giving up after ", rec->recoveries(), " recoveries)");
    return;
  }
  const bool continuing = rec->started_at() > 0;  // a previous attempt of this recovery failed
  if (!continuing) {
    rec->set_started_at(r->recover_requested_at > 0 ? r->recover_requested_at : clock_->WallSeconds());
    rec->set_steps_before(r->job.step());
    rec->set_peer_failed(false);
    rec->set_live_failed(false);
    rec->set_wait_seconds(0);
  }
  rec->set_recoveries(rec->recoveries() + 1);
  rec->set_reason(reason);
  const std::vector<std::string> old_ids(r->job.worker_ids().begin(), r->job.worker_ids().end());
  std::map<std::string, std::string> old_names;
  for (const auto& id : old_ids) {
    auto info = membership_->Get(id);
    if (info.ok()) old_names[id] = info->name();
  }
  // The old generation ends: communicators aborted, rendezvous scope dropped.
  for (const auto& id : old_ids) {
    tandem::v1::WorkerCommand abort;
    abort.set_abort_job(r->job.id());
    membership_->Send(id, abort).IgnoreError();
  }
  kv_->DropJob(r->job.id());
  // Ranks that finished the training phase in flight before the failure hold
  // the state after it: a degraded recovery keeps that when every survivor did.
  std::set<std::string> finished_inflight;
  std::optional<PlannedPhase> inflight_training;
  if (r->inflight && !r->extra &&
      (r->inflight->phase() == tandem::v1::PHASE_SFT_STEP || r->inflight->phase() == tandem::v1::PHASE_UPDATE)) {
    inflight_training = PlannedPhase{r->inflight->phase(), r->inflight->step()};
    for (const auto& [rank, rep] : r->reports) {
      if (rep.ok() && rank < static_cast<int>(old_ids.size())) finished_inflight.insert(old_ids[rank]);
    }
  }
  const PhaseCursor inflight_cursor = r->cursor;
  r->inflight.reset();
  r->reports.clear();
  r->extra.reset();
  const int64_t old_generation = r->job.generation();
  r->job.set_generation(old_generation + 1);
  r->job.set_state(tandem::v1::JOB_STATE_RECOVERING);
  r->job.set_reason(reason);
  PersistLocked(*r);
  EventLocked(r, "recovery", absl::StrCat("recovering (generation ", old_generation, " -> ", r->job.generation(),
                                          ", attempt ", rec->recoveries(), "): ", reason));

  // Wait for the survivors and replacements. A short settle first: a killed
  // worker's stream and lease end a moment after its peers see the error.
  const absl::Time wait_start = absl::Now();
  const absl::Time deadline = wait_start + absl::Milliseconds(policy.replacement_timeout_ms);
  const int full = std::max(1, r->job.spec().cluster().workers());
  r->choosing_members = true;
  auto stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || r->cancel_requested; };
  mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(std::min<int64_t>(300, config_.lease_ms())));
  std::optional<RankPlan> plan;
  std::set<std::string> survivors;
  auto alive_members = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::set<std::string> alive;
    for (const auto& id : old_ids) {
      if (!r->suspects.count(id) && membership_->InJobAndAlive(id, r->job.id())) alive.insert(id);
    }
    return alive;
  };
  auto idle_candidates = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Candidate> idle;
    for (const auto& w : membership_->Idle()) {
      if (w.device() == r->job.spec().cluster().device()) idle.push_back({w.id(), w.name()});
    }
    return idle;
  };
  bool planned = false;
  if (grow) {
    // A planned grow back: the idle workers are there now, or it is off.
    survivors = alive_members();
    plan = PlanRanks(old_ids, old_names, survivors, idle_candidates(), r->grow_target);
    if (plan && membership_->Reassign(r->job.id(), plan->worker_ids).ok()) {
      planned = true;
    } else {
      plan.reset();
      EventLocked(r, "recovery", "grow back called off: the idle workers are gone");
    }
  }
  if (!planned && policy.degraded) {
    if (stop()) {
      r->choosing_members = false;
      return;
    }
    survivors = alive_members();
    rec->set_has_inflight_trained(false);
    if (inflight_training && !survivors.empty()) {
      const PhaseCursor next = r->plan->Next(inflight_cursor);
      if (absl::c_all_of(survivors, [&](const std::string& id) { return finished_inflight.count(id) > 0; })) {
        rec->set_has_last_trained(true);
        rec->set_last_trained_step(inflight_training->step);
        rec->set_last_trained_next_unit(next.unit);
        rec->set_last_trained_next_sub(next.sub);
      } else {
        // A rank may have finished the step although its report says it
        // failed (a collective after the optimizer step broke): SETUP
        // accepts the in-flight step when every survivor holds it.
        rec->set_has_inflight_trained(true);
        rec->set_inflight_trained_step(inflight_training->step);
        rec->set_inflight_next_unit(next.unit);
        rec->set_inflight_next_sub(next.sub);
      }
    }
    if (RecoverDegradedLocked(r, old_ids, survivors)) {
      r->choosing_members = false;
      rec->set_wait_seconds(rec->wait_seconds() + absl::ToDoubleSeconds(absl::Now() - wait_start));
      return;
    }
  }
  bool reported_wait = false;
  while (!planned) {
    if (stop()) {
      r->choosing_members = false;
      return;
    }
    survivors = alive_members();
    const std::vector<Candidate> idle = idle_candidates();
    plan = PlanRanks(old_ids, old_names, survivors, idle, full);
    if (!plan && absl::Now() >= deadline) {
      const int have = static_cast<int>(survivors.size() + idle.size());
      if (policy.min_workers < full && have >= policy.min_workers && have >= 1) {
        plan = PlanRanks(old_ids, old_names, survivors, idle, have);
      }
      if (!plan) {
        r->choosing_members = false;
        r->fail_reason = absl::StrCat(reason, "; no replacement worker within ",
                                      absl::FormatDuration(absl::Milliseconds(policy.replacement_timeout_ms)), " (",
                                      survivors.size(), " of ", full, " workers left, ", idle.size(), " idle",
                                      policy.min_workers < full ? absl::StrCat(", min_workers ", policy.min_workers) : "",
                                      ")");
        return;
      }
    }
    if (plan) {
      absl::Status s = membership_->Reassign(r->job.id(), plan->worker_ids);
      if (s.ok()) break;
      spdlog::info("job {}: reassign: {} (retrying)", r->job.id(), s.ToString());
      plan.reset();
    } else if (!reported_wait) {
      reported_wait = true;
      EventLocked(r, "recovery", absl::StrCat("waiting up to ",
                                              absl::FormatDuration(absl::Milliseconds(policy.replacement_timeout_ms)),
                                              " for ", full - static_cast<int>(survivors.size()),
                                              " replacement worker(s)"));
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(100));
  }
  r->choosing_members = false;
  std::vector<std::string> leaving;
  for (const auto& id : old_ids) {
    if (std::find(plan->worker_ids.begin(), plan->worker_ids.end(), id) == plan->worker_ids.end()) {
      leaving.push_back(id);
    }
  }
  membership_->Release(r->job.id(), leaving);
  // Detection: the lost workers' last sign of life -> the request.
  if (!continuing) {
    double detect = 0;
    for (const auto& id : old_ids) {
      if (survivors.count(id)) continue;
      auto info = membership_->Get(id);
      if (info.ok() && info->last_heartbeat() > 0) detect = std::max(detect, rec->started_at() - info->last_heartbeat());
    }
    rec->set_detect_seconds(std::max(0.0, detect));
  }
  rec->set_wait_seconds(rec->wait_seconds() + absl::ToDoubleSeconds(absl::Now() - wait_start));

  // Restore source: peer memory, else the newest good disk checkpoint, else
  // the job's resume_from, else scratch.
  std::set<std::string> bad(rec->bad_checkpoints().begin(), rec->bad_checkpoints().end());
  std::optional<tandem::v1::CheckpointRecord> disk;
  auto records = store_->ListCheckpoints(r->job.id());
  if (records.ok()) disk = ChooseCheckpoint(*records, bad);
  std::string restore_from;
  int64_t disk_step = -1;
  if (disk) {
    restore_from = disk->path();
    disk_step = disk->step();
  } else if (!r->job.spec().resume_from().empty() && !bad.count(r->job.spec().resume_from())) {
    restore_from = r->job.spec().resume_from();
  }
  const bool peer = policy.peer_copies && !rec->peer_failed() &&
                    PeerRestorePossible(*plan, static_cast<int>(old_ids.size()), rec->peer_copy_step(),
                                        rec->peer_copy_world()) &&
                    rec->peer_copy_step() >= disk_step;
  rec->set_restore_from(restore_from);
  rec->clear_peer_restore_ranks();
  rec->set_peer_restore_step(peer ? rec->peer_copy_step() : 0);
  if (peer) {
    for (int pr : plan->replaced_ranks) rec->add_peer_restore_ranks(pr);
  }
  // A normal recovery ends degraded mode: every rank computes its own share.
  const bool was_degraded = rec->degraded_logical_world() > 0;
  rec->set_degraded_logical_world(0);
  rec->clear_logical_begin();
  rec->clear_logical_own();
  rec->set_live_restore(false);
  if (grow) rec->set_grow_backs(rec->grow_backs() + 1);
  // The new generation holds no complete set of copies until its next
  // checkpoint (a replacement holds none).
  const int64_t peer_step = rec->peer_copy_step();
  rec->set_peer_copy_step(0);
  rec->set_peer_copy_world(0);
  r->job.clear_worker_ids();
  for (const auto& id : plan->worker_ids) r->job.add_worker_ids(id);
  r->cursor = {};
  r->suspects.clear();
  for (const auto& id : leaving) r->preempting.erase(id);
  PersistLocked(*r);
  std::string source = peer ? absl::StrCat("step ", peer_step, " from peer memory")
                       : !restore_from.empty()
                           ? absl::StrCat(disk_step >= 0 ? absl::StrCat("step ", disk_step, " from ") : "", "disk ",
                                          restore_from)
                           : std::string("from scratch (no checkpoint)");
  std::vector<std::string> replaced;
  for (int pr : plan->replaced_ranks) {
    replaced.push_back(absl::StrCat("rank ", pr, " -> ", plan->worker_ids[pr]));
  }
  EventLocked(r, "recovery",
              absl::StrCat(grow ? absl::StrCat("growing back to ", plan->worker_ids.size(), " of ", full, " ranks",
                                               was_degraded ? " (degraded mode ends)" : "", ": ")
                                : "",
                           "generation ", r->job.generation(), " on ", absl::StrJoin(plan->worker_ids, ", "),
                           plan->same_world || static_cast<int>(plan->worker_ids.size()) >= full
                               ? ""
                               : absl::StrCat(" (elastic: ", plan->worker_ids.size(), " of ", full, " ranks)"),
                           replaced.empty() ? "" : absl::StrCat(" (", absl::StrJoin(replaced, ", "), ")"),
                           "; restoring ", source));
}

void JobManager::CompletePhaseLocked(JobRecord* r, const PlannedPhase& phase) {
  const double wall = absl::ToDoubleSeconds(absl::Now() - r->inflight_started);
  if (phase.phase == tandem::v1::PHASE_CHECKPOINT) {
    r->last_checkpoint_seconds = wall;
    // Every rank keeps its neighbour's shard in memory (worker/engine/peer_snapshot.h).
    bool all_copied = r->reports.size() > 1;
    for (const auto& [rank, rep] : r->reports) all_copied = all_copied && rep.checkpoint().peer_copy();
    if (all_copied) {
      r->job.mutable_recovery()->set_peer_copy_step(phase.step);
      r->job.mutable_recovery()->set_peer_copy_world(r->job.worker_ids_size());
    }
  }
  if (r->extra) {  // an unplanned phase: the cursor stays
    r->extra.reset();
    r->inflight.reset();
    r->reports.clear();
    PersistLocked(*r);
    return;
  }
  const int64_t unit = r->cursor.unit;
  if (r->plan->KindOf(unit) == UnitKind::kSetup) {
    CompleteSetupLocked(r, wall);
    return;
  }
  if (r->acc_unit != unit) {
    r->step_acc.Clear();
    r->acc_unit = unit;
  }
  StepMetrics& acc = r->step_acc;
  const auto& rank0 = r->reports.at(0);
  MergeMetrics(&acc, rank0.metrics());
  const std::string name = PhaseName(phase.phase);
  double worker_max = 0;
  int64_t peak = 0;
  for (const auto& [rank, rep] : r->reports) {
    worker_max = std::max(worker_max, rep.seconds());
    peak = std::max({peak, rep.peak_memory_bytes(), rep.metrics().peak_memory_bytes()});
  }
  (*acc.mutable_phase_seconds())[name] += wall;
  (*acc.mutable_extra())[absl::StrCat(name, "_worker_seconds")] = worker_max;
  (*acc.mutable_extra())[absl::StrCat(name, "_peak_memory_bytes")] = static_cast<double>(peak);
  acc.set_peak_memory_bytes(std::max(acc.peak_memory_bytes(), peak));
  const bool held = WarmStartHeld(rank0.metrics());
  const std::string probe = TeacherForcedExact(rank0.metrics());
  r->inflight.reset();
  r->reports.clear();  // rank0 is gone from here on
  PhaseCursor next = r->plan->Next(r->cursor);
  const UnitKind kind = r->plan->KindOf(unit);
  if (kind == UnitKind::kWarmup && held && next.unit <= r->plan->AfterWarmStart().unit) {
    // The warm start reached its skill level (init.sft.stop_accuracy): the
    // model no longer changes, so the remaining steps would only re-check it.
    const int64_t done = -phase.step;
    EventLocked(r, "warm_start",
                absl::StrCat("warm start reached init.sft.stop_accuracy ", r->job.spec().init().sft_stop_accuracy(),
                             " at step ", done, "/", r->job.spec().init().sft_steps(),
                             " (teacher-forced exact ", probe,
                             "); skipping the remaining ", r->job.spec().init().sft_steps() - done));
    next = r->plan->AfterWarmStart();
  }
  r->cursor = next;
  if (phase.phase == tandem::v1::PHASE_SFT_STEP || phase.phase == tandem::v1::PHASE_UPDATE) {
    // What a degraded recovery keeps: every rank has finished this step.
    auto* rec = r->job.mutable_recovery();
    rec->set_has_last_trained(true);
    rec->set_last_trained_step(phase.step);
    rec->set_last_trained_next_unit(next.unit);
    rec->set_last_trained_next_sub(next.sub);
  }
  const bool unit_done = next.unit != unit;
  if (unit_done && (kind == UnitKind::kStep || kind == UnitKind::kWarmup || kind == UnitKind::kBaseline)) {
    acc.set_step(r->plan->StepOf(unit));
    acc.set_wall_time(clock_->WallSeconds());
    if (kind == UnitKind::kWarmup) (*acc.mutable_extra())["warmup"] = 1;
    if (kind == UnitKind::kBaseline) (*acc.mutable_extra())["baseline"] = 1;
    *r->job.mutable_latest() = acc;
    if (kind == UnitKind::kStep) r->job.set_step(acc.step());
    PersistLocked(*r);
    std::string summary = kind == UnitKind::kWarmup ? absl::StrCat("warm-start step ", -acc.step(), "/",
                                                                   r->job.spec().init().sft_steps())
                          : kind == UnitKind::kBaseline ? std::string("baseline evaluation")
                                                        : StepSummary(acc, r->job.total_steps());
    EventLocked(r, "step", summary, &acc);
  } else {
    PersistLocked(*r);
  }
}

void JobManager::CompleteSetupLocked(JobRecord* r, double wall) {
  // Where the plan continues: after the restored checkpoint's step.
  int64_t restored = -1, skipped = 0;
  double restore_s = 0;
  int source = tandem::v1::RESTORE_SOURCE_UNSPECIFIED;
  for (const auto& [rank, rep] : r->reports) {
    const tandem::v1::SetupResult& setup = rep.setup();
    if (rank == 0 && setup.restored()) restored = setup.restored_step();
    restore_s = std::max(restore_s, setup.restore_seconds());
    source = std::max<int>(source, setup.restore_source());
    skipped = std::max(skipped, setup.checkpoints_skipped());
  }
  r->inflight.reset();
  r->reports.clear();
  auto* rec = r->job.mutable_recovery();
  r->cursor = r->plan->Next(r->cursor);
  const bool live = rec->live_restore() && rec->has_last_trained();
  const bool live_inflight = live && rec->has_inflight_trained() && restored == rec->inflight_trained_step();
  const int64_t restored_step = live_inflight ? rec->inflight_trained_step()
                                : live        ? rec->last_trained_step()
                                : restored >= 0 ? restored
                                                : -1;
  if (live) {
    // The survivors kept the state after this training phase: continue
    // right after it (a warm-start step's number is negative).
    r->cursor = live_inflight ? PhaseCursor{rec->inflight_next_unit(), rec->inflight_next_sub()}
                              : PhaseCursor{rec->last_trained_next_unit(), rec->last_trained_next_sub()};
    rec->set_has_last_trained(true);
    rec->set_last_trained_step(restored_step);
    rec->set_last_trained_next_unit(r->cursor.unit);
    rec->set_last_trained_next_sub(r->cursor.sub);
    if (restored_step >= 1) r->job.set_step(std::max(r->job.step(), restored_step));
  } else if (restored_step >= 0) {
    r->cursor = {r->plan->UnitOfStep(restored_step + 1), 0};
    r->job.set_step(restored_step);
    rec->set_has_last_trained(restored_step >= 1);
    rec->set_last_trained_step(restored_step);
    rec->set_last_trained_next_unit(r->cursor.unit);
    rec->set_last_trained_next_sub(0);
  } else {
    rec->set_has_last_trained(false);
  }
  const bool from_peer = source == tandem::v1::RESTORE_SOURCE_PEER;
  const char* from = live ? "live memory" : from_peer ? "peer memory" : restored_step >= 0 ? "disk" : "scratch";
  if (skipped > 0) {
    EventLocked(r, "recovery", absl::StrCat(skipped, " newer checkpoint(s) failed verification; used step ",
                                            restored_step));
  }
  if (rec->started_at() > 0) {
    const double total = clock_->WallSeconds() - rec->started_at();
    const double rendezvous = std::max(0.0, wall - restore_s);
    const int64_t redone =
        live ? 0 : std::max<int64_t>(0, rec->steps_before() - std::max<int64_t>(0, restored_step));
    StepMetrics m;
    m.set_step(std::max<int64_t>(0, restored_step));
    m.set_wall_time(clock_->WallSeconds());
    auto& x = *m.mutable_extra();
    x["recovery_seconds"] = total;
    x["detect_seconds"] = rec->detect_seconds();
    x["wait_seconds"] = rec->wait_seconds();
    x["rendezvous_seconds"] = rendezvous;
    x["restore_seconds"] = restore_s;
    x["restore_source"] = live                ? tandem::v1::RESTORE_SOURCE_LIVE
                          : from_peer         ? tandem::v1::RESTORE_SOURCE_PEER
                          : restored_step >= 0 ? tandem::v1::RESTORE_SOURCE_DISK
                                              : tandem::v1::RESTORE_SOURCE_UNSPECIFIED;
    x["degraded"] = rec->degraded_logical_world() > 0 ? 1 : 0;
    x["steps_redone"] = static_cast<double>(redone);
    x["world_size"] = r->job.worker_ids_size();
    x["generation"] = static_cast<double>(r->job.generation());
    rec->set_steps_redone_total(rec->steps_redone_total() + redone);
    rec->set_started_at(0);
    rec->set_restore_from("");
    rec->set_peer_restore_step(0);
    rec->clear_peer_restore_ranks();
    rec->set_peer_failed(false);
    rec->set_live_restore(false);
    rec->set_live_failed(false);
    rec->set_has_inflight_trained(false);
    r->job.set_state(tandem::v1::JOB_STATE_RUNNING);
    r->job.set_reason("");
    PersistLocked(*r);
    EventLocked(r, "recovery",
                absl::StrFormat("recovered in %.2f s: detect %.2f s, wait %.2f s, rendezvous %.2f s, restore %.2f s "
                                "from %s; resuming at step %d (%d step%s redone)",
                                total, rec->detect_seconds(), rec->wait_seconds(), rendezvous, restore_s, from,
                                std::max<int64_t>(0, restored_step) + 1, redone, redone == 1 ? "" : "s"),
                &m);
    EventLocked(r, "state", "job running");
    return;
  }
  PersistLocked(*r);
  EventLocked(r, "state", restored_step >= 0 ? absl::StrFormat("setup done on every worker; resumed from step %d "
                                                               "(%s), continuing at step %d",
                                                               restored_step, from, restored_step + 1)
                                             : std::string("setup done on every worker"));
}

void JobManager::PruneFinishedLocked() {
  std::vector<JobRecord*> finished;
  for (auto& [id, r] : jobs_) {
    if (IsTerminal(r->job.state()) && (!r->runner.joinable() || r->runner_done)) finished.push_back(r.get());
  }
  std::sort(finished.begin(), finished.end(), [](const JobRecord* a, const JobRecord* b) {
    return a->job.finished_at() != b->job.finished_at() ? a->job.finished_at() > b->job.finished_at() : a->seq > b->seq;
  });
  const double oldest = clock_->WallSeconds() - static_cast<double>(config_.finished_job_retention_s());
  const size_t keep = config_.max_finished_jobs() > 0 ? static_cast<size_t>(config_.max_finished_jobs()) : SIZE_MAX;
  int pruned = 0;
  for (size_t i = 0; i < finished.size(); ++i) {
    JobRecord* r = finished[i];
    const bool too_old = config_.finished_job_retention_s() > 0 && r->job.finished_at() > 0 && r->job.finished_at() < oldest;
    if (i < keep && !too_old) continue;
    absl::Status s = store_->DeleteJob(r->job.id());
    NoteStoreWrite(s);
    if (!s.ok()) {
      spdlog::error("prune job {}: {}", r->job.id(), s.ToString());
      return;
    }
    if (r->runner.joinable()) r->runner.join();
    jobs_.erase(r->job.id());
    ++pruned;
  }
  if (pruned > 0) spdlog::info("retention: deleted {} finished job(s) from the state store", pruned);
}

void JobManager::SchedulerLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || schedule_requested_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(250));
      if (stopping_) return;
      schedule_requested_ = false;
      for (auto& [id, r] : jobs_) {
        if (r->runner_done && r->runner.joinable()) r->runner.join();
      }
      if (clock_->WallSeconds() - last_prune_ >= kPruneEverySeconds) {
        last_prune_ = clock_->WallSeconds();
        PruneFinishedLocked();
      }
    }
    ScheduleOnce();
  }
}

void JobManager::ScheduleOnce() {
  std::vector<PendingJob> pending;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : jobs_) {
      if (r->job.state() != tandem::v1::JOB_STATE_PENDING) continue;
      pending.push_back({id, r->job.spec().priority(), r->seq, r->job.spec().cluster().device(),
                         r->job.spec().cluster().workers()});
    }
  }
  if (pending.empty()) return;
  ScheduleResult result = Schedule(pending, membership_->Idle());
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  for (const auto& d : result.start) {
    JobRecord* r = FindLocked(d.job_id);
    if (r == nullptr || r->job.state() != tandem::v1::JOB_STATE_PENDING) continue;
    absl::Status s = membership_->Assign(d.job_id, d.worker_ids);
    if (!s.ok()) {
      schedule_requested_ = true;
      continue;
    }
    r->job.set_state(tandem::v1::JOB_STATE_RUNNING);
    r->job.set_reason("");
    r->job.set_generation(r->job.generation() + 1);
    r->job.clear_worker_ids();
    for (const auto& w : d.worker_ids) r->job.add_worker_ids(w);
    r->job.set_started_at(clock_->WallSeconds());
    r->cursor = {};
    r->fail_reason.clear();
    PersistLocked(*r);
    EventLocked(r, "state", absl::StrCat("running on ", absl::StrJoin(d.worker_ids, ", "), " (generation ",
                                         r->job.generation(), ")"));
    StartRunnerLocked(r);
  }
  for (const auto& [id, reason] : result.reasons) {
    JobRecord* r = FindLocked(id);
    if (r == nullptr || r->job.state() != tandem::v1::JOB_STATE_PENDING || r->job.reason() == reason) continue;
    r->job.set_reason(reason);
    PersistLocked(*r);
  }
}

}  // namespace tandem::server
