#include "server/membership/membership.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/bandwidth.h"
#include "common/base/status_macros.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using tandem::v1::WorkerInfo;
using tandem::v1::WorkerState;

void CommandQueue::Push(tandem::v1::WorkerCommand command) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(command));
}

CommandQueue::PopResult CommandQueue::Pop(uint64_t epoch, int64_t timeout_ms, tandem::v1::WorkerCommand* out,
                                          uint64_t* clears) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return epoch_ != epoch || !queue_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(timeout_ms));
  if (epoch_ != epoch) return PopResult::kSuperseded;
  if (queue_.empty()) return PopResult::kTimeout;
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (clears != nullptr) *clears = clears_;
  return PopResult::kCommand;
}

void CommandQueue::Unpop(tandem::v1::WorkerCommand command, uint64_t clears) {
  absl::MutexLock lock(&mu_);
  if (clears != clears_) return;
  queue_.push_front(std::move(command));
}

void CommandQueue::SetEpoch(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  epoch_ = epoch;
}

bool CommandQueue::ContainsCommand(const std::string& command_id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& c : queue_) {
    if (c.has_phase() && c.phase().command_id() == command_id) return true;
  }
  return false;
}

void CommandQueue::Clear() {
  absl::MutexLock lock(&mu_);
  queue_.clear();
  ++clears_;
}

size_t CommandQueue::size() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

Membership::Membership(const tandem::v1::CoordinatorConfig& config, StateStore* store, const Clock* clock)
    : config_(config), store_(store), clock_(clock) {}

WriteTicket Membership::Persist(const WorkerInfo& info) {
  if (store_ == nullptr) return 0;
  auto it = workers_.find(info.id());
  auto ticket = store_->SubmitPutWorker(info, it == workers_.end() ? "" : it->second.credential_digest);
  if (!ticket.ok()) spdlog::error("persist worker {}: {}", info.id(), ticket.status().ToString());
  return ticket.ok() ? *ticket : 0;
}

absl::Status Membership::Load() {
  if (store_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto workers, store_->LoadWorkers());
  absl::MutexLock lock(&mu_);
  const int64_t grace = std::max(config_.lease_ms(), config_.reattach_grace_ms());
  for (auto& w : workers) {
    Entry e;
    e.info = w.info;
    e.credential_digest = w.credential_digest;
    e.lease_deadline_ms = clock_->NowMs() + grace;
    int64_t n = 0;
    const std::string& id = e.info.id();
    if (id.rfind("w-", 0) == 0 && absl::SimpleAtoi(id.substr(2), &n)) next_id_ = std::max(next_id_, n + 1);
    workers_[id] = std::move(e);
  }
  return absl::OkStatus();
}

Membership::Entry* Membership::FindLocked(const std::string& id_or_name) {
  auto it = workers_.find(id_or_name);
  if (it != workers_.end()) return &it->second;
  for (auto& [id, e] : workers_) {
    if (e.info.name() == id_or_name) return &e;
  }
  return nullptr;
}

absl::StatusOr<RegisterResult> Membership::Register(const tandem::v1::RegisterWorkerRequest& req,
                                                    int64_t job_generation) {
  WriteTicket ticket = 0;
  absl::StatusOr<RegisterResult> result;
  {
    absl::MutexLock lock(&mu_);
    result = RegisterLocked(req, job_generation, &ticket);
  }
  // The credential goes out once its digest is durable: a restarted
  // coordinator accepts it. No lock is held while waiting.
  if (result.ok() && store_ != nullptr) {
    if (absl::Status s = store_->WaitDurable(ticket); !s.ok()) {
      spdlog::error("persist worker {}: {}", result->worker_id, s.ToString());
    }
  }
  return result;
}

