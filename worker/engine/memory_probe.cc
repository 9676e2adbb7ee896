#include "worker/engine/memory_probe.h"

#include <cstdio>
#include <cstring>

namespace tandem::worker {
namespace {
int64_t ReadStatusKb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kb = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, key, n) == 0) {
      std::sscanf(line + n, " %ld", &kb);
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}
}  // namespace

int64_t CurrentRssBytes() { return ReadStatusKb("VmRSS:"); }
int64_t PeakRssBytes() { return ReadStatusKb("VmHWM:"); }

void ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return;
  std::fputs("5", f);
  std::fclose(f);
}

}  // namespace tandem::worker
