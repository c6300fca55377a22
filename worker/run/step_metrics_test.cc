// The metric line: what StepMetrics::ToJson writes, ParseMetricLine reads back
// (the one reader keel-worker and keeld use), with one rule for missing and
// non-finite numbers.
#include "worker/run/step_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace keel {
namespace {

TEST(MetricLineTest, ReadsBackWhatTheWriterWrote) {
  StepMetrics m;
  m.step = 42;
  m.loss = 0.125;
  m.lr = 6e-4;
  m.tokens_per_s = 1234.5;
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.probed = true;
  m.probe.cosine = 0.75;
  m.probe.zeta = -0.5;
  m.operands.push_back({"blocks.0.fc1", Role::kFwdX, 0.01, 0});
  m.operands.push_back({"blocks.0.fc1", Role::kFwdW, 0.25, 0});
  MetricLine line;
  Status s = ParseMetricLine(m.ToJson(), &line);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(line.step, 42);
  EXPECT_EQ(line.loss, 0.125);
  EXPECT_EQ(line.lr, m.lr);
  EXPECT_EQ(line.tokens_per_s, 1234.5);
  EXPECT_EQ(line.grad_norm, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(line.has_probe);
  EXPECT_EQ(line.probe_cosine, 0.75);
  EXPECT_EQ(line.probe_zeta, -0.5);
  EXPECT_TRUE(line.has_saturation);
  EXPECT_EQ(line.max_saturated, 0.25);
  // One rank: no per-rank times.
  EXPECT_TRUE(line.rank_step_seconds.empty());
  EXPECT_EQ(m.ToJson().find("rank_step_ms"), std::string::npos);
}

TEST(MetricLineTest, PerRankTimesRoundTripInMilliseconds) {
  StepMetrics m;
  m.step = 3;
  m.rank_step_seconds = {0.5, 0.25};
  m.rank_comm_seconds = {0.125, 0.0625};
  m.rank_comm_exposed_seconds = {0.03125, 0.0};
  const std::string json = m.ToJson();
  EXPECT_NE(json.find("\"rank_step_ms\":[500,250]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rank_comm_ms\":[125,62.5]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rank_comm_exposed_ms\":[31.25,0]"), std::string::npos) << json;
  EXPECT_EQ(json.find("grad_buckets"), std::string::npos) << json;  // one reduction: no bucket counts
  MetricLine line;
  ASSERT_TRUE(ParseMetricLine(json, &line).ok());
  EXPECT_EQ(line.rank_step_seconds, (std::vector<double>{0.5, 0.25}));
  EXPECT_EQ(line.rank_comm_seconds, (std::vector<double>{0.125, 0.0625}));
  EXPECT_EQ(line.rank_comm_exposed_seconds, (std::vector<double>{0.03125, 0.0}));
}

TEST(MetricLineTest, BucketCountsAreWrittenWhenTheGradientWasBucketed) {
  StepMetrics m;
  m.step = 1;
  m.grad_buckets = 6;
  m.grad_buckets_early = 5;
  const std::string json = m.ToJson();
  EXPECT_NE(json.find("\"grad_buckets\":6,\"grad_buckets_early\":5"), std::string::npos) << json;
}

TEST(MetricLineTest, MissingOrNonNumericValuesReadAsNaNForEveryReader) {
  MetricLine line;
  ASSERT_TRUE(ParseMetricLine(R"({"step": 3, "loss": "NaN", "lr": null, "grad_norm": "fast"})", &line).ok());
  EXPECT_EQ(line.step, 3);
  EXPECT_TRUE(std::isnan(line.loss));          // the writer's spelling of NaN
  EXPECT_TRUE(std::isnan(line.lr));            // null
  EXPECT_TRUE(std::isnan(line.grad_norm));     // not a number
  EXPECT_TRUE(std::isnan(line.tokens_per_s));  // missing
  EXPECT_FALSE(line.has_probe);
  EXPECT_FALSE(line.has_saturation);
}

TEST(MetricLineTest, RefusesLinesWithoutAStep) {
  MetricLine line;
  line.step = 99;
  for (const char* bad : {"", "[1]", "{\"loss\": 1}", "{\"step\": 0}", "{\"step\": 2.5}", "{\"step\": \"x\"}", "{\"step\""}) {
    EXPECT_FALSE(ParseMetricLine(bad, &line).ok()) << bad;
  }
  EXPECT_EQ(line.step, 99);  // untouched
}

TEST(MetricLineTest, ReadsBackOutlierAnalytics) {
  StepMetrics m;
  m.step = 200;
  OutlierMetric a{"h.0.attn", Role::kFwdX, 12.5, 40, 0.125, false, 0, {7, 3}};
  OutlierMetric b{"h.0.attn", Role::kDgradDy, 3.0, 2, 0, true, 0.6, {1}};
  OutlierMetric c{"lm_head", Role::kFwdW, std::numeric_limits<double>::quiet_NaN(),
                  std::numeric_limits<double>::infinity(), 0.5, true, 1.0, {}};
  m.outliers = {a, b, c};
  const std::string json = m.ToJson();
  EXPECT_TRUE(MetricLineHasAnalytics(json));
  EXPECT_NE(json.find("\"analytics\":{\"h.0.attn\":{\"fwd_x\":{\"kurtosis\":12.5,\"top1_over_median\":40,"
                      "\"ftz_rate\":0.125,\"hot\":[7,3]},\"dgrad_dy\":"),
            std::string::npos)
      << json;
  MetricLine line;
  ASSERT_TRUE(ParseMetricLine(json, &line).ok());
  EXPECT_TRUE(line.has_analytics);
  ASSERT_EQ(line.outliers.size(), 3u);
  EXPECT_EQ(line.outliers[0].linear, "h.0.attn");
  EXPECT_EQ(line.outliers[0].role, "fwd_x");
  EXPECT_EQ(line.outliers[0].kurtosis, 12.5);
  EXPECT_EQ(line.outliers[0].top1_over_median, 40);
  EXPECT_EQ(line.outliers[0].ftz_rate, 0.125);
  EXPECT_TRUE(std::isnan(line.outliers[0].hot_overlap));  // the first analytics step has none
  EXPECT_EQ(line.outliers[1].role, "dgrad_dy");
  EXPECT_EQ(line.outliers[1].hot_overlap, 0.6);
  EXPECT_EQ(line.outliers[2].linear, "lm_head");
  EXPECT_TRUE(std::isnan(line.outliers[2].kurtosis));
  EXPECT_TRUE(std::isinf(line.outliers[2].top1_over_median));
  // A step without analytics.
  StepMetrics plain;
  plain.step = 201;
  EXPECT_FALSE(MetricLineHasAnalytics(plain.ToJson()));
  ASSERT_TRUE(ParseMetricLine(plain.ToJson(), &line).ok());
  EXPECT_FALSE(line.has_analytics);
  EXPECT_TRUE(line.outliers.empty());
}

}  // namespace
}  // namespace keel
