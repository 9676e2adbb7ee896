#include "server/jobs/job_manager.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "common/status_util.h"
#include "server/jobs/job_limits.h"
#include "server/scheduler/scheduler.h"
#include "spdlog/spdlog.h"
#include "worker/model/job_model.h"

namespace tandem::server {

using tandem::v1::Job;
using tandem::v1::JobState;

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
  const DriverServices services{&config_, store_, membership_, kv_, clock_, this};
  std::vector<std::shared_ptr<JobDriver>> drivers;
  for (auto& s : stored) {
    auto d = std::make_shared<JobDriver>(services, std::move(s));
    RETURN_IF_ERROR(d->LoadCounters());
    d->QuarantineIfInvalid();
    drivers.push_back(std::move(d));
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& d : drivers) jobs_[d->id()] = d;
  }
  PruneFinished();
  absl::MutexLock lock(&mu_);
  last_prune_ = clock_->WallSeconds();
  loaded_ = true;
  spdlog::info("loaded {} jobs from {}", jobs_.size(), store_->path());
  return absl::OkStatus();
}

void JobManager::Start() {
  for (auto& d : Drivers()) d->Resume();
  absl::MutexLock lock(&mu_);
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

void JobManager::Shutdown() {
  std::thread scheduler;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    scheduler = std::move(scheduler_);
  }
  if (scheduler.joinable()) scheduler.join();
  for (auto& d : Drivers()) d->Stop();
}

std::shared_ptr<JobDriver> JobManager::Find(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<JobDriver>> JobManager::FindOrNotFound(const std::string& job_id) const {
  std::shared_ptr<JobDriver> d = Find(job_id);
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return d;
}

std::vector<std::shared_ptr<JobDriver>> JobManager::Drivers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<JobDriver>> out;
  out.reserve(jobs_.size());
  for (const auto& [id, d] : jobs_) out.push_back(d);
  return out;
}

void JobManager::RequestSchedule() {
  absl::MutexLock lock(&mu_);
  schedule_requested_ = true;
}

void JobManager::NotifyScheduler() { RequestSchedule(); }

void JobManager::NoteStoreWrite(const absl::Status& s) {
  absl::MutexLock lock(&store_mu_);
  store_error_ = s.ok() ? "" : std::string(s.message());
}

std::string JobManager::StoreError() const {
  absl::MutexLock lock(&store_mu_);
  return store_error_;
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
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("coordinator is shutting down");
  }
  auto next = store_->NextJobSeq();
  if (!next.ok()) {
    NoteStoreWrite(next.status());
    return absl::UnavailableError(absl::StrCat("the job was not accepted: ", next.status().message()));
  }
  const int64_t seq = *next;
  Job job;
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
  const DriverServices services{&config_, store_, membership_, kv_, clock_, this};
  auto d = std::make_shared<JobDriver>(services, std::move(job), seq);
  // Persisted (under the new driver's lock only) before anyone can see it.
  RETURN_IF_ERROR(
      d->PersistNew(absl::StrCat("submitted ", common::KindName(spec.kind()), " job '", spec.name(), "' (",
                                 spec.cluster().workers(), " ", common::DeviceName(spec.cluster().device()), " worker",
                                 spec.cluster().workers() == 1 ? "" : "s", ", ", spec.train().steps(), " steps)")));
  {
    absl::MutexLock lock(&mu_);
    jobs_[d->id()] = d;
    schedule_requested_ = true;
  }
  return d->Record();
}

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) const {
  ASSIGN_OR_RETURN(auto d, FindOrNotFound(job_id));
  return d->Record();
}

std::vector<Job> JobManager::List(JobState filter, int limit) const {
  std::vector<std::pair<int64_t, Job>> jobs;  // (seq, job)
  for (const auto& d : Drivers()) {
    Job job = d->Record();
    if (filter == tandem::v1::JOB_STATE_UNSPECIFIED || job.state() == filter)
      jobs.emplace_back(d->seq(), std::move(job));
  }
  std::sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });  // newest first
  std::vector<Job> out;
  for (auto& [seq, job] : jobs) {
    if (static_cast<int>(out.size()) >= limit) break;
    out.push_back(std::move(job));
  }
  return out;
}

std::vector<Job> JobManager::Snapshot() const {
  std::vector<Job> out;
  for (const auto& d : Drivers()) out.push_back(d->Record());
  return out;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  ASSIGN_OR_RETURN(auto d, FindOrNotFound(job_id));
  return d->Cancel(reason);
}

absl::StatusOr<int64_t> JobManager::LastEventSeq(const std::string& job_id) const {
  ASSIGN_OR_RETURN(auto d, FindOrNotFound(job_id));
  return d->LastEventSeq();
}

