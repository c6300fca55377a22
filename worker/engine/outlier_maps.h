// The block magnitude maps of outlier analytics (kernels/outliers.h) as SVG
// heatmaps: one file per operand that has a map, under the run directory
// (run_dir.h: <run_dir>/analytics/<step, 8 digits>/<linear>.<role>.svg).
//
// A map has at most kMapMaxCells x kMapMaxCells cells (16x16 blocks, merged on
// large operands), each the mean |x| of its cell, coloured on a log scale
// between the map's smallest positive and largest finite means (32 steps of a
// viridis-like ramp; exact zeros black, NaN/Inf magenta). Runs of equal colour
// along a row are drawn as one rectangle of one path per colour, so a file is
// at most about 0.3 MB (128 x 128 cells, each unlike its neighbours) and
// usually far smaller.
#ifndef KEEL_WORKER_ENGINE_OUTLIER_MAPS_H_
#define KEEL_WORKER_ENGINE_OUTLIER_MAPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/outliers.h"
#include "kernels/base/status.h"

namespace keel {

// The SVG document of one operand's map (o.map_mean over o.grid); title is
// shown above it (layer, role, step).
std::string BlockMapSvg(const OperandOutliers& o, const std::string& title);

// Writes every map of one analytics step: results are slots x kRoleCount
// (Backend::ReadOutlierAnalytics), linear_names the slots' layer names; a
// result without a map is skipped. dir is created. *written: files written.
Status WriteBlockMaps(const std::string& dir, int64_t step, const std::vector<std::string>& linear_names,
                      const std::vector<OperandOutliers>& results, int* written);

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_OUTLIER_MAPS_H_
