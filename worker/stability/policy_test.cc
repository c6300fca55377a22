// The policy engine's escalation: no rule replays itself (refused at
// validation, escalated at run time), `switch: next` resolved against the
// running scheme, the learning-rate fallback and the stop past the ladder's
// top, probation, and the default policy's shape.
#include "worker/stability/policy.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

using Kind = PolicyAction::Kind;

PolicyAction Action(Kind kind, const std::string& scheme = "", int64_t steps = 0, double factor = 1.0) {
  PolicyAction a;
  a.kind = kind;
  a.scheme = scheme;
  a.steps = steps;
  a.factor = factor;
  return a;
}

PolicyRule Rule(const std::string& name, std::vector<PolicyAction> actions, int64_t cooldown = 0) {
  PolicyRule r;
  r.name = name;
  r.when = {"loss_zscore"};
  r.actions = std::move(actions);
  r.cooldown = cooldown;
  return r;
}

Policy WithRules(std::vector<std::string> ladder, std::vector<PolicyRule> rules) {
  Policy p;
  p.ladder = std::move(ladder);
  p.rules = std::move(rules);
  p.max_interventions = 100;
  return p;
}

const std::vector<Firing> kSpike = {{"loss_zscore", "loss 9 is 40 sigma above the mean", {}}};

std::vector<Kind> Kinds(const PolicyEngine::Decision& d) {
  std::vector<Kind> out;
  for (const PolicyAction& a : d.actions) out.push_back(a.kind);
  return out;
}

TEST(ValidateRuleTest, ARollbackAloneIsRefusedNamingTheField) {
  Status s = ValidateRule(Rule("r", {Action(Kind::kRollback, "", 50)}), "policy.rules[2]");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.field(), "policy.rules[2].do");
  EXPECT_EQ(s.message(),
            "policy.rules[2].do: [rollback] is a rollback alone: the run would replay the same steps in the same "
            "scheme and diverge the same way (allowed: a rollback with switch, scale_lr or stop)");
  // skip_step changes nothing about the replay either.
  EXPECT_FALSE(ValidateRule(Rule("r", {Action(Kind::kRollback, "", 50), Action(Kind::kSkipStep)}), "f").ok());
  EXPECT_TRUE(ValidateRule(Rule("r", {Action(Kind::kRollback, "", 50), Action(Kind::kSwitch, "next")}), "f").ok());
  EXPECT_TRUE(ValidateRule(Rule("r", {Action(Kind::kRollback, "", 50), Action(Kind::kScaleLr, "", 0, 0.5)}), "f").ok());
  EXPECT_TRUE(ValidateRule(Rule("r", {Action(Kind::kRollback, "", 50), Action(Kind::kStop)}), "f").ok());
  EXPECT_TRUE(ValidateRule(Rule("r", {Action(Kind::kSkipStep)}), "f").ok());  // no rollback: nothing replays
}

TEST(PolicyEngineTest, NextIsResolvedAgainstTheSchemeThatRanTheStep) {
  Policy p = WithRules({"mxfp4", "mxfp6_e2m3", "bf16"},
                       {Rule("spike", {Action(Kind::kRollback, "", 50), Action(Kind::kSwitch, "next")})});
  PolicyEngine engine(p, "mxfp4");
  auto d = engine.Decide(100, 100, "mxfp4", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].escalation.empty());
  ASSERT_EQ(d[0].actions.size(), 2u);
  EXPECT_EQ(d[0].actions[0].kind, Kind::kRollback);
  EXPECT_EQ(d[0].actions[1].scheme, "mxfp6_e2m3");
  // Later in the run, past step 100: the rule as written, from the scheme now running.
  d = engine.Decide(200, 200, "mxfp6_e2m3", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].escalation.empty());
  EXPECT_EQ(d[0].actions[1].scheme, "bf16");
}

