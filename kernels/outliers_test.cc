// Outlier analytics (outliers.h) against hand-computed values and against the
// repository's NVFP4 quantizer, and the Backend bookkeeping (nn.h) on the CPU
// backend through real linear layers.
#include "kernels/outliers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/nn.h"
#include "kernels/nn_cpu.h"
#include "kernels/quantize.h"

namespace keel {
namespace {

const float kNan = std::numeric_limits<float>::quiet_NaN();

OutlierSums SumsOf(const std::vector<float>& x, int64_t rows, int64_t cols, int axis) {
  OutlierSums s;
  AddOutlierSumsRef(x.data(), rows, cols, axis, &s);
  return s;
}

TEST(OutlierSums, KurtosisOfHandMadeTensors) {
  // +-1: variance 1, fourth moment 1.
  EXPECT_NEAR(Kurtosis(SumsOf({1, -1, 1, -1}, 1, 4, 1)), 1.0, 1e-12);
  // {0, 0, 0, 2}: mean 0.5, m2 = (3 * 0.25 + 2.25) / 4 = 0.75,
  // m4 = (3 * 0.0625 + 5.0625) / 4 = 1.3125, kurtosis 1.3125 / 0.5625 = 7/3.
  EXPECT_NEAR(Kurtosis(SumsOf({0, 0, 0, 2}, 2, 2, 1)), 7.0 / 3.0, 1e-12);
  // The same values far from zero: the shift keeps the moments exact.
  EXPECT_NEAR(Kurtosis(SumsOf({1001, 999, 1001, 999}, 1, 4, 1)), 1.0, 1e-9);
  // A constant has no kurtosis.
  EXPECT_TRUE(std::isnan(Kurtosis(SumsOf({3, 3, 3, 3}, 1, 4, 1))));
}

TEST(OutlierSums, AddsOverCallsAboutTheFirstCallsMean) {
  OutlierSums s;
  const std::vector<float> a = {0, 0, 0, 2}, b = {10, 10, 10, 12};
  AddOutlierSumsRef(a.data(), 1, 4, 1, &s);
  EXPECT_DOUBLE_EQ(s.shift, 0.5);
  AddOutlierSumsRef(b.data(), 1, 4, 1, &s);
  EXPECT_DOUBLE_EQ(s.shift, 0.5);  // kept from the first call
  EXPECT_EQ(s.finite, 8);
  // All eight values: mean 5.5, deviations -5.5 x3, -3.5, 4.5 x3, 6.5.
  const double m2 = (3 * 30.25 + 12.25 + 3 * 20.25 + 42.25) / 8;
  const double m4 = (3 * 915.0625 + 150.0625 + 3 * 410.0625 + 1785.0625) / 8;
  EXPECT_NEAR(Kurtosis(s), m4 / (m2 * m2), 1e-12);
}

TEST(OutlierSums, NonFiniteElementsAreCountedApart) {
  const OutlierSums s = SumsOf({1, kNan, -1, std::numeric_limits<float>::infinity()}, 1, 4, 1);
  EXPECT_EQ(s.finite, 2);
  EXPECT_EQ(s.nonfinite, 2);
  // A NaN amax makes every block scale NaN: nothing rounds to zero.
  EXPECT_EQ(s.flushed, 0);
}

TEST(OutlierSums, FlushToZeroOfHandMadeBlocks) {
  // One row of 32: two NVFP4 blocks. Tensor amax 6: s_enc = 448 * 6 / 6 = 448.
  // Block 0, amax 6: scale 448 (E4M3), s_b = 1, so each element is rounded as
  // is to E2M1 {0, 0.5, 1, ...}: 0.1 -> 0, 0.25 -> 0 (a tie, to even), -0.2 ->
  // -0, while 0.26 -> 0.5 and 0.5 stays: 3 flushed of 6 nonzero.
  // Block 1, amax 1: 1 * 448 / 6 = 74.67 rounds to the E4M3 72, s_b = 448 / 72
  // = 6.22: 0.01 -> 0.062 -> 0 flushed, 0.05 -> 0.311 -> 0.5 kept.
  std::vector<float> x(32, 0.0f);
  const float block0[] = {6, 0.1f, 0.5f, 0.25f, 0.26f, -0.2f};
  for (int i = 0; i < 6; ++i) x[i] = block0[i];
  x[16] = 1.0f;
  x[17] = 0.01f;
  x[18] = 0.05f;
  const OutlierSums s = SumsOf(x, 1, 32, 1);
  EXPECT_EQ(s.nonzero, 9);
  EXPECT_EQ(s.flushed, 4);
  // Down the columns (axis 0) of the same values laid out as 32 x 1: the same
  // blocks, the same counts.
  const OutlierSums t = SumsOf(x, 32, 1, 0);
  EXPECT_EQ(t.nonzero, 9);
  EXPECT_EQ(t.flushed, 4);
}

// The flush count is the repository's NVFP4 quantizer's: nonzero inputs whose
// dequantized value is zero, on a tensor with outliers, for both block axes.
TEST(OutlierSums, FlushToZeroMatchesTheNvfp4Quantizer) {
  const int64_t rows = 64, cols = 96;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) {
    v = normal(rng) * 0.05f;
    if (uniform(rng) < 0.02f) v *= 400.0f;  // outliers: their blocks flush the small values
    if (uniform(rng) < 0.05f) v = 0.0f;
  }
  for (int axis : {0, 1}) {
    Nvfp4Options options;
    options.axis = axis;
    std::vector<float> out(x.size());
    ASSERT_TRUE(Nvfp4QuantizeRef(x.data(), rows, cols, options, out.data(), nullptr, nullptr, nullptr).ok());
    int64_t nonzero = 0, flushed = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == 0.0f) continue;
      ++nonzero;
      if (out[i] == 0.0f) ++flushed;
    }
    const OutlierSums s = SumsOf(x, rows, cols, axis);
    EXPECT_EQ(s.nonzero, nonzero) << "axis " << axis;
    EXPECT_EQ(s.flushed, flushed) << "axis " << axis;
    EXPECT_GT(flushed, 0) << "axis " << axis << ": the test tensor should flush something";
  }
}

