// Learning-rate schedule: linear warmup from 0, then cosine decay to
// min_lr_ratio * lr (the shape of HF transformers'
// get_cosine_schedule_with_warmup with a floor):
//   step < warmup:  lr * step / warmup            (step 0 -> 0)
//   otherwise:      p = min(1, (step - warmup) / max(1, total - warmup))
//                   lr * (m + (1 - m) * 0.5 * (1 + cos(pi * p)))
// where m = min_lr_ratio. Steps at or past `total_steps` stay at the floor.
// Header-only value type; thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace tandem::rl {

struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;  // in [0, 1]

  // Learning rate to use for optimizer step `step` (0-based).
  double At(int64_t step) const {
    if (step < 0) step = 0;
    if (step < warmup_steps) {
      return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
    }
    const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
    const double p = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
  }
};

}  // namespace tandem::rl
