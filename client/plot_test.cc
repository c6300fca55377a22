// plot.h: interventions and precision changes from events, the layout of the
// loss plot (texts inside the canvas and apart, markers at the steps where the
// interventions were decided) and its SVG.
#include "client/plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "client/plot_testing.h"
#include "proto/event_kinds.h"

namespace keel {
namespace client {
namespace {

v1::Event Event(const std::string& run, int64_t step, const char* kind,
                std::map<std::string, std::string> details = {}) {
  v1::Event e;
  e.set_run_id(run);
  e.set_step(step);
  e.set_kind(kind);
  for (const auto& kv : details) (*e.mutable_details())[kv.first] = kv.second;
  return e;
}

// keel-train's record of a policy rescue at `from`: rollback to `to`, then the
// switch and scale_lr at `to`.
std::vector<v1::Event> Rescue(const std::string& run, int64_t from, int64_t to, const std::string& scheme,
                              const std::string& next) {
  return {Event(run, to, event_kind::kRollback,
                {{"from_step", std::to_string(from)}, {"to_step", std::to_string(to)}, {"rule", "loss-spike"}}),
          Event(run, to, event_kind::kSwitchPrecision, {{"from", scheme}, {"precision", next}, {"rule", "loss-spike"}}),
          Event(run, to, event_kind::kScaleLr, {{"factor", "0.01"}, {"rule", "loss-spike"}})};
}

// Appends the point (step, loss) to the run's series.
void AddPoint(RunSeries* s, int64_t step, double loss) {
  v1::MetricPoint p;
  p.set_step(step);
  p.set_loss(loss);
  s->points.push_back(p);
}

// The texts of `role` in the layout, in order.
std::vector<std::string> TextsOf(const LossPlot& plot, const std::string& role) {
  std::vector<std::string> out;
  for (const PlotText& t : plot.texts)
    if (t.role == role) out.push_back(t.text);
  return out;
}

TEST(PlotInterventionsTest, ARollbackIsDrawnWhereItWasDecidedNotWhereTheRunResumed) {
  std::vector<PlotIntervention> items =
      PlotInterventions({Event("r1", 100, event_kind::kRollback, {{"from_step", "155"}, {"to_step", "100"}})});
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].run_id, "r1");
  EXPECT_EQ(items[0].step, 155);
  EXPECT_EQ(items[0].resumed_step, 100);
  EXPECT_EQ(items[0].summary, "rollback to 100");
}

TEST(PlotInterventionsTest, TheActionsOfOneDecisionAreOneIntervention) {
  std::vector<PlotIntervention> items = PlotInterventions(Rescue("r1", 155, 100, "mxfp4", "mxfp6_e2m3"));
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].step, 155);
  EXPECT_EQ(items[0].resumed_step, 100);
  EXPECT_EQ(items[0].precision, "mxfp6_e2m3");
  EXPECT_EQ(items[0].summary, "rollback to 100, switch mxfp4 -> mxfp6_e2m3, scale_lr x0.01 (rule loss-spike)");
}

TEST(PlotInterventionsTest, InterleavedRunsAreGroupedPerRun) {
  std::vector<v1::Event> a = Rescue("a", 155, 100, "mxfp4", "mxfp6_e2m3");
  std::vector<v1::Event> b = Rescue("b", 150, 125, "nvfp4", "mxfp8_e4m3");
  std::vector<v1::Event> events = {a[0], b[0], a[1], b[1], a[2], b[2]};
  std::vector<PlotIntervention> items = PlotInterventions(events);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].run_id, "a");
  EXPECT_EQ(items[0].step, 155);
  EXPECT_EQ(items[0].precision, "mxfp6_e2m3");
  EXPECT_EQ(items[1].run_id, "b");
  EXPECT_EQ(items[1].step, 150);
  EXPECT_EQ(items[1].resumed_step, 125);
  EXPECT_EQ(items[1].summary, "rollback to 125, switch nvfp4 -> mxfp8_e4m3, scale_lr x0.01 (rule loss-spike)");
}

