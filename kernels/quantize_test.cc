// Properties of the CPU reference quantizers: the MX scale formula and its
// specials (NaN/Inf blocks, zero blocks, the -127 clamp, padding, clipping and
// the bump fix), axis handling, NVFP4's scales, tiles and RHT, per-tensor FP8,
// and stochastic rounding's unbiasedness.
#include "kernels/quantize.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const ElemFormat kAll[] = {ElemFormat::kE4M3, ElemFormat::kE5M2, ElemFormat::kE3M2,
                           ElemFormat::kE2M3, ElemFormat::kE2M1};

// Normal values with a sprinkling of large outliers, as activations have.
std::vector<float> RandomWithOutliers(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) {
    v = normal(rng);
    if (uniform(rng) < 0.01f) v *= std::pow(10.0f, 1.0f + 4.0f * uniform(rng));
  }
  return x;
}

bool SameBits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || FloatBits(a) == FloatBits(b);
}

struct Mx {
  std::vector<float> out;
  std::vector<uint8_t> codes, scales;
};

Mx RunMx(const std::vector<float>& x, int64_t rows, int64_t cols, MxOptions options) {
  Mx r;
  r.out.resize(rows * cols);
  r.codes.resize(rows * cols);
  r.scales.resize(MxScaleCount(rows, cols, options.block, options.axis));
  Status s = MxQuantizeRef(x.data(), rows, cols, options, r.out.data(), r.codes.data(), r.scales.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

// A worked example of docs/numerics.md, "MX block scaling", by hand: block amax
// 1.0 gives e = 0 - 8 = -8 for E4M3; 0.3 * 2^8 = 76.8 lies in [64, 128) where the
// quantum is 2^(6-3) = 8, so it rounds to 80 and dequantizes to 80/256 = 0.3125.
TEST(MxTest, WorkedExampleE4M3) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  x[1] = 0.3f;
  x[2] = -0.01f;  // 2.56 -> quantum 2^(1-3) = 0.25 -> 2.5 -> 0.009765625
  MxOptions o;
  Mx r = RunMx(x, 1, 32, o);
  EXPECT_EQ(r.scales[0], 127 - 8);
  EXPECT_EQ(r.out[0], 1.0f);
  EXPECT_EQ(r.out[1], 0.3125f);
  EXPECT_EQ(r.out[2], -0.009765625f);
  EXPECT_EQ(r.codes[1], EncodeElem(80.0f, ElemFormat::kE4M3));
  EXPECT_EQ(r.codes[2], EncodeElem(-2.5f, ElemFormat::kE4M3));
}

// The shared exponent is floor(log2(amax)) - emax, read from amax's exact binary
// exponent (here from the fp32 bits, independently of the reference's frexp).
TEST(MxTest, ScaleFormulaOnRandomBlocks) {
  std::vector<float> x = RandomWithOutliers(64 * 256, 1);
  for (ElemFormat f : kAll) {
    MxOptions o;
    o.elem = f;
    Mx r = RunMx(x, 64, 256, o);
    for (int64_t row = 0; row < 64; ++row) {
      for (int64_t b = 0; b < 8; ++b) {
        float amax = 0;
        for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[row * 256 + b * 32 + k]));
        int exponent = static_cast<int>((FloatBits(amax) >> 23) & 0xFF) - 127;
        int e = std::max(exponent - Spec(f).emax, -127);
        ASSERT_EQ(r.scales[row * 8 + b], e + 127) << Spec(f).name;
        // Every output is a format value times 2^e and within max_normal * 2^e.
        for (int k = 0; k < 32; ++k) {
          int64_t i = row * 256 + b * 32 + k;
          ASSERT_LE(std::fabs(r.out[i]), std::ldexp(Spec(f).max_normal, e));
          ASSERT_EQ(r.out[i], std::ldexp(DecodeElem(r.codes[i], f), e));
        }
      }
    }
  }
}

