// YAML run configs (see run_config.h). Every field is read in this file only.
#include "worker/config/run_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <limits>
#include <sstream>

#include "kernels/base/host.h"
#include "worker/io/yaml_strict.h"

namespace keel {
namespace {

// Errors carry "source:line:col: field: ..." (yaml-cpp marks are 0-based).
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  // A node made by an override (--set) has no mark: 1:1.
  std::string Where(const YAML::Node& node) const { return YamlWhere(source_, node.Mark()); }

  Status Error(const YAML::Node& node, const std::string& field, const std::string& what) const {
    return Status::InvalidArgument(Where(node) + field + ": " + what);
  }

  // Rejects keys outside `allowed` so that a typo never passes silently.
  Status CheckKeys(const YAML::Node& map, const std::string& field,
                   const std::set<std::string>& allowed) const {
    if (!map.IsMap()) return Error(map, field, "expected a mapping");
    for (auto it = map.begin(); it != map.end(); ++it) {
      std::string key = it->first.as<std::string>();
      if (!allowed.count(key)) {
        std::string list;
        for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
        return Error(it->first, field.empty() ? key : field + "." + key,
                     "unknown key (allowed: " + list + ")");
      }
    }
    return Status::Ok();
  }

  Status String(const YAML::Node& node, const std::string& field, std::string* out) const {
    if (!node.IsScalar()) return Error(node, field, "expected a string");
    *out = node.Scalar();
    return Status::Ok();
  }

  Status Int(const YAML::Node& node, const std::string& field, int64_t lo, int64_t hi,
             int64_t* out) const {
    int64_t v;
    if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, v)) {
      return Error(node, field, "'" + Text(node) + "' is not an integer");
    }
    if (v < lo || v > hi) {
      return Error(node, field, std::to_string(v) + " is out of range (allowed: " +
                                    std::to_string(lo) + " .. " + std::to_string(hi) + ")");
    }
    *out = v;
    return Status::Ok();
  }

  Status Int(const YAML::Node& node, const std::string& field, int64_t lo, int64_t hi,
             int* out) const {
    int64_t v;
    Status s = Int(node, field, lo, hi, &v);
    if (s.ok()) *out = static_cast<int>(v);
    return s;
  }

  Status Float(const YAML::Node& node, const std::string& field, double lo, double hi,
               float* out) const {
    double v;
    if (!node.IsScalar() || !YAML::convert<double>::decode(node, v) || !std::isfinite(v)) {
      return Error(node, field, "'" + Text(node) + "' is not a finite number");
    }
    if (v < lo || v > hi) {
      std::ostringstream range;
      range << lo << " .. " << hi;
      return Error(node, field, Text(node) + " is out of range (allowed: " + range.str() + ")");
    }
    *out = static_cast<float>(v);
    return Status::Ok();
  }

  Status Bool(const YAML::Node& node, const std::string& field, bool* out) const {
    bool v;
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, v)) {
      return Error(node, field, "'" + Text(node) + "' is not a boolean (allowed: true, false)");
    }
    *out = v;
    return Status::Ok();
  }

  Status OneOf(const YAML::Node& node, const std::string& field,
               const std::vector<std::string>& allowed, std::string* out) const {
    std::string v;
    Status s = String(node, field, &v);
    if (!s.ok()) return s;
    std::string list;
    for (const std::string& a : allowed) {
      if (a == v) {
        *out = v;
        return Status::Ok();
      }
      list += (list.empty() ? "" : ", ") + a;
    }
    return Error(node, field, "unknown value '" + v + "' (allowed: " + list + ")");
  }

  static std::string Text(const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    return node.IsMap() ? "<mapping>" : node.IsSequence() ? "<sequence>" : "<null>";
  }

 private:
  std::string source_;
};

const std::set<std::string> kRoleKeys = {"fwd_x", "fwd_w", "dgrad_dy", "dgrad_w", "wgrad_dy",
                                         "wgrad_x"};

// The keys of a precision mapping: its options and the six roles.
std::set<std::string> PrecisionKeys() {
  std::set<std::string> keys = {"preset", "rounding", "grad_rounding", "layernorm", "forward_only",
                                "bf16_first_blocks", "bf16_last_blocks", "bf16_head", "attention", "post_qk_bf16", "hcp",
                                "mx_block", "bump_exponent", "nvfp4_weight_16x16",
                                "nvfp4_rht_wgrad", "nvfp4_sr_grads", "name"};
  keys.insert(kRoleKeys.begin(), kRoleKeys.end());
  return keys;
}

std::vector<std::string> PresetNameList() {
  std::vector<std::string> names;
  for (const PresetInfo& p : Presets()) names.push_back(p.name);
  return names;
}

OperandFormat& RoleFormat(PrecisionScheme* s, Role role) { return s->roles[static_cast<int>(role)]; }

// precision.<role>: an operand format per role.
Status ParseRoleFormats(const Reader& r, const YAML::Node& node, PrecisionScheme* s) {
  const std::string f = "precision";
  // Roles first: a forward role set without its backward twins also sets those
  // (backward activations/gradients take fwd_x's format, dgrad_w takes fwd_w's:
  // docs/numerics.md, "Operand roles and axes").
  for (int i = 0; i < kRoleCount; ++i) {
    const char* role = RoleName(static_cast<Role>(i));
    if (!node[role]) continue;
    std::string text;
    KEEL_RETURN_IF_ERROR(r.String(node[role], f + "." + role, &text));
    Status st = ParseOperandFormat(f + "." + role, text, &s->roles[i]);
    if (!st.ok()) return Status::InvalidArgument(r.Where(node[role]) + st.message());
  }
  if (node["fwd_x"]) {
    for (Role b : {Role::kDgradDy, Role::kWgradDy, Role::kWgradX}) {
      if (!node[RoleName(b)]) RoleFormat(s, b) = RoleFormat(s, Role::kFwdX);
    }
  }
  if (node["fwd_w"] && !node["dgrad_w"]) RoleFormat(s, Role::kDgradW) = RoleFormat(s, Role::kFwdW);
  return Status::Ok();
}

// precision.rounding (every operand) and precision.grad_rounding (the gradients).
Status ParseRoundings(const Reader& r, const YAML::Node& node, PrecisionScheme* s) {
  const std::string f = "precision";
  const std::vector<std::string> roundings = RoundingNames();
  if (node["rounding"]) {
    std::string text;
    KEEL_RETURN_IF_ERROR(r.OneOf(node["rounding"], f + ".rounding", roundings, &text));
    Rounding rounding;
    ParseRounding(text, &rounding);
    for (OperandFormat& o : s->roles) o.rounding = rounding;
    s->layernorm.rounding = rounding;
  }
  if (node["grad_rounding"]) {
    std::string text;
    KEEL_RETURN_IF_ERROR(r.OneOf(node["grad_rounding"], f + ".grad_rounding", roundings, &text));
    Rounding rounding;
    ParseRounding(text, &rounding);
    RoleFormat(s, Role::kDgradDy).rounding = rounding;
    RoleFormat(s, Role::kWgradDy).rounding = rounding;
  }
  return Status::Ok();
}

// precision.hcp: the Hot-Channel Patch, {channels, every, dgrad, wgrad_rows}
// (docs/hcp.md); a key left out keeps the preset's value, `hcp: off` drops it.
Status ParseHcp(const Reader& r, const YAML::Node& node, PrecisionScheme* s) {
  const std::string f = "precision.hcp";
  if (!node["hcp"]) return Status::Ok();
  const YAML::Node h = node["hcp"];
  if (h.IsScalar() && h.Scalar() == "off") {
    s->hcp_channels = 0;
    s->hcp_dgrad = false;
    s->hcp_wgrad_rows = 0;
    return Status::Ok();
  }
  if (!h.IsMap()) return r.Error(h, f, "expected a mapping {channels, every, dgrad, wgrad_rows} or off");
  KEEL_RETURN_IF_ERROR(r.CheckKeys(h, f, {"channels", "every", "dgrad", "wgrad_rows"}));
  if (h["channels"]) KEEL_RETURN_IF_ERROR(r.Int(h["channels"], f + ".channels", 0, kMaxHcpChannels, &s->hcp_channels));
  if (h["every"]) KEEL_RETURN_IF_ERROR(r.Int(h["every"], f + ".every", 1, 1 << 30, &s->hcp_every));
  if (h["dgrad"]) KEEL_RETURN_IF_ERROR(r.Bool(h["dgrad"], f + ".dgrad", &s->hcp_dgrad));
  if (h["wgrad_rows"]) {
    KEEL_RETURN_IF_ERROR(r.Int(h["wgrad_rows"], f + ".wgrad_rows", 0, kMaxHcpChannels, &s->hcp_wgrad_rows));
  }
  return Status::Ok();
}

