// Linear attention with decay:
//  * the reference backward (ref/linear_attention_ref_math.h in double)
//    against central finite differences of L = sum(out * G) +
//    sum(final_state * F), every input: q, k, v, log decay, initial state;
//  * decode: the fast CPU backend stepping one token at a time with the state
//    updated in place equals the chunked forward over the whole sequence.
// (The chunked CPU backend and the CUDA kernels against the reference
// recurrence: the linear_attention rows of kernels_ops_test.)
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backends.h"
#include "kernels/ref/linear_attention_ref_math.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

using testing::RandomVec;
using testing::RelErr;

struct Shape {
  std::vector<int32_t> lens;
  int h, dk, dv;
  bool decay, state;
};

class LinearAttentionGradcheck : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearAttentionGradcheck, ReferenceBackwardMatchesFiniteDifferences) {
  const Shape& s = GetParam();
  std::vector<int32_t> cu{0};
  for (int32_t len : s.lens) cu.push_back(cu.back() + len);
  const int nseq = int(s.lens.size()), tt = cu.back();
  LinearAttentionParams p;
  p.num_heads = s.h;
  p.key_dim = s.dk;
  p.value_dim = s.dv;
  const size_t rows = size_t(tt) * s.h, ns = size_t(nseq) * s.h * s.dk * s.dv;
  std::vector<double> q = RandomVec<double>(rows * s.dk, 1), k = RandomVec<double>(rows * s.dk, 2),
                      v = RandomVec<double>(rows * s.dv, 3), g = RandomVec<double>(rows, 4, -1.0, 0.0),
                      init = RandomVec<double>(ns, 5), gout = RandomVec<double>(rows * s.dv, 6),
                      gfin = RandomVec<double>(ns, 7);
  const double* gp = s.decay ? g.data() : nullptr;
  const double* ip = s.state ? init.data() : nullptr;
  auto loss = [&]() {
    std::vector<double> out(rows * s.dv), fin(ns);
    ref::LinearAttentionForwardT<double>(p, q.data(), k.data(), v.data(), gp, cu.data(), nseq, ip, out.data(),
                                         fin.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * gout[i];
    if (s.state)
      for (size_t i = 0; i < ns; ++i) l += fin[i] * gfin[i];
    return l;
  };
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dg(rows), dinit(ns);
  ref::LinearAttentionBackwardT<double>(p, q.data(), k.data(), v.data(), gp, cu.data(), nseq, ip, gout.data(),
                                        s.state ? gfin.data() : nullptr, dq.data(), dk.data(), dv.data(),
                                        s.decay ? dg.data() : nullptr, s.state ? dinit.data() : nullptr);
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    std::vector<double> fd(x.size());
    const double h = 1e-5;
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = loss();
      x[i] = x0 - h;
      const double lm = loss();
      x[i] = x0;
      fd[i] = (lp - lm) / (2 * h);
    }
    EXPECT_LT(RelErr(grad, fd), 1e-7) << name;
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
  if (s.decay) check(g, dg, "dg");
  if (s.state) check(init, dinit, "d_initial_state");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearAttentionGradcheck,
                         ::testing::Values(Shape{{1}, 1, 2, 3, true, false}, Shape{{4}, 2, 3, 2, true, true},
                                           Shape{{3, 0, 5}, 2, 2, 3, true, true}, Shape{{6}, 1, 3, 3, false, true},
                                           Shape{{5, 2}, 1, 4, 2, false, false}));

// Token-by-token decode with the state updated in place equals one chunked
// forward over the sequences (lengths beyond one 64-token chunk).
TEST(LinearAttentionDecode, StepsEqualChunkedForward) {
  auto ops = MakeCpuOps(2);
  const int H = 3, dk = 32, dv = 48;
  const std::vector<int32_t> lens{150, 70};
  const int nseq = int(lens.size()), steps = 150;
  LinearAttentionParams p;
  p.num_heads = H;
  p.key_dim = dk;
  p.value_dim = dv;
  std::vector<int32_t> cu{0, lens[0], lens[0] + lens[1]};
  const int tt = cu.back();
  auto q = RandomVec(size_t(tt) * H * dk, 11), k = RandomVec(q.size(), 12), v = RandomVec(size_t(tt) * H * dv, 13),
       g = RandomVec(size_t(tt) * H, 14, -0.3, 0);
  const size_t ns = size_t(nseq) * H * dk * dv;
  auto init = RandomVec(ns, 15);
  std::vector<float> out(size_t(tt) * H * dv), fin(ns);
  ops->linear_attention_forward(p, q.data(), k.data(), v.data(), g.data(), cu.data(), nseq, tt, init.data(), out.data(),
                                fin.data());
  // Decode: every step feeds one token of each unfinished sequence.
  std::vector<float> state = init, step_out(size_t(tt) * H * dv, NAN);
  for (int step = 0; step < steps; ++step) {
    for (int b = 0; b < nseq; ++b) {
      if (step >= lens[b]) continue;
      const size_t row = size_t(cu[b] + step) * H;
      const int32_t one[2] = {0, 1};
      ops->linear_attention_forward(p, q.data() + row * dk, k.data() + row * dk, v.data() + row * dv, g.data() + row,
                                    one, 1, 1, state.data() + size_t(b) * H * dk * dv, step_out.data() + row * dv,
                                    state.data() + size_t(b) * H * dk * dv);
    }
  }
  EXPECT_LT(RelErr(step_out, out), 1e-5);
  EXPECT_LT(RelErr(state, fin), 1e-5);
}

}  // namespace
}  // namespace tandem::kernels