TEST(MxTest, NanOrInfMakesTheWholeBlockNan) {
  for (ElemFormat f : kAll) {
    for (float special : {kNan, kInf, -kInf}) {
      std::vector<float> x = RandomWithOutliers(2 * 64, 2);
      x[5] = special;  // block 0 of row 0
      MxOptions o;
      o.elem = f;
      Mx r = RunMx(x, 2, 64, o);
      EXPECT_EQ(r.scales[0], kE8M0Nan);
      for (int k = 0; k < 32; ++k) EXPECT_TRUE(std::isnan(r.out[k])) << k;
      // The other blocks are untouched.
      EXPECT_NE(r.scales[1], kE8M0Nan);
      EXPECT_NE(r.scales[2], kE8M0Nan);
      for (int k = 32; k < 128; ++k) EXPECT_FALSE(std::isnan(r.out[k]));
    }
  }
}

TEST(MxTest, ZeroBlockUsesTwoToMinus126AndStaysZero) {
  for (ElemFormat f : kAll) {
    std::vector<float> x(32, 0.0f);
    x[3] = -0.0f;
    MxOptions o;
    o.elem = f;
    Mx r = RunMx(x, 1, 32, o);
    // e = -126 - emax < -127 for every format, so it clamps to -127: byte 0.
    EXPECT_EQ(r.scales[0], 0);
    // Exact zeros of either sign come out as +0 (as microxcaling's sign() * ...).
    for (int k = 0; k < 32; ++k) EXPECT_EQ(FloatBits(r.out[k]), 0u) << k;
    EXPECT_EQ(r.codes[3], 0);
  }
}

TEST(MxTest, ExponentClampsAtMinus127) {
  // amax = 2^-130 (an fp32 subnormal): e would be -138 for E4M3, clamps to -127.
  std::vector<float> x(32, 0.0f);
  x[0] = 0x1p-130f;   // w = 2^-3: exactly representable
  x[1] = 0x1p-140f;   // w = 2^-13: below E4M3's smallest subnormal 2^-9 -> 0
  x[2] = 0x1p-136f;   // w = 2^-9: E4M3's smallest subnormal, kept
  x[3] = 0x1.8p-137f; // w = 1.5 * 2^-10: between 0 and 2^-9, ties? no: 0.75 quanta -> 2^-9
  MxOptions o;
  Mx r = RunMx(x, 1, 32, o);
  EXPECT_EQ(r.scales[0], 0);
  EXPECT_EQ(r.out[0], 0x1p-130f);
  EXPECT_EQ(r.out[1], 0.0f);
  EXPECT_EQ(r.out[2], 0x1p-136f);
  EXPECT_EQ(r.out[3], 0x1p-136f);
}

TEST(MxTest, PaddingChangesNothing) {
  // 3 x 45 with block 32: each row's second block holds 13 real values. The
  // result must equal quantizing the same rows padded with zeros to 64.
  const int64_t rows = 3, cols = 45;
  std::vector<float> x = RandomWithOutliers(rows * cols, 3);
  std::vector<float> padded(rows * 64, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) padded[r * 64 + c] = x[r * cols + c];
  for (ElemFormat f : kAll) {
    for (Rounding rounding : {Rounding::kNearestEven, Rounding::kNearestAway}) {
      MxOptions o;
      o.elem = f;
      o.rounding = rounding;
      Mx a = RunMx(x, rows, cols, o), b = RunMx(padded, rows, 64, o);
      ASSERT_EQ(a.scales.size(), 6u);
      EXPECT_EQ(a.scales, b.scales);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(SameBits(a.out[r * cols + c], b.out[r * 64 + c]));
    }
  }
}

TEST(MxTest, AxisZeroIsAxisOneOfTheTranspose) {
  const int64_t rows = 70, cols = 24;  // 70 rows: a partial block down each column
  std::vector<float> x = RandomWithOutliers(rows * cols, 4), xt(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
  for (ElemFormat f : kAll) {
    MxOptions o;
    o.elem = f;
    MxOptions o0 = o;
    o0.axis = 0;
    Mx a = RunMx(x, rows, cols, o0);
    Mx b = RunMx(xt, cols, rows, o);
    // Scales: axis 0 is ceil(rows/32) x cols; the transpose's are cols x ceil(rows/32).
    ASSERT_EQ(a.scales.size(), 3u * cols);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t blk = 0; blk < 3; ++blk) ASSERT_EQ(a.scales[blk * cols + c], b.scales[c * 3 + blk]);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(SameBits(a.out[r * cols + c], b.out[c * rows + r]));
  }
}

