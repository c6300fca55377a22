// Backend's outlier analytics bookkeeping (nn.h, "Outlier analytics"): the
// per-slot, per-role buffers in backend memory, filled by the backend's three
// reductions while armed and read back once per analytics step. Shared by every
// backend; only the reductions themselves are backend code.
#include <string>

#include "kernels/nn.h"

namespace keel {

namespace {

// Zeroes `bytes` (a multiple of 4) of backend memory: 0.0f is all-zero bits, so
// this also zeroes doubles and integers.
Status Zero(Backend* backend, void* p, size_t bytes) {
  return bytes == 0 ? Status::Ok() : backend->Fill(static_cast<float*>(p), static_cast<int64_t>(bytes / 4), 0.0f);
}

}  // namespace

Status Backend::BeginOutlierAnalytics(int slots, bool maps) {
  if (slots < 0 || slots > (1 << 20))
    return Status::Error("BeginOutlierAnalytics: slots: " + std::to_string(slots) +
                         " is not allowed; need 0 .. 1048576 (the model's linear layers)");
  if (slots != outlier_slots_) {
    ReleaseOutlierAnalytics();
    outlier_slots_ = slots;
    outlier_buffers_.assign(static_cast<size_t>(slots) * kRoleCount, OutlierBuffers());
  }
  // Buffers already allocated are zeroed now; new ones are zeroed when allocated.
  for (size_t i = 0; i < outlier_buffers_.size(); ++i) {
    OutlierBuffers& b = outlier_buffers_[i];
    b.calls = 0;
    if (b.sums == nullptr) continue;
    KEEL_RETURN_IF_ERROR(Zero(this, b.sums, sizeof(OutlierSums)));
    const OutlierView view = OutlierViewOf(static_cast<Role>(i % kRoleCount));
    KEEL_RETURN_IF_ERROR(Zero(this, b.channel_max, sizeof(float) * (view.channel_axis == 1 ? b.cols : b.rows)));
    if (b.map != nullptr) KEEL_RETURN_IF_ERROR(Zero(this, b.map, sizeof(double) * MapGridFor(b.rows, b.cols).cells()));
  }
  outlier_maps_ = maps;
  outliers_armed_ = true;
  return Status::Ok();
}

Status Backend::AnalyzeOperand(const char* op, Role role, const float* x, int64_t rows, int64_t cols, int slot) {
  if (!outliers_armed_ || slot < 0) return Status::Ok();
  if (slot >= outlier_slots_)
    return Status::Error(std::string(op) + ": analytics_slot: " + std::to_string(slot) +
                         " is not allowed; need -1 or 0.." + std::to_string(outlier_slots_ - 1) +
                         " (the slots of BeginOutlierAnalytics)");
  const OutlierView view = OutlierViewOf(role);
  OutlierBuffers& b = outlier_buffers_[static_cast<size_t>(slot) * kRoleCount + static_cast<int>(role)];
  const bool map = outlier_maps_ && view.map;
  const MapGrid grid = MapGridFor(rows, cols);
  if (b.sums != nullptr && (b.rows != rows || b.cols != cols)) {
    // Another shape in this slot than before (a model rebuilt): new buffers.
    if (b.calls > 0)
      return Status::Error(std::string(op) + ": analytics_slot: " + std::to_string(slot) + " " + RoleName(role) +
                           " was " + std::to_string(b.rows) + " x " + std::to_string(b.cols) + " earlier in this step, now " +
                           std::to_string(rows) + " x " + std::to_string(cols) + "; one slot is one layer");
    Free(b.sums);
    Free(b.channel_max);
    Free(b.map);
    b = OutlierBuffers();
  }
  if (b.sums == nullptr) {
    const int64_t channels = view.channel_axis == 1 ? cols : rows;
    void* p = nullptr;
    KEEL_RETURN_IF_ERROR(Alloc(sizeof(OutlierSums), &p));
    b.sums = static_cast<OutlierSums*>(p);
    KEEL_RETURN_IF_ERROR(Alloc(sizeof(float) * channels, &p));
    b.channel_max = static_cast<float*>(p);
    b.rows = rows;
    b.cols = cols;
    KEEL_RETURN_IF_ERROR(Zero(this, b.sums, sizeof(OutlierSums)));
    KEEL_RETURN_IF_ERROR(Zero(this, b.channel_max, sizeof(float) * channels));
  }
  if (map && b.map == nullptr) {
    void* p = nullptr;
    KEEL_RETURN_IF_ERROR(Alloc(sizeof(double) * grid.cells(), &p));
    b.map = static_cast<double*>(p);
    KEEL_RETURN_IF_ERROR(Zero(this, b.map, sizeof(double) * grid.cells()));
  }
  KEEL_RETURN_IF_ERROR(AddOutlierSums(x, rows, cols, view.nvfp4_axis, b.sums));
  KEEL_RETURN_IF_ERROR(ChannelAbsMax(x, rows, cols, view.channel_axis, b.channel_max));
  if (map) KEEL_RETURN_IF_ERROR(AddBlockAbsSums(x, rows, cols, grid, b.map));
  ++b.calls;
  return Status::Ok();
}

Status Backend::ReadOutlierAnalytics(std::vector<OperandOutliers>* out) {
  if (out == nullptr) return Status::Error("ReadOutlierAnalytics: out: null is not allowed");
  if (!outliers_armed_)
    return Status::Error("ReadOutlierAnalytics: not armed; call BeginOutlierAnalytics before the step");
  outliers_armed_ = false;
  out->assign(outlier_buffers_.size(), OperandOutliers());
  // Every buffer in one DownloadMany (one wait), then the means.
  std::vector<DownloadItem> items;
  for (size_t i = 0; i < outlier_buffers_.size(); ++i) {
    const OutlierBuffers& b = outlier_buffers_[i];
    OperandOutliers& o = (*out)[i];
    if (b.calls == 0) continue;
    const OutlierView view = OutlierViewOf(static_cast<Role>(i % kRoleCount));
    o.calls = b.calls;
    o.rows = b.rows;
    o.cols = b.cols;
    items.push_back({&o.sums, b.sums, sizeof(OutlierSums)});
    o.channel_max.resize(static_cast<size_t>(view.channel_axis == 1 ? b.cols : b.rows));
    items.push_back({o.channel_max.data(), b.channel_max, sizeof(float) * o.channel_max.size()});
    if (outlier_maps_ && b.map != nullptr) {
      o.grid = MapGridFor(b.rows, b.cols);
      o.map_mean.resize(static_cast<size_t>(o.grid.cells()));
      items.push_back({o.map_mean.data(), b.map, sizeof(double) * o.map_mean.size()});
    }
  }
  KEEL_RETURN_IF_ERROR(DownloadMany(items));
  for (size_t i = 0; i < outlier_buffers_.size(); ++i) {
    const OutlierBuffers& b = outlier_buffers_[i];
    OperandOutliers& o = (*out)[i];
    if (b.calls == 0 || o.map_mean.empty()) continue;
    for (int64_t r = 0; r < o.grid.rows; ++r) {
      for (int64_t c = 0; c < o.grid.cols; ++c) {
        const double elements = static_cast<double>(MapCellElements(o.grid, r, c, b.rows, b.cols) * b.calls);
        o.map_mean[r * o.grid.cols + c] /= elements;
      }
    }
  }
  return Status::Ok();
}

void Backend::ReleaseOutlierAnalytics() {
  for (OutlierBuffers& b : outlier_buffers_) {
    Free(b.sums);
    Free(b.channel_max);
    Free(b.map);
    b = OutlierBuffers();
  }
  outlier_buffers_.clear();
  outlier_slots_ = 0;
  outliers_armed_ = false;
}

}  // namespace keel
