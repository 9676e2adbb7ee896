// GatherTpSlice (tp_gather.h): each rank of a ZeRO-3 world builds its
// tensor-parallel slice from the shards alone. The slice equals slicing the
// full parameters; each rank receives fewer bytes than a full allgather
// would bring it; bad sizes are refused with a clear error.
#include "worker/rollout/tp_gather.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "tests/support/run_ranks.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/tp_slice.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::rollout {
namespace {

model::ModelConfig Config() {
  nlohmann::json j = {
      {"vocab_size", 29},         {"hidden_size", 32},        {"intermediate_size", 40},       {"num_hidden_layers", 3},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"model_type", "qwen2"}};
  auto c = model::ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<zero::Unit> Units(const model::ParamLayout& layout) {
  std::vector<zero::Unit> units;
  for (int u = 0; u < layout.num_units(); ++u) units.push_back({layout.unit_offset(u), layout.unit_size(u)});
  return units;
}

std::vector<float> Full(size_t n) {
  std::vector<float> full(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (float& v : full) v = ud(rng);
  return full;
}

// Each rank's shard comes from a ZeRO-3 optimizer.
void ExpectSlicesFromShards(int world, int tp) {
  const model::ModelConfig config = Config();
  const model::ParamLayout layout(config);
  const std::vector<float> full = Full(layout.total_floats());
  std::vector<TpGatherStats> stats(world);
  testing::RunRanks(world, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    zero::ZeroOptions o;
    o.stage = 3;
    o.units = Units(layout);
    o.comm = &c;
    o.ops = ops.get();
    auto opt = zero::ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ASSERT_TRUE((*opt)->InitFromFull(full.data()).ok());
    std::vector<float> shard((*opt)->shard_size());
    (*opt)->CopyParamShard(shard.data());
    auto map = MakeTpSliceMap(config, c.rank() % tp, tp);
    ASSERT_TRUE(map.ok()) << map.status();
    std::vector<float> slice(map->slice_floats, -1.f), want(map->slice_floats);
    auto st = GatherTpSlice(c, config, tp, o.units, shard.data(), slice.data(), std::chrono::milliseconds(20000));
    ASSERT_TRUE(st.ok()) << "rank " << c.rank() << ": " << st.status();
    SliceFromFull(*map, full.data(), want.data());
    ASSERT_EQ(slice, want) << "rank " << c.rank();
    stats[c.rank()] = *st;
  });
  uint64_t sent = 0, received = 0, owned = 0;
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(r);
    sent += stats[r].bytes_sent;
    received += stats[r].bytes_received;
    owned += layout.total_floats() * 4 - stats[r].full_gather_bytes;
    EXPECT_LE(stats[r].bytes_received, stats[r].slice_bytes);
    if (tp > 1) {
      EXPECT_LT(stats[r].bytes_received, stats[r].full_gather_bytes);
    } else {
      EXPECT_LE(stats[r].bytes_received, stats[r].full_gather_bytes);
    }
  }
  EXPECT_EQ(sent, received);
  EXPECT_EQ(owned, layout.total_floats() * 4);  // the shards partition the model
}

TEST(TpGatherTest, TwoRanksOneTpGroup) { ExpectSlicesFromShards(2, 2); }
TEST(TpGatherTest, FourRanksTwoTpGroups) { ExpectSlicesFromShards(4, 2); }
TEST(TpGatherTest, TpSizeOneGathersTheFullModel) { ExpectSlicesFromShards(2, 1); }

TEST(TpGatherTest, RefusesATpSizeThatDoesNotDivideTheWorld) {
  const model::ModelConfig config = Config();
  const model::ParamLayout layout(config);
  testing::RunRanks(2, [&](comm::Collective& c) {
    std::vector<float> shard(layout.total_floats()), slice(layout.total_floats());
    auto st = GatherTpSlice(c, config, 4, Units(layout), shard.data(), slice.data(), std::chrono::milliseconds(2000));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.status().message().find("rollout.tp_size 4 must divide the number of rollout workers (2)"),
              std::string::npos)
        << st.status();
    std::vector<zero::Unit> bad = Units(layout);
    bad.pop_back();
    auto units = GatherTpSlice(c, config, 2, bad, shard.data(), slice.data(), std::chrono::milliseconds(2000));
    ASSERT_FALSE(units.ok());
    EXPECT_NE(units.status().message().find("does not match the model's layout"), std::string::npos) << units.status();
  });
}

}  // namespace
}  // namespace tandem::rollout
