// GuardedMemory and the guarded Ops: allocator behaviour, copies, the faults
// that prove the device discipline (host access of a device pointer, a host
// pointer handed to an op, use after free, out of bounds), and
// guarded(CpuOps) == CpuOps bit for bit.
#include "kernels/guarded/guarded_memory.h"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

using testing::RandomIds;
using testing::RandomVec;

constexpr size_t kCap = size_t{64} << 20;

template <typename T>
DeviceArray<T> Up(DeviceMemory* mem, const std::vector<T>& host) {
  DeviceArray<T> a;
  EXPECT_TRUE(a.Allocate(mem, host.size()));
  a.Upload(host.data(), host.size());
  return a;
}

template <typename T>
std::vector<T> Down(const DeviceArray<T>& a) {
  std::vector<T> host(a.size());
  a.Download(host.data(), host.size());
  return host;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(GuardedMemoryTest, AllocateAlignFreeCoalesce) {
  GuardedMemory mem(size_t{2} << 20);
  ASSERT_TRUE(mem.ok()) << mem.last_error();
  EXPECT_STREQ(mem.name(), "guarded");
  EXPECT_EQ(mem.Allocate(0), nullptr);
  EXPECT_TRUE(mem.ok());

  char* a = static_cast<char*>(mem.Allocate(1000));
  char* b = static_cast<char*>(mem.Allocate(1));
  char* c = static_cast<char*>(mem.Allocate(300));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  for (char* p : {a, b, c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    EXPECT_TRUE(mem.Contains(p));
  }
  EXPECT_EQ(b, a + 1024);  // first fit, 256-byte granules
  EXPECT_EQ(c, b + 256);
  EXPECT_EQ(mem.allocated_bytes(), 1301u);

  mem.Free(b);
  EXPECT_EQ(mem.allocated_bytes(), 1300u);
  EXPECT_EQ(mem.Allocate(200), b);  // the hole is reused
  mem.Free(b);
  EXPECT_EQ(mem.Allocate(512), c + 512);  // does not fit the hole: after c

  // Everything freed coalesces back into one range of the whole capacity.
  mem.Free(c + 512);
  mem.Free(a);
  mem.Free(c);
  EXPECT_EQ(mem.allocated_bytes(), 0u);
  void* all = mem.Allocate(mem.capacity());
  EXPECT_EQ(all, a);
  EXPECT_EQ(mem.allocated_bytes(), mem.capacity());
  EXPECT_TRUE(mem.ok());
  EXPECT_EQ(mem.Allocate(256), nullptr);  // exhausted
  EXPECT_TRUE(mem.ok());  // not sticky: free something and retry
  EXPECT_NE(mem.last_error().find("out of memory allocating 256"),
            std::string::npos)
      << mem.last_error();
  mem.Free(all);
  EXPECT_EQ(mem.allocated_bytes(), 0u);
  void* again = mem.Allocate(256);  // the retry succeeds
  EXPECT_NE(again, nullptr);
  mem.Free(again);
}

TEST(GuardedMemoryTest, DefaultCapacityIsAddressSpaceOnly) {
  auto mem = MakeGuardedMemory();  // 16 GiB reserved twice, nothing touched
  ASSERT_TRUE(mem->ok()) << mem->last_error();
  EXPECT_EQ(mem->capacity(), size_t{16} << 30);
  void* big = mem->Allocate(size_t{8} << 30);
  ASSERT_NE(big, nullptr);
  mem->SetZero(static_cast<char*>(big) + (size_t{4} << 30), 4096);
  mem->Free(big);
  EXPECT_EQ(mem->allocated_bytes(), 0u);
}

TEST(GuardedMemoryTest, CopiesRoundTrip) {
  auto mem = MakeGuardedMemory(kCap);
  const auto host = RandomVec(10000, 1);
  DeviceArray<float> a = Up<float>(mem.get(), host);
  DeviceArray<float> b;
  ASSERT_TRUE(b.AllocateZeroed(mem.get(), host.size()));
  EXPECT_EQ(Down(b), std::vector<float>(host.size(), 0.f));
  mem->CopyOnDevice(b.data() + 10, a.data() + 20, 100 * sizeof(float));
  mem->SetZero(a.data() + 5000, 5000 * sizeof(float));
  const auto a2 = Down(a);
  const auto b2 = Down(b);
  for (size_t i = 0; i < host.size(); ++i) {
    ASSERT_EQ(a2[i], i < 5000 ? host[i] : 0.f) << i;
    ASSERT_EQ(b2[i], (i >= 10 && i < 110) ? host[i + 10] : 0.f) << i;
  }
  // Partial upload/download at an offset.
  std::vector<float> part(7, 3.5f), back(7);
  a.Upload(part.data(), 7, 9993);
  a.Download(back.data(), 7, 9993);
  EXPECT_EQ(back, part);
  EXPECT_TRUE(mem->Synchronize());
  EXPECT_EQ(mem->allocated_bytes(), 2 * host.size() * sizeof(float));
}

TEST(GuardedMemoryTest, FreedPagesReadZeroAndRealChecksBounds) {
  auto mem = MakeGuardedMemory(kCap);
  const size_t n = 1 << 16;  // 256 KiB: whole pages
  float* p = static_cast<float*>(mem->Allocate(n * sizeof(float)));
  std::vector<float> ones(n, 1.f), back(n);
  mem->CopyToDevice(p, ones.data(), n * sizeof(float));
  EXPECT_NE(mem->Real(p, n * sizeof(float), "p"), static_cast<void*>(p));
  EXPECT_EQ(mem->Real(nullptr, 10, "null"), nullptr);
  int host = 0;
  EXPECT_EQ(mem->Real(&host, 4, "host", /*allow_host=*/true), &host);
  EXPECT_FALSE(mem->Contains(&host));
  // One past the end with zero bytes is a valid address.
  EXPECT_NE(mem->Real(p + n, 0, "end"), nullptr);
  mem->Free(p);
  float* q = static_cast<float*>(mem->Allocate(n * sizeof(float)));
  ASSERT_EQ(q, p);
  mem->CopyToHost(back.data(), q, n * sizeof(float));
  EXPECT_EQ(back, std::vector<float>(n, 0.f));  // pages went back to the OS
  mem->Free(q);
}

// ---- Faults: each must kill the process, like an illegal address on a GPU.

class GuardedDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(GuardedDeathTest, HostReadOfDevicePointerFaults) {
  auto mem = MakeGuardedMemory(kCap);
  float* p = static_cast<float*>(mem->Allocate(64 * sizeof(float)));
  mem->SetZero(p, 64 * sizeof(float));
  EXPECT_EXIT(
      {
        volatile float x = p[3];
        (void)x;
      },
      ::testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT({ p[0] = 1.f; }, ::testing::KilledBySignal(SIGSEGV), "");
  mem->Free(p);
}

TEST_F(GuardedDeathTest, HostPointerToOpAborts) {
  auto mem = MakeGuardedMemory(kCap);
  auto ops = MakeGuardedOps(MakeCpuOps(1), mem.get());
  std::vector<float> host(16, 1.f);
  EXPECT_DEATH(ops->scale(host.data(), 2.f, host.size()),
               "guarded: scale x: .* is not a device pointer");
  DeviceArray<float> d = Up<float>(mem.get(), host);
  EXPECT_DEATH(ops->add_inplace(d.data(), host.data(), 16),
               "guarded: add_inplace x: .* is not a device pointer");
  EXPECT_DEATH(mem->CopyToDevice(host.data(), d.data(), 16),
               "CopyToDevice src: .* is a device pointer");
}

TEST_F(GuardedDeathTest, UseAfterFreeAndOutOfBoundsAbort) {
  auto mem = MakeGuardedMemory(kCap);
  auto ops = MakeGuardedOps(MakeCpuOps(1), mem.get());
  float* p = static_cast<float*>(mem->Allocate(100 * sizeof(float)));
  mem->SetZero(p, 100 * sizeof(float));
  EXPECT_DEATH(ops->sum_squares(p, 101),
               "sum_squares g: .* not inside a live allocation");
  EXPECT_DEATH(ops->sum_squares(p + 50, 51), "not inside a live allocation");
  std::vector<float> big(101);
  EXPECT_DEATH(mem->CopyToHost(big.data(), p, big.size() * sizeof(float)),
               "CopyToHost src");
  mem->Free(p);
  EXPECT_DEATH(ops->scale(p, 2.f, 100), "use after free");
  EXPECT_DEATH(mem->Free(p), "double free");
}

// Two threads inside one Ops instance at once (CUDA ops are one per
// thread): thread A keeps a long sum_squares running while thread B calls a
// short op in a bounded loop; B's first call that overlaps aborts.
TEST_F(GuardedDeathTest, TwoThreadsInOneOpsInstanceAbort) {
  EXPECT_DEATH(
      {
        auto mem = MakeGuardedMemory(size_t{128} << 20);
        auto ops = MakeGuardedOps(MakeCpuOps(1), mem.get());
        const size_t n = size_t{8} << 20;  // 32 MB: milliseconds per pass
        float* big = static_cast<float*>(mem->Allocate(n * sizeof(float)));
        float* small = static_cast<float*>(mem->Allocate(16 * sizeof(float)));
        mem->SetZero(big, n * sizeof(float));
        mem->SetZero(small, 16 * sizeof(float));
        std::atomic<bool> stop{false};
        std::thread a([&] {
          for (int i = 0; i < 200 && !stop; ++i) ops->sum_squares(big, n);
        });
        for (int i = 0; i < 2000000; ++i) ops->scale(small, 1.f, 16);
        stop = true;
        a.join();
      },
      "entered by two threads at once");
}

// ---- guarded(CpuOps) == CpuOps, bit for bit.

class GuardedOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_ = MakeGuardedMemory(kCap);
    cpu_ = MakeCpuOps(1);
    guarded_ = MakeGuardedOps(MakeCpuOps(1), mem_.get());
  }
  template <typename T>
  DeviceArray<T> D(const std::vector<T>& v) {
    return Up<T>(mem_.get(), v);
  }
  std::unique_ptr<GuardedMemory> mem_;
  std::unique_ptr<Ops> cpu_, guarded_;
};

TEST_F(GuardedOpsTest, Name) {
  EXPECT_EQ(std::string(guarded_->name()),
            std::string("guarded(") + cpu_->name() + ")");
}

TEST_F(GuardedOpsTest, MatmulAllTransposes) {
  const int m = 13, n = 17, k = 29, ld_pad = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = (ta ? m : k) + ld_pad, ldb = (tb ? k : n) + ld_pad;
      const int ldc = n + ld_pad;
      const auto a = RandomVec(static_cast<size_t>(ta ? k : m) * lda, 2);
      const auto b = RandomVec(static_cast<size_t>(tb ? n : k) * ldb, 3);
      auto c = RandomVec(static_cast<size_t>(m) * ldc, 4);
      auto da = D(a), db = D(b), dc = D(c);
      cpu_->matmul(ta, tb, m, n, k, 0.7f, a.data(), lda, b.data(), ldb, 0.3f,
                   c.data(), ldc);
      guarded_->matmul(ta, tb, m, n, k, 0.7f, da.data(), lda, db.data(), ldb,
                       0.3f, dc.data(), ldc);
      EXPECT_TRUE(SameBits(Down(dc), c)) << ta << tb;
    }
  }
}

