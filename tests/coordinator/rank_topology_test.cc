// Ranks grouped by node at the coordinator: the SETUP assignment carries
// each rank's groups; per-tier bytes are summed over ranks into the step
// metrics and exported on /metrics.
#include <gtest/gtest.h>

#include "common/rank_topology.h"
#include "server/coordinator_metrics.h"
#include "server/jobs/phase_commands.h"
#include "server/jobs/step_metrics.h"

namespace tandem::server {
namespace {

TEST(RankTopologyTest, SetupAssignmentCarriesTheGroupsOfEachRank) {
  tandem::v1::Job job;
  job.set_id("j-000001");
  for (const char* id : {"w-1", "w-2", "w-3", "w-4"}) job.add_worker_ids(id);
  const auto setup = MakePhaseCommand(job, {0, 0}, {tandem::v1::PHASE_SETUP, 0}, false, 1000);
  const std::vector<std::string> nodes = {"n0", "n1", "n0", "n1"};
  for (int rank = 0; rank < 4; ++rank) {
    const auto command = CommandForRank(job, tandem::v1::DriverState(), setup, rank, "/runs", nodes);
    const auto& t = command.phase().assignment().topology();
    EXPECT_TRUE(common::CheckRankTopology(t, rank, 4).ok()) << rank;
    EXPECT_EQ(t.num_nodes(), 2);
    EXPECT_EQ(t.node_index(), rank % 2);
    EXPECT_EQ(t.local_index(), rank / 2);
    EXPECT_EQ(std::vector<int>(t.intra_ranks().begin(), t.intra_ranks().end()),
              (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    EXPECT_EQ(std::vector<int>(t.inter_ranks().begin(), t.inter_ranks().end()),
              (rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
  }
  // Unknown nodes (a list that does not match the ranks): no topology.
  EXPECT_FALSE(
      CommandForRank(job, tandem::v1::DriverState(), setup, 0, "/runs", {"n0"}).phase().assignment().has_topology());
  EXPECT_FALSE(CommandForRank(job, tandem::v1::DriverState(), setup, 0, "/runs").phase().assignment().has_topology());
}

TEST(RankTopologyTest, TierBytesAreSummedOverRanksAndExported) {
  std::map<int, tandem::v1::ReportPhaseRequest> reports;
  tandem::v1::StepMetrics acc;
  for (int rank = 0; rank < 2; ++rank) {
    auto* extra = reports[rank].mutable_metrics()->mutable_extra();
    (*extra)["tier_sent_inter_node"] = 100.0 * (rank + 1);
    (*extra)["tier_sent_inter_node_allgather"] = 100.0 * (rank + 1);
    (*extra)["tier_sent_intra_node"] = 10;
    (*extra)["bytes_sent_allgather"] = 100.0 * (rank + 1) + 10;
    AddTierBytes(&acc, reports[rank].metrics());
  }
  EXPECT_EQ(acc.extra().at("job_tier_sent_inter_node"), 300);
  EXPECT_EQ(acc.extra().at("job_tier_sent_intra_node"), 20);
  EXPECT_EQ(acc.extra().count("job_bytes_sent_allgather"), 0u);
  CoordinatorMetrics m;
  m.PhaseCompleted(tandem::v1::PHASE_SFT_STEP, 0.5, reports);
  EXPECT_EQ(m.tier_bytes().Value({"inter_node", "allgather"}), 300);
  EXPECT_EQ(m.tier_bytes().Value({"intra_node", "allgather"}), 0);
  const std::string text = CoordinatorMetrics().Render();
  EXPECT_NE(text.find("tandem_collective_tier_sent_bytes_total{tier=\"inter_node\",kind=\"reduce_scatter\"} 0\n"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::server
