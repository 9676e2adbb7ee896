// Sequence-parallel attention over a packed batch of several sequences
// (worker/model/softmax_attention_sp.h, linear_attention_sp.h slices): the
// rows split over 1-4 ranks (threads over one store) by SliceBounds, so
// slices start and end inside sequences and hold sequence starts. Softmax
// (full and sliding window, GQA) forward and backward and linear attention
// forward and backward equal the single-rank reference kernels within a
// relative error of 2e-5 (max abs error / max abs value).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/backends.h"
#include "tests/comm/comm_test_util.h"
#include "worker/model/linear_attention_sp.h"
#include "worker/model/softmax_attention_sp.h"

namespace tandem::model {
namespace {

using comm::testing::RunRanks;
using comm::testing::Values;
constexpr comm::Timeout kT{20000};
constexpr double kTol = 2e-5;

// Sequences of 50, 3, 90, 1 and 33 rows.
const std::vector<int32_t> kCu{0, 50, 53, 143, 144, 177};

SequenceSlice SliceOf(int rank, int size) {
  const std::vector<int> b = SliceBounds(kCu.back(), size);
  SequenceSlice s;
  s.rank = rank;
  s.size = size;
  s.offset = b[rank];
  s.rows = b[rank + 1] - b[rank];
  s.global_cu = kCu;
  s.bounds = b;
  return s;
}

// The local pieces of the sequences in a slice.
std::vector<int32_t> LocalCu(const SequenceSlice& s) {
  std::vector<int32_t> cu{0};
  for (size_t i = 1; i < kCu.size(); ++i) {
    const int end = std::clamp(kCu[i], s.offset, s.offset + s.rows) - s.offset;
    if (end > cu.back()) cu.push_back(end);
  }
  return cu;
}

double Rel(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e = std::max(e, std::fabs(double(got[i]) - want[i]));
    m = std::max(m, std::fabs(double(want[i])));
  }
  return e / m;
}

// (ranks, (window, attention sinks))
class SoftmaxSpTest : public ::testing::TestWithParam<std::tuple<int, std::pair<int, int>>> {};

TEST_P(SoftmaxSpTest, ForwardAndBackwardEqualSingleRank) {
  const auto [n, window_sinks] = GetParam();
  const auto [window, sinks] = window_sinks;
  const int T = kCu.back(), H = 4, Hkv = 2, D = 16;
  kernels::AttentionParams p;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.window = window;
  p.sinks = sinks;
  const size_t nq = size_t(T) * H * D, nk = size_t(T) * Hkv * D;
  auto q = Values(0, nq, 1), k = Values(0, nk, 2), v = Values(0, nk, 3), dout = Values(0, nq, 4);
  auto ref = kernels::MakeReferenceOps();
  std::vector<float> out(nq), lse(size_t(T) * H), dq(nq), dk(nk), dv(nk);
  const int ns = int(kCu.size()) - 1;
  ref->attention_forward(p, q.data(), k.data(), v.data(), kCu.data(), ns, T, out.data(), lse.data());
  ref->attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), kCu.data(), ns, T,
                          dq.data(), dk.data(), dv.data());
  std::vector<float> gout(nq, NAN), glse(lse.size(), NAN), gdq(nq, NAN), gdk(nk, NAN), gdv(nk, NAN);
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeCpuOps(1);
    const SequenceSlice s = SliceOf(c.rank(), n);
    const size_t oq = size_t(s.offset) * H * D, ok = size_t(s.offset) * Hkv * D;
    SoftmaxSpScratch scratch;
    ASSERT_TRUE(SoftmaxAttentionSpForward(c, *ops, p, s, q.data() + oq, k.data() + ok, v.data() + ok, gout.data() + oq,
                                          glse.data() + size_t(s.offset) * H, scratch, kT)
                    .ok());
    ASSERT_TRUE(SoftmaxAttentionSpBackward(c, *ops, p, s, q.data() + oq, k.data() + ok, v.data() + ok, gout.data() + oq,
                                           dout.data() + oq, glse.data() + size_t(s.offset) * H, gdq.data() + oq,
                                           gdk.data() + ok, gdv.data() + ok, scratch, kT)
                    .ok());
  });
  EXPECT_LT(Rel(gout, out), kTol);
  EXPECT_LT(Rel(glse, lse), kTol);
  EXPECT_LT(Rel(gdq, dq), kTol);
  EXPECT_LT(Rel(gdk, dk), kTol);
  EXPECT_LT(Rel(gdv, dv), kTol);
  std::printf("[softmax sp] ranks %d window %d sinks %d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", n, window, sinks,
              Rel(gout, out), Rel(glse, lse), Rel(gdq, dq), Rel(gdk, dk), Rel(gdv, dv));
}

