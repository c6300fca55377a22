// Stability detectors (see detectors.h).
#include "worker/stability/detectors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace keel {
namespace {

std::string Num(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", v);
  return text;
}

}  // namespace

namespace {

using Kind = DetectorParam::Kind;

DetectorParam IntParam(const char* key, int lo, int hi, int DetectorConfig::*field) {
  return {key, Kind::kInt, static_cast<double>(lo), static_cast<double>(hi), {}, field};
}

DetectorParam FloatParam(const char* key, double lo, double hi, double DetectorConfig::*field) {
  return {key, Kind::kFloat, lo, hi, {}, nullptr, field};
}

// The spike rules' parameters; the z-score rule and the ratio rule share window
// and min_samples.
std::vector<DetectorParam> ZscoreParams() {
  return {IntParam("window", 2, 1 << 20, &DetectorConfig::window),
          IntParam("min_samples", 2, 1 << 20, &DetectorConfig::min_samples),
          FloatParam("z", 0.5, 1e6, &DetectorConfig::z)};
}

std::vector<DetectorParam> RatioParams() {
  return {IntParam("window", 2, 1 << 20, &DetectorConfig::window),
          IntParam("min_samples", 2, 1 << 20, &DetectorConfig::min_samples),
          FloatParam("ratio", 1.0, 1e6, &DetectorConfig::ratio),
          IntParam("steps", 0, 1 << 20, &DetectorConfig::steps)};
}

std::vector<DetectorParam> GradBiasParams() {
  DetectorParam scope{"scope", Kind::kChoice};
  scope.choices = {"overall", "any_layer"};
  scope.string_field = &DetectorConfig::scope;
  return {FloatParam("min_cosine", -1.0, 1.0, &DetectorConfig::min_cosine),
          FloatParam("max_abs_zeta", 0.0, 1e6, &DetectorConfig::max_abs_zeta),
          FloatParam("max_rel_error", 0.0, 1e6, &DetectorConfig::max_rel_error),
          IntParam("consecutive", 1, 1 << 20, &DetectorConfig::consecutive), scope};
}

std::vector<DetectorInfo> BuildDetectors() {
  return {
      {"nonfinite", true, {}},
      {"loss_zscore", true, ZscoreParams()},
      {"loss_ratio", true, RatioParams()},
      {"grad_norm_zscore", true, ZscoreParams()},
      {"grad_norm_ratio", true, RatioParams()},
      {"grad_bias", false, GradBiasParams()},
      {"saturation", false,
       {FloatParam("max_fraction", 0.0, 1.0, &DetectorConfig::max_fraction),
        DetectorParam{"roles", Kind::kRoles}}},
      {"gamma_growth", false,
       {IntParam("window", 2, 1 << 20, &DetectorConfig::window),
        FloatParam("max_rate", 0.0, 1e6, &DetectorConfig::max_rate)}},
      {"loss_drift", false,
       {IntParam("window", 2, 1 << 20, &DetectorConfig::window),
        IntParam("min_samples", 2, 1 << 20, &DetectorConfig::min_samples),
        FloatParam("ratio", 1.0, 1e6, &DetectorConfig::ratio)}},
      {"hot_channel_growth", false,
       {IntParam("window", 1, 1 << 20, &DetectorConfig::window),
        IntParam("min_samples", 1, 1 << 20, &DetectorConfig::min_samples),
        FloatParam("ratio", 1.0, 1e6, &DetectorConfig::ratio)}},
  };
}

}  // namespace

const std::vector<DetectorInfo>& Detectors() {
  static const std::vector<DetectorInfo>* detectors = new std::vector<DetectorInfo>(BuildDetectors());
  return *detectors;
}

