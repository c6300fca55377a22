// The decisions and arithmetic inside the trainer's phases (trainer.cc:
// Trainer::Step's forward/backward, metrics, stability controller and optimizer,
// and Train's cadences), as pure functions of plain values, so that each is
// tested on its own (step_phases_test.cc). The trainer calls exactly these; the
// order of every floating-point operation is the one the trainer has always
// used, so runs stay bit-for-bit reproducible across this split.
#ifndef KEEL_WORKER_ENGINE_STEP_PHASES_H_
#define KEEL_WORKER_ENGINE_STEP_PHASES_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/nn.h"
#include "worker/config/run_config.h"
#include "worker/engine/model.h"
#include "worker/run/step_metrics.h"
#include "worker/stability/policy.h"

namespace keel {

// Cadences (probe, evaluation, checkpoints, progress): true when `step` is a
// multiple of `period`; never when period <= 0, which turns the cadence off.
bool EveryNth(int64_t step, int64_t period);

// num / den, or 0 when den <= 0 (no weights, no time measured).
double SafeRatio(double num, double den);

// Learning rate for optimizer step `step` (0-based) of a `steps`-step run from
// `base_lr` (the config's lr times the policy's scale): linear warmup over
// warmup_steps, then constant, or cosine / linear decay to base_lr *
// min_lr_ratio at the last step; inside the injected spike (spike_at, 1-based,
// for spike_steps steps) everything is multiplied by spike_factor.
double ScheduledLearningRate(const ScheduleConfig& schedule, double base_lr, int64_t steps, int64_t step);

// Global-norm clipping, folded into the gradient scale the optimizer applies:
// clip / grad_norm when clip > 0 and grad_norm is above it, else 1.
float ClipScale(double grad_norm, float clip);

// The layer group a parameter's norms are reported under: its block ("0",
// "1", ...), "embed" for the token and position embeddings, else "final".
std::string ParamGroup(const ParamInfo& param);

// Per-parameter values summed by group. `order` lists the groups as they first
// appear; sums add in parameter order (the trainer's order, kept for
// reproducibility).
struct GroupSums {
  std::vector<std::string> order;
  std::map<std::string, double> by_group;
  double total = 0;
};
// Sums values[first + i] under groups[i] for every i < groups.size().
GroupSums SumByGroup(const std::vector<std::string>& groups, const std::vector<double>& values,
                     size_t first = 0);
// sqrt of each group's sum (sums of squares -> norms), in group order.
std::vector<GroupValue> GroupNorms(const GroupSums& squares);
// |delta| / |weights| per group, in the order of `weights` (0 where a group's
// weights are all 0).
std::vector<GroupValue> GroupRatios(const GroupSums& delta_squares, const GroupSums& weight_squares);

// The quantized operands' saturation and NaN-block fractions from the
// backend's counters (linear-major, kRoleCount roles each). Roles that counted
// no elements (fp32 operands) are left out.
std::vector<OperandMetric> OperandMetrics(const std::vector<OperandStats>& counters,
                                          const std::vector<std::string>& linear_names);

// Mean and standard deviation (population) of one layernorm gain vector.
StepMetrics::LnGamma GainStats(const std::string& name, const std::vector<float>& gamma);

// The gradient-bias probe's values (step_metrics.h ProbeValues) from
// <g_q, g>, |g_q|^2 and |g|^2.
ProbeValues ProbeValuesFrom(double cross, double quantized_squares, double reference_squares);

// Whether any of a step's policy decisions skips its update (a skip_step among
// the actions the engine decided on, which an escalation keeps).
bool SkipsUpdate(const std::vector<PolicyEngine::Decision>& decisions);

// What a policy decision's events carry: the rule, each firing detector's
// values ("<detector>.<value>") and the firing detectors' names as details,
// and the cause "rule NAME (message; message)" that ends every event message.
struct DecisionEvidence {
  std::vector<std::pair<std::string, std::string>> details;
  std::string cause;
};
DecisionEvidence EvidenceOf(const PolicyEngine::Decision& decision);

// The checkpoint directories to delete after writing the one of step
// `written`, keeping `keep` in all (0: keep all): the oldest of the others go,
// and the one just written always stays, even when later steps exist (a run
// restarted from scratch in an old run directory). `existing`: ascending by
// step, as ListCheckpoints gives them.
std::vector<std::string> CheckpointsToPrune(const std::vector<std::pair<int64_t, std::string>>& existing,
                                            int64_t written, int keep);

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_STEP_PHASES_H_
