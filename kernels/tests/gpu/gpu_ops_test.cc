// kernels_gpu_test: every CUDA op against the reference backend.
//
// Random inputs on the host; MakeReferenceOps() computes the expected result
// (plain loops, double accumulators), CudaOps computes on the device, and the
// two are compared with a normwise relative error
//     err = max_i |cuda_i - ref_i| / max(max_i |ref_i|, 1e-2)
// (NaN or Inf in the CUDA result counts as an infinite error). Bounds:
// 1e-5 for elementwise ops (SwiGLU, add, bias add, scale, RoPE, embedding,
// AdamW), 1e-4 for reductions (matmul, RMSNorm, bias/embedding backward,
// attention forward/backward, decode attention, LM head), 1e-9 relative for
// sum_squares (double accumulation).
//
// No GoogleTest on purpose: the binary builds on a bare CUDA machine. With no
// CUDA device it prints "kernels_gpu_test: no CUDA device: skipped" and exits
// 0. Otherwise it prints one table row per check (op, shape, error, bound,
// PASS/FAIL, device ms), a few throughput figures, and exits 1 if any check
// failed. `kernels_gpu_test FILTER` runs only ops whose name contains FILTER.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

constexpr double kTolElementwise = 1e-5;
constexpr double kTolReduction = 1e-4;
// Outputs smaller than this in magnitude are compared absolutely (e.g. the
// dq of a one-token sequence, exactly 0 in the reference).
constexpr double kErrFloor = 1e-2;

struct Row {
  std::string op;
  std::string shape;
  double err;
  double tol;
  bool pass;
  double ms;
  std::string note;
};

std::vector<Row> g_rows;
const char* g_filter = nullptr;

bool Selected(const char* op) {
  return g_filter == nullptr || std::strstr(op, g_filter) != nullptr;
}

// RAII device array.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      p_ = nullptr;
    }
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { Upload(h); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  void Upload(const std::vector<T>& h) {
    if (p_ != nullptr && !h.empty()) {
      cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    if (p_ != nullptr && n_ > 0) {
      cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    }
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class GpuTimer {
 public:
  GpuTimer() {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
  }
  ~GpuTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  void Start() { cudaEventRecord(a_, 0); }
  double StopMs() {
    cudaEventRecord(b_, 0);
    cudaEventSynchronize(b_);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a_, b_);
    return ms;
  }

 private:
  cudaEvent_t a_, b_;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  std::vector<float> Uniform(size_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen_);
    return v;
  }
  std::vector<int32_t> Ints(size_t n, int lo, int hi_inclusive) {
    std::uniform_int_distribution<int> dist(lo, hi_inclusive);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = dist(gen_);
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

double RelErr(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) return INFINITY;
    if (!std::isfinite(ref[i])) {
      // Both must agree exactly on non-finite values (e.g. lse = -inf).
      if (got[i] != ref[i]) return INFINITY;
      continue;
    }
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(ref[i])));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_diff / std::max(max_ref, kErrFloor);
}

// Records one comparison; a CUDA error recorded by the backend fails it.
void Report(CudaOps& cuda, const std::string& op, const std::string& shape,
            double err, double tol, double ms) {
  cuda.Synchronize();
  Row row{op, shape, err, tol, err <= tol && cuda.ok(), ms, ""};
  if (!cuda.ok()) {
    row.note = cuda.last_error();
    cuda.ClearError();
  }
  std::printf("%-26s %-44s %10.3e %8.0e %-4s %9.3f %s\n", row.op.c_str(),
              row.shape.c_str(), row.err, row.tol, row.pass ? "PASS" : "FAIL",
              row.ms, row.note.c_str());
  std::fflush(stdout);
  g_rows.push_back(row);
}

std::string Fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// ---------------------------------------------------------------- matmul --
void TestMatmul(CudaOps& cuda, Ops& ref) {
  if (!Selected("matmul")) return;
  struct Shape {
    int m, n, k, pad;
    float beta;
  };
  const Shape shapes[] = {{1, 1, 1, 0, 0.f},
                          {17, 33, 29, 3, 0.3f},
                          {128, 96, 64, 0, 1.f},
                          {257, 129, 65, 5, 0.f},
                          {512, 1024, 256, 0, 0.5f}};
  Rng rng(1);
  GpuTimer timer;
  for (const Shape& s : shapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
        const int b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
        const int lda = a_cols + s.pad, ldb = b_cols + s.pad, ldc = s.n + s.pad;
        auto a = rng.Uniform(size_t(a_rows) * lda);
        auto b = rng.Uniform(size_t(b_rows) * ldb);
        auto c = rng.Uniform(size_t(s.m) * ldc);
        Dev<float> da(a), db(b), dc(c);
        ref.matmul(ta, tb, s.m, s.n, s.k, 0.7f, a.data(), lda, b.data(), ldb,
                   s.beta, c.data(), ldc);
        timer.Start();
        cuda.matmul(ta, tb, s.m, s.n, s.k, 0.7f, da.get(), lda, db.get(), ldb,
                    s.beta, dc.get(), ldc);
        const double ms = timer.StopMs();
        Report(cuda, "matmul",
               Fmt("m%d n%d k%d ta%d tb%d ld+%d beta%.1f", s.m, s.n, s.k, ta,
                   tb, s.pad, s.beta),
               RelErr(dc.Download(), c), kTolReduction, ms);
      }
    }
  }
}

