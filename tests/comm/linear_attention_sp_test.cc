// Sequence-parallel linear attention (worker/model/linear_attention_sp.h):
// one 300-token sequence split over 1-4 ranks (threads over one store,
// uneven chunks, a data-dependent gate) equals the single-rank forward, and
// the SP backward (dq, dk, dv, d log decay) the single-rank backward; the
// all_scan bytes per rank are one state whatever the number of ranks.
#include <cstdio>
#include <vector>

#include "kernels/backends.h"
#include "tests/comm/comm_test_util.h"
#include "worker/model/linear_attention_sp.h"

namespace tandem::model {
namespace {

using comm::testing::RunRanks;
using comm::testing::Values;
constexpr comm::Timeout kT{20000};

class LinearSpTest : public ::testing::TestWithParam<int> {};

TEST_P(LinearSpTest, EqualsSingleRankForward) {
  const int n = GetParam();
  const int T = 300, H = 2, dk = 16, dv = 24;
  kernels::LinearAttentionParams p{H, dk, dv, 0.f};
  auto q = Values(0, size_t(T) * H * dk, 1), k = Values(0, size_t(T) * H * dk, 2), v = Values(0, size_t(T) * H * dv, 3),
       g = Values(0, size_t(T) * H, 4);
  for (float& x : g) x = -0.1f * (x + 1.f);  // log decay in [-0.2, 0]
  auto ref_ops = kernels::MakeReferenceOps();
  std::vector<float> want(size_t(T) * H * dv);
  const int32_t cu[2] = {0, T};
  ref_ops->linear_attention_forward(p, q.data(), k.data(), v.data(), g.data(), cu, 1, T, nullptr, want.data(), nullptr);
  // Uneven chunks: rank r holds [bounds[r], bounds[r+1]).
  std::vector<int> bounds{0};
  for (int r = 1; r < n; ++r) bounds.push_back(T * r / n + (r % 2 ? 7 : -5));
  bounds.push_back(T);
  std::vector<float> got(want.size(), NAN);
  std::vector<uint64_t> sent(n);
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeCpuOps(1);
    const int r = c.rank(), t0 = bounds[r], t = bounds[r + 1] - t0;
    ASSERT_TRUE(LinearAttentionSpForward(c, *ops, p, q.data() + size_t(t0) * H * dk, k.data() + size_t(t0) * H * dk,
                                         v.data() + size_t(t0) * H * dv, g.data() + size_t(t0) * H, t,
                                         got.data() + size_t(t0) * H * dv, kT)
                    .ok());
    sent[r] = c.bytes(comm::CollectiveKind::kAllScan).sent + c.bytes(comm::CollectiveKind::kAllScan).received;
  });
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    ref = std::max(ref, std::fabs(double(want[i])));
  }
  EXPECT_LT(err / ref, 1e-5);
  const uint64_t state_bytes = uint64_t{H} * dk * dv * sizeof(float);
  for (int r = 0; r < n; ++r) EXPECT_LE(sent[r], 2 * state_bytes) << "rank " << r;
  std::printf(
      "[linear sp] ranks %d: max rel err %.2e, all_scan bytes per rank (sent + "
      "received) max %llu, one state = %llu\n",
      n, err / ref, (unsigned long long)*std::max_element(sent.begin(), sent.end()), (unsigned long long)state_bytes);
}

TEST_P(LinearSpTest, BackwardEqualsSingleRank) {
  const int n = GetParam();
  const int T = 260, H = 2, dk = 8, dv = 12;
  kernels::LinearAttentionParams p{H, dk, dv, 0.f};
  auto q = Values(1, size_t(T) * H * dk, 1), k = Values(1, size_t(T) * H * dk, 2), v = Values(1, size_t(T) * H * dv, 3),
       g = Values(1, size_t(T) * H, 4), dout = Values(1, size_t(T) * H * dv, 5);
  for (float& x : g) x = -0.1f * (x + 1.f);
  auto ref_ops = kernels::MakeReferenceOps();
  const size_t nq = size_t(T) * H * dk, nv = size_t(T) * H * dv, ng = size_t(T) * H;
  std::vector<float> wq(nq), wk(nq), wv(nv), wg(ng);
  const int32_t cu[2] = {0, T};
  ref_ops->linear_attention_backward(p, q.data(), k.data(), v.data(), g.data(), cu, 1, T, nullptr, dout.data(), nullptr,
                                     wq.data(), wk.data(), wv.data(), wg.data(), nullptr);
  std::vector<int> bounds{0};
  for (int r = 1; r < n; ++r) bounds.push_back(T * r / n + (r % 2 ? 5 : -3));
  bounds.push_back(T);
  std::vector<float> gq(nq, NAN), gk(nq, NAN), gv(nv, NAN), gg(ng, NAN);
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeCpuOps(1);
    const int r = c.rank(), t0 = bounds[r], t = bounds[r + 1] - t0;
    const size_t oq = size_t(t0) * H * dk, ov = size_t(t0) * H * dv, og = size_t(t0) * H;
    ASSERT_TRUE(LinearAttentionSpBackward(c, *ops, p, q.data() + oq, k.data() + oq, v.data() + ov, g.data() + og, t,
                                          dout.data() + ov, gq.data() + oq, gk.data() + oq, gv.data() + ov,
                                          gg.data() + og, kT)
                    .ok());
  });
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      e = std::max(e, std::fabs(double(a[i]) - b[i]));
      m = std::max(m, std::fabs(double(b[i])));
    }
    return e / m;
  };
  EXPECT_LT(rel(gq, wq), 1e-5);
  EXPECT_LT(rel(gk, wk), 1e-5);
  EXPECT_LT(rel(gv, wv), 1e-5);
  EXPECT_LT(rel(gg, wg), 1e-4);
  std::printf("[linear sp backward] ranks %d: dq %.2e dk %.2e dv %.2e dg %.2e\n", n, rel(gq, wq), rel(gk, wk),
              rel(gv, wv), rel(gg, wg));
}

INSTANTIATE_TEST_SUITE_P(Ranks, LinearSpTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace tandem::model
