// Block magnitude maps as SVG (outlier_maps.h).
#include "worker/engine/outlier_maps.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "worker/io/file_util.h"

namespace keel {
namespace {

constexpr int kLevels = 32;

// The ramp's anchors (dark blue to yellow, perceptually ordered like viridis).
const int kAnchors[][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};

std::string LevelColour(int level) {
  const double t = static_cast<double>(level) / (kLevels - 1) * 4.0;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  char hex[8];
  int rgb[3];
  for (int k = 0; k < 3; ++k) rgb[k] = static_cast<int>(std::lround(kAnchors[i][k] + f * (kAnchors[i + 1][k] - kAnchors[i][k])));
  std::snprintf(hex, sizeof(hex), "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return hex;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

}  // namespace

std::string BlockMapSvg(const OperandOutliers& o, const std::string& title) {
  const MapGrid& g = o.grid;
  double lo = 0, hi = 0;  // smallest positive and largest finite means
  for (double v : o.map_mean) {
    if (!std::isfinite(v) || v <= 0) continue;
    lo = lo == 0 ? v : std::min(lo, v);
    hi = std::max(hi, v);
  }
  // The class of each cell: "z" zero, "n" non-finite, else its level.
  auto level = [&](double v) -> int {
    if (!std::isfinite(v)) return -2;
    if (v <= 0) return -1;
    if (hi <= lo) return kLevels - 1;
    const double t = (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo));
    return std::min(kLevels - 1, std::max(0, static_cast<int>(std::floor(t * (kLevels - 1) + 0.5))));
  };
  auto cls = [](int l) { return l == -2 ? std::string("n") : l == -1 ? std::string("z") : "c" + std::to_string(l); };
  const int64_t px = std::max<int64_t>(2, 512 / std::max<int64_t>(1, std::max(g.rows, g.cols)));
  const int64_t top = 28, legend = 16;
  const int64_t width = std::max<int64_t>(g.cols * px, 320), height = top + g.rows * px + 8 + legend + 20;
  std::string s;
  s.reserve(static_cast<size_t>(4096 + g.cells() * 8));
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
       std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"11\" shape-rendering=\"crispEdges\">\n";
  s += "<title>" + Escape(title) + "</title>\n<style>.z{fill:#000}.n{fill:#f0f}";
  for (int l = 0; l < kLevels; ++l) s += ".c" + std::to_string(l) + "{fill:" + LevelColour(l) + "}";
  s += "</style>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  s += "<text x=\"0\" y=\"12\">" + Escape(title) + "</text>\n";
  s += "<text x=\"0\" y=\"24\">" + std::to_string(o.rows) + " x " + std::to_string(o.cols) + ", cells " +
       std::to_string(g.cell_rows) + " x " + std::to_string(g.cell_cols) + ", mean |x| per cell, log colour</text>\n";
  // The cells in unit coordinates, scaled to px: one path per colour class,
  // equal neighbours in a row merged into one rectangle "Mx yhWv1h-Wz".
  std::vector<std::string> paths(kLevels + 2);  // index level + 2
  for (int64_t r = 0; r < g.rows; ++r) {
    for (int64_t c = 0; c < g.cols;) {
      const int l = level(o.map_mean[r * g.cols + c]);
      int64_t end = c + 1;
      while (end < g.cols && level(o.map_mean[r * g.cols + end]) == l) ++end;
      const std::string w = std::to_string(end - c);
      paths[l + 2] += "M" + std::to_string(c) + " " + std::to_string(r) + "h" + w + "v1h-" + w + "z";
      c = end;
    }
  }
  s += "<g transform=\"translate(0," + std::to_string(top) + ") scale(" + std::to_string(px) + ")\">\n";
  for (int l = -2; l < kLevels; ++l) {
    if (!paths[l + 2].empty()) s += "<path class=\"" + cls(l) + "\" d=\"" + paths[l + 2] + "\"/>\n";
  }
  s += "</g>\n";
  // The legend: the ramp from lo to hi.
  const int64_t y = top + g.rows * px + 8;
  for (int l = 0; l < kLevels; ++l) {
    s += "<rect class=\"c" + std::to_string(l) + "\" x=\"" + std::to_string(l * 8) + "\" y=\"" + std::to_string(y) +
         "\" width=\"8\" height=\"" + std::to_string(legend) + "\"/>";
  }
  s += "\n<text x=\"0\" y=\"" + std::to_string(y + legend + 14) + "\">" + Number(lo) + "</text>";
  s += "<text x=\"" + std::to_string(kLevels * 8) + "\" y=\"" + std::to_string(y + legend + 14) +
       "\" text-anchor=\"end\">" + Number(hi) + "</text>\n</svg>\n";
  return s;
}

Status WriteBlockMaps(const std::string& dir, int64_t step, const std::vector<std::string>& linear_names,
                      const std::vector<OperandOutliers>& results, int* written) {
  *written = 0;
  bool made = false;
  for (size_t i = 0; i < results.size(); ++i) {
    const OperandOutliers& o = results[i];
    if (o.map_mean.empty()) continue;
    const size_t slot = i / kRoleCount;
    if (slot >= linear_names.size())
      return Status::Error("analytics maps: slot " + std::to_string(slot) + " has no layer name (" +
                           std::to_string(linear_names.size()) + " layers)");
    if (!made) {
      KEEL_RETURN_IF_ERROR(MakeDirs(dir));
      made = true;
    }
    const std::string name = linear_names[slot] + "." + RoleName(static_cast<Role>(i % kRoleCount));
    KEEL_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + name + ".svg",
                                         BlockMapSvg(o, name + ", step " + std::to_string(step))));
    ++*written;
  }
  return Status::Ok();
}

}  // namespace keel
