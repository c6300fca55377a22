// Fast scalar numerics of the CUDA quantizers (quantize_cuda.cu): element rounding
// and encoding, MX (E8M0) and NVFP4 (E4M3) block scales, BF16 rounding, the 16-point
// RHT, per-tensor FP8, and the index helpers the kernels need.
//
// Everything here is KEEL_HD (host and device), so quant_core_test.cc checks each
// function on the CPU, bit for bit, against the reference in formats.h and
// quantize.h; the kernels call exactly these functions, which makes that test the
// CI guard on the GPU's numbers. Speed comes from reading exponents off the fp32
// bits and building powers of two from bits; what is computed never changes: every
// result is the value the reference gets with frexp/ldexp/floor, and every
// floating-point operation here is one the reference also performs, in its order,
// or is exact (a power-of-two scaling, a multiplication by +-1).
//
// NaN: the GPU's arithmetic returns one canonical positive NaN, while x86 keeps the
// NaN operand (and its sign). Where the sign of a NaN reaches an element code (only
// per-tensor FP8 does that), the functions below decide it explicitly, the way the
// reference does (see Fp8Element).
#ifndef KEEL_KERNELS_QUANT_CORE_H_
#define KEEL_KERNELS_QUANT_CORE_H_

#include <cfloat>
#include <cstdint>
#include <cstring>  // memcpy (BitCast), on the host and the device

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "kernels/formats.h"  // ElemFormat, Rounding (enums only: nothing here calls formats.cc)
#include "kernels/philox.h"   // KEEL_HD, Philox4x32

// Asks nvcc to unroll the loop that follows; nothing on the host (g++ does not
// know the pragma).
#if defined(__CUDA_ARCH__)
#define KEEL_UNROLL _Pragma("unroll")
#else
#define KEEL_UNROLL
#endif

