// The CPU backend against first principles: finite-difference gradients of
// every layer, AdamW and RandomNormal against their formulas, the quantized
// linear layer against an explicit reference quantization and a double GEMM,
// the operand statistics on a hand-made tensor, and bit-identical results for
// 1 and 3 threads.
//
// The CPU backend's memory is host memory, so the tests pass std::vector data
// straight to it (Alloc is exercised on its own).
#include "kernels/nn_cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/gemm_cpu.h"
#include "kernels/gla_cpu.h"
#include "kernels/nn.h"
#include "kernels/nn_test_util.h"
#include "kernels/philox.h"
#include "kernels/quantize.h"

namespace keel {
namespace {

using nn_test::Normal;
using nn_test::Quant;
using nn_test::WithOutliers;

constexpr double kU = 1.0 / 16777216.0;  // fp32 unit roundoff, 2^-24

std::unique_ptr<Backend> MakeCpu(int threads) {
  std::unique_ptr<Backend> backend;
  Status status = MakeCpuBackend(threads, &backend);
  EXPECT_TRUE(status.ok()) << status.message();
  return backend;
}

double WeightedSum(const std::vector<float>& y, const std::vector<float>& r) {
  double sum = 0.0;
  for (size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * r[i];
  return sum;
}

// ---- Gradient checks -----------------------------------------------------------------
//
// Every layer's backward is compared with central differences of the scalar
// L = sum_i y_i r_i (r random, L accumulated in double), so dL/dy = r is what
// the backward receives. Step h = 1e-2 on inputs of order 1:
//   - truncation error of the central difference is h^2/6 |L'''| ~ 2e-5 for
//     these smooth functions with O(1) derivatives;
//   - the forward's fp32 outputs carry relative errors of a few 2^-24, which
//     move L by at most ~1e-5 for the sizes below; divided by 2h that is ~5e-4.
// So the difference and the analytic gradient agree to a few 1e-4 (observed:
// at most 5e-5); the checks allow 1e-3 * max(1, |gradient|). A wrong formula
// (a missing term, a wrong sign, a wrong column) is off by O(0.1 - 1) and fails.
constexpr float kStep = 1e-2f;
constexpr double kGradTolerance = 1e-3;

void ExpectGradient(const std::string& what, std::vector<float>* param,
                    const std::function<double()>& loss, const std::vector<float>& analytic) {
  ASSERT_EQ(param->size(), analytic.size()) << what;
  for (size_t i = 0; i < param->size(); ++i) {
    const float saved = (*param)[i];
    const float plus = saved + kStep, minus = saved - kStep;
    (*param)[i] = plus;
    const double loss_plus = loss();
    (*param)[i] = minus;
    const double loss_minus = loss();
    (*param)[i] = saved;
    const double numeric = (loss_plus - loss_minus) / (static_cast<double>(plus) - minus);
    const double error = std::fabs(numeric - analytic[i]) / std::max(1.0, std::fabs(numeric));
    EXPECT_LE(error, kGradTolerance)
        << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric;
  }
  // Guard against a vacuous check: the gradient must not be all zeros.
  double norm = 0.0;
  for (float g : analytic) norm += std::fabs(g);
  EXPECT_GT(norm, 1e-3) << what << ": zero gradient";
}

// A "+=" output: the backward adds into `base`; the test hands it base and
// looks at the increment.
std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

class NnCpuTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = MakeCpu(2); }
  std::unique_ptr<Backend> backend_;
};

#define ASSERT_OK(expr)                             \
  do {                                              \
    Status status_ = (expr);                        \
    ASSERT_TRUE(status_.ok()) << status_.message(); \
  } while (0)
#define EXPECT_OK(expr)                             \
  do {                                              \
    Status status_ = (expr);                        \
    EXPECT_TRUE(status_.ok()) << status_.message(); \
  } while (0)

TEST_F(NnCpuTest, LinearFp32Gradients) {
  const int64_t rows = 5, in = 7, out = 6;
  std::vector<float> x = Normal(rows * in, 1), w = Normal(out * in, 2), bias = Normal(out, 3);
  std::vector<float> r = Normal(rows * out, 4), y(rows * out);
  LinearQuant q;  // every role fp32
  auto loss = [&]() {
    EXPECT_TRUE(
        backend_->LinearForward(x.data(), w.data(), bias.data(), nullptr, y.data(), rows, in, out, q).ok());
    return WeightedSum(y, r);
  };
  // dx is written (start from garbage); dw and dbias are += (start from a base).
  std::vector<float> dx(rows * in, 123.0f), dw_base = Normal(out * in, 5), db_base = Normal(out, 6);
  std::vector<float> dw = dw_base, db = db_base;
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(),
                                     rows, in, out, q));
  ExpectGradient("linear dx", &x, loss, dx);
  ExpectGradient("linear dw", &w, loss, Minus(dw, dw_base));
  ExpectGradient("linear dbias", &bias, loss, Minus(db, db_base));
}

// The residual rides in LinearForward: (acc + bias) + residual must be the bits of
// LinearForward without it followed by Add, in every format (per-tensor FP8 and
// NVFP4 fold their decode scales into alpha, which must not scale the residual),
// with and without a bias, for 1 and 3 threads.
TEST_F(NnCpuTest, LinearResidualEqualsLinearThenAdd) {
  const int64_t rows = 48, in = 64, out = 32;
  std::vector<float> x = WithOutliers(rows * in, 181), w = Normal(out * in, 182, 0.1f);
  std::vector<float> bias = Normal(out, 183), residual = Normal(rows * out, 184, 3.0f);
  std::vector<LinearQuant> schemes(6);
  for (OperandFormat& f : schemes[1].role) f = Quant(QuantFormat::kBf16);
  for (OperandFormat& f : schemes[2].role) f = Quant(QuantFormat::kMxfp8E4M3, Rounding::kNearestAway);
  for (OperandFormat& f : schemes[3].role) f = Quant(QuantFormat::kNvfp4);
  for (OperandFormat& f : schemes[4].role) f = Quant(QuantFormat::kFp8E4M3);
  schemes[5].role[static_cast<int>(Role::kFwdW)] = Quant(QuantFormat::kFp8E5M2);  // fp32 x, fp8 w
  for (int threads : {1, 3}) {
    std::unique_ptr<Backend> be = MakeCpu(threads);
    for (size_t k = 0; k < schemes.size(); ++k) {
      LinearQuant q = schemes[k];
      q.seed = 9;
      const float* biases[] = {nullptr, bias.data()};
      for (const float* b : biases) {
        SCOPED_TRACE("scheme " + std::to_string(k) + (b != nullptr ? " with bias" : " without bias") + ", " +
                     std::to_string(threads) + " threads");
        std::vector<float> plain(rows * out), sum(rows * out), fused(rows * out, -7.0f);
        ASSERT_OK(be->LinearForward(x.data(), w.data(), b, nullptr, plain.data(), rows, in, out, q));
        ASSERT_OK(be->Add(plain.data(), residual.data(), sum.data(), rows * out));
        ASSERT_OK(be->LinearForward(x.data(), w.data(), b, residual.data(), fused.data(), rows, in, out, q));
        EXPECT_EQ(0, std::memcmp(sum.data(), fused.data(), sum.size() * sizeof(float)));
        EXPECT_NE(0, std::memcmp(plain.data(), fused.data(), sum.size() * sizeof(float)));
      }
    }
  }
  // residual == y is refused and leaves y as it was.
  std::vector<float> y(rows * out, 2.5f);
  const Status status =
      backend_->LinearForward(x.data(), w.data(), bias.data(), y.data(), y.data(), rows, in, out, LinearQuant());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("residual"), std::string::npos) << status.message();
  EXPECT_EQ(y, std::vector<float>(rows * out, 2.5f));
}

TEST_F(NnCpuTest, LayerNormGradientsWithAndWithoutBeta) {
  const int64_t rows = 4, cols = 9;
  for (bool with_beta : {true, false}) {
    SCOPED_TRACE(with_beta ? "with beta" : "without beta");
    std::vector<float> x = Normal(rows * cols, 11, 2.0f), gamma = Normal(cols, 12);
    std::vector<float> beta = Normal(cols, 13), r = Normal(rows * cols, 14);
    for (float& v : x) v += 0.5f;  // a nonzero mean, so the centring matters
    std::vector<float> y(rows * cols), mean(rows), rstd(rows);
    const float* beta_ptr = with_beta ? beta.data() : nullptr;
    auto loss = [&]() {
      EXPECT_TRUE(backend_
                      ->LayerNormForward(x.data(), gamma.data(), beta_ptr, y.data(), mean.data(),
                                         rstd.data(), rows, cols, 1e-5f)
                      .ok());
      return WeightedSum(y, r);
    };
    loss();  // mean and rstd of the unperturbed x, for the backward
    std::vector<float> dx_base = Normal(rows * cols, 15), dg_base = Normal(cols, 16),
                       db_base = Normal(cols, 17);
    std::vector<float> dx = dx_base, dg = dg_base, db = db_base;
    ASSERT_OK(backend_->LayerNormBackward(x.data(), gamma.data(), mean.data(), rstd.data(),
                                          r.data(), dx.data(), dg.data(),
                                          with_beta ? db.data() : nullptr, rows, cols));
    ExpectGradient("layernorm dx", &x, loss, Minus(dx, dx_base));
    ExpectGradient("layernorm dgamma", &gamma, loss, Minus(dg, dg_base));
    if (with_beta) {
      ExpectGradient("layernorm dbeta", &beta, loss, Minus(db, db_base));
    } else {
      EXPECT_EQ(db, db_base);  // untouched when null was passed
    }
  }
}

TEST_F(NnCpuTest, LayerNormForwardNormalises) {
  const int64_t rows = 3, cols = 64;
  std::vector<float> x = Normal(rows * cols, 21, 3.0f), gamma(cols, 1.0f), y(rows * cols);
  std::vector<float> mean(rows), rstd(rows);
  for (float& v : x) v += 5.0f;
  ASSERT_OK(backend_->LayerNormForward(x.data(), gamma.data(), nullptr, y.data(), mean.data(),
                                       rstd.data(), rows, cols, 0.0f));
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < cols; ++c) m += y[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) v += std::pow(y[r * cols + c] - m / cols, 2);
    EXPECT_NEAR(m / cols, 0.0, 1e-5);
    EXPECT_NEAR(v / cols, 1.0, 1e-5);
  }
}

TEST_F(NnCpuTest, RmsNormGradients) {
  const int64_t rows = 4, cols = 9;
  std::vector<float> x = Normal(rows * cols, 221, 2.0f), gain = Normal(cols, 222);
  std::vector<float> r = Normal(rows * cols, 223), y(rows * cols), rstd(rows);
  for (float& v : x) v += 0.5f;  // a nonzero mean: RMSNorm must not centre it
  auto loss = [&]() {
    EXPECT_TRUE(backend_->RmsNormForward(x.data(), gain.data(), y.data(), rstd.data(), rows, cols, 1e-5f).ok());
    return WeightedSum(y, r);
  };
  loss();  // rstd of the unperturbed x, for the backward
  std::vector<float> dx_base = Normal(rows * cols, 224), dg_base = Normal(cols, 225);
  std::vector<float> dx = dx_base, dg = dg_base;
  ASSERT_OK(backend_->RmsNormBackward(x.data(), gain.data(), rstd.data(), r.data(), dx.data(), dg.data(), rows,
                                      cols));
  ExpectGradient("rmsnorm dx", &x, loss, Minus(dx, dx_base));
  ExpectGradient("rmsnorm dgain", &gain, loss, Minus(dg, dg_base));
}

TEST_F(NnCpuTest, RmsNormForwardIsTheFormula) {
  const int64_t rows = 3, cols = 64;
  std::vector<float> x = Normal(rows * cols, 231, 3.0f), gain = Normal(cols, 232), y(rows * cols), rstd(rows);
  for (float& v : x) v += 5.0f;
  const float eps = 1e-2f;
  ASSERT_OK(backend_->RmsNormForward(x.data(), gain.data(), y.data(), rstd.data(), rows, cols, eps));
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0.0;
    for (int64_t c = 0; c < cols; ++c) squares += static_cast<double>(x[r * cols + c]) * x[r * cols + c];
    const double expected_rstd = 1.0 / std::sqrt(squares / cols + eps);
    EXPECT_NEAR(rstd[r], expected_rstd, 4 * kU * expected_rstd);
    for (int64_t c = 0; c < cols; ++c) {
      const double expected = x[r * cols + c] * expected_rstd * gain[c];
      EXPECT_NEAR(y[r * cols + c], expected, 8 * kU * std::fabs(expected) + 1e-30) << r << "," << c;
    }
  }
  // Errors name the field and the value.
  Status status = backend_->RmsNormForward(x.data(), gain.data(), y.data(), rstd.data(), rows, 0, eps);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("RmsNormForward: cols: 0"), std::string::npos) << status.message();
  status = backend_->RmsNormForward(x.data(), nullptr, y.data(), rstd.data(), rows, cols, eps);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("gain: null"), std::string::npos) << status.message();
}

TEST_F(NnCpuTest, RopeTablesAreLlamaAngles) {
  const int64_t positions = 7, hd = 12;
  std::vector<float> cos, sin;
  RopeTables(10000.0, positions, hd, &cos, &sin);
  ASSERT_EQ(cos.size(), static_cast<size_t>(positions * hd / 2));
  ASSERT_EQ(sin.size(), cos.size());
  for (int64_t t = 0; t < positions; ++t) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      // theta_i = 10000^(-2i / hd): i = 0 turns by t radians, the last pair slowest.
      const double angle = t * std::pow(10000.0, -2.0 * i / hd);
      EXPECT_EQ(cos[t * hd / 2 + i], static_cast<float>(std::cos(angle))) << t << "," << i;
      EXPECT_EQ(sin[t * hd / 2 + i], static_cast<float>(std::sin(angle))) << t << "," << i;
    }
  }
  EXPECT_EQ(cos[0], 1.0f);
  EXPECT_EQ(sin[1 * hd / 2 + 0], static_cast<float>(std::sin(1.0)));
}