TEST(PlotInterventionsTest, DecisionsAtOtherStepsStaySeparate) {
  std::vector<PlotIntervention> items = PlotInterventions(
      {Event("r1", 50, event_kind::kSwitchPrecision, {{"from", "mxfp4"}, {"precision", "mxfp6_e2m3"}}),
       Event("r1", 80, event_kind::kSwitchPrecision, {{"from", "mxfp6_e2m3"}, {"precision", "bf16"}})});
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].step, 50);
  EXPECT_EQ(items[0].resumed_step, -1);
  EXPECT_EQ(items[1].step, 80);
  EXPECT_EQ(items[1].summary, "switch mxfp6_e2m3 -> bf16");
}

TEST(PlotInterventionsTest, WithoutATrajectoryChangeThereIsNoMarker) {
  EXPECT_TRUE(PlotInterventions({Event("r1", 10, event_kind::kScaleLr, {{"factor", "0.5"}}),
                                 Event("r1", 20, event_kind::kSkipStep), Event("r1", 30, event_kind::kStop),
                                 Event("r1", 0, event_kind::kState),
                                 Event("r1", 5, event_kind::kInterventionRequested)})
                  .empty());
}

TEST(PlotInterventionsTest, ARollbackWithoutFromStepFallsBackToItsEventStep) {
  std::vector<PlotIntervention> items =
      PlotInterventions({Event("r1", 100, event_kind::kRollback, {{"from_step", "not a number"}})});
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].step, 100);
  EXPECT_EQ(items[0].summary, "rollback to 100");
}

TEST(PrecisionChangesTest, SwitchesAndRollbacksThatNameAnotherScheme) {
  v1::Run run;
  run.set_id("r1");
  run.mutable_scheme()->set_name("mxfp4");
  std::vector<PrecisionChange> changes = PrecisionChanges(
      run, {Event("other", 10, event_kind::kSwitchPrecision, {{"precision", "bf16"}}),
            Event("r1", 100, event_kind::kSwitchPrecision, {{"from", "mxfp4"}, {"precision", "mxfp6_e2m3"}}),
            Event("r1", 120, event_kind::kRollback, {{"to_step", "120"}, {"precision", "mxfp6_e2m3"}}),  // same scheme
            Event("r1", 150, event_kind::kRollback, {{"from_step", "180"}, {"to_step", "150"}, {"precision", "bf16"}}),
            Event("r1", 160, event_kind::kInterventionRequested, {{"precision", "nvfp4"}})});
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].step, 100);
  EXPECT_EQ(changes[0].from, "mxfp4");
  EXPECT_EQ(changes[0].to, "mxfp6_e2m3");
  EXPECT_EQ(changes[1].step, 150);  // the rollback's target: the new scheme trains from there
  EXPECT_EQ(changes[1].from, "mxfp6_e2m3");
  EXPECT_EQ(changes[1].to, "bf16");
}

TEST(BoxTest, OverlapNeedsSharedArea) {
  Box a{0, 0, 10, 10};
  EXPECT_TRUE(a.Overlaps({5, 5, 10, 10}));
  EXPECT_FALSE(a.Overlaps({10, 0, 5, 5}));  // touching edges
  EXPECT_FALSE(a.Overlaps({0, 11, 5, 5}));
  EXPECT_TRUE(a.Contains({1, 1, 9, 9}));
  EXPECT_FALSE(a.Contains({1, 1, 10, 9}));
}

