// CUDA per-tensor quantizers (Fp8TensorAmaxCuda, Fp8TensorQuantizeCuda and
// Bf16QuantizeCuda of quantize_cuda.h) and the tensor amax kernel that NVFP4's
// amax pass shares. See docs/numerics.md, "Per-tensor FP8" and "BF16". Elementwise
// kernels in units of 8 elements with a scalar tail, then their launchers; the
// shared device and launch helpers are in quantize_cuda_internal.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/formats.h"
#include "kernels/quant_core.h"
#include "kernels/quant_core_rne.h"
#include "kernels/quantize.h"
#include "kernels/quantize_cuda.h"
#include "kernels/quantize_cuda_internal.h"

namespace keel {
namespace qcuda {
namespace {

// ============================================================================
// Kernels
// ============================================================================

// max |x| over count elements (NaN wins, or NaN ignored), into *amax by atomicMax.
template <typename InT, bool kIgnoreNan>
__global__ void __launch_bounds__(kThreads) AmaxKernel(const InT* __restrict__ x, int64_t count, unsigned int* amax) {
  uint32_t m = 0;
  const int64_t units = count / 8;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t u = tid; u < units; u += step) {
    float v[8];
    Load8(x + u * 8, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max(m, kIgnoreNan ? qcore::AbsBitsNoNan(v[e]) : qcore::AbsBits(v[e]));
  }
  for (int64_t i = units * 8 + tid; i < count; i += step) {
    const float v = Load1(x + i);
    m = max(m, kIgnoreNan ? qcore::AbsBitsNoNan(v) : qcore::AbsBits(v));
  }
  CtaMaxToGlobal(m, amax);
}

// The elementwise kernels' loop over count elements of x: unit_fn(unit, v, uni)
// for each unit of 8 elements (v: their values; uni: their uniforms under
// stochastic rounding, else zeros), kUnits units per thread per grid step with
// all of the step's loads issued first; then element_fn(i, x_i, u) for each of
// the count % 8 trailing elements.
template <int kUnits, Rounding R, typename InT, typename UnitFn, typename ElementFn>
__device__ __forceinline__ void ForEachUnit8(const InT* __restrict__ x, int64_t count, uint64_t seed, UnitFn unit_fn,
                                             ElementFn element_fn) {
  const int64_t units = count / 8;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kThreads * kUnits);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * (kThreads * kUnits); base < units; base += step) {
    float v[kUnits][8];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = base + u * kThreads + threadIdx.x;
      if (unit < units) Load8(x + unit * 8, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = base + u * kThreads + threadIdx.x;
      if (unit >= units) continue;
      float uni[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (R == Rounding::kStochastic) Uniform8(seed, unit * 8, uni);
      unit_fn(unit, v[u], uni);
    }
  }
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i = units * 8 + tid; i < count; i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float u = R == Rounding::kStochastic ? PhiloxUniform(seed, static_cast<uint64_t>(i)) : 0.0f;
    element_fn(i, Load1(x + i), u);
  }
}

// Per-tensor FP8, elementwise.
template <typename InT, ElemFormat F, Rounding R>
__global__ void __launch_bounds__(kThreads) Fp8Kernel(const InT* __restrict__ x, int64_t count, const float* amax,
                                                      uint64_t seed, const DeviceOutputs o) {
  constexpr ElemConsts c = qcore::ConstsOf(F);
  // Four 16-byte bf16 loads per thread before any arithmetic: with two, the kernel
  // was latency-bound (H200: 0.41 ms before, 0.22 ms with this and the hardware cvt).
  constexpr int kUnits = sizeof(InT) == 2 ? 4 : 2;
  const bool out_bf16 = o.out_dtype == DType::kBF16;
  const qcore::Fp8Scale s = qcore::Fp8ScaleFromAmax(__ldg(amax), c);
  if (o.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *o.tensor_scale = s.inv;
  // What the output is multiplied by: 1 / scale, or 1 (the code's value, exact in
  // bf16) when outputs.out_without_tensor_scale; the rounding still uses s.scale.
  qcore::Fp8Scale s_out = s;
  if (o.out_without_tensor_scale) s_out.inv = 1.0f;
  auto unit_fn = [&](int64_t unit, const float (&v)[8], const float (&uni)[8]) {
    float out[8];
    uint32_t code[8];
    if constexpr (KEEL_HW_FP8 && R != Rounding::kStochastic) {
      // Fp8Element with the conversion in hardware (NaN codes by a select;
      // nearest_away through TiesAwayInput).
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        Rounded q0, q1;
        qcore::Fp8TensorPairNearest<F, R>(v[e], v[e + 1], s.scale, s_out.inv, o.out != nullptr, &q0, &q1);
        PutPair(q0, q1, code + e, out + e);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const Rounded r = qcore::Fp8Element(v[e], s_out, c, R, uni[e]);
        out[e] = r.value;
        code[e] = r.code;
      }
    }
    if (o.codes != nullptr) StoreCodes8<8>(o.codes, unit * 8, code);
    if (o.out != nullptr) StoreOut8(o.out, out_bf16, unit * 8, out);
  };
  auto element_fn = [&](int64_t i, float xi, float u) {
    const Rounded r = qcore::Fp8Element(xi, s_out, c, R, u);
    if (o.codes != nullptr) o.codes[i] = static_cast<uint8_t>(r.code);
    if (o.out != nullptr) StoreOut1(o.out, out_bf16, i, r.value);
  };
  ForEachUnit8<kUnits, R>(x, count, seed, unit_fn, element_fn);
}

// BF16 rounding, elementwise. codes: the bf16 bits, 2 bytes each.
template <typename InT, Rounding R>
__global__ void __launch_bounds__(kThreads) Bf16Kernel(const InT* __restrict__ x, int64_t count, uint64_t seed,
                                                       const DeviceOutputs o) {
  const bool out_bf16 = o.out_dtype == DType::kBF16;
  unsigned int nonfinite = 0;
  auto unit_fn = [&](int64_t unit, const float (&v)[8], const float (&uni)[8]) {
    uint32_t b[8];
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      b[e] = qcore::Bf16Round(v[e], R, uni[e]);
      out[e] = qcore::Bf16Value(static_cast<uint16_t>(b[e]));
      nonfinite += qcore::IsFinite(v[e]) ? 0u : 1u;
    }
    if (o.codes != nullptr) {
      *reinterpret_cast<uint4*>(o.codes + unit * 16) =
          make_uint4(b[0] | (b[1] << 16), b[2] | (b[3] << 16), b[4] | (b[5] << 16), b[6] | (b[7] << 16));
    }
    if (o.out != nullptr) StoreOut8(o.out, out_bf16, unit * 8, out);
  };
  auto element_fn = [&](int64_t i, float xi, float u) {
    const uint16_t b = qcore::Bf16Round(xi, R, u);
    if (o.codes != nullptr) reinterpret_cast<uint16_t*>(o.codes)[i] = b;
    if (o.out != nullptr) StoreOut1(o.out, out_bf16, i, qcore::Bf16Value(b));
    nonfinite += qcore::IsFinite(xi) ? 0u : 1u;
  };
  ForEachUnit8<2, R>(x, count, seed, unit_fn, element_fn);
  if (o.counts != nullptr) AddCounts(0u, nonfinite, o.counts);
}

