// The kinds of run events (keel.proto Event.kind; keel-train's events.jsonl
// "kind"), defined once for keel-train, keel-worker, keeld and the keel CLI,
// and the kinds of the command files keel-worker hands a trainer.
//
// Written by keel-train: the policy's and commands' actions (switch_precision,
// rollback, scale_lr, skip_step, stop), escalate, probation, checkpoint_skipped,
// command_failed.
// Written by keel-worker: command_failed (a command it could not hand on).
// Written by keeld: state, restart, intervention_requested, sweep_rule,
// metrics_gap.
#ifndef KEEL_PROTO_EVENT_KINDS_H_
#define KEEL_PROTO_EVENT_KINDS_H_

#include <string>

namespace keel {
namespace event_kind {

constexpr char kState[] = "state";                    // a run state change (details: state)
constexpr char kRestart[] = "restart";                // requeued after a failure or a lost worker
constexpr char kSwitchPrecision[] = "switch_precision";  // details: from, precision
constexpr char kRollback[] = "rollback";              // details: from_step, to_step, checkpoint[, precision]
constexpr char kScaleLr[] = "scale_lr";
constexpr char kSkipStep[] = "skip_step";
constexpr char kStop[] = "stop";                      // the policy ended the run as diverged
// Why a policy did something other than its rule as written: a rule that fired
// again before passing the step where it last fired, or at the ladder's top
// (details: rule, step, from, to). The actions' own events follow it.
constexpr char kEscalate[] = "escalate";
constexpr char kProbation[] = "probation";            // a firing after probation's return: the run stays up
constexpr char kInterventionRequested[] = "intervention_requested";  // keel intervene, before the trainer acts
constexpr char kSweepRule[] = "sweep_rule";           // a sweep rule switched the run
constexpr char kCommandFailed[] = "command_failed";
constexpr char kCheckpointSkipped[] = "checkpoint_skipped";  // details: checkpoint, reason, resumed_from
constexpr char kRankMismatch[] = "rank_mismatch";     // ranks' weight hashes differ (details: step, hashes)
constexpr char kMetricsGap[] = "metrics_gap";         // details: first_step, last_step, missing, attempt

// The stability interventions a trainer reports (policy rules or commands),
// as keel_interventions_total{action} counts them, in this order.
constexpr const char* kInterventions[] = {kSwitchPrecision, kRollback, kScaleLr, kSkipStep, kStop};

inline bool IsIntervention(const std::string& kind) {
  for (const char* k : kInterventions) {
    if (kind == k) return true;
  }
  return false;
}

// Kinds after which the run trains in another precision scheme or from an
// earlier step: what keel plot marks on a run's curve.
inline bool ChangesTrajectory(const std::string& kind) { return kind == kSwitchPrecision || kind == kRollback; }

}  // namespace event_kind
}  // namespace keel

#endif  // KEEL_PROTO_EVENT_KINDS_H_
