// Precision schemes: how a run rounds every GEMM operand, its layernorm affine
// parameters and its attention products (docs/numerics.md, "Precision schemes";
// the roles: docs/numerics.md, "Operand roles and axes"). This header is the one
// definition of a scheme and of the named presets; run configs (run_config.h),
// the CLI and the wire form (scheme_proto.h) all go through it.
//
// A preset name means the same format in every role unless the name says
// otherwise; any field can then be overridden in a config.
#ifndef KEEL_WORKER_CONFIG_SCHEME_H_
#define KEEL_WORKER_CONFIG_SCHEME_H_

#include <string>
#include <vector>

#include "kernels/base/numeric_types.h"
#include "kernels/base/status.h"

namespace keel {

// The most hot channels (or wgrad tokens) a Hot-Channel Patch may take.
constexpr int kMaxHcpChannels = 4096;

struct PrecisionScheme {
  std::string name = "fp32";          // the preset it came from, or "custom"
  // Format of each linear-layer operand role, indexed by Role.
  OperandFormat roles[kRoleCount];
  // Layernorm math is always fp32; its affine parameters (gamma, beta) are used
  // as stored (kind kFp32), rounded to bf16, or quantized to a format (along the
  // feature axis, straight-through gradient).
  OperandFormat layernorm;
  // Forward-only quantization: the backward GEMMs use the unquantized operands.
  bool forward_only = false;
  // Blocks kept in BF16 (every role bf16): the first N and the last M transformer
  // or residual blocks, and the LM head (gpt only).
  int bf16_first_blocks = 0;
  int bf16_last_blocks = 0;
  bool bf16_head = false;
  // Attention's two batched products (q.k and probs.v): bf16 operands with fp32
  // accumulation, or fp32 throughout.
  bool attention_bf16 = true;
  // CHON's post-QK protection (docs/numerics.md, "Post-QK protection"): the
  // linear layers after the query-key product kept in BF16 (every role), by
  // model: softmax attention (llama) its W_v, the v part of attn.qkv; gated
  // linear attention (gla) its gk_proj (both) and o_proj. Other models refuse it.
  bool post_qk_bf16 = false;
  // CHON's Hot-Channel Patch (docs/hcp.md) on every linear layer with a role
  // below BF16: the forward GEMM's hcp_channels hot input channels (and, with
  // hcp_dgrad, the dgrad GEMM's hot output channels), chosen afresh every
  // hcp_every steps and held in between (and in checkpoints); hcp_wgrad_rows
  // tokens of each wgrad GEMM, chosen in each call. A layer whose contraction
  // is narrower than hcp_channels patches all of it. 0 channels: no patch.
  int hcp_channels = 0;
  int hcp_every = 100;
  bool hcp_dgrad = false;
  int hcp_wgrad_rows = 0;

  // The formats a linear layer of block `block` (of `blocks`; -1 for the head)
  // uses under this scheme: forward_only and the BF16 layers applied. post_qk:
  // the layer follows the query-key product, and post_qk_bf16 keeps it BF16 too.
  LinearQuant LinearFor(int block, int blocks, bool post_qk = false) const;
  // True when any role or the layernorm is quantized below fp32.
  bool AnyQuantized() const;
};

// Checks a scheme's internal consistency (RHT on both wgrad roles or neither,
// NVFP4 rounding nearest_even or stochastic, MX block size, non-negative layer
// counts). Messages name the field and value.
Status ValidateScheme(const PrecisionScheme& scheme);

// Named presets: fp32, bf16, mxfp8_e4m3, mxfp8_e5m2, mxfp8_e4m3_bwd_e5m2,
// mxfp6_e2m3, mxfp6_e3m2, mxfp4, nvfp4, nvfp4_recipe, nvfp4_hcp, chon,
// mx_w_e4m3_a_bf16, mxfp8_e4m3_fwd_only.
struct PresetInfo {
  std::string name;
  std::string summary;  // one line for `keel-train presets`
};
const std::vector<PresetInfo>& Presets();
std::string PresetNames();  // comma-separated, for error messages
Status SchemeFromPreset(const std::string& name, PrecisionScheme* out);

// The ladder `policy: default` climbs from `start` (docs/train.md has the table
// for every preset): start.name first, then presets of strictly more precision,
// always ending at fp32. The rung above a scheme follows from its narrowest
// operand format (forward_only's backward roles count as fp32):
//   4-bit MX (mxfp4)   -> mxfp6_e2m3 -> mxfp8_e4m3 -> mx_w_e4m3_a_bf16 -> bf16 -> fp32
//   4-bit NVFP4        -> nvfp4_recipe (unless it already rotates its wgrad
//                         operands) -> chon (post_qk_model; else nvfp4_hcp),
//                         unless the start patches already -> mxfp8_e4m3 -> ...
//   6-bit              -> mxfp8_e4m3 -> ...
//   8-bit              -> mx_w_e4m3_a_bf16 -> ...
//   8-bit weights only, the rest bf16 or wider ("mixed") -> bf16 -> fp32
//   bf16               -> fp32
// post_qk_model: the run's model takes post_qk_bf16 (llama, gla), so that
// the chon rung can run on it.
// language_model (gpt, llama, gla): when the start rounds its head (the tied
// embedding's logits GEMM) to 8 bits or fewer, the first rung above it is the
// start with the head in BF16 ("<start>+bf16_head"); and every rung above the
// start that would round the head keeps it in BF16 ("mxfp8_e4m3+bf16_head").
// Session 32's GPT runs (docs/reproductions/policy-grid.md): the MX head alone
// biased the gradient and stalled the loss at 1.2-1.9x bf16's.
std::vector<std::string> RescueLadder(const PrecisionScheme& start, bool post_qk_model = true,
                                      bool language_model = false);

// Whether a language model's head (the roles' formats, unless bf16_head; a
// forward_only scheme's backward roles do not count) is rounded to 8 bits or
// fewer: where RescueLadder puts the "+bf16_head" rung, and where policy:
// default's bias rule applies.
bool RoundsHeadBelowBf16(const PrecisionScheme& s);

// A rung's name: a preset, or the run's own scheme by its name, optionally
// followed by kBf16HeadRung ("mxfp4+bf16_head": that scheme with bf16_head).
constexpr char kBf16HeadRung[] = "+bf16_head";
// The scheme a rung names; `own` is the run's starting scheme (a rung named
// like it is it, custom or not). An unknown name is refused, naming `field`.
Status SchemeForRung(const std::string& rung, const PrecisionScheme& own, PrecisionScheme* out,
                     const std::string& field = "policy.ladder");
// A scheme as a config or a flag names it: a preset, optionally followed by
// kBf16HeadRung (SchemeForRung without a run's own scheme).
Status SchemeFromName(const std::string& name, PrecisionScheme* out, const std::string& field = "precision");

// Operand formats as written in configs: "fp32", "bf16", or a QuantFormat name
// (mxfp8_e4m3 ... nvfp4, fp8_e4m3, fp8_e5m2).
Status ParseOperandFormat(const std::string& field, const std::string& text, OperandFormat* out);
std::string OperandFormatName(const OperandFormat& format);
std::string OperandFormatNames();

// One line per role plus the options, for `keel-train presets` and run logs.
std::string DescribeScheme(const PrecisionScheme& scheme);

}  // namespace keel

#endif  // KEEL_WORKER_CONFIG_SCHEME_H_