// ------------------------------------------------------------- embedding --
void TestEmbedding(CudaOps& cuda, Ops& ref) {
  if (!Selected("embedding")) return;
  struct Shape {
    int v, c, t;
  };
  const Shape shapes[] = {{97, 33, 50}, {1000, 256, 300}, {5, 7, 1}};
  Rng rng(2);
  GpuTimer timer;
  for (const Shape& s : shapes) {
    auto table = rng.Uniform(size_t(s.v) * s.c);
    auto ids = rng.Ints(s.t, 0, s.v - 1);
    std::vector<float> out(size_t(s.t) * s.c);
    Dev<float> dtable_in(table), dout_dev(out.size());
    Dev<int32_t> dids(ids);
    ref.embedding_forward(ids.data(), s.t, table.data(), s.c, out.data());
    timer.Start();
    cuda.embedding_forward(dids.get(), s.t, dtable_in.get(), s.c,
                           dout_dev.get());
    double ms = timer.StopMs();
    const std::string shape = Fmt("V%d C%d T%d", s.v, s.c, s.t);
    Report(cuda, "embedding_forward", shape, RelErr(dout_dev.Download(), out),
           kTolElementwise, ms);

    auto dout = rng.Uniform(size_t(s.t) * s.c);
    auto dtable = rng.Uniform(size_t(s.v) * s.c);  // accumulated into
    Dev<float> ddout(dout), ddtable(dtable);
    ref.embedding_backward(ids.data(), s.t, dout.data(), s.c, dtable.data());
    timer.Start();
    cuda.embedding_backward(dids.get(), s.t, ddout.get(), s.c, ddtable.get());
    ms = timer.StopMs();
    Report(cuda, "embedding_backward", shape,
           RelErr(ddtable.Download(), dtable), kTolReduction, ms);
  }
}

// --------------------------------------------------------------- rmsnorm --
void TestRmsnorm(CudaOps& cuda, Ops& ref) {
  if (!Selected("rmsnorm")) return;
  struct Shape {
    int t, c;
  };
  const Shape shapes[] = {{1, 8}, {7, 33}, {64, 1024}, {5, 4097}, {300, 512}};
  Rng rng(3);
  GpuTimer timer;
  for (const Shape& s : shapes) {
    const size_t n = size_t(s.t) * s.c;
    auto x = rng.Uniform(n, -2.f, 2.f);
    auto w = rng.Uniform(s.c, 0.5f, 1.5f);
    std::vector<float> y(n), rstd(s.t);
    Dev<float> dx(x), dw(w), dy(n), drstd(s.t);
    ref.rmsnorm_forward(x.data(), w.data(), s.t, s.c, 1e-6f, y.data(),
                        rstd.data());
    timer.Start();
    cuda.rmsnorm_forward(dx.get(), dw.get(), s.t, s.c, 1e-6f, dy.get(),
                         drstd.get());
    double ms = timer.StopMs();
    const std::string shape = Fmt("T%d C%d", s.t, s.c);
    Report(cuda, "rmsnorm_forward y", shape, RelErr(dy.Download(), y),
           kTolReduction, ms);
    Report(cuda, "rmsnorm_forward rstd", shape, RelErr(drstd.Download(), rstd),
           kTolReduction, 0);

    auto g = rng.Uniform(n);
    auto gw = rng.Uniform(s.c);  // dw accumulated into
    std::vector<float> gx(n);
    Dev<float> dg(g), dgw(gw), dgx(n);
    drstd.Upload(rstd);  // same rstd for both backends
    ref.rmsnorm_backward(g.data(), x.data(), w.data(), rstd.data(), s.t, s.c,
                         gx.data(), gw.data());
    timer.Start();
    cuda.rmsnorm_backward(dg.get(), dx.get(), dw.get(), drstd.get(), s.t, s.c,
                          dgx.get(), dgw.get());
    ms = timer.StopMs();
    Report(cuda, "rmsnorm_backward dx", shape, RelErr(dgx.Download(), gx),
           kTolReduction, ms);
    Report(cuda, "rmsnorm_backward dw", shape, RelErr(dgw.Download(), gw),
           kTolReduction, 0);
  }
}

