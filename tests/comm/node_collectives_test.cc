// Ranks grouped by node: the grouping, tier accounting of the flat
// communicator, the intra/inter sub-communicators and the hierarchical
// allreduce against the flat one (4 ranks as threads, 2 "nodes").
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rank_topology.h"
#include "tests/comm/comm_test_util.h"
#include "worker/comm/node_collectives.h"
#include "worker/comm/tiered_collective.h"

namespace tandem::comm {
namespace {

using testing::TestOptions;
using testing::Values;
constexpr Timeout kT{20000};

// Runs fn(rank, flat, store) on n threads over one store; flat is wrapped for
// tier accounting with `nodes` into the rank's own ledger (one per process in
// a real job).
void RunTiered(const std::vector<std::string>& nodes,
               const std::function<void(int, Collective&, Store&, std::shared_ptr<TierLedger>)>& fn) {
  InMemoryStore store;
  const int n = static_cast<int>(nodes.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = MakeCollective("gloo", store, r, n, TestOptions());
      ASSERT_TRUE(c.ok()) << c.status();
      auto ledger = std::make_shared<TierLedger>();
      auto tiered = MakeTieredCollective(std::move(*c), nodes, ledger);
      ASSERT_TRUE(tiered.ok()) << tiered.status();
      fn(r, **tiered, store, ledger);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(RankTopology, GroupsByNodeInRankOrder) {
  const std::vector<std::string> nodes = {"a", "b", "a", "b", "c"};
  auto g2 = common::GroupRanksByNode(nodes, 2);
  EXPECT_EQ(g2.num_nodes, 3);
  EXPECT_EQ(g2.node_index, 0);
  EXPECT_EQ(g2.local_index, 1);
  EXPECT_EQ(g2.intra_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(g2.inter_ranks, (std::vector<int>{2, 3}));
  auto g4 = common::GroupRanksByNode(nodes, 4);
  EXPECT_EQ(g4.node_index, 2);
  EXPECT_EQ(g4.intra_ranks, (std::vector<int>{4}));
  EXPECT_EQ(g4.inter_ranks, (std::vector<int>{0, 1, 4}));
  auto one = common::GroupRanksByNode({"h", "h", "h"}, 1);
  EXPECT_EQ(one.num_nodes, 1);
  EXPECT_EQ(one.inter_ranks, (std::vector<int>{1}));
}

TEST(RankTopology, WorkerChecksWhatItIsGiven) {
  const std::vector<std::string> nodes = {"a", "b", "a", "b"};
  tandem::v1::RankTopology t;
  common::FillRankTopology(nodes, 3, &t);
  EXPECT_TRUE(common::CheckRankTopology(t, 3, 4).ok());
  auto bad_world = common::CheckRankTopology(t, 3, 5);
  EXPECT_TRUE(absl::StrContains(bad_world.message(), "rank_nodes has 4 entries")) << bad_world;
  auto wrong_rank = common::CheckRankTopology(t, 2, 4);
  EXPECT_TRUE(absl::StrContains(wrong_rank.message(), "do not match")) << wrong_rank;
  t.set_rank_nodes(1, "");
  auto empty = common::CheckRankTopology(t, 3, 4);
  EXPECT_TRUE(absl::StrContains(empty.message(), "rank 1 has no node")) << empty;
}

TEST(RankTopology, NodeNamesAreChecked) {
  EXPECT_TRUE(common::CheckNodeName("rack1-host.7_a").ok());
  for (std::string bad : {std::string(), std::string(129, 'x'), std::string("a b"), std::string("a/b")}) {
    auto st = common::CheckNodeName(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(st.message(), "node:")) << st;
  }
}

TEST(TieredCollective, RejectsWrongNodeList) {
  InMemoryStore store;
  auto c = MakeCollective("gloo", store, 0, 1, TestOptions());
  ASSERT_TRUE(c.ok());
  auto t = MakeTieredCollective(std::move(*c), {"a", "b"}, std::make_shared<TierLedger>());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "2 member nodes for a communicator of 1")) << t.status();
}

// Ring on a,a,b,b: rank 0 sends to 1 (intra), receives from 3 (inter); rank 1
// sends to 2 (inter), receives from 0 (intra); and so on.
TEST(TieredCollective, SplitsRingBytesByNeighbourTier) {
  const std::vector<std::string> nodes = {"a", "a", "b", "b"};
  const size_t len = 1000;
  RunTiered(nodes, [&](int r, Collective& c, Store&, std::shared_ptr<TierLedger> ledger) {
    auto data = Values(r, len);
    ASSERT_TRUE(c.allreduce(data.data(), len, ReduceOp::kSum, kT).ok());
    const ByteCount all = c.bytes(CollectiveKind::kAllreduce);
    const ByteCount intra = ledger->bytes(Tier::kIntraNode, CollectiveKind::kAllreduce);
    const ByteCount inter = ledger->bytes(Tier::kInterNode, CollectiveKind::kAllreduce);
    EXPECT_EQ(all.sent, 2 * 3 * len);  // 2(N-1)/N * 4 bytes * len
    EXPECT_EQ(intra.sent + inter.sent, all.sent);
    EXPECT_EQ(intra.received + inter.received, all.received);
    const bool sends_across = r == 1 || r == 3;
    EXPECT_EQ(inter.sent, sends_across ? all.sent : 0) << r;
    EXPECT_EQ(inter.received, sends_across ? 0 : all.received) << r;
    // Send/recv by peer; broadcast by tree edge (root 0: 0->1, 0->2, 2->3).
    if (r == 0) ASSERT_TRUE(c.send(data.data(), 40, 2, 1, kT).ok());
    if (r == 2) ASSERT_TRUE(c.recv(data.data(), 40, 0, 1, kT).ok());
    ASSERT_TRUE(c.broadcast(data.data(), 10, 0, kT).ok());
    const ByteCount sr = ledger->bytes(Tier::kInterNode, CollectiveKind::kSendRecv);
    EXPECT_EQ(sr.sent, r == 0 ? 40u : 0u);
    EXPECT_EQ(sr.received, r == 2 ? 40u : 0u);
    const ByteCount bi = ledger->bytes(Tier::kIntraNode, CollectiveKind::kBroadcast);
    const ByteCount bx = ledger->bytes(Tier::kInterNode, CollectiveKind::kBroadcast);
    EXPECT_EQ(bi.sent, r == 0 || r == 2 ? 40u : 0u) << r;
    EXPECT_EQ(bx.sent, r == 0 ? 40u : 0u) << r;
    EXPECT_EQ(bx.received, r == 2 ? 40u : 0u) << r;
    EXPECT_EQ(bi.received, r == 1 || r == 3 ? 40u : 0u) << r;
    ledger->Reset();
    EXPECT_EQ(ledger->total(Tier::kInterNode).sent, 0u);
  });
}

TEST(NodeCollectives, SubCommunicatorsSumWithinTheirGroups) {
  const std::vector<std::string> nodes = {"a", "b", "a", "b"};
  RunTiered(nodes, [&](int r, Collective&, Store& store, std::shared_ptr<TierLedger> ledger) {
    auto opts = TestOptions();
    opts.prefix = "groups";
    auto g = MakeNodeCollectives("gloo", store, nodes, r, opts, ledger);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->num_nodes, 2);
    EXPECT_TRUE(g->uniform);
    ASSERT_EQ(g->intra->size(), 2);
    ASSERT_EQ(g->inter->size(), 2);
    float v = static_cast<float>(r + 1);
    ASSERT_TRUE(g->intra->allreduce(&v, 1, ReduceOp::kSum, kT).ok());
    EXPECT_EQ(v, r % 2 == 0 ? 1.f + 3.f : 2.f + 4.f);  // node a: ranks 0, 2
    float w = static_cast<float>(r + 1);
    ASSERT_TRUE(g->inter->allreduce(&w, 1, ReduceOp::kSum, kT).ok());
    EXPECT_EQ(w, r < 2 ? 1.f + 2.f : 3.f + 4.f);  // local 0: ranks 0, 1
    EXPECT_EQ(ledger->bytes(Tier::kInterNode, CollectiveKind::kAllreduce).sent, 4u);
    EXPECT_EQ(ledger->bytes(Tier::kIntraNode, CollectiveKind::kAllreduce).sent, 4u);
  });
}

// Hierarchical vs flat allreduce on 2 nodes x 2 ranks: equal within fp32
// reduction-order tolerance; inter-node bytes per rank n*4 * 2(M-1)/M / L.
TEST(NodeCollectives, HierarchicalAllreduceEqualsFlat) {
  const std::vector<std::string> nodes = {"a", "a", "b", "b"};
  for (size_t len : {size_t{1}, size_t{7}, size_t{1001}, size_t{100003}}) {
    RunTiered(nodes, [&](int r, Collective& flat, Store& store, std::shared_ptr<TierLedger> ledger) {
      auto g = MakeNodeCollectives("gloo", store, nodes, r, TestOptions(), ledger);
      ASSERT_TRUE(g.ok()) << g.status();
      auto a = Values(r, len, 3);
      auto b = a;
      std::vector<float> scratch(len / 2 + 1);
      ASSERT_TRUE(flat.allreduce(a.data(), len, ReduceOp::kSum, kT).ok());
      const uint64_t flat_inter = ledger->total(Tier::kInterNode).sent;
      ledger->Reset();
      ASSERT_TRUE(HierarchicalAllreduce(*g, b.data(), len, scratch.data(), kT).ok());
      for (size_t i = 0; i < len; ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(a[i]))) << i;
      const uint64_t hier_inter = ledger->total(Tier::kInterNode).sent;
      const size_t piece = SplitEven(len, 2)[r < 2 ? r : r - 2];
      EXPECT_EQ(hier_inter, piece > 0 ? 2 * 4 * piece / 2 : 0) << "rank " << r;
      EXPECT_EQ(flat_inter, r == 1 || r == 3 ? 2 * 4 * len * 3 / 4 : 0) << "rank " << r;
    });
  }
}

// The store keys Set during the rendezvous, recorded (thread safe).
class RecordingStore final : public Store {
 public:
  explicit RecordingStore(Store* inner) : inner_(inner) {}
  absl::Status Set(std::string_view key, std::string_view value) override {
    {
      absl::MutexLock lock(&mu_);
      keys_.emplace_back(key);
    }
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override {
    return inner_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    {
      absl::MutexLock lock(&mu_);
      keys_.emplace_back(key);
    }
    return inner_->Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key) override { return inner_->Delete(key); }
  std::vector<std::string> keys() {
    absl::MutexLock lock(&mu_);
    return keys_;
  }

 private:
  Store* inner_;
  absl::Mutex mu_;
  std::vector<std::string> keys_;
};

// Every group rendezvouses under its own key prefix (the rule the NCCL
// backend relies on too: one unique id per group, nccl_node_collectives_gpu_test).
TEST(NodeCollectives, EachGroupRendezvousesUnderItsOwnKeys) {
  const std::vector<std::string> nodes = {"a", "b", "a", "b"};
  RunTiered(nodes, [&](int r, Collective&, Store& store, std::shared_ptr<TierLedger> ledger) {
    RecordingStore recording(&store);
    auto opts = TestOptions();
    opts.prefix = "job7";
    auto g = MakeNodeCollectives("gloo", recording, nodes, r, opts, ledger);
    ASSERT_TRUE(g.ok()) << g.status();
    // Node a holds ranks 0 and 2 (node index 0), local index = r / 2.
    const std::string intra = absl::StrCat("job7/intra", r % 2, "/");
    const std::string inter = absl::StrCat("job7/inter", r / 2, "/");
    bool saw_intra = false, saw_inter = false;
    for (const std::string& key : recording.keys()) {
      const bool in_intra = absl::StartsWith(key, intra), in_inter = absl::StartsWith(key, inter);
      EXPECT_TRUE(in_intra || in_inter) << "rank " << r << " wrote " << key;
      saw_intra = saw_intra || in_intra;
      saw_inter = saw_inter || in_inter;
    }
    EXPECT_TRUE(saw_intra && saw_inter) << "rank " << r;
  });
}

TEST(NodeCollectives, HierarchicalAllreduceNeedsEqualNodes) {
  const std::vector<std::string> nodes = {"a", "a", "b"};
  RunTiered(nodes, [&](int r, Collective&, Store& store, std::shared_ptr<TierLedger> ledger) {
    auto g = MakeNodeCollectives("gloo", store, nodes, r, TestOptions(), ledger);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_FALSE(g->uniform);
    float x[4] = {};
    auto st = HierarchicalAllreduce(*g, x, 4, x, kT);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(st.message(), "different numbers of ranks")) << st;
  });
}

}  // namespace
}  // namespace tandem::comm
