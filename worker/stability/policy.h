// Stability policies: "when these detectors fire, do these actions"
// (docs/design.md defines the terms). A run's policy comes from its config's `policy:`
// section (a sweep's `policy:` is copied into each of its runs); the trainer
// evaluates it after every step (PolicyEngine), so an intervention costs no
// network round trip.
//
//   policy:
//     detectors:                 # overrides of detectors.h's defaults
//       loss_zscore: {z: 6, window: 128, min_samples: 64}
//       grad_bias: {enabled: true, max_abs_zeta: 0.9, consecutive: 2}
//     ladder: [mxfp4, mxfp6_e2m3, mxfp8_e4m3, mx_w_e4m3_a_bf16, bf16]
//     snapshots: {every: 100, keep: 8}   # on-disk checkpoint ring for rollbacks
//     max_interventions: 5              # per run (default 5)
//     rules:
//       - name: spike                   # default "rule<i>"
//         when: [loss_zscore, loss_ratio, nonfinite]
//         match: any                    # any (default) | all
//         do:
//           - rollback: {steps: 200}    # newest snapshot >= 200 steps back; same data replayed
//           - switch: next              # next rung of the ladder, or a scheme name
//           - scale_lr: 0.5             # multiply the learning rate from now on
//           - skip_step                 # do not apply this step's update
//           - stop                      # end the run as diverged (keel-train exit 3)
//         cooldown: 200                 # steps before this rule may fire again (default 100)
//         max: 3                        # times this rule may fire (0, default: no limit)
//     sweep_rules:                      # keeld, across a sweep's runs (SweepRule below)
//       - {when_diverged: 2, scheme: mxfp4, switch: mxfp6_e2m3}
//
// Manual interventions (keel intervene) take the same path: a command the
// trainer applies before its next step (trainer.h ProcessCommands).
#ifndef KEEL_WORKER_STABILITY_POLICY_H_
#define KEEL_WORKER_STABILITY_POLICY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/stability/detectors.h"

namespace keel {

struct PolicyAction {
  enum class Kind { kSwitch, kRollback, kScaleLr, kSkipStep, kStop };
  Kind kind = Kind::kSwitch;
  std::string scheme;     // kSwitch: a preset name or "next"
  int64_t steps = 0;      // kRollback
  double factor = 1.0;    // kScaleLr
};
const char* ActionName(PolicyAction::Kind kind);  // switch, rollback, scale_lr, skip_step, stop

struct PolicyRule {
  std::string name;
  std::vector<std::string> when;  // detector names
  bool match_all = false;
  std::vector<PolicyAction> actions;
  int64_t cooldown = 100;
  int max = 0;
};

// A sweep-level rule, applied by keeld (not the trainer): once `diverged` runs
// of one scheme in a sweep have ended DIVERGED, that scheme's other runs switch
// to `switch_to` (running ones at their next step, queued ones before they start).
//   sweep_rules:
//     - {when_diverged: 2, scheme: mxfp4, switch: mxfp6_e2m3}   # scheme: any (default)
struct SweepRule {
  int diverged = 1;
  std::string scheme = "any";
  std::string switch_to;
};

struct Policy {
  std::map<std::string, DetectorConfig> detectors;  // every detector, defaults filled in
  std::vector<std::string> ladder;
  int snapshot_every = 0;  // 0: the run's checkpoint_every
  int snapshot_keep = 0;   // 0: the run's keep_checkpoints
  int max_interventions = 5;
  std::vector<PolicyRule> rules;
  std::vector<SweepRule> sweep_rules;
  std::string yaml;        // the section as given, for checkpoints and events

  bool active() const { return !rules.empty(); }
};

// Decides, step by step, which rules act (cooldowns and caps included).
class PolicyEngine {
 public:
  explicit PolicyEngine(const Policy& policy) : policy_(policy) {}

  struct Decision {
    const PolicyRule* rule = nullptr;
    std::vector<Firing> firings;  // the detectors of the rule that fired
  };
  // The rules that act on this step's firings, in rule order. `tick` counts the
  // steps taken (it keeps increasing across rollbacks); cooldowns are in ticks.
  std::vector<Decision> Decide(int64_t tick, const std::vector<Firing>& fired);
  // The ladder rung after `scheme`; "" when `scheme` is the last rung; the last
  // rung (the most precise) when `scheme` is not on the ladder.
  std::string NextRung(const std::string& scheme) const;
  int interventions() const { return interventions_; }
  bool exhausted() const { return interventions_ >= policy_.max_interventions; }

 private:
  const Policy& policy_;
  std::map<std::string, int64_t> last_fired_;  // rule name -> step
  std::map<std::string, int> times_;           // rule name -> count
  int interventions_ = 0;
};

}  // namespace keel

#endif  // KEEL_WORKER_STABILITY_POLICY_H_
