// Outlier analytics of a quantized linear layer's operands (issue 15;
// docs/train.md, "Outlier analytics"): what the trainer measures every
// `analytics_every` steps about each operand as it enters quantization.
//
// Per operand (one layer, one role) three reductions, each additive over the
// calls of a step (the micro-batches), so a backend accumulates them on its
// device and the host reads them once:
//   - OutlierSums: power sums of x about a shift (the kurtosis), and the NVFP4
//     flush-to-zero count: finite nonzero elements that NVFP4 rounds to zero;
//   - per-channel max |x| (ChannelAbsMax): the hot channels and top-1/median.
//     This is the reusable per-channel magnitude reduction (the Hot-Channel
//     Patch scores input channels with it);
//   - optionally the block map: sum |x| per cell of a grid of 16x16 blocks
//     (MapGrid), written as a heatmap.
// The functions named *Ref are the CPU reference (the CPU backend runs them;
// the CUDA backend's kernels are tested against them). Summaries (kurtosis,
// top-k, Jaccard) are plain host math on what the backend returns.
//
// How a role sees its operand (OutlierViewOf): the tensor, its channel axis and
// the axis of its NVFP4 blocks, those of the role's GEMM
// (docs/numerics.md, "Operand roles and axes"):
//   role      tensor          channels                 NVFP4 1x16 blocks
//   fwd_x     x  [rows, in]   columns (in)             along in
//   fwd_w     w  [out, in]    columns (in)             along in
//   dgrad_dy  dy [rows, out]  columns (out)            along out
//   dgrad_w   w  [out, in]    rows (out)               along out (down columns)
//   wgrad_dy  dy [rows, out]  columns (out)            along rows (tokens)
//   wgrad_x   x  [rows, in]   columns (in)             along rows (tokens)
// A channel is the GEMM's reduction channel where that is a feature (fwd, dgrad);
// the wgrad GEMMs reduce over tokens, and their channels stay the features, so
// wgrad_x and fwd_x (the same tensor) differ only in the flush-to-zero rate.
// Block maps are drawn for the three tensors, under the role that reads each
// first: fwd_x, fwd_w, dgrad_dy.
#ifndef KEEL_KERNELS_OUTLIERS_H_
#define KEEL_KERNELS_OUTLIERS_H_

#include <cstdint>
#include <vector>

#include "kernels/base/numeric_types.h"

namespace keel {

// Additive sums over an operand's elements. Plain data: the CUDA backend keeps
// one per slot and role in device memory with this layout.
//   shift: the mean of the finite elements of the first call added (0 until
//     then); the power sums are of (x - shift), which keeps the fourth central
//     moment accurate in double when the mean is far from 0.
//   s1..s4: sums of (x - shift)^k over finite elements, in double.
//   finite, nonfinite: elements in the sums; NaN and Inf ones (left out).
//   nonzero: finite nonzero elements; flushed: those of them that NVFP4 (1x16
//     blocks along the role's axis, E4M3 block scales, the per-tensor scale from
//     the call's amax, nearest-even, no RHT: the recipe's forward quantizer)
//     rounds to zero. A last block shorter than 16 (an axis length not a
//     multiple of 16) takes its amax over the elements it has.
struct OutlierSums {
  double shift = 0;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  int64_t finite = 0;
  int64_t nonfinite = 0;
  int64_t nonzero = 0;
  int64_t flushed = 0;
};

// A role's view of its operand (the table above).
struct OutlierView {
  int channel_axis;  // 1: channels are columns (max over rows); 0: channels are rows
  int nvfp4_axis;    // 1: blocks of 16 consecutive elements of a row; 0: down a column
  bool map;          // the role draws its tensor's block map
};
OutlierView OutlierViewOf(Role role);

// The block map's grid: cells of cell_rows x cell_cols elements, both multiples
// of 16 (16x16 blocks, merged when the tensor has more than kMapMaxCells blocks
// along an axis, so that a map has at most kMapMaxCells x kMapMaxCells cells);
// rows x cols cells, the last ones cut by the tensor's edge.
constexpr int64_t kMapMaxCells = 128;
struct MapGrid {
  int64_t cell_rows = 16, cell_cols = 16;
  int64_t rows = 0, cols = 0;
  int64_t cells() const { return rows * cols; }
};
MapGrid MapGridFor(int64_t tensor_rows, int64_t tensor_cols);
// Elements of cell (r, c) of a tensor_rows x tensor_cols tensor.
int64_t MapCellElements(const MapGrid& grid, int64_t r, int64_t c, int64_t tensor_rows, int64_t tensor_cols);

// ---- CPU reference (x: rows x cols, row-major, host memory) ------------------------
// out[ch] = max(out[ch], max |x| over channel ch) (cols channels for axis 1, rows
// for axis 0); a NaN wins over every number (a NaN channel is the hottest).
void ChannelAbsMaxRef(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out);
// *sums += x's sums (OutlierSums), blocks along nvfp4_axis; sets sums->shift
// first when sums->finite == 0.
void AddOutlierSumsRef(const float* x, int64_t rows, int64_t cols, int nvfp4_axis, OutlierSums* sums);
// map[r * grid.cols + c] += sum of |x| over cell (r, c) (grid from MapGridFor).
void AddBlockAbsSumsRef(const float* x, int64_t rows, int64_t cols, const MapGrid& grid, double* map);

// ---- What a backend returns and its summaries --------------------------------------

// One slot and role after a step's analytics (Backend::ReadOutlierAnalytics).
struct OperandOutliers {
  int64_t calls = 0;            // operands analyzed (0: the role never ran)
  int64_t rows = 0, cols = 0;   // one call's operand
  OutlierSums sums;
  std::vector<float> channel_max;  // max |x| per channel over the calls
  MapGrid grid;
  std::vector<double> map_mean;    // mean |x| per cell over the calls; empty without maps
};

struct OutlierSummary {
  double kurtosis = 0;           // E[(x-m)^4] / var^2 (Pearson: 3 for a Gaussian); NaN when var is 0
  double top1_over_median = 0;   // largest channel max over the median channel max
  double ftz_rate = 0;           // flushed / nonzero (0 when no element is nonzero)
  std::vector<int64_t> hot;      // the top-k channels, hottest first
};

// Pearson kurtosis from the power sums (NaN without two distinct finite values).
double Kurtosis(const OutlierSums& sums);
// The k channels of largest max |x| (NaN counts as largest; ties: lower index
// first), hottest first; all of them when there are fewer than k.
std::vector<int64_t> TopChannels(const std::vector<float>& channel_max, int k);
// The largest channel max over the median one (the lower median: the element at
// (n - 1) / 2 in ascending order): +Inf when the median is 0 and the top is not,
// NaN when both are 0 or there are no channels.
double TopOverMedian(const std::vector<float>& channel_max);
// |a ∩ b| / |a ∪ b| of two channel sets (1 when both are empty).
double Jaccard(const std::vector<int64_t>& a, const std::vector<int64_t>& b);
OutlierSummary Summarize(const OperandOutliers& operand, int top_k);

}  // namespace keel

#endif  // KEEL_KERNELS_OUTLIERS_H_
