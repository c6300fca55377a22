// keeld's exporter: a data-parallel run's per-rank step and communication
// times (and the exposed part of the latter) become one series per rank, and
// go away with the run.
#include "server/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

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

}  // namespace
}  // namespace keel