// RoPE on a qkv-like buffer: rows of ld = 3 * width floats, the first 2 * heads
// heads (q and k) rotated, v untouched.
TEST_F(NnCpuTest, RopeIsTheRotateHalfRotationAndItsBackwardTheTranspose) {
  const int64_t batch = 2, seq = 5, heads = 4, hd = 6, ld = heads * hd + 10;
  const int64_t rows = batch * seq, half = hd / 2;
  std::vector<float> cos, sin;
  RopeTables(10000.0, seq, hd, &cos, &sin);
  std::vector<float> x = Normal(rows * ld, 241), y(rows * ld, -9.0f);
  ASSERT_OK(backend_->RopeForward(x.data(), y.data(), cos.data(), sin.data(), batch, seq, heads, hd, ld));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % seq;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        // Pair (i, i + hd/2) of head h, turned by t * 10000^(-2i/hd) (in double here).
        const double angle = t * std::pow(10000.0, -2.0 * i / hd);
        const double a = x[r * ld + h * hd + i], b = x[r * ld + h * hd + i + half];
        EXPECT_NEAR(y[r * ld + h * hd + i], a * std::cos(angle) - b * std::sin(angle), 1e-6);
        EXPECT_NEAR(y[r * ld + h * hd + i + half], b * std::cos(angle) + a * std::sin(angle), 1e-6);
      }
    }
    for (int64_t c = heads * hd; c < ld; ++c) EXPECT_EQ(y[r * ld + c], -9.0f) << "column " << c << " was written";
  }
  // In place gives the same bits.
  std::vector<float> in_place = x;
  ASSERT_OK(backend_->RopeForward(in_place.data(), in_place.data(), cos.data(), sin.data(), batch, seq, heads, hd, ld));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < heads * hd; ++c) EXPECT_EQ(in_place[r * ld + c], y[r * ld + c]);
  }
  // The rotation keeps dot products between positions a function of their
  // distance only: q at 4 . k at 1 equals q at 3 . k at 0 (same vectors).
  {
    std::vector<float> q = Normal(hd, 242), k = Normal(hd, 243), buf(seq * hd);
    auto rotated = [&](const std::vector<float>& v, int64_t t) {
      for (int64_t p = 0; p < seq; ++p) std::copy(v.begin(), v.end(), buf.begin() + p * hd);
      EXPECT_TRUE(backend_->RopeForward(buf.data(), buf.data(), cos.data(), sin.data(), 1, seq, 1, hd, hd).ok());
      return std::vector<float>(buf.begin() + t * hd, buf.begin() + (t + 1) * hd);
    };
    auto dot = [](const std::vector<float>& a, const std::vector<float>& b) {
      double s = 0.0;
      for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
      return s;
    };
    const double d41 = dot(rotated(q, 4), rotated(k, 1)), d30 = dot(rotated(q, 3), rotated(k, 0));
    const double d40 = dot(rotated(q, 4), rotated(k, 0));
    EXPECT_NEAR(d41, d30, 1e-5);
    EXPECT_GT(std::fabs(d41 - d40), 1e-3);  // and it does depend on the distance
  }
  // The backward is the gradient of the forward (a linear map: central
  // differences are exact up to rounding) and, being the inverse rotation,
  // undoes it.
  std::vector<float> r = Normal(rows * ld, 244), dx(rows * ld, 5.0f);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->RopeForward(x.data(), y.data(), cos.data(), sin.data(), batch, seq, heads, hd, ld).ok());
    double sum = 0.0;  // only the rotated columns
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t c = 0; c < heads * hd; ++c) sum += static_cast<double>(y[row * ld + c]) * r[row * ld + c];
    }
    return sum;
  };
  ASSERT_OK(backend_->RopeBackward(r.data(), dx.data(), cos.data(), sin.data(), batch, seq, heads, hd, ld));
  std::vector<float> dx_rotated;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t c = 0; c < heads * hd; ++c) dx_rotated.push_back(dx[row * ld + c]);
  }
  // ExpectGradient perturbs every element of its vector: check on a copy that
  // maps into x's rotated columns.
  std::vector<float> xr;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t c = 0; c < heads * hd; ++c) xr.push_back(x[row * ld + c]);
  }
  auto loss_of_xr = [&]() {
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t c = 0; c < heads * hd; ++c) x[row * ld + c] = xr[row * heads * hd + c];
    }
    return loss();
  };
  ExpectGradient("rope dx", &xr, loss_of_xr, dx_rotated);
  std::vector<float> back(rows * ld, 0.0f);
  ASSERT_OK(backend_->RopeForward(x.data(), y.data(), cos.data(), sin.data(), batch, seq, heads, hd, ld));
  ASSERT_OK(backend_->RopeBackward(y.data(), back.data(), cos.data(), sin.data(), batch, seq, heads, hd, ld));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t c = 0; c < heads * hd; ++c) EXPECT_NEAR(back[row * ld + c], x[row * ld + c], 1e-6);
  }
  // Errors name the field and the value.
  Status status = backend_->RopeForward(x.data(), y.data(), cos.data(), sin.data(), batch, seq, heads, 5, ld);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("RopeForward: hd: 5 is not allowed; need an even head size"), std::string::npos)
      << status.message();
  status = backend_->RopeBackward(x.data(), y.data(), cos.data(), sin.data(), batch, seq, heads, hd, heads * hd - 1);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("RopeBackward: ld: 23 is not allowed; need >= 24"), std::string::npos)
      << status.message();
}

TEST_F(NnCpuTest, EmbeddingWithoutPositions) {
  const int64_t batch = 2, seq = 3, dim = 4, vocab = 5;
  std::vector<int32_t> tokens = {1, 3, 1, 4, 1, 0};
  std::vector<float> wte = Normal(vocab * dim, 251), r = Normal(batch * seq * dim, 252), out(batch * seq * dim);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->EmbeddingForward(tokens.data(), wte.data(), nullptr, out.data(), batch, seq, dim).ok());
    return WeightedSum(out, r);
  };
  std::vector<float> dwte_base = Normal(vocab * dim, 253), dwte = dwte_base;
  ASSERT_OK(backend_->EmbeddingBackward(tokens.data(), r.data(), dwte.data(), nullptr, batch, seq, dim));
  ExpectGradient("embedding dwte (no positions)", &wte, loss, Minus(dwte, dwte_base));
  loss();
  for (int64_t bt = 0; bt < batch * seq; ++bt) {
    for (int64_t c = 0; c < dim; ++c) EXPECT_EQ(out[bt * dim + c], wte[tokens[bt] * dim + c]);
  }
}

TEST_F(NnCpuTest, GeluGradientAndValues) {
  const int64_t n = 40;
  std::vector<float> x = Normal(n, 31, 2.0f), r = Normal(n, 32), y(n), dx(n, 7.0f);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->GeluForward(x.data(), y.data(), n).ok());
    return WeightedSum(y, r);
  };
  ASSERT_OK(backend_->GeluBackward(x.data(), r.data(), dx.data(), n));
  ExpectGradient("gelu dx", &x, loss, dx);
  // The exact (erf) GELU, not the tanh approximation: they differ by ~1e-3 near |x| = 2.
  loss();
  for (int64_t i = 0; i < n; ++i) {
    double expected = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
    EXPECT_NEAR(y[i], expected, 1e-6 * std::max(1.0, std::fabs(expected)));
  }
}

TEST_F(NnCpuTest, SwigluGradient) {
  const int64_t rows = 3, h = 5;
  std::vector<float> x = Normal(rows * 2 * h, 41, 2.0f), r = Normal(rows * h, 42);
  std::vector<float> y(rows * h), dx(rows * 2 * h, 7.0f);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->SwigluForward(x.data(), y.data(), rows, h).ok());
    return WeightedSum(y, r);
  };
  ASSERT_OK(backend_->SwigluBackward(x.data(), r.data(), dx.data(), rows, h));
  ExpectGradient("swiglu dx", &x, loss, dx);
  loss();
  const double gate = x[1], up = x[h + 1];  // row 0, column 1
  EXPECT_NEAR(y[1], gate / (1.0 + std::exp(-gate)) * up, 1e-6);
}

TEST_F(NnCpuTest, EmbeddingGradients) {
  const int64_t batch = 2, seq = 3, dim = 4, vocab = 5;
  std::vector<int32_t> tokens = {1, 3, 1, 4, 1, 0};  // token 1 three times: the += must add up
  std::vector<float> wte = Normal(vocab * dim, 51), wpe = Normal(seq * dim, 52);
  std::vector<float> r = Normal(batch * seq * dim, 53), out(batch * seq * dim);
  auto loss = [&]() {
    EXPECT_TRUE(
        backend_
            ->EmbeddingForward(tokens.data(), wte.data(), wpe.data(), out.data(), batch, seq, dim)
            .ok());
    return WeightedSum(out, r);
  };
  std::vector<float> dwte_base = Normal(vocab * dim, 54), dwpe_base = Normal(seq * dim, 55);
  std::vector<float> dwte = dwte_base, dwpe = dwpe_base;
  ASSERT_OK(backend_->EmbeddingBackward(tokens.data(), r.data(), dwte.data(), dwpe.data(), batch,
                                        seq, dim));
  ExpectGradient("embedding dwte", &wte, loss, Minus(dwte, dwte_base));
  ExpectGradient("embedding dwpe", &wpe, loss, Minus(dwpe, dwpe_base));
  loss();
  EXPECT_EQ(out[(1 * seq + 2) * dim + 3], wte[0 * dim + 3] + wpe[2 * dim + 3]);
  tokens[2] = -1;
  EXPECT_FALSE(
      backend_->EmbeddingForward(tokens.data(), wte.data(), wpe.data(), out.data(), batch, seq, dim)
          .ok());
}

TEST_F(NnCpuTest, AttentionGradient) {
  const int64_t batch = 2, seq = 5, heads = 2, dim = 6;
  std::vector<float> qkv = Normal(batch * seq * 3 * dim, 61), r = Normal(batch * seq * dim, 62);
  std::vector<float> out(batch * seq * dim), stats(batch * heads * seq * 2);
  auto loss = [&]() {
    EXPECT_TRUE(
        backend_
            ->AttentionForward(qkv.data(), out.data(), stats.data(), batch, seq, heads, dim, false)
            .ok());
    return WeightedSum(out, r);
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 7.0f);
  ASSERT_OK(backend_->AttentionBackward(qkv.data(), out.data(), stats.data(), r.data(),
                                        dqkv.data(), batch, seq, heads, dim, false));
  ExpectGradient("attention dqkv", &qkv, loss, dqkv);
  // Causality: the first token attends only to itself, so its output is its v,
  // its max score is its own and its sum exp(0) = 1.
  loss();
  for (int64_t d = 0; d < dim; ++d) EXPECT_FLOAT_EQ(out[d], qkv[2 * dim + d]);
  const int64_t hd = dim / heads;
  float s00 = 0.0f;
  for (int64_t d = 0; d < hd; ++d) s00 += qkv[d] * qkv[dim + d];
  EXPECT_FLOAT_EQ(stats[0], s00 / std::sqrt(static_cast<float>(hd)));
  EXPECT_EQ(stats[1], 1.0f);
  // Every row's 1 / l is in (0, 1]: l sums exp(s_j - m) <= 1 with one term exactly 1.
  for (int64_t r = 0; r < batch * heads * seq; ++r) {
    EXPECT_GT(stats[2 * r + 1], 0.0f);
    EXPECT_LE(stats[2 * r + 1], 1.0f);
  }
}

// bf16_operands: the product operands are bf16 values, so the output moves by
// about 2^-9 relative from the fp32 path, and stays close to it.
TEST_F(NnCpuTest, AttentionBf16OperandsRoundBeforeProducts) {
  const int64_t batch = 1, seq = 8, heads = 1, dim = 8;
  std::vector<float> qkv = Normal(seq * 3 * dim, 63);
  std::vector<float> out32(seq * dim), out16(seq * dim), stats(seq * 2);
  ASSERT_OK(backend_->AttentionForward(qkv.data(), out32.data(), stats.data(), batch, seq, heads,
                                       dim, false));
  ASSERT_OK(backend_->AttentionForward(qkv.data(), out16.data(), stats.data(), batch, seq, heads,
                                       dim, true));
  double max_diff = 0.0;
  for (size_t i = 0; i < out32.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(out32[i] - out16[i])));
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 0.05);
  // Row 0 attends to token 0 only: its output is v_0 rounded to bf16 (P = 1 exactly).
  for (int64_t d = 0; d < dim; ++d)
    EXPECT_EQ(out16[d], Bf16ToFloat(FloatToBf16(qkv[2 * dim + d], Rounding::kNearestEven, 0.0f)));
}

// The bf16 path against a double-precision attention that rounds exactly the
// operands the backend's comment lists (q, k, v, P, dout, dS) and nothing else.
// Tolerance 1e-5 of the sum of |terms|: fp32 accumulation over at most
// seq * hd terms errs by ~1e-6 of it, while leaving out any one of the
// roundings moves results by ~2^-9 = 2e-3 of it.
TEST_F(NnCpuTest, AttentionBf16MatchesRoundedReference) {
  const int64_t batch = 2, seq = 6, heads = 2, dim = 16, hd = dim / heads, ld = 3 * dim;
  std::vector<float> qkv = Normal(batch * seq * ld, 65), dout = Normal(batch * seq * dim, 66);
  std::vector<float> out(batch * seq * dim), stats(batch * heads * seq * 2), dqkv(qkv.size());
  ASSERT_OK(backend_->AttentionForward(qkv.data(), out.data(), stats.data(), batch, seq, heads, dim,
                                       true));
  ASSERT_OK(backend_->AttentionBackward(qkv.data(), out.data(), stats.data(), dout.data(),
                                        dqkv.data(), batch, seq, heads, dim, true));
  auto bf16 = [](double v) {
    return static_cast<double>(
        Bf16ToFloat(FloatToBf16(static_cast<float>(v), Rounding::kNearestEven, 0.0f)));
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto expect_close = [](const char* what, float got, double want, double bound) {
    EXPECT_NEAR(got, want, 1e-5 * bound + 1e-7) << what;
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      auto at = [&](const std::vector<float>& m, int64_t stride, int64_t t, int64_t column) {
        return bf16(m[(b * seq + t) * stride + column]);
      };
      auto q = [&](int64_t t, int64_t d) { return at(qkv, ld, t, h * hd + d); };
      auto k = [&](int64_t t, int64_t d) { return at(qkv, ld, t, dim + h * hd + d); };
      auto v = [&](int64_t t, int64_t d) { return at(qkv, ld, t, 2 * dim + h * hd + d); };
      auto dO = [&](int64_t t, int64_t d) { return at(dout, dim, t, h * hd + d); };
      const float* st = &stats[(b * heads + h) * seq * 2];
      std::vector<double> P(seq * seq, 0.0);  // the backend's P: exp(s - m) / l from its stats
      std::vector<double> dK(seq * hd, 0.0), dKb(seq * hd, 0.0), dV(seq * hd, 0.0),
          dVb(seq * hd, 0.0);
      for (int64_t t = 0; t < seq; ++t) {
        // Forward: the softmax of the bf16 scores, and O = bf16(P) . bf16(v).
        std::vector<double> s(t + 1);
        double max = -1e300, sum = 0.0;
        for (int64_t j = 0; j <= t; ++j) {
          s[j] = 0.0;
          for (int64_t d = 0; d < hd; ++d) s[j] += q(t, d) * k(j, d);
          s[j] *= scale;
          max = std::max(max, s[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(s[j] - max);
        EXPECT_NEAR(st[2 * t], max, 1e-6);
        EXPECT_NEAR(st[2 * t + 1], 1.0 / sum, 1e-6 / sum);
        for (int64_t j = 0; j <= t; ++j) {
          P[t * seq + j] = std::exp(s[j] - st[2 * t]) * st[2 * t + 1];
          EXPECT_NEAR(P[t * seq + j], std::exp(s[j] - max) / sum, 1e-6);
        }
        for (int64_t d = 0; d < hd; ++d) {
          double o = 0.0, bound = 0.0;
          for (int64_t j = 0; j <= t; ++j) {
            o += bf16(P[t * seq + j]) * v(j, d);
            bound += std::fabs(bf16(P[t * seq + j]) * v(j, d));
          }
          expect_close("out", out[(b * seq + t) * dim + h * hd + d], o, bound);
        }
        // Backward.
        // D = dout . out, unrounded.
        std::vector<double> dP(t + 1), dS(t + 1);
        double delta = 0.0;
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t i = (b * seq + t) * dim + h * hd + d;
          delta += static_cast<double>(dout[i]) * out[i];
        }
        for (int64_t j = 0; j <= t; ++j) {
          dP[j] = 0.0;
          for (int64_t d = 0; d < hd; ++d) dP[j] += dO(t, d) * v(j, d);
        }
        for (int64_t j = 0; j <= t; ++j) dS[j] = bf16(P[t * seq + j] * (dP[j] - delta));
        for (int64_t d = 0; d < hd; ++d) {
          double dq = 0.0, bound = 0.0;
          for (int64_t j = 0; j <= t; ++j) {
            dq += dS[j] * k(j, d);
            bound += std::fabs(dS[j] * k(j, d));
            dK[j * hd + d] += dS[j] * q(t, d);
            dKb[j * hd + d] += std::fabs(dS[j] * q(t, d));
            dV[j * hd + d] += bf16(P[t * seq + j]) * dO(t, d);
            dVb[j * hd + d] += std::fabs(bf16(P[t * seq + j]) * dO(t, d));
          }
          expect_close("dq", dqkv[(b * seq + t) * ld + h * hd + d], scale * dq, scale * bound);
        }
      }
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t d = 0; d < hd; ++d) {
          expect_close("dk", dqkv[(b * seq + t) * ld + dim + h * hd + d], scale * dK[t * hd + d],
                       scale * dKb[t * hd + d]);
          expect_close("dv", dqkv[(b * seq + t) * ld + 2 * dim + h * hd + d], dV[t * hd + d],
                       dVb[t * hd + d]);
        }
      }
    }
  }
}

