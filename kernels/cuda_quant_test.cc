// CUDA quantizers against the CPU reference, bit for bit, on large tensors: every
// format and rounding mode (stochastic with a fixed seed), both axes, block 32 and
// other block sizes, NVFP4 1x16 / 16x16 with and without RHT, fp32 and bf16 inputs
// (a bf16 input is compared with the reference run on its fp32 value), fp32 and
// bf16 dequantized outputs, the device API and QuantizeCuda. Inputs are normal
// values with 0.1% outliers scaled by 1e3..1e6, zero / -0 / subnormal blocks, and
// (in the "specials" inputs) NaN and +-Inf.
//
// No tolerance anywhere: dequantized floats are compared bitwise (any NaN equals
// any NaN), packed codes and scales bytewise. A bf16 output is compared with the
// reference's fp32 output rounded to nearest-even bf16.
//
// Needs a GPU, so CI does not run it (tag manual). One line per case; exits 1 on
// any mismatch. Run: bazel run //kernels:cuda_quant_test [-- --quick]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/formats.h"
#include "kernels/quantize.h"
#include "kernels/quantize_cuda.h"
#include "kernels/quantizer.h"

namespace keel {
namespace {

// Device memory goes through quantize_cuda.h's helpers, so this file needs no CUDA
// headers; a failure there ends the test.
#define CHECK_OK(expr)                                                                  \
  do {                                                                                  \
    const Status status_ = (expr);                                                      \
    if (!status_.ok()) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                \
                   status_.message().c_str());                                          \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

constexpr uint64_t kSeed = 0x5EED0123456789ABull;

// ---- inputs ---------------------------------------------------------------------

enum class Kind { kOutliers, kSpecials, kInfOnly };

std::vector<float> MakeInput(int64_t rows, int64_t cols, Kind kind, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decades(3.0f, 6.0f);
  const int64_t n = rows * cols;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (rng() % 1000 == 0) v *= std::pow(10.0f, decades(rng));  // 0.1% outliers
    x[i] = v;
  }
  auto at = [&](int64_t r, int64_t c) -> float& { return x[(r % rows) * cols + (c % cols)]; };
  // Blocks along rows and down columns that are all zero (with -0s) or tiny, placed
  // so that both axes meet them.
  for (int64_t k = 0; k < 40; ++k) {
    at(5, k) = (k % 3 == 0) ? -0.0f : 0.0f;
    at(64 + k, 77) = (k % 5 == 0) ? -0.0f : 0.0f;
    at(9, 100 + k) = normal(rng) * 1e-39f;  // fp32 subnormals
    at(100 + k, 33) = normal(rng) * 1e-41f;
  }
  at(23, 41) = 6.0f * 448.0f;
  at(25, 1) = std::numeric_limits<float>::denorm_min();
  if (kind == Kind::kSpecials) {
    // Blocks near the top of fp32 (they would set the whole tensor's NVFP4 / FP8
    // scale, so only the specials inputs have them).
    for (int64_t k = 0; k < 40; ++k) {
      at(17, 300 + k) = normal(rng) * 1e36f;
      at(200 + k, 301) = normal(rng) * 3e37f;
      at(21, 500 + k) = -std::ldexp(1.9f, 127);
    }
    at(7, 40) = std::numeric_limits<float>::quiet_NaN();
    at(300, 900) = -std::numeric_limits<float>::quiet_NaN();
    at(11, 70) = INFINITY;
    at(12, 71) = -INFINITY;
    at(640, 3) = INFINITY;
    at(rows - 1, cols - 1) = INFINITY;
  }
  if (kind == Kind::kInfOnly) {  // Inf without NaN (NVFP4: S_enc = 1)
    at(11, 70) = INFINITY;
    at(400, 5) = -INFINITY;
  }
  return x;
}

struct Input {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;       // fp32 input
  std::vector<float> bf16_f32;  // the same rounded to bf16, as fp32
  std::vector<uint16_t> bf16;   // its bits
};

Input MakeInputs(const std::string& name, int64_t rows, int64_t cols, Kind kind, uint64_t seed) {
  Input in;
  in.name = name;
  in.rows = rows;
  in.cols = cols;
  in.f32 = MakeInput(rows, cols, kind, seed);
  in.bf16.resize(in.f32.size());
  in.bf16_f32.resize(in.f32.size());
  for (size_t i = 0; i < in.f32.size(); ++i) {
    in.bf16[i] = FloatToBf16(in.f32[i], Rounding::kNearestEven, 0.0f);
    in.bf16_f32[i] = Bf16ToFloat(in.bf16[i]);
  }
  return in;
}

// ---- cases ----------------------------------------------------------------------

struct Case {
  QuantRequest request;
  const Input* input = nullptr;
  DType in_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
  bool host_api = false;    // QuantizeCuda instead of the device API
  bool amax_first = false;  // NVFP4 / FP8: run the amax function, pass its result
  bool bump = false;        // MX: the paper's bump-exponent fix (device API only)
};

std::string Describe(const Case& c) {
  const QuantRequest& r = c.request;
  char text[256];
  std::string extra;
  if (IsMx(r.format)) extra = " block=" + std::to_string(r.block) + (c.bump ? " bump" : "");
  if (r.format == QuantFormat::kNvfp4) {
    extra = std::string(r.tile_16x16 ? " 16x16" : " 1x16") + (r.rht ? " rht" : "");
    if (c.amax_first) extra += " amax-given";
  }
  if ((r.format == QuantFormat::kFp8E4M3 || r.format == QuantFormat::kFp8E5M2) && c.amax_first)
    extra += " amax-given";
  std::snprintf(text, sizeof(text), "%-11s %-13s axis=%d%-18s %5lldx%-6lld %-8s in=%s out=%s %s",
                QuantFormatName(r.format), RoundingName(r.rounding), r.axis, extra.c_str(),
                static_cast<long long>(r.rows), static_cast<long long>(r.cols), c.input->name.c_str(),
                c.in_dtype == DType::kF32 ? "f32 " : "bf16", c.out_dtype == DType::kF32 ? "f32 " : "bf16",
                c.host_api ? "QuantizeCuda" : "device-api");
  return text;
}

size_t CodeBytes(const QuantRequest& r) {
  const int64_t count = r.rows * r.cols;
  if (r.format == QuantFormat::kBf16) return static_cast<size_t>(count) * 2;
  if (Spec(ElementOf(r.format)).bits == 4) return static_cast<size_t>((count + 1) / 2);
  return static_cast<size_t>(count);
}

size_t ScaleBytes(const QuantRequest& r) {
  if (IsMx(r.format)) return static_cast<size_t>(MxScaleCount(r.rows, r.cols, r.block, r.axis));
  if (r.format == QuantFormat::kNvfp4) return static_cast<size_t>(MxScaleCount(r.rows, r.cols, 16, r.axis));
  return 0;
}

// The GPU result in QuantResult form; out_bits holds the bf16 output when asked.
struct GpuResult {
  QuantResult result;
  std::vector<uint16_t> out_bf16;
  std::string error;
};

std::mutex g_gpu_mutex;  // one case on the GPU at a time (memory and timing stay sane)

GpuResult RunGpu(const Case& c) {
  GpuResult g;
  const QuantRequest& r = c.request;
  const int64_t count = r.rows * r.cols;
  std::lock_guard<std::mutex> lock(g_gpu_mutex);
  if (c.host_api) {
    Status s = QuantizeCuda(r, c.input->f32.data(), &g.result);
    if (!s.ok()) g.error = s.message();
    return g;
  }
  const size_t in_bytes = static_cast<size_t>(count) * (c.in_dtype == DType::kF32 ? 4 : 2);
  const size_t out_bytes = static_cast<size_t>(count) * (c.out_dtype == DType::kF32 ? 4 : 2);
  const size_t code_bytes = CodeBytes(r), scale_bytes = ScaleBytes(r);
  void *d_x = nullptr, *d_out = nullptr;
  uint8_t *d_codes = nullptr, *d_scales = nullptr;
  float *d_tensor_scale = nullptr, *d_amax = nullptr;
  CHECK_OK(CudaMalloc(reinterpret_cast<void**>(&d_x), in_bytes));
  CHECK_OK(CudaMalloc(reinterpret_cast<void**>(&d_out), out_bytes));
  CHECK_OK(CudaMalloc(reinterpret_cast<void**>(&d_codes), std::max<size_t>(code_bytes, 16)));
  CHECK_OK(CudaMalloc(reinterpret_cast<void**>(&d_scales), std::max<size_t>(scale_bytes, 16)));
  CHECK_OK(CudaMalloc(reinterpret_cast<void**>(&d_tensor_scale), 16));
  CHECK_OK(CudaMalloc(reinterpret_cast<void**>(&d_amax), 16));
  const void* host_x = c.in_dtype == DType::kF32 ? static_cast<const void*>(c.input->f32.data())
                                                 : static_cast<const void*>(c.input->bf16.data());
  CHECK_OK(CudaMemcpyToDevice(d_x, host_x, in_bytes));
  // Poison the outputs so that an unwritten byte cannot pass by luck.
  CHECK_OK(CudaMemset(d_out, 0xA5, out_bytes));
  CHECK_OK(CudaMemset(d_codes, 0xA5, std::max<size_t>(code_bytes, 16)));
  CHECK_OK(CudaMemset(d_scales, 0xA5, std::max<size_t>(scale_bytes, 16)));

  DeviceOutputs o;
  o.out = d_out;
  o.out_dtype = c.out_dtype;
  o.codes = d_codes;
  Status s;
  const bool has_tensor_scale = r.format == QuantFormat::kNvfp4 || r.format == QuantFormat::kFp8E4M3 ||
                                r.format == QuantFormat::kFp8E5M2;
  if (IsMx(r.format)) {
    o.scales = d_scales;
    MxOptions options = MxOptionsOf(r);
    options.bump_exponent = c.bump;
    s = MxQuantizeCuda(d_x, c.in_dtype, r.rows, r.cols, options, o, nullptr);
  } else if (r.format == QuantFormat::kNvfp4) {
    const Nvfp4Options options = Nvfp4OptionsOf(r);
    o.scales = d_scales;
    o.tensor_scale = d_tensor_scale;
    const float* amax = nullptr;
    if (c.amax_first) {
      s = Nvfp4AmaxCuda(d_x, c.in_dtype, r.rows, r.cols, options, d_amax, nullptr);
      amax = d_amax;
    }
    if (s.ok()) s = Nvfp4QuantizeCuda(d_x, c.in_dtype, r.rows, r.cols, options, amax, o, nullptr);
  } else if (r.format == QuantFormat::kBf16) {
    s = Bf16QuantizeCuda(d_x, c.in_dtype, count, r.rounding, r.seed, o, nullptr);
  } else {
    o.tensor_scale = d_tensor_scale;
    const float* amax = nullptr;
    if (c.amax_first) {
      s = Fp8TensorAmaxCuda(d_x, c.in_dtype, count, d_amax, nullptr);
      amax = d_amax;
    }
    if (s.ok())
      s = Fp8TensorQuantizeCuda(d_x, c.in_dtype, count, ElementOf(r.format), r.rounding, r.seed, amax, o, nullptr);
  }
  if (!s.ok()) {
    g.error = s.message();
  } else {
    CHECK_OK(CudaSynchronize());
    if (c.out_dtype == DType::kF32) {
      g.result.out.resize(static_cast<size_t>(count));
      CHECK_OK(CudaMemcpyToHost(g.result.out.data(), d_out, out_bytes));
    } else {
      g.out_bf16.resize(static_cast<size_t>(count));
      CHECK_OK(CudaMemcpyToHost(g.out_bf16.data(), d_out, out_bytes));
    }
    g.result.packed_codes.resize(code_bytes);
    CHECK_OK(CudaMemcpyToHost(g.result.packed_codes.data(), d_codes, code_bytes));
    g.result.scales.resize(scale_bytes);
    if (scale_bytes > 0)
      CHECK_OK(CudaMemcpyToHost(g.result.scales.data(), d_scales, scale_bytes));
    g.result.has_tensor_scale = has_tensor_scale;
    if (has_tensor_scale)
      CHECK_OK(CudaMemcpyToHost(&g.result.tensor_scale, d_tensor_scale, 4));
  }
  CHECK_OK(CudaFree(d_x));
  CHECK_OK(CudaFree(d_out));
  CHECK_OK(CudaFree(d_codes));
  CHECK_OK(CudaFree(d_scales));
  CHECK_OK(CudaFree(d_tensor_scale));
  CHECK_OK(CudaFree(d_amax));
  return g;
}

bool SameFloat(float a, float b) {
  return FloatBits(a) == FloatBits(b) || (std::isnan(a) && std::isnan(b));
}

struct Outcome {
  bool pass = false;
  std::string line;
};

Outcome RunCase(const Case& c) {
  const QuantRequest& r = c.request;
  const std::vector<float>& cpu_x = c.in_dtype == DType::kF32 ? c.input->f32 : c.input->bf16_f32;
  QuantResult want;
  Status cpu;
  if (c.bump) {  // QuantRequest has no bump flag: call the MX reference directly
    MxOptions options = MxOptionsOf(r);
    options.bump_exponent = true;
    std::vector<uint8_t> codes(r.rows * r.cols);
    want.out.resize(codes.size());
    want.scales.resize(MxScaleCount(r.rows, r.cols, r.block, r.axis));
    cpu = MxQuantizeRef(cpu_x.data(), r.rows, r.cols, options, want.out.data(), codes.data(),
                        want.scales.data());
    want.packed_codes = PackCodes(codes.data(), codes.size(), options.elem);
  } else {
    cpu = QuantizeCpu(r, cpu_x.data(), &want);
  }
  Outcome outcome;
  if (!cpu.ok()) {
    outcome.line = "FAIL  " + Describe(c) + "  cpu reference refused: " + cpu.message();
    return outcome;
  }
  GpuResult got = RunGpu(c);
  if (!got.error.empty()) {
    outcome.line = "FAIL  " + Describe(c) + "  cuda: " + got.error;
    return outcome;
  }
  int64_t out_bad = 0, code_bad = 0, scale_bad = 0;
  int64_t first_out = -1, first_code = -1, first_scale = -1;
  const size_t count = want.out.size();
  for (size_t i = 0; i < count; ++i) {
    bool same;
    if (c.out_dtype == DType::kF32) {
      same = i < got.result.out.size() && SameFloat(got.result.out[i], want.out[i]);
    } else {
      const uint16_t w = FloatToBf16(want.out[i], Rounding::kNearestEven, 0.0f);
      const uint16_t g = got.out_bf16[i];
      same = g == w || (std::isnan(Bf16ToFloat(g)) && std::isnan(Bf16ToFloat(w)));
    }
    if (!same && out_bad++ == 0) first_out = static_cast<int64_t>(i);
  }
  const std::vector<uint8_t>& wc = want.packed_codes;
  const std::vector<uint8_t>& gc = got.result.packed_codes;
  for (size_t i = 0; i < std::max(wc.size(), gc.size()); ++i) {
    if (i >= wc.size() || i >= gc.size() || wc[i] != gc[i]) {
      if (code_bad++ == 0) first_code = static_cast<int64_t>(i);
    }
  }
  const std::vector<uint8_t>& ws = want.scales;
  const std::vector<uint8_t>& gs = got.result.scales;
  for (size_t i = 0; i < std::max(ws.size(), gs.size()); ++i) {
    if (i >= ws.size() || i >= gs.size() || ws[i] != gs[i]) {
      if (scale_bad++ == 0) first_scale = static_cast<int64_t>(i);
    }
  }
  const bool tensor_ok = want.has_tensor_scale == got.result.has_tensor_scale &&
                         (!want.has_tensor_scale || SameFloat(want.tensor_scale, got.result.tensor_scale));
  outcome.pass = out_bad == 0 && code_bad == 0 && scale_bad == 0 && tensor_ok;
  char text[512];
  std::snprintf(text, sizeof(text), "%s  %s  mismatches: out=%lld codes=%lld scales=%lld tensor_scale=%s",
                outcome.pass ? "PASS" : "FAIL", Describe(c).c_str(), static_cast<long long>(out_bad),
                static_cast<long long>(code_bad), static_cast<long long>(scale_bad), tensor_ok ? "ok" : "DIFF");
  outcome.line = text;
  // The first mismatch of each kind, to start debugging from.
  if (first_out >= 0) {
    const size_t i = static_cast<size_t>(first_out);
    const float g = c.out_dtype == DType::kF32 ? got.result.out[i] : Bf16ToFloat(got.out_bf16[i]);
    std::snprintf(text, sizeof(text), "\n      out[%zu] (row %lld col %lld): x=%a cuda=%a (0x%08x) cpu=%a (0x%08x)", i,
                  static_cast<long long>(i / r.cols), static_cast<long long>(i % r.cols),
                  static_cast<double>(cpu_x[i]), static_cast<double>(g), FloatBits(g),
                  static_cast<double>(want.out[i]), FloatBits(want.out[i]));
    outcome.line += text;
  }
  if (first_code >= 0) {
    const size_t i = static_cast<size_t>(first_code);
    std::snprintf(text, sizeof(text), "\n      packed code byte %zu: cuda=0x%02x cpu=0x%02x", i,
                  i < gc.size() ? gc[i] : 0, i < wc.size() ? wc[i] : 0);
    outcome.line += text;
  }
  if (first_scale >= 0) {
    const size_t i = static_cast<size_t>(first_scale);
    std::snprintf(text, sizeof(text), "\n      scale byte %zu: cuda=0x%02x cpu=0x%02x", i, i < gs.size() ? gs[i] : 0,
                  i < ws.size() ? ws[i] : 0);
    outcome.line += text;
  }
  if (!tensor_ok) {
    std::snprintf(text, sizeof(text), "\n      tensor scale: cuda=%a cpu=%a", static_cast<double>(got.result.tensor_scale),
                  static_cast<double>(want.tensor_scale));
    outcome.line += text;
  }
  return outcome;
}

const QuantFormat kMxFormats[] = {QuantFormat::kMxfp8E4M3, QuantFormat::kMxfp8E5M2, QuantFormat::kMxfp6E3M2,
                                  QuantFormat::kMxfp6E2M3, QuantFormat::kMxfp4};
const Rounding kModes[] = {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic};

QuantRequest Request(QuantFormat format, const Input& in, int axis, Rounding rounding) {
  QuantRequest r;
  r.format = format;
  r.rows = in.rows;
  r.cols = in.cols;
  r.axis = axis;
  r.rounding = rounding;
  r.seed = kSeed;
  return r;
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::string device;
  const Status visible = CudaDeviceDescription(&device);
  if (!visible.ok()) {
    std::fprintf(stderr, "cuda_quant_test: %s\n", visible.message().c_str());
    return 2;
  }
  const int64_t big = quick ? 1024 : 4096;
  std::printf("cuda_quant_test on %s; large tensors %lldx%lld\n", device.c_str(), static_cast<long long>(big),
              static_cast<long long>(big));

  const auto t0 = std::chrono::steady_clock::now();
  // Inputs. NVFP4 takes NaN-free inputs for most cases (a NaN anywhere makes the
  // whole NVFP4 tensor NaN), and the specials for a few.
  const Input big_specials = MakeInputs("specials", big, big, Kind::kSpecials, 1);
  const Input big_outliers = MakeInputs("outliers", big, big, Kind::kOutliers, 2);
  const Input mid = MakeInputs("specials", 1000, 1000, Kind::kSpecials, 3);          // partial blocks
  const Input odd = MakeInputs("specials", 999, 1001, Kind::kSpecials, 4);           // odd everything
  const Input nv_rows = MakeInputs("outliers", 999, 1024, Kind::kOutliers, 5);       // nvfp4 axis 1
  const Input nv_cols = MakeInputs("outliers", 1024, 999, Kind::kOutliers, 6);       // nvfp4 axis 0, odd cols
  const Input nv_nan = MakeInputs("specials", 512, 768, Kind::kSpecials, 7);
  const Input nv_inf = MakeInputs("inf", 512, 768, Kind::kInfOnly, 8);
  const Input flat = MakeInputs("specials", 1, 1000003, Kind::kSpecials, 9);         // count % 8 != 0
  // Down columns, stochastic: cols % 4 == 2 (each lane draws its own Philox groups)
  // and cols % 4 == 0 (lane pairs share them), both with an odd partial row block.
  const Input cols_unpaired = MakeInputs("outliers", 999, 1002, Kind::kOutliers, 10);
  const Input cols_paired = MakeInputs("outliers", 1009, 1000, Kind::kOutliers, 11);
  const Input nv_cols_unpaired = MakeInputs("outliers", 1024, 1002, Kind::kOutliers, 12);  // nvfp4 axis 0

  std::vector<Case> cases;
  auto add = [&](const QuantRequest& r, const Input& in, DType in_dtype, DType out_dtype, bool host_api,
                 bool amax_first) {
    Case c;
    c.request = r;
    c.input = &in;
    c.in_dtype = in_dtype;
    c.out_dtype = out_dtype;
    c.host_api = host_api;
    c.amax_first = amax_first;
    cases.push_back(c);
  };

  // MX: every element format, mode and axis, block 32, on the large tensor with
  // fp32 input and fp32 output, and with bf16 input and bf16 output (training's
  // fake-quant path).
  for (QuantFormat f : kMxFormats)
    for (Rounding m : kModes)
      for (int axis : {1, 0}) {
        QuantRequest r = Request(f, big_specials, axis, m);
        add(r, big_specials, DType::kF32, DType::kF32, false, false);
        add(r, big_specials, DType::kBF16, DType::kBF16, false, false);
      }
  // The bump-exponent fix, along rows (its own kernel instantiations) and down columns.
  for (QuantFormat f : kMxFormats)
    for (int axis : {1, 0}) {
      add(Request(f, big_specials, axis, Rounding::kNearestEven), big_specials, DType::kBF16, DType::kBF16,
          false, false);
      cases.back().bump = true;
    }
  // MX block sizes other than 32 (16 and 64 take the fast kernels along rows, the
  // rest the generic path) and shapes with partial blocks and odd sizes.
  for (QuantFormat f : kMxFormats)
    for (Rounding m : kModes)
      for (int axis : {1, 0})
        for (int block : {16, 64, 24, 7}) {
          QuantRequest r = Request(f, mid, axis, m);
          r.block = block;
          add(r, mid, block == 16 ? DType::kBF16 : DType::kF32, DType::kF32, false, false);
        }
  for (QuantFormat f : kMxFormats)
    for (Rounding m : kModes)
      for (int axis : {1, 0}) {
        QuantRequest r = Request(f, mid, axis, m);
        add(r, mid, DType::kF32, DType::kF32, true, false);  // QuantizeCuda, fast kernels
        QuantRequest o = Request(f, odd, axis, m);
        add(o, odd, DType::kF32, DType::kF32, true, false);  // QuantizeCuda, generic path
        o.block = 33;
        add(o, odd, DType::kBF16, DType::kF32, false, false);
      }

  for (const Input* in : {&cols_unpaired, &cols_paired}) {
    for (QuantFormat f : kMxFormats)
      for (Rounding m : kModes) add(Request(f, *in, 0, m), *in, DType::kBF16, DType::kF32, false, false);
  }
  for (bool rht : {false, true}) {
    QuantRequest r = Request(QuantFormat::kNvfp4, nv_cols_unpaired, 0, Rounding::kStochastic);
    r.rht = rht;
    add(r, nv_cols_unpaired, DType::kBF16, DType::kF32, false, false);
  }

  // NVFP4: 1x16 / 16x16, with and without RHT, both modes, both axes, both input
  // types; the amax pass run separately (amax given) on half of them.
  for (bool tile : {false, true})
    for (bool rht : {false, true})
      for (Rounding m : {Rounding::kNearestEven, Rounding::kStochastic})
        for (int axis : {1, 0})
          for (DType in_dtype : {DType::kF32, DType::kBF16}) {
            QuantRequest r = Request(QuantFormat::kNvfp4, big_outliers, axis, m);
            r.tile_16x16 = tile;
            r.rht = rht;
            add(r, big_outliers, in_dtype, in_dtype, false, in_dtype == DType::kBF16);
          }
  for (bool rht : {false, true})
    for (Rounding m : {Rounding::kNearestEven, Rounding::kStochastic}) {
      QuantRequest r = Request(QuantFormat::kNvfp4, nv_rows, 1, m);
      r.rht = rht;
      add(r, nv_rows, DType::kF32, DType::kF32, true, false);
      QuantRequest c = Request(QuantFormat::kNvfp4, nv_cols, 0, m);  // odd cols: generic
      c.rht = rht;
      add(c, nv_cols, DType::kF32, DType::kF32, true, false);
      add(c, nv_cols, DType::kBF16, DType::kBF16, false, true);
      for (const Input* in : {&nv_nan, &nv_inf})
        for (int axis : {1, 0})
          for (bool tile : {false, true}) {
            QuantRequest s = Request(QuantFormat::kNvfp4, *in, axis, m);
            s.rht = rht;
            s.tile_16x16 = tile;
            add(s, *in, DType::kF32, DType::kF32, false, tile);
          }
    }

  // Per-tensor FP8 and BF16, on the large tensor and on an odd count.
  for (QuantFormat f : {QuantFormat::kFp8E4M3, QuantFormat::kFp8E5M2})
    for (Rounding m : kModes) {
      add(Request(f, big_specials, 1, m), big_specials, DType::kF32, DType::kF32, false, true);
      add(Request(f, big_outliers, 1, m), big_outliers, DType::kBF16, DType::kBF16, false, false);
      add(Request(f, flat, 1, m), flat, DType::kF32, DType::kF32, true, false);
    }
  for (Rounding m : kModes) {
    add(Request(QuantFormat::kBf16, big_specials, 1, m), big_specials, DType::kF32, DType::kF32, false, false);
    add(Request(QuantFormat::kBf16, big_specials, 0, m), big_specials, DType::kBF16, DType::kBF16, false, false);
    add(Request(QuantFormat::kBf16, flat, 1, m), flat, DType::kF32, DType::kF32, true, false);
  }

  // CPU references are the slow part: run cases on all cores, the GPU part one at
  // a time.
  std::atomic<size_t> next{0};
  std::atomic<int> failures{0};
  std::mutex print_mutex;
  std::vector<std::string> failed;  // guarded by print_mutex
  const unsigned workers = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < cases.size(); i = next++) {
        const Outcome o = RunCase(cases[i]);
        if (!o.pass) ++failures;
        std::lock_guard<std::mutex> lock(print_mutex);
        if (!o.pass) failed.push_back(o.line);
        std::printf("%s\n", o.line.c_str());
        std::fflush(stdout);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Failures again at the end, where a log's tail shows them.
  if (!failed.empty()) std::printf("\nfailed cases:\n");
  for (const std::string& line : failed) std::printf("%s\n", line.c_str());
  std::printf("%zu cases, %d failed, %.1f s\n", cases.size(), failures.load(), seconds);
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) { return keel::Main(argc, argv); }
