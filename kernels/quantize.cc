// CPU reference quantizers: MX block scaling, NVFP4, per-tensor FP8 and BF16.
// Loops are plain and follow the numbered steps of the doc
// (docs/numerics.md, "MX block scaling" and "NVFP4"); speed is the CUDA kernels'
// business.
#include "kernels/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "kernels/philox.h"

namespace keel {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// A matrix seen as `lines` lines of `length` elements along the quantization
// axis: axis 1 walks rows, axis 0 walks columns.
struct AxisView {
  int64_t rows, cols;
  int axis;
  int64_t lines() const { return axis == 1 ? rows : cols; }
  int64_t length() const { return axis == 1 ? cols : rows; }
  // Row-major index in x of element k of line `line`.
  int64_t Index(int64_t line, int64_t k) const {
    return axis == 1 ? line * cols + k : k * cols + line;
  }
  // Index of block `block` of line `line` in the scale array (quantize.h layout).
  int64_t ScaleIndex(int64_t line, int64_t block, int64_t blocks_per_line) const {
    return axis == 1 ? line * blocks_per_line + block : block * cols + line;
  }
};

// NaN-propagating min, as torch.min behaves (std::fmin would drop the NaN).
float MinKeepNan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return kNan;
  return a < b ? a : b;
}

// Element rounding for the block quantizers. An exact zero (+0 or -0) becomes +0,
// as in both references: microxcaling computes sign(w) * round(|w|) and
// torch.sign(-0.0) is +0; TransformerEngine's E2M1 cast sends x >= 0.0, which
// -0.0 satisfies, to code 0. A nonzero value that rounds to zero keeps its sign.
float ZeroOrRound(float w, ElemFormat elem, Rounding rounding, float u) {
  return w == 0.0f ? 0.0f : RoundToElem(w, elem, rounding, u);
}

float Uniform(Rounding rounding, uint64_t seed, int64_t index) {
  return rounding == Rounding::kStochastic ? PhiloxUniform(seed, static_cast<uint64_t>(index))
                                           : 0.0f;
}

Status CheckShape(int64_t rows, int64_t cols) {
  if (rows < 1) return Status::Error("rows: " + std::to_string(rows) + " is not allowed; need >= 1");
  if (cols < 1) return Status::Error("cols: " + std::to_string(cols) + " is not allowed; need >= 1");
  if (rows > (int64_t{1} << 40) / cols)
    return Status::Error("rows x cols: " + std::to_string(rows) + " x " + std::to_string(cols) +
                         " is too large; need at most 2^40 elements");
  return Status::Ok();
}

Status CheckAxis(int axis) {
  if (axis != 0 && axis != 1)
    return Status::Error("axis: " + std::to_string(axis) + " is not allowed; use 1 (along rows) or 0 (down columns)");
  return Status::Ok();
}

}  // namespace

MxOptions MxOptionsOf(const OperandFormat& format, int axis, uint64_t seed) {
  MxOptions options;
  options.elem = ElementOf(format.format);
  options.block = format.mx_block;
  options.axis = axis;
  options.rounding = format.rounding;
  options.seed = seed;
  options.bump_exponent = format.bump_exponent;
  return options;
}

Nvfp4Options Nvfp4OptionsOf(const OperandFormat& format, int axis, uint64_t seed) {
  Nvfp4Options options;
  options.tile_16x16 = format.tile_16x16;
  options.rht = format.rht;
  options.axis = axis;
  options.rounding = format.rounding;
  options.seed = seed;
  return options;
}

int64_t MxScaleCount(int64_t rows, int64_t cols, int block, int axis) {
  AxisView view{rows, cols, axis};
  return view.lines() * ((view.length() + block - 1) / block);
}

Status ValidateMx(int64_t rows, int64_t cols, const MxOptions& options) {
  Status status = CheckShape(rows, cols);
  if (!status.ok()) return status;
  status = CheckAxis(options.axis);
  if (!status.ok()) return status;
  if (options.block < 1 || options.block > kMaxMxBlock)
    return Status::Error("block: " + std::to_string(options.block) + " is not allowed; need 1.." +
                         std::to_string(kMaxMxBlock));
  return Status::Ok();
}

Status ValidateNvfp4(int64_t rows, int64_t cols, const Nvfp4Options& options) {
  Status status = CheckShape(rows, cols);
  if (!status.ok()) return status;
  status = CheckAxis(options.axis);
  if (!status.ok()) return status;
  if (options.rounding == Rounding::kNearestAway)
    return Status::Error("rounding: nearest_away is not allowed for nvfp4; use nearest_even or stochastic");
  AxisView view{rows, cols, options.axis};
  const char* along = options.axis == 1 ? "cols" : "rows";
  if (view.length() % 16 != 0)
    return Status::Error(std::string(along) + ": " + std::to_string(view.length()) +
                         " is not a multiple of 16; nvfp4 blocks of 16 along axis " +
                         std::to_string(options.axis) + " must divide it");
  if (options.tile_16x16 && view.lines() % 16 != 0)
    return Status::Error(std::string(options.axis == 1 ? "rows" : "cols") + ": " +
                         std::to_string(view.lines()) +
                         " is not a multiple of 16; the 16x16 tile must divide the shape");
  return Status::Ok();
}