// ------------------------------------------------ swiglu, add, bias, scale --
void TestElementwise(CudaOps& cuda, Ops& ref) {
  Rng rng(4);
  GpuTimer timer;
  if (Selected("swiglu")) {
    for (size_t n : {size_t(1), size_t(1000), size_t((1 << 20) + 3)}) {
      auto gate = rng.Uniform(n, -6.f, 6.f), up = rng.Uniform(n, -2.f, 2.f);
      std::vector<float> h(n);
      Dev<float> dgate(gate), dup(up), dh(n);
      ref.swiglu_forward(gate.data(), up.data(), n, h.data());
      timer.Start();
      cuda.swiglu_forward(dgate.get(), dup.get(), n, dh.get());
      double ms = timer.StopMs();
      const std::string shape = Fmt("n%zu", n);
      Report(cuda, "swiglu_forward", shape, RelErr(dh.Download(), h),
             kTolElementwise, ms);
      auto g = rng.Uniform(n);
      std::vector<float> gg(n), gu(n);
      Dev<float> dg(g), dgg(n), dgu(n);
      ref.swiglu_backward(g.data(), gate.data(), up.data(), n, gg.data(),
                          gu.data());
      timer.Start();
      cuda.swiglu_backward(dg.get(), dgate.get(), dup.get(), n, dgg.get(),
                           dgu.get());
      ms = timer.StopMs();
      Report(cuda, "swiglu_backward dgate", shape, RelErr(dgg.Download(), gg),
             kTolElementwise, ms);
      Report(cuda, "swiglu_backward dup", shape, RelErr(dgu.Download(), gu),
             kTolElementwise, 0);
    }
  }
  if (Selected("add_inplace")) {
    for (size_t n : {size_t(7), size_t(1) << 22}) {
      auto y = rng.Uniform(n), x = rng.Uniform(n);
      Dev<float> dy(y), dx(x);
      ref.add_inplace(y.data(), x.data(), n);
      timer.Start();
      cuda.add_inplace(dy.get(), dx.get(), n);
      const double ms = timer.StopMs();
      Report(cuda, "add_inplace", Fmt("n%zu", n), RelErr(dy.Download(), y),
             kTolElementwise, ms);
    }
  }
  if (Selected("bias")) {
    struct Shape {
      int rows, cols;
    };
    for (Shape s : {Shape{7, 33}, Shape{300, 1000}, Shape{1, 1}}) {
      const size_t n = size_t(s.rows) * s.cols;
      auto y = rng.Uniform(n), bias = rng.Uniform(s.cols);
      Dev<float> dy(y), dbias(bias);
      ref.add_bias(y.data(), bias.data(), s.rows, s.cols);
      timer.Start();
      cuda.add_bias(dy.get(), dbias.get(), s.rows, s.cols);
      double ms = timer.StopMs();
      const std::string shape = Fmt("rows%d cols%d", s.rows, s.cols);
      Report(cuda, "add_bias", shape, RelErr(dy.Download(), y), kTolElementwise,
             ms);
      auto g = rng.Uniform(n), gb = rng.Uniform(s.cols);
      Dev<float> dg(g), dgb(gb);
      ref.bias_backward(g.data(), s.rows, s.cols, gb.data());
      timer.Start();
      cuda.bias_backward(dg.get(), s.rows, s.cols, dgb.get());
      ms = timer.StopMs();
      Report(cuda, "bias_backward", shape, RelErr(dgb.Download(), gb),
             kTolReduction, ms);
    }
  }
  if (Selected("scale")) {
    const size_t n = 100003;
    auto x = rng.Uniform(n);
    Dev<float> dx(x);
    ref.scale(x.data(), -0.37f, n);
    timer.Start();
    cuda.scale(dx.get(), -0.37f, n);
    const double ms = timer.StopMs();
    Report(cuda, "scale", Fmt("n%zu", n), RelErr(dx.Download(), x),
           kTolElementwise, ms);
  }
}

// ------------------------------------------------------------------ rope --
void TestRope(CudaOps& cuda, Ops& ref) {
  if (!Selected("rope")) return;
  Rng rng(5);
  GpuTimer timer;
  const int kMaxPos = 64;
  struct Case {
    int t, nh, d;
    RopeType type;
  };
  const Case cases[] = {{13, 3, 32, RopeType::kDefault},
                        {13, 3, 64, RopeType::kLinear},
                        {40, 8, 128, RopeType::kYarn},
                        {1, 1, 2, RopeType::kDefault}};
  for (const Case& cs : cases) {
    RopeConfig cfg;
    cfg.head_dim = cs.d;
    cfg.type = cs.type;
    cfg.factor = cs.type == RopeType::kDefault ? 1.0 : 4.0;
    cfg.original_max_position = 32;
    std::vector<float> cos(size_t(kMaxPos) * cs.d / 2), sin(cos.size());
    rope_tables(cfg, kMaxPos, kMaxPos, cos.data(), sin.data());
    auto pos = rng.Ints(cs.t, 0, kMaxPos - 1);
    Dev<float> dcos(cos), dsin(sin);
    Dev<int32_t> dpos(pos);
    for (bool inverse : {false, true}) {
      auto x = rng.Uniform(size_t(cs.t) * cs.nh * cs.d);
      Dev<float> dx(x);
      ref.rope_apply(x.data(), pos.data(), cs.t, cs.nh, cs.d, cos.data(),
                     sin.data(), inverse);
      timer.Start();
      cuda.rope_apply(dx.get(), dpos.get(), cs.t, cs.nh, cs.d, dcos.get(),
                      dsin.get(), inverse);
      const double ms = timer.StopMs();
      Report(cuda, inverse ? "rope_apply inverse" : "rope_apply",
             Fmt("T%d nh%d D%d type%d", cs.t, cs.nh, cs.d, int(cs.type)),
             RelErr(dx.Download(), x), kTolElementwise, ms);
    }
  }
}