TEST(ChannelAbsMax, ColumnsAndRowsAndNanWins) {
  const std::vector<float> x = {1, -5, 2,    //
                                -3, 4, kNan};
  std::vector<float> columns(3, 0.0f), rows(2, 0.0f);
  ChannelAbsMaxRef(x.data(), 2, 3, 1, columns.data());
  EXPECT_EQ(columns[0], 3.0f);
  EXPECT_EQ(columns[1], 5.0f);
  EXPECT_TRUE(std::isnan(columns[2]));
  ChannelAbsMaxRef(x.data(), 2, 3, 0, rows.data());
  EXPECT_EQ(rows[0], 5.0f);
  EXPECT_TRUE(std::isnan(rows[1]));
  // It accumulates: a second tensor raises only the channels it exceeds.
  const std::vector<float> y = {7, 0, 0, 0, 0, 0};
  ChannelAbsMaxRef(y.data(), 2, 3, 1, columns.data());
  EXPECT_EQ(columns[0], 7.0f);
  EXPECT_EQ(columns[1], 5.0f);
}

// The summaries against the definitions written as plainly as possible (a full
// sort, NaN above every number, ties by index) on random channel sets with
// ties, zeros and NaNs, every size from 1 to 300 and k from 0 past the size.
TEST(OutlierSummary, TopChannelsAndMedianMatchAFullSort) {
  std::mt19937 rng(7);
  for (int n = 1; n <= 300; ++n) {
    std::vector<float> m(static_cast<size_t>(n));
    for (float& v : m) {
      const unsigned r = rng() % 16;
      v = r == 0 ? kNan : r == 1 ? 0.0f : static_cast<float>(rng() % 40) * 0.25f;  // many ties
    }
    if (n % 7 == 0) std::fill(m.begin(), m.end(), kNan);
    std::vector<int64_t> order(m.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    auto hotter = [&](int64_t a, int64_t b) {
      const bool na = std::isnan(m[a]), nb = std::isnan(m[b]);
      if (na != nb) return na;
      if (!na && m[a] != m[b]) return m[a] > m[b];
      return a < b;
    };
    std::sort(order.begin(), order.end(), hotter);
    for (int k : {0, 1, 3, 8, n - 1, n, n + 5}) {
      if (k < 0) continue;
      const std::vector<int64_t> want(order.begin(), order.begin() + std::min(k, n));
      EXPECT_EQ(TopChannels(m, k), want) << "n " << n << " k " << k;
    }
    // Ascending with NaN last: the hottest-first order reversed, then the lower median.
    const float top = m[order.front()];
    const float median = m[order[order.size() - 1 - (order.size() - 1) / 2]];
    const double got = TopOverMedian(m);
    if (std::isnan(top) || std::isnan(median) || (median == 0 && top == 0)) {
      EXPECT_TRUE(std::isnan(got)) << "n " << n << " got " << got;
    } else if (median == 0) {
      EXPECT_TRUE(std::isinf(got)) << "n " << n;
    } else {
      EXPECT_DOUBLE_EQ(got, static_cast<double>(top) / static_cast<double>(median)) << "n " << n;
    }
  }
}

TEST(OutlierSummary, TopChannelsMedianAndJaccard) {
  const std::vector<float> m = {1, 9, 2, 9, 0.5f, 3};
  EXPECT_EQ(TopChannels(m, 3), (std::vector<int64_t>{1, 3, 5}));  // tie 9 = 9: lower index first
  EXPECT_EQ(TopChannels(m, 10).size(), 6u);
  EXPECT_EQ(TopChannels({1, kNan, 2}, 1), (std::vector<int64_t>{1}));  // NaN is hottest
  // Ascending 0.5 1 2 3 9 9: the lower median (index 2) is 2, so 9 / 2.
  EXPECT_DOUBLE_EQ(TopOverMedian(m), 4.5);
  EXPECT_DOUBLE_EQ(TopOverMedian({4, 1, 2}), 2.0);
  EXPECT_TRUE(std::isinf(TopOverMedian({0, 0, 1})));
  EXPECT_TRUE(std::isnan(TopOverMedian({0, 0})));
  EXPECT_DOUBLE_EQ(Jaccard({1, 2, 3}, {2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(Jaccard({1, 2}, {2, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Jaccard({1}, {2}), 0.0);
  EXPECT_DOUBLE_EQ(Jaccard({}, {}), 1.0);
}

TEST(MapGrid, SixteenBySixteenBlocksMergedPast128) {
  const MapGrid small = MapGridFor(40, 64);
  EXPECT_EQ(small.cell_rows, 16);
  EXPECT_EQ(small.cell_cols, 16);
  EXPECT_EQ(small.rows, 3);  // the last cell holds 8 rows
  EXPECT_EQ(small.cols, 4);
  EXPECT_EQ(MapCellElements(small, 2, 0, 40, 64), 8 * 16);
  // 50304 columns are 3144 blocks: 25 blocks a cell (400 columns), 126 cells.
  const MapGrid wide = MapGridFor(8192, 50304);
  EXPECT_EQ(wide.cell_cols, 400);
  EXPECT_EQ(wide.cols, 126);
  EXPECT_EQ(wide.cell_rows, 64);  // 512 blocks: 4 a cell
  EXPECT_EQ(wide.rows, 128);
  EXPECT_LE(wide.rows, kMapMaxCells);
}

TEST(BlockAbsSums, SumsOfMagnitudesPerCell) {
  std::vector<float> x(20 * 18, 0.0f);
  x[0] = -2.0f;            // cell (0, 0)
  x[17] = 3.0f;            // row 0, column 17: cell (0, 1)
  x[19 * 18 + 0] = -1.0f;  // row 19: cell (1, 0)
  const MapGrid grid = MapGridFor(20, 18);
  ASSERT_EQ(grid.cells(), 4);
  std::vector<double> map(4, 0.0);
  AddBlockAbsSumsRef(x.data(), 20, 18, grid, map.data());
  EXPECT_EQ(map, (std::vector<double>{2, 3, 1, 0}));
}

// ---- The Backend bookkeeping on real linear layers (CPU backend) -----------------

std::unique_ptr<Backend> Cpu() {
  std::unique_ptr<Backend> backend;
  EXPECT_TRUE(MakeCpuBackend(2, &backend).ok());
  return backend;
}

TEST(BackendOutliers, AnalyzesEachRoleOfForwardAndBackward) {
  std::unique_ptr<Backend> b = Cpu();
  const int64_t rows = 32, in = 48, out = 16;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * in), w(out * in), dy(rows * out), y(rows * out), dx(rows * in), dw(out * in, 0.0f);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  for (float& v : dy) v = normal(rng);
  x[5 * in + 7] = 40.0f;  // a hot input channel: column 7 of x
  LinearQuant q;  // fp32 roles: analytics run whatever the formats
  q.analytics_slot = 1;
  ASSERT_TRUE(b->BeginOutlierAnalytics(2, true).ok());
  for (int call = 0; call < 2; ++call) {  // two micro-batches of the same tensors
    ASSERT_TRUE(b->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q).ok());
    ASSERT_TRUE(b->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, rows, in, out, q).ok());
  }
  std::vector<OperandOutliers> result;
  ASSERT_TRUE(b->ReadOutlierAnalytics(&result).ok());
  ASSERT_EQ(result.size(), 2u * kRoleCount);
  for (int r = 0; r < kRoleCount; ++r) EXPECT_EQ(result[r].calls, 0) << "slot 0 was never used";
  const OperandOutliers& fx = result[kRoleCount + static_cast<int>(Role::kFwdX)];
  const OperandOutliers& wx = result[kRoleCount + static_cast<int>(Role::kWgradX)];
  const OperandOutliers& dw_role = result[kRoleCount + static_cast<int>(Role::kDgradW)];
  EXPECT_EQ(fx.calls, 2);
  EXPECT_EQ(fx.channel_max.size(), static_cast<size_t>(in));
  EXPECT_EQ(fx.channel_max[7], 40.0f);
  EXPECT_EQ(Summarize(fx, 1).hot, (std::vector<int64_t>{7}));
  // Two calls of one tensor: the kurtosis of the tensor itself.
  EXPECT_NEAR(Kurtosis(fx.sums), Kurtosis(SumsOf(x, rows, in, 1)), 1e-9);
  // wgrad_x reads the same x: same channels, blocks down the columns.
  EXPECT_EQ(wx.channel_max, fx.channel_max);
  EXPECT_EQ(wx.sums.flushed, 2 * SumsOf(x, rows, in, 0).flushed);
  // dgrad_w's channels are w's rows (out).
  EXPECT_EQ(dw_role.channel_max.size(), static_cast<size_t>(out));
  // Maps for fwd_x, fwd_w, dgrad_dy only: mean |x| per 16x16 cell.
  ASSERT_EQ(fx.map_mean.size(), static_cast<size_t>(2 * 3));
  double cell = 0;
  for (int64_t i = 0; i < 16; ++i) {
    for (int64_t j = 0; j < 16; ++j) cell += std::fabs(x[i * in + j]);
  }
  EXPECT_NEAR(fx.map_mean[0], cell / 256, 1e-12);
  EXPECT_TRUE(wx.map_mean.empty());
  // Disarmed after the read: a later call adds nothing and a read is refused.
  ASSERT_TRUE(b->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q).ok());
  Status again = b->ReadOutlierAnalytics(&result);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("not armed"), std::string::npos) << again.message();
}

TEST(BackendOutliers, ASlotOutOfRangeIsRefusedNamingIt) {
  std::unique_ptr<Backend> b = Cpu();
  std::vector<float> x(16 * 16, 1.0f), w(16 * 16, 1.0f), y(16 * 16);
  LinearQuant q;
  q.analytics_slot = 3;
  ASSERT_TRUE(b->BeginOutlierAnalytics(2, false).ok());
  Status s = b->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), 16, 16, 16, q);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("analytics_slot: 3 is not allowed; need -1 or 0..1"), std::string::npos) << s.message();
  Status bad = b->BeginOutlierAnalytics(-1, false);
  EXPECT_NE(bad.message().find("slots: -1 is not allowed"), std::string::npos) << bad.message();
}

