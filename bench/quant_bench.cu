// Throughput of the CUDA quantizers (kernels/quantize_cuda.h) on one large bf16
// tensor, against a device-to-device copy of the same tensor in the same run.
//
// Every case reads the bf16 input and writes what the trainer would keep: packed
// codes + block scales (the real quantizers), or a bf16 tensor (the fake-quant path
// training uses on Hopper, which has no MX/NVFP4 GEMMs). Reported: the median of
// --iters timed runs (cudaEvents around each run, after --warmup runs), GB/s as
// (bytes read + bytes written) / time, where a two-pass case (amax pass, then
// quantize) counts the input twice, and that bandwidth as a fraction of the copy's.
//
//   bazel build //bench:quant_bench && bazel-bin/bench/quant_bench [--rows R]
//       [--cols C] [--iters N] [--warmup N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/quantize.h"
#include "kernels/quantize_cuda.h"
#include "kernels/quantizer.h"

namespace keel {
namespace {

#define BENCH_CUDA(call)                                                                       \
  do {                                                                                         \
    const cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                \
                   cudaGetErrorString(err_));                                                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

#define BENCH_OK(expr)                                                                         \
  do {                                                                                         \
    const Status status_ = (expr);                                                             \
    if (!status_.ok()) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, status_.message().c_str()); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// A bf16 tensor of N(0,1)-like values (a sum of four uniforms) with 0.1% outliers
// scaled by 10^3..10^6, from a hash of the index: no host round trip.
__device__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

__global__ void FillKernel(uint16_t* x, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t h0 = Hash(4 * i), h1 = Hash(4 * i + 1), h2 = Hash(4 * i + 2), h3 = Hash(4 * i + 3);
    float v = ((h0 >> 8) + (h1 >> 8) + (h2 >> 8) + (h3 >> 8)) * (1.0f / 16777216.0f) - 2.0f;
    v = v * 1.7320508f;  // unit variance
    if (h0 % 1000 == 0) v *= exp10f(3.0f + 3.0f * (h1 >> 8) * (1.0f / 16777216.0f));
    x[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// Each case's configuration as keel-quant would state it, checked the same way.
void CheckRequest(QuantFormat format, int64_t rows, int64_t cols, int axis, Rounding rounding, bool tile,
                  bool rht) {
  QuantRequest r;
  r.format = format;
  r.rows = rows;
  r.cols = cols;
  r.axis = axis;
  r.rounding = rounding;
  r.tile_16x16 = tile;
  r.rht = rht;
  BENCH_OK(ValidateRequest(r));
}

struct Case {
  std::string group;   // "codes+scales", "fake-quant bf16->bf16", "baseline"
  std::string name;
  double bytes;        // read + written
  int passes;          // times the input is read
  std::function<void(cudaStream_t)> run;
};

double MedianMs(const Case& c, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) c.run(stream);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    c.run(stream);
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    BENCH_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

int Main(int argc, char** argv) {
  const int64_t rows = Flag(argc, argv, "--rows", 16384);
  const int64_t cols = Flag(argc, argv, "--cols", 16384);
  const int iters = static_cast<int>(std::max<int64_t>(Flag(argc, argv, "--iters", 25), 1));
  const int warmup = static_cast<int>(Flag(argc, argv, "--warmup", 3));
  if (rows % 32 != 0 || cols % 32 != 0) {
    std::fprintf(stderr, "--rows and --cols must be multiples of 32 (MX blocks, NVFP4 tiles)\n");
    return 1;
  }
  const int64_t n = rows * cols;

  int device = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  int mem_clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  cudaGetLastError();
  std::printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, memory bus %d bits at %.0f MHz (peak ~%.0f GB/s)\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30), bus_bits, mem_clock_khz / 1e3,
              2.0 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e9);
  std::printf("tensor: %lld x %lld bf16 (%.0f MiB), N(0,1) with 0.1%% outliers x1e3..1e6\n",
              static_cast<long long>(rows), static_cast<long long>(cols), 2.0 * n / (1 << 20));
  std::printf("timing: median of %d runs after %d warm-up runs, cudaEvents; rounding nearest_even unless named\n",
              iters, warmup);

  uint16_t* x = nullptr;
  uint16_t* copy = nullptr;
  uint16_t* out = nullptr;
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  float* amax = nullptr;
  float* tensor_scale = nullptr;
  BENCH_CUDA(cudaMalloc(&x, n * 2));
  BENCH_CUDA(cudaMalloc(&copy, n * 2));
  BENCH_CUDA(cudaMalloc(&out, n * 2));
  BENCH_CUDA(cudaMalloc(&codes, n));
  BENCH_CUDA(cudaMalloc(&scales, n / 16));
  BENCH_CUDA(cudaMalloc(&amax, 4 * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&tensor_scale, 16));
  FillKernel<<<prop.multiProcessorCount * 8, 256>>>(x, n);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const double in_bytes = 2.0 * n;
  std::vector<Case> cases;
  cases.push_back({"baseline", "cudaMemcpy device to device", 2.0 * in_bytes, 1, [=](cudaStream_t s) {
                     BENCH_CUDA(cudaMemcpyAsync(copy, x, n * 2, cudaMemcpyDeviceToDevice, s));
                   }});

  // (a) packed codes + scales.
  struct MxFormat {
    ElemFormat elem;
    const char* name;
  };
  const MxFormat mx_formats[] = {{ElemFormat::kE4M3, "mxfp8_e4m3"}, {ElemFormat::kE5M2, "mxfp8_e5m2"},
                                 {ElemFormat::kE3M2, "mxfp6_e3m2"}, {ElemFormat::kE2M3, "mxfp6_e2m3"},
                                 {ElemFormat::kE2M1, "mxfp4"}};
  // What a case writes: the bf16 dequantized tensor (fake quantization), or codes
  // and block scales of code_bytes and scale_bytes per element (the scales only when
  // scale_bytes > 0); with_tensor_scale: also the decode scale. *written: its bytes.
  auto outputs = [&](bool fake, double code_bytes, double scale_bytes, bool with_tensor_scale, double* written) {
    DeviceOutputs d;
    if (with_tensor_scale) d.tensor_scale = tensor_scale;
    if (fake) {
      d.out = out;
      d.out_dtype = DType::kBF16;
      *written = 2.0 * n;
    } else {
      d.codes = codes;
      if (scale_bytes > 0) d.scales = scales;
      *written = (code_bytes + scale_bytes) * n;
    }
    return d;
  };
  auto add_mx = [&](const MxFormat& f, int axis, Rounding rounding, bool fake) {
    QuantFormat format;
    ParseQuantFormat(f.name, &format);
    CheckRequest(format, rows, cols, axis, rounding, false, false);
    MxOptions o;
    o.elem = f.elem;
    o.axis = axis;
    o.rounding = rounding;
    o.seed = 1;
    double written;
    const DeviceOutputs d = outputs(fake, Spec(f.elem).bits == 4 ? 0.5 : 1.0, 1.0 / 32, false, &written);
    std::string name = std::string(f.name) + " axis " + std::to_string(axis);
    if (rounding != Rounding::kNearestEven) name += std::string(" ") + RoundingName(rounding);
    cases.push_back({fake ? "fake-quant bf16->bf16" : "codes+scales", name, in_bytes + written, 1,
                     [=](cudaStream_t s) { BENCH_OK(MxQuantizeCuda(x, DType::kBF16, rows, cols, o, d, s)); }});
  };
  auto add_nvfp4 = [&](bool tile, bool rht, int axis, Rounding rounding, bool amax_pass, bool fake) {
    CheckRequest(QuantFormat::kNvfp4, rows, cols, axis, rounding, tile, rht);
    Nvfp4Options o;
    o.tile_16x16 = tile;
    o.rht = rht;
    o.axis = axis;
    o.rounding = rounding;
    o.seed = 1;
    double written;
    const DeviceOutputs d = outputs(fake, 0.5, 1.0 / 16, true, &written);
    std::string name = std::string("nvfp4 ") + (tile ? "16x16" : "1x16") + (rht ? " rht" : "") + " axis " +
                       std::to_string(axis) + (rounding == Rounding::kStochastic ? " stochastic" : "") +
                       (amax_pass ? "  amax+quantize" : "  quantize (amax given)");
    // The tensor amax of this case's domain (x, or its RHT along the axis).
    const float* given = amax + (rht ? (axis == 1 ? 1 : 2) : 0);
    cases.push_back({fake ? "fake-quant bf16->bf16" : "codes+scales", name,
                     (amax_pass ? 2 : 1) * in_bytes + written, amax_pass ? 2 : 1, [=](cudaStream_t s) {
                       BENCH_OK(Nvfp4QuantizeCuda(x, DType::kBF16, rows, cols, o, amax_pass ? nullptr : given, d, s));
                     }});
  };
  auto add_fp8 = [&](bool amax_pass, bool fake) {
    CheckRequest(QuantFormat::kFp8E4M3, rows, cols, 1, Rounding::kNearestEven, false, false);
    double written;
    const DeviceOutputs d = outputs(fake, 1.0, 0.0, true, &written);
    const float* given = amax + 3;
    cases.push_back({fake ? "fake-quant bf16->bf16" : "codes+scales",
                     std::string("fp8_e4m3 per-tensor") + (amax_pass ? "  amax+quantize" : "  quantize (amax given)"),
                     (amax_pass ? 2 : 1) * in_bytes + written + 4, amax_pass ? 2 : 1, [=](cudaStream_t s) {
                       BENCH_OK(Fp8TensorQuantizeCuda(x, DType::kBF16, n, ElemFormat::kE4M3,
                                                      Rounding::kNearestEven, 0, amax_pass ? nullptr : given, d, s));
                     }});
  };

  for (const MxFormat& f : mx_formats)
    for (int axis : {1, 0}) add_mx(f, axis, Rounding::kNearestEven, false);
  // nearest_away (the MX presets' rounding) for every format along rows, and
  // MXFP8 down columns; stochastic for MXFP8 both ways.
  for (const MxFormat& f : mx_formats) add_mx(f, 1, Rounding::kNearestAway, false);
  add_mx(mx_formats[0], 0, Rounding::kNearestAway, false);
  add_mx(mx_formats[0], 1, Rounding::kStochastic, false);
  add_mx(mx_formats[0], 0, Rounding::kStochastic, false);
  for (bool tile : {false, true})
    for (bool rht : {false, true})
      for (bool amax_pass : {false, true}) add_nvfp4(tile, rht, 1, Rounding::kNearestEven, amax_pass, false);
  add_nvfp4(false, false, 0, Rounding::kNearestEven, false, false);
  add_nvfp4(true, false, 0, Rounding::kNearestEven, false, false);
  add_nvfp4(false, true, 0, Rounding::kStochastic, false, false);  // wgrad operand of dY
  add_nvfp4(false, true, 1, Rounding::kStochastic, false, false);
  add_fp8(false, false);
  add_fp8(true, false);
  // (b) fake quantization, bf16 in and out.
  add_mx(mx_formats[0], 1, Rounding::kNearestEven, true);
  add_mx(mx_formats[0], 0, Rounding::kNearestEven, true);
  add_mx(mx_formats[4], 1, Rounding::kNearestEven, true);
  add_mx(mx_formats[0], 1, Rounding::kNearestAway, true);
  add_nvfp4(false, false, 1, Rounding::kNearestEven, false, true);
  add_nvfp4(true, false, 1, Rounding::kNearestEven, false, true);
  add_fp8(false, true);

  // The amaxes the "amax given" cases use, computed once as training would reuse
  // them: NVFP4 over x, over its RHT along rows and down columns; FP8 over x.
  Nvfp4Options plain, rht_rows, rht_cols;
  rht_rows.rht = rht_cols.rht = true;
  rht_cols.axis = 0;
  BENCH_OK(Nvfp4AmaxCuda(x, DType::kBF16, rows, cols, plain, amax, stream));
  BENCH_OK(Nvfp4AmaxCuda(x, DType::kBF16, rows, cols, rht_rows, amax + 1, stream));
  BENCH_OK(Nvfp4AmaxCuda(x, DType::kBF16, rows, cols, rht_cols, amax + 2, stream));
  BENCH_OK(Fp8TensorAmaxCuda(x, DType::kBF16, n, amax + 3, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  float host_amax[4];
  BENCH_CUDA(cudaMemcpy(host_amax, amax, sizeof(host_amax), cudaMemcpyDeviceToHost));
  std::printf("amax: x %g, rht along rows %g, rht down columns %g\n\n", host_amax[0], host_amax[1], host_amax[2]);

  double copy_gbs = 0.0;
  std::printf("%-22s %-48s %9s %9s %8s\n", "group", "case", "ms", "GB/s", "vs copy");
  for (const Case& c : cases) {
    const double ms = MedianMs(c, stream, warmup, iters);
    const double gbs = c.bytes / (ms * 1e-3) / 1e9;
    if (c.group == "baseline") copy_gbs = gbs;
    std::printf("%-22s %-48s %9.3f %9.1f %7.0f%%\n", c.group.c_str(), c.name.c_str(), ms, gbs,
                100.0 * gbs / copy_gbs);
    std::fflush(stdout);
  }
  std::printf("\nGB/s = (bytes read + bytes written) / median time; two-pass cases read the input twice.\n");

  BENCH_CUDA(cudaStreamDestroy(stream));
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(copy));
  BENCH_CUDA(cudaFree(out));
  BENCH_CUDA(cudaFree(codes));
  BENCH_CUDA(cudaFree(scales));
  BENCH_CUDA(cudaFree(amax));
  BENCH_CUDA(cudaFree(tensor_scale));
  return 0;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) { return keel::Main(argc, argv); }
