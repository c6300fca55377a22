// format.h: tables, progress bars, numbers, CSV/JSONL export and the watch row.
#include "client/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace keel {
namespace client {
namespace {

TEST(FormatTableTest, PadsColumnsToTheWidestCellAndTrimsTrailingSpace) {
  std::string table = FormatTable({"ID", "STATE"}, {{"run-1", "RUNNING"}, {"r2", "-"}});
  EXPECT_EQ(table,
            "ID     STATE\n"
            "run-1  RUNNING\n"
            "r2     -\n");
}

TEST(FormatTableTest, HeaderWiderThanCells) {
  std::string table = FormatTable({"LONGHEADER", "X"}, {{"a", "b"}});
  EXPECT_EQ(table, "LONGHEADER  X\na           b\n");
}

TEST(ProgressBarTest, FillsInProportionAndClamps) {
  EXPECT_EQ(ProgressBar(0, 100, 10), "[..........]");
  EXPECT_EQ(ProgressBar(50, 100, 10), "[#####.....]");
  EXPECT_EQ(ProgressBar(99, 100, 10), "[#########.]");  // full only at the end
  EXPECT_EQ(ProgressBar(100, 100, 10), "[##########]");
  EXPECT_EQ(ProgressBar(250, 100, 10), "[##########]");
  EXPECT_EQ(ProgressBar(5, 0, 4), "[....]");
  EXPECT_EQ(ProgressBar(-3, 10, 4), "[....]");
}

TEST(FormatNumberTest, ShortestRoundTrip) {
  EXPECT_EQ(FormatNumber(2.5), "2.5");
  EXPECT_EQ(FormatNumber(6e-4), "0.0006");
  EXPECT_EQ(FormatNumber(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatNumber(std::nan("")), "nan");
  EXPECT_EQ(FormatNumber(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(HumanNumberTest, FourSignificantDigitsWithoutTrailingZeros) {
  EXPECT_EQ(HumanNumber(2.3456789012345678), "2.346");
  EXPECT_EQ(HumanNumber(0.1 + 0.2), "0.3");  // FormatNumber: 0.30000000000000004
  EXPECT_EQ(HumanNumber(2.5), "2.5");
  EXPECT_EQ(HumanNumber(2.0), "2");
  EXPECT_EQ(HumanNumber(-2.3456789), "-2.346");
  EXPECT_EQ(HumanNumber(0.00123456), "0.001235");
  EXPECT_EQ(HumanNumber(0.001), "0.001");
  EXPECT_EQ(HumanNumber(10.0 / 3.0), "3.333");
  EXPECT_EQ(HumanNumber(123.456789), "123.5");
}

TEST(HumanNumberTest, RoundingCarriesIntoTheNextDecade) {
  EXPECT_EQ(HumanNumber(9.99996), "10");
  EXPECT_EQ(HumanNumber(0.00099996), "0.001");
  EXPECT_EQ(HumanNumber(999999.7), "1e6");
}

TEST(HumanNumberTest, LargeIntegerPartsAreKeptBelowAMillion) {
  EXPECT_EQ(HumanNumber(12345.678), "12346");
  EXPECT_EQ(HumanNumber(999499.0), "999499");
  EXPECT_EQ(HumanNumber(999999.0), "1e6");  // 1.000e6 to four digits
  EXPECT_EQ(HumanNumber(1000000.0), "1e6");
  EXPECT_EQ(HumanNumber(1234567.0), "1.235e6");
}

TEST(HumanNumberTest, TinyAndHugeInScientificNotation) {
  EXPECT_EQ(HumanNumber(6e-4), "6e-4");
  EXPECT_EQ(HumanNumber(0.000612345), "6.123e-4");
  EXPECT_EQ(HumanNumber(-6.5e-9), "-6.5e-9");
  EXPECT_EQ(HumanNumber(1e-300), "1e-300");
  EXPECT_EQ(HumanNumber(std::numeric_limits<double>::denorm_min()), "4.941e-324");
  EXPECT_EQ(HumanNumber(1.7976931348623157e308), "1.798e308");
}

TEST(HumanNumberTest, ZeroAndNonFinite) {
  EXPECT_EQ(HumanNumber(0.0), "0");
  EXPECT_EQ(HumanNumber(-0.0), "0");
  EXPECT_EQ(HumanNumber(std::nan("")), "nan");
  EXPECT_EQ(HumanNumber(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(HumanNumber(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(HumanNumberTest, NeverLongerThanElevenCharacters) {
  // Whatever the magnitude, a table cell stays short: a sign, four digits, a
  // point and an exponent of at most five characters ("-1.235e-310"), or a
  // sign and at most six integer digits.
  for (double magnitude = 1e-310; magnitude < 1e308; magnitude *= 7.3) {
    for (double v : {magnitude, -magnitude, magnitude * 1.23456789}) {
      EXPECT_LE(HumanNumber(v).size(), 11u) << v << " -> " << HumanNumber(v);
    }
  }
}

TEST(RunLossTextTest, DashBeforeTheFirstPointElseHumanNumber) {
  v1::Run run;
  EXPECT_EQ(RunLossText(run), "-");
  run.set_step(1);
  run.set_loss(3.14159265358979);
  EXPECT_EQ(RunLossText(run), "3.142");
  run.set_loss(std::nan(""));
  EXPECT_EQ(RunLossText(run), "nan");
}

TEST(CsvFieldTest, QuotesOnlyWhenNeeded) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(CsvField("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(CsvField(""), "");
}

TEST(JsonStringTest, Escapes) { EXPECT_EQ(JsonString("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\""); }

std::vector<RunSeries> TwoRuns() {
  RunSeries a;
  a.run.set_id("r1");
  a.run.set_sweep_id("s1");
  (*a.run.mutable_axes())["optimizer.lr"] = "6e-4";
  (*a.run.mutable_axes())["note"] = "x,y";
  for (int step : {0, 10}) {
    v1::MetricPoint p;
    p.set_run_id("r1");
    p.set_step(step);
    p.set_loss(step == 0 ? 4.0 : 2.5);
    p.set_lr(0.0006);
    p.set_tokens_per_s(1000);
    p.set_grad_norm(0.5);
    a.points.push_back(p);
  }
  RunSeries b;
  b.run.set_id("r2");
  b.run.set_sweep_id("s1");
  (*b.run.mutable_axes())["optimizer.lr"] = "1e-3";
  v1::MetricPoint p;
  p.set_run_id("r2");
  p.set_step(5);
  p.set_loss(std::nan(""));
  p.set_lr(0.001);
  b.points.push_back(p);
  return {a, b};
}

TEST(ExportTest, MachineOutputsKeepFullPrecision) {
  std::vector<RunSeries> series = TwoRuns();
  const double loss = 2.4567890123456789;
  series[0].points[0].set_loss(loss);
  series[0].points[0].set_lr(0.1 + 0.2);
  const std::string loss_text = FormatNumber(loss);
  EXPECT_EQ(std::strtod(loss_text.c_str(), nullptr), loss);
  EXPECT_GE(loss_text.size(), 16u);  // every digit the double needs, not HumanNumber's four
  std::string csv = ExportCsv(series);
  EXPECT_NE(csv.find(",0," + loss_text + ",0.30000000000000004,"), std::string::npos) << csv;
  std::string jsonl = ExportJsonl(series);
  EXPECT_NE(jsonl.find("\"loss\":" + loss_text + ",\"lr\":0.30000000000000004"), std::string::npos) << jsonl;
}

TEST(ExportTest, CsvHasFixedColumnsThenSortedAxes) {
  EXPECT_EQ(ExportCsv(TwoRuns()),
            "sweep_id,run_id,step,loss,lr,tokens_per_s,grad_norm,note,optimizer.lr\n"
            "s1,r1,0,4,0.0006,1000,0.5,\"x,y\",6e-4\n"
            "s1,r1,10,2.5,0.0006,1000,0.5,\"x,y\",6e-4\n"
            "s1,r2,5,nan,0.001,0,0,,1e-3\n");
}

TEST(ExportTest, JsonlOneObjectPerPointNonFiniteAsNull) {
  EXPECT_EQ(ExportJsonl(TwoRuns()),
            "{\"sweep_id\":\"s1\",\"run_id\":\"r1\",\"step\":0,\"loss\":4,\"lr\":0.0006,\"tokens_per_s\":1000,"
            "\"grad_norm\":0.5,\"note\":\"x,y\",\"optimizer.lr\":\"6e-4\"}\n"
            "{\"sweep_id\":\"s1\",\"run_id\":\"r1\",\"step\":10,\"loss\":2.5,\"lr\":0.0006,\"tokens_per_s\":1000,"
            "\"grad_norm\":0.5,\"note\":\"x,y\",\"optimizer.lr\":\"6e-4\"}\n"
            "{\"sweep_id\":\"s1\",\"run_id\":\"r2\",\"step\":5,\"loss\":null,\"lr\":0.001,\"tokens_per_s\":0,"
            "\"grad_norm\":0,\"note\":\"\",\"optimizer.lr\":\"1e-3\"}\n");
}

TEST(WatchRowTest, HasEveryColumn) {
  v1::Run run;
  run.set_id("r1");
  run.set_state(v1::RUNNING);
  run.set_step(50);
  run.set_steps(100);
  run.set_loss(2.4567890123456789);
  run.set_precision("mxfp8_e4m3");
  run.set_restarts(1);
  std::vector<std::string> row = WatchRow(run, 3);
  ASSERT_EQ(row.size(), WatchHeader().size());
  EXPECT_EQ(row[0], "r1");
  EXPECT_EQ(row[1], "RUNNING");
  EXPECT_EQ(row[2], "[##########..........] 50/100");
  EXPECT_EQ(row[3], "2.457");  // four significant digits, not seventeen
  EXPECT_EQ(row[4], "mxfp8_e4m3");
  EXPECT_EQ(row[5], "1");
  EXPECT_EQ(row[6], "3");
}

TEST(IsTerminalTest, TerminalStates) {
  EXPECT_TRUE(IsTerminal(v1::SUCCEEDED));
  EXPECT_TRUE(IsTerminal(v1::FAILED));
  EXPECT_TRUE(IsTerminal(v1::CANCELLED));
  EXPECT_TRUE(IsTerminal(v1::DIVERGED));
  EXPECT_FALSE(IsTerminal(v1::RUNNING));
  EXPECT_FALSE(IsTerminal(v1::QUEUED));
}

}  // namespace
}  // namespace client
}  // namespace keel