// precision.layernorm, forward_only, bf16_first_blocks, bf16_last_blocks,
// bf16_head, attention, post_qk_bf16 and hcp.
Status ParseSchemeOptions(const Reader& r, const YAML::Node& node, PrecisionScheme* s) {
  const std::string f = "precision";
  if (node["layernorm"]) {
    std::string text;
    KEEL_RETURN_IF_ERROR(r.String(node["layernorm"], f + ".layernorm", &text));
    Status st = ParseOperandFormat(f + ".layernorm", text, &s->layernorm);
    if (!st.ok()) return Status::InvalidArgument(r.Where(node["layernorm"]) + st.message());
  }
  if (node["forward_only"]) KEEL_RETURN_IF_ERROR(r.Bool(node["forward_only"], f + ".forward_only", &s->forward_only));
  if (node["bf16_first_blocks"]) {
    KEEL_RETURN_IF_ERROR(
        r.Int(node["bf16_first_blocks"], f + ".bf16_first_blocks", 0, 1 << 20, &s->bf16_first_blocks));
  }
  if (node["bf16_last_blocks"]) {
    KEEL_RETURN_IF_ERROR(
        r.Int(node["bf16_last_blocks"], f + ".bf16_last_blocks", 0, 1 << 20, &s->bf16_last_blocks));
  }
  if (node["bf16_head"]) KEEL_RETURN_IF_ERROR(r.Bool(node["bf16_head"], f + ".bf16_head", &s->bf16_head));
  if (node["post_qk_bf16"]) {
    KEEL_RETURN_IF_ERROR(r.Bool(node["post_qk_bf16"], f + ".post_qk_bf16", &s->post_qk_bf16));
  }
  if (node["attention"]) {
    std::string text;
    KEEL_RETURN_IF_ERROR(r.OneOf(node["attention"], f + ".attention", {"bf16", "fp32"}, &text));
    s->attention_bf16 = text == "bf16";
  }
  return ParseHcp(r, node, s);
}

// precision.mx_block and precision.bump_exponent, for the MX operands.
Status ParseMxOptions(const Reader& r, const YAML::Node& node, PrecisionScheme* s) {
  const std::string f = "precision";
  if (node["mx_block"]) {
    int block;
    KEEL_RETURN_IF_ERROR(r.Int(node["mx_block"], f + ".mx_block", 1, kMaxMxBlock, &block));
    for (OperandFormat& o : s->roles) o.mx_block = block;
    s->layernorm.mx_block = block;
  }
  if (node["bump_exponent"]) {
    bool bump;
    KEEL_RETURN_IF_ERROR(r.Bool(node["bump_exponent"], f + ".bump_exponent", &bump));
    for (OperandFormat& o : s->roles) o.bump_exponent = bump && o.quantized() && IsMx(o.format);
    s->layernorm.bump_exponent = bump && s->layernorm.quantized() && IsMx(s->layernorm.format);
  }
  return Status::Ok();
}

bool IsNvfp4(const OperandFormat& o) { return o.quantized() && o.format == QuantFormat::kNvfp4; }

// precision.nvfp4_weight_16x16, nvfp4_rht_wgrad and nvfp4_sr_grads: each
// changes the NVFP4 operands only.
Status ParseNvfp4Options(const Reader& r, const YAML::Node& node, PrecisionScheme* s) {
  const std::string f = "precision";
  bool v;
  if (node["nvfp4_weight_16x16"]) {
    KEEL_RETURN_IF_ERROR(r.Bool(node["nvfp4_weight_16x16"], f + ".nvfp4_weight_16x16", &v));
    for (Role x : {Role::kFwdW, Role::kDgradW}) RoleFormat(s, x).tile_16x16 = v && IsNvfp4(RoleFormat(s, x));
  }
  if (node["nvfp4_rht_wgrad"]) {
    KEEL_RETURN_IF_ERROR(r.Bool(node["nvfp4_rht_wgrad"], f + ".nvfp4_rht_wgrad", &v));
    bool both = IsNvfp4(RoleFormat(s, Role::kWgradDy)) && IsNvfp4(RoleFormat(s, Role::kWgradX));
    RoleFormat(s, Role::kWgradDy).rht = v && both;
    RoleFormat(s, Role::kWgradX).rht = v && both;
  }
  if (node["nvfp4_sr_grads"]) {
    KEEL_RETURN_IF_ERROR(r.Bool(node["nvfp4_sr_grads"], f + ".nvfp4_sr_grads", &v));
    for (Role x : {Role::kDgradDy, Role::kWgradDy}) {
      if (IsNvfp4(RoleFormat(s, x))) RoleFormat(s, x).rounding = v ? Rounding::kStochastic : Rounding::kNearestEven;
    }
  }
  return Status::Ok();
}

// Whether a precision mapping changes its preset: any key but preset and name.
bool ChangesThePreset(const YAML::Node& node) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    if (key != "preset" && key != "name") return true;
  }
  return false;
}

// A scheme named in a config (precision, a ladder's rung, a switch): a preset,
// or a preset followed by "+bf16_head" (kBf16HeadRung: that preset with the
// head in BF16), or "next" where `next_allowed`; *scheme (when given) is the
// scheme it names (untouched for "next").
Status ParseRungName(const Reader& r, const YAML::Node& node, const std::string& field, bool next_allowed,
                     std::string* out, PrecisionScheme* scheme = nullptr) {
  std::string v;
  KEEL_RETURN_IF_ERROR(r.String(node, field, &v));
  PrecisionScheme s;  // a config's rung names a preset, never the run's own scheme
  if ((next_allowed && v == "next") || SchemeFromName(v, &s, field).ok()) {
    *out = v;
    if (scheme != nullptr && v != "next") *scheme = s;
    return Status::Ok();
  }
  return r.Error(node, field,
                 "unknown value '" + v + "' (allowed: " + PresetNames() + (next_allowed ? ", next" : "") +
                     "; a preset may be followed by " + kBf16HeadRung + ")");
}

// precision: either a preset name (optionally followed by +bf16_head, as the
// policies' ladders name that scheme with the head in BF16), or a mapping
// {preset, overrides...}.
Status ParsePrecision(const Reader& r, const YAML::Node& node, PrecisionScheme* out) {
  const std::string f = "precision";
  PrecisionScheme s;
  if (node.IsScalar()) {
    std::string name;
    return ParseRungName(r, node, f, false, &name, out);
  }
  KEEL_RETURN_IF_ERROR(r.CheckKeys(node, f, PrecisionKeys()));
  if (node["preset"]) {
    std::string preset;
    KEEL_RETURN_IF_ERROR(r.OneOf(node["preset"], f + ".preset", PresetNameList(), &preset));
    SchemeFromPreset(preset, &s);
  }
  // In this order: the options read the formats the roles set.
  KEEL_RETURN_IF_ERROR(ParseRoleFormats(r, node, &s));
  KEEL_RETURN_IF_ERROR(ParseRoundings(r, node, &s));
  KEEL_RETURN_IF_ERROR(ParseSchemeOptions(r, node, &s));
  KEEL_RETURN_IF_ERROR(ParseMxOptions(r, node, &s));
  KEEL_RETURN_IF_ERROR(ParseNvfp4Options(r, node, &s));
  if (node["name"]) {
    KEEL_RETURN_IF_ERROR(r.String(node["name"], f + ".name", &s.name));
  } else if (ChangesThePreset(node)) {
    s.name = "custom";
  }
  Status st = ValidateScheme(s);
  if (!st.ok()) return Status::InvalidArgument(r.Where(node) + st.message());
  *out = s;
  return Status::Ok();
}

// Sets node[path] = value for a dotted path, creating mappings on the way.
Status ApplyOverride(YAML::Node root, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Status::InvalidArgument("--set: '" + assignment + "' is not of the form key.path=value");
  }
  std::string path = assignment.substr(0, eq);
  YAML::Node value;
  // "--set path:1:col: ..." names the assignment and the place in its value.
  KEEL_RETURN_IF_ERROR(LoadYamlStrict(assignment.substr(eq + 1), "--set " + path, &value));
  std::vector<std::string> keys;
  std::stringstream parts(path);
  for (std::string key; std::getline(parts, key, '.');) keys.push_back(key);
  std::vector<YAML::Node> chain = {root};
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    YAML::Node next = chain.back()[keys[i]];
    if (!next.IsMap()) {
      if (next.IsDefined() && !next.IsNull() && keys[i] == "precision" && next.IsScalar()) {
        // "precision: mxfp4" then --set precision.bump_exponent=true: keep the preset.
        std::string preset = next.Scalar();
        next = YAML::Node(YAML::NodeType::Map);
        next["preset"] = preset;
      } else if (next.IsDefined() && !next.IsNull()) {
        return Status::InvalidArgument("--set " + path + ": '" + keys[i] + "' is not a mapping");
      } else {
        next = YAML::Node(YAML::NodeType::Map);
      }
      chain.back()[keys[i]] = next;
    }
    chain.push_back(chain.back()[keys[i]]);
  }
  chain.back()[keys.back()] = value;
  return Status::Ok();
}

// One detector parameter, read as the detector's table says (detectors.h).
Status ParseDetectorParam(const Reader& r, const YAML::Node& node, const std::string& field,
                          const DetectorParam& param, DetectorConfig* out) {
  switch (param.kind) {
    case DetectorParam::Kind::kInt:
      return r.Int(node, field, static_cast<int64_t>(param.min), static_cast<int64_t>(param.max),
                   &(out->*param.int_field));
    case DetectorParam::Kind::kFloat: {
      float v;
      KEEL_RETURN_IF_ERROR(r.Float(node, field, param.min, param.max, &v));
      out->*param.float_field = v;
      return Status::Ok();
    }
    case DetectorParam::Kind::kChoice:
      return r.OneOf(node, field, param.choices, &(out->*param.string_field));
    case DetectorParam::Kind::kRoles: {
      if (!node.IsSequence()) return r.Error(node, field, "expected a list of roles");
      std::vector<std::string> role_names;
      for (int i = 0; i < kRoleCount; ++i) role_names.push_back(RoleName(static_cast<Role>(i)));
      for (const YAML::Node& role : node) {
        std::string name;
        KEEL_RETURN_IF_ERROR(r.OneOf(role, field, role_names, &name));
        out->roles.push_back(name);
      }
      return Status::Ok();
    }
  }
  return Status::Error(field + ": unknown parameter kind");
}

