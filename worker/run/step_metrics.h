// What one optimizer step of keel-train measured: the metrics.jsonl line, the
// values the worker streams to keeld and what the stability detectors read.
#ifndef KEEL_WORKER_RUN_STEP_METRICS_H_
#define KEEL_WORKER_RUN_STEP_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/numeric_types.h"
#include "kernels/base/status.h"

namespace keel {

// What one optimizer step measured. Fractions are of the operand's elements
// (saturated) and blocks (nan_blocks) over the step's micro-batches.
struct OperandMetric {
  std::string linear;  // "blocks.0.fc1", "h.3.attn.c_attn", "lm_head"
  Role role;
  double saturated = 0;
  double nan_blocks = 0;
};

// Outlier analytics of one operand on an analytics step (kernels/outliers.h;
// docs/train.md, "Outlier analytics"): Pearson kurtosis, the largest channel
// max |x| over the median channel's, the fraction of nonzero elements NVFP4
// flushes to zero, the top-k channels (hottest first) and their Jaccard overlap
// with the previous analytics step's (absent on the first).
struct OutlierMetric {
  std::string linear;
  Role role;
  double kurtosis = 0, top1_over_median = 0, ftz_rate = 0;
  bool has_overlap = false;
  double hot_overlap = 0;
  std::vector<int64_t> hot;
};

struct GroupValue {
  std::string name;  // a block ("0", "1", ...) or "embed" / "head" / "final"
  double value = 0;
};

// The gradient-bias probe: the step's gradient g_q against the gradient g on the
// same weights and batch with unquantized (fp32) operands. cosine = <g_q, g> /
// (|g_q| |g|), rel_error = |g_q - g| / |g|, zeta = <g_q - g, g> / |g|^2 (the
// multiplicative bias of g_q = (1 + zeta) g).
struct ProbeValues {
  double cosine = 0, rel_error = 0, zeta = 0;
};
struct ProbeLayer {
  std::string name;
  ProbeValues values;
};

struct StepMetrics {
  int64_t step = 0;            // 1-based: the number of optimizer steps done
  int64_t unix_ms = 0;         // wall clock when the step ended
  int64_t attempt = 0;         // the run attempt under keel-worker (0: standalone, not written)
  double loss = 0;             // mean over the step's micro-batches
  double lr = 0;
  double tokens_per_s = 0;     // proxy: samples per second
  double step_seconds = 0;
  // Ranks (data parallel), by rank (rank 0 writes the line); empty for a run
  // of one rank: every rank's step time; its time in the gradient and weight
  // collectives (their own durations: a bucketed all-reduce as measured on the
  // communication thread or stream, which may overlap the backward); and the
  // part of that the rank waited for after its backward had finished (the
  // exposed time; overlap = 1 - exposed / comm).
  std::vector<double> rank_step_seconds, rank_comm_seconds, rank_comm_exposed_seconds;
  // Gradient buckets (dist.bucket_mb > 0 with ranks): how many this step's
  // gradient was reduced in, and how many of them started while the backward
  // still ran. 0: one reduction after the backward.
  int grad_buckets = 0, grad_buckets_early = 0;
  double grad_norm = 0;        // global, before clipping
  std::vector<GroupValue> grad_norms;     // per layer group
  double update_ratio = 0;     // |w_new - w_old| / |w_old|, global
  std::vector<GroupValue> update_ratios;  // per layer group
  struct LnGamma {
    std::string name;
    double mean = 0, std = 0;
  };
  std::vector<LnGamma> ln_gamma;
  std::vector<OperandMetric> operands;    // quantized roles only
  std::vector<OutlierMetric> outliers;    // analytics steps only, layer by layer
  bool probed = false;
  ProbeValues probe;
  std::vector<ProbeLayer> probe_layers;
  bool evaluated = false;
  double val_loss = 0;
  std::string scheme;          // the scheme's name during this step
  bool skipped = false;        // a policy skipped this step's update

  // One JSON object on one line (the metrics.jsonl format; docs/train.md).
  std::string ToJson() const;
};

// The fields of a metrics.jsonl line (StepMetrics::ToJson) that keel-worker
// and keeld read, with one rule for every reader: a number that is missing or
// not a number (null, a string other than "NaN"/"Infinity"/"-Infinity") reads
// as NaN; the non-finite strings read as their values.
// An operand's analytics scalars as a metric line holds them (hot_overlap NaN
// when the line has none).
struct OutlierValue {
  std::string linear, role;
  double kurtosis = 0, top1_over_median = 0, ftz_rate = 0, hot_overlap = 0;
};

struct MetricLine {
  int64_t step = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, grad_norm = 0;
  bool has_probe = false;  // the line holds a gradient-bias probe
  double probe_cosine = 0, probe_zeta = 0;
  bool has_saturation = false;  // the line holds quantized operands
  double max_saturated = 0;     // the largest saturated fraction over them
  std::vector<double> rank_step_seconds, rank_comm_seconds, rank_comm_exposed_seconds;  // by rank; empty: one rank
  bool has_analytics = false;           // the line is an analytics step's
  std::vector<OutlierValue> outliers;   // its operands, in the line's order
};

// Whether a metric line's text holds outlier analytics, without parsing it:
// keeld keeps the latest such line apart from the latest line.
bool MetricLineHasAnalytics(const std::string& line);

// Parses one line. Fails, naming what is wrong, when the line is not a JSON
// object or has no integer "step" >= 1.
Status ParseMetricLine(const std::string& line, MetricLine* out);

}  // namespace keel

#endif  // KEEL_WORKER_RUN_STEP_METRICS_H_