// ------------------------------------------------------------- attention --
struct AttnCase {
  std::vector<int> seqlens;
  int h, hkv, d;
  bool causal;
  int window;
};

void TestAttention(CudaOps& cuda, Ops& ref) {
  const bool fwd = Selected("attention_forward");
  const bool bwd = Selected("attention_backward");
  if (!fwd && !bwd) return;
  const AttnCase cases[] = {
      {{1}, 4, 4, 32, true, -1},        {{37, 64, 5}, 8, 2, 64, true, -1},
      {{100, 29}, 8, 1, 128, true, 16}, {{130}, 4, 2, 64, false, -1},
      {{65, 200}, 8, 8, 32, true, 33},  {{77, 3}, 4, 1, 48, true, -1},
      {{70}, 2, 1, 256, true, -1},      {{129, 1, 64}, 8, 4, 128, true, -1},
      {{50}, 2, 2, 16, false, 7},
  };
  Rng rng(6);
  GpuTimer timer;
  for (const AttnCase& cs : cases) {
    std::vector<int32_t> cu{0};
    for (int len : cs.seqlens) cu.push_back(cu.back() + len);
    const int t = cu.back();
    const int nseq = static_cast<int>(cs.seqlens.size());
    AttentionParams p;
    p.num_heads = cs.h;
    p.num_kv_heads = cs.hkv;
    p.head_dim = cs.d;
    p.causal = cs.causal;
    p.window = cs.window;
    std::string shape = "lens";
    for (int len : cs.seqlens)
      shape += Fmt("%s%d", shape == "lens" ? "" : ",", len);
    shape += Fmt(" H%d Hkv%d D%d %s w%d", cs.h, cs.hkv, cs.d,
                 cs.causal ? "causal" : "full", cs.window);
    const size_t nq = size_t(t) * cs.h * cs.d, nkv = size_t(t) * cs.hkv * cs.d;
    auto q = rng.Uniform(nq), k = rng.Uniform(nkv), v = rng.Uniform(nkv);
    std::vector<float> out(nq), lse(size_t(t) * cs.h);
    Dev<float> dq(q), dk(k), dv(v), dout(nq), dlse(lse.size());
    Dev<int32_t> dcu(cu);
    ref.attention_forward(p, q.data(), k.data(), v.data(), cu.data(), nseq, t,
                          out.data(), lse.data());
    if (fwd) {
      timer.Start();
      cuda.attention_forward(p, dq.get(), dk.get(), dv.get(), dcu.get(), nseq,
                             t, dout.get(), dlse.get());
      const double ms = timer.StopMs();
      Report(cuda, "attention_forward out", shape, RelErr(dout.Download(), out),
             kTolReduction, ms);
      Report(cuda, "attention_forward lse", shape, RelErr(dlse.Download(), lse),
             kTolReduction, 0);
    }
    if (bwd) {
      auto g = rng.Uniform(nq);
      std::vector<float> gq(nq), gk(nkv), gv(nkv);
      Dev<float> dg(g), dgq(nq), dgk(nkv), dgv(nkv);
      dout.Upload(out);  // both backends see the reference out and lse
      dlse.Upload(lse);
      ref.attention_backward(p, q.data(), k.data(), v.data(), out.data(),
                             g.data(), lse.data(), cu.data(), nseq, t,
                             gq.data(), gk.data(), gv.data());
      timer.Start();
      cuda.attention_backward(p, dq.get(), dk.get(), dv.get(), dout.get(),
                              dg.get(), dlse.get(), dcu.get(), nseq, t,
                              dgq.get(), dgk.get(), dgv.get());
      const double ms = timer.StopMs();
      Report(cuda, "attention_backward dq", shape, RelErr(dgq.Download(), gq),
             kTolReduction, ms);
      Report(cuda, "attention_backward dk", shape, RelErr(dgk.Download(), gk),
             kTolReduction, 0);
      Report(cuda, "attention_backward dv", shape, RelErr(dgv.Download(), gv),
             kTolReduction, 0);
    }
  }
}

