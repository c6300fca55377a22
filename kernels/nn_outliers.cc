// Backend's outlier analytics bookkeeping (nn.h, "Outlier analytics"): the
// per-slot, per-role buffers in backend memory, filled by the backend's three
// reductions while armed and read back once per analytics step. Shared by every
// backend; only the reductions themselves are backend code.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/nn.h"

namespace keel {

namespace {

// Zeroes `bytes` (a multiple of 4) of backend memory: 0.0f is all-zero bits, so
// this also zeroes doubles and integers.
Status Zero(Backend* backend, void* p, size_t bytes) {
  return bytes == 0 ? Status::Ok() : backend->Fill(static_cast<float*>(p), static_cast<int64_t>(bytes / 4), 0.0f);
}

// Arenas hold at least this much; a buffer never straddles two. Offsets are
// multiples of kOutlierAlign, enough for doubles and vector loads.
constexpr size_t kOutlierArenaBytes = size_t{4} << 20;
constexpr size_t kOutlierAlign = 256;

}  // namespace

Status Backend::CarveOutlierBuffer(size_t bytes, void** out) {
  const size_t need = (bytes + kOutlierAlign - 1) / kOutlierAlign * kOutlierAlign;
  int index = -1;
  for (size_t i = 0; i < outlier_arenas_.size(); ++i) {
    if (outlier_arenas_[i].bytes - outlier_arenas_[i].used >= need) {
      index = static_cast<int>(i);
      break;
    }
  }
  if (index < 0) {
    OutlierArena a;
    a.bytes = std::max(kOutlierArenaBytes, need);
    void* p = nullptr;
    KEEL_RETURN_IF_ERROR(Alloc(a.bytes, &p));
    a.base = static_cast<char*>(p);
    // Zero once: what is carved later is zero until used, and
    // BeginOutlierAnalytics zeroes only the carved part.
    Status zeroed = Zero(this, a.base, a.bytes);
    if (!zeroed.ok()) {
      Free(a.base);
      return zeroed;
    }
    outlier_arenas_.push_back(a);
    index = static_cast<int>(outlier_arenas_.size()) - 1;
  }
  OutlierArena& a = outlier_arenas_[static_cast<size_t>(index)];
  *out = a.base + a.used;
  a.used += need;
  return Status::Ok();
}

Status Backend::BeginOutlierAnalytics(int slots, bool maps) {
  if (slots < 0 || slots > (1 << 20))
    return Status::Error("BeginOutlierAnalytics: slots: " + std::to_string(slots) +
                         " is not allowed; need 0 .. 1048576 (the model's linear layers)");
  if (slots != outlier_slots_) {
    ReleaseOutlierAnalytics();
    outlier_slots_ = slots;
    outlier_buffers_.assign(static_cast<size_t>(slots) * kRoleCount, OutlierBuffers());
  }
  // Every buffer carved so far is zeroed now (one Fill per arena); new ones are zero when carved.
  for (OutlierBuffers& b : outlier_buffers_) b.calls = 0;
  for (const OutlierArena& a : outlier_arenas_) KEEL_RETURN_IF_ERROR(Zero(this, a.base, a.used));
  outlier_maps_ = maps;
  outliers_armed_ = true;
  return Status::Ok();
}

Status Backend::OutlierBuffersFor(const char* op, Role role, int64_t rows, int64_t cols, int slot,
                                  OutlierBuffers** out, bool* map) {
  *out = nullptr;
  *map = false;
  if (!outliers_armed_ || slot < 0) return Status::Ok();
  if (slot >= outlier_slots_)
    return Status::Error(std::string(op) + ": analytics_slot: " + std::to_string(slot) +
                         " is not allowed; need -1 or 0.." + std::to_string(outlier_slots_ - 1) +
                         " (the slots of BeginOutlierAnalytics)");
  const OutlierView view = OutlierViewOf(role);
  OutlierBuffers& b = outlier_buffers_[static_cast<size_t>(slot) * kRoleCount + static_cast<int>(role)];
  if (b.sums != nullptr && (b.rows != rows || b.cols != cols)) {
    // Another shape in this slot than before (a model rebuilt): new buffers (the
    // old ones stay in their arena, unused, until ReleaseOutlierAnalytics).
    if (b.calls > 0)
      return Status::Error(std::string(op) + ": analytics_slot: " + std::to_string(slot) + " " + RoleName(role) +
                           " was " + std::to_string(b.rows) + " x " + std::to_string(b.cols) + " earlier in this step, now " +
                           std::to_string(rows) + " x " + std::to_string(cols) + "; one slot is one layer");
    b = OutlierBuffers();
  }
  if (b.sums == nullptr) {
    const int64_t channels = view.channel_axis == 1 ? cols : rows;
    void* p = nullptr;
    KEEL_RETURN_IF_ERROR(CarveOutlierBuffer(sizeof(OutlierSums), &p));
    b.sums = static_cast<OutlierSums*>(p);
    KEEL_RETURN_IF_ERROR(CarveOutlierBuffer(sizeof(float) * static_cast<size_t>(channels), &p));
    b.channel_max = static_cast<float*>(p);
    b.rows = rows;
    b.cols = cols;
  }
  *map = outlier_maps_ && view.map;
  if (*map && b.map == nullptr) {
    void* p = nullptr;
    KEEL_RETURN_IF_ERROR(CarveOutlierBuffer(sizeof(double) * static_cast<size_t>(MapGridFor(rows, cols).cells()), &p));
    b.map = static_cast<double*>(p);
  }
  *out = &b;
  return Status::Ok();
}

Status Backend::AnalyzeOperand(const char* op, Role role, const float* x, int64_t rows, int64_t cols, int slot) {
  OutlierBuffers* b = nullptr;
  bool map = false;
  KEEL_RETURN_IF_ERROR(OutlierBuffersFor(op, role, rows, cols, slot, &b, &map));
  if (b == nullptr) return Status::Ok();
  const OutlierView view = OutlierViewOf(role);
  KEEL_RETURN_IF_ERROR(AddOutlierSums(x, rows, cols, view.nvfp4_axis, b->sums));
  KEEL_RETURN_IF_ERROR(ChannelAbsMax(x, rows, cols, view.channel_axis, b->channel_max));
  if (map) KEEL_RETURN_IF_ERROR(AddBlockAbsSums(x, rows, cols, MapGridFor(rows, cols), b->map));
  ++b->calls;
  return Status::Ok();
}

Status Backend::AnalyzeOperandBf16(const char* op, Role role, const uint16_t* x, int64_t ld, int64_t rows,
                                   int64_t cols, int slot) {
  OutlierBuffers* b = nullptr;
  bool map = false;
  KEEL_RETURN_IF_ERROR(OutlierBuffersFor(op, role, rows, cols, slot, &b, &map));
  if (b == nullptr) return Status::Ok();
  const OutlierView view = OutlierViewOf(role);
  KEEL_RETURN_IF_ERROR(AddOutlierSumsBf16(x, ld, rows, cols, view.nvfp4_axis, b->sums));
  KEEL_RETURN_IF_ERROR(ChannelAbsMaxBf16(x, ld, rows, cols, view.channel_axis, b->channel_max));
  if (map) KEEL_RETURN_IF_ERROR(AddBlockAbsSumsBf16(x, ld, rows, cols, MapGridFor(rows, cols), b->map));
  ++b->calls;
  return Status::Ok();
}

Status Backend::ReadOutlierAnalytics(std::vector<OperandOutliers>* out) {
  if (out == nullptr) return Status::Error("ReadOutlierAnalytics: out: null is not allowed");
  if (!outliers_armed_)
    return Status::Error("ReadOutlierAnalytics: not armed; call BeginOutlierAnalytics before the step");
  outliers_armed_ = false;
  out->assign(outlier_buffers_.size(), OperandOutliers());
  // Every arena's carved bytes in one DownloadMany (one wait, one copy per
  // arena), then each buffer from its place, and the means.
  std::vector<std::vector<char>> host(outlier_arenas_.size());
  std::vector<DownloadItem> items;
  for (size_t a = 0; a < outlier_arenas_.size(); ++a) {
    host[a].resize(outlier_arenas_[a].used);
    items.push_back({host[a].data(), outlier_arenas_[a].base, outlier_arenas_[a].used});
  }
  KEEL_RETURN_IF_ERROR(DownloadMany(items));
  // A carved buffer's bytes, from the host copy of the arena that holds it.
  auto copy = [this, &host](void* dst, const void* carved, size_t bytes) {
    const char* p = static_cast<const char*>(carved);
    for (size_t a = 0; a < outlier_arenas_.size(); ++a) {
      const OutlierArena& arena = outlier_arenas_[a];
      if (p >= arena.base && p < arena.base + arena.used) {
        std::memcpy(dst, host[a].data() + (p - arena.base), bytes);
        return;
      }
    }
  };
  for (size_t i = 0; i < outlier_buffers_.size(); ++i) {
    const OutlierBuffers& b = outlier_buffers_[i];
    OperandOutliers& o = (*out)[i];
    if (b.calls == 0) continue;
    const OutlierView view = OutlierViewOf(static_cast<Role>(i % kRoleCount));
    o.calls = b.calls;
    o.rows = b.rows;
    o.cols = b.cols;
    copy(&o.sums, b.sums, sizeof(OutlierSums));
    o.channel_max.resize(static_cast<size_t>(view.channel_axis == 1 ? b.cols : b.rows));
    copy(o.channel_max.data(), b.channel_max, sizeof(float) * o.channel_max.size());
    if (!outlier_maps_ || b.map == nullptr) continue;
    o.grid = MapGridFor(b.rows, b.cols);
    o.map_mean.resize(static_cast<size_t>(o.grid.cells()));
    copy(o.map_mean.data(), b.map, sizeof(double) * o.map_mean.size());
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
  for (OutlierArena& a : outlier_arenas_) Free(a.base);
  outlier_arenas_.clear();
  outlier_buffers_.clear();
  outlier_slots_ = 0;
  outliers_armed_ = false;
}

}  // namespace keel
