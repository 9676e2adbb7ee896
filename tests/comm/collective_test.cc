// Gloo Collective vs serial references: 1-4 ranks as threads, odd sizes,
// zero length, uneven counts, all_scan, all_to_all, byte accounting.
#include <numeric>

#include "tests/comm/comm_test_util.h"

namespace tandem::comm {
namespace {

using testing::RunRanks;
using testing::Values;
constexpr Timeout kT{20000};

class RanksTest : public ::testing::TestWithParam<int> {};

TEST_P(RanksTest, Allreduce) {
  const int n = GetParam();
  for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{300007}}) {
    std::vector<std::vector<float>> in(n);
    for (int r = 0; r < n; ++r) in[r] = Values(r, len);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      std::vector<float> expect(len);
      for (size_t i = 0; i < len; ++i) {
        double acc = op == ReduceOp::kSum ? 0 : in[0][i];
        for (int r = 0; r < n; ++r) {
          const float v = in[r][i];
          acc = op == ReduceOp::kSum   ? acc + v
                : op == ReduceOp::kMax ? std::max<double>(acc, v)
                                       : std::min<double>(acc, v);
        }
        expect[i] = acc;
      }
      RunRanks(n, [&](Collective& c) {
        auto data = in[c.rank()];
        ASSERT_TRUE(c.allreduce(data.data(), len, op, kT).ok());
        for (size_t i = 0; i < len; ++i) {
          ASSERT_NEAR(data[i], expect[i], 1e-5) << "i=" << i;
        }
      });
    }
  }
}

TEST_P(RanksTest, ReduceScatterUneven) {
  const int n = GetParam();
  // Shapes: small uneven, with a zero, large uneven, equal (the
  // halving-doubling path on 2 and 4 ranks), tiny uneven as in ZeRO pieces.
  for (int shape = 0; shape < 5; ++shape) {
    std::vector<size_t> counts(n);
    for (int r = 0; r < n; ++r) {
      counts[r] = shape == 0   ? 2 * r + 1
                  : shape == 1 ? (r == 1 ? 0 : 5)
                  : shape == 2 ? 10001 + 3 * r
                  : shape == 3 ? 4099
                               : (r == 0 ? 2 : 1);
    }
    const size_t total = std::accumulate(counts.begin(), counts.end(), 0ul);
    std::vector<std::vector<float>> all(n);
    for (int r = 0; r < n; ++r) all[r] = Values(r, total, 1);
    RunRanks(n, [&](Collective& c) {
      auto in = all[c.rank()];
      std::vector<float> out(counts[c.rank()] + 1, -7.f);
      absl::Status st = c.reduce_scatter(in.data(), out.data(), counts, kT);
      ASSERT_TRUE(st.ok()) << st << " shape " << shape;
      size_t off = 0;
      for (int r = 0; r < c.rank(); ++r) off += counts[r];
      for (size_t i = 0; i < counts[c.rank()]; ++i) {
        double acc = 0;
        for (int r = 0; r < n; ++r) acc += all[r][off + i];
        ASSERT_NEAR(out[i], acc, 1e-5) << "i=" << i;
      }
      EXPECT_EQ(out[counts[c.rank()]], -7.f);  // no overrun
    });
  }
}

TEST_P(RanksTest, AllgatherVariableCountsAndAliasing) {
  const int n = GetParam();
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r == 0 ? 0 : 3 * r + 2;
  if (n == 1) counts[0] = 9;
  const size_t total = std::accumulate(counts.begin(), counts.end(), 0ul);
  RunRanks(n, [&](Collective& c) {
    auto mine = Values(c.rank(), counts[c.rank()], 2);
    std::vector<float> out(total, 0.f);
    ASSERT_TRUE(c.allgather(mine.data(), out.data(), counts, kT).ok());
    // Aliased input: own piece already in place.
    std::vector<float> out2(total, 0.f);
    size_t my_off = 0;
    for (int r = 0; r < c.rank(); ++r) my_off += counts[r];
    std::copy(mine.begin(), mine.end(), out2.begin() + my_off);
    ASSERT_TRUE(c.allgather(out2.data() + my_off, out2.data(), counts, kT).ok());
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      auto v = Values(r, counts[r], 2);
      for (size_t i = 0; i < counts[r]; ++i) {
        ASSERT_EQ(out[off + i], v[i]);
        ASSERT_EQ(out2[off + i], v[i]);
      }
      off += counts[r];
    }
  });
}

