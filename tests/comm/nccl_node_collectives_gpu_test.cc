// NCCL sub-communicators per node group (MakeNodeCollectives with backend
// "nccl"), ranks as threads, one device per rank (NCCL refuses two ranks of
// one communicator on the same device): 4+ devices run 2 nodes x 2 ranks,
// 2-3 devices 2 nodes x 1 rank, 1 device 1 node x 1 rank. Checks that each
// group publishes its own unique id under its own store key, that the intra
// and inter communicators have the group's ranks and sizes and sum within
// their group on device memory, that HierarchicalAllreduce over them equals
// the flat sum, and that the tier ledger splits the bytes by tier. Skips
// without a GPU ("no CUDA device").
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/collective.h"
#include "worker/comm/node_collectives.h"
#include "worker/comm/tiered_collective.h"

namespace tandem::comm {
namespace {

constexpr Timeout kT{60000};

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<std::string> NodesFor(int devices) {
  if (devices >= 4) return {"a", "a", "b", "b"};
  if (devices >= 2) return {"a", "b"};
  return {"a"};
}

// Device buffer owned by one rank's thread.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) { ok = cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)) == cudaSuccess; }
  ~DeviceFloats() {
    if (p != nullptr) cudaFree(p);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void Put(const std::vector<float>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice); }
  std::vector<float> Get() const {
    std::vector<float> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
  float* p = nullptr;
  size_t n = 0;
  bool ok = false;
};

float ValueOf(int rank, size_t i) { return static_cast<float>((rank + 1) * 0.25 + static_cast<double>(i % 97) * 0.5); }

TEST(NcclNodeCollectives, GroupsRendezvousApartAndSumWithinTheirGroups) {
  const int devices = DeviceCount();
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::string> nodes = NodesFor(devices);
  const int world = static_cast<int>(nodes.size());
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      CollectiveOptions opts;
      opts.prefix = "job";
      opts.device = r;
      opts.timeout = kT;
      auto ledger = std::make_shared<TierLedger>();
      auto flat = MakeCollective("nccl", store, r, world, opts);
      ASSERT_TRUE(flat.ok()) << flat.status();
      auto tiered = MakeTieredCollective(std::move(*flat), nodes, ledger);
      ASSERT_TRUE(tiered.ok()) << tiered.status();
      auto g = MakeNodeCollectives("nccl", store, nodes, r, opts, ledger);
      ASSERT_TRUE(g.ok()) << g.status();
      const int locals = world / g->num_nodes;
      const int node = r / locals, local = r % locals;
      EXPECT_TRUE(g->uniform);
      EXPECT_EQ(g->intra->backend(), "nccl");
      EXPECT_EQ(g->inter->backend(), "nccl");
      EXPECT_EQ(g->intra->size(), locals);
      EXPECT_EQ(g->intra->rank(), local);
      EXPECT_EQ(g->inter->size(), g->num_nodes);
      EXPECT_EQ(g->inter->rank(), node);
      // One unique id per group, each under its own key.
      auto flat_id = store.Get("job/nccl/id", kT);
      auto intra_id = store.Get(absl::StrCat("job/intra", node, "/nccl/id"), kT);
      auto inter_id = store.Get(absl::StrCat("job/inter", local, "/nccl/id"), kT);
      ASSERT_TRUE(flat_id.ok() && intra_id.ok() && inter_id.ok());
      EXPECT_NE(*intra_id, *flat_id);
      EXPECT_NE(*inter_id, *flat_id);
      EXPECT_NE(*intra_id, *inter_id);

      // Sums within each group, on device memory.
      const size_t n = 100003;
      std::vector<float> host(n);
      for (size_t i = 0; i < n; ++i) host[i] = ValueOf(r, i);
      DeviceFloats d(n), scratch(n / locals + 1);
      ASSERT_TRUE(d.ok && scratch.ok);
      d.Put(host);
      ASSERT_TRUE(g->intra->allreduce(d.p, n, ReduceOp::kSum, kT).ok());
      std::vector<float> got = d.Get();
      for (size_t i = 0; i < n; i += 997) {
        float want = 0;
        for (int l = 0; l < locals; ++l) want += ValueOf(node * locals + l, i);
        ASSERT_EQ(got[i], want) << "intra, i " << i;
      }
      d.Put(host);
      ASSERT_TRUE(g->inter->allreduce(d.p, n, ReduceOp::kSum, kT).ok());
      got = d.Get();
      for (size_t i = 0; i < n; i += 997) {
        float want = 0;
        for (int m = 0; m < g->num_nodes; ++m) want += ValueOf(m * locals + local, i);
        ASSERT_EQ(got[i], want) << "inter, i " << i;
      }

      // Hierarchical allreduce equals the flat sum.
      ledger->Reset();
      d.Put(host);
      ASSERT_TRUE(HierarchicalAllreduce(*g, d.p, n, scratch.p, kT).ok());
      got = d.Get();
      for (size_t i = 0; i < n; i += 101) {
        double want = 0;
        for (int q = 0; q < world; ++q) want += ValueOf(q, i);
        ASSERT_NEAR(got[i], want, 1e-5 * (1 + std::fabs(want))) << "i " << i;
      }
      if (locals > 1) EXPECT_GT(ledger->total(Tier::kIntraNode).sent, 0u);
      if (g->num_nodes > 1) EXPECT_GT(ledger->total(Tier::kInterNode).sent, 0u);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace tandem::comm