namespace keel {
namespace qcore {

// ---- bits ----------------------------------------------------------------------

constexpr uint32_t kSignBit = 0x80000000u;
constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kQuietNanBits = 0x7FC00000u;  // std::numeric_limits<float>::quiet_NaN()
constexpr uint32_t kFltMaxBits = 0x7F7FFFFFu;

// The bits of `from` read as a `To` of the same size (C++20's std::bit_cast;
// a fixed-size memcpy compiles to a register move on the host and the device).
template <typename To, typename From>
KEEL_HD To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "BitCast needs types of one size");
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

KEEL_HD uint32_t AsBits(float x) { return BitCast<uint32_t>(x); }
KEEL_HD float AsFloat(uint32_t bits) { return BitCast<float>(bits); }

KEEL_HD float QuietNan() { return AsFloat(kQuietNanBits); }
KEEL_HD bool IsNan(float x) { return (AsBits(x) & kAbsMask) > kInfBits; }
KEEL_HD bool IsFinite(float x) { return (AsBits(x) & kAbsMask) < kInfBits; }

// |x| as bits. Unsigned order of these is the order of magnitudes, with +Inf above
// every finite value and every NaN above +Inf, so an integer max over them is a
// NaN-propagating amax (NaN wins), exactly and with no float compare.
KEEL_HD uint32_t AbsBits(float x) { return AsBits(x) & kAbsMask; }
// The same, with NaN counted as 0: the amax that ignores NaN (per-tensor FP8).
KEEL_HD uint32_t AbsBitsNoNan(float x) {
  uint32_t a = AsBits(x) & kAbsMask;
  return a > kInfBits ? 0u : a;
}

KEEL_HD int CountLeadingZeros(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#else
  return __builtin_clz(v);
#endif
}

// Correctly rounded fp32 division (nvcc's '/' is too unless built with
// -prec-div=false or --use_fast_math; the intrinsic keeps it so regardless).
KEEL_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// One correctly rounded fp32 addition, subtraction or multiplication that is never
// fused with a neighbour into an FMA (nvcc's -fmad=false and the host's
// -ffp-contract=off say so for the whole build; the intrinsics keep it so regardless).
KEEL_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KEEL_HD float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KEEL_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// |x|: the sign bit cleared (on the device an operand modifier of the instruction
// that uses it).
KEEL_HD float Abs(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return AsFloat(AsBits(x) & kAbsMask);
#endif
}

// min/max for operands that are not NaN (or whose NaN result is discarded): one
// instruction on the device; the reference's a < b ? a : b on the host.
KEEL_HD float Min(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return a < b ? a : b;
#endif
}
KEEL_HD float Max(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return a > b ? a : b;
#endif
}

// floor(log2|x|) for finite x != 0, exactly, subnormals included (frexp's k - 1).
KEEL_HD int FloorLog2(float x) {
  uint32_t a = AsBits(x) & kAbsMask;
  int biased = static_cast<int>(a >> 23);
  if (biased != 0) return biased - 127;
  // Subnormal: |x| = a * 2^-149 with a < 2^23, so floor(log2|x|) = (31 - clz(a)) - 149.
  return -118 - CountLeadingZeros(a);
}

// 2^k as a float, exactly, for k in [-149, 127] (subnormal below -126).
KEEL_HD float Pow2(int k) {
  return k >= -126 ? AsFloat(static_cast<uint32_t>(k + 127) << 23)
                   : AsFloat(1u << (k + 149));
}

// ---- element formats -------------------------------------------------------------

// What the rounding needs of an element format (the same numbers as Spec() in
// formats.cc, as compile-time constants so the kernels fold them).
struct ElemConsts {
  int bits;            // total bits including sign
  int mbits;           // stored mantissa bits
  int bias;
  int emax;            // floor(log2(max_normal))
  uint32_t max_bits;   // fp32 bits of max_normal
  uint32_t max_code;   // code of +max_normal
  uint32_t nan_code;   // code EncodeElem gives +NaN (formats without NaN: max_code)
};

KEEL_HD constexpr ElemConsts ConstsOf(ElemFormat format) {
  return format == ElemFormat::kE4M3   ? ElemConsts{8, 3, 7, 8, 0x43E00000u, 0x7Eu, 0x7Fu}
         : format == ElemFormat::kE5M2 ? ElemConsts{8, 2, 15, 15, 0x47600000u, 0x7Bu, 0x7Eu}
         : format == ElemFormat::kE3M2 ? ElemConsts{6, 2, 3, 4, 0x41E00000u, 0x1Fu, 0x1Fu}
         : format == ElemFormat::kE2M3 ? ElemConsts{6, 3, 1, 2, 0x40F00000u, 0x1Fu, 0x1Fu}
                                       : ElemConsts{4, 1, 1, 2, 0x40C00000u, 0x7u, 0x7u};  // E2M1
}

// A value of an element format and its bit code (sign in bit `bits - 1`).
struct Rounded {
  float value;
  uint32_t code;
};

// The core of RoundElem for finite w with |w| < 2^(emax + 1), given as its bits:
// w rounded to the element grid under `mode`, clamped to +-max_normal after
// rounding, sign kept (zero included), and the result's code.
//
// With p = max(floor(log2|w|), 1 - bias) the grid step is q = 2^(p - mbits). For
// big = 2^(p - mbits + 23), |w| + big lies in [big, 2 big), where the fp32 step is
// exactly q: the hardware addition rounds |w| to the grid, ties to even, and the
// low bits of the sum are n, the number of quanta. So value = (|w| + big) - big
// (exact) and code = ((p - 1 + bias) << mbits) + n: in the subnormal binade
// (p = 1 - bias) that is n itself, above it exponent field p + bias with mantissa
// n - 2^mbits, and n = 2^(mbits + 1) carries into the next exponent as it should.
// Codes grow with magnitude, so a value above max_normal is a code above max_code.
// The other modes start from the nearest-even n: rem = |w| - value is exact
// (Sterbenz) and says whether a tie went down (nearest_away moves it up) or which
// grid point is below |w| (stochastic: up iff u < (|w| - floor) / q, exact too).
// This is RoundQuanta of formats.h on n = |w| / q, without leaving fp32.
KEEL_HD Rounded RoundElemCore(uint32_t bits, ElemConsts c, Rounding mode, float u) {
  const uint32_t sign = bits & kSignBit;
  const float magnitude = AsFloat(bits ^ sign);
  uint32_t exponent = bits & 0x7F800000u;  // fp32 zero and subnormals: 0, below 1 - bias
  const uint32_t min_exponent = static_cast<uint32_t>(128 - c.bias) << 23;
  if (exponent < min_exponent) exponent = min_exponent;
  const uint32_t big_bits = exponent + (static_cast<uint32_t>(23 - c.mbits) << 23);
  const float big = AsFloat(big_bits);
  const float sum = magnitude + big;
  uint32_t n = AsBits(sum) - big_bits;
  float value = sum - big;
  if (mode != Rounding::kNearestEven) {
    const float rem = magnitude - value;                    // in [-q/2, q/2]
    const float q = AsFloat(big_bits - (23u << 23));        // 2^(p - mbits)
    if (mode == Rounding::kNearestAway) {
      if (rem == AsFloat(big_bits - (24u << 23))) {         // a tie that went down
        n += 1;
        value = value + q;
      }
    } else {                                                // kStochastic
      const bool below = rem < 0.0f;
      const float floor_value = below ? value - q : value;
      n -= below ? 1u : 0u;
      const float fraction = (magnitude - floor_value) * AsFloat(0x8A800000u - big_bits);  // / q
      const bool up = u < fraction;
      n += up ? 1u : 0u;
      value = up ? floor_value + q : floor_value;
    }
  }
  uint32_t code = (big_bits >> (23 - c.mbits)) -
                  (static_cast<uint32_t>(151 - c.bias - c.mbits) << c.mbits) + n;
  if (code > c.max_code) code = c.max_code;                // rounded above max_normal: clamp
  value = Min(value, AsFloat(c.max_bits));
  return Rounded{AsFloat(AsBits(value) | sign), code | (sign >> (32 - c.bits))};
}

// RoundToElem and EncodeElem of formats.h in one step, for any x: NaN is returned
// as is with the NaN code (sign kept), and |x| >= max_normal (Inf included) gives
// +-max_normal whatever the mode (rounding can only land on max_normal or above,
// and max_normal is on the grid, so the core leaves a clamped input unchanged).
KEEL_HD Rounded RoundElem(float x, ElemConsts c, Rounding mode, float u) {
  uint32_t bits = AsBits(x);
  const uint32_t magnitude = bits & kAbsMask;
  if (magnitude > kInfBits) return Rounded{x, ((bits & kSignBit) >> (32 - c.bits)) | c.nan_code};
  if (magnitude > c.max_bits) bits = (bits & kSignBit) | c.max_bits;
  return RoundElemCore(bits, c, mode, u);
}

// The value of a code that RoundElem can produce (NaN codes of E4M3/E5M2 give NaN;
// only the low `bits` bits are read). Used to recover a block scale from its byte.
KEEL_HD float DecodeElemFast(uint32_t code, ElemConsts c) {
  code &= (1u << c.bits) - 1u;
  const uint32_t sign = (code >> (c.bits - 1)) << 31;
  const uint32_t magnitude_code = code & ((1u << (c.bits - 1)) - 1u);
  if (c.bits == 8 && c.mbits == 3 && magnitude_code == 0x7Fu) return AsFloat(sign | kQuietNanBits);
  if (c.bits == 8 && c.mbits == 2 && magnitude_code >= 0x7Cu)  // E5M2 exponent field 31
    return AsFloat(sign | (magnitude_code == 0x7Cu ? kInfBits : kQuietNanBits));
  const int field = static_cast<int>(magnitude_code >> c.mbits);
  const uint32_t mantissa = magnitude_code & ((1u << c.mbits) - 1u);
  // value = n * 2^(p - mbits) with p = max(field - bias, 1 - bias) and n the
  // mantissa plus the implicit bit of a normal.
  const int p = field == 0 ? 1 - c.bias : field - c.bias;
  const uint32_t n = field == 0 ? mantissa : mantissa + (1u << c.mbits);
  return AsFloat(sign | AsBits(static_cast<float>(n) * Pow2(p - c.mbits)));
}

// E4M3 round-to-nearest-even of d in [-448, 448] or NaN: the NVFP4 block scale
// (docs/numerics.md, "NVFP4", step 2).
KEEL_HD Rounded RoundE4M3Rne(float d) {
  const ElemConsts c = ConstsOf(ElemFormat::kE4M3);
  if (IsNan(d)) return Rounded{d, ((AsBits(d) & kSignBit) >> 24) | c.nan_code};
  return RoundElemCore(AsBits(d), c, Rounding::kNearestEven, 0.0f);  // d in [-448, 448]
}

// ---- MX block scale (docs/numerics.md, "MX block scaling") -------------------------

struct MxScale {
  bool nan;         // the block is all NaN (a NaN or Inf in it, or e > 127)
  int e;            // shared exponent, in [-127, 127] unless nan
  uint32_t byte;    // E8M0: e + 127, 0xFF when nan
  float scale;      // 2^e (subnormal for e = -127)
  float inv_scale;  // 2^-e (always normal: e <= 126)
};

// The block's scale from amax_bits = max over the block of AbsBits(v): a value at
// or above kInfBits means a NaN or Inf is in the block. Steps 1-4 of that
// section, with the bump of step 3 when `bump`.
KEEL_HD MxScale MxScaleFromAmax(uint32_t amax_bits, ElemConsts c, bool bump) {
  MxScale s;
  s.nan = amax_bits >= kInfBits;
  if (amax_bits == 0) amax_bits = 0x00800000u;  // 2^-126
  int e = s.nan ? 0 : FloorLog2(AsFloat(amax_bits)) - c.emax;
  if (bump) {
    // The significand of amax (normalised, as frexp gives it) against the largest
    // element significand (max_normal / 2^emax): compare the 23 fraction bits.
    uint32_t fraction = amax_bits & 0x007FFFFFu;
    if ((amax_bits >> 23) == 0) fraction = (amax_bits << (CountLeadingZeros(amax_bits) - 8)) & 0x007FFFFFu;
    if (fraction > (c.max_bits & 0x007FFFFFu)) e += 1;
  }
  if (e > 127) s.nan = true;
  if (e < -127) e = -127;
  if (s.nan) e = 0;
  s.e = e;
  s.byte = s.nan ? 0xFFu : static_cast<uint32_t>(e + 127);
  s.scale = Pow2(e);
  s.inv_scale = Pow2(-e);
  return s;
}

// The scale a byte written by MxScaleFromAmax stands for.
KEEL_HD MxScale MxScaleFromByte(uint32_t byte) {
  MxScale s;
  s.nan = byte == 0xFFu;
  s.e = s.nan ? 0 : static_cast<int>(byte) - 127;
  s.byte = byte;
  s.scale = Pow2(s.e);
  s.inv_scale = Pow2(-s.e);
  return s;
}

// The operand statistics' saturation test (nn.h OperandStats) for one MX
// element: x was clipped when its code has the largest magnitude, its block is
// not NaN, and |x| exceeds |code value * 2^e|, the dequantized value.
KEEL_HD bool MxSaturated(float x, uint32_t code, const MxScale& s, ElemConsts c) {
  if ((code & ((1u << (c.bits - 1)) - 1u)) != c.max_code || s.nan) return false;
  return (AsBits(x) & kAbsMask) > (AsBits(DecodeElemFast(code, c) * s.scale) & kAbsMask) && !IsNan(x);
}

// The block quantizers' zero rule (ZeroOrRound in quantize.cc): a scaled value
// that is exactly zero, -0 included, becomes +0 before rounding. It applies to
// the value after scaling, so a tiny negative x whose w underflows to -0 also
// gives +0; a nonzero w that rounds to zero keeps its sign.
KEEL_HD uint32_t PlusZeroBits(float w) {
  const uint32_t bits = AsBits(w);
  return bits == kSignBit ? 0u : bits;
}

// Step 5 for one element of a block that is not NaN: w = x / 2^e (one correctly
// rounded multiplication by 2^-e, as ldexp rounds), rounded to the element grid,
// times 2^e (exact: the smallest element quantum times 2^-127 is still a multiple
// of 2^-149). |w| < 2^(emax + 1) because the block amax set e.
KEEL_HD Rounded MxElementFinite(float x, const MxScale& s, ElemConsts c, Rounding mode, float u) {
  Rounded r = RoundElemCore(PlusZeroBits(x * s.inv_scale), c, mode, u);
  r.value = r.value * s.scale;
  return r;
}

// The element of a NaN block.
KEEL_HD Rounded MxNanElement(ElemConsts c) { return Rounded{QuietNan(), c.nan_code}; }

KEEL_HD Rounded MxElement(float x, const MxScale& s, ElemConsts c, Rounding mode, float u) {
  return s.nan ? MxNanElement(c) : MxElementFinite(x, s, c, mode, u);
}

// ---- BF16 --------------------------------------------------------------------------

// FloatToBf16 of formats.h: the low 16 bits are the fraction of one bf16 ulp.
KEEL_HD uint16_t Bf16Round(float x, Rounding mode, float u) {
  const uint32_t bits = AsBits(x);
  if ((bits & kAbsMask) > kInfBits) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t upper = bits >> 16;
  const uint32_t lower = bits & 0xFFFFu;
  bool up;
  switch (mode) {
    case Rounding::kNearestEven: up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u)); break;
    case Rounding::kNearestAway: up = lower >= 0x8000u; break;
    default:  // kStochastic: u < lower / 2^16, compared exactly after scaling u by 2^16
      up = u * 65536.0f < static_cast<float>(lower);
      break;
  }
  // A carry into the exponent field moves to the next binade or to Inf, as it should.
  return static_cast<uint16_t>(upper + (up ? 1u : 0u));
}

KEEL_HD float Bf16Value(uint16_t bits) { return AsFloat(static_cast<uint32_t>(bits) << 16); }

// ---- per-tensor FP8 ----------------------------------------------------------------

struct Fp8Scale {
  float scale;  // max_normal / amax (1 when amax is 0 or not finite, FLT_MAX on overflow)
  float inv;    // 1 / scale: the decode scale
};

// amax: max |x| over the tensor ignoring NaN (may be +Inf).
KEEL_HD Fp8Scale Fp8ScaleFromAmax(float amax, ElemConsts c) {
  Fp8Scale s;
  s.scale = 1.0f;
  if (amax > 0.0f && IsFinite(amax)) {
    s.scale = Div(AsFloat(c.max_bits), amax);
    if (!IsFinite(s.scale)) s.scale = FLT_MAX;
  }
  s.inv = Div(1.0f, s.scale);
  return s;
}

// One element: r = round(x * scale) saturating, dequantized r * (1 / scale). A NaN
// x keeps its sign in the code, as x * scale does on x86 (the GPU's product would
// be the canonical +NaN).
KEEL_HD Rounded Fp8Element(float x, const Fp8Scale& s, ElemConsts c, Rounding mode, float u) {
  Rounded r = RoundElem(IsNan(x) ? x : x * s.scale, c, mode, u);
  r.value = r.value * s.inv;
  return r;
}

