// Per-job bounds on what the coordinator stores, and how often it applies
// the retention settings.
#pragma once

#include <cstdint>

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

}  // namespace tandem::server