TEST(MxTest, FloorRuleClipsAndBumpExponentFixes) {
  // amax = 1.9 * 2^3 (mantissa above E4M3's 1.75): e = 3 - 8 = -5, so amax / 2^e =
  // 486.4 clips to 448 and dequantizes to 14. Bumping e to -4 keeps it: 486.4/2 =
  // 243.2 rounds to 240 (quantum 16) -> 15.
  std::vector<float> x(32, 0.0f);
  x[0] = 15.2f;
  MxOptions o;
  EXPECT_EQ(RunMx(x, 1, 32, o).out[0], 14.0f);
  o.bump_exponent = true;
  Mx bumped = RunMx(x, 1, 32, o);
  EXPECT_EQ(bumped.scales[0], 127 - 4);
  EXPECT_EQ(bumped.out[0], 15.0f);
  // A mantissa at or below 1.75 is not bumped.
  x[0] = 14.0f;
  EXPECT_EQ(RunMx(x, 1, 32, o).scales[0], 127 - 5);
}

TEST(MxTest, TieRulesDiffer) {
  // E2M1 with amax 6 (e = 0): 2.5 is a tie between 2 and 3.
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;
  x[1] = 2.5f;
  x[2] = -0.25f;
  MxOptions o;
  o.elem = ElemFormat::kE2M1;
  Mx even = RunMx(x, 1, 32, o);
  o.rounding = Rounding::kNearestAway;
  Mx away = RunMx(x, 1, 32, o);
  EXPECT_EQ(even.out[1], 2.0f);
  EXPECT_EQ(away.out[1], 3.0f);
  EXPECT_EQ(FloatBits(even.out[2]), FloatBits(-0.0f));  // nonzero: the sign stays
  EXPECT_EQ(even.codes[2], 0x8);
  EXPECT_EQ(away.out[2], -0.5f);
}

TEST(MxTest, BlockSizeIsConfigurable) {
  std::vector<float> x = RandomWithOutliers(4 * 48, 5);
  MxOptions o;
  o.block = 16;
  Mx r = RunMx(x, 4, 48, o);
  ASSERT_EQ(r.scales.size(), 12u);
  for (int b = 0; b < 3; ++b) {
    std::vector<float> one(x.begin() + 16 * b, x.begin() + 16 * b + 16);
    Mx single = RunMx(one, 1, 16, o);
    EXPECT_EQ(single.scales[0], r.scales[b]);
  }
}

// Stochastic MX rounding is unbiased: averaged over many seeds the dequantized
// value converges to the input. Per element the mean of n roundings has sd <=
// quantum / (2 sqrt(n)); we allow 5 sd.
TEST(MxTest, StochasticRoundingIsUnbiasedAndSeeded) {
  std::vector<float> x = RandomWithOutliers(32, 6);
  MxOptions o;
  o.elem = ElemFormat::kE2M1;
  o.rounding = Rounding::kStochastic;
  const int n = 20000;
  std::vector<double> mean(32, 0.0);
  int e = 0;
  for (int seed = 0; seed < n; ++seed) {
    o.seed = seed;
    Mx r = RunMx(x, 1, 32, o);
    e = r.scales[0] - 127;
    for (int k = 0; k < 32; ++k) mean[k] += r.out[k] / n;
  }
  for (int k = 0; k < 32; ++k) {
    // The quantum at this element's magnitude (E2M1 in units of 2^e).
    float w = std::fabs(std::ldexp(x[k], -e));
    int p = std::max(w == 0 ? 0 : std::ilogb(w), 0);
    double quantum = std::ldexp(1.0, p - 1 + e);
    if (std::fabs(std::ldexp(x[k], -e)) >= 6.0f) continue;  // saturated: biased by design
    EXPECT_NEAR(mean[k], x[k], 5 * quantum / (2 * std::sqrt(n))) << k;
  }
  // Same seed, same result; another seed, another result.
  o.seed = 5;
  Mx a = RunMx(x, 1, 32, o), b = RunMx(x, 1, 32, o);
  o.seed = 6;
  Mx c = RunMx(x, 1, 32, o);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_NE(a.codes, c.codes);
}