// policy.detectors.NAME: a boolean (on or off), or a mapping of `enabled` and
// the parameters of the detector's table (detectors.h).
Status ParseDetector(const Reader& r, const YAML::Node& c, const std::string& name, DetectorConfig* dc) {
  const std::string g = "policy.detectors." + name;
  if (c.IsScalar()) return r.Bool(c, g, &dc->enabled);  // "loss_zscore: false" / "grad_bias: true"
  const DetectorInfo& info = *FindDetector(name);
  std::set<std::string> keys = {"enabled"};
  for (const DetectorParam& param : info.params) keys.insert(param.key);
  KEEL_RETURN_IF_ERROR(r.CheckKeys(c, g, keys));
  if (!info.on_by_default) dc->enabled = true;  // configuring turns it on
  if (c["enabled"]) KEEL_RETURN_IF_ERROR(r.Bool(c["enabled"], g + ".enabled", &dc->enabled));
  for (const DetectorParam& param : info.params) {
    if (YAML::Node value = c[param.key]) {
      KEEL_RETURN_IF_ERROR(ParseDetectorParam(r, value, g + "." + param.key, param, dc));
    }
  }
  return Status::Ok();
}

Status ParseDetectors(const Reader& r, const YAML::Node& d, std::map<std::string, DetectorConfig>* detectors) {
  const std::string f = "policy.detectors";
  if (!d.IsMap()) return r.Error(d, f, "expected a mapping of detector names");
  for (auto it = d.begin(); it != d.end(); ++it) {
    std::string name;
    KEEL_RETURN_IF_ERROR(r.OneOf(it->first, f, DetectorNames(), &name));
    KEEL_RETURN_IF_ERROR(ParseDetector(r, it->second, name, &(*detectors)[name]));
  }
  return Status::Ok();
}

Status ParseLadder(const Reader& r, const YAML::Node& ladder, std::vector<std::string>* out) {
  const std::string f = "policy.ladder";
  if (!ladder.IsSequence()) return r.Error(ladder, f, "expected a list of scheme presets");
  for (const YAML::Node& rung : ladder) {
    std::string name;
    KEEL_RETURN_IF_ERROR(ParseRungName(r, rung, f, false, &name));
    if (std::find(out->begin(), out->end(), name) != out->end()) {
      return r.Error(rung, f, "'" + name + "' appears twice: the ladder would loop");
    }
    out->push_back(name);
  }
  return Status::Ok();
}

Status ParseSnapshots(const Reader& r, const YAML::Node& snap, Policy* p) {
  const std::string f = "policy.snapshots";
  KEEL_RETURN_IF_ERROR(r.CheckKeys(snap, f, {"every", "keep", "memory_mib"}));
  if (snap["every"]) KEEL_RETURN_IF_ERROR(r.Int(snap["every"], f + ".every", 1, 1 << 30, &p->snapshot_every));
  if (snap["keep"]) KEEL_RETURN_IF_ERROR(r.Int(snap["keep"], f + ".keep", 1, 1 << 20, &p->snapshot_keep));
  if (snap["memory_mib"]) {
    KEEL_RETURN_IF_ERROR(r.Int(snap["memory_mib"], f + ".memory_mib", 0, int64_t(1) << 30, &p->snapshot_memory_mib));
  }
  return Status::Ok();
}

// policy.rules[i].when: a detector or a non-empty list of them, each enabled.
Status ParseWhen(const Reader& r, const YAML::Node& rn, const std::string& g, const Policy& p,
                 std::vector<std::string>* out) {
  YAML::Node when = rn["when"];
  if (!when) return r.Error(rn, g + ".when", "missing (a list of detectors)");
  if (when.IsScalar()) {
    std::string name;
    KEEL_RETURN_IF_ERROR(r.OneOf(when, g + ".when", DetectorNames(), &name));
    out->push_back(name);
  } else if (when.IsSequence() && when.size() > 0) {
    for (const YAML::Node& w : when) {
      std::string name;
      KEEL_RETURN_IF_ERROR(r.OneOf(w, g + ".when", DetectorNames(), &name));
      out->push_back(name);
    }
  } else {
    return r.Error(when, g + ".when", "expected a detector or a non-empty list of detectors");
  }
  for (const std::string& name : *out) {
    if (!p.detectors.at(name).enabled) {
      return r.Error(when, g + ".when", "detector '" + name + "' is disabled in policy.detectors");
    }
  }
  return Status::Ok();
}

// The argument of an action (`switch: bf16`, `rollback: {steps: 200}`, ...)
// under the field h = policy.rules[i].do.KIND; `an` is the whole action.
Status ParseSwitchAction(const Reader& r, const YAML::Node& an, const YAML::Node& arg, const std::string& h,
                         const Policy& p, PolicyAction* a) {
  a->kind = PolicyAction::Kind::kSwitch;
  if (!arg) return r.Error(an, h, "missing the scheme (a preset name or next)");
  KEEL_RETURN_IF_ERROR(ParseRungName(r, arg, h, true, &a->scheme));
  if (a->scheme == "next" && p.ladder.empty()) return r.Error(arg, h, "'next' needs policy.ladder");
  return Status::Ok();
}

Status ParseRollbackAction(const Reader& r, const YAML::Node& an, const YAML::Node& arg, const std::string& h,
                           PolicyAction* a) {
  a->kind = PolicyAction::Kind::kRollback;
  YAML::Node steps = arg && arg.IsMap() ? arg["steps"] : arg;
  if (arg && arg.IsMap()) KEEL_RETURN_IF_ERROR(r.CheckKeys(arg, h, {"steps"}));
  if (!steps) return r.Error(an, h + ".steps", "missing (steps to roll back, >= 1)");
  return r.Int(steps, h + ".steps", 1, int64_t(1) << 40, &a->steps);
}

Status ParseScaleLrAction(const Reader& r, const YAML::Node& an, const YAML::Node& arg, const std::string& h,
                          PolicyAction* a) {
  a->kind = PolicyAction::Kind::kScaleLr;
  if (!arg) return r.Error(an, h, "missing the factor");
  float factor;
  KEEL_RETURN_IF_ERROR(r.Float(arg, h, 1e-6, 10.0, &factor));
  a->factor = factor;
  return Status::Ok();
}

// One item of policy.rules[i].do: a bare action name or a one-key mapping
// {action: argument}.
Status ParseAction(const Reader& r, const YAML::Node& an, const std::string& g, const Policy& p,
                   PolicyAction* a) {
  std::string kind;
  // Undefined (`!arg`) for a bare action: a default-constructed Node would be
  // a defined null, and "missing ..." would never be said.
  YAML::Node arg(YAML::NodeType::Undefined);
  if (an.IsScalar()) {
    kind = an.Scalar();
  } else if (an.IsMap() && an.size() == 1) {
    kind = an.begin()->first.as<std::string>();
    arg = an.begin()->second;
  } else {
    return r.Error(an, g + ".do", "expected an action such as `switch: bf16` or `skip_step`");
  }
  const std::string h = g + ".do." + kind;
  if (kind == "switch") return ParseSwitchAction(r, an, arg, h, p, a);
  if (kind == "rollback") return ParseRollbackAction(r, an, arg, h, a);
  if (kind == "scale_lr") return ParseScaleLrAction(r, an, arg, h, a);
  if (kind == "skip_step" || kind == "stop") {
    a->kind = kind == "stop" ? PolicyAction::Kind::kStop : PolicyAction::Kind::kSkipStep;
    if (arg && !arg.IsNull()) return r.Error(arg, h, "takes no value");
    return Status::Ok();
  }
  return r.Error(an, g + ".do", "unknown action '" + kind + "' (allowed: switch, rollback, scale_lr, skip_step, stop)");
}

Status ParseActions(const Reader& r, const YAML::Node& rn, const std::string& g, const Policy& p,
                    std::vector<PolicyAction>* out) {
  YAML::Node actions = rn["do"];
  if (!actions || !actions.IsSequence() || actions.size() == 0) {
    return r.Error(actions ? actions : rn, g + ".do", "expected a non-empty list of actions (switch, rollback, scale_lr, skip_step, stop)");
  }
  for (const YAML::Node& an : actions) {
    PolicyAction a;
    KEEL_RETURN_IF_ERROR(ParseAction(r, an, g, p, &a));
    out->push_back(a);
  }
  return Status::Ok();
}