absl::StatusOr<RegisterResult> Membership::RegisterLocked(const tandem::v1::RegisterWorkerRequest& req,
                                                          int64_t job_generation, WriteTicket* ticket) {
  if (req.has_tier_bandwidth()) {
    const auto& t = req.tier_bandwidth();
    for (double v : {t.intra_bytes_per_s(), t.inter_bytes_per_s()}) {
      if (!std::isfinite(v) || v <= 0 || v > common::kMaxBandwidthBytesPerS) {
        return absl::InvalidArgumentError(
            absl::StrCat("tier_bandwidth: intra ", t.intra_bytes_per_s(), " and inter ", t.inter_bytes_per_s(),
                         " bytes/s: both must be above zero and at most ", common::kMaxBandwidthBytesPerS,
                         " (--tier-bandwidth intra=10Gbit,inter=1Gbit)"));
      }
    }
  }
  Entry* e = nullptr;
  if (!req.worker_id().empty()) {
    auto it = workers_.find(req.worker_id());
    if (it != workers_.end()) e = &it->second;
  }
  if (e == nullptr) {
    for (auto& [id, entry] : workers_) {
      if (entry.info.name() == req.name()) e = &entry;
    }
  }
  // A name or id held by a live worker goes only to the holder of its
  // credential: two workers started with one --name are refused, never
  // trade the identity back and forth.
  const bool proven =
      e != nullptr && !e->credential_digest.empty() && !req.worker_credential().empty() &&
      common::ConstantTimeEquals(common::CredentialDigest(req.worker_credential()), e->credential_digest);
  if (e != nullptr && !proven && LiveLocked(*e)) {
    return absl::AlreadyExistsError(
        absl::StrCat("name: '", req.name(), "' is held by live worker ", e->info.id(), " on host '", e->info.host(),
                     "': give every worker its own --name (this one is refused until that worker's lease runs out)"));
  }
  RegisterResult result;
  std::string credential = proven ? req.worker_credential() : "";
  if (credential.empty()) {
    ASSIGN_OR_RETURN(credential, common::GenerateToken());
  }
  const double now = clock_->WallSeconds();
  if (e == nullptr) {
    std::string id = absl::StrCat("w-", next_id_++);
    e = &workers_[id];
    e->info.set_id(id);
    e->info.set_registered_at(now);
  }
  WorkerInfo& info = e->info;
  info.set_name(req.name());
  info.set_host(req.host());
  info.set_device(req.device());
  info.set_device_count(req.device_count());
  info.set_memory_bytes(req.memory_bytes());
  info.set_version(req.version());
  info.set_data_address(req.data_address());
  info.set_node(req.node().empty() ? req.host() : req.node());
  info.set_speed(req.speed());
  if (req.has_tier_bandwidth()) {
    *info.mutable_tier_bandwidth() = req.tier_bandwidth();
  } else {
    info.clear_tier_bandwidth();
  }
  info.set_last_heartbeat(now);
  const bool in_job = !info.job_id().empty() && (info.state() == tandem::v1::WORKER_STATE_BUSY ||
                                                 info.state() == tandem::v1::WORKER_STATE_DRAINING);
  if (in_job && req.job_id() == info.job_id() && job_generation >= 0 && req.generation() == job_generation) {
    result.keep_job = true;
    result.rank = info.rank();
  } else {
    if (in_job) result.dropped_job = info.job_id();
    // A preempted worker that comes back (restarted) is a fresh worker.
    if (info.preempting() && req.job_id().empty()) {
      info.set_preempting(false);
      info.set_state(tandem::v1::WORKER_STATE_IDLE);
    }
    if (info.state() != tandem::v1::WORKER_STATE_DRAINING) info.set_state(tandem::v1::WORKER_STATE_IDLE);
    info.clear_job_id();
    info.set_rank(0);
    e->queue->Clear();
  }
  // The previous Attach stream (if any) ends: its epoch is no longer current.
  e->attach_epoch++;
  e->queue->SetEpoch(e->attach_epoch);
  e->attached = false;
  e->lease_deadline_ms = clock_->NowMs() + config_.lease_ms();
  result.worker_id = info.id();
  result.credential = credential;
  e->credential_digest = common::CredentialDigest(credential);
  *ticket = Persist(info);
  return result;
}

bool Membership::LiveLocked(const Entry& e) const {
  return e.info.state() != tandem::v1::WORKER_STATE_GONE && e.info.state() != tandem::v1::WORKER_STATE_LOST &&
         clock_->NowMs() < e.lease_deadline_ms;
}

absl::Status Membership::CheckCredential(const std::string& worker_id, const std::string& credential) const {
  if (credential.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("missing worker credential (metadata ",
                                                   common::kWorkerCredentialMetadata,
                                                   "): RegisterWorker's response carries it"));
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() == tandem::v1::WORKER_STATE_LOST ||
      it->second.info.state() == tandem::v1::WORKER_STATE_GONE) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered: register again"));
  }
  if (it->second.credential_digest.empty() ||
      !common::ConstantTimeEquals(common::CredentialDigest(credential), it->second.credential_digest)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the worker credential is not the one of worker ", worker_id, ": a worker acts only as itself"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Membership::WorkerForCredential(const std::string& credential) const {
  if (credential.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("missing worker credential (metadata ",
                                                   common::kWorkerCredentialMetadata,
                                                   "): RegisterWorker's response carries it"));
  }
  const std::string digest = common::CredentialDigest(credential);
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : workers_) {
    if (!e.credential_digest.empty() && common::ConstantTimeEquals(digest, e.credential_digest) && LiveLocked(e)) {
      return id;
    }
  }
  return absl::PermissionDeniedError("the worker credential belongs to no live worker: register again");
}

