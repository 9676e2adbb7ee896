// ShardedParams (the sharded KL reference): over 2 and 3 ranks as threads
// (Gloo on 127.0.0.1), log-probs of the tiny model over the sharded
// parameters equal those over the full vector bit for bit (an allgather
// copies bits), every rank holds only its shard - the same partition as a
// ZeRO-3 optimizer's parameter shard - plus at most two unit buffers, Trim
// frees them, and bad unit tables are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/backends.h"
#include "tests/support/run_ranks.h"
#include "tests/zero/zero_test_model.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"
#include "worker/zero/sharded_params.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using ::tandem::testing::RunRanks;
using namespace test_model;

model::Batch MakeBatch(int rank, int vocab) {
  model::Batch b;
  for (int i = 0; i < 3; ++i) b.AddSequence(MakeSequence(1, rank * 3 + i, vocab));
  return b;
}

TEST(ShardedParams, LogprobsEqualTheFullCopyBitForBit) {
  for (int n : {2, 3}) {
    const model::ModelConfig config = TinyConfig();
    RunRanks(n, [&](comm::Collective& c) {
      auto ops = kernels::MakeReferenceOps();
      auto mem = kernels::MakeHostMemory();
      model::Model m(config, ops.get());
      std::vector<float> full(m.layout().total_floats());
      m.InitParams(7, full.data());
      const model::Batch batch = MakeBatch(c.rank(), config.vocab_size);
      std::vector<float> want(batch.num_tokens()), got(batch.num_tokens());
      model::FlatParamProvider flat(m.layout(), full.data(), nullptr);
      ASSERT_TRUE(m.ForwardLogprobs(batch, flat, want.data()).ok());

      auto sharded = ShardedParams::Create(UnitsOf(m.layout()), &c, mem.get(), comm::Timeout{20000});
      ASSERT_TRUE(sharded.ok()) << sharded.status();
      ShardedParams& ref = **sharded;
      ref.LoadFull(full.data());
      for (int pass = 0; pass < 2; ++pass) {  // the second over reused buffers
        ASSERT_TRUE(m.ForwardLogprobs(batch, ref, got.data()).ok());
        ASSERT_TRUE(ref.status().ok()) << ref.status();
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "N=" << n << " rank " << c.rank() << " pass " << pass;
      }

      // Memory: the shard and at most two unit buffers, never the full vector.
      size_t max_unit = 0;
      for (const Unit& u : UnitsOf(m.layout())) max_unit = std::max(max_unit, u.size);
      EXPECT_EQ(ref.shard_bytes(), ref.shard_size() * sizeof(float));
      EXPECT_LE(ref.shard_size(), full.size() / n + m.layout().num_units());
      EXPECT_GT(ref.peak_buffer_bytes(), 0u);
      EXPECT_LE(ref.peak_buffer_bytes(), 2 * max_unit * sizeof(float));
      ref.Trim();
      EXPECT_EQ(ref.buffer_bytes(), 0u);

      // The same partition as a ZeRO-3 parameter shard: LoadShard of the
      // optimizer's shard gives the same shard back.
      ZeroOptions o;
      o.stage = 3;
      o.units = UnitsOf(m.layout());
      o.comm = &c;
      o.ops = ops.get();
      auto z = ZeroOptimizer::Create(o);
      ASSERT_TRUE(z.ok()) << z.status();
      ASSERT_TRUE((*z)->InitFromFull(full.data()).ok());
      ASSERT_EQ((*z)->shard_size(), ref.shard_size());
      std::vector<float> from_zero((*z)->shard_size()), from_ref(ref.shard_size());
      (*z)->CopyParamShard(from_zero.data());
      ref.CopyShard(from_ref.data());
      EXPECT_EQ(0, std::memcmp(from_zero.data(), from_ref.data(), from_ref.size() * sizeof(float)));
      ref.LoadShard(from_zero.data());
      ASSERT_TRUE(m.ForwardLogprobs(batch, ref, got.data()).ok());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
    });
  }
}

TEST(ShardedParams, RefusesBadUnitTables) {
  RunRanks(1, [&](comm::Collective& c) {
    auto mem = kernels::MakeHostMemory();
    auto empty = ShardedParams::Create({}, &c, mem.get(), comm::Timeout{1000});
    ASSERT_FALSE(empty.ok());
    EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
    auto gap = ShardedParams::Create({{0, 4}, {5, 4}}, &c, mem.get(), comm::Timeout{1000});
    ASSERT_FALSE(gap.ok());
    EXPECT_NE(gap.status().message().find("contiguous"), std::string::npos) << gap.status();
  });
}

}  // namespace
}  // namespace tandem::zero
