// MakeGuardedCollective over Gloo, 2 and 3 ranks as threads: every
// collective on guarded device buffers gives the same bits as on host
// buffers; host pointers pass through; byte accounting is forwarded; a
// guarded range outside its allocation aborts.
#include "worker/comm/guarded_collective.h"

#include <cstring>
#include <numeric>

#include "kernels/memory.h"
#include "tests/comm/comm_test_util.h"

namespace tandem::comm {
namespace {

using kernels::DeviceArray;
using kernels::GuardedMemory;
using testing::TestOptions;
using testing::Values;
constexpr Timeout kT{20000};
constexpr size_t kCap = size_t{256} << 20;

// Runs fn(guarded collective, its memory) on n threads, one rank each.
void RunGuarded(int n, const std::function<void(Collective&, GuardedMemory&)>& fn) {
  ::tandem::testing::RunRankThreads(n, [&](int, std::unique_ptr<Collective> c) {
    auto mem = kernels::MakeGuardedMemory(kCap);
    auto g = MakeGuardedCollective(std::move(c), mem.get());
    fn(*g, *mem);
  });
}

DeviceArray<float> Up(GuardedMemory& mem, const std::vector<float>& v) {
  DeviceArray<float> a;
  EXPECT_TRUE(a.Allocate(&mem, v.size()));
  a.Upload(v.data(), v.size());
  return a;
}

std::vector<float> Down(const DeviceArray<float>& a) {
  std::vector<float> v(a.size());
  a.Download(v.data(), v.size());
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GuardedCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(GuardedCollectiveTest, AllreduceBroadcastScanMatchHost) {
  const int n = GetParam();
  RunGuarded(n, [&](Collective& c, GuardedMemory& mem) {
    EXPECT_EQ(c.backend(), "gloo");
    EXPECT_EQ(c.size(), n);
    for (size_t len : {size_t{1}, size_t{1001}, size_t{70001}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        auto host = Values(c.rank(), len);
        auto dev = Up(mem, host);
        ASSERT_TRUE(c.allreduce(host.data(), len, op, kT).ok());
        ASSERT_TRUE(c.allreduce(dev.data(), len, op, kT).ok());
        EXPECT_TRUE(SameBits(Down(dev), host)) << len;
      }
      auto host = Values(c.rank(), len, 2);
      auto dev = Up(mem, host);
      ASSERT_TRUE(c.broadcast(host.data(), len, n - 1, kT).ok());
      ASSERT_TRUE(c.broadcast(dev.data(), len, n - 1, kT).ok());
      EXPECT_TRUE(SameBits(Down(dev), host));
      EXPECT_TRUE(SameBits(host, Values(n - 1, len, 2)));

      host = Values(c.rank(), len, 3);
      dev = Up(mem, host);
      ASSERT_TRUE(c.all_scan(host.data(), len, ScanOp::Sum(), kT).ok());
      ASSERT_TRUE(c.all_scan(dev.data(), len, ScanOp::Sum(), kT).ok());
      EXPECT_TRUE(SameBits(Down(dev), host));
    }
    ASSERT_TRUE(c.barrier(kT).ok());
    // Zero length on a device pointer: succeeds without communicating.
    auto one = Up(mem, {1.f});
    EXPECT_TRUE(c.allreduce(one.data(), 0, ReduceOp::kSum, kT).ok());
  });
}

TEST_P(GuardedCollectiveTest, ReduceScatterAllgatherMatchHost) {
  const int n = GetParam();
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = 1001 + 7 * r;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  RunGuarded(n, [&](Collective& c, GuardedMemory& mem) {
    const int me = c.rank();
    size_t off = 0;
    for (int r = 0; r < me; ++r) off += counts[r];

    const auto in = Values(me, total, 4);
    std::vector<float> host_out(counts[me]);
    auto dev_in = Up(mem, in);
    auto dev_out = Up(mem, std::vector<float>(counts[me], -1.f));
    ASSERT_TRUE(c.reduce_scatter(in.data(), host_out.data(), counts, kT).ok());
    ASSERT_TRUE(c.reduce_scatter(dev_in.data(), dev_out.data(), counts, kT).ok());
    EXPECT_TRUE(SameBits(Down(dev_out), host_out));
    // Mixed: device in, host out.
    std::vector<float> mixed(counts[me]);
    ASSERT_TRUE(c.reduce_scatter(dev_in.data(), mixed.data(), counts, kT).ok());
    EXPECT_TRUE(SameBits(mixed, host_out));

    // Allgather, in place (in aliases out + off) on the device buffer.
    const auto mine = Values(me, counts[me], 5);
    std::vector<float> host_all(total);
    ASSERT_TRUE(c.allgather(mine.data(), host_all.data(), counts, kT).ok());
    DeviceArray<float> dev_all;
    ASSERT_TRUE(dev_all.AllocateZeroed(&mem, total));
    dev_all.Upload(mine.data(), mine.size(), off);
    ASSERT_TRUE(c.allgather(dev_all.data() + off, dev_all.data(), counts, kT).ok());
    EXPECT_TRUE(SameBits(Down(dev_all), host_all));
    for (int r = 0, o = 0; r < c.size(); o += counts[r], ++r) {
      const auto theirs = Values(r, counts[r], 5);
      EXPECT_TRUE(std::equal(theirs.begin(), theirs.end(), host_all.begin() + o));
    }
  });
}

TEST_P(GuardedCollectiveTest, SendRecvDeviceAndHost) {
  const int n = GetParam();
  const size_t len = 5003;
  RunGuarded(n, [&](Collective& c, GuardedMemory& mem) {
    const int me = c.rank();
    if (me == 0) {
      for (int peer = 1; peer < n; ++peer) {
        auto dev = Up(mem, Values(peer, len, 6));
        ASSERT_TRUE(c.send(dev.data(), len * 4, peer, 1, kT).ok());
      }
      for (int peer = 1; peer < n; ++peer) {
        DeviceArray<float> dev;
        ASSERT_TRUE(dev.Allocate(&mem, len));
        ASSERT_TRUE(c.recv(dev.data(), len * 4, peer, 2, kT).ok());
        EXPECT_TRUE(SameBits(Down(dev), Values(peer, len, 7)));
      }
    } else {
      DeviceArray<float> dev;
      ASSERT_TRUE(dev.Allocate(&mem, len));
      ASSERT_TRUE(c.recv(dev.data(), len * 4, 0, 1, kT).ok());
      EXPECT_TRUE(SameBits(Down(dev), Values(me, len, 6)));
      const auto host = Values(me, len, 7);  // host pointer passes through
      ASSERT_TRUE(c.send(host.data(), len * 4, 0, 2, kT).ok());
    }
  });
}

TEST_P(GuardedCollectiveTest, BytesForwarded) {
  const int n = GetParam();
  const size_t len = 4096;
  RunGuarded(n, [&](Collective& c, GuardedMemory& mem) {
    c.ResetBytes();
    auto host = Values(c.rank(), len);
    ASSERT_TRUE(c.allreduce(host.data(), len, ReduceOp::kSum, kT).ok());
    const ByteCount h = c.bytes(CollectiveKind::kAllreduce);
    EXPECT_EQ(h.calls, 1u);
    EXPECT_GT(h.sent, 0u);
    EXPECT_GT(h.received, 0u);
    c.ResetBytes();
    auto dev = Up(mem, host);
    ASSERT_TRUE(c.allreduce(dev.data(), len, ReduceOp::kSum, kT).ok());
    const ByteCount d = c.bytes(CollectiveKind::kAllreduce);
    EXPECT_EQ(d.calls, h.calls);
    EXPECT_EQ(d.sent, h.sent);
    EXPECT_EQ(d.received, h.received);
    EXPECT_EQ(c.total_bytes().sent, d.sent);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GuardedCollectiveTest, ::testing::Values(2, 3));

TEST(GuardedCollectiveDeathTest, OutOfBoundsDevicePointerAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        RunGuarded(1, [](Collective& c, GuardedMemory& mem) {
          auto dev = Up(mem, std::vector<float>(10, 1.f));
          (void)c.allreduce(dev.data(), 11, ReduceOp::kSum, kT);
        });
      },
      "guarded: allreduce data: .* not inside a live allocation");
}

TEST(GuardedCollectiveTest1, AbortForwards) {
  RunGuarded(1, [](Collective& c, GuardedMemory& mem) {
    auto dev = Up(mem, std::vector<float>(10, 1.f));
    c.Abort();
    absl::Status st = c.allreduce(dev.data(), 10, ReduceOp::kSum, kT);
    EXPECT_FALSE(st.ok());
  });
}

}  // namespace
}  // namespace tandem::comm