TEST(BackendOutliers, ASecondStepStartsFromZero) {
  std::unique_ptr<Backend> b = Cpu();
  std::vector<float> x(16 * 16, 2.0f), w(16 * 16, 1.0f), y(16 * 16);
  x[3] = -9.0f;
  LinearQuant q;
  q.analytics_slot = 0;
  std::vector<OperandOutliers> first, second;
  ASSERT_TRUE(b->BeginOutlierAnalytics(1, false).ok());
  ASSERT_TRUE(b->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), 16, 16, 16, q).ok());
  ASSERT_TRUE(b->ReadOutlierAnalytics(&first).ok());
  x[3] = 2.0f;
  ASSERT_TRUE(b->BeginOutlierAnalytics(1, false).ok());
  ASSERT_TRUE(b->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), 16, 16, 16, q).ok());
  ASSERT_TRUE(b->ReadOutlierAnalytics(&second).ok());
  EXPECT_EQ(first[0].channel_max[3], 9.0f);
  EXPECT_EQ(second[0].channel_max[3], 2.0f);
  EXPECT_EQ(second[0].calls, 1);
  EXPECT_EQ(second[0].sums.finite, 256);
}

// The bf16 reductions read each element's exact value from rows ld apart:
// the fp32 reductions' results on the widened tensor, the gap between rows
// never read; an ld under cols is refused naming it.
TEST(BackendOutliers, Bf16ReductionsGiveTheWidenedTensorsResults) {
  std::unique_ptr<Backend> b = Cpu();
  const int64_t rows = 20, cols = 37, ld = 40;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(static_cast<size_t>(rows * ld), 0x7FC0u);  // NaN in the gaps
  std::vector<float> wide(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * (c == 11 ? 40.0f : 1.0f);
      uint32_t u;
      std::memcpy(&u, &v, sizeof(u));
      bits[r * ld + c] = static_cast<uint16_t>(u >> 16);  // truncated: any bf16 value will do
      u &= 0xFFFF0000u;
      std::memcpy(&wide[r * cols + c], &u, sizeof(u));
    }
  }
  for (int axis : {1, 0}) {
    std::vector<float> a(static_cast<size_t>(axis == 1 ? cols : rows), 0.0f), c = a;
    ASSERT_TRUE(b->ChannelAbsMax(wide.data(), rows, cols, axis, a.data()).ok());
    ASSERT_TRUE(b->ChannelAbsMaxBf16(bits.data(), ld, rows, cols, axis, c.data()).ok());
    EXPECT_EQ(a, c) << axis;
    OutlierSums sa, sc;
    ASSERT_TRUE(b->AddOutlierSums(wide.data(), rows, cols, axis, &sa).ok());
    ASSERT_TRUE(b->AddOutlierSumsBf16(bits.data(), ld, rows, cols, axis, &sc).ok());
    EXPECT_EQ(std::memcmp(&sa, &sc, sizeof(sa)), 0) << axis;
    EXPECT_EQ(sc.nonfinite, 0) << axis;  // the NaN gaps were not read
  }
  const MapGrid grid = MapGridFor(rows, cols);
  std::vector<double> ma(static_cast<size_t>(grid.cells()), 0.0), mc = ma;
  ASSERT_TRUE(b->AddBlockAbsSums(wide.data(), rows, cols, grid, ma.data()).ok());
  ASSERT_TRUE(b->AddBlockAbsSumsBf16(bits.data(), ld, rows, cols, grid, mc.data()).ok());
  EXPECT_EQ(ma, mc);
  std::vector<float> out(static_cast<size_t>(cols), 0.0f);
  const Status s = b->ChannelAbsMaxBf16(bits.data(), cols - 1, rows, cols, 1, out.data());
  EXPECT_NE(s.message().find("ChannelAbsMaxBf16: ld: 36 is not allowed; need >= cols (37)"), std::string::npos)
      << s.message();
}

