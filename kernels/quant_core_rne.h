// The CUDA kernels' shortcuts for nearest-even rounding, as host and device
// functions (KEEL_HD) beside quant_core.h, so that quant_core_rne_test.cc runs on
// the CPU the very arithmetic the GPU runs and checks it, bit for bit, against
// the CPU reference quantizers (formats.h, quantize.h):
//   - RneSmall: RoundElemCore's nearest_even in fewer instructions. MX E3M2, E2M3
//     and E2M1 use it on every GPU, MX E4M3 and E5M2 below sm_89, NVFP4 always.
//   - TiesAwayInput: nearest_away as nearest_even of a slightly changed input, so
//     that nearest_away runs the nearest-even paths (one extra instruction).
//   - MxElementNearest, Nvfp4ElementRne, Nvfp4RoundRne: MX's (nearest even or
//     away) and NVFP4's (nearest even) element built on them.
//   - SrSmall, MxElementSr, Nvfp4ElementSr: RoundElemCore's stochastic rounding
//     in fewer instructions (the grid point below |w| from one addition rounded
//     toward zero), and MX's and NVFP4's stochastic element built on it.
//   - SatfiniteFp8x2 and Fp8x2Values: the FP8 conversion instructions that the MX
//     and per-tensor FP8 kernels use on sm_89 and later; on the host, an
//     emulation of what the PTX ISA documents for them.
//   - MxFp8PairNearest and Fp8TensorPairNearest: how those kernels combine the
//     conversion with their scales, for nearest_even and nearest_away.
// The host cannot check that the hardware instruction does what the PTX ISA says;
// cuda_quant_test does, on a GPU: its mxfp8_e4m3 / mxfp8_e5m2 and fp8_e4m3 /
// fp8_e5m2 nearest_even cases compare the sm_89+ path with the reference.
#ifndef KEEL_KERNELS_QUANT_CORE_RNE_H_
#define KEEL_KERNELS_QUANT_CORE_RNE_H_

#include <cfloat>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#include "kernels/formats.h"  // ElemFormat
#include "kernels/quant_core.h"

