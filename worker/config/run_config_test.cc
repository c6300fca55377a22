// Tests of the run-config parser (ParseRunConfig, LoadRunConfig, --set
// overrides, ParsePolicyNode, the stored scheme) and ValidateRunConfig: every
// field the parser accepts lands in RunConfig, and every refusal names the
// field, the value and what is allowed, at the right source:line:col, and
// leaves the output untouched. Also the strict YAML loader behind the parser,
// run names that must stay inside runs/, and model sizes that cannot fit any
// GPU.
#include "worker/config/run_config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "worker/config/scheme_testing.h"

namespace keel {
namespace {

Status Parse(const std::string& text, std::vector<std::string> overrides = {}) {
  RunConfig config;
  return ParseRunConfig(text, "r.yaml", overrides, &config);
}

// Parses text that must be accepted.
RunConfig Parsed(const std::string& text, std::vector<std::string> overrides = {}) {
  RunConfig config;
  Status s = ParseRunConfig(text, "r.yaml", overrides, &config);
  EXPECT_TRUE(s.ok()) << text << " -> " << s.message();
  return config;
}

// ---- Every field lands ---------------------------------------------------------

TEST(RunConfigFieldsTest, EmptyConfigIsTheDefaults) {
  RunConfig c = Parsed("");
  RunConfig d;
  EXPECT_EQ(c.name, d.name);
  EXPECT_EQ(c.model.type, "proxy");
  EXPECT_EQ(c.steps, d.steps);
  EXPECT_EQ(c.precision.name, "fp32");
  PrecisionScheme fp32;
  ASSERT_TRUE(SchemeFromPreset("fp32", &fp32).ok());
  EXPECT_EQ(SchemeToYaml(c.precision), SchemeToYaml(fp32));  // the preset, attention included
  EXPECT_FALSE(c.precision.attention_bf16);
  EXPECT_FALSE(c.policy.active());
  // Derived: runs/<name>, seq = context, vocab padded to 128, mlp_hidden 4 x width.
  EXPECT_EQ(c.run_dir, "runs/run");
  EXPECT_EQ(c.seq, 1024);
  EXPECT_EQ(c.model.padded_vocab, 50304);
  EXPECT_EQ(c.model.mlp_hidden, 4 * 512);
  // A document holding only a comment is empty too.
  EXPECT_EQ(Parsed("# nothing\n").steps, d.steps);
}

TEST(RunConfigFieldsTest, EveryTopLevelFieldLands) {
  RunConfig c = Parsed(
      "name: my-run\n"
      "steps: 1234\n"
      "batch: 7\n"
      "seq: 0\n"
      "grad_accum: 3\n"
      "seed: 9223372036854775807\n"
      "backend: cuda\n"
      "threads: 5\n"
      "run_dir: /tmp/somewhere\n"
      "checkpoint_every: 11\n"
      "keep_checkpoints: 0\n"
      "probe_every: 13\n"
      "operand_stats: false\n"
      "log_every: 17\n"
      "check_every: 19\n"
      "dist: {reduce: bf16, timeout_s: 2.5, bucket_mb: 0.5}\n");
  EXPECT_EQ(c.name, "my-run");
  EXPECT_EQ(c.steps, 1234);
  EXPECT_EQ(c.batch, 7);
  EXPECT_EQ(c.seq, 1024);  // 0: model.context
  EXPECT_EQ(c.grad_accum, 3);
  EXPECT_EQ(c.seed, uint64_t{9223372036854775807u});
  EXPECT_EQ(c.backend, "cuda");
  EXPECT_EQ(c.threads, 5);
  EXPECT_EQ(c.run_dir, "/tmp/somewhere");
  EXPECT_EQ(c.checkpoint_every, 11);
  EXPECT_EQ(c.keep_checkpoints, 0);
  EXPECT_EQ(c.probe_every, 13);
  EXPECT_FALSE(c.operand_stats);
  EXPECT_EQ(c.log_every, 17);
  EXPECT_EQ(c.check_every, 19);
  EXPECT_EQ(c.dist.reduce, "bf16");
  EXPECT_FLOAT_EQ(c.dist.timeout_s, 2.5f);
  EXPECT_EQ(c.dist.bucket_mb, 0.5f);
  // The defaults: fp32 reductions in 25 MiB buckets, hashes compared every 100 steps.
  EXPECT_EQ(Parsed("steps: 1\n").dist.reduce, "fp32");
  EXPECT_EQ(Parsed("steps: 1\n").dist.bucket_mb, 25.0f);
  EXPECT_EQ(Parsed("dist: {bucket_mb: 0}\n").dist.bucket_mb, 0.0f);  // one reduction after the backward
  EXPECT_EQ(Parsed("steps: 1\n").dist.listen_host, "127.0.0.1");  // one host: loopback only
  EXPECT_EQ(Parsed("steps: 1\n").dist.advertise_host, "");
  EXPECT_EQ(Parsed("dist: {listen_host: 0.0.0.0, advertise_host: node-7.cluster}\n").dist.advertise_host,
            "node-7.cluster");
  EXPECT_EQ(Parsed("dist: {listen_host: '::'}\n").dist.listen_host, "::");
  EXPECT_EQ(Parsed("steps: 1\n").check_every, 100);
  // Without run_dir, the name picks the directory.
  EXPECT_EQ(Parsed("name: other\n").run_dir, "runs/other");
}

TEST(RunConfigFieldsTest, EveryModelFieldLands) {
  RunConfig c = Parsed(
      "model:\n"
      "  type: gpt\n"
      "  layers: 3\n"
      "  width: 96\n"
      "  heads: 6\n"
      "  context: 128\n"
      "  vocab: 300\n"
      "  padded_vocab: 512\n"
      "  mlp: swiglu\n"
      "  mlp_hidden: 200\n"
      "  qk_layernorm: true\n"
      "  bias: false\n"
      "  ln_eps: 1e-6\n"
      "data: {train: t.bin}\n"
      "seq: 64\n");
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.type, "gpt");
  EXPECT_EQ(m.layers, 3);
  EXPECT_EQ(m.width, 96);
  EXPECT_EQ(m.heads, 6);
  EXPECT_EQ(m.context, 128);
  EXPECT_EQ(m.vocab, 300);
  EXPECT_EQ(m.padded_vocab, 512);
  EXPECT_EQ(m.mlp, "swiglu");
  EXPECT_EQ(m.mlp_hidden, 200);
  EXPECT_TRUE(m.qk_layernorm);
  EXPECT_FALSE(m.bias);
  EXPECT_EQ(m.ln_eps, 1e-6f);
  EXPECT_EQ(c.seq, 64);
}

TEST(RunConfigFieldsTest, DerivedModelSizesFollowTheirRules) {
  // padded_vocab: vocab rounded up to a multiple of 128.
  EXPECT_EQ(Parsed("model: {vocab: 256}\n").model.padded_vocab, 256);
  EXPECT_EQ(Parsed("model: {vocab: 257}\n").model.padded_vocab, 384);
  // mlp_hidden: 4 x width (gelu); 8/3 x width rounded up to 64 (swiglu).
  EXPECT_EQ(Parsed("model: {width: 100}\n").model.mlp_hidden, 400);
  EXPECT_EQ(Parsed("model: {width: 96, mlp: swiglu}\n").model.mlp_hidden, 256);   // 8 * 96 / 3 = 256
  EXPECT_EQ(Parsed("model: {width: 100, mlp: swiglu}\n").model.mlp_hidden, 320);  // 266 -> 320
  // seq: model.context when not given.
  EXPECT_EQ(Parsed("model: {context: 77}\n").seq, 77);
  // llama: SwiGLU without biases or QK-LayerNorm, so the swiglu hidden size.
  const ModelConfig llama =
      Parsed("model: {type: llama, width: 100, heads: 10, vocab: 300}\ndata: {train: t.bin}\n").model;
  EXPECT_EQ(llama.type, "llama");
  EXPECT_EQ(llama.mlp, "swiglu");
  EXPECT_FALSE(llama.bias);
  EXPECT_FALSE(llama.qk_layernorm);
  EXPECT_EQ(llama.mlp_hidden, 320);  // 8 * 100 / 3 = 266 -> 320
  EXPECT_EQ(llama.padded_vocab, 384);
  EXPECT_EQ(Parsed("model: {type: llama, width: 96, heads: 12}\ndata: {train: t.bin}\n").model.mlp_hidden, 256);
  // gla: the same fixed block.
  const ModelConfig gla = Parsed("model: {type: gla, width: 96, heads: 12}\ndata: {train: t.bin}\n").model;
  EXPECT_EQ(gla.type, "gla");
  EXPECT_EQ(gla.mlp, "swiglu");
  EXPECT_FALSE(gla.bias);
  EXPECT_FALSE(gla.qk_layernorm);
  EXPECT_EQ(gla.mlp_hidden, 256);
  EXPECT_EQ(Parsed("model: {type: llama, heads: 8, mlp_hidden: 100}\ndata: {train: t.bin}\n").model.mlp_hidden,
            100);
}

TEST(RunConfigFieldsTest, EveryDataOptimizerAndScheduleFieldLands) {
  RunConfig c = Parsed(
      "data:\n"
      "  train: a/train_*.bin\n"
      "  val: a/val.bin\n"
      "  val_batches: 9\n"
      "  eval_every: 25\n"
      "  shuffle: true\n"
      "optimizer:\n"
      "  type: adamw\n"
      "  lr: 0.25\n"
      "  beta1: 0.5\n"
      "  beta2: 0.75\n"
      "  eps: 0.125\n"
      "  weight_decay: 0.0625\n"
      "  grad_clip: 2.5\n"
      "  shard: true\n"
      "schedule:\n"
      "  type: cosine\n"
      "  warmup_steps: 8\n"
      "  min_lr_ratio: 0.375\n"
      "  spike_at: 40\n"
      "  spike_steps: 6\n"
      "  spike_factor: 12.5\n");
  EXPECT_EQ(c.data.train, "a/train_*.bin");
  EXPECT_EQ(c.data.val, "a/val.bin");
  EXPECT_EQ(c.data.val_batches, 9);
  EXPECT_EQ(c.data.eval_every, 25);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_FALSE(RunConfig().data.shuffle);  // llm.c's order unless asked
  EXPECT_EQ(c.optimizer.type, "adamw");
  EXPECT_EQ(c.optimizer.lr, 0.25f);
  EXPECT_EQ(c.optimizer.beta1, 0.5f);
  EXPECT_EQ(c.optimizer.beta2, 0.75f);
  EXPECT_EQ(c.optimizer.eps, 0.125f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0625f);
  EXPECT_EQ(c.optimizer.grad_clip, 2.5f);
  EXPECT_TRUE(c.optimizer.shard);
  EXPECT_EQ(c.schedule.type, "cosine");
  EXPECT_EQ(c.schedule.warmup_steps, 8);
  EXPECT_EQ(c.schedule.min_lr_ratio, 0.375f);
  EXPECT_EQ(c.schedule.spike_at, 40);
  EXPECT_EQ(c.schedule.spike_steps, 6);
  EXPECT_EQ(c.schedule.spike_factor, 12.5f);
  EXPECT_EQ(Parsed("schedule: {type: linear}\n").schedule.type, "linear");
  // adam with weight_decay 0 is allowed (nothing to decay).
  EXPECT_EQ(Parsed("optimizer: {type: adam, weight_decay: 0}\n").optimizer.weight_decay, 0.0f);
}

TEST(RunConfigPrecisionTest, APresetNameOrAPresetMapping) {
  for (const PresetInfo& p : Presets()) {
    PrecisionScheme want;
    ASSERT_TRUE(SchemeFromPreset(p.name, &want).ok());
    // Post-QK protection (chon) needs an attention model.
    const std::string model = want.post_qk_bf16 ? "model: {type: llama, heads: 8}\ndata: {train: t.bin}\n" : "";
    EXPECT_EQ(SchemeToYaml(Parsed(model + "precision: " + p.name + "\n").precision), SchemeToYaml(want)) << p.name;
    // A mapping with only the preset is the preset, name included.
    EXPECT_EQ(SchemeToYaml(Parsed(model + "precision: {preset: " + p.name + "}\n").precision), SchemeToYaml(want))
        << p.name;
  }
}

TEST(RunConfigPrecisionTest, ForwardRolesSetTheirBackwardTwinsUnlessGiven) {
  PrecisionScheme s = Parsed("precision: {fwd_x: mxfp8_e5m2, fwd_w: mxfp6_e2m3}\n").precision;
  EXPECT_EQ(s.name, "custom");
  EXPECT_EQ(RoleOf(s, Role::kFwdX).format, QuantFormat::kMxfp8E5M2);
  for (Role twin : {Role::kDgradDy, Role::kWgradDy, Role::kWgradX}) {
    EXPECT_EQ(RoleOf(s, twin).format, QuantFormat::kMxfp8E5M2) << RoleName(twin);
  }
  EXPECT_EQ(RoleOf(s, Role::kFwdW).format, QuantFormat::kMxfp6E2M3);
  EXPECT_EQ(RoleOf(s, Role::kDgradW).format, QuantFormat::kMxfp6E2M3);
  // Every role given explicitly keeps its own format.
  s = Parsed(
          "precision:\n  fwd_x: mxfp8_e4m3\n  fwd_w: mxfp8_e4m3\n  dgrad_dy: mxfp8_e5m2\n  dgrad_w: bf16\n"
          "  wgrad_dy: mxfp4\n  wgrad_x: fp32\n")
          .precision;
  EXPECT_EQ(RoleOf(s, Role::kDgradDy).format, QuantFormat::kMxfp8E5M2);
  EXPECT_EQ(RoleOf(s, Role::kDgradW).format, QuantFormat::kBf16);
  EXPECT_EQ(RoleOf(s, Role::kWgradDy).format, QuantFormat::kMxfp4);
  EXPECT_FALSE(RoleOf(s, Role::kWgradX).quantized());
}

TEST(RunConfigPrecisionTest, EveryOptionLands) {
  PrecisionScheme s = Parsed(
                          "precision:\n"
                          "  preset: mxfp8_e4m3\n"
                          "  rounding: stochastic\n"
                          "  grad_rounding: nearest_away\n"
                          "  layernorm: bf16\n"
                          "  forward_only: true\n"
                          "  bf16_first_blocks: 2\n"
                          "  bf16_last_blocks: 3\n"
                          "  bf16_head: true\n"
                          "  attention: bf16\n"
                          "  mx_block: 16\n"
                          "  bump_exponent: true\n"
                          "  name: mine\n")
                          .precision;
  EXPECT_EQ(s.name, "mine");
  EXPECT_EQ(RoleOf(s, Role::kFwdX).format, QuantFormat::kMxfp8E4M3);  // from the preset
  EXPECT_EQ(RoleOf(s, Role::kFwdX).rounding, Rounding::kStochastic);
  EXPECT_EQ(RoleOf(s, Role::kDgradW).rounding, Rounding::kStochastic);
  EXPECT_EQ(RoleOf(s, Role::kDgradDy).rounding, Rounding::kNearestAway);  // grad_rounding: the gradients
  EXPECT_EQ(RoleOf(s, Role::kWgradDy).rounding, Rounding::kNearestAway);
  EXPECT_EQ(s.layernorm.format, QuantFormat::kBf16);
  EXPECT_TRUE(s.forward_only);
  EXPECT_EQ(s.bf16_first_blocks, 2);
  EXPECT_EQ(s.bf16_last_blocks, 3);
  EXPECT_TRUE(s.bf16_head);
  EXPECT_TRUE(s.attention_bf16);
  for (const OperandFormat& o : s.roles) {
    EXPECT_EQ(o.mx_block, 16);
    EXPECT_TRUE(o.bump_exponent);  // every role is MX here
  }
  EXPECT_FALSE(Parsed("precision: {attention: fp32}\n").precision.attention_bf16);
  // CHON's post-QK protection, for the attention models; stored and read back.
  for (const char* type : {"llama", "gla"}) {
    s = Parsed(std::string("model: {type: ") + type + ", heads: 8}\ndata: {train: t.bin}\n" +
               "precision: {preset: nvfp4_recipe, post_qk_bf16: true}\n")
            .precision;
    EXPECT_TRUE(s.post_qk_bf16) << type;
    EXPECT_EQ(s.name, "custom");
    PrecisionScheme back;
    ASSERT_TRUE(ParseSchemeYaml(SchemeToYaml(s), &back).ok());
    EXPECT_TRUE(back.post_qk_bf16);
  }
  EXPECT_FALSE(Parsed("precision: nvfp4_recipe\n").precision.post_qk_bf16);
  // The Hot-Channel Patch: a key left out keeps the preset's, off drops it.
  s = Parsed("precision: {preset: nvfp4_hcp, hcp: {channels: 8, wgrad_rows: 16}}\n").precision;
  EXPECT_EQ(s.hcp_channels, 8);
  EXPECT_EQ(s.hcp_every, 100);
  EXPECT_TRUE(s.hcp_dgrad);
  EXPECT_EQ(s.hcp_wgrad_rows, 16);
  s = Parsed("precision: {preset: nvfp4, hcp: {channels: 4, every: 7, dgrad: false}}\n").precision;
  EXPECT_EQ(s.hcp_channels, 4);
  EXPECT_EQ(s.hcp_every, 7);
  EXPECT_FALSE(s.hcp_dgrad);
  s = Parsed("precision: {preset: nvfp4_hcp, hcp: off}\n").precision;
  EXPECT_EQ(s.hcp_channels, 0);
  EXPECT_FALSE(s.hcp_dgrad);
  EXPECT_EQ(Parsed("model: {type: gla, heads: 8}\ndata: {train: t.bin}\nprecision: chon\n").precision.name, "chon");
  // Without a name, changing anything makes it "custom".
  EXPECT_EQ(Parsed("precision: {preset: bf16, bf16_head: false}\n").precision.name, "custom");
  // bump_exponent touches MX operands only.
  s = Parsed("precision: {preset: bf16, bump_exponent: true}\n").precision;
  EXPECT_FALSE(RoleOf(s, Role::kFwdX).bump_exponent);
}

TEST(RunConfigPrecisionTest, Nvfp4FlagsTouchNvfp4OperandsOnly) {
  PrecisionScheme s = Parsed(
                          "precision: {preset: nvfp4, nvfp4_weight_16x16: true, nvfp4_rht_wgrad: true, "
                          "nvfp4_sr_grads: true}\n")
                          .precision;
  ExpectNvfp4RecipeOptions(s);
  // Off again on the recipe that has them.
  s = Parsed("precision: {preset: nvfp4_recipe, nvfp4_weight_16x16: false, nvfp4_rht_wgrad: false, "
             "nvfp4_sr_grads: false}\n")
          .precision;
  EXPECT_FALSE(RoleOf(s, Role::kFwdW).tile_16x16);
  EXPECT_FALSE(RoleOf(s, Role::kWgradX).rht);
  EXPECT_EQ(RoleOf(s, Role::kDgradDy).rounding, Rounding::kNearestEven);
  // On an MX scheme they change nothing.
  s = Parsed("precision: {preset: mxfp4, nvfp4_weight_16x16: true, nvfp4_rht_wgrad: true}\n").precision;
  EXPECT_FALSE(RoleOf(s, Role::kFwdW).tile_16x16);
  EXPECT_FALSE(RoleOf(s, Role::kWgradX).rht);
}

TEST(RunConfigPolicyTest, AnEmptyPolicyHasEveryDetectorAtItsDefault) {
  RunConfig c = Parsed("policy:\n");
  EXPECT_FALSE(c.policy.active());
  EXPECT_EQ(c.policy.max_interventions, 5);
  for (const std::string& name : DetectorNames()) {
    ASSERT_TRUE(c.policy.detectors.count(name)) << name;
    EXPECT_EQ(c.policy.detectors.at(name).enabled, DefaultDetectorConfig(name).enabled) << name;
  }
}

TEST(RunConfigPolicyTest, PolicyDefaultIsResolvedAgainstTheRunsSchemeAndLength) {
  RunConfig c = Parsed("precision: mxfp4\nsteps: 9000\npolicy: default\n");
  EXPECT_TRUE(c.policy.active());
  EXPECT_EQ(c.policy.preset, "default");
  EXPECT_EQ(c.policy.ladder,
            (std::vector<std::string>{"mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"}));
  EXPECT_EQ(c.policy.snapshot_every, 100);
  ASSERT_EQ(c.policy.rules.size(), 2u);  // blow-up and drift
  EXPECT_EQ(c.policy.rules[0].actions[0].steps, 200);
  EXPECT_EQ(c.policy.rules[1].name, "drift");
  EXPECT_EQ(c.policy.probation_after, 0);
  EXPECT_EQ(c.policy.rewarm_steps, 200);
  EXPECT_EQ(c.policy.yaml, "default");
  EXPECT_EQ(c.policy.detectors.at("loss_drift").ratio, 2);  // the proxy's
  EXPECT_EQ(c.probe_every, 0);  // the proxy's default policy reads no probe
  // A language model's drift rule fires at 1.1x its lowest median, its bias
  // rule reads the probe, which it turns on, and its ladder keeps the head in
  // BF16 above the start (policy.h, scheme.h).
  for (const char* type : {"gpt", "llama", "gla"}) {
    const std::string lm_yaml =
        std::string("model: {type: ") + type + ", heads: 4}\ndata: {train: t.bin}\nprecision: mxfp4\nsteps: 3000\n";
    const RunConfig lm = Parsed(lm_yaml + "policy: default\n");
    EXPECT_EQ(lm.policy.detectors.at("loss_drift").ratio, 1.1) << type;
    EXPECT_TRUE(lm.policy.detectors.at("grad_bias").enabled) << type;
    ASSERT_EQ(lm.policy.rules.size(), 3u) << type;
    EXPECT_EQ(lm.policy.rules[2].name, "bias") << type;
    EXPECT_EQ(lm.probe_every, 100) << type;
    EXPECT_EQ(lm.policy.ladder,
              (std::vector<std::string>{"mxfp4", "mxfp4+bf16_head", "mxfp6_e2m3+bf16_head", "mxfp8_e4m3+bf16_head",
                                        "mx_w_e4m3_a_bf16+bf16_head", "bf16", "fp32"}))
        << type;
    // The run's own probe cadence stays, 0 (off) included; a short run probes
    // often enough for three probes in a row.
    EXPECT_EQ(Parsed(lm_yaml + "probe_every: 0\npolicy: default\n").probe_every, 0) << type;
    EXPECT_EQ(Parsed(lm_yaml + "probe_every: 7\npolicy: default\n").probe_every, 7) << type;
    // Its probe's reference is the bf16 scheme's gradient unless the run names
    // one; a run without the bias rule keeps fp32, the field's default.
    EXPECT_EQ(lm.probe_reference, "bf16") << type;
    EXPECT_EQ(Parsed(lm_yaml + "probe_reference: fp32\npolicy: default\n").probe_reference, "fp32") << type;
    EXPECT_EQ(Parsed(lm_yaml + "probe_reference: bf16\npolicy: default\n").probe_reference, "bf16") << type;
    EXPECT_EQ(Parsed(lm_yaml).probe_reference, "fp32") << type;
    EXPECT_EQ(Parsed(lm_yaml + "policy: default\n", {"steps=300"}).probe_every, 10) << type;
    // Without the default policy nothing probes unless told; nor does a run
    // whose head is BF16 already (bf16, fp32, the NVFP4 recipe, a +bf16_head
    // start): it has no bias rule, which the evidence supports only where the
    // head can move to BF16.
    EXPECT_EQ(Parsed(lm_yaml).probe_every, 0) << type;
    for (const char* p : {"bf16", "fp32", "nvfp4_recipe", "mxfp4+bf16_head"}) {
      const RunConfig other = Parsed(lm_yaml + "policy: default\n", {std::string("precision=") + p});
      EXPECT_EQ(other.probe_every, 0) << type << " " << p;
      EXPECT_EQ(other.probe_reference, "fp32") << type << " " << p;
      EXPECT_EQ(other.policy.rules.size(), 2u) << type << " " << p;
    }
    EXPECT_EQ(Parsed(lm_yaml + "policy: default\n", {"precision=nvfp4"}).probe_every, 100) << type;
  }
  // The mapping form, with probation; the scheme after --set.
  c = Parsed("precision: mxfp4\nsteps: 300\npolicy: {preset: default, probation: {after: 40}}\n",
             {"precision=nvfp4"});
  EXPECT_EQ(c.policy.ladder.front(), "nvfp4");
  EXPECT_EQ(c.policy.ladder[1], "nvfp4_recipe");
  EXPECT_EQ(c.policy.ladder.back(), "fp32");
  EXPECT_EQ(c.policy.probation_after, 40);
  EXPECT_EQ(c.policy.snapshot_every, 3);
  EXPECT_EQ(c.policy.rewarm_steps, 6);  // 2 S
  // rewarm given beside the preset: that, 0 included (off).
  EXPECT_EQ(Parsed("steps: 9000\npolicy: {preset: default, rewarm: 50}\n").policy.rewarm_steps, 50);
  EXPECT_EQ(Parsed("steps: 9000\npolicy: {preset: default, rewarm: 0}\n").policy.rewarm_steps, 0);
  // rollback beside the preset: the blow-up rule's distance (2 S by default), and
  // enough snapshots kept to reach it.
  auto rollback_of = [](const RunConfig& rc) {
    for (const PolicyRule& rule : rc.policy.rules) {
      for (const PolicyAction& a : rule.actions) {
        if (a.kind == PolicyAction::Kind::kRollback) return a.steps;
      }
    }
    return int64_t{-1};
  };
  EXPECT_EQ(rollback_of(Parsed("steps: 9000\npolicy: default\n")), 200);
  RunConfig long_rollback = Parsed("steps: 9000\npolicy: {preset: default, rollback: 500}\n");
  EXPECT_EQ(rollback_of(long_rollback), 500);
  EXPECT_EQ(long_rollback.policy.rollback_steps, 500);
  EXPECT_EQ(long_rollback.policy.snapshot_keep, 12);
  EXPECT_EQ(Parsed("steps: 9000\npolicy: {preset: default, rollback: 2000}\n").policy.snapshot_keep, 21);
  EXPECT_EQ(Parsed("steps: 9000\npolicy: {preset: default, rollback: 2000, snapshots: {keep: 4}}\n")
                .policy.snapshot_keep,
            4);
  // lr_fallbacks beside the preset: how many times the learning rate halves
  // past the ladder's top before the run stops (the preset's 3), each one more
  // intervention allowed.
  const Policy preset = Parsed("steps: 9000\npolicy: default\n").policy;
  EXPECT_EQ(preset.lr_fallbacks, 3);
  const Policy one = Parsed("steps: 9000\npolicy: {preset: default, lr_fallbacks: 1}\n").policy;
  EXPECT_EQ(one.lr_fallbacks, 1);
  EXPECT_EQ(one.max_interventions, preset.max_interventions - 2);
  const Policy none = Parsed("steps: 9000\npolicy: {preset: default, lr_fallbacks: 0}\n").policy;
  EXPECT_EQ(none.lr_fallbacks, 0);
  EXPECT_EQ(none.max_interventions, preset.max_interventions - 3);
  EXPECT_EQ(Parsed("steps: 9000\npolicy: {preset: default, rollback: 200, lr_fallbacks: 2}\n").policy.lr_fallbacks, 2);
  // snapshots beside the preset: what is given replaces the preset's; the
  // memory budget is the host's share (-1) unless given.
  EXPECT_EQ(c.policy.snapshot_memory_mib, -1);
  EXPECT_EQ(c.policy.snapshot_keep, 12);
  const Policy snap = Parsed("steps: 9000\npolicy: {preset: default, snapshots: {memory_mib: 0, keep: 7}}\n").policy;
  EXPECT_EQ(snap.snapshot_memory_mib, 0);
  EXPECT_EQ(snap.snapshot_keep, 7);
  EXPECT_EQ(snap.snapshot_every, 100);  // the preset's
  EXPECT_EQ(Parsed("steps: 9000\npolicy: {preset: default, snapshots: {every: 40}}\n").policy.snapshot_every, 40);
  // --set policy=default on a run without one.
  c = Parsed("precision: bf16\n", {"policy=default"});
  EXPECT_EQ(c.policy.ladder, (std::vector<std::string>{"bf16", "fp32"}));
  // precision may name a rung with the head in BF16, as the ladders do.
  c = Parsed("precision: mxfp4+bf16_head\n");
  EXPECT_EQ(c.precision.name, "mxfp4+bf16_head");
  EXPECT_TRUE(c.precision.bf16_head);
  EXPECT_EQ(c.precision.roles[0].format, QuantFormat::kMxfp4);
  // A written-out ladder and switch may keep the head in BF16.
  c = Parsed("policy:\n  ladder: [mxfp8_e4m3, mxfp8_e4m3+bf16_head, bf16]\n  rules:\n"
             "    - {when: nonfinite, do: [{rollback: 5}, {switch: next}]}\n"
             "    - {when: loss_ratio, do: [{rollback: 5}, {switch: mxfp4+bf16_head}]}\n");
  EXPECT_EQ(c.policy.ladder, (std::vector<std::string>{"mxfp8_e4m3", "mxfp8_e4m3+bf16_head", "bf16"}));
  EXPECT_EQ(c.policy.rules[1].actions[1].scheme, "mxfp4+bf16_head");
  // probation on a policy written out.
  c = Parsed("policy:\n  ladder: [mxfp4, bf16]\n  probation: {after: 7}\n  rules:\n"
             "    - {when: nonfinite, do: [{rollback: 5}, {switch: next}]}\n");
  EXPECT_EQ(c.policy.probation_after, 7);
  EXPECT_EQ(c.policy.preset, "");
  EXPECT_EQ(c.policy.rewarm_steps, 0);  // a policy written out re-warms only when told
  c = Parsed("policy:\n  ladder: [mxfp4, bf16]\n  rewarm: 25\n  rules:\n"
             "    - {when: nonfinite, do: [{rollback: 5}, {switch: next}]}\n");
  EXPECT_EQ(c.policy.rewarm_steps, 25);
}

TEST(RunConfigPolicyTest, EveryDetectorParameterLands) {
  const Policy p = Parsed(
                       "policy:\n"
                       "  detectors:\n"
                       "    nonfinite: false\n"
                       "    loss_zscore: {window: 50, min_samples: 20, z: 4.5}\n"
                       "    loss_ratio: {window: 60, min_samples: 30, ratio: 3.5, steps: 7}\n"
                       "    grad_norm_zscore: {window: 70, min_samples: 40, z: 5.5}\n"
                       "    grad_norm_ratio: {enabled: false, window: 80, min_samples: 50, ratio: 2.5, steps: 9}\n"
                       "    grad_bias: {min_cosine: 0.25, max_abs_zeta: 0.75, max_rel_error: 0.5, consecutive: 3,"
                       " scope: any_layer}\n"
                       "    saturation: {max_fraction: 0.125, roles: [fwd_x, wgrad_dy]}\n"
                       "    gamma_growth: {window: 90, max_rate: 0.25}\n"
                       "    loss_drift: {window: 40, min_samples: 80, ratio: 3}\n"
                       "    hot_channel_growth: {window: 5, min_samples: 3, ratio: 6}\n")
                       .policy;
  const auto& d = p.detectors;
  EXPECT_FALSE(d.at("nonfinite").enabled);
  EXPECT_EQ(d.at("loss_zscore").window, 50);
  EXPECT_EQ(d.at("loss_zscore").min_samples, 20);
  EXPECT_EQ(d.at("loss_zscore").z, 4.5);
  EXPECT_EQ(d.at("loss_ratio").window, 60);
  EXPECT_EQ(d.at("loss_ratio").min_samples, 30);
  EXPECT_EQ(d.at("loss_ratio").ratio, 3.5);
  EXPECT_EQ(d.at("loss_ratio").steps, 7);
  EXPECT_EQ(d.at("grad_norm_zscore").window, 70);
  EXPECT_EQ(d.at("grad_norm_zscore").min_samples, 40);
  EXPECT_EQ(d.at("grad_norm_zscore").z, 5.5);
  EXPECT_FALSE(d.at("grad_norm_ratio").enabled);
  EXPECT_EQ(d.at("grad_norm_ratio").window, 80);
  EXPECT_EQ(d.at("grad_norm_ratio").min_samples, 50);
  EXPECT_EQ(d.at("grad_norm_ratio").ratio, 2.5);
  EXPECT_EQ(d.at("grad_norm_ratio").steps, 9);
  EXPECT_TRUE(d.at("grad_bias").enabled);  // configuring an off-by-default detector turns it on
  EXPECT_EQ(d.at("grad_bias").min_cosine, 0.25);
  EXPECT_EQ(d.at("grad_bias").max_abs_zeta, 0.75);
  EXPECT_EQ(d.at("grad_bias").max_rel_error, 0.5);
  EXPECT_EQ(d.at("grad_bias").consecutive, 3);
  EXPECT_EQ(d.at("grad_bias").scope, "any_layer");
  EXPECT_TRUE(d.at("saturation").enabled);
  EXPECT_EQ(d.at("saturation").max_fraction, 0.125);
  EXPECT_EQ(d.at("saturation").roles, (std::vector<std::string>{"fwd_x", "wgrad_dy"}));
  EXPECT_TRUE(d.at("gamma_growth").enabled);
  EXPECT_EQ(d.at("gamma_growth").window, 90);
  EXPECT_EQ(d.at("gamma_growth").max_rate, 0.25);
  EXPECT_TRUE(d.at("loss_drift").enabled);  // configuring an off-by-default detector turns it on
  EXPECT_EQ(d.at("loss_drift").window, 40);
  EXPECT_EQ(d.at("loss_drift").min_samples, 80);
  EXPECT_EQ(d.at("loss_drift").ratio, 3);
  EXPECT_TRUE(d.at("hot_channel_growth").enabled);
  EXPECT_EQ(d.at("hot_channel_growth").window, 5);
  EXPECT_EQ(d.at("hot_channel_growth").min_samples, 3);
  EXPECT_EQ(d.at("hot_channel_growth").ratio, 6);
  // The YAML above sets every parameter of detectors.h's table: a parameter
  // added there must be added here.
  for (const DetectorInfo& info : Detectors()) {
    const DetectorConfig def = DefaultDetectorConfig(info.name);
    const DetectorConfig& got = d.at(info.name);
    for (const DetectorParam& param : info.params) {
      bool changed = false;
      switch (param.kind) {
        case DetectorParam::Kind::kInt: changed = got.*param.int_field != def.*param.int_field; break;
        case DetectorParam::Kind::kFloat: changed = got.*param.float_field != def.*param.float_field; break;
        case DetectorParam::Kind::kChoice: changed = got.*param.string_field != def.*param.string_field; break;
        case DetectorParam::Kind::kRoles: changed = got.roles != def.roles; break;
      }
      EXPECT_TRUE(changed) << info.name << "." << param.key << " is not covered by this test";
    }
  }
  // A boolean switches a detector on or off; `enabled` inside a mapping too.
  EXPECT_TRUE(Parsed("policy: {detectors: {grad_bias: true}}\n").policy.detectors.at("grad_bias").enabled);
  EXPECT_FALSE(Parsed("policy: {detectors: {saturation: {enabled: false, max_fraction: 0.5}}}\n")
                   .policy.detectors.at("saturation")
                   .enabled);
}

TEST(RunConfigPolicyTest, EveryRuleActionAndSweepRuleFieldLands) {
  const Policy p = Parsed(
                       "policy:\n"
                       "  ladder: [mxfp4, mxfp8_e4m3, bf16]\n"
                       "  snapshots: {every: 25, keep: 6, memory_mib: 512}\n"
                       "  max_interventions: 9\n"
                       "  lr_fallbacks: 3\n"
                       "  rules:\n"
                       "    - name: spike\n"
                       "      when: [loss_zscore, loss_ratio]\n"
                       "      match: all\n"
                       "      do: [{rollback: {steps: 200}}, {switch: next}, {scale_lr: 0.5}, skip_step, stop]\n"
                       "      cooldown: 50\n"
                       "      max: 3\n"
                       "    - when: nonfinite\n"
                       "      do: [{rollback: 10}, {switch: bf16}, {skip_step: null}]\n"
                       "  sweep_rules:\n"
                       "    - {when_diverged: 2, scheme: mxfp4, switch: mxfp6_e2m3}\n"
                       "    - {when_diverged: 1, switch: bf16}\n")
                       .policy;
  EXPECT_TRUE(p.active());
  EXPECT_EQ(p.ladder, (std::vector<std::string>{"mxfp4", "mxfp8_e4m3", "bf16"}));
  EXPECT_EQ(p.snapshot_every, 25);
  EXPECT_EQ(p.snapshot_keep, 6);
  EXPECT_EQ(p.lr_fallbacks, 3);
  EXPECT_EQ(p.snapshot_memory_mib, 512);
  EXPECT_EQ(p.max_interventions, 9);
  ASSERT_EQ(p.rules.size(), 2u);
  const PolicyRule& a = p.rules[0];
  EXPECT_EQ(a.name, "spike");
  EXPECT_EQ(a.when, (std::vector<std::string>{"loss_zscore", "loss_ratio"}));
  EXPECT_TRUE(a.match_all);
  EXPECT_EQ(a.cooldown, 50);
  EXPECT_EQ(a.max, 3);
  ASSERT_EQ(a.actions.size(), 5u);
  EXPECT_EQ(a.actions[0].kind, PolicyAction::Kind::kRollback);
  EXPECT_EQ(a.actions[0].steps, 200);
  EXPECT_EQ(a.actions[1].kind, PolicyAction::Kind::kSwitch);
  EXPECT_EQ(a.actions[1].scheme, "next");
  EXPECT_EQ(a.actions[2].kind, PolicyAction::Kind::kScaleLr);
  EXPECT_EQ(a.actions[2].factor, 0.5);
  EXPECT_EQ(a.actions[3].kind, PolicyAction::Kind::kSkipStep);
  EXPECT_EQ(a.actions[4].kind, PolicyAction::Kind::kStop);
  const PolicyRule& b = p.rules[1];
  EXPECT_EQ(b.name, "rule1");  // default: rule<index>
  EXPECT_EQ(b.when, (std::vector<std::string>{"nonfinite"}));
  EXPECT_FALSE(b.match_all);
  EXPECT_EQ(b.cooldown, 100);
  EXPECT_EQ(b.max, 0);
  ASSERT_EQ(b.actions.size(), 3u);
  EXPECT_EQ(b.actions[0].steps, 10);  // rollback: N is rollback: {steps: N}
  EXPECT_EQ(b.actions[1].scheme, "bf16");
  EXPECT_EQ(b.actions[2].kind, PolicyAction::Kind::kSkipStep);
  ASSERT_EQ(p.sweep_rules.size(), 2u);
  EXPECT_EQ(p.sweep_rules[0].diverged, 2);
  EXPECT_EQ(p.sweep_rules[0].scheme, "mxfp4");
  EXPECT_EQ(p.sweep_rules[0].switch_to, "mxfp6_e2m3");
  EXPECT_EQ(p.sweep_rules[1].diverged, 1);
  EXPECT_EQ(p.sweep_rules[1].scheme, "any");
  EXPECT_EQ(p.sweep_rules[1].switch_to, "bf16");
  // The section as given, for checkpoints and events.
  EXPECT_NE(p.yaml.find("spike"), std::string::npos) << p.yaml;
  EXPECT_NE(p.yaml.find("when_diverged"), std::string::npos) << p.yaml;
}

TEST(RunConfigPolicyTest, ParsePolicyNodeReadsASweepsOwnNodes) {
  YAML::Node node = YAML::Load("{rules: [{when: nonfinite, do: [stop]}]}");
  Policy p;
  ASSERT_TRUE(ParsePolicyNode(node, "sweep.yaml", &p).ok());
  ASSERT_EQ(p.rules.size(), 1u);
  EXPECT_EQ(p.rules[0].actions[0].kind, PolicyAction::Kind::kStop);
  node = YAML::Load("\n{rules: [{when: nonfinite, do: [explode]}]}");
  Status s = ParsePolicyNode(node, "sweep.yaml", &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "sweep.yaml:2:33: policy.rules[0].do: unknown action 'explode' (allowed: switch, rollback, scale_lr, "
            "skip_step, stop)");
  EXPECT_EQ(p.rules.size(), 1u);  // untouched
}

TEST(RunConfigSchemeYamlTest, EveryPresetRoundTripsThroughTheStoredText) {
  for (const PresetInfo& info : Presets()) {
    PrecisionScheme s, back;
    ASSERT_TRUE(SchemeFromPreset(info.name, &s).ok());
    ASSERT_TRUE(ParseSchemeYaml(SchemeToYaml(s), &back).ok()) << info.name;
    EXPECT_EQ(SchemeToYaml(back), SchemeToYaml(s)) << info.name;
    EXPECT_EQ(back.name, info.name);
  }
  PrecisionScheme s;
  Status bad = ParseSchemeYaml("{name: x}", &s);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.message().rfind("stored precision scheme: ", 0), 0u) << bad.message();
}

