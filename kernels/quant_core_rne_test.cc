// quant_core_rne.h against the CPU reference quantizers (formats.h, quantize.h),
// bit for bit: the nearest-even paths of the CUDA kernels, including the ones
// that run only on a GPU, checked in CI without one.
//   - RneSmall, TiesAwayInput, MxElementNearest, Nvfp4ElementRne and
//     Nvfp4RoundRne are the very code the kernels run (MX E3M2, E2M3, E2M1 on
//     every GPU, MX E4M3 and E5M2 below sm_89, NVFP4 always), for nearest_even and
//     (MX, FP8) nearest_away; qcore::Fp8Element is per-tensor FP8 below sm_89.
//   - On the host, SatfiniteFp8x2 is an emulation of cvt.rn.satfinite.{e4m3,e5m2}x2
//     as the PTX ISA documents it, so MxFp8PairNearest and Fp8TensorPairNearest
//     here are the kernels' sm_89+ arithmetic with the instruction emulated. The
//     emulation itself is checked against the reference first.
// Inputs: every fp32 bit pattern at a prime stride, a denser sweep where the
// format's grid lies, and at every rounding decision of each format (each value,
// each midpoint between neighbours, the midpoint above max_normal, with the fp32
// values up to 3 ulps either side), both signs, at every MX block exponent, plus
// +-0, fp32 subnormals, +-Inf and NaN. That the hardware instruction does what
// the PTX ISA says needs a GPU: cuda_quant_test's mxfp8_e4m3 / mxfp8_e5m2 and
// fp8_e4m3 / fp8_e5m2 nearest_even and nearest_away cases compare the sm_89+
// kernels with the reference.
#include "kernels/quant_core_rne.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/philox.h"
#include "kernels/quant_core.h"
#include "kernels/quantize.h"

namespace keel {
namespace {

using qcore::AsBits;
using qcore::AsFloat;
using qcore::Rounded;

// Bitwise, except that any NaN equals any NaN (the GPU's NaNs are canonical).
bool SameFloat(float a, float b) { return AsBits(a) == AsBits(b) || (std::isnan(a) && std::isnan(b)); }

// Counts mismatches and reports the first few with what was compared.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  ~Mismatches() { EXPECT_EQ(count_, 0) << what_ << ": mismatches"; }
  // Records one comparison of (value, code) with the reference's.
  void Check(const char* path, float x, const Rounded& got, float want_value, uint32_t want_code) {
    if (SameFloat(got.value, want_value) && got.code == want_code) return;
    if (count_++ < 5)
      ADD_FAILURE() << what_ << ", " << path << ": x=" << std::hexfloat << x << " (0x" << std::hex
                    << AsBits(x) << ") gives " << got.value << " code 0x" << got.code << ", reference "
                    << want_value << " code 0x" << want_code << std::dec << std::defaultfloat;
  }

 private:
  std::string what_;
  int64_t count_ = 0;
};

// Every fp32 whose magnitude bits lie in [0, end), at `stride`, with both signs.
std::vector<float> Sweep(uint32_t end, uint32_t stride) {
  std::vector<float> x;
  for (uint64_t b = 0; b < end; b += stride) {
    x.push_back(AsFloat(static_cast<uint32_t>(b)));
    x.push_back(-AsFloat(static_cast<uint32_t>(b)));
  }
  return x;
}

// Every fp32 bit pattern at a prime stride (1M values: every exponent, NaNs and
// infinities included, both mantissa parities).
std::vector<float> EveryPatternStrided() {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) x.push_back(AsFloat(static_cast<uint32_t>(b)));
  return x;
}

// 2^(emax + 1): MX's w = x / 2^e stays below it (see MxElementFinite).
float WLimit(ElemFormat f) { return std::ldexp(1.0f, Spec(f).emax + 1); }

// About 512K values of |w| below WLimit, both signs.
std::vector<float> DenseBelowLimit(ElemFormat f) {
  const uint32_t end = AsBits(WLimit(f));
  return Sweep(end, (end >> 18) | 1u);
}

