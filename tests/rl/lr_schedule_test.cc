// Warmup + cosine learning-rate schedule.
#include "worker/rl/lr_schedule.h"

#include <gtest/gtest.h>

namespace tandem::rl {
namespace {

TEST(LrScheduleTest, WarmupThenCosineToFloor) {
  const LrSchedule s{.lr = 1e-3, .warmup_steps = 10, .total_steps = 110, .min_lr_ratio = 0.1};
  EXPECT_DOUBLE_EQ(s.At(0), 0.0);
  EXPECT_DOUBLE_EQ(s.At(5), 0.5e-3);
  EXPECT_DOUBLE_EQ(s.At(10), 1e-3);  // peak right after warmup
  // Halfway through the decay: floor + half the range.
  EXPECT_NEAR(s.At(60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-15);
  EXPECT_NEAR(s.At(110), 1e-4, 1e-15);
  EXPECT_NEAR(s.At(500), 1e-4, 1e-15);  // stays at the floor
  for (int64_t i = 10; i < 110; ++i) EXPECT_LE(s.At(i + 1), s.At(i) + 1e-18);
  for (int64_t i = 0; i < 10; ++i) EXPECT_LT(s.At(i), s.At(i + 1));
}

TEST(LrScheduleTest, NoWarmupStartsAtPeak) {
  const LrSchedule s{.lr = 2.0, .warmup_steps = 0, .total_steps = 4, .min_lr_ratio = 0.0};
  EXPECT_DOUBLE_EQ(s.At(0), 2.0);
  EXPECT_NEAR(s.At(2), 1.0, 1e-12);
  EXPECT_NEAR(s.At(4), 0.0, 1e-12);
}

TEST(LrScheduleTest, ConstantWhenFloorIsOne) {
  const LrSchedule s{.lr = 0.5, .warmup_steps = 2, .total_steps = 10, .min_lr_ratio = 1.0};
  EXPECT_DOUBLE_EQ(s.At(1), 0.25);
  for (int i = 2; i < 20; ++i) EXPECT_DOUBLE_EQ(s.At(i), 0.5);
}

}  // namespace
}  // namespace tandem::rl