TEST_F(NnCpuTest, CrossEntropyGradientWithPaddingAndIgnoredTarget) {
  const int64_t rows = 4, padded = 7, vocab = 5;
  const float scale = 0.25f;
  std::vector<float> logits = Normal(rows * padded, 71, 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = vocab; c < padded; ++c) logits[r * padded + c] = 50.0f;  // must be ignored
  }
  std::vector<int32_t> targets = {2, -1, 0, 4};
  std::vector<float> losses(rows);
  auto loss = [&]() {
    EXPECT_TRUE(
        backend_
            ->CrossEntropyForward(logits.data(), targets.data(), losses.data(), rows, padded, vocab)
            .ok());
    double sum = 0.0;
    for (float l : losses) sum += static_cast<double>(scale) * l;
    return sum;
  };
  std::vector<float> dlogits(rows * padded, 9.0f);
  ASSERT_OK(backend_->CrossEntropyBackward(logits.data(), targets.data(), dlogits.data(), rows,
                                           padded, vocab, scale));
  ExpectGradient("cross-entropy dlogits", &logits, loss, dlogits);
  loss();
  EXPECT_EQ(losses[1], 0.0f);
  for (int64_t c = 0; c < padded; ++c) EXPECT_EQ(dlogits[1 * padded + c], 0.0f);
  for (int64_t c = vocab; c < padded; ++c) EXPECT_EQ(dlogits[0 * padded + c], 0.0f);
  // Row 0's loss by hand.
  double sum = 0.0;
  for (int64_t c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(logits[c]));
  EXPECT_NEAR(losses[0], std::log(sum) - logits[2], 1e-5);
  // dlogits may alias logits.
  std::vector<float> in_place = logits;
  ASSERT_OK(backend_->CrossEntropyBackward(in_place.data(), targets.data(), in_place.data(), rows,
                                           padded, vocab, scale));
  EXPECT_EQ(in_place, dlogits);
  // A target in the padding is an error.
  targets[3] = 5;
  Status status = backend_->CrossEntropyForward(logits.data(), targets.data(), losses.data(), rows,
                                                padded, vocab);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("targets[3]"), std::string::npos) << status.message();
}

// The fused op gives CrossEntropyForward's losses and CrossEntropyBackward's
// dlogits, the same bits: out of place and in place, with ignored rows, padding
// columns that must not count, and non-finite logits (whatever the unfused ops
// give for them, NaN included, the fused op gives too).
TEST_F(NnCpuTest, CrossEntropyFusedMatchesForwardThenBackward) {
  const int64_t rows = 8, padded = 11, vocab = 9;
  const float scale = 0.375f;
  std::vector<float> logits = Normal(rows * padded, 72, 3.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = vocab; c < padded; ++c) logits[r * padded + c] = 60.0f;  // must be ignored
  }
  logits[5 * padded + 4] = std::numeric_limits<float>::infinity();
  logits[6 * padded + 2] = std::numeric_limits<float>::quiet_NaN();
  logits[7 * padded + 0] = -std::numeric_limits<float>::infinity();
  const std::vector<int32_t> targets = {3, -1, 0, 8, -100, 4, 2, 1};
  auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  std::vector<float> losses(rows, 7.0f), dlogits(rows * padded, 9.0f);
  ASSERT_OK(backend_->CrossEntropyForward(logits.data(), targets.data(), losses.data(), rows,
                                          padded, vocab));
  ASSERT_OK(backend_->CrossEntropyBackward(logits.data(), targets.data(), dlogits.data(), rows,
                                           padded, vocab, scale));
  // The rows the test means to cover: an ignored row, a finite one, row 7's
  // -inf logit (probability 0, finite loss) and NaN from rows 5 (+inf) and 6.
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_TRUE(std::isfinite(losses[7]));
  EXPECT_TRUE(std::isnan(losses[5]));
  EXPECT_TRUE(std::isnan(losses[6]));

  std::vector<float> fused_losses(rows, -3.0f), fused_dlogits(rows * padded, -5.0f);
  ASSERT_OK(backend_->CrossEntropyFused(logits.data(), targets.data(), fused_losses.data(),
                                        fused_dlogits.data(), rows, padded, vocab, scale));
  EXPECT_EQ(bits(fused_losses), bits(losses));
  EXPECT_EQ(bits(fused_dlogits), bits(dlogits));

  // dlogits == logits: the target's logit is read before the row is overwritten.
  std::vector<float> in_place = logits;
  std::vector<float> in_place_losses(rows, -3.0f);
  ASSERT_OK(backend_->CrossEntropyFused(in_place.data(), targets.data(), in_place_losses.data(),
                                        in_place.data(), rows, padded, vocab, scale));
  EXPECT_EQ(bits(in_place_losses), bits(losses));
  EXPECT_EQ(bits(in_place), bits(dlogits));

  // Bad input is refused before anything is written.
  std::vector<int32_t> bad = targets;
  bad[2] = static_cast<int32_t>(vocab);
  std::vector<float> untouched(rows, -3.0f);
  Status status = backend_->CrossEntropyFused(logits.data(), bad.data(), untouched.data(),
                                              fused_dlogits.data(), rows, padded, vocab, scale);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("CrossEntropyFused: targets[2]"), std::string::npos)
      << status.message();
  EXPECT_EQ(untouched, std::vector<float>(rows, -3.0f));
  status = backend_->CrossEntropyFused(logits.data(), targets.data(), losses.data(), nullptr, rows,
                                       padded, vocab, scale);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("dlogits"), std::string::npos) << status.message();
}

// CrossEntropyFusedBf16: the losses of CrossEntropyFused and the bf16 rounding
// (nearest even) of its dlogits, into a separate buffer with a wider ld or over
// logits itself (row r in the first half of logits' row r), and in row chunks
// (row0) into one buffer.
TEST_F(NnCpuTest, CrossEntropyFusedBf16IsTheRoundedFusedGradient) {
  const int64_t rows = 8, padded = 12, vocab = 9;
  const float scale = 0.375f;
  std::vector<float> logits = Normal(rows * padded, 74, 3.0f);
  logits[5 * padded + 4] = std::numeric_limits<float>::infinity();
  const std::vector<int32_t> targets = {3, -1, 0, 8, -100, 4, 2, 1};
  std::vector<float> losses(rows), dlogits(rows * padded);
  ASSERT_OK(backend_->CrossEntropyFused(logits.data(), targets.data(), losses.data(), dlogits.data(), rows, padded,
                                        vocab, scale));
  const int64_t ld = padded + 4;
  std::vector<uint16_t> out(rows * ld, 0xABCD);
  std::vector<float> got_losses(rows, -1.0f);
  ASSERT_OK(backend_->CrossEntropyFusedBf16(logits.data(), targets.data(), got_losses.data(), out.data(), ld, rows,
                                            padded, vocab, scale, 0));
  EXPECT_EQ(0, std::memcmp(got_losses.data(), losses.data(), rows * sizeof(float)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < padded; ++c) {
      ASSERT_EQ(out[r * ld + c], FloatToBf16(dlogits[r * padded + c], Rounding::kNearestEven, 0.0f)) << r << "," << c;
    }
    for (int64_t c = padded; c < ld; ++c) ASSERT_EQ(out[r * ld + c], 0xABCD) << "past the row: untouched";
  }
  // Over logits.
  std::vector<float> in_place = logits;
  ASSERT_OK(backend_->CrossEntropyFusedBf16(in_place.data(), targets.data(), got_losses.data(),
                                            reinterpret_cast<uint16_t*>(in_place.data()), 2 * padded, rows, padded,
                                            vocab, scale, 0));
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(in_place.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < padded; ++c) {
      ASSERT_EQ(bits[r * 2 * padded + c], out[r * ld + c]) << r << "," << c;
    }
  }
  const Status status = backend_->CrossEntropyFusedBf16(logits.data(), targets.data(), got_losses.data(), out.data(),
                                                        padded - 1, rows, padded, vocab, scale, 0);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("ld: 11 is not allowed"), std::string::npos) << status.message();
  // In row chunks (row0): each call's rows of logits, targets and losses, into the
  // whole buffer at its rows; the same bits as one call.
  std::vector<uint16_t> chunked(rows * ld, 0xABCD);
  std::vector<float> chunk_losses(rows, -1.0f);
  for (int64_t r0 = 0; r0 < rows; r0 += 2) {
    const int64_t n = std::min<int64_t>(2, rows - r0);
    ASSERT_OK(backend_->CrossEntropyFusedBf16(logits.data() + r0 * padded, targets.data() + r0,
                                              chunk_losses.data() + r0, chunked.data(), ld, n, padded, vocab, scale,
                                              r0));
  }
  EXPECT_EQ(chunked, out);
  EXPECT_EQ(0, std::memcmp(chunk_losses.data(), losses.data(), rows * sizeof(float)));
  const Status aliased = backend_->CrossEntropyFusedBf16(in_place.data() + padded, targets.data(), got_losses.data(),
                                                         reinterpret_cast<uint16_t*>(in_place.data() + padded),
                                                         2 * padded, 1, padded, vocab, scale, 1);
  EXPECT_NE(aliased.message().find("row0: 1 is not allowed"), std::string::npos) << aliased.message();
}

// LinearBackward with dy_bf16: the bits of LinearBackward on dy when both dy
// roles round to bf16 nearest even (the statistics too); refused with other
// roles or a dbias.
TEST_F(NnCpuTest, LinearBackwardTakesDyInBf16) {
  const int64_t rows = 16, in = 24, out = 20, ld = 23;
  const std::vector<float> x = Normal(rows * in, 75, 1.0f), w = Normal(out * in, 76, 0.2f);
  std::vector<float> dy = Normal(rows * out, 77, 0.5f);
  dy[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint16_t> dy_bits(rows * ld, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < out; ++c) dy_bits[r * ld + c] = FloatToBf16(dy[r * out + c], Rounding::kNearestEven, 0.0f);
  }
  LinearQuant q;
  for (OperandFormat& f : q.role) f = Quant(QuantFormat::kBf16);
  q.role[static_cast<int>(Role::kWgradX)] = Quant(QuantFormat::kMxfp8E4M3);  // x in another format: still allowed
  ASSERT_TRUE(TakesBf16Dy(q));
  q.stats_slot = 0;
  std::vector<OperandStats> plain_stats, bf16_stats;
  std::vector<float> dx(rows * in), dw(out * in, 0.0f), dx2(rows * in), dw2(out * in, 0.0f);
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, rows, in, out, q));
  ASSERT_OK(backend_->ReadOperandStats(&plain_stats));
  LinearQuant qb = q;
  qb.dy_bf16 = dy_bits.data();
  qb.dy_bf16_ld = ld;
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), nullptr, dx2.data(), dw2.data(), nullptr, rows, in, out, qb));
  ASSERT_OK(backend_->ReadOperandStats(&bf16_stats));
  EXPECT_EQ(0, std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw.data(), dw2.data(), dw.size() * sizeof(float)));
  ASSERT_EQ(plain_stats.size(), bf16_stats.size());
  for (size_t i = 0; i < plain_stats.size(); ++i) {
    EXPECT_EQ(plain_stats[i].elements, bf16_stats[i].elements) << i;
    EXPECT_EQ(plain_stats[i].saturated, bf16_stats[i].saturated) << i;
    EXPECT_EQ(plain_stats[i].blocks, bf16_stats[i].blocks) << i;
    EXPECT_EQ(plain_stats[i].nan_blocks, bf16_stats[i].nan_blocks) << i;
  }
  EXPECT_EQ(bf16_stats[static_cast<int>(Role::kDgradDy)].nan_blocks, 1);
  std::vector<float> dbias(out, 0.0f);
  Status status = backend_->LinearBackward(x.data(), w.data(), nullptr, dx2.data(), dw2.data(), dbias.data(), rows, in,
                                           out, qb);
  EXPECT_NE(status.message().find("dbias: not allowed with dy_bf16"), std::string::npos) << status.message();
  LinearQuant stochastic = qb;
  stochastic.role[static_cast<int>(Role::kWgradDy)] = Quant(QuantFormat::kBf16, Rounding::kStochastic);
  status = backend_->LinearBackward(x.data(), w.data(), nullptr, dx2.data(), dw2.data(), nullptr, rows, in, out,
                                    stochastic);
  EXPECT_NE(status.message().find("dy_bf16: given is not allowed"), std::string::npos) << status.message();
  LinearQuant narrow = qb;
  narrow.dy_bf16_ld = out - 1;
  status = backend_->LinearBackward(x.data(), w.data(), nullptr, dx2.data(), dw2.data(), nullptr, rows, in, out,
                                    narrow);
  EXPECT_NE(status.message().find("dy_bf16_ld: 19 is not allowed"), std::string::npos) << status.message();
}

