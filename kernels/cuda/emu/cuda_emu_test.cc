// kernels_cuda_emu_test: runs the CUDA kernels with block-level cooperation
// (attention forward/backward, decode attention, RMSNorm, the LM head row
// kernels, sum_squares, AdamW; the very device code of
// kernels/cuda/*_kernel.cuh) on the CPU
// emulator of cuda_emu.h and compares them with the reference backend. It
// needs no GPU and no CUDA toolkit, so CI checks the kernels' tiling, varlen
// lookup, GQA, masks and online softmax on every run. Error metric and bound
// as kernels_gpu_test: max |emu - ref| / max(max |ref|, 1e-2) <= 1e-4.
// Exit status 1 on any failure.
#include "kernels/cuda/emu/cuda_emu.h"
// The emulator must come first: it defines the CUDA keywords.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/attention_bwd_kernel.cuh"
#include "kernels/cuda/sample_kernel.cuh"
#include "kernels/cuda/attention_fwd_kernel.cuh"
#include "kernels/cuda/decode_attention_kernel.cuh"
#include "kernels/cuda/lm_head_kernel.cuh"
#include "kernels/cuda/optimizer_kernel.cuh"
#include "kernels/cuda/rmsnorm_kernel.cuh"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

constexpr double kTol = 1e-4;
// Outputs smaller than this in magnitude are compared absolutely (e.g. the
// dq of a one-token sequence, exactly 0 in the reference).
constexpr double kErrFloor = 1e-2;
int g_failed = 0;
int g_checks = 0;

std::vector<float> Uniform(std::mt19937_64& gen, size_t n) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

double RelErr(const std::vector<float>& got, const std::vector<float>& ref) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(ref[i])));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_diff / std::max(max_ref, kErrFloor);
}

void Expect(const char* what, const std::string& shape, double err) {
  ++g_checks;
  const bool ok = err <= kTol;
  if (!ok) ++g_failed;
  std::printf("%-24s %-40s %10.3e %s\n", what, shape.c_str(), err,
              ok ? "PASS" : "FAIL");
  std::fflush(stdout);
}

float Scale(const AttentionParams& p) {
  return p.scale != 0.f ? p.scale : 1.f / sqrtf(static_cast<float>(p.head_dim));
}

void EmuForward(const AttentionParams& p, const float* q, const float* k,
                const float* v, const int32_t* cu, int nseq, int t, float* out,
                float* lse) {
  const cuda::AttnFwdArgs a{q,          k,           v,
                            out,        lse,         cu,
                            nseq,       p.num_heads, p.num_kv_heads,
                            p.head_dim, p.causal,    p.window,
                            Scale(p)};
  cuda::DispatchAttnTiles(p.head_dim, [&]<int kMaxD, int kBr, int kBc>() {
    tandem_emu::Launch(dim3(cuda::TileGridX(t, nseq, kBr), p.num_heads),
                       dim3(cuda::kAttnThreads),
                       cuda::FwdSmemBytes<kMaxD, kBr, kBc>(),
                       [&] { cuda::AttnFwdKernel<kMaxD, kBr, kBc>(a); });
  });
}

void EmuBackward(const AttentionParams& p, const float* q, const float* k,
                 const float* v, const float* out, const float* dout,
                 const float* lse, const int32_t* cu, int nseq, int t,
                 float* dq, float* dk, float* dv) {
  const size_t rows = size_t(t) * p.num_heads;
  std::vector<float> delta(rows);
  std::fill(dq, dq + rows * p.head_dim, 0.f);
  tandem_emu::Launch(dim3(cuda::GridFor(rows * cuda::kWarp, 256, 65535u * 4u)),
                     dim3(256), 0, [&] {
                       cuda::AttnDeltaKernel(out, dout, rows, p.head_dim,
                                             delta.data());
                     });
  const cuda::AttnBwdArgs a{q,
                            k,
                            v,
                            dout,
                            lse,
                            delta.data(),
                            dq,
                            dk,
                            dv,
                            cu,
                            nseq,
                            p.num_heads,
                            p.num_kv_heads,
                            p.head_dim,
                            p.causal,
                            p.window,
                            Scale(p)};
  cuda::DispatchAttnTiles(p.head_dim, [&]<int kMaxD, int kBr, int kBc>() {
    tandem_emu::Launch(dim3(cuda::TileGridX(t, nseq, kBc), p.num_kv_heads),
                       dim3(cuda::kAttnThreads),
                       cuda::BwdSmemBytes<kMaxD, kBr, kBc>(),
                       [&] { cuda::AttnBwdKernel<kMaxD, kBr, kBc>(a); });
  });
}

