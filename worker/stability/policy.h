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
//     snapshots: {every: 100, keep: 8, memory_mib: 16384}  # the ring rollbacks return to:
//                                       # in host memory if it fits memory_mib, else on disk
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
//         cooldown: 200                 # steps before this rule may fire again, once the run is
//                                       # past the step where it fired (default 100)
//         max: 3                        # times this rule may fire (0, default: no limit)
//     probation: {after: 300}           # optional: after 300 healthy steps in a scheme the
//                                       # policy moved up to, back down one rung (once it
//                                       # diverges there, never again)
//     sweep_rules:                      # keeld, across a sweep's runs (SweepRule below)
//       - {when_diverged: 2, scheme: mxfp4, switch: mxfp6_e2m3}
//
// Or the preset, with nothing to tune (DefaultPolicy below; docs/train.md):
//
//   policy: default
//   policy: {preset: default, probation: {after: 300}}
//
// No identical replay: a rule whose actions are a rollback alone is refused
// (ValidateRule), and when a rule fires again before the run has passed the
// step where it last fired, the engine escalates instead of repeating the rule
// (PolicyEngine::Decide): the next rung of the ladder, then the learning-rate
// fallback, then stop.
//
// Manual interventions (keel intervene) take the same path: a command the
// trainer applies before its next step (trainer.h ProcessCommands).
#ifndef KEEL_WORKER_STABILITY_POLICY_H_
#define KEEL_WORKER_STABILITY_POLICY_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/base/status.h"
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

// Refuses a rule that could only replay itself: one whose actions are a
// rollback alone (skip_step aside), which would run the same steps in the same
// scheme at the same learning rate and diverge the same way. `field` names the
// rule ("policy.rules[0]") in the message.
Status ValidateRule(const PolicyRule& rule, const std::string& field);

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

// policy.snapshots.memory_mib's default (DefaultSnapshotMemoryMib): an eighth
// of the host's memory, at most 16 GiB. 16 GiB hold the default policy's 12
// snapshots (weights and both Adam moments, 12 bytes a parameter) of a model up
// to 110M parameters, and the 6 a rollback needs up to 220M; a larger model's
// go to disk.
constexpr int64_t kSnapshotMemoryCapMib = 16384;
int64_t DefaultSnapshotMemoryMib(int64_t host_mib);

struct Policy {
  std::string preset;  // "default" for `policy: default`; "" for a policy written out
  std::map<std::string, DetectorConfig> detectors;  // every detector, defaults filled in
  std::vector<std::string> ladder;
  int snapshot_every = 0;  // 0: the run's checkpoint_every
  int snapshot_keep = 0;   // 0: the run's keep_checkpoints
  // Where the snapshots live (Trainer::StartPolicy): in host memory when
  // snapshot_keep of them (or at least enough for the longest rollback) fit in
  // this many MiB; else on disk, as checkpoints. 0: always on disk; -1 (not
  // given): DefaultSnapshotMemoryMib of the host's memory.
  int64_t snapshot_memory_mib = -1;
  int max_interventions = 5;
  std::vector<PolicyRule> rules;
  std::vector<SweepRule> sweep_rules;
  // probation: {after: N}: after N healthy steps (no rule fired) in a scheme the
  // policy moved up to, go back down one rung, never below the run's starting
  // scheme; once a rule fires after such a return, the run stays up. 0: off.
  int64_t probation_after = 0;
  // The escalation past the ladder's top: scale the learning rate by
  // lr_fallback_factor, at most lr_fallbacks times (`lr_fallbacks: N`, also
  // beside `preset: default`), then stop as diverged.
  double lr_fallback_factor = 0.5;
  int lr_fallbacks = 1;  // a policy written out; the preset sets 3
  // rewarm: N: after every switch the policy makes (a rule's or probation's),
  // the learning rate starts again from 1/N of its value and ramps linearly
  // back to it over N steps (a new warm-up: Adam's moments were shaped by the
  // old scheme's rounding). 0: off.
  int64_t rewarm_steps = 0;
  // rollback: N beside `preset: default`: how far back its blow-up rule rolls
  // back (at least N steps, to the newest snapshot there). 0: the preset's (2 S).
  int64_t rollback_steps = 0;
  std::string yaml;        // the section as given, for checkpoints and events

