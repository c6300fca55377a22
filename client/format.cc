// Formatting for the keel CLI (see format.h).
#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <sstream>

#include "proto/event_kinds.h"

namespace keel {
namespace client {

std::string FormatTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size(), 0);
  auto widen = [&widths](const std::vector<std::string>& row) {
    if (row.size() > widths.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  };
  widen(header);
  for (const auto& row : rows) widen(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(header);
  for (const auto& row : rows) emit(row);
  return out;
}

std::string ProgressBar(int64_t step, int64_t steps, int width) {
  if (width < 0) width = 0;
  int64_t filled = 0;
  if (steps > 0 && step > 0) {
    // Integer arithmetic: a bar is full only when step reaches steps.
    filled = std::min<int64_t>(width, step * width / steps);
  }
  return "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '.') +
         "]";
}

std::string FormatNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

std::string HumanNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";  // also -0
  // "%.3e" rounds to four significant digits first, so the exponent is the
  // rounded value's (9.99996 -> "1.000e+01", printed "10", not "9.99996").
  char scientific[32];
  std::snprintf(scientific, sizeof(scientific), "%.3e", value);
  const char* e = std::strchr(scientific, 'e');
  const int exponent = std::atoi(e + 1);
  auto trim_zeros = [](std::string text) {
    if (text.find('.') == std::string::npos) return text;
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
    return text;
  };
  if (exponent >= -3 && exponent < 6) {
    char fixed[32];
    std::snprintf(fixed, sizeof(fixed), "%.*f", std::max(0, 3 - exponent), value);
    return trim_zeros(fixed);
  }
  return trim_zeros(std::string(scientific, static_cast<size_t>(e - scientific))) + "e" + std::to_string(exponent);
}

std::string StateName(v1::RunState state) {
  if (state == v1::RUN_STATE_UNSPECIFIED) return "-";
  return v1::RunState_Name(state);
}

bool IsTerminal(v1::RunState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED || state == v1::DIVERGED;
}

std::string AxesText(const google::protobuf::Map<std::string, std::string>& axes) {
  std::map<std::string, std::string> sorted(axes.begin(), axes.end());
  std::string out;
  for (const auto& kv : sorted) {
    if (!out.empty()) out += " ";
    out += kv.first + "=" + kv.second;
  }
  return out;
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm_utc;
  gmtime_r(&seconds, &tm_utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d %H:%M:%S", &tm_utc);
  return buffer;
}

std::string CsvField(const std::string& field) {
  if (field.find_first_of(",\"\r\n") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::vector<std::string> AxisNames(const std::vector<RunSeries>& series) {
  std::set<std::string> names;
  for (const auto& s : series)
    for (const auto& kv : s.run.axes()) names.insert(kv.first);
  return std::vector<std::string>(names.begin(), names.end());
}

namespace {

std::string AxisValue(const v1::Run& run, const std::string& name) {
  auto it = run.axes().find(name);
  return it == run.axes().end() ? std::string() : it->second;
}

std::string JsonNumber(double value) { return std::isfinite(value) ? FormatNumber(value) : "null"; }

}  // namespace

std::string ExportCsv(const std::vector<RunSeries>& series) {
  std::vector<std::string> axes = AxisNames(series);
  std::string out = "sweep_id,run_id,step,loss,lr,tokens_per_s,grad_norm";
  for (const auto& axis : axes) out += "," + CsvField(axis);
  out += "\n";
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      std::string run_id = p.run_id().empty() ? s.run.id() : p.run_id();
      out += CsvField(s.run.sweep_id()) + "," + CsvField(run_id) + "," + std::to_string(p.step()) + "," +
             FormatNumber(p.loss()) + "," + FormatNumber(p.lr()) + "," + FormatNumber(p.tokens_per_s()) + "," +
             FormatNumber(p.grad_norm());
      for (const auto& axis : axes) out += "," + CsvField(AxisValue(s.run, axis));
      out += "\n";
    }
  }
  return out;
}

std::string ExportJsonl(const std::vector<RunSeries>& series) {
  std::vector<std::string> axes = AxisNames(series);
  std::string out;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      std::string run_id = p.run_id().empty() ? s.run.id() : p.run_id();
      out += "{\"sweep_id\":" + JsonString(s.run.sweep_id()) + ",\"run_id\":" + JsonString(run_id) +
             ",\"step\":" + std::to_string(p.step()) + ",\"loss\":" + JsonNumber(p.loss()) +
             ",\"lr\":" + JsonNumber(p.lr()) + ",\"tokens_per_s\":" + JsonNumber(p.tokens_per_s()) +
             ",\"grad_norm\":" + JsonNumber(p.grad_norm());
      for (const auto& axis : axes) out += "," + JsonString(axis) + ":" + JsonString(AxisValue(s.run, axis));
      out += "}\n";
    }
  }
  return out;
}