struct Nv {
  std::vector<float> out;
  std::vector<uint8_t> codes, scales;
  float s_dec = 0;
};

Nv RunNv(const std::vector<float>& x, int64_t rows, int64_t cols, Nvfp4Options o) {
  Nv r;
  r.out.resize(rows * cols);
  r.codes.resize(rows * cols);
  r.scales.resize(MxScaleCount(rows, cols, 16, o.axis));
  Status s = Nvfp4QuantizeRef(x.data(), rows, cols, o, r.out.data(), r.codes.data(), r.scales.data(), &r.s_dec);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(Nvfp4Test, ScalesFollowSection3) {
  std::vector<float> x = RandomWithOutliers(32 * 64, 7);
  Nv r = RunNv(x, 32, 64, Nvfp4Options());
  float amax_t = 0;
  for (float v : x) amax_t = std::max(amax_t, std::fabs(v));
  const float s_enc = 2688.0f / amax_t;
  EXPECT_EQ(r.s_dec, 1.0f / s_enc);
  for (int64_t row = 0; row < 32; ++row) {
    for (int64_t b = 0; b < 4; ++b) {
      float amax_b = 0;
      for (int k = 0; k < 16; ++k) amax_b = std::max(amax_b, std::fabs(x[row * 64 + b * 16 + k]));
      float d = std::min(amax_b * (s_enc * (1.0f / 6.0f)), 448.0f);
      float sf = DecodeElem(r.scales[row * 4 + b], ElemFormat::kE4M3);
      // sf is d rounded to E4M3: the nearest E4M3 value (within half a quantum).
      EXPECT_EQ(sf, RoundToElem(d, ElemFormat::kE4M3, Rounding::kNearestEven, 0));
      for (int k = 0; k < 16; ++k) {
        int64_t i = row * 64 + b * 16 + k;
        ASSERT_EQ(r.out[i], (DecodeElem(r.codes[i], ElemFormat::kE2M1) * sf) * r.s_dec);
      }
    }
  }
  // The tensor's largest element maps to E2M1's 6 in a block whose scale is 448.
  int64_t at = 0;
  for (int64_t i = 0; i < 32 * 64; ++i) if (std::fabs(x[i]) == amax_t) at = i;
  EXPECT_EQ(DecodeElem(r.scales[at / 16], ElemFormat::kE4M3), 448.0f);
  EXPECT_EQ(std::fabs(DecodeElem(r.codes[at], ElemFormat::kE2M1)), 6.0f);
  EXPECT_NEAR(std::fabs(r.out[at]), amax_t, amax_t * 1e-6);
}

TEST(Nvfp4Test, TensorScaleSpecials) {
  std::vector<float> zeros(16, 0.0f);
  Nv z = RunNv(zeros, 1, 16, Nvfp4Options());
  EXPECT_EQ(z.s_dec, 1.0f / FLT_MAX);  // S_enc = 2688/0 = Inf -> FLT_MAX
  for (float v : z.out) EXPECT_EQ(v, 0.0f);
  std::vector<float> inf(16, 1.0f);
  inf[2] = kInf;
  Nv i = RunNv(inf, 1, 16, Nvfp4Options());
  EXPECT_EQ(i.s_dec, 1.0f);  // S_enc = 2688/Inf = 0 -> 1
  EXPECT_EQ(i.out[2], 2688.0f);  // saturates to 6 * 448
  std::vector<float> nan(32, 1.0f);
  nan[20] = kNan;
  Nv n = RunNv(nan, 1, 32, Nvfp4Options());
  for (float v : n.out) EXPECT_TRUE(std::isnan(v));
  for (uint8_t c : n.codes) EXPECT_EQ(c, 0);  // as TransformerEngine's E2M1 cast
  EXPECT_EQ(FloatBits(n.s_dec), 0x7FC00000u);  // the canonical quiet NaN
  EXPECT_EQ(n.scales[0], 0x7F);               // E4M3 NaN
}

TEST(Nvfp4Test, SignOfZeroFollowsTransformerEngine) {
  // TE's E2M1 cast gives code 0 to -0.0 (x >= 0.0 holds) and code 8 (-0) to
  // values in [-0.25, 0) of the scaled domain.
  std::vector<float> x(16, 0.0f);
  x[0] = 6.0f;
  x[1] = -0.0f;
  x[2] = -0.1f;  // scaled by ~1: -0.1 rounds to -0
  Nv r = RunNv(x, 1, 16, Nvfp4Options());
  EXPECT_EQ(r.codes[1], 0x0);
  EXPECT_EQ(FloatBits(r.out[1]), 0u);
  EXPECT_EQ(r.codes[2], 0x8);
  EXPECT_EQ(FloatBits(r.out[2]), 0x80000000u);
}

TEST(Nvfp4Test, TilesGiveWAndItsTransposeTheSameValues) {
  const int64_t rows = 48, cols = 32;
  std::vector<float> w = RandomWithOutliers(rows * cols, 8), wt(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) wt[c * rows + r] = w[r * cols + c];
  Nvfp4Options o;
  o.tile_16x16 = true;
  Nv a = RunNv(w, rows, cols, o), b = RunNv(wt, cols, rows, o);
  Nvfp4Options o0 = o;
  o0.axis = 0;  // blocks down columns of W: the layout W^T's GEMM reads
  Nv c = RunNv(w, rows, cols, o0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      ASSERT_TRUE(SameBits(a.out[r * cols + col], b.out[col * rows + r]));
      ASSERT_TRUE(SameBits(a.out[r * cols + col], c.out[r * cols + col]));
    }
  }
  // 1x16 blocks do not have this property in general.
  Nv d = RunNv(w, rows, cols, Nvfp4Options()), e = RunNv(wt, cols, rows, Nvfp4Options());
  int differ = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = 0; col < cols; ++col) differ += d.out[r * cols + col] != e.out[col * rows + r];
  EXPECT_GT(differ, 0);
}