struct Case {
  std::vector<int> lens;
  int h, hkv, d;
  bool causal;
  int window;
};

void TestAttention(Ops& ref) {
  const Case cases[] = {
      {{1}, 2, 2, 32, true, -1},        {{37, 70, 5}, 4, 2, 64, true, -1},
      {{100, 29}, 2, 1, 128, true, 16}, {{130}, 2, 1, 40, false, -1},
      {{90}, 2, 2, 16, false, 7},       {{40}, 2, 1, 256, true, -1},
      {{65, 3}, 8, 1, 32, true, 33},
  };
  std::mt19937_64 gen(42);
  for (const Case& c : cases) {
    std::vector<int32_t> cu{0};
    for (int len : c.lens) cu.push_back(cu.back() + len);
    const int t = cu.back(), nseq = static_cast<int>(c.lens.size());
    AttentionParams p;
    p.num_heads = c.h;
    p.num_kv_heads = c.hkv;
    p.head_dim = c.d;
    p.causal = c.causal;
    p.window = c.window;
    std::string shape = "lens";
    for (size_t i = 0; i < c.lens.size(); ++i)
      shape += (i ? "," : "") + std::to_string(c.lens[i]);
    shape += " H" + std::to_string(c.h) + " Hkv" + std::to_string(c.hkv) +
             " D" + std::to_string(c.d) + (c.causal ? " causal" : " full") +
             " w" + std::to_string(c.window);
    const size_t nq = size_t(t) * c.h * c.d, nkv = size_t(t) * c.hkv * c.d;
    auto q = Uniform(gen, nq), k = Uniform(gen, nkv), v = Uniform(gen, nkv);
    std::vector<float> out(nq), lse(size_t(t) * c.h), eout(nq),
        else_(lse.size());
    ref.attention_forward(p, q.data(), k.data(), v.data(), cu.data(), nseq, t,
                          out.data(), lse.data());
    EmuForward(p, q.data(), k.data(), v.data(), cu.data(), nseq, t, eout.data(),
               else_.data());
    Expect("attention_forward out", shape, RelErr(eout, out));
    Expect("attention_forward lse", shape, RelErr(else_, lse));

    auto g = Uniform(gen, nq);
    std::vector<float> gq(nq), gk(nkv), gv(nkv), eq(nq), ek(nkv, NAN),
        ev(nkv, NAN);
    ref.attention_backward(p, q.data(), k.data(), v.data(), out.data(),
                           g.data(), lse.data(), cu.data(), nseq, t, gq.data(),
                           gk.data(), gv.data());
    EmuBackward(p, q.data(), k.data(), v.data(), out.data(), g.data(),
                lse.data(), cu.data(), nseq, t, eq.data(), ek.data(),
                ev.data());
    Expect("attention_backward dq", shape, RelErr(eq, gq));
    Expect("attention_backward dk", shape, RelErr(ek, gk));
    Expect("attention_backward dv", shape, RelErr(ev, gv));
  }
}

void TestDecode(Ops& ref) {
  struct DCase {
    int h, hkv, d, n_new, window;
  };
  const DCase cases[] = {{4, 2, 64, 1, -1},
                         {4, 2, 64, 3, -1},
                         {2, 1, 128, 1, 20},
                         {2, 2, 48, 2, 9}};
  const std::vector<int32_t> lens{5, 100, 150};
  const int batch = 3, cap = 160;
  std::mt19937_64 gen(43);
  for (const DCase& c : cases) {
    AttentionParams p;
    p.num_heads = c.h;
    p.num_kv_heads = c.hkv;
    p.head_dim = c.d;
    p.window = c.window;
    const size_t nq = size_t(batch) * c.n_new * c.h * c.d;
    const size_t nc = size_t(batch) * cap * c.hkv * c.d;
    auto q = Uniform(gen, nq), kc = Uniform(gen, nc), vc = Uniform(gen, nc);
    std::vector<float> out(nq), eout(nq, NAN);
    ref.decode_attention(p, q.data(), batch, c.n_new, kc.data(), vc.data(), cap,
                         lens.data(), out.data());
    const cuda::DecodeArgs a{q.data(),    kc.data(), vc.data(), lens.data(),
                             eout.data(), c.n_new,   cap,       c.h,
                             c.hkv,       c.d,       c.window,  Scale(p)};
    cuda::DispatchDecode(c.d, [&]<int kMaxD>() {
      tandem_emu::Launch(dim3(c.h, c.n_new, batch),
                         dim3(cuda::kDecodeWarps * cuda::kWarp), 0,
                         [&] { cuda::DecodeKernel<kMaxD>(a); });
    });
    Expect("decode_attention",
           "lens5,100,150 new" + std::to_string(c.n_new) + " H" +
               std::to_string(c.h) + " Hkv" + std::to_string(c.hkv) + " D" +
               std::to_string(c.d) + " w" + std::to_string(c.window),
           RelErr(eout, out));
  }
}