std::vector<std::string> WatchHeader() {
  return {"RUN", "STATE", "PROGRESS", "LOSS", "PRECISION", "RESTARTS", "INTERVENTIONS"};
}

std::string RunLossText(const v1::Run& run) {
  return run.step() > 0 || run.loss() != 0 ? HumanNumber(run.loss()) : "-";
}

std::vector<std::string> WatchRow(const v1::Run& run, int interventions) {
  std::string progress =
      ProgressBar(run.step(), run.steps(), 20) + " " + std::to_string(run.step()) + "/" + std::to_string(run.steps());
  return {run.id(),
          StateName(run.state()),
          progress,
          RunLossText(run),
          run.precision().empty() ? "-" : run.precision(),
          std::to_string(run.restarts()),
          std::to_string(interventions)};
}

bool IsInterventionEvent(const v1::Event& event) {
  return event_kind::ChangesTrajectory(event.kind());
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

// Coordinates with two decimals: enough for a screen, never NaN (callers pass
// finite values only).
std::string Coord(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f", v);
  return buffer;
}

const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

bool Plottable(const v1::MetricPoint& p) { return std::isfinite(p.loss()) && p.loss() > 0; }

}  // namespace

std::string RenderLossSvg(const std::string& title, const std::vector<RunSeries>& series,
                          const std::vector<v1::Event>& events) {
  const double width = 960, plot_left = 80, plot_top = 50, plot_width = 620, plot_height = 400;
  const double legend_x = plot_left + plot_width + 20;
  const double height = std::max(520.0, plot_top + 30.0 + 18.0 * static_cast<double>(series.size()));

  // Data ranges over plottable points only.
  double min_step = 0, max_step = 0, min_log = 0, max_log = 0;
  bool any = false;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      if (!Plottable(p)) continue;
      double l = std::log10(p.loss());
      double st = static_cast<double>(p.step());
      if (!any) {
        min_step = max_step = st;
        min_log = max_log = l;
        any = true;
      } else {
        min_step = std::min(min_step, st);
        max_step = std::max(max_step, st);
        min_log = std::min(min_log, l);
        max_log = std::max(max_log, l);
      }
    }
  }
  for (const auto& e : events) {
    if (!IsInterventionEvent(e)) continue;
    double st = static_cast<double>(e.step());
    if (!any) {
      min_step = max_step = st;
    } else {
      min_step = std::min(min_step, st);
      max_step = std::max(max_step, st);
    }
  }
  if (max_step <= min_step) max_step = min_step + 1;
  if (!any) {
    min_log = -1;
    max_log = 1;
  }
  // Round out to whole decades so the gridlines sit on 10^k.
  min_log = std::floor(min_log);
  max_log = std::ceil(max_log);
  if (max_log <= min_log) max_log = min_log + 1;

  auto x_of = [&](double step) { return plot_left + (step - min_step) / (max_step - min_step) * plot_width; };
  auto y_of = [&](double log_loss) {
    return plot_top + plot_height - (log_loss - min_log) / (max_log - min_log) * plot_height;
  };

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << Coord(width) << "\" height=\""
      << Coord(height) << "\" viewBox=\"0 0 " << Coord(width) << " " << Coord(height) << "\">\n"
      << "<title>" << XmlEscape(title) << "</title>\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << Coord(width) << "\" height=\"" << Coord(height) << "\" fill=\"white\"/>\n"
      << "<text x=\"" << Coord(plot_left) << "\" y=\"30\" font-family=\"sans-serif\" font-size=\"16\">"
      << XmlEscape(title) << "</text>\n";

  // Axes, decade gridlines and labels.
  svg << "<g font-family=\"sans-serif\" font-size=\"11\" fill=\"black\">\n";
  for (double k = min_log; k <= max_log + 1e-9; k += 1) {
    double y = y_of(k);
    svg << "<line x1=\"" << Coord(plot_left) << "\" y1=\"" << Coord(y) << "\" x2=\"" << Coord(plot_left + plot_width)
        << "\" y2=\"" << Coord(y) << "\" stroke=\"#dddddd\"/>\n"
        << "<text x=\"" << Coord(plot_left - 6) << "\" y=\"" << Coord(y + 4) << "\" text-anchor=\"end\">1e"
        << static_cast<int>(k) << "</text>\n";
  }
  for (int i = 0; i <= 5; ++i) {
    double step = min_step + (max_step - min_step) * i / 5.0;
    double x = x_of(step);
    char label[32];
    std::snprintf(label, sizeof(label), "%.0f", step);
    svg << "<text x=\"" << Coord(x) << "\" y=\"" << Coord(plot_top + plot_height + 16) << "\" text-anchor=\"middle\">"
        << label << "</text>\n";
  }
  svg << "<rect x=\"" << Coord(plot_left) << "\" y=\"" << Coord(plot_top) << "\" width=\"" << Coord(plot_width)
      << "\" height=\"" << Coord(plot_height) << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << Coord(plot_left + plot_width / 2) << "\" y=\"" << Coord(plot_top + plot_height + 34)
      << "\" text-anchor=\"middle\">step</text>\n"
      << "<text x=\"20\" y=\"" << Coord(plot_top + plot_height / 2)
      << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " << Coord(plot_top + plot_height / 2)
      << ")\">loss (log scale)</text>\n"
      << "</g>\n";

  // One polyline per run.
  std::map<std::string, int> color_of_run;
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    int color = static_cast<int>(i % kPaletteSize);
    color_of_run[s.run.id()] = color;
    std::string points;
    for (const auto& p : s.points) {
      if (!Plottable(p)) continue;
      if (!points.empty()) points += " ";
      points += Coord(x_of(static_cast<double>(p.step()))) + "," + Coord(y_of(std::log10(p.loss())));
    }
    svg << "<polyline class=\"run\" data-run=\"" << XmlEscape(s.run.id()) << "\" fill=\"none\" stroke=\""
        << kPalette[color] << "\" stroke-width=\"1.5\" points=\"" << points << "\"/>\n";
  }

  // Intervention markers.
  int marker_index = 0;
  for (const auto& e : events) {
    if (!IsInterventionEvent(e)) continue;
    double x = x_of(static_cast<double>(e.step()));
    auto it = color_of_run.find(e.run_id());
    const char* color = it == color_of_run.end() ? "#444444" : kPalette[it->second];
    std::string label = e.kind() + " " + e.run_id() + (e.message().empty() ? "" : ": " + e.message());
    if (label.size() > 60) label = label.substr(0, 57) + "...";
    // Stagger labels so that neighbouring markers stay readable.
    double label_y = plot_top + 12 + 12.0 * (marker_index % 6);
    svg << "<g class=\"marker\">\n"
        << "<line x1=\"" << Coord(x) << "\" y1=\"" << Coord(plot_top) << "\" x2=\"" << Coord(x) << "\" y2=\""
        << Coord(plot_top + plot_height) << "\" stroke=\"" << color << "\" stroke-dasharray=\"5,4\"/>\n"
        << "<text x=\"" << Coord(x + 3) << "\" y=\"" << Coord(label_y)
        << "\" font-family=\"sans-serif\" font-size=\"10\" fill=\"" << color << "\">" << XmlEscape(label) << "</text>\n"
        << "</g>\n";
    ++marker_index;
  }

  // Legend.
  svg << "<g class=\"legend\" font-family=\"sans-serif\" font-size=\"11\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    double y = plot_top + 10 + 18.0 * static_cast<double>(i);
    std::string axes = AxesText(s.run.axes());
    svg << "<line x1=\"" << Coord(legend_x) << "\" y1=\"" << Coord(y) << "\" x2=\"" << Coord(legend_x + 20)
        << "\" y2=\"" << Coord(y) << "\" stroke=\"" << kPalette[i % kPaletteSize] << "\" stroke-width=\"2\"/>\n"
        << "<text x=\"" << Coord(legend_x + 26) << "\" y=\"" << Coord(y + 4) << "\">" << XmlEscape(s.run.id())
        << (axes.empty() ? "" : " " + XmlEscape(axes)) << "</text>\n";
  }
  svg << "</g>\n</svg>\n";
  return svg.str();
}

}  // namespace client
}  // namespace keel