TEST(PolicyEngineTest, ARuleFiringAgainBeforePassingItsStepEscalatesInsteadOfReplaying) {
  // A fixed scheme: repeated, it would be the same replay every time.
  Policy p = WithRules({"mxfp4", "mxfp8_e4m3", "bf16", "fp32"},
                       {Rule("spike", {Action(Kind::kRollback, "", 50), Action(Kind::kSwitch, "mxfp8_e4m3"),
                                       Action(Kind::kScaleLr, "", 0, 0.1)})});
  PolicyEngine engine(p, "mxfp4");
  auto d = engine.Decide(450, 450, "mxfp4", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kSwitch, Kind::kScaleLr}));
  EXPECT_EQ(d[0].actions[1].scheme, "mxfp8_e4m3");
  // Rolled back to 400, diverged again at 412 (tick 462): one rung up instead.
  d = engine.Decide(462, 412, "mxfp8_e4m3", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].escalation,
            "rule spike fired again at step 412 before passing step 450 where it last fired: escalating to bf16 "
            "instead of replaying");
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kSwitch}));
  EXPECT_EQ(d[0].actions[0].steps, 50);  // the rule's rollback stays
  EXPECT_EQ(d[0].actions[1].scheme, "bf16");
  // The step where it last fired is now 412: firing at 412 again escalates, at 413 it does not.
  d = engine.Decide(480, 412, "bf16", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].actions[1].scheme, "fp32");
  d = engine.Decide(500, 413, "fp32", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].escalation.empty());
  EXPECT_EQ(d[0].actions[1].scheme, "mxfp8_e4m3");  // as written
}

TEST(PolicyEngineTest, PastTheTopTheLearningRateFallsBackThenTheRunStops) {
  Policy p = WithRules({"bf16", "fp32"}, {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")})});
  p.lr_fallbacks = 2;
  p.lr_fallback_factor = 0.5;
  PolicyEngine engine(p, "bf16");
  auto d = engine.Decide(100, 100, "bf16", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].actions[1].scheme, "fp32");
  // Again before passing 100, in fp32, the top: the LR, twice.
  d = engine.Decide(110, 90, "fp32", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kScaleLr}));
  EXPECT_EQ(d[0].actions[1].factor, 0.5);
  EXPECT_NE(d[0].escalation.find("no rung above fp32, scaling the learning rate by 0.5 (fallback 1 of 2)"),
            std::string::npos)
      << d[0].escalation;
  d = engine.Decide(120, 85, "fp32", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kScaleLr}));
  // Then stop, where it diverged (no rollback).
  d = engine.Decide(130, 80, "fp32", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kStop}));
  EXPECT_NE(d[0].escalation.find("the learning-rate fallback is spent, stopping the run as diverged"),
            std::string::npos)
      << d[0].escalation;
}

TEST(PolicyEngineTest, SwitchNextAtTheTopEscalatesEvenWhenTheRunPassedTheStep) {
  Policy p = WithRules({"bf16", "fp32"}, {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")})});
  PolicyEngine engine(p, "fp32");
  auto d = engine.Decide(100, 100, "fp32", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].escalation,
            "rule spike fired at step 100 on fp32, the top of the ladder: no rung above fp32, scaling the learning "
            "rate by 0.5 (fallback 1 of 1)");
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kScaleLr}));
  d = engine.Decide(300, 300, "fp32", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kStop}));
}

// A rule that also scales the learning rate acts as written at the top of the
// ladder (the lower learning rate is its change; the trainer records the switch
// as skipped), and escalates only when it fires again before passing its step.
TEST(PolicyEngineTest, SwitchNextAtTheTopOfARuleThatScalesTheLearningRateActsAsWritten) {
  const PolicyAction scale = Action(Kind::kScaleLr, "", 0, 0.01);
  Policy p = WithRules({"mxfp8_e4m3", "bf16"},
                       {Rule("spike", {Action(Kind::kRollback, "", 50), Action(Kind::kSwitch, "next"), scale})});
  PolicyEngine engine(p, "bf16");
  auto d = engine.Decide(151, 151, "bf16", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].escalation, "");
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kSwitch, Kind::kScaleLr}));
  EXPECT_EQ(d[0].actions[1].scheme, "next");  // nothing above bf16: the trainer's switch_skipped
  EXPECT_DOUBLE_EQ(d[0].actions[2].factor, 0.01);
  d = engine.Decide(200, 120, "bf16", kSpike);  // again, before passing step 151
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].escalation.find("no rung above bf16, scaling the learning rate by 0.5"), std::string::npos)
      << d[0].escalation;
}

