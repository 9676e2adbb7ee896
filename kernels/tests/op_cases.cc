// The rows of the kernel case table (op_cases.h). Shapes: degenerate sizes
// (1), sizes that are not multiples of any tile or vector width, padded
// leading dimensions, large reductions (K up to 4099, n up to 4M), GQA
// ratios 1-8, head dims 16-256, packed varlen batches, sliding windows.
#include "kernels/tests/op_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "kernels/bf16.h"
#include "kernels/int8_blocks.h"
#include "kernels/int8_rounding.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels::testing {
namespace {

std::string Fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// Device copies of host vectors for one run of a case; freed at scope end.
class Tensors {
 public:
  explicit Tensors(DeviceMemory& mem) : mem_(mem) {}
  ~Tensors() {
    for (void* p : owned_) mem_.Free(p);
  }
  Tensors(const Tensors&) = delete;
  Tensors& operator=(const Tensors&) = delete;

  template <typename T>
  T* In(const std::vector<T>& host) {
    if (host.empty()) return nullptr;
    void* p = mem_.Allocate(host.size() * sizeof(T));
    if (p == nullptr) return nullptr;
    owned_.push_back(p);
    mem_.CopyToDevice(p, host.data(), host.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  // n NaNs: an output the op must write in full.
  float* Unwritten(size_t n) { return In(std::vector<float>(n, NAN)); }

  template <typename T>
  std::vector<T> Get(const T* p, size_t n) {
    std::vector<T> host(n);
    if (n > 0 && p != nullptr) mem_.CopyToHost(host.data(), p, n * sizeof(T));
    return host;
  }

 private:
  DeviceMemory& mem_;
  std::vector<void*> owned_;
};

using Outputs = std::vector<Output>;
using Table = std::vector<OpCase>;

template <typename T>
std::vector<float> AsFloats(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// ---------------------------------------------------------------- matmul --
void AddMatmul(Table& t) {
  struct Shape {
    int m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},     {7, 13, 5},    {33, 17, 129}, {64, 64, 64},  {1, 300, 513},  {128, 96, 1024},
                          {17, 1, 2048}, {5, 33, 4099}, {17, 33, 29},  {128, 96, 64}, {257, 129, 65}, {512, 1024, 256}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (int ab = 0; ab < 2; ++ab) {
          // beta 0 must ignore C, even NaN; padded leading dimensions.
          const float alpha = ab ? 0.5f : 1.f, beta = ab ? 1.5f : 0.f;
          t.push_back({"matmul", Fmt("m%d n%d k%d ta%d tb%d alpha%.1f beta%.1f", s.m, s.n, s.k, ta, tb, alpha, beta),
                       [=](Ops& ops, DeviceMemory& mem, Ops&) {
                         const int lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 1, ldc = s.n + 2;
                         auto a = RandomVec(size_t(ta ? s.k : s.m) * lda, seed);
                         auto b = RandomVec(size_t(tb ? s.n : s.k) * ldb, seed + 1);
                         auto c = RandomVec(size_t(s.m) * ldc, seed + 2);
                         if (beta == 0.f) c.assign(c.size(), NAN);
                         Tensors d(mem);
                         float* dc = d.In(c);
                         ops.matmul(ta, tb, s.m, s.n, s.k, alpha, d.In(a), lda, d.In(b), ldb, beta, dc, ldc);
                         const auto got = d.Get(dc, c.size());
                         std::vector<float> stored;  // the n columns of each row
                         for (int i = 0; i < s.m; ++i)
                           for (int j = 0; j < s.n; ++j) stored.push_back(got[size_t(i) * ldc + j]);
                         return Outputs{{"c", Bound::kReduction, stored}};
                       }});
          seed += 3;
        }
      }
    }
  }
}

// ------------------------------------------------------------- embedding --
void AddEmbedding(Table& t) {
  struct Shape {
    int v, t, c;
  };
  const Shape shapes[] = {{1, 1, 1},       {50, 5, 17},  {50, 300, 256},   {7, 1000, 100},
                          {4096, 513, 64}, {97, 50, 33}, {1000, 300, 256}, {5, 1, 7}};
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    t.push_back({"embedding", Fmt("V%d T%d C%d", s.v, s.t, s.c), [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   auto table = RandomVec(size_t(s.v) * s.c, seed);
                   auto ids = RandomIds(s.t, 0, s.v - 1, seed + 1);  // repeats
                   auto dout = RandomVec(size_t(s.t) * s.c, seed + 2);
                   auto dtable = RandomVec(table.size(), seed + 3);  // += into
                   Tensors d(mem);
                   const int32_t* dids = d.In(ids);
                   float* out = d.Unwritten(size_t(s.t) * s.c);
                   float* dt = d.In(dtable);
                   ops.embedding_forward(dids, s.t, d.In(table), s.c, out);
                   ops.embedding_backward(dids, s.t, d.In(dout), s.c, dt);
                   return Outputs{{"out", Bound::kExact, d.Get(out, size_t(s.t) * s.c)},
                                  {"dtable", Bound::kReduction, d.Get(dt, dtable.size())}};
                 }});
    seed += 4;
  }
}

// --------------------------------------------------------------- rmsnorm --
void AddRmsnorm(Table& t) {
  struct Shape {
    int t, c;
  };
  // No C = 1: there y = sign(x) w and dx is pure cancellation noise
  // (1 - x^2 / (x^2 + eps)), ill-conditioned in any precision.
  const Shape shapes[] = {{1, 2},     {1, 7}, {3, 64}, {17, 100},  {64, 256},  {33, 1000}, {5, 4097},
                          {2048, 33}, {1, 8}, {7, 33}, {64, 1024}, {300, 512}, {3, 1030},  {70, 96}};
  uint64_t seed = 200;
  for (const Shape& s : shapes) {
    t.push_back({"rmsnorm", Fmt("T%d C%d", s.t, s.c), [=](Ops& ops, DeviceMemory& mem, Ops& ref) {
                   const size_t n = size_t(s.t) * s.c;
                   auto x = RandomVec(n, seed, -3, 3);
                   auto w = RandomVec(s.c, seed + 1, 0.5, 1.5);
                   auto dy = RandomVec(n, seed + 2);
                   auto dw = RandomVec(s.c, seed + 3);      // accumulated into
                   std::vector<float> y_ref(n), rstd(s.t);  // backward's input
                   ref.rmsnorm_forward(x.data(), w.data(), s.t, s.c, 1e-5f, y_ref.data(), rstd.data());
                   Tensors d(mem);
                   const float *dx_in = d.In(x), *dw_in = d.In(w);
                   float* y = d.Unwritten(n);
                   float* r = d.Unwritten(s.t);
                   float* dx = d.Unwritten(n);
                   float* ddw = d.In(dw);
                   ops.rmsnorm_forward(dx_in, dw_in, s.t, s.c, 1e-5f, y, r);
                   ops.rmsnorm_backward(d.In(dy), dx_in, dw_in, d.In(rstd), s.t, s.c, dx, ddw);
                   return Outputs{{"y", Bound::kReduction, d.Get(y, n)},
                                  {"rstd", Bound::kReduction, d.Get(r, s.t)},
                                  {"dx", Bound::kReduction, d.Get(dx, n)},
                                  {"dw", Bound::kReduction, d.Get(ddw, s.c)}};
                 }});
    seed += 4;
  }
}