absl::Status Membership::Heartbeat(const tandem::v1::HeartbeatRequest& req) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end() || it->second.info.state() == tandem::v1::WORKER_STATE_LOST ||
      it->second.info.state() == tandem::v1::WORKER_STATE_GONE) {
    return absl::NotFoundError(absl::StrCat("worker ", req.worker_id(), " is not registered: register again"));
  }
  it->second.lease_deadline_ms = clock_->NowMs() + config_.lease_ms();
  it->second.info.set_last_heartbeat(clock_->WallSeconds());
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::shared_ptr<CommandQueue>, uint64_t>> Membership::Attach(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() == tandem::v1::WORKER_STATE_LOST ||
      it->second.info.state() == tandem::v1::WORKER_STATE_GONE) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered: register again"));
  }
  Entry& e = it->second;
  e.attach_epoch++;
  e.queue->SetEpoch(e.attach_epoch);
  e.attached = true;
  e.lease_deadline_ms = clock_->NowMs() + config_.lease_ms();
  if (e.info.state() == tandem::v1::WORKER_STATE_DRAINING && e.info.job_id().empty()) {
    tandem::v1::WorkerCommand drain;
    drain.set_drain(true);
    e.queue->Push(drain);
  }
  return std::make_pair(e.queue, e.attach_epoch);
}

void Membership::Detach(const std::string& worker_id, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.attach_epoch == epoch) it->second.attached = false;
}

bool Membership::IsCurrentAttach(const std::string& worker_id, uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  return it != workers_.end() && it->second.attach_epoch == epoch && it->second.attached;
}

absl::Status Membership::Send(const std::string& worker_id, tandem::v1::WorkerCommand command) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker ", worker_id, " unknown"));
  it->second.queue->Push(std::move(command));
  return absl::OkStatus();
}

void Membership::Resend(const std::string& worker_id, const tandem::v1::WorkerCommand& command) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  if (command.has_phase() && it->second.queue->ContainsCommand(command.phase().command_id())) return;
  it->second.queue->Push(command);
}

std::vector<WorkerInfo> Membership::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, e] : workers_) out.push_back(e.info);
  return out;
}

absl::StatusOr<WorkerInfo> Membership::Get(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker ", worker_id, " unknown"));
  return it->second.info;
}

absl::StatusOr<WorkerInfo> Membership::Drain(const std::string& id_or_name) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id_or_name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("worker: no worker with id or name '", id_or_name, "'"));
  auto state = e->info.state();
  if (state == tandem::v1::WORKER_STATE_LOST || state == tandem::v1::WORKER_STATE_GONE) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", e->info.id(), " is ", tandem::v1::WorkerState_Name(state)));
  }
  if (state == tandem::v1::WORKER_STATE_IDLE) {
    e->info.set_state(tandem::v1::WORKER_STATE_DRAINING);
    tandem::v1::WorkerCommand drain;
    drain.set_drain(true);
    e->queue->Push(drain);
  } else if (state == tandem::v1::WORKER_STATE_BUSY) {
    // Stays BUSY until its job ends; Release() then makes it DRAINING.
    e->info.set_state(tandem::v1::WORKER_STATE_DRAINING);
  }
  Persist(e->info);
  return e->info;
}

std::vector<WorkerInfo> Membership::Idle() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  const int64_t now = clock_->NowMs();
  for (const auto& [id, e] : workers_) {
    if (e.info.state() == tandem::v1::WORKER_STATE_IDLE && e.attached && now < e.lease_deadline_ms) {
      out.push_back(e.info);
    }
  }
  return out;
}

absl::Status Membership::Assign(const std::string& job_id, const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  for (const auto& id : worker_ids) {
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second.info.state() != tandem::v1::WORKER_STATE_IDLE) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is no longer idle"));
    }
  }
  for (size_t i = 0; i < worker_ids.size(); ++i) {
    WorkerInfo& info = workers_[worker_ids[i]].info;
    info.set_state(tandem::v1::WORKER_STATE_BUSY);
    info.set_job_id(job_id);
    info.set_rank(static_cast<int>(i));
    Persist(info);
  }
  return absl::OkStatus();
}

void Membership::Release(const std::string& job_id, const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  for (const auto& id : worker_ids) {
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second.info.job_id() != job_id) continue;
    WorkerInfo& info = it->second.info;
    info.clear_job_id();
    info.set_rank(0);
    if (info.state() == tandem::v1::WORKER_STATE_BUSY) info.set_state(tandem::v1::WORKER_STATE_IDLE);
    if (info.state() == tandem::v1::WORKER_STATE_DRAINING) {
      tandem::v1::WorkerCommand drain;
      drain.set_drain(true);
      it->second.queue->Push(drain);
    }
    Persist(info);
  }
}

