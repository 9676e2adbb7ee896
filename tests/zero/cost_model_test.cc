// The cost model (worker/zero/cost_model.h) by hand on small unit tables:
// ring bytes per tier, the gather counts per unit, hpZ, qwZ and LoCo wire
// sizes (against worker/comm's own), memory, time, and refused inputs.
// tests/zero/cost_model_engine_test.cc checks it against measured bytes.
#include "worker/zero/cost_model.h"

#include <gtest/gtest.h>

#include "kernels/int8_blocks.h"
#include "worker/comm/collective.h"
#include "worker/comm/quantized_collectives.h"

namespace tandem::zero {
namespace {

constexpr int kAllreduce = static_cast<int>(PlanKind::kAllreduce);
constexpr int kReduceScatter = static_cast<int>(PlanKind::kReduceScatter);
constexpr int kAllgather = static_cast<int>(PlanKind::kAllgather);
constexpr int kSendRecv = static_cast<int>(PlanKind::kSendRecv);
constexpr int kIntra = 0, kInter = 1;

PlanInput TwoByTwo(int stage) {
  PlanInput in;
  in.unit_sizes = {400, 800, 400};  // embeddings, one layer, final unit
  in.rank_nodes = {"a", "a", "b", "b"};
  in.stage = stage;
  return in;
}

TEST(CostModelTest, WireSizesMatchTheCollectives) {
  for (size_t n : {0, 1, 2, 3, 63, 64, 65, 255, 256, 257, 1000, 12345}) {
    EXPECT_EQ(PlanInt8WireFloats(n), kernels::Int8WireFloats(n)) << n;
    EXPECT_EQ(PlanInt4WireBytes(n), comm::Int4WireBytes(n)) << n;
    for (int parts : {1, 2, 3, 4, 7}) EXPECT_EQ(PlanSplitEven(n, parts), comm::SplitEven(n, parts)) << n;
  }
  EXPECT_EQ(PlanKindName(PlanKind::kReduceScatter), comm::CollectiveKindName(comm::CollectiveKind::kReduceScatter));
  EXPECT_EQ(PlanKindName(PlanKind::kSendRecv), comm::CollectiveKindName(comm::CollectiveKind::kSendRecv));
}

TEST(CostModelTest, StageZeroIsOneAllreduceHalfOfItAcrossNodes) {
  auto p = PlanStep(TwoByTwo(0));
  ASSERT_TRUE(p.ok()) << p.status();
  // Psi = 1600 floats: each rank sends 2 * 3/4 * 6400 B = 9600 B to the
  // next rank; 0->1 and 2->3 stay on the node, 1->2 and 3->0 cross.
  EXPECT_EQ(p->job_sent[kAllreduce][kIntra], 2u * 9600);
  EXPECT_EQ(p->job_sent[kAllreduce][kInter], 2u * 9600);
  EXPECT_EQ(p->rank_sent[1][kAllreduce][kInter], 9600u);
  EXPECT_EQ(p->rank_sent[1][kAllreduce][kIntra], 0u);
  EXPECT_EQ(p->job_sent[kAllgather][kIntra] + p->job_sent[kAllgather][kInter], 0u);
  EXPECT_EQ(p->memory.total, 16u * 1600);
  // Layer-major: one allreduce per unit, the same bytes here.
  PlanInput lm = TwoByTwo(0);
  lm.layer_major = true;
  EXPECT_EQ(PlanStep(lm)->job_sent[kAllreduce][kInter], 2u * 9600);
}

TEST(CostModelTest, StageTwoReduceScattersPerMicroBatchAndGathersOnce) {
  PlanInput in = TwoByTwo(2);
  in.micro_batches = 3;
  auto p = PlanStep(in);
  ASSERT_TRUE(p.ok()) << p.status();
  // Per unit per rank: 3/4 of it; 3 micro-batches; 1600 floats in all.
  EXPECT_EQ(p->job_sent[kReduceScatter][kIntra] + p->job_sent[kReduceScatter][kInter], 3u * 4 * 1200 * 4);
  EXPECT_EQ(p->job_sent[kAllgather][kIntra] + p->job_sent[kAllgather][kInter], 4u * 1200 * 4);
  in.layer_major = true;
  EXPECT_EQ(PlanStep(in)->job_sent[kReduceScatter][kInter], 2u * 1200 * 4);
  // Memory: full params, shard of grads and moments (400 of 1600).
  EXPECT_EQ(p->memory.params, 4u * 1600);
  EXPECT_EQ(p->memory.gradients, 4u * 400);
  EXPECT_EQ(p->memory.optimizer, 8u * 400);
}

TEST(CostModelTest, StageThreeGatherCounts) {
  // One layer, units of 400 / 800 / 400 floats; each gather sends 3/4 of
  // the unit per rank.
  for (bool tied : {false, true}) {
    for (bool layer_major : {false, true}) {
      PlanInput in = TwoByTwo(3);
      in.tied = tied;
      in.layer_major = layer_major;
      in.micro_batches = 4;
      auto p = PlanStep(in);
      ASSERT_TRUE(p.ok()) << p.status();
      const uint64_t m = 4;
      const uint64_t g0 = tied ? (layer_major ? 2 * m + 2 : 3 * m + 1) : m + 1;
      const uint64_t gl = layer_major ? m + 1 : 2 * m;
      const uint64_t gf = tied ? (layer_major ? m + 1 : 2 * m) : (layer_major ? 2 * m + 1 : 3 * m);
      const uint64_t floats = 3 * (g0 * 100 + gl * 200 + gf * 100);  // per rank: 3/4 of each unit
      EXPECT_EQ(p->job_sent[kAllgather][kIntra], 2 * 4 * floats) << tied << layer_major;
      EXPECT_EQ(p->job_sent[kAllgather][kInter], 2 * 4 * floats) << tied << layer_major;
      const uint64_t rs = (layer_major ? 1 : m) * 4 * 1200 * 4;
      EXPECT_EQ(p->job_sent[kReduceScatter][kIntra] + p->job_sent[kReduceScatter][kInter], rs);
    }
  }
}

TEST(CostModelTest, HierarchicalKeepsGathersOnTheNode) {
  PlanInput in = TwoByTwo(3);
  in.hpz = true;
  auto p = PlanStep(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job_sent[kAllgather][kIntra] > 0, true);
  // Inter-node: the refresh (each rank sends half of its chunk: a quarter
  // of each unit) and the inter-node reduce-scatter (the same), M = 1.
  EXPECT_EQ(p->job_sent[kAllgather][kInter], 4u * 1600 / 4 * 4);
  EXPECT_EQ(p->job_sent[kReduceScatter][kInter], 4u * 1600 / 4 * 4);
  // Flat stage 3 sends 1/2 of all ring bytes across nodes.
  auto flat = PlanStep(TwoByTwo(3));
  EXPECT_LT(p->job_sent[kAllgather][kInter], flat->job_sent[kAllgather][kInter]);
  // The secondary copy: half of every unit (L = 2).
  EXPECT_EQ(p->memory.compute, 4u * 800);
  EXPECT_EQ(p->memory.params, 4u * 400);
  // qwZ: the same calls with int8 wires.
  in.qwz = true;
  auto q = PlanStep(in);
  ASSERT_TRUE(q.ok());
  // Refresh: per unit and inter group, the other node's int8 piece.
  uint64_t refresh = 0;
  for (size_t u : in.unit_sizes) {
    for (size_t chunk : PlanSplitEven(u, 2)) {
      for (size_t sub : PlanSplitEven(chunk, 2)) refresh += 4 * PlanInt8WireFloats(sub);
    }
  }
  EXPECT_EQ(q->job_sent[kAllgather][kInter], refresh);
  // LoCo: the inter-node reduce-scatter becomes int4 send/recv.
  in.int4 = true;
  auto l = PlanStep(in);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->job_sent[kReduceScatter][kInter], 0u);
  uint64_t exchange = 0;
  for (size_t u : in.unit_sizes) {
    for (size_t chunk : PlanSplitEven(u, 2)) {
      for (size_t sub : PlanSplitEven(chunk, 2)) exchange += PlanInt4WireBytes(sub);
    }
  }
  EXPECT_EQ(l->job_sent[kSendRecv][kInter], exchange);
  EXPECT_EQ(l->memory.grad_error, 4u * 800);
}

TEST(CostModelTest, FlatLocoExchangesWithEveryPeer) {
  PlanInput in = TwoByTwo(3);
  in.int4 = true;
  auto p = PlanStep(in);
  ASSERT_TRUE(p.ok());
  // Rank 0 sends pieces to 1 (intra), 2 and 3 (inter), per unit.
  uint64_t intra = 0, inter = 0;
  for (size_t u : in.unit_sizes) {
    const auto c = PlanSplitEven(u, 4);
    intra += PlanInt4WireBytes(c[1]);
    inter += PlanInt4WireBytes(c[2]) + PlanInt4WireBytes(c[3]);
  }
  EXPECT_EQ(p->rank_sent[0][kSendRecv][kIntra], intra);
  EXPECT_EQ(p->rank_sent[0][kSendRecv][kInter], inter);
  // Stage 0: the exchange and an allgather of the int4 sums.
  in.stage = 0;
  auto s0 = PlanStep(in);
  EXPECT_GT(s0->job_sent[kSendRecv][kInter], 0u);
  EXPECT_GT(s0->job_sent[kAllgather][kInter], 0u);
  EXPECT_EQ(s0->job_sent[kAllreduce][kInter], 0u);
}

TEST(CostModelTest, QuantizedFlatGathers) {
  PlanInput in = TwoByTwo(3);
  in.qwz = true;
  auto p = PlanStep(in);
  ASSERT_TRUE(p.ok());
  // Rank 0 sends every piece but rank 1's, as int8 wires; unit gathers
  // 2 / 2 / 3 times (M = 1, untied).
  const uint64_t times[3] = {2, 2, 3};
  uint64_t rank0 = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto c = PlanSplitEven(in.unit_sizes[i], 4);
    rank0 += times[i] * 4 * (PlanInt8WireFloats(c[0]) + PlanInt8WireFloats(c[2]) + PlanInt8WireFloats(c[3]));
  }
  EXPECT_EQ(p->rank_sent[0][kAllgather][kIntra], rank0);
}

