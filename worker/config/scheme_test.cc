// Precision schemes: presets mean what their names say, configs parse and
// validate with errors that name the field, schemes survive a YAML round trip.
#include "worker/config/scheme.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "worker/config/run_config.h"
#include "worker/config/scheme_proto.h"
#include "worker/config/scheme_testing.h"

namespace keel {
namespace {

PrecisionScheme Preset(const std::string& name) {
  PrecisionScheme s;
  Status st = SchemeFromPreset(name, &s);
  EXPECT_TRUE(st.ok()) << st.message();
  return s;
}

TEST(SchemeTest, EveryIssuePresetExistsAndValidates) {
  for (const char* name : {"fp32", "bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp8_e4m3_bwd_e5m2",
                           "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "nvfp4", "nvfp4_recipe", "nvfp4_hcp", "chon",
                           "mx_w_e4m3_a_bf16", "mxfp8_e4m3_fwd_only"}) {
    PrecisionScheme s;
    ASSERT_TRUE(SchemeFromPreset(name, &s).ok()) << name;
    EXPECT_EQ(s.name, name);
    EXPECT_TRUE(ValidateScheme(s).ok()) << name;
  }
}

// The quantizers take MX blocks of 1 .. kMaxMxBlock elements; a scheme from any
// source (a config, a stored proto, an intervention) is held to that.
TEST(SchemeTest, MxBlockOutsideWhatTheQuantizersTakeIsRefused) {
  PrecisionScheme s = Preset("mxfp8_e4m3");
  for (int block : {1, 32, kMaxMxBlock}) {
    s.roles[0].mx_block = block;
    EXPECT_TRUE(ValidateScheme(s).ok()) << block;
  }
  for (int block : {0, -1, kMaxMxBlock + 1}) {
    s.roles[0].mx_block = block;
    Status st = ValidateScheme(s);
    EXPECT_FALSE(st.ok()) << block;
    EXPECT_EQ(st.field(), "precision.fwd_x");
    EXPECT_EQ(st.message(), "precision.fwd_x: mx_block " + std::to_string(block) +
                                " is not allowed (a block size 1 .. 4096)");
  }
}

TEST(SchemeTest, SingleFormatPresetsUseTheFormatInEveryRole) {
  const std::pair<const char*, QuantFormat> cases[] = {
      {"mxfp8_e4m3", QuantFormat::kMxfp8E4M3}, {"mxfp8_e5m2", QuantFormat::kMxfp8E5M2},
      {"mxfp6_e2m3", QuantFormat::kMxfp6E2M3}, {"mxfp6_e3m2", QuantFormat::kMxfp6E3M2},
      {"mxfp4", QuantFormat::kMxfp4},          {"nvfp4", QuantFormat::kNvfp4},
      {"bf16", QuantFormat::kBf16}};
  for (const auto& c : cases) {
    PrecisionScheme s = Preset(c.first);
    for (int r = 0; r < kRoleCount; ++r) {
      EXPECT_TRUE(s.roles[r].quantized()) << c.first << " " << r;
      EXPECT_EQ(s.roles[r].format, c.second) << c.first << " " << r;
    }
  }
  PrecisionScheme fp32 = Preset("fp32");
  for (const OperandFormat& f : fp32.roles) EXPECT_FALSE(f.quantized());
  EXPECT_FALSE(fp32.attention_bf16);
  EXPECT_FALSE(fp32.AnyQuantized());
}

TEST(SchemeTest, HybridPresets) {
  PrecisionScheme s = Preset("mxfp8_e4m3_bwd_e5m2");
  EXPECT_EQ(RoleOf(s, Role::kFwdX).format, QuantFormat::kMxfp8E4M3);
  EXPECT_EQ(RoleOf(s, Role::kFwdW).format, QuantFormat::kMxfp8E4M3);
  for (Role r : {Role::kDgradDy, Role::kDgradW, Role::kWgradDy, Role::kWgradX}) {
    EXPECT_EQ(RoleOf(s, r).format, QuantFormat::kMxfp8E5M2);
  }
  s = Preset("mx_w_e4m3_a_bf16");
  EXPECT_EQ(RoleOf(s, Role::kFwdW).format, QuantFormat::kMxfp8E4M3);
  EXPECT_EQ(RoleOf(s, Role::kDgradW).format, QuantFormat::kMxfp8E4M3);
  for (Role r : {Role::kFwdX, Role::kDgradDy, Role::kWgradDy, Role::kWgradX}) {
    EXPECT_EQ(RoleOf(s, r).format, QuantFormat::kBf16);
  }
  s = Preset("mxfp8_e4m3_fwd_only");
  LinearQuant q = s.LinearFor(0, 4);
  EXPECT_EQ(q.role[static_cast<int>(Role::kFwdX)].format, QuantFormat::kMxfp8E4M3);
  for (Role r : {Role::kDgradDy, Role::kDgradW, Role::kWgradDy, Role::kWgradX}) {
    EXPECT_FALSE(q.role[static_cast<int>(r)].quantized());
  }
}

TEST(SchemeTest, Nvfp4RecipeOptions) {
  PrecisionScheme s = Preset("nvfp4_recipe");
  ExpectNvfp4RecipeOptions(s);
  // First and last blocks and the head stay BF16.
  for (int block : {0, 11, -1}) {
    LinearQuant q = s.LinearFor(block, 12);
    for (const OperandFormat& f : q.role) EXPECT_EQ(f.format, QuantFormat::kBf16) << block;
  }
  LinearQuant middle = s.LinearFor(5, 12);
  EXPECT_EQ(middle.role[0].format, QuantFormat::kNvfp4);
}

RunConfig Parse(const std::string& yaml, Status* status) {
  RunConfig c;
  *status = ParseRunConfig(yaml, "test.yaml", {}, &c);
  return c;
}

TEST(RunConfigTest, PresetByNameAndMappingOverrides) {
  Status st;
  RunConfig c = Parse("precision: mxfp4\n", &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(c.precision.name, "mxfp4");
  c = Parse("precision:\n  preset: fp32\n  fwd_x: mxfp8_e4m3\n  fwd_w: mxfp6_e2m3\n", &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(c.precision.name, "custom");
  // The defaults of docs/numerics.md, "Operand roles and axes": backward
  // activations/gradients follow fwd_x, dgrad_w follows fwd_w.
  EXPECT_EQ(RoleOf(c.precision, Role::kWgradX).format, QuantFormat::kMxfp8E4M3);
  EXPECT_EQ(RoleOf(c.precision, Role::kDgradDy).format, QuantFormat::kMxfp8E4M3);
  EXPECT_EQ(RoleOf(c.precision, Role::kDgradW).format, QuantFormat::kMxfp6E2M3);
  c = Parse("precision:\n  preset: mxfp8_e4m3\n  bump_exponent: true\n  layernorm: fp32\n", &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(RoleOf(c.precision, Role::kFwdX).bump_exponent);
  EXPECT_FALSE(c.precision.layernorm.quantized());
}

TEST(RunConfigTest, ErrorsNameFieldValueAndAllowed) {
  // Each refused config, and what its message must mention.
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"precision: mxfp9\n", {"mxfp9", "mxfp8_e4m3_bwd_e5m2"}},
      {"model:\n  type: proxy\n  widht: 64\n", {"test.yaml:3:3: model.widht: unknown key"}},
      {"optimizer:\n  lr: -1\n", {"optimizer.lr"}},
      {"precision:\n  preset: nvfp4\n  rounding: nearest_away\n", {"nearest_away"}},
      {"model:\n  type: gpt\n", {"data.train"}},
      {"precision: nvfp4_recipe\nbatch: 100\n", {"batch: 100"}},
      {"optimizer:\n  weight_decay: 0.1\n", {"adamw"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.first);
    Status st;
    Parse(c.first, &st);
    ASSERT_FALSE(st.ok());
    for (const std::string& mention : c.second) {
      EXPECT_NE(st.message().find(mention), std::string::npos) << st.message();
    }
  }
}

TEST(RunConfigTest, OverridesApplyBeforeValidation) {
  RunConfig c;
  Status st = ParseRunConfig("precision: mxfp4\nsteps: 5\n", "t", {"steps=7", "precision.bump_exponent=true",
                                                                 "optimizer.lr=0.01"}, &c);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(c.steps, 7);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 0.01f);
  EXPECT_TRUE(RoleOf(c.precision, Role::kFwdX).bump_exponent);
  EXPECT_EQ(RoleOf(c.precision, Role::kFwdX).format, QuantFormat::kMxfp4);
  st = ParseRunConfig("steps: 5\n", "t", {"steps"}, &c);
  EXPECT_FALSE(st.ok());
}

TEST(RunConfigTest, SchemeYamlRoundTripsEveryPreset) {
  for (const PresetInfo& p : Presets()) {
    PrecisionScheme s = Preset(p.name), back;
    ASSERT_TRUE(ParseSchemeYaml(SchemeToYaml(s), &back).ok()) << p.name;
    EXPECT_EQ(SchemeToYaml(back), SchemeToYaml(s)) << p.name;
    EXPECT_EQ(DescribeScheme(back), DescribeScheme(s)) << p.name;
  }
}

// policy: default's ladders (docs/train.md has the same table): each starts at
// the run's scheme, climbs through presets of more precision and ends at fp32.
TEST(RescueLadderTest, EveryPresetsLadderClimbsToFp32) {
  using Ladder = std::vector<std::string>;
  const Ladder mx_tail = {"mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"};
  auto with = [](Ladder head, const Ladder& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  const std::map<std::string, Ladder> want = {
      {"fp32", {"fp32"}},
      {"bf16", {"bf16", "fp32"}},
      {"mxfp8_e4m3", {"mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"}},
      {"mxfp8_e5m2", {"mxfp8_e5m2", "mx_w_e4m3_a_bf16", "bf16", "fp32"}},
      {"mxfp8_e4m3_bwd_e5m2", {"mxfp8_e4m3_bwd_e5m2", "mx_w_e4m3_a_bf16", "bf16", "fp32"}},
      {"mxfp6_e2m3", with({"mxfp6_e2m3"}, mx_tail)},
      {"mxfp6_e3m2", with({"mxfp6_e3m2"}, mx_tail)},
      {"mxfp4", with({"mxfp4", "mxfp6_e2m3"}, mx_tail)},
      {"nvfp4", with({"nvfp4", "nvfp4_recipe", "chon"}, mx_tail)},
      {"nvfp4_recipe", with({"nvfp4_recipe", "chon"}, mx_tail)},
      {"nvfp4_hcp", with({"nvfp4_hcp", "chon"}, mx_tail)},
      {"chon", with({"chon"}, mx_tail)},
      {"mx_w_e4m3_a_bf16", {"mx_w_e4m3_a_bf16", "bf16", "fp32"}},
      {"mxfp8_e4m3_fwd_only", {"mxfp8_e4m3_fwd_only", "mx_w_e4m3_a_bf16", "bf16", "fp32"}},
  };
  ASSERT_EQ(want.size(), Presets().size()) << "a new preset needs its ladder here and in docs/train.md";
  for (const PresetInfo& p : Presets()) {
    ASSERT_TRUE(want.count(p.name)) << p.name;
    const Ladder ladder = RescueLadder(Preset(p.name));
    EXPECT_EQ(ladder, want.at(p.name)) << p.name;
    EXPECT_EQ(ladder.back(), "fp32") << p.name;
    for (size_t i = 1; i < ladder.size(); ++i) {
      PrecisionScheme rung;
      EXPECT_TRUE(SchemeFromPreset(ladder[i], &rung).ok()) << p.name << ": " << ladder[i];
    }
  }
}

TEST(RescueLadderTest, ACustomSchemeClimbsFromItsNarrowestFormat) {
  // Named "custom": the ladder starts at the run's own scheme, whatever its name.
  PrecisionScheme s = Preset("bf16");
  s.name = "custom";
  s.roles[static_cast<int>(Role::kFwdW)] = Preset("mxfp6_e3m2").roles[0];
  EXPECT_EQ(RescueLadder(s), (std::vector<std::string>{"custom", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"}));
  // 8-bit weights only, the rest bf16: the mixed rung already, so bf16 next.
  s.roles[static_cast<int>(Role::kFwdW)] = Preset("mxfp8_e5m2").roles[0];
  EXPECT_EQ(RescueLadder(s), (std::vector<std::string>{"custom", "bf16", "fp32"}));
  // An 8-bit activation: below the mixed rung.
  s.roles[static_cast<int>(Role::kFwdX)] = Preset("mxfp8_e5m2").roles[0];
  EXPECT_EQ(RescueLadder(s), (std::vector<std::string>{"custom", "mx_w_e4m3_a_bf16", "bf16", "fp32"}));
  // NVFP4 with rotated wgrad operands skips the recipe rung; CHON comes next.
  PrecisionScheme n = Preset("nvfp4_recipe");
  n.name = "custom";
  EXPECT_EQ(RescueLadder(n)[1], "chon");
  EXPECT_EQ(RescueLadder(n)[2], "mxfp8_e4m3");
}

// A language model's ladder: the start with its head in BF16 first, where the
// start rounds the head to 8 bits or fewer, and no rung above the start rounds
// the head again. Session 32's GPT runs: the MX head alone stalled the loss.
TEST(RescueLadderTest, ALanguageModelKeepsItsHeadInBf16AboveTheStart) {
  using Ladder = std::vector<std::string>;
  EXPECT_EQ(RescueLadder(Preset("mxfp8_e4m3"), false, true),
            (Ladder{"mxfp8_e4m3", "mxfp8_e4m3+bf16_head", "mx_w_e4m3_a_bf16+bf16_head", "bf16", "fp32"}));
  EXPECT_EQ(RescueLadder(Preset("mxfp4"), false, true),
            (Ladder{"mxfp4", "mxfp4+bf16_head", "mxfp6_e2m3+bf16_head", "mxfp8_e4m3+bf16_head",
                    "mx_w_e4m3_a_bf16+bf16_head", "bf16", "fp32"}));
  // nvfp4_recipe and chon keep the head in BF16 already: no suffix, no extra rung.
  EXPECT_EQ(RescueLadder(Preset("nvfp4"), true, true),
            (Ladder{"nvfp4", "nvfp4+bf16_head", "nvfp4_recipe", "chon", "mxfp8_e4m3+bf16_head",
                    "mx_w_e4m3_a_bf16+bf16_head", "bf16", "fp32"}));
  EXPECT_EQ(RescueLadder(Preset("nvfp4_recipe"), true, true),
            (Ladder{"nvfp4_recipe", "chon", "mxfp8_e4m3+bf16_head", "mx_w_e4m3_a_bf16+bf16_head", "bf16", "fp32"}));
  EXPECT_EQ(RescueLadder(Preset("bf16"), false, true), (Ladder{"bf16", "fp32"}));
  EXPECT_EQ(RescueLadder(Preset("fp32"), false, true), (Ladder{"fp32"}));
  // A start whose head is BF16 already climbs as before, the head kept.
  PrecisionScheme head = Preset("mxfp8_e4m3");
  head.name = "custom";
  head.bf16_head = true;
  EXPECT_EQ(RescueLadder(head, false, true),
            (Ladder{"custom", "mx_w_e4m3_a_bf16+bf16_head", "bf16", "fp32"}));
  // Every rung is a scheme, its head BF16 where the name says so.
  for (const PresetInfo& p : Presets()) {
    const PrecisionScheme start = Preset(p.name);
    for (const std::string& rung : RescueLadder(start, true, true)) {
      PrecisionScheme s;
      ASSERT_TRUE(SchemeForRung(rung, start, &s).ok()) << p.name << ": " << rung;
      EXPECT_EQ(s.name, rung);
      if (rung.find("+bf16_head") != std::string::npos) EXPECT_TRUE(s.bf16_head) << rung;
    }
  }
}

// The test both the ladder's head rung and the bias rule use.
TEST(SchemeTest, RoundsHeadBelowBf16) {
  for (const char* p : {"mxfp4", "mxfp8_e4m3", "nvfp4", "mx_w_e4m3_a_bf16", "mxfp8_e4m3_fwd_only"}) {
    EXPECT_TRUE(RoundsHeadBelowBf16(Preset(p))) << p;
  }
  for (const char* p : {"fp32", "bf16", "nvfp4_recipe", "nvfp4_hcp", "chon"}) EXPECT_FALSE(RoundsHeadBelowBf16(Preset(p))) << p;
  PrecisionScheme s;
  ASSERT_TRUE(SchemeFromName("mxfp4+bf16_head", &s).ok());
  EXPECT_FALSE(RoundsHeadBelowBf16(s));
  // forward_only: an 8-bit backward role alone does not count (it is not quantized).
  s = Preset("bf16");
  s.forward_only = true;
  s.roles[static_cast<int>(Role::kWgradDy)] = Preset("mxfp8_e4m3").roles[0];
  EXPECT_FALSE(RoundsHeadBelowBf16(s));
  s.forward_only = false;
  EXPECT_TRUE(RoundsHeadBelowBf16(s));
}

TEST(SchemeForRungTest, APresetTheRunsOwnSchemeOrEitherWithABf16Head) {
  PrecisionScheme own = Preset("mxfp4");
  own.name = "custom";
  own.bf16_first_blocks = 2;
  PrecisionScheme s;
  ASSERT_TRUE(SchemeForRung("custom", own, &s).ok());
  EXPECT_EQ(s.bf16_first_blocks, 2);
  EXPECT_FALSE(s.bf16_head);
  ASSERT_TRUE(SchemeForRung("custom+bf16_head", own, &s).ok());
  EXPECT_EQ(s.name, "custom+bf16_head");
  EXPECT_EQ(s.bf16_first_blocks, 2);  // the run's own scheme, its head now BF16
  EXPECT_TRUE(s.bf16_head);
  ASSERT_TRUE(SchemeForRung("mxfp8_e4m3+bf16_head", own, &s).ok());
  PrecisionScheme want = Preset("mxfp8_e4m3");
  want.bf16_head = true;
  want.name = "mxfp8_e4m3+bf16_head";
  EXPECT_EQ(DescribeScheme(s), DescribeScheme(want));
  EXPECT_TRUE(ValidateScheme(s).ok());
  ASSERT_TRUE(SchemeForRung("bf16", own, &s).ok());
  EXPECT_EQ(DescribeScheme(s), DescribeScheme(Preset("bf16")));
  for (const char* bad : {"fp8", "", "+bf16_head", "mxfp4+bf16", "mxfp4+bf16_head+bf16_head"}) {
    const Status st = SchemeForRung(bad, own, &s, "policy.ladder");
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.field(), "policy.ladder") << bad;
    EXPECT_NE(st.message().find(std::string("unknown scheme '") + bad + "'"), std::string::npos) << st.message();
  }
}

// A model without post-QK protection (gpt, proxy) climbs through nvfp4_hcp
// instead of chon; a start that patches already skips the rung.
TEST(RescueLadderTest, TheChonRungFollowsTheModel) {
  using Ladder = std::vector<std::string>;
  EXPECT_EQ(RescueLadder(Preset("nvfp4"), false),
            (Ladder{"nvfp4", "nvfp4_recipe", "nvfp4_hcp", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"}));
  EXPECT_EQ(RescueLadder(Preset("nvfp4_hcp"), false),
            (Ladder{"nvfp4_hcp", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"}));
  PrecisionScheme patched = Preset("nvfp4");
  patched.name = "custom";
  patched.hcp_channels = 16;
  EXPECT_EQ(RescueLadder(patched, true)[2], "chon");  // patches, but has no post-QK protection
  patched.post_qk_bf16 = true;
  EXPECT_EQ(RescueLadder(patched, true)[2], "mxfp8_e4m3");
}

TEST(SchemeTest, HcpPresetsAndTheirChecks) {
  const PrecisionScheme hcp = Preset("nvfp4_hcp"), chon = Preset("chon"), recipe = Preset("nvfp4_recipe");
  EXPECT_EQ(hcp.hcp_channels, 32);
  EXPECT_EQ(hcp.hcp_every, 100);
  EXPECT_TRUE(hcp.hcp_dgrad);
  EXPECT_EQ(hcp.hcp_wgrad_rows, 0);
  EXPECT_FALSE(hcp.post_qk_bf16);
  EXPECT_TRUE(chon.post_qk_bf16);
  EXPECT_EQ(chon.hcp_channels, 32);
  // The recipe underneath, role for role.
  for (int r = 0; r < kRoleCount; ++r) {
    EXPECT_EQ(OperandFormatName(hcp.roles[r]), OperandFormatName(recipe.roles[r]));
    EXPECT_EQ(hcp.roles[r].rht, recipe.roles[r].rht);
    EXPECT_EQ(hcp.roles[r].rounding, recipe.roles[r].rounding);
  }
  EXPECT_NE(DescribeScheme(hcp).find("hcp=32/fwd+dgrad/every100"), std::string::npos) << DescribeScheme(hcp);
  struct Bad {
    void (*mutate)(PrecisionScheme*);
    std::string message;
  };
  const std::vector<Bad> bad = {
      {[](PrecisionScheme* s) { s->hcp_channels = -1; },
       "precision.hcp.channels: -1 is not allowed (0 .. 4096; 0: no patch)"},
      {[](PrecisionScheme* s) { s->hcp_every = 0; }, "precision.hcp.every: 0 is not allowed (>= 1 steps between choices)"},
      {[](PrecisionScheme* s) { s->hcp_wgrad_rows = 5000; }, "precision.hcp.wgrad_rows: 5000 is not allowed (0 .. 4096)"},
      {[](PrecisionScheme* s) {
         s->hcp_channels = 0;
         s->hcp_dgrad = true;
       },
       "precision.hcp.dgrad: true is not allowed with channels 0 (nothing to patch)"},
  };
  for (const Bad& b : bad) {
    PrecisionScheme s = hcp;
    b.mutate(&s);
    const Status st = ValidateScheme(s);
    EXPECT_EQ(st.message(), b.message);
  }
}

TEST(SchemeProtoTest, EveryPresetRoundTripsThroughTheWireForm) {
  for (const PresetInfo& p : Presets()) {
    PrecisionScheme s = Preset(p.name), back;
    v1::PrecisionScheme wire;
    SchemeToProto(s, &wire);
    EXPECT_EQ(wire.fwd_x().format(), OperandFormatName(s.roles[0])) << p.name;
    ASSERT_TRUE(SchemeFromProto(wire, &back).ok()) << p.name;
    EXPECT_EQ(SchemeToYaml(back), SchemeToYaml(s)) << p.name;
  }
  // post_qk_bf16 travels too.
  PrecisionScheme chon = Preset("nvfp4_recipe"), chon_back;
  chon.post_qk_bf16 = true;
  v1::PrecisionScheme chon_wire;
  SchemeToProto(chon, &chon_wire);
  EXPECT_TRUE(chon_wire.post_qk_bf16());
  ASSERT_TRUE(SchemeFromProto(chon_wire, &chon_back).ok());
  EXPECT_TRUE(chon_back.post_qk_bf16);
  EXPECT_NE(DescribeScheme(chon_back).find("post_qk_bf16"), std::string::npos) << DescribeScheme(chon_back);
  // And the Hot-Channel Patch, every field.
  PrecisionScheme hcp = Preset("chon"), hcp_back;
  hcp.hcp_channels = 7;
  hcp.hcp_every = 9;
  hcp.hcp_dgrad = false;
  hcp.hcp_wgrad_rows = 48;
  v1::PrecisionScheme hcp_wire;
  SchemeToProto(hcp, &hcp_wire);
  ASSERT_TRUE(SchemeFromProto(hcp_wire, &hcp_back).ok());
  EXPECT_EQ(hcp_back.hcp_channels, 7);
  EXPECT_EQ(hcp_back.hcp_every, 9);
  EXPECT_FALSE(hcp_back.hcp_dgrad);
  EXPECT_EQ(hcp_back.hcp_wgrad_rows, 48);
  EXPECT_EQ(SchemeToYaml(hcp_back), SchemeToYaml(hcp));
  PrecisionScheme from_yaml;
  ASSERT_TRUE(ParseSchemeYaml(SchemeToYaml(hcp), &from_yaml).ok());
  EXPECT_EQ(DescribeScheme(from_yaml), DescribeScheme(hcp));
  v1::PrecisionScheme bad;
  SchemeToProto(Preset("mxfp4"), &bad);
  bad.mutable_dgrad_w()->set_format("mxfp9");
  PrecisionScheme out;
  Status st = SchemeFromProto(bad, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("precision.dgrad_w.format"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel
