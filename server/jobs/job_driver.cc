// JobDriver: the job's record, its lifecycle (start, cancel, stop), events,
// logs, persistence and the job's end (job_driver.h).
#include "server/jobs/job_driver.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/status_util.h"
#include "server/jobs/job_limits.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

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

JobDriver::JobDriver(const DriverServices& services, tandem::v1::Job job, int64_t seq)
    : config_(*services.config),
      store_(services.store),
      membership_(services.membership),
      kv_(services.kv),
      clock_(services.clock),
      host_(services.host),
      id_(job.id()),
      seq_(seq) {
  absl::MutexLock lock(&mu_);
  job_ = std::move(job);
  plan_ = std::make_unique<PhasePlan>(job_.spec());
  PublishLocked();
}

JobDriver::JobDriver(const DriverServices& services, StoredJob stored)
    : config_(*services.config),
      store_(services.store),
      membership_(services.membership),
      kv_(services.kv),
      clock_(services.clock),
      host_(services.host),
      id_(stored.job.id()),
      seq_(stored.seq) {
  absl::MutexLock lock(&mu_);
  job_ = std::move(stored.job);
  state_ = std::move(stored.driver);
  cursor_ = {state_.cursor_unit(), state_.cursor_sub()};
  PublishLocked();
}

JobDriver::~JobDriver() { Stop(); }

absl::Status JobDriver::LoadCounters() {
  ASSIGN_OR_RETURN(int64_t last_event, store_->LastEventSeq(id_));
  // The per-job log cap counts what is stored, across restarts.
  ASSIGN_OR_RETURN(int64_t log_lines, store_->CountLogs(id_));
  absl::MutexLock lock(&mu_);
  last_event_seq_ = last_event;
  log_lines_ = log_lines;
  return absl::OkStatus();
}

void JobDriver::QuarantineIfInvalid() {
  absl::MutexLock lock(&mu_);
  // A stored job this coordinator cannot run (written by another version,
  // or damaged) fails with the reason instead of taking the coordinator
  // down on every start.
  const bool known_state = tandem::v1::JobState_IsValid(job_.state());
  absl::Status valid = known_state ? common::ValidateJobSpec(job_.spec())
                                   : absl::InvalidArgumentError(absl::StrCat("unknown state ", job_.state()));
  if (valid.ok() && cursor_.unit < 0) valid = absl::InvalidArgumentError("negative phase cursor");
  if (valid.ok()) {
    plan_ = std::make_unique<PhasePlan>(job_.spec());
    return;
  }
  tandem::v1::JobSpec defaults;
  common::ApplyJobDefaults(&defaults);
  plan_ = std::make_unique<PhasePlan>(defaults);
  if (known_state && IsTerminal(job_.state())) return;
  spdlog::error("job {}: quarantined: {}", id_, std::string(valid.message()));
  job_.clear_worker_ids();  // never sends it commands
  FinishLocked(
      tandem::v1::JOB_STATE_FAILED,
      absl::StrCat("quarantined when the coordinator started: its stored spec is not valid: ", valid.message()));
}

void JobDriver::Resume() {
  absl::MutexLock lock(&mu_);
  if (job_.state() != tandem::v1::JOB_STATE_RUNNING && job_.state() != tandem::v1::JOB_STATE_RECOVERING) return;
  EventLocked("state", "coordinator restarted: waiting for the job's workers to re-attach");
  StartThreadLocked();
}

absl::Status JobDriver::PersistNew(const std::string& submitted_message) {
  absl::MutexLock lock(&mu_);
  absl::Status s = PersistLocked();
  // Accepted only once durable: a restarted coordinator knows every job it
  // answered for.
  if (s.ok()) s = AwaitDurableLocked(write_ticket_);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("the job was not accepted: ", s.message()));
  EventLocked("state", submitted_message);
  return absl::OkStatus();
}