// ---- NVFP4 (docs/numerics.md, "NVFP4") --------------------------------------------

struct Nvfp4TensorScale {
  float s_enc;
  float s_dec;
  float m;  // s_enc * (1/6), the factor from a block amax to its scale
};

// Step 1, from the tensor amax (NaN-propagating max |y|).
KEEL_HD Nvfp4TensorScale Nvfp4TensorScaleFromAmax(float amax_t) {
  Nvfp4TensorScale t;
  float s_enc = Div(448.0f * 6.0f, amax_t);
  if ((AsBits(s_enc) & kAbsMask) == kInfBits) s_enc = FLT_MAX;
  if (s_enc == 0.0f) s_enc = 1.0f;
  t.s_enc = s_enc;
  t.s_dec = Div(1.0f, s_enc);
  if (IsNan(t.s_dec)) t.s_dec = QuietNan();  // canonical, as the reference stores it
  t.m = s_enc * (1.0f / 6.0f);
  return t;
}

struct Nvfp4BlockScale {
  float sf;        // E4M3 block scale value (NaN when the tensor or block amax is NaN)
  uint32_t code;   // its E4M3 byte
  float s_b;       // encode scale applied to the block's elements
};

// Steps 2-3 from the block (or tile) amax. The reference's NaN-keeping min gives
// the positive quiet NaN, so NaN scales encode as 0x7F.
KEEL_HD Nvfp4BlockScale Nvfp4BlockScaleFromAmax(float amax_b, const Nvfp4TensorScale& t) {
  float d = amax_b * t.m;
  if (IsNan(d)) {
    d = QuietNan();
  } else {
    d = Min(d, FLT_MAX);
    d = Min(Max(d, -448.0f), 448.0f);
  }
  const Rounded sf = RoundE4M3Rne(d);
  float s_b = Div(1.0f, sf.value * t.s_dec);
  s_b = IsNan(s_b) ? QuietNan() : Min(s_b, FLT_MAX);
  return Nvfp4BlockScale{sf.value, sf.code, s_b};
}