// ============================================================================
// Launchers
// ============================================================================

Status LaunchFp8Tensor(const void* x, DType x_dtype, int64_t count, ElemFormat elem, Rounding rounding,
                       uint64_t seed, const float* amax, const DeviceOutputs& outputs, cudaStream_t stream) {
  const int64_t ctas = CeilDiv(CeilDiv(count, 8), kThreads * 2);
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return WithRounding(rounding, [&](auto rnd) {
      if (elem == ElemFormat::kE4M3)
        return Launch(Fp8Kernel<InT, ElemFormat::kE4M3, decltype(rnd)::value>, ctas, stream,
                      static_cast<const InT*>(x), count, amax, seed, outputs);
      return Launch(Fp8Kernel<InT, ElemFormat::kE5M2, decltype(rnd)::value>, ctas, stream,
                    static_cast<const InT*>(x), count, amax, seed, outputs);
    });
  });
}

Status LaunchBf16(const void* x, DType x_dtype, int64_t count, Rounding rounding, uint64_t seed,
                  const DeviceOutputs& outputs, cudaStream_t stream) {
  const int64_t ctas = CeilDiv(CeilDiv(count, 8), kThreads * 2);
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return WithRounding(rounding, [&](auto rnd) {
      return Launch(Bf16Kernel<InT, decltype(rnd)::value>, ctas, stream, static_cast<const InT*>(x), count, seed,
                    outputs);
    });
  });
}

}  // namespace

