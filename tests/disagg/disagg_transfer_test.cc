// The disaggregated hand-off as pure functions: packing round-trips bit for
// bit and rejects malformed input; the trainers' selection drops groups older
// than the staleness bound and counts them, keeps equal work per trainer,
// and refuses incomplete or mixed-version groups.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "worker/engine/disagg_transfer.h"

namespace tandem::worker::disagg {
namespace {

rl::Trajectory Traj(int64_t group, int64_t version, int n = 3) {
  rl::Trajectory t;
  t.prompt_ids = {1, 40 + static_cast<int32_t>(group), 41};
  for (int i = 0; i < n; ++i) {
    t.completion_ids.push_back(50 + i);
    t.logp_sampled.push_back(-0.25f * static_cast<float>(i + 1));
  }
  t.group = group;
  t.policy_version = version;
  return t;
}

// Groups of size g with the given versions, group-major.
std::vector<rl::Trajectory> Groups(const std::vector<int64_t>& versions, int g) {
  std::vector<rl::Trajectory> out;
  for (size_t p = 0; p < versions.size(); ++p) {
    for (int i = 0; i < g; ++i) out.push_back(Traj(static_cast<int64_t>(p), versions[p], 1 + i));
  }
  return out;
}

TEST(DisaggTransferTest, PackRoundTripsBitForBit) {
  RolloutBatch b;
  b.step = 123456789012;
  b.generated_tokens = 77;
  b.generate_seconds = 0.125;
  b.trajectories = {Traj(3, 9), Traj(4, 1LL << 40, 0)};
  b.trajectories[0].logp_sampled[1] = std::numeric_limits<float>::quiet_NaN();
  b.trajectories[0].completion_ids[0] = -5;
  auto words = Pack(b);
  auto back = Unpack(words);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, b.step);
  EXPECT_EQ(back->generated_tokens, 77);
  EXPECT_EQ(back->generate_seconds, 0.125);
  ASSERT_EQ(back->trajectories.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& x = back->trajectories[i];
    const auto& y = b.trajectories[i];
    EXPECT_EQ(x.prompt_ids, y.prompt_ids);
    EXPECT_EQ(x.completion_ids, y.completion_ids);
    EXPECT_EQ(x.group, y.group);
    EXPECT_EQ(x.policy_version, y.policy_version);
    ASSERT_EQ(x.logp_sampled.size(), y.logp_sampled.size());
    for (size_t j = 0; j < x.logp_sampled.size(); ++j) {
      if (std::isnan(y.logp_sampled[j])) {
        EXPECT_TRUE(std::isnan(x.logp_sampled[j]));
      } else {
        EXPECT_EQ(x.logp_sampled[j], y.logp_sampled[j]);
      }
    }
  }
}

TEST(DisaggTransferTest, UnpackRejectsMalformedInput) {
  RolloutBatch b;
  b.step = 2;
  b.trajectories = {Traj(0, 1)};
  auto words = Pack(b);
  EXPECT_FALSE(Unpack({}).ok());
  EXPECT_FALSE(Unpack(std::span<const float>(words).first(words.size() - 1)).ok());
  auto longer = words;
  longer.push_back(0.f);
  EXPECT_FALSE(Unpack(longer).ok());
  auto bad_magic = words;
  bad_magic[0] = 1.f;
  EXPECT_EQ(Unpack(bad_magic).status().code(), absl::StatusCode::kDataLoss);
}

TEST(DisaggTransferTest, DropsStaleGroupsAndCountsThem) {
  // Trainer at version 5, bound 1: the group of version 3 is dropped.
  auto all = Groups({5, 3, 4, 5}, 2);
  auto sel = SelectForTrainer(all, 5, 1, 2, 0, 1);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->received, 8);
  EXPECT_EQ(sel->dropped_stale, 2);
  EXPECT_EQ(sel->dropped_uneven, 0);
  EXPECT_EQ(sel->kept, 6);
  EXPECT_EQ(sel->max_staleness, 1);
  EXPECT_DOUBLE_EQ(sel->mean_staleness, 2.0 / 6.0);
  ASSERT_EQ(sel->mine.size(), 6u);
  EXPECT_EQ(sel->mine[0].group, 0);
  EXPECT_EQ(sel->mine[2].group, 2);
  EXPECT_EQ(sel->mine[4].group, 3);
  // Bound 0 keeps only the current version.
  sel = SelectForTrainer(all, 5, 0, 2, 0, 1);
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->dropped_stale, 4);
  EXPECT_EQ(sel->kept, 4);
  EXPECT_EQ(sel->max_staleness, 0);
}

TEST(DisaggTransferTest, TrainersGetEqualWholeGroupsInOrder) {
  // Arrival order differs from group order (rollout ranks in any order).
  auto all = Groups({2, 2, 2, 0, 2}, 3);
  std::rotate(all.begin(), all.begin() + 6, all.end());
  const std::vector<std::vector<int64_t>> expected = {{0, 1}, {2, 4}};
  for (int t = 0; t < 2; ++t) {
    auto sel = SelectForTrainer(all, 2, 1, 3, t, 2);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_EQ(sel->dropped_stale, 3);  // group 3 (version 0)
    EXPECT_EQ(sel->dropped_uneven, 0);
    EXPECT_EQ(sel->kept, 12);
    ASSERT_EQ(sel->mine.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(sel->mine[i].group, expected[t][i / 3]) << t << " " << i;
    EXPECT_EQ(sel->mine[1].completion_ids.size(), 2u);  // order inside a group kept
  }
}

TEST(DisaggTransferTest, UnevenRemainderIsCountedSeparately) {
  auto all = Groups({1, 1, 1}, 2);  // 3 groups, 2 trainers: one left over
  auto s0 = SelectForTrainer(all, 1, 0, 2, 0, 2);
  auto s1 = SelectForTrainer(all, 1, 0, 2, 1, 2);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->dropped_uneven, 2);
  EXPECT_EQ(s0->kept, 4);
  ASSERT_EQ(s0->mine.size(), 2u);
  ASSERT_EQ(s1->mine.size(), 2u);
  EXPECT_EQ(s0->mine[0].group, 0);
  EXPECT_EQ(s1->mine[0].group, 1);
}

TEST(DisaggTransferTest, RefusesIncompleteMixedOrFutureGroups) {
  auto incomplete = Groups({1, 1}, 2);
  incomplete.pop_back();
  EXPECT_EQ(SelectForTrainer(incomplete, 1, 0, 2, 0, 1).status().code(), absl::StatusCode::kInternal);
  auto mixed = Groups({1, 1}, 2);
  mixed[1].policy_version = 0;
  EXPECT_EQ(SelectForTrainer(mixed, 1, 5, 2, 0, 1).status().code(), absl::StatusCode::kInternal);
  auto future = Groups({3}, 2);
  EXPECT_FALSE(SelectForTrainer(future, 2, 5, 2, 0, 1).ok());
  EXPECT_FALSE(SelectForTrainer(Groups({1}, 2), 1, 0, 2, 2, 2).ok());
}

}  // namespace
}  // namespace tandem::worker::disagg
