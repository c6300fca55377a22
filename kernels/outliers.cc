// Outlier analytics: the role views, the CPU reference reductions and the
// summaries (outliers.h).
#include "kernels/outliers.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>

#include "kernels/quant_core.h"

namespace keel {

OutlierView OutlierViewOf(Role role) {
  switch (role) {
    case Role::kFwdX: return {1, 1, true};
    case Role::kFwdW: return {1, 1, true};
    case Role::kDgradDy: return {1, 1, true};
    case Role::kDgradW: return {0, 0, false};
    case Role::kWgradDy: return {1, 0, false};
    case Role::kWgradX: return {1, 0, false};
  }
  return {1, 1, false};
}

MapGrid MapGridFor(int64_t tensor_rows, int64_t tensor_cols) {
  auto cell = [](int64_t length) {
    const int64_t blocks = (length + 15) / 16;
    return 16 * ((blocks + kMapMaxCells - 1) / kMapMaxCells);  // 16x16 blocks, merged past kMapMaxCells
  };
  MapGrid grid;
  grid.cell_rows = cell(tensor_rows);
  grid.cell_cols = cell(tensor_cols);
  grid.rows = (tensor_rows + grid.cell_rows - 1) / grid.cell_rows;
  grid.cols = (tensor_cols + grid.cell_cols - 1) / grid.cell_cols;
  return grid;
}

int64_t MapCellElements(const MapGrid& grid, int64_t r, int64_t c, int64_t tensor_rows, int64_t tensor_cols) {
  const int64_t h = std::min(grid.cell_rows, tensor_rows - r * grid.cell_rows);
  const int64_t w = std::min(grid.cell_cols, tensor_cols - c * grid.cell_cols);
  return std::max<int64_t>(h, 0) * std::max<int64_t>(w, 0);
}

void ChannelAbsMaxRef(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out) {
  // The max of |x| as bits: non-negative floats order as their bits, and every
  // NaN's magnitude bits exceed Inf's, so a NaN wins (what the CUDA kernel's
  // integer atomicMax gives, whatever the order).
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t bits = qcore::AsBits(x[r * cols + c]) & qcore::kAbsMask;
      float* slot = &out[channel_axis == 1 ? c : r];
      if (bits > qcore::AsBits(*slot)) *slot = qcore::AsFloat(bits);
    }
  }
}

void AddOutlierSumsRef(const float* x, int64_t rows, int64_t cols, int nvfp4_axis, OutlierSums* sums) {
  // Pass 1: the tensor amax (NaN-propagating, as the quantizer takes it) and
  // the mean of the finite elements (the shift of a first call).
  float amax = 0.0f;
  double sum = 0;
  int64_t finite = 0;
  const int64_t count = rows * cols;
  for (int64_t i = 0; i < count; ++i) {
    const float magnitude = std::fabs(x[i]);
    if (std::isnan(magnitude) || std::isnan(amax)) amax = std::numeric_limits<float>::quiet_NaN();
    else amax = std::max(amax, magnitude);
    if (std::isfinite(x[i])) {
      sum += x[i];
      ++finite;
    }
  }
  if (sums->finite == 0 && finite > 0) sums->shift = sum / static_cast<double>(finite);
  const double shift = sums->shift;

  // Pass 2, block by block along the NVFP4 axis.
  const qcore::Nvfp4TensorScale tensor = qcore::Nvfp4TensorScaleFromAmax(amax);
  const int64_t lines = nvfp4_axis == 1 ? rows : cols;
  const int64_t length = nvfp4_axis == 1 ? cols : rows;
  auto at = [&](int64_t line, int64_t k) { return nvfp4_axis == 1 ? x[line * cols + k] : x[k * cols + line]; };
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t k0 = 0; k0 < length; k0 += 16) {
      const int64_t k1 = std::min(length, k0 + 16);
      float amax_b = 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const float magnitude = std::fabs(at(line, k));
        if (std::isnan(magnitude) || std::isnan(amax_b)) amax_b = std::numeric_limits<float>::quiet_NaN();
        else amax_b = std::max(amax_b, magnitude);
      }
      const qcore::Nvfp4BlockScale block = qcore::Nvfp4BlockScaleFromAmax(amax_b, tensor);
      for (int64_t k = k0; k < k1; ++k) {
        const float v = at(line, k);
        if (!std::isfinite(v)) {
          ++sums->nonfinite;
          continue;
        }
        const double d = static_cast<double>(v) - shift;
        const double d2 = d * d;
        sums->s1 += d;
        sums->s2 += d2;
        sums->s3 += d2 * d;
        sums->s4 += d2 * d2;
        ++sums->finite;
        if (v != 0.0f) {
          ++sums->nonzero;
          if (qcore::Nvfp4Element(v, block, Rounding::kNearestEven, 0.0f).value == 0.0f) ++sums->flushed;
        }
      }
    }
  }
}