// policy.rules[index]; `p` holds the detectors, the ladder and the rules before it.
Status ParseRule(const Reader& r, const YAML::Node& rn, int index, const Policy& p, PolicyRule* rule) {
  const std::string g = "policy.rules[" + std::to_string(index) + "]";
  KEEL_RETURN_IF_ERROR(r.CheckKeys(rn, g, {"name", "when", "match", "do", "cooldown", "max"}));
  rule->name = "rule" + std::to_string(index);
  if (rn["name"]) KEEL_RETURN_IF_ERROR(r.String(rn["name"], g + ".name", &rule->name));
  KEEL_RETURN_IF_ERROR(ParseWhen(r, rn, g, p, &rule->when));
  if (rn["match"]) {
    std::string match;
    KEEL_RETURN_IF_ERROR(r.OneOf(rn["match"], g + ".match", {"any", "all"}, &match));
    rule->match_all = match == "all";
  }
  KEEL_RETURN_IF_ERROR(ParseActions(r, rn, g, p, &rule->actions));
  if (rn["cooldown"]) KEEL_RETURN_IF_ERROR(r.Int(rn["cooldown"], g + ".cooldown", 0, int64_t(1) << 40, &rule->cooldown));
  if (rn["max"]) KEEL_RETURN_IF_ERROR(r.Int(rn["max"], g + ".max", 0, 1 << 20, &rule->max));
  Status replay = ValidateRule(*rule, g);  // no rollback alone
  if (!replay.ok()) return Status::InvalidArgument(r.Where(rn["do"]) + replay.message());
  for (const PolicyRule& other : p.rules) {
    if (other.name == rule->name) return r.Error(rn, g + ".name", "'" + rule->name + "' names two rules");
  }
  return Status::Ok();
}

Status ParseRules(const Reader& r, const YAML::Node& rules, Policy* p) {
  if (!rules.IsSequence()) return r.Error(rules, "policy.rules", "expected a list of rules");
  int index = 0;
  for (const YAML::Node& rn : rules) {
    PolicyRule rule;
    KEEL_RETURN_IF_ERROR(ParseRule(r, rn, index, *p, &rule));
    p->rules.push_back(rule);
    ++index;
  }
  return Status::Ok();
}

Status ParseSweepRule(const Reader& r, const YAML::Node& sn, int index, SweepRule* rule) {
  const std::string g = "policy.sweep_rules[" + std::to_string(index) + "]";
  KEEL_RETURN_IF_ERROR(r.CheckKeys(sn, g, {"when_diverged", "scheme", "switch"}));
  if (!sn["when_diverged"]) return r.Error(sn, g + ".when_diverged", "missing (runs that must diverge, >= 1)");
  KEEL_RETURN_IF_ERROR(r.Int(sn["when_diverged"], g + ".when_diverged", 1, 1 << 20, &rule->diverged));
  std::vector<std::string> schemes = PresetNameList();
  schemes.push_back("any");
  if (sn["scheme"]) KEEL_RETURN_IF_ERROR(r.OneOf(sn["scheme"], g + ".scheme", schemes, &rule->scheme));
  if (!sn["switch"]) return r.Error(sn, g + ".switch", "missing (the preset the other runs switch to)");
  return r.OneOf(sn["switch"], g + ".switch", PresetNameList(), &rule->switch_to);
}

Status ParseSweepRules(const Reader& r, const YAML::Node& sweep_rules, std::vector<SweepRule>* out) {
  if (!sweep_rules.IsSequence()) return r.Error(sweep_rules, "policy.sweep_rules", "expected a list");
  int index = 0;
  for (const YAML::Node& sn : sweep_rules) {
    SweepRule rule;
    KEEL_RETURN_IF_ERROR(ParseSweepRule(r, sn, index++, &rule));
    out->push_back(rule);
  }
  return Status::Ok();
}

// policy.probation: {after: N}, N >= 1.
Status ParseProbation(const Reader& r, const YAML::Node& node, Policy* p) {
  const std::string f = "policy.probation";
  KEEL_RETURN_IF_ERROR(r.CheckKeys(node, f, {"after"}));
  if (!node["after"]) return r.Error(node, f + ".after", "missing (healthy steps before going back down one rung, >= 1)");
  return r.Int(node["after"], f + ".after", 1, int64_t(1) << 40, &p->probation_after);
}