TEST_F(NnCpuTest, LinearTakesXInBf16) {
  const int64_t rows = 16, in = 24, out = 20, ld = 27;
  std::vector<float> x = Normal(rows * in, 85, 1.0f);
  const std::vector<float> w = Normal(out * in, 86, 0.2f), dy = Normal(rows * out, 87, 0.5f);
  x[5] = std::numeric_limits<float>::infinity();
  std::vector<uint16_t> x_bits(rows * ld, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) x_bits[r * ld + c] = FloatToBf16(x[r * in + c], Rounding::kNearestEven, 0.0f);
  }
  LinearQuant q;
  for (OperandFormat& f : q.role) f = Quant(QuantFormat::kBf16);
  q.role[static_cast<int>(Role::kDgradDy)] = Quant(QuantFormat::kMxfp8E4M3);  // another format off x's path: allowed
  ASSERT_TRUE(TakesBf16X(q));
  q.stats_slot = 0;
  // The same call with x in fp32 and with its producer's bf16 rounding: the
  // same outputs and the same statistics (the infinity counted in both x roles).
  std::vector<OperandStats> plain_stats, bf16_stats;
  std::vector<float> y(rows * out), y2(rows * out), dx(rows * in), dw(out * in, 0.0f), dx2(rows * in),
      dw2(out * in, 0.0f);
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, rows, in, out, q));
  ASSERT_OK(backend_->ReadOperandStats(&plain_stats));
  LinearQuant qb = q;
  qb.x_bf16 = x_bits.data();
  qb.x_bf16_ld = ld;
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->LinearForward(nullptr, w.data(), nullptr, nullptr, y2.data(), rows, in, out, qb));
  ASSERT_OK(backend_->LinearBackward(nullptr, w.data(), dy.data(), dx2.data(), dw2.data(), nullptr, rows, in, out, qb));
  ASSERT_OK(backend_->ReadOperandStats(&bf16_stats));
  EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw.data(), dw2.data(), dw.size() * sizeof(float)));
  ASSERT_EQ(plain_stats.size(), bf16_stats.size());
  for (size_t i = 0; i < plain_stats.size(); ++i) {
    EXPECT_EQ(plain_stats[i].elements, bf16_stats[i].elements) << i;
    EXPECT_EQ(plain_stats[i].saturated, bf16_stats[i].saturated) << i;
    EXPECT_EQ(plain_stats[i].blocks, bf16_stats[i].blocks) << i;
    EXPECT_EQ(plain_stats[i].nan_blocks, bf16_stats[i].nan_blocks) << i;
  }
  EXPECT_EQ(bf16_stats[static_cast<int>(Role::kFwdX)].nan_blocks, 1);
  EXPECT_EQ(bf16_stats[static_cast<int>(Role::kWgradX)].nan_blocks, 1);
  // Refused, with nothing written: x roles that do not round to bf16 nearest
  // even, an fp32 GEMM, a narrow ld, a forward Hot-Channel Patch.
  auto refused = [&](const LinearQuant& bad, const std::string& want) {
    std::vector<float> y3(rows * out, 7.0f), dw3(out * in, 7.0f);
    Status status = backend_->LinearForward(nullptr, w.data(), nullptr, nullptr, y3.data(), rows, in, out, bad);
    EXPECT_NE(status.message().find(want), std::string::npos) << status.message();
    status = backend_->LinearBackward(nullptr, w.data(), dy.data(), nullptr, dw3.data(), nullptr, rows, in, out, bad);
    EXPECT_NE(status.message().find(want), std::string::npos) << status.message();
    EXPECT_EQ(y3, std::vector<float>(rows * out, 7.0f));
    EXPECT_EQ(dw3, std::vector<float>(out * in, 7.0f));
  };
  LinearQuant away = qb;
  away.role[static_cast<int>(Role::kWgradX)] = Quant(QuantFormat::kBf16, Rounding::kNearestAway);
  refused(away, "x_bf16: given is not allowed with these roles");
  LinearQuant mx = qb;
  mx.role[static_cast<int>(Role::kFwdX)] = Quant(QuantFormat::kMxfp8E4M3);
  refused(mx, "x_bf16: given is not allowed with these roles");
  LinearQuant fp32_w = qb;
  fp32_w.role[static_cast<int>(Role::kFwdW)] = OperandFormat{};
  refused(fp32_w, "x_bf16: given is not allowed with these roles");
  LinearQuant narrow = qb;
  narrow.x_bf16_ld = in - 1;
  refused(narrow, "x_bf16_ld: 23 is not allowed; need >= in (24)");
  const std::vector<int32_t> hot = {1, 2};
  LinearQuant patched = qb;
  patched.hcp_fwd = HotChannels{hot.data(), 2};
  refused(patched, "hcp_fwd: 2 hot channels are not allowed with x_bf16");
}

TEST_F(NnCpuTest, LayerNormAndGeluBf16AreTheRoundingsOfTheirFp32Outputs) {
  const int64_t rows = 6, cols = 40;
  std::vector<float> x = Normal(rows * cols, 88, 3.0f);
  x[7] = std::numeric_limits<float>::quiet_NaN();  // row 0: every output NaN
  x[100] = 1e30f;                                  // GELU(1e30) = 1e30, LN row 2: a large spread
  const std::vector<float> gamma = Normal(cols, 89, 1.0f), beta = Normal(cols, 90, 0.1f);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows), mean2(rows), rstd2(rows);
  std::vector<uint16_t> yb(rows * cols);
  ASSERT_OK(backend_->LayerNormForward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                                       cols, 1e-5f));
  ASSERT_OK(backend_->LayerNormForwardBf16(x.data(), gamma.data(), beta.data(), yb.data(), mean2.data(),
                                           rstd2.data(), rows, cols, 1e-5f));
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(yb[i], FloatToBf16(y[i], Rounding::kNearestEven, 0.0f)) << i;
  EXPECT_EQ(0, std::memcmp(mean.data(), mean2.data(), rows * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(rstd.data(), rstd2.data(), rows * sizeof(float)));
  const int64_t n = rows * cols;
  std::vector<float> g(n);
  std::vector<uint16_t> gb(n);
  ASSERT_OK(backend_->GeluForward(x.data(), g.data(), n));
  ASSERT_OK(backend_->GeluForwardBf16(x.data(), gb.data(), n));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gb[i], FloatToBf16(g[i], Rounding::kNearestEven, 0.0f)) << i;
  EXPECT_EQ(gb[7] & 0x7F80u, 0x7F80u);  // the NaN stays NaN
  Status status = backend_->GeluForwardBf16(x.data(), gb.data(), -1);
  EXPECT_NE(status.message().find("count"), std::string::npos) << status.message();
  status = backend_->LayerNormForwardBf16(x.data(), gamma.data(), beta.data(), nullptr, mean2.data(), rstd2.data(),
                                          rows, cols, 1e-5f);
  EXPECT_NE(status.message().find("y"), std::string::npos) << status.message();
}

// AddLayerNormForward: the bits of Add and then the LayerNorm, with the sum in
// place over y or apart, fp32 or bf16 out; what it refuses.
TEST_F(NnCpuTest, AddLayerNormIsAddThenLayerNorm) {
  const int64_t rows = 5, cols = 24, n = rows * cols;
  const std::vector<float> yh = Normal(n, 91, 2.0f), res = Normal(n, 92, 3.0f);
  const std::vector<float> gamma = Normal(cols, 93, 1.0f), beta = Normal(cols, 94, 0.1f);
  std::vector<float> sum(n), ref(n), mean(rows), rstd(rows);
  std::vector<uint16_t> refb(n);
  ASSERT_OK(backend_->Add(yh.data(), res.data(), sum.data(), n));
  ASSERT_OK(backend_->LayerNormForward(sum.data(), gamma.data(), beta.data(), ref.data(), mean.data(), rstd.data(),
                                       rows, cols, 1e-5f));
  ASSERT_OK(backend_->LayerNormForwardBf16(sum.data(), gamma.data(), beta.data(), refb.data(), mean.data(),
                                           rstd.data(), rows, cols, 1e-5f));
  for (const bool bf16 : {false, true}) {
    std::vector<float> y = yh, out(n), m(rows), r(rows);
    std::vector<uint16_t> outb(n);
    ASSERT_OK(backend_->AddLayerNormForward(y.data(), res.data(), y.data(), gamma.data(), beta.data(),
                                            bf16 ? nullptr : out.data(), bf16 ? outb.data() : nullptr, m.data(),
                                            r.data(), rows, cols, 1e-5f));
    EXPECT_EQ(0, std::memcmp(y.data(), sum.data(), n * sizeof(float)));
    if (bf16) {
      EXPECT_EQ(outb, refb);
    } else {
      EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), n * sizeof(float)));
    }
    EXPECT_EQ(0, std::memcmp(m.data(), mean.data(), rows * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(r.data(), rstd.data(), rows * sizeof(float)));
  }
  std::vector<float> y = yh, out(n), m(rows), r(rows);
  std::vector<uint16_t> outb(n);
  Status s = backend_->AddLayerNormForward(y.data(), res.data(), y.data(), gamma.data(), beta.data(), out.data(),
                                           outb.data(), m.data(), r.data(), rows, cols, 1e-5f);
  EXPECT_NE(s.message().find("give exactly one"), std::string::npos) << s.message();
  std::vector<float> r2 = res;
  s = backend_->AddLayerNormForward(y.data(), r2.data(), r2.data(), gamma.data(), beta.data(), out.data(), nullptr,
                                    m.data(), r.data(), rows, cols, 1e-5f);
  EXPECT_NE(s.message().find("sum aliases residual"), std::string::npos) << s.message();
  EXPECT_EQ(y, yh);  // refused calls change nothing
}

// GELU's backward writing the dy of the linear layer before it in bf16 and
// summing that layer's bias gradient: the layer's backward then gives the bits
// of the fp32 path (dx, dw, dbias, statistics).
TEST_F(NnCpuTest, GeluBackwardBf16GivesTheLinearsDyAndDbias) {
  const int64_t rows = 16, in = 24, out = 40;
  const std::vector<float> x = Normal(rows * in, 91, 1.0f), w = Normal(out * in, 92, 0.2f);
  std::vector<float> pre = Normal(rows * out, 93, 1.5f);
  const std::vector<float> dact = Normal(rows * out, 94, 0.5f);
  pre[9] = std::numeric_limits<float>::quiet_NaN();
  LinearQuant q;
  for (OperandFormat& f : q.role) f = Quant(QuantFormat::kBf16);
  q.stats_slot = 0;
  ASSERT_TRUE(TakesBf16Dy(q));
  std::vector<float> dy(rows * out), dx(rows * in), dw(out * in, 0.0f), db(out, 0.5f);
  std::vector<OperandStats> plain_stats, bf16_stats;
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->GeluBackward(pre.data(), dact.data(), dy.data(), rows * out));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), rows, in, out, q));
  ASSERT_OK(backend_->ReadOperandStats(&plain_stats));
  std::vector<uint16_t> dy_bits(rows * out);
  std::vector<float> dx2(rows * in), dw2(out * in, 0.0f), db2(out, 0.5f);
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->GeluBackwardBf16(pre.data(), dact.data(), dy_bits.data(), rows, out, db2.data()));
  for (int64_t i = 0; i < rows * out; ++i) ASSERT_EQ(dy_bits[i], FloatToBf16(dy[i], Rounding::kNearestEven, 0.0f)) << i;
  LinearQuant qb = q;
  qb.dy_bf16 = dy_bits.data();
  qb.dy_bf16_ld = out;
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), nullptr, dx2.data(), dw2.data(), nullptr, rows, in, out, qb));
  ASSERT_OK(backend_->ReadOperandStats(&bf16_stats));
  EXPECT_EQ(0, std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw.data(), dw2.data(), dw.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(db.data(), db2.data(), db.size() * sizeof(float)));  // += onto 0.5, like dbias
  ASSERT_EQ(plain_stats.size(), bf16_stats.size());
  for (size_t i = 0; i < plain_stats.size(); ++i) EXPECT_EQ(plain_stats[i].nan_blocks, bf16_stats[i].nan_blocks) << i;
  EXPECT_EQ(bf16_stats[static_cast<int>(Role::kDgradDy)].nan_blocks, 1);
  // Without column sums; bad shapes refused.
  ASSERT_OK(backend_->GeluBackwardBf16(pre.data(), dact.data(), dy_bits.data(), rows, out, nullptr));
  Status status = backend_->GeluBackwardBf16(pre.data(), dact.data(), dy_bits.data(), -1, out, nullptr);
  EXPECT_NE(status.message().find("rows"), std::string::npos) << status.message();
}

// ---- AdamW ----------------------------------------------------------------------------

TEST_F(NnCpuTest, AdamWMatchesFormulaInDouble) {
  const int64_t n = 6;
  for (float weight_decay : {0.0f, 0.1f}) {
    SCOPED_TRACE(weight_decay);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, grad_scale = 0.5f;
    std::vector<float> p = Normal(n, 81), m(n, 0.0f), v(n, 0.0f);
    std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
    for (int step = 1; step <= 4; ++step) {
      std::vector<float> g = Normal(n, 82 + step);
      ASSERT_OK(backend_->AdamW(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps,
                                weight_decay, step, grad_scale));
      for (int64_t i = 0; i < n; ++i) {
        double gi = static_cast<double>(g[i]) * grad_scale;
        md[i] = b1 * md[i] + (1.0 - b1) * gi;
        vd[i] = b2 * vd[i] + (1.0 - b2) * gi * gi;
        double m_hat = md[i] / (1.0 - std::pow(static_cast<double>(b1), step));
        double v_hat = vd[i] / (1.0 - std::pow(static_cast<double>(b2), step));
        pd[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * pd[i]);
      }
    }
    // Each step's update is ~lr; fp32 evaluation errs by a few 2^-24 relative
    // on p, m and v per step.
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(p[i], pd[i], 2e-6 * std::max(1.0, std::fabs(pd[i])));
      EXPECT_NEAR(m[i], md[i], 1e-6);
      EXPECT_NEAR(v[i], vd[i], 1e-6);
    }
  }
  std::vector<float> one(1);
  EXPECT_FALSE(backend_
                   ->AdamW(one.data(), one.data(), one.data(), one.data(), 1, 1e-3f, 0.9f, 0.999f,
                           1e-8f, 0.0f, 0, 1.0f)
                   .ok());
}

// AdamWTensors gives the bits of one AdamW call per tensor and, asked for them,
// each tensor's sum of squared deltas (an empty tensor's is 0).
TEST_F(NnCpuTest, AdamWTensorsGivesEachTensorsSquaredDeltas) {
  const std::vector<int64_t> sizes = {5, 0, 9};
  std::vector<std::vector<float>> p, q, g, m1, v1, m2, v2;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = std::max<int64_t>(1, sizes[i]);
    p.push_back(Normal(n, 90 + static_cast<int>(i)));
    q.push_back(p.back());
    g.push_back(Normal(n, 95 + static_cast<int>(i)));
    for (auto* list : {&m1, &v1, &m2, &v2}) list->emplace_back(static_cast<size_t>(n), 0.0f);
  }
  std::vector<AdamWTensor> tensors;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_OK(backend_->AdamW(p[i].data(), g[i].data(), m1[i].data(), v1[i].data(), sizes[i], 1e-2f, 0.9f, 0.95f,
                              1e-8f, 0.1f, 1, 1.0f));
    tensors.push_back(AdamWTensor{q[i].data(), g[i].data(), m2[i].data(), v2[i].data(), sizes[i], 0.1f});
  }
  const std::vector<std::vector<float>> before = q;
  std::vector<double> delta;
  ASSERT_OK(backend_->AdamWTensors(tensors, 1e-2f, 0.9f, 0.95f, 1e-8f, 1, 1.0f, &delta));
  ASSERT_EQ(delta.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(p[i], q[i]) << i;  // the same bits as one AdamW call
    double want = 0.0;
    for (int64_t j = 0; j < sizes[i]; ++j) {
      const double d = static_cast<double>(before[i][static_cast<size_t>(j)] - q[i][static_cast<size_t>(j)]);
      want += d * d;
    }
    EXPECT_EQ(delta[i], want) << i;
    if (sizes[i] > 0) {
      EXPECT_GT(delta[i], 0.0) << i;
    }
  }
}

// ---- RandomNormal ---------------------------------------------------------------------

TEST_F(NnCpuTest, RandomNormalFormulaAndMoments) {
  const int64_t n = 100000;
  const uint64_t seed = 42, offset = 1000;
  const float stddev = 2.0f;
  std::vector<float> x(n);
  ASSERT_OK(backend_->RandomNormal(x.data(), n, seed, offset, stddev));
  for (int64_t i = 0; i < 8; ++i) {
    float u1 = 1.0f - PhiloxUniform(seed, 2 * (offset + i));
    float u2 = PhiloxUniform(seed, 2 * (offset + i) + 1);
    float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
    EXPECT_EQ(x[i], stddev * z) << i;
  }
  double sum = 0.0, squares = 0.0;
  for (float v : x) {
    sum += v / stddev;
    squares += static_cast<double>(v / stddev) * (v / stddev);
  }
  const double mean = sum / n, variance = squares / n - mean * mean;
  // 5 sigma: the mean's sigma is 1/sqrt(n), the variance's sqrt(2/n).
  EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt(static_cast<double>(n)));
  EXPECT_LT(std::fabs(variance - 1.0), 5.0 * std::sqrt(2.0 / n));
  // The offset continues the stream: elements 5.. of offset 1000 are offset 1005.
  std::vector<float> tail(10);
  ASSERT_OK(backend_->RandomNormal(tail.data(), 10, seed, offset + 5, stddev));
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(tail[i], x[5 + i]);
}