// The inputs around every rounding decision of format f, in the element's own
// scale (w): each finite non-negative value and each midpoint between neighbours
// (and above max_normal the midpoint to, and the grid point of, a wider exponent
// range), with the fp32 values up to 3 ulps on either side; both signs; +-0 and
// the smallest fp32 subnormals.
std::vector<float> Decisions(ElemFormat f) {
  const ElemSpec& spec = Spec(f);
  std::vector<float> values;
  for (uint32_t code = 0; code < (1u << (spec.bits - 1)); ++code) {
    const float v = DecodeElem(static_cast<uint8_t>(code), f);
    if (std::isfinite(v)) values.push_back(v);
  }
  const float top_step = values.back() - values[values.size() - 2];
  values.push_back(values.back() + top_step);
  std::vector<float> points;
  for (size_t i = 0; i < values.size(); ++i) {
    points.push_back(values[i]);
    if (i + 1 < values.size()) points.push_back(0.5f * (values[i] + values[i + 1]));  // exact
  }
  std::vector<float> x;
  for (float p : points) {
    for (int ulps = -3; ulps <= 3; ++ulps) {
      const int64_t bits = static_cast<int64_t>(AsBits(p)) + ulps;
      if (bits < 0) continue;
      x.push_back(AsFloat(static_cast<uint32_t>(bits)));
      x.push_back(-AsFloat(static_cast<uint32_t>(bits)));
    }
  }
  for (uint32_t tiny : {0u, 1u, 2u, 3u, 0x400000u, 0x7FFFFFu}) {
    x.push_back(AsFloat(tiny));
    x.push_back(-AsFloat(tiny));
  }
  return x;
}

// Infinities, NaNs of both signs and payloads, fp32's extremes.
std::vector<float> Specials() {
  return {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
          AsFloat(0x7F800001u), AsFloat(0xFF800001u), AsFloat(0x7FFFFFFFu), FLT_MAX, -FLT_MAX, FLT_MIN,
          -FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f, -0.0f};
}

std::vector<float> WithinLimit(const std::vector<float>& x, float limit) {
  std::vector<float> kept;
  for (float v : x)
    if (std::fabs(v) < limit) kept.push_back(v);
  return kept;
}

// ---- the FP8 conversion's emulation ---------------------------------------------------

TEST(QuantCoreRneTest, SatfiniteFp8EmulationRoundsAsTheReference) {
  // Round to nearest even, then saturate: the reference's RoundToElem with EncodeElem,
  // for every input the instruction can see. A NaN gives a NaN code.
  for (ElemFormat f : {ElemFormat::kE4M3, ElemFormat::kE5M2}) {
    std::vector<float> x = EveryPatternStrided();
    for (const std::vector<float>& more : {DenseBelowLimit(f), Decisions(f), Specials()})
      x.insert(x.end(), more.begin(), more.end());
    Mismatches bad(std::string(Spec(f).name) + " emulated cvt.rn.satfinite");
    for (float w : x) {
      const uint32_t code = qcore::SatfiniteFp8Emulated(w, qcore::ConstsOf(f));
      const float want = RoundToElem(w, f, Rounding::kNearestEven, 0.0f);
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(DecodeElem(static_cast<uint8_t>(code), f))) << Spec(f).name << " " << w;
        continue;
      }
      bad.Check("SatfiniteFp8Emulated", w, Rounded{want, code}, want, EncodeElem(want, f));
    }
  }
}

template <ElemFormat F>
void CheckFp8x2Values() {
  for (uint32_t pair = 0; pair < 0x10000u; ++pair) {
    float lo, hi;
    qcore::Fp8x2Values<F>(pair, &lo, &hi);
    ASSERT_TRUE(SameFloat(lo, DecodeElem(static_cast<uint8_t>(pair & 0xFFu), F))) << std::hex << pair;
    ASSERT_TRUE(SameFloat(hi, DecodeElem(static_cast<uint8_t>(pair >> 8), F))) << std::hex << pair;
  }
  // The pair conversion puts its first operand in the low byte.
  EXPECT_EQ(qcore::SatfiniteFp8x2<F>(1.0f, -2.0f),
            EncodeElem(1.0f, F) | (static_cast<uint32_t>(EncodeElem(-2.0f, F)) << 8));
}

TEST(QuantCoreRneTest, Fp8x2ValuesDecodeEveryPairOfCodesInOrder) {
  CheckFp8x2Values<ElemFormat::kE4M3>();
  CheckFp8x2Values<ElemFormat::kE5M2>();
}

// ---- RneSmall ------------------------------------------------------------------------------