// The block scale a stored E4M3 byte stands for (the byte is exact, so s_b follows).
KEEL_HD Nvfp4BlockScale Nvfp4BlockScaleFromCode(uint32_t code, const Nvfp4TensorScale& t) {
  const float sf = DecodeElemFast(code, ConstsOf(ElemFormat::kE4M3));
  float s_b = Div(1.0f, sf * t.s_dec);
  s_b = IsNan(s_b) ? QuietNan() : Min(s_b, FLT_MAX);
  return Nvfp4BlockScale{IsNan(sf) ? QuietNan() : sf, code, s_b};
}

// Step 4 for one (rotated) element, with the zero rule of PlusZeroBits. E2M1 has
// no NaN: a NaN product (a NaN y, or the NaN s_b of a NaN tensor amax) gets code 0,
// as TransformerEngine's cast and the reference give it; the value stays NaN.
KEEL_HD Rounded Nvfp4Element(float y, const Nvfp4BlockScale& b, Rounding mode, float u) {
  const float scaled = y * b.s_b;
  Rounded r = RoundElemCore(PlusZeroBits(Min(Max(scaled, -6.0f), 6.0f)), ConstsOf(ElemFormat::kE2M1),
                            mode, u);
  if (IsNan(scaled)) r = Rounded{QuietNan(), 0u};  // a select, not a branch, in the kernels
  return r;
}

