// The coordinator's counters and histograms in Prometheus' text format:
// exact rendering of a small family, cumulative buckets, escaping, and the
// bounded labels of CoordinatorMetrics (unknown RPC paths and collective
// kinds never become labels).
#include "server/prometheus_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "server/coordinator_metrics.h"

namespace tandem::server {
namespace {

TEST(PrometheusMetricsTest, CounterRendersSortedChildren) {
  CounterFamily c("x_total", "Things.", {"kind"});
  c.Add({"b"}, 2.5);
  c.Increment({"a"});
  c.Add({"a"}, -3);  // ignored: counters only go up
  std::string out;
  c.Render(&out);
  EXPECT_EQ(out,
            "# HELP x_total Things.\n# TYPE x_total counter\n"
            "x_total{kind=\"a\"} 1\nx_total{kind=\"b\"} 2.5\n");
  EXPECT_EQ(c.Value({"a"}), 1);
}

TEST(PrometheusMetricsTest, HistogramBucketsAreCumulative) {
  HistogramFamily h("d_seconds", "Durations.", {}, {0.1, 1});
  h.Observe({}, 0.05);
  h.Observe({}, 0.1);  // le is inclusive
  h.Observe({}, 0.5);
  h.Observe({}, 7);
  std::string out;
  h.Render(&out);
  EXPECT_EQ(out,
            "# HELP d_seconds Durations.\n# TYPE d_seconds histogram\n"
            "d_seconds_bucket{le=\"0.1\"} 2\nd_seconds_bucket{le=\"1\"} 3\nd_seconds_bucket{le=\"+Inf\"} 4\n"
            "d_seconds_sum 7.65\nd_seconds_count 4\n");
}

TEST(PrometheusMetricsTest, LabelValuesAreEscaped) {
  EXPECT_EQ(PrometheusLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(PrometheusNumber(0.005), "0.005");
  EXPECT_EQ(PrometheusNumber(3), "3");
}

TEST(CoordinatorMetricsTest, LabelsStayBounded) {
  CoordinatorMetrics m;
  m.RpcFinished("/tandem.v1.Control/SubmitJob", 0, true, 0.002);
  m.RpcFinished("/tandem.v1.Cluster/Attach", 1, false, 30);
  m.RpcFinished("/evil.Service/x", 12, true, 0.001);
  m.RpcFinished("/tandem.v1.Control/Bad{Name}", 12, true, 0.001);
  EXPECT_EQ(m.rpcs().Value({"tandem.v1.Control", "SubmitJob", "OK"}), 1);
  EXPECT_EQ(m.rpcs().Value({"tandem.v1.Cluster", "Attach", "CANCELLED"}), 1);
  EXPECT_EQ(m.rpcs().Value({"other", "other", "UNIMPLEMENTED"}), 2);
  EXPECT_EQ(m.rpc_seconds().Count({"tandem.v1.Cluster", "Attach"}), 0u);  // streams: no latency
  EXPECT_EQ(m.rpc_seconds().Count({"tandem.v1.Control", "SubmitJob"}), 1u);

  std::map<int, tandem::v1::ReportPhaseRequest> reports;
  for (int rank = 0; rank < 2; ++rank) {
    auto* extra = reports[rank].mutable_metrics()->mutable_extra();
    (*extra)["bytes_sent_allreduce"] = 1000;
    (*extra)["bytes_sent_made_up"] = 5;  // not a collective kind: ignored
  }
  m.PhaseCompleted(tandem::v1::PHASE_SFT_STEP, 0.5, reports);
  EXPECT_EQ(m.collective_bytes().Value({"allreduce"}), 2000);
  EXPECT_EQ(m.phase_seconds().Count({"sft_step"}), 1u);
  EXPECT_EQ(m.Render().find("made_up"), std::string::npos);

  m.StepCompleted(tandem::v1::JOB_KIND_SFT);
  m.CheckpointPublished(4096);
  m.RecoveryStarted();
  EXPECT_EQ(m.steps().Value({"sft"}), 1);
  EXPECT_EQ(m.checkpoint_bytes().Value({}), 4096);
  EXPECT_EQ(m.recoveries().Value({}), 1);
  // Series of every bounded label value exist at 0 from the start.
  const std::string text = CoordinatorMetrics().Render();
  EXPECT_NE(text.find("tandem_steps_total{kind=\"grpo\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("tandem_collective_sent_bytes_total{kind=\"reduce_scatter\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("tandem_phase_duration_seconds_count{phase=\"rollout\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace tandem::server