// ---- GEMM -------------------------------------------------------------------------------

// GemmCpu promises the naive k-ordered fp32 loop's bits, for any transposes,
// edges that are not multiples of the tiles, and several k slices.
TEST(GemmCpuTest, EqualsNaiveLoopBitForBit) {
  ThreadPool pool(3);
  const GemmShape shape{137, 531, 301};  // m, n, k: partial tiles and blocks everywhere
  for (int variant = 0; variant < 8; ++variant) {
    const bool ta = variant & 1, tb = variant & 2, accumulate = variant & 4;
    SCOPED_TRACE("variant " + std::to_string(variant));
    std::vector<float> a = Normal(shape.m * shape.k, 91), b = Normal(shape.k * shape.n, 92);
    std::vector<float> c = Normal(shape.m * shape.n, 93), expected = c;
    const int64_t lda = ta ? shape.m : shape.k, ldb = tb ? shape.k : shape.n;
    GemmCpu(&pool, shape, ta, tb, 0.75f, a.data(), lda, b.data(), ldb, accumulate, c.data(),
            shape.n);
    GemmNaive(shape, ta, tb, 0.75f, a.data(), lda, b.data(), ldb, accumulate, expected.data(),
              shape.n);
    ASSERT_EQ(0, std::memcmp(c.data(), expected.data(), c.size() * sizeof(float)));
  }
  // And the loop itself is a matrix product (not, say, A^T B by mistake).
  const GemmShape small{2, 2, 3};
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1};
  float c[4];
  GemmCpu(&pool, small, false, false, 1.0f, a, 3, b, 2, false, c, 2);
  EXPECT_EQ(c[0], 4.0f);
  EXPECT_EQ(c[1], 5.0f);
  EXPECT_EQ(c[2], 10.0f);
  EXPECT_EQ(c[3], 11.0f);
}

// ---- Quantized linear layer ---------------------------------------------------------------

// c[i][j] = sum_p a[i][p] b[p][j] in double, with bound[i][j] = sum_p |a b|.
struct DoubleGemm {
  std::vector<double> c, bound;
};
DoubleGemm GemmDouble(const std::vector<float>& a, bool ta, const std::vector<float>& b, bool tb,
                      int64_t m, int64_t n, int64_t k) {
  DoubleGemm result{std::vector<double>(m * n, 0.0), std::vector<double>(m * n, 0.0)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        result.c[i * n + j] += av * bv;
        result.bound[i * n + j] += std::fabs(av * bv);
      }
    }
  }
  return result;
}

// |got - (base + expected)| within fp32 summation error: k products and k - 1
// additions, each rounding by at most 2^-24 relative, plus `extra` roundings
// (alpha folding, the += and bias additions) on the result.
void ExpectGemmClose(const std::string& what, const std::vector<float>& got,
                     const std::vector<float>& base, const DoubleGemm& expected, int64_t k,
                     int extra) {
  ASSERT_EQ(got.size(), expected.c.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double want = expected.c[i] + (base.empty() ? 0.0 : base[i]);
    double tolerance = (k + extra) * kU * (expected.bound[i] + std::fabs(want)) + 1e-30;
    ASSERT_NEAR(got[i], want, tolerance) << what << "[" << i << "]";
  }
}

std::vector<float> MxRef(const std::vector<float>& x, int64_t rows, int64_t cols, int axis,
                         const OperandFormat& f, uint64_t seed) {
  MxOptions o;
  o.elem = ElementOf(f.format);
  o.block = f.mx_block;
  o.axis = axis;
  o.rounding = f.rounding;
  o.seed = seed;
  o.bump_exponent = f.bump_exponent;
  std::vector<float> out(x.size());
  Status status = MxQuantizeRef(x.data(), rows, cols, o, out.data(), nullptr, nullptr);
  EXPECT_TRUE(status.ok()) << status.message();
  return out;
}

std::vector<float> Nvfp4Ref(const std::vector<float>& x, int64_t rows, int64_t cols, int axis,
                            const OperandFormat& f, uint64_t seed) {
  Nvfp4Options o;
  o.tile_16x16 = f.tile_16x16;
  o.rht = f.rht;
  o.axis = axis;
  o.rounding = f.rounding;
  o.seed = seed;
  std::vector<float> out(x.size());
  Status status = Nvfp4QuantizeRef(x.data(), rows, cols, o, out.data(), nullptr, nullptr, nullptr);
  EXPECT_TRUE(status.ok()) << status.message();
  return out;
}

int RoleIndex(Role role) { return static_cast<int>(role); }

TEST_F(NnCpuTest, QuantizedLinearMxfp8MatchesReference) {
  const int64_t rows = 32, in = 64, out = 48;
  LinearQuant q;
  for (OperandFormat& f : q.role) f = Quant(QuantFormat::kMxfp8E4M3);
  q.role[RoleIndex(Role::kDgradDy)] = Quant(QuantFormat::kMxfp8E5M2);
  q.role[RoleIndex(Role::kWgradDy)] = Quant(QuantFormat::kMxfp8E5M2, Rounding::kStochastic);
  q.role[RoleIndex(Role::kFwdW)].bump_exponent = true;
  q.seed = 20240611;
  auto seed = [&](Role role) { return RoleSeed(q.seed, role); };
  auto fmt = [&](Role role) { return q.role[RoleIndex(role)]; };

  std::vector<float> x = WithOutliers(rows * in, 101), w = WithOutliers(out * in, 102);
  std::vector<float> dy = WithOutliers(rows * out, 103), bias = Normal(out, 104);
  std::vector<float> y(rows * out);
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), bias.data(), nullptr, y.data(), rows, in, out, q));
  std::vector<float> xq = MxRef(x, rows, in, 1, fmt(Role::kFwdX), seed(Role::kFwdX));
  std::vector<float> wq = MxRef(w, out, in, 1, fmt(Role::kFwdW), seed(Role::kFwdW));
  DoubleGemm fwd = GemmDouble(xq, false, wq, true, rows, out, in);
  std::vector<float> bias_rows(rows * out);
  for (int64_t i = 0; i < rows * out; ++i) bias_rows[i] = bias[i % out];
  ExpectGemmClose("y", y, bias_rows, fwd, in, 2);
  // The quantization did happen: y is far from the fp32 product somewhere.
  DoubleGemm exact = GemmDouble(x, false, w, true, rows, out, in);
  double max_diff = 0.0;
  for (size_t i = 0; i < y.size(); ++i)
    max_diff =
        std::max(max_diff, std::fabs(y[i] - bias_rows[i] - exact.c[i]) / (exact.bound[i] + 1e-6));
  EXPECT_GT(max_diff, 1e-4);

  std::vector<float> dx(rows * in, 5.0f), dw_base = Normal(out * in, 105),
                                          db_base = Normal(out, 106);
  std::vector<float> dw = dw_base, db = db_base;
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                                     rows, in, out, q));
  // dgrad: dy blocked along `out` (axis 1), w down its columns (axis 0).
  std::vector<float> dyq1 = MxRef(dy, rows, out, 1, fmt(Role::kDgradDy), seed(Role::kDgradDy));
  std::vector<float> wq0 = MxRef(w, out, in, 0, fmt(Role::kDgradW), seed(Role::kDgradW));
  ExpectGemmClose("dx", dx, {}, GemmDouble(dyq1, false, wq0, false, rows, in, out), out, 1);
  // wgrad: dy and x blocked along the rows (axis 0), stochastic rounding seeded per role.
  std::vector<float> dyq0 = MxRef(dy, rows, out, 0, fmt(Role::kWgradDy), seed(Role::kWgradDy));
  std::vector<float> xq0 = MxRef(x, rows, in, 0, fmt(Role::kWgradX), seed(Role::kWgradX));
  ExpectGemmClose("dw", dw, dw_base, GemmDouble(dyq0, true, xq0, false, out, in, rows), rows, 2);
  // dbias: column sums of the unquantized dy.
  for (int64_t o = 0; o < out; ++o) {
    double sum = db_base[o];
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * out + o];
    EXPECT_NEAR(db[o], sum, 1e-4);
  }
  // A different seed changes the stochastic wgrad_dy rounding, hence dw.
  LinearQuant q2 = q;
  q2.seed += 1;
  std::vector<float> dw2 = dw_base;
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw2.data(), nullptr,
                                     rows, in, out, q2));
  EXPECT_NE(dw, dw2);
}

TEST_F(NnCpuTest, QuantizedLinearNvfp4MatchesReference) {
  const int64_t rows = 32, in = 48, out = 32;
  LinearQuant q;
  for (OperandFormat& f : q.role) f = Quant(QuantFormat::kNvfp4);
  q.role[RoleIndex(Role::kFwdW)].tile_16x16 = true;
  q.role[RoleIndex(Role::kDgradW)].tile_16x16 = true;
  q.role[RoleIndex(Role::kDgradDy)].rounding = Rounding::kStochastic;
  q.role[RoleIndex(Role::kWgradDy)].rounding = Rounding::kStochastic;
  q.seed = 77;
  auto seed = [&](Role role) { return RoleSeed(q.seed, role); };
  auto fmt = [&](Role role) { return q.role[RoleIndex(role)]; };
  std::vector<float> x = WithOutliers(rows * in, 111), w = WithOutliers(out * in, 112);
  std::vector<float> dy = WithOutliers(rows * out, 113);

  // The references' outputs include S_dec; the backend folds S_dec_a * S_dec_b
  // into alpha instead, which moves each product by at most 3 roundings.
  std::vector<float> y(rows * out);
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q));
  std::vector<float> xq = Nvfp4Ref(x, rows, in, 1, fmt(Role::kFwdX), seed(Role::kFwdX));
  std::vector<float> wq = Nvfp4Ref(w, out, in, 1, fmt(Role::kFwdW), seed(Role::kFwdW));
  ExpectGemmClose("y", y, {}, GemmDouble(xq, false, wq, true, rows, out, in), in, 4);

  std::vector<float> dx(rows * in), dw(out * in, 0.0f);
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr,
                                     rows, in, out, q));
  std::vector<float> dyq1 = Nvfp4Ref(dy, rows, out, 1, fmt(Role::kDgradDy), seed(Role::kDgradDy));
  std::vector<float> wq0 = Nvfp4Ref(w, out, in, 0, fmt(Role::kDgradW), seed(Role::kDgradW));
  ExpectGemmClose("dx", dx, {}, GemmDouble(dyq1, false, wq0, false, rows, in, out), out, 4);
  std::vector<float> dyq0 = Nvfp4Ref(dy, rows, out, 0, fmt(Role::kWgradDy), seed(Role::kWgradDy));
  std::vector<float> xq0 = Nvfp4Ref(x, rows, in, 0, fmt(Role::kWgradX), seed(Role::kWgradX));
  ExpectGemmClose("dw", dw, {}, GemmDouble(dyq0, true, xq0, false, out, in, rows), rows, 5);
}

TEST_F(NnCpuTest, PerTensorFp8AndBf16Roles) {
  const int64_t rows = 8, in = 24, out = 8;
  LinearQuant q;
  q.role[RoleIndex(Role::kFwdX)] = Quant(QuantFormat::kFp8E4M3);
  q.role[RoleIndex(Role::kFwdW)] = Quant(QuantFormat::kBf16);
  std::vector<float> x = WithOutliers(rows * in, 121), w = Normal(out * in, 122), y(rows * out);
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q));
  std::vector<float> xq(x.size()), wq(w.size());
  ASSERT_OK(Fp8TensorQuantizeRef(x.data(), x.size(), ElemFormat::kE4M3, Rounding::kNearestEven, 0,
                                 xq.data(), nullptr, nullptr));
  ASSERT_OK(Bf16QuantizeRef(w.data(), w.size(), Rounding::kNearestEven, 0, wq.data(), nullptr));
  ExpectGemmClose("y", y, {}, GemmDouble(xq, false, wq, true, rows, out, in), in, 4);
}

TEST_F(NnCpuTest, RhtOnBothWgradRolesCancelsInDw) {
  const int64_t rows = 64, in = 32, out = 16;
  std::vector<float> x = WithOutliers(rows * in, 131), w = Normal(out * in, 132);
  std::vector<float> dy = WithOutliers(rows * out, 133);
  LinearQuant plain;  // nvfp4 on the two wgrad roles, fp32 elsewhere
  plain.role[RoleIndex(Role::kWgradDy)] = Quant(QuantFormat::kNvfp4, Rounding::kStochastic);
  plain.role[RoleIndex(Role::kWgradX)] = Quant(QuantFormat::kNvfp4);
  plain.seed = 9;
  LinearQuant rotated = plain;
  rotated.role[RoleIndex(Role::kWgradDy)].rht = true;
  rotated.role[RoleIndex(Role::kWgradX)].rht = true;

  std::vector<float> dw_plain(out * in, 0.0f), dw_rht(out * in, 0.0f);
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw_plain.data(),
                                     nullptr, rows, in, out, plain));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw_rht.data(), nullptr,
                                     rows, in, out, rotated));
  // Exactly the product of the two rotated, quantized operands.
  const OperandFormat& fdy = rotated.role[RoleIndex(Role::kWgradDy)];
  const OperandFormat& fx = rotated.role[RoleIndex(Role::kWgradX)];
  std::vector<float> dyq = Nvfp4Ref(dy, rows, out, 0, fdy, RoleSeed(rotated.seed, Role::kWgradDy));
  std::vector<float> xq = Nvfp4Ref(x, rows, in, 0, fx, RoleSeed(rotated.seed, Role::kWgradX));
  ExpectGemmClose("dw (rht)", dw_rht, {}, GemmDouble(dyq, true, xq, false, out, in, rows), rows, 5);

  // The rotation cancels: dw with the RHT is the exact dw up to NVFP4's error
  // (4-bit elements, about 10% rms per element on these operands), a relative
  // Frobenius error measured at 0.17 with the RHT and 0.12 without; a rotation
  // that did not cancel (one side only, or along the wrong axis) multiplies dy^T
  // by an unrelated orthogonal matrix and gives an error near 1.4.
  DoubleGemm exact = GemmDouble(dy, true, x, false, out, in, rows);
  auto relative_error = [&](const std::vector<float>& got) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += std::pow(got[i] - exact.c[i], 2);
      den += std::pow(exact.c[i], 2);
    }
    return std::sqrt(num / den);
  };
  const double error_rht = relative_error(dw_rht), error_plain = relative_error(dw_plain);
  EXPECT_LT(error_rht, 0.25) << "plain nvfp4: " << error_plain;
  EXPECT_LT(error_plain, 0.25);
  EXPECT_GT(error_rht, 0.0);
  EXPECT_NE(dw_rht, dw_plain);  // the RHT was applied
}