// ---------------------------------------------------------------- swiglu --
void AddSwiglu(Table& t) {
  const size_t sizes[] = {1, 7, 8, 9, 100, 1000, 3 * 4096 + 5, 100000, (size_t{1} << 20) + 3};
  uint64_t seed = 300;
  for (size_t n : sizes) {
    t.push_back({"swiglu", Fmt("n%zu", n), [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   auto gate = RandomVec(n, seed, -12, 12);
                   if (n > 9) {  // saturated sigmoid on both sides
                     gate[0] = -100.f;
                     gate[1] = 100.f;
                     gate[2] = -87.5f;
                     gate[3] = 0.f;
                   }
                   auto up = RandomVec(n, seed + 1, -2, 2);
                   auto dh = RandomVec(n, seed + 2);
                   Tensors d(mem);
                   const float *g = d.In(gate), *u = d.In(up);
                   float *h = d.Unwritten(n), *dg = d.Unwritten(n), *du = d.Unwritten(n);
                   ops.swiglu_forward(g, u, n, h);
                   ops.swiglu_backward(d.In(dh), g, u, n, dg, du);
                   return Outputs{{"h", Bound::kElementwise, d.Get(h, n)},
                                  {"dgate", Bound::kElementwise, d.Get(dg, n)},
                                  {"dup", Bound::kElementwise, d.Get(du, n)}};
                 }});
    seed += 3;
  }
}

// -------------------------------------------------- add, scale, bias add --
void AddElementwise(Table& t) {
  uint64_t seed = 400;
  for (size_t n : {size_t{1}, size_t{7}, size_t{31}, size_t{100003}, size_t{1} << 22}) {
    t.push_back(
        {"add_scale", Fmt("n%zu", n), [=](Ops& ops, DeviceMemory& mem, Ops&) {
           auto x = RandomVec(n, seed), y = RandomVec(n, seed + 1);
           Tensors d(mem);
           float* dy = d.In(y);
           ops.add_inplace(dy, d.In(x), n);
           auto added = d.Get(dy, n);
           ops.scale(dy, -0.37f, n);
           return Outputs{{"y+x", Bound::kElementwise, std::move(added)}, {"s*y", Bound::kElementwise, d.Get(dy, n)}};
         }});
    seed += 2;
  }
  struct Shape {
    int rows, cols;
  };
  for (Shape s :
       {Shape{1, 1}, Shape{7, 13}, Shape{300, 129}, Shape{1000, 64}, Shape{2, 5000}, Shape{7, 33}, Shape{300, 1000}}) {
    t.push_back(
        {"bias", Fmt("rows%d cols%d", s.rows, s.cols), [=](Ops& ops, DeviceMemory& mem, Ops&) {
           const size_t n = size_t(s.rows) * s.cols;
           auto bias = RandomVec(s.cols, seed), y = RandomVec(n, seed + 1);
           auto db = RandomVec(s.cols, seed + 2);  // accumulated into
           Tensors d(mem);
           float *dy = d.In(y), *ddb = d.In(db);
           ops.add_bias(dy, d.In(bias), s.rows, s.cols);
           ops.bias_backward(dy, s.rows, s.cols, ddb);
           return Outputs{{"y", Bound::kElementwise, d.Get(dy, n)}, {"dbias", Bound::kReduction, d.Get(ddb, s.cols)}};
         }});
    seed += 3;
  }
}

// ------------------------------------------------------------------ rope --
void AddRope(Table& t) {
  struct Shape {
    int t, nh, d;
    RopeType type;
    double factor;
    int original_max, max_pos;
  };
  const Shape shapes[] = {
      {1, 1, 2, RopeType::kDefault, 4.0, 64, 300},      {5, 3, 8, RopeType::kLinear, 4.0, 64, 300},
      {17, 4, 64, RopeType::kDynamicNtk, 4.0, 64, 300}, {64, 8, 128, RopeType::kYarn, 4.0, 64, 300},
      {33, 2, 96, RopeType::kDefault, 4.0, 64, 300},    {13, 3, 32, RopeType::kDefault, 1.0, 32, 64},
      {13, 3, 64, RopeType::kLinear, 4.0, 32, 64},      {40, 8, 128, RopeType::kYarn, 4.0, 32, 64},
      {1, 1, 2, RopeType::kDefault, 1.0, 32, 64}};
  uint64_t seed = 500;
  for (const Shape& s : shapes) {
    t.push_back({"rope",
                 Fmt("T%d nh%d D%d type%d factor%.0f orig%d", s.t, s.nh, s.d, int(s.type), s.factor, s.original_max),
                 [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   RopeConfig cfg;
                   cfg.head_dim = s.d;
                   cfg.type = s.type;
                   cfg.factor = s.factor;
                   cfg.original_max_position = s.original_max;
                   std::vector<float> cos(size_t(s.max_pos) * s.d / 2), sin(cos.size());
                   rope_tables(cfg, s.max_pos, s.max_pos, cos.data(), sin.data());
                   auto pos = RandomIds(s.t, 0, s.max_pos - 1, seed);
                   const size_t n = size_t(s.t) * s.nh * s.d;
                   auto x = RandomVec(n, seed + 1);
                   Tensors d(mem);
                   const int32_t* dpos = d.In(pos);
                   const float *dcos = d.In(cos), *dsin = d.In(sin);
                   float* dx = d.In(x);
                   ops.rope_apply(dx, dpos, s.t, s.nh, s.d, dcos, dsin, false);
                   auto fwd = d.Get(dx, n);
                   float* dx2 = d.In(x);
                   ops.rope_apply(dx2, dpos, s.t, s.nh, s.d, dcos, dsin, true);
                   return Outputs{{"x", Bound::kElementwise, std::move(fwd)},
                                  {"x inverse", Bound::kElementwise, d.Get(dx2, n)}};
                 }});
    seed += 2;
  }
}