template <ElemFormat F>
void CheckRneSmall() {
  // Its domain: finite |w| < 2^(emax + 1) (kClamp), |w| <= max_normal (no clamp).
  std::vector<float> w = DenseBelowLimit(F);
  const std::vector<float> decisions = Decisions(F);
  w.insert(w.end(), decisions.begin(), decisions.end());
  w = WithinLimit(w, WLimit(F));
  Mismatches bad(std::string(Spec(F).name) + " RneSmall");
  for (float v : w) {
    const float want = RoundToElem(v, F, Rounding::kNearestEven, 0.0f);
    bad.Check("RneSmall<clamp>", v, qcore::RneSmall<F, true>(v), want, EncodeElem(want, F));
    if (std::fabs(v) <= Spec(F).max_normal)
      bad.Check("RneSmall<no clamp>", v, qcore::RneSmall<F, false>(v), want, EncodeElem(want, F));
  }
}

TEST(QuantCoreRneTest, RneSmallMatchesRoundToElemOverItsDomain) {
  CheckRneSmall<ElemFormat::kE4M3>();
  CheckRneSmall<ElemFormat::kE5M2>();
  CheckRneSmall<ElemFormat::kE3M2>();
  CheckRneSmall<ElemFormat::kE2M3>();
  CheckRneSmall<ElemFormat::kE2M1>();
}

// ---- nearest away through nearest even ------------------------------------------------------

// Every fp32 of magnitude below `limit` whose bits are a multiple of 512 (up to
// 2.3M of them), both signs: each binade, each pattern of the 14 significand bits
// above bit 8, and so every tie of every format (a tie has at most mbits + 2
// significant bits).
std::vector<float> DenseGridBelow(float limit) {
  std::vector<float> x;
  for (uint64_t b = 0; b < AsBits(limit); b += 512) {
    x.push_back(AsFloat(static_cast<uint32_t>(b)));
    x.push_back(-AsFloat(static_cast<uint32_t>(b)));
  }
  return x;
}

template <ElemFormat F>
void CheckTiesAway() {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  constexpr bool kFp8 = F == ElemFormat::kE4M3 || F == ElemFormat::kE5M2;
  // RneSmall's domain (|w| < 2^(emax + 1)): every bit pattern at stride 64, the
  // decisions +-3 ulps, and the dense sweep.
  std::vector<float> w = DenseGridBelow(WLimit(F));
  for (const std::vector<float>& more : {DenseBelowLimit(F), Decisions(F)}) w.insert(w.end(), more.begin(), more.end());
  w = WithinLimit(w, WLimit(F));
  Mismatches bad(std::string(Spec(F).name) + " TiesAwayInput");
  int64_t ties = 0;
  for (float v : w) {
    const float want = RoundToElem(v, F, Rounding::kNearestAway, 0.0f);
    const uint32_t want_code = EncodeElem(want, F);
    const Rounded core = qcore::RoundElemCore(AsBits(v), c, Rounding::kNearestAway, 0.0f);
    bad.Check("RoundElemCore nearest_away (the reference's twin)", v, core, want, want_code);
    bad.Check("RneSmall(TiesAwayInput)", v, qcore::RneSmall<F, true>(qcore::TiesAwayInput(v)), want, want_code);
    if constexpr (kFp8) {
      const uint32_t code = qcore::SatfiniteFp8Emulated(qcore::TiesAwayInput(v), c);
      bad.Check("cvt.rn.satfinite(TiesAwayInput)", v, Rounded{want, code}, want, want_code);
    }
    ties += RoundToElem(v, F, Rounding::kNearestEven, 0.0f) != want ? 1 : 0;
  }
  // The inputs reach the cases where the two modes differ, the ties that nearest
  // even rounds down (E2M1, the fewest: 0.25, 1.25, 2.5 and 5, both signs, twice).
  EXPECT_GE(ties, 16) << Spec(F).name;
  if constexpr (kFp8) {
    // The conversion also sees w beyond 2^(emax + 1) (per-tensor FP8, after the
    // clamp to +-FLT_MAX): every pattern at a prime stride, and fp32's extremes.
    std::vector<float> wide = EveryPatternStrided();
    wide.insert(wide.end(), {FLT_MAX, -FLT_MAX, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f, -0.0f});
    for (float v : wide) {
      if (!std::isfinite(v)) continue;
      const float want = RoundToElem(v, F, Rounding::kNearestAway, 0.0f);
      const uint32_t code = qcore::SatfiniteFp8Emulated(qcore::TiesAwayInput(v), c);
      bad.Check("cvt.rn.satfinite(TiesAwayInput), wide", v, Rounded{want, code}, want, EncodeElem(want, F));
    }
  }
}