const DetectorInfo* FindDetector(const std::string& name) {
  for (const DetectorInfo& info : Detectors()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

const std::vector<std::string>& DetectorNames() {
  static const std::vector<std::string>* names = [] {
    auto* out = new std::vector<std::string>;
    for (const DetectorInfo& info : Detectors()) out->push_back(info.name);
    return out;
  }();
  return *names;
}

DetectorConfig DefaultDetectorConfig(const std::string& name) {
  DetectorConfig c;
  const DetectorInfo* info = FindDetector(name);
  c.enabled = info != nullptr && info->on_by_default;
  if (name == "loss_drift") {
    c.window = 256;
    c.min_samples = 512;
  }
  if (name == "hot_channel_growth") {
    c.window = 8;
    c.min_samples = 4;
    c.ratio = 4.0;
  }
  return c;
}

DetectorSet::DetectorSet(const std::map<std::string, DetectorConfig>& configs) {
  for (const std::string& name : DetectorNames()) {
    auto it = configs.find(name);
    configs_[name] = it != configs.end() ? it->second : DefaultDetectorConfig(name);
  }
}

bool DetectorSet::On(const std::string& name) const { return configs_.at(name).enabled; }

void DetectorSet::Reset() {
  loss_ = Series();
  grad_norm_ = Series();
  bias_run_ = 0;
  gamma_.clear();
  drift_values_.clear();
  drift_has_best_ = false;
  drift_seen_ = 0;
  hot_.clear();
}

void DetectorSet::Drift(double loss, std::vector<Firing>* out) {
  const DetectorConfig& c = configs_.at("loss_drift");
  if (!c.enabled || !std::isfinite(loss)) return;
  drift_values_.push_back(loss);
  ++drift_seen_;
  while (drift_values_.size() > static_cast<size_t>(c.window)) drift_values_.pop_front();
  if (drift_values_.size() < static_cast<size_t>(c.window)) return;
  // The median: a few spiking steps (the spike rules' business) do not move it.
  std::vector<double> sorted(drift_values_.begin(), drift_values_.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (drift_seen_ >= c.min_samples && drift_has_best_ && drift_best_ > 0 && median > c.ratio * drift_best_) {
    out->push_back({"loss_drift", "the median loss of the last " + std::to_string(c.window) + " steps, " + Num(median) +
                                      ", is " + Num(median / drift_best_) + "x the lowest since the last reset, " +
                                      Num(drift_best_) + " (threshold " + Num(c.ratio) + ")",
                    {{"median", median}, {"best", drift_best_}, {"ratio", median / drift_best_}}});
    // Re-arm: the next firing needs a full history of its own.
    drift_values_.clear();
    drift_has_best_ = false;
    drift_seen_ = 0;
    return;
  }
  if (!drift_has_best_ || median < drift_best_) drift_best_ = median;
  drift_has_best_ = true;
}

void DetectorSet::Spike(const std::string& zscore, const std::string& ratio, const std::string& what,
                        double value, Series* s, std::vector<Firing>* out) {
  if (!std::isfinite(value)) return;  // nonfinite's business; keeps the statistics clean
  const DetectorConfig& zc = configs_.at(zscore);
  const DetectorConfig& rc = configs_.at(ratio);
  const size_t window = static_cast<size_t>(std::max(zc.window, rc.window));
  auto stats = [&](int last, double* mean, double* stddev) {
    const size_t n = std::min(static_cast<size_t>(last), s->values.size());
    double sum = 0, sq = 0;
    for (size_t i = s->values.size() - n; i < s->values.size(); ++i) sum += s->values[i];
    *mean = n ? sum / n : 0;
    for (size_t i = s->values.size() - n; i < s->values.size(); ++i) sq += (s->values[i] - *mean) * (s->values[i] - *mean);
    *stddev = n > 1 ? std::sqrt(sq / (n - 1)) : 0;
    return n;
  };
  if (zc.enabled) {
    double mean, stddev;
    size_t n = stats(zc.window, &mean, &stddev);
    if (static_cast<int>(n) >= zc.min_samples && stddev > 0) {
      double z = (value - mean) / stddev;
      if (z > zc.z) {
        out->push_back({zscore, what + " " + Num(value) + " is " + Num(z) + " sigma above the mean " + Num(mean) +
                                    " of the last " + std::to_string(n) + " steps (threshold " + Num(zc.z) + ")",
                        {{what, value}, {"z", z}, {"mean", mean}, {"std", stddev}}});
      }
    }
  }
  if (rc.enabled) {
    double mean, stddev;
    size_t n = stats(rc.window, &mean, &stddev);
    if (static_cast<int>(n) >= rc.min_samples && mean > 0 && value / mean > rc.ratio) {
      ++s->over_ratio;
      if (s->over_ratio > rc.steps) {
        out->push_back({ratio, what + " " + Num(value) + " has been above " + Num(rc.ratio) + "x its running mean " +
                                   Num(mean) + " for " + std::to_string(s->over_ratio) + " steps",
                        {{what, value}, {"ratio", value / mean}, {"mean", mean},
                         {"consecutive", static_cast<double>(s->over_ratio)}}});
      }
    } else {
      s->over_ratio = 0;
    }
  }
  s->values.push_back(value);
  while (s->values.size() > window) s->values.pop_front();
}

void DetectorSet::HotChannelGrowth(const StepMetrics& m, std::vector<Firing>* out) {
  const DetectorConfig& c = configs_.at("hot_channel_growth");
  if (!c.enabled || m.outliers.empty()) return;
  double worst_growth = 0, worst_value = 0, worst_base = 0;
  std::string worst;
  int seen = 0;
  for (const OutlierMetric& o : m.outliers) {
    const std::string key = o.linear + " " + RoleName(o.role);
    std::deque<double>& history = hot_[key];
    const double v = o.top1_over_median;
    if (static_cast<int>(history.size()) >= c.min_samples && std::isfinite(v)) {
      const double base = *std::min_element(history.begin(), history.end());
      if (base > 0 && v > c.ratio * base && v / base > worst_growth) {
        worst_growth = v / base;
        worst_value = v;
        worst_base = base;
        worst = key;
        seen = static_cast<int>(history.size());
      }
    }
    if (std::isfinite(v)) history.push_back(v);
    while (static_cast<int>(history.size()) > c.window) history.pop_front();
  }
  if (worst.empty()) return;
  out->push_back({"hot_channel_growth", worst + ": top-1 channel " + Num(worst_value) + "x the median channel, " +
                                            Num(worst_growth) + "x its lowest " + Num(worst_base) + "x over the last " +
                                            std::to_string(seen) + " analytics steps (threshold " + Num(c.ratio) +
                                            "x)",
                  {{"top1_over_median", worst_value}, {"baseline", worst_base}, {"growth", worst_growth}}});
}

std::vector<Firing> DetectorSet::Observe(const StepMetrics& m) {
  std::vector<Firing> out;
  if (On("nonfinite") && (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm))) {
    out.push_back({"nonfinite", "loss " + Num(m.loss) + ", grad norm " + Num(m.grad_norm) + " (not finite)",
                   {{"loss", m.loss}, {"grad_norm", m.grad_norm}}});
  }
  Spike("loss_zscore", "loss_ratio", "loss", m.loss, &loss_, &out);
  Spike("grad_norm_zscore", "grad_norm_ratio", "grad_norm", m.grad_norm, &grad_norm_, &out);
  Drift(m.loss, &out);
  HotChannelGrowth(m, &out);

  const DetectorConfig& bias = configs_.at("grad_bias");
  if (bias.enabled && m.probed) {
    auto bad = [&](const ProbeValues& v) {
      return v.cosine < bias.min_cosine ||
             (bias.max_abs_zeta > 0 && std::fabs(v.zeta) > bias.max_abs_zeta) ||
             (bias.max_rel_error > 0 && v.rel_error > bias.max_rel_error) || !std::isfinite(v.cosine);
    };
    bool over = bad(m.probe);
    std::string where = "overall";
    ProbeValues worst = m.probe;
    if (bias.scope == "any_layer") {
      for (const ProbeLayer& l : m.probe_layers) {
        if (bad(l.values)) {
          over = true;
          where = "layer " + l.name;
          worst = l.values;
          break;
        }
      }
    }
    bias_run_ = over ? bias_run_ + 1 : 0;
    if (over && bias_run_ >= bias.consecutive) {
      out.push_back({"grad_bias", "gradient bias (" + where + "): cosine " + Num(worst.cosine) + ", zeta " +
                                      Num(worst.zeta) + ", rel. error " + Num(worst.rel_error) + " for " +
                                      std::to_string(bias_run_) + " probes in a row",
                     {{"cosine", worst.cosine}, {"zeta", worst.zeta}, {"rel_error", worst.rel_error},
                      {"consecutive", static_cast<double>(bias_run_)}}});
    }
  }

  const DetectorConfig& sat = configs_.at("saturation");
  if (sat.enabled && !m.operands.empty()) {
    std::map<std::string, std::pair<double, int>> by_role;  // mean over linear layers
    for (const OperandMetric& o : m.operands) {
      auto& acc = by_role[RoleName(o.role)];
      acc.first += o.saturated;
      acc.second += 1;
    }
    for (const auto& kv : by_role) {
      if (!sat.roles.empty() && std::find(sat.roles.begin(), sat.roles.end(), kv.first) == sat.roles.end()) continue;
      const double fraction = kv.second.first / kv.second.second;
      if (fraction > sat.max_fraction) {
        out.push_back({"saturation", "role " + kv.first + ": " + Num(100 * fraction) + "% of values clipped (threshold " +
                                         Num(100 * sat.max_fraction) + "%)",
                       {{"fraction", fraction}}});
        break;
      }
    }
  }

  const DetectorConfig& gamma = configs_.at("gamma_growth");
  if (gamma.enabled && !m.ln_gamma.empty()) {
    std::map<std::string, double> means;
    for (const StepMetrics::LnGamma& g : m.ln_gamma) means[g.name] = g.mean;
    if (!gamma_.empty() && m.step - gamma_.front().first >= gamma.window) {
      const auto& old = gamma_.front();
      double worst = 0;
      std::string layer;
      for (const auto& kv : means) {
        auto it = old.second.find(kv.first);
        if (it == old.second.end()) continue;
        double rate = std::fabs(kv.second - it->second) / static_cast<double>(m.step - old.first);
        if (rate > worst) {
          worst = rate;
          layer = kv.first;
        }
      }
      if (worst > gamma.max_rate) {
        out.push_back({"gamma_growth", layer + " mean moves " + Num(worst) + " per step over " +
                                           std::to_string(m.step - old.first) + " steps (threshold " +
                                           Num(gamma.max_rate) + ")",
                       {{"rate", worst}}});
      }
    }
    gamma_.push_back({m.step, means});
    while (!gamma_.empty() && m.step - gamma_.front().first > gamma.window) gamma_.pop_front();
  }
  return out;
}

}  // namespace keel
