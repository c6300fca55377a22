// Policy decisions (see policy.h).
#include "worker/stability/policy.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>

#include "worker/io/json.h"

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
       "on a slow drift (the median loss of 256 steps at 2x its best, 1.1x for a language model) move one rung "
       "up without a rollback; "
       "past fp32 halve the learning rate up to three times, then stop as diverged"},
  };
  return *presets;
}

std::string PolicyPresetNames() {
  std::string names;
  for (const PolicyPresetInfo& p : PolicyPresets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

Policy DefaultPolicy(const std::vector<std::string>& ladder, int64_t run_steps, bool language_model, bool bias_rule) {
  Policy p;
  p.preset = "default";
  p.ladder = ladder;
  for (const std::string& name : DetectorNames()) p.detectors[name] = DefaultDetectorConfig(name);
  // Distances in steps follow the run's length: the tuned proxy run
  // (examples/proxy_mxfp8_e4m3_policy_tuned.yaml, 9000 steps) snapshotted every
  // 100 steps; a short run keeps the same proportions.
  const int snapshot = static_cast<int>(std::min<int64_t>(100, std::max<int64_t>(1, run_steps / 90)));
  // A rollback restores the statistics of the step it returns to; after a
  // restart from disk they start afresh (DetectorSet::Reset), and min_samples
  // stays at most half the rollback so that even then a replay that diverges
  // again is seen before it passes the step where the rule fired.
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
  // Two snapshots back (200 steps of a 9000-step run), or twice min_samples
  // on a short run. In the policy grid (docs/reproductions/policy-grid.md,
  // sessions 35-36) a rollback of 200 rescued as many blow-ups as one of 500
  // (29 of 39 pairs against 28) with about half the replayed steps: the loss
  // gave no warning a longer rollback would have got behind.
  PolicyAction rollback;
  rollback.kind = PolicyAction::Kind::kRollback;
  rollback.steps = std::max(2 * snapshot, 2 * min_samples);
  PolicyAction next;
  next.kind = PolicyAction::Kind::kSwitch;
  next.scheme = "next";
  rule.actions = {rollback, next};
  rule.cooldown = min_samples;
  // A slow drift after a rescue (docs/reproductions/policy-grid.md, session 27):
  // the loss settles several times above its best level with no spike the rule
  // above sees. One rung up from where the run is: a rollback would land inside
  // the drift. The window is 256 steps on a 9000-step run, in proportion on a
  // shorter one, and the median keeps single spikes out. A language model's
  // loss starts at ln(vocab) and lives below it, so doubling is out of reach
  // from 5.4 nats up (GPT-2's vocabulary): there 1.1x. In session 31's GPT
  // slices (policy-grid.md) no bf16 or healthy MXFP8 run's median rose 1.05x
  // above its lowest; the MXFP4 runs that diverged at lr 2e-3 passed 1.1x
  // about when they blew up, where the rule above acted 60-630 steps later
  // or not at all.
  const int drift_window = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(16, run_steps / 36)));
  DetectorConfig& drift = p.detectors["loss_drift"];
  drift.enabled = true;
  drift.window = drift_window;
  drift.min_samples = 2 * drift_window;
  drift.ratio = language_model ? 1.1 : 2;
  PolicyRule drift_rule;
  drift_rule.name = "drift";
  drift_rule.when = {"loss_drift"};
  drift_rule.actions = {next};
  drift_rule.cooldown = drift_window;
  p.rules = {rule, drift_rule};
  // Only where the caller says (bias_rule: a language model whose ladder's
  // first rung moves the head to BF16), the remedy the evidence below supports;
  // a start with its head in BF16 already (bf16, the NVFP4 recipe, CHON) gets
  // neither the rule nor the probe.
  if (bias_rule) {
    // Multiplicative gradient bias, the MX instability's cause (the MX paper;
    // the probe's zeta). In session 32's GPT runs (docs/reproductions/policy-grid.md)
    // every MXFP8 and MXFP4 run whose head was MX had |zeta| 0.12-1.1 from its
    // first probes on and trained to 1.2-1.9x bf16's loss; with the head in
    // BF16 |zeta| fell to 0.01-0.07 and the loss followed bf16's.
    DetectorConfig& bias = p.detectors["grad_bias"];
    bias.enabled = true;
    bias.max_abs_zeta = 0.1;
    bias.consecutive = 3;
    PolicyRule bias_rule;
    bias_rule.name = "bias";
    bias_rule.when = {"grad_bias"};
    bias_rule.actions = {next};
    bias_rule.cooldown = min_samples;
    p.rules.push_back(bias_rule);
  }
  // Where the ladder is spent (fp32 itself blows up: depth 8 at lr 1e-3 in the
  // grid), the learning rate halves up to three times before the run stops:
  // with one halving 4 of those 9 blow-ups were rescued, with three 8.
  p.lr_fallbacks = 3;
  // Each firing moves up a rung, falls back on the learning rate or stops;
  // probation can bring the run down once per rung, and one climb back follows;
  // a drift can take a rung too.
  const int rungs = static_cast<int>(ladder.size());
  p.max_interventions = 3 * std::max(0, rungs - 1) + p.lr_fallbacks + 1;
  // The next rung replaying from the snapshot blew up within a few steps of
  // the switch in the policy grid (docs/reproductions/policy-grid.md): each
  // switch restarts the learning rate's warm-up.
  p.rewarm_steps = 2 * snapshot;
  return p;
}