TEST(QuantCoreRneTest, TiesAwayInputRoundedToNearestEvenIsNearestAway) {
  CheckTiesAway<ElemFormat::kE4M3>();
  CheckTiesAway<ElemFormat::kE5M2>();
  CheckTiesAway<ElemFormat::kE3M2>();
  CheckTiesAway<ElemFormat::kE2M3>();
  CheckTiesAway<ElemFormat::kE2M1>();
}

// ---- stochastic ------------------------------------------------------------------------------

// Uniforms that sit on the rounding decisions of the inputs above: 0, the
// smallest and largest, and each of 1/4, 1/2, 3/4 with its neighbours 2^-24 away
// (the fractions of midpoints and quarter points are exactly these).
std::vector<float> DecisionUniforms() {
  const float step = std::ldexp(1.0f, -24);
  std::vector<float> u = {0.0f, step, 1.0f - step};
  for (float f : {0.25f, 0.5f, 0.75f})
    for (float d : {-step, 0.0f, step}) u.push_back(f + d);
  return u;
}

template <ElemFormat F>
void CheckSrSmall() {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  std::vector<float> w = DenseGridBelow(WLimit(F));
  for (const std::vector<float>& more : {DenseBelowLimit(F), Decisions(F)}) w.insert(w.end(), more.begin(), more.end());
  w = WithinLimit(w, WLimit(F));
  const std::vector<float> uniforms = DecisionUniforms();
  Mismatches bad(std::string(Spec(F).name) + " SrSmall");
  int64_t k = 0;
  for (float v : w) {
    // Every decision uniform on the decision inputs (and a third of the dense
    // ones), a Philox draw on every input.
    const bool all = k++ % 3 == 0;
    for (size_t j = 0; j <= uniforms.size(); ++j) {
      if (j < uniforms.size() && !all) continue;
      const float u = j < uniforms.size() ? uniforms[j] : PhiloxUniform(7, static_cast<uint64_t>(k));
      const float want = RoundToElem(v, F, Rounding::kStochastic, u);
      const uint32_t want_code = EncodeElem(want, F);
      bad.Check("SrSmall<clamp>", v, qcore::SrSmall<F, true>(v, u), want, want_code);
      if (std::fabs(v) <= Spec(F).max_normal)
        bad.Check("SrSmall<no clamp>", v, qcore::SrSmall<F, false>(v, u), want, want_code);
      bad.Check("RoundElemCore", v, qcore::RoundElemCore(AsBits(v), c, Rounding::kStochastic, u), want, want_code);
    }
  }
}

TEST(QuantCoreRneTest, SrSmallMatchesRoundToElemOverItsDomain) {
  CheckSrSmall<ElemFormat::kE4M3>();
  CheckSrSmall<ElemFormat::kE5M2>();
  CheckSrSmall<ElemFormat::kE3M2>();
  CheckSrSmall<ElemFormat::kE2M3>();
  CheckSrSmall<ElemFormat::kE2M1>();
}

TEST(QuantCoreRneTest, AddRzBelowPow2TruncatesTheExactSum) {
  // a + b for b = 2^k, a < b: the sum's bits, truncated, are b's plus a's bits
  // at or above b's ulp (2^(k - 23)). Every a of a few binades below b at a prime
  // stride, and fp32's smallest.
  for (int k : {-10, 0, 3, 24, 100}) {
    const float b = std::ldexp(1.0f, k);
    for (uint32_t bits = 0; bits < AsBits(b); bits += 997) {
      const float a = AsFloat(bits);
      // floor(a / ulp) * ulp + b, computed in double (exact: both fit 53 bits).
      const double ulp = std::ldexp(1.0, k - 23);
      const double want = std::floor(static_cast<double>(a) / ulp) * ulp + static_cast<double>(b);
      ASSERT_EQ(static_cast<double>(qcore::AddRzBelowPow2(a, b)), want) << std::hexfloat << a << " + " << b;
    }
  }
}

// ---- MX ------------------------------------------------------------------------------------