absl::Status JobManager::NextEvents(const std::string& job_id, int64_t after_seq, int64_t wait_ms,
                                    std::vector<StoredEvent>* out, bool* finished) {
  ASSIGN_OR_RETURN(auto d, FindOrNotFound(job_id));
  int64_t last = 0;
  bool terminal = false;
  d->AwaitEvent(after_seq, absl::Milliseconds(wait_ms), &last, &terminal);
  ASSIGN_OR_RETURN(*out, store_->ListEvents(job_id, after_seq, 256));
  int64_t got = out->empty() ? after_seq : out->back().seq;
  *finished = terminal && got >= last;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<tandem::v1::LogLine>> JobManager::Logs(const std::string& job_id, int64_t after_seq,
                                                                  int limit) const {
  RETURN_IF_ERROR(FindOrNotFound(job_id).status());
  return store_->ListLogs(job_id, after_seq, limit);
}

absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> JobManager::Checkpoints(const std::string& job_id) const {
  RETURN_IF_ERROR(FindOrNotFound(job_id).status());
  return store_->ListCheckpoints(job_id);
}

absl::Status JobManager::OnReport(const tandem::v1::ReportPhaseRequest& report) {
  ASSIGN_OR_RETURN(auto d, FindOrNotFound(report.job_id()));
  return d->OnReport(report);
}

void JobManager::OnWorkerLost(const LostWorker& lost) {
  if (lost.job_id.empty()) return;
  if (auto d = Find(lost.job_id)) d->OnWorkerLost(lost);
}

void JobManager::OnWorkerAttached(const std::string& worker_id) {
  for (auto& d : Drivers()) {
    if (d->HasMember(worker_id)) d->OnWorkerAttached(worker_id);
  }
}

void JobManager::OnWorkerPreempting(const std::string& worker_id, const std::string& job_id) {
  if (auto d = Find(job_id)) d->OnWorkerPreempting(worker_id);
}

int64_t JobManager::JobGenerationFor(const std::string& job_id, const std::string& worker_id) const {
  auto d = Find(job_id);
  return d == nullptr ? -1 : d->GenerationFor(worker_id);
}

bool JobManager::ScopeActive(const std::string& job_id, int64_t generation) const {
  auto d = Find(job_id);
  return d != nullptr && d->ScopeActive(generation);
}

void JobManager::PruneFinished() {
  struct Finished {
    std::shared_ptr<JobDriver> driver;
    double finished_at;
  };
  std::vector<Finished> finished;
  for (auto& d : Drivers()) {
    if (d->Finished()) finished.push_back({d, d->Record().finished_at()});
  }
  std::sort(finished.begin(), finished.end(), [](const Finished& a, const Finished& b) {
    return a.finished_at != b.finished_at ? a.finished_at > b.finished_at : a.driver->seq() > b.driver->seq();
  });
  const double oldest = clock_->WallSeconds() - static_cast<double>(config_.finished_job_retention_s());
  const size_t keep = config_.max_finished_jobs() > 0 ? static_cast<size_t>(config_.max_finished_jobs()) : SIZE_MAX;
  int pruned = 0;
  for (size_t i = 0; i < finished.size(); ++i) {
    const Finished& f = finished[i];
    const bool too_old = config_.finished_job_retention_s() > 0 && f.finished_at > 0 && f.finished_at < oldest;
    if (i < keep && !too_old) continue;
    // The SQLite delete runs with no lock of the job manager held.
    absl::Status s = store_->DeleteJob(f.driver->id());
    NoteStoreWrite(s);
    if (!s.ok()) {
      spdlog::error("prune job {}: {}", f.driver->id(), s.ToString());
      return;
    }
    f.driver->ReapThread();
    absl::MutexLock lock(&mu_);
    jobs_.erase(f.driver->id());
    ++pruned;
  }
  if (pruned > 0) spdlog::info("retention: deleted {} finished job(s) from the state store", pruned);
}

void JobManager::SchedulerLoop() {
  while (true) {
    bool prune = false;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || schedule_requested_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(250));
      if (stopping_) return;
      schedule_requested_ = false;
      if (clock_->WallSeconds() - last_prune_ >= kPruneEverySeconds) {
        last_prune_ = clock_->WallSeconds();
        prune = true;
      }
    }
    for (auto& d : Drivers()) d->ReapThread();
    if (prune) PruneFinished();
    ScheduleOnce();
  }
}

void JobManager::ScheduleOnce() {
  std::vector<PendingJob> pending;
  for (const auto& d : Drivers()) {
    Job job = d->Record();
    if (job.state() != tandem::v1::JOB_STATE_PENDING) continue;
    pending.push_back(
        {d->id(), job.spec().priority(), d->seq(), job.spec().cluster().device(), job.spec().cluster().workers()});
  }
  if (pending.empty()) return;
  ScheduleResult result = Schedule(pending, membership_->Idle());
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
  for (const auto& d : result.start) {
    auto driver = Find(d.job_id);
    if (driver == nullptr) continue;
    if (!driver->StartOn(d.worker_ids) && driver->State() == tandem::v1::JOB_STATE_PENDING) RequestSchedule();
  }
  for (const auto& [id, reason] : result.reasons) {
    if (auto driver = Find(id)) driver->SetPendingReason(reason);
  }
}

}  // namespace tandem::server