int64_t LongestRollback(const Policy& p) {
  int64_t longest = 0;
  for (const PolicyRule& rule : p.rules) {
    for (const PolicyAction& a : rule.actions) {
      if (a.kind == PolicyAction::Kind::kRollback) longest = std::max(longest, a.steps);
    }
  }
  return longest;
}

int64_t SnapshotsForRollback(int64_t rollback_steps, int64_t every) { return (rollback_steps + every - 1) / every + 1; }

int64_t DefaultSnapshotMemoryMib(int64_t host_mib) { return std::min(kSnapshotMemoryCapMib, std::max<int64_t>(0, host_mib / 8)); }

int DefaultProbeEvery(int64_t run_steps) {
  return static_cast<int>(std::min<int64_t>(100, std::max<int64_t>(1, run_steps / 30)));
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
  } else if (state_.lr_fallbacks_used < policy_.lr_fallbacks) {
    ++state_.lr_fallbacks_used;
    up.kind = PolicyAction::Kind::kScaleLr;
    up.factor = policy_.lr_fallback_factor;
    d->escalation = why + ": no rung above " + scheme + ", scaling the learning rate by " +
                    Number(up.factor) + " (fallback " + std::to_string(state_.lr_fallbacks_used) + " of " +
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
    const auto found = state_.rules.find(rule.name);
    const PolicyState::Rule* last = found == state_.rules.end() ? nullptr : &found->second;
    // The cooldown holds back a rule only once the run is past the step where
    // it last fired: in a replay (a rollback went back before that step) the
    // steps that made it fire are gone, and a firing there is a new divergence
    // of the replay, which escalates at once (no blind steps after a rescue).
    if (last && tick - last->tick < rule.cooldown && step > last->step) continue;
    if (rule.max > 0 && last && last->times >= rule.max) continue;
    if (last && step <= last->step) {
      const std::string again = "rule " + rule.name + " fired again at step " + std::to_string(step);
      Escalate(rule, scheme,
               step == last->step
                   ? again + ", the step where it last fired"
                   : again + " before passing step " + std::to_string(last->step) + " where it last fired",
               &d);
    } else {
      for (PolicyAction a : rule.actions) {
        if (a.kind == PolicyAction::Kind::kSwitch && a.scheme == "next") {
          const std::string next = NextRung(scheme);
          if (next.empty()) {
            // The top of the ladder. A rule that also changes the learning rate
            // still makes a change: it acts as written and the trainer records
            // the switch as skipped. A rule whose only change was the switch
            // takes the rest of the escalation instead, never a replay.
            const bool scales_lr = std::any_of(rule.actions.begin(), rule.actions.end(), [](const PolicyAction& x) {
              return x.kind == PolicyAction::Kind::kScaleLr;
            });
            if (scales_lr) {
              d.actions.push_back(a);  // "next" left unresolved: switch_skipped
              continue;
            }
            Escalate(rule, scheme, "rule " + rule.name + " fired at step " + std::to_string(step) + " on " + scheme +
                                       ", the top of the ladder", &d);
            break;
          }
          a.scheme = next;
        }
        d.actions.push_back(a);
      }
    }
    if (state_.returned && !state_.probation_over) {
      state_.probation_over = true;
      d.probation_over = "rule " + rule.name + " fired at step " + std::to_string(step) + " on " + scheme +
                         ", where probation had brought the run back down: it stays up for the rest of the run";
    }
    for (const PolicyAction& a : d.actions) {
      if (a.kind == PolicyAction::Kind::kSwitch) state_.policy_scheme = a.scheme;
    }
    state_.healthy_since = tick;
    PolicyState::Rule& fired_rule = state_.rules[rule.name];
    fired_rule.tick = tick;
    fired_rule.step = step;
    ++fired_rule.times;
    ++state_.interventions;
    out.push_back(std::move(d));
  }
  return out;
}