TEST(LayoutTest, TwentyRunsWithInterventionsAndSwitches) {
  SyntheticSweep sweep = MakeSyntheticSweep(20);
  LossPlot plot = LayOutLossPlot("sweep sweep-1 (demo): loss vs step", sweep.series, sweep.events);
  ASSERT_EQ(LayoutProblems(plot), "");
  EXPECT_EQ(plot.width, 1000);

  // One line and one legend entry per run, each with its own colour and dash.
  ASSERT_EQ(plot.lines.size(), 20u);
  std::set<std::string> styles;
  for (const PlotLine& line : plot.lines) styles.insert(line.color + "/" + line.dash);
  EXPECT_EQ(styles.size(), 20u);
  std::vector<const PlotText*> legend;
  for (const PlotText& t : plot.texts)
    if (t.role == "legend") legend.push_back(&t);
  ASSERT_EQ(legend.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(legend[i]->text, sweep.series[i].run.id());
    // Swatch just left of its text, on its row.
    EXPECT_LT(plot.lines[i].swatch_x + plot.lines[i].swatch_width, legend[i]->box.x);
    EXPECT_GT(plot.lines[i].swatch_y, legend[i]->box.y);
    EXPECT_LT(plot.lines[i].swatch_y, legend[i]->box.bottom());
  }
  // The legend's header names the axes and the switches once.
  const std::vector<std::string> head_texts = TextsOf(plot, "legend-head");
  const std::set<std::string> head(head_texts.begin(), head_texts.end());
  EXPECT_EQ(head, (std::set<std::string>{"run", "state", "policy.max_interventions", "precision", "seed",
                                         "precision switches"}));
  // The twice-rescued run's row lists both of its switches.
  bool both = false;
  for (const PlotText& t : plot.texts)
    both = both || (t.role == "legend-cell" && t.text == "-> mxfp6_e2m3 at 100, -> mxfp8_e4m3 at 200");
  EXPECT_TRUE(both);

  // The policy's 6 rescues (3 faulty precisions x 2 seeds), the second rescue of
  // one run and one manual switch: 8 interventions, each numbered and listed.
  ASSERT_EQ(plot.markers.size(), 8u);
  size_t at_rollback_from = 0;
  for (const PlotMarker& m : plot.markers) {
    EXPECT_GT(m.number, 0);
    ASSERT_GE(m.tag_text, 0);
    EXPECT_EQ(plot.texts[static_cast<size_t>(m.tag_text)].text, std::to_string(m.number));
    EXPECT_DOUBLE_EQ(m.x, plot.XOfStep(static_cast<double>(m.intervention.step)));
    if (m.intervention.resumed_step == kSyntheticRollbackTo) {
      ++at_rollback_from;
      EXPECT_EQ(m.intervention.step, kSyntheticRollbackFrom);
      EXPECT_GT(m.x - plot.XOfStep(kSyntheticRollbackTo), 10.0);  // visibly not at the target
    }
  }
  EXPECT_EQ(at_rollback_from, 6u);
  size_t list_lines = 0;
  for (const PlotText& t : plot.texts) list_lines += t.role == "list" && t.text.find(" at step ") != std::string::npos;
  EXPECT_EQ(list_lines, 8u);

  // Each precision switch is a shape on its run's line, at the switch's step.
  ASSERT_EQ(plot.switches.size(), 8u);
  for (const PlotShape& s : plot.switches) {
    EXPECT_DOUBLE_EQ(s.x, plot.XOfStep(static_cast<double>(s.step)));
    auto line = std::find_if(plot.lines.begin(), plot.lines.end(),
                             [&](const PlotLine& l) { return l.run_id == s.run_id; });
    ASSERT_NE(line, plot.lines.end());
    // The line passes through the shape: some segment spans its x at its y.
    bool on_line = false;
    for (const auto& piece : line->pieces) {
      for (size_t k = 1; k < piece.size(); ++k) {
        const auto& a = piece[k - 1];
        const auto& b = piece[k];
        if (a.first <= s.x && s.x <= b.first) {
          const double t = b.first > a.first ? (s.x - a.first) / (b.first - a.first) : 0;
          on_line = on_line || std::abs(a.second + t * (b.second - a.second) - s.y) < 0.01;
        }
      }
    }
    EXPECT_TRUE(on_line) << s.run_id << " at " << s.step;
  }
  // One key shape per scheme switched to, with the same shape as on the lines.
  std::map<std::string, int> shape_of;
  for (const PlotShape& s : plot.switches) shape_of[s.scheme] = s.shape;
  ASSERT_EQ(plot.key.size(), shape_of.size());
  for (const PlotShape& k : plot.key) EXPECT_EQ(k.shape, shape_of.at(k.scheme)) << k.scheme;
}

