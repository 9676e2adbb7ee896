// GRPO math against hand-computed values and central finite differences.
#include "worker/rl/grpo.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace tandem::rl {
namespace {

TEST(GroupAdvantagesTest, HandComputed) {
  const std::vector<double> r = {1, 0, 0, 1, 2, 2, 2, 2};
  AdvantageOptions o{.group_size = 4};
  auto a = GroupAdvantages(r, o);
  ASSERT_TRUE(a.ok()) << a.status();
  // Group 1: mean 0.5, unbiased std sqrt(1/3) = 0.5773503.
  const double s = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-4);
  EXPECT_NEAR((*a)[0], s, 1e-12);
  EXPECT_NEAR((*a)[1], -s, 1e-12);
  EXPECT_NEAR((*a)[2], -s, 1e-12);
  EXPECT_NEAR((*a)[3], s, 1e-12);
  for (int i = 4; i < 8; ++i) EXPECT_EQ((*a)[i], 0.0);  // equal rewards

  o.unbiased_std = false;  // population std 0.5
  a = GroupAdvantages(r, o);
  ASSERT_TRUE(a.ok());
  EXPECT_NEAR((*a)[0], 0.5 / 0.5001, 1e-12);

  o.scale_by_std = false;  // Dr. GRPO: mean only
  a = GroupAdvantages(r, o);
  ASSERT_TRUE(a.ok());
  EXPECT_DOUBLE_EQ((*a)[0], 0.5);
  EXPECT_DOUBLE_EQ((*a)[1], -0.5);

  // Group of 3 with rewards 0, 0, 3: mean 1, unbiased std sqrt(3).
  a = GroupAdvantages(std::vector<double>{0, 0, 3}, {.group_size = 3, .eps = 0});
  ASSERT_TRUE(a.ok());
  EXPECT_NEAR((*a)[2], 2 / std::sqrt(3.0), 1e-12);
  EXPECT_NEAR((*a)[0], -1 / std::sqrt(3.0), 1e-12);

  // Group of one: advantage 0.
  a = GroupAdvantages(std::vector<double>{5, 7}, {.group_size = 1});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0], 0.0);
  EXPECT_EQ((*a)[1], 0.0);
}

TEST(GroupAdvantagesTest, Errors) {
  EXPECT_FALSE(GroupAdvantages(std::vector<double>{1, 2, 3}, {.group_size = 2}).ok());
  EXPECT_FALSE(GroupAdvantages(std::vector<double>{1, 2}, {.group_size = 0}).ok());
  EXPECT_FALSE(GroupAdvantages(std::vector<double>{1, NAN}, {.group_size = 2}).ok());
}

// Tokens: r = 1.5, 0.5, 1.1 (masked) and one unmasked token.
struct Tiny {
  std::vector<double> new_ = {std::log(1.5), std::log(0.5), std::log(1.1), 0.3};
  std::vector<double> old_ = {0, 0, 0, 0};
  std::vector<double> ref_ = {0, 0, 0, 0};
  std::vector<double> adv_ = {1, -1, 1, 5};
  std::vector<double> mask_ = {1, 1, 1, 0};
  std::vector<int32_t> cu_ = {0, 2, 4};
  PolicyLossInput<double> In(bool with_ref = false) const {
    return {new_, old_, with_ref ? std::span<const double>(ref_) : std::span<const double>(), adv_, mask_, cu_};
  }
};

TEST(PolicyLossTest, SymmetricClipHandComputed) {
  Tiny t;
  auto r = PolicyLoss(t.In(), PolicyLossOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  // pg = -min(rA, clip(r)A): -1.2 (clipped), 0.8 (clipped), -1.1.
  EXPECT_NEAR(r->loss, (-1.2 + 0.8 - 1.1) / 3, 1e-12);
  EXPECT_NEAR(r->dlogp[0], 0.0, 1e-15);
  EXPECT_NEAR(r->dlogp[1], 0.0, 1e-15);
  EXPECT_NEAR(r->dlogp[2], -1.1 / 3, 1e-12);
  EXPECT_EQ(r->dlogp[3], 0.0);
  EXPECT_NEAR(r->clip_fraction, 2.0 / 3, 1e-12);
  EXPECT_NEAR(r->ratio_mean, (1.5 + 0.5 + 1.1) / 3, 1e-12);
  EXPECT_EQ(r->masked_tokens, 3);
  EXPECT_EQ(r->kl_mean, 0);
}

TEST(PolicyLossTest, AsymmetricClipHandComputed) {
  Tiny t;
  auto r = PolicyLoss(t.In(), {.clip_low = 0.2, .clip_high = 0.6});
  ASSERT_TRUE(r.ok());
  // r = 1.5 < 1.6 is no longer clipped: pg -1.5, gradient -1.5.
  EXPECT_NEAR(r->loss, (-1.5 + 0.8 - 1.1) / 3, 1e-12);
  EXPECT_NEAR(r->dlogp[0], -1.5 / 3, 1e-12);
  EXPECT_NEAR(r->dlogp[1], 0.0, 1e-15);
  EXPECT_NEAR(r->clip_fraction, 1.0 / 3, 1e-12);
  // A wider low clip un-clips r = 0.5 with A < 0: pg = -(0.5 * -1) = 0.5.
  r = PolicyLoss(t.In(), {.clip_low = 0.6, .clip_high = 0.6});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->loss, (-1.5 + 0.5 - 1.1) / 3, 1e-12);
  EXPECT_NEAR(r->dlogp[1], 0.5 / 3, 1e-12);
}