// Rows of blocks of 32 along a row: each block's first element is the largest
// fp32 whose floor(log2) is e + emax, so the block exponent is e; the other 31 are
// candidates w * 2^e (candidates of the element's own scale moved to the block's).
void AddMxBlocks(ElemFormat f, int e, const std::vector<float>& w, std::vector<float>* x) {
  const float setter = AsFloat((static_cast<uint32_t>(e + Spec(f).emax + 127) << 23) | 0x7FFFFFu);
  for (size_t i = 0; i < w.size(); i += 31) {
    x->push_back(setter);
    for (size_t k = i; k < i + 31; ++k) x->push_back(k < w.size() ? std::ldexp(w[k], e) : 0.0f);
  }
}

template <ElemFormat F, Rounding R>
void CheckMxPaths() {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  constexpr bool kFp8 = F == ElemFormat::kE4M3 || F == ElemFormat::kE5M2;
  const std::vector<float> decisions = WithinLimit(Decisions(F), WLimit(F));
  const std::vector<float> dense = WithinLimit(DenseBelowLimit(F), WLimit(F));
  std::vector<float> x;
  for (int e = -127; e <= 127 - c.emax; ++e) AddMxBlocks(F, e, decisions, &x);
  for (int e : {-127, -126 + c.emax, -1, 0, 1, 127 - c.emax}) AddMxBlocks(F, e, dense, &x);
  const int64_t n = static_cast<int64_t>(x.size());
  MxOptions o;
  o.elem = F;
  o.rounding = R;
  o.seed = 0x5EED;
  std::vector<float> want(n);
  std::vector<uint8_t> want_codes(n), want_scales(n / 32);
  ASSERT_TRUE(MxQuantizeRef(x.data(), 1, n, o, want.data(), want_codes.data(), want_scales.data()).ok());

  std::vector<qcore::MxScale> scales(n / 32);
  for (int64_t b = 0; b < n / 32; ++b) {
    uint32_t amax = 0;
    for (int64_t i = b * 32; i < b * 32 + 32; ++i) amax = std::max(amax, qcore::AbsBits(x[i]));
    scales[b] = qcore::MxScaleFromAmax(amax, c, false);
    ASSERT_EQ(scales[b].byte, want_scales[b]) << Spec(F).name << " block " << b;
  }
  Mismatches bad(std::string(Spec(F).name) + " MX " + RoundingName(R));
  for (int64_t i = 0; i < n; ++i) {
    const qcore::MxScale& s = scales[i / 32];
    if constexpr (R == Rounding::kStochastic) {
      const float u = PhiloxUniform(o.seed, static_cast<uint64_t>(i));
      bad.Check("MxElementSr", x[i], qcore::MxElementSr<F>(x[i], s, u), want[i], want_codes[i]);
    } else {
      bad.Check("MxElementNearest", x[i], qcore::MxElementNearest<F, R>(x[i], s), want[i], want_codes[i]);
    }
    if constexpr (kFp8 && R != Rounding::kStochastic) {
      // The pair as the kernels convert it: along rows both from one block, down
      // columns from two blocks (here 37 blocks apart, another exponent).
      const int64_t j = (i + 37 * 32) % n;
      Rounded q0, q1, codes0, codes1;
      qcore::MxFp8PairNearest<F, R>(x[i], x[j], s, scales[j / 32], true, &q0, &q1);
      qcore::MxFp8PairNearest<F, R>(x[i], x[j], s, scales[j / 32], false, &codes0, &codes1);
      bad.Check("MxFp8PairNearest lo", x[i], q0, want[i], want_codes[i]);
      bad.Check("MxFp8PairNearest hi", x[j], q1, want[j], want_codes[j]);
      bad.Check("MxFp8PairNearest codes only", x[i], Rounded{want[i], codes0.code}, want[i], want_codes[i]);
      bad.Check("MxFp8PairNearest codes only", x[j], Rounded{want[j], codes1.code}, want[j], want_codes[j]);
    }
  }
}

