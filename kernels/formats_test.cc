// Exhaustive tests of the element formats (docs/numerics.md, "Element formats"):
// every code, every midpoint between neighbouring values, saturation, specials,
// E8M0, BF16, and the Philox stream stochastic rounding draws from.
#include "kernels/formats.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/philox.h"

namespace keel {
namespace {

const ElemFormat kAll[] = {ElemFormat::kE4M3, ElemFormat::kE5M2, ElemFormat::kE3M2,
                           ElemFormat::kE2M3, ElemFormat::kE2M1};
const Rounding kModes[] = {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic};

bool IsNanCode(uint8_t code, ElemFormat f) { return std::isnan(DecodeElem(code, f)); }

// All finite non-negative values of a format, ascending, with their codes.
std::vector<std::pair<float, uint8_t>> PositiveValues(ElemFormat f) {
  std::vector<std::pair<float, uint8_t>> values;
  const int half = 1 << (Spec(f).bits - 1);
  for (int code = 0; code < half; ++code) {
    float v = DecodeElem(static_cast<uint8_t>(code), f);
    if (std::isfinite(v)) values.push_back({v, static_cast<uint8_t>(code)});
  }
  return values;
}

TEST(FormatsTest, SpecTableMatchesNumericsSection1) {
  for (ElemFormat f : kAll) {
    const ElemSpec& s = Spec(f);
    SCOPED_TRACE(s.name);
    EXPECT_EQ(s.bits, 1 + s.ebits + s.mbits);
    EXPECT_EQ(s.min_normal, std::ldexp(1.0f, 1 - s.bias));
    EXPECT_EQ(s.min_subnormal, std::ldexp(1.0f, 1 - s.bias - s.mbits));
    // The largest finite code decodes to max_normal.
    std::vector<std::pair<float, uint8_t>> values = PositiveValues(f);
    EXPECT_EQ(values.back().first, s.max_normal);
    EXPECT_EQ(std::ilogb(s.max_normal), s.emax);
  }
  EXPECT_EQ(Spec(ElemFormat::kE4M3).max_normal, 448.0f);
  EXPECT_EQ(Spec(ElemFormat::kE5M2).max_normal, 57344.0f);
  EXPECT_EQ(Spec(ElemFormat::kE3M2).max_normal, 28.0f);
  EXPECT_EQ(Spec(ElemFormat::kE2M3).max_normal, 7.5f);
  EXPECT_EQ(Spec(ElemFormat::kE2M1).max_normal, 6.0f);
}

TEST(FormatsTest, EveryCodeDecodesAndReencodesToItself) {
  for (ElemFormat f : kAll) {
    SCOPED_TRACE(Spec(f).name);
    for (int code = 0; code < (1 << Spec(f).bits); ++code) {
      float v = DecodeElem(static_cast<uint8_t>(code), f);
      if (std::isnan(v)) {
        // E5M2 has three NaN payloads per sign; all encode to the canonical quiet one.
        uint8_t back = EncodeElem(v, f);
        EXPECT_TRUE(IsNanCode(back, f)) << code;
        EXPECT_EQ(back >> 7, code >> 7) << "NaN keeps its sign, code " << code;
        continue;
      }
      EXPECT_EQ(EncodeElem(v, f), code) << "value " << v;
      // Representable values are fixed points of every rounding mode.
      if (std::isfinite(v)) {
        for (Rounding r : kModes) {
          for (float u : {0.0f, 0.5f, 0.999f}) {
            float back = RoundToElem(v, f, r, u);
            EXPECT_EQ(FloatBits(back), FloatBits(v)) << v << " " << RoundingName(r);
          }
        }
      }
    }
  }
}

TEST(FormatsTest, SpecialCodes) {
  EXPECT_TRUE(std::isnan(DecodeElem(0x7F, ElemFormat::kE4M3)));
  EXPECT_TRUE(std::isnan(DecodeElem(0xFF, ElemFormat::kE4M3)));
  EXPECT_EQ(DecodeElem(0x7E, ElemFormat::kE4M3), 448.0f);
  EXPECT_EQ(DecodeElem(0x78, ElemFormat::kE4M3), 256.0f);  // E4M3 uses exponent 15 for normals
  EXPECT_EQ(DecodeElem(0x7C, ElemFormat::kE5M2), std::numeric_limits<float>::infinity());
  EXPECT_EQ(DecodeElem(0xFC, ElemFormat::kE5M2), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(DecodeElem(0x7D, ElemFormat::kE5M2)));
  EXPECT_EQ(DecodeElem(0x01, ElemFormat::kE4M3), 0x1p-9f);
  EXPECT_EQ(DecodeElem(0x01, ElemFormat::kE5M2), 0x1p-16f);
  EXPECT_EQ(DecodeElem(0x01, ElemFormat::kE3M2), 0x1p-4f);
  EXPECT_EQ(DecodeElem(0x01, ElemFormat::kE2M3), 0x1p-3f);
  EXPECT_EQ(DecodeElem(0x01, ElemFormat::kE2M1), 0.5f);
  // No NaN or Inf in the 6- and 4-bit formats: their top codes are numbers.
  EXPECT_EQ(DecodeElem(0x1F, ElemFormat::kE3M2), 28.0f);
  EXPECT_EQ(DecodeElem(0x1F, ElemFormat::kE2M3), 7.5f);
  EXPECT_EQ(DecodeElem(0x07, ElemFormat::kE2M1), 6.0f);
  EXPECT_EQ(DecodeElem(0x0F, ElemFormat::kE2M1), -6.0f);
  // E2M1's whole grid.
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(DecodeElem(static_cast<uint8_t>(c), ElemFormat::kE2M1), grid[c]);
}

// Midpoints between neighbours: ties go to the even code (nearest_even) or to the
// larger magnitude (nearest_away); just below or above a midpoint goes to the
// nearer neighbour in both; stochastic goes up iff u < fraction (here 0.5).
TEST(FormatsTest, EveryMidpointRoundsAsEachModeSays) {
  for (ElemFormat f : kAll) {
    SCOPED_TRACE(Spec(f).name);
    std::vector<std::pair<float, uint8_t>> values = PositiveValues(f);
    for (size_t i = 0; i + 1 < values.size(); ++i) {
      const float lo = values[i].first, hi = values[i + 1].first;
      const float mid = (lo + hi) / 2;  // exact: a few bits more than the format
      const float even = (values[i].second & 1) == 0 ? lo : hi;
      for (float sign : {1.0f, -1.0f}) {
        float m = sign * mid;
        EXPECT_EQ(RoundToElem(m, f, Rounding::kNearestEven, 0), sign * even) << m;
        EXPECT_EQ(RoundToElem(m, f, Rounding::kNearestAway, 0), sign * hi) << m;
        EXPECT_EQ(RoundToElem(m, f, Rounding::kStochastic, 0.4999999f), sign * hi) << m;
        EXPECT_EQ(RoundToElem(m, f, Rounding::kStochastic, 0.5f), sign * lo) << m;
        float below = sign * std::nextafter(mid, 0.0f);
        float above = sign * std::nextafter(mid, 1e30f);
        for (Rounding r : {Rounding::kNearestEven, Rounding::kNearestAway}) {
          EXPECT_EQ(RoundToElem(below, f, r, 0), sign * lo) << below;
          EXPECT_EQ(RoundToElem(above, f, r, 0), sign * hi) << above;
        }
        // Stochastic never leaves the bracketing pair.
        EXPECT_EQ(RoundToElem(below, f, Rounding::kStochastic, 0.0f), sign * hi);
        EXPECT_EQ(RoundToElem(below, f, Rounding::kStochastic, 0.9999999f), sign * lo);
      }
    }
  }
}

TEST(FormatsTest, SaturatesAfterRoundingNeverInf) {
  for (ElemFormat f : kAll) {
    SCOPED_TRACE(Spec(f).name);
    const float max = Spec(f).max_normal;
    for (Rounding r : kModes) {
      for (float v : {std::nextafter(max, 1e30f), max * 1.0625f, max * 1.5f, max * 2, 1e30f,
                      std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()}) {
        EXPECT_EQ(RoundToElem(v, f, r, 0.0f), max) << v;
        EXPECT_EQ(RoundToElem(-v, f, r, 0.0f), -max) << v;
      }
    }
  }
  // E4M3: 464 is the midpoint of 448 and the (out of range) 480; it rounds to 448.
  EXPECT_EQ(RoundToElem(464.0f, ElemFormat::kE4M3, Rounding::kNearestAway, 0), 448.0f);
  EXPECT_EQ(RoundToElem(500.0f, ElemFormat::kE4M3, Rounding::kNearestEven, 0), 448.0f);
}

TEST(FormatsTest, NanAndZeroAndSubnormals) {
  for (ElemFormat f : kAll) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (Rounding r : kModes) EXPECT_TRUE(std::isnan(RoundToElem(nan, f, r, 0)));
    EXPECT_EQ(FloatBits(RoundToElem(0.0f, f, Rounding::kNearestEven, 0)), 0u);
    EXPECT_EQ(FloatBits(RoundToElem(-0.0f, f, Rounding::kNearestEven, 0)), 0x80000000u);
    // Half the smallest subnormal is a tie with zero.
    const float half = Spec(f).min_subnormal / 2;
    EXPECT_EQ(RoundToElem(half, f, Rounding::kNearestEven, 0), 0.0f);
    EXPECT_EQ(RoundToElem(half, f, Rounding::kNearestAway, 0), Spec(f).min_subnormal);
    // A tiny negative rounds to -0 (the sign is kept, as hardware conversions do).
    EXPECT_EQ(FloatBits(RoundToElem(-1e-30f, f, Rounding::kNearestEven, 0)), 0x80000000u);
    EXPECT_EQ(FloatBits(RoundToElem(0x1p-149f, f, Rounding::kNearestAway, 0)), 0u);
  }
}

TEST(FormatsTest, E8M0) {
  for (int e = -127; e <= 127; ++e) {
    uint8_t byte = EncodeE8M0(e);
    EXPECT_EQ(byte, e + 127);
    EXPECT_EQ(DecodeE8M0(byte), std::ldexp(1.0f, e));
  }
  EXPECT_EQ(EncodeE8M0(128), kE8M0Nan);
  EXPECT_EQ(EncodeE8M0(-128), kE8M0Nan);
  EXPECT_TRUE(std::isnan(DecodeE8M0(0xFF)));
  EXPECT_EQ(DecodeE8M0(0), 0x1p-127f);  // no zero in E8M0
}

TEST(FormatsTest, Bf16EveryCodeAndEveryMidpoint) {
  for (uint32_t code = 0; code < 0x10000; ++code) {
    float v = Bf16ToFloat(static_cast<uint16_t>(code));
    for (Rounding r : kModes) {
      uint16_t back = FloatToBf16(v, r, 0.5f);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(Bf16ToFloat(back)));
        continue;
      }
      ASSERT_EQ(back, code) << RoundingName(r);
    }
    if (!std::isfinite(v) || (code & 0x7FFF) == 0x7F7F) continue;  // no upper neighbour
    // The midpoint to the next code (in magnitude) has low 16 bits 0x8000.
    float mid = BitsFloat((code << 16) | 0x8000u);
    uint16_t up = static_cast<uint16_t>(code + 1);
    uint16_t even = (code & 1) ? up : static_cast<uint16_t>(code);
    ASSERT_EQ(FloatToBf16(mid, Rounding::kNearestEven, 0), even) << code;
    ASSERT_EQ(FloatToBf16(mid, Rounding::kNearestAway, 0), up) << code;
    ASSERT_EQ(FloatToBf16(BitsFloat((code << 16) | 0x7FFFu), Rounding::kNearestAway, 0), code);
    ASSERT_EQ(FloatToBf16(BitsFloat((code << 16) | 0x8001u), Rounding::kNearestEven, 0), up);
  }
  // Overflow under round-to-nearest goes to Inf, as IEEE says.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max(), Rounding::kNearestEven, 0), 0x7F80);
  // NaN stays NaN, quiet, with its sign.
  EXPECT_EQ(FloatToBf16(BitsFloat(0xFF800001u), Rounding::kNearestEven, 0) & 0xFFC0, 0xFFC0);
}

TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  // Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors):
  // counter words 0..3, key words 0..1, then the four output words.
  struct Kat {
    uint32_t in[6];
    uint32_t out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0, 0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4 got = Philox4x32(k.in[0], k.in[1], k.in[2], k.in[3], k.in[4], k.in[5]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.v[w], k.out[w]) << "vector " << (&k - kats) << " word " << w;
  }
}

TEST(PhiloxTest, UniformIsInUnitIntervalAndSeedDependent) {
  double sum = 0;
  const int n = 1 << 20;
  int same = 0;
  for (int i = 0; i < n; ++i) {
    float u = PhiloxUniform(42, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    same += PhiloxUniform(43, i) == u;
  }
  // Mean of n uniforms: sd = sqrt(1/12/n) = 2.8e-4; 6 sd bound.
  EXPECT_NEAR(sum / n, 0.5, 6 * std::sqrt(1.0 / 12 / n));
  EXPECT_LT(same, 16);  // two seeds agree only by chance (p = 2^-24 per draw)
}

// Stochastic rounding is unbiased: the mean of many roundings of x is x. With
// n draws the mean's standard deviation is quantum * sqrt(f (1 - f) / n); we
// allow 5 standard deviations (a false failure about once in 1.7 million runs).
TEST(FormatsTest, StochasticRoundingIsUnbiased) {
  const int n = 200000;
  for (ElemFormat f : kAll) {
    SCOPED_TRACE(Spec(f).name);
    for (float x : {Spec(f).min_subnormal * 0.3f, Spec(f).min_normal * 1.37f, 1.1f, -1.3f,
                    Spec(f).max_normal * 0.77f}) {
      float lo = RoundToElem(x, f, Rounding::kStochastic, 0.9999999f);
      float hi = RoundToElem(x, f, Rounding::kStochastic, 0.0f);
      double quantum = std::fabs(hi - lo);
      double frac = quantum == 0 ? 0 : std::fabs(x - lo) / quantum;
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += RoundToElem(x, f, Rounding::kStochastic, PhiloxUniform(7, i));
      double sd = quantum * std::sqrt(frac * (1 - frac) / n);
      EXPECT_NEAR(sum / n, x, 5 * sd + 1e-12) << "x=" << x << " quantum=" << quantum;
    }
  }
  // BF16 too.
  const float x = 1.0f + 0x1p-9f + 0x1p-11f;  // 5/8 of the way to the next bf16 value... in ulps
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += Bf16ToFloat(FloatToBf16(x, Rounding::kStochastic, PhiloxUniform(9, i)));
  const double quantum = 0x1p-7, frac = (x - 1.0) / quantum;
  EXPECT_NEAR(sum / n, x, 5 * quantum * std::sqrt(frac * (1 - frac) / n));
}

}  // namespace
}  // namespace keel
