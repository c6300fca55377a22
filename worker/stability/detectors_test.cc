// Detectors on synthetic metric streams at their documented defaults: each
// fires when it should and not before. Policies: rule matching, cooldowns,
// caps, the ladder, and parse errors with their YAML line.
#include "worker/stability/detectors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "worker/config/run_config.h"
#include "worker/stability/policy.h"
#include "yaml-cpp/yaml.h"

namespace keel {
namespace {

StepMetrics Step(int64_t step, double loss, double grad_norm = 1.0) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.grad_norm = grad_norm;
  return m;
}

// A noisy but stable stream: 1 +- 0.01 (deterministic).
double Noise(int64_t i) { return 0.01 * std::sin(0.7 * static_cast<double>(i)); }

std::vector<std::string> Names(const std::vector<Firing>& f) {
  std::vector<std::string> out;
  for (const Firing& x : f) out.push_back(x.detector);
  return out;
}

bool Has(const std::vector<Firing>& f, const std::string& name) {
  for (const Firing& x : f) {
    if (x.detector == name) return true;
  }
  return false;
}

TEST(DetectorsTest, DefaultsAreDocumented) {
  EXPECT_TRUE(DefaultDetectorConfig("loss_zscore").enabled);
  EXPECT_EQ(DefaultDetectorConfig("loss_zscore").window, 128);
  EXPECT_EQ(DefaultDetectorConfig("loss_zscore").min_samples, 64);
  EXPECT_EQ(DefaultDetectorConfig("loss_zscore").z, 6.0);
  EXPECT_EQ(DefaultDetectorConfig("loss_ratio").ratio, 2.0);
  EXPECT_EQ(DefaultDetectorConfig("loss_ratio").steps, 4);
  EXPECT_FALSE(DefaultDetectorConfig("grad_bias").enabled);
  EXPECT_FALSE(DefaultDetectorConfig("saturation").enabled);
  EXPECT_FALSE(DefaultDetectorConfig("loss_drift").enabled);
  EXPECT_EQ(DefaultDetectorConfig("loss_drift").window, 256);
  EXPECT_EQ(DefaultDetectorConfig("loss_drift").min_samples, 512);
  EXPECT_EQ(DefaultDetectorConfig("loss_drift").ratio, 2.0);
}

// loss_drift: a run that descends and then holds is left alone, and so is one
// with a few spiking steps (the median ignores them); a slow rise to 2x the
// lowest windowed median fires once, then re-arms and needs a full history
// again (a reset does the same).
TEST(DetectorsTest, LossDriftFiresOnASlowRiseNotOnDescentOrSpikes) {
  DetectorConfig c = DefaultDetectorConfig("loss_drift");
  c.enabled = true;
  c.window = 50;
  c.min_samples = 100;
  DetectorSet d({{"loss_drift", c}});
  int64_t step = 0;
  auto feed = [&](int n, const std::function<double(int)>& loss) {
    std::vector<int64_t> fired;
    for (int i = 0; i < n; ++i) {
      ++step;
      if (Has(d.Observe(Step(step, loss(i))), "loss_drift")) fired.push_back(step);
    }
    return fired;
  };
  // Descent from 1.0 to 0.1, then a plateau with noise and three spikes of 50x.
  EXPECT_TRUE(feed(300, [](int i) { return 0.1 + 0.9 * std::exp(-i / 40.0); }).empty());
  EXPECT_TRUE(feed(300, [](int i) { return (i % 97 == 5 ? 5.0 : 0.1) * (1 + Noise(i)); }).empty());
  // A slow drift: from 0.1 to 0.4 over 600 steps. It fires once the median of
  // the last 50 passes 0.2, not before, and only once until the history refills.
  std::vector<int64_t> fired = feed(600, [](int i) { return 0.1 * (1 + 3.0 * i / 600.0); });
  ASSERT_FALSE(fired.empty());
  EXPECT_GT(fired[0], 600 + 200);  // 0.2 is a third of the way: after ~200 steps plus half a window
  EXPECT_LT(fired[0], 600 + 300);
  for (size_t k = 1; k < fired.size(); ++k) EXPECT_GE(fired[k] - fired[k - 1], c.min_samples);
  // Disabled, or after a reset with too little history, nothing fires.
  d.Reset();
  EXPECT_TRUE(feed(99, [](int i) { return 0.1 * (1 + i); }).empty());
  DetectorSet off({});
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(Has(off.Observe(Step(i, 0.1 * (1 + i))), "loss_drift"));
}

// hot_channel_growth: a layer whose top-1 channel holds steady (transient
// spikes below the ratio) is left alone; one whose top-1 grows past 4x its
// lowest value of the last 8 analytics steps fires, naming the layer and role.
// Steps without analytics change nothing; off by default; a reset forgets.
TEST(DetectorsTest, HotChannelGrowthFiresWhenATopChannelGrows) {
  EXPECT_FALSE(DefaultDetectorConfig("hot_channel_growth").enabled);
  EXPECT_EQ(DefaultDetectorConfig("hot_channel_growth").window, 8);
  EXPECT_EQ(DefaultDetectorConfig("hot_channel_growth").min_samples, 4);
  EXPECT_EQ(DefaultDetectorConfig("hot_channel_growth").ratio, 4.0);
  DetectorConfig c = DefaultDetectorConfig("hot_channel_growth");
  c.enabled = true;
  DetectorSet d({{"hot_channel_growth", c}});
  auto analytics = [](int64_t step, double steady, double growing) {
    StepMetrics m = Step(step, 1.0);
    OutlierMetric a, b;
    a.linear = "layers.0.attn.qkv";
    a.role = Role::kFwdX;
    a.top1_over_median = steady;
    b.linear = "layers.3.attn.o_proj";
    b.role = Role::kFwdX;
    b.top1_over_median = growing;
    m.outliers = {a, b};
    return m;
  };
  int64_t step = 0;
  // Steady layers with a transient 3x spike: nothing.
  for (int i = 0; i < 12; ++i) {
    EXPECT_FALSE(Has(d.Observe(analytics(step += 10, 20.0 * (i == 6 ? 3.0 : 1.0), 30.0)), "hot_channel_growth")) << i;
    EXPECT_FALSE(Has(d.Observe(Step(++step, 1.0)), "hot_channel_growth"));  // no analytics on this step
  }
  // o_proj's top channel grows: 30 -> 100 (3.3x, not yet) -> 130 (4.3x: fires).
  EXPECT_FALSE(Has(d.Observe(analytics(step += 10, 20.0, 100.0)), "hot_channel_growth"));
  const std::vector<Firing> f = d.Observe(analytics(step += 10, 20.0, 130.0));
  ASSERT_TRUE(Has(f, "hot_channel_growth"));
  EXPECT_NE(f[0].message.find("layers.3.attn.o_proj fwd_x: top-1 channel 130x the median channel"), std::string::npos)
      << f[0].message;
  EXPECT_EQ(f[0].values.at("baseline"), 30.0);
  EXPECT_NEAR(f[0].values.at("growth"), 130.0 / 30.0, 1e-12);
  // After a reset, fewer than min_samples analytics steps: nothing.
  d.Reset();
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(Has(d.Observe(analytics(step += 10, 1.0, 1000.0 * (i + 1))), "hot_channel_growth"));
  DetectorSet off({});
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(Has(off.Observe(analytics(step += 10, 1.0, 10.0 * (1 << i))), "hot_channel_growth"));
}

TEST(DetectorsTest, NonFiniteFiresOnNanOrInf) {
  DetectorSet d({});
  EXPECT_TRUE(d.Observe(Step(1, 1.0)).empty());
  EXPECT_TRUE(Has(d.Observe(Step(2, std::nan(""))), "nonfinite"));
  EXPECT_TRUE(Has(d.Observe(Step(3, 1.0, std::numeric_limits<double>::infinity())), "nonfinite"));
}

TEST(DetectorsTest, ZscoreNeedsMinSamplesThenFiresAboveSixSigma) {
  DetectorSet d({});
  // Before 64 samples even a huge spike is ignored (not enough history).
  for (int i = 1; i <= 63; ++i) ASSERT_TRUE(d.Observe(Step(i, 1.0 + Noise(i))).empty()) << i;
  DetectorSet early({});
  for (int i = 1; i <= 10; ++i) early.Observe(Step(i, 1.0 + Noise(i)));
  EXPECT_FALSE(Has(early.Observe(Step(11, 100.0)), "loss_zscore"));
  // With history: 5 sigma does not fire, 7 sigma does.
  for (int i = 64; i <= 200; ++i) ASSERT_TRUE(d.Observe(Step(i, 1.0 + Noise(i))).empty()) << i;
  const double sigma = 0.01 / std::sqrt(2.0);  // std of 0.01 sin(.) ~ 0.00707
  EXPECT_FALSE(Has(d.Observe(Step(201, 1.0 + 5 * sigma)), "loss_zscore"));
  std::vector<Firing> f = d.Observe(Step(202, 1.0 + 7 * sigma));
  ASSERT_TRUE(Has(f, "loss_zscore")) << ::testing::PrintToString(Names(f));
  EXPECT_GT(f[0].values.at("z"), 6.0);
  EXPECT_NEAR(f[0].values.at("mean"), 1.0, 0.01);
}

TEST(DetectorsTest, RatioFiresOnlyAfterMoreThanFourConsecutiveSteps) {
  DetectorSet d({});
  for (int i = 1; i <= 100; ++i) d.Observe(Step(i, 1.0 + Noise(i)));
  // 2.5x the mean: steps 1..4 above the ratio do not fire; the 5th does.
  for (int k = 1; k <= 4; ++k) EXPECT_FALSE(Has(d.Observe(Step(100 + k, 2.5)), "loss_ratio")) << k;
  EXPECT_TRUE(Has(d.Observe(Step(105, 2.5)), "loss_ratio"));
  // A dip below the ratio resets the count.
  DetectorSet e({});
  for (int i = 1; i <= 100; ++i) e.Observe(Step(i, 1.0 + Noise(i)));
  for (int k = 1; k <= 4; ++k) e.Observe(Step(100 + k, 2.5));
  e.Observe(Step(105, 1.0));
  EXPECT_FALSE(Has(e.Observe(Step(106, 2.5)), "loss_ratio"));
}

TEST(DetectorsTest, GradNormSpikeAndDisabledDetectors) {
  std::map<std::string, DetectorConfig> configs;
  configs["loss_zscore"] = DefaultDetectorConfig("loss_zscore");
  configs["loss_zscore"].enabled = false;
  DetectorSet d(configs);
  for (int i = 1; i <= 100; ++i) d.Observe(Step(i, 1.0 + Noise(i), 1.0 + Noise(i)));
  std::vector<Firing> f = d.Observe(Step(101, 50.0, 50.0));
  EXPECT_TRUE(Has(f, "grad_norm_zscore"));
  EXPECT_FALSE(Has(f, "loss_zscore"));  // disabled
}

TEST(DetectorsTest, GradBiasNeedsConsecutiveBadProbes) {
  std::map<std::string, DetectorConfig> configs;
  configs["grad_bias"] = DefaultDetectorConfig("grad_bias");
  configs["grad_bias"].enabled = true;  // max_abs_zeta 0.9, consecutive 2
  DetectorSet d(configs);
  auto probe = [](int64_t step, double zeta) {
    StepMetrics m = Step(step, 1.0);
    m.probed = true;
    m.probe.cosine = 0.9;
    m.probe.zeta = zeta;
    m.probe.rel_error = 0.3;
    return m;
  };
  EXPECT_FALSE(Has(d.Observe(probe(10, -0.95)), "grad_bias"));  // one bad probe
  EXPECT_FALSE(Has(d.Observe(Step(11, 1.0)), "grad_bias"));     // steps without a probe change nothing
  EXPECT_TRUE(Has(d.Observe(probe(20, -1.2)), "grad_bias"));    // the second in a row
  EXPECT_FALSE(Has(d.Observe(probe(30, -0.5)), "grad_bias"));   // back under: reset
}

TEST(DetectorsTest, SaturationAndGammaGrowth) {
  std::map<std::string, DetectorConfig> configs;
  configs["saturation"] = DefaultDetectorConfig("saturation");
  configs["saturation"].enabled = true;  // 5%
  configs["gamma_growth"] = DefaultDetectorConfig("gamma_growth");
  configs["gamma_growth"].enabled = true;  // 0.0005 per step over 200 steps
  DetectorSet d(configs);
  StepMetrics m = Step(1, 1.0);
  m.operands.push_back({"blocks.0.fc1", Role::kFwdW, 0.04, 0});
  EXPECT_FALSE(Has(d.Observe(m), "saturation"));
  m.operands[0].saturated = 0.08;
  EXPECT_TRUE(Has(d.Observe(m), "saturation"));
  DetectorSet g(configs);
  bool fired = false;
  for (int step = 1; step <= 400 && !fired; ++step) {
    StepMetrics s = Step(step, 1.0);
    // Gamma drifts 0.0001/step until step 250, then 0.002/step.
    double mean = step <= 250 ? 1.0 - 0.0001 * step : 1.0 - 0.025 - 0.002 * (step - 250);
    s.ln_gamma.push_back({"blocks.0.ln.weight", mean, 0.01});
    fired = Has(g.Observe(s), "gamma_growth");
    if (step <= 250) {
      ASSERT_FALSE(fired) << step;
    }
  }
  EXPECT_TRUE(fired);
}

Policy ParsePolicyText(const std::string& yaml, Status* status) {
  RunConfig c;
  *status = ParseRunConfig(yaml, "p.yaml", {}, &c);
  return c.policy;
}

TEST(PolicyTest, RulesCooldownsCapsAndTheLadder) {
  Status st;
  Policy p = ParsePolicyText(
      "precision: mxfp4\n"
      "policy:\n"
      "  ladder: [mxfp4, mxfp6_e2m3, mxfp8_e4m3, bf16]\n"
      "  max_interventions: 3\n"
      "  rules:\n"
      "    - {name: spike, when: [loss_zscore, nonfinite], do: [{rollback: {steps: 50}}, {switch: next}], cooldown: 10}\n"
      "    - {name: both, when: [loss_zscore, grad_norm_zscore], match: all, do: [stop], max: 1}\n",
      &st);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(p.rules.size(), 2u);
  EXPECT_EQ(p.rules[0].actions[0].kind, PolicyAction::Kind::kRollback);
  EXPECT_EQ(p.rules[0].actions[0].steps, 50);
  EXPECT_EQ(p.rules[1].match_all, true);
  PolicyEngine engine(p);
  EXPECT_EQ(engine.NextRung("mxfp4"), "mxfp6_e2m3");
  EXPECT_EQ(engine.NextRung("bf16"), "");
  EXPECT_EQ(engine.NextRung("custom"), "bf16");
  Firing z{"loss_zscore", "", {}}, g{"grad_norm_zscore", "", {}};
  auto d = engine.Decide(100, 100, "mxfp4", {z});
  ASSERT_EQ(d.size(), 1u);  // "all" needs both
  EXPECT_EQ(d[0].rule->name, "spike");
  EXPECT_TRUE(engine.Decide(105, 105, "mxfp4", {z}).empty());  // cooldown 10
  d = engine.Decide(110, 110, "mxfp4", {z, g});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(engine.Decide(200, 200, "mxfp4", {z, g}).empty());  // max_interventions 3 reached
  EXPECT_TRUE(engine.exhausted());
}

TEST(PolicyTest, InvalidPoliciesNameTheFieldAndLine) {
  struct Case {
    std::string yaml, expect;
  };
  const std::vector<Case> cases = {
      {"policy:\n  rules:\n    - {when: [loss_zscor], do: [stop]}\n", "p.yaml:3:15: policy.rules[0].when: unknown value 'loss_zscor'"},
      {"policy:\n  rules:\n    - {when: [nonfinite], do: [{switch: mxfp9}]}\n", "mxfp9"},
      {"policy:\n  ladder: [mxfp4, bf16, mxfp4]\n", "p.yaml:2:25: policy.ladder: 'mxfp4' appears twice: the ladder would loop"},
      {"policy:\n  detectors:\n    loss_zscore: {z: -1}\n", "policy.detectors.loss_zscore.z"},
      {"policy:\n  rules:\n    - {when: [nonfinite], do: [{switch: next}]}\n", "'next' needs policy.ladder"},
      {"policy:\n  rules:\n    - {when: [nonfinite], do: [{explode: 1}]}\n", "unknown action 'explode'"},
      {"policy:\n  detectors: {grad_bias: false}\n  rules:\n    - {when: [grad_bias], do: [stop]}\n", "disabled"},
      {"policy:\n  rules:\n    - {when: [nonfinite], do: [{scale_lr: 50}]}\n", "scale_lr"},
      {"policy:\n  sweep_rules:\n    - {when_diverged: 0, switch: bf16}\n", "policy.sweep_rules[0].when_diverged"},
      {"policy:\n  sweep_rules:\n    - {when_diverged: 2, switch: fp64}\n", "fp64"},
  };
  for (const Case& c : cases) {
    Status st;
    ParsePolicyText(c.yaml, &st);
    ASSERT_FALSE(st.ok()) << c.yaml;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
  }
}


// The parameter table is what the policy parser reads: every parameter of every
// detector is accepted under that detector and lands in its DetectorConfig
// field, a value outside the table's range is refused naming the field, and a
// key of another detector is refused.
Policy ParseOnePolicy(const std::string& yaml, Status* status) {
  Policy policy;
  *status = ParsePolicyNode(YAML::Load(yaml), "test.yaml", &policy);
  return policy;
}

TEST(DetectorTableTest, EveryParameterOfEveryDetectorParsesIntoItsField) {
  for (const DetectorInfo& info : Detectors()) {
    for (const DetectorParam& param : info.params) {
      std::string value;
      switch (param.kind) {
        case DetectorParam::Kind::kInt: value = std::to_string(static_cast<int>(param.min) + 1); break;
        case DetectorParam::Kind::kFloat: value = param.min < 0 ? "0.5" : std::to_string(param.min + 0.25); break;
        case DetectorParam::Kind::kChoice: value = param.choices.back(); break;
        case DetectorParam::Kind::kRoles: value = "[dgrad_dy]"; break;
      }
      const std::string where = info.name + "." + param.key;
      Status st;
      Policy p = ParseOnePolicy("detectors: {" + info.name + ": {" + param.key + ": " + value + "}}", &st);
      ASSERT_TRUE(st.ok()) << where << ": " << st.message();
      const DetectorConfig& dc = p.detectors.at(info.name);
      EXPECT_TRUE(dc.enabled) << where << ": configuring a detector turns it on";
      switch (param.kind) {
        case DetectorParam::Kind::kInt: EXPECT_EQ(dc.*param.int_field, std::stoi(value)) << where; break;
        case DetectorParam::Kind::kFloat: EXPECT_DOUBLE_EQ(dc.*param.float_field, std::stod(value)) << where; break;
        case DetectorParam::Kind::kChoice: EXPECT_EQ(dc.*param.string_field, value) << where; break;
        case DetectorParam::Kind::kRoles: EXPECT_EQ(dc.roles, std::vector<std::string>{"dgrad_dy"}) << where; break;
      }
      if (param.kind == DetectorParam::Kind::kInt || param.kind == DetectorParam::Kind::kFloat) {
        ParseOnePolicy("detectors: {" + info.name + ": {" + param.key + ": " + std::to_string(param.max * 2 + 1) + "}}",
                       &st);
        EXPECT_FALSE(st.ok()) << where << " accepted a value above its maximum";
        EXPECT_NE(st.message().find("policy.detectors." + where), std::string::npos) << st.message();
      }
    }
  }
}

TEST(DetectorTableTest, AKeyOfAnotherDetectorIsRefused) {
  Status st;
  ParseOnePolicy("detectors: {grad_bias: {z: 3}}", &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("policy.detectors.grad_bias.z: unknown key"), std::string::npos) << st.message();
  ParseOnePolicy("detectors: {nonfinite: {window: 3}}", &st);
  EXPECT_FALSE(st.ok());
}

TEST(DetectorTableTest, DefaultsFollowTheTable) {
  ASSERT_EQ(DetectorNames().size(), Detectors().size());
  for (const DetectorInfo& info : Detectors()) {
    EXPECT_EQ(DefaultDetectorConfig(info.name).enabled, info.on_by_default) << info.name;
    EXPECT_EQ(FindDetector(info.name), &info);
  }
  EXPECT_EQ(FindDetector("loss_spike"), nullptr);
  EXPECT_FALSE(DefaultDetectorConfig("grad_bias").enabled);
  EXPECT_TRUE(DefaultDetectorConfig("loss_zscore").enabled);
}

}  // namespace
}  // namespace keel
