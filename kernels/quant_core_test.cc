// quant_core.h against the CPU reference, bit for bit. The CUDA kernels do their
// arithmetic only through quant_core.h, so this test (which needs no GPU) is CI's
// guard on the GPU numbers: element rounding and codes for every format and mode,
// BF16 rounding, block and tensor scales, the RHT, and whole MX / NVFP4 / FP8
// quantizations assembled from quant_core.h the way the kernels assemble them.
#include "kernels/quant_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/philox.h"
#include "kernels/quantize.h"

namespace keel {
namespace {

using qcore::AsBits;
using qcore::AsFloat;
using qcore::ConstsOf;
using qcore::ElemConsts;
using qcore::Rounded;

const ElemFormat kFormats[] = {ElemFormat::kE4M3, ElemFormat::kE5M2, ElemFormat::kE3M2,
                               ElemFormat::kE2M3, ElemFormat::kE2M1};

// Every finite non-negative value of a format, in code order.
std::vector<float> PositiveGrid(ElemFormat f) {
  std::vector<float> grid;
  for (uint32_t code = 0; code < (1u << (Spec(f).bits - 1)); ++code) {
    float v = DecodeElem(static_cast<uint8_t>(code), f);
    if (std::isfinite(v)) grid.push_back(v);
  }
  return grid;
}
const Rounding kModes[] = {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic};

std::string Describe(ElemFormat f, Rounding mode, float x, float u) {
  char text[160];
  std::snprintf(text, sizeof(text), "%s %s x=%a (0x%08x) u=%a", Spec(f).name, RoundingName(mode),
                static_cast<double>(x), AsBits(x), static_cast<double>(u));
  return text;
}

bool SameFloat(float a, float b) {  // bitwise, any NaN equal to any NaN
  return AsBits(a) == AsBits(b) || (std::isnan(a) && std::isnan(b));
}

// Checks one input; returns false (and records a failure, a few times at most) on
// a mismatch so that loops over millions of values stop early.
int g_reported = 0;
bool CheckElem(ElemFormat f, Rounding mode, float x, float u) {
  const float want = RoundToElem(x, f, mode, u);
  const uint8_t want_code = EncodeElem(want, f);
  const Rounded got = qcore::RoundElem(x, ConstsOf(f), mode, u);
  if (AsBits(got.value) == AsBits(want) && got.code == want_code) return true;
  if (g_reported++ < 10)
    ADD_FAILURE() << Describe(f, mode, x, u) << ": value " << got.value << " (0x" << std::hex
                  << AsBits(got.value) << ") code 0x" << got.code << ", reference " << want
                  << " (0x" << AsBits(want) << ") code 0x" << int{want_code};
  return false;
}

// The uniforms a stochastic check tries for x: the boundaries around the exact
// fraction of |x| in quanta (u < fraction rounds up), and a few others.
std::vector<float> UniformsFor(ElemFormat f, float x, std::mt19937_64& rng) {
  std::vector<float> us = {0.0f, 0x1p-24f, 0.5f, 1.0f - 0x1p-24f};
  const ElemSpec& spec = Spec(f);
  float m = std::fabs(x);
  if (std::isfinite(m) && m < spec.max_normal) {
    int p = 1 - spec.bias;
    if (m != 0.0f) p = std::max(p, qcore::FloorLog2(m));
    float n = std::ldexp(m, spec.mbits - p);
    float fraction = n - std::floor(n);
    us.push_back(fraction);
    us.push_back(std::nextafter(fraction, 0.0f));
    us.push_back(std::nextafter(fraction, 1.0f));
  }
  us.push_back(static_cast<float>(rng() >> 40) * 0x1p-24f);
  return us;
}

TEST(QuantCoreTest, ElemConstsMatchSpec) {
  for (ElemFormat f : kFormats) {
    const ElemSpec& spec = Spec(f);
    const ElemConsts c = ConstsOf(f);
    EXPECT_EQ(c.bits, spec.bits) << spec.name;
    EXPECT_EQ(c.mbits, spec.mbits) << spec.name;
    EXPECT_EQ(c.bias, spec.bias) << spec.name;
    EXPECT_EQ(c.emax, spec.emax) << spec.name;
    EXPECT_EQ(AsFloat(c.max_bits), spec.max_normal) << spec.name;
    EXPECT_EQ(c.max_code, EncodeElem(spec.max_normal, f)) << spec.name;
    EXPECT_EQ(c.nan_code, EncodeElem(std::numeric_limits<float>::quiet_NaN(), f)) << spec.name;
  }
  for (uint32_t b = 0; b < 0x10000u; ++b)
    ASSERT_EQ(AsBits(qcore::Bf16Value(static_cast<uint16_t>(b))), AsBits(Bf16ToFloat(static_cast<uint16_t>(b))));
}

TEST(QuantCoreTest, FloorLog2MatchesFrexpIncludingSubnormals) {
  for (uint32_t a = 1; a < (1u << 23); a += 7) {  // subnormals
    int k;
    std::frexp(AsFloat(a), &k);
    ASSERT_EQ(qcore::FloorLog2(AsFloat(a)), k - 1) << std::hex << a;
    ASSERT_EQ(qcore::FloorLog2(-AsFloat(a)), k - 1) << std::hex << a;
  }
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float x = AsFloat(bits);
    if (!std::isfinite(x) || x == 0.0f) continue;
    int k;
    std::frexp(x, &k);
    ASSERT_EQ(qcore::FloorLog2(x), k - 1) << std::hex << bits;
  }
}

TEST(QuantCoreTest, Pow2IsExactOverTheWholeRange) {
  for (int k = -149; k <= 127; ++k) EXPECT_EQ(qcore::Pow2(k), std::ldexp(1.0f, k)) << k;
}

TEST(QuantCoreTest, RoundElemOnCodesMidpointsAndNeighboursAtManyScales) {
  std::mt19937_64 rng(2);
  for (ElemFormat f : kFormats) {
    const ElemSpec& spec = Spec(f);
    const std::vector<float> grid = PositiveGrid(f);
    std::vector<float> points;
    for (size_t i = 0; i < grid.size(); ++i) {
      points.push_back(grid[i]);
      float next = i + 1 < grid.size() ? grid[i + 1] : std::ldexp(1.0f, spec.emax + 1);
      float mid = 0.5f * (grid[i] + next);  // exact: a few significant bits
      for (float p : {mid, 0.5f * (grid[i] + mid), 0.5f * (mid + next)}) points.push_back(p);
    }
    for (Rounding mode : kModes) {
      for (int scale = -24; scale <= 24; ++scale) {
        for (float base : points) {
          float p = std::ldexp(base, scale);
          for (float x : {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY)}) {
            for (float signed_x : {x, -x}) {
              if (mode == Rounding::kStochastic) {
                for (float u : UniformsFor(f, signed_x, rng))
                  if (!CheckElem(f, mode, signed_x, u)) return;
              } else if (!CheckElem(f, mode, signed_x, 0.0f)) {
                return;
              }
            }
          }
        }
      }
    }
  }
}