bool JobDriver::StartOn(const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || job_.state() != tandem::v1::JOB_STATE_PENDING) return false;
  if (!membership_->Assign(id_, worker_ids).ok()) return false;
  job_.set_state(tandem::v1::JOB_STATE_RUNNING);
  job_.set_reason("");
  job_.set_generation(job_.generation() + 1);
  job_.clear_worker_ids();
  for (const auto& w : worker_ids) job_.add_worker_ids(w);
  job_.set_started_at(clock_->WallSeconds());
  cursor_ = {};
  fail_reason_.clear();
  PersistLocked().IgnoreError();  // logged and noted; the job runs on
  EventLocked("state",
              absl::StrCat("running on ", absl::StrJoin(worker_ids, ", "), " (generation ", job_.generation(), ")"));
  StartThreadLocked();
  return true;
}

void JobDriver::SetPendingReason(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (job_.state() != tandem::v1::JOB_STATE_PENDING || job_.reason() == reason) return;
  job_.set_reason(reason);
  PersistLocked().IgnoreError();
}

absl::StatusOr<tandem::v1::Job> JobDriver::Cancel(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(job_.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id_, " already ", JobStateName(job_.state())));
  }
  std::string why = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  absl::Status s = PersistLocked();
  if (s.ok()) s = AwaitDurableLocked(write_ticket_);  // mu_ released meanwhile
  if (!s.ok()) {
    // Not durable: a restarted coordinator would run the job again.
    return absl::UnavailableError(
        absl::StrCat("cannot record the cancellation: ", s.message(), " (free space or fix the disk, then retry)"));
  }
  if (IsTerminal(job_.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id_, " already ", JobStateName(job_.state())));
  }
  if (job_.state() == tandem::v1::JOB_STATE_PENDING) {
    FinishLocked(tandem::v1::JOB_STATE_CANCELLED, why);
    // The answer says cancelled: durable first.
    if (absl::Status d = AwaitDurableLocked(write_ticket_); !d.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot record the cancellation: ", d.message()));
    }
  } else {
    cancel_requested_ = true;
    cancel_reason_ = why;
  }
  PublishLocked();
  return job_;
}

void JobDriver::Stop() {
  std::thread t;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

void JobDriver::ReapThread() {
  if (!reapable_.exchange(false)) return;  // nothing to join: no need for mu_
  std::thread t;
  {
    absl::MutexLock lock(&mu_);
    if (!thread_done_ || !thread_.joinable()) return;
    t = std::move(thread_);
  }
  t.join();
}

bool JobDriver::Finished() const {
  if (running_.load()) return false;
  absl::MutexLock lock(&view_mu_);
  return IsTerminal(view_.state());
}

tandem::v1::Job JobDriver::Record() const {
  absl::MutexLock lock(&view_mu_);
  return view_;
}

JobState JobDriver::State() const {
  absl::MutexLock lock(&view_mu_);
  return view_.state();
}

bool JobDriver::HasMember(const std::string& worker_id) const {
  absl::MutexLock lock(&view_mu_);
  const auto& ids = view_.worker_ids();
  return std::find(ids.begin(), ids.end(), worker_id) != ids.end();
}

int64_t JobDriver::LastEventSeq() const {
  absl::MutexLock lock(&mu_);
  return last_event_seq_;
}

void JobDriver::AwaitEvent(int64_t after_seq, absl::Duration wait, int64_t* last, bool* terminal) {
  const absl::Time deadline = absl::Now() + wait;
  WriteTicket ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return last_event_seq_ > after_seq || stopping_; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    *last = last_event_seq_;
    *terminal = IsTerminal(job_.state());
    ticket = last_event_ticket_;
  }
  // Readers see committed events only: wait for them (no lock held).
  if (store_->WaitDurable(ticket, deadline).ok()) return;
  *last = std::min(*last, after_seq);
  *terminal = false;
}

int64_t JobDriver::GenerationFor(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  if (!fail_reason_.empty()) return -1;
  if (job_.state() != tandem::v1::JOB_STATE_RUNNING && job_.state() != tandem::v1::JOB_STATE_RECOVERING) return -1;
  const auto& ids = job_.worker_ids();
  if (std::find(ids.begin(), ids.end(), worker_id) == ids.end()) return -1;
  return job_.generation();
}

bool JobDriver::ScopeActive(int64_t generation) const {
  absl::MutexLock lock(&mu_);
  return !IsTerminal(job_.state()) && job_.state() != tandem::v1::JOB_STATE_PENDING && job_.generation() == generation;
}

