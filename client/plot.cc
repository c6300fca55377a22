// The loss-vs-step plot (see plot.h): interventions and precision changes from
// the events, the layout, then the SVG.
#include "client/plot.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "proto/event_kinds.h"

namespace keel {
namespace client {

// ---- Interventions and precision changes from the events ------------------------

namespace {

std::string Detail(const v1::Event& event, const char* key) {
  auto it = event.details().find(key);
  return it == event.details().end() ? std::string() : it->second;
}

// details[key] as an integer, or `fallback` when it is missing or not one.
int64_t DetailInt(const v1::Event& event, const char* key, int64_t fallback) {
  const std::string text = Detail(event, key);
  if (text.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && *end == '\0' ? value : fallback;
}

// What one event did, for the intervention's summary.
std::string ActionText(const v1::Event& event) {
  const std::string& kind = event.kind();
  if (kind == event_kind::kRollback) return "rollback to " + std::to_string(DetailInt(event, "to_step", event.step()));
  if (kind == event_kind::kSwitchPrecision) {
    const std::string from = Detail(event, "from"), to = Detail(event, "precision");
    if (to.empty()) return "switch precision";
    return "switch " + (from.empty() ? "to " : from + " -> ") + to;
  }
  if (kind == event_kind::kScaleLr) {
    const std::string factor = Detail(event, "factor");
    char* end = nullptr;
    double value = factor.empty() ? 0 : std::strtod(factor.c_str(), &end);
    return factor.empty() || *end != '\0' ? kind : kind + " x" + HumanNumber(value);
  }
  return kind;
}

}  // namespace

std::vector<PlotIntervention> PlotInterventions(const std::vector<v1::Event>& events) {
  struct Open {
    PlotIntervention item;
    int64_t end_step = 0;  // where the decision left the run: the next event of it starts here
    bool changes_trajectory = false;
    std::string rule;
  };
  std::vector<Open> all;
  std::map<std::string, size_t> open_of_run;  // run -> index in `all` of its newest decision
  for (const v1::Event& e : events) {
    if (!event_kind::IsIntervention(e.kind())) continue;
    const bool rollback = e.kind() == event_kind::kRollback;
    // See PlotIntervention::step: a rollback starts at from_step, not at its Event.step.
    const int64_t start = rollback ? DetailInt(e, "from_step", e.step()) : e.step();
    auto it = open_of_run.find(e.run_id());
    if (it == open_of_run.end() || all[it->second].end_step != start) {
      Open fresh;
      fresh.item.run_id = e.run_id();
      fresh.item.step = start;
      all.push_back(fresh);
      open_of_run[e.run_id()] = all.size() - 1;
      it = open_of_run.find(e.run_id());
    }
    Open& o = all[it->second];
    o.item.summary += (o.item.summary.empty() ? "" : ", ") + ActionText(e);
    if (rollback) o.item.resumed_step = e.step();
    if (e.kind() == event_kind::kSwitchPrecision && !Detail(e, "precision").empty())
      o.item.precision = Detail(e, "precision");
    if (o.rule.empty()) o.rule = Detail(e, "rule");
    o.changes_trajectory = o.changes_trajectory || event_kind::ChangesTrajectory(e.kind());
    o.end_step = e.step();
  }
  std::vector<PlotIntervention> out;
  for (Open& o : all) {
    if (!o.changes_trajectory) continue;
    if (!o.rule.empty()) o.item.summary += " (rule " + o.rule + ")";
    out.push_back(std::move(o.item));
  }
  return out;
}

std::vector<PrecisionChange> PrecisionChanges(const v1::Run& run, const std::vector<v1::Event>& events) {
  std::vector<PrecisionChange> out;
  std::string current = run.scheme().name();
  for (const v1::Event& e : events) {
    if (e.run_id() != run.id()) continue;
    const std::string to = Detail(e, "precision");
    if (to.empty()) continue;
    int64_t step;
    if (e.kind() == event_kind::kSwitchPrecision) {
      step = e.step();
    } else if (e.kind() == event_kind::kRollback) {
      step = DetailInt(e, "to_step", e.step());
    } else {
      continue;
    }
    std::string from = Detail(e, "from");
    if (from.empty()) from = current;
    if (to != from) out.push_back({step, from, to});
    current = to;
  }
  return out;
}

// ---- Layout ---------------------------------------------------------------------

bool Box::Overlaps(const Box& o) const {
  return x < o.right() && o.x < right() && y < o.bottom() && o.y < bottom();
}

bool Box::Contains(const Box& o) const {
  return o.x >= x && o.y >= y && o.right() <= right() && o.bottom() <= bottom();
}

double LossPlot::XOfStep(double step) const {
  return chart.x + (step - static_cast<double>(min_step)) / static_cast<double>(max_step - min_step) * chart.width;
}

double LossPlot::YOfLoss(double loss) const {
  return chart.bottom() - (std::log10(loss) - min_log_loss) / (max_log_loss - min_log_loss) * chart.height;
}

namespace {

constexpr int kCanvasWidth = 1000;
constexpr double kMargin = 16;
constexpr double kChartHeight = 400;
constexpr double kFont = 11;       // ticks, legend, key, list, tags
constexpr double kTitleFont = 14;
// Vertical extent of a line of text around its baseline, in em: DejaVu Sans
// Mono's tallest glyphs reach 0.76 em up and 0.24 em down; rounded out.
constexpr double kAscentEm = 0.85, kDescentEm = 0.3;
constexpr double kRowPitch = 1.5 * kFont;  // legend and list rows
constexpr double kTagPad = 4;
constexpr double kTagGap = 3;
constexpr int kMaxNumbered = 40;        // interventions with a tag and a list line; the rest get the line only
constexpr size_t kMaxLegendCell = 48;  // characters of a legend cell at most
constexpr double kSwatchWidth = 28;
constexpr double kShapeRadius = 4;

// tab10: ten colours told apart by most readers; the dash pattern changes with
// every ten runs, so that up to 40 runs have a style each.
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
const char* const kDashes[] = {"", "7,3", "2,2", "9,3,2,3"};
constexpr int kDashCount = sizeof(kDashes) / sizeof(kDashes[0]);
constexpr int kShapeCount = 6;  // see ShapePath

bool Plottable(const v1::MetricPoint& p) { return std::isfinite(p.loss()) && p.loss() > 0; }

// Character cells of UTF-8 text: one per ASCII character, two per other code
// point (a glyph from a fallback font may be wider than the monospace cell).
size_t Columns(const std::string& text) {
  size_t columns = 0;
  for (unsigned char c : text) {
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    columns += c < 0x80 ? 1 : 2;
  }
  return columns;
}

double TextWidth(const std::string& text, double size) {
  return static_cast<double>(Columns(text)) * kCharWidthEm * size;
}

// `text` cut to at most `columns` cells, ending in "..." when cut; never splits
// a UTF-8 sequence.
std::string Truncate(const std::string& text, size_t columns) {
  if (Columns(text) <= columns) return text;
  if (columns <= 3) return std::string("...").substr(0, columns);
  std::string out;
  size_t used = 0;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    size_t cells = c < 0x80 ? 1 : 2;
    if (used + cells > columns - 3) break;
    out.append(text, i, length);
    used += cells;
    i += length;
  }
  return out + "...";
}

PlotText MakeText(const std::string& role, const std::string& text, double x, double y, double size,
                  TextAnchor anchor = TextAnchor::kStart) {
  PlotText t{role, text, x, y, size, anchor};
  const double width = TextWidth(text, size);
  const double left = anchor == TextAnchor::kStart ? x : anchor == TextAnchor::kMiddle ? x - width / 2 : x - width;
  t.box = {left, y - kAscentEm * size, width, (kAscentEm + kDescentEm) * size};
  return t;
}

// A numbered tag: the number in a frame, its top-left corner at (x, y).
PlotText MakeTag(int number, double x, double y, const std::string& color) {
  const std::string text = std::to_string(number);
  const double width = TextWidth(text, kFont) + 2 * kTagPad;
  const double height = (kAscentEm + kDescentEm) * kFont + 2;
  PlotText t = MakeText("tag", text, x + width / 2, y + 1 + kAscentEm * kFont, kFont, TextAnchor::kMiddle);
  t.box = {x, y, width, height};
  t.frame = color;
  return t;
}

double TagWidth(int number) { return TextWidth(std::to_string(number), kFont) + 2 * kTagPad; }
double TagHeight() { return (kAscentEm + kDescentEm) * kFont + 2; }

// The least m x 10^k >= value, m in 1..9 (value > 0).
double RoundUp(double value) {
  const double power = std::pow(10.0, std::floor(std::log10(value)));
  return std::ceil(value / power * (1 - 1e-12)) * power;
}

// 1, 2 or 5 times a power of ten, >= raw.
double NiceStep(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * power;
}

// The densest set of loss ticks in [10^lo, 10^hi] whose neighbours are at
// least `min_gap` pixels apart on a `height`-pixel log axis: decades (every
// 1st, 2nd, 5th, ... for a long range), 1-2-5 up to 1..9 per decade, or evenly
// spaced values for a range of less than a decade.
std::vector<double> LossTicks(double lo, double hi, double height, double min_gap) {
  std::vector<std::vector<double>> candidates;
  for (double stride : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) {
    std::vector<double> ticks;
    for (double k = std::ceil(lo / stride) * stride; k <= hi; k += stride) ticks.push_back(std::pow(10.0, k));
    candidates.push_back(ticks);
  }
  for (const std::vector<int>& mantissas :
       {std::vector<int>{1, 2, 5}, std::vector<int>{1, 2, 3, 5}, std::vector<int>{1, 2, 3, 4, 5, 6, 8},
        std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    std::vector<double> ticks;
    for (double k = std::floor(lo); k <= std::ceil(hi); k += 1) {
      for (int m : mantissas) {
        double log_value = std::log10(m) + k;
        if (log_value >= lo && log_value <= hi) ticks.push_back(m * std::pow(10.0, k));
      }
    }
    candidates.push_back(ticks);
  }
  const double v_lo = std::pow(10.0, lo), v_hi = std::pow(10.0, hi);
  // Evenly spaced values only within a decade: over more, they crowd the top
  // of a log axis and leave its bottom bare.
  for (int n = 10; n >= 2 && hi - lo < 1; --n) {
    const double step = NiceStep((v_hi - v_lo) / n);
    std::vector<double> ticks;
    for (double k = std::ceil(v_lo / step); k * step <= v_hi; k += 1) {
      if (k >= 1) ticks.push_back(k * step);
    }
    candidates.push_back(ticks);
  }
  const double pixels_per_decade = height / (hi - lo);
  const std::vector<double>* best = nullptr;
  for (const auto& ticks : candidates) {
    if (ticks.size() < 2 || ticks.size() > 12) continue;
    bool spaced = true;
    for (size_t i = 1; i < ticks.size(); ++i)
      spaced = spaced && (std::log10(ticks[i]) - std::log10(ticks[i - 1])) * pixels_per_decade >= min_gap;
    if (spaced && (best == nullptr || ticks.size() > best->size())) best = &ticks;
  }
  if (best != nullptr) return *best;
  return {v_lo, v_hi};  // a range too narrow for round values: its two ends
}

// Step ticks: the densest multiples of a 1-2-5 step whose labels keep at
// least `gap` pixels apart and stay within [left_limit, right_limit].
std::vector<int64_t> StepTicks(const LossPlot& plot, double gap, double left_limit, double right_limit) {
  const double range = static_cast<double>(plot.max_step - plot.min_step);
  for (int n = 12; n >= 1; --n) {
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(NiceStep(range / n)));
    std::vector<int64_t> ticks;
    int64_t first = plot.min_step >= 0 ? (plot.min_step + step - 1) / step * step : plot.min_step / step * step;
    for (int64_t t = first; t <= plot.max_step; t += step) ticks.push_back(t);
    bool fits = !ticks.empty();
    for (size_t i = 0; fits && i < ticks.size(); ++i) {
      const double x = plot.XOfStep(static_cast<double>(ticks[i]));
      const double half = TextWidth(std::to_string(ticks[i]), kFont) / 2;
      fits = x - half >= left_limit && x + half <= right_limit;
      if (i > 0) {
        const double prev_x = plot.XOfStep(static_cast<double>(ticks[i - 1]));
        const double prev_half = TextWidth(std::to_string(ticks[i - 1]), kFont) / 2;
        fits = fits && (x - half) - (prev_x + prev_half) >= gap;
      }
    }
    if (fits) return ticks;
  }
  return {plot.min_step};
}

// Left edges for tags of `widths` wanted centred at `centres` (ascending),
// kept in order, kTagGap apart and within [lo, hi]. False when they do not fit.
bool PackRow(const std::vector<double>& centres, const std::vector<double>& widths, double lo, double hi,
             std::vector<double>* lefts) {
  const size_t n = centres.size();
  lefts->assign(n, 0);
  double edge = lo;
  for (size_t i = 0; i < n; ++i) {
    (*lefts)[i] = std::max(centres[i] - widths[i] / 2, edge);
    edge = (*lefts)[i] + widths[i] + kTagGap;
  }
  edge = hi;
  for (size_t i = n; i-- > 0;) {
    (*lefts)[i] = std::min((*lefts)[i], edge - widths[i]);
    edge = (*lefts)[i] - kTagGap;
  }
  return n == 0 || (*lefts)[0] >= lo;
}

// The parts of a line (pixel points) on or below y = top, in order; where the
// line crosses y = top a part ends or starts at the crossing.
std::vector<std::vector<std::pair<double, double>>> CutAtTop(const std::vector<std::pair<double, double>>& points,
                                                             double top) {
  std::vector<std::vector<std::pair<double, double>>> pieces;
  std::vector<std::pair<double, double>> piece;
  for (size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    const bool inside = p.second >= top;
    if (i > 0 && inside != (points[i - 1].second >= top)) {
      const auto& q = points[i - 1];
      const double t = (top - q.second) / (p.second - q.second);
      piece.push_back({q.first + t * (p.first - q.first), top});
      if (!inside) {
        pieces.push_back(piece);
        piece.clear();
      }
    }
    if (inside) piece.push_back(p);
  }
  if (!piece.empty()) pieces.push_back(piece);
  return pieces;
}

// Interpolated pixel y of a line at pixel x (its end's y outside its range).
bool LineYAt(const std::vector<std::pair<double, double>>& points, double x, double* y) {
  if (points.empty()) return false;
  if (x <= points.front().first) {
    *y = points.front().second;
    return true;
  }
  for (size_t i = 1; i < points.size(); ++i) {
    if (x <= points[i].first) {
      const auto& a = points[i - 1];
      const auto& b = points[i];
      const double t = b.first > a.first ? (x - a.first) / (b.first - a.first) : 1;
      *y = a.second + t * (b.second - a.second);
      return true;
    }
  }
  *y = points.back().second;
  return true;
}

}  // namespace

LossPlot LayOutLossPlot(const std::string& title, const std::vector<RunSeries>& series,
                        const std::vector<v1::Event>& events) {
  LossPlot plot;
  plot.width = kCanvasWidth;
  const double usable = kCanvasWidth - 2 * kMargin;

  const std::vector<PlotIntervention> interventions = PlotInterventions(events);
  std::vector<std::vector<PrecisionChange>> changes;
  for (const auto& s : series) changes.push_back(PrecisionChanges(s.run, events));

  // Data ranges: plottable points, and the steps of interventions and switches.
  bool any_step = false, any_loss = false;
  double lo = 0, hi = 0, start_hi = 0;
  auto take_step = [&](int64_t step) {
    plot.min_step = any_step ? std::min(plot.min_step, step) : step;
    plot.max_step = any_step ? std::max(plot.max_step, step) : step;
    any_step = true;
  };
  for (const auto& s : series) {
    bool first = true;
    for (const auto& p : s.points) {
      if (!Plottable(p)) continue;
      take_step(p.step());
      const double l = std::log10(p.loss());
      if (first) start_hi = any_loss ? std::max(start_hi, l) : l;
      first = false;
      lo = any_loss ? std::min(lo, l) : l;
      hi = any_loss ? std::max(hi, l) : l;
      any_loss = true;
    }
  }
  std::map<std::string, size_t> index_of_run;  // in `series`: its colour, style and legend row
  for (size_t i = 0; i < series.size(); ++i) index_of_run[series[i].run.id()] = i;
  for (const auto& i : interventions) {
    if (!index_of_run.count(i.run_id)) continue;
    take_step(i.step);
    if (i.resumed_step >= 0) take_step(i.resumed_step);
  }
  for (const auto& run_changes : changes)
    for (const auto& c : run_changes) take_step(c.step);
  if (!any_step) plot.min_step = 0;
  if (plot.max_step <= plot.min_step) plot.max_step = plot.min_step + 1;
  if (!any_loss) {
    lo = 0;
    hi = 1;
  }
  // A run that blows up (loss 10^4 and more, just before it turns NaN) would
  // squeeze every other curve into the chart's bottom edge: the axis ends at
  // three times the highest starting loss, rounded up to a round number
  // (1..9 x 10^k), and a line above that leaves through the top.
  const double cut = std::log10(RoundUp(3 * std::pow(10.0, start_hi)));
  if (any_loss && hi > cut) {
    hi = cut;
    plot.clipped_above = std::pow(10.0, cut);
  }
  // A little room above and below the data.
  const double pad = std::max(0.02, 0.04 * (hi - lo));
  plot.min_log_loss = lo - pad;
  plot.max_log_loss = hi + pad;

  // Loss ticks first: their labels' width sets the chart's left edge.
  const double text_height = (kAscentEm + kDescentEm) * kFont;
  const std::vector<double> loss_ticks =
      LossTicks(plot.min_log_loss, plot.max_log_loss, kChartHeight, text_height + 6);
  double label_width = 0;
  for (double v : loss_ticks) label_width = std::max(label_width, TextWidth(HumanNumber(v), kFont));
  const double axis_title_column = text_height + 10;  // the turned "loss (log scale)"
  plot.chart.x = kMargin + axis_title_column + label_width + 6;
  plot.chart.width = kCanvasWidth - kMargin - 24 - plot.chart.x;
  plot.chart.height = kChartHeight;

  // Markers (events of runs not plotted are left out); then the tag band,
  // whose height sets the chart's top.
  for (const auto& i : interventions) {
    auto run = index_of_run.find(i.run_id);
    if (run == index_of_run.end()) continue;
    PlotMarker m;
    m.intervention = i;
    m.color = kPalette[run->second % kPaletteSize];
    m.x = plot.XOfStep(static_cast<double>(i.step));
    m.number = plot.markers.size() < static_cast<size_t>(kMaxNumbered) ? static_cast<int>(plot.markers.size()) + 1 : 0;
    plot.markers.push_back(m);
  }
  // Tags in rows above the chart, in the order of their x; with more than one
  // row, neighbours alternate rows. As many rows as it takes to fit them all.
  std::vector<size_t> numbered;
  for (size_t i = 0; i < plot.markers.size(); ++i)
    if (plot.markers[i].number > 0) numbered.push_back(i);
  std::stable_sort(numbered.begin(), numbered.end(),
                   [&](size_t a, size_t b) { return plot.markers[a].x < plot.markers[b].x; });
  const double band_lo = plot.chart.x - 12, band_hi = kCanvasWidth - kMargin;
  size_t rows = 0;
  std::vector<std::vector<size_t>> row_members;
  std::vector<std::vector<double>> row_lefts;
  while (!numbered.empty()) {
    ++rows;
    row_members.assign(rows, {});
    row_lefts.assign(rows, {});
    for (size_t k = 0; k < numbered.size(); ++k) row_members[k % rows].push_back(numbered[k]);
    bool fits = true;
    for (size_t r = 0; r < rows && fits; ++r) {
      std::vector<double> centres, widths;
      for (size_t i : row_members[r]) {
        centres.push_back(plot.markers[i].x);
        widths.push_back(TagWidth(plot.markers[i].number));
      }
      fits = PackRow(centres, widths, band_lo, band_hi, &row_lefts[r]);
    }
    if (fits) break;
  }
  const double title_baseline = kMargin + kAscentEm * kTitleFont;
  const double band_top = title_baseline + kDescentEm * kTitleFont + 10;
  const double tag_pitch = TagHeight() + 4;
  // Room under the lowest row for the leaders to run down to the chart.
  const double leader_room = 16;
  plot.chart.y = band_top + static_cast<double>(rows) * tag_pitch + (rows > 0 ? leader_room : 0);

  // Title.
  plot.texts.push_back(MakeText("title", Truncate(title, static_cast<size_t>(usable / (kCharWidthEm * kTitleFont))),
                                kMargin, title_baseline, kTitleFont));

  // Tags: row 0 sits just above the chart.
  for (size_t r = 0; r < rows; ++r) {
    const double y = plot.chart.y - leader_room - TagHeight() - static_cast<double>(r) * tag_pitch;
    for (size_t k = 0; k < row_members[r].size(); ++k) {
      PlotMarker& m = plot.markers[row_members[r][k]];
      m.tag_text = static_cast<int>(plot.texts.size());
      plot.texts.push_back(MakeTag(m.number, row_lefts[r][k], y, m.color));
    }
  }

  // Axes: loss ticks, step ticks, titles.
  for (double v : loss_ticks) {
    const double y = plot.YOfLoss(v);
    plot.y_grid.push_back(y);
    plot.texts.push_back(MakeText("ytick", HumanNumber(v), plot.chart.x - 6, y + 0.3 * kFont, kFont, TextAnchor::kEnd));
  }
  const double tick_baseline = plot.chart.bottom() + 8 + kAscentEm * kFont;
  for (int64_t step : StepTicks(plot, 12, kMargin, kCanvasWidth - kMargin)) {
    const double x = plot.XOfStep(static_cast<double>(step));
    plot.x_grid.push_back(x);
    plot.texts.push_back(MakeText("xtick", std::to_string(step), x, tick_baseline, kFont, TextAnchor::kMiddle));
  }
  const double step_title_baseline = tick_baseline + kRowPitch;
  plot.texts.push_back(MakeText("axis", "step", plot.chart.x + plot.chart.width / 2, step_title_baseline, kFont,
                                TextAnchor::kMiddle));
  {
    const std::string name = plot.clipped_above > 0
                                 ? "loss (log scale; cut above " + HumanNumber(plot.clipped_above) + ")"
                                 : "loss (log scale)";
    PlotText t = MakeText("axis", name, kMargin + kAscentEm * kFont, plot.chart.y + kChartHeight / 2,
                          kFont, TextAnchor::kMiddle);
    t.vertical = true;
    const double length = TextWidth(t.text, kFont);
    t.box = {kMargin, t.y - length / 2, text_height, length};
    plot.texts.push_back(t);
  }

  // Lines, and a shape where a run's precision changed: one shape per scheme,
  // in the order the schemes first appear.
  std::map<std::string, int> shape_of_scheme;
  std::vector<std::string> schemes;
  for (size_t i = 0; i < series.size(); ++i) {
    PlotLine line;
    line.run_id = series[i].run.id();
    line.color = kPalette[i % kPaletteSize];
    line.dash = kDashes[(i / kPaletteSize) % kDashCount];
    std::vector<std::pair<double, double>> points;
    for (const auto& p : series[i].points) {
      if (!Plottable(p)) continue;
      points.push_back({plot.XOfStep(static_cast<double>(p.step())), plot.YOfLoss(p.loss())});
    }
    line.pieces = CutAtTop(points, plot.chart.y);
    for (const auto& c : changes[i]) {
      if (!shape_of_scheme.count(c.to)) {
        shape_of_scheme[c.to] = static_cast<int>(schemes.size()) % kShapeCount;
        schemes.push_back(c.to);
      }
      PlotShape s;
      s.run_id = line.run_id;
      s.scheme = c.to;
      s.step = c.step;
      s.shape = shape_of_scheme[c.to];
      s.x = plot.XOfStep(static_cast<double>(c.step));
      s.fill = line.color;
      if (!LineYAt(points, s.x, &s.y)) continue;
      s.y = std::max(s.y, plot.chart.y);  // on the top edge where the line is cut
      plot.switches.push_back(s);
    }
    plot.lines.push_back(line);
  }

  // Below the chart: the shape key, the legend, the numbered interventions.
  double y = step_title_baseline + kDescentEm * kFont + 14;
  if (!schemes.empty()) {
    const std::string lead = "precision switched to:";
    double baseline = y + kAscentEm * kFont;
    plot.texts.push_back(MakeText("key", lead, kMargin, baseline, kFont));
    double x = kMargin + TextWidth(lead, kFont) + 12;
    for (const std::string& scheme : schemes) {
      const std::string name = Truncate(scheme, 40);
      const double entry = 2 * kShapeRadius + 5 + TextWidth(name, kFont);
      if (x + entry > kCanvasWidth - kMargin) {
        x = kMargin;
        baseline += kRowPitch;
      }
      PlotShape s;
      s.scheme = scheme;
      s.shape = shape_of_scheme[scheme];
      s.x = x + kShapeRadius;
      s.y = baseline - 0.3 * kFont;
      s.fill = "#ffffff";
      plot.key.push_back(s);
      plot.texts.push_back(MakeText("key", name, x + 2 * kShapeRadius + 5, baseline, kFont));
      x += entry + 16;
    }
    y = baseline + kDescentEm * kFont + 10;
  }

  if (!series.empty()) {
    // A table: a header (run, each axis, precision switches) and a row per
    // run, cells aligned; several such tables side by side when they fit.
    const std::vector<std::string> axes = AxisNames(series);
    bool any_change = false;
    for (const auto& run_changes : changes) any_change = any_change || !run_changes.empty();
    bool any_state = false;
    for (const auto& s : series) any_state = any_state || s.run.state() != v1::RUN_STATE_UNSPECIFIED;
    std::vector<std::string> header = {"run"};
    if (any_state) header.push_back("state");
    header.insert(header.end(), axes.begin(), axes.end());
    if (any_change) header.push_back("precision switches");
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < series.size(); ++i) {
      std::vector<std::string> row = {series[i].run.id()};
      if (any_state) row.push_back(StateName(series[i].run.state()));
      for (const std::string& axis : axes) {
        auto it = series[i].run.axes().find(axis);
        row.push_back(it == series[i].run.axes().end() ? "-" : it->second);
      }
      if (any_change) {
        std::string text;
        for (const auto& c : changes[i])
          text += (text.empty() ? "-> " : ", -> ") + c.to + " at " + std::to_string(c.step);
        row.push_back(text);
      }
      rows.push_back(row);
    }
    // Column widths in characters; while the table is wider than the canvas,
    // the widest column gives up characters (cells cut with "...").
    const size_t cells = header.size();
    std::vector<size_t> widths(cells, 0);
    for (size_t k = 0; k < cells; ++k) {
      widths[k] = std::min(kMaxLegendCell, Columns(header[k]));
      for (const auto& row : rows) widths[k] = std::max(widths[k], std::min(kMaxLegendCell, Columns(row[k])));
    }
    const double cell_gap = 2 * kCharWidthEm * kFont;
    auto table_width = [&] {
      double chars = 0;
      for (size_t w : widths) chars += static_cast<double>(w);
      return kSwatchWidth + 6 + chars * kCharWidthEm * kFont + static_cast<double>(cells - 1) * cell_gap;
    };
    while (table_width() > usable) {
      size_t& widest = *std::max_element(widths.begin(), widths.end());
      if (widest <= 6) break;
      --widest;
    }
    const double table_gap = 24;
    const size_t tables = std::max<size_t>(1, static_cast<size_t>((usable + table_gap) / (table_width() + table_gap)));
    const size_t per_table = (series.size() + tables - 1) / tables;
    auto put_row = [&](const std::vector<std::string>& row, double x, double baseline, const char* first_role,
                       const char* role) {
      double cell_x = x + kSwatchWidth + 6;
      for (size_t k = 0; k < cells; ++k) {
        const std::string text = Truncate(row[k], widths[k]);
        if (!text.empty()) plot.texts.push_back(MakeText(k == 0 ? first_role : role, text, cell_x, baseline, kFont));
        cell_x += static_cast<double>(widths[k]) * kCharWidthEm * kFont + cell_gap;
      }
    };
    // Column-major: runs read down, then across, in sweep order.
    for (size_t table = 0; table * per_table < series.size(); ++table) {
      const double x = kMargin + static_cast<double>(table) * (table_width() + table_gap);
      put_row(header, x, y + kAscentEm * kFont, "legend-head", "legend-head");
    }
    for (size_t i = 0; i < series.size(); ++i) {
      const double x = kMargin + static_cast<double>(i / per_table) * (table_width() + table_gap);
      const double baseline = y + kAscentEm * kFont + static_cast<double>(i % per_table + 1) * kRowPitch;
      PlotLine& line = plot.lines[i];
      line.swatch_x = x;
      // On a whole pixel: a 3-unit-wide swatch then fully covers the pixel row
      // below it, whose colour a test can read exactly.
      line.swatch_y = std::round(baseline - 0.3 * kFont);
      line.swatch_width = kSwatchWidth;
      put_row(rows[i], x, baseline, "legend", "legend-cell");
    }
    y += static_cast<double>(per_table + 1) * kRowPitch + 10;
  }