TEST(QuantCoreTest, RoundElemOnSpecialValues) {
  std::mt19937_64 rng(3);
  std::vector<float> specials = {0.0f, -0.0f, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, FLT_MIN,
                                 -FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0x1p-127f, 0x1.fffffcp-127f,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 -std::numeric_limits<float>::quiet_NaN(), AsFloat(0x7F800001u),
                                 AsFloat(0xFF800001u), AsFloat(0x7FFFFFFFu), AsFloat(0xFFC00000u)};
  for (ElemFormat f : kFormats) {
    const ElemSpec& spec = Spec(f);
    float top = std::ldexp(1.0f, spec.emax + 1);
    for (float v : {spec.max_normal, spec.min_normal, spec.min_subnormal, top,
                    0.5f * (spec.max_normal + top), 0.5f * spec.min_subnormal,
                    0.25f * spec.min_subnormal, 0.75f * spec.min_subnormal}) {
      for (float x : {v, std::nextafter(v, 0.0f), std::nextafter(v, INFINITY)}) {
        specials.push_back(x);
        specials.push_back(-x);
      }
    }
  }
  for (ElemFormat f : kFormats) {
    for (Rounding mode : kModes) {
      for (float x : specials) {
        for (float u : UniformsFor(f, x, rng)) {
          CheckElem(f, mode, x, u);
          if (mode != Rounding::kStochastic) break;
        }
      }
    }
  }
}