namespace keel {
namespace qcore {

// ---- nearest even, short ---------------------------------------------------------

// The magic addend of RneSmall and SrSmall, as bits: the power of two whose fp32
// ulp is the grid step of format c at |w| (w's exponent, raised to the format's
// smallest normal one), so that |w| + big lands on w's grid.
KEEL_HD uint32_t GridBigBits(uint32_t w_bits, ElemConsts c) {
  const uint32_t exponent = w_bits & 0x7F800000u;
  const uint32_t min_exponent = static_cast<uint32_t>(128 - c.bias) << 23;
  return (exponent > min_exponent ? exponent : min_exponent) + (static_cast<uint32_t>(23 - c.mbits) << 23);
}

// The result of RneSmall and SrSmall from the grid point chosen: its code from
// big's exponent and the n quanta above it, clamped to max_normal when kClamp,
// with w's sign on both.
template <ElemFormat F, bool kClamp>
KEEL_HD Rounded GridRounded(uint32_t big_bits, uint32_t n, float value, uint32_t sign) {
  constexpr ElemConsts c = ConstsOf(F);
  uint32_t code = (big_bits >> (23 - c.mbits)) - (static_cast<uint32_t>(151 - c.bias - c.mbits) << c.mbits) + n;
  if constexpr (kClamp) {
    code = code < c.max_code ? code : c.max_code;
    value = Min(value, AsFloat(c.max_bits));
  }
  return Rounded{AsFloat(AsBits(value) | sign), code | (sign >> (32 - c.bits))};
}

// RoundElemCore for Rounding::kNearestEven, written for the instruction count:
// |w| is an operand modifier of the magic addition instead of a separate mask,
// and kClamp = false drops the clamp to max_normal for callers whose |w| is at
// most max_normal already (NVFP4 clamps w to +-6 before rounding, and 6 is on the
// grid, so rounding cannot exceed it). Same additions, same bits: see
// RoundElemCore for why (|w| + big) - big is the nearest-even grid point and the
// low bits of the sum count its quanta. w must not be NaN, and |w| < 2^(emax + 1).
// kSigned = false: the caller knows w's sign bit is clear (w = |something|) and
// handles the sign itself, so no instruction is spent on it.
template <ElemFormat F, bool kClamp, bool kSigned = true>
KEEL_HD Rounded RneSmall(float w) {
  constexpr ElemConsts c = ConstsOf(F);
  const uint32_t bits = AsBits(w);
  const uint32_t sign = kSigned ? bits & kSignBit : 0u;
  const uint32_t big_bits = GridBigBits(bits, c);
  const float big = AsFloat(big_bits);
  const float sum = AddRn(Abs(w), big);
  const uint32_t n = AsBits(sum) - big_bits;
  float value = SubRn(sum, big);
  return GridRounded<F, kClamp>(big_bits, n, value, sign);
}

// x * 2^-e (the one rounding MxElementFinite does) with the zero rule of
// PlusZeroBits applied, in two instructions: w + 0 is w for every w != 0 and +0
// for w = +-0 under round-to-nearest. The separate addition keeps it from being
// fused: an FMA would keep the -0 of a product that underflows.
KEEL_HD float ScaledPlusZero(float x, float inv_scale) { return AddRn(MulRn(x, inv_scale), 0.0f); }

// ---- nearest away, through nearest even ---------------------------------------------

// The input whose nearest-even rounding is w's nearest_away rounding, on any
// element grid, for w finite (a NaN stays a NaN; an infinity would become one,
// so callers that can see one clamp it first): w with its lowest significand bit
// set. One instruction, so nearest_away runs every nearest-even path (RneSmall,
// the FP8 conversion instruction) at their speed.
//
// Why. Let g be the grid point at or below |w| and q the grid step there
// (q = 2^(p - mbits), p = max(floor(log2|w|), 1 - bias)), so |w| = g + f with
// 0 <= f < q. The two modes differ only at f = q/2 (a tie): nearest_even goes
// down when g / q is even, nearest_away always goes up. The lowest bit of w is
// worth u = ulp(w) = 2^(floor(log2|w|) - 23) (2^-149 for fp32 subnormals and
// zero), and q >= 2^(23 - mbits) u >= 2^20 u, so g, q/2 and q are all even
// multiples of u, and so is f when that bit is clear. Setting it gives
// |w'| = g + f' with f' = f or f + u, the same g and sign:
//   - f < q/2: f <= q/2 - 2u when the bit was clear, so f' < q/2 and both
//     modes round w and w' down;
//   - f = q/2: the bit was clear, f' = q/2 + u lies above the tie and nearest
//     even rounds w' up, as nearest_away rounds w;
//   - f > q/2: f' > q/2 as well, both round up;
//   - f' < q always, so the next grid point is the same one.
// So round_even(w') = round_away(w) on the unbounded grid; clamping to
// max_normal afterwards (RneSmall's clamp, the conversion's .satfinite, which
// gives max_normal for any |w'| above it) then agrees too. Zero: +0 becomes
// 2^-149, -0 becomes -2^-149, both rounding to a zero of their sign as before
// (the MX zero rule is applied to w before this, see ScaledPlusZero).
KEEL_HD float TiesAwayInput(float w) { return AsFloat(AsBits(w) | 1u); }

// The input that rounding mode R (nearest even or away) hands to a nearest-even
// rounding: w itself, or TiesAwayInput(w).
template <Rounding R>
KEEL_HD float NearestInput(float w) {
  static_assert(R == Rounding::kNearestEven || R == Rounding::kNearestAway, "a nearest mode");
  if constexpr (R == Rounding::kNearestAway) return TiesAwayInput(w);
  return w;
}

// MxElementFinite for nearest_even or nearest_away: the kernels' path for E3M2,
// E2M3 and E2M1, and for E4M3 and E5M2 below sm_89. The value is the rounded w
// times 2^e (exact); a caller that wants only the code leaves it unused.
template <ElemFormat F, Rounding R = Rounding::kNearestEven>
KEEL_HD Rounded MxElementNearest(float x, const MxScale& s) {
  Rounded r = RneSmall<F, true>(NearestInput<R>(ScaledPlusZero(x, s.inv_scale)));
  r.value = r.value * s.scale;
  return r;
}

// NVFP4's step-4 input in two parts: the magnitude min(|y * s_b|, 6) (one
// instruction on the device: the clamp to +-6 of the reference, sign aside) and
// whether the element is negative under PlusZeroBits' rule (a -0 product counts
// as +0; every other negative product, one that rounds to zero included, keeps its
// sign). The product must not be NaN.
struct Nvfp4Scaled {
  float magnitude;
  bool negative;
};
KEEL_HD Nvfp4Scaled Nvfp4Scale(float y, float s_b) {
  const float product = MulRn(y, s_b);
  return Nvfp4Scaled{Min(Abs(product), 6.0f), AsBits(product) > kSignBit};
}
// The rounded magnitude with that sign: code bit 3, and the value negated (-0 for
// a magnitude that rounded to zero, as the reference keeps the sign).
KEEL_HD Rounded Nvfp4WithSign(Rounded r, bool negative) {
  return negative ? Rounded{-r.value, r.code | 8u} : r;
}

// Nvfp4Element (nearest_even) for a block whose s_b is not NaN. Then no y * s_b is
// NaN: a NaN y makes the block amax NaN and so s_b NaN, and s_b is never 0 (sf is
// at most 448 and |S_dec| below 2^117, so 1 / (sf * S_dec) is not 1 / Inf), so an
// infinite y gives an infinite product that the clamp takes to 6. Blocks with a
// NaN s_b are handled whole by the caller (Nvfp4RoundRne). The magnitude is at
// most 6, on the grid, so rounding needs no clamp.
KEEL_HD Rounded Nvfp4ElementRne(float y, float s_b) {
  const Nvfp4Scaled w = Nvfp4Scale(y, s_b);
  return Nvfp4WithSign(RneSmall<ElemFormat::kE2M1, false, false>(w.magnitude), w.negative);
}

// Nearest-even NVFP4 steps 4-5 for the kN elements of one block (or part of one):
// a NaN block scale (a NaN tensor or block) gives code 0 and NaN for all of them,
// as Nvfp4Element does; otherwise each element rounds, and the dequantized value
// is computed only when it is wanted (codes-only calls skip that arithmetic).
template <int kN>
KEEL_HD void Nvfp4RoundRne(const float (&y)[kN], const Nvfp4BlockScale& s, const Nvfp4TensorScale& t,
                           bool with_values, uint32_t (&code)[kN], float (&out)[kN]) {
  if (IsNan(s.s_b)) {
    const float nan_out = Nvfp4Dequant(QuietNan(), s, t);
    KEEL_UNROLL
    for (int k = 0; k < kN; ++k) {
      code[k] = 0;
      out[k] = nan_out;
    }
    return;
  }
  // Two copies of the loop, so that the codes-only one has no value arithmetic.
  auto round = [&](auto values) {
    KEEL_UNROLL
    for (int k = 0; k < kN; ++k) {
      const Rounded q = Nvfp4ElementRne(y[k], s.s_b);
      code[k] = q.code;
      if constexpr (decltype(values)::value) out[k] = Nvfp4Dequant(q.value, s, t);
    }
  };
  if (with_values) round(std::true_type{});
  else round(std::false_type{});
}

// ---- stochastic, short ------------------------------------------------------------

// One fp32 addition a + b rounded toward zero, for 0 <= a < b with b a power of two
// (all SrSmall needs): __fadd_rz on the device; on the host the nearest sum,
// stepped down one ulp when it rounded up (then the exact sum lies between the
// two, and b <= sum <= 2b makes sum - b exact, so the test is exact too).
KEEL_HD float AddRzBelowPow2(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rz(a, b);
#else
  const float sum = a + b;
  return sum - b > a ? AsFloat(AsBits(sum) - 1u) : sum;
#endif
}

// RoundElemCore for Rounding::kStochastic, written for the instruction count:
// the same rule (up iff u < (|w| - floor) / q, floor the grid point at or below
// |w|), with floor read off one addition rounded toward zero instead of
// correcting the nearest-even one. With big = 2^(p - mbits + 23) as in RneSmall,
// |w| < 2^(p + 1) <= big, so the exact |w| + big lies in [big, 2 big), where the
// fp32 step is q: truncating it gives big + floor exactly, and its low bits count
// floor's quanta. |w| - floor is exact (0 <= it < q, and floor = 0 or floor >= q >
// |w| - floor, so Sterbenz applies), and multiplying by 1 / q (a power of two) is
// exact: the fraction is the reference's. Up adds one quantum (a carry from the
// largest mantissa moves to the next exponent, as in RoundElemCore). kClamp as in
// RneSmall: false for callers whose |w| is at most max_normal (then rounding up
// cannot pass it: max_normal is on the grid); kSigned as in RneSmall. w must not
// be NaN, and |w| < 2^(emax + 1); the sign of w is kept, zero included.
template <ElemFormat F, bool kClamp, bool kSigned = true>
KEEL_HD Rounded SrSmall(float w, float u) {
  constexpr ElemConsts c = ConstsOf(F);
  const uint32_t bits = AsBits(w);
  const uint32_t sign = kSigned ? bits & kSignBit : 0u;
  const uint32_t big_bits = GridBigBits(bits, c);
  const float big = AsFloat(big_bits);
  const float magnitude = Abs(w);
  const float sum = AddRzBelowPow2(magnitude, big);
  const float floor_value = SubRn(sum, big);
  const float fraction = MulRn(SubRn(magnitude, floor_value), AsFloat(0x8A800000u - big_bits));  // / q
  const bool up = u < fraction;
  const uint32_t n = AsBits(sum) - big_bits + (up ? 1u : 0u);
  float value = up ? AddRn(floor_value, AsFloat(big_bits - (23u << 23))) : floor_value;  // + q
  return GridRounded<F, kClamp>(big_bits, n, value, sign);
}

// MxElementFinite for stochastic rounding with the uniform u.
template <ElemFormat F>
KEEL_HD Rounded MxElementSr(float x, const MxScale& s, float u) {
  Rounded r = SrSmall<F, true>(ScaledPlusZero(x, s.inv_scale), u);
  r.value = r.value * s.scale;
  return r;
}

// Nvfp4Element (stochastic, uniform u) for a block whose s_b is not NaN, as
// Nvfp4ElementRne: the caller selects NaN blocks whole.
KEEL_HD Rounded Nvfp4ElementSr(float y, float s_b, float u) {
  const Nvfp4Scaled w = Nvfp4Scale(y, s_b);
  return Nvfp4WithSign(SrSmall<ElemFormat::kE2M1, false, false>(w.magnitude, u), w.negative);
}

// Stochastic NVFP4 steps 4-5 for the kN elements of one block (or part of one),
// u[k] the uniform of element k: Nvfp4RoundRne with Nvfp4ElementSr.
template <int kN>
KEEL_HD void Nvfp4RoundSr(const float (&y)[kN], const float (&u)[kN], const Nvfp4BlockScale& s,
                          const Nvfp4TensorScale& t, uint32_t (&code)[kN], float (&out)[kN]) {
  const bool nan_block = IsNan(s.s_b);
  const float nan_out = Nvfp4Dequant(QuietNan(), s, t);
  KEEL_UNROLL
  for (int k = 0; k < kN; ++k) {
    const Rounded q = Nvfp4ElementSr(y[k], s.s_b, u[k]);
    code[k] = nan_block ? 0u : q.code;
    out[k] = nan_block ? nan_out : Nvfp4Dequant(q.value, s, t);
  }
}

// ---- the FP8 conversion instructions (sm_89 and later) ---------------------------

// cvt.rn.satfinite.{e4m3,e5m2}.f32 on one value as the PTX ISA describes it:
// round to nearest, ties to even, onto the format's grid, subnormals included (an
// fp32 subnormal input is not flushed); with .satfinite a NaN input gives a NaN
// and a magnitude above the largest finite value (an infinity included) gives that
// value with the input's sign. Which NaN code the hardware writes is not
// documented; this writes 0x7F (a NaN in both formats), and the kernels never keep
// it (a NaN block or input gets its code from the reference's rule). Worked out on
// the integer significand, independently of RoundElemCore's float addition, so
// that quant_core_rne_test compares two derivations.
KEEL_HD uint32_t SatfiniteFp8Emulated(float x, ElemConsts c) {
  const uint32_t bits = AsBits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & kAbsMask;
  if (magnitude > kInfBits) return 0x7Fu;
  if (magnitude > c.max_bits) return sign | c.max_code;
  // |x| = significand * 2^(field - 150), with field 1 for fp32 subnormals.
  const uint32_t field = magnitude >> 23;
  const uint32_t significand = field == 0 ? magnitude : (magnitude & 0x007FFFFFu) | 0x00800000u;
  const int exponent = (field == 0 ? 1 : static_cast<int>(field)) - 150;
  // The grid step where |x| lies is 2^(p - mbits), p = max(floor(log2|x|), 1 - bias):
  // n = |x| / step quanta, rounded to nearest even on the bits shifted out.
  int p = 1 - c.bias;
  if (magnitude != 0 && FloorLog2(x) > p) p = FloorLog2(x);
  const int shift = p - c.mbits - exponent;  // at least 23 - mbits
  uint32_t n = 0;
  if (shift < 25) {  // else |x| < step / 2 (significand < 2^24): n = 0
    const uint32_t rest = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    n = significand >> shift;
    if (rest > half || (rest == half && (n & 1u) != 0)) n += 1;
  }
  // In the subnormal binade the code is n; above it, the exponent field p + bias
  // and the mantissa n - 2^mbits (n = 2^(mbits + 1) carries into the next binade).
  const uint32_t code = p == 1 - c.bias ? n : (static_cast<uint32_t>(p + c.bias) << c.mbits) + n - (1u << c.mbits);
  return sign | code;
}

#if defined(__CUDACC__)
template <ElemFormat F>
constexpr __nv_fp8_interpretation_t Fp8Kind() {
  return F == ElemFormat::kE4M3 ? __NV_E4M3 : __NV_E5M2;
}
#endif

// The codes of lo and hi (F: E4M3 or E5M2), lo in the low byte (the order the
// kernels store): cvt.rn.satfinite.{e4m3,e5m2}x2.f32 on the device, one
// instruction per pair on sm_89 and later (the kernels use it nowhere else);
// SatfiniteFp8Emulated twice on the host.
template <ElemFormat F>
KEEL_HD uint32_t SatfiniteFp8x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, Fp8Kind<F>());
#else
  return SatfiniteFp8Emulated(lo, ConstsOf(F)) | (SatfiniteFp8Emulated(hi, ConstsOf(F)) << 8);
#endif
}

