// Policy decisions (see policy.h).
#include "worker/stability/policy.h"

#include <algorithm>
#include <cstdio>

namespace keel {
namespace {

std::string Number(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

bool Has(const std::vector<PolicyAction>& actions, PolicyAction::Kind kind) {
  for (const PolicyAction& a : actions) {
    if (a.kind == kind) return true;
  }
  return false;
}

}  // namespace

const char* ActionName(PolicyAction::Kind kind) {
  switch (kind) {
    case PolicyAction::Kind::kSwitch: return "switch";
    case PolicyAction::Kind::kRollback: return "rollback";
    case PolicyAction::Kind::kScaleLr: return "scale_lr";
    case PolicyAction::Kind::kSkipStep: return "skip_step";
    case PolicyAction::Kind::kStop: return "stop";
  }
  return "?";
}

Status ValidateRule(const PolicyRule& rule, const std::string& field) {
  const bool changes_the_replay = Has(rule.actions, PolicyAction::Kind::kSwitch) ||
                                  Has(rule.actions, PolicyAction::Kind::kScaleLr) ||
                                  Has(rule.actions, PolicyAction::Kind::kStop);
  if (Has(rule.actions, PolicyAction::Kind::kRollback) && !changes_the_replay) {
    std::string listed;
    for (const PolicyAction& a : rule.actions) listed += (listed.empty() ? "" : ", ") + std::string(ActionName(a.kind));
    return Status::InvalidField(
        field + ".do", "[" + listed + "] is a rollback alone: the run would replay the same steps in the same "
                       "scheme and diverge the same way (allowed: a rollback with switch, scale_lr or stop)");
  }
  return Status::Ok();
}

const std::vector<PolicyPresetInfo>& PolicyPresets() {
  static const std::vector<PolicyPresetInfo>* presets = new std::vector<PolicyPresetInfo>{
      {"default",
       "any run, nothing to tune: on a blow-up (non-finite, 30-sigma loss or grad-norm spike, loss 10x its "
       "mean) roll back and move one rung up the ladder derived from the run's scheme (ending at fp32); "
       "past fp32 halve the learning rate once, then stop as diverged"},
  };
  return *presets;
}

std::string PolicyPresetNames() {
  std::string names;
  for (const PolicyPresetInfo& p : PolicyPresets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

Policy DefaultPolicy(const std::vector<std::string>& ladder, int64_t run_steps) {
  Policy p;
  p.preset = "default";
  p.ladder = ladder;
  for (const std::string& name : DetectorNames()) p.detectors[name] = DefaultDetectorConfig(name);
  // Distances in steps follow the run's length: the tuned proxy run
  // (examples/proxy_mxfp8_e4m3_policy_tuned.yaml, 9000 steps) snapshotted every
  // 100 steps and rolled back 500; a short run keeps the same proportions.
  const int snapshot = static_cast<int>(std::min<int64_t>(100, std::max<int64_t>(1, run_steps / 90)));
  // The statistics restart after a rollback (DetectorSet::Reset): min_samples
  // stays under half the rollback so that a replay that diverges again is seen
  // before it passes the step where the rule fired.
  const int min_samples = std::min(64, std::max(8, 2 * snapshot));
  for (const char* name : {"loss_zscore", "grad_norm_zscore", "loss_ratio"}) {
    DetectorConfig& c = p.detectors[name];
    c.window = 2 * min_samples;
    c.min_samples = min_samples;
  }
  // z 30: the proxy's ordinary loss noise reached z 6-8, real blow-ups z > 1000.
  p.detectors["loss_zscore"].z = 30;
  p.detectors["grad_norm_zscore"].z = 30;
  p.detectors["loss_ratio"].ratio = 10;
  p.detectors["grad_norm_ratio"].enabled = false;  // fired on healthy grad-norm growth
  p.snapshot_every = snapshot;
  p.snapshot_keep = 12;
  PolicyRule rule;
  rule.name = "blow-up";
  rule.when = {"nonfinite", "grad_norm_zscore", "loss_zscore", "loss_ratio"};
  PolicyAction rollback;
  rollback.kind = PolicyAction::Kind::kRollback;
  rollback.steps = 5 * snapshot;
  PolicyAction next;
  next.kind = PolicyAction::Kind::kSwitch;
  next.scheme = "next";
  rule.actions = {rollback, next};
  rule.cooldown = min_samples;
  p.rules = {rule};
  // Each firing moves up a rung, falls back on the learning rate or stops;
  // probation can bring the run down once per rung, and one climb back follows.
  const int rungs = static_cast<int>(ladder.size());
  p.max_interventions = 2 * std::max(0, rungs - 1) + p.lr_fallbacks + 1;
  return p;
}

std::string PolicyEngine::NextRung(const std::string& scheme) const {
  const auto& ladder = policy_.ladder;
  auto it = std::find(ladder.begin(), ladder.end(), scheme);
  // A scheme off the ladder (a custom one, say) moves to its top rung, the most precise.
  if (it == ladder.end()) return ladder.empty() ? "" : ladder.back();
  ++it;
  return it == ladder.end() ? "" : *it;
}

void PolicyEngine::Escalate(const PolicyRule& rule, const std::string& scheme, const std::string& why,
                            Decision* d) {
  d->actions.clear();
  // The rollback stays (the state it diverged from is no better now) and so
  // does skip_step; the rest is one step up the escalation.
  for (const PolicyAction& a : rule.actions) {
    if (a.kind == PolicyAction::Kind::kRollback || a.kind == PolicyAction::Kind::kSkipStep) d->actions.push_back(a);
  }
  PolicyAction up;
  const std::string next = NextRung(scheme);
  if (!next.empty()) {
    up.kind = PolicyAction::Kind::kSwitch;
    up.scheme = next;
    d->escalation = why + ": escalating to " + next + " instead of replaying";
  } else if (lr_fallbacks_used_ < policy_.lr_fallbacks) {
    ++lr_fallbacks_used_;
    up.kind = PolicyAction::Kind::kScaleLr;
    up.factor = policy_.lr_fallback_factor;
    d->escalation = why + ": no rung above " + scheme + ", scaling the learning rate by " +
                    Number(up.factor) + " (fallback " + std::to_string(lr_fallbacks_used_) + " of " +
                    std::to_string(policy_.lr_fallbacks) + ")";
  } else {
    // Stopping where it diverged: no rollback first, the events and the final
    // checkpoint show the state the policy gave up on.
    d->actions.clear();
    up.kind = PolicyAction::Kind::kStop;
    d->escalation = why + ": no rung above " + scheme + " and the learning-rate fallback is spent, stopping the "
                    "run as diverged";
  }
  d->actions.push_back(up);
}

std::vector<PolicyEngine::Decision> PolicyEngine::Decide(int64_t tick, int64_t step, const std::string& scheme,
                                                         const std::vector<Firing>& fired) {
  std::vector<Decision> out;
  for (const PolicyRule& rule : policy_.rules) {
    if (exhausted()) break;
    Decision d;
    d.rule = &rule;
    for (const std::string& name : rule.when) {
      for (const Firing& f : fired) {
        if (f.detector == name) d.firings.push_back(f);
      }
    }
    std::vector<std::string> names;
    for (const Firing& f : d.firings) names.push_back(f.detector);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    const bool match = rule.match_all ? names.size() == rule.when.size() : !names.empty();
    if (!match) continue;
    auto last = last_fired_.find(rule.name);
    if (last != last_fired_.end() && tick - last->second < rule.cooldown) continue;
    if (rule.max > 0 && times_[rule.name] >= rule.max) continue;
    auto last_step = last_fired_step_.find(rule.name);
    if (last_step != last_fired_step_.end() && step <= last_step->second) {
      const std::string again = "rule " + rule.name + " fired again at step " + std::to_string(step);
      Escalate(rule, scheme,
               step == last_step->second
                   ? again + ", the step where it last fired"
                   : again + " before passing step " + std::to_string(last_step->second) + " where it last fired",
               &d);
    } else {
      for (PolicyAction a : rule.actions) {
        if (a.kind == PolicyAction::Kind::kSwitch && a.scheme == "next") {
          const std::string next = NextRung(scheme);
          if (next.empty()) {
            // The top of the ladder: the rest of the escalation, never a replay.
            Escalate(rule, scheme, "rule " + rule.name + " fired at step " + std::to_string(step) + " on " + scheme +
                                       ", the top of the ladder", &d);
            break;
          }
          a.scheme = next;
        }
        d.actions.push_back(a);
      }
    }
    if (returned_ && !probation_over_) {
      probation_over_ = true;
      d.probation_over = "rule " + rule.name + " fired at step " + std::to_string(step) + " on " + scheme +
                         ", where probation had brought the run back down: it stays up for the rest of the run";
    }
    for (const PolicyAction& a : d.actions) {
      if (a.kind == PolicyAction::Kind::kSwitch) policy_scheme_ = a.scheme;
    }
    healthy_since_ = tick;
    last_fired_[rule.name] = tick;
    last_fired_step_[rule.name] = step;
    ++times_[rule.name];
    ++interventions_;
    out.push_back(std::move(d));
  }
  return out;
}

std::string PolicyEngine::ProbationReturn(int64_t tick, const std::string& scheme) {
  if (policy_.probation_after <= 0 || probation_over_) return "";
  // Only a scheme the policy moved to; one someone else chose (keel intervene)
  // is theirs to keep.
  if (scheme != policy_scheme_) return "";
  if (tick - healthy_since_ < policy_.probation_after) return "";
  const auto& ladder = policy_.ladder;
  const auto here = std::find(ladder.begin(), ladder.end(), scheme);
  const auto floor = std::find(ladder.begin(), ladder.end(), start_scheme_);
  if (here == ladder.end() || floor == ladder.end() || here <= floor) return "";
  policy_scheme_ = *(here - 1);
  healthy_since_ = tick;
  returned_ = true;
  return policy_scheme_;
}

}  // namespace keel