TEST_F(GuardedOpsTest, AttentionForwardBackward) {
  AttentionParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 16;
  const std::vector<int32_t> cu = {0, 11, 30, 37};
  const int t = 37, ns = 3;
  const size_t qn = size_t{t} * 4 * 16, kn = size_t{t} * 2 * 16;
  const auto q = RandomVec(qn, 5), k = RandomVec(kn, 6), v = RandomVec(kn, 7);
  const auto dout = RandomVec(qn, 8);
  std::vector<float> out(qn), lse(t * 4), dq(qn), dk(kn), dv(kn);
  auto d_q = D(q), d_k = D(k), d_v = D(v), d_dout = D(dout);
  auto d_cu = D(cu);
  auto d_out = D(out), d_lse = D(lse);
  auto d_dq = D(dq), d_dk = D(dk), d_dv = D(dv);
  for (int window : {-1, 5}) {
    p.window = window;
    cpu_->attention_forward(p, q.data(), k.data(), v.data(), cu.data(), ns, t,
                            out.data(), lse.data());
    guarded_->attention_forward(p, d_q.data(), d_k.data(), d_v.data(),
                                d_cu.data(), ns, t, d_out.data(), d_lse.data());
    EXPECT_TRUE(SameBits(Down(d_out), out));
    EXPECT_TRUE(SameBits(Down(d_lse), lse));
    cpu_->attention_backward(p, q.data(), k.data(), v.data(), out.data(),
                             dout.data(), lse.data(), cu.data(), ns, t,
                             dq.data(), dk.data(), dv.data());
    guarded_->attention_backward(p, d_q.data(), d_k.data(), d_v.data(),
                                 d_out.data(), d_dout.data(), d_lse.data(),
                                 d_cu.data(), ns, t, d_dq.data(), d_dk.data(),
                                 d_dv.data());
    EXPECT_TRUE(SameBits(Down(d_dq), dq));
    EXPECT_TRUE(SameBits(Down(d_dk), dk));
    EXPECT_TRUE(SameBits(Down(d_dv), dv));
  }
  // Decode over a cache: batch 2, 3 new tokens each.
  const int batch = 2, n_new = 3, cap = 20;
  const std::vector<int32_t> len = {9, 20};
  const auto dq2 = RandomVec(size_t{batch} * n_new * 4 * 16, 9);
  const auto kc = RandomVec(size_t{batch} * cap * 2 * 16, 10);
  const auto vc = RandomVec(size_t{batch} * cap * 2 * 16, 11);
  std::vector<float> o(dq2.size());
  auto d_q2 = D(dq2), d_kc = D(kc), d_vc = D(vc), d_o = D(o);
  auto d_len = D(len);
  p.window = -1;
  cpu_->decode_attention(p, dq2.data(), batch, n_new, kc.data(), vc.data(), cap,
                         len.data(), o.data());
  guarded_->decode_attention(p, d_q2.data(), batch, n_new, d_kc.data(),
                             d_vc.data(), cap, d_len.data(), d_o.data());
  EXPECT_TRUE(SameBits(Down(d_o), o));
}