  if (!plot.markers.empty()) {
    double baseline = y + kAscentEm * kFont;
    plot.texts.push_back(MakeText(
        "list", "interventions, numbered above the chart at the step where each was decided:", kMargin, baseline,
        kFont));
    size_t unnumbered = 0;
    const double tag_column = TagWidth(kMaxNumbered) + 6;
    const size_t fit = static_cast<size_t>((usable - tag_column) / (kCharWidthEm * kFont));
    for (const PlotMarker& m : plot.markers) {
      if (m.number == 0) {
        ++unnumbered;
        continue;
      }
      baseline += kRowPitch;
      const double tag_top = baseline - kAscentEm * kFont - 1;
      plot.texts.push_back(MakeTag(m.number, kMargin, tag_top, m.color));
      const PlotIntervention& i = m.intervention;
      const std::string line = i.run_id + " at step " + std::to_string(i.step) + ": " + i.summary;
      plot.texts.push_back(MakeText("list", Truncate(line, fit), kMargin + tag_column, baseline, kFont));
    }
    if (unnumbered > 0) {
      baseline += kRowPitch;
      plot.texts.push_back(MakeText("list",
                                    "... and " + std::to_string(unnumbered) +
                                        " more, drawn as lines only (keel show RUN lists a run's events)",
                                    kMargin, baseline, kFont));
    }
    y = baseline + kDescentEm * kFont + 2;
  }
  plot.height = static_cast<int>(std::ceil(std::max(y, plot.chart.bottom() + 60) + kMargin));
  return plot;
}

// ---- SVG ------------------------------------------------------------------------

namespace {

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids most control characters even escaped.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

// Coordinates with two decimals: enough for a screen, never NaN (the layout
// makes finite values only).
std::string Coord(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f", v);
  return buffer;
}

// One of kShapeCount shapes of radius r centred at (x, y), as path data.
std::string ShapePath(int shape, double x, double y, double r) {
  auto p = [](double px, double py) { return Coord(px) + "," + Coord(py); };
  switch (shape % kShapeCount) {
    case 0:  // circle
      return "M" + p(x - r, y) + " A" + Coord(r) + "," + Coord(r) + " 0 1,0 " + p(x + r, y) + " A" + Coord(r) + "," +
             Coord(r) + " 0 1,0 " + p(x - r, y) + " Z";
    case 1:  // square
      r *= 0.85;
      return "M" + p(x - r, y - r) + " L" + p(x + r, y - r) + " L" + p(x + r, y + r) + " L" + p(x - r, y + r) + " Z";
    case 2:  // triangle, point up
      return "M" + p(x, y - r * 1.15) + " L" + p(x + r, y + r * 0.75) + " L" + p(x - r, y + r * 0.75) + " Z";
    case 3:  // diamond
      r *= 1.15;
      return "M" + p(x, y - r) + " L" + p(x + r, y) + " L" + p(x, y + r) + " L" + p(x - r, y) + " Z";
    case 4:  // triangle, point down
      return "M" + p(x, y + r * 1.15) + " L" + p(x + r, y - r * 0.75) + " L" + p(x - r, y - r * 0.75) + " Z";
    default: {  // plus
      const double a = r, b = r * 0.38;
      return "M" + p(x - b, y - a) + " L" + p(x + b, y - a) + " L" + p(x + b, y - b) + " L" + p(x + a, y - b) + " L" +
             p(x + a, y + b) + " L" + p(x + b, y + b) + " L" + p(x + b, y + a) + " L" + p(x - b, y + a) + " L" +
             p(x - b, y + b) + " L" + p(x - a, y + b) + " L" + p(x - a, y - b) + " L" + p(x - b, y - b) + " Z";
    }
  }
}

void WriteText(const PlotText& t, std::ostringstream& svg) {
  if (!t.frame.empty()) {
    svg << "<rect x=\"" << Coord(t.box.x) << "\" y=\"" << Coord(t.box.y) << "\" width=\"" << Coord(t.box.width)
        << "\" height=\"" << Coord(t.box.height) << "\" rx=\"3\" fill=\"white\" stroke=\"" << t.frame
        << "\" stroke-width=\"1.5\"/>\n";
  }
  const char* anchor = t.anchor == TextAnchor::kStart ? "start" : t.anchor == TextAnchor::kMiddle ? "middle" : "end";
  svg << "<text class=\"" << t.role << "\" x=\"" << Coord(t.x) << "\" y=\"" << Coord(t.y) << "\" font-size=\""
      << Coord(t.size) << "\"";
  if (t.anchor != TextAnchor::kStart) svg << " text-anchor=\"" << anchor << "\"";
  if (t.vertical) svg << " transform=\"rotate(-90 " << Coord(t.x) << " " << Coord(t.y) << ")\"";
  svg << ">" << XmlEscape(t.text) << "</text>\n";
}

}  // namespace

std::string LossPlotSvg(const LossPlot& plot) {
  const Box& c = plot.chart;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << plot.width << "\" height=\""
      << plot.height << "\" viewBox=\"0 0 " << plot.width << " " << plot.height << "\">\n";
  for (const PlotText& t : plot.texts) {
    if (t.role == "title") svg << "<title>" << XmlEscape(t.text) << "</title>\n";
  }
  svg << "<rect x=\"0\" y=\"0\" width=\"" << plot.width << "\" height=\"" << plot.height << "\" fill=\"white\"/>\n";

  // Grid and frame.
  svg << "<g class=\"grid\" stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double y : plot.y_grid)
    svg << "<line x1=\"" << Coord(c.x) << "\" y1=\"" << Coord(y) << "\" x2=\"" << Coord(c.right()) << "\" y2=\""
        << Coord(y) << "\"/>\n";
  for (double x : plot.x_grid)
    svg << "<line x1=\"" << Coord(x) << "\" y1=\"" << Coord(c.y) << "\" x2=\"" << Coord(x) << "\" y2=\""
        << Coord(c.bottom()) << "\"/>\n";
  svg << "</g>\n";

  // Interventions: a dashed line through the chart and a leader up to the tag
  // (drawn before the tags, whose white fill covers a leader that crosses one).
  for (const PlotMarker& m : plot.markers) {
    svg << "<g class=\"marker\" data-run=\"" << XmlEscape(m.intervention.run_id) << "\" data-step=\""
        << m.intervention.step << "\" stroke=\"" << m.color << "\" stroke-width=\"1.2\">\n"
        << "<line x1=\"" << Coord(m.x) << "\" y1=\"" << Coord(c.y) << "\" x2=\"" << Coord(m.x) << "\" y2=\""
        << Coord(c.bottom()) << "\" stroke-dasharray=\"5,4\" stroke-opacity=\"0.75\"/>\n";
    if (m.tag_text >= 0) {
      const Box& tag = plot.texts[static_cast<size_t>(m.tag_text)].box;
      svg << "<line x1=\"" << Coord(tag.x + tag.width / 2) << "\" y1=\"" << Coord(tag.bottom()) << "\" x2=\""
          << Coord(m.x) << "\" y2=\"" << Coord(c.y) << "\"/>\n";
    }
    svg << "</g>\n";
  }

  // Runs.
  for (const PlotLine& line : plot.lines) {
    for (const auto& piece : line.pieces) {
      std::string points;
      for (const auto& p : piece) {
        if (!points.empty()) points += " ";
        points += Coord(p.first) + "," + Coord(p.second);
      }
      svg << "<polyline class=\"run\" data-run=\"" << XmlEscape(line.run_id) << "\" fill=\"none\" stroke=\""
          << line.color << "\" stroke-width=\"1.6\" stroke-linejoin=\"round\"";
      if (!line.dash.empty()) svg << " stroke-dasharray=\"" << line.dash << "\"";
      svg << " points=\"" << points << "\"/>\n";
    }
  }
  for (const PlotShape& s : plot.switches) {
    svg << "<path class=\"switch\" data-run=\"" << XmlEscape(s.run_id) << "\" data-step=\"" << s.step
        << "\" data-scheme=\"" << XmlEscape(s.scheme) << "\" d=\"" << ShapePath(s.shape, s.x, s.y, kShapeRadius)
        << "\" fill=\"" << s.fill << "\" stroke=\"black\" stroke-width=\"1\"/>\n";
  }
  svg << "<rect x=\"" << Coord(c.x) << "\" y=\"" << Coord(c.y) << "\" width=\"" << Coord(c.width) << "\" height=\""
      << Coord(c.height) << "\" fill=\"none\" stroke=\"black\"/>\n";

  // Key shapes and legend swatches.
  for (const PlotShape& s : plot.key) {
    svg << "<path class=\"key\" d=\"" << ShapePath(s.shape, s.x, s.y, kShapeRadius) << "\" fill=\"" << s.fill
        << "\" stroke=\"black\" stroke-width=\"1\"/>\n";
  }
  for (const PlotLine& line : plot.lines) {
    if (line.swatch_width <= 0) continue;
    svg << "<line class=\"swatch\" data-run=\"" << XmlEscape(line.run_id) << "\" x1=\"" << Coord(line.swatch_x)
        << "\" y1=\"" << Coord(line.swatch_y) << "\" x2=\"" << Coord(line.swatch_x + line.swatch_width) << "\" y2=\""
        << Coord(line.swatch_y) << "\" stroke=\"" << line.color << "\" stroke-width=\"3\"";
    if (!line.dash.empty()) svg << " stroke-dasharray=\"" << line.dash << "\"";
    svg << "/>\n";
  }

  // Every text (tags with their frames).
  svg << "<g font-family=\"DejaVu Sans Mono, monospace\" fill=\"black\">\n";
  for (const PlotText& t : plot.texts) WriteText(t, svg);
  svg << "</g>\n</svg>\n";
  return svg.str();
}

std::string RenderLossSvg(const std::string& title, const std::vector<RunSeries>& series,
                          const std::vector<v1::Event>& events) {
  return LossPlotSvg(LayOutLossPlot(title, series, events));
}

}  // namespace client
}  // namespace keel