TEST(QuantCoreRneTest, MxNearestEvenPathsMatchTheReferenceAtEveryBlockExponent) {
  // NaN blocks never reach these functions (the kernels select MxNanElement);
  // cuda_quant_test's MX cases on its "specials" inputs cover them on a GPU.
  CheckMxPaths<ElemFormat::kE4M3, Rounding::kNearestEven>();
  CheckMxPaths<ElemFormat::kE5M2, Rounding::kNearestEven>();
  CheckMxPaths<ElemFormat::kE3M2, Rounding::kNearestEven>();
  CheckMxPaths<ElemFormat::kE2M3, Rounding::kNearestEven>();
  CheckMxPaths<ElemFormat::kE2M1, Rounding::kNearestEven>();
}

TEST(QuantCoreRneTest, MxStochasticPathMatchesTheReferenceAtEveryBlockExponent) {
  CheckMxPaths<ElemFormat::kE4M3, Rounding::kStochastic>();
  CheckMxPaths<ElemFormat::kE5M2, Rounding::kStochastic>();
  CheckMxPaths<ElemFormat::kE3M2, Rounding::kStochastic>();
  CheckMxPaths<ElemFormat::kE2M3, Rounding::kStochastic>();
  CheckMxPaths<ElemFormat::kE2M1, Rounding::kStochastic>();
}

TEST(QuantCoreRneTest, MxNearestAwayPathsMatchTheReferenceAtEveryBlockExponent) {
  CheckMxPaths<ElemFormat::kE4M3, Rounding::kNearestAway>();
  CheckMxPaths<ElemFormat::kE5M2, Rounding::kNearestAway>();
  CheckMxPaths<ElemFormat::kE3M2, Rounding::kNearestAway>();
  CheckMxPaths<ElemFormat::kE2M3, Rounding::kNearestAway>();
  CheckMxPaths<ElemFormat::kE2M1, Rounding::kNearestAway>();
}

// ---- per-tensor FP8 --------------------------------------------------------------------------

// One tensor, quantized by the reference and by the kernels' two nearest-even
// paths (Fp8TensorPairRne on sm_89+, Fp8Element below), pair by pair.
template <ElemFormat F, Rounding R>
void CheckFp8Tensor(const std::vector<float>& x, const std::string& what) {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> want(n);
  std::vector<uint8_t> want_codes(n);
  float want_decode = 0.0f;
  ASSERT_TRUE(Fp8TensorQuantizeRef(x.data(), n, F, R, 0, want.data(), want_codes.data(), &want_decode).ok());
  uint32_t amax = 0;
  for (float v : x) amax = std::max(amax, qcore::AbsBitsNoNan(v));
  const qcore::Fp8Scale s = qcore::Fp8ScaleFromAmax(AsFloat(amax), c);
  ASSERT_EQ(AsBits(s.inv), AsBits(want_decode)) << what;
  Mismatches bad(std::string(Spec(F).name) + " per-tensor FP8 " + RoundingName(R) + ", " + what);
  for (int64_t i = 0; i < n; ++i) {
    bad.Check("Fp8Element", x[i], qcore::Fp8Element(x[i], s, c, R, 0.0f), want[i], want_codes[i]);
    const int64_t j = (i + 1) % n;
    Rounded q0, q1, raw0, raw1;
    qcore::Fp8TensorPairNearest<F, R>(x[i], x[j], s.scale, s.inv, true, &q0, &q1);
    bad.Check("Fp8TensorPairNearest lo", x[i], q0, want[i], want_codes[i]);
    bad.Check("Fp8TensorPairNearest hi", x[j], q1, want[j], want_codes[j]);
    // Without the tensor scale the output is the code's value.
    qcore::Fp8TensorPairNearest<F, R>(x[i], x[j], s.scale, 1.0f, true, &raw0, &raw1);
    bad.Check("Fp8TensorPairNearest unscaled", x[i], raw0, DecodeElem(want_codes[i], F), want_codes[i]);
  }
}