// With the RHT, saturation compares the rotated input with its dequantized
// value (nn.h): recount it here from the reference's codes and outputs.
TEST_F(NnCpuTest, RhtOperandStatsJudgeTheRotatedInput) {
  const int64_t rows = 64, in = 32, out = 16;
  std::vector<float> x = WithOutliers(rows * in, 191), w = Normal(out * in, 192);
  std::vector<float> dy = WithOutliers(rows * out, 193), dw(out * in, 0.0f);
  LinearQuant q;
  q.role[RoleIndex(Role::kWgradDy)] = Quant(QuantFormat::kNvfp4);
  q.role[RoleIndex(Role::kWgradX)] = Quant(QuantFormat::kNvfp4);
  q.role[RoleIndex(Role::kWgradDy)].rht = q.role[RoleIndex(Role::kWgradX)].rht = true;
  q.stats_slot = 0;
  ASSERT_OK(backend_->ResetOperandStats(1));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr,
                                     rows, in, out, q));
  std::vector<OperandStats> stats;
  ASSERT_OK(backend_->ReadOperandStats(&stats));
  // Saturated elements of x (rows x in, axis 0) counted against `input`.
  auto count = [&](const std::vector<float>& input) {
    Nvfp4Options o;
    o.rht = true;
    o.axis = 0;
    std::vector<float> dequantized(x.size());
    std::vector<uint8_t> codes(x.size());
    EXPECT_TRUE(
        Nvfp4QuantizeRef(x.data(), rows, in, o, dequantized.data(), codes.data(), nullptr, nullptr)
            .ok());
    int64_t saturated = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::fabs(DecodeElem(codes[i], ElemFormat::kE2M1)) == 6.0f &&
          std::fabs(input[i]) > std::fabs(dequantized[i]))
        ++saturated;
    }
    return saturated;
  };
  std::vector<float> rotated(x.size());
  RhtRef(x.data(), rows, in, 0, rotated.data());
  const int64_t expected = count(rotated);
  ASSERT_NE(expected, count(x)) << "the data must tell the rotated input from the raw one";
  const OperandStats& sx = stats[RoleIndex(Role::kWgradX)];
  EXPECT_EQ(sx.saturated, expected);
  EXPECT_EQ(sx.elements, rows * in);
  EXPECT_EQ(sx.blocks, rows * in / 16);
  EXPECT_EQ(sx.nan_blocks, 0);
  EXPECT_EQ(stats[RoleIndex(Role::kWgradDy)].elements, rows * out);
  EXPECT_EQ(stats[RoleIndex(Role::kFwdX)].elements, 0);  // fp32 roles record nothing
}

TEST_F(NnCpuTest, RhtMisuseIsAnError) {
  const int64_t rows = 32, in = 16, out = 16;
  std::vector<float> x = Normal(rows * in, 141), w = Normal(out * in, 142),
                     dy = Normal(rows * out, 143);
  std::vector<float> y(rows * out), dw(out * in, 0.0f);
  LinearQuant q;
  q.role[RoleIndex(Role::kWgradDy)] = Quant(QuantFormat::kNvfp4);
  q.role[RoleIndex(Role::kWgradX)] = Quant(QuantFormat::kNvfp4);
  q.role[RoleIndex(Role::kWgradDy)].rht = true;  // only one side
  Status status = backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw.data(),
                                           nullptr, rows, in, out, q);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("wgrad_dy.rht"), std::string::npos) << status.message();
  EXPECT_EQ(dw, std::vector<float>(out * in, 0.0f));  // nothing written

  LinearQuant fwd;
  fwd.role[RoleIndex(Role::kFwdX)] = Quant(QuantFormat::kNvfp4);
  fwd.role[RoleIndex(Role::kFwdX)].rht = true;
  status = backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, fwd);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("fwd_x.rht"), std::string::npos) << status.message();

  q.role[RoleIndex(Role::kWgradX)].rht = true;  // both: fine at 32 rows, an error at 24
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr,
                                     rows, in, out, q));
  status = backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr, 24,
                                    in, out, q);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rows: 24"), std::string::npos) << status.message();

  LinearQuant mx;
  mx.role[RoleIndex(Role::kWgradDy)] = Quant(QuantFormat::kMxfp8E4M3);
  mx.role[RoleIndex(Role::kWgradX)] = Quant(QuantFormat::kMxfp8E4M3);
  mx.role[RoleIndex(Role::kWgradDy)].rht = mx.role[RoleIndex(Role::kWgradX)].rht = true;
  EXPECT_FALSE(backend_
                   ->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr,
                                    rows, in, out, mx)
                   .ok());
}

// ---- Operand statistics -------------------------------------------------------------------

TEST_F(NnCpuTest, OperandStatsOnHandMadeTensor) {
  // x: 2 rows x 64 = four E4M3 blocks of 32 along the row.
  //   block 0: amax 1.76, just above 1.75 = 448 * 2^-8, the largest value its
  //            scale 2^-8 reaches: clipped to 1.75, saturated;
  //   block 1: amax exactly 1.75: represented, the largest code but not saturated;
  //   block 2: a NaN: a NaN block (its other elements are not saturated either);
  //   block 3: zeros.
  const int64_t rows = 2, in = 64, out = 3;
  std::vector<float> x(rows * in, 0.0f);
  for (int i = 0; i < 32; ++i) x[i] = 0.01f * i;
  x[5] = 1.76f;
  for (int i = 32; i < 64; ++i) x[i] = -0.02f * (i - 32);
  x[40] = -1.75f;
  x[64 + 3] = std::numeric_limits<float>::quiet_NaN();
  x[64 + 4] = 1.0f;
  std::vector<float> w = Normal(out * in, 151), y(rows * out);
  LinearQuant q;
  q.role[RoleIndex(Role::kFwdX)] = Quant(QuantFormat::kMxfp8E4M3);
  q.role[RoleIndex(Role::kFwdW)] = Quant(QuantFormat::kBf16);
  q.stats_slot = 1;
  ASSERT_OK(backend_->ResetOperandStats(2));
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q));
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q));
  std::vector<OperandStats> stats;
  ASSERT_OK(backend_->ReadOperandStats(&stats));
  ASSERT_EQ(stats.size(), 2u * kRoleCount);
  const OperandStats& fx = stats[1 * kRoleCount + RoleIndex(Role::kFwdX)];
  EXPECT_EQ(fx.elements, 2 * rows * in);  // two calls
  EXPECT_EQ(fx.saturated, 2);
  EXPECT_EQ(fx.blocks, 2 * 4);
  EXPECT_EQ(fx.nan_blocks, 2);
  const OperandStats& fw = stats[1 * kRoleCount + RoleIndex(Role::kFwdW)];
  EXPECT_EQ(fw.elements, 2 * out * in);
  EXPECT_EQ(fw.saturated, 0);
  EXPECT_EQ(fw.blocks, 2);  // BF16: one block per call
  EXPECT_EQ(fw.nan_blocks, 0);
  for (int r = 0; r < kRoleCount; ++r) EXPECT_EQ(stats[r].elements, 0) << "slot 0 untouched";
  for (int r = 2; r < kRoleCount; ++r) EXPECT_EQ(stats[kRoleCount + r].elements, 0) << r;

  // NVFP4 counts 1x16 blocks (a 16x16 tile as its 16 blocks) and saturates at 6.
  LinearQuant nv;
  nv.role[RoleIndex(Role::kFwdW)] = Quant(QuantFormat::kNvfp4);
  nv.role[RoleIndex(Role::kFwdW)].tile_16x16 = true;
  nv.stats_slot = 0;
  std::vector<float> w16 = Normal(16 * in, 152), y16(rows * 16);
  std::vector<float> finite_x = Normal(rows * in, 153);
  ASSERT_OK(
      backend_->LinearForward(finite_x.data(), w16.data(), nullptr, nullptr, y16.data(), rows, in, 16, nv));
  ASSERT_OK(backend_->ReadOperandStats(&stats));
  EXPECT_EQ(stats[RoleIndex(Role::kFwdW)].blocks, 16 * in / 16);
  EXPECT_EQ(stats[RoleIndex(Role::kFwdW)].elements, 16 * in);

  ASSERT_OK(backend_->ResetOperandStats(2));
  ASSERT_OK(backend_->ReadOperandStats(&stats));
  for (const OperandStats& s : stats)
    EXPECT_EQ(s.elements + s.blocks + s.saturated + s.nan_blocks, 0);
  q.stats_slot = 2;  // only slots 0 and 1 exist
  Status status = backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, q);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("stats_slot"), std::string::npos) << status.message();
}

// ---- QuantizeDequantize -----------------------------------------------------------------

TEST_F(NnCpuTest, QuantizeDequantizeIncludesPerTensorScale) {
  const int64_t rows = 16, cols = 32;
  std::vector<float> x = WithOutliers(rows * cols, 161), out(rows * cols);
  OperandFormat nv = Quant(QuantFormat::kNvfp4);
  ASSERT_OK(backend_->QuantizeDequantize(x.data(), rows, cols, 1, nv, 5, out.data()));
  EXPECT_EQ(out, Nvfp4Ref(x, rows, cols, 1, nv, 5));
  OperandFormat mx = Quant(QuantFormat::kMxfp6E2M3, Rounding::kStochastic);
  std::vector<float> in_place = x;
  ASSERT_OK(backend_->QuantizeDequantize(in_place.data(), rows, cols, 0, mx, 6, in_place.data()));
  EXPECT_EQ(in_place, MxRef(x, rows, cols, 0, mx, 6));
  OperandFormat fp8 = Quant(QuantFormat::kFp8E5M2);
  ASSERT_OK(backend_->QuantizeDequantize(x.data(), rows, cols, 1, fp8, 0, out.data()));
  std::vector<float> expected(x.size());
  ASSERT_OK(Fp8TensorQuantizeRef(x.data(), x.size(), ElemFormat::kE5M2, Rounding::kNearestEven, 0,
                                 expected.data(), nullptr, nullptr));
  EXPECT_EQ(out, expected);
  ASSERT_OK(backend_->QuantizeDequantize(x.data(), rows, cols, 1, OperandFormat(), 0, out.data()));
  EXPECT_EQ(out, x);
  EXPECT_FALSE(backend_->QuantizeDequantize(x.data(), rows, cols, 2, nv, 0, out.data()).ok());
}

// ---- Determinism --------------------------------------------------------------------------

TEST(NnCpuDeterminismTest, OneAndThreeThreadsGiveTheSameBits) {
  std::unique_ptr<Backend> one = MakeCpu(1), three = MakeCpu(3);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  {  // GEMM at a size with several blocks in m, n and k
    const GemmShape shape{300, 700, 600};
    std::vector<float> a = Normal(shape.m * shape.k, 171), b = Normal(shape.n * shape.k, 172);
    std::vector<float> c1(shape.m * shape.n), c3(shape.m * shape.n);
    ThreadPool pool1(1), pool3(3);
    GemmCpu(&pool1, shape, false, true, 1.0f, a.data(), shape.k, b.data(), shape.k, false,
            c1.data(), shape.n);
    GemmCpu(&pool3, shape, false, true, 1.0f, a.data(), shape.k, b.data(), shape.k, false,
            c3.data(), shape.n);
    EXPECT_TRUE(same(c1, c3));
  }
  {  // quantized linear, forward and backward
    const int64_t rows = 256, in = 320, out = 160;
    LinearQuant q;
    for (OperandFormat& f : q.role) f = Quant(QuantFormat::kMxfp8E4M3, Rounding::kStochastic);
    q.seed = 3;
    std::vector<float> x = WithOutliers(rows * in, 173), w = Normal(out * in, 174);
    std::vector<float> dy = Normal(rows * out, 175), bias = Normal(out, 176);
    std::vector<float> y[2], dx[2], dw[2], db[2];
    Backend* backends[2] = {one.get(), three.get()};
    for (int b = 0; b < 2; ++b) {
      y[b].resize(rows * out);
      dx[b].resize(rows * in);
      dw[b].assign(out * in, 0.5f);
      db[b].assign(out, 0.5f);
      ASSERT_OK(backends[b]->LinearForward(x.data(), w.data(), bias.data(), nullptr, y[b].data(), rows, in,
                                           out, q));
      ASSERT_OK(backends[b]->LinearBackward(x.data(), w.data(), dy.data(), dx[b].data(),
                                            dw[b].data(), db[b].data(), rows, in, out, q));
    }
    EXPECT_TRUE(same(y[0], y[1]));
    EXPECT_TRUE(same(dx[0], dx[1]));
    EXPECT_TRUE(same(dw[0], dw[1]));
    EXPECT_TRUE(same(db[0], db[1]));
  }
  {  // attention with bf16 operands, forward and backward
    const int64_t batch = 2, seq = 33, heads = 3, dim = 48;
    std::vector<float> qkv = Normal(batch * seq * 3 * dim, 177),
                       dout = Normal(batch * seq * dim, 178);
    std::vector<float> out[2], stats[2], dqkv[2];
    Backend* backends[2] = {one.get(), three.get()};
    for (int b = 0; b < 2; ++b) {
      out[b].resize(batch * seq * dim);
      stats[b].resize(batch * heads * seq * 2);
      dqkv[b].resize(qkv.size());
      ASSERT_OK(backends[b]->AttentionForward(qkv.data(), out[b].data(), stats[b].data(), batch,
                                              seq, heads, dim, true));
      ASSERT_OK(backends[b]->AttentionBackward(qkv.data(), out[b].data(), stats[b].data(),
                                               dout.data(), dqkv[b].data(), batch, seq, heads, dim,
                                               true));
    }
    EXPECT_TRUE(same(out[0], out[1]));
    EXPECT_TRUE(same(stats[0], stats[1]));
    EXPECT_TRUE(same(dqkv[0], dqkv[1]));
  }
}

// ---- Memory, elementwise, reductions, errors ----------------------------------------------

TEST_F(NnCpuTest, AllocIsZeroedAndAligned) {
  void* ptr = nullptr;
  ASSERT_OK(backend_->Alloc(1000, &ptr));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % 256, 0u);
  std::vector<unsigned char> host(1000, 0xAB);
  ASSERT_OK(backend_->Download(host.data(), ptr, host.size()));
  EXPECT_EQ(host, std::vector<unsigned char>(1000, 0));
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  ASSERT_OK(backend_->Upload(ptr, values.data(), 12));
  EXPECT_EQ(static_cast<float*>(ptr)[2], 3.0f);
  backend_->Free(ptr);
  backend_->Free(nullptr);
  EXPECT_STREQ(backend_->name(), "cpu");
  EXPECT_EQ(backend_->Describe(), "cpu: 2 threads");
}

TEST_F(NnCpuTest, ElementwiseOps) {
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40}, out(4);
  ASSERT_OK(backend_->Add(a.data(), b.data(), out.data(), 4));
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33, 44}));
  ASSERT_OK(backend_->Add(a.data(), b.data(), a.data(), 4));  // out aliases a
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33, 44}));
  ASSERT_OK(backend_->Axpy(0.5f, b.data(), a.data(), 4));
  EXPECT_EQ(a, (std::vector<float>{16, 32, 48, 64}));
  ASSERT_OK(backend_->Scale(a.data(), 4, 0.25f));
  EXPECT_EQ(a, (std::vector<float>{4, 8, 12, 16}));
  ASSERT_OK(backend_->Fill(a.data(), 3, -1.0f));
  EXPECT_EQ(a, (std::vector<float>{-1, -1, -1, 16}));
  std::vector<float> src = {1, 2, 3, 4, 5, 6}, dst(8, 0.0f);  // 2 x 2 of a 2 x 3 into a 2 x 4
  ASSERT_OK(backend_->Copy2D(src.data(), 3, dst.data(), 4, 2, 2));
  EXPECT_EQ(dst, (std::vector<float>{1, 2, 0, 0, 4, 5, 0, 0}));
  EXPECT_FALSE(backend_->Copy2D(src.data(), 1, dst.data(), 4, 2, 2).ok());
  EXPECT_FALSE(backend_->Fill(a.data(), -1, 0.0f).ok());
}

