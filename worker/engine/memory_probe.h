// Process memory figures from /proc (Linux): resident set now and the peak
// since the last ResetPeakRss() (VmHWM, reset through /proc/self/clear_refs).
#pragma once

#include <cstdint>

namespace tandem::worker {

int64_t CurrentRssBytes();
int64_t PeakRssBytes();
// Best effort: when the kernel refuses, the peak keeps counting from start.
void ResetPeakRss();

}  // namespace tandem::worker