TEST(QuantCoreTest, RoundElemOnRandomBitPatterns) {
  // 2.5M fp32 patterns per format and mode (37.5M in all): uniform bits reach every
  // exponent, and a second half concentrated where the grids are (|x| < 2^20).
  std::mt19937_64 rng(4);
  for (ElemFormat f : kFormats) {
    for (Rounding mode : kModes) {
      for (int i = 0; i < 2500000; ++i) {
        uint64_t r = rng();
        uint32_t bits = static_cast<uint32_t>(r);
        if (i & 1) bits = (bits & 0x807FFFFFu) | ((100u + (bits >> 23) % 48u) << 23);
        float u = (r >> 63) ? static_cast<float>((r >> 32) & 0xFFFFFF) * 0x1p-24f
                            : static_cast<float>(static_cast<double>(r >> 33) * 0x1p-31);
        if (!CheckElem(f, mode, AsFloat(bits), u)) return;
      }
    }
  }
}

TEST(QuantCoreTest, DecodeElemFastMatchesDecodeElemForEveryCode) {
  for (ElemFormat f : kFormats) {
    for (uint32_t code = 0; code < (1u << Spec(f).bits); ++code) {
      float want = DecodeElem(static_cast<uint8_t>(code), f);
      float got = qcore::DecodeElemFast(code, ConstsOf(f));
      EXPECT_TRUE(SameFloat(got, want)) << Spec(f).name << " code 0x" << std::hex << code;
      if (!std::isnan(want)) {
        EXPECT_EQ(std::signbit(got), std::signbit(want));
      }
    }
  }
}

TEST(QuantCoreTest, E4M3RneScaleOverItsWholeInputRange) {
  // d in [0, 448] or NaN; all of [0, 512) by fp32 pattern stride, plus every midpoint.
  for (uint32_t bits = 0; bits <= AsBits(512.0f); bits += 13) {
    float d = AsFloat(bits);
    Rounded got = qcore::RoundE4M3Rne(d);
    float want = RoundToElem(d, ElemFormat::kE4M3, Rounding::kNearestEven, 0.0f);
    ASSERT_EQ(AsBits(got.value), AsBits(want)) << d;
    ASSERT_EQ(got.code, EncodeElem(want, ElemFormat::kE4M3)) << d;
  }
  Rounded nan = qcore::RoundE4M3Rne(qcore::QuietNan());
  EXPECT_TRUE(std::isnan(nan.value));
  EXPECT_EQ(nan.code, 0x7Fu);
}

bool CheckBf16(float x, Rounding mode, float u) {
  uint16_t want = FloatToBf16(x, mode, u);
  uint16_t got = qcore::Bf16Round(x, mode, u);
  if (got == want) return true;
  if (g_reported++ < 10)
    ADD_FAILURE() << "bf16 " << RoundingName(mode) << " x=0x" << std::hex << AsBits(x) << " u=" << u
                  << ": 0x" << got << ", reference 0x" << want;
  return false;
}

TEST(QuantCoreTest, Bf16RoundMatchesFloatToBf16) {
  std::mt19937_64 rng(5);
  // Every low half-word under a few high half-words (ties, carries into the
  // exponent, the step to Inf, NaN payloads), each with boundary uniforms.
  for (uint32_t upper : {0x0000u, 0x0001u, 0x3F80u, 0x3F81u, 0x7F7Fu, 0x7F80u, 0x7F81u, 0x7FC0u,
                         0x8000u, 0xBF80u, 0xFF7Fu, 0xFF80u}) {
    for (uint32_t lower = 0; lower < 0x10000u; ++lower) {
      float x = AsFloat((upper << 16) | lower);
      float f = static_cast<float>(lower) / 65536.0f;
      for (Rounding mode : kModes) {
        if (mode == Rounding::kStochastic) {
          for (float u : {0.0f, f, std::nextafter(f, 0.0f), std::nextafter(f, 1.0f), 0.999f})
            if (u < 1.0f && !CheckBf16(x, mode, u)) return;
        } else if (!CheckBf16(x, mode, 0.0f)) {
          return;
        }
      }
    }
  }
  // 4M random patterns per mode.
  for (Rounding mode : kModes) {
    for (int i = 0; i < 4000000; ++i) {
      uint64_t r = rng();
      float u = static_cast<float>((r >> 40) & 0xFFFFFF) * 0x1p-24f;
      if (!CheckBf16(AsFloat(static_cast<uint32_t>(r)), mode, u)) return;
    }
  }
}