void TestDecode(CudaOps& cuda, Ops& ref) {
  if (!Selected("decode_attention")) return;
  struct Case {
    int h, hkv, d, n_new, window;
  };
  const Case cases[] = {{8, 2, 64, 1, -1},
                        {8, 2, 64, 4, -1},
                        {4, 1, 128, 1, 50},
                        {8, 8, 32, 3, 20},
                        {2, 1, 256, 1, -1}};
  const std::vector<int32_t> lens{5, 100, 300};
  const int batch = static_cast<int>(lens.size());
  const int cap = 320;
  Rng rng(7);
  GpuTimer timer;
  for (const Case& cs : cases) {
    AttentionParams p;
    p.num_heads = cs.h;
    p.num_kv_heads = cs.hkv;
    p.head_dim = cs.d;
    p.window = cs.window;
    const size_t nq = size_t(batch) * cs.n_new * cs.h * cs.d;
    const size_t nc = size_t(batch) * cap * cs.hkv * cs.d;
    auto q = rng.Uniform(nq), kc = rng.Uniform(nc), vc = rng.Uniform(nc);
    std::vector<float> out(nq);
    Dev<float> dq(q), dkc(kc), dvc(vc), dout(nq);
    Dev<int32_t> dlens(lens);
    ref.decode_attention(p, q.data(), batch, cs.n_new, kc.data(), vc.data(),
                         cap, lens.data(), out.data());
    timer.Start();
    cuda.decode_attention(p, dq.get(), batch, cs.n_new, dkc.get(), dvc.get(),
                          cap, dlens.get(), dout.get());
    const double ms = timer.StopMs();
    Report(cuda, "decode_attention",
           Fmt("B%d lens5,100,300 cap%d new%d H%d Hkv%d D%d w%d", batch, cap,
               cs.n_new, cs.h, cs.hkv, cs.d, cs.window),
           RelErr(dout.Download(), out), kTolReduction, ms);
  }
}

// --------------------------------------------------------------- lm head --
void TestLmHead(CudaOps& cuda, Ops& ref) {
  if (!Selected("lm_head")) return;
  struct Shape {
    int t, c, v, chunk;
  };
  const Shape shapes[] = {
      {37, 64, 1000, 16}, {64, 128, 5003, 64}, {1, 8, 3, 4}};
  Rng rng(8);
  GpuTimer timer;
  for (const Shape& s : shapes) {
    auto h = rng.Uniform(size_t(s.t) * s.c);
    auto w = rng.Uniform(size_t(s.v) * s.c, -0.3f, 0.3f);
    auto targets = rng.Ints(s.t, 0, s.v - 1);
    if (s.t > 2) {
      targets[1] = -1;   // "no target"
      targets[2] = s.v;  // out of range: also no target
    }
    std::vector<float> logp(s.t), ent(s.t);
    Dev<float> dh(h), dw(w), dscratch(size_t(s.chunk) * s.v), dlogp(s.t),
        dent(s.t);
    Dev<int32_t> dtargets(targets);
    ref.lm_head_logprobs_forward(h.data(), w.data(), targets.data(), s.t, s.c,
                                 s.v, s.chunk, nullptr, logp.data(),
                                 ent.data());
    timer.Start();
    cuda.lm_head_logprobs_forward(dh.get(), dw.get(), dtargets.get(), s.t, s.c,
                                  s.v, s.chunk, dscratch.get(), dlogp.get(),
                                  dent.get());
    double ms = timer.StopMs();
    const std::string shape =
        Fmt("T%d C%d V%d chunk%d", s.t, s.c, s.v, s.chunk);
    Report(cuda, "lm_head_forward logp", shape, RelErr(dlogp.Download(), logp),
           kTolReduction, ms);
    Report(cuda, "lm_head_forward entropy", shape, RelErr(dent.Download(), ent),
           kTolReduction, 0);

    auto g = rng.Uniform(s.t);
    for (int i = 0; i < s.t; i += 3) g[i] = 0.f;            // untrained tokens
    auto gw = rng.Uniform(size_t(s.v) * s.c, -0.1f, 0.1f);  // accumulated
    std::vector<float> gh(size_t(s.t) * s.c);
    Dev<float> dg(g), dgw(gw), dgh(gh.size());
    ref.lm_head_logprobs_backward(h.data(), w.data(), targets.data(), g.data(),
                                  s.t, s.c, s.v, s.chunk, nullptr, gh.data(),
                                  gw.data());
    timer.Start();
    cuda.lm_head_logprobs_backward(dh.get(), dw.get(), dtargets.get(), dg.get(),
                                   s.t, s.c, s.v, s.chunk, dscratch.get(),
                                   dgh.get(), dgw.get());
    ms = timer.StopMs();
    Report(cuda, "lm_head_backward dh", shape, RelErr(dgh.Download(), gh),
           kTolReduction, ms);
    Report(cuda, "lm_head_backward dw", shape, RelErr(dgw.Download(), gw),
           kTolReduction, 0);
  }
}