TEST_F(GuardedOpsTest, LmHeadForwardBackward) {
  const int t = 23, c = 24, v = 51, chunk = 8;
  const auto h = RandomVec(size_t{t} * c, 12), w = RandomVec(size_t{v} * c, 13);
  const auto targets = RandomIds(t, 0, v - 1, 14);
  const auto dlogp = RandomVec(t, 15);
  std::vector<float> scratch(size_t{chunk} * v), logp(t), ent(t);
  std::vector<float> dh(size_t{t} * c), dw = RandomVec(size_t{v} * c, 16);
  auto d_h = D(h), d_w = D(w), d_dl = D(dlogp);
  auto d_tg = D(targets);
  auto d_s = D(scratch), d_lp = D(logp), d_e = D(ent), d_dh = D(dh),
       d_dw = D(dw);
  cpu_->lm_head_logprobs_forward(h.data(), w.data(), targets.data(), t, c, v,
                                 chunk, scratch.data(), logp.data(),
                                 ent.data());
  guarded_->lm_head_logprobs_forward(d_h.data(), d_w.data(), d_tg.data(), t, c,
                                     v, chunk, d_s.data(), d_lp.data(),
                                     d_e.data());
  EXPECT_TRUE(SameBits(Down(d_lp), logp));
  EXPECT_TRUE(SameBits(Down(d_e), ent));
  // entropy == nullptr stays nullptr.
  guarded_->lm_head_logprobs_forward(d_h.data(), d_w.data(), d_tg.data(), t, c,
                                     v, chunk, d_s.data(), d_lp.data(),
                                     nullptr);
  EXPECT_TRUE(SameBits(Down(d_lp), logp));
  cpu_->lm_head_logprobs_backward(h.data(), w.data(), targets.data(),
                                  dlogp.data(), t, c, v, chunk, scratch.data(),
                                  dh.data(), dw.data());
  guarded_->lm_head_logprobs_backward(d_h.data(), d_w.data(), d_tg.data(),
                                      d_dl.data(), t, c, v, chunk, d_s.data(),
                                      d_dh.data(), d_dw.data());
  EXPECT_TRUE(SameBits(Down(d_dh), dh));
  EXPECT_TRUE(SameBits(Down(d_dw), dw));
}

