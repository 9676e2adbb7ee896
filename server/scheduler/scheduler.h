// Gang scheduling, as a pure function: every job needs all its workers at
// once. Jobs are considered by priority (higher first), then submission
// order (FIFO). A job that cannot start blocks the jobs after it that need
// the same device kind (no starvation of large jobs); its reason says why,
// e.g. "needs 4 cpu workers, 2 idle". Workers are chosen in name order, so
// ranks are stable. Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

struct PendingJob {
  std::string id;
  int priority = 0;
  int64_t seq = 0;  // submission order
  tandem::v1::DeviceKind device = tandem::v1::DEVICE_KIND_CPU;
  int workers = 1;
};

struct ScheduleDecision {
  std::string job_id;
  std::vector<std::string> worker_ids;  // rank order
};

struct ScheduleResult {
  std::vector<ScheduleDecision> start;
  std::map<std::string, std::string> reasons;  // job id -> PENDING reason
};

ScheduleResult Schedule(std::vector<PendingJob> pending, std::vector<tandem::v1::WorkerInfo> idle);

}  // namespace tandem::server