template <ElemFormat F, Rounding R>
void CheckFp8TensorPaths() {
  const float max_normal = Spec(F).max_normal;
  // An infinite amax makes the scale 1: every input reaches the conversion as it
  // is, beyond max_normal, infinities and NaNs included.
  std::vector<float> x = {INFINITY};
  for (const std::vector<float>& more : {EveryPatternStrided(), DenseBelowLimit(F), Decisions(F), Specials()})
    x.insert(x.end(), more.begin(), more.end());
  CheckFp8Tensor<F, R>(x, "scale 1");
  // Power-of-two scales 2^k (amax = max_normal / 2^k): x * scale is exact, so
  // the decisions arrive unchanged.
  for (int k : {-100, -3, 0, 5, 127}) {
    const float amax = std::ldexp(max_normal, -k);
    std::vector<float> y = {amax};
    for (float w : WithinLimit(Decisions(F), max_normal)) y.push_back(std::ldexp(w, -k));
    CheckFp8Tensor<F, R>(y, "scale 2^" + std::to_string(k));
  }
  // Scales that are not powers of two: the product's rounding comes first.
  for (float amax : {3.7f, 1e-30f, 6e37f}) {
    std::vector<float> y = WithinLimit(EveryPatternStrided(), amax);
    y.push_back(amax);
    for (float w : WithinLimit(Decisions(F), max_normal)) y.push_back(w * (amax / max_normal));
    CheckFp8Tensor<F, R>(y, "amax " + std::to_string(amax));
  }
}

TEST(QuantCoreRneTest, Fp8TensorNearestEvenPathsMatchTheReference) {
  CheckFp8TensorPaths<ElemFormat::kE4M3, Rounding::kNearestEven>();
  CheckFp8TensorPaths<ElemFormat::kE5M2, Rounding::kNearestEven>();
}

TEST(QuantCoreRneTest, Fp8TensorNearestAwayPathsMatchTheReference) {
  CheckFp8TensorPaths<ElemFormat::kE4M3, Rounding::kNearestAway>();
  CheckFp8TensorPaths<ElemFormat::kE5M2, Rounding::kNearestAway>();
}

// ---- NVFP4 -------------------------------------------------------------------------------------

// x (1 x n, n a multiple of 16, 1x16 blocks along the row) by the reference and
// by Nvfp4RoundRne on whole blocks and on halves (the two kernels' block sizes).
void CheckNvfp4(const std::vector<float>& x, const std::string& what) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> want(n);
  std::vector<uint8_t> want_codes(n), want_scales(n / 16);
  float want_s_dec = 0.0f;
  ASSERT_TRUE(Nvfp4QuantizeRef(x.data(), 1, n, Nvfp4Options{}, want.data(), want_codes.data(), want_scales.data(),
                               &want_s_dec).ok());
  uint32_t amax = 0;
  for (float v : x) amax = std::max(amax, qcore::AbsBits(v));
  const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(AsFloat(amax));
  ASSERT_TRUE(SameFloat(t.s_dec, want_s_dec)) << what;
  Mismatches bad("NVFP4 nearest_even, " + what);
  for (int64_t b = 0; b < n / 16; ++b) {
    float y[16], half_y[8];
    uint32_t block_amax = 0;
    for (int k = 0; k < 16; ++k) {
      y[k] = x[b * 16 + k];
      block_amax = std::max(block_amax, qcore::AbsBits(y[k]));
    }
    const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromAmax(AsFloat(block_amax), t);
    ASSERT_EQ(s.code, want_scales[b]) << what << " block " << b;
    uint32_t code[16], codes_only[16], half_code[8];
    float out[16], unused[16], half_out[8];
    qcore::Nvfp4RoundRne(y, s, t, true, code, out);
    qcore::Nvfp4RoundRne(y, s, t, false, codes_only, unused);
    for (int k = 0; k < 16; ++k) {
      const int64_t i = b * 16 + k;
      if (k % 8 == 0) {
        std::copy(y + k, y + k + 8, half_y);
        qcore::Nvfp4RoundRne(half_y, s, t, true, half_code, half_out);
      }
      bad.Check("Nvfp4RoundRne<16>", x[i], Rounded{out[k], code[k]}, want[i], want_codes[i]);
      bad.Check("Nvfp4RoundRne<16> codes only", x[i], Rounded{want[i], codes_only[k]}, want[i], want_codes[i]);
      bad.Check("Nvfp4RoundRne<8>", x[i], Rounded{half_out[k % 8], half_code[k % 8]}, want[i], want_codes[i]);
    }
  }
}

// Blocks of 16: a setter of magnitude `amax_b` first, then candidates that land
// on E2M1's rounding decisions when scaled by 6 / amax_b.
void AddNvfp4Blocks(float amax_b, const std::vector<float>& w, std::vector<float>* x) {
  for (size_t i = 0; i < w.size(); i += 15) {
    x->push_back(amax_b);
    for (size_t k = i; k < i + 15; ++k) x->push_back(k < w.size() ? w[k] * (amax_b / 6.0f) : -0.0f);
  }
}