// ------------------------------------------------------------- optimizer --
void TestOptimizer(CudaOps& cuda, Ops& ref) {
  Rng rng(9);
  GpuTimer timer;
  if (Selected("sum_squares")) {
    for (size_t n : {size_t(1), size_t(1000003)}) {
      auto g = rng.Uniform(n);
      Dev<float> dg(g);
      const double want = ref.sum_squares(g.data(), n);
      timer.Start();
      const double got = cuda.sum_squares(dg.get(), n);
      const double ms = timer.StopMs();
      Report(cuda, "sum_squares", Fmt("n%zu", n),
             std::fabs(got - want) / std::max(std::fabs(want), 1e-300), 1e-9,
             ms);
    }
  }
  if (Selected("adamw")) {
    const size_t n = 10007;
    for (int64_t step : {int64_t(1), int64_t(10)}) {
      auto p = rng.Uniform(n), g = rng.Uniform(n),
           m = rng.Uniform(n, -0.1f, 0.1f), v = rng.Uniform(n, 0.f, 0.01f);
      Dev<float> dp(p), dg(g), dm(m), dv(v);
      ref.adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f,
                     0.95f, 1e-8f, 0.1f, step);
      timer.Start();
      cuda.adamw_step(dp.get(), dg.get(), dm.get(), dv.get(), n, 1e-3f, 0.9f,
                      0.95f, 1e-8f, 0.1f, step);
      const double ms = timer.StopMs();
      const std::string shape = Fmt("n%zu step%lld", n, (long long)step);
      Report(cuda, "adamw_step p", shape, RelErr(dp.Download(), p),
             kTolElementwise, ms);
      Report(cuda, "adamw_step m", shape, RelErr(dm.Download(), m),
             kTolElementwise, 0);
      Report(cuda, "adamw_step v", shape, RelErr(dv.Download(), v),
             kTolElementwise, 0);
    }
  }
}

// fp32 <-> bf16: bit-identical to the reference (err = mismatching elements).
void TestConvert(CudaOps& cuda, Ops& ref) {
  if (!Selected("bf16")) return;
  Rng rng(13);
  GpuTimer timer;
  const size_t n = 1000003;
  std::vector<float> x = rng.Uniform(n, -1e3f, 1e3f);
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u,
                               0xff800000u, 0x7fc00000u, 0xffc00001u,
                               0x7f800001u, 0x00000001u, 0x807fffffu,
                               0x3f808000u, 0x3f818000u, 0x7f7fffffu,
                               0x7f7f8000u, 0x00008000u, 0x00018000u};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); ++i) {
    std::memcpy(&x[i * 7], &specials[i], 4);
  }
  std::vector<uint16_t> want(n);
  ref.float_to_bf16(x.data(), want.data(), n);
  Dev<float> dx(x);
  Dev<uint16_t> dy(n);
  timer.Start();
  cuda.float_to_bf16(dx.get(), dy.get(), n);
  double ms = timer.StopMs();
  std::vector<uint16_t> got = dy.Download();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
  Report(cuda, "float_to_bf16", Fmt("n%zu (bit mismatches)", n), double(bad),
         0, ms);
  std::vector<float> back(n);
  ref.bf16_to_float(want.data(), back.data(), n);
  Dev<float> dback(n);
  timer.Start();
  cuda.bf16_to_float(dy.get(), dback.get(), n);
  ms = timer.StopMs();
  std::vector<float> gback = dback.Download();
  bad = std::memcmp(gback.data(), back.data(), n * sizeof(float)) != 0;
  Report(cuda, "bf16_to_float", Fmt("n%zu (bitwise equal)", n), double(bad), 0,
         ms);
}

// ---------------------------------------------------------- sampling --
// sample_logits: token ids against the reference (a draw within rounding of
// a boundary may differ: counted, expected 0) and the log-probs.
void TestSampling(CudaOps& cuda, Ops& ref) {
  if (!Selected("sample")) return;
  Rng rng(17);
  GpuTimer timer;
  for (int v : {7, 5003, 151936}) {
    for (float temp : {0.f, 1.f}) {
      const int rows = 64;
      std::vector<float> logits = rng.Uniform(size_t(rows) * v, -8.f, 8.f);
      std::vector<float> uf = rng.Uniform(rows, 0.f, 1.f);
      std::vector<double> u(uf.begin(), uf.end());
      std::vector<int32_t> want_id(rows);
      std::vector<float> want_lp(rows), want_raw(rows);
      ref.sample_logits(logits.data(), rows, v, temp, u.data(), want_id.data(), want_lp.data(), want_raw.data());
      Dev<float> dl(logits), dlp(rows), draw(rows);
      Dev<double> du(u);
      Dev<int32_t> did(rows);
      timer.Start();
      cuda.sample_logits(dl.get(), rows, v, temp, du.get(), did.get(), dlp.get(), draw.get());
      const double ms = timer.StopMs();
      std::vector<int32_t> got_id = did.Download();
      size_t bad = 0;
      for (int r = 0; r < rows; ++r) bad += got_id[r] != want_id[r];
      Report(cuda, "sample_logits ids", Fmt("rows%d v%d T%.0f (mismatches)", rows, v, temp), double(bad), 0, ms);
      Report(cuda, "sample_logits logp_raw", Fmt("rows%d v%d T%.0f", rows, v, temp),
             RelErr(draw.Download(), want_raw), 1e-5, ms);
    }
  }
}