std::string PolicyEngine::ProbationReturn(int64_t tick, const std::string& scheme) {
  if (policy_.probation_after <= 0 || state_.probation_over) return "";
  // Only a scheme the policy moved to; one someone else chose (keel intervene)
  // is theirs to keep.
  if (scheme != state_.policy_scheme) return "";
  if (tick - state_.healthy_since < policy_.probation_after) return "";
  const auto& ladder = policy_.ladder;
  const auto here = std::find(ladder.begin(), ladder.end(), scheme);
  const auto floor = std::find(ladder.begin(), ladder.end(), start_scheme_);
  if (here == ladder.end() || floor == ladder.end() || here <= floor) return "";
  state_.policy_scheme = *(here - 1);
  state_.healthy_since = tick;
  state_.returned = true;
  return state_.policy_scheme;
}

PolicyState PolicyEngine::State(int64_t tick) const {
  PolicyState s = state_;
  s.tick = tick;
  return s;
}

int64_t PolicyEngine::Restore(const PolicyState& state) {
  state_ = state;
  state_.tick = 0;
  return state.tick;
}

bool PolicyState::operator==(const PolicyState& o) const {
  return tick == o.tick && rules == o.rules && interventions == o.interventions &&
         lr_fallbacks_used == o.lr_fallbacks_used && policy_scheme == o.policy_scheme &&
         healthy_since == o.healthy_since && returned == o.returned && probation_over == o.probation_over;
}

