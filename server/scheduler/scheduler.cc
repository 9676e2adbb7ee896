#include "server/scheduler/scheduler.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace tandem::server {

ScheduleResult Schedule(std::vector<PendingJob> pending, std::vector<tandem::v1::WorkerInfo> idle) {
  std::stable_sort(pending.begin(), pending.end(), [](const PendingJob& a, const PendingJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  std::sort(idle.begin(), idle.end(),
            [](const auto& a, const auto& b) { return a.name() != b.name() ? a.name() < b.name() : a.id() < b.id(); });
  std::map<tandem::v1::DeviceKind, std::vector<std::string>> free;
  for (const auto& w : idle) free[w.device()].push_back(w.id());
  std::map<tandem::v1::DeviceKind, std::string> blocked_by;
  ScheduleResult result;
  for (const auto& job : pending) {
    auto& pool = free[job.device];
    const std::string device = common::DeviceName(job.device);
    if (auto b = blocked_by.find(job.device); b != blocked_by.end()) {
      result.reasons[job.id] =
          absl::StrCat("waiting behind job ", b->second, " (", device, " workers are reserved for it)");
      continue;
    }
    if (static_cast<int>(pool.size()) < job.workers) {
      result.reasons[job.id] = absl::StrCat("needs ", job.workers, " ", device, " worker", job.workers == 1 ? "" : "s",
                                            ", ", pool.size(), " idle");
      blocked_by[job.device] = job.id;
      continue;
    }
    ScheduleDecision d;
    d.job_id = job.id;
    d.worker_ids.assign(pool.begin(), pool.begin() + job.workers);
    pool.erase(pool.begin(), pool.begin() + job.workers);
    result.start.push_back(std::move(d));
  }
  return result;
}

}  // namespace tandem::server