TEST(QuantCoreRneTest, Nvfp4NearestEvenMatchesTheReference) {
  // |w| <= 6, so that no candidate exceeds its block's setter.
  const std::vector<float> w = WithinLimit(Decisions(ElemFormat::kE2M1), std::nextafter(6.0f, 7.0f));
  // Block amaxes over E4M3's range below the tensor amax and past its bottom
  // (block scales that round to E4M3 subnormals and to zero), at several tensor
  // amaxes.
  for (int top : {-100, -10, 0, 10, 100}) {
    std::vector<float> x;
    for (int below = 0; below <= 20; ++below) AddNvfp4Blocks(std::ldexp(1.37f, top - below), w, &x);
    CheckNvfp4(x, "tensor amax 1.37 * 2^" + std::to_string(top));
  }
  std::vector<float> inf;
  AddNvfp4Blocks(1.0f, w, &inf);
  inf[20] = INFINITY;  // the tensor amax is Inf; y * s_b = Inf clamps to 6
  inf[40] = -INFINITY;
  CheckNvfp4(inf, "with +-Inf");
  std::vector<float> nan = inf;
  nan[41] = std::numeric_limits<float>::quiet_NaN();  // every block scale NaN
  CheckNvfp4(nan, "with a NaN");
  std::vector<float> tiny;  // fp32 subnormals of both signs and +-0
  for (uint32_t bits = 0; bits < 64; ++bits) tiny.push_back((bits & 1) ? -AsFloat(bits) : AsFloat(bits));
  CheckNvfp4(tiny, "subnormal");
}

TEST(QuantCoreRneTest, Nvfp4ElementSrMatchesNvfp4ElementForEveryInput) {
  // As the nearest-even test below, each input with one of the decision uniforms
  // (in turn) and a Philox draw.
  std::vector<float> y = EveryPatternStrided();
  y.erase(std::remove_if(y.begin(), y.end(), [](float v) { return std::isnan(v); }), y.end());
  for (float v : Specials())
    if (!std::isnan(v)) y.push_back(v);
  const std::vector<float> decision_uniforms = DecisionUniforms();
  Mismatches bad("Nvfp4ElementSr");
  int64_t k = 0;
  for (float amax_t : {1.0f, 3e-30f, 2e38f}) {
    const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(amax_t);
    for (uint32_t code = 0; code < 0x7Fu; code += 7) {
      const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromCode(code, t);
      ASSERT_FALSE(std::isnan(s.s_b));
      for (float v : y) {
        const float uniforms[2] = {decision_uniforms[k % decision_uniforms.size()],
                                   PhiloxUniform(11, static_cast<uint64_t>(k))};
        ++k;
        for (float u : uniforms) {
          const Rounded want = qcore::Nvfp4Element(v, s, Rounding::kStochastic, u);
          bad.Check("Nvfp4ElementSr", v, qcore::Nvfp4ElementSr(v, s.s_b, u), want.value, want.code);
        }
      }
    }
  }
}

TEST(QuantCoreRneTest, Nvfp4ElementRneMatchesNvfp4ElementForEveryInput) {
  // Every y that is not NaN (the block scale is NaN then, and Nvfp4RoundRne takes
  // the whole block), against every block scale of E4M3 codes at three tensor
  // scales: infinite products, products beyond +-6 and fp32 subnormals included.
  std::vector<float> y = EveryPatternStrided();
  y.erase(std::remove_if(y.begin(), y.end(), [](float v) { return std::isnan(v); }), y.end());
  const std::vector<float> more = Specials();
  for (float v : more)
    if (!std::isnan(v)) y.push_back(v);
  Mismatches bad("Nvfp4ElementRne");
  for (float amax_t : {1.0f, 3e-30f, 2e38f}) {
    const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(amax_t);
    for (uint32_t code = 0; code < 0x7Fu; code += 3) {
      const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromCode(code, t);
      ASSERT_FALSE(std::isnan(s.s_b));
      for (float v : y) {
        const Rounded want = qcore::Nvfp4Element(v, s, Rounding::kNearestEven, 0.0f);
        bad.Check("Nvfp4ElementRne", v, qcore::Nvfp4ElementRne(v, s.s_b), want.value, want.code);
      }
    }
  }
}

}  // namespace
}  // namespace keel