// The CPU backend, counting the backend calls the analytics bookkeeping makes.
class CountingCpu : public CpuBackend {
 public:
  CountingCpu() : CpuBackend(2) {}
  Status Alloc(size_t bytes, void** ptr) override {
    ++allocs;
    return CpuBackend::Alloc(bytes, ptr);
  }
  Status Fill(float* x, int64_t count, float value) override {
    ++fills;
    return CpuBackend::Fill(x, count, value);
  }
  Status DownloadMany(const std::vector<DownloadItem>& items) override {
    ++downloads;
    copies += static_cast<int>(items.size());
    return CpuBackend::DownloadMany(items);
  }
  int allocs = 0, fills = 0, downloads = 0, copies = 0;
};

// Many layers' buffers share one arena: an analytics step zeroes them with one
// Fill and reads them back with one copy, however many operands it analysed (it
// had two or three of each per operand), and the results are still each
// layer's own.
TEST(BackendOutliers, OneFillAndOneCopyPerStepForAllOperands) {
  CountingCpu b;
  const int64_t rows = 16, in = 32, out = 16;
  const int layers = 12;
  std::vector<float> w(static_cast<size_t>(out * in), 0.5f), y(static_cast<size_t>(rows * out));
  std::vector<std::vector<float>> xs;
  for (int l = 0; l < layers; ++l) {
    xs.emplace_back(static_cast<size_t>(rows * in), 1.0f);
    xs.back()[static_cast<size_t>(l)] = 10.0f + l;  // layer l's hot channel is l
  }
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(b.BeginOutlierAnalytics(layers, false).ok());
    for (int l = 0; l < layers; ++l) {
      LinearQuant q;
      q.analytics_slot = l;
      ASSERT_TRUE(b.LinearForward(xs[static_cast<size_t>(l)].data(), w.data(), nullptr, nullptr, y.data(), rows, in,
                                  out, q).ok());
    }
    const int allocs = b.allocs, fills = b.fills;
    std::vector<OperandOutliers> result;
    ASSERT_TRUE(b.ReadOutlierAnalytics(&result).ok());
    EXPECT_EQ(b.downloads, step + 1);
    EXPECT_EQ(b.copies, step + 1);  // one arena: one copy
    for (int l = 0; l < layers; ++l) {
      const OperandOutliers& fx = result[static_cast<size_t>(l) * kRoleCount + static_cast<int>(Role::kFwdX)];
      ASSERT_EQ(fx.calls, 1) << l;
      // Layer 0's max is 1 in the second step: the arena was zeroed in between.
      EXPECT_EQ(fx.channel_max[static_cast<size_t>(l)], step == 1 && l == 0 ? 1.0f : 10.0f + l) << l;
      EXPECT_EQ(fx.sums.finite, rows * in) << l;
    }
    if (step == 0) {
      EXPECT_EQ(allocs, 1);  // the arena, zeroed when made
      EXPECT_EQ(fills, 1);
    }
    xs[0][0] = 1.0f;  // the second step sees layer 0 without its hot channel
  }
  // The second step allocated nothing and zeroed everything with one Fill.
  EXPECT_EQ(b.allocs, 1);
  EXPECT_EQ(b.fills, 2);
}

}  // namespace
}  // namespace keel