// ------------------------------------------------------------- attention --
// Normal inputs (q, k with std 1.5: sharp softmax rows) for the cases with
// qk_std > 0, uniform in [-1, 1] otherwise.
std::vector<float> AttnInput(size_t n, uint64_t seed, float std) {
  if (std <= 0.f) return RandomVec(n, seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, std);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void AddAttention(Table& t) {
  struct Case {
    std::vector<int> lens;
    int h, hkv, d;
    bool causal;
    int window;
    float scale = 0.f;   // 0: 1/sqrt(D)
    float qk_std = 0.f;  // 0: uniform inputs
    int sinks = 0;       // attention sinks (causal with a window; ignored otherwise)
    int skip = 0;        // AttentionParams::skip_query_rows (key-only rows of sequence 0)
  };
  const Case cases[] = {
      {{1}, 4, 4, 32, true, -1},
      {{37, 64, 5}, 8, 2, 64, true, -1},
      {{100, 29}, 8, 1, 128, true, 16},
      {{130}, 4, 2, 64, false, -1},
      {{65, 200}, 8, 8, 32, true, 33},
      {{77, 3}, 4, 1, 48, true, -1},
      {{70}, 2, 1, 256, true, -1},
      {{129, 1, 64}, 8, 4, 128, true, -1},
      {{50}, 2, 2, 16, false, 7},
      {{1}, 2, 2, 32, true, -1},
      {{37, 70, 5}, 4, 2, 64, true, -1},
      {{100, 29}, 2, 1, 128, true, 16},
      {{130}, 2, 1, 40, false, -1},
      {{90}, 2, 2, 16, false, 7},
      {{40}, 2, 1, 256, true, -1},
      {{65, 3}, 8, 1, 32, true, 33},
      // Lengths around the CPU's 64-row tiles, GQA 1-8, odd head dims,
      // empty sequences in a batch, a custom scale; sharp softmax rows.
      {{1}, 1, 1, 64, true, -1, 0.f, 1.5f},
      {{7}, 2, 1, 32, true, -1, 0.f, 1.5f},
      {{63}, 4, 2, 64, true, -1, 0.f, 1.5f},
      {{65}, 8, 1, 128, true, -1, 0.f, 1.5f},
      {{130}, 4, 1, 64, true, -1, 0.f, 1.5f},
      {{257}, 2, 2, 64, true, -1, 0.f, 1.5f},
      {{257}, 8, 8, 32, true, -1, 0.f, 1.5f},
      {{5, 64, 1, 130}, 4, 2, 64, true, -1, 0.f, 1.5f},
      {{5, 64, 1, 130}, 8, 1, 32, true, -1, 0.f, 1.5f},
      {{65}, 2, 1, 32, true, 1, 0.f, 1.5f},
      {{5, 64, 1, 130}, 2, 2, 64, true, 16, 0.f, 1.5f},
      {{257}, 4, 4, 32, true, 100, 0.f, 1.5f},
      {{200, 3}, 8, 2, 128, true, 100, 0.f, 1.5f},
      {{63}, 2, 1, 64, false, -1, 0.f, 1.5f},
      {{5, 64, 1, 130}, 8, 2, 32, false, -1, 0.f, 1.5f},
      {{130}, 2, 2, 64, false, 16, 0.f, 1.5f},
      {{33}, 4, 2, 8, true, -1, 0.f, 1.5f},
      {{70, 9}, 2, 1, 20, true, 7, 0.f, 1.5f},
      {{90}, 4, 4, 64, true, -1, 0.3f, 1.5f},
      {{300}, 16, 8, 64, true, -1, 0.f, 1.5f},
      {{5, 0, 64, 0}, 4, 1, 64, true, -1, 0.f, 1.5f},
      {{100, 100, 100, 100}, 4, 2, 32, false, 30, 0.f, 1.5f},
      // Attention sinks: inside one tile, past a 64-row tile, beside a
      // window of 1, in packed batches, with key tiles between the sinks and
      // the window that no query sees; ignored without a window or causality.
      {{100, 29}, 8, 2, 64, true, 16, 0.f, 1.5f, 4},
      {{400}, 2, 1, 32, true, 20, 0.f, 1.5f, 5},
      {{200, 65}, 4, 1, 32, true, 33, 0.f, 1.5f, 70},
      {{130}, 2, 2, 128, true, 1, 0.f, 0.f, 1},
      {{5, 64, 1, 130}, 4, 2, 48, true, 7, 0.f, 1.5f, 3},
      {{300}, 8, 8, 16, true, 40, 0.f, 1.5f, 150},
      {{70}, 4, 2, 32, true, -1, 0.f, 1.5f, 8},
      {{90}, 2, 2, 16, false, 7, 0.f, 0.f, 5},
      // Key-only rows (sequence-parallel padding): whole 64-row tiles and a
      // partial one skipped, beside a window, sinks and packed sequences,
      // and a whole first sequence.
      {{200, 65}, 4, 2, 64, true, -1, 0.f, 1.5f, 0, 130},
      {{100}, 2, 1, 32, true, 16, 0.f, 1.5f, 0, 64},
      {{300}, 8, 8, 16, true, 40, 0.f, 1.5f, 150, 200},
      {{129, 1, 64}, 8, 4, 128, true, -1, 0.f, 0.f, 0, 129},
  };
  uint64_t seed = 600;
  for (const Case& c : cases) {
    std::string shape = "lens";
    for (size_t i = 0; i < c.lens.size(); ++i) {
      if (i > 0) shape += ",";
      shape += std::to_string(c.lens[i]);
    }
    shape += Fmt(" H%d Hkv%d D%d %s w%d", c.h, c.hkv, c.d, c.causal ? "causal" : "full", c.window);
    if (c.scale != 0.f) shape += Fmt(" scale%.1f", c.scale);
    if (c.qk_std > 0.f) shape += Fmt(" normal%.1f", c.qk_std);
    if (c.sinks > 0) shape += Fmt(" sinks%d", c.sinks);
    if (c.skip > 0) shape += Fmt(" skip%d", c.skip);
    t.push_back({"attention", shape, [=](Ops& ops, DeviceMemory& mem, Ops& ref) {
                   std::vector<int32_t> cu{0};
                   for (int len : c.lens) cu.push_back(cu.back() + len);
                   const int tt = cu.back(), nseq = int(c.lens.size());
                   AttentionParams p;
                   p.num_heads = c.h;
                   p.num_kv_heads = c.hkv;
                   p.head_dim = c.d;
                   p.causal = c.causal;
                   p.window = c.window;
                   p.sinks = c.sinks;
                   p.scale = c.scale;
                   p.skip_query_rows = c.skip;
                   const size_t nq = size_t(tt) * c.h * c.d, nkv = size_t(tt) * c.hkv * c.d, nl = size_t(tt) * c.h;
                   const float vg_std = c.qk_std > 0.f ? 1.f : 0.f;
                   auto q = AttnInput(nq, seed, c.qk_std), k = AttnInput(nkv, seed + 1, c.qk_std),
                        v = AttnInput(nkv, seed + 2, vg_std), g = AttnInput(nq, seed + 3, vg_std);
                   // Key-only rows come as sequence-parallel padding does:
                   // zero queries, outputs, output gradients and lse.
                   const size_t skip_q = size_t(c.skip) * c.h * c.d, skip_l = size_t(c.skip) * c.h;
                   std::fill(q.begin(), q.begin() + skip_q, 0.f);
                   std::fill(g.begin(), g.begin() + skip_q, 0.f);
                   // The backward pass reads the reference's out and lse.
                   std::vector<float> out_ref(nq), lse_ref(nl);
                   ref.attention_forward(p, q.data(), k.data(), v.data(), cu.data(), nseq, tt, out_ref.data(),
                                         lse_ref.data());
                   std::fill(out_ref.begin(), out_ref.begin() + skip_q, 0.f);
                   std::fill(lse_ref.begin(), lse_ref.begin() + skip_l, 0.f);
                   Tensors d(mem);
                   const float *dq_in = d.In(q), *dk_in = d.In(k), *dv_in = d.In(v);
                   const int32_t* dcu = d.In(cu);
                   float *out = d.Unwritten(nq), *lse = d.Unwritten(nl);
                   ops.attention_forward(p, dq_in, dk_in, dv_in, dcu, nseq, tt, out, lse);
                   float *dq = d.Unwritten(nq), *dk = d.Unwritten(nkv), *dv = d.Unwritten(nkv);
                   ops.attention_backward(p, dq_in, dk_in, dv_in, d.In(out_ref), d.In(g), d.In(lse_ref), dcu, nseq, tt,
                                          dq, dk, dv);
                   Outputs o{{"out", Bound::kReduction, d.Get(out, nq)},
                             {"lse", Bound::kReduction, d.Get(lse, nl)},
                             {"dq", Bound::kReduction, d.Get(dq, nq)},
                             {"dk", Bound::kReduction, d.Get(dk, nkv)},
                             {"dv", Bound::kReduction, d.Get(dv, nkv)}};
                   // Key-only rows' out, lse and dq are unspecified.
                   for (int x : {0, 2}) std::fill(o[x].values.begin(), o[x].values.begin() + skip_q, 0.f);
                   std::fill(o[1].values.begin(), o[1].values.begin() + skip_l, 0.f);
                   // Window 1: each query sees only itself, so dp - delta
                   // cancels and dq, dk are exact zeros; the cancelling
                   // terms are O(1).
                   if (c.window == 1 && c.sinks == 0) o[2].cancel_scale = o[3].cancel_scale = 1.0;
                   return o;
                 }});
    seed += 4;
  }
}

void AddDecode(Table& t) {
  struct Case {
    std::vector<int32_t> lens;
    int cap, h, hkv, d, n_new, window;
    int sinks = 0;
  };
  const std::vector<int32_t> a{5, 100, 300}, b{5, 100, 150};
  const Case cases[] = {{a, 320, 8, 2, 64, 1, -1},    {a, 320, 8, 2, 64, 4, -1},     {a, 320, 4, 1, 128, 1, 50},
                        {a, 320, 8, 8, 32, 3, 20},    {a, 320, 2, 1, 256, 1, -1},    {b, 160, 4, 2, 64, 1, -1},
                        {b, 160, 4, 2, 64, 3, -1},    {b, 160, 2, 1, 128, 1, 20},    {b, 160, 2, 2, 48, 2, 9},
                        {a, 320, 8, 2, 64, 3, 20, 4}, {b, 160, 2, 1, 128, 1, 20, 30}};
  uint64_t seed = 700;
  for (const Case& c : cases) {
    t.push_back({"decode_attention",
                 Fmt("lens%d,%d,%d cap%d new%d H%d Hkv%d D%d w%d s%d", c.lens[0], c.lens[1], c.lens[2], c.cap, c.n_new,
                     c.h, c.hkv, c.d, c.window, c.sinks),
                 [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   const int batch = int(c.lens.size());
                   AttentionParams p;
                   p.num_heads = c.h;
                   p.num_kv_heads = c.hkv;
                   p.head_dim = c.d;
                   p.window = c.window;
                   p.sinks = c.sinks;
                   const size_t nq = size_t(batch) * c.n_new * c.h * c.d;
                   const size_t nc = size_t(batch) * c.cap * c.hkv * c.d;
                   auto q = RandomVec(nq, seed), kc = RandomVec(nc, seed + 1), vc = RandomVec(nc, seed + 2);
                   Tensors d(mem);
                   float* out = d.Unwritten(nq);
                   ops.decode_attention(p, d.In(q), batch, c.n_new, d.In(kc), d.In(vc), c.cap, d.In(c.lens), out);
                   return Outputs{{"out", Bound::kReduction, d.Get(out, nq)}};
                 }});
    seed += 3;
  }
}

// Paged KV cache: new k/v rows written into their slots, then attention of
// those rows over block tables (a prefix block shared by two sequences,
// blocks in shuffled order, fp32 and bf16 pools).
void AddPaged(Table& t) {
  struct Case {
    std::vector<int32_t> lens;  // cached tokens per sequence, new ones included
    int n_new, bs, h, hkv, d, window;
    bool bf16;
    int sinks = 0;
  };
  const std::vector<int32_t> a{5, 40, 77}, b{1, 16, 33, 130};
  const Case cases[] = {
      {a, 1, 16, 8, 2, 64, -1, false},   {a, 4, 16, 8, 2, 64, -1, true},     {a, 3, 8, 4, 1, 128, 20, false},
      {b, 1, 16, 2, 2, 32, -1, true},    {b, 1, 32, 4, 4, 48, 9, false},     {a, 5, 4, 2, 1, 256, -1, false},
      {b, 3, 32, 8, 2, 32, 7, false},    {a, 2, 64, 16, 2, 128, -1, true},   {a, 3, 8, 4, 1, 128, 20, false, 5},
      {b, 3, 32, 8, 2, 32, 7, true, 40}, {b, 1, 16, 2, 2, 32, 9, false, 16}, {b, 2, 4, 4, 2, 64, 3, false, 6}};
  uint64_t seed = 1700;
  for (const Case& c : cases) {
    t.push_back({"paged_attention",
                 Fmt("lens%zu new%d bs%d H%d Hkv%d D%d w%d s%d %s", c.lens.size(), c.n_new, c.bs, c.h, c.hkv, c.d,
                     c.window, c.sinks, c.bf16 ? "bf16" : "fp32"),
                 [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   const int S = int(c.lens.size()), kd = c.hkv * c.d;
                   int max_blocks = 0;
                   for (int32_t len : c.lens) max_blocks = std::max(max_blocks, (len + c.bs - 1) / c.bs);
                   const int nb = S * max_blocks + 3;
                   // Blocks handed out in a shuffled order; sequence 1 shares
                   // sequence 0's first block when both fill it before their
                   // new rows.
                   std::vector<int32_t> order(nb);
                   for (int i = 0; i < nb; ++i) order[i] = (i * 7 + 3) % nb;
                   std::vector<int32_t> tables(size_t(S) * max_blocks, 0);
                   int next = 0;
                   for (int s = 0; s < S; ++s) {
                     for (int j = 0; j * c.bs < c.lens[s]; ++j) tables[s * max_blocks + j] = order[next++];
                   }
                   if (S > 1 && c.lens[0] - c.n_new >= c.bs && c.lens[1] - c.n_new >= c.bs) {
                     tables[max_blocks] = tables[0];
                   }
                   std::vector<int32_t> slots, seq, pos;
                   for (int s = 0; s < S; ++s) {
                     for (int i = 0; i < c.n_new && i < c.lens[s]; ++i) {
                       const int j = c.lens[s] - std::min(c.n_new, int(c.lens[s])) + i;
                       slots.push_back(tables[s * max_blocks + j / c.bs] * c.bs + j % c.bs);
                       seq.push_back(s);
                       pos.push_back(j);
                     }
                   }
                   const int rows = int(slots.size());
                   AttentionParams p;
                   p.num_heads = c.h;
                   p.num_kv_heads = c.hkv;
                   p.head_dim = c.d;
                   p.window = c.window;
                   p.sinks = c.sinks;
                   const size_t np = size_t(nb) * c.bs * kd, nq = size_t(rows) * c.h * c.d;
                   auto kp = RandomVec(np, seed), vp = RandomVec(np, seed + 1);
                   auto kn = RandomVec(size_t(rows) * kd, seed + 2), vn = RandomVec(size_t(rows) * kd, seed + 3);
                   auto q = RandomVec(nq, seed + 4);
                   Tensors d(mem);
                   PagedKv kv;
                   kv.dtype = c.bf16 ? KvDtype::kBF16 : KvDtype::kF32;
                   kv.block_size = c.bs;
                   kv.num_blocks = nb;
                   kv.max_blocks = max_blocks;
                   kv.block_tables = d.In(tables);
                   std::vector<uint16_t> kh(np), vh(np);
                   if (c.bf16) {
                     for (size_t i = 0; i < np; ++i) {
                       kh[i] = Bf16FromFloat(kp[i]);
                       vh[i] = Bf16FromFloat(vp[i]);
                     }
                     kv.k = d.In(kh);
                     kv.v = d.In(vh);
                   } else {
                     kv.k = d.In(kp);
                     kv.v = d.In(vp);
                   }
                   float* out = d.Unwritten(nq);
                   ops.paged_kv_write(kv, kd, d.In(kn), d.In(vn), d.In(slots), rows);
                   ops.paged_attention(p, kv, d.In(q), d.In(seq), d.In(pos), rows, out);
                   std::vector<float> kf, vf;
                   if (c.bf16) {
                     for (uint16_t x : d.Get(static_cast<uint16_t*>(kv.k), np)) kf.push_back(FloatFromBf16(x));
                     for (uint16_t x : d.Get(static_cast<uint16_t*>(kv.v), np)) vf.push_back(FloatFromBf16(x));
                   } else {
                     kf = d.Get(static_cast<float*>(kv.k), np);
                     vf = d.Get(static_cast<float*>(kv.v), np);
                   }
                   return Outputs{{"out", Bound::kReduction, d.Get(out, nq)},
                                  {"k_pool", Bound::kExact, kf},
                                  {"v_pool", Bound::kExact, vf}};
                 }});
    seed += 5;
  }
}

// ----------------------------------------------------- linear attention --
// The chunked backends against the reference recurrence: lengths around the
// 64-token chunk, packed varlen with empty sequences, padding rows, Dk != Dv,
// no decay / a constant per-head decay / a data-dependent gate (mild and
// strong), initial and final states, decode steps updating the state in
// place.
void AddLinearAttention(Table& t) {
  enum Decay { kNone, kHead, kGate, kStrong };
  struct Case {
    std::vector<int> lens;
    int h, dk, dv;
    Decay decay;
    bool state;             // initial state in, final state out, d_final in
    bool in_place = false;  // final_state aliases initial_state (decode)
    int pad = 0;            // rows after the last sequence
    float scale = 0.f;
  };
  const Case cases[] = {
      {{1}, 1, 4, 4, kGate, false},
      {{7}, 2, 16, 16, kNone, false},
      {{63, 65}, 2, 32, 32, kGate, false},
      {{130}, 3, 64, 64, kHead, true},
      {{5, 0, 64, 1, 130}, 2, 24, 40, kGate, true, false, 3},
      {{200, 3}, 1, 128, 64, kStrong, false},
      {{257}, 2, 64, 128, kGate, true},
      {{1, 1, 1, 1}, 4, 32, 32, kGate, true, true},
      {{3, 2}, 2, 64, 16, kHead, true, true},
      {{100}, 2, 48, 24, kNone, true, false, 0, 0.3f},
      {{65}, 1, 256, 16, kGate, false},
      {{129, 64}, 2, 16, 64, kStrong, true},
  };
  uint64_t seed = 1200;
  for (const Case& c : cases) {
    std::string shape = "lens";
    for (size_t i = 0; i < c.lens.size(); ++i) {
      if (i > 0) shape += ",";
      shape += std::to_string(c.lens[i]);
    }
    const char* decay[] = {"none", "per-head", "gate", "strong gate"};
    shape += Fmt(" H%d Dk%d Dv%d decay %s%s%s pad%d", c.h, c.dk, c.dv, decay[c.decay], c.state ? " state" : "",
                 c.in_place ? " in-place" : "", c.pad);
    if (c.scale != 0.f) shape += Fmt(" scale%.1f", c.scale);
    t.push_back({"linear_attention", shape, [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   std::vector<int32_t> cu{0};
                   for (int len : c.lens) cu.push_back(cu.back() + len);
                   const int nseq = int(c.lens.size()), tt = cu.back() + c.pad;
                   LinearAttentionParams p;
                   p.num_heads = c.h;
                   p.key_dim = c.dk;
                   p.value_dim = c.dv;
                   p.scale = c.scale;
                   const size_t rows = size_t(tt) * c.h, nq = rows * c.dk, nv = rows * c.dv,
                                ns = size_t(nseq) * c.h * c.dk * c.dv;
                   auto q = RandomVec(nq, seed), k = RandomVec(nq, seed + 1), v = RandomVec(nv, seed + 2),
                        dout = RandomVec(nv, seed + 3);
                   std::vector<float> g;
                   if (c.decay == kHead) {
                     g.resize(rows);
                     for (size_t r = 0; r < rows; ++r) g[r] = std::log(1.f - std::exp2(-5.f - float(r % c.h)));
                   } else if (c.decay == kGate || c.decay == kStrong) {
                     g = RandomVec(rows, seed + 4, c.decay == kGate ? -0.5 : -4.0, 0.0);
                   }
                   std::vector<float> init, dfin;
                   if (c.state) {
                     init = RandomVec(ns, seed + 5);
                     dfin = RandomVec(ns, seed + 6);
                   }
                   Tensors d(mem);
                   const float *dq_in = d.In(q), *dk_in = d.In(k), *dv_in = d.In(v), *dg_in = d.In(g);
                   const int32_t* dcu = d.In(cu);
                   float* out = d.Unwritten(nv);
                   float* dinit = d.In(init);
                   float* fin = c.in_place ? dinit : (c.state ? d.Unwritten(ns) : nullptr);
                   ops.linear_attention_forward(p, dq_in, dk_in, dv_in, dg_in, dcu, nseq, tt, dinit, out, fin);
                   Outputs o{{"out", Bound::kReduction, d.Get(out, size_t(cu.back()) * c.h * c.dv)}};
                   if (c.state) o.push_back({"final_state", Bound::kReduction, d.Get(fin, ns)});
                   // The backward reads the initial state as it was.
                   const float* init2 = d.In(init);
                   float *dq = d.Unwritten(nq), *dk = d.Unwritten(nq), *dv = d.Unwritten(nv),
                         *dg = g.empty() ? nullptr : d.Unwritten(rows), *dinit2 = c.state ? d.Unwritten(ns) : nullptr;
                   ops.linear_attention_backward(p, dq_in, dk_in, dv_in, dg_in, dcu, nseq, tt, init2, d.In(dout),
                                                 d.In(dfin), dq, dk, dv, dg, dinit2);
                   o.push_back({"dq", Bound::kReduction, d.Get(dq, nq)});
                   o.push_back({"dk", Bound::kReduction, d.Get(dk, nq)});
                   o.push_back({"dv", Bound::kReduction, d.Get(dv, nv)});
                   if (dg != nullptr) o.push_back({"dg", Bound::kReduction, d.Get(dg, rows)});
                   if (c.state) o.push_back({"d_initial_state", Bound::kReduction, d.Get(dinit2, ns)});
                   return o;
                 }});
    seed += 7;
  }
}

// -------------------------------------------------------- sparse decode --
// Key block summaries (exact: max / min) and top-k block-sparse decode:
// partial last blocks, a row shorter than one block, GQA, top-k covering
// everything (= dense decode), no sink or recent blocks.
void AddSparseDecode(Table& t) {
  struct Case {
    std::vector<int32_t> lens;
    int cap, h, hkv, d, bs, topk, sinks, recent;
  };
  const Case cases[] = {{{5, 100, 300}, 320, 8, 2, 64, 16, 2, 1, 2},
                        {{5, 100, 300}, 320, 4, 1, 128, 32, 100, 1, 2},
                        {{77, 200}, 210, 4, 4, 32, 8, 3, 0, 1},
                        {{1, 64, 65}, 70, 2, 1, 48, 16, 1, 1, 0},
                        {{1000}, 1024, 4, 2, 64, 64, 4, 1, 2}};
  uint64_t seed = 1300;
  for (const Case& c : cases) {
    std::string lens;
    for (size_t i = 0; i < c.lens.size(); ++i) {
      if (i > 0) lens += ",";
      lens += std::to_string(c.lens[i]);
    }
    t.push_back(
        {"sparse_decode",
         Fmt("lens%s cap%d H%d Hkv%d D%d block%d top%d sink%d recent%d", lens.c_str(), c.cap, c.h, c.hkv, c.d, c.bs,
             c.topk, c.sinks, c.recent),
         [=](Ops& ops, DeviceMemory& mem, Ops&) {
           const int batch = int(c.lens.size());
           AttentionParams p;
           p.num_heads = c.h;
           p.num_kv_heads = c.hkv;
           p.head_dim = c.d;
           SparseDecodeParams s{c.bs, c.topk, c.sinks, c.recent};
           const size_t nq = size_t(batch) * c.h * c.d;
           const size_t nc = size_t(batch) * c.cap * c.hkv * c.d;
           const size_t ns = size_t(batch) * ((c.cap + c.bs - 1) / c.bs) * c.hkv * 2 * c.d;
           auto q = AttnInput(nq, seed, 1.5f), kc = AttnInput(nc, seed + 1, 1.5f), vc = RandomVec(nc, seed + 2);
           Tensors d(mem);
           const float* dk = d.In(kc);
           const int32_t* dl = d.In(c.lens);
           float* sum = d.Unwritten(ns);
           ops.key_block_summaries(p, batch, dk, c.cap, dl, c.bs, 0, sum);
           float* out = d.Unwritten(nq);
           ops.sparse_decode_attention(p, s, d.In(q), batch, dk, d.In(vc), c.cap, dl, sum, out);
           return Outputs{{"summaries", Bound::kExact, d.Get(sum, ns)}, {"out", Bound::kReduction, d.Get(out, nq)}};
         }});
    seed += 3;
  }
}

// ------------------------------------------------- paged sparse attention --
// Page summaries written row by row as sequences grow, then top-k block
// sparse attention of each sequence's last rows over shuffled pages: sparse
// blocks of one and several pages, fp32 and bf16 pools, GQA, several rows
// of one sequence (a prefill chunk), top-k covering everything.
void AddPagedSparse(Table& t) {
  struct Case {
    std::vector<int32_t> lens;
    int n_new, page, block, h, hkv, d, topk, sinks, recent;
    bool bf16;
  };
  const Case cases[] = {{{5, 100, 300}, 1, 16, 32, 8, 2, 64, 2, 1, 2, false},
                        {{77, 200}, 4, 8, 8, 4, 4, 32, 3, 0, 1, true},
                        {{1000}, 2, 16, 64, 4, 1, 128, 4, 1, 2, false},
                        {{1, 64, 65}, 1, 16, 16, 2, 1, 48, 100, 1, 1, true}};
  uint64_t seed = 2300;
  for (const Case& c : cases) {
    std::string lens;
    for (size_t i = 0; i < c.lens.size(); ++i) {
      if (i > 0) lens += ",";
      lens += std::to_string(c.lens[i]);
    }
    t.push_back(
        {"paged_sparse",
         Fmt("lens%s new%d page%d block%d H%d Hkv%d D%d top%d sink%d recent%d %s", lens.c_str(), c.n_new, c.page,
             c.block, c.h, c.hkv, c.d, c.topk, c.sinks, c.recent, c.bf16 ? "bf16" : "fp32"),
         [=](Ops& ops, DeviceMemory& mem, Ops&) {
           const int S = int(c.lens.size()), kd = c.hkv * c.d;
           int max_blocks = 0;
           for (int32_t len : c.lens)
             max_blocks = std::max(max_blocks, (len + c.block - 1) / c.block * (c.block / c.page));
           const int nb = S * max_blocks + 2;
           std::vector<int32_t> tables(size_t(S) * max_blocks, 0), slots, seq, pos;
           for (int i = 0; i < S * max_blocks; ++i) tables[i] = (i * 7 + 3) % nb;
           for (int s = 0; s < S; ++s) {
             for (int j = 0; j < c.lens[s]; ++j)
               slots.push_back(tables[s * max_blocks + j / c.page] * c.page + j % c.page);
           }
           for (int s = 0; s < S; ++s) {
             for (int j = std::max(0, c.lens[s] - c.n_new); j < c.lens[s]; ++j) {
               seq.push_back(s);
               pos.push_back(j);
             }
           }
           const int rows = int(slots.size()), qrows = int(pos.size());
           AttentionParams p;
           p.num_heads = c.h;
           p.num_kv_heads = c.hkv;
           p.head_dim = c.d;
           const SparseDecodeParams sp{c.block, c.topk, c.sinks, c.recent};
           const size_t np = size_t(nb) * c.page * kd, nq = size_t(qrows) * c.h * c.d,
                        ns = size_t(nb) * c.hkv * 2 * c.d;
           auto kn = AttnInput(size_t(rows) * kd, seed, 1.5f), vn = RandomVec(size_t(rows) * kd, seed + 1);
           auto q = AttnInput(nq, seed + 2, 1.5f);
           Tensors d(mem);
           PagedKv kv;
           kv.dtype = c.bf16 ? KvDtype::kBF16 : KvDtype::kF32;
           kv.block_size = c.page;
           kv.num_blocks = nb;
           kv.max_blocks = max_blocks;
           kv.block_tables = d.In(tables);
           if (c.bf16) {
             kv.k = d.In(std::vector<uint16_t>(np, 0));
             kv.v = d.In(std::vector<uint16_t>(np, 0));
           } else {
             kv.k = d.In(std::vector<float>(np, 0.f));
             kv.v = d.In(std::vector<float>(np, 0.f));
           }
           float* sum = d.In(std::vector<float>(ns, 0.f));
           const int32_t* dslots = d.In(slots);
           ops.paged_kv_write(kv, kd, d.In(kn), d.In(vn), dslots, rows);
           ops.paged_key_summaries(p, kv, dslots, rows, sum);
           float* out = d.Unwritten(nq);
           ops.paged_sparse_attention(p, sp, kv, sum, d.In(q), d.In(seq), d.In(pos), qrows, out);
           return Outputs{{"summaries", Bound::kExact, d.Get(sum, ns)}, {"out", Bound::kReduction, d.Get(out, nq)}};
         }});
    seed += 3;
  }
}

// --------------------------------------------------------------- lm head --
void AddLmHead(Table& t) {
  struct Shape {
    int t, c, v, chunk;
  };
  const Shape shapes[] = {{1, 1, 1, 1},       {1, 3, 2, 4},        {3, 16, 5, 2},      {17, 37, 100, 7},
                          {40, 64, 1000, 64}, {9, 33, 5000, 4},    {64, 24, 4099, 16}, {2, 8, 17, 1},
                          {37, 64, 1000, 16}, {64, 128, 5003, 64}, {1, 8, 3, 4},       {9, 16, 301, 9}};
  uint64_t seed = 800;
  for (const Shape& s : shapes) {
    t.push_back({"lm_head", Fmt("T%d C%d V%d chunk%d", s.t, s.c, s.v, s.chunk), [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   auto h = RandomVec(size_t(s.t) * s.c, seed);
                   auto w = RandomVec(size_t(s.v) * s.c, seed + 1, -0.6, 0.6);
                   auto tg = RandomIds(s.t, 0, s.v - 1, seed + 2);
                   if (s.t > 2) {
                     tg[1] = -100;  // ignored token
                     tg[2] = s.v;   // out of range: also no target
                   }
                   auto dlogp = RandomVec(s.t, seed + 3);
                   for (int i = 0; i < s.t; i += 3) dlogp[i] = 0.f;     // untrained
                   auto dw = RandomVec(w.size(), seed + 4, -0.1, 0.1);  // += into
                   Tensors d(mem);
                   const float *dh_in = d.In(h), *dw_in = d.In(w);
                   const int32_t* dtg = d.In(tg);
                   float* scratch = d.Unwritten(size_t(s.chunk) * s.v);
                   float *lp = d.Unwritten(s.t), *en = d.Unwritten(s.t), *lp_only = d.Unwritten(s.t);
                   ops.lm_head_logprobs_forward(dh_in, dw_in, dtg, s.t, s.c, s.v, s.chunk, scratch, lp, en);
                   ops.lm_head_logprobs_forward(dh_in, dw_in, dtg, s.t, s.c, s.v, s.chunk, scratch, lp_only, nullptr);
                   float *dh = d.Unwritten(h.size()), *ddw = d.In(dw);
                   ops.lm_head_logprobs_backward(dh_in, dw_in, dtg, d.In(dlogp), s.t, s.c, s.v, s.chunk, scratch, dh,
                                                 ddw);
                   Outputs o{{"logp", Bound::kReduction, d.Get(lp, s.t)}};
                   // V = 1: every entropy is 0 up to rounding noise.
                   if (s.v > 1) o.push_back({"entropy", Bound::kReduction, d.Get(en, s.t)});
                   o.push_back({"logp (no entropy)", Bound::kReduction, d.Get(lp_only, s.t)});
                   o.push_back({"dh", Bound::kReduction, d.Get(dh, h.size())});
                   o.push_back({"dw", Bound::kReduction, d.Get(ddw, w.size())});
                   return o;
                 }});
    seed += 5;
  }
  // No token trained: dh is exactly 0 and dw exactly unchanged.
  t.push_back({"lm_head", "T10 C8 V50 chunk4 all dlogp 0", [](Ops& ops, DeviceMemory& mem, Ops&) {
                 const int tt = 10, c = 8, v = 50, chunk = 4;
                 auto h = RandomVec(tt * c, 1), w = RandomVec(v * c, 2);
                 auto tg = RandomIds(tt, 0, v - 1, 3);
                 auto dw = RandomVec(v * c, 4);
                 Tensors d(mem);
                 float *dh = d.Unwritten(tt * c), *ddw = d.In(dw);
                 ops.lm_head_logprobs_backward(d.In(h), d.In(w), d.In(tg), d.In(std::vector<float>(tt, 0.f)), tt, c, v,
                                               chunk, d.Unwritten(chunk * v), dh, ddw);
                 return Outputs{{"dh", Bound::kExact, d.Get(dh, tt * c)}, {"dw", Bound::kExact, d.Get(ddw, v * c)}};
               }});
}

// ------------------------------------------------------------- optimizer --
void AddOptimizer(Table& t) {
  uint64_t seed = 900;
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{3001}, size_t{100003}, size_t{1000003}, size_t{1} << 20}) {
    t.push_back({"sum_squares", Fmt("n%zu", n), [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   auto g = RandomVec(n, seed, -3, 3);
                   Tensors d(mem);
                   Output o{"sum", Bound::kDoubleSum, {}};
                   o.scalar = ops.sum_squares(d.In(g), n);
                   return Outputs{o};
                 }});
    ++seed;
  }
  struct Case {
    size_t n;
    int64_t first_step;
    int steps;
    float lr, beta2, wd;
    bool update;  // compare p - p0 too (needs |dp| >> ulp(p): lr 0.05)
  };
  const Case cases[] = {{1, 1, 3, 0.05f, 0.95f, 0.1f, true},      {7, 1, 3, 0.05f, 0.95f, 0.1f, true},
                        {8, 1, 3, 0.05f, 0.95f, 0.1f, true},      {100003, 1, 3, 0.05f, 0.95f, 0.1f, true},
                        {10007, 1, 1, 1e-3f, 0.95f, 0.1f, false}, {10007, 10, 1, 1e-3f, 0.95f, 0.1f, false},
                        {3001, 3, 1, 1e-3f, 0.999f, 0.01f, false}};
  for (const Case& c : cases) {
    t.push_back({"adamw",
                 Fmt("n%zu steps%lld-%lld lr%g beta2 %g wd%g", c.n, (long long)c.first_step,
                     (long long)(c.first_step + c.steps - 1), c.lr, c.beta2, c.wd),
                 [=](Ops& ops, DeviceMemory& mem, Ops&) {
                   auto p = RandomVec(c.n, seed), m = RandomVec(c.n, seed + 1, -0.1, 0.1),
                        v = RandomVec(c.n, seed + 2, 0, 0.01);
                   Tensors d(mem);
                   float *dp = d.In(p), *dm = d.In(m), *dv = d.In(v);
                   for (int s = 0; s < c.steps; ++s) {
                     auto g = RandomVec(c.n, seed + 3 + s);
                     ops.adamw_step(dp, d.In(g), dm, dv, c.n, c.lr, 0.9f, c.beta2, 1e-8f, c.wd, c.first_step + s);
                   }
                   auto p1 = d.Get(dp, c.n);
                   Outputs o{{"p", Bound::kElementwise, p1},
                             {"m", Bound::kElementwise, d.Get(dm, c.n)},
                             {"v", Bound::kElementwise, d.Get(dv, c.n)}};
                   if (c.update) {
                     std::vector<float> dpv(c.n);  // rounding here << the bound
                     for (size_t i = 0; i < c.n; ++i) dpv[i] = p1[i] - p[i];
                     o.push_back({"p - p0", Bound::kUpdate, dpv});
                   }
                   return o;
                 }});
    seed += 3 + c.steps;
  }
}