Status MxQuantizeRef(const float* x, int64_t rows, int64_t cols, const MxOptions& options,
                     float* out, uint8_t* codes, uint8_t* scales) {
  Status status = ValidateMx(rows, cols, options);
  if (!status.ok()) return status;
  const ElemSpec& spec = Spec(options.elem);
  // The largest element significand (1.75 for E4M3): above it the floor rule clips.
  const float largest_significand = std::ldexp(spec.max_normal, -spec.emax);
  AxisView view{rows, cols, options.axis};
  const int64_t blocks_per_line = (view.length() + options.block - 1) / options.block;

  for (int64_t line = 0; line < view.lines(); ++line) {
    for (int64_t block = 0; block < blocks_per_line; ++block) {
      const int64_t begin = block * options.block;
      const int64_t end = std::min<int64_t>(begin + options.block, view.length());
      // Padding elements beyond `end` would be zeros: they change neither amax nor
      // any real element, so the loops simply stop at `end`.

      // Step 1: a NaN or Inf anywhere makes the whole block NaN.
      bool special = false;
      float amax = 0.0f;
      for (int64_t k = begin; k < end; ++k) {
        float v = x[view.Index(line, k)];
        if (!std::isfinite(v)) special = true;
        else amax = std::max(amax, std::fabs(v));
      }
      // Step 2: an all-zero block takes amax = 2^-126.
      if (amax == 0.0f) amax = 0x1p-126f;
      // Step 3: the exact binary exponent of amax, minus the element's emax.
      int amax_exp = 0;
      float significand = 2.0f * std::frexp(amax, &amax_exp);  // amax = significand * 2^(amax_exp-1)
      int e = (amax_exp - 1) - spec.emax;
      if (options.bump_exponent && significand > largest_significand) e += 1;
      // Step 4: out of range above is NaN; below, clamp to the smallest scale.
      if (e > 127) special = true;
      if (e < -127) e = -127;

      if (scales != nullptr)
        scales[view.ScaleIndex(line, block, blocks_per_line)] = special ? kE8M0Nan : EncodeE8M0(e);
      for (int64_t k = begin; k < end; ++k) {
        int64_t index = view.Index(line, k);
        if (special) {
          if (out != nullptr) out[index] = kNan;
          if (codes != nullptr) codes[index] = EncodeElem(kNan, options.elem);
          continue;
        }
        // Step 5: scale, round to the element grid (then saturate), scale back.
        float w = std::ldexp(x[index], -e);
        float r = ZeroOrRound(w, options.elem, options.rounding,
                              Uniform(options.rounding, options.seed, index));
        if (out != nullptr) out[index] = std::ldexp(r, e);
        if (codes != nullptr) codes[index] = EncodeElem(r, options.elem);
      }
    }
  }
  return Status::Ok();
}