TEST_F(NnCpuTest, ReductionsInDouble) {
  std::vector<float> a = Normal(200000, 181), b = Normal(200000, 182);
  std::vector<Span> spans = {{a.data(), 200000}, {b.data(), 17}, {a.data(), 0}};
  std::vector<double> sums, squares, dots;
  ASSERT_OK(backend_->Sums(spans, &sums));
  ASSERT_OK(backend_->SumSquares(spans, &squares));
  ASSERT_OK(backend_->Dots(spans, {{b.data(), 200000}, {a.data(), 17}, {b.data(), 0}}, &dots));
  double s = 0, sq = 0, d = 0, s17 = 0;
  for (int i = 0; i < 200000; ++i) {
    s += a[i];
    sq += static_cast<double>(a[i]) * a[i];
    d += static_cast<double>(a[i]) * b[i];
  }
  for (int i = 0; i < 17; ++i) s17 += b[i];
  ASSERT_EQ(sums.size(), 3u);
  // Chunked double sums against one sequential double sum: both err by ~1e-16
  // relative per addition, far below float resolution.
  EXPECT_NEAR(sums[0], s, 1e-12 * sq);
  EXPECT_NEAR(sums[1], s17, 1e-12);
  EXPECT_EQ(sums[2], 0.0);
  EXPECT_NEAR(squares[0], sq, 1e-12 * sq);
  EXPECT_NEAR(dots[0], d, 1e-12 * sq);
  EXPECT_FALSE(backend_->Dots(spans, {{b.data(), 5}}, &dots).ok());
}

// The CPU backend has no per-op timer (turning it on is refused, off is fine)
// and no device memory figure.
TEST_F(NnCpuTest, ProfilingIsRefusedWithoutATimer) {
  const Status on = backend_->SetProfiling(true);
  ASSERT_FALSE(on.ok());
  EXPECT_NE(on.message().find("cpu backend has no per-op timer"), std::string::npos) << on.message();
  EXPECT_TRUE(backend_->SetProfiling(false).ok());
  // Nor a device memory figure.
  int64_t bytes = -1;
  EXPECT_FALSE(backend_->DeviceMemoryInUse(&bytes));
  EXPECT_EQ(bytes, 0);
}

// Ops longest first, each op's parts under it, per step over `steps`.
TEST(FormatProfileTest, OrdersOpsAndNestsTheirParts) {
  const std::vector<OpTime> times = {{"Add", 20, 2.0, 1.0},
                                     {"LinearForward > gemm", 8, 6.0, 0.5},
                                     {"LinearForward", 8, 10.0, 3.0},
                                     {"LinearForward > quantize", 16, 3.0, 1.5}};
  const std::string table = FormatProfile(times, 2, 8.0);
  const size_t linear = table.find("LinearForward"), gemm = table.find("> gemm"),
               quantize = table.find("> quantize"), add = table.find("Add");
  ASSERT_NE(linear, std::string::npos) << table;
  EXPECT_LT(linear, gemm) << table;
  EXPECT_LT(gemm, quantize) << table;
  EXPECT_LT(quantize, add) << table;
  // LinearForward: 4 calls and 5 ms per step, 62.5% of an 8 ms step, 1.5 ms of
  // host time; all ops 6 ms (75%) and 2 ms of host time (the parts' host time is
  // inside their op's), so 6 ms of the step's wall clock is host work outside them.
  EXPECT_NE(table.find("4.0      5.000    62.5%      1.500"), std::string::npos) << table;
  EXPECT_NE(table.find("6.000    75.0%      2.000"), std::string::npos) << table;
  const size_t outside = table.find("host outside the ops");
  ASSERT_NE(outside, std::string::npos) << table;
  const std::string outside_line = table.substr(outside, table.find('\n', outside) - outside);
  EXPECT_EQ(outside_line.substr(outside_line.size() - 6), " 6.000") << table;
}

// ---- Gated linear attention (GLA) -------------------------------------------------------

TEST_F(NnCpuTest, LogSigmoidValuesGradientAndExtremes) {
  const int64_t n = 12;
  const float scale = 1.0f / 16.0f;
  std::vector<float> x = Normal(n, 71, 3.0f), r = Normal(n, 72), y(n), dx(n, 7.0f);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->LogSigmoidForward(x.data(), y.data(), n, scale).ok());
    return WeightedSum(y, r);
  };
  ASSERT_OK(backend_->LogSigmoidBackward(x.data(), r.data(), dx.data(), n, scale));
  ExpectGradient("logsigmoid dx", &x, loss, dx);
  loss();
  for (int64_t i = 0; i < n; ++i) {
    const double expected = scale * -std::log1p(std::exp(-static_cast<double>(x[i])));
    EXPECT_NEAR(y[i], expected, 4 * kU * std::fabs(expected) + 1e-12) << i;
    EXPECT_LE(y[i], 0.0f);
  }
  // No overflow at either end: logsigmoid(-200) = -200, logsigmoid(200) = -exp(-200) ~ 0.
  std::vector<float> big = {-200.0f, 200.0f, -88.0f, 89.0f}, out(4), grad(4);
  const std::vector<float> ones(4, 1.0f);
  ASSERT_OK(backend_->LogSigmoidForward(big.data(), out.data(), 4, 1.0f));
  ASSERT_OK(backend_->LogSigmoidBackward(big.data(), ones.data(), grad.data(), 4, 1.0f));
  EXPECT_EQ(out[0], -200.0f);
  EXPECT_EQ(out[1], -0.0f);
  EXPECT_NEAR(out[2], -88.0f, 1e-5);
  EXPECT_EQ(grad[0], 1.0f);  // sigmoid(200)
  EXPECT_EQ(grad[1], 0.0f);  // 1 / (1 + inf)
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}

// g is a column block of a wider matrix (g_ld > cols): the backward writes dg
// there and leaves the other columns alone.
TEST_F(NnCpuTest, SiluGateGradientOnAColumnBlock) {
  const int64_t rows = 3, cols = 5, g_ld = 9;
  std::vector<float> x = Normal(rows * cols, 81), g = Normal(rows * g_ld, 82, 2.0f), r = Normal(rows * cols, 83);
  std::vector<float> y(rows * cols), dx(rows * cols, 7.0f), dg(rows * g_ld, 7.0f);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->SiluGateForward(x.data(), g.data(), g_ld, y.data(), rows, cols).ok());
    return WeightedSum(y, r);
  };
  ASSERT_OK(backend_->SiluGateBackward(x.data(), g.data(), g_ld, r.data(), dx.data(), dg.data(), rows, cols));
  ExpectGradient("silu gate dx", &x, loss, dx);
  // The gradient through g's columns past cols is 0 (they are not read), and
  // dg keeps its 7s there.
  std::vector<float> dg_expected = dg;
  for (int64_t rr = 0; rr < rows; ++rr) {
    for (int64_t c = cols; c < g_ld; ++c) {
      EXPECT_EQ(dg[rr * g_ld + c], 7.0f);
      dg_expected[rr * g_ld + c] = 0.0f;
    }
  }
  ExpectGradient("silu gate dg", &g, loss, dg_expected);
  loss();
  const double a = g[g_ld + 2];  // row 1, column 2
  EXPECT_NEAR(y[cols + 2], x[cols + 2] * a / (1.0 + std::exp(-a)), 1e-6);
}

// The recurrence by hand for one head of size 1 x 1 and three positions.
TEST_F(NnCpuTest, GlaForwardIsTheRecurrence) {
  const int64_t ld = 3;
  // q, k, v per position; gates log(0.5), log(0.25), 0.
  std::vector<float> qkv = {2.0f, 1.0f, 3.0f, -1.0f, 2.0f, 1.0f, 0.5f, 4.0f, -2.0f};
  std::vector<float> gk = {std::log(0.5f), std::log(0.25f), 0.0f}, out(3);
  ASSERT_OK(backend_->GlaForward(qkv.data(), ld, gk.data(), out.data(), 1, 3, 1, 1, 1));
  const double s0 = 1.0 * 3.0, s1 = 0.25 * s0 + 2.0 * 1.0, s2 = 1.0 * s1 + 4.0 * -2.0;
  EXPECT_NEAR(out[0], 2.0 * s0, 1e-6);
  EXPECT_NEAR(out[1], -1.0 * s1, 1e-6);
  EXPECT_NEAR(out[2], 0.5 * s2, 1e-6);
}

// GLA's operands: q, k, v at the start of rows ld apart, and the log gates.
struct GlaCase {
  gla_cpu::Shape shape;
  std::vector<float> qkv, gk;
};

GlaCase MakeGlaCase(int64_t batch, int64_t seq, int64_t heads, int64_t dk, int64_t dv, int64_t extra,
                    float gate_scale, uint32_t seed) {
  GlaCase c;
  c.shape = gla_cpu::Shape{batch, seq, heads, dk, dv, 2 * dk + dv + extra};
  c.qkv = Normal(batch * seq * c.shape.ld, seed);
  c.gk = nn_test::LogGates(batch * seq * dk, seed + 1, gate_scale);
  return c;
}

// Gradients of the sequential recurrence (the CPU backend's) against central
// differences, through q, k, v and the gates, over two heads, with extra
// columns in qkv's rows that the backward must leave alone.
TEST_F(NnCpuTest, GlaGradient) {
  GlaCase c = MakeGlaCase(2, 5, 2, 4, 6, 3, 0.3f, 91);
  const gla_cpu::Shape& s = c.shape;
  std::vector<float> r = Normal(s.batch * s.seq * s.dv, 93), out(s.batch * s.seq * s.dv);
  auto loss = [&]() {
    EXPECT_TRUE(backend_->GlaForward(c.qkv.data(), s.ld, c.gk.data(), out.data(), s.batch, s.seq, s.heads, s.dk, s.dv)
                    .ok());
    return WeightedSum(out, r);
  };
  std::vector<float> dqkv(c.qkv.size(), 7.0f), dgk(c.gk.size(), 7.0f);
  ASSERT_OK(backend_->GlaBackward(c.qkv.data(), s.ld, c.gk.data(), r.data(), dqkv.data(), dgk.data(), s.batch, s.seq,
                                  s.heads, s.dk, s.dv));
  std::vector<float> dqkv_expected = dqkv;
  for (int64_t row = 0; row < s.batch * s.seq; ++row) {
    for (int64_t col = 2 * s.dk + s.dv; col < s.ld; ++col) {
      EXPECT_EQ(dqkv[row * s.ld + col], 7.0f);
      dqkv_expected[row * s.ld + col] = 0.0f;
    }
  }
  ExpectGradient("gla dqkv", &c.qkv, loss, dqkv_expected);
  ExpectGradient("gla dgk", &c.gk, loss, dgk);
}

// The chunked form (what the CUDA kernels compute) against the definition,
// forward and backward, for chunk sizes that do and do not divide the sequence
// (1: one position a chunk; 64: the CUDA chunk, several chunks), with moderate
// gates and with gates so negative (-30 |N|) that a chunk's cumulative sums fall
// far below -88, where a form dividing by exp(B_s) would overflow.
// Tolerance: both forms sum the same O(1) products in fp32 in different orders,
// so they differ by a few hundred ulps of the largest partial sums; and the
// chunked form's decay between positions s < t is exp(B_t - B_s), a difference of
// two cumulative sums that carries an absolute error of about an ulp of |B|,
// hence a relative error of ulp(|B|) in the decay (the sequential form
// multiplies the exact per-position decays). With gates of -0.1 |N|, |B| < 10:
// 1e-5 relative to max(1, |value|), and 5e-5 for dgk, a reverse cumulative sum
// over the sequence whose terms cancel (observed: 2e-5 at chunk 64). With gates
// of -30 |N|, |B| reaches ~1500 within a chunk of 64, whose ulp is 1.2e-4: 3e-4
// (observed: 9e-5). A wrong term (a missing decay, an off-by-one in the causal
// mask) is off by O(0.1).
TEST_F(NnCpuTest, GlaChunkedMatchesSequential) {
  for (float gate_scale : {0.1f, 30.0f}) {
    for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{64}}) {
      const int64_t seq = chunk == 64 ? 150 : 10;
      GlaCase c = MakeGlaCase(2, seq, 2, 6, 10, 1, gate_scale, 101);
      const gla_cpu::Shape& s = c.shape;
      const std::vector<float> dout = Normal(s.batch * s.seq * s.dv, 103);
      std::vector<float> seq_out(s.batch * s.seq * s.dv), chunk_out(seq_out.size());
      std::vector<float> seq_dqkv(c.qkv.size(), 0.0f), chunk_dqkv(c.qkv.size(), 0.0f);
      std::vector<float> seq_dgk(c.gk.size()), chunk_dgk(c.gk.size());
      for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t h = 0; h < s.heads; ++h) {
          gla_cpu::ForwardSequential(c.qkv.data(), c.gk.data(), seq_out.data(), s, b, h);
          gla_cpu::ForwardChunked(c.qkv.data(), c.gk.data(), chunk_out.data(), s, b, h, chunk);
          gla_cpu::BackwardSequential(c.qkv.data(), c.gk.data(), dout.data(), seq_dqkv.data(), seq_dgk.data(), s, b,
                                      h);
          gla_cpu::BackwardChunked(c.qkv.data(), c.gk.data(), dout.data(), chunk_dqkv.data(), chunk_dgk.data(), s, b,
                                   h, chunk);
        }
      }
      const std::string what = "gates " + std::to_string(gate_scale) + ", chunk " + std::to_string(chunk);
      double tolerance = 0.0;
      const auto expect_close = [&](const char* name, const std::vector<float>& want, const std::vector<float>& got) {
        double worst = 0.0;
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(std::isfinite(got[i])) << what << " " << name << "[" << i << "]";
          worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(static_cast<double>(want[i]))));
        }
        EXPECT_LE(worst, tolerance) << what << " " << name;
      };
      tolerance = gate_scale > 1.0f ? 3e-4 : 1e-5;
      expect_close("out", seq_out, chunk_out);
      expect_close("dqkv", seq_dqkv, chunk_dqkv);
      tolerance = gate_scale > 1.0f ? 3e-4 : 5e-5;
      expect_close("dgk", seq_dgk, chunk_dgk);
    }
  }
}

TEST_F(NnCpuTest, GlaShapeErrorsNameTheField) {
  std::vector<float> buf(1000);
  Status status = backend_->GlaForward(buf.data(), 20, buf.data(), buf.data(), 1, 4, 3, 4, 6);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("GlaForward: dk: 4 is not allowed; need a positive multiple of heads 3"),
            std::string::npos)
      << status.message();
  status = backend_->GlaBackward(buf.data(), 9, buf.data(), buf.data(), buf.data(), buf.data(), 1, 4, 2, 4, 2);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("GlaBackward: ld: 9 is not allowed; need >= 2 dk + dv = 10"), std::string::npos)
      << status.message();
  status = backend_->SiluGateForward(buf.data(), buf.data(), 3, buf.data(), 2, 4);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("g_ld: 3"), std::string::npos) << status.message();
}

TEST_F(NnCpuTest, ShapeErrorsNameTheField) {
  std::vector<float> buf(1000);
  Status status = backend_->AttentionForward(buf.data(), buf.data(), buf.data(), 1, 4, 5, 8, false);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("heads: 5"), std::string::npos) << status.message();
  status =
      backend_->LinearForward(buf.data(), buf.data(), nullptr, nullptr, buf.data(), 0, 4, 4, LinearQuant());
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rows: 0"), std::string::npos) << status.message();
  status = backend_->LayerNormForward(buf.data(), buf.data(), nullptr, buf.data(), buf.data(),
                                      buf.data(), 2, -3, 1e-5f);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cols: -3"), std::string::npos) << status.message();
  // Quantizer errors name the role and the field.
  LinearQuant nv;
  nv.role[RoleIndex(Role::kFwdX)] = Quant(QuantFormat::kNvfp4);
  status = backend_->LinearForward(buf.data(), buf.data(), nullptr, nullptr, buf.data(), 2, 24, 2, nv);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("fwd_x: cols: 24"), std::string::npos) << status.message();
  nv.role[RoleIndex(Role::kFwdX)].rounding = Rounding::kNearestAway;
  status = backend_->LinearForward(buf.data(), buf.data(), nullptr, nullptr, buf.data(), 2, 32, 2, nv);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("fwd_x: rounding"), std::string::npos) << status.message();
  std::unique_ptr<Backend> backend;
  EXPECT_FALSE(MakeCpuBackend(-1, &backend).ok());
  ASSERT_OK(MakeCpuBackend(0, &backend));  // hardware concurrency
  EXPECT_EQ(backend->name(), std::string("cpu"));
}