TEST(LayoutTest, ShortLegendRowsShareTheWidthInSeveralColumns) {
  std::vector<RunSeries> series(24);
  for (size_t i = 0; i < series.size(); ++i) {
    series[i].run.set_id("r" + std::to_string(i));
    (*series[i].run.mutable_axes())["seed"] = std::to_string(i);
    v1::MetricPoint p;
    p.set_loss(1 + static_cast<double>(i));
    series[i].points.push_back(p);
  }
  LossPlot plot = LayOutLossPlot("t", series, {});
  ASSERT_EQ(LayoutProblems(plot), "");
  std::set<double> columns;
  double lowest = 0;
  for (const PlotText& t : plot.texts) {
    if (t.role != "legend") continue;
    columns.insert(t.box.x);
    lowest = std::max(lowest, t.box.bottom());
  }
  EXPECT_GE(columns.size(), 3u);
  // Shorter than one row per run would make it.
  EXPECT_LT(lowest - plot.chart.bottom(), 60 + 24 * 1.5 * 11 / 2);
}

TEST(LayoutTest, ARunThatBlowsUpLeavesThroughTheTopInsteadOfFlatteningTheOthers) {
  RunSeries healthy, blown;
  healthy.run.set_id("healthy");
  blown.run.set_id("blown");
  for (int step = 0; step <= 100; step += 5) {
    v1::MetricPoint p;
    p.set_step(step);
    p.set_loss(4 - 2.0 * step / 100);
    healthy.points.push_back(p);
    if (step >= 60) p.set_loss(step >= 80 ? std::nan("") : std::pow(10.0, (step - 50) / 5.0));  // 100 .. 1e5
    blown.points.push_back(p);
  }
  blown.run.mutable_scheme()->set_name("mxfp4");
  std::vector<v1::Event> events = {
      Event("blown", 70, event_kind::kSwitchPrecision, {{"from", "mxfp4"}, {"precision", "bf16"}})};
  LossPlot plot = LayOutLossPlot("t", {healthy, blown}, events);
  ASSERT_EQ(LayoutProblems(plot), "");
  EXPECT_DOUBLE_EQ(plot.clipped_above, 20);  // three times the highest start, 4: 12, rounded up
  // The blown-up run's line ends on the chart's top edge, before step 60...
  ASSERT_EQ(plot.lines[1].pieces.size(), 1u);
  EXPECT_DOUBLE_EQ(plot.lines[1].pieces[0].back().second, plot.chart.y);
  EXPECT_LT(plot.lines[1].pieces[0].back().first, plot.XOfStep(60));
  // ... the healthy one spans a good part of the height...
  const auto& healthy_points = plot.lines[0].pieces[0];
  EXPECT_GT(healthy_points.back().second - healthy_points.front().second, 0.25 * plot.chart.height);
  // ... a switch where the line is off the chart sits on the edge, and the axis says where it is cut.
  ASSERT_EQ(plot.switches.size(), 1u);
  EXPECT_DOUBLE_EQ(plot.switches[0].y, plot.chart.y);
  bool said = false;
  for (const PlotText& t : plot.texts) said = said || (t.vertical && t.text == "loss (log scale; cut above 20)");
  EXPECT_TRUE(said);
}

TEST(LayoutTest, LossTicksOfANarrowRangeAreSeveralRoundNumbers) {
  RunSeries s;
  s.run.set_id("r1");
  for (int step = 0; step <= 100; ++step) {
    AddPoint(&s, step, 4.5 - 2.4 * step / 100.0);  // 4.5 down to 2.1
  }
  LossPlot plot = LayOutLossPlot("t", {s}, {});
  ASSERT_EQ(LayoutProblems(plot), "");
  const std::vector<std::string> labels = TextsOf(plot, "ytick");
  EXPECT_GE(labels.size(), 3u);
  for (const std::string& label : labels) EXPECT_LE(label.size(), 5u) << label;  // "2.5", not "2.5000000001"
  for (double y : plot.y_grid) {
    EXPECT_GE(y, plot.chart.y);
    EXPECT_LE(y, plot.chart.bottom());
  }
  const std::vector<std::string> steps = TextsOf(plot, "xtick");
  EXPECT_GE(steps.size(), 5u);
  EXPECT_EQ(steps.front(), "0");
  EXPECT_EQ(steps.back(), "100");
}

