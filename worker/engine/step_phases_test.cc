// The pure parts of the trainer's phases (step_phases.h): cadences, the
// learning-rate schedule, clipping, per-group sums and norms, operand and
// layernorm statistics, the probe's values, the stability controller's skip
// and evidence, and checkpoint pruning.
#include "worker/engine/step_phases.h"

#include <gtest/gtest.h>

#include <cmath>

namespace keel {
namespace {

TEST(StepPhasesTest, EveryNthIsOffForPeriodZeroOrBelow) {
  EXPECT_TRUE(EveryNth(10, 5));
  EXPECT_FALSE(EveryNth(11, 5));
  EXPECT_TRUE(EveryNth(7, 1));
  EXPECT_FALSE(EveryNth(10, 0));
  EXPECT_FALSE(EveryNth(10, -5));
}

TEST(StepPhasesTest, SafeRatioIsZeroWithoutADenominator) {
  EXPECT_DOUBLE_EQ(SafeRatio(3, 4), 0.75);
  EXPECT_EQ(SafeRatio(3, 0), 0.0);
  EXPECT_EQ(SafeRatio(3, -1), 0.0);
}

ScheduleConfig Schedule(const std::string& type, int warmup, float min_lr_ratio) {
  ScheduleConfig s;
  s.type = type;
  s.warmup_steps = warmup;
  s.min_lr_ratio = min_lr_ratio;
  return s;
}

TEST(StepPhasesTest, WarmupRisesLinearlyToTheBaseRate) {
  const ScheduleConfig s = Schedule("constant", 4, 0.0f);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 2.0, 100, 0), 0.5);  // step 1 of 4
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 2.0, 100, 2), 1.5);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 2.0, 100, 3), 2.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 2.0, 100, 50), 2.0);  // constant after
}

TEST(StepPhasesTest, CosineAndLinearDecayToTheMinimumRatio) {
  // 10 steps after 2 of warmup: progress (step - 2) / 10.
  const ScheduleConfig cosine = Schedule("cosine", 2, 0.5f);
  const ScheduleConfig linear = Schedule("linear", 2, 0.5f);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(cosine, 1.0, 12, 2), 1.0);   // progress 0
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(cosine, 1.0, 12, 7), 0.75);  // halfway: mean of 1 and 0.5
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(cosine, 1.0, 12, 12), 0.5);  // the end
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(cosine, 1.0, 12, 40), 0.5);  // past the end: held
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(linear, 1.0, 12, 2), 1.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(linear, 1.0, 12, 4), 0.9);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(linear, 1.0, 12, 12), 0.5);
  // Cosine lies above linear in the first half.
  EXPECT_GT(ScheduledLearningRate(cosine, 1.0, 12, 4), ScheduledLearningRate(linear, 1.0, 12, 4));
}

TEST(StepPhasesTest, SpikeMultipliesTheRateForItsSteps) {
  ScheduleConfig s = Schedule("constant", 0, 0.0f);
  s.spike_at = 3;  // 1-based: steps 3 and 4 are optimizer steps 2 and 3
  s.spike_steps = 2;
  s.spike_factor = 10.0f;
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 0.5, 100, 1), 0.5);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 0.5, 100, 2), 5.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 0.5, 100, 3), 5.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 0.5, 100, 4), 0.5);
  s.spike_at = 0;  // off
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(s, 0.5, 100, 2), 0.5);
}

TEST(StepPhasesTest, ClipScaleShrinksOnlyNormsAboveTheThreshold) {
  EXPECT_EQ(ClipScale(100.0, 0.0f), 1.0f);  // clipping off
  EXPECT_EQ(ClipScale(0.5, 1.0f), 1.0f);
  EXPECT_EQ(ClipScale(1.0, 1.0f), 1.0f);    // at the threshold: unchanged
  EXPECT_EQ(ClipScale(4.0, 1.0f), 0.25f);
  EXPECT_EQ(ClipScale(3.0, 1.5f), 0.5f);
}

ParamInfo Param(const std::string& name, int block) {
  ParamInfo p;
  p.name = name;
  p.block = block;
  return p;
}