TEST_P(RanksTest, BroadcastEveryRoot) {
  const int n = GetParam();
  for (int root = 0; root < n; ++root) {
    RunRanks(n, [&](Collective& c) {
      auto data = Values(c.rank(), 4099, 3);
      ASSERT_TRUE(c.broadcast(data.data(), data.size(), root, kT).ok());
      EXPECT_EQ(data, Values(root, 4099, 3));
      ASSERT_TRUE(c.barrier(kT).ok());
    });
  }
}

TEST_P(RanksTest, SendRecvRing) {
  const int n = GetParam();
  if (n == 1) {
    // One rank: the ring's only neighbour is the rank itself. send and recv
    // reject it (and peers out of range) at once, count no bytes, and leave
    // the communicator usable.
    RunRanks(1, [&](Collective& c) {
      std::vector<float> buf(777);
      for (int peer : {0, -1, 1}) {
        const absl::Status s = c.send(buf.data(), 777 * 4, peer, 1, kT);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        EXPECT_NE(s.message().find("bad peer " + std::to_string(peer)), std::string::npos) << s;
        const absl::Status r = c.recv(buf.data(), 777 * 4, peer, 1, kT);
        EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r;
        EXPECT_NE(r.message().find("bad peer " + std::to_string(peer)), std::string::npos) << r;
      }
      EXPECT_EQ(c.bytes(CollectiveKind::kSendRecv).sent, 0u);
      EXPECT_EQ(c.bytes(CollectiveKind::kSendRecv).received, 0u);
      EXPECT_TRUE(c.barrier(kT).ok());
    });
    return;
  }
  RunRanks(n, [&](Collective& c) {
    const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
    auto mine = Values(c.rank(), 777, 4);
    std::vector<float> got(777);
    auto other = Values(c.rank(), 5, 5);
    std::vector<float> got_other(5);
    // send is a rendezvous: even ranks send first, odd ranks receive first.
    auto do_send = [&] {
      ASSERT_TRUE(c.send(mine.data(), 777 * 4, next, 1, kT).ok());
      ASSERT_TRUE(c.send(other.data(), 5 * 4, next, 2, kT).ok());
    };
    auto do_recv = [&] {
      ASSERT_TRUE(c.recv(got.data(), 777 * 4, prev, 1, kT).ok());
      ASSERT_TRUE(c.recv(got_other.data(), 5 * 4, prev, 2, kT).ok());
    };
    if (c.rank() % 2 == 0) {
      do_send();
      do_recv();
    } else {
      do_recv();
      do_send();
    }
    EXPECT_EQ(got, Values(prev, 777, 4));
    EXPECT_EQ(got_other, Values(prev, 5, 5));
  });
}

TEST_P(RanksTest, AllScanMatchesSerialScan) {
  const int n = GetParam();
  for (size_t len : {size_t{0}, size_t{13}, size_t{150001}}) {
    std::vector<std::vector<float>> s6(n), s7(n);
    for (int r = 0; r < n; ++r) {
      s6[r] = Values(r, len, 6);
      s7[r] = Values(r, len, 7);
    }
    // Sum.
    RunRanks(n, [&](Collective& c) {
      auto data = s6[c.rank()];
      ASSERT_TRUE(c.all_scan(data.data(), len, ScanOp::Sum(), kT).ok());
      for (size_t i = 0; i < len; ++i) {
        double acc = 0;
        for (int r = 0; r < c.rank(); ++r) acc += s6[r][i];
        ASSERT_NEAR(data[i], acc, 1e-5);
      }
    });
    // Affine recurrence with a per-rank decay.
    RunRanks(n, [&](Collective& c) {
      auto data = s7[c.rank()];
      const float decay = 0.5f + 0.1f * c.rank();
      ASSERT_TRUE(c.all_scan(data.data(), len, ScanOp::Affine(decay), kT).ok());
      for (size_t i = 0; i < len; ++i) {
        double state = 0;
        for (int r = 0; r < c.rank(); ++r) {
          state = (0.5f + 0.1f * r) * state + s7[r][i];
        }
        ASSERT_NEAR(data[i], state, 1e-5);
      }
      // Bytes per rank do not grow with N: at most len floats each way.
      auto b = c.bytes(CollectiveKind::kAllScan);
      EXPECT_LE(b.sent, len * 4);
      EXPECT_LE(b.received, len * 4);
    });
  }
}