void TestRmsnorm(Ops& ref) {
  std::mt19937_64 gen(44);
  struct Shape {
    int t, c;
  };
  for (Shape s : {Shape{1, 8}, Shape{7, 33}, Shape{3, 1030}, Shape{70, 96}}) {
    const size_t n = size_t(s.t) * s.c;
    auto x = Uniform(gen, n), w = Uniform(gen, s.c);
    std::vector<float> y(n), rstd(s.t), ey(n), erstd(s.t);
    ref.rmsnorm_forward(x.data(), w.data(), s.t, s.c, 1e-5f, y.data(),
                        rstd.data());
    tandem_emu::Launch(dim3(s.t), dim3(cuda::RowThreads(s.c)), 0, [&] {
      cuda::RmsnormForwardKernel(x.data(), w.data(), s.c, 1e-5f, ey.data(),
                                 erstd.data());
    });
    const std::string shape =
        "T" + std::to_string(s.t) + " C" + std::to_string(s.c);
    Expect("rmsnorm_forward y", shape, RelErr(ey, y));
    Expect("rmsnorm_forward rstd", shape, RelErr(erstd, rstd));
    auto g = Uniform(gen, n), dw = Uniform(gen, s.c);
    auto edw = dw;
    std::vector<float> dx(n), edx(n);
    ref.rmsnorm_backward(g.data(), x.data(), w.data(), rstd.data(), s.t, s.c,
                         dx.data(), dw.data());
    tandem_emu::Launch(dim3(s.t), dim3(cuda::RowThreads(s.c)), 0, [&] {
      cuda::RmsnormBackwardDxKernel(g.data(), x.data(), w.data(), rstd.data(),
                                    s.c, edx.data());
    });
    tandem_emu::Launch(dim3((s.c + cuda::kDwThreads - 1) / cuda::kDwThreads,
                            (s.t + cuda::kDwRows - 1) / cuda::kDwRows),
                       dim3(cuda::kDwThreads), 0, [&] {
                         cuda::RmsnormBackwardDwKernel(g.data(), x.data(),
                                                       rstd.data(), s.t, s.c,
                                                       edw.data());
                       });
    Expect("rmsnorm_backward dx", shape, RelErr(edx, dx));
    Expect("rmsnorm_backward dw", shape, RelErr(edw, dw));
  }
}

// The row kernels of the LM head, fed with logits from the reference matmul
// (cuBLAS does that GEMM on the GPU).
void TestLmHeadRows(Ops& ref) {
  std::mt19937_64 gen(45);
  const int t = 9, c = 16, v = 301;
  auto h = Uniform(gen, size_t(t) * c), w = Uniform(gen, size_t(v) * c);
  std::vector<int32_t> targets(t);
  for (int i = 0; i < t; ++i) targets[i] = (i * 37) % v;
  targets[1] = -1;
  targets[2] = v;
  std::vector<float> logits(size_t(t) * v);
  ref.matmul(false, true, t, v, c, 1.f, h.data(), c, w.data(), c, 0.f,
             logits.data(), v);
  std::vector<float> logp(t), ent(t), elogp(t), eent(t);
  ref.lm_head_logprobs_forward(h.data(), w.data(), targets.data(), t, c, v, t,
                               nullptr, logp.data(), ent.data());
  tandem_emu::Launch(dim3(t), dim3(cuda::kLmThreads), 0, [&] {
    cuda::LogprobRowKernel(logits.data(), v, targets.data(), elogp.data(),
                           eent.data());
  });
  const std::string shape = "T9 C16 V301";
  Expect("lm_head logprob rows", shape, RelErr(elogp, logp));
  Expect("lm_head entropy rows", shape, RelErr(eent, ent));
  auto dlogp = Uniform(gen, t);
  dlogp[3] = 0.f;
  std::vector<float> dh(size_t(t) * c), dw(size_t(v) * c, 0.f),
      edh(size_t(t) * c), edw(size_t(v) * c, 0.f);
  ref.lm_head_logprobs_backward(h.data(), w.data(), targets.data(),
                                dlogp.data(), t, c, v, t, nullptr, dh.data(),
                                dw.data());
  tandem_emu::Launch(dim3(t), dim3(cuda::kLmThreads), 0, [&] {
    cuda::DlogitsRowKernel(logits.data(), v, targets.data(), dlogp.data());
  });
  ref.matmul(false, false, t, c, v, 1.f, logits.data(), v, w.data(), c, 0.f,
             edh.data(), c);
  ref.matmul(true, false, v, c, t, 1.f, logits.data(), v, h.data(), c, 1.f,
             edw.data(), c);
  Expect("lm_head dlogits -> dh", shape, RelErr(edh, dh));
  Expect("lm_head dlogits -> dw", shape, RelErr(edw, dw));
}