TEST(Nvfp4Test, RhtIsTheSignedHadamardOverFour) {
  static const float kSigns[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  // One-hot rows give the rows of diag(s) * H16 / 4 exactly.
  std::vector<float> eye(16 * 16, 0.0f), y(16 * 16);
  for (int i = 0; i < 16; ++i) eye[i * 16 + i] = 1.0f;
  RhtRef(eye.data(), 16, 16, 1, y.data());
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      int parity = __builtin_popcount(i & j) & 1;
      EXPECT_EQ(y[i * 16 + j], kSigns[i] * (parity ? -0.25f : 0.25f)) << i << "," << j;
    }
  }
  // Orthogonal: the norm of every chunk is kept (to fp32 rounding).
  std::vector<float> x = RandomWithOutliers(4 * 64, 9), z(4 * 64);
  RhtRef(x.data(), 4, 64, 1, z.data());
  for (int chunk = 0; chunk < 16; ++chunk) {
    double nx = 0, nz = 0;
    for (int k = 0; k < 16; ++k) {
      nx += double(x[chunk * 16 + k]) * x[chunk * 16 + k];
      nz += double(z[chunk * 16 + k]) * z[chunk * 16 + k];
    }
    EXPECT_NEAR(nz, nx, nx * 1e-5);
  }
  // Axis 0 rotates down columns.
  std::vector<float> col(16 * 2, 0.0f), ycol(32);
  col[3 * 2 + 1] = 1.0f;  // row 3, column 1
  RhtRef(col.data(), 16, 2, 0, ycol.data());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(ycol[j * 2 + 0], 0.0f);
    EXPECT_EQ(ycol[j * 2 + 1], kSigns[3] * ((__builtin_popcount(3 & j) & 1) ? -0.25f : 0.25f));
  }
  // Quantizing with --rht is quantizing the rotated tensor.
  Nvfp4Options o;
  o.rht = true;
  Nv with = RunNv(x, 4, 64, o);
  Nv rotated = RunNv(z, 4, 64, Nvfp4Options());
  for (int i = 0; i < 4 * 64; ++i) ASSERT_TRUE(SameBits(with.out[i], rotated.out[i]));
}