void RhtRef(const float* x, int64_t rows, int64_t cols, int axis, float* y) {
  static const float kSigns[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  AxisView view{rows, cols, axis};
  for (int64_t line = 0; line < view.lines(); ++line) {
    for (int64_t chunk = 0; chunk + 16 <= view.length(); chunk += 16) {
      float in[16];
      for (int i = 0; i < 16; ++i) in[i] = x[view.Index(line, chunk + i)];
      for (int j = 0; j < 16; ++j) {
        float sum = 0.0f;
        for (int i = 0; i < 16; ++i) {
          // Sylvester H16: entry (i, j) is (-1)^popcount(i & j).
          float hadamard = (__builtin_popcount(i & j) & 1) ? -1.0f : 1.0f;
          sum += in[i] * (kSigns[i] * hadamard * 0.25f);
        }
        y[view.Index(line, chunk + j)] = sum;
      }
    }
  }
}

Status Nvfp4QuantizeRef(const float* x, int64_t rows, int64_t cols, const Nvfp4Options& options,
                        float* out, uint8_t* codes, uint8_t* scales, float* s_dec_out) {
  Status status = ValidateNvfp4(rows, cols, options);
  if (!status.ok()) return status;
  const int64_t count = rows * cols;
  std::vector<float> rotated;
  const float* y = x;
  if (options.rht) {
    rotated.resize(count);
    RhtRef(x, rows, cols, options.axis, rotated.data());
    y = rotated.data();
  }

  // Step 1: the per-tensor scale, from the tensor's amax (NaN propagates).
  float amax_t = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    float magnitude = std::fabs(y[i]);
    if (std::isnan(magnitude) || std::isnan(amax_t)) amax_t = kNan;
    else amax_t = std::max(amax_t, magnitude);
  }
  float s_enc = (448.0f * 6.0f) / amax_t;
  if (std::isinf(s_enc)) s_enc = FLT_MAX;
  if (s_enc == 0.0f) s_enc = 1.0f;
  // A NaN tensor (NaN amax) stores the canonical quiet NaN, whatever payload the
  // division produced, so CPU and GPU write the same packed bytes.
  const float s_dec = std::isnan(s_enc) ? kNan : 1.0f / s_enc;
  if (s_dec_out != nullptr) *s_dec_out = s_dec;
  const float m = s_enc * (1.0f / 6.0f);

  AxisView view{rows, cols, options.axis};
  const int64_t blocks_per_line = view.length() / 16;
  const int64_t tile_lines = options.tile_16x16 ? 16 : 1;
  for (int64_t line0 = 0; line0 < view.lines(); line0 += tile_lines) {
    for (int64_t block = 0; block < blocks_per_line; ++block) {
      // amax of the 1x16 block, or of the 16x16 tile shared by its 16 blocks.
      float amax_b = 0.0f;
      for (int64_t line = line0; line < line0 + tile_lines; ++line) {
        for (int64_t k = block * 16; k < block * 16 + 16; ++k) {
          float magnitude = std::fabs(y[view.Index(line, k)]);
          if (std::isnan(magnitude) || std::isnan(amax_b)) amax_b = kNan;
          else amax_b = std::max(amax_b, magnitude);
        }
      }
      // Step 2: the E4M3 block scale.
      float d = MinKeepNan(amax_b * m, FLT_MAX);
      d = std::isnan(d) ? d : std::min(std::max(d, -448.0f), 448.0f);
      float sf = RoundToElem(d, ElemFormat::kE4M3, Rounding::kNearestEven, 0.0f);
      // Step 3: the encode scale actually applied to the block.
      float s_b = MinKeepNan(1.0f / (sf * s_dec), FLT_MAX);
      for (int64_t line = line0; line < line0 + tile_lines; ++line) {
        if (scales != nullptr)
          scales[view.ScaleIndex(line, block, blocks_per_line)] = EncodeElem(sf, ElemFormat::kE4M3);
        for (int64_t k = block * 16; k < block * 16 + 16; ++k) {
          int64_t index = view.Index(line, k);
          // Step 4: E2M1 of the clamped, scaled value.
          float scaled = y[index] * s_b;
          float clamped = std::isnan(scaled) ? scaled : std::min(std::max(scaled, -6.0f), 6.0f);
          float q = ZeroOrRound(clamped, ElemFormat::kE2M1, options.rounding,
                                Uniform(options.rounding, options.seed, index));
          // E2M1 has no NaN; like TransformerEngine's cast (no interval holds a NaN)
          // a NaN gets code 0. The NaN scale byte and S_dec carry the NaN.
          if (codes != nullptr) codes[index] = std::isnan(q) ? 0 : EncodeElem(q, ElemFormat::kE2M1);
          // Step 5: dequantize in the spec's order.
          if (out != nullptr) out[index] = (q * sf) * s_dec;
        }
      }
    }
  }
  return Status::Ok();
}

Status Fp8TensorQuantizeRef(const float* x, int64_t count, ElemFormat elem, Rounding rounding,
                            uint64_t seed, float* out, uint8_t* codes, float* scale_out) {
  Status status = CheckShape(1, count);
  if (!status.ok()) return status;
  if (elem != ElemFormat::kE4M3 && elem != ElemFormat::kE5M2)
    return Status::Error(std::string("format: ") + Spec(elem).name +
                         " is not allowed for per-tensor FP8; use e4m3 or e5m2");
  const ElemSpec& spec = Spec(elem);
  float amax = 0.0f;  // NaN elements do not take part; they stay NaN below
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
  }
  float scale = 1.0f;
  if (amax > 0.0f && std::isfinite(amax)) {
    scale = spec.max_normal / amax;
    if (std::isinf(scale)) scale = FLT_MAX;
  }
  const float scale_inv = 1.0f / scale;
  if (scale_out != nullptr) *scale_out = scale_inv;
  for (int64_t i = 0; i < count; ++i) {
    // A NaN passes through with its sign (the product's NaN sign is not portable).
    float scaled = std::isnan(x[i]) ? x[i] : x[i] * scale;
    float r = RoundToElem(scaled, elem, rounding, Uniform(rounding, seed, i));
    if (codes != nullptr) codes[i] = EncodeElem(r, elem);
    if (out != nullptr) out[i] = r * scale_inv;
  }
  return Status::Ok();
}

Status Bf16QuantizeRef(const float* x, int64_t count, Rounding rounding, uint64_t seed,
                       float* out, uint16_t* bits) {
  Status status = CheckShape(1, count);
  if (!status.ok()) return status;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t b = FloatToBf16(x[i], rounding, Uniform(rounding, seed, i));
    if (bits != nullptr) bits[i] = b;
    if (out != nullptr) out[i] = Bf16ToFloat(b);
  }
  return Status::Ok();
}

std::vector<uint8_t> PackCodes(const uint8_t* codes, int64_t count, ElemFormat elem) {
  if (Spec(elem).bits != 4) return std::vector<uint8_t>(codes, codes + count);
  std::vector<uint8_t> packed((count + 1) / 2, 0);
  for (int64_t i = 0; i < count; ++i) {
    uint8_t nibble = codes[i] & 0x0F;
    packed[i / 2] |= (i % 2 == 0) ? nibble : static_cast<uint8_t>(nibble << 4);
  }
  return packed;
}

}  // namespace keel