Status LaunchTensorAmax(const void* x, DType x_dtype, int64_t count, bool ignore_nan, float* amax,
                        cudaStream_t stream) {
  unsigned int* amax_bits = reinterpret_cast<unsigned int*>(amax);
  const int64_t ctas = CeilDiv(CeilDiv(count, 8), kThreads);
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return WithBool(ignore_nan, [&](auto ignore) {
      return Launch(AmaxKernel<InT, decltype(ignore)::value>, ctas, stream, static_cast<const InT*>(x), count,
                    amax_bits);
    });
  });
}

}  // namespace qcuda

// ============================================================================
// Device-pointer API (quantize_cuda.h)
// ============================================================================

Status Fp8TensorAmaxCuda(const void* x, DType x_dtype, int64_t count, float* amax, void* stream) {
  KEEL_RETURN_IF_ERROR(qcuda::CheckCount(count, "Fp8TensorAmaxCuda"));
  KEEL_RETURN_IF_ERROR(qcuda::CheckIo(x, x_dtype, DeviceOutputs{}, false, false, "Fp8TensorAmaxCuda"));
  if (amax == nullptr) return Status::Error("Fp8TensorAmaxCuda: amax: null; need a device float");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  KEEL_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  return qcuda::LaunchTensorAmax(x, x_dtype, count, /*ignore_nan=*/true, amax, s);
}

Status Fp8TensorQuantizeCuda(const void* x, DType x_dtype, int64_t count, ElemFormat elem, Rounding rounding,
                             uint64_t seed, const float* amax, const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(qcuda::CheckCount(count, "Fp8TensorQuantizeCuda"));
  if (elem != ElemFormat::kE4M3 && elem != ElemFormat::kE5M2)
    return Status::Error(std::string("Fp8TensorQuantizeCuda: elem: ") + Spec(elem).name +
                         " is not allowed for per-tensor FP8; use e4m3 or e5m2");
  KEEL_RETURN_IF_ERROR(qcuda::CheckIo(x, x_dtype, outputs, false, true, "Fp8TensorQuantizeCuda"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  qcuda::StreamBuffer amax_temp(s);
  if (amax == nullptr) {
    KEEL_RETURN_IF_ERROR(amax_temp.Allocate(sizeof(float)));
    KEEL_RETURN_IF_ERROR(Fp8TensorAmaxCuda(x, x_dtype, count, amax_temp.get<float>(), stream));
    amax = amax_temp.get<float>();
  }
  return qcuda::LaunchFp8Tensor(x, x_dtype, count, elem, rounding, seed, amax, outputs, s);
}

Status Bf16QuantizeCuda(const void* x, DType x_dtype, int64_t count, Rounding rounding, uint64_t seed,
                        const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(qcuda::CheckCount(count, "Bf16QuantizeCuda"));
  KEEL_RETURN_IF_ERROR(qcuda::CheckIo(x, x_dtype, outputs, false, false, "Bf16QuantizeCuda"));
  return qcuda::LaunchBf16(x, x_dtype, count, rounding, seed, outputs, static_cast<cudaStream_t>(stream));
}

}  // namespace keel