void AddBlockAbsSumsRef(const float* x, int64_t rows, int64_t cols, const MapGrid& grid, double* map) {
  for (int64_t r = 0; r < grid.rows; ++r) {
    for (int64_t c = 0; c < grid.cols; ++c) {
      double sum = 0;
      for (int64_t i = r * grid.cell_rows; i < std::min(rows, (r + 1) * grid.cell_rows); ++i) {
        for (int64_t j = c * grid.cell_cols; j < std::min(cols, (c + 1) * grid.cell_cols); ++j) {
          sum += std::fabs(x[i * cols + j]);
        }
      }
      map[r * grid.cols + c] += sum;
    }
  }
}

double Kurtosis(const OutlierSums& s) {
  if (s.finite < 2) return std::numeric_limits<double>::quiet_NaN();
  const double n = static_cast<double>(s.finite);
  // Central moments from the sums about the shift: delta is the mean's offset
  // from the shift (small, so nothing cancels badly).
  const double delta = s.s1 / n;
  const double m2 = s.s2 / n - delta * delta;
  const double m4 = s.s4 / n - 4 * delta * (s.s3 / n) + 6 * delta * delta * (s.s2 / n) - 3 * delta * delta * delta * delta;
  if (!(m2 > 0)) return std::numeric_limits<double>::quiet_NaN();
  return m4 / (m2 * m2);
}

namespace {

// Channel magnitudes ordered hottest first: NaN above every number.
bool Hotter(float a, float b) {
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
}

}  // namespace

// Both run on the host for every analysed operand of an analytics step (a
// GPT-2 124M step has 294), so neither sorts all channels: a full sort with
// the NaN-aware comparison took about 0.1 ms per 2048 channels, most of an
// analytics step's cost at the proxy (docs/benchmarks.md, "Outlier analytics
// cost").
std::vector<int64_t> TopChannels(const std::vector<float>& channel_max, int k) {
  const size_t keep = std::min(channel_max.size(), static_cast<size_t>(std::max(k, 0)));
  std::vector<int64_t> top;  // hottest first; a later channel enters only when strictly hotter
  if (keep == 0) return top;
  top.reserve(keep + 1);
  for (size_t i = 0; i < channel_max.size(); ++i) {
    const float v = channel_max[i];
    if (top.size() == keep && !Hotter(v, channel_max[top.back()])) continue;
    // Channels seen earlier have lower indices, so among equals they stay first.
    size_t at = top.size();
    while (at > 0 && Hotter(v, channel_max[top[at - 1]])) --at;
    top.insert(top.begin() + static_cast<std::ptrdiff_t>(at), static_cast<int64_t>(i));
    if (top.size() > keep) top.pop_back();
  }
  return top;
}

double TopOverMedian(const std::vector<float>& channel_max) {
  if (channel_max.empty()) return std::numeric_limits<double>::quiet_NaN();
  // Ascending order puts NaNs last: the top is NaN when there is one, and the
  // lower median is NaN when its index falls among them.
  std::vector<float> numbers;
  numbers.reserve(channel_max.size());
  for (float v : channel_max) {
    if (!std::isnan(v)) numbers.push_back(v);
  }
  const size_t mid = (channel_max.size() - 1) / 2;
  if (numbers.size() < channel_max.size() && mid >= numbers.size()) return std::numeric_limits<double>::quiet_NaN();
  std::nth_element(numbers.begin(), numbers.begin() + static_cast<std::ptrdiff_t>(mid), numbers.end());
  const double median = numbers[mid];
  const double top = numbers.size() < channel_max.size() ? std::numeric_limits<double>::quiet_NaN()
                                                         : *std::max_element(numbers.begin() + static_cast<std::ptrdiff_t>(mid),
                                                                             numbers.end());
  if (median == 0) return top == 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  return top / median;
}

double Jaccard(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> x = a, y = b;
  std::sort(x.begin(), x.end());
  x.erase(std::unique(x.begin(), x.end()), x.end());
  std::sort(y.begin(), y.end());
  y.erase(std::unique(y.begin(), y.end()), y.end());
  std::vector<int64_t> common;
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(common));
  const size_t united = x.size() + y.size() - common.size();
  return united == 0 ? 1.0 : static_cast<double>(common.size()) / static_cast<double>(united);
}

OutlierSummary Summarize(const OperandOutliers& operand, int top_k) {
  OutlierSummary s;
  s.kurtosis = Kurtosis(operand.sums);
  s.top1_over_median = TopOverMedian(operand.channel_max);
  s.ftz_rate = operand.sums.nonzero > 0
                   ? static_cast<double>(operand.sums.flushed) / static_cast<double>(operand.sums.nonzero)
                   : 0.0;
  s.hot = TopChannels(operand.channel_max, top_k);
  return s;
}

}  // namespace keel
