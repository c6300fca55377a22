// The names of Keel's numeric formats: what a precision scheme says about an
// operand, without the arithmetic. keeld and the CLI validate run configs
// against these types, so they live here, apart from the quantizers and the
// kernels (kernels/formats.h, kernels/quantize.h, kernels/nn.h), which include
// this header and give the words their meaning (docs/numerics.md).
#ifndef KEEL_KERNELS_BASE_NUMERIC_TYPES_H_
#define KEEL_KERNELS_BASE_NUMERIC_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace keel {

// Element formats (docs/numerics.md, "Element formats").
enum class ElemFormat { kE4M3, kE5M2, kE3M2, kE2M3, kE2M1 };

// Rounding of a value to a grid point.
//   kNearestEven: ties to even (what hardware conversions do)
//   kNearestAway: ties away from zero (the MX reference library's "nearest")
//   kStochastic:  round away from zero with probability equal to the fraction;
//                 the caller supplies the uniform u in [0, 1)
enum class Rounding { kNearestEven, kNearestAway, kStochastic };

// Parses "nearest_even" | "nearest_away" | "stochastic".
bool ParseRounding(const std::string& text, Rounding* out);
const char* RoundingName(Rounding rounding);
// Every rounding's name, in enum order (what configs may say).
std::vector<std::string> RoundingNames();

// The quantization formats keel-quant and precision schemes name.
enum class QuantFormat {
  kMxfp8E4M3, kMxfp8E5M2, kMxfp6E3M2, kMxfp6E2M3, kMxfp4, kNvfp4, kFp8E4M3, kFp8E5M2, kBf16,
};

// "mxfp8_e4m3" ... "bf16". Returns false for an unknown name.
bool ParseQuantFormat(const std::string& text, QuantFormat* out);
const char* QuantFormatName(QuantFormat format);
// Comma-separated list of every accepted name, for error messages and --help.
std::string QuantFormatNames();
bool IsMx(QuantFormat format);
// The element format of an MX or per-tensor FP8 format (E2M1 for nvfp4).
ElemFormat ElementOf(QuantFormat format);

// How one GEMM operand is rounded before the product (one role of a precision
// scheme: docs/numerics.md, "Precision schemes"). kind == kFp32 leaves the
// operand untouched.
// The largest MX block the quantizers take (a block's scale and elements are
// held per thread block); run configs are refused above it, not at the first GEMM.
constexpr int kMaxMxBlock = 4096;

struct OperandFormat {
  enum class Kind { kFp32, kQuant };
  Kind kind = Kind::kFp32;
  QuantFormat format = QuantFormat::kBf16;   // when kind == kQuant
  Rounding rounding = Rounding::kNearestEven;
  int mx_block = 32;                         // MX formats
  bool bump_exponent = false;                // MX: the instability paper's fix
  bool tile_16x16 = false;                   // NVFP4: one amax per 16x16 tile
  bool rht = false;                          // NVFP4: random Hadamard transform first

  bool quantized() const { return kind == Kind::kQuant; }
};

// The six operand roles of a quantized linear layer, in this order everywhere
// (metrics labels use these names).
enum class Role { kFwdX, kFwdW, kDgradDy, kDgradW, kWgradDy, kWgradX };
constexpr int kRoleCount = 6;
const char* RoleName(Role role);  // "fwd_x", "fwd_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x"

// The per-role seed the kernels use: a fixed 64-bit mix of (seed, role).
uint64_t RoleSeed(uint64_t seed, Role role);

// Hot-Channel Patch of one GEMM (docs/hcp.md): the contraction indices (hot
// channels) whose quantization residuals the GEMM adds back as extra K
// columns. index: backend memory, `count` distinct values in [0, K),
// ascending; count 0: no patch.
// choose_into (backend memory, count int32, or null): the call first chooses
// the set from the operands it has (the `count` highest HcpScores of this GEMM,
// in HcpTopK's order), writes it there and patches with it; index is then not
// read. The models choose this way every R steps and pass index in between.
struct HotChannels {
  const int32_t* index = nullptr;
  int32_t count = 0;
  int32_t* choose_into = nullptr;
};

// Formats of one linear layer's six roles plus what the kernels need to draw
// stochastic-rounding bits and to record statistics.
struct LinearQuant {
  OperandFormat role[kRoleCount];
  // Stochastic rounding of role r in this call uses seed RoleSeed(seed, r): the
  // model passes a seed unique to (run seed, step, micro-step, layer, pass).
  uint64_t seed = 0;
  // Statistics slot (0 .. stats_slots-1 of ResetOperandStats) whose six role
  // counters this call adds to; -1 records nothing.
  int stats_slot = -1;
  // Outlier analytics slot (kernels/outliers.h; 0 .. slots-1 of
  // Backend::BeginOutlierAnalytics) whose sums this call adds to while
  // analytics are armed; -1 analyzes nothing. Models pass the layer's slot
  // always: it is read only on the steps the trainer arms.
  int analytics_slot = -1;
  // Hot-Channel Patch (docs/hcp.md): the forward GEMM's hot input channels
  // (K = in) and the dgrad GEMM's hot output channels (K = out). The wgrad
  // GEMM (K = rows, tokens) patches its hcp_wgrad_rows highest-scoring rows,
  // chosen afresh in each call (0: none).
  // Forward operands kept for the backward (the CUDA backend; the CPU ignores
  // it). With keep_slot >= 0, LinearForward keeps its rounded x and w under
  // that key when the forward role and the backward role that read the same
  // tensor (fwd_x / wgrad_x, fwd_w / dgrad_w) are the same deterministic BF16
  // rounding and both GEMMs run in BF16; LinearBackward with the same key,
  // pointers and shape then uses them instead of rounding x and w again (the
  // same bits, the same statistics). The caller promises that x and w are not
  // written between the two calls; models pass one key per linear layer.
  int keep_slot = -1;
  // dy already rounded to bf16 (nearest even) by its producer
  // (Backend::CrossEntropyFusedBf16): rows x out bf16 bits, rows dy_bf16_ld
  // elements apart, in backend memory. LinearBackward then reads dy from here,
  // not from its dy argument, and needs all four backward roles quantized, both
  // dy roles BF16 nearest even (TakesBf16Dy) and dbias null; statistics and
  // analytics see dy's values as a rounding of dy would have given them.
  const uint16_t* dy_bf16 = nullptr;
  int64_t dy_bf16_ld = 0;
  // x already rounded to bf16 (nearest even) by its producer
  // (Backend::LayerNormForwardBf16, Backend::GeluForwardBf16): rows x in bf16
  // bits, rows x_bf16_ld elements apart, in backend memory. LinearForward and
  // LinearBackward then read x from here for fwd_x and wgrad_x, not from their
  // x argument, and need those two roles BF16 nearest even with fwd_w and
  // wgrad_dy quantized (TakesBf16X: both GEMMs that read x run in BF16) and no
  // Hot-Channel Patch of the forward; statistics and analytics see x's values
  // as the rounding would have given them. Nothing else in the call changes.
  const uint16_t* x_bf16 = nullptr;
  int64_t x_bf16_ld = 0;
  HotChannels hcp_fwd;
  HotChannels hcp_dgrad;
  int32_t hcp_wgrad_rows = 0;
};

}  // namespace keel

#endif  // KEEL_KERNELS_BASE_NUMERIC_TYPES_H_