std::vector<LostWorker> Membership::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  std::vector<LostWorker> lost;
  const int64_t now = clock_->NowMs();
  const int64_t gap = last_lease_check_ms_ > 0 ? now - last_lease_check_ms_ : 0;
  last_lease_check_ms_ = now;
  if (gap > std::max<int64_t>(config_.lease_ms() / 4, 2 * config_.heartbeat_ms())) {
    // The coordinator was not running this check (nor, likely, answering
    // heartbeats) for `gap`: that time does not count against any lease.
    spdlog::warn("lease check ran {} ms late (coordinator stalled); leases extended by that", gap);
    for (auto& [id, e] : workers_) e.lease_deadline_ms += gap;
    return lost;
  }
  for (auto& [id, e] : workers_) {
    auto state = e.info.state();
    if (state == tandem::v1::WORKER_STATE_LOST || state == tandem::v1::WORKER_STATE_GONE) continue;
    if (now < e.lease_deadline_ms) continue;
    LostWorker l{id, e.info.name(), e.info.job_id(), e.info.job_id().empty() ? -1 : e.info.rank(),
                 absl::StrCat("lease expired (no heartbeat for ",
                              absl::FormatDuration(absl::Milliseconds(config_.lease_ms())), ")")};
    e.info.set_state(tandem::v1::WORKER_STATE_LOST);
    e.info.clear_job_id();
    e.attached = false;
    e.attach_epoch++;
    e.queue->SetEpoch(e.attach_epoch);
    e.queue->Clear();
    Persist(e.info);
    lost.push_back(std::move(l));
  }
  // Retention: LOST and GONE workers are forgotten once silent for
  // lost_worker_retention_ms (their ids are never reused).
  if (const int64_t keep_ms = config_.lost_worker_retention_ms(); keep_ms > 0) {
    const double cutoff = clock_->WallSeconds() - static_cast<double>(keep_ms) / 1000.0;
    for (auto it = workers_.begin(); it != workers_.end();) {
      const auto state = it->second.info.state();
      if ((state == tandem::v1::WORKER_STATE_LOST || state == tandem::v1::WORKER_STATE_GONE) &&
          it->second.info.last_heartbeat() < cutoff) {
        if (store_ != nullptr) {
          if (absl::Status st = store_->SubmitDeleteWorker(it->first).status(); !st.ok()) {
            spdlog::error("forget worker {}: {}", it->first, st.ToString());
            ++it;
            continue;
          }
        }
        spdlog::info("worker {} ({}) forgotten: {} for longer than {}", it->first, it->second.info.name(),
                     state == tandem::v1::WORKER_STATE_LOST ? "lost" : "gone",
                     absl::FormatDuration(absl::Milliseconds(keep_ms)));
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return lost;
}

bool Membership::InJobAndAlive(const std::string& worker_id, const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  const Entry& e = it->second;
  const auto state = e.info.state();
  return e.attached && clock_->NowMs() < e.lease_deadline_ms && e.info.job_id() == job_id &&
         (state == tandem::v1::WORKER_STATE_BUSY || state == tandem::v1::WORKER_STATE_DRAINING);
}

absl::Status Membership::Reassign(const std::string& job_id, const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  for (const auto& id : worker_ids) {
    auto it = workers_.find(id);
    if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker ", id, " unknown"));
    const auto& info = it->second.info;
    const bool idle = info.state() == tandem::v1::WORKER_STATE_IDLE && info.job_id().empty();
    if (!idle && info.job_id() != job_id) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is neither idle nor in job ", job_id));
    }
  }
  for (size_t i = 0; i < worker_ids.size(); ++i) {
    WorkerInfo& info = workers_[worker_ids[i]].info;
    if (info.state() != tandem::v1::WORKER_STATE_DRAINING) info.set_state(tandem::v1::WORKER_STATE_BUSY);
    info.set_job_id(job_id);
    info.set_rank(static_cast<int>(i));
    Persist(info);
  }
  return absl::OkStatus();
}

std::string Membership::MarkPreempting(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return "";
  Entry& e = it->second;
  const bool first = !e.info.preempting();
  e.info.set_preempting(true);
  const auto state = e.info.state();
  if (state == tandem::v1::WORKER_STATE_IDLE ||
      (state == tandem::v1::WORKER_STATE_DRAINING && e.info.job_id().empty() && first)) {
    e.info.set_state(tandem::v1::WORKER_STATE_DRAINING);
    tandem::v1::WorkerCommand drain;
    drain.set_drain(true);
    e.queue->Push(drain);
  } else if (state == tandem::v1::WORKER_STATE_BUSY) {
    e.info.set_state(tandem::v1::WORKER_STATE_DRAINING);
  }
  if (first) Persist(e.info);
  return e.info.job_id();
}

std::string Membership::JobOf(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? std::string() : it->second.info.job_id();
}

std::map<WorkerState, int> Membership::CountByState() const {
  absl::MutexLock lock(&mu_);
  std::map<WorkerState, int> out;
  for (const auto& [id, e] : workers_) out[e.info.state()]++;
  return out;
}

}  // namespace tandem::server
