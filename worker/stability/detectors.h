// Stability detectors: functions of a run's metric stream that fire when a
// low-precision run starts to go wrong (docs/design.md defines the terms). They run
// inside the trainer after every step, on the values StepMetrics already holds,
// so they cost no extra device work.
//
// Detectors and their defaults (each can be configured or disabled):
//   nonfinite         loss or global grad norm is NaN or Inf.                       on
//   loss_zscore       (loss - mean) / std over the previous `window` steps > z,
//                     once `min_samples` are there (OLMo-core's spike rule):
//                     window 128, min_samples 64, z 6.                              on
//   loss_ratio        loss / running mean of the previous `window` steps > ratio
//                     for more than `steps` consecutive steps (llm-foundry's):
//                     ratio 2, steps 4, window 128, min_samples 64.                  on
//   grad_norm_zscore  the z-score rule on the global grad norm.                     on
//   grad_norm_ratio   the ratio rule on the global grad norm.                       on
//   grad_bias         on each gradient-bias probe (probe_every): cosine < min_cosine,
//                     or |zeta| > max_abs_zeta, or rel_error > max_rel_error, for
//                     `consecutive` probes in a row; scope "overall" or "any_layer":
//                     min_cosine -1 (off), max_abs_zeta 0.9, max_rel_error 0 (off),
//                     consecutive 2, scope overall.                                 off
//   saturation        the saturated (clipped) fraction of an operand role, over all
//                     linear layers, above max_fraction: max_fraction 0.05,
//                     roles all.                                                    off
//   gamma_growth      the largest per-layer change of LN gamma mean over the last
//                     `window` steps, per step, above max_rate: window 200,
//                     max_rate 0.0005.                                              off
//   loss_drift        a slow rise, not a spike: the median loss of the last
//                     `window` steps above `ratio` x the lowest such median since
//                     the start or the last reset, once `min_samples` steps are
//                     seen; then it re-arms (forgets its history): window 256,
//                     min_samples 512, ratio 2.                                     off
//   hot_channel_growth CHON's outlier warning, on outlier-analytics steps
//                     (analytics_every): some layer's operand has its top-1
//                     channel magnitude over the median channel above `ratio` x
//                     the lowest such value of its previous `window` analytics
//                     steps, once `min_samples` of them are seen: window 8,
//                     min_samples 4, ratio 4.                                       off
// Statistics are over the steps before the current one (the current value never
// dilutes its own spike), and non-finite values are kept out of them.
#ifndef KEEL_WORKER_STABILITY_DETECTORS_H_
#define KEEL_WORKER_STABILITY_DETECTORS_H_

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "worker/run/step_metrics.h"

namespace keel {

struct DetectorConfig {
  bool enabled = true;
  // zscore / ratio
  int window = 128;
  int min_samples = 64;
  double z = 6.0;
  double ratio = 2.0;
  int steps = 4;
  // grad_bias
  double min_cosine = -1.0;  // -1: off (no cosine is below it)
  double max_abs_zeta = 0.9;
  double max_rel_error = 0.0;
  int consecutive = 2;
  std::string scope = "overall";
  // saturation
  double max_fraction = 0.05;
  std::vector<std::string> roles;  // empty: every role
  // gamma_growth
  double max_rate = 0.0005;
};

// One parameter a detector accepts in a policy (policy.detectors.NAME.KEY):
// its key, its kind and range, and the DetectorConfig field it sets. The run
// config parser reads a detector's keys from this table and nothing else.
struct DetectorParam {
  enum class Kind {
    kInt,     // an integer in [min, max]         -> int_field
    kFloat,   // a finite number in [min, max]    -> float_field
    kChoice,  // one of `choices`                 -> string_field
    kRoles,   // a list of operand role names     -> DetectorConfig::roles
  };
  const char* key;
  Kind kind;
  double min = 0, max = 0;
  std::vector<std::string> choices;
  int DetectorConfig::*int_field = nullptr;
  double DetectorConfig::*float_field = nullptr;
  std::string DetectorConfig::*string_field = nullptr;
};

// A detector: its name, whether it runs when a policy does not mention it, and
// the parameters it accepts besides `enabled`. Configuring an off-by-default
// detector with a mapping turns it on.
struct DetectorInfo {
  std::string name;
  bool on_by_default;
  std::vector<DetectorParam> params;
};

// Every detector, in the order of the table above.
const std::vector<DetectorInfo>& Detectors();
// The detector called `name`, or nullptr.
const DetectorInfo* FindDetector(const std::string& name);

// Names in the order above; DefaultDetectorConfig gives each one's defaults.
const std::vector<std::string>& DetectorNames();
DetectorConfig DefaultDetectorConfig(const std::string& name);

// A detector that fired on a step, with the values behind it.
struct Firing {
  std::string detector;
  std::string message;                        // "loss 3.2 is 8.1 sigma above the mean 0.41 of 128 steps"
  std::map<std::string, double> values;       // {"loss": 3.2, "z": 8.1, "mean": 0.41, ...}
};

class DetectorSet {
 public:
  // configs: by detector name; missing names take their defaults.
  explicit DetectorSet(const std::map<std::string, DetectorConfig>& configs);
  // Feeds one step's metrics; returns the detectors that fired on it.
  std::vector<Firing> Observe(const StepMetrics& m);
  // Forgets the history (after a rollback the stream restarts from there).
  void Reset();
  // The run moved to another scheme: grad_bias counts its probes in a row
  // afresh (the old scheme's probes say nothing of the new one's bias); the
  // loss and grad-norm statistics carry on.
  void SchemeSwitched() { bias_run_ = 0; }

 private:
  struct Series {
    std::deque<double> values;
    int over_ratio = 0;  // consecutive steps above the ratio
  };
  void Spike(const std::string& zscore, const std::string& ratio, const std::string& what, double value,
             Series* series, std::vector<Firing>* out);
  bool On(const std::string& name) const;

  std::map<std::string, DetectorConfig> configs_;
  Series loss_, grad_norm_;
  int bias_run_ = 0;  // consecutive probes over a grad_bias threshold
  // loss_drift: the last `window` finite losses, the lowest median of a full
  // window since the last reset, and the steps seen since then.
  std::deque<double> drift_values_;
  double drift_best_ = 0;
  bool drift_has_best_ = false;
  int64_t drift_seen_ = 0;
  void Drift(double loss, std::vector<Firing>* out);
  // hot_channel_growth: per "linear role", the previous analytics steps'
  // top-1-over-median values (at most `window`).
  std::map<std::string, std::deque<double>> hot_;
  void HotChannelGrowth(const StepMetrics& m, std::vector<Firing>* out);
  std::deque<std::pair<int64_t, std::map<std::string, double>>> gamma_;  // (step, LN gamma means)
};

}  // namespace keel

#endif  // KEEL_WORKER_STABILITY_DETECTORS_H_