// The values of the two codes in `codes` (lo in the low byte). On the device
// cvt.rn.f16x2.{e4m3,e5m2}x2 then fp16 to fp32; both conversions are exact (E4M3
// and E5M2 values are fp16 values), so on the host the values are DecodeElemFast's.
template <ElemFormat F>
KEEL_HD void Fp8x2Values(uint32_t codes, float* lo, float* hi) {
#if defined(__CUDA_ARCH__)
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), Fp8Kind<F>());
  const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h));
  *lo = v.x;
  *hi = v.y;
#else
  *lo = DecodeElemFast(codes & 0xFFu, ConstsOf(F));
  *hi = DecodeElemFast(codes >> 8, ConstsOf(F));
#endif
}

// MxElementFinite (nearest_even or nearest_away, E4M3 or E5M2) of two elements of
// blocks that are not NaN, with the conversion in hardware: for a finite w with
// |w| < 2^(emax + 1), rounding to nearest even then saturating is RoundElemCore's
// code, since rounding then clamping and saturating the rounded value agree (a
// tie just above max_normal goes to the even grid point max_normal, and anything
// that would round higher saturates to it); nearest_away converts
// TiesAwayInput(w) instead (w is finite here). The conversion keeps -0's sign, so
// w comes from ScaledPlusZero; the value is the code's value times 2^e (exact).
// Values only when with_values (codes-only callers skip the decode); 0 otherwise.
template <ElemFormat F, Rounding R = Rounding::kNearestEven>
KEEL_HD void MxFp8PairNearest(float x0, float x1, const MxScale& s0, const MxScale& s1, bool with_values,
                              Rounded* q0, Rounded* q1) {
  const uint32_t pair = SatfiniteFp8x2<F>(NearestInput<R>(ScaledPlusZero(x0, s0.inv_scale)),
                                          NearestInput<R>(ScaledPlusZero(x1, s1.inv_scale)));
  *q0 = Rounded{0.0f, pair & 0xFFu};
  *q1 = Rounded{0.0f, pair >> 8};
  if (with_values) {
    float v0, v1;
    Fp8x2Values<F>(pair, &v0, &v1);
    q0->value = v0 * s0.scale;
    q1->value = v1 * s1.scale;
  }
}