  bool active() const { return !rules.empty(); }
};

// The most learning-rate fallbacks a policy may take (0.5^8: 1/256 of the rate).
constexpr int kMaxLrFallbacks = 8;

// The policies a config can name (`policy: NAME`): today only "default".
struct PolicyPresetInfo {
  std::string name;
  std::string summary;  // one line for `keel-train presets --policies`
};
const std::vector<PolicyPresetInfo>& PolicyPresets();
std::string PolicyPresetNames();  // comma-separated, for error messages

// `policy: default` for a run of `run_steps` steps starting in ladder[0]
// (`ladder`: RescueLadder of the run's scheme, worker/config/scheme.h; it ends at
// fp32). One rule, "blow-up": nonfinite, or the loss or grad norm 30 sigma
// above its running mean, or the loss 10x its running mean for 4 steps ->
// rollback, switch next. The thresholds are relative to the run's own running
// statistics; the distances scale with the run's length (S = run_steps / 90
// clamped to 1 .. 100: the tuned 9000-step run's 100): snapshots every S steps (12 kept), rollback 2 S (at
// least twice min_samples), the statistics' min_samples 2 S clamped to 8 .. 64 (window twice that), cooldown
// min_samples, and a re-warm of the learning rate over 2 S steps after each
// switch. max_interventions is the longest escalation the ladder allows,
// so the policy never goes quiet before its stop. A second rule, "drift",
// moves up a rung when the median loss of a window settles above a ratio of
// its lowest: 2x, or 1.1x for a language model (`language_model`: the run
// reads token shards, IsLanguageModel), whose loss lies between its healthy
// level and ln(vocab) and so cannot double from anywhere above ln(vocab) / 2.
// bias_rule (for a language model whose ladder's first rung is its start with
// the head in BF16: RescueLadder, a start that rounds its head to 8 bits or
// fewer) adds a third rule, "bias": the gradient-bias probe's |zeta| above 0.1
// on 3 probes in a row -> switch next.
// docs/train.md has the table.
Policy DefaultPolicy(const std::vector<std::string>& ladder, int64_t run_steps, bool language_model, bool bias_rule);

// The probe cadence a language model's `policy: default` sets when the run did
// not give probe_every: every 100 steps, or steps / 30 (at least 1) on a run
// shorter than 3000, so that the bias rule sees its probes before the end.
int DefaultProbeEvery(int64_t run_steps);

// The longest rollback any of the policy's rules takes, in steps (0: none).
int64_t LongestRollback(const Policy& p);
// How many snapshots, taken every `every` steps, a rollback of `rollback_steps`
// from any step needs: the newest ceil(rollback_steps / every) + 1.
int64_t SnapshotsForRollback(int64_t rollback_steps, int64_t every);

// What a PolicyEngine has learnt during a run: what escalates a rule that fires
// again instead of replaying it, what the learning-rate fallback has spent,
// and probation's progress. Checkpoints carry it (trainer.h SaveCheckpoint) so
// that a restart (keel-worker's requeue, --resume, keeld moving the run) does
// not forget it and replay a blow-up the run has already been rescued from.
struct PolicyState {
  struct Rule {
    int64_t tick = 0;  // the tick of its last firing (cooldowns)
    int64_t step = 0;  // the step number of its last firing (escalation)
    int times = 0;     // its firings so far (PolicyRule::max)
    bool operator==(const Rule& o) const { return tick == o.tick && step == o.step && times == o.times; }
  };
  // The steps the run has taken when the state was saved: the trainer's count
  // (cooldowns are in these ticks, which rollbacks do not rewind), kept
  // beside the engine's state so that both resume together.
  int64_t tick = 0;
  std::map<std::string, Rule> rules;  // rule name -> its last firing; rules that never fired are absent
  int interventions = 0;
  int lr_fallbacks_used = 0;
  // Probation: the scheme the policy last moved to (probation applies only
  // there), the tick since which the run has been healthy in it, whether the
  // run came down by probation, and whether probation is over (it stays up).
  std::string policy_scheme;
  int64_t healthy_since = 0;
  bool returned = false;
  bool probation_over = false;