TEST(StepPhasesTest, ParametersGroupByBlockEmbeddingOrFinal) {
  EXPECT_EQ(ParamGroup(Param("h.3.mlp.c_fc.weight", 3)), "3");
  EXPECT_EQ(ParamGroup(Param("wte", -1)), "embed");
  EXPECT_EQ(ParamGroup(Param("wpe", -1)), "embed");
  EXPECT_EQ(ParamGroup(Param("ln_f.weight", -1)), "final");
}

TEST(StepPhasesTest, SumByGroupKeepsFirstAppearanceOrderAndTheTotal) {
  const std::vector<std::string> groups = {"embed", "0", "0", "1", "final"};
  // Two halves, as the trainer reduces gradients and weights in one call.
  const std::vector<double> values = {1, 2, 3, 4, 5, 10, 20, 30, 40, 50};
  GroupSums first = SumByGroup(groups, values);
  EXPECT_EQ(first.order, (std::vector<std::string>{"embed", "0", "1", "final"}));
  EXPECT_EQ(first.by_group.at("0"), 5.0);
  EXPECT_EQ(first.by_group.at("final"), 5.0);
  EXPECT_EQ(first.total, 15.0);
  GroupSums second = SumByGroup(groups, values, groups.size());
  EXPECT_EQ(second.by_group.at("embed"), 10.0);
  EXPECT_EQ(second.by_group.at("0"), 50.0);
  EXPECT_EQ(second.total, 150.0);
}

TEST(StepPhasesTest, GroupNormsAndRatiosFollowTheGroupOrder) {
  const std::vector<std::string> groups = {"embed", "0", "1"};
  GroupSums weights = SumByGroup(groups, {16, 4, 0});
  GroupSums delta = SumByGroup(groups, {1, 1, 9});
  std::vector<GroupValue> norms = GroupNorms(weights);
  ASSERT_EQ(norms.size(), 3u);
  EXPECT_EQ(norms[0].name, "embed");
  EXPECT_EQ(norms[0].value, 4.0);
  EXPECT_EQ(norms[1].value, 2.0);
  std::vector<GroupValue> ratios = GroupRatios(delta, weights);
  ASSERT_EQ(ratios.size(), 3u);
  EXPECT_EQ(ratios[0].value, 0.25);  // 1 / 4
  EXPECT_EQ(ratios[1].value, 0.5);   // 1 / 2
  EXPECT_EQ(ratios[2].name, "1");
  EXPECT_EQ(ratios[2].value, 0.0);   // no weights: 0, not a division by zero
}

TEST(StepPhasesTest, OperandMetricsSkipUncountedRoles) {
  std::vector<OperandStats> counters(2 * kRoleCount);
  // Linear "a": only fwd_x counted; linear "b": only wgrad_dy, with no blocks.
  counters[static_cast<int>(Role::kFwdX)] = OperandStats{200, 50, 10, 1};
  counters[kRoleCount + static_cast<int>(Role::kWgradDy)] = OperandStats{8, 2, 0, 0};
  std::vector<OperandMetric> m = OperandMetrics(counters, {"a", "b"});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].linear, "a");
  EXPECT_EQ(m[0].role, Role::kFwdX);
  EXPECT_EQ(m[0].saturated, 0.25);
  EXPECT_EQ(m[0].nan_blocks, 0.1);
  EXPECT_EQ(m[1].linear, "b");
  EXPECT_EQ(m[1].role, Role::kWgradDy);
  EXPECT_EQ(m[1].saturated, 0.25);
  EXPECT_EQ(m[1].nan_blocks, 0.0);
}

TEST(StepPhasesTest, GainStatsArePopulationMeanAndDeviation) {
  StepMetrics::LnGamma g = GainStats("ln", {1.0f, 2.0f, 3.0f, 4.0f});
  EXPECT_EQ(g.name, "ln");
  EXPECT_EQ(g.mean, 2.5);
  EXPECT_DOUBLE_EQ(g.std, std::sqrt(1.25));
  g = GainStats("flat", {1.0f, 1.0f});
  EXPECT_EQ(g.mean, 1.0);
  EXPECT_EQ(g.std, 0.0);
}