TEST(QuantCoreTest, PhiloxUniform4MatchesPhiloxUniform) {
  std::mt19937_64 rng(6);
  for (int i = 0; i < 20000; ++i) {
    uint64_t seed = i < 10 ? static_cast<uint64_t>(i) : rng();
    uint64_t group = i % 3 == 0 ? static_cast<uint64_t>(i) : rng() >> (2 + rng() % 62);
    float u[4];
    qcore::PhiloxUniform4(seed, group, u);
    for (int k = 0; k < 4; ++k)
      ASSERT_EQ(AsBits(u[k]), AsBits(PhiloxUniform(seed, group * 4 + k))) << seed << " " << group;
  }
}

TEST(QuantCoreTest, FastDivmodIsExact) {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 16, 24, 100, 255, 256, 257, 1000, 2047, 2048,
                                    65535, 65536, 65537, 0x7FFFFFFFu, 0x80000000u, 0x80000001u,
                                    0xFFFFFFFEu, 0xFFFFFFFFu};
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<uint32_t>(rng() >> (32 + rng() % 32)) | 1u);
  for (uint32_t d : divisors) {
    if (d == 0) continue;
    qcore::FastDivmod fd(d);
    for (uint32_t n : {0u, 1u, d - 1u, d, d + 1u, 2u * d, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u}) {
      uint32_t q, r;
      fd.DivMod(n, &q, &r);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(r, n % d) << n << " % " << d;
    }
    for (int k = 0; k < 20000; ++k) {
      uint32_t n = static_cast<uint32_t>(rng());
      ASSERT_EQ(fd.Div(n), n / d) << n << " / " << d;
    }
  }
}

// ---- whole quantizations assembled from quant_core.h ----------------------------------

// A test matrix: normal values, 0.1% outliers scaled by 1e3..1e6, and (when asked)
// a zero run, tiny values, NaN and +-Inf spots.
std::vector<float> TestMatrix(int64_t rows, int64_t cols, bool specials, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decades(3.0f, 6.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) {
    v = normal(rng);
    if (rng() % 1000 == 0) v *= std::pow(10.0f, decades(rng));
  }
  if (specials && x.size() >= 512) {
    for (int i = 0; i < 64; ++i) x[i] = 0.0f;                       // a zero block
    for (int i = 64; i < 96; ++i) x[i] = normal(rng) * 1e-39f;      // subnormal inputs
    for (int i = 96; i < 128; ++i) x[i] = normal(rng) * 1e30f;      // near the fp32 top
    x[200] = std::numeric_limits<float>::quiet_NaN();
    x[201] = -std::numeric_limits<float>::quiet_NaN();
    x[300] = INFINITY;
    x[301] = -INFINITY;
    x[x.size() - 1] = INFINITY;
  }
  return x;
}

struct AxisMap {  // as AxisView in quantize.cc
  int64_t rows, cols;
  int axis;
  int64_t lines() const { return axis == 1 ? rows : cols; }
  int64_t length() const { return axis == 1 ? cols : rows; }
  int64_t Index(int64_t line, int64_t k) const { return axis == 1 ? line * cols + k : k * cols + line; }
  int64_t ScaleIndex(int64_t line, int64_t b, int64_t per_line) const {
    return axis == 1 ? line * per_line + b : b * cols + line;
  }
};

