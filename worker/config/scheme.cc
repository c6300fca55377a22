// Precision schemes and presets (see scheme.h).
#include "worker/config/scheme.h"

#include <algorithm>
#include <sstream>

namespace keel {
namespace {

OperandFormat Fp32() { return OperandFormat(); }

OperandFormat Quant(QuantFormat format, Rounding rounding) {
  OperandFormat f;
  f.kind = OperandFormat::Kind::kQuant;
  f.format = format;
  f.rounding = rounding;
  return f;
}

OperandFormat Bf16() { return Quant(QuantFormat::kBf16, Rounding::kNearestEven); }

// MX presets round to nearest with ties away from zero: microxcaling's default,
// what the MX-instability paper trained with (docs/numerics.md, "Rounding").
OperandFormat Mx(QuantFormat format) { return Quant(format, Rounding::kNearestAway); }

void SetAll(PrecisionScheme* s, const OperandFormat& f) {
  for (int r = 0; r < kRoleCount; ++r) s->roles[r] = f;
}

void SetForward(PrecisionScheme* s, const OperandFormat& x, const OperandFormat& w) {
  s->roles[static_cast<int>(Role::kFwdX)] = x;
  s->roles[static_cast<int>(Role::kFwdW)] = w;
}

void SetBackward(PrecisionScheme* s, const OperandFormat& grads_and_acts, const OperandFormat& w) {
  s->roles[static_cast<int>(Role::kDgradDy)] = grads_and_acts;
  s->roles[static_cast<int>(Role::kDgradW)] = w;
  s->roles[static_cast<int>(Role::kWgradDy)] = grads_and_acts;
  s->roles[static_cast<int>(Role::kWgradX)] = grads_and_acts;
}

// The NVFP4 training recipe: 16x16 weight tiles, the RHT on the wgrad operands,
// stochastic rounding of the gradients, the first and last block and the head
// in BF16, layernorm affine BF16.
void Nvfp4Recipe(PrecisionScheme* s) {
  OperandFormat act = Quant(QuantFormat::kNvfp4, Rounding::kNearestEven);
  OperandFormat weight = act;
  weight.tile_16x16 = true;
  OperandFormat grad = Quant(QuantFormat::kNvfp4, Rounding::kStochastic);
  SetForward(s, act, weight);
  s->roles[static_cast<int>(Role::kDgradDy)] = grad;
  s->roles[static_cast<int>(Role::kDgradW)] = weight;
  OperandFormat wgrad_dy = grad, wgrad_x = act;
  wgrad_dy.rht = true;
  wgrad_x.rht = true;
  s->roles[static_cast<int>(Role::kWgradDy)] = wgrad_dy;
  s->roles[static_cast<int>(Role::kWgradX)] = wgrad_x;
  s->layernorm = Bf16();
  s->bf16_first_blocks = 1;
  s->bf16_last_blocks = 1;
  s->bf16_head = true;
}

// The recipe with the Hot-Channel Patch of the forward and dgrad GEMMs.
void Nvfp4Hcp(PrecisionScheme* s) {
  Nvfp4Recipe(s);
  s->hcp_channels = 32;
  s->hcp_every = 100;
  s->hcp_dgrad = true;
}

struct PresetDef {
  PresetInfo info;
  void (*build)(PrecisionScheme*);
};

void MxEverywhere(PrecisionScheme* s, QuantFormat format) {
  SetAll(s, Mx(format));
  s->layernorm = Mx(format);  // the paper quantized LN affine too ("LN not quantized" was a fix)
}

const std::vector<PresetDef>& PresetDefs() {
  static const std::vector<PresetDef>* defs = new std::vector<PresetDef>{
      {{"fp32", "every operand fp32 (the reference); fp32 attention"},
       [](PrecisionScheme* s) {
         SetAll(s, Fp32());
         s->attention_bf16 = false;
       }},
      {{"bf16", "every GEMM operand and the layernorm affine rounded to bf16 (nearest even)"},
       [](PrecisionScheme* s) {
         SetAll(s, Bf16());
         s->layernorm = Bf16();
       }},
      {{"mxfp8_e4m3", "MXFP8 E4M3 (block 32, nearest-away) in every role and on layernorm affine"},
       [](PrecisionScheme* s) { MxEverywhere(s, QuantFormat::kMxfp8E4M3); }},
      {{"mxfp8_e5m2", "MXFP8 E5M2 in every role and on layernorm affine"},
       [](PrecisionScheme* s) { MxEverywhere(s, QuantFormat::kMxfp8E5M2); }},
      {{"mxfp8_e4m3_bwd_e5m2", "MXFP8 E4M3 forward, E5M2 in all four backward roles (paper's grid)"},
       [](PrecisionScheme* s) {
         MxEverywhere(s, QuantFormat::kMxfp8E4M3);
         SetBackward(s, Mx(QuantFormat::kMxfp8E5M2), Mx(QuantFormat::kMxfp8E5M2));
       }},
      {{"mxfp6_e2m3", "MXFP6 E2M3 in every role and on layernorm affine"},
       [](PrecisionScheme* s) { MxEverywhere(s, QuantFormat::kMxfp6E2M3); }},
      {{"mxfp6_e3m2", "MXFP6 E3M2 in every role and on layernorm affine"},
       [](PrecisionScheme* s) { MxEverywhere(s, QuantFormat::kMxfp6E3M2); }},
      {{"mxfp4", "MXFP4 (E2M1) in every role and on layernorm affine"},
       [](PrecisionScheme* s) { MxEverywhere(s, QuantFormat::kMxfp4); }},
      {{"nvfp4", "NVFP4 1x16 (nearest even) in every role; layernorm affine bf16"},
       [](PrecisionScheme* s) {
         SetAll(s, Quant(QuantFormat::kNvfp4, Rounding::kNearestEven));
         s->layernorm = Bf16();
       }},
      {{"nvfp4_recipe",
        "NVFP4 recipe: 16x16 weights, RHT on wgrad operands, SR on gradients, first and last "
        "block and the head in bf16, layernorm affine bf16"},
       Nvfp4Recipe},
      {{"nvfp4_hcp",
        "nvfp4_recipe plus the Hot-Channel Patch: 32 hot channels of every forward and dgrad GEMM, "
        "re-chosen every 100 steps"},
       Nvfp4Hcp},
      {{"chon", "CHON: nvfp4_hcp plus post-QK protection (post_qk_bf16; llama and gla models)"},
       [](PrecisionScheme* s) {
         Nvfp4Hcp(s);
         s->post_qk_bf16 = true;
       }},
      {{"mx_w_e4m3_a_bf16", "MXFP8 E4M3 weights (fwd_w, dgrad_w); bf16 activations and gradients"},
       [](PrecisionScheme* s) {
         SetAll(s, Bf16());
         s->roles[static_cast<int>(Role::kFwdW)] = Mx(QuantFormat::kMxfp8E4M3);
         s->roles[static_cast<int>(Role::kDgradW)] = Mx(QuantFormat::kMxfp8E4M3);
         s->layernorm = Bf16();
       }},
      {{"mxfp8_e4m3_fwd_only", "MXFP8 E4M3 forward; backward GEMMs on the unquantized operands"},
       [](PrecisionScheme* s) {
         MxEverywhere(s, QuantFormat::kMxfp8E4M3);
         s->forward_only = true;
       }},
  };
  return *defs;
}

}  // namespace

LinearQuant PrecisionScheme::LinearFor(int block, int blocks, bool post_qk) const {
  LinearQuant q;
  bool keep_bf16 = block < 0 ? bf16_head
                             : (block < bf16_first_blocks || block >= blocks - bf16_last_blocks ||
                                (post_qk && post_qk_bf16));
  for (int r = 0; r < kRoleCount; ++r) {
    if (keep_bf16) {
      q.role[r] = Bf16();
    } else if (forward_only && r >= static_cast<int>(Role::kDgradDy)) {
      q.role[r] = Fp32();
    } else {
      q.role[r] = roles[r];
    }
  }
  return q;
}

bool PrecisionScheme::AnyQuantized() const {
  for (const OperandFormat& f : roles) {
    if (f.quantized()) return true;
  }
  return layernorm.quantized();
}

Status ValidateScheme(const PrecisionScheme& s) {
  for (int r = 0; r < kRoleCount; ++r) {
    const OperandFormat& f = s.roles[r];
    std::string field = std::string("precision.") + RoleName(static_cast<Role>(r));
    if (!f.quantized()) continue;
    if (IsMx(f.format) && (f.mx_block < 1 || f.mx_block > kMaxMxBlock)) {
      return Status::InvalidField(field, "mx_block " + std::to_string(f.mx_block) +
                                             " is not allowed (a block size 1 .. " +
                                             std::to_string(kMaxMxBlock) + ")");
    }
    if (f.format == QuantFormat::kNvfp4 && f.rounding == Rounding::kNearestAway) {
      return Status::InvalidField(field, "rounding nearest_away is not allowed for nvfp4 (allowed: "
                                         "nearest_even, stochastic)");
    }
    if (f.rht && f.format != QuantFormat::kNvfp4) {
      return Status::InvalidField(field, "rht is only allowed with nvfp4 (format is " +
                           OperandFormatName(f) + ")");
    }
    if (f.tile_16x16 && f.format != QuantFormat::kNvfp4) {
      return Status::InvalidField(field, "16x16 tiles are only allowed with nvfp4 (format is " +
                           OperandFormatName(f) + ")");
    }
    if (f.rht && r != static_cast<int>(Role::kWgradDy) && r != static_cast<int>(Role::kWgradX)) {
      return Status::InvalidField(field, "rht is only allowed on the wgrad roles (wgrad_dy, wgrad_x)");
    }
  }
  const OperandFormat& wdy = s.roles[static_cast<int>(Role::kWgradDy)];
  const OperandFormat& wx = s.roles[static_cast<int>(Role::kWgradX)];
  if (wdy.rht != wx.rht) {
    return Status::InvalidField("precision", "rht must be set on both wgrad_dy and wgrad_x or on neither (the rotation "
        "cancels only when both operands of dW = dY^T X are rotated)");
  }
  if (s.layernorm.rht || s.layernorm.tile_16x16) {
    return Status::InvalidField("precision.layernorm", "rht and 16x16 tiles are not allowed on layernorm");
  }
  if (s.hcp_channels < 0 || s.hcp_channels > kMaxHcpChannels) {
    return Status::InvalidField("precision.hcp.channels", std::to_string(s.hcp_channels) +
                                                              " is not allowed (0 .. " +
                                                              std::to_string(kMaxHcpChannels) + "; 0: no patch)");
  }
  if (s.hcp_every < 1) {
    return Status::InvalidField("precision.hcp.every",
                                std::to_string(s.hcp_every) + " is not allowed (>= 1 steps between choices)");
  }
  if (s.hcp_wgrad_rows < 0 || s.hcp_wgrad_rows > kMaxHcpChannels) {
    return Status::InvalidField("precision.hcp.wgrad_rows", std::to_string(s.hcp_wgrad_rows) +
                                                                " is not allowed (0 .. " +
                                                                std::to_string(kMaxHcpChannels) + ")");
  }
  if (s.hcp_dgrad && s.hcp_channels == 0) {
    return Status::InvalidField("precision.hcp.dgrad", "true is not allowed with channels 0 (nothing to patch)");
  }
  if (s.bf16_first_blocks < 0) {
    return Status::InvalidField("precision.bf16_first_blocks", "" + std::to_string(s.bf16_first_blocks) +
                         " is not allowed (>= 0)");
  }
  if (s.bf16_last_blocks < 0) {
    return Status::InvalidField("precision.bf16_last_blocks", "" + std::to_string(s.bf16_last_blocks) +
                         " is not allowed (>= 0)");
  }
  return Status::Ok();
}

const std::vector<PresetInfo>& Presets() {
  static const std::vector<PresetInfo>* infos = [] {
    auto* v = new std::vector<PresetInfo>;
    for (const PresetDef& d : PresetDefs()) v->push_back(d.info);
    return v;
  }();
  return *infos;
}

std::string PresetNames() {
  std::string names;
  for (const PresetInfo& p : Presets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

Status SchemeFromPreset(const std::string& name, PrecisionScheme* out) {
  for (const PresetDef& d : PresetDefs()) {
    if (d.info.name == name) {
      PrecisionScheme s;
      s.name = name;
      d.build(&s);
      *out = s;
      return Status::Ok();
    }
  }
  return Status::InvalidField("precision.preset", "unknown value '" + name + "' (allowed: " +
                       PresetNames() + ")");
}

namespace {

// Element bits of an operand format: 4, 6, 8, 16 (bf16) or 32 (fp32).
int ElementBits(const OperandFormat& f) {
  if (!f.quantized()) return 32;
  switch (f.format) {
    case QuantFormat::kMxfp4:
    case QuantFormat::kNvfp4: return 4;
    case QuantFormat::kMxfp6E3M2:
    case QuantFormat::kMxfp6E2M3: return 6;
    case QuantFormat::kMxfp8E4M3:
    case QuantFormat::kMxfp8E5M2:
    case QuantFormat::kFp8E4M3:
    case QuantFormat::kFp8E5M2: return 8;
    case QuantFormat::kBf16: return 16;
  }
  return 32;
}

bool IsWeightRole(int role) { return role == static_cast<int>(Role::kFwdW) || role == static_cast<int>(Role::kDgradW); }

// The rungs of RescueLadder, least precise first.
constexpr const char* kMixedRung = "mx_w_e4m3_a_bf16";
const std::vector<std::string>& CommonRungs() {
  static const std::vector<std::string>* rungs =
      new std::vector<std::string>{"mxfp6_e2m3", "mxfp8_e4m3", kMixedRung, "bf16", "fp32"};
  return *rungs;
}

}  // namespace

std::vector<std::string> RescueLadder(const PrecisionScheme& start, bool post_qk_model, bool language_model) {
  // The narrowest element over what the scheme rounds (forward_only's
  // backward roles run on unquantized operands), and its shape.
  int narrowest = ElementBits(start.layernorm);
  bool mxfp4 = start.layernorm.quantized() && start.layernorm.format == QuantFormat::kMxfp4;
  bool nvfp4 = start.layernorm.quantized() && start.layernorm.format == QuantFormat::kNvfp4;
  bool only_weights_narrow = true;  // every 8-bit (or narrower) role is a weight role
  for (int r = 0; r < kRoleCount; ++r) {
    if (start.forward_only && r >= static_cast<int>(Role::kDgradDy)) continue;
    const OperandFormat& f = start.roles[r];
    const int bits = ElementBits(f);
    narrowest = std::min(narrowest, bits);
    if (bits <= 8 && !IsWeightRole(r)) only_weights_narrow = false;
    mxfp4 |= f.quantized() && f.format == QuantFormat::kMxfp4;
    nvfp4 |= f.quantized() && f.format == QuantFormat::kNvfp4;
  }
  if (start.layernorm.quantized() && ElementBits(start.layernorm) <= 8) only_weights_narrow = false;
  std::string first_above;  // the first rung of CommonRungs above the start
  std::vector<std::string> ladder = {start.name};
  if (narrowest <= 4) {
    const OperandFormat& wgrad_x = start.roles[static_cast<int>(Role::kWgradX)];
    // NVFP4 alone: its own recipe first (RHT, stochastic rounding, bf16 edge
    // blocks: the same 4-bit speed, built for stability), then MXFP8. MXFP6
    // is skipped: on Blackwell FP6 runs at FP8's rate, and NVFP4's finer scales
    // already do much of what its extra mantissa bits would.
    if (nvfp4 && !mxfp4) {
      if (!wgrad_x.rht && start.name != "nvfp4_recipe") ladder.push_back("nvfp4_recipe");
      // Then CHON's patch (and post-QK protection where the model has it),
      // unless the start has them already.
      const char* chon = post_qk_model ? "chon" : "nvfp4_hcp";
      if (start.name != chon && !(start.hcp_channels > 0 && (start.post_qk_bf16 || !post_qk_model))) {
        ladder.push_back(chon);
      }
      first_above = "mxfp8_e4m3";
    } else {
      first_above = "mxfp6_e2m3";
    }
  } else if (narrowest <= 6) {
    first_above = "mxfp8_e4m3";
  } else if (narrowest <= 8) {
    first_above = only_weights_narrow ? "bf16" : kMixedRung;
  } else if (narrowest <= 16) {
    first_above = "fp32";
  }
  if (!first_above.empty()) {
    const std::vector<std::string>& rungs = CommonRungs();
    for (auto it = std::find(rungs.begin(), rungs.end(), first_above); it != rungs.end(); ++it) {
      if (std::find(ladder.begin(), ladder.end(), *it) == ladder.end()) ladder.push_back(*it);
    }
  }
  if (!language_model) return ladder;
  // The head first (where the start rounds it), then every rung that would
  // round it again keeps it BF16.
  std::vector<std::string> with_head = {start.name};
  if (RoundsHeadBelowBf16(start)) with_head.push_back(start.name + kBf16HeadRung);
  for (size_t i = 1; i < ladder.size(); ++i) {
    PrecisionScheme rung;
    SchemeFromPreset(ladder[i], &rung);  // the rungs above the start are presets
    with_head.push_back(RoundsHeadBelowBf16(rung) ? ladder[i] + kBf16HeadRung : ladder[i]);
  }
  return with_head;
}

bool RoundsHeadBelowBf16(const PrecisionScheme& s) {
  if (s.bf16_head) return false;
  for (int r = 0; r < kRoleCount; ++r) {
    if (s.forward_only && r >= static_cast<int>(Role::kDgradDy)) continue;  // unquantized backward operands
    if (ElementBits(s.roles[r]) <= 8) return true;
  }
  return false;
}

Status SchemeForRung(const std::string& rung, const PrecisionScheme& own, PrecisionScheme* out,
                     const std::string& field) {
  const size_t suffix = std::char_traits<char>::length(kBf16HeadRung);
  const bool head = rung.size() > suffix && rung.compare(rung.size() - suffix, suffix, kBf16HeadRung) == 0;
  const std::string base = head ? rung.substr(0, rung.size() - suffix) : rung;
  PrecisionScheme s;
  if (!own.name.empty() && base == own.name) {
    s = own;
  } else if (!SchemeFromPreset(base, &s).ok()) {
    return Status::InvalidField(field, "unknown scheme '" + rung + "' (allowed: a preset, " + PresetNames() +
                                           ", the run's own scheme '" + own.name + "', either followed by " +
                                           kBf16HeadRung + ")");
  }
  if (head) {
    s.bf16_head = true;
    s.name = rung;
  }
  *out = s;
  return Status::Ok();
}

Status SchemeFromName(const std::string& name, PrecisionScheme* out, const std::string& field) {
  PrecisionScheme no_own;
  no_own.name.clear();  // an unnamed own scheme: SchemeForRung never takes it
  return SchemeForRung(name, no_own, out, field);
}

Status ParseOperandFormat(const std::string& field, const std::string& text, OperandFormat* out) {
  if (text == "fp32") {
    *out = Fp32();
    return Status::Ok();
  }
  QuantFormat format;
  if (!ParseQuantFormat(text, &format)) {
    return Status::InvalidField(field, "unknown format '" + text + "' (allowed: " +
                         OperandFormatNames() + ")");
  }
  *out = format == QuantFormat::kBf16 ? Bf16()
         : format == QuantFormat::kNvfp4 || !IsMx(format)
             ? Quant(format, Rounding::kNearestEven)
             : Mx(format);
  return Status::Ok();
}

std::string OperandFormatName(const OperandFormat& f) {
  return f.quantized() ? QuantFormatName(f.format) : "fp32";
}

std::string OperandFormatNames() { return "fp32, " + QuantFormatNames(); }

std::string DescribeScheme(const PrecisionScheme& s) {
  std::ostringstream out;
  auto describe = [](const OperandFormat& f) {
    std::string text = OperandFormatName(f);
    if (f.quantized() && f.format != QuantFormat::kBf16) {
      text += std::string("/") + RoundingName(f.rounding);
      if (IsMx(f.format)) text += "/block" + std::to_string(f.mx_block);
      if (f.bump_exponent) text += "/bump";
      if (f.tile_16x16) text += "/16x16";
      if (f.rht) text += "/rht";
    }
    return text;
  };
  for (int r = 0; r < kRoleCount; ++r) {
    out << (r ? " " : "") << RoleName(static_cast<Role>(r)) << "=" << describe(s.roles[r]);
  }
  out << " layernorm=" << describe(s.layernorm);
  out << " attention=" << (s.attention_bf16 ? "bf16" : "fp32");
  if (s.forward_only) out << " forward_only";
  if (s.bf16_first_blocks) out << " bf16_first_blocks=" << s.bf16_first_blocks;
  if (s.bf16_last_blocks) out << " bf16_last_blocks=" << s.bf16_last_blocks;
  if (s.bf16_head) out << " bf16_head";
  if (s.post_qk_bf16) out << " post_qk_bf16";
  if (s.hcp_channels > 0) {
    out << " hcp=" << s.hcp_channels << (s.hcp_dgrad ? "/fwd+dgrad" : "/fwd") << "/every" << s.hcp_every;
  }
  if (s.hcp_wgrad_rows > 0) out << " hcp_wgrad_rows=" << s.hcp_wgrad_rows;
  return out.str();
}

}  // namespace keel