void JobDriver::StartThreadLocked() {
  if (thread_.joinable()) {
    if (!thread_done_) return;
    thread_.join();  // finished: it only set thread_done_
  }
  thread_done_ = false;
  reapable_ = false;
  running_ = true;
  thread_ = std::thread([this] { Run(); });
}

void JobDriver::PublishLocked() {
  absl::MutexLock lock(&view_mu_);
  view_ = job_;
}

absl::Status JobDriver::PersistLocked() {
  PublishLocked();
  state_.set_cursor_unit(cursor_.unit);
  state_.set_cursor_sub(cursor_.sub);
  auto ticket = store_->SubmitPutJob(job_, state_, seq_);
  host_->NoteStoreWrite(ticket.status());
  if (!ticket.ok()) {
    spdlog::error("persist job {}: {}", id_, ticket.status().ToString());
    return ticket.status();
  }
  write_ticket_ = *ticket;
  return absl::OkStatus();
}

absl::Status JobDriver::AwaitDurableLocked(WriteTicket ticket) {
  if (ticket <= 0 || store_->DurableThrough() >= ticket) return store_->WaitDurable(ticket);
  mu_.Unlock();
  absl::Status s = store_->WaitDurable(ticket);
  mu_.Lock();
  host_->NoteStoreWrite(s);
  return s;
}

void JobDriver::EventLocked(const std::string& kind, const std::string& message, const StepMetrics* metrics) {
  PublishLocked();
  tandem::v1::JobEvent e;
  e.set_job_id(job_.id());
  e.set_time(clock_->WallSeconds());
  e.set_kind(kind);
  e.set_message(message);
  e.set_state(job_.state());
  if (metrics) *e.mutable_metrics() = *metrics;
  const int64_t seq = last_event_seq_ + 1;
  auto ticket = store_->SubmitEvent(e, seq);
  host_->NoteStoreWrite(ticket.status());
  if (!ticket.ok()) {
    spdlog::error("job {} event: {}", job_.id(), ticket.status().ToString());
    return;
  }
  last_event_seq_ = seq;
  last_event_ticket_ = write_ticket_ = *ticket;
  if (seq % kPruneEventsEvery == 0 && seq > kMaxEventsPerJob) {
    auto pruned = store_->SubmitPruneEvents(job_.id(), seq - kMaxEventsPerJob);
    host_->NoteStoreWrite(pruned.status());
    if (!pruned.ok()) spdlog::error("job {} events: {}", job_.id(), pruned.status().ToString());
    if (pruned.ok()) write_ticket_ = *pruned;
  }
  if (kind != "step") LogLocked("coordinator", {message});
}

void JobDriver::LogLocked(const std::string& source, const std::vector<std::string>& lines) {
  if (lines.empty() || log_lines_ >= kMaxLogLinesPerJob) return;
  std::vector<tandem::v1::LogLine> out;
  const double now = clock_->WallSeconds();
  for (const auto& text : lines) {
    if (log_lines_ >= kMaxLogLinesPerJob) {
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
    log_lines_++;
  }
  auto ticket = store_->SubmitLogs(job_.id(), std::move(out));
  if (!ticket.ok()) spdlog::error("job {} logs: {}", job_.id(), ticket.status().ToString());
  if (ticket.ok()) write_ticket_ = *ticket;
}

void JobDriver::FinishLocked(JobState state, const std::string& reason) {
  const auto& ids = job_.worker_ids();
  std::vector<std::string> workers(ids.begin(), ids.end());
  if (state != tandem::v1::JOB_STATE_SUCCEEDED) {
    for (const auto& w : workers) {
      tandem::v1::WorkerCommand abort;
      abort.set_abort_job(job_.id());
      membership_->Send(w, abort).IgnoreError();
    }
  }
  membership_->Release(job_.id(), workers);
  kv_->DropJob(job_.id());
  inflight_.reset();
  job_.set_state(state);
  job_.set_reason(reason);
  job_.set_finished_at(clock_->WallSeconds());
  SaveLocked();
  std::string message = absl::StrCat("job ", JobStateName(state));
  if (!reason.empty()) absl::StrAppend(&message, ": ", reason);
  EventLocked("state", message);
  spdlog::info("job {}: {}", job_.id(), message);
  host_->RequestSchedule();
}

}  // namespace tandem::server
