// The loss-vs-step plot of `keel plot`: first a layout (every line, marker and
// text of the picture, each text with the box it may take), then the layout
// written as a standalone SVG 1.1. The layout is its own step so that a test
// can check what a reader will see: every text inside the canvas, no two texts
// overlapping, each intervention drawn at the step where it was decided.
//
// The picture, top to bottom: the title; a band of numbered tags, one per
// intervention, each with a leader down to a dashed vertical line at the
// intervention's step; the chart (loss on a log axis against step, one line
// per run, a precision switch marked on the run's line by a shape that names
// the new scheme; the axis ends at 3x the highest starting loss, rounded up,
// so that a run that blows up leaves through the top instead of flattening
// the rest); the key of those shapes; the legend, a table with a row per run
// (swatch, run id, state, each axis's value, precision switches) in as many
// side-by-side parts as fit; the numbered interventions, one line each. The
// canvas is as tall as all that needs: nothing is cut off.
//
// Text is set in a monospace font, whose advance (0.60 em in DejaVu Sans Mono,
// Liberation Mono, Courier) the layout rounds up to kCharWidthEm: a text's box
// is an upper bound of the ink, so boxes that do not overlap mean texts that do
// not overlap.
#ifndef KEEL_CLIENT_PLOT_H_
#define KEEL_CLIENT_PLOT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "client/format.h"
#include "proto/keel.pb.h"

namespace keel {
namespace client {

// The width of a character cell the layout assumes, in em.
constexpr double kCharWidthEm = 0.62;

// One intervention as the plot shows it: the intervention events (event_kind::
// IsIntervention) that one decision of one run produced. A decision's events
// come one after another in the run's event list, each starting at the step
// where the one before left the run (a policy rule's rollback, switch and
// scale_lr; keel intervene's rollback and switch), and are merged into one.
// Only decisions with a switch_precision or a rollback are plotted.
struct PlotIntervention {
  std::string run_id;
  // Where it was decided, the marker's step. A rollback's Event.step is the
  // step it went back to (keel-train records the event after restoring the
  // checkpoint: worker/engine/trainer.cc, RollbackAndRecord), so its decision step
  // is details.from_step, the step the run had reached; every other kind's
  // Event.step is the step it acted at. A rollback without a readable
  // from_step (not written by keel-train) falls back to its Event.step.
  int64_t step = 0;
  int64_t resumed_step = -1;  // a rollback's details.to_step (its Event.step); -1 without a rollback
  std::string precision;      // the scheme a switch moved the run to; "" without a switch
  std::string summary;        // "rollback to 100, switch mxfp4 -> mxfp6_e2m3, scale_lr x0.01 (rule loss-spike)"
};

// The plotted interventions of `events` (any runs), in the order of their
// first event. Events are taken in the order given: the store's, which is the
// order keeld received them.
std::vector<PlotIntervention> PlotInterventions(const std::vector<v1::Event>& events);

// A run's precision changes: from `step` on it trains in `to`. From
// switch_precision events (details.precision, at Event.step) and rollbacks
// whose details name a precision other than the one in force (at to_step).
struct PrecisionChange {
  int64_t step = 0;
  std::string from;  // details.from, else the scheme in force before (run.scheme().name() at first)
  std::string to;
};
std::vector<PrecisionChange> PrecisionChanges(const v1::Run& run, const std::vector<v1::Event>& events);

// A rectangle in SVG user units (pixels): x, y its top-left corner.
struct Box {
  double x = 0, y = 0, width = 0, height = 0;
  double right() const { return x + width; }
  double bottom() const { return y + height; }
  // Share some area (touching edges do not count).
  bool Overlaps(const Box& other) const;
  bool Contains(const Box& other) const;
};

enum class TextAnchor { kStart, kMiddle, kEnd };

struct PlotText {
  // "title", "axis", "xtick", "ytick", "key", "tag", "list", and in the legend
  // "legend-head" (column names), "legend" (a run's id, beside its swatch),
  // "legend-cell" (its state, axis values and precision switches).
  std::string role;
  std::string text;
  double x = 0, y = 0;  // the anchor point, on the baseline
  double size = 0;      // font size
  TextAnchor anchor = TextAnchor::kStart;
  bool vertical = false;  // turned -90 degrees about (x, y): reads bottom to top
  Box box;                // what the text may cover (for a tag: its frame)
  std::string frame;      // a tag: the frame's colour, drawn around `box` on white
};

// A run's line and its legend swatch.
struct PlotLine {
  std::string run_id;
  std::string color;
  std::string dash;  // SVG stroke-dasharray; "" solid
  // Its plottable points in pixels, joined across the others; one piece unless
  // the line leaves the chart through the top (LossPlot::clipped_above).
  std::vector<std::vector<std::pair<double, double>>> pieces;
  double swatch_x = 0, swatch_y = 0, swatch_width = 0;
};

// A shape: a precision switch on a run's line, or an entry of the shape key.
struct PlotShape {
  std::string run_id;  // "" in the key
  std::string scheme;
  int64_t step = 0;
  int shape = 0;  // index into the shapes (circle, square, triangle, diamond, ...): one per scheme
  double x = 0, y = 0;
  std::string fill;
};

// An intervention as drawn: its tag (text `number` in the band above the chart,
// role "tag") and a dashed vertical line at x through the chart.
struct PlotMarker {
  PlotIntervention intervention;
  int number = 0;      // 1, 2, ...; 0: beyond the numbered ones (line only)
  std::string color;   // the run's
  double x = 0;        // of intervention.step
  int tag_text = -1;   // index of its tag in LossPlot::texts, -1 if not numbered
};

struct LossPlot {
  int width = 0, height = 0;  // the canvas; the SVG's width, height and viewBox
  Box chart;                  // the data area
  int64_t min_step = 0, max_step = 1;
  double min_log_loss = 0, max_log_loss = 1;  // log10 at the chart's bottom and top
  // 0, or the loss above which lines are cut: three times the highest starting
  // loss rounded up to m x 10^k (m in 1..9), when a run went further (a
  // blow-up would flatten the other curves).
  double clipped_above = 0;
  std::vector<double> x_grid, y_grid;         // gridline positions (pixels)
  std::vector<PlotText> texts;
  std::vector<PlotLine> lines;     // one per run, in the order given
  std::vector<PlotShape> switches;
  std::vector<PlotShape> key;
  std::vector<PlotMarker> markers;

  double XOfStep(double step) const;
  double YOfLoss(double loss) const;  // loss > 0
};

// Lays out the plot of `series` (one line per run, in the given order) and the
// interventions among `events`. Points whose loss is not finite and > 0 are
// left out (log axis). Every coordinate is finite.
LossPlot LayOutLossPlot(const std::string& title, const std::vector<RunSeries>& series,
                        const std::vector<v1::Event>& events);

// The layout as a standalone SVG 1.1 document.
std::string LossPlotSvg(const LossPlot& plot);

// LossPlotSvg(LayOutLossPlot(...)): what `keel plot` writes.
std::string RenderLossSvg(const std::string& title, const std::vector<RunSeries>& series,
                          const std::vector<v1::Event>& events);

}  // namespace client
}  // namespace keel

#endif  // KEEL_CLIENT_PLOT_H_
