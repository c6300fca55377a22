// Formatting for the keel CLI (see format.h).
#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>

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

}  // namespace client
}  // namespace keel