// The operand statistics (nn.h OperandStats) of NVFP4: an element saturated
// when its code is +-6 and |y| exceeds |(6 sf) S_dec|, sf its block's E4M3 scale
// (a NaN scale gives a NaN bound: nothing saturates); a block with a NaN or Inf
// y counts as a NaN block.
KEEL_HD float Nvfp4SaturationBound(uint32_t scale_code, float s_dec) {
  return AsFloat(AsBits((6.0f * DecodeElemFast(scale_code, ConstsOf(ElemFormat::kE4M3))) * s_dec) & kAbsMask);
}
KEEL_HD bool Nvfp4Saturated(float y, uint32_t code, float bound) {
  return (code & 7u) == 7u && AsFloat(AsBits(y) & kAbsMask) > bound;
}

// Step 5: (q * sf) * S_dec, in that order.
KEEL_HD float Nvfp4Dequant(float q, const Nvfp4BlockScale& b, const Nvfp4TensorScale& t) {
  return (q * b.sf) * t.s_dec;
}

// ---- random Hadamard transform -------------------------------------------------------

// s_i = -1 for i in {3, 5, 6, 7, 8, 9, 10, 12, 14, 15}
// (docs/numerics.md, "Random Hadamard transform").
constexpr uint32_t kRhtNegativeSigns = 0xD7E8u;