void MxFast(const std::vector<float>& x, int64_t rows, int64_t cols, const MxOptions& o,
            std::vector<float>* out, std::vector<uint8_t>* codes, std::vector<uint8_t>* scales) {
  const ElemConsts c = ConstsOf(o.elem);
  AxisMap v{rows, cols, o.axis};
  const int64_t per_line = (v.length() + o.block - 1) / o.block;
  out->assign(rows * cols, 0.0f);
  codes->assign(rows * cols, 0);
  scales->assign(v.lines() * per_line, 0);
  for (int64_t line = 0; line < v.lines(); ++line) {
    for (int64_t b = 0; b < per_line; ++b) {
      const int64_t end = std::min<int64_t>((b + 1) * o.block, v.length());
      uint32_t amax = 0;
      for (int64_t k = b * o.block; k < end; ++k) amax = std::max(amax, qcore::AbsBits(x[v.Index(line, k)]));
      const qcore::MxScale s = qcore::MxScaleFromAmax(amax, c, o.bump_exponent);
      (*scales)[v.ScaleIndex(line, b, per_line)] = static_cast<uint8_t>(s.byte);
      // What the generic kernels do: the second pass rebuilds the scale from its byte.
      const qcore::MxScale t = qcore::MxScaleFromByte(s.byte);
      for (int64_t k = b * o.block; k < end; ++k) {
        const int64_t i = v.Index(line, k);
        float u = o.rounding == Rounding::kStochastic ? PhiloxUniform(o.seed, i) : 0.0f;
        Rounded r = qcore::MxElement(x[i], (k & 1) ? t : s, c, o.rounding, u);
        (*out)[i] = r.value;
        (*codes)[i] = static_cast<uint8_t>(r.code);
      }
    }
  }
}

int64_t CountFloatMismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += !SameFloat(a[i], b[i]);
  return n;
}

int64_t CountByteMismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n + static_cast<int64_t>(a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

TEST(QuantCoreTest, MxQuantizationMatchesReference) {
  struct Shape { int64_t rows, cols; };
  for (Shape shape : {Shape{64, 96}, Shape{37, 53}}) {
    const std::vector<float> x = TestMatrix(shape.rows, shape.cols, true, 8);
    for (ElemFormat f : kFormats) {
      for (Rounding mode : kModes) {
        for (int axis : {1, 0}) {
          for (int block : {32, 16, 7}) {
            for (bool bump : {false, true}) {
              MxOptions o;
              o.elem = f;
              o.block = block;
              o.axis = axis;
              o.rounding = mode;
              o.seed = 1234;
              o.bump_exponent = bump;
              std::vector<float> want_out(x.size()), got_out;
              std::vector<uint8_t> want_codes(x.size()), got_codes, got_scales;
              std::vector<uint8_t> want_scales(MxScaleCount(shape.rows, shape.cols, block, axis));
              ASSERT_TRUE(MxQuantizeRef(x.data(), shape.rows, shape.cols, o, want_out.data(),
                                        want_codes.data(), want_scales.data()).ok());
              MxFast(x, shape.rows, shape.cols, o, &got_out, &got_codes, &got_scales);
              SCOPED_TRACE(std::string(Spec(f).name) + " " + RoundingName(mode) + " axis " +
                           std::to_string(axis) + " block " + std::to_string(block) +
                           (bump ? " bump" : ""));
              // Bitwise, NaN payloads included: both write the same quiet NaN.
              int64_t bad = 0;
              for (size_t i = 0; i < x.size(); ++i) {
                if (AsBits(got_out[i]) == AsBits(want_out[i]) && got_codes[i] == want_codes[i]) continue;
                if (bad++ < 3)
                  ADD_FAILURE() << "element " << i << " x=" << x[i] << " (0x" << std::hex
                                << AsBits(x[i]) << "): 0x" << AsBits(got_out[i]) << " code 0x"
                                << int{got_codes[i]} << ", reference 0x" << AsBits(want_out[i])
                                << " code 0x" << int{want_codes[i]} << std::dec;
              }
              EXPECT_EQ(bad, 0);
              EXPECT_EQ(CountByteMismatches(got_codes, want_codes), 0);
              EXPECT_EQ(CountByteMismatches(got_scales, want_scales), 0);
            }
          }
        }
      }
    }
  }
}

TEST(QuantCoreTest, MxBlocksOfGridPointsAndMidpointsAtEveryScale) {
  // Each block: its amax is max_normal * 2^k (so e = k, clamped at -127), the
  // other 31 elements grid values and midpoints between neighbours times 2^k, with
  // both signs; k runs over every block exponent and beyond, so w = x / 2^e and
  // r * 2^e cross into and out of the fp32 subnormals.
  std::mt19937_64 rng(15);
  for (ElemFormat f : kFormats) {
    const ElemSpec& spec = Spec(f);
    const std::vector<float> grid = PositiveGrid(f);
    std::vector<float> x;
    for (int k = -150; k <= 127 - spec.emax; ++k) {
      x.push_back(std::ldexp(spec.max_normal, k));
      for (int j = 1; j < 32; ++j) {
        size_t g = rng() % (grid.size() - 1);
        float v = (j % 2) ? grid[g] : 0.5f * (grid[g] + grid[g + 1]);
        if (j % 3 == 0) v = -v;
        x.push_back(std::ldexp(v, k));
      }
    }
    const int64_t cols = static_cast<int64_t>(x.size());
    for (Rounding mode : kModes) {
      MxOptions o;
      o.elem = f;
      o.rounding = mode;
      o.seed = 5;
      std::vector<float> want_out(x.size()), got_out;
      std::vector<uint8_t> want_codes(x.size()), want_scales(x.size() / 32), got_codes, got_scales;
      ASSERT_TRUE(MxQuantizeRef(x.data(), 1, cols, o, want_out.data(), want_codes.data(), want_scales.data()).ok());
      MxFast(x, 1, cols, o, &got_out, &got_codes, &got_scales);
      int64_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (AsBits(got_out[i]) == AsBits(want_out[i]) && got_codes[i] == want_codes[i]) continue;
        if (bad++ < 3)
          ADD_FAILURE() << spec.name << " " << RoundingName(mode) << " element " << i << " x=" << std::hexfloat
                        << x[i] << ": " << got_out[i] << " code " << got_codes[i] + 0 << ", reference "
                        << want_out[i] << " code " << want_codes[i] + 0 << std::defaultfloat;
      }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(CountByteMismatches(got_scales, want_scales), 0);
    }
  }
}

