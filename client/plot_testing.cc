// Test helpers for plot.h (see plot_testing.h).
#include "client/plot_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "proto/event_kinds.h"

namespace keel {
namespace client {
namespace {

const char* const kPrecisions[] = {"bf16", "mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "nvfp4"};
// One rung up the demo's ladder.
const char* const kNextRung[] = {"bf16", "bf16", "mxfp8_e4m3", "mxfp6_e2m3", "mxfp8_e4m3"};

// A small deterministic noise in [-1, 1].
double Noise(int run, int step) {
  uint32_t h = static_cast<uint32_t>(run) * 2654435761u ^ static_cast<uint32_t>(step) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return static_cast<double>(h % 20001) / 10000.0 - 1.0;
}

// `*clock`: when the event happened, as 10 x the step the run had reached
// (plus one for each event before it at that moment). The runs advance
// together, so once sorted by time the events of runs that acted at the same
// step interleave: A's rollback, B's rollback, A's switch, B's switch, ...
v1::Event MakeEvent(const std::string& run_id, int64_t step, const char* kind, const std::string& message,
                    std::initializer_list<std::pair<const char*, std::string>> details, int64_t* clock) {
  v1::Event e;
  e.set_run_id(run_id);
  e.set_step(step);
  e.set_unix_ms(1700000000000 + 1000 * *clock);
  ++*clock;  // the next event of the same moment comes after this one
  e.set_kind(kind);
  e.set_message(message);
  for (const auto& kv : details) (*e.mutable_details())[kv.first] = kv.second;
  return e;
}

// The policy's rollback, switch and scale_lr, as keel-train records them.
void PolicyRescue(const std::string& run_id, int64_t from, int64_t to, const std::string& scheme,
                  const std::string& next, std::vector<v1::Event>* events) {
  const std::string rule = "loss-spike";
  int64_t when = from * 10;
  int64_t* clock = &when;
  events->push_back(MakeEvent(run_id, to, event_kind::kRollback,
                              "rolled back from step " + std::to_string(from) + " to " + std::to_string(to) +
                                  ": rule loss-spike (loss z-score 41.2 > 6)",
                              {{"from_step", std::to_string(from)},
                               {"to_step", std::to_string(to)},
                               {"checkpoint", "/runs/" + run_id + "/checkpoints/step_" + std::to_string(to)},
                               {"rule", rule},
                               {"detectors", "loss_zscore"},
                               {"loss_zscore.z", "41.23456789"}},
                              clock));
  events->push_back(MakeEvent(run_id, to, event_kind::kSwitchPrecision,
                              "switched precision from " + scheme + " to " + next + ": rule loss-spike",
                              {{"from", scheme}, {"precision", next}, {"rule", rule}}, clock));
  events->push_back(MakeEvent(run_id, to, event_kind::kScaleLr, "learning rate scaled by 0.01: rule loss-spike",
                              {{"factor", "0.01"}, {"lr_scale", "0.01"}, {"rule", rule}}, clock));
}

}  // namespace

SyntheticSweep MakeSyntheticSweep(int runs) {
  SyntheticSweep sweep;
  for (int i = 0; i < runs; ++i) {
    int64_t clock = 0;
    const int precision = i % 5;
    const int seed = (i / 5) % 2 + 1;
    const bool policy = (i / 10) % 2 == 1;
    const bool faulty = precision >= 2;
    RunSeries s;
    const std::string id = "run-" + std::to_string(3 + i);
    s.run.set_id(id);
    s.run.set_sweep_id("sweep-1");
    s.run.set_index(i);
    s.run.mutable_scheme()->set_name(kPrecisions[precision]);
    (*s.run.mutable_axes())["precision"] = kPrecisions[precision];
    (*s.run.mutable_axes())["seed"] = std::to_string(seed);
    (*s.run.mutable_axes())["policy.max_interventions"] = policy ? "3" : "0";
    sweep.events.push_back(
        MakeEvent(id, 0, event_kind::kState, "RUNNING on w1", {{"state", "RUNNING"}}, &clock));

    std::string scheme = kPrecisions[precision];
    const bool rescued_twice = policy && precision == 3 && seed == 2;
    for (int step = 0; step <= 300; step += 5) {
      double loss = 1.9 + 0.07 * precision + 0.03 * seed + 3.2 * std::exp(-step / 70.0) +
                    0.04 * Noise(i, step) + 0.01 * std::sin(step / 9.0 + i);
      if (!faulty && step >= 150 && step <= 160) loss *= 1.0 + 0.25 * (1 + precision) * (160 - step) / 10.0;
      if (faulty && !policy && step >= 150) {
        // Blows up: the loss detectors may not act.
        const int k = (step - 150) / 5;
        if (k > 3) loss = std::nan("");
        else loss *= std::pow(12.0 + precision, k + 1);
      }
      if (rescued_twice && step > 200) loss *= 1.02;  // the second trajectory, after its rollback at 232
      v1::MetricPoint p;
      p.set_run_id(id);
      p.set_step(step);
      p.set_loss(loss);
      p.set_lr(policy && faulty && step > kSyntheticRollbackTo ? 3e-5 : 3e-3);
      p.set_tokens_per_s(52000 + 100 * Noise(i + 7, step));
      p.set_grad_norm(0.8 + 0.1 * Noise(i + 11, step));
      s.points.push_back(p);
    }
    if (faulty && !policy) {
      clock = 170 * 10;
      sweep.events.push_back(MakeEvent(id, 170, event_kind::kStop, "stopped the run as diverged: rule nan-stop",
                                       {{"rule", "nan-stop"}}, &clock));
      s.run.set_state(v1::DIVERGED);
    } else {
      s.run.set_state(v1::SUCCEEDED);
    }
    if (faulty && policy) {
      PolicyRescue(id, kSyntheticRollbackFrom, kSyntheticRollbackTo, scheme, kNextRung[precision], &sweep.events);
      scheme = kNextRung[precision];
      if (rescued_twice) {
        PolicyRescue(id, 232, 200, scheme, kNextRung[2], &sweep.events);
        scheme = kNextRung[2];
      }
    }
    if (policy && precision == 1 && seed == 1) {
      // A scale_lr alone: an intervention, but no trajectory change, so no marker.
      clock = 120 * 10;
      sweep.events.push_back(MakeEvent(id, 120, event_kind::kScaleLr, "learning rate scaled by 0.5: rule grad-norm",
                                       {{"factor", "0.5"}, {"rule", "grad-norm"}}, &clock));
    }
    if (policy && precision == 0 && seed == 1) {
      // keel intervene RUN --precision mxfp8_e4m3: a switch without a rule.
      clock = 240 * 10;
      sweep.events.push_back(MakeEvent(id, 240, event_kind::kInterventionRequested,
                                       "switch to mxfp8_e4m3 requested", {{"precision", "mxfp8_e4m3"}}, &clock));
      sweep.events.push_back(MakeEvent(id, 240, event_kind::kSwitchPrecision,
                                       "switched precision from bf16 to mxfp8_e4m3 (try mx)",
                                       {{"from", "bf16"}, {"precision", "mxfp8_e4m3"}}, &clock));
      scheme = "mxfp8_e4m3";
    }
    s.run.set_precision(scheme);
    s.run.set_step(300);
    s.run.set_steps(300);
    s.run.set_loss(s.points.back().loss());
    sweep.series.push_back(s);
  }
  std::stable_sort(sweep.events.begin(), sweep.events.end(),
                   [](const v1::Event& a, const v1::Event& b) { return a.unix_ms() < b.unix_ms(); });
  return sweep;
}

std::string LayoutProblems(const LossPlot& plot) {
  const Box canvas{0, 0, static_cast<double>(plot.width), static_cast<double>(plot.height)};
  auto describe = [](const PlotText& t) {
    char box[160];
    std::snprintf(box, sizeof(box), " at (%.1f, %.1f) size %.1f x %.1f", t.box.x, t.box.y, t.box.width,
                  t.box.height);
    return t.role + " \"" + t.text + "\"" + box;
  };
  for (const PlotText& t : plot.texts) {
    if (!std::isfinite(t.x) || !std::isfinite(t.y) || !std::isfinite(t.box.x) || !std::isfinite(t.box.y))
      return "text " + t.role + " \"" + t.text + "\" has a coordinate that is not finite";
    if (!canvas.Contains(t.box))
      return "text " + describe(t) + " is not inside the canvas " + std::to_string(plot.width) + " x " +
             std::to_string(plot.height);
  }
  for (size_t i = 0; i < plot.texts.size(); ++i)
    for (size_t j = i + 1; j < plot.texts.size(); ++j)
      if (plot.texts[i].box.Overlaps(plot.texts[j].box))
        return "texts " + describe(plot.texts[i]) + " and " + describe(plot.texts[j]) + " overlap";
  // Half a unit of slack: Coord() rounds to two decimals, the layout does not.
  Box chart = plot.chart;
  chart.x -= 0.5;
  chart.y -= 0.5;
  chart.width += 1;
  chart.height += 1;
  for (const PlotLine& line : plot.lines) {
    for (const auto& piece : line.pieces) {
      for (const auto& p : piece) {
        if (!std::isfinite(p.first) || !std::isfinite(p.second) || !chart.Contains({p.first, p.second, 0, 0}))
          return "a point of run " + line.run_id + " is outside the chart";
      }
    }
  }
  for (const PlotShape& s : plot.switches) {
    if (!std::isfinite(s.x) || !std::isfinite(s.y) || !chart.Contains({s.x, s.y, 0, 0}))
      return "the switch of run " + s.run_id + " at step " + std::to_string(s.step) + " is outside the chart";
  }
  for (const PlotMarker& m : plot.markers) {
    if (!std::isfinite(m.x) || m.x < chart.x || m.x > chart.right())
      return "the marker of run " + m.intervention.run_id + " at step " + std::to_string(m.intervention.step) +
             " is outside the chart";
    if (m.tag_text >= 0 && plot.texts[static_cast<size_t>(m.tag_text)].box.bottom() > plot.chart.y)
      return "the tag of intervention " + std::to_string(m.number) + " is not above the chart";
  }
  return "";
}

}  // namespace client
}  // namespace keel