INSTANTIATE_TEST_SUITE_P(Ranks, SoftmaxSpTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(std::pair{-1, 0}, std::pair{9, 0}, std::pair{9, 3})));

TEST(SoftmaxSpTest, RefusesASliceOfAnotherGroup) {
  RunRanks(2, [&](comm::Collective& c) {
    auto ops = kernels::MakeCpuOps(1);
    SequenceSlice s = SliceOf(c.rank(), 3);
    kernels::AttentionParams p;
    p.head_dim = 4;
    std::vector<float> buf(size_t(kCu.back()) * 4);
    SoftmaxSpScratch scratch;
    const absl::Status st = SoftmaxAttentionSpForward(c, *ops, p, s, buf.data(), buf.data(), buf.data(), buf.data(),
                                                      buf.data(), scratch, kT);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("of 3"), std::string::npos) << st;
  });
}

class LinearSliceTest : public ::testing::TestWithParam<int> {};

TEST_P(LinearSliceTest, PackedSequencesEqualSingleRank) {
  const int n = GetParam();
  const int T = kCu.back(), H = 2, dk = 8, dv = 12;
  kernels::LinearAttentionParams p{H, dk, dv, 0.f};
  const size_t nq = size_t(T) * H * dk, nv = size_t(T) * H * dv;
  auto q = Values(2, nq, 1), k = Values(2, nq, 2), v = Values(2, nv, 3), g = Values(2, size_t(T) * H, 4),
       dout = Values(2, nv, 5);
  for (float& x : g) x = -0.1f * (x + 1.f);
  auto ref = kernels::MakeReferenceOps();
  const int ns = int(kCu.size()) - 1;
  std::vector<float> out(nv), wq(nq), wk(nq), wv(nv);
  ref->linear_attention_forward(p, q.data(), k.data(), v.data(), g.data(), kCu.data(), ns, T, nullptr, out.data(),
                                nullptr);
  ref->linear_attention_backward(p, q.data(), k.data(), v.data(), g.data(), kCu.data(), ns, T, nullptr, dout.data(),
                                 nullptr, wq.data(), wk.data(), wv.data(), nullptr, nullptr);
  std::vector<float> gout(nv, NAN), gq(nq, NAN), gk(nq, NAN), gv(nv, NAN);
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeCpuOps(1);
    const SequenceSlice s = SliceOf(c.rank(), n);
    const std::vector<int32_t> cu = LocalCu(s);
    const int m = int(cu.size()) - 1;
    const size_t oq = size_t(s.offset) * H * dk, ov = size_t(s.offset) * H * dv, og = size_t(s.offset) * H;
    ASSERT_TRUE(LinearAttentionSliceForward(c, *ops, p, s, cu.data(), m, q.data() + oq, k.data() + oq, v.data() + ov,
                                            g.data() + og, gout.data() + ov, kT)
                    .ok());
    ASSERT_TRUE(LinearAttentionSliceBackward(c, *ops, p, s, cu.data(), m, q.data() + oq, k.data() + oq, v.data() + ov,
                                             g.data() + og, dout.data() + ov, gq.data() + oq, gk.data() + oq,
                                             gv.data() + ov, kT)
                    .ok());
  });
  EXPECT_LT(Rel(gout, out), kTol);
  EXPECT_LT(Rel(gq, wq), kTol);
  EXPECT_LT(Rel(gk, wk), kTol);
  EXPECT_LT(Rel(gv, wv), kTol);
  std::printf("[linear slice sp] ranks %d: out %.1e dq %.1e dk %.1e dv %.1e\n", n, Rel(gout, out), Rel(gq, wq),
              Rel(gk, wk), Rel(gv, wv));
}

INSTANTIATE_TEST_SUITE_P(Ranks, LinearSliceTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace tandem::model
