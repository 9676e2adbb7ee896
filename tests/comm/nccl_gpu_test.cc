// NCCL backend on one GPU, one rank: allreduce, allgather, reduce_scatter,
// broadcast, barrier, byte accounting. Prints SKIPPED (exit 0) without a GPU.
#include <cuda_runtime.h>

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
  ASSERT_EQ(cudaMemcpy(d_in, host.data(), n * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
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
  EXPECT_FALSE((*c)->all_scan(d_in, n, ScanOp::Sum(), t).ok());
  cudaFree(d_in);
  cudaFree(d_out);
  std::printf("nccl single-rank collectives OK on GPU\n");
}

}  // namespace
}  // namespace tandem::comm