TEST(PolicyEngineTest, WithoutALadderAReplayGoesStraightToTheLearningRate) {
  Policy p = WithRules({}, {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kScaleLr, "", 0, 0.9),
                                           Action(Kind::kSkipStep)})});
  PolicyEngine engine(p);
  ASSERT_EQ(engine.Decide(100, 100, "custom", kSpike).size(), 1u);
  auto d = engine.Decide(101, 95, "custom", kSpike);
  ASSERT_EQ(d.size(), 1u);
  // skip_step stays with the rollback; the rule's own scale_lr 0.9 gives way to the fallback.
  EXPECT_EQ(Kinds(d[0]), (std::vector<Kind>{Kind::kRollback, Kind::kSkipStep, Kind::kScaleLr}));
  EXPECT_EQ(d[0].actions[2].factor, 0.5);
}

TEST(PolicyEngineTest, CooldownsHoldPastTheFiringStepButNotInAReplay) {
  // A rule without a rollback: the run goes on past the firing, and the
  // cooldown holds the next firings back for 10 ticks.
  Policy p = WithRules({"mxfp4", "mxfp6_e2m3", "bf16"}, {Rule("drift", {Action(Kind::kSwitch, "next")}, /*cooldown=*/10)});
  PolicyEngine engine(p, "mxfp4");
  ASSERT_EQ(engine.Decide(100, 100, "mxfp4", kSpike).size(), 1u);
  EXPECT_TRUE(engine.Decide(105, 105, "mxfp6_e2m3", kSpike).empty());  // cooldown 10 ticks
  ASSERT_EQ(engine.Decide(110, 110, "mxfp6_e2m3", kSpike).size(), 1u);
  // With a rollback: the replay's steps are new, and a firing there (step 85,
  // before 100) is a new divergence of the replay: it escalates at once,
  // cooldown or not, and every firing counts.
  Policy q = WithRules({"mxfp4", "bf16"}, {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")},
                                                /*cooldown=*/10)});
  q.max_interventions = 2;
  PolicyEngine replay(q, "mxfp4");
  ASSERT_EQ(replay.Decide(100, 100, "mxfp4", kSpike).size(), 1u);
  const auto again = replay.Decide(105, 85, "bf16", kSpike);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0].escalation.find("before passing step 100"), std::string::npos) << again[0].escalation;
  EXPECT_TRUE(replay.exhausted());
  EXPECT_TRUE(replay.Decide(200, 200, "bf16", kSpike).empty());
}