// `policy: NAME` or `policy: {preset: NAME, probation: ..., sweep_rules: ...}`:
// a named policy, resolved against the run's scheme and length by
// ResolvePolicyPreset once they are known.
Status ParsePolicyPreset(const Reader& r, const YAML::Node& node, Policy* p) {
  const std::string f = "policy";
  std::vector<std::string> presets;
  for (const PolicyPresetInfo& info : PolicyPresets()) presets.push_back(info.name);
  if (node.IsScalar()) {
    if (std::find(presets.begin(), presets.end(), node.Scalar()) == presets.end()) {
      return r.Error(node, f, "unknown policy '" + node.Scalar() + "' (allowed: " + PolicyPresetNames() +
                                  ", or a mapping of detectors, ladder, rules, ...)");
    }
    p->preset = node.Scalar();
    p->rewarm_steps = -1;  // the preset's
    p->lr_fallbacks = -1;  // likewise
    return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(r.CheckKeys(
      node, f, {"preset", "probation", "rollback", "lr_fallbacks", "sweep_rules", "rewarm", "snapshots"}));
  KEEL_RETURN_IF_ERROR(r.OneOf(node["preset"], f + ".preset", presets, &p->preset));
  p->rewarm_steps = -1;  // the preset's, unless given
  p->lr_fallbacks = -1;  // likewise
  if (node["rewarm"]) KEEL_RETURN_IF_ERROR(r.Int(node["rewarm"], f + ".rewarm", 0, 1 << 30, &p->rewarm_steps));
  if (node["rollback"]) KEEL_RETURN_IF_ERROR(r.Int(node["rollback"], f + ".rollback", 1, 1 << 30, &p->rollback_steps));
  if (node["lr_fallbacks"]) {
    KEEL_RETURN_IF_ERROR(r.Int(node["lr_fallbacks"], f + ".lr_fallbacks", 0, kMaxLrFallbacks, &p->lr_fallbacks));
  }
  if (YAML::Node probation = node["probation"]) KEEL_RETURN_IF_ERROR(ParseProbation(r, probation, p));
  if (YAML::Node sweep_rules = node["sweep_rules"]) KEEL_RETURN_IF_ERROR(ParseSweepRules(r, sweep_rules, &p->sweep_rules));
  if (YAML::Node snap = node["snapshots"]) KEEL_RETURN_IF_ERROR(ParseSnapshots(r, snap, p));
  return Status::Ok();
}

Status ParsePolicy(const Reader& r, const YAML::Node& node, Policy* out) {
  const std::string f = "policy";
  Policy p;
  for (const std::string& name : DetectorNames()) p.detectors[name] = DefaultDetectorConfig(name);
  if (node.IsNull()) {
    *out = p;
    return Status::Ok();
  }
  if (node.IsScalar() || (node.IsMap() && node["preset"])) {
    KEEL_RETURN_IF_ERROR(ParsePolicyPreset(r, node, &p));
  } else {
    KEEL_RETURN_IF_ERROR(r.CheckKeys(node, f,
                                     {"detectors", "ladder", "snapshots", "max_interventions", "rules", "sweep_rules",
                                      "probation", "rewarm", "lr_fallbacks"}));
    if (YAML::Node d = node["detectors"]) KEEL_RETURN_IF_ERROR(ParseDetectors(r, d, &p.detectors));
    if (YAML::Node ladder = node["ladder"]) KEEL_RETURN_IF_ERROR(ParseLadder(r, ladder, &p.ladder));
    if (YAML::Node snap = node["snapshots"]) KEEL_RETURN_IF_ERROR(ParseSnapshots(r, snap, &p));
    if (node["max_interventions"]) {
      KEEL_RETURN_IF_ERROR(r.Int(node["max_interventions"], f + ".max_interventions", 0, 1 << 20, &p.max_interventions));
    }
    if (node["rewarm"]) KEEL_RETURN_IF_ERROR(r.Int(node["rewarm"], f + ".rewarm", 0, 1 << 30, &p.rewarm_steps));
    if (node["lr_fallbacks"]) {
      KEEL_RETURN_IF_ERROR(r.Int(node["lr_fallbacks"], f + ".lr_fallbacks", 0, kMaxLrFallbacks, &p.lr_fallbacks));
    }
    if (YAML::Node rules = node["rules"]) KEEL_RETURN_IF_ERROR(ParseRules(r, rules, &p));
    if (YAML::Node sweep_rules = node["sweep_rules"]) KEEL_RETURN_IF_ERROR(ParseSweepRules(r, sweep_rules, &p.sweep_rules));
    if (YAML::Node probation = node["probation"]) {
      KEEL_RETURN_IF_ERROR(ParseProbation(r, probation, &p));
      if (p.ladder.empty()) {
        return r.Error(probation, f + ".probation", "needs policy.ladder (probation goes back down one of its rungs)");
      }
    }
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  p.yaml = e.c_str();
  *out = p;
  return Status::Ok();
}

// A named policy (`policy: default`) becomes its rules once the run's starting
// scheme and length are known; what the config set besides the name stays.
// probe_set / reference_set: the config gave probe_every / probe_reference.
// The default policy's bias rule (a language model whose start rounds its head
// to 8 bits or fewer) reads the gradient-bias probe, so such a run that did not
// say probes every DefaultProbeEvery steps against the bf16 scheme's gradient
// (at GPT-2 124M an fp32 reference costs 5.9% of the run at that cadence, a bf16
// one 0.8%; docs/train.md); no other run pays for a probe.
void ResolvePolicyPreset(RunConfig* c, bool probe_set, bool reference_set) {
  if (c->policy.preset != "default") return;
  const bool lm = IsLanguageModel(c->model);
  const bool bias_rule = lm && RoundsHeadBelowBf16(c->precision);  // the ladder's first rung: the head to BF16
  Policy resolved = DefaultPolicy(RescueLadder(c->precision, IsDecoderModel(c->model), lm), c->steps, lm, bias_rule);
  if (bias_rule && !probe_set) c->probe_every = DefaultProbeEvery(c->steps);
  if (bias_rule && !reference_set) c->probe_reference = "bf16";
  resolved.probation_after = c->policy.probation_after;
  if (c->policy.rewarm_steps >= 0) resolved.rewarm_steps = c->policy.rewarm_steps;  // -1: the preset's
  if (c->policy.lr_fallbacks >= 0) {  // -1: the preset's; each fallback is one more intervention
    resolved.max_interventions += c->policy.lr_fallbacks - resolved.lr_fallbacks;
    resolved.lr_fallbacks = c->policy.lr_fallbacks;
  }
  resolved.sweep_rules = c->policy.sweep_rules;
  if (c->policy.snapshot_every > 0) resolved.snapshot_every = c->policy.snapshot_every;  // 0: the preset's
  if (c->policy.snapshot_keep > 0) resolved.snapshot_keep = c->policy.snapshot_keep;
  if (c->policy.rollback_steps > 0) {  // 0: the preset's 2 S
    resolved.rollback_steps = c->policy.rollback_steps;
    for (PolicyRule& rule : resolved.rules) {
      for (PolicyAction& a : rule.actions) {
        if (a.kind == PolicyAction::Kind::kRollback) a.steps = c->policy.rollback_steps;
      }
    }
    // Enough snapshots to reach that far back, unless the config chose how many.
    const int64_t reach = SnapshotsForRollback(c->policy.rollback_steps, resolved.snapshot_every);
    if (c->policy.snapshot_keep <= 0 && resolved.snapshot_keep < reach) resolved.snapshot_keep = static_cast<int>(reach);
  }
  resolved.snapshot_memory_mib = c->policy.snapshot_memory_mib;
  resolved.yaml = c->policy.yaml;
  c->policy = resolved;
}

// The node of the field a ValidateRunConfig failure names (Status::field():
// "model.heads" -> root.model.heads), or its nearest existing ancestor, or root.
YAML::Node FieldNode(const YAML::Node& root, const std::string& field) {
  if (field.empty()) return root;
  std::vector<std::string> keys;
  std::stringstream parts(field);
  for (std::string key; std::getline(parts, key, '.');) keys.push_back(key);
  YAML::Node node = root;
  for (const std::string& key : keys) {
    if (!node.IsMap()) break;
    YAML::Node next = node[key];
    if (!next) break;
    node = next;
  }
  return node;
}

Status ParseModel(const Reader& r, const YAML::Node& m, ModelConfig* mc) {
  KEEL_RETURN_IF_ERROR(r.CheckKeys(m, "model",
                                   {"type", "layers", "width", "heads", "context", "vocab",
                                    "padded_vocab", "mlp", "mlp_hidden", "qk_layernorm", "bias",
                                    "ln_eps"}));
  if (m["type"]) KEEL_RETURN_IF_ERROR(r.OneOf(m["type"], "model.type", {"proxy", "gpt", "llama", "gla"}, &mc->type));
  if (IsDecoderModel(*mc)) {
    // The llama and gla blocks are fixed: a key that would change them is an
    // error, not ignored.
    for (const char* key : {"mlp", "qk_layernorm", "bias"}) {
      if (m[key]) {
        return r.Error(m[key], std::string("model.") + key,
                       "'" + m[key].Scalar() + "' is not allowed with model.type " + mc->type +
                           " (always SwiGLU, no biases, no QK-LayerNorm; "
                           "allowed keys: type, layers, width, heads, context, vocab, padded_vocab, mlp_hidden, ln_eps)");
      }
    }
  }
  if (m["layers"]) KEEL_RETURN_IF_ERROR(r.Int(m["layers"], "model.layers", 1, 1024, &mc->layers));
  if (m["width"]) KEEL_RETURN_IF_ERROR(r.Int(m["width"], "model.width", 1, 1 << 16, &mc->width));
  if (m["heads"]) KEEL_RETURN_IF_ERROR(r.Int(m["heads"], "model.heads", 1, 1024, &mc->heads));
  if (m["context"]) KEEL_RETURN_IF_ERROR(r.Int(m["context"], "model.context", 1, 1 << 20, &mc->context));
  if (m["vocab"]) KEEL_RETURN_IF_ERROR(r.Int(m["vocab"], "model.vocab", 2, 65536, &mc->vocab));
  if (m["padded_vocab"]) {
    KEEL_RETURN_IF_ERROR(r.Int(m["padded_vocab"], "model.padded_vocab", 0, 1 << 20, &mc->padded_vocab));
  }
  if (m["mlp"]) KEEL_RETURN_IF_ERROR(r.OneOf(m["mlp"], "model.mlp", {"gelu", "swiglu"}, &mc->mlp));
  if (m["mlp_hidden"]) {
    KEEL_RETURN_IF_ERROR(r.Int(m["mlp_hidden"], "model.mlp_hidden", 0, 1 << 20, &mc->mlp_hidden));
  }
  if (m["qk_layernorm"]) KEEL_RETURN_IF_ERROR(r.Bool(m["qk_layernorm"], "model.qk_layernorm", &mc->qk_layernorm));
  if (m["bias"]) KEEL_RETURN_IF_ERROR(r.Bool(m["bias"], "model.bias", &mc->bias));
  if (m["ln_eps"]) KEEL_RETURN_IF_ERROR(r.Float(m["ln_eps"], "model.ln_eps", 1e-30, 1.0, &mc->ln_eps));
  return Status::Ok();
}

Status ParseData(const Reader& r, const YAML::Node& d, DataConfig* dc) {
  KEEL_RETURN_IF_ERROR(r.CheckKeys(d, "data", {"train", "val", "val_batches", "eval_every", "shuffle"}));
  if (d["shuffle"]) KEEL_RETURN_IF_ERROR(r.Bool(d["shuffle"], "data.shuffle", &dc->shuffle));
  if (d["train"]) KEEL_RETURN_IF_ERROR(r.String(d["train"], "data.train", &dc->train));
  if (d["val"]) KEEL_RETURN_IF_ERROR(r.String(d["val"], "data.val", &dc->val));
  if (d["val_batches"]) {
    KEEL_RETURN_IF_ERROR(r.Int(d["val_batches"], "data.val_batches", 1, 1 << 20, &dc->val_batches));
  }
  if (d["eval_every"]) {
    KEEL_RETURN_IF_ERROR(r.Int(d["eval_every"], "data.eval_every", 0, 1 << 30, &dc->eval_every));
  }
  return Status::Ok();
}

Status ParseOptimizer(const Reader& r, const YAML::Node& o, OptimizerConfig* oc) {
  KEEL_RETURN_IF_ERROR(r.CheckKeys(
      o, "optimizer", {"type", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "shard"}));
  if (o["type"]) KEEL_RETURN_IF_ERROR(r.OneOf(o["type"], "optimizer.type", {"adam", "adamw"}, &oc->type));
  if (o["lr"]) KEEL_RETURN_IF_ERROR(r.Float(o["lr"], "optimizer.lr", 0.0, 10.0, &oc->lr));
  if (o["beta1"]) KEEL_RETURN_IF_ERROR(r.Float(o["beta1"], "optimizer.beta1", 0.0, 0.999999, &oc->beta1));
  if (o["beta2"]) KEEL_RETURN_IF_ERROR(r.Float(o["beta2"], "optimizer.beta2", 0.0, 0.99999999, &oc->beta2));
  if (o["eps"]) KEEL_RETURN_IF_ERROR(r.Float(o["eps"], "optimizer.eps", 0.0, 1.0, &oc->eps));
  if (o["weight_decay"]) {
    KEEL_RETURN_IF_ERROR(r.Float(o["weight_decay"], "optimizer.weight_decay", 0.0, 10.0, &oc->weight_decay));
  }
  if (o["grad_clip"]) KEEL_RETURN_IF_ERROR(r.Float(o["grad_clip"], "optimizer.grad_clip", 0.0, 1e30, &oc->grad_clip));
  if (o["shard"]) KEEL_RETURN_IF_ERROR(r.Bool(o["shard"], "optimizer.shard", &oc->shard));
  if (oc->type == "adam" && oc->weight_decay != 0.0f) {
    return r.Error(o["weight_decay"], "optimizer.weight_decay",
                   r.Text(o["weight_decay"]) + " needs optimizer.type adamw (adam has no weight decay)");
  }
  return Status::Ok();
}

Status ParseSchedule(const Reader& r, const YAML::Node& s, ScheduleConfig* sc) {
  KEEL_RETURN_IF_ERROR(r.CheckKeys(s, "schedule", {"type", "warmup_steps", "min_lr_ratio", "spike_at", "spike_steps",
                                                  "spike_factor"}));
  if (s["spike_at"]) KEEL_RETURN_IF_ERROR(r.Int(s["spike_at"], "schedule.spike_at", 0, 1 << 30, &sc->spike_at));
  if (s["spike_steps"]) {
    KEEL_RETURN_IF_ERROR(r.Int(s["spike_steps"], "schedule.spike_steps", 1, 1 << 30, &sc->spike_steps));
  }
  if (s["spike_factor"]) {
    KEEL_RETURN_IF_ERROR(r.Float(s["spike_factor"], "schedule.spike_factor", 1e-6, 1e6, &sc->spike_factor));
  }
  if (s["type"]) {
    KEEL_RETURN_IF_ERROR(r.OneOf(s["type"], "schedule.type", {"constant", "cosine", "linear"}, &sc->type));
  }
  if (s["warmup_steps"]) {
    KEEL_RETURN_IF_ERROR(r.Int(s["warmup_steps"], "schedule.warmup_steps", 0, 1 << 30, &sc->warmup_steps));
  }
  if (s["min_lr_ratio"]) {
    KEEL_RETURN_IF_ERROR(r.Float(s["min_lr_ratio"], "schedule.min_lr_ratio", 0.0, 1.0, &sc->min_lr_ratio));
  }
  return Status::Ok();
}

// The top-level scalars: steps, batch, seq, grad_accum, seed, backend, threads,
// run_dir, checkpoint_every, keep_checkpoints, probe_every, operand_stats,
// analytics_every, log_every, check_every.
Status ParseRunFields(const Reader& r, const YAML::Node& root, RunConfig* c) {
  if (root["steps"]) KEEL_RETURN_IF_ERROR(r.Int(root["steps"], "steps", 1, int64_t(1) << 40, &c->steps));
  if (root["batch"]) KEEL_RETURN_IF_ERROR(r.Int(root["batch"], "batch", 1, 1 << 24, &c->batch));
  if (root["seq"]) KEEL_RETURN_IF_ERROR(r.Int(root["seq"], "seq", 0, 1 << 20, &c->seq));
  if (root["grad_accum"]) KEEL_RETURN_IF_ERROR(r.Int(root["grad_accum"], "grad_accum", 1, 1 << 16, &c->grad_accum));
  if (root["seed"]) {
    int64_t seed;
    KEEL_RETURN_IF_ERROR(r.Int(root["seed"], "seed", 0, INT64_MAX, &seed));
    c->seed = static_cast<uint64_t>(seed);
  }
  if (root["backend"]) KEEL_RETURN_IF_ERROR(r.OneOf(root["backend"], "backend", {"cpu", "cuda"}, &c->backend));
  if (root["threads"]) KEEL_RETURN_IF_ERROR(r.Int(root["threads"], "threads", 0, 1024, &c->threads));
  if (root["run_dir"]) KEEL_RETURN_IF_ERROR(r.String(root["run_dir"], "run_dir", &c->run_dir));
  if (root["checkpoint_every"]) {
    KEEL_RETURN_IF_ERROR(r.Int(root["checkpoint_every"], "checkpoint_every", 0, 1 << 30, &c->checkpoint_every));
  }
  if (root["keep_checkpoints"]) {
    KEEL_RETURN_IF_ERROR(r.Int(root["keep_checkpoints"], "keep_checkpoints", 0, 1 << 20, &c->keep_checkpoints));
  }
  if (root["probe_every"]) KEEL_RETURN_IF_ERROR(r.Int(root["probe_every"], "probe_every", 0, 1 << 30, &c->probe_every));
  if (root["probe_reference"]) {
    KEEL_RETURN_IF_ERROR(r.OneOf(root["probe_reference"], "probe_reference", {"fp32", "bf16"}, &c->probe_reference));
  }
  if (root["operand_stats"]) KEEL_RETURN_IF_ERROR(r.Bool(root["operand_stats"], "operand_stats", &c->operand_stats));
  if (root["analytics_every"]) {
    KEEL_RETURN_IF_ERROR(r.Int(root["analytics_every"], "analytics_every", 0, 1 << 30, &c->analytics_every));
  }
  if (root["log_every"]) KEEL_RETURN_IF_ERROR(r.Int(root["log_every"], "log_every", 1, 1 << 30, &c->log_every));
  if (root["check_every"]) KEEL_RETURN_IF_ERROR(r.Int(root["check_every"], "check_every", 0, 1 << 30, &c->check_every));
  return Status::Ok();
}

// An IP address or host name (IsHostAddress) for dist.listen_host /
// dist.advertise_host; the wildcards "0.0.0.0" and "::" only where listening.
Status HostField(const Reader& r, const YAML::Node& node, const std::string& field, bool wildcard_allowed,
                 std::string* out) {
  std::string v;
  KEEL_RETURN_IF_ERROR(r.String(node, field, &v));
  if (!IsHostAddress(v) || (IsWildcardAddress(v) && !wildcard_allowed)) {
    return r.Error(node, field,
                   "'" + v + "' is not allowed (allowed: an IP address or host name of " +
                       (wildcard_allowed ? "this machine, e.g. 127.0.0.1, or 0.0.0.0 / :: for every interface)"
                                         : "this machine that the other ranks reach, not a wildcard)"));
  }
  *out = v;
  return Status::Ok();
}

Status ParseAnalytics(const Reader& r, const YAML::Node& a, AnalyticsConfig* ac) {
  KEEL_RETURN_IF_ERROR(r.CheckKeys(a, "analytics", {"top_k", "maps_every"}));
  if (a["top_k"]) KEEL_RETURN_IF_ERROR(r.Int(a["top_k"], "analytics.top_k", 1, 1024, &ac->top_k));
  if (a["maps_every"]) KEEL_RETURN_IF_ERROR(r.Int(a["maps_every"], "analytics.maps_every", 0, 1 << 30, &ac->maps_every));
  return Status::Ok();
}

Status ParseDist(const Reader& r, const YAML::Node& d, DistConfig* dc) {
  KEEL_RETURN_IF_ERROR(r.CheckKeys(d, "dist", {"reduce", "timeout_s", "bucket_mb", "listen_host", "advertise_host"}));
  if (d["reduce"]) KEEL_RETURN_IF_ERROR(r.OneOf(d["reduce"], "dist.reduce", {"fp32", "bf16"}, &dc->reduce));
  if (d["timeout_s"]) KEEL_RETURN_IF_ERROR(r.Float(d["timeout_s"], "dist.timeout_s", 0.1, 86400.0, &dc->timeout_s));
  // 0: one reduction after the backward; else MiB per bucket, up to 64 GiB.
  if (d["bucket_mb"]) KEEL_RETURN_IF_ERROR(r.Float(d["bucket_mb"], "dist.bucket_mb", 0.0, 65536.0, &dc->bucket_mb));
  if (d["listen_host"]) KEEL_RETURN_IF_ERROR(HostField(r, d["listen_host"], "dist.listen_host", true, &dc->listen_host));
  if (d["advertise_host"]) {
    KEEL_RETURN_IF_ERROR(HostField(r, d["advertise_host"], "dist.advertise_host", false, &dc->advertise_host));
  }
  return Status::Ok();
}

// The defaults that depend on other fields: run_dir, seq, padded_vocab, mlp_hidden.
void ResolveDerivedFields(RunConfig* c) {
  if (c->run_dir.empty()) c->run_dir = "runs/" + c->name;
  if (c->seq == 0) c->seq = c->model.context;
  if (c->model.padded_vocab == 0) c->model.padded_vocab = (c->model.vocab + 127) / 128 * 128;
  if (IsDecoderModel(c->model)) {  // what the llama and gla blocks are (ParseModel refuses other values)
    c->model.mlp = "swiglu";
    c->model.bias = false;
    c->model.qk_layernorm = false;
  }
  if (c->model.mlp_hidden == 0) {
    c->model.mlp_hidden = c->model.mlp == "gelu" ? 4 * c->model.width
                                                 : (8 * c->model.width / 3 + 63) / 64 * 64;
  }
}

Status ParseNode(const Reader& r, const YAML::Node& root, RunConfig* out) {
  RunConfig c;
  if (!root.IsMap()) return r.Error(root, "config", "expected a mapping at the top level");
  KEEL_RETURN_IF_ERROR(r.CheckKeys(
      root, "",
      {"name", "model", "data", "precision", "optimizer", "schedule", "steps", "batch", "seq",
       "grad_accum", "seed", "backend", "threads", "run_dir", "checkpoint_every",
       "keep_checkpoints", "probe_every", "probe_reference", "operand_stats", "analytics_every", "analytics", "log_every",
       "check_every", "dist", "policy"}));
  if (root["name"]) {
    KEEL_RETURN_IF_ERROR(r.String(root["name"], "name", &c.name));
    // The default run directory is runs/<name>: "..", "/" or a leading '.'
    // would put it elsewhere.
    std::string problem = NameProblem(c.name);
    if (!problem.empty()) return r.Error(root["name"], "name", problem);
  }
  if (YAML::Node m = root["model"]) KEEL_RETURN_IF_ERROR(ParseModel(r, m, &c.model));
  if (YAML::Node d = root["data"]) KEEL_RETURN_IF_ERROR(ParseData(r, d, &c.data));
  if (root["precision"]) {
    KEEL_RETURN_IF_ERROR(ParsePrecision(r, root["precision"], &c.precision));
  } else {
    SchemeFromPreset("fp32", &c.precision);  // what its name says: fp32 attention too
  }
  if (YAML::Node o = root["optimizer"]) KEEL_RETURN_IF_ERROR(ParseOptimizer(r, o, &c.optimizer));
  if (YAML::Node s = root["schedule"]) KEEL_RETURN_IF_ERROR(ParseSchedule(r, s, &c.schedule));
  if (YAML::Node d = root["dist"]) KEEL_RETURN_IF_ERROR(ParseDist(r, d, &c.dist));
  if (YAML::Node a = root["analytics"]) KEEL_RETURN_IF_ERROR(ParseAnalytics(r, a, &c.analytics));
  KEEL_RETURN_IF_ERROR(ParseRunFields(r, root, &c));
  if (root["policy"]) KEEL_RETURN_IF_ERROR(ParsePolicy(r, root["policy"], &c.policy));
  ResolveDerivedFields(&c);
  ResolvePolicyPreset(&c, static_cast<bool>(root["probe_every"]), static_cast<bool>(root["probe_reference"]));
  Status st = ValidateRunConfig(c);
  if (!st.ok()) return Status::InvalidArgument(r.Where(FieldNode(root, st.field())) + st.message());
  *out = c;
  return Status::Ok();
}

}  // namespace

std::string NameProblem(const std::string& name) {
  const std::string allowed = std::string(" (allowed: ") + kNameRule + ")";
  if (name.empty()) return "an empty name is not allowed" + allowed;
  // Checked before anything looks at the characters, and never echoed whole.
  if (name.size() > kMaxNameLength) {
    return "a name of " + std::to_string(name.size()) + " characters is not allowed: too long" + allowed;
  }
  if (name.front() == '.') return "'" + name + "' is not allowed: it starts with '.'" + allowed;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(name[i]);
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    ch == '_' || ch == '.' || ch == '-';
    if (!ok) {
      char shown[16];
      if (ch > 0x20 && ch < 0x7F) {
        std::snprintf(shown, sizeof(shown), "'%c'", ch);
      } else {
        std::snprintf(shown, sizeof(shown), "byte 0x%02X", ch);
      }
      return "'" + name + "' is not allowed: " + shown + " at offset " + std::to_string(i) + allowed;
    }
  }
  return "";
}