TEST(LayoutTest, LossTicksOfManyDecades) {
  RunSeries s;
  s.run.set_id("r1");
  for (int step = 0; step <= 100; ++step) {
    AddPoint(&s, step, std::pow(10.0, 6 - 0.12 * step));  // 1e6 down to 1e-6
  }
  LossPlot plot = LayOutLossPlot("t", {s}, {});
  ASSERT_EQ(LayoutProblems(plot), "");
  const std::vector<std::string> ticks = TextsOf(plot, "ytick");
  const std::set<std::string> labels(ticks.begin(), ticks.end());
  EXPECT_GE(labels.size(), 4u);
  EXPECT_TRUE(labels.count("1e-6") || labels.count("1e6") || labels.count("1")) << *labels.begin();
}

TEST(LayoutTest, LargeStepNumbersDoNotCollide) {
  RunSeries s;
  s.run.set_id("r1");
  for (int64_t step = 0; step <= 100; ++step) {
    AddPoint(&s, 123456789 + step * 98765, 3);
  }
  LossPlot plot = LayOutLossPlot("t", {s}, {});
  EXPECT_EQ(LayoutProblems(plot), "");
  EXPECT_GE(TextsOf(plot, "xtick").size(), 2u);
}

TEST(LayoutTest, ManyInterventionsAreNumberedUpToFortyAndTheRestCounted) {
  RunSeries s;
  s.run.set_id("r1");
  s.run.mutable_scheme()->set_name("mxfp4");
  std::vector<v1::Event> events;
  for (int step = 0; step < 600; ++step) {
    AddPoint(&s, step, 3 + (step % 7) * 0.1);
    if (step % 10 == 5)  // 60 switches back and forth, at close steps
      events.push_back(Event("r1", step, event_kind::kSwitchPrecision,
                             {{"precision", (step / 10) % 2 ? "mxfp4" : "bf16"}}));
  }
  LossPlot plot = LayOutLossPlot("t", {s}, events);
  ASSERT_EQ(LayoutProblems(plot), "");
  ASSERT_EQ(plot.markers.size(), 60u);
  EXPECT_EQ(plot.markers[39].number, 40);
  EXPECT_EQ(plot.markers[40].number, 0);
  EXPECT_EQ(plot.markers[40].tag_text, -1);
  bool counted = false;
  for (const PlotText& t : plot.texts) counted = counted || t.text.find("... and 20 more") == 0;
  EXPECT_TRUE(counted);
  EXPECT_EQ(plot.switches.size(), 60u);
}

TEST(LayoutTest, LongNamesAreCutToFitTheCanvas) {
  RunSeries s;
  s.run.set_id(std::string(300, 'r'));
  (*s.run.mutable_axes())["optimizer.lr"] = std::string(200, '9');
  AddPoint(&s, 0, 2);
  std::string title(500, 't');
  LossPlot plot = LayOutLossPlot(title, {s, s}, {});
  ASSERT_EQ(LayoutProblems(plot), "");
  for (const PlotText& t : plot.texts) {
    if (t.role == "legend" || t.role == "legend-cell" || t.role == "title") {
      EXPECT_EQ(t.text.substr(t.text.size() - 3), "...") << t.role;
    }
  }
}

TEST(LayoutTest, NonAsciiTextIsCutOnCharacterBoundaries) {
  RunSeries s;
  s.run.set_id("r1");
  (*s.run.mutable_axes())["note"] = std::string(100, 'x') + "\xc3\xa9\xc3\xa9\xc3\xa9";  // "ééé"
  for (int i = 0; i < 40; ++i) (*s.run.mutable_axes())["note"] += "\xe2\x82\xac";       // "€"
  LossPlot plot = LayOutLossPlot("t", {s}, {});
  ASSERT_EQ(LayoutProblems(plot), "");
  bool cut = false;
  for (const PlotText& t : plot.texts) {
    if (t.role != "legend-cell") continue;
    cut = true;
    EXPECT_EQ(t.text.substr(t.text.size() - 3), "...");
    // Valid UTF-8: no lead byte without its continuation bytes before "...".
    std::string body = t.text.substr(0, t.text.size() - 3);
    size_t i = 0;
    while (i < body.size()) {
      unsigned char c = static_cast<unsigned char>(body[i]);
      size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
      ASSERT_LE(i + length, body.size()) << t.text;
      i += length;
    }
  }
  EXPECT_TRUE(cut);
}

