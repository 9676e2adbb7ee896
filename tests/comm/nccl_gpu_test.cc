// NCCL backend on one GPU, one rank: allreduce, allgather, reduce_scatter,
// broadcast, barrier, all_scan, byte accounting; host pointers (staged); ordering after
// work queued on the legacy default stream, called from a new thread. Prints
// SKIPPED (exit 0) without a GPU.
#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/collective.h"

namespace tandem::comm {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclSingleRank, Collectives) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  InMemoryStore store;
  CollectiveOptions opts;
  auto c = MakeCollective("nccl", store, 0, 1, opts);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->backend(), "nccl");
  const size_t n = 1000003;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) * 0.5f;
  float *d_in = nullptr, *d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_in, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const Timeout t(20000);
  std::vector<float> back(n);
  ASSERT_TRUE((*c)->allreduce(d_in, n, ReduceOp::kSum, t).ok());
  cudaMemcpy(back.data(), d_in, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  ASSERT_TRUE((*c)->allgather(d_in, d_out, {n}, t).ok());
  cudaMemcpy(back.data(), d_out, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  cudaMemset(d_out, 0, n * 4);
  ASSERT_TRUE((*c)->reduce_scatter(d_in, d_out, {n}, t).ok());
  cudaMemcpy(back.data(), d_out, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  ASSERT_TRUE((*c)->broadcast(d_in, n, 0, t).ok());
  ASSERT_TRUE((*c)->barrier(t).ok());
  EXPECT_EQ((*c)->bytes(CollectiveKind::kAllreduce).calls, 1u);
  // all_scan on one rank: the exclusive scan is the identity everywhere
  // (device memory, blocks of 64 Ki floats and a partial one).
  ASSERT_TRUE((*c)->all_scan(d_in, n, ScanOp::Affine(0.5f), t).ok());
  cudaMemcpy(back.data(), d_in, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, std::vector<float>(n, 0.f));
  cudaFree(d_in);
  cudaFree(d_out);
  std::printf("nccl single-rank collectives OK on GPU\n");
}

// Host (pageable and pinned) pointers are staged through device scratch.
TEST(NcclSingleRank, HostPointers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  InMemoryStore store;
  auto c = MakeCollective("nccl", store, 0, 1, CollectiveOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  const Timeout t(20000);
  for (size_t n : {size_t{1}, size_t{3}, size_t{100003}}) {
    std::vector<float> host(n), expect(n);
    for (size_t i = 0; i < n; ++i) expect[i] = host[i] = 0.25f * (i % 97);
    ASSERT_TRUE((*c)->allreduce(host.data(), n, ReduceOp::kSum, t).ok());
    EXPECT_EQ(host, expect);
    ASSERT_TRUE((*c)->broadcast(host.data(), n, 0, t).ok());
    EXPECT_EQ(host, expect);
    std::vector<float> out(n, -1.f);
    ASSERT_TRUE((*c)->reduce_scatter(host.data(), out.data(), {n}, t).ok());
    EXPECT_EQ(out, expect);
    // In-place allgather on host memory (in aliases out).
    ASSERT_TRUE((*c)->allgather(out.data(), out.data(), {n}, t).ok());
    EXPECT_EQ(out, expect);
  }
  // Pinned host memory.
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64 * 4), cudaSuccess);
  for (int i = 0; i < 64; ++i) pinned[i] = float(i);
  ASSERT_TRUE((*c)->allreduce(pinned, 64, ReduceOp::kMax, t).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(pinned[i], float(i));
  // Mixed: device in, host out.
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, pinned, 64 * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> out(64);
  ASSERT_TRUE((*c)->reduce_scatter(d, out.data(), {64}, t).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], float(i));
  cudaFree(d);
  cudaFreeHost(pinned);
  EXPECT_EQ((*c)->bytes(CollectiveKind::kAllreduce).calls, 4u);
}

// Data written by work queued on the legacy default stream (as CudaOps does)
// is what NCCL reads, even when the collective runs on another thread.
TEST(NcclSingleRank, OrderedAfterLegacyStreamFromNewThread) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  InMemoryStore store;
  auto c = MakeCollective("nccl", store, 0, 1, CollectiveOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t big = size_t{64} << 20, n = size_t{1} << 20;
  float *a = nullptr, *b = nullptr, *x = nullptr, *src = nullptr;
  ASSERT_EQ(cudaMalloc(&a, big * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, big * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&x, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&src, n * 4), cudaSuccess);
  std::vector<float> expect(n);
  for (size_t i = 0; i < n; ++i) expect[i] = 1.f + float(i % 1013);
  ASSERT_EQ(cudaMemcpy(src, expect.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(x, 0, n * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    // Keep the legacy stream busy, then write x last on it.
    for (int i = 0; i < 30; ++i) {
      cudaMemcpyAsync(b, a, big * 4, cudaMemcpyDeviceToDevice, cudaStreamLegacy);
    }
    cudaMemcpyAsync(x, src, n * 4, cudaMemcpyDeviceToDevice, cudaStreamLegacy);
    absl::Status st;
    std::vector<float> host_sum(1, 2.f);
    std::thread comm([&] {
      st = (*c)->allreduce(x, n, ReduceOp::kMax, Timeout(20000));
      if (st.ok()) st = (*c)->allreduce(host_sum.data(), 1, ReduceOp::kSum, Timeout(20000));
    });
    comm.join();
    ASSERT_TRUE(st.ok()) << st;
    std::vector<float> back(n);
    ASSERT_EQ(cudaMemcpy(back.data(), x, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, expect) << "rep " << rep;
    EXPECT_EQ(host_sum[0], 2.f);
    cudaMemset(x, 0, n * 4);
    cudaDeviceSynchronize();
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(x);
  cudaFree(src);
}

}  // namespace
}  // namespace tandem::comm