// ---- Every refusal: message, line and column ------------------------------------

struct ErrorCase {
  std::string yaml;
  std::string message;  // the whole message, "r.yaml:line:col: field: ..."
};

// Runs each case: refused as InvalidArgument with exactly that message, and the
// output untouched.
void ExpectErrors(const std::vector<ErrorCase>& cases, const std::vector<std::string>& overrides = {}) {
  for (const ErrorCase& c : cases) {
    RunConfig config;
    config.name = "untouched";
    Status s = ParseRunConfig(c.yaml, "r.yaml", overrides, &config);
    EXPECT_EQ(s.message(), c.message) << "for:\n" << c.yaml;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_EQ(config.name, "untouched") << c.yaml;
  }
}

const std::string kRootKeys =
    "analytics, analytics_every, backend, batch, check_every, checkpoint_every, data, dist, grad_accum, keep_checkpoints, "
    "log_every, model, name, "
    "operand_stats, optimizer, policy, precision, probe_every, probe_reference, run_dir, schedule, seed, seq, steps, threads";
const std::string kDetectors =
    "nonfinite, loss_zscore, loss_ratio, grad_norm_zscore, grad_norm_ratio, grad_bias, saturation, gamma_growth, "
    "loss_drift, hot_channel_growth";
const std::string kActions = "switch, rollback, scale_lr, skip_step, stop";