namespace {

// Saturating int64 arithmetic for the parameter count: any overflow is a model
// far beyond every limit, so INT64_MAX is the right answer.
int64_t SatMul(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_mul_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}
int64_t SatAdd(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_add_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}

}  // namespace

int64_t ModelParameterCount(const ModelConfig& m) {
  const int64_t d = m.width, layers = m.layers;
  if (m.type == "proxy") {
    // Per block: ln weight and bias (d each), fc1 (4d x d), fc2 (d x 4d), fc2 bias (d).
    const int64_t block = SatAdd(SatMul(SatMul(8, d), d), SatMul(3, d));
    return SatMul(layers, block);
  }
  const int64_t hidden = m.mlp_hidden;
  if (m.type == "llama") {
    // As model_llama.cc's Build registers them: per block the attention RMSNorm
    // gain (d), q/k/v (3d x d), o_proj (d x d), the MLP RMSNorm gain (d), gate and
    // up (2h x d), down (d x h); the token embedding (tied head) and the final gain.
    int64_t block = SatMul(2, d);
    block = SatAdd(block, SatMul(SatMul(4, d), d));
    block = SatAdd(block, SatMul(SatMul(3, hidden), d));
    int64_t total = SatMul(m.padded_vocab, d);
    total = SatAdd(total, SatMul(layers, block));
    return SatAdd(total, d);
  }
  if (m.type == "gla") {
    // As model_gla.cc registers them: per block the two RMSNorm gains (2d), q, k,
    // v and g (3d x d: q and k d/2 rows each), the gate's low rank pair (16 x d,
    // then d/2 x 16 with a bias of d/2), the output norm's gain (d / heads, shared
    // by the heads), o_proj (d x d), gate and up (2h x d), down (d x h); the token
    // embedding (tied head) and the final gain.
    const int64_t dk = d / 2, dvh = m.heads > 0 ? d / m.heads : d;
    int64_t block = SatMul(2, d);
    block = SatAdd(block, SatMul(SatMul(4, d), d));
    block = SatAdd(block, SatAdd(SatMul(kGlaGateRank, d), SatMul(kGlaGateRank + 1, dk)));
    block = SatAdd(block, dvh);
    block = SatAdd(block, SatMul(SatMul(3, hidden), d));
    int64_t total = SatMul(m.padded_vocab, d);
    total = SatAdd(total, SatMul(layers, block));
    return SatAdd(total, d);
  }
  // gpt, as model_gpt.cc's Build registers them.
  const int64_t fc_out = m.mlp == "swiglu" ? SatMul(2, hidden) : hidden;
  const int64_t hd = m.heads > 0 ? d / m.heads : d;
  const int64_t b = m.bias ? 1 : 0;
  int64_t block = 0;
  block = SatAdd(block, SatMul(d, 1 + b));                      // ln_1
  block = SatAdd(block, SatAdd(SatMul(SatMul(3, d), d), SatMul(b, SatMul(3, d))));  // c_attn
  if (m.qk_layernorm) block = SatAdd(block, SatMul(SatMul(2, hd), 1 + b));          // q_ln, k_ln
  block = SatAdd(block, SatAdd(SatMul(d, d), SatMul(b, d)));   // attn c_proj
  block = SatAdd(block, SatMul(d, 1 + b));                      // ln_2
  block = SatAdd(block, SatAdd(SatMul(fc_out, d), SatMul(b, fc_out)));  // mlp c_fc
  block = SatAdd(block, SatAdd(SatMul(d, hidden), SatMul(b, d)));       // mlp c_proj
  int64_t total = SatAdd(SatMul(m.padded_vocab, d), SatMul(m.context, d));  // wte, wpe
  total = SatAdd(total, SatMul(layers, block));
  return SatAdd(total, SatMul(d, 1 + b));  // ln_f
}