namespace {

constexpr int64_t kPolicyStateVersion = 1;

// One member of the state's JSON: a non-negative integer that fits `max`.
Status StateCount(const JsonValue& object, const std::string& key, const std::string& where, int64_t max,
                  int64_t* out) {
  const JsonValue* v = object.Find(key);
  if (v == nullptr) return Status::DataLoss(where + ": " + key + " is missing (allowed: an integer >= 0)");
  if (!v->is_int() || v->int_value() < 0 || v->int_value() > max) {
    return Status::DataLoss(where + ": " + key + " is " + ToJson(*v) + " (allowed: an integer 0 .. " +
                            std::to_string(max) + ")");
  }
  *out = v->int_value();
  return Status::Ok();
}

Status StateBool(const JsonValue& object, const std::string& key, const std::string& where, bool* out) {
  const JsonValue* v = object.Find(key);
  if (v == nullptr || !v->is_bool()) {
    return Status::DataLoss(where + ": " + key + " is " + (v ? ToJson(*v) : std::string("missing")) +
                            " (allowed: true or false)");
  }
  *out = v->bool_value();
  return Status::Ok();
}

// Refuses members of `object` other than `keys`.
Status OnlyKeys(const JsonValue& object, const std::vector<std::string>& keys, const std::string& where) {
  for (const auto& m : object.members()) {
    if (std::find(keys.begin(), keys.end(), m.first) == keys.end()) {
      std::string allowed;
      for (const std::string& k : keys) allowed += (allowed.empty() ? "" : ", ") + k;
      return Status::DataLoss(where + ": unknown field " + m.first + " (allowed: " + allowed + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string PolicyStateToJson(const PolicyState& state) {
  JsonValue rules = JsonValue::Object();
  for (const auto& r : state.rules) {
    JsonValue rule = JsonValue::Object();
    rule.Set("tick", JsonValue(r.second.tick));
    rule.Set("step", JsonValue(r.second.step));
    rule.Set("times", JsonValue(r.second.times));
    rules.Set(r.first, rule);
  }
  JsonValue v = JsonValue::Object();
  v.Set("version", JsonValue(kPolicyStateVersion));
  v.Set("tick", JsonValue(state.tick));
  v.Set("rules", rules);
  v.Set("interventions", JsonValue(state.interventions));
  v.Set("lr_fallbacks_used", JsonValue(state.lr_fallbacks_used));
  v.Set("policy_scheme", JsonValue(state.policy_scheme));
  v.Set("healthy_since", JsonValue(state.healthy_since));
  v.Set("returned", JsonValue(state.returned));
  v.Set("probation_over", JsonValue(state.probation_over));
  return ToJson(v);
}

Status ParsePolicyState(const std::string& text, const std::string& where, PolicyState* out) {
  JsonValue v;
  Status parsed = ParseJson(text, &v);
  if (!parsed.ok()) return Status::DataLoss(where + ": not JSON (" + parsed.message() + ")");
  if (!v.is_object()) return Status::DataLoss(where + ": is " + ToJson(v) + " (allowed: a JSON object)");
  KEEL_RETURN_IF_ERROR(OnlyKeys(v,
                                {"version", "tick", "rules", "interventions", "lr_fallbacks_used", "policy_scheme",
                                 "healthy_since", "returned", "probation_over"},
                                where));
  int64_t version = 0;
  KEEL_RETURN_IF_ERROR(StateCount(v, "version", where, INT64_MAX, &version));
  if (version != kPolicyStateVersion) {
    return Status::DataLoss(where + ": version is " + std::to_string(version) + " (allowed: " +
                            std::to_string(kPolicyStateVersion) + ")");
  }
  PolicyState s;
  int64_t count = 0;
  KEEL_RETURN_IF_ERROR(StateCount(v, "tick", where, INT64_MAX, &s.tick));
  KEEL_RETURN_IF_ERROR(StateCount(v, "interventions", where, INT_MAX, &count));
  s.interventions = static_cast<int>(count);
  KEEL_RETURN_IF_ERROR(StateCount(v, "lr_fallbacks_used", where, INT_MAX, &count));
  s.lr_fallbacks_used = static_cast<int>(count);
  KEEL_RETURN_IF_ERROR(StateCount(v, "healthy_since", where, INT64_MAX, &s.healthy_since));
  KEEL_RETURN_IF_ERROR(StateBool(v, "returned", where, &s.returned));
  KEEL_RETURN_IF_ERROR(StateBool(v, "probation_over", where, &s.probation_over));
  const JsonValue* scheme = v.Find("policy_scheme");
  if (scheme == nullptr || !scheme->is_string()) {
    return Status::DataLoss(where + ": policy_scheme is " + (scheme ? ToJson(*scheme) : std::string("missing")) +
                            " (allowed: a scheme name, or \"\")");
  }
  s.policy_scheme = scheme->string_value();
  const JsonValue* rules = v.Find("rules");
  if (rules == nullptr || !rules->is_object()) {
    return Status::DataLoss(where + ": rules is " + (rules ? ToJson(*rules) : std::string("missing")) +
                            " (allowed: an object of rule name -> {tick, step, times})");
  }
  for (const auto& m : rules->members()) {
    const std::string field = "rules." + m.first;
    if (!m.second.is_object()) {
      return Status::DataLoss(where + ": " + field + " is " + ToJson(m.second) + " (allowed: {tick, step, times})");
    }
    KEEL_RETURN_IF_ERROR(OnlyKeys(m.second, {"tick", "step", "times"}, where + ": " + field));
    PolicyState::Rule r;
    KEEL_RETURN_IF_ERROR(StateCount(m.second, "tick", where + ": " + field, INT64_MAX, &r.tick));
    KEEL_RETURN_IF_ERROR(StateCount(m.second, "step", where + ": " + field, INT64_MAX, &r.step));
    KEEL_RETURN_IF_ERROR(StateCount(m.second, "times", where + ": " + field, INT_MAX, &count));
    r.times = static_cast<int>(count);
    s.rules[m.first] = r;
  }
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace keel