TEST(PolicyEngineTest, ProbationGoesBackDownOneRungAfterHealthyStepsThenStaysUpOnceItDiverges) {
  Policy p = WithRules({"mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "bf16"},
                       {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")})});
  p.probation_after = 50;
  PolicyEngine engine(p, "mxfp4");
  EXPECT_EQ(engine.ProbationReturn(10, "mxfp4"), "");  // the start: nothing to come back from
  ASSERT_EQ(engine.Decide(100, 100, "mxfp4", kSpike).size(), 1u);
  ASSERT_EQ(engine.Decide(130, 120, "mxfp6_e2m3", kSpike).size(), 1u);  // up again, to mxfp8_e4m3
  EXPECT_EQ(engine.ProbationReturn(179, "mxfp8_e4m3"), "");  // 49 healthy steps
  EXPECT_EQ(engine.ProbationReturn(180, "mxfp8_e4m3"), "mxfp6_e2m3");
  EXPECT_EQ(engine.ProbationReturn(229, "mxfp6_e2m3"), "");
  EXPECT_EQ(engine.ProbationReturn(230, "mxfp6_e2m3"), "mxfp4");
  EXPECT_EQ(engine.ProbationReturn(400, "mxfp4"), "");  // never below the starting scheme
  // Diverges again after coming down: back up, and for good.
  auto d = engine.Decide(401, 380, "mxfp4", kSpike);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].actions[1].scheme, "mxfp6_e2m3");
  EXPECT_NE(d[0].probation_over.find("stays up for the rest of the run"), std::string::npos) << d[0].probation_over;
  EXPECT_TRUE(engine.probation_over());
  EXPECT_EQ(engine.ProbationReturn(10000, "mxfp6_e2m3"), "");
}

TEST(PolicyEngineTest, ProbationLeavesASchemeChosenByHandAlone) {
  Policy p = WithRules({"mxfp4", "mxfp6_e2m3", "bf16"},
                       {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")})});
  p.probation_after = 5;
  PolicyEngine engine(p, "mxfp4");
  ASSERT_EQ(engine.Decide(100, 100, "mxfp4", kSpike).size(), 1u);
  // keel intervene moved the run to bf16: not the policy's rung.
  EXPECT_EQ(engine.ProbationReturn(200, "bf16"), "");
  EXPECT_EQ(engine.ProbationReturn(200, "mxfp6_e2m3"), "mxfp4");
}

TEST(DefaultPolicyTest, TwoRulesThatClimbTheLadderWithDistancesFromTheRunLength) {
  const std::vector<std::string> ladder = {"mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"};
  Policy p = DefaultPolicy(ladder, 9000, false, false);
  EXPECT_EQ(p.preset, "default");
  EXPECT_EQ(p.ladder, ladder);
  EXPECT_EQ(p.snapshot_every, 100);
  EXPECT_EQ(p.snapshot_keep, 12);
  ASSERT_EQ(p.rules.size(), 2u);
  const PolicyRule& r = p.rules[0];
  EXPECT_EQ(r.name, "blow-up");
  EXPECT_EQ(r.when, (std::vector<std::string>{"nonfinite", "grad_norm_zscore", "loss_zscore", "loss_ratio"}));
  ASSERT_EQ(r.actions.size(), 2u);
  EXPECT_EQ(r.actions[0].kind, Kind::kRollback);
  EXPECT_EQ(r.actions[0].steps, 200);  // 2 S
  EXPECT_EQ(r.actions[1].scheme, "next");
  EXPECT_TRUE(ValidateRule(r, "policy.rules[0]").ok());
  EXPECT_EQ(p.detectors.at("loss_zscore").z, 30);
  EXPECT_EQ(p.detectors.at("grad_norm_zscore").z, 30);
  EXPECT_EQ(p.detectors.at("loss_ratio").ratio, 10);
  EXPECT_EQ(p.detectors.at("loss_zscore").min_samples, 64);
  EXPECT_EQ(p.detectors.at("loss_zscore").window, 128);
  EXPECT_FALSE(p.detectors.at("grad_norm_ratio").enabled);
  EXPECT_TRUE(p.detectors.at("nonfinite").enabled);
  // The drift rule: one rung up, no rollback (it would land in the drift).
  const PolicyRule& drift = p.rules[1];
  EXPECT_EQ(drift.name, "drift");
  EXPECT_EQ(drift.when, (std::vector<std::string>{"loss_drift"}));
  ASSERT_EQ(drift.actions.size(), 1u);
  EXPECT_EQ(drift.actions[0].kind, Kind::kSwitch);
  EXPECT_EQ(drift.actions[0].scheme, "next");
  EXPECT_TRUE(ValidateRule(drift, "policy.rules[1]").ok());
  EXPECT_TRUE(p.detectors.at("loss_drift").enabled);
  EXPECT_EQ(p.detectors.at("loss_drift").window, 250);  // 9000 / 36
  EXPECT_EQ(p.detectors.at("loss_drift").min_samples, 500);
  EXPECT_EQ(p.detectors.at("loss_drift").ratio, 2);
  EXPECT_EQ(drift.cooldown, 250);
  // 5 climbs by either rule or by drift, 5 probation returns, 3 LR fallbacks, 1 stop.
  EXPECT_EQ(p.lr_fallbacks, 3);
  EXPECT_EQ(p.max_interventions, 19);
  EXPECT_EQ(p.rewarm_steps, 200);  // 2 S: each switch re-warms the learning rate
  // A short run: the same proportions, and the statistics armed in time to see
  // a replay diverge again.
  Policy short_run = DefaultPolicy(ladder, 300, false, false);
  EXPECT_EQ(short_run.snapshot_every, 3);
  EXPECT_EQ(short_run.detectors.at("loss_zscore").min_samples, 8);
  EXPECT_EQ(short_run.rules[0].actions[0].steps, 16);  // 2 min_samples, more than 2 S
  EXPECT_LE(2 * short_run.detectors.at("loss_zscore").min_samples, short_run.rules[0].actions[0].steps);
  EXPECT_EQ(short_run.detectors.at("loss_drift").window, 16);
  EXPECT_EQ(PolicyPresetNames(), "default");
}

// A language model's loss lies below ln(vocab): its drift rule fires at 1.1x
// the lowest median, and everything else is the proxy's.
TEST(DefaultPolicyTest, ALanguageModelsDriftRuleFiresAtATenthAboveItsLowest) {
  const std::vector<std::string> ladder = {"mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"};
  const Policy proxy = DefaultPolicy(ladder, 3000, false, false);
  const Policy lm = DefaultPolicy(ladder, 3000, true, false);
  EXPECT_EQ(proxy.detectors.at("loss_drift").ratio, 2);
  EXPECT_EQ(lm.detectors.at("loss_drift").ratio, 1.1);
  EXPECT_EQ(lm.detectors.at("loss_drift").window, proxy.detectors.at("loss_drift").window);
  EXPECT_EQ(lm.rules.size(), proxy.rules.size());
  EXPECT_EQ(lm.detectors.at("loss_zscore").z, proxy.detectors.at("loss_zscore").z);
  // A GPT run's loss plateaus at 6.0 and creeps up to 6.9 (1.15x): the drift
  // rule fires, where the proxy's 2x would not.
  DetectorSet lm_detectors(lm.detectors), proxy_detectors(proxy.detectors);
  const int window = lm.detectors.at("loss_drift").window;
  bool lm_fired = false, proxy_fired = false;
  for (int step = 1; step <= 6 * window; ++step) {
    StepMetrics m;
    m.step = step;
    m.loss = step <= 3 * window ? 6.0 : 6.0 + 0.9 * (step - 3 * window) / (3.0 * window);
    m.grad_norm = 1.0;
    for (const Firing& f : lm_detectors.Observe(m)) lm_fired |= f.detector == "loss_drift";
    for (const Firing& f : proxy_detectors.Observe(m)) proxy_fired |= f.detector == "loss_drift";
  }
  EXPECT_TRUE(lm_fired);
  EXPECT_FALSE(proxy_fired);
}

// A language model's third rule: the gradient-bias probe's |zeta| above 0.1
// on three probes in a row moves one rung up, without a rollback. The proxy's
// default policy has no such rule and leaves the detector off.
TEST(DefaultPolicyTest, ALanguageModelsBiasRuleClimbsOnThreeBiasedProbesInARow) {
  const std::vector<std::string> ladder = {"mxfp8_e4m3", "mxfp8_e4m3+bf16_head", "mx_w_e4m3_a_bf16+bf16_head",
                                           "bf16", "fp32"};
  const Policy proxy = DefaultPolicy(ladder, 3000, false, false);
  const Policy lm = DefaultPolicy(ladder, 3000, true, true);
  EXPECT_FALSE(proxy.detectors.at("grad_bias").enabled);
  for (const PolicyRule& r : proxy.rules) EXPECT_NE(r.name, "bias");
  // Without bias_rule (a language model whose head is BF16 already: no such rung), no rule and no detector.
  const Policy recipe = DefaultPolicy({"nvfp4_recipe", "chon", "mxfp8_e4m3+bf16_head", "bf16", "fp32"}, 3000, true, false);
  EXPECT_FALSE(recipe.detectors.at("grad_bias").enabled);
  EXPECT_EQ(recipe.rules.size(), 2u);
  const PolicyRule& bias = lm.rules.back();
  EXPECT_EQ(bias.name, "bias");
  EXPECT_EQ(bias.when, (std::vector<std::string>{"grad_bias"}));
  ASSERT_EQ(bias.actions.size(), 1u);
  EXPECT_EQ(bias.actions[0].kind, Kind::kSwitch);
  EXPECT_EQ(bias.actions[0].scheme, "next");
  EXPECT_TRUE(ValidateRule(bias, "policy.rules[2]").ok());
  EXPECT_EQ(DefaultProbeEvery(9000), 100);
  EXPECT_EQ(DefaultProbeEvery(3000), 100);
  EXPECT_EQ(DefaultProbeEvery(300), 10);
  EXPECT_EQ(DefaultProbeEvery(10), 1);
  // Session 32's GPT probes (zeta): mxfp8_e4m3 with an MX head, seed 1 at lr
  // 2e-3, fires on the third; one probe under 0.1 restarts the count.
  DetectorSet d(lm.detectors);
  auto probe = [&](int step, double zeta) {
    StepMetrics m;
    m.step = step;
    m.loss = 6.0;
    m.grad_norm = 1.0;
    m.probed = true;
    m.probe.zeta = zeta;
    m.probe.cosine = 0.95;
    bool fired = false;
    for (const Firing& f : d.Observe(m)) fired |= f.detector == "grad_bias";
    return fired;
  };
  EXPECT_FALSE(probe(100, -0.14));
  EXPECT_FALSE(probe(200, -0.18));
  EXPECT_TRUE(probe(300, -0.16));
  EXPECT_FALSE(probe(400, -0.08));  // the count restarts
  EXPECT_FALSE(probe(500, -0.17));
  EXPECT_FALSE(probe(600, -0.24));
  EXPECT_TRUE(probe(700, -0.23));
  // A switch starts the count afresh: the new scheme's own probes decide.
  d.SchemeSwitched();
  EXPECT_FALSE(probe(800, -0.3));
  EXPECT_FALSE(probe(900, -0.3));
  EXPECT_TRUE(probe(1000, -0.3));
  // The engine: the firing climbs one rung, here to the BF16 head.
  PolicyEngine engine(lm, "mxfp8_e4m3");
  const std::vector<PolicyEngine::Decision> ds =
      engine.Decide(300, 300, "mxfp8_e4m3", {{"grad_bias", "gradient bias", {}}});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule->name, "bias");
  ASSERT_EQ(ds[0].actions.size(), 1u);
  EXPECT_EQ(ds[0].actions[0].kind, Kind::kSwitch);
  EXPECT_EQ(ds[0].actions[0].scheme, "mxfp8_e4m3+bf16_head");
}

// The default policy over a whole escalation: every firing is a replay that
// diverges again, and the run ends stopped, having climbed every rung once.
TEST(DefaultPolicyTest, SnapshotMemoryIsAnEighthOfTheHostAtMost16GiB) {
  EXPECT_EQ(DefaultSnapshotMemoryMib(24 * 1024), 3072);    // this build machine's 24 GiB
  EXPECT_EQ(DefaultSnapshotMemoryMib(128 * 1024), 16384);  // the one-GPU H200 host
  EXPECT_EQ(DefaultSnapshotMemoryMib(512 * 1024), 16384);  // capped
  EXPECT_EQ(DefaultSnapshotMemoryMib(0), 0);               // unknown: on disk
  EXPECT_EQ(DefaultSnapshotMemoryMib(-5), 0);
}

TEST(DefaultPolicyTest, RepeatedDivergenceClimbsEveryRungThenFallsBackThenStops) {
  const std::vector<std::string> ladder = {"mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"};
  Policy p = DefaultPolicy(ladder, 300, false, false);
  PolicyEngine engine(p, "mxfp4");
  std::string scheme = "mxfp4";
  std::vector<std::string> climbed;
  int64_t tick = 0;
  bool stopped = false, scaled = false;
  for (int firing = 0; firing < 20 && !stopped; ++firing) {
    tick += 40;  // past the cooldown, always back at step 151
    auto d = engine.Decide(tick, 151, scheme, {{"nonfinite", "loss nan", {}}});
    ASSERT_EQ(d.size(), 1u) << "firing " << firing;
    if (firing > 0) {
      EXPECT_FALSE(d[0].escalation.empty()) << firing;
    }
    for (const PolicyAction& a : d[0].actions) {
      if (a.kind == Kind::kSwitch) {
        climbed.push_back(a.scheme);
        scheme = a.scheme;
      }
      scaled |= a.kind == Kind::kScaleLr;
      stopped |= a.kind == Kind::kStop;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_TRUE(scaled);
  EXPECT_EQ(climbed, (std::vector<std::string>{"mxfp6_e2m3", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"}));
  EXPECT_LE(engine.interventions(), p.max_interventions);
}

// The state a checkpoint carries: what an engine learnt, written and read back
// equal, and put into a new engine it decides as the old one would have.
TEST(PolicyStateTest, RoundTripsThroughJsonAndANewEngineEscalatesAsTheOldOneWould) {
  Policy p = WithRules({"mxfp4", "mxfp8_e4m3", "bf16"},
                       {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")}),
                        Rule("other", {Action(Kind::kStop)}, 1000)});
  p.rules[1].when = {"nonfinite"};
  p.probation_after = 10;
  PolicyEngine engine(p, "mxfp4");
  ASSERT_EQ(engine.Decide(100, 100, "mxfp4", kSpike).size(), 1u);  // -> mxfp8_e4m3
  EXPECT_EQ(engine.ProbationReturn(110, "mxfp8_e4m3"), "mxfp4");
  ASSERT_EQ(engine.Decide(130, 125, "mxfp4", kSpike).size(), 1u);  // back up, probation over
  const PolicyState saved = engine.State(131);
  EXPECT_EQ(saved.tick, 131);
  ASSERT_EQ(saved.rules.size(), 1u);  // "other" never fired
  EXPECT_EQ(saved.rules.at("spike").tick, 130);
  EXPECT_EQ(saved.rules.at("spike").step, 125);
  EXPECT_EQ(saved.rules.at("spike").times, 2);
  EXPECT_EQ(saved.interventions, 2);
  EXPECT_EQ(saved.policy_scheme, "mxfp8_e4m3");
  EXPECT_TRUE(saved.returned);
  EXPECT_TRUE(saved.probation_over);

  const std::string json = PolicyStateToJson(saved);
  PolicyState loaded;
  Status s = ParsePolicyState(json, "ckpt/optimizer.safetensors: policy_state", &loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(loaded == saved) << json;
  EXPECT_EQ(PolicyStateToJson(loaded), json);

  // A new engine given the state: the rule firing again at step 125 escalates
  // (as the old engine does), where a fresh engine replays the rule as written.
  PolicyEngine restored(p, "mxfp4");
  EXPECT_EQ(restored.Restore(loaded), 131);
  EXPECT_TRUE(restored.State(131) == saved);
  EXPECT_TRUE(restored.probation_over());
  EXPECT_EQ(restored.interventions(), 2);
  auto again = restored.Decide(140, 125, "mxfp8_e4m3", kSpike);
  auto same = engine.Decide(140, 125, "mxfp8_e4m3", kSpike);
  ASSERT_EQ(again.size(), 1u);
  ASSERT_EQ(same.size(), 1u);
  EXPECT_EQ(again[0].escalation, same[0].escalation);
  EXPECT_NE(again[0].escalation.find("fired again at step 125, the step where it last fired"), std::string::npos)
      << again[0].escalation;
  EXPECT_EQ(again[0].actions[1].scheme, "bf16");
  PolicyEngine fresh(p, "mxfp4");
  auto replay = fresh.Decide(140, 125, "mxfp8_e4m3", kSpike);
  ASSERT_EQ(replay.size(), 1u);
  EXPECT_TRUE(replay[0].escalation.empty());
  // Cooldowns count from the restored ticks: a rule that fired at tick 125
  // with a 1000-tick cooldown stays quiet until tick 1125.
  PolicyState cooling = saved;
  cooling.rules["other"] = PolicyState::Rule{125, 120, 1};
  PolicyEngine cool(p, "mxfp4");
  cool.Restore(cooling);
  const std::vector<Firing> nan = {{"nonfinite", "loss is NaN", {}}};
  EXPECT_TRUE(cool.Decide(200, 200, "bf16", nan).empty());   // 75 ticks after, cooldown 1000
  EXPECT_EQ(cool.Decide(1125, 900, "bf16", nan).size(), 1u);  // 1000 ticks after
}

TEST(PolicyStateTest, AFreshEngineHasTheEmptyState) {
  Policy p = WithRules({"mxfp4", "bf16"}, {Rule("spike", {Action(Kind::kRollback, "", 20), Action(Kind::kSwitch, "next")})});
  PolicyEngine engine(p, "mxfp4");
  EXPECT_TRUE(engine.State(0) == PolicyState{});
  PolicyState empty;
  ASSERT_TRUE(ParsePolicyState(PolicyStateToJson(empty), "f", &empty).ok());
  EXPECT_TRUE(empty == PolicyState{});
}

TEST(PolicyStateTest, BadStateIsRefusedNamingTheFileTheFieldAndTheValue) {
  PolicyState good;
  good.rules["spike"] = PolicyState::Rule{31, 30, 1};
  good.policy_scheme = "bf16";
  const std::string json = PolicyStateToJson(good);
  struct Case {
    std::string from, to, want;
  };
  const std::vector<Case> cases = {
      {"\"interventions\":0", "\"interventions\":-1", "interventions is -1 (allowed: an integer 0 .."},
      {"\"tick\":31", "\"tick\":\"x\"", "rules.spike: tick is \"x\" (allowed: an integer 0 .."},
      {"\"times\":1", "\"times\":1,\"extra\":2", "rules.spike: unknown field extra"},
      {"\"version\":1", "\"version\":2", "version is 2 (allowed: 1)"},
      {"\"returned\":false", "\"returned\":0", "returned is 0 (allowed: true or false)"},
      {"\"policy_scheme\":\"bf16\"", "\"policy_scheme\":7", "policy_scheme is 7"},
      {"\"rules\":{", "\"rules\":[{", "not JSON"},
      {",\"healthy_since\":0", "", "healthy_since is missing"},
  };
  for (const Case& c : cases) {
    std::string text = json;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from << " in " << json;
    text.replace(at, c.from.size(), c.to);
    PolicyState out = good;
    out.interventions = 42;  // unchanged on error
    Status s = ParsePolicyState(text, "run/checkpoints/step_00000010/optimizer.safetensors: policy_state", &out);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
    EXPECT_NE(s.message().find("step_00000010/optimizer.safetensors: policy_state"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.message();
    EXPECT_EQ(out.interventions, 42);
  }
  PolicyState out;
  EXPECT_FALSE(ParsePolicyState("[1]", "f", &out).ok());
}

}  // namespace
}  // namespace keel