TEST(PolicyLossTest, KlK3HandComputed) {
  Tiny t;
  auto r = PolicyLoss(t.In(true), {.kl_coef = 0.1});
  ASSERT_TRUE(r.ok());
  // k3 = exp(ref-new) - (ref-new) - 1 with ref = 0:
  const double kl0 = 1 / 1.5 + std::log(1.5) - 1;  // 0.0721318
  const double kl1 = 2 - std::log(2.0) - 1;        // 0.3068528
  const double kl2 = 1 / 1.1 + std::log(1.1) - 1;  // 0.0044010
  EXPECT_NEAR(kl0, 0.0721318, 1e-7);
  EXPECT_NEAR(kl1, 0.3068528, 1e-7);
  EXPECT_NEAR(kl2, 0.0044010, 1e-7);
  EXPECT_NEAR(r->kl_mean, (kl0 + kl1 + kl2) / 3, 1e-12);
  EXPECT_NEAR(r->loss, (-1.2 + 0.8 - 1.1 + 0.1 * (kl0 + kl1 + kl2)) / 3, 1e-12);
  // d k3 / d new = 1 - exp(ref - new).
  EXPECT_NEAR(r->dlogp[0], 0.1 * (1 - 1 / 1.5) / 3, 1e-12);
  EXPECT_NEAR(r->dlogp[1], 0.1 * (1 - 2.0) / 3, 1e-12);
  EXPECT_NEAR(r->dlogp[2], (-1.1 + 0.1 * (1 - 1 / 1.1)) / 3, 1e-12);
  // KL is reported with kl_coef 0 too when reference log-probs are given.
  r = PolicyLoss(t.In(true), {});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->kl_mean, (kl0 + kl1 + kl2) / 3, 1e-12);
  EXPECT_NEAR(r->loss, (-1.2 + 0.8 - 1.1) / 3, 1e-12);
}

TEST(PolicyLossTest, SequenceAggregationAndExternalNormaliser) {
  Tiny t;
  auto r = PolicyLoss(t.In(), {.aggregation = LossAggregation::kSequence});
  ASSERT_TRUE(r.ok()) << r.status();
  // Sequence 0: tokens 0, 1 (2 masked); sequence 1: token 2 (1 masked).
  EXPECT_NEAR(r->loss, ((-1.2 + 0.8) / 2 + -1.1) / 2, 1e-12);
  EXPECT_NEAR(r->dlogp[2], -1.1 / 2, 1e-12);
  EXPECT_EQ(r->sequences, 2);
  // Global normalisers (e.g. 6 tokens / 4 sequences across all ranks).
  r = PolicyLoss(t.In(), {}, 6.0);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->loss, -1.5 / 6, 1e-12);
  EXPECT_NEAR(r->dlogp[2], -1.1 / 6, 1e-12);
  r = PolicyLoss(t.In(), {.aggregation = LossAggregation::kSequence}, 4.0);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->loss, (-0.2 - 1.1) / 4, 1e-12);
}

TEST(PolicyLossTest, SplittingAcrossRanksWithGlobalNormaliserIsExact) {
  // Loss and gradient over the whole batch equal the sums over two halves
  // computed with the global normaliser.
  Tiny t;
  auto whole = PolicyLoss(t.In(true), {.kl_coef = 0.05});
  ASSERT_TRUE(whole.ok());
  double sum = 0;
  for (int half = 0; half < 2; ++half) {
    const size_t b = half * 2;
    PolicyLossInput<double> in{
        std::span<const double>(t.new_).subspan(b, 2),  std::span<const double>(t.old_).subspan(b, 2),
        std::span<const double>(t.ref_).subspan(b, 2),  std::span<const double>(t.adv_).subspan(b, 2),
        std::span<const double>(t.mask_).subspan(b, 2), {}};
    auto part = PolicyLoss(in, {.kl_coef = 0.05}, whole->masked_tokens);
    ASSERT_TRUE(part.ok());
    sum += part->loss;
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(part->dlogp[i], whole->dlogp[b + i], 1e-15);
    }
  }
  EXPECT_NEAR(sum, whole->loss, 1e-15);
}