TEST(QuantCoreTest, MxScaleExtremes) {
  // Every fp32 exponent as a block amax, with the bump on and off.
  for (ElemFormat f : kFormats) {
    for (bool bump : {false, true}) {
      for (uint32_t amax : {0u, 1u, 0x00400000u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F000000u}) {
        for (uint32_t fraction : {0u, 0x600000u, 0x600001u, 0x7FFFFFu}) {
          uint32_t bits = amax >= 0x00800000u ? ((amax & 0x7F800000u) | fraction) : amax;
          std::vector<float> x = {AsFloat(bits), 0.0f};
          MxOptions o;
          o.elem = f;
          o.block = 2;
          o.bump_exponent = bump;
          std::vector<float> out(2);
          std::vector<uint8_t> codes(2), scale(1);
          ASSERT_TRUE(MxQuantizeRef(x.data(), 1, 2, o, out.data(), codes.data(), scale.data()).ok());
          uint32_t block_amax = std::max(qcore::AbsBits(x[0]), qcore::AbsBits(x[1]));
          qcore::MxScale s = qcore::MxScaleFromAmax(block_amax, ConstsOf(f), bump);
          EXPECT_EQ(s.byte, scale[0]) << Spec(f).name << " amax 0x" << std::hex << bits;
          for (int i = 0; i < 2; ++i) {
            Rounded r = qcore::MxElement(x[i], s, ConstsOf(f), Rounding::kNearestEven, 0.0f);
            EXPECT_EQ(AsBits(r.value), AsBits(out[i])) << Spec(f).name << std::hex << " 0x" << bits;
            EXPECT_EQ(r.code, codes[i]);
          }
        }
      }
    }
  }
}