TEST(Nvfp4Test, StochasticRoundingIsUnbiased) {
  std::vector<float> x = RandomWithOutliers(16, 10);
  Nvfp4Options o;
  o.rounding = Rounding::kStochastic;
  const int n = 20000;
  std::vector<double> mean(16, 0.0);
  Nv ref = RunNv(x, 1, 16, Nvfp4Options());
  for (int seed = 0; seed < n; ++seed) {
    o.seed = seed;
    Nv r = RunNv(x, 1, 16, o);
    ASSERT_EQ(r.scales, ref.scales);  // scales never depend on the rounding
    for (int k = 0; k < 16; ++k) mean[k] += r.out[k] / n;
  }
  // One E2M1 quantum is at most 2 (between 4 and 6) in scaled units.
  const double unit = DecodeElem(ref.scales[0], ElemFormat::kE4M3) * ref.s_dec;
  for (int k = 0; k < 16; ++k) EXPECT_NEAR(mean[k], x[k], 5 * 2 * unit / (2 * std::sqrt(n)) + 1e-3 * std::fabs(x[k])) << k;
}

TEST(Nvfp4Test, RejectsShapesTheBlockOrTileDoesNotDivide) {
  Nvfp4Options o;
  EXPECT_FALSE(ValidateNvfp4(16, 24, o).ok());
  o.tile_16x16 = true;
  Status s = ValidateNvfp4(24, 32, o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rows: 24"), std::string::npos) << s.message();
  o.rounding = Rounding::kNearestAway;
  EXPECT_NE(ValidateNvfp4(32, 32, o).message().find("nearest_away"), std::string::npos);
}

TEST(Fp8TensorTest, AmaxMapsToMaxNormal) {
  std::vector<float> x = RandomWithOutliers(1000, 11);
  for (ElemFormat f : {ElemFormat::kE4M3, ElemFormat::kE5M2}) {
    std::vector<float> out(x.size());
    std::vector<uint8_t> codes(x.size());
    float scale_inv = 0;
    ASSERT_TRUE(Fp8TensorQuantizeRef(x.data(), x.size(), f, Rounding::kNearestEven, 0, out.data(),
                                     codes.data(), &scale_inv).ok());
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(scale_inv, 1.0f / (Spec(f).max_normal / amax));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(out[i], DecodeElem(codes[i], f) * scale_inv);
      if (std::fabs(x[i]) == amax) {
        EXPECT_EQ(std::fabs(DecodeElem(codes[i], f)), Spec(f).max_normal);
      }
    }
  }
  EXPECT_FALSE(Fp8TensorQuantizeRef(x.data(), x.size(), ElemFormat::kE2M1, Rounding::kNearestEven, 0,
                                    nullptr, nullptr, nullptr).ok());
}

TEST(PackCodesTest, Fp4IsTwoPerByteLowNibbleFirst) {
  const uint8_t codes[5] = {0x1, 0xF, 0x7, 0x8, 0x3};
  std::vector<uint8_t> packed = PackCodes(codes, 5, ElemFormat::kE2M1);
  ASSERT_EQ(packed.size(), 3u);
  EXPECT_EQ(packed[0], 0xF1);
  EXPECT_EQ(packed[1], 0x87);
  EXPECT_EQ(packed[2], 0x03);
  EXPECT_EQ(PackCodes(codes, 5, ElemFormat::kE3M2).size(), 5u);
}

}  // namespace
}  // namespace keel