  bool operator==(const PolicyState& o) const;
  bool operator!=(const PolicyState& o) const { return !(*this == o); }
};

// The state as one line of JSON (version 1):
//   {"version":1,"tick":46,"rules":{"blow-up":{"tick":31,"step":30,"times":1}},
//    "interventions":1,"lr_fallbacks_used":0,"policy_scheme":"mxfp8_e4m3",
//    "healthy_since":31,"returned":false,"probation_over":false}
std::string PolicyStateToJson(const PolicyState& state);
// Parses PolicyStateToJson's text. Every key above is required and no other is
// allowed; counts and ticks are non-negative integers. An error names `where`
// (the file), the field, the value and what is allowed; *out is unchanged on error.
Status ParsePolicyState(const std::string& text, const std::string& where, PolicyState* out);

// Decides, step by step, which rules act (cooldowns and caps included), and
// what they do: a rule's actions with `switch: next` resolved against the
// scheme running, or an escalation instead of an identical replay.
class PolicyEngine {
 public:
  // `start_scheme`: the run's starting scheme, below which probation never goes.
  explicit PolicyEngine(const Policy& policy, std::string start_scheme = "")
      : policy_(policy), start_scheme_(std::move(start_scheme)) {}

  struct Decision {
    const PolicyRule* rule = nullptr;
    std::vector<Firing> firings;  // the detectors of the rule that fired
    // What to do, in order: the rule's actions with every `switch: next`
    // resolved to a scheme name, or, when `escalation` says so, instead of them.
    std::vector<PolicyAction> actions;
    // Empty when the rule acts as written; else what the engine did instead
    // and why ("rule spike fired again at step 412 before passing step 450
    // where it last fired: escalating to bf16 instead of replaying").
    std::string escalation;
    // Set when this firing ended probation (the run stays up from now on).
    std::string probation_over;
  };
  // The rules that act on this step's firings, in rule order. `tick` counts the
  // steps taken (it keeps increasing across rollbacks); cooldowns are in ticks
  // and hold a rule back only once the run is past the step where it last
  // fired (in a replay, a firing is a new divergence and escalates at once).
  // `step` is the step number just taken (a rollback moves it back); `scheme`
  // the scheme that ran it.
  //
  // A rule that fires at a step not past the step where it last fired (the
  // run rolled back and diverged again on the way) does not repeat itself: it
  // keeps its rollbacks and skip_step and, instead of its other actions, moves
  // one rung up the ladder from `scheme`; with no rung above, scales the
  // learning rate (lr_fallbacks times); after that, stops. A `switch: next`
  // with no rung above escalates the same way.
  std::vector<Decision> Decide(int64_t tick, int64_t step, const std::string& scheme,
                               const std::vector<Firing>& fired);
  // Probation, after a step's decisions were applied with `scheme` now
  // running: the rung to go back down to now, or "" (sets up the next one).
  std::string ProbationReturn(int64_t tick, const std::string& scheme);
  // The ladder rung after `scheme`; "" when `scheme` is the last rung; the last
  // rung (the most precise) when `scheme` is not on the ladder.
  std::string NextRung(const std::string& scheme) const;
  int interventions() const { return state_.interventions; }
  bool exhausted() const { return state_.interventions >= policy_.max_interventions; }
  bool probation_over() const { return state_.probation_over; }

  // What the engine has learnt, with `tick` (the caller's count of steps
  // taken) in it, for a checkpoint; Restore puts a saved state back (a resume),
  // and returns the tick saved with it. A PolicyState{} is a fresh engine's.
  PolicyState State(int64_t tick) const;
  int64_t Restore(const PolicyState& state);

 private:
  // The escalation of `rule` from `scheme`: *d's actions and its message's end.
  void Escalate(const PolicyRule& rule, const std::string& scheme, const std::string& why, Decision* d);

  const Policy& policy_;
  const std::string start_scheme_;
  PolicyState state_;  // its tick unused: the caller counts the ticks
};

}  // namespace keel

#endif  // KEEL_WORKER_STABILITY_POLICY_H_