TEST(PolicyLossTest, GradientMatchesCentralDifferences) {
  std::mt19937_64 gen(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int n = 64;
  std::vector<double> lnew(n), lold(n), lref(n), adv(n), mask(n);
  std::vector<int32_t> cu = {0, 10, 11, 30, 47, 64};
  for (int i = 0; i < n; ++i) {
    lold[i] = -1.0 + 0.5 * normal(gen);
    lnew[i] = lold[i] + 0.3 * normal(gen);  // ratios spread over clip edges
    lref[i] = lold[i] + 0.2 * normal(gen);
    adv[i] = normal(gen);
    mask[i] = (i % 7 == 3) ? 0.0 : 1.0;
  }
  for (auto agg : {LossAggregation::kToken, LossAggregation::kSequence}) {
    const PolicyLossOptions o{.clip_low = 0.2, .clip_high = 0.28, .kl_coef = 0.04, .aggregation = agg};
    PolicyLossInput<double> in{lnew, lold, lref, adv, mask, cu};
    auto r = PolicyLoss(in, o, agg == LossAggregation::kToken ? 100.0 : 0.0);
    ASSERT_TRUE(r.ok()) << r.status();
    const double h = 1e-6;
    int checked = 0;
    for (int i = 0; i < n; ++i) {
      const double ratio = std::exp(lnew[i] - lold[i]);
      // Skip points within reach of the clip kinks.
      if (std::abs(ratio - 0.8) < 1e-4 || std::abs(ratio - 1.28) < 1e-4) continue;
      std::vector<double> plus = lnew, minus = lnew;
      plus[i] += h;
      minus[i] -= h;
      const double norm = agg == LossAggregation::kToken ? 100.0 : 0.0;
      PolicyLossInput<double> p = in, m = in;
      p.logp_new = plus;
      m.logp_new = minus;
      const double fd = (PolicyLoss(p, o, norm).value().loss - PolicyLoss(m, o, norm).value().loss) / (2 * h);
      EXPECT_NEAR(r->dlogp[i], fd, 1e-8 + 1e-6 * std::abs(fd)) << "token " << i;
      ++checked;
    }
    EXPECT_GT(checked, 55);
    EXPECT_GT(r->clip_fraction, 0.05);  // the test crosses clipped tokens
    EXPECT_LT(r->clip_fraction, 0.9);
  }
}

TEST(PolicyLossTest, FloatMatchesDouble) {
  Tiny t;
  std::vector<float> nf(t.new_.begin(), t.new_.end()), of(t.old_.begin(), t.old_.end()),
      rf(t.ref_.begin(), t.ref_.end()), af(t.adv_.begin(), t.adv_.end()), mf(t.mask_.begin(), t.mask_.end());
  PolicyLossInput<float> in{nf, of, rf, af, mf, t.cu_};
  auto f = PolicyLoss(in, {.kl_coef = 0.1});
  auto d = PolicyLoss(t.In(true), {.kl_coef = 0.1});
  ASSERT_TRUE(f.ok() && d.ok());
  EXPECT_NEAR(f->loss, d->loss, 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f->dlogp[i], d->dlogp[i], 1e-6);
}

TEST(PolicyLossTest, Errors) {
  Tiny t;
  PolicyLossInput<double> in = t.In();
  EXPECT_FALSE(PolicyLoss(in, {.kl_coef = 0.1}).ok());  // no reference
  in.mask = std::span<const double>(t.mask_).subspan(0, 3);
  EXPECT_FALSE(PolicyLoss(in, {}).ok());
  in = t.In();
  EXPECT_FALSE(PolicyLoss(in, {.clip_low = 1.5}).ok());
  EXPECT_FALSE(PolicyLoss(in, {.kl_coef = -1}).ok());
  in.cu_seqlens = {};
  EXPECT_FALSE(PolicyLoss(in, {.aggregation = LossAggregation::kSequence}).ok());
  // No masked tokens: zero loss and gradient, not NaN.
  std::vector<double> zero(4, 0.0);
  in = t.In();
  in.mask = zero;
  auto r = PolicyLoss(in, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->loss, 0.0);
  EXPECT_EQ(r->clip_fraction, 0.0);
}

}  // namespace
}  // namespace tandem::rl
