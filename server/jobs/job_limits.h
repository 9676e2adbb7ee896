// Per-job bounds on what the coordinator stores, how often it applies the
// retention settings, and how long a job waits for its writes.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace tandem::server {

// How often finished jobs are checked against the retention settings.
inline constexpr double kPruneEverySeconds = 30;
// Log lines stored per job; later lines are dropped with one notice.
inline constexpr int64_t kMaxLogLinesPerJob = 200000;
// Events stored per job, running or finished: the newest are kept (a
// watcher that falls this far behind misses the oldest). Applied every
// kPruneEventsEvery events.
inline constexpr int64_t kMaxEventsPerJob = 100000;
inline constexpr int64_t kPruneEventsEvery = 1000;
// How long ReportPhase waits for a published checkpoint's record to be
// durable before it answers UNAVAILABLE (the worker sends the report again).
inline constexpr absl::Duration kCheckpointAckWait = absl::Seconds(30);
// The longest a driver's wait goes without looking at its inbox (a loss
// posted while the job's lock was held is seen at the latest then).
inline constexpr absl::Duration kInboxPollInterval = absl::Milliseconds(250);
// How often a driver waiting for its own write looks whether it is stopping.
inline constexpr absl::Duration kDurableWaitSlice = absl::Milliseconds(200);

}  // namespace tandem::server
