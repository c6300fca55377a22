// Inputs and operand formats that the Backend tests (nn_cpu_test, nn_cuda_test)
// share, so that both draw the same tensors from the same seeds.
#ifndef KEEL_KERNELS_NN_TEST_UTIL_H_
#define KEEL_KERNELS_NN_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/base/numeric_types.h"

namespace keel {
namespace nn_test {

// n draws of N(0, stddev^2) from mt19937(seed).
inline std::vector<float> Normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Normal values with 3% outliers of 20-40x, as activations and gradients have,
// so that block scales differ from block to block and some elements saturate.
inline std::vector<float> WithOutliers(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::vector<float> x = Normal(n, seed, stddev);
  std::mt19937 rng(seed + 1000);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (float& v : x) {
    if (uniform(rng) < 0.03f) v *= 20.0f * (1.0f + uniform(rng));
  }
  return x;
}

// |got - want| / |want| in the 2-norm (double sums).
inline double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// GLA's log forget gates: n draws of -scale * |N(0, 1)| from mt19937(seed), all
// <= 0 (scale 0.1: decays around 0.9 per position; 30: every chunk's cumulative
// gates far below -88, where exp(-B) overflows).
inline std::vector<float> LogGates(int64_t n, uint32_t seed, float scale) {
  std::vector<float> x = Normal(n, seed);
  for (float& v : x) v = -scale * (v < 0.0f ? -v : v);
  return x;
}

// A quantized operand: `format` with `rounding`.
inline OperandFormat Quant(QuantFormat format, Rounding rounding = Rounding::kNearestEven) {
  OperandFormat f;
  f.kind = OperandFormat::Kind::kQuant;
  f.format = format;
  f.rounding = rounding;
  return f;
}

}  // namespace nn_test
}  // namespace keel

#endif  // KEEL_KERNELS_NN_TEST_UTIL_H_