// Fp8Element (nearest_even or nearest_away) of two elements with the conversion in
// hardware. Saturation covers |x * scale| above max_normal, Inf included, as
// RoundElem's clamp does; -0 keeps its code 0x80 (per-tensor FP8 has no zero
// rule). A NaN x gets the reference's code, its own sign with the NaN code, by a
// select; its value (the NaN code's value times out_scale) is a NaN either way.
// nearest_away first clamps the product to +-FLT_MAX (so that TiesAwayInput sees
// no infinity; the conversion saturates either way, and a NaN's code is the
// select's). scale: the encode scale; out_scale: what the code's value is
// multiplied by (1 / scale, or 1 for an output without the tensor scale). Values
// only when with_values.
template <ElemFormat F, Rounding R = Rounding::kNearestEven>
KEEL_HD void Fp8TensorPairNearest(float x0, float x1, float scale, float out_scale, bool with_values, Rounded* q0,
                                  Rounded* q1) {
  constexpr ElemConsts c = ConstsOf(F);
  float w0 = x0 * scale, w1 = x1 * scale;
  if constexpr (R == Rounding::kNearestAway) {
    w0 = TiesAwayInput(Min(Max(w0, -FLT_MAX), FLT_MAX));
    w1 = TiesAwayInput(Min(Max(w1, -FLT_MAX), FLT_MAX));
  }
  const uint32_t pair = SatfiniteFp8x2<F>(w0, w1);
  const uint32_t code0 = IsNan(x0) ? ((AsBits(x0) >> 24) & 0x80u) | c.nan_code : pair & 0xFFu;
  const uint32_t code1 = IsNan(x1) ? ((AsBits(x1) >> 24) & 0x80u) | c.nan_code : pair >> 8;
  *q0 = Rounded{0.0f, code0};
  *q1 = Rounded{0.0f, code1};
  if (with_values) {
    float v0, v1;
    Fp8x2Values<F>(code0 | (code1 << 8), &v0, &v1);
    q0->value = v0 * out_scale;
    q1->value = v1 * out_scale;
  }
}

}  // namespace qcore
}  // namespace keel

#endif  // KEEL_KERNELS_QUANT_CORE_RNE_H_
