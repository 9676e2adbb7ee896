#include "common/base/check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::base::internal {

// stderr and abort only: the check may fire before logging is set up, or
// inside the logger.
void CheckFailed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, condition);
  std::fflush(stderr);
  std::abort();
}

void CheckOkFailed(const char* file, int line, const char* expression, const absl::Status& status) {
  const std::string text = status.ToString();
  std::fprintf(stderr, "%s:%d: check failed: %s is OK: %s\n", file, line, expression, text.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tandem::base::internal