TEST_P(RanksTest, AllToAllMatchesSerialExchange) {
  const int n = GetParam();
  // count(s -> t): uneven, with zeros (rank 1 sends rank 0 nothing, and the
  // last shape sends nothing anywhere but to itself), and large pieces.
  for (int shape = 0; shape < 3; ++shape) {
    auto count = [&](int s, int t) -> size_t {
      if (shape == 0) return (s == 1 && t == 0) ? 0 : 3 * s + t + 1;
      if (shape == 1) return 50001 + 7 * s + t;
      return s == t ? 5 : 0;
    };
    auto piece = [&](int s, int t) { return Values(s * n + t, count(s, t), 9); };
    RunRanks(n, [&](Collective& c) {
      const int r = c.rank();
      std::vector<size_t> send(n), recv(n);
      std::vector<float> in, expect;
      for (int t = 0; t < n; ++t) {
        send[t] = count(r, t);
        const auto p = piece(r, t);
        in.insert(in.end(), p.begin(), p.end());
      }
      for (int s = 0; s < n; ++s) {
        recv[s] = count(s, r);
        const auto p = piece(s, r);
        expect.insert(expect.end(), p.begin(), p.end());
      }
      std::vector<float> out(expect.size(), -7.f);
      ASSERT_TRUE(c.alltoall(in.data(), send, out.data(), recv, kT).ok());
      EXPECT_EQ(out, expect);
      auto b = c.bytes(CollectiveKind::kAllToAll);
      EXPECT_EQ(b.calls, 1u);
      EXPECT_EQ(b.sent, (std::accumulate(send.begin(), send.end(), size_t{0}) - send[r]) * 4);
      EXPECT_EQ(b.received, (std::accumulate(recv.begin(), recv.end(), size_t{0}) - recv[r]) * 4);
      c.ResetBytes();
    });
  }
}

TEST_P(RanksTest, AllToAllRefusesBadCounts) {
  const int n = GetParam();
  RunRanks(n, [&](Collective& c) {
    std::vector<float> in(8, 1.f), out(8);
    auto st = c.alltoall(in.data(), std::vector<size_t>(n + 1, 1), out.data(), std::vector<size_t>(n, 1), kT);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("gloo: all_to_all failed"), std::string::npos) << st;
  });
  RunRanks(n, [&](Collective& c) {
    std::vector<float> in(8, 1.f), out(8);
    std::vector<size_t> send(n, 1), recv(n, 1);
    send[c.rank()] = 2;  // its own piece: 2 out, 1 in
    auto st = c.alltoall(in.data(), send, out.data(), recv, kT);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("sends itself 2 elements but receives 1"), std::string::npos) << st;
  });
}

TEST_P(RanksTest, ByteAccounting) {
  const int n = GetParam();
  RunRanks(n, [&](Collective& c) {
    std::vector<float> data(1000, 1.f);
    ASSERT_TRUE(c.allreduce(data.data(), 1000, ReduceOp::kSum, kT).ok());
    auto b = c.bytes(CollectiveKind::kAllreduce);
    EXPECT_EQ(b.sent, 2ull * (n - 1) * 4000 / n);
    EXPECT_EQ(b.calls, 1u);
    c.ResetBytes();
    EXPECT_EQ(c.total_bytes().sent, 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, RanksTest, ::testing::Values(1, 2, 3, 4));

TEST(Collective, UnknownBackendNamesIt) {
  InMemoryStore store;
  auto c = MakeCollective("mpi", store, 0, 1, testing::TestOptions());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("mpi"), std::string::npos);
}

}  // namespace
}  // namespace tandem::comm