TEST_F(GuardedOpsTest, AdamwAndElementwise) {
  const size_t n = 1001;
  auto p = RandomVec(n, 17), m = RandomVec(n, 18, 0, 0.1);
  auto v = RandomVec(n, 19, 0, 0.1);
  const auto g = RandomVec(n, 20);
  auto d_p = D(p), d_m = D(m), d_v = D(v), d_g = D(g);
  for (int64_t step = 1; step <= 3; ++step) {
    cpu_->adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f,
                     0.999f, 1e-8f, 0.01f, step);
    guarded_->adamw_step(d_p.data(), d_g.data(), d_m.data(), d_v.data(), n,
                         1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
  }
  EXPECT_TRUE(SameBits(Down(d_p), p));
  EXPECT_TRUE(SameBits(Down(d_m), m));
  EXPECT_TRUE(SameBits(Down(d_v), v));
  EXPECT_EQ(guarded_->sum_squares(d_p.data(), n),
            cpu_->sum_squares(p.data(), n));
  cpu_->scale(p.data(), 0.5f, n);
  guarded_->scale(d_p.data(), 0.5f, n);
  cpu_->add_inplace(p.data(), g.data(), n);
  guarded_->add_inplace(d_p.data(), d_g.data(), n);
  EXPECT_TRUE(SameBits(Down(d_p), p));
  std::vector<uint16_t> b(n);
  std::vector<float> f(n);
  auto d_b = D(b);
  auto d_f = D(f);
  cpu_->float_to_bf16(p.data(), b.data(), n);
  cpu_->bf16_to_float(b.data(), f.data(), n);
  guarded_->float_to_bf16(d_p.data(), d_b.data(), n);
  guarded_->bf16_to_float(d_b.data(), d_f.data(), n);
  EXPECT_TRUE(SameBits(Down(d_b), b));
  EXPECT_TRUE(SameBits(Down(d_f), f));
}