// ------------------------------------------------------------- sampling --
// Ids equal to the reference (a draw within rounding of a boundary could
// differ; random draws never land there in practice), the log-probs within
// fp32 rounding. Vocabularies smaller and larger than a block, greedy and
// three temperatures, a row of ties, u at both ends of [0, 1).
void AddSampling(Table& t) {
  uint64_t seed = 1000;
  for (int v : {1, 7, 300, 5003, 151936}) {
    for (float temp : {0.f, 0.7f, 1.f, 1.3f}) {
      t.push_back(
          {"sample_logits", Fmt("rows64 v%d temperature %.1f", v, temp), [=](Ops& ops, DeviceMemory& mem, Ops&) {
             const int rows = 64;
             auto logits = RandomVec(size_t(rows) * v, seed, -8, 8);
             for (int i = 0; i < v; ++i) logits[size_t(5) * v + i] = 0.5f;
             auto u = RandomVec<double>(rows, seed + 1, 0, 1);
             u[0] = 0.0;
             u[1] = 0.9999999;
             Tensors d(mem);
             int32_t* ids = d.In(std::vector<int32_t>(rows, -7));
             float *lp = d.Unwritten(rows), *raw = d.Unwritten(rows);
             ops.sample_logits(d.In(logits), rows, v, temp, d.In(u), ids, lp, raw);
             return Outputs{{"ids", Bound::kExact, AsFloats(d.Get(ids, rows))},
                            {"logp_sample", Bound::kReduction, d.Get(lp, rows)},
                            {"logp_raw", Bound::kReduction, d.Get(raw, rows)}};
           }});
      seed += 2;
    }
  }
}