TEST(RunConfigFieldsTest, OutlierAnalyticsFieldsLandAndAreChecked) {
  RunConfig d = Parsed("");
  EXPECT_EQ(d.analytics_every, 100);
  EXPECT_EQ(d.analytics.top_k, 8);
  EXPECT_EQ(d.analytics.maps_every, 0);
  RunConfig c = Parsed("analytics_every: 50\nanalytics: {top_k: 4, maps_every: 500}\n");
  EXPECT_EQ(c.analytics_every, 50);
  EXPECT_EQ(c.analytics.top_k, 4);
  EXPECT_EQ(c.analytics.maps_every, 500);
  EXPECT_EQ(Parsed("analytics_every: 0\n").analytics_every, 0);
  ExpectErrors({
      {"analytics_every: -1\n", "r.yaml:1:18: analytics_every: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"analytics: {top_k: 0}\n", "r.yaml:1:20: analytics.top_k: 0 is out of range (allowed: 1 .. 1024)"},
      {"analytics: {top_k: 1025}\n", "r.yaml:1:20: analytics.top_k: 1025 is out of range (allowed: 1 .. 1024)"},
      {"analytics: {maps: true}\n", "r.yaml:1:13: analytics.maps: unknown key (allowed: maps_every, top_k)"},
  });
  for (const char* text : {"analytics_every: 20\nanalytics: {maps_every: 30}\n",
                           "analytics_every: 0\nanalytics: {maps_every: 100}\n"}) {
    Status s = Parse(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find("analytics.maps_every: "), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("is not allowed with analytics_every"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("(allowed: 0 (no maps) or a multiple of analytics_every"), std::string::npos)
        << s.message();
  }
}

TEST(RunConfigErrorTest, TopLevel) {
  ExpectErrors({
      {"- steps\n", "r.yaml:1:1: config: expected a mapping at the top level"},
      {"7\n", "r.yaml:1:1: config: expected a mapping at the top level"},
      {"steps: 10\nbogus: 1\n", "r.yaml:2:1: bogus: unknown key (allowed: " + kRootKeys + ")"},
      {"name: [a]\n", "r.yaml:1:7: name: expected a string"},
      {"steps: 0\n", "r.yaml:1:8: steps: 0 is out of range (allowed: 1 .. 1099511627776)"},
      {"steps: 1099511627777\n", "r.yaml:1:8: steps: 1099511627777 is out of range (allowed: 1 .. 1099511627776)"},
      {"steps: ten\n", "r.yaml:1:8: steps: 'ten' is not an integer"},
      {"steps: 1.5\n", "r.yaml:1:8: steps: '1.5' is not an integer"},
      {"steps: [1]\n", "r.yaml:1:8: steps: '<sequence>' is not an integer"},
      {"steps: {a: 1}\n", "r.yaml:1:8: steps: '<mapping>' is not an integer"},
      {"batch: 16777217\n", "r.yaml:1:8: batch: 16777217 is out of range (allowed: 1 .. 16777216)"},
      {"seq: -1\n", "r.yaml:1:6: seq: -1 is out of range (allowed: 0 .. 1048576)"},
      {"grad_accum: 0\n", "r.yaml:1:13: grad_accum: 0 is out of range (allowed: 1 .. 65536)"},
      {"seed: -1\n", "r.yaml:1:7: seed: -1 is out of range (allowed: 0 .. 9223372036854775807)"},
      {"seed: 9223372036854775808\n", "r.yaml:1:7: seed: '9223372036854775808' is not an integer"},
      {"backend: tpu\n", "r.yaml:1:10: backend: unknown value 'tpu' (allowed: cpu, cuda)"},
      {"threads: 1025\n", "r.yaml:1:10: threads: 1025 is out of range (allowed: 0 .. 1024)"},
      {"run_dir: {a: 1}\n", "r.yaml:1:10: run_dir: expected a string"},
      {"checkpoint_every: -1\n", "r.yaml:1:19: checkpoint_every: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"keep_checkpoints: 1048577\n",
       "r.yaml:1:19: keep_checkpoints: 1048577 is out of range (allowed: 0 .. 1048576)"},
      {"probe_every: -1\n", "r.yaml:1:14: probe_every: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"probe_reference: fp16\n", "r.yaml:1:18: probe_reference: unknown value 'fp16' (allowed: fp32, bf16)"},
      {"operand_stats: maybe\n", "r.yaml:1:16: operand_stats: 'maybe' is not a boolean (allowed: true, false)"},
      {"log_every: 0\n", "r.yaml:1:12: log_every: 0 is out of range (allowed: 1 .. 1073741824)"},
      {"check_every: -1\n", "r.yaml:1:14: check_every: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"dist: {reduce: fp16}\n", "r.yaml:1:16: dist.reduce: unknown value 'fp16' (allowed: fp32, bf16)"},
      {"dist: {timeout_s: 0}\n", "r.yaml:1:19: dist.timeout_s: 0 is out of range (allowed: 0.1 .. 86400)"},
      {"dist: {ranks: 2}\n",
       "r.yaml:1:8: dist.ranks: unknown key (allowed: advertise_host, bucket_mb, listen_host, reduce, timeout_s)"},
      {"dist: {listen_host: 'a b'}\n",
       "r.yaml:1:21: dist.listen_host: 'a b' is not allowed (allowed: an IP address or host name of this machine, "
       "e.g. 127.0.0.1, or 0.0.0.0 / :: for every interface)"},
      {"dist: {listen_host: '10.0.0.1:7000'}\n",  // no port: the OS picks it
       "r.yaml:1:21: dist.listen_host: '10.0.0.1:7000' is not allowed (allowed: an IP address or host name of this "
       "machine, e.g. 127.0.0.1, or 0.0.0.0 / :: for every interface)"},
      {"dist: {advertise_host: 0.0.0.0}\n",
       "r.yaml:1:24: dist.advertise_host: '0.0.0.0' is not allowed (allowed: an IP address or host name of this "
       "machine that the other ranks reach, not a wildcard)"},
      {"dist: {advertise_host: -h}\n",
       "r.yaml:1:24: dist.advertise_host: '-h' is not allowed (allowed: an IP address or host name of this machine "
       "that the other ranks reach, not a wildcard)"},
      {"dist: {bucket_mb: -1}\n", "r.yaml:1:19: dist.bucket_mb: -1 is out of range (allowed: 0 .. 65536)"},
      {"dist: {bucket_mb: 1e9}\n", "r.yaml:1:19: dist.bucket_mb: 1e9 is out of range (allowed: 0 .. 65536)"},
      {"dist: {bucket_mb: big}\n", "r.yaml:1:19: dist.bucket_mb: 'big' is not a finite number"},
      {"dist: {bucket_mb: .nan}\n", "r.yaml:1:19: dist.bucket_mb: '.nan' is not a finite number"},
      // A null value is not "missing".
      {"steps: 10\nbatch: ~\n", "r.yaml:2:8: batch: '<null>' is not an integer"},
  });
}

TEST(RunConfigErrorTest, Model) {
  const std::string keys =
      "bias, context, heads, layers, ln_eps, mlp, mlp_hidden, padded_vocab, qk_layernorm, type, vocab, width";
  ExpectErrors({
      {"model: 5\n", "r.yaml:1:8: model: expected a mapping"},
      {"model:\n  type: proxy\n  depth: 3\n", "r.yaml:3:3: model.depth: unknown key (allowed: " + keys + ")"},
      {"model:\n  type: rnn\n", "r.yaml:2:9: model.type: unknown value 'rnn' (allowed: proxy, gpt, llama, gla)"},
      {"model:\n  layers: 0\n", "r.yaml:2:11: model.layers: 0 is out of range (allowed: 1 .. 1024)"},
      {"model: {width: 65537}\n", "r.yaml:1:16: model.width: 65537 is out of range (allowed: 1 .. 65536)"},
      {"model: {heads: 0}\n", "r.yaml:1:16: model.heads: 0 is out of range (allowed: 1 .. 1024)"},
      {"model: {context: 0}\n", "r.yaml:1:18: model.context: 0 is out of range (allowed: 1 .. 1048576)"},
      {"model: {vocab: 1}\n", "r.yaml:1:16: model.vocab: 1 is out of range (allowed: 2 .. 65536)"},
      {"model: {padded_vocab: -1}\n",
       "r.yaml:1:23: model.padded_vocab: -1 is out of range (allowed: 0 .. 1048576)"},
      {"model: {mlp: relu}\n", "r.yaml:1:14: model.mlp: unknown value 'relu' (allowed: gelu, swiglu)"},
      {"model: {mlp_hidden: -1}\n", "r.yaml:1:21: model.mlp_hidden: -1 is out of range (allowed: 0 .. 1048576)"},
      {"model: {qk_layernorm: 2}\n",
       "r.yaml:1:23: model.qk_layernorm: '2' is not a boolean (allowed: true, false)"},
      {"model: {bias: nope}\n", "r.yaml:1:15: model.bias: 'nope' is not a boolean (allowed: true, false)"},
      {"model: {ln_eps: 0}\n", "r.yaml:1:17: model.ln_eps: 0 is out of range (allowed: 1e-30 .. 1)"},
      {"model: {ln_eps: .inf}\n", "r.yaml:1:17: model.ln_eps: '.inf' is not a finite number"},
      {"model: {ln_eps: abc}\n", "r.yaml:1:17: model.ln_eps: 'abc' is not a finite number"},
  });
  // The llama block is fixed: the gpt-only keys are refused, naming the value.
  const std::string llama = " is not allowed with model.type llama (always SwiGLU, no biases, no QK-LayerNorm; "
                            "allowed keys: type, layers, width, heads, context, vocab, padded_vocab, mlp_hidden, "
                            "ln_eps)";
  ExpectErrors({
      {"model: {type: llama, mlp: gelu}\n", "r.yaml:1:27: model.mlp: 'gelu'" + llama},
      {"model: {type: llama, mlp: swiglu}\n", "r.yaml:1:27: model.mlp: 'swiglu'" + llama},
      {"model:\n  type: llama\n  bias: true\n", "r.yaml:3:9: model.bias: 'true'" + llama},
      {"model: {qk_layernorm: false, type: llama}\n", "r.yaml:1:23: model.qk_layernorm: 'false'" + llama},
  });
  EXPECT_EQ(Parse("model: {mlp: gelu}\n", {"model.type=llama"}).message(), "r.yaml:1:14: model.mlp: 'gelu'" + llama);
  // The gla block too.
  const std::string gla = " is not allowed with model.type gla (always SwiGLU, no biases, no QK-LayerNorm; "
                          "allowed keys: type, layers, width, heads, context, vocab, padded_vocab, mlp_hidden, "
                          "ln_eps)";
  ExpectErrors({
      {"model: {type: gla, mlp: gelu}\n", "r.yaml:1:25: model.mlp: 'gelu'" + gla},
      {"model:\n  type: gla\n  bias: false\n", "r.yaml:3:9: model.bias: 'false'" + gla},
  });
}

TEST(RunConfigErrorTest, Data) {
  ExpectErrors({
      {"data: [a]\n", "r.yaml:1:7: data: expected a mapping"},
      {"data:\n  test: x\n", "r.yaml:2:3: data.test: unknown key (allowed: eval_every, shuffle, train, val, val_batches)"},
      {"data: {shuffle: often}\n", "r.yaml:1:17: data.shuffle: 'often' is not a boolean (allowed: true, false)"},
      {"data:\n  train: [a]\n", "r.yaml:2:10: data.train: expected a string"},
      {"data:\n  val: {}\n", "r.yaml:2:8: data.val: expected a string"},
      {"data: {val_batches: 0}\n", "r.yaml:1:21: data.val_batches: 0 is out of range (allowed: 1 .. 1048576)"},
      {"data: {eval_every: -1}\n", "r.yaml:1:20: data.eval_every: -1 is out of range (allowed: 0 .. 1073741824)"},
  });
}

TEST(RunConfigErrorTest, Optimizer) {
  ExpectErrors({
      {"optimizer: adam\n", "r.yaml:1:12: optimizer: expected a mapping"},
      {"optimizer:\n  momentum: 0.9\n",
       "r.yaml:2:3: optimizer.momentum: unknown key (allowed: beta1, beta2, eps, grad_clip, lr, shard, type, "
       "weight_decay)"},
      {"optimizer: {shard: 2}\n", "r.yaml:1:20: optimizer.shard: '2' is not a boolean (allowed: true, false)"},
      {"optimizer: {type: sgd}\n", "r.yaml:1:19: optimizer.type: unknown value 'sgd' (allowed: adam, adamw)"},
      {"optimizer: {lr: 11}\n", "r.yaml:1:17: optimizer.lr: 11 is out of range (allowed: 0 .. 10)"},
      {"optimizer: {lr: -1e-3}\n", "r.yaml:1:17: optimizer.lr: -1e-3 is out of range (allowed: 0 .. 10)"},
      {"optimizer: {lr: fast}\n", "r.yaml:1:17: optimizer.lr: 'fast' is not a finite number"},
      {"optimizer: {beta1: 1}\n", "r.yaml:1:20: optimizer.beta1: 1 is out of range (allowed: 0 .. 0.999999)"},
      // The limit 0.99999999 prints with 6 significant digits.
      {"optimizer: {beta2: 1}\n", "r.yaml:1:20: optimizer.beta2: 1 is out of range (allowed: 0 .. 1)"},
      {"optimizer: {eps: 2}\n", "r.yaml:1:18: optimizer.eps: 2 is out of range (allowed: 0 .. 1)"},
      {"optimizer: {type: adamw, weight_decay: 11}\n",
       "r.yaml:1:40: optimizer.weight_decay: 11 is out of range (allowed: 0 .. 10)"},
      {"optimizer: {grad_clip: -1}\n", "r.yaml:1:24: optimizer.grad_clip: -1 is out of range (allowed: 0 .. 1e+30)"},
      // Cross-field: plain Adam has no weight decay (type defaults to adam).
      {"optimizer:\n  lr: 0.1\n  weight_decay: 0.01\n",
       "r.yaml:3:17: optimizer.weight_decay: 0.01 needs optimizer.type adamw (adam has no weight decay)"},
      {"optimizer: {type: adam, weight_decay: 1e-2}\n",
       "r.yaml:1:39: optimizer.weight_decay: 1e-2 needs optimizer.type adamw (adam has no weight decay)"},
  });
}

TEST(RunConfigErrorTest, Schedule) {
  ExpectErrors({
      {"schedule: cosine\n", "r.yaml:1:11: schedule: expected a mapping"},
      {"schedule:\n  decay: 3\n",
       "r.yaml:2:3: schedule.decay: unknown key (allowed: min_lr_ratio, spike_at, spike_factor, spike_steps, type, "
       "warmup_steps)"},
      {"schedule: {type: step}\n",
       "r.yaml:1:18: schedule.type: unknown value 'step' (allowed: constant, cosine, linear)"},
      {"schedule: {warmup_steps: -1}\n",
       "r.yaml:1:26: schedule.warmup_steps: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"schedule: {min_lr_ratio: 2}\n", "r.yaml:1:26: schedule.min_lr_ratio: 2 is out of range (allowed: 0 .. 1)"},
      {"schedule: {spike_at: -1}\n", "r.yaml:1:22: schedule.spike_at: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"schedule: {spike_steps: 0}\n",
       "r.yaml:1:25: schedule.spike_steps: 0 is out of range (allowed: 1 .. 1073741824)"},
      {"schedule: {spike_factor: 0}\n",
       "r.yaml:1:26: schedule.spike_factor: 0 is out of range (allowed: 1e-06 .. 1e+06)"},
  });
}

TEST(RunConfigErrorTest, Precision) {
  const std::string keys =
      "attention, bf16_first_blocks, bf16_head, bf16_last_blocks, bump_exponent, dgrad_dy, dgrad_w, forward_only, "
      "fwd_w, fwd_x, grad_rounding, hcp, layernorm, mx_block, name, nvfp4_rht_wgrad, nvfp4_sr_grads, "
      "nvfp4_weight_16x16, post_qk_bf16, preset, rounding, wgrad_dy, wgrad_x";
  const std::string roundings = "(allowed: nearest_even, nearest_away, stochastic)";
  ExpectErrors({
      {"precision: fp8\n", "r.yaml:1:12: precision: unknown value 'fp8' (allowed: " + PresetNames() +
                                "; a preset may be followed by +bf16_head)"},
      {"precision: ''\n", "r.yaml:1:12: precision: unknown value '' (allowed: " + PresetNames() +
                               "; a preset may be followed by +bf16_head)"},
      {"precision: fp8+bf16_head\n", "r.yaml:1:12: precision: unknown value 'fp8+bf16_head' (allowed: " +
                                          PresetNames() + "; a preset may be followed by +bf16_head)"},
      {"precision: [bf16]\n", "r.yaml:1:12: precision: expected a mapping"},
      {"precision:\n  preset: bf16\n  fmt: x\n", "r.yaml:3:3: precision.fmt: unknown key (allowed: " + keys + ")"},
      {"precision:\n  preset: fp8\n",
       "r.yaml:2:11: precision.preset: unknown value 'fp8' (allowed: " + PresetNames() + ")"},
      {"precision:\n  fwd_x: fp7\n",
       "r.yaml:2:10: precision.fwd_x: unknown format 'fp7' (allowed: " + OperandFormatNames() + ")"},
      {"precision:\n  wgrad_x: [bf16]\n", "r.yaml:2:12: precision.wgrad_x: expected a string"},
      {"precision: {rounding: up}\n", "r.yaml:1:23: precision.rounding: unknown value 'up' " + roundings},
      {"precision: {grad_rounding: down}\n",
       "r.yaml:1:28: precision.grad_rounding: unknown value 'down' " + roundings},
      {"precision: {layernorm: fp7}\n",
       "r.yaml:1:24: precision.layernorm: unknown format 'fp7' (allowed: " + OperandFormatNames() + ")"},
      {"precision: {layernorm: {a: 1}}\n", "r.yaml:1:24: precision.layernorm: expected a string"},
      {"precision: {forward_only: 3}\n",
       "r.yaml:1:27: precision.forward_only: '3' is not a boolean (allowed: true, false)"},
      {"precision: {bf16_first_blocks: -1}\n",
       "r.yaml:1:32: precision.bf16_first_blocks: -1 is out of range (allowed: 0 .. 1048576)"},
      {"precision: {bf16_last_blocks: x}\n", "r.yaml:1:31: precision.bf16_last_blocks: 'x' is not an integer"},
      {"precision: {bf16_head: x}\n", "r.yaml:1:24: precision.bf16_head: 'x' is not a boolean (allowed: true, false)"},
      {"precision: {attention: fp16}\n",
       "r.yaml:1:24: precision.attention: unknown value 'fp16' (allowed: bf16, fp32)"},
      {"precision: {mx_block: 0}\n", "r.yaml:1:23: precision.mx_block: 0 is out of range (allowed: 1 .. 4096)"},
      {"precision: {mx_block: 4097}\n", "r.yaml:1:23: precision.mx_block: 4097 is out of range (allowed: 1 .. 4096)"},
      {"precision: {bump_exponent: x}\n",
       "r.yaml:1:28: precision.bump_exponent: 'x' is not a boolean (allowed: true, false)"},
      {"precision: {nvfp4_weight_16x16: x}\n",
       "r.yaml:1:33: precision.nvfp4_weight_16x16: 'x' is not a boolean (allowed: true, false)"},
      {"precision: {nvfp4_rht_wgrad: x}\n",
       "r.yaml:1:30: precision.nvfp4_rht_wgrad: 'x' is not a boolean (allowed: true, false)"},
      {"precision: {nvfp4_sr_grads: x}\n",
       "r.yaml:1:29: precision.nvfp4_sr_grads: 'x' is not a boolean (allowed: true, false)"},
      {"precision: {name: [a]}\n", "r.yaml:1:19: precision.name: expected a string"},
      // The scheme's own rules, at the precision mapping.
      {"precision:\n  preset: nvfp4\n  rounding: nearest_away\n",
       "r.yaml:2:3: precision.fwd_x: rounding nearest_away is not allowed for nvfp4 (allowed: nearest_even, "
       "stochastic)"},
      {"precision:\n  preset: nvfp4_recipe\n  wgrad_x: mxfp8_e4m3\n",
       "r.yaml:2:3: precision: rht must be set on both wgrad_dy and wgrad_x or on neither (the rotation cancels "
       "only when both operands of dW = dY^T X are rotated)"},
  });
}

TEST(RunConfigErrorTest, PolicySectionsAndDetectors) {
  const std::string policy_keys =
      "detectors, ladder, lr_fallbacks, max_interventions, probation, rewarm, rules, snapshots, sweep_rules";
  const std::string roles = "fwd_x, fwd_w, dgrad_dy, dgrad_w, wgrad_dy, wgrad_x";
  ExpectErrors({
      {"policy: [a]\n", "r.yaml:1:9: policy: expected a mapping"},
      {"policy:\n  detector: {}\n", "r.yaml:2:3: policy.detector: unknown key (allowed: " + policy_keys + ")"},
      {"policy:\n  detectors: [nonfinite]\n", "r.yaml:2:14: policy.detectors: expected a mapping of detector names"},
      {"policy:\n  detectors:\n    loss_spike: true\n",
       "r.yaml:3:5: policy.detectors: unknown value 'loss_spike' (allowed: " + kDetectors + ")"},
      {"policy:\n  detectors:\n    nonfinite: maybe\n",
       "r.yaml:3:16: policy.detectors.nonfinite: 'maybe' is not a boolean (allowed: true, false)"},
      {"policy:\n  detectors:\n    loss_zscore: [1]\n", "r.yaml:3:18: policy.detectors.loss_zscore: expected a mapping"},
      {"policy:\n  detectors:\n    loss_zscore: {zz: 3}\n",
       "r.yaml:3:19: policy.detectors.loss_zscore.zz: unknown key (allowed: enabled, min_samples, window, z)"},
      {"policy:\n  detectors:\n    loss_ratio: {enabled: x}\n",
       "r.yaml:3:27: policy.detectors.loss_ratio.enabled: 'x' is not a boolean (allowed: true, false)"},
      {"policy:\n  detectors:\n    loss_zscore: {window: 1}\n",
       "r.yaml:3:27: policy.detectors.loss_zscore.window: 1 is out of range (allowed: 2 .. 1048576)"},
      {"policy:\n  detectors:\n    loss_zscore: {z: 0.1}\n",
       "r.yaml:3:22: policy.detectors.loss_zscore.z: 0.1 is out of range (allowed: 0.5 .. 1e+06)"},
      {"policy:\n  detectors:\n    grad_bias: {scope: layer}\n",
       "r.yaml:3:24: policy.detectors.grad_bias.scope: unknown value 'layer' (allowed: overall, any_layer)"},
      {"policy:\n  detectors:\n    saturation: {roles: fwd_x}\n",
       "r.yaml:3:25: policy.detectors.saturation.roles: expected a list of roles"},
      {"policy:\n  detectors:\n    saturation: {roles: [fwd_x, bwd]}\n",
       "r.yaml:3:33: policy.detectors.saturation.roles: unknown value 'bwd' (allowed: " + roles + ")"},
      {"policy:\n  ladder: bf16\n", "r.yaml:2:11: policy.ladder: expected a list of scheme presets"},
      {"policy:\n  ladder: [mxfp4, fp8]\n",
       "r.yaml:2:19: policy.ladder: unknown value 'fp8' (allowed: " + PresetNames() +
           "; a preset may be followed by +bf16_head)"},
      {"policy:\n  ladder: [mxfp4, mxfp4+fp8]\n",
       "r.yaml:2:19: policy.ladder: unknown value 'mxfp4+fp8' (allowed: " + PresetNames() +
           "; a preset may be followed by +bf16_head)"},
      {"policy:\n  ladder: [mxfp4, fp8+bf16_head]\n",
       "r.yaml:2:19: policy.ladder: unknown value 'fp8+bf16_head' (allowed: " + PresetNames() +
           "; a preset may be followed by +bf16_head)"},
      {"policy:\n  ladder: [mxfp4, bf16, mxfp4]\n",
       "r.yaml:2:25: policy.ladder: 'mxfp4' appears twice: the ladder would loop"},
      {"policy:\n  snapshots: 5\n", "r.yaml:2:14: policy.snapshots: expected a mapping"},
      {"policy:\n  snapshots: {size: 1}\n", "r.yaml:2:15: policy.snapshots.size: unknown key (allowed: every, keep, memory_mib)"},
      {"policy:\n  snapshots: {every: 0}\n",
       "r.yaml:2:22: policy.snapshots.every: 0 is out of range (allowed: 1 .. 1073741824)"},
      {"policy:\n  snapshots: {keep: 0}\n",
       "r.yaml:2:21: policy.snapshots.keep: 0 is out of range (allowed: 1 .. 1048576)"},
      {"policy:\n  snapshots: {memory_mib: -1}\n",
       "r.yaml:2:27: policy.snapshots.memory_mib: -1 is out of range (allowed: 0 .. 1073741824)"},
      {"policy:\n  max_interventions: -1\n",
       "r.yaml:2:22: policy.max_interventions: -1 is out of range (allowed: 0 .. 1048576)"},
  });
}

TEST(RunConfigErrorTest, PolicyRules) {
  const std::string head = "policy:\n  rules:\n";
  const std::string allowed_do = "expected a non-empty list of actions (" + kActions + ")";
  ExpectErrors({
      {head.substr(0, head.size() - 1) + " {a: 1}\n", "r.yaml:2:10: policy.rules: expected a list of rules"},
      {head + "    - name: a\n      when: nonfinite\n      do: [stop]\n      bogus: 1\n",
       "r.yaml:6:7: policy.rules[0].bogus: unknown key (allowed: cooldown, do, match, max, name, when)"},
      {head + "    - stop\n", "r.yaml:3:7: policy.rules[0]: expected a mapping"},
      {head + "    - {name: [a], when: nonfinite, do: [stop]}\n", "r.yaml:3:14: policy.rules[0].name: expected a string"},
      {head + "    - {do: [stop]}\n", "r.yaml:3:7: policy.rules[0].when: missing (a list of detectors)"},
      {head + "    - {when: spike, do: [stop]}\n",
       "r.yaml:3:14: policy.rules[0].when: unknown value 'spike' (allowed: " + kDetectors + ")"},
      {head + "    - {when: [nonfinite, spike], do: [stop]}\n",
       "r.yaml:3:26: policy.rules[0].when: unknown value 'spike' (allowed: " + kDetectors + ")"},
      {head + "    - {when: [], do: [stop]}\n",
       "r.yaml:3:14: policy.rules[0].when: expected a detector or a non-empty list of detectors"},
      {head + "    - {when: {a: 1}, do: [stop]}\n",
       "r.yaml:3:14: policy.rules[0].when: expected a detector or a non-empty list of detectors"},
      // grad_bias is off unless policy.detectors turns it on.
      {head + "    - {when: [nonfinite, grad_bias], do: [stop]}\n",
       "r.yaml:3:14: policy.rules[0].when: detector 'grad_bias' is disabled in policy.detectors"},
      {"policy:\n  detectors: {nonfinite: false}\n  rules:\n    - {when: nonfinite, do: [stop]}\n",
       "r.yaml:4:14: policy.rules[0].when: detector 'nonfinite' is disabled in policy.detectors"},
      {head + "    - {when: nonfinite, match: most, do: [stop]}\n",
       "r.yaml:3:32: policy.rules[0].match: unknown value 'most' (allowed: any, all)"},
      {head + "    - {when: nonfinite}\n", "r.yaml:3:7: policy.rules[0].do: " + allowed_do},
      {head + "    - {when: nonfinite, do: []}\n", "r.yaml:3:29: policy.rules[0].do: " + allowed_do},
      {head + "    - {when: nonfinite, do: stop}\n", "r.yaml:3:29: policy.rules[0].do: " + allowed_do},
      {head + "    - {when: nonfinite, cooldown: -1, do: [stop]}\n",
       "r.yaml:3:35: policy.rules[0].cooldown: -1 is out of range (allowed: 0 .. 1099511627776)"},
      {head + "    - {when: nonfinite, max: 1048577, do: [stop]}\n",
       "r.yaml:3:30: policy.rules[0].max: 1048577 is out of range (allowed: 0 .. 1048576)"},
      {head + "    - {name: a, when: nonfinite, do: [stop]}\n    - {name: a, when: loss_ratio, do: [stop]}\n",
       "r.yaml:4:7: policy.rules[1].name: 'a' names two rules"},
      // The default name of the second rule is rule1.
      {head + "    - {name: rule1, when: nonfinite, do: [stop]}\n    - {when: loss_ratio, do: [stop]}\n",
       "r.yaml:4:7: policy.rules[1].name: 'rule1' names two rules"},
  });
}

TEST(RunConfigErrorTest, PolicyPresetsProbationAndReplays) {
  const std::string head = "policy:\n  rules:\n    - {when: nonfinite, do: [";
  ExpectErrors({
      {"policy: safest\n",
       "r.yaml:1:9: policy: unknown policy 'safest' (allowed: default, or a mapping of detectors, ladder, rules, ...)"},
      {"policy: {preset: safest}\n", "r.yaml:1:18: policy.preset: unknown value 'safest' (allowed: default)"},
      {"policy: {preset: default, rules: []}\n",
       "r.yaml:1:27: policy.rules: unknown key (allowed: lr_fallbacks, preset, probation, rewarm, rollback, snapshots, "
       "sweep_rules)"},
      {"policy: {preset: default, lr_fallbacks: 9}\n",
       "r.yaml:1:41: policy.lr_fallbacks: 9 is out of range (allowed: 0 .. 8)"},
      {"policy: {preset: default, lr_fallbacks: two}\n",
       "r.yaml:1:41: policy.lr_fallbacks: 'two' is not an integer"},
      {"policy: {preset: default, rollback: 0}\n",
       "r.yaml:1:37: policy.rollback: 0 is out of range (allowed: 1 .. 1073741824)"},
      {"policy: {preset: default, probation: {after: 0}}\n",
       "r.yaml:1:46: policy.probation.after: 0 is out of range (allowed: 1 .. 1099511627776)"},
      {"policy: {preset: default, probation: {after: -5}}\n",
       "r.yaml:1:46: policy.probation.after: -5 is out of range (allowed: 1 .. 1099511627776)"},
      {"policy: {preset: default, probation: {}}\n",
       "r.yaml:1:38: policy.probation.after: missing (healthy steps before going back down one rung, >= 1)"},
      {"policy: {preset: default, probation: {before: 3}}\n",
       "r.yaml:1:39: policy.probation.before: unknown key (allowed: after)"},
      {"policy:\n  probation: {after: 5}\n",
       "r.yaml:2:14: policy.probation: needs policy.ladder (probation goes back down one of its rungs)"},
      {head + "{rollback: 50}]}\n",
       "r.yaml:3:29: policy.rules[0].do: [rollback] is a rollback alone: the run would replay the same steps in the "
       "same scheme and diverge the same way (allowed: a rollback with switch, scale_lr or stop)"},
      {head + "{rollback: 50}, skip_step]}\n",
       "r.yaml:3:29: policy.rules[0].do: [rollback, skip_step] is a rollback alone: the run would replay the same "
       "steps in the same scheme and diverge the same way (allowed: a rollback with switch, scale_lr or stop)"},
  });
}

TEST(RunConfigErrorTest, PolicyActions) {
  // Each action below is the first item of `do:`, which opens at column 30.
  const std::string head = "policy:\n  rules:\n    - {when: nonfinite, do: [";
  const std::string tail = "]}\n";
  ExpectErrors({
      {head + "{switch: bf16, stop: 1}" + tail,
       "r.yaml:3:30: policy.rules[0].do: expected an action such as `switch: bf16` or `skip_step`"},
      {head + "[stop]" + tail, "r.yaml:3:30: policy.rules[0].do: expected an action such as `switch: bf16` or `skip_step`"},
      {head + "explode" + tail,
       "r.yaml:3:30: policy.rules[0].do: unknown action 'explode' (allowed: " + kActions + ")"},
      {head + "switch" + tail, "r.yaml:3:30: policy.rules[0].do.switch: missing the scheme (a preset name or next)"},
      {head + "{switch: null}" + tail, "r.yaml:3:39: policy.rules[0].do.switch: expected a string"},
      {head + "{switch: fp8}" + tail,
       "r.yaml:3:39: policy.rules[0].do.switch: unknown value 'fp8' (allowed: " + PresetNames() +
           ", next; a preset may be followed by +bf16_head)"},
      {head + "{switch: next}" + tail, "r.yaml:3:39: policy.rules[0].do.switch: 'next' needs policy.ladder"},
      {head + "rollback" + tail, "r.yaml:3:30: policy.rules[0].do.rollback.steps: missing (steps to roll back, >= 1)"},
      {head + "{rollback: {}}" + tail,
       "r.yaml:3:30: policy.rules[0].do.rollback.steps: missing (steps to roll back, >= 1)"},
      {head + "{rollback: {step: 3}}" + tail,
       "r.yaml:3:42: policy.rules[0].do.rollback.step: unknown key (allowed: steps)"},
      {head + "{rollback: 0}" + tail,
       "r.yaml:3:41: policy.rules[0].do.rollback.steps: 0 is out of range (allowed: 1 .. 1099511627776)"},
      {head + "{rollback: {steps: x}}" + tail,
       "r.yaml:3:49: policy.rules[0].do.rollback.steps: 'x' is not an integer"},
      {head + "scale_lr" + tail, "r.yaml:3:30: policy.rules[0].do.scale_lr: missing the factor"},
      {head + "{scale_lr: 20}" + tail,
       "r.yaml:3:41: policy.rules[0].do.scale_lr: 20 is out of range (allowed: 1e-06 .. 10)"},
      {head + "{skip_step: 1}" + tail, "r.yaml:3:42: policy.rules[0].do.skip_step: takes no value"},
      {head + "{stop: now}" + tail, "r.yaml:3:37: policy.rules[0].do.stop: takes no value"},
      // The index in the field is the rule's; a later action is found at its place.
      {"policy:\n  rules:\n    - {when: nonfinite, do: [stop]}\n    - {when: nonfinite, do: [stop, explode]}\n",
       "r.yaml:4:36: policy.rules[1].do: unknown action 'explode' (allowed: " + kActions + ")"},
  });
}

TEST(RunConfigErrorTest, PolicySweepRules) {
  const std::string head = "policy:\n  sweep_rules:\n";
  ExpectErrors({
      {"policy:\n  sweep_rules: {}\n", "r.yaml:2:16: policy.sweep_rules: expected a list"},
      {head + "    - {when_diverged: 1, switch: bf16, on: x}\n",
       "r.yaml:3:40: policy.sweep_rules[0].on: unknown key (allowed: scheme, switch, when_diverged)"},
      {head + "    - {switch: bf16}\n",
       "r.yaml:3:7: policy.sweep_rules[0].when_diverged: missing (runs that must diverge, >= 1)"},
      {head + "    - {when_diverged: 0, switch: bf16}\n",
       "r.yaml:3:23: policy.sweep_rules[0].when_diverged: 0 is out of range (allowed: 1 .. 1048576)"},
      {head + "    - {when_diverged: 1, scheme: fp8, switch: bf16}\n",
       "r.yaml:3:34: policy.sweep_rules[0].scheme: unknown value 'fp8' (allowed: " + PresetNames() + ", any)"},
      {head + "    - {when_diverged: 1}\n",
       "r.yaml:3:7: policy.sweep_rules[0].switch: missing (the preset the other runs switch to)"},
      {head + "    - {when_diverged: 1, switch: bf16}\n    - {when_diverged: 1, switch: any}\n",
       "r.yaml:4:34: policy.sweep_rules[1].switch: unknown value 'any' (allowed: " + PresetNames() + ")"},
  });
}

// ValidateRunConfig's rules, reported at the field they name (or its nearest
// ancestor in the file, or 1:1).
TEST(RunConfigErrorTest, CrossFieldRulesPointAtTheirField) {
  const std::string rht = " per micro-batch is not allowed with RHT on the wgrad operands (a multiple of 16)";
  ExpectErrors({
      {"model: {type: gpt, heads: 8}\n", "r.yaml:1:1: data.train: missing (gpt needs token shards)"},
      {"model: {type: gpt, heads: 8}\ndata:\n  val: v.bin\n",
       "r.yaml:3:3: data.train: missing (gpt needs token shards)"},
      {"model: {type: gpt, width: 100, heads: 12}\ndata: {train: t.bin}\n",
       "r.yaml:1:39: model.heads: 12 does not divide model.width 100"},
      {"model:\n  type: gpt\n  width: 100\ndata: {train: t.bin}\n",
       "r.yaml:2:3: model.heads: 12 does not divide model.width 100"},
      {"model: {type: gpt, heads: 8, context: 64}\ndata: {train: t.bin}\nseq: 65\n",
       "r.yaml:3:6: seq: 65 is larger than model.context 64"},
      {"model: {type: gpt, heads: 8, vocab: 300, padded_vocab: 256}\ndata: {train: t.bin}\n",
       "r.yaml:1:56: model.padded_vocab: 256 is smaller than model.vocab 300"},
      {"precision: nvfp4_recipe\nbatch: 10\n", "r.yaml:2:8: batch: 10 samples" + rht},
      {"model: {type: gpt, heads: 8, context: 8}\ndata: {train: t.bin}\nprecision: nvfp4_recipe\nbatch: 3\n",
       "r.yaml:4:8: batch: 24 tokens (batch x seq)" + rht},
      {"model: {type: llama, heads: 8}\n", "r.yaml:1:1: data.train: missing (llama needs token shards)"},
      {"model: {type: llama, width: 100, heads: 12}\ndata: {train: t.bin}\n",
       "r.yaml:1:41: model.heads: 12 does not divide model.width 100"},
      {"model: {type: llama, width: 60, heads: 4}\ndata: {train: t.bin}\n",
       "r.yaml:1:40: model.heads: 4 with model.width 60 gives head size 15 (allowed: an even head size, which RoPE "
       "needs)"},
      {"model: {type: llama, heads: 8, context: 64}\ndata: {train: t.bin}\nseq: 65\n",
       "r.yaml:3:6: seq: 65 is larger than model.context 64"},
      {"model: {type: llama, heads: 8, vocab: 300, padded_vocab: 256}\ndata: {train: t.bin}\n",
       "r.yaml:1:58: model.padded_vocab: 256 is smaller than model.vocab 300"},
      {"model: {type: llama, heads: 8, context: 8}\ndata: {train: t.bin}\nprecision: nvfp4_recipe\nbatch: 3\n",
       "r.yaml:4:8: batch: 24 tokens (batch x seq)" + rht},
      {"precision: {preset: nvfp4, post_qk_bf16: true}\n",
       "r.yaml:1:42: precision.post_qk_bf16: true is not allowed with model.type proxy (allowed with llama, whose W_v "
       "it keeps in BF16, and gla, whose gk_proj and o_proj it keeps in BF16)"},
      {"model: {type: gpt, heads: 8}\ndata: {train: t.bin}\nprecision: {preset: nvfp4, post_qk_bf16: true}\n",
       "r.yaml:3:42: precision.post_qk_bf16: true is not allowed with model.type gpt (allowed with llama, whose W_v "
       "it keeps in BF16, and gla, whose gk_proj and o_proj it keeps in BF16)"},
      {"precision: {post_qk_bf16: 2}\n", "r.yaml:1:27: precision.post_qk_bf16: '2' is not a boolean (allowed: true, false)"},
      {"precision: {preset: nvfp4_hcp, hcp: {k: 3}}\n",
       "r.yaml:1:38: precision.hcp.k: unknown key (allowed: channels, dgrad, every, wgrad_rows)"},
      {"precision: {preset: nvfp4_hcp, hcp: {channels: -2}}\n",
       "r.yaml:1:48: precision.hcp.channels: -2 is out of range (allowed: 0 .. 4096)"},
      {"precision: {preset: nvfp4_hcp, hcp: {every: 0}}\n",
       "r.yaml:1:45: precision.hcp.every: 0 is out of range (allowed: 1 .. 1073741824)"},
      {"precision: {preset: nvfp4_hcp, hcp: 3}\n",
       "r.yaml:1:37: precision.hcp: expected a mapping {channels, every, dgrad, wgrad_rows} or off"},
      {"precision: {preset: nvfp4, hcp: {wgrad_rows: 80}}\nbatch: 64\n",
       "r.yaml:1:46: precision.hcp.wgrad_rows: 80 is not allowed with 64 rows per micro-batch (allowed: 0 .. 64)"},
      {"model: {type: gpt, heads: 8}\ndata: {train: t.bin}\nprecision: nvfp4\npolicy: {ladder: [nvfp4, chon, fp32], "
       "rules: [{when: [loss_zscore], do: [{switch: next}, {rollback: 10}]}]}\n",
       "r.yaml:4:18: policy.ladder: 'chon' is not allowed with model.type gpt (it sets post_qk_bf16, which needs "
       "llama or gla; nvfp4_hcp is the same without it)"},
      {"model: {type: gla, heads: 8}\n", "r.yaml:1:1: data.train: missing (gla needs token shards)"},
      {"model: {type: gla, width: 96, heads: 32}\ndata: {train: t.bin}\n",
       "r.yaml:1:38: model.heads: 32 with model.width 96 (allowed with model.type gla: an even width whose half, the "
       "key width, model.heads divides)"},
      {"model: {type: gla, width: 100, heads: 8}\ndata: {train: t.bin}\n",
       "r.yaml:1:39: model.heads: 8 does not divide model.width 100"},
      {"model: {type: proxy, width: 65536, layers: 1024}\n",
       "r.yaml:1:29: model.width: 65536 with model.layers 1024 (proxy) gives 35184573415424 parameters, a training "
       "state of 524291.0 GiB (16 bytes per parameter: fp32 weights, gradients, Adam m and v), more than the limit "
       "of 256 GiB (allowed: at most 17179869184 parameters)"},
  });
}

TEST(RunConfigErrorTest, ValidateRunConfigOnABuiltConfig) {
  RunConfig c;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c.probe_every = -1;
  Status s = ValidateRunConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "probe_every: must be >= 0");
  c = RunConfig();
  c.precision.bf16_first_blocks = -1;
  EXPECT_EQ(ValidateRunConfig(c).message(), "precision.bf16_first_blocks: -1 is not allowed (>= 0)");
}

TEST(RunConfigErrorTest, UnreadableValuesAndOneLineMessages) {
  ExpectErrors({
      // A key that is not a string.
      {"steps: 1\n[a]: 1\n", "r.yaml:2:1: config: bad conversion"},
      // An echoed newline is written as \n: every message is one line.
      {"backend: \"c\\npu\"\n", "r.yaml:1:10: backend: unknown value 'c\\npu' (allowed: cpu, cuda)"},
      // The strict loader's refusals come first.
      {"steps: [1\n", "r.yaml:2:1: invalid YAML: end of sequence flow not found"},
  });
}

// ---- --set overrides -----------------------------------------------------------

TEST(RunConfigOverrideTest, AssignmentsReplaceCreateAndKeepPresets) {
  RunConfig c = Parsed("steps: 10\noptimizer: {lr: 0.5}\nprecision: mxfp4\n",
                       {"steps=20", "optimizer.lr=1e-3", "model.width=64", "precision.bump_exponent=true",
                        "policy.rules=[{when: nonfinite, do: [stop]}]"});
  EXPECT_EQ(c.steps, 20);
  EXPECT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_EQ(c.model.width, 64);  // model: created
  // "precision: mxfp4" then precision.bump_exponent: the preset stays.
  PrecisionScheme mxfp4;
  ASSERT_TRUE(SchemeFromPreset("mxfp4", &mxfp4).ok());
  EXPECT_EQ(RoleOf(c.precision, Role::kFwdX).format, RoleOf(mxfp4, Role::kFwdX).format);
  EXPECT_TRUE(RoleOf(c.precision, Role::kFwdX).bump_exponent);
  EXPECT_EQ(c.policy.rules.size(), 1u);
  // On an empty file, and later assignments win.
  EXPECT_EQ(Parsed("", {"batch=8", "batch=16"}).batch, 16);
  EXPECT_EQ(Parsed("", {"precision=bf16"}).precision.name, "bf16");
}

TEST(RunConfigOverrideTest, RefusalsNameTheAssignment) {
  ExpectErrors({{"steps: 10\n", "--set: 'steps' is not of the form key.path=value"}}, {"steps"});
  ExpectErrors({{"steps: 10\n", "--set: '=5' is not of the form key.path=value"}}, {"=5"});
  ExpectErrors({{"model: {width: 64}\n", "--set model.width.x: 'width' is not a mapping"}}, {"model.width.x=3"});
  ExpectErrors({{"policy: {ladder: [bf16]}\n", "--set policy.ladder.x: 'ladder' is not a mapping"}},
               {"policy.ladder.x=1"});
  // The value goes through the strict loader, named after the assignment.
  ExpectErrors({{"steps: 10\n", "--set optimizer:1:12: lr: duplicate key (first at line 1)"}},
               {"optimizer={lr: 1e-3, lr: 2e-3}"});
  ExpectErrors({{"steps: 10\n", "--set optimizer.lr:1:1: invalid YAML: end of sequence flow not found"}},
               {"optimizer.lr=[1, 2"});
  // A value the parser refuses names the field; its node has no place in the file.
  ExpectErrors({{"steps: 10\n", "r.yaml:1:1: steps: 0 is out of range (allowed: 1 .. 1099511627776)"}},
               {"steps=0"});
  ExpectErrors({{"", "r.yaml:1:1: model.typo: unknown key (allowed: bias, context, heads, layers, ln_eps, mlp, "
                     "mlp_hidden, padded_vocab, qk_layernorm, type, vocab, width)"}},
               {"model.typo=1"});
}

// ---- Files ---------------------------------------------------------------------

std::string TempPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

TEST(RunConfigFileTest, LoadRunConfigNamesTheFlagOrTheFile) {
  RunConfig config;
  Status s = LoadRunConfig(TempPath("no-such.yaml"), {}, &config);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message().rfind("--config: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("no-such.yaml"), std::string::npos) << s.message();
  const std::string path = TempPath("bad.yaml");
  std::ofstream(path) << "steps: 10\nbatch: 0\n";
  s = LoadRunConfig(path, {}, &config);
  EXPECT_EQ(s.message(), path + ":2:8: batch: 0 is out of range (allowed: 1 .. 16777216)");
  std::ofstream(path) << std::string(5u << 20, ' ');
  s = LoadRunConfig(path, {}, &config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind(path + ":1:1: size: ", 0), 0u) << s.message();
}

// ---- The strict loader, names and model sizes --------------------------------------

TEST(RunConfigStatusTest, EveryRefusalIsAnInvalidArgument) {
  // keeld maps the code to gRPC's INVALID_ARGUMENT; no caller reads the text.
  for (const char* bad : {"model: {type: proxy, width: 0}\n", "precision: mxfp9\n", "a: 1\na: 2\n", "steps: [\n",
                          "batch: 256\n---\nbatch: 1\n", "name: ../x\n"}) {
    Status s = Parse(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad << " -> " << s.message();
  }
  Status s = Parse("batch: 8\n", {"optimizer.lr=[1, 2"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
}

TEST(RunConfigStrictTest, DuplicateKeysAreRefusedAtTheSecond) {
  EXPECT_EQ(Parse("steps: 10\nbatch: 8\nsteps: 20\n").message(), "r.yaml:3:1: steps: duplicate key (first at line 1)");
  EXPECT_EQ(Parse("model:\n  width: 64\n  width: 128\n").message(),
            "r.yaml:3:3: model.width: duplicate key (first at line 2)");
  EXPECT_EQ(Parse("policy:\n  rules:\n    - {name: a, when: nonfinite, when: loss_ratio, do: [stop]}\n").message(),
            "r.yaml:3:34: policy.rules[0].when: duplicate key (first at line 3)");
}

TEST(RunConfigStrictTest, SecondDocumentIsRefused) {
  EXPECT_NE(Parse("steps: 10\n---\nsteps: 20\n").message().find("r.yaml:2:1: document: a second YAML document"),
            std::string::npos);
}

TEST(RunConfigStrictTest, SetValuesGoThroughTheStrictLoader) {
  Status s = Parse("steps: 10\n", {"optimizer={lr: 1e-3, lr: 2e-3}"});
  EXPECT_EQ(s.message(), "--set optimizer:1:12: lr: duplicate key (first at line 1)");
  s = Parse("steps: 10\n", {"model=" + std::string(100000, '[')});
  EXPECT_NE(s.message().find("nesting: more than 64 levels"), std::string::npos) << s.message();
}

TEST(RunConfigStrictTest, BinaryGarbageAndHugeTextHaveAReasonAndAPosition) {
  std::string garbage = "steps: 1\n";
  for (int i = 0; i < 256; ++i) garbage += static_cast<char>(255 - i);
  EXPECT_EQ(Parse(garbage).message(), "r.yaml:2:1: not a text file: byte 0xFF at line 2 col 1 (allowed: UTF-8 text "
                                      "without control characters other than tab, CR, LF)");
  EXPECT_EQ(Parse(std::string(5u << 20, ' ')).message(),
            "r.yaml:1:1: size: 5242880 bytes is more than the limit of 4194304 bytes (allowed: at most 4 MiB)");
}

// The default run directory is runs/<name>: a name with ".." or "/" would put
// keel-train's output elsewhere.
TEST(RunConfigNameTest, NamesThatLeaveRunsDirAreRefused) {
  const std::string allowed = " (allowed: [A-Za-z0-9_.-]+, at most 128 characters, not starting with '.')";
  EXPECT_EQ(Parse("name: ../../etc\n").message(), "r.yaml:1:7: name: '../../etc' is not allowed: it starts with '.'" + allowed);
  EXPECT_EQ(Parse("name: '..'\n").message(), "r.yaml:1:7: name: '..' is not allowed: it starts with '.'" + allowed);
  EXPECT_EQ(Parse("name: a/b\n").message(), "r.yaml:1:7: name: 'a/b' is not allowed: '/' at offset 1" + allowed);
  EXPECT_EQ(Parse("name: \"a\\nb\"\n").message(), "r.yaml:1:7: name: 'a\\nb' is not allowed: byte 0x0A at offset 1" + allowed);
  EXPECT_EQ(Parse("name: ''\n").message(), "r.yaml:1:7: name: an empty name is not allowed" + allowed);
  EXPECT_EQ(Parse("name: " + std::string(129, 'n') + "\n").message(),
            "r.yaml:1:7: name: a name of 129 characters is not allowed: too long" + allowed);
  EXPECT_NE(Parse("steps: 1\n", {"name=../x"}).message().find("name: '../x' is not allowed"), std::string::npos);
  RunConfig config;
  ASSERT_TRUE(ParseRunConfig("name: run-1.a_B\n", "r.yaml", {}, &config).ok());
  EXPECT_EQ(config.run_dir, "runs/run-1.a_B");
  ASSERT_TRUE(ParseRunConfig("name: " + std::string(128, 'n') + "\n", "r.yaml", {}, &config).ok());
}

TEST(RunConfigModelSizeTest, ParameterCountsMatchTheModels) {
  RunConfig config;
  ASSERT_TRUE(ParseRunConfig("model: {type: proxy, layers: 2, width: 64}\n", "r.yaml", {}, &config).ok());
  EXPECT_EQ(ModelParameterCount(config.model), 2 * (8 * 64 * 64 + 3 * 64));
  // GPT-2 124M with the vocabulary padded to 50304: llm.c's 124,475,904.
  std::ifstream in("examples/gpt2_124m.yaml");
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_FALSE(text.str().empty()) << "examples/gpt2_124m.yaml not found";
  Status s = ParseRunConfig(text.str(), "examples/gpt2_124m.yaml", {"data.train=x.bin"}, &config);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ModelParameterCount(config.model), 124475904);
  // examples/llama_124m.yaml: V d + L (2d + 4d^2 + 3 h d) + d with V 50304, d 768,
  // h 2048 (8/3 x 768), L 12, the head tied: 123,587,328.
  std::ifstream llama_in("examples/llama_124m.yaml");
  std::stringstream llama_text;
  llama_text << llama_in.rdbuf();
  ASSERT_FALSE(llama_text.str().empty()) << "examples/llama_124m.yaml not found";
  s = ParseRunConfig(llama_text.str(), "examples/llama_124m.yaml", {"data.train=x.bin"}, &config);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(config.model.mlp_hidden, 2048);
  const int64_t d = 768, h = 2048;
  EXPECT_EQ(ModelParameterCount(config.model), 50304 * d + 12 * (2 * d + 4 * d * d + 3 * h * d) + d);
  EXPECT_EQ(ModelParameterCount(config.model), 123587328);
  // examples/gla_124m.yaml: V d + L (2d + 4d^2 + 16 d + 17 d/2 + d/H + 3 h d) + d with
  // H 4 (the output norm's gain d/H = 192), the rest as llama's: 123,815,424.
  std::ifstream gla_in("examples/gla_124m.yaml");
  std::stringstream gla_text;
  gla_text << gla_in.rdbuf();
  ASSERT_FALSE(gla_text.str().empty()) << "examples/gla_124m.yaml not found";
  s = ParseRunConfig(gla_text.str(), "examples/gla_124m.yaml", {"data.train=x.bin"}, &config);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(config.model.type, "gla");
  EXPECT_EQ(config.model.mlp_hidden, 2048);
  EXPECT_EQ(ModelParameterCount(config.model),
            50304 * d + 12 * (2 * d + 4 * d * d + 16 * d + 17 * d / 2 + d / 4 + 3 * h * d) + d);
  EXPECT_EQ(ModelParameterCount(config.model), 123815424);
}

TEST(RunConfigModelSizeTest, ModelsBeyondTheStateLimitAreRefusedWithTheEstimate) {
  Status s = Parse("model: {type: gpt, width: 65536, layers: 1024, heads: 16}\ndata: {train: x.bin}\n");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().substr(0, 21), "r.yaml:1:27: model.wi") << s.message();
  EXPECT_NE(s.message().find("model.width: 65536 with model.layers 1024 (gpt) gives "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("more than the limit of 256 GiB (allowed: at most 17179869184 parameters)"),
            std::string::npos)
      << s.message();
  s = Parse("model: {type: proxy, width: 65536, layers: 1024}\n");
  EXPECT_NE(s.message().find("(proxy) gives 35184573415424 parameters, a training state of 524291.0 GiB"),
            std::string::npos)
      << s.message();
  // The largest inputs every field allows still count without overflow.
  ModelConfig m;
  m.type = "gpt";
  m.width = 1 << 16;
  m.layers = 1024;
  m.heads = 1;
  m.context = 1 << 20;
  m.padded_vocab = 1 << 20;
  m.mlp = "swiglu";
  m.mlp_hidden = 1 << 20;
  m.qk_layernorm = true;
  EXPECT_GT(ModelParameterCount(m), int64_t{1} << 40);
  // GPT-2 350M (24 x 1024) fits.
  EXPECT_TRUE(Parse("model: {type: gpt, width: 1024, layers: 24, heads: 16}\ndata: {train: x.bin}\n").ok());
}

TEST(RunConfigModelSizeTest, EveryExampleRunConfigStillParses) {
  for (const char* name : {"gla_124m", "gla_fortunes_cpu", "gpt2_124m", "gpt_fortunes_cpu", "llama_124m",
                           "llama_fortunes_cpu", "proxy_cpu",
                           "proxy_mxfp8_e4m3",
                           "proxy_mxfp8_e4m3_policy", "proxy_mxfp8_e4m3_policy_tuned",
                           "proxy_mxfp8_e4m3_policy_default"}) {
    const std::string path = std::string("examples/") + name + ".yaml";
    RunConfig config;
    Status s = LoadRunConfig(path, {"data.train=x.bin"}, &config);
    EXPECT_TRUE(s.ok()) << path << ": " << s.message();
  }
}

}  // namespace
}  // namespace keel
