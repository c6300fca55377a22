// The pure parts of the trainer's phases (see step_phases.h).
#include "worker/engine/step_phases.h"

#include <algorithm>
#include <cmath>

#include "worker/io/json.h"

namespace keel {

bool EveryNth(int64_t step, int64_t period) { return period > 0 && step % period == 0; }

double SafeRatio(double num, double den) { return den > 0 ? num / den : 0.0; }

double ScheduledLearningRate(const ScheduleConfig& s, double base_lr, int64_t steps, int64_t step) {
  double lr = base_lr;
  if (s.spike_at > 0 && step + 1 >= s.spike_at && step + 1 < s.spike_at + s.spike_steps) lr *= s.spike_factor;
  if (step < s.warmup_steps) return lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.type == "constant") return lr;
  const double span = std::max<int64_t>(1, steps - s.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  const double min_lr = lr * s.min_lr_ratio;
  if (s.type == "cosine") return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  return lr - (lr - min_lr) * progress;  // linear
}

float ClipScale(double grad_norm, float clip) {
  if (clip > 0 && grad_norm > clip) return static_cast<float>(clip / grad_norm);
  return 1.0f;
}

std::string ParamGroup(const ParamInfo& p) {
  if (p.block >= 0) return std::to_string(p.block);
  if (p.name == "wte" || p.name == "wpe") return "embed";
  return "final";
}

GroupSums SumByGroup(const std::vector<std::string>& groups, const std::vector<double>& values, size_t first) {
  GroupSums sums;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string& g = groups[i];
    if (!sums.by_group.count(g)) sums.order.push_back(g);
    sums.by_group[g] += values[first + i];
    sums.total += values[first + i];
  }
  return sums;
}

std::vector<GroupValue> GroupNorms(const GroupSums& squares) {
  std::vector<GroupValue> norms;
  for (const std::string& g : squares.order) norms.push_back({g, std::sqrt(squares.by_group.at(g))});
  return norms;
}

std::vector<GroupValue> GroupRatios(const GroupSums& delta, const GroupSums& weights) {
  std::vector<GroupValue> ratios;
  for (const std::string& g : weights.order) {
    const auto d = delta.by_group.find(g);
    const double delta_squares = d == delta.by_group.end() ? 0.0 : d->second;
    ratios.push_back({g, SafeRatio(std::sqrt(delta_squares), std::sqrt(weights.by_group.at(g)))});
  }
  return ratios;
}

std::vector<OperandMetric> OperandMetrics(const std::vector<OperandStats>& counters,
                                          const std::vector<std::string>& linear_names) {
  std::vector<OperandMetric> out;
  for (size_t s = 0; s < linear_names.size(); ++s) {
    for (int r = 0; r < kRoleCount; ++r) {
      const OperandStats& c = counters[s * kRoleCount + r];
      if (c.elements == 0) continue;  // fp32 roles record nothing
      OperandMetric o;
      o.linear = linear_names[s];
      o.role = static_cast<Role>(r);
      o.saturated = SafeRatio(static_cast<double>(c.saturated), static_cast<double>(c.elements));
      o.nan_blocks = SafeRatio(static_cast<double>(c.nan_blocks), static_cast<double>(c.blocks));
      out.push_back(o);
    }
  }
  return out;
}

StepMetrics::LnGamma GainStats(const std::string& name, const std::vector<float>& gamma) {
  const double count = static_cast<double>(gamma.size());
  double sum = 0, sq = 0;
  for (float g : gamma) sum += g;
  const double mean = sum / count;
  for (float g : gamma) sq += (g - mean) * (g - mean);
  return {name, mean, std::sqrt(sq / count)};
}

ProbeValues ProbeValuesFrom(double c, double qq, double gg) {
  ProbeValues v;
  v.cosine = SafeRatio(c, std::sqrt(qq) * std::sqrt(gg));
  v.rel_error = SafeRatio(std::sqrt(std::max(0.0, qq - 2 * c + gg)), std::sqrt(gg));
  v.zeta = SafeRatio(c - gg, gg);
  return v;
}

bool SkipsUpdate(const std::vector<PolicyEngine::Decision>& decisions) {
  for (const PolicyEngine::Decision& d : decisions) {
    for (const PolicyAction& a : d.actions) {
      if (a.kind == PolicyAction::Kind::kSkipStep) return true;
    }
  }
  return false;
}

DecisionEvidence EvidenceOf(const PolicyEngine::Decision& d) {
  DecisionEvidence e;
  e.details = {{"rule", d.rule->name}};
  std::string detectors, reasons;
  for (const Firing& f : d.firings) {
    detectors += (detectors.empty() ? "" : ",") + f.detector;
    reasons += (reasons.empty() ? "" : "; ") + f.message;
    for (const auto& v : f.values) e.details.push_back({f.detector + "." + v.first, JsonNumber(v.second)});
  }
  e.details.push_back({"detectors", detectors});
  e.cause = "rule " + d.rule->name + " (" + reasons + ")";
  return e;
}

std::vector<std::string> CheckpointsToPrune(const std::vector<std::pair<int64_t, std::string>>& existing,
                                            int64_t written, int keep) {
  if (keep <= 0) return {};
  std::vector<std::string> others;
  for (const auto& c : existing) {
    if (c.first != written) others.push_back(c.second);
  }
  // The one just written is one of the `keep`: keep - 1 of the others stay.
  std::vector<std::string> prune;
  for (size_t i = 0; i + keep < others.size() + 1; ++i) prune.push_back(others[i]);
  return prune;
}

}  // namespace keel