TEST(CostModelTest, TimeUsesTheSlowestNodeLink) {
  auto p = PlanStep(TwoByTwo(0));
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> nodes = {"a", "a", "b", "b"};
  const CommTime t = PredictCommTime(*p, nodes, 9600, 960);
  EXPECT_DOUBLE_EQ(t.intra_seconds, 1.0);   // 9600 B at 9600 B/s per rank
  EXPECT_DOUBLE_EQ(t.inter_seconds, 10.0);  // one rank per node crosses
  EXPECT_DOUBLE_EQ(t.total_seconds, 11.0);
}

TEST(CostModelTest, RefusesInputsThatCannotRun) {
  PlanInput in = TwoByTwo(2);
  in.hpz = true;
  EXPECT_NE(PlanStep(in).status().message().find("stage 3"), std::string::npos);
  in = TwoByTwo(3);
  in.hpz = true;
  in.rank_nodes = {"a", "a", "a", "b"};
  EXPECT_NE(PlanStep(in).status().message().find("same number of workers"), std::string::npos);
  in = TwoByTwo(1);
  in.qwz = true;
  EXPECT_FALSE(PlanStep(in).ok());
  in = TwoByTwo(3);
  in.micro_batches = 0;
  EXPECT_FALSE(PlanStep(in).ok());
  in = TwoByTwo(4);
  EXPECT_FALSE(PlanStep(in).ok());
  in = TwoByTwo(3);
  in.rank_nodes.clear();
  EXPECT_FALSE(PlanStep(in).ok());
  in = TwoByTwo(3);
  in.bf16 = true;
  in.hpz = true;
  EXPECT_FALSE(PlanStep(in).ok());
}

}  // namespace
}  // namespace tandem::zero
