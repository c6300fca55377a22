// The block maps as SVG: one rectangle per run of equal colour along a row,
// zero and non-finite cells in their own classes, the colour ramp's ends at
// the smallest positive and largest finite means, and the files of a step.
#include "worker/engine/outlier_maps.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "worker/io/file_util.h"

namespace keel {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

OperandOutliers Map(int64_t rows, int64_t cols, std::vector<double> means) {
  OperandOutliers o;
  o.calls = 1;
  o.rows = rows;
  o.cols = cols;
  o.grid = MapGridFor(rows, cols);
  o.map_mean = std::move(means);
  return o;
}

TEST(OutlierMapsTest, RunsOfEqualColourAreOneRectangle) {
  // 2 x 4 cells: row 0 is one colour (merged), row 1 has four distinct classes:
  // zero, the smallest (c0), NaN, the largest (c31).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const OperandOutliers o = Map(32, 64, {2, 2, 2, 2, 0, 0.01, nan, 100});
  const std::string svg = BlockMapSvg(o, "h.0.mlp.fc.fwd_x, step 100");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("<title>h.0.mlp.fc.fwd_x, step 100</title>"), std::string::npos);
  // Cells: row 0 one rectangle of width 4, row 1 four, each in its class's path.
  EXPECT_EQ(Count(svg, "v1h-"), 5);
  // 2 lies at log(2 / 0.01) / log(100 / 0.01) = 0.575 of the log range: level
  // 0.575 x 31 = 17.8, rounded to 18.
  EXPECT_NE(svg.find("<path class=\"c18\" d=\"M0 0h4v1h-4z\"/>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<path class=\"z\" d=\"M0 1h1v1h-1z\"/>"), std::string::npos);
  EXPECT_NE(svg.find("<path class=\"c0\" d=\"M1 1h1v1h-1z\"/>"), std::string::npos);
  EXPECT_NE(svg.find("<path class=\"n\" d=\"M2 1h1v1h-1z\"/>"), std::string::npos);
  EXPECT_NE(svg.find("<path class=\"c31\" d=\"M3 1h1v1h-1z\"/>"), std::string::npos);
  // The legend's ends.
  EXPECT_NE(svg.find(">0.01</text>"), std::string::npos);
  EXPECT_NE(svg.find(">100</text>"), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(OutlierMapsTest, TheLargestMapStaysBounded) {
  // 128 x 128 cells, every one a different colour from its neighbour: the worst case.
  std::vector<double> means(128 * 128);
  for (size_t i = 0; i < means.size(); ++i) means[i] = (i % 2) ? 1.0 : 1000.0;
  const std::string svg = BlockMapSvg(Map(128 * 16, 128 * 16, means), "worst");
  EXPECT_EQ(Count(svg, "v1h-"), 128 * 128);
  EXPECT_LT(svg.size(), 320u * 1024);
}

TEST(OutlierMapsTest, WritesOneFilePerMapUnderTheStep) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/maps/analytics/00000100";
  std::vector<OperandOutliers> results(2 * kRoleCount);
  results[kRoleCount + static_cast<int>(Role::kFwdW)] = Map(16, 16, {2.0});
  results[static_cast<int>(Role::kWgradX)].calls = 1;  // analyzed, but no map
  int written = 0;
  ASSERT_TRUE(WriteBlockMaps(dir, 100, {"h.0.attn", "h.0.mlp"}, results, &written).ok());
  EXPECT_EQ(written, 1);
  std::string svg;
  ASSERT_TRUE(ReadFile(dir + "/h.0.mlp.fwd_w.svg", &svg).ok());
  EXPECT_NE(svg.find("h.0.mlp.fwd_w, step 100"), std::string::npos);
  // A slot beyond the names is an error naming it.
  Status bad = WriteBlockMaps(dir, 100, {"h.0.attn"}, results, &written);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("slot 1 has no layer name"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace keel