// fp32 <-> bf16: bit for bit, NaN, Inf, denormals and ties included.
void AddConvert(Table& t) {
  t.push_back({"bf16", "n1000003 with specials", [](Ops& ops, DeviceMemory& mem, Ops& ref) {
                 const size_t n = 1000003;
                 auto x = RandomVec(n, 1100, -1e3, 1e3);
                 const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                              0xffc00001u, 0x7f800001u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                              0x3f818000u, 0x7f7fffffu, 0x7f7f8000u, 0x00008000u, 0x00018000u};
                 for (size_t i = 0; i < sizeof(specials) / 4; ++i) std::memcpy(&x[i * 7], &specials[i], 4);
                 std::vector<uint16_t> bits(n);  // bf16_to_float's input
                 ref.float_to_bf16(x.data(), bits.data(), n);
                 Tensors d(mem);
                 uint16_t* y = d.In(std::vector<uint16_t>(n, 0x5555));
                 ops.float_to_bf16(d.In(x), y, n);
                 float* back = d.Unwritten(n);
                 ops.bf16_to_float(d.In(bits), back, n);
                 return Outputs{{"float_to_bf16", Bound::kExact, AsFloats(d.Get(y, n))},
                                {"bf16_to_float", Bound::kExact, d.Get(back, n)}};
               }});
}