TEST_F(GuardedOpsTest, EmbeddingRmsnormRopeSwiglu) {
  const int t = 19, c = 32, vocab = 40, nh = 2, d = 16;
  const auto ids = RandomIds(t, 0, vocab - 1, 21);
  const auto table = RandomVec(size_t{vocab} * c, 22);
  std::vector<float> x(size_t{t} * c), y(x.size()), rstd(t), dx(x.size());
  auto dtable = RandomVec(table.size(), 23);
  const auto w = RandomVec(c, 24), dy = RandomVec(x.size(), 25);
  auto dw = RandomVec(c, 26);
  auto d_ids = D(ids);
  auto d_table = D(table), d_x = D(x), d_y = D(y), d_rstd = D(rstd),
       d_dx = D(dx), d_dtable = D(dtable), d_w = D(w), d_dy = D(dy),
       d_dw = D(dw);
  cpu_->embedding_forward(ids.data(), t, table.data(), c, x.data());
  guarded_->embedding_forward(d_ids.data(), t, d_table.data(), c, d_x.data());
  EXPECT_TRUE(SameBits(Down(d_x), x));
  cpu_->rmsnorm_forward(x.data(), w.data(), t, c, 1e-5f, y.data(), rstd.data());
  guarded_->rmsnorm_forward(d_x.data(), d_w.data(), t, c, 1e-5f, d_y.data(),
                            d_rstd.data());
  EXPECT_TRUE(SameBits(Down(d_y), y));
  cpu_->rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), t, c,
                         dx.data(), dw.data());
  guarded_->rmsnorm_backward(d_dy.data(), d_x.data(), d_w.data(), d_rstd.data(),
                             t, c, d_dx.data(), d_dw.data());
  EXPECT_TRUE(SameBits(Down(d_dx), dx));
  EXPECT_TRUE(SameBits(Down(d_dw), dw));
  cpu_->embedding_backward(ids.data(), t, dy.data(), c, dtable.data());
  guarded_->embedding_backward(d_ids.data(), t, d_dy.data(), c,
                               d_dtable.data());
  EXPECT_TRUE(SameBits(Down(d_dtable), dtable));

  // Rope on [t, nh, d] (= x viewed as [19, 2, 16]) with positions 5..23.
  RopeConfig rc;
  rc.head_dim = d;
  const int max_pos = 30;
  std::vector<float> cs(size_t{max_pos} * d / 2), sn(cs.size());
  rope_tables(rc, max_pos, max_pos, cs.data(), sn.data());
  std::vector<int32_t> pos(t);
  for (int i = 0; i < t; ++i) pos[i] = i + 5;
  auto d_pos = D(pos);
  auto d_cs = D(cs), d_sn = D(sn);
  for (bool inverse : {false, true}) {
    cpu_->rope_apply(x.data(), pos.data(), t, nh, d, cs.data(), sn.data(),
                     inverse);
    guarded_->rope_apply(d_x.data(), d_pos.data(), t, nh, d, d_cs.data(),
                         d_sn.data(), inverse);
    EXPECT_TRUE(SameBits(Down(d_x), x));
  }
  std::vector<float> h(x.size()), dg(x.size()), du(x.size());
  auto d_h = D(h), d_dg = D(dg), d_du = D(du);
  cpu_->swiglu_forward(x.data(), y.data(), x.size(), h.data());
  guarded_->swiglu_forward(d_x.data(), d_y.data(), x.size(), d_h.data());
  EXPECT_TRUE(SameBits(Down(d_h), h));
  cpu_->swiglu_backward(dy.data(), x.data(), y.data(), x.size(), dg.data(),
                        du.data());
  guarded_->swiglu_backward(d_dy.data(), d_x.data(), d_y.data(), x.size(),
                            d_dg.data(), d_du.data());
  EXPECT_TRUE(SameBits(Down(d_dg), dg));
  EXPECT_TRUE(SameBits(Down(d_du), du));
  // add_bias / bias_backward on [t, c].
  cpu_->add_bias(y.data(), w.data(), t, c);
  guarded_->add_bias(d_y.data(), d_w.data(), t, c);
  EXPECT_TRUE(SameBits(Down(d_y), y));
  cpu_->bias_backward(dy.data(), t, c, dw.data());
  guarded_->bias_backward(d_dy.data(), t, c, d_dw.data());
  EXPECT_TRUE(SameBits(Down(d_dw), dw));
}

}  // namespace
}  // namespace tandem::kernels