// ------------------------------------------------------------ memory --
// MakeCudaMemory: upload, device copy, zero, an op in between (same legacy
// stream), download from another thread, all bitwise; allocated_bytes; an
// impossible allocation returns nullptr with a recorded error.
void TestMemory(CudaOps& cuda) {
  if (!Selected("memory")) return;
  GpuTimer timer;
  Rng rng(11);
  const size_t n = (size_t(1) << 20) + 7;
  const std::vector<float> host = rng.Uniform(n);
  std::unique_ptr<DeviceMemory> mem = MakeCudaMemory();
  if (mem == nullptr) {
    Report(cuda, "memory", "MakeCudaMemory returned nullptr", 1, 0, 0);
    return;
  }
  timer.Start();
  DeviceArray<float> a, b;
  bool bad = !a.Allocate(mem.get(), n) || !b.AllocateZeroed(mem.get(), n);
  bad = bad || mem->allocated_bytes() != 2 * n * sizeof(float);
  if (!bad) {
    a.Upload(host.data(), n);
    mem->CopyOnDevice(b.data() + 3, a.data(), (n - 3) * sizeof(float));
    cuda.scale(b.data(), 2.f, n);  // ordered after the copy (legacy stream)
    mem->SetZero(a.data() + n / 2, (n - n / 2) * sizeof(float));
    std::vector<float> ga(n), gb(n);
    std::thread reader([&] {  // a new thread: the memory selects the device
      a.Download(ga.data(), n);
      b.Download(gb.data(), n);
    });
    reader.join();
    for (size_t i = 0; i < n && !bad; ++i) {
      const float ea = i < n / 2 ? host[i] : 0.f;
      const float eb = i < 3 ? 0.f : host[i - 3] * 2.f;
      bad = std::memcmp(&ga[i], &ea, 4) != 0 || std::memcmp(&gb[i], &eb, 4) != 0;
    }
    bad = bad || !mem->Synchronize() || !mem->ok();
  }
  const double ms = timer.StopMs();
  a.reset();
  b.reset();
  bad = bad || mem->allocated_bytes() != 0;
  Report(cuda, "memory round trip",
         Fmt("n%zu copy/zero/op/thread (bitwise) %s", n,
             mem->ok() ? "" : mem->last_error().c_str()),
         double(bad), 0, ms);

  std::unique_ptr<DeviceMemory> oom = MakeCudaMemory();
  void* huge = oom->Allocate(size_t(1) << 50);
  const bool caught = huge == nullptr && !oom->ok() &&
                      oom->last_error().find("out of memory") != std::string::npos;
  if (huge != nullptr) oom->Free(huge);
  Report(cuda, "memory oom", "1 PiB -> nullptr + error", caught ? 0.0 : 1.0, 0,
         0);
}

// Unsupported shapes must become a recorded error, not a crash.
void TestErrors(CudaOps& cuda) {
  if (!Selected("errors")) return;
  AttentionParams p;
  p.num_heads = 3;
  p.num_kv_heads = 2;  // does not divide
  cuda.attention_forward(p, nullptr, nullptr, nullptr, nullptr, 1, 4, nullptr,
                         nullptr);
  const bool caught = !cuda.ok();
  const std::string msg = cuda.last_error();
  cuda.ClearError();
  Row row{"errors", "attention H3 Hkv2", caught ? 0.0 : 1.0, 0, caught, 0, msg};
  std::printf("%-26s %-44s %10.3e %8.0e %-4s %9.3f %s\n", row.op.c_str(),
              row.shape.c_str(), row.err, row.tol, row.pass ? "PASS" : "FAIL",
              0.0, msg.c_str());
  g_rows.push_back(row);
}

