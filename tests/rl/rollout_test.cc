// Rollout bookkeeping: packed RL batch layout, splits, staleness filter.
#include "worker/rl/rollout.h"

#include <gtest/gtest.h>

#include "worker/rl/grpo.h"

namespace tandem::rl {
namespace {

TEST(BuildRlBatchTest, LayoutMasksCompletionIncludingEos) {
  std::vector<Trajectory> t(2);
  t[0].prompt_ids = {1, 10, 11};
  t[0].completion_ids = {20, 2};  // eos sampled
  t[0].logp_sampled = {-0.5f, -0.1f};
  t[1].prompt_ids = {1, 12};
  t[1].completion_ids = {21, 22, 23};  // truncated, no eos
  t[1].logp_sampled = {-1.f, -2.f, -3.f};
  const std::vector<double> adv = {0.7, -0.3};
  auto b = BuildRlBatch(t, adv);
  ASSERT_TRUE(b.ok()) << b.status();
  const PackedBatch& p = b->packed;
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{1, 10, 11, 20, 2, 1, 12, 21, 22, 23}));
  EXPECT_EQ(p.targets, (std::vector<int32_t>{10, 11, 20, 2, 0, 12, 21, 22, 23, 0}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 5, 10}));
  EXPECT_EQ(p.loss_mask, (std::vector<float>{0, 0, 1, 1, 0, 0, 1, 1, 1, 0}));
  EXPECT_EQ(b->advantages, (std::vector<float>{0, 0, 0.7f, 0.7f, 0, 0, -0.3f, -0.3f, -0.3f, 0}));
  EXPECT_EQ(b->logp_sampled, (std::vector<float>{0, 0, -0.5f, -0.1f, 0, 0, -1, -2, -3, 0}));
  EXPECT_EQ(b->num_loss_tokens, 5);
  EXPECT_EQ(CountCompletionTokens(t), 5);
  EXPECT_EQ(p.num_sequences, 2);

  // The packed vectors feed the policy loss directly.
  PolicyLossInput<float> in{b->logp_sampled, b->logp_sampled, {}, b->advantages, p.loss_mask, p.cu_seqlens};
  auto loss = PolicyLoss(in, {});
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(loss->loss, -(0.7 * 2 - 0.3 * 3) / 5, 1e-6);
}

TEST(BuildRlBatchTest, Errors) {
  std::vector<Trajectory> t(1);
  t[0].prompt_ids = {1};
  t[0].completion_ids = {5, 6};
  EXPECT_FALSE(BuildRlBatch(t, std::vector<double>{}).ok());
  t[0].logp_sampled = {-1.f};
  EXPECT_FALSE(BuildRlBatch(t, std::vector<double>{1.0}).ok());
  t[0].logp_sampled.clear();
  EXPECT_TRUE(BuildRlBatch(t, std::vector<double>{1.0}).ok());
  t[0].prompt_ids.clear();
  EXPECT_FALSE(BuildRlBatch(t, std::vector<double>{1.0}).ok());
}

TEST(SplitEvenTest, Ranges) {
  const auto parts = SplitEven(10, 4);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0], (IndexRange{0, 2}));
  EXPECT_EQ(parts[1], (IndexRange{2, 5}));
  EXPECT_EQ(parts[3], (IndexRange{7, 10}));
  int64_t total = 0;
  for (auto r : SplitEven(7, 3)) total += r.size();
  EXPECT_EQ(total, 7);
}

TEST(DropStaleTest, CountsAndKeepsOrder) {
  std::vector<Trajectory> t(5);
  const int64_t versions[] = {5, 3, 4, 2, 5};
  for (int i = 0; i < 5; ++i) {
    t[i].policy_version = versions[i];
    t[i].group = i;
  }
  auto s = DropStale(&t, 5, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dropped, 2);
  EXPECT_EQ(s->kept, 3);
  EXPECT_EQ(s->max_kept_staleness, 1);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].group, 0);
  EXPECT_EQ(t[1].group, 2);
  EXPECT_EQ(t[2].group, 4);
  // Sync mode: staleness 0 keeps only the current version.
  s = DropStale(&t, 5, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dropped, 1);
  EXPECT_EQ(s->max_kept_staleness, 0);
  // A trajectory from the future is a bug upstream.
  t[0].policy_version = 9;
  EXPECT_FALSE(DropStale(&t, 5, 1).ok());
  EXPECT_FALSE(DropStale(&t, 9, -1).ok());
}

TEST(DecodeCompletionTest, StopsAtEos) {
  const auto tok = model::CharTokenizer::Default();
  std::vector<int32_t> ids = tok.Encode("42");
  ids.push_back(tok.eos());
  for (int32_t id : tok.Encode("junk")) ids.push_back(id);
  CompletionText c = DecodeCompletion(ids, tok);
  EXPECT_EQ(c.text, "42");
  EXPECT_TRUE(c.terminated);
  c = DecodeCompletion(tok.Encode("4 2"), tok);
  EXPECT_EQ(c.text, "4 2");
  EXPECT_FALSE(c.terminated);
}

}  // namespace
}  // namespace tandem::rl