TEST(QuantCoreTest, RhtOutputMatchesRhtRef) {
  for (int axis : {1, 0}) {
    std::vector<float> x = TestMatrix(48, 64, true, 9);
    x[5] = INFINITY;  // +Inf and -Inf in one chunk: Inf - Inf
    x[6] = -INFINITY;
    std::vector<float> want(x.size());
    RhtRef(x.data(), 48, 64, axis, want.data());
    AxisMap v{48, 64, axis};
    for (int64_t line = 0; line < v.lines(); ++line) {
      for (int64_t chunk = 0; chunk < v.length(); chunk += 16) {
        float in[16];
        for (int i = 0; i < 16; ++i) in[i] = x[v.Index(line, chunk + i)];
        float halves[16];
        qcore::RhtHalf(in, in + 8, 0, halves);
        qcore::RhtHalf(in, in + 8, 1, halves + 8);
        for (int j = 0; j < 16; ++j) {
          // NaN signs may differ from the reference's (see below); bitwise otherwise.
          ASSERT_TRUE(SameFloat(halves[j], qcore::RhtOutput(in, j))) << "half, j " << j;
          float got = qcore::RhtOutput(in, j);
          float w = want[v.Index(line, chunk + j)];
          // NaN signs differ by design (x86's Inf - Inf is -NaN); nothing reads them
          // (a NaN in y makes every NVFP4 code the positive max code).
          ASSERT_TRUE(SameFloat(got, w)) << "axis " << axis << " line " << line << " j " << j;
        }
      }
    }
  }
}

struct Nvfp4Outputs {
  std::vector<float> out;
  std::vector<uint8_t> codes, scales;
  float s_dec = 0.0f;
};

void Nvfp4Fast(const std::vector<float>& x, int64_t rows, int64_t cols, const Nvfp4Options& o,
               Nvfp4Outputs* r) {
  AxisMap v{rows, cols, o.axis};
  std::vector<float> y(x);
  if (o.rht) {
    for (int64_t line = 0; line < v.lines(); ++line) {
      for (int64_t chunk = 0; chunk < v.length(); chunk += 16) {
        float in[16];
        for (int i = 0; i < 16; ++i) in[i] = x[v.Index(line, chunk + i)];
        for (int j = 0; j < 16; ++j) y[v.Index(line, chunk + j)] = qcore::RhtOutput(in, j);
      }
    }
  }
  uint32_t amax_t = 0;
  for (float value : y) amax_t = std::max(amax_t, qcore::AbsBits(value));
  const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(AsFloat(amax_t));
  r->s_dec = t.s_dec;
  r->out.assign(x.size(), 0.0f);
  r->codes.assign(x.size(), 0);
  const int64_t per_line = v.length() / 16;
  r->scales.assign(v.lines() * per_line, 0);
  const int64_t tile = o.tile_16x16 ? 16 : 1;
  for (int64_t line0 = 0; line0 < v.lines(); line0 += tile) {
    for (int64_t b = 0; b < per_line; ++b) {
      uint32_t amax_b = 0;
      for (int64_t line = line0; line < line0 + tile; ++line)
        for (int64_t k = b * 16; k < b * 16 + 16; ++k)
          amax_b = std::max(amax_b, qcore::AbsBits(y[v.Index(line, k)]));
      const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromAmax(AsFloat(amax_b), t);
      const qcore::Nvfp4BlockScale from_code = qcore::Nvfp4BlockScaleFromCode(s.code, t);
      EXPECT_TRUE(SameFloat(from_code.sf, s.sf));
      EXPECT_TRUE(SameFloat(from_code.s_b, s.s_b));
      for (int64_t line = line0; line < line0 + tile; ++line) {
        r->scales[v.ScaleIndex(line, b, per_line)] = static_cast<uint8_t>(s.code);
        for (int64_t k = b * 16; k < b * 16 + 16; ++k) {
          const int64_t i = v.Index(line, k);
          float u = o.rounding == Rounding::kStochastic ? PhiloxUniform(o.seed, i) : 0.0f;
          Rounded q = qcore::Nvfp4Element(y[i], s, o.rounding, u);
          r->codes[i] = static_cast<uint8_t>(q.code);
          r->out[i] = qcore::Nvfp4Dequant(q.value, s, t);
        }
      }
    }
  }
}