// ---------------------------------------------------------- throughput --
// Not compared with the reference (too slow there): device time only.
void Bench(CudaOps& cuda) {
  if (!Selected("bench")) return;
  std::printf("\n%-40s %10s %12s\n", "benchmark", "ms", "GFLOP/s");
  GpuTimer timer;
  Rng rng(10);
  {
    const int n = 4096;
    Dev<float> a(rng.Uniform(size_t(n) * n)), b(rng.Uniform(size_t(n) * n)),
        c(size_t(n) * n);
    cuda.matmul(false, false, n, n, n, 1.f, a.get(), n, b.get(), n, 0.f,
                c.get(), n);
    timer.Start();
    for (int i = 0; i < 5; ++i)
      cuda.matmul(false, false, n, n, n, 1.f, a.get(), n, b.get(), n, 0.f,
                  c.get(), n);
    const double ms = timer.StopMs() / 5;
    std::printf("%-40s %10.3f %12.1f\n", "sgemm 4096^3 (fp32, no TF32)", ms,
                2.0 * n * n * n / (ms * 1e6));
  }
  for (int seqlen : {1024, 4096}) {
    const int batch = 4, h = 8, d = 64;
    std::vector<int32_t> cu{0};
    for (int i = 0; i < batch; ++i) cu.push_back(cu.back() + seqlen);
    const int t = cu.back();
    const size_t nq = size_t(t) * h * d;
    Dev<float> q(rng.Uniform(nq)), k(rng.Uniform(nq)), v(rng.Uniform(nq)),
        out(nq), lse(size_t(t) * h), g(rng.Uniform(nq)), dq(nq), dk(nq), dv(nq);
    Dev<int32_t> dcu(cu);
    AttentionParams p;
    p.num_heads = h;
    p.num_kv_heads = h;
    p.head_dim = d;
    cuda.attention_forward(p, q.get(), k.get(), v.get(), dcu.get(), batch, t,
                           out.get(), lse.get());
    timer.Start();
    cuda.attention_forward(p, q.get(), k.get(), v.get(), dcu.get(), batch, t,
                           out.get(), lse.get());
    const double fwd_ms = timer.StopMs();
    cuda.attention_backward(p, q.get(), k.get(), v.get(), out.get(), g.get(),
                            lse.get(), dcu.get(), batch, t, dq.get(), dk.get(),
                            dv.get());
    timer.Start();
    cuda.attention_backward(p, q.get(), k.get(), v.get(), out.get(), g.get(),
                            lse.get(), dcu.get(), batch, t, dq.get(), dk.get(),
                            dv.get());
    const double bwd_ms = timer.StopMs();
    // Causal: half of the 4 B H T^2 D multiply-adds forward, 2.5x backward.
    const double fwd_flop = 2.0 * batch * h * double(seqlen) * seqlen * d;
    std::printf("%-40s %10.3f %12.1f\n",
                Fmt("attention fwd B4 H8 D64 T%d causal", seqlen).c_str(),
                fwd_ms, fwd_flop / (fwd_ms * 1e6));
    std::printf("%-40s %10.3f %12.1f\n",
                Fmt("attention bwd B4 H8 D64 T%d causal", seqlen).c_str(),
                bwd_ms, 2.5 * fwd_flop / (bwd_ms * 1e6));
  }
  {
    const int batch = 16, h = 8, hkv = 2, d = 64, cap = 4096;
    std::vector<int32_t> lens(batch, cap);
    Dev<float> q(rng.Uniform(size_t(batch) * h * d)),
        kc(rng.Uniform(size_t(batch) * cap * hkv * d)),
        vc(rng.Uniform(size_t(batch) * cap * hkv * d)),
        out(size_t(batch) * h * d);
    Dev<int32_t> dl(lens);
    AttentionParams p;
    p.num_heads = h;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    cuda.decode_attention(p, q.get(), batch, 1, kc.get(), vc.get(), cap,
                          dl.get(), out.get());
    timer.Start();
    cuda.decode_attention(p, q.get(), batch, 1, kc.get(), vc.get(), cap,
                          dl.get(), out.get());
    const double ms = timer.StopMs();
    // Bytes read per query head (K and V rows re-read per head of a group).
    const double bytes = 2.0 * batch * h * double(cap) * d * sizeof(float);
    std::printf("%-40s %10.3f %9.1f GB/s\n", "decode B16 H8 Hkv2 D64 cache4096",
                ms, bytes / (ms * 1e6));
  }
  cuda.Synchronize();
  if (!cuda.ok()) std::printf("bench error: %s\n", cuda.last_error().c_str());
}

}  // namespace
}  // namespace tandem::kernels

int main(int argc, char** argv) {
  using namespace tandem::kernels;
  if (argc > 1) g_filter = argv[1];
  if (!CudaDeviceAvailable()) {
    std::printf(
        "kernels_gpu_test: no CUDA device: skipped (built OK; nothing "
        "was run)\n");
    return 0;
  }
  std::unique_ptr<CudaOps> cuda = CudaOps::Create();
  if (cuda == nullptr) {
    std::printf(
        "kernels_gpu_test: CUDA device present but CudaOps::Create "
        "failed\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("kernels_gpu_test on %s (sm_%d%d, %d SMs)\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("%-26s %-44s %10s %8s %-4s %9s\n", "op", "shape", "rel_err",
              "bound", "ok", "ms");
  std::unique_ptr<Ops> ref = MakeReferenceOps();
  TestMatmul(*cuda, *ref);
  TestEmbedding(*cuda, *ref);
  TestRmsnorm(*cuda, *ref);
  TestElementwise(*cuda, *ref);
  TestRope(*cuda, *ref);
  TestAttention(*cuda, *ref);
  TestDecode(*cuda, *ref);
  TestLmHead(*cuda, *ref);
  TestOptimizer(*cuda, *ref);
  TestConvert(*cuda, *ref);
  TestErrors(*cuda);
  TestMemory(*cuda);
  int failed = 0;
  for (const Row& r : g_rows) failed += r.pass ? 0 : 1;
  Bench(*cuda);
  std::printf("\nkernels_gpu_test: %zu checks, %d failed\n", g_rows.size(),
              failed);
  return failed == 0 ? 0 : 1;
}