// ---- Hot-Channel Patch (docs/hcp.md) -------------------------------------------

// Every role NVFP4; with_rht: the recipe's RHT on the two wgrad roles.
LinearQuant Nvfp4Roles(bool with_rht) {
  LinearQuant q;
  for (OperandFormat& f : q.role) f = nn_test::Quant(QuantFormat::kNvfp4);
  if (with_rht) {
    q.role[static_cast<int>(Role::kWgradDy)].rht = true;
    q.role[static_cast<int>(Role::kWgradX)].rht = true;
  }
  q.seed = 77;
  return q;
}

using nn_test::RelError;

std::vector<int32_t> AllIndices(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i);
  return v;
}

// The three GEMMs of one NVFP4 linear layer with outliers, unpatched, patched
// on every channel (k = K: the fp32 layer's results up to fp32 rounding, far
// closer than NVFP4 alone), and with count 0 (the unpatched bits).
TEST_F(NnCpuTest, HcpWithEveryChannelGivesTheFp32LayerAndWithNoneThePlainOne) {
  const int64_t rows = 32, in = 64, out = 48;
  const std::vector<float> x = nn_test::WithOutliers(rows * in, 11), w = nn_test::WithOutliers(out * in, 12, 0.1f),
                           dy = nn_test::WithOutliers(rows * out, 13);
  const std::vector<int32_t> all_in = AllIndices(in), all_out = AllIndices(out);
  for (const bool rht : {false, true}) {
    SCOPED_TRACE(rht ? "rht on the wgrad roles" : "no rht");
    struct Result {
      std::vector<float> y, dx, dw;
    };
    auto run = [&](const LinearQuant& q) {
      Result r{std::vector<float>(rows * out), std::vector<float>(rows * in), std::vector<float>(out * in, 0.0f)};
      EXPECT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, r.y.data(), rows, in, out, q));
      EXPECT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), r.dx.data(), r.dw.data(), nullptr, rows, in,
                                         out, q));
      return r;
    };
    const Result fp32 = run(LinearQuant());
    const LinearQuant plain_q = Nvfp4Roles(rht);
    const Result plain = run(plain_q);
    LinearQuant none = plain_q;
    none.hcp_fwd = HotChannels{all_in.data(), 0};
    none.hcp_dgrad = HotChannels{all_out.data(), 0};
    const Result zero = run(none);
    EXPECT_EQ(0, std::memcmp(zero.y.data(), plain.y.data(), plain.y.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(zero.dx.data(), plain.dx.data(), plain.dx.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(zero.dw.data(), plain.dw.data(), plain.dw.size() * sizeof(float)));
    LinearQuant every = plain_q;
    every.hcp_fwd = HotChannels{all_in.data(), static_cast<int32_t>(in)};
    every.hcp_dgrad = HotChannels{all_out.data(), static_cast<int32_t>(out)};
    every.hcp_wgrad_rows = static_cast<int32_t>(rows);
    const Result full = run(every);
    const double e_y = RelError(full.y, fp32.y), e_dx = RelError(full.dx, fp32.dx), e_dw = RelError(full.dw, fp32.dw);
    std::printf("k = K: relative error to fp32 y %.2e dx %.2e dw %.2e; NVFP4 alone y %.2e dx %.2e dw %.2e\n", e_y,
                e_dx, e_dw, RelError(plain.y, fp32.y), RelError(plain.dx, fp32.dx), RelError(plain.dw, fp32.dw));
    EXPECT_LT(e_y, 1e-5);
    EXPECT_LT(e_dx, 1e-5);
    EXPECT_LT(e_dw, 1e-5);
    EXPECT_GT(RelError(plain.y, fp32.y), 1e-2);  // NVFP4 alone is far off: the patch did the work
  }
}

// Intermediate k: the patched result minus the unpatched one is the formula's
// patch, sum over hot j of dA(., j) B(., j)^T + Q(A)(., j) dB(., j)^T, computed
// here in double from QuantizeDequantize's Q; and the scores are the mean
// absolute residuals of the formula, the top k as nn.h orders them.
TEST_F(NnCpuTest, HcpWithSomeChannelsAddsTheFormulasPatchAndScoresRankTheResiduals) {
  const int64_t rows = 32, in = 64, out = 48;
  const std::vector<float> x = nn_test::WithOutliers(rows * in, 21), w = nn_test::WithOutliers(out * in, 22, 0.1f),
                           dy = nn_test::WithOutliers(rows * out, 23);
  const LinearQuant q = Nvfp4Roles(false);
  auto qdq = [&](const std::vector<float>& t, int64_t r, int64_t c, int axis, Role role) {
    std::vector<float> out_values(t.size());
    EXPECT_OK(backend_->QuantizeDequantize(t.data(), r, c, axis, q.role[static_cast<int>(role)],
                                           RoleSeed(q.seed, role), out_values.data()));
    return out_values;
  };
  // Q of each role, as the layer's GEMMs quantize them.
  const std::vector<float> qx = qdq(x, rows, in, 1, Role::kFwdX), qw_f = qdq(w, out, in, 1, Role::kFwdW),
                           qdy = qdq(dy, rows, out, 1, Role::kDgradDy), qw_d = qdq(w, out, in, 0, Role::kDgradW);
  // Scores: the formula, and HcpTopK's choice of 5.
  std::vector<float> scores_f(in), scores_d(out);
  ASSERT_OK(backend_->HcpScores(Backend::HcpGemm::kFwd, x.data(), w.data(), rows, in, out, q, scores_f.data()));
  ASSERT_OK(backend_->HcpScores(Backend::HcpGemm::kDgrad, dy.data(), w.data(), rows, in, out, q, scores_d.data()));
  for (int64_t j = 0; j < in; ++j) {
    double sa = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) sa += std::fabs(x[r * in + j] - qx[r * in + j]);
    for (int64_t o = 0; o < out; ++o) sb += std::fabs(w[o * in + j] - qw_f[o * in + j]);
    EXPECT_NEAR(scores_f[j], sa / rows + sb / out, 1e-5 * (sa / rows + sb / out) + 1e-7) << "fwd channel " << j;
  }
  for (int64_t j = 0; j < out; ++j) {
    double sa = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) sa += std::fabs(dy[r * out + j] - qdy[r * out + j]);
    for (int64_t i = 0; i < in; ++i) sb += std::fabs(w[j * in + i] - qw_d[j * in + i]);
    EXPECT_NEAR(scores_d[j], sa / rows + sb / in, 1e-5 * (sa / rows + sb / in) + 1e-7) << "dgrad channel " << j;
  }
  std::vector<int32_t> hot_f(5), hot_d(5);
  ASSERT_OK(backend_->HcpTopK(scores_f.data(), in, 5, hot_f.data()));
  ASSERT_OK(backend_->HcpTopK(scores_d.data(), out, 5, hot_d.data()));
  for (const std::vector<int32_t>* hot : {&hot_f, &hot_d}) {
    const std::vector<float>& sc = hot == &hot_f ? scores_f : scores_d;
    EXPECT_TRUE(std::is_sorted(hot->begin(), hot->end()));
    float lowest_kept = INFINITY;
    for (int32_t j : *hot) lowest_kept = std::min(lowest_kept, sc[j]);
    int above = 0;
    for (float v : sc) above += v > lowest_kept;
    EXPECT_LE(above, 4);  // nothing outside the set scores higher than what it kept
  }

  // The patched GEMMs against the formula.
  std::vector<float> y0(rows * out), y1(rows * out), dx0(rows * in), dx1(rows * in);
  std::vector<float> dw0(out * in, 0.0f), dw1(out * in, 0.0f);
  LinearQuant patched = q;
  patched.hcp_fwd = HotChannels{hot_f.data(), 5};
  patched.hcp_dgrad = HotChannels{hot_d.data(), 5};
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y0.data(), rows, in, out, q));
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y1.data(), rows, in, out, patched));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx0.data(), dw0.data(), nullptr, rows, in, out, q));
  ASSERT_OK(
      backend_->LinearBackward(x.data(), w.data(), dy.data(), dx1.data(), dw1.data(), nullptr, rows, in, out, patched));
  // choose_into: the calls choose the same sets themselves and patch with them.
  std::vector<int32_t> into_f(5, -1), into_d(5, -1);
  LinearQuant choosing = q;
  choosing.hcp_fwd = HotChannels{nullptr, 5, into_f.data()};
  choosing.hcp_dgrad = HotChannels{nullptr, 5, into_d.data()};
  std::vector<float> y_c(rows * out), dx_c(rows * in), dw_c(out * in, 0.0f);
  ASSERT_OK(backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y_c.data(), rows, in, out, choosing));
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), dx_c.data(), dw_c.data(), nullptr, rows, in, out,
                                     choosing));
  EXPECT_EQ(into_f, hot_f);
  EXPECT_EQ(into_d, hot_d);
  EXPECT_EQ(0, std::memcmp(y_c.data(), y1.data(), y1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dx_c.data(), dx1.data(), dx1.size() * sizeof(float)));
  double worst_y = 0, worst_dx = 0, scale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double patch = 0;
      for (int32_t j : hot_f) {
        patch += (static_cast<double>(x[r * in + j]) - qx[r * in + j]) * w[o * in + j] +
                 static_cast<double>(qx[r * in + j]) * (w[o * in + j] - qw_f[o * in + j]);
      }
      worst_y = std::max(worst_y, std::fabs((static_cast<double>(y1[r * out + o]) - y0[r * out + o]) - patch));
      scale = std::max(scale, std::fabs(static_cast<double>(y0[r * out + o])));
    }
    for (int64_t i = 0; i < in; ++i) {
      double patch = 0;
      for (int32_t j : hot_d) {
        patch += (static_cast<double>(dy[r * out + j]) - qdy[r * out + j]) * w[j * in + i] +
                 static_cast<double>(qdy[r * out + j]) * (w[j * in + i] - qw_d[j * in + i]);
      }
      worst_dx = std::max(worst_dx, std::fabs((static_cast<double>(dx1[r * in + i]) - dx0[r * in + i]) - patch));
    }
  }
  EXPECT_LT(worst_y, 1e-5 * scale) << "forward patch";
  EXPECT_LT(worst_dx, 1e-5 * scale) << "dgrad patch";
  EXPECT_GT(RelError(y1, y0), 1e-3);  // the patch is not nothing
  // No wgrad rows asked: dw is the unpatched one, bit for bit.
  EXPECT_EQ(0, std::memcmp(dw0.data(), dw1.data(), dw0.size() * sizeof(float)));

  // The wgrad's rows, chosen per call: the k tokens of highest score, and the
  // formula's patch over them.
  LinearQuant wrows = q;
  wrows.hcp_wgrad_rows = 6;
  std::vector<float> dw2(out * in, 0.0f);
  ASSERT_OK(backend_->LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw2.data(), nullptr, rows, in, out, wrows));
  const std::vector<float> qdy_w = qdq(dy, rows, out, 0, Role::kWgradDy), qx_w = qdq(x, rows, in, 0, Role::kWgradX);
  std::vector<float> token_scores(rows);
  for (int64_t t = 0; t < rows; ++t) {
    double sa = 0, sb = 0;
    for (int64_t o = 0; o < out; ++o) sa += std::fabs(dy[t * out + o] - qdy_w[t * out + o]);
    for (int64_t i = 0; i < in; ++i) sb += std::fabs(x[t * in + i] - qx_w[t * in + i]);
    token_scores[t] = static_cast<float>(sa / out + sb / in);
  }
  std::vector<int32_t> hot_t(6);
  ASSERT_OK(backend_->HcpTopK(token_scores.data(), rows, 6, hot_t.data()));
  double worst_dw = 0, dw_scale = 0;
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double patch = 0;
      for (int32_t t : hot_t) {
        patch += (static_cast<double>(dy[t * out + o]) - qdy_w[t * out + o]) * x[t * in + i] +
                 static_cast<double>(qdy_w[t * out + o]) * (x[t * in + i] - qx_w[t * in + i]);
      }
      worst_dw = std::max(worst_dw, std::fabs((static_cast<double>(dw2[o * in + i]) - dw0[o * in + i]) - patch));
      dw_scale = std::max(dw_scale, std::fabs(static_cast<double>(dw0[o * in + i])));
    }
  }
  EXPECT_LT(worst_dw, 1e-5 * dw_scale) << "wgrad patch";
}

TEST_F(NnCpuTest, HcpTopKOrdersTiesByIndexAndNanFirst) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {0.5f, 2.0f, nan, 2.0f, 1.0f, 3.0f, 2.0f};
  std::vector<int32_t> top(4);
  ASSERT_OK(backend_->HcpTopK(scores.data(), 7, 4, top.data()));
  // NaN (2), then 3.0 (5), then the two lowest-indexed 2.0s (1, 3); ascending.
  EXPECT_EQ(top, (std::vector<int32_t>{1, 2, 3, 5}));
  ASSERT_OK(backend_->HcpTopK(scores.data(), 7, 0, top.data()));
  Status s = backend_->HcpTopK(scores.data(), 7, 8, top.data());
  EXPECT_NE(s.message().find("k: 8 of count 7 is not allowed"), std::string::npos) << s.message();
}

TEST_F(NnCpuTest, HcpBadHotSetsAreRefusedNamingTheFieldAndChangeNothing) {
  const int64_t rows = 16, in = 32, out = 16;
  const std::vector<float> x = Normal(rows * in, 31), w = Normal(out * in, 32), dy = Normal(rows * out, 33);
  std::vector<float> y(rows * out, 7.0f), dx(rows * in, 7.0f), dw(out * in, 7.0f);
  const LinearQuant q = Nvfp4Roles(false);
  auto refused = [&](const LinearQuant& bad, bool forward, const std::string& expect) {
    Status s = forward ? backend_->LinearForward(x.data(), w.data(), nullptr, nullptr, y.data(), rows, in, out, bad)
                       : backend_->LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, rows,
                                                  in, out, bad);
    EXPECT_FALSE(s.ok()) << expect;
    EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  };
  const std::vector<int32_t> unordered = {4, 2}, outside = {1, 32}, fine = {1, 2};
  LinearQuant bad = q;
  bad.hcp_fwd = HotChannels{unordered.data(), 2};
  refused(bad, true, "hcp_fwd.index[1]: 2 is not allowed; need ascending, distinct indices in 0..31");
  bad.hcp_fwd = HotChannels{outside.data(), 2};
  refused(bad, true, "hcp_fwd.index[1]: 32 is not allowed");
  bad.hcp_fwd = HotChannels{fine.data(), 33};
  refused(bad, true, "hcp_fwd.count: 33 is not allowed; need 0..32");
  bad.hcp_fwd = HotChannels{nullptr, 2};
  refused(bad, true, "hcp_fwd.index: null is not allowed with count 2");
  bad = q;
  bad.hcp_dgrad = HotChannels{outside.data(), 2};
  refused(bad, false, "hcp_dgrad.index[1]: 32 is not allowed; need ascending, distinct indices in 0..15");
  bad = q;
  bad.hcp_wgrad_rows = 17;
  refused(bad, false, "hcp_wgrad_rows: 17 is not allowed; need 0..16");
  for (float v : y) ASSERT_EQ(v, 7.0f);
  for (float v : dx) ASSERT_EQ(v, 7.0f);
  for (float v : dw) ASSERT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace keel