// ------------------------------------------------------------ int8 blocks --
// Blockwise int8 quantisation (qwZ): the wire (scales, codes, padding) bit
// for bit, and dequantisation of the reference's wire bit for bit. Pieces
// shorter than, equal to and longer than a block, ragged tails, an all-zero
// block, outliers, specials of the code rounding (exact halves).
void AddInt8Blocks(Table& t) {
  uint64_t seed = 1200;
  for (size_t n : {size_t{1}, size_t{3}, size_t{255}, size_t{256}, size_t{257}, size_t{1000}, size_t{100003}}) {
    for (uint64_t rounding : {kInt8RoundNearest, uint64_t{0x5EED0000} + n}) {
      const char* mode = rounding == kInt8RoundNearest ? "nearest" : "stochastic";
      t.push_back({"int8_blocks", Fmt("n%zu_%s", n, mode), [=](Ops& ops, DeviceMemory& mem, Ops& ref) {
                     auto x = RandomVec(n, seed, -2, 2);
                     if (n >= 1000) {
                       std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // an all-zero block
                       x[700] = 1e4f;                                     // an outlier
                       // Codes that land on .5 exactly: amax 127, x = k + 0.5.
                       x[768] = 127.f;
                       for (size_t i = 769; i < 800; ++i) x[i] = static_cast<float>(i % 9) - 4.5f;
                     }
                     const size_t w = Int8WireFloats(n);
                     std::vector<float> ref_wire(w);
                     ref.quantize_int8(x.data(), n, ref_wire.data(), rounding);
                     Tensors d(mem);
                     float* wire = d.Unwritten(w);
                     ops.quantize_int8(d.In(x), n, wire, rounding);
                     float* out = d.Unwritten(n);
                     ops.dequantize_int8(d.In(ref_wire), n, out);
                     return Outputs{{"quantize_int8", Bound::kExact, d.Get(wire, w)},
                                    {"dequantize_int8", Bound::kExact, d.Get(out, n)}};
                   }});
    }
    ++seed;
  }
}