KEEL_HD constexpr int Parity4(int v) { return (v ^ (v >> 1) ^ (v >> 2) ^ (v >> 3)) & 1; }

// The coefficient s_i * H16[i][j] / 4 (H16[i][j] = (-1)^popcount(i & j)).
KEEL_HD constexpr float RhtCoefficient(int i, int j) {
  return ((static_cast<int>(kRhtNegativeSigns >> i) & 1) ^ Parity4(i & j)) ? -0.25f : 0.25f;
}

// sum += quarter[i] * sign(i, j) for i = 0..15 from sum = 0, where quarter[i] =
// in[i] * 0.25: x * (-0.25) is exactly -(x * 0.25) and s + (-t) is s - t, so this
// is RhtRef's sum += in[i] * (s_i * H16[i][j] * 0.25) bit for bit, with one
// multiplication per input instead of one per term.
KEEL_HD float RhtSum(const float quarter[16], int j) {
  float sum = 0.0f;
  KEEL_UNROLL
  for (int i = 0; i < 16; ++i) sum = RhtCoefficient(i, j) < 0.0f ? sum - quarter[i] : sum + quarter[i];
  return sum;
}

// Output j of the RHT of one 16-element chunk, summed exactly as RhtRef does:
// in index order, in fp32, no FMA. With j known at compile time (unrolled loops)
// the signs are constants.
KEEL_HD float RhtOutput(const float in[16], int j) {
  float quarter[16];
  KEEL_UNROLL
  for (int i = 0; i < 16; ++i) quarter[i] = in[i] * 0.25f;
  return RhtSum(quarter, j);
}

// Outputs half * 8 .. half * 8 + 7 of one chunk whose elements 0..7 are lo and
// 8..15 are hi, bit-identical to RhtOutput(in, half * 8 + e): H16[i][8 + e] is
// H16[i][e] for i < 8 and -H16[i][e] for i >= 8, so the upper half is the lower
// half's sum with the hi terms negated (exact). Two lanes that share a chunk thus
// run the same instructions (no divergence) on their own half.
KEEL_HD void RhtHalf(const float lo[8], const float hi[8], int half, float y[8]) {
  const uint32_t flip = static_cast<uint32_t>(half) << 31;
  float quarter[16];
  KEEL_UNROLL
  for (int i = 0; i < 8; ++i) {
    quarter[i] = lo[i] * 0.25f;
    quarter[8 + i] = AsFloat(AsBits(hi[i] * 0.25f) ^ flip);
  }
  KEEL_UNROLL
  for (int e = 0; e < 8; ++e) y[e] = RhtSum(quarter, e);
}

// ---- stochastic rounding ---------------------------------------------------------------

// PhiloxUniform(seed, 4 * group + k) for k = 0..3 from one Philox call.
KEEL_HD void PhiloxUniform4(uint64_t seed, uint64_t group, float u[4]) {
  const Philox4 r = Philox4x32(static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), 0u,
                               0u, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  for (int k = 0; k < 4; ++k) u[k] = static_cast<float>(r.v[k] >> 8) * (1.0f / 16777216.0f);
}

// ---- indexing ----------------------------------------------------------------------------

// Division of a 32-bit n by a fixed d >= 1 as a multiply-high, add and shift
// (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994): l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1,
// n / d = (mulhi(m, n) + n) >> l, the sum taken in 64 bits. Exact for every n < 2^32.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  int shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    shift = 0;
    while ((uint64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  KEEL_HD uint32_t Div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(multiplier, n);
#else
    const uint32_t high = static_cast<uint32_t>((static_cast<uint64_t>(multiplier) * n) >> 32);
#endif
    return static_cast<uint32_t>((static_cast<uint64_t>(high) + n) >> shift);
  }
  // Quotient and remainder.
  KEEL_HD void DivMod(uint32_t n, uint32_t* q, uint32_t* r) const {
    *q = Div(n);
    *r = n - *q * divisor;
  }
};

}  // namespace qcore
}  // namespace keel

#endif  // KEEL_KERNELS_QUANT_CORE_H_
