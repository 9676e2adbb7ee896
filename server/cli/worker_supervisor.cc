#include "server/cli/worker_supervisor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

double NowUnix() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

std::chrono::milliseconds RestartBackoff(const SupervisorOptions& options, int n) {
  std::chrono::milliseconds d = options.initial_backoff;
  for (int i = 0; i < n && d < options.max_backoff; ++i) d *= 2;
  return std::min(d, options.max_backoff);
}

std::string DescribeEvent(const SupervisorEvent& e) {
  const std::string head = absl::StrCat("worker ", e.member, " exited (", e.reason, ")");
  switch (e.kind) {
    case SupervisorEvent::Kind::kRestarted:
      return absl::StrCat(head, "; restarted (", e.restart, " of ", e.max_restarts, ")");
    case SupervisorEvent::Kind::kRestartFailed:
      return absl::StrCat(head, "; restart ", e.restart, " of ", e.max_restarts, " failed: ", e.error);
    case SupervisorEvent::Kind::kGaveUp:
      return absl::StrCat(head, "; not restarted: all ", e.max_restarts,
                          " restarts are used; the job recovers without it or fails; see ", e.log_file);
    case SupervisorEvent::Kind::kExited:
      return absl::StrCat(head, "; not restarted (", e.note, "); see ", e.log_file);
  }
  return head;
}

WorkerSupervisor::WorkerSupervisor(SupervisorOptions options, EventFn on_event)
    : options_(options), on_event_(std::move(on_event)) {}

WorkerSupervisor::~WorkerSupervisor() { Stop(); }

absl::Status WorkerSupervisor::Start(std::vector<SupervisedMember> members) {
  thread_ = std::thread([this, members = std::move(members)]() mutable { Run(std::move(members)); });
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&started_));
  return start_status_;
}

void WorkerSupervisor::AllowRestarts() {
  absl::MutexLock lock(&mu_);
  restarts_allowed_ = options_.restart;
}

std::vector<SupervisorEvent> WorkerSupervisor::Down() const {
  absl::MutexLock lock(&mu_);
  std::vector<SupervisorEvent> down;
  for (const Slot& s : slots_) {
    if (s.down) down.push_back(*s.down);
  }
  return down;
}

std::vector<SupervisorEvent> WorkerSupervisor::restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

int WorkerSupervisor::restart_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(restarts_.size());
}

void WorkerSupervisor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // no restart begins after this
  }
  if (thread_.joinable()) thread_.join();
}

// The supervisor thread: every fork, wait, signal and reap of a member.
void WorkerSupervisor::Run(std::vector<SupervisedMember> members) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& m : members) {
      Slot slot;
      slot.member = std::move(m);
      auto child = ChildProcess::Start(slot.member.spec);
      if (!child.ok()) {
        start_status_ = absl::Status(child.status().code(),
                                     absl::StrCat("cannot start ", slot.member.name, ": ", child.status().message()));
        StopAllLocked();
        stopping_ = true;
        started_ = true;
        return;
      }
      slot.child = std::move(*child);
      slots_.push_back(std::move(slot));
    }
    started_ = true;
  }
  while (true) {
    std::vector<SupervisorEvent> events;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(options_.poll));
      if (stopping_) break;
      CheckLocked(&events);
    }
    for (const auto& e : events) {
      if (on_event_) on_event_(e);
    }
  }
  absl::MutexLock lock(&mu_);
  StopAllLocked();
}

void WorkerSupervisor::CheckLocked(std::vector<SupervisorEvent>* events) {
  const auto now = Clock::now();
  for (Slot& s : slots_) {
    SupervisorEvent e;
    e.member = s.member.name;
    e.max_restarts = options_.max_restarts;
    e.log_file = s.member.spec.log_file;
    if (s.child != nullptr) {
      if (s.child->Running()) continue;
      // Exited: reaped here; decide whether it comes back.
      const bool clean = s.child->ExitedCleanly();
      s.reason = s.child->ExitReason();
      s.child.reset();
      e.reason = s.reason;
      e.time = NowUnix();
      if (clean || !restarts_allowed_) {
        e.kind = SupervisorEvent::Kind::kExited;
        e.note = clean ? "clean exit" : !options_.restart ? "--no-restart" : "during start-up";
        s.down = e;
        events->push_back(e);
      } else if (s.restarts >= options_.max_restarts) {
        e.kind = SupervisorEvent::Kind::kGaveUp;
        s.down = e;
        events->push_back(e);
      } else {
        s.restart_at = now + RestartBackoff(options_, s.restarts);
      }
      continue;
    }
    if (!s.restart_at || now < *s.restart_at) continue;
    s.restart_at.reset();
    ++s.restarts;
    e.reason = s.reason;
    e.restart = s.restarts;
    e.time = NowUnix();
    auto child = ChildProcess::Start(s.member.spec);
    if (child.ok()) {
      s.child = std::move(*child);
      e.kind = SupervisorEvent::Kind::kRestarted;
      e.pid = s.child->pid();
      restarts_.push_back(e);
      events->push_back(e);
      continue;
    }
    e.kind = SupervisorEvent::Kind::kRestartFailed;
    e.error = std::string(child.status().message());
    events->push_back(e);
    if (s.restarts < options_.max_restarts) {
      s.restart_at = now + RestartBackoff(options_, s.restarts);
    } else {
      SupervisorEvent gave_up = e;
      gave_up.kind = SupervisorEvent::Kind::kGaveUp;
      gave_up.error.clear();
      s.down = gave_up;
      events->push_back(gave_up);
    }
  }
}

void WorkerSupervisor::StopAllLocked() {
  std::vector<ChildProcess*> all;
  for (Slot& s : slots_) {
    if (s.child != nullptr) all.push_back(s.child.get());
  }
  // SIGINT, not SIGTERM: the whole run is ending, so the workers stop at once
  // instead of asking the coordinator for a graceful handover.
  StopAll(all, options_.stop_grace, SIGINT);
  for (Slot& s : slots_) s.restart_at.reset();
}

}  // namespace tandem::cli