void ExpectNvfp4Matches(const std::vector<float>& x, int64_t rows, int64_t cols, const Nvfp4Options& o,
                        const std::string& what) {
  Nvfp4Outputs want, got;
  want.out.resize(x.size());
  want.codes.resize(x.size());
  want.scales.resize(MxScaleCount(rows, cols, 16, o.axis));
  ASSERT_TRUE(Nvfp4QuantizeRef(x.data(), rows, cols, o, want.out.data(), want.codes.data(),
                               want.scales.data(), &want.s_dec).ok());
  Nvfp4Fast(x, rows, cols, o, &got);
  SCOPED_TRACE(what + (o.tile_16x16 ? " 16x16" : " 1x16") + (o.rht ? " rht" : "") + " axis " +
               std::to_string(o.axis) + " " + RoundingName(o.rounding));
  EXPECT_EQ(CountFloatMismatches(got.out, want.out), 0);
  EXPECT_EQ(CountByteMismatches(got.codes, want.codes), 0);
  EXPECT_EQ(CountByteMismatches(got.scales, want.scales), 0);
  EXPECT_TRUE(SameFloat(got.s_dec, want.s_dec));
}

TEST(QuantCoreTest, Nvfp4QuantizationMatchesReference) {
  // Finite tensors (the interesting case: a NaN anywhere makes the whole tensor NaN),
  // then tensors with NaN and Inf, and tensors with extreme amax.
  for (bool specials : {false, true}) {
    const std::vector<float> x = TestMatrix(64, 96, specials, 10);
    for (bool tile : {false, true})
      for (bool rht : {false, true})
        for (int axis : {1, 0})
          for (Rounding mode : {Rounding::kNearestEven, Rounding::kStochastic}) {
            Nvfp4Options o;
            o.tile_16x16 = tile;
            o.rht = rht;
            o.axis = axis;
            o.rounding = mode;
            o.seed = 99;
            ExpectNvfp4Matches(x, 64, 96, o, specials ? "specials" : "finite");
          }
  }
  std::vector<float> inf_only = TestMatrix(32, 32, false, 11);
  inf_only[3] = INFINITY;
  inf_only[40] = -INFINITY;
  for (float scale : {0.0f, 1e-30f, 1e-39f, 1e30f, 3e38f}) {
    std::vector<float> x = TestMatrix(32, 32, false, 12);
    for (float& v : x) v *= scale;
    x[7] = scale == 0.0f ? -0.0f : x[7];
    for (bool rht : {false, true}) {
      Nvfp4Options o;
      o.rht = rht;
      ExpectNvfp4Matches(x, 32, 32, o, "scaled");
      ExpectNvfp4Matches(inf_only, 32, 32, o, "inf");
    }
  }
}

TEST(QuantCoreTest, Fp8TensorQuantizationMatchesReference) {
  std::vector<std::vector<float>> tensors = {TestMatrix(1, 5000, true, 13), TestMatrix(1, 5000, false, 14),
                                             std::vector<float>(100, 0.0f), std::vector<float>(100, 1e-40f)};
  tensors.back()[3] = -AsFloat(0x7FC00001u);  // a negative NaN keeps its sign in the code
  for (const std::vector<float>& x : tensors) {
    for (ElemFormat f : {ElemFormat::kE4M3, ElemFormat::kE5M2}) {
      for (Rounding mode : kModes) {
        const int64_t n = static_cast<int64_t>(x.size());
        std::vector<float> want_out(n);
        std::vector<uint8_t> want_codes(n);
        float want_scale = 0.0f;
        ASSERT_TRUE(Fp8TensorQuantizeRef(x.data(), n, f, mode, 77, want_out.data(), want_codes.data(),
                                         &want_scale).ok());
        uint32_t amax = 0;
        for (float v : x) amax = std::max(amax, qcore::AbsBitsNoNan(v));
        const ElemConsts c = ConstsOf(f);
        const qcore::Fp8Scale s = qcore::Fp8ScaleFromAmax(AsFloat(amax), c);
        EXPECT_EQ(AsBits(s.inv), AsBits(want_scale));
        for (int64_t i = 0; i < n; ++i) {
          float u = mode == Rounding::kStochastic ? PhiloxUniform(77, i) : 0.0f;
          Rounded r = qcore::Fp8Element(x[i], s, c, mode, u);
          ASSERT_TRUE(SameFloat(r.value, want_out[i])) << Spec(f).name << " " << i;
          ASSERT_EQ(r.code, want_codes[i]) << Spec(f).name << " " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace keel
