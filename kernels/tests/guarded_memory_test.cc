// GuardedMemory and the guarded Ops: allocator behaviour, copies, the faults
// that prove the device discipline (host access of a device pointer, a host
// pointer handed to an op, use after free, out of bounds). That
// guarded(CpuOps) == CpuOps bit for bit is checked over the kernel case
// table by kernels_ops_test (cpu_guarded).
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
  EXPECT_TRUE(mem.ok());                  // not sticky: free something and retry
  EXPECT_NE(mem.last_error().find("out of memory allocating 256"), std::string::npos) << mem.last_error();
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
  EXPECT_DEATH(ops->scale(host.data(), 2.f, host.size()), "guarded: scale x: .* is not a device pointer");
  DeviceArray<float> d = Up<float>(mem.get(), host);
  EXPECT_DEATH(ops->add_inplace(d.data(), host.data(), 16), "guarded: add_inplace x: .* is not a device pointer");
  EXPECT_DEATH(mem->CopyToDevice(host.data(), d.data(), 16), "CopyToDevice src: .* is a device pointer");
}

TEST_F(GuardedDeathTest, UseAfterFreeAndOutOfBoundsAbort) {
  auto mem = MakeGuardedMemory(kCap);
  auto ops = MakeGuardedOps(MakeCpuOps(1), mem.get());
  float* p = static_cast<float*>(mem->Allocate(100 * sizeof(float)));
  mem->SetZero(p, 100 * sizeof(float));
  EXPECT_DEATH(ops->sum_squares(p, 101), "sum_squares g: .* not inside a live allocation");
  EXPECT_DEATH(ops->sum_squares(p + 50, 51), "not inside a live allocation");
  std::vector<float> big(101);
  EXPECT_DEATH(mem->CopyToHost(big.data(), p, big.size() * sizeof(float)), "CopyToHost src");
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

// ---- The guarded Ops. guarded(CpuOps) == CpuOps bit for bit, for every
// case of the kernel case table: kernels_ops_test (cpu_guarded).

TEST(GuardedOpsTest, Name) {
  auto mem = MakeGuardedMemory(kCap);
  auto guarded = MakeGuardedOps(MakeCpuOps(1), mem.get());
  EXPECT_EQ(std::string(guarded->name()), std::string("guarded(") + MakeCpuOps(1)->name() + ")");
}

}  // namespace
}  // namespace tandem::kernels
