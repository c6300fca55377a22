// quant-demo: the numerics demo of the README's Quickstart. Quantizes one
// activation-like tensor (Gaussian with heavy outliers, fixed seed) in every
// format Keel supports, prints the error each format makes, and, when a GPU is
// there, checks that the CUDA kernels give the same bits as the CPU reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/quantizer.h"

namespace {

struct Case {
  keel::QuantFormat format;
  keel::Rounding rounding;
  bool tile_16x16;
  bool rht;
};

std::string Describe(const Case& c) {
  std::string text = keel::QuantFormatName(c.format);
  if (c.tile_16x16) text += " 16x16";
  if (c.rht) text += " +rht";
  return text + " " + keel::RoundingName(c.rounding);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 1024, cols = 1024;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: quant-demo [--rows R] [--cols C]\n"
          "Quantizes a R x C (default 1024 x 1024) Gaussian tensor with 1%% outliers in every\n"
          "format and prints SNR, relative error, large-error and flushed fractions; with a\n"
          "GPU it also checks that CUDA and the CPU reference agree bit for bit.\n");
      return 0;
    }
    if (i + 1 < argc && std::strcmp(argv[i], "--rows") == 0) rows = std::atoll(argv[++i]);
    else if (i + 1 < argc && std::strcmp(argv[i], "--cols") == 0) cols = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "quant-demo: error: unknown argument '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (rows < 16 || cols < 16 || rows % 16 != 0 || cols % 16 != 0) {
    std::fprintf(stderr, "quant-demo: error: --rows/--cols must be positive multiples of 16\n");
    return 2;
  }

  std::mt19937 rng(1337);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) {
    v = normal(rng);
    if (uniform(rng) < 0.01f) v *= 20.0f + 200.0f * uniform(rng);  // outlier channels' scale
  }
  double signal = 0;
  for (float v : x) signal += double(v) * v;

  using keel::QuantFormat;
  using keel::Rounding;
  const Case cases[] = {
      {QuantFormat::kBf16, Rounding::kNearestEven, false, false},
      {QuantFormat::kFp8E4M3, Rounding::kNearestEven, false, false},
      {QuantFormat::kFp8E5M2, Rounding::kNearestEven, false, false},
      {QuantFormat::kMxfp8E4M3, Rounding::kNearestEven, false, false},
      {QuantFormat::kMxfp8E4M3, Rounding::kNearestAway, false, false},
      {QuantFormat::kMxfp8E5M2, Rounding::kNearestEven, false, false},
      {QuantFormat::kMxfp6E3M2, Rounding::kNearestEven, false, false},
      {QuantFormat::kMxfp6E2M3, Rounding::kNearestEven, false, false},
      {QuantFormat::kMxfp4, Rounding::kNearestEven, false, false},
      {QuantFormat::kMxfp4, Rounding::kStochastic, false, false},
      {QuantFormat::kNvfp4, Rounding::kNearestEven, false, false},
      {QuantFormat::kNvfp4, Rounding::kNearestEven, true, false},
      {QuantFormat::kNvfp4, Rounding::kNearestEven, false, true},
      {QuantFormat::kNvfp4, Rounding::kStochastic, false, false},
  };

  std::printf("Keel numerics demo: %lld x %lld fp32 tensor, N(0,1) with 1%% outliers x20..x220, seed 1337\n",
              static_cast<long long>(rows), static_cast<long long>(cols));
  keel::QuantRequest probe;
  probe.rows = 16;
  probe.cols = 16;
  keel::QuantResult probe_result;
  std::vector<float> probe_x(256, 1.0f);
  keel::Status cuda = keel::QuantizeCuda(probe, probe_x.data(), &probe_result);
  std::printf("CUDA: %s\n\n", cuda.ok() ? "available; checking CUDA == CPU bit for bit"
                                        : ("not used (" + cuda.message() + ")").c_str());
  std::printf("%-28s %8s %10s %10s %10s %9s %9s\n", "format", "SNR dB", "rel.err", "err>25%",
              "flushed", "cpu ms", "cuda");
  int failures = 0;
  for (const Case& c : cases) {
    keel::QuantRequest request;
    request.format = c.format;
    request.rows = rows;
    request.cols = cols;
    request.rounding = c.rounding;
    request.seed = 42;
    request.tile_16x16 = c.tile_16x16;
    request.rht = c.rht;
    keel::QuantResult result;
    auto start = std::chrono::steady_clock::now();
    keel::Status status = keel::QuantizeCpu(request, x.data(), &result);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) {
      std::printf("%-28s error: %s\n", Describe(c).c_str(), status.message().c_str());
      ++failures;
      continue;
    }
    // Against the input in the domain the output lives in (rotated for RHT).
    std::vector<float> reference = x;
    if (c.rht) keel::RhtRef(x.data(), rows, cols, 1, reference.data());
    double noise = 0;
    int64_t flushed = 0, large = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      double d = double(result.out[i]) - reference[i];
      noise += d * d;
      if (result.out[i] == 0.0f && reference[i] != 0.0f) ++flushed;
      // Large errors: more than a quarter of the value (clipped or coarsely rounded).
      if (std::fabs(d) > 0.25 * std::fabs(reference[i])) ++large;
    }
    std::string cuda_column = "-";
    if (cuda.ok()) {
      keel::QuantResult gpu;
      keel::Status s = keel::QuantizeCuda(request, x.data(), &gpu);
      bool same = s.ok() && gpu.packed_codes == result.packed_codes && gpu.scales == result.scales &&
                  std::memcmp(gpu.out.data(), result.out.data(), result.out.size() * 4) == 0;
      cuda_column = same ? "same" : "DIFFERS";
      failures += same ? 0 : 1;
    }
    std::printf("%-28s %8.2f %10.3e %9.4f%% %9.4f%% %9.1f %9s\n", Describe(c).c_str(),
                10 * std::log10(signal / noise), std::sqrt(noise / signal),
                100.0 * large / (rows * cols), 100.0 * flushed / (rows * cols), ms, cuda_column.c_str());
  }
  std::printf("\nSNR = 10 log10(|x|^2 / |q(x) - x|^2); rel.err = |q(x) - x| / |x|; err>25%%: elements off by\n"
              "more than a quarter of their value; flushed: nonzero inputs that became 0. An outlier\n"
              "sets its block's scale, so its neighbours flush: compare 1x16 blocks, 16x16 tiles and RHT.\n");
  return failures == 0 ? 0 : 1;
}