void TestOptimizer(Ops& ref) {
  std::mt19937_64 gen(46);
  const size_t n = 3001;
  auto g = Uniform(gen, n);
  double got = 0.0;
  tandem_emu::Launch(dim3(cuda::GridFor(n, cuda::kOptThreads, 4)),
                     dim3(cuda::kOptThreads), 0,
                     [&] { cuda::SumSquaresKernel(g.data(), n, &got); });
  const double want = ref.sum_squares(g.data(), n);
  Expect("sum_squares", "n3001 (4 blocks)", std::fabs(got - want) / want);
  auto p = Uniform(gen, n), m = Uniform(gen, n), v = Uniform(gen, n);
  for (auto& x : v) x = std::fabs(x) * 0.01f;
  auto ep = p, em = m, ev = v;
  ref.adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f,
                 1e-8f, 0.01f, 3);
  const double bc1 = 1.0 - std::pow(0.9, 3.0), bc2 = 1.0 - std::pow(0.999, 3.0);
  tandem_emu::Launch(dim3(cuda::GridFor(n, cuda::kOptThreads, 2)),
                     dim3(cuda::kOptThreads), 0, [&] {
                       cuda::AdamwKernel(ep.data(), g.data(), em.data(),
                                         ev.data(), n, 1e-3f, 0.9f, 0.999f,
                                         1e-8f, 0.01f, float(1.0 / bc1),
                                         float(1.0 / bc2));
                     });
  Expect("adamw_step p", "n3001 step3", RelErr(ep, p));
  Expect("adamw_step m", "n3001 step3", RelErr(em, m));
  Expect("adamw_step v", "n3001 step3", RelErr(ev, v));
}

// sample_logits: ids equal to the reference (a draw within rounding of a
// boundary could differ; random draws never land there in practice), the
// two log-probs within fp32 rounding. Vocabularies smaller and larger than
// the block, greedy and two temperatures, ties, u at the ends of [0, 1).
void TestSampling(Ops& ref) {
  std::mt19937_64 gen(47);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  for (int v : {1, 7, 300, 5003}) {
    for (float temp : {0.f, 0.7f, 1.3f}) {
      const int rows = 6;
      auto logits = Uniform(gen, size_t(rows) * v);
      for (auto& x : logits) x *= 4.f;
      for (int i = 0; i < v; ++i) logits[size_t(5) * v + i] = 0.5f;  // ties
      std::vector<double> u(rows);
      for (auto& x : u) x = unif(gen);
      u[0] = 0.0;
      u[1] = 0.9999999;
      std::vector<int32_t> want_id(rows), got_id(rows);
      std::vector<float> want_lp(rows), want_raw(rows), got_lp(rows), got_raw(rows);
      ref.sample_logits(logits.data(), rows, v, temp, u.data(), want_id.data(), want_lp.data(),
                        want_raw.data());
      tandem_emu::Launch(dim3(rows), dim3(cuda::kSampleThreads), 0, [&] {
        cuda::SampleRowKernel(logits.data(), v, temp, u.data(), got_id.data(), got_lp.data(),
                              got_raw.data());
      });
      const std::string shape = "v" + std::to_string(v) + " T" + std::to_string(temp);
      int id_mismatch = 0;
      for (int r = 0; r < rows; ++r) id_mismatch += got_id[r] != want_id[r];
      Expect("sample_logits ids", shape, id_mismatch);
      Expect("sample_logits logp_sample", shape, RelErr(got_lp, want_lp));
      Expect("sample_logits logp_raw", shape, RelErr(got_raw, want_raw));
    }
  }
}

}  // namespace
}  // namespace tandem::kernels

int main() {
  using namespace tandem::kernels;
  auto ref = MakeReferenceOps();
  TestAttention(*ref);
  TestDecode(*ref);
  TestRmsnorm(*ref);
  TestLmHeadRows(*ref);
  TestOptimizer(*ref);
  TestSampling(*ref);
  std::printf("kernels_cuda_emu_test: %d checks, %d failed\n", g_checks,
              g_failed);
  return g_failed == 0 ? 0 : 1;
}