// A tiny XML well-formedness check: every tag closes in order, attributes are
// quoted, and the root is one <svg> element. Returns "" or the problem.
std::string CheckXml(const std::string& xml, std::map<std::string, int>* counts) {
  std::vector<std::string> stack;
  size_t i = 0;
  bool root_seen = false;
  while ((i = xml.find('<', i)) != std::string::npos) {
    size_t end = xml.find('>', i);
    if (end == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
      continue;
    }
    bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
    if (stack.empty()) {
      if (root_seen) return "second root element <" + name + ">";
      if (name != "svg") return "root is <" + name + ">";
      root_seen = true;
    }
    // Attributes: name="value" pairs only.
    std::string attrs = tag.substr(name.size());
    static const std::regex kAttrs(R"((\s+[A-Za-z_:][-A-Za-z0-9_:.]*="[^"<]*")*\s*)");
    if (!std::regex_match(attrs, kAttrs)) return "bad attributes in <" + name + ">";
    (*counts)[name]++;
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (!root_seen) return "no <svg>";
  return "";
}

TEST(CheckXmlTest, CatchesBrokenDocuments) {
  std::map<std::string, int> counts;
  EXPECT_EQ(CheckXml("<svg><g></svg>", &counts), "mismatched </svg>");
  EXPECT_EQ(CheckXml("<svg a=b/>", &counts), "bad attributes in <svg>");
  EXPECT_EQ(CheckXml("<svg><g></g>", &counts), "unclosed <svg>");
  EXPECT_EQ(CheckXml("<svg/><svg/>", &counts), "second root element <svg>");
  EXPECT_EQ(CheckXml("<svg x=\"1\"><g/></svg>", &counts), "");
}

std::vector<RunSeries> TwoRuns() {
  RunSeries a;
  a.run.set_id("r1<&>");  // escaped in attributes and text
  a.run.set_sweep_id("s1");
  a.run.mutable_scheme()->set_name("mxfp4");
  (*a.run.mutable_axes())["optimizer.lr"] = "6e-4";
  (*a.run.mutable_axes())["note"] = "x,y";
  for (int step : {0, 10}) {
    AddPoint(&a, step, step == 0 ? 4.0 : 2.5);
  }
  RunSeries b;
  b.run.set_id("r2");
  (*b.run.mutable_axes())["optimizer.lr"] = "1e-3";
  AddPoint(&b, 5, std::nan(""));
  return {a, b};
}

TEST(SvgTest, WellFormedWithPolylinesLegendMarkersAndSwitches) {
  std::vector<RunSeries> series = TwoRuns();
  std::vector<v1::Event> events = Rescue("r1<&>", 8, 4, "mxfp4", "bf16");
  events.push_back(Event("r1<&>", 0, event_kind::kState));  // not a marker
  LossPlot plot = LayOutLossPlot("sweep s1", series, events);
  ASSERT_EQ(LayoutProblems(plot), "");
  std::string svg = LossPlotSvg(plot);
  EXPECT_EQ(svg, RenderLossSvg("sweep s1", series, events));  // what keel plot writes

  std::map<std::string, int> counts;
  ASSERT_EQ(CheckXml(svg, &counts), "") << svg;
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"1000\" height=\"" +
                     std::to_string(plot.height) + "\" viewBox=\"0 0 1000 " + std::to_string(plot.height) + "\">"),
            std::string::npos);
  EXPECT_EQ(counts["polyline"], 1);  // r2's only point is NaN: a legend row, no line
  EXPECT_EQ(counts["svg"], 1);
  // One intervention: a dashed line at step 8 (where the rollback was decided),
  // its tag "1" and its list line.
  char x[32];
  std::snprintf(x, sizeof(x), "%.2f", plot.XOfStep(8));
  EXPECT_NE(svg.find("<g class=\"marker\" data-run=\"r1&lt;&amp;&gt;\" data-step=\"8\""), std::string::npos);
  EXPECT_NE(svg.find("<line x1=\"" + std::string(x) + "\""), std::string::npos) << x;
  EXPECT_NE(svg.find(">r1&lt;&amp;&gt; at step 8: rollback to 4, switch mxfp4 -&gt; bf16, scale_lr x0.01 (rule "
                     "loss-spike)<"),
            std::string::npos);
  // The switch: a shape on the line at step 4, and in the key.
  EXPECT_NE(svg.find("<path class=\"switch\" data-run=\"r1&lt;&amp;&gt;\" data-step=\"4\" data-scheme=\"bf16\""),
            std::string::npos);
  EXPECT_NE(svg.find(">precision switched to:<"), std::string::npos);
  // Legend: a header, then run id, axis values (or "-") and the switch.
  for (const char* cell : {">run<", ">note<", ">optimizer.lr<", ">precision switches<", ">r1&lt;&amp;&gt;<", ">x,y<",
                           ">6e-4<", ">-&gt; bf16 at 4<", ">r2<", ">-<", ">1e-3<"})
    EXPECT_NE(svg.find(cell), std::string::npos) << cell;
  EXPECT_EQ(svg.find("r1<&>"), std::string::npos);
}