namespace {

// The training state (kBytesPerParameter per parameter) fits kMaxTrainingStateBytes.
Status CheckTrainingStateFits(const ModelConfig& m) {
  const int64_t params = ModelParameterCount(m);
  const int64_t state = SatMul(params, kBytesPerParameter);
  if (state > kMaxTrainingStateBytes) {
    char gib[32];
    std::snprintf(gib, sizeof(gib), "%.1f", static_cast<double>(state) / static_cast<double>(int64_t{1} << 30));
    return Status::InvalidField("model.width", std::to_string(m.width) + " with model.layers " +
                         std::to_string(m.layers) + " (" + m.type + ") gives " + std::to_string(params) +
                         " parameters, a training state of " + gib + " GiB (" +
                         std::to_string(kBytesPerParameter) +
                         " bytes per parameter: fp32 weights, gradients, Adam m and v), more than the limit of " +
                         std::to_string(kMaxTrainingStateBytes >> 30) + " GiB (allowed: at most " +
                         std::to_string(kMaxTrainingStateBytes / kBytesPerParameter) + " parameters)");
  }
  return Status::Ok();
}

// A language model's data and shapes: token shards, heads dividing the width,
// seq within the context, a padded vocabulary no smaller than the vocabulary;
// llama: an even head size (RoPE turns pairs of features); gla: heads also
// divide the key width d/2.
Status CheckLanguageModelShapes(const RunConfig& c) {
  const ModelConfig& m = c.model;
  if (c.data.train.empty()) return Status::InvalidField("data.train", "missing (" + m.type + " needs token shards)");
  if (m.width % m.heads != 0) {
    return Status::InvalidField("model.heads", std::to_string(m.heads) + " does not divide model.width " +
                         std::to_string(m.width));
  }
  if (m.type == "llama" && (m.width / m.heads) % 2 != 0) {
    return Status::InvalidField("model.heads", std::to_string(m.heads) + " with model.width " + std::to_string(m.width) +
                                                   " gives head size " + std::to_string(m.width / m.heads) +
                                                   " (allowed: an even head size, which RoPE needs)");
  }
  if (m.type == "gla" && (m.width % 2 != 0 || (m.width / 2) % m.heads != 0)) {
    return Status::InvalidField("model.heads", std::to_string(m.heads) + " with model.width " + std::to_string(m.width) +
                                                   " (allowed with model.type gla: an even width whose half, the key "
                                                   "width, model.heads divides)");
  }
  if (c.seq > m.context) {
    return Status::InvalidField("seq", std::to_string(c.seq) + " is larger than model.context " +
                         std::to_string(m.context));
  }
  if (m.padded_vocab < m.vocab) {
    return Status::InvalidField("model.padded_vocab", std::to_string(m.padded_vocab) +
                         " is smaller than model.vocab " + std::to_string(m.vocab));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateRunConfig(const RunConfig& c) {
  const ModelConfig& m = c.model;
  KEEL_RETURN_IF_ERROR(CheckTrainingStateFits(m));
  if (IsLanguageModel(m)) KEEL_RETURN_IF_ERROR(CheckLanguageModelShapes(c));
  if (c.probe_every < 0) return Status::InvalidField("probe_every", "must be >= 0");
  if (c.analytics_every < 0) {
    return Status::InvalidField("analytics_every", std::to_string(c.analytics_every) + " is not allowed (allowed: 0 (off) or a period >= 1)");
  }
  if (c.analytics.top_k < 1 || c.analytics.top_k > 1024) {
    return Status::InvalidField("analytics.top_k", std::to_string(c.analytics.top_k) + " is not allowed (allowed: 1 .. 1024)");
  }
  if (c.analytics.maps_every < 0 ||
      (c.analytics.maps_every > 0 && (c.analytics_every == 0 || c.analytics.maps_every % c.analytics_every != 0))) {
    return Status::InvalidField(
        "analytics.maps_every",
        std::to_string(c.analytics.maps_every) + " is not allowed with analytics_every " + std::to_string(c.analytics_every) +
            " (allowed: 0 (no maps) or a multiple of analytics_every, which must be > 0: maps are drawn on analytics steps)");
  }
  // RHT rotates 16-token chunks of the wgrad operands, so a micro-batch's rows
  // (tokens) must come in multiples of 16.
  const int64_t rows = IsLanguageModel(m) ? static_cast<int64_t>(c.batch) * c.seq : c.batch;
  if (c.precision.roles[static_cast<int>(Role::kWgradX)].rht && rows % 16 != 0) {
    return Status::InvalidField("batch", std::to_string(rows) + (IsLanguageModel(m) ? " tokens (batch x seq)" : " samples") +
                         " per micro-batch is not allowed with RHT on the wgrad operands (a multiple of 16)");
  }
  if (c.precision.post_qk_bf16 && m.type != "llama" && m.type != "gla") {
    return Status::InvalidField("precision.post_qk_bf16",
                                "true is not allowed with model.type " + m.type +
                                    " (allowed with llama, whose W_v it keeps in BF16, and gla, whose gk_proj and "
                                    "o_proj it keeps in BF16)");
  }
  // A preset the policy may switch to must run on this model too.
  if (m.type != "llama" && m.type != "gla") {
    std::vector<std::pair<std::string, std::string>> targets;  // field, preset
    for (const std::string& rung : c.policy.ladder) targets.push_back({"policy.ladder", rung});
    for (const PolicyRule& rule : c.policy.rules) {
      for (const PolicyAction& a : rule.actions) {
        if (a.kind == PolicyAction::Kind::kSwitch && a.scheme != "next") {
          targets.push_back({"policy.rules." + rule.name, a.scheme});
        }
      }
    }
    for (const auto& [field, preset] : targets) {
      PrecisionScheme s;
      if (SchemeForRung(preset, c.precision, &s).ok() && s.post_qk_bf16) {
        return Status::InvalidField(field, "'" + preset + "' is not allowed with model.type " + m.type +
                                               " (it sets post_qk_bf16, which needs llama or gla; nvfp4_hcp is the "
                                               "same without it)");
      }
    }
  }
  if (c.precision.hcp_wgrad_rows > rows) {
    return Status::InvalidField("precision.hcp.wgrad_rows",
                                std::to_string(c.precision.hcp_wgrad_rows) + " is not allowed with " +
                                    std::to_string(rows) + " rows per micro-batch (allowed: 0 .. " +
                                    std::to_string(rows) + ")");
  }
  return ValidateScheme(c.precision);
}

namespace {

// A one-line message: echoed values (names, keys) may hold newlines.
Status OneLineStatus(const Status& s) { return s.WithMessage(OneLine(s.message())); }

Status ParseRunConfigText(const std::string& yaml_text, const std::string& source,
                          const std::vector<std::string>& overrides, RunConfig* out) {
  Reader r(source);
  YAML::Node root;
  KEEL_RETURN_IF_ERROR(LoadYamlStrict(yaml_text, source, &root));
  try {
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    for (const std::string& o : overrides) KEEL_RETURN_IF_ERROR(ApplyOverride(root, o));
    return ParseNode(r, root, out);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(YamlWhere(source, e.mark) + "config: " + (e.msg.empty() ? "unreadable value" : e.msg));
  }
}

}  // namespace

Status ParseRunConfig(const std::string& yaml_text, const std::string& source,
                      const std::vector<std::string>& overrides, RunConfig* out) {
  return OneLineStatus(ParseRunConfigText(yaml_text, source, overrides, out));
}

Status ParsePolicyNode(const YAML::Node& node, const std::string& source, Policy* out) {
  Reader r(source);
  try {
    return OneLineStatus(ParsePolicy(r, node, out));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(YamlWhere(source, e.mark) + "policy: " + (e.msg.empty() ? "unreadable value" : e.msg));
  }
}

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     RunConfig* out) {
  std::string text;
  Status read = ReadYamlFile(path, &text);
  // A file too large already reads "path:1:1: size: ..." (InvalidArgument); only
  // say which flag for a file that could not be read at all.
  if (!read.ok() && read.code() != StatusCode::kInvalidArgument) return read.WithPrefix("--config: ");
  KEEL_RETURN_IF_ERROR(read);
  return ParseRunConfig(text, path, overrides, out);
}

std::string SchemeToYaml(const PrecisionScheme& s) {
  // Every role and option spelled out, so the text alone rebuilds the scheme.
  YAML::Emitter e;
  e << YAML::Flow << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << s.name;
  auto fmt = [&](const char* key, const OperandFormat& f) {
    e << YAML::Key << key << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "format" << YAML::Value << OperandFormatName(f);
    e << YAML::Key << "rounding" << YAML::Value << RoundingName(f.rounding);
    e << YAML::Key << "mx_block" << YAML::Value << f.mx_block;
    e << YAML::Key << "bump_exponent" << YAML::Value << f.bump_exponent;
    e << YAML::Key << "tile_16x16" << YAML::Value << f.tile_16x16;
    e << YAML::Key << "rht" << YAML::Value << f.rht;
    e << YAML::EndMap;
  };
  for (int i = 0; i < kRoleCount; ++i) fmt(RoleName(static_cast<Role>(i)), s.roles[i]);
  fmt("layernorm", s.layernorm);
  e << YAML::Key << "forward_only" << YAML::Value << s.forward_only;
  e << YAML::Key << "bf16_first_blocks" << YAML::Value << s.bf16_first_blocks;
  e << YAML::Key << "bf16_last_blocks" << YAML::Value << s.bf16_last_blocks;
  e << YAML::Key << "bf16_head" << YAML::Value << s.bf16_head;
  e << YAML::Key << "attention_bf16" << YAML::Value << s.attention_bf16;
  e << YAML::Key << "post_qk_bf16" << YAML::Value << s.post_qk_bf16;
  e << YAML::Key << "hcp_channels" << YAML::Value << s.hcp_channels;
  e << YAML::Key << "hcp_every" << YAML::Value << s.hcp_every;
  e << YAML::Key << "hcp_dgrad" << YAML::Value << s.hcp_dgrad;
  e << YAML::Key << "hcp_wgrad_rows" << YAML::Value << s.hcp_wgrad_rows;
  e << YAML::EndMap;
  return e.c_str();
}

Status ParseSchemeYaml(const std::string& yaml_text, PrecisionScheme* out) {
  try {
    YAML::Node n = YAML::Load(yaml_text);
    PrecisionScheme s;
    s.name = n["name"].as<std::string>();
    auto fmt = [&](const char* key, OperandFormat* f) -> Status {
      YAML::Node m = n[key];
      KEEL_RETURN_IF_ERROR(ParseOperandFormat(key, m["format"].as<std::string>(), f));
      if (!ParseRounding(m["rounding"].as<std::string>(), &f->rounding)) {
        return Status::InvalidArgument(std::string(key) + ".rounding: unknown value");
      }
      f->mx_block = m["mx_block"].as<int>();
      f->bump_exponent = m["bump_exponent"].as<bool>();
      f->tile_16x16 = m["tile_16x16"].as<bool>();
      f->rht = m["rht"].as<bool>();
      return Status::Ok();
    };
    for (int i = 0; i < kRoleCount; ++i) KEEL_RETURN_IF_ERROR(fmt(RoleName(static_cast<Role>(i)), &s.roles[i]));
    KEEL_RETURN_IF_ERROR(fmt("layernorm", &s.layernorm));
    s.forward_only = n["forward_only"].as<bool>();
    s.bf16_first_blocks = n["bf16_first_blocks"].as<int>();
    s.bf16_last_blocks = n["bf16_last_blocks"].as<int>();
    s.bf16_head = n["bf16_head"].as<bool>();
    s.attention_bf16 = n["attention_bf16"].as<bool>();
    // Absent from schemes stored before it existed: off.
    if (n["post_qk_bf16"]) s.post_qk_bf16 = n["post_qk_bf16"].as<bool>();
    if (n["hcp_channels"]) s.hcp_channels = n["hcp_channels"].as<int>();
    if (n["hcp_every"]) s.hcp_every = n["hcp_every"].as<int>();
    if (n["hcp_dgrad"]) s.hcp_dgrad = n["hcp_dgrad"].as<bool>();
    if (n["hcp_wgrad_rows"]) s.hcp_wgrad_rows = n["hcp_wgrad_rows"].as<int>();
    KEEL_RETURN_IF_ERROR(ValidateScheme(s));
    *out = s;
    return Status::Ok();
  } catch (const YAML::Exception& e) {
    return Status::Error(std::string("stored precision scheme: ") + e.what());
  }
}

}  // namespace keel