// Filtered sampling: ids equal to the reference (the same caveat as
// above), log-probs within the reduction bound. Rows of distinct values, a
// row of equal values, a row of +0 and -0, logits on a 0.5 grid (many ties),
// each row with a seen list (repeated ids, ids outside the vocabulary);
// every filter alone, all together, and the degenerate settings.
void AddFilteredSampling(Table& t) {
  struct Combo {
    const char* name;
    SampleFilter f;
  };
  const Combo combos[] = {
      {"all", {0.8f, 50, 0.9f, 0.05f, 1.3f}},         {"top_k 1", {1.f, 1, 1.f, 0.f, 1.f}},
      {"top_p 1e-6", {1.f, 0, 1e-6f, 0.f, 1.f}},      {"min_p 0.999", {1.f, 0, 1.f, 0.999f, 1.f}},
      {"top_p 0.95", {1.2f, 0, 0.95f, 0.f, 1.f}},     {"greedy penalty 2", {0.f, 0, 1.f, 0.f, 2.f}},
      {"min_p 0.1 T 1.5", {1.5f, 0, 1.f, 0.1f, 1.f}}, {"top_k 100 penalty 0.7", {0.7f, 100, 1.f, 0.f, 0.7f}},
  };
  uint64_t seed = 2000;
  for (int v : {1, 7, 300, 5003, 151936}) {
    const int rows = v > 100000 ? 5 : 12;
    for (const Combo& c : combos) {
      const SampleFilter f = c.f;
      t.push_back({"sample_filtered", Fmt("rows%d v%d %s", rows, v, c.name), [=](Ops& ops, DeviceMemory& mem, Ops&) {
                     auto logits = RandomVec(size_t(rows) * v, seed, -8, 8);
                     for (int i = 0; i < v; ++i) {
                       logits[size_t(2) * v + i] = 0.5f;
                       logits[size_t(3) * v + i] = (i % 2) ? -0.f : 0.f;
                       logits[size_t(4) * v + i] = std::round(logits[size_t(4) * v + i] * 2) / 2;
                     }
                     auto u = RandomVec<double>(rows, seed + 1, 0, 1);
                     u[0] = 0.0;
                     u[1] = 0.9999999;
                     std::mt19937_64 rng(seed + 2);
                     std::vector<int32_t> offsets{0}, seen;
                     for (int r = 0; r < rows; ++r) {
                       const float* row = logits.data() + size_t(r) * v;
                       const int32_t top = static_cast<int32_t>(std::max_element(row, row + v) - row);
                       const int n = static_cast<int>(rng() % 24);
                       for (int j = 0; j < n; ++j) {
                         const uint64_t x = rng() % 10;
                         seen.push_back(x == 0   ? -1
                                        : x == 1 ? v + 3
                                        : x < 4  ? top
                                                 : static_cast<int32_t>(rng() % static_cast<uint64_t>(v)));
                       }
                       offsets.push_back(static_cast<int32_t>(seen.size()));
                     }
                     Tensors d(mem);
                     int32_t* ids = d.In(std::vector<int32_t>(rows, -7));
                     float *lp = d.Unwritten(rows), *raw = d.Unwritten(rows);
                     ops.sample_filtered(d.In(logits), rows, v, f, d.In(offsets), d.In(seen), d.In(u), ids, lp, raw);
                     return Outputs{{"ids", Bound::kExact, AsFloats(d.Get(ids, rows))},
                                    {"logp_sample", Bound::kReduction, d.Get(lp, rows)},
                                    {"logp_raw", Bound::kReduction, d.Get(raw, rows)}};
                   }});
      seed += 3;
    }
  }
}

Table Build() {
  Table t;
  AddMatmul(t);
  AddEmbedding(t);
  AddRmsnorm(t);
  AddSwiglu(t);
  AddElementwise(t);
  AddRope(t);
  AddAttention(t);
  AddDecode(t);
  AddLinearAttention(t);
  AddSparseDecode(t);
  AddPagedSparse(t);
  AddPaged(t);
  AddLmHead(t);
  AddOptimizer(t);
  AddSampling(t);
  AddFilteredSampling(t);
  AddConvert(t);
  AddInt8Blocks(t);
  return t;
}

}  // namespace

const std::vector<OpCase>& OpCases() {
  static const Table* const table = new Table(Build());
  return *table;
}

std::vector<std::string> OpFamilies() {
  std::vector<std::string> ops;
  for (const OpCase& c : OpCases())
    if (ops.empty() || ops.back() != c.op) ops.push_back(c.op);
  return ops;
}

}  // namespace tandem::kernels::testing