TEST(StepPhasesTest, ProbeValuesMeasureDirectionErrorAndBias) {
  // g_q = g: |g|^2 = 4.
  ProbeValues same = ProbeValuesFrom(4, 4, 4);
  EXPECT_DOUBLE_EQ(same.cosine, 1.0);
  EXPECT_DOUBLE_EQ(same.rel_error, 0.0);
  EXPECT_DOUBLE_EQ(same.zeta, 0.0);
  // g_q = 2 g: same direction, |g_q - g| = |g|, 100% multiplicative bias.
  ProbeValues doubled = ProbeValuesFrom(8, 16, 4);
  EXPECT_DOUBLE_EQ(doubled.cosine, 1.0);
  EXPECT_DOUBLE_EQ(doubled.rel_error, 1.0);
  EXPECT_DOUBLE_EQ(doubled.zeta, 1.0);
  // Orthogonal unit vectors.
  ProbeValues orthogonal = ProbeValuesFrom(0, 1, 1);
  EXPECT_DOUBLE_EQ(orthogonal.cosine, 0.0);
  EXPECT_DOUBLE_EQ(orthogonal.rel_error, std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(orthogonal.zeta, -1.0);
  // No reference gradient: zeros, not NaN.
  ProbeValues none = ProbeValuesFrom(0, 1, 0);
  EXPECT_EQ(none.cosine, 0.0);
  EXPECT_EQ(none.rel_error, 0.0);
  EXPECT_EQ(none.zeta, 0.0);
}

PolicyRule Rule(const std::string& name, std::vector<PolicyAction::Kind> kinds) {
  PolicyRule r;
  r.name = name;
  for (PolicyAction::Kind k : kinds) {
    PolicyAction a;
    a.kind = k;
    r.actions.push_back(a);
  }
  return r;
}

TEST(StepPhasesTest, OnlyASkipStepActionSkipsTheUpdate) {
  using Kind = PolicyAction::Kind;
  const PolicyRule switch_rule = Rule("s", {Kind::kSwitch, Kind::kRollback});
  const PolicyRule skip_rule = Rule("k", {Kind::kStop, Kind::kSkipStep});
  EXPECT_FALSE(SkipsUpdate({}));
  EXPECT_FALSE(SkipsUpdate({{&switch_rule, {}, switch_rule.actions}}));
  EXPECT_TRUE(SkipsUpdate({{&switch_rule, {}, switch_rule.actions}, {&skip_rule, {}, skip_rule.actions}}));
  // The decided actions count, not the rule's: an escalation that stops instead.
  EXPECT_FALSE(SkipsUpdate({{&skip_rule, {}, switch_rule.actions}}));
}

TEST(StepPhasesTest, EvidenceNamesTheRuleTheDetectorsAndTheirValues) {
  const PolicyRule rule = Rule("spike", {PolicyAction::Kind::kStop});
  PolicyEngine::Decision d;
  d.rule = &rule;
  d.firings.push_back({"loss_zscore", "loss 3 is 8 sigma above", {{"z", 8.0}, {"loss", 3.0}}});
  d.firings.push_back({"nonfinite", "grad norm is NaN", {}});
  DecisionEvidence e = EvidenceOf(d);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"rule", "spike"}, {"loss_zscore.loss", "3"}, {"loss_zscore.z", "8"}, {"detectors", "loss_zscore,nonfinite"}};
  EXPECT_EQ(e.details, want);
  EXPECT_EQ(e.cause, "rule spike (loss 3 is 8 sigma above; grad norm is NaN)");
}

TEST(StepPhasesTest, PruningKeepsTheNewestAndTheOneJustWritten) {
  const std::vector<std::pair<int64_t, std::string>> four = {{1, "s1"}, {2, "s2"}, {3, "s3"}, {4, "s4"}};
  EXPECT_EQ(CheckpointsToPrune(four, 4, 2), (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(CheckpointsToPrune(four, 4, 4), std::vector<std::string>{});
  EXPECT_EQ(CheckpointsToPrune(four, 4, 0), std::vector<std::string>{});  // 0: keep all
  EXPECT_EQ(CheckpointsToPrune(four, 4, 1), (std::vector<std::string>{"s1", "s2", "s3"}));
  // A fresh run wrote step 1 into a directory with later steps: step 1 stays.
  EXPECT_EQ(CheckpointsToPrune(four, 1, 2), (std::vector<std::string>{"s2", "s3"}));
}

}  // namespace
}  // namespace keel