TEST(SvgTest, LogScaleSkipsZeroNegativeAndNonFiniteLoss) {
  RunSeries s;
  s.run.set_id("r1");
  double losses[] = {10.0, 0.0, std::nan(""), -1.0, std::numeric_limits<double>::infinity(), 0.1};
  for (int i = 0; i < 6; ++i) {
    AddPoint(&s, i * 100, losses[i]);
  }
  LossPlot plot = LayOutLossPlot("t", {s}, {});
  ASSERT_EQ(LayoutProblems(plot), "");
  std::string svg = LossPlotSvg(plot);
  std::map<std::string, int> counts;
  ASSERT_EQ(CheckXml(svg, &counts), "");
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // Exactly the two good points remain on the polyline: loss 10 near the top,
  // 0.1 near the bottom, and the axis labels span them.
  EXPECT_EQ(plot.clipped_above, 0);  // the first point is the highest
  ASSERT_EQ(plot.lines[0].pieces.size(), 1u);
  const auto& points = plot.lines[0].pieces[0];
  ASSERT_EQ(points.size(), 2u);
  EXPECT_LT(points[0].second, plot.chart.y + 0.1 * plot.chart.height);
  EXPECT_GT(points[1].second, plot.chart.bottom() - 0.1 * plot.chart.height);
  std::smatch match;
  ASSERT_TRUE(std::regex_search(svg, match, std::regex("<polyline[^>]* points=\"([^\"]*)\"")));
  std::string svg_points = match[1];
  EXPECT_EQ(std::count(svg_points.begin(), svg_points.end(), ','), 2) << svg_points;
  EXPECT_NE(svg.find(">10<"), std::string::npos);
  EXPECT_NE(svg.find(">0.1<"), std::string::npos);
}

TEST(SvgTest, NoPlottablePointsAndNoRunsStillValid) {
  RunSeries s;
  s.run.set_id("r1");
  AddPoint(&s, 0, std::nan(""));
  for (const std::vector<RunSeries>& series : {std::vector<RunSeries>{s}, std::vector<RunSeries>{}}) {
    LossPlot plot = LayOutLossPlot("t", series, {});
    ASSERT_EQ(LayoutProblems(plot), "");
    EXPECT_EQ(plot.clipped_above, 0);
    std::string svg = LossPlotSvg(plot);
    std::map<std::string, int> counts;
    ASSERT_EQ(CheckXml(svg, &counts), "");
    EXPECT_EQ(counts["polyline"], 0);
    EXPECT_EQ(counts["path"], 0);
    EXPECT_EQ(svg.find("nan"), std::string::npos);
  }
}

}  // namespace
}  // namespace client
}  // namespace keel
