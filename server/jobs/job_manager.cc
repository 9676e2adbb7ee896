#include "server/jobs/job_manager.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/status_util.h"
#include "server/jobs/job_limits.h"
#include "server/scheduler/scheduler.h"
#include "spdlog/spdlog.h"
#include "worker/model/job_model.h"

namespace tandem::server {

using tandem::v1::Job;
using tandem::v1::JobState;
using tandem::v1::StepMetrics;

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
  if (*seq % kPruneEventsEvery == 0 && *seq > kMaxEventsPerJob) {
    absl::Status pruned = store_->PruneEvents(r->job.id(), *seq - kMaxEventsPerJob);
    NoteStoreWrite(pruned);
    if (!pruned.ok()) spdlog::error("job {} events: {}", r->job.id(), pruned.ToString());
  }
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
