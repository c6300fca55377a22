// keeld's exporter: a data-parallel run's per-rank step and communication
// times (and the exposed part of the latter) become one series per rank, and
// go away with the run; outlier analytics become per layer and role series,
// all four scalars for fwd_x / fwd_w / dgrad_dy and the flush rate alone for
// the other roles.
#include "server/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <cmath>
#include <map>
#include <string>

namespace keel {
namespace {

// metric name -> {rank label -> value} for the run's per-rank series.
std::map<std::string, std::map<std::string, double>> RankSeries(KeeldMetrics& metrics, const std::string& run) {
  std::map<std::string, std::map<std::string, double>> out;
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
    if (f.name != "keel_run_rank_step_seconds" && f.name != "keel_run_rank_comm_seconds" &&
        f.name != "keel_run_rank_comm_exposed_seconds") {
      continue;
    }
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& l : m.label) labels[l.name] = l.value;
      if (labels["run"] == run) out[f.name][labels["rank"]] = m.gauge.value;
    }
  }
  return out;
}

TEST(KeeldMetricsTest, PerRankTimesAreOneSeriesPerRankAndLeaveWithTheRun) {
  KeeldMetrics metrics;
  CoordinatorStats stats;
  RunGauges gang;
  gang.run = "run-1";
  gang.sweep = "sweep-1";
  gang.has_metric = true;
  gang.rank_step_seconds = {0.5, 0.25, 0.75};
  gang.rank_comm_seconds = {0.125, 0.0625, 0.25};
  gang.rank_comm_exposed_seconds = {0.03125, 0.0, 0.25};  // part, all and none overlapped
  gang.ranks = 3;
  gang.workers = 2;
  gang.gpus = 3;
  RunGauges single;
  single.run = "run-2";
  single.sweep = "sweep-1";
  single.has_metric = true;
  stats.runs = {gang, single};
  metrics.Update(stats);
  auto series = RankSeries(metrics, "run-1");
  EXPECT_EQ(series["keel_run_rank_step_seconds"], (std::map<std::string, double>{{"0", 0.5}, {"1", 0.25}, {"2", 0.75}}));
  EXPECT_EQ(series["keel_run_rank_comm_seconds"],
            (std::map<std::string, double>{{"0", 0.125}, {"1", 0.0625}, {"2", 0.25}}));
  EXPECT_EQ(series["keel_run_rank_comm_exposed_seconds"],
            (std::map<std::string, double>{{"0", 0.03125}, {"1", 0.0}, {"2", 0.25}}));
  EXPECT_TRUE(RankSeries(metrics, "run-2").empty());  // one rank: no per-rank series
  std::map<std::string, double> ranks, workers, gpus;
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name != "run") continue;
        if (f.name == "keel_run_ranks") ranks[l.value] = m.gauge.value;
        if (f.name == "keel_run_workers") workers[l.value] = m.gauge.value;
        if (f.name == "keel_run_gpus") gpus[l.value] = m.gauge.value;
      }
    }
  }
  EXPECT_EQ(ranks, (std::map<std::string, double>{{"run-1", 3}, {"run-2", 1}}));
  EXPECT_EQ(workers, (std::map<std::string, double>{{"run-1", 2}, {"run-2", 1}}));
  EXPECT_EQ(gpus, (std::map<std::string, double>{{"run-1", 3}, {"run-2", 0}}));
  stats.runs = {single};  // run-1 ended longer than the retention ago
  metrics.Update(stats);
  EXPECT_TRUE(RankSeries(metrics, "run-1").empty());
}

// "metric{layer,role}" -> value for the run's outlier series.
std::map<std::string, double> OutlierSeries(KeeldMetrics& metrics, const std::string& run) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
    if (f.name.rfind("keel_run_operand_", 0) != 0) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& l : m.label) labels[l.name] = l.value;
      if (labels["run"] == run) out[f.name + "{" + labels["layer"] + "," + labels["role"] + "}"] = m.gauge.value;
    }
  }
  return out;
}

TEST(KeeldMetricsTest, OutlierAnalyticsArePerLayerAndRoleAndLeaveWithTheRun) {
  KeeldMetrics metrics;
  CoordinatorStats stats;
  RunGauges run;
  run.run = "run-1";
  run.sweep = "sweep-1";
  run.has_metric = true;
  const double nan = std::nan("");
  run.outliers = {{"h.11.mlp", "fwd_x", 40, 120, 0.125, 0.75},
                  {"h.11.mlp", "wgrad_x", 40, 120, 0.0625, 0.75},
                  {"h.11.mlp", "dgrad_dy", 3, 2, 0, nan}};  // first analytics step: no overlap
  stats.runs = {run};
  metrics.Update(stats);
  EXPECT_EQ(OutlierSeries(metrics, "run-1"),
            (std::map<std::string, double>{
                {"keel_run_operand_kurtosis{h.11.mlp,fwd_x}", 40},
                {"keel_run_operand_channel_peak_to_median{h.11.mlp,fwd_x}", 120},
                {"keel_run_operand_ftz_ratio{h.11.mlp,fwd_x}", 0.125},
                {"keel_run_operand_hot_channel_overlap_ratio{h.11.mlp,fwd_x}", 0.75},
                {"keel_run_operand_ftz_ratio{h.11.mlp,wgrad_x}", 0.0625},
                {"keel_run_operand_kurtosis{h.11.mlp,dgrad_dy}", 3},
                {"keel_run_operand_channel_peak_to_median{h.11.mlp,dgrad_dy}", 2},
                {"keel_run_operand_ftz_ratio{h.11.mlp,dgrad_dy}", 0},
            }));
  stats.runs = {};  // the run ended longer than the retention ago
  metrics.Update(stats);
  EXPECT_TRUE(OutlierSeries(metrics, "run-1").empty());
}

}  // namespace
}  // namespace keel
