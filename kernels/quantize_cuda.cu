// CUDA quantizers of quantize_cuda.h (MX, NVFP4 with 1x16 blocks or 16x16 tiles
// and optional RHT, per-tensor FP8, BF16) and QuantizeCuda of quantizer.h. They
// agree bit for bit with the CPU reference in quantize.cc: every number is computed
// by a quant_core.h function, which quant_core_test.cc checks against that
// reference on the CPU. This file only decides who loads what: the kernels first,
// then their launchers, then QuantizeCuda for host arrays.
//
// How x is read (once, at full bandwidth, 256 threads per CTA, grid sized to the
// resident CTAs with grid-stride loops):
//   - Along rows (axis 1): a thread loads 8 consecutive elements (16 bytes of bf16
//     or 2 x 16 of fp32); the 2..32 adjacent lanes that cover one block combine
//     their amax with xor-shuffles, so a warp's load is 512 or 1024 contiguous
//     bytes. Each thread takes two such units per iteration, loads first, so that
//     enough bytes are in flight.
//   - Down columns (axis 0): a thread owns two adjacent columns and holds the
//     whole column block (32 or 16 rows) in registers; a warp's load per row is
//     128 (bf16) or 256 (fp32) contiguous bytes. No shared memory anywhere except
//     the 8-word amax reduction.
//   - NVFP4 along rows, nearest_even without RHT: one thread per 16-element
//     block (two 16-byte loads of bf16), so the block scale is computed once; for
//     16x16 tiles a warp covers 4 tiles along the row (see Nvfp4RowsRneKernel).
//   - NVFP4 16x16 tiles along rows: one warp per tile (lane = row * 2 + half);
//     the tile amax is a full-warp reduction. Down columns, 8 lanes share a tile.
//   - RHT along rows: the two lanes of a 16-chunk swap their halves with 8
//     shuffles and each computes its own 8 outputs (quant_core RhtHalf).
//   - Shapes the fast kernels do not cover (MX blocks other than 8..256 by powers
//     of two along rows or other than 32 down columns, odd column counts) take a
//     generic path: one kernel for the block scales, then one thread per pair of
//     elements, so that each packed FP4 byte has exactly one writer.
#include "kernels/quantize_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/formats.h"
#include "kernels/quant_core.h"
#include "kernels/quantize.h"
#include "kernels/quantizer.h"

namespace keel {
namespace {

using qcore::ElemConsts;
using qcore::Rounded;

constexpr int kThreads = 256;  // per CTA, every kernel
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
// Work counts below this use 32-bit index division (FastDivmod); the margin covers
// the inactive tail of the last grid-stride step.
constexpr int64_t kNarrowLimit = (int64_t{1} << 32) - (int64_t{1} << 24);

// ============================================================================
// Device helpers: loads, stores, reductions
// ============================================================================

// bf16 inputs travel as their bits (uint16_t); a bf16 is the fp32 with those bits
// on top, so the conversion is exact.
__device__ __forceinline__ float Bf16Float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ float Load1(const float* p) { return __ldg(p); }
__device__ __forceinline__ float Load1(const uint16_t* p) { return Bf16Float(__ldg(p)); }

// Eight consecutive elements at a 16-byte aligned address.
__device__ __forceinline__ void Load8(const float* p, float v[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void Load8(const uint16_t* p, float v[8]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
  }
}

// Per-half max of two bf16 pairs: sm_90 has max.u16x2, one instruction for two
// elements. Applied to magnitude bits (x & 0x7FFF7FFF) it is AbsBits' max per
// element, since a bf16's magnitude bits order as its fp32 bits do, NaN above Inf.
__device__ __forceinline__ uint32_t MaxU16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return max(a & 0xFFFFu, b & 0xFFFFu) | max(a & 0xFFFF0000u, b & 0xFFFF0000u);
#endif
}
constexpr uint32_t kBf16x2AbsMask = 0x7FFF7FFFu;

// Two adjacent elements, kept in their raw form in registers until used (a column
// block stays in registers: 32 words for bf16, 64 for fp32).
template <typename InT> struct Raw2;
template <> struct Raw2<float> {
  using Type = float2;
  __device__ static Type Load(const float* p) { return __ldg(reinterpret_cast<const float2*>(p)); }
  __device__ static Type Zero() { return make_float2(0.0f, 0.0f); }
  __device__ static void Unpack(Type r, float* a, float* b) { *a = r.x; *b = r.y; }
  // Running max of AbsBits of each of the two columns.
  struct AbsMax {
    uint32_t lo = 0, hi = 0;
    __device__ void Add(Type r) {
      lo = max(lo, qcore::AbsBits(r.x));
      hi = max(hi, qcore::AbsBits(r.y));
    }
    __device__ uint32_t Lo() const { return lo; }
    __device__ uint32_t Hi() const { return hi; }
  };
};
template <> struct Raw2<uint16_t> {
  using Type = uint32_t;
  __device__ static Type Load(const uint16_t* p) {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
  }
  __device__ static Type Zero() { return 0u; }
  __device__ static void Unpack(Type r, float* a, float* b) {
    *a = __uint_as_float(r << 16);
    *b = __uint_as_float(r & 0xFFFF0000u);
  }
  // The same, both columns in one packed max (two instructions per pair).
  struct AbsMax {
    uint32_t m = 0;
    __device__ void Add(Type r) { m = MaxU16x2(m, r & kBf16x2AbsMask); }
    __device__ uint32_t Lo() const { return m << 16; }
    __device__ uint32_t Hi() const { return m & 0xFFFF0000u; }
  };
};

// Eight consecutive elements at a 16-byte aligned address, kept raw in registers
// (a software-pipelined kernel holds the next step's loads this way).
template <typename InT> struct Raw8;
template <> struct Raw8<float> {
  struct Type {
    float4 a, b;
  };
  __device__ static Type Load(const float* p) {
    return Type{__ldg(reinterpret_cast<const float4*>(p)), __ldg(reinterpret_cast<const float4*>(p) + 1)};
  }
  __device__ static Type Zero() { return Type{make_float4(0, 0, 0, 0), make_float4(0, 0, 0, 0)}; }
  __device__ static void Unpack(const Type& r, float v[8]) {
    v[0] = r.a.x; v[1] = r.a.y; v[2] = r.a.z; v[3] = r.a.w;
    v[4] = r.b.x; v[5] = r.b.y; v[6] = r.b.z; v[7] = r.b.w;
  }
  // max over the 8 elements of AbsBits.
  __device__ static uint32_t AbsMax(const Type& r) {
    float v[8];
    Unpack(r, v);
    uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max(m, qcore::AbsBits(v[e]));
    return m;
  }
};
template <> struct Raw8<uint16_t> {
  using Type = uint4;
  __device__ static Type Load(const uint16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ static Type Zero() { return make_uint4(0, 0, 0, 0); }
  __device__ static void Unpack(const Type& r, float v[8]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
  // The same with packed 16x2 maxima: 4 masks, 3 maxes and 3 to finish, not 16.
  __device__ static uint32_t AbsMax(const Type& r) {
    const uint32_t m = MaxU16x2(MaxU16x2(r.x & kBf16x2AbsMask, r.y & kBf16x2AbsMask),
                                MaxU16x2(r.z & kBf16x2AbsMask, r.w & kBf16x2AbsMask));
    return max(m << 16, m & 0xFFFF0000u);
  }
};

// Dequantized output: fp32, or bf16 rounded to nearest even from the fp32 value
// by the hardware conversion (one instruction per pair; the same bits as
// FloatToBf16's nearest_even except that a NaN comes out as the canonical NaN).
__device__ __forceinline__ uint32_t ToBf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
__device__ __forceinline__ uint32_t ToBf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ void StoreOut8(void* out, bool bf16, int64_t i, const float v[8]) {
  if (bf16) {
    const uint4 w = make_uint4(ToBf16x2(v[0], v[1]), ToBf16x2(v[2], v[3]), ToBf16x2(v[4], v[5]),
                               ToBf16x2(v[6], v[7]));
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + i) = w;
  } else {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(out) + i);
    q[0] = make_float4(v[0], v[1], v[2], v[3]);
    q[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}
__device__ __forceinline__ void StoreOut2(void* out, bool bf16, int64_t i, float a, float b) {
  if (bf16) {
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + i) = ToBf16x2(a, b);
  } else {
    *reinterpret_cast<float2*>(static_cast<float*>(out) + i) = make_float2(a, b);
  }
}
__device__ __forceinline__ void StoreOut1(void* out, bool bf16, int64_t i, float a) {
  if (bf16) static_cast<uint16_t*>(out)[i] = static_cast<uint16_t>(ToBf16(a));
  else static_cast<float*>(out)[i] = a;
}

// Codes of 8 consecutive elements starting at an index i that is a multiple of 8:
// FP4 packs element i + m into bits 4m.. of a little-endian word (element 2k in the
// low nibble of byte k, as PackCodes does); 6- and 8-bit codes take a byte each.
template <int kBits>
__device__ __forceinline__ void StoreCodes8(uint8_t* codes, int64_t i, const uint32_t c[8]) {
  if constexpr (kBits == 4) {
    uint32_t w = 0;
#pragma unroll
    for (int m = 0; m < 8; ++m) w |= c[m] << (4 * m);
    *reinterpret_cast<uint32_t*>(codes + i / 2) = w;
  } else {
    uint2 w;
    w.x = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
    w.y = c[4] | (c[5] << 8) | (c[6] << 16) | (c[7] << 24);
    *reinterpret_cast<uint2*>(codes + i) = w;
  }
}
// Codes of two row-adjacent elements at an even index i.
template <int kBits>
__device__ __forceinline__ void StoreCodes2(uint8_t* codes, int64_t i, uint32_t c0, uint32_t c1) {
  if constexpr (kBits == 4) codes[i / 2] = static_cast<uint8_t>(c0 | (c1 << 4));
  else *reinterpret_cast<uint16_t*>(codes + i) = static_cast<uint16_t>(c0 | (c1 << 8));
}

// The uniforms of elements i and i + 1 for even i (same Philox group).
__device__ __forceinline__ void Uniform2(uint64_t seed, int64_t i, float* u0, float* u1) {
  float u[4];
  qcore::PhiloxUniform4(seed, static_cast<uint64_t>(i) >> 2, u);
  const bool upper = (i & 2) != 0;
  *u0 = upper ? u[2] : u[0];
  *u1 = upper ? u[3] : u[1];
}
// The uniforms of elements i .. i + 7 for i a multiple of 8.
__device__ __forceinline__ void Uniform8(uint64_t seed, int64_t i, float u[8]) {
  qcore::PhiloxUniform4(seed, static_cast<uint64_t>(i) >> 2, u);
  qcore::PhiloxUniform4(seed, (static_cast<uint64_t>(i) >> 2) + 1, u + 4);
}

// ---- Hardware FP8 conversion (sm_89 and later) ----------------------------------
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 rounds two floats to nearest even and clamps
// to +-max_normal: for a finite w with |w| < 2^(emax + 1) that is RoundElemCore's
// nearest_even code, since rounding then clamping and saturating the rounded value
// agree (a tie just above max_normal goes to the even grid point max_normal, and
// anything that would round higher saturates to it). One instruction per pair
// instead of about a dozen per element. What it does not do is Keel's zero rule
// and NaN codes: MX callers make w with ScaledPlusZero (hardware keeps -0's sign),
// and callers select NaN codes themselves. Below sm_89 the quant_core path runs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KEEL_HW_FP8 1
#else
#define KEEL_HW_FP8 0
#endif

template <ElemFormat F>
constexpr bool kHwFp8Format = F == ElemFormat::kE4M3 || F == ElemFormat::kE5M2;

template <ElemFormat F>
constexpr __nv_fp8_interpretation_t Fp8Kind() {
  return F == ElemFormat::kE4M3 ? __NV_E4M3 : __NV_E5M2;
}

// Codes of lo and hi, lo in the low byte (the order StoreCodes wants).
template <ElemFormat F>
__device__ __forceinline__ uint32_t HwFp8x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, Fp8Kind<F>());
}

// The values of two codes made by HwFp8x2 (exact: E4M3 and E5M2 are subsets of fp16).
template <ElemFormat F>
__device__ __forceinline__ float2 HwFp8x2Value(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), Fp8Kind<F>());
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// x * 2^-e (the one rounding MxElementFinite does) with the zero rule of
// PlusZeroBits applied, in two instructions: w + 0 is w for every w != 0 and +0
// for w = +-0 under round-to-nearest. The separate __fadd_rn keeps it from being
// fused: an FMA would keep the -0 of a product that underflows.
__device__ __forceinline__ float ScaledPlusZero(float x, float inv_scale) {
  return __fadd_rn(__fmul_rn(x, inv_scale), 0.0f);
}

// ---- Nearest-even rounding to E3M2, E2M3 and E2M1 ------------------------------
// qcore::RoundElemCore for Rounding::kNearestEven, written for the instruction
// count: |w| is an operand modifier of the magic addition instead of a separate
// mask, and kClamp = false drops the clamp to max_normal for callers whose |w| is
// at most max_normal already (NVFP4 clamps w to +-6 before rounding, and 6 is on
// the grid, so rounding cannot exceed it). Same additions, same bits: see
// RoundElemCore for why (|w| + big) - big is the nearest-even grid point and the
// low bits of the sum count its quanta. w must not be NaN.
template <ElemFormat F, bool kClamp>
__device__ __forceinline__ Rounded RneSmall(float w) {
  constexpr ElemConsts c = qcore::ConstsOf(F);
  const uint32_t bits = __float_as_uint(w);
  const uint32_t sign = bits & qcore::kSignBit;
  const uint32_t big_bits = max(bits & 0x7F800000u, static_cast<uint32_t>(128 - c.bias) << 23) +
                            (static_cast<uint32_t>(23 - c.mbits) << 23);
  const float big = __uint_as_float(big_bits);
  const float sum = __fadd_rn(fabsf(w), big);
  const uint32_t n = __float_as_uint(sum) - big_bits;
  float value = __fsub_rn(sum, big);
  uint32_t code = (big_bits >> (23 - c.mbits)) - (static_cast<uint32_t>(151 - c.bias - c.mbits) << c.mbits) + n;
  if constexpr (kClamp) {
    code = min(code, c.max_code);
    value = fminf(value, __uint_as_float(c.max_bits));
  }
  return Rounded{__uint_as_float(__float_as_uint(value) | sign), code | (sign >> (32 - c.bits))};
}

// Nvfp4Element (nearest_even) for a block whose s_b is not NaN. Then no y * s_b is
// NaN: a NaN y makes the block amax NaN and so s_b NaN, and s_b is never 0 (sf is
// at most 448 and |S_dec| below 2^117, so 1 / (sf * S_dec) is not 1 / Inf), so an
// infinite y gives an infinite product that the clamp takes to +-6. Blocks with a
// NaN s_b are handled whole by the caller. The + 0 is PlusZeroBits (see
// ScaledPlusZero).
__device__ __forceinline__ Rounded Nvfp4ElementRne(float y, float s_b) {
  const float w = __fadd_rn(fminf(fmaxf(__fmul_rn(y, s_b), -6.0f), 6.0f), 0.0f);
  return RneSmall<ElemFormat::kE2M1, false>(w);
}

// Nearest-even NVFP4 step 4-5 for the kN elements of one block (or part of one):
// a NaN block scale (a NaN tensor or block) gives code 0 and NaN for all of them,
// as Nvfp4Element does; otherwise each element rounds, and the dequantized value
// is computed only when it is wanted (codes-only calls skip that arithmetic).
template <int kN>
__device__ __forceinline__ void Nvfp4RoundRne(const float (&y)[kN], const qcore::Nvfp4BlockScale& s,
                                              const qcore::Nvfp4TensorScale& t, bool with_values,
                                              uint32_t (&code)[kN], float (&out)[kN]) {
  if (qcore::IsNan(s.s_b)) {
    const float nan_out = qcore::Nvfp4Dequant(qcore::QuietNan(), s, t);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      code[k] = 0;
      out[k] = nan_out;
    }
    return;
  }
  // Two copies of the loop, so that the codes-only one has no value arithmetic.
  auto round = [&](auto values) {
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const Rounded q = Nvfp4ElementRne(y[k], s.s_b);
      code[k] = q.code;
      if constexpr (decltype(values)::value) out[k] = qcore::Nvfp4Dequant(q.value, s, t);
    }
  };
  if (with_values) round(std::true_type{});
  else round(std::false_type{});
}

// The tensor scale a dequantized NVFP4 output carries: t, or t with S_dec = 1 when
// outputs.out_without_tensor_scale (q * sf, exact in bf16; the caller folds S_dec
// into its GEMM's alpha). Only the output uses it: block scales still come from t.
__device__ __forceinline__ qcore::Nvfp4TensorScale OutTensorScale(qcore::Nvfp4TensorScale t,
                                                                  const DeviceOutputs& o) {
  if (o.out_without_tensor_scale) t.s_dec = 1.0f;
  return t;
}

// Division of a work index by a fixed divisor: a multiply-high (FastDivmod) when
// every index fits in 32 bits, a 64-bit division otherwise.
struct IndexDiv {
  qcore::FastDivmod fast;
  int64_t divisor = 1;
  bool wide = false;
};

IndexDiv MakeIndexDiv(int64_t divisor, int64_t max_index) {
  IndexDiv d;
  d.divisor = divisor;
  d.wide = max_index >= kNarrowLimit || divisor >= kNarrowLimit;
  if (!d.wide) d.fast = qcore::FastDivmod(static_cast<uint32_t>(divisor));
  return d;
}

__device__ __forceinline__ void DivMod(int64_t n, const IndexDiv& by, int64_t* q, int64_t* r) {
  if (by.wide) {
    *q = n / by.divisor;
    *r = n - *q * by.divisor;
  } else {
    uint32_t q32, r32;
    by.fast.DivMod(static_cast<uint32_t>(n), &q32, &r32);
    *q = q32;
    *r = r32;
  }
}

// Max over the CTA of each thread's m, then one atomicMax per CTA. Non-negative
// float bits order like the floats, so the unsigned max is the float max (NaN bits
// above +Inf: a NaN wins, which is the NaN-propagating amax).
__device__ __forceinline__ void CtaMaxToGlobal(uint32_t m, unsigned int* out) {
  __shared__ uint32_t warp_max[kWarps];
  m = __reduce_max_sync(kFullMask, m);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = max(m, warp_max[w]);
    m = max(m, warp_max[0]);
    if (m != 0) atomicMax(out, m);
  }
}

// ============================================================================
// Kernels: MX (NUMERICS.md section 2)
// ============================================================================

struct MxRowsArgs {
  int64_t rows, cols;
  int64_t blocks_per_row;
  int64_t units_per_row;      // cols / 8
  int64_t padded_units;       // blocks_per_row * lanes: a trailing partial block's idle lanes
  int lanes;                  // block / 8 lanes per block: 1, 2, 4, .. 32
  int lane_shift;             // log2(lanes)
  int64_t total;              // rows * padded_units
  IndexDiv by_padded;
  uint64_t seed;
  DeviceOutputs o;
};

// Axis 1, block = 8 * lanes, cols % 8 == 0. A unit is 8 consecutive elements of
// a row; units are numbered row by row with each row padded to whole blocks, so
// the lanes of one block are adjacent and aligned within their warp.
// kBump: the bump exponent rule (a template flag, so the common path has no
// branch on it). kDense: cols % block == 0 and rows * cols < 2^31, chosen by the
// launcher; then there is no padding, unit g holds elements 8g .. 8g + 7 and its
// scale byte is g / lanes, so indices are 32-bit and need no division.
template <typename InT, ElemFormat F, Rounding R, bool kBump, bool kDense>
__global__ void __launch_bounds__(kThreads) MxRowsKernel(const InT* __restrict__ x, const MxRowsArgs a) {
  using Index = std::conditional_t<kDense, uint32_t, int64_t>;
  constexpr ElemConsts c = qcore::ConstsOf(F);
  constexpr bool kHw = KEEL_HW_FP8 && kHwFp8Format<F> && R == Rounding::kNearestEven;
  // Two units per step: with four (98 registers, or 80 with spills at three CTAs
  // per SM) the H200 ran slower than with two and 4 CTAs per SM.
  constexpr int kUnits = 2;
  using Raw = Raw8<InT>;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const Index total = static_cast<Index>(a.total);
  const Index step = static_cast<Index>(gridDim.x) * (kThreads * kUnits);
  // Software pipelined: the loads of step k + 1 are issued before the arithmetic
  // of step k, so each thread keeps 2 * kUnits 16-byte loads in flight while it
  // computes (loading then computing in turn left the kernel latency-bound).
  typename Raw::Type next[kUnits];
  Index next_row[kUnits], next_unit[kUnits];  // dense: row 0, the unit counted over the tensor
  bool next_active[kUnits];
  auto load_step = [&](Index base) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const Index g = base + u * kThreads + threadIdx.x;
      if constexpr (kDense) {
        next_row[u] = 0;
        next_unit[u] = g;
        next_active[u] = g < total;
        next[u] = next_active[u] ? Raw::Load(x + g * 8) : Raw::Zero();
      } else {
        DivMod(g, a.by_padded, &next_row[u], &next_unit[u]);
        next_active[u] = g < total && next_unit[u] < a.units_per_row;
        next[u] = next_active[u] ? Raw::Load(x + next_row[u] * a.cols + next_unit[u] * 8) : Raw::Zero();
      }
    }
  };
  load_step(static_cast<Index>(blockIdx.x) * (kThreads * kUnits));
  for (Index base = static_cast<Index>(blockIdx.x) * (kThreads * kUnits); base < total; base += step) {
    float v[kUnits][8];
    uint32_t unit_amax[kUnits];
    Index row[kUnits], unit[kUnits];
    bool active[kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      Raw::Unpack(next[u], v[u]);
      unit_amax[u] = Raw::AbsMax(next[u]);
      row[u] = next_row[u];
      unit[u] = next_unit[u];
      active[u] = next_active[u];
    }
    load_step(base + step);  // inactive (zeros) past the end
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      uint32_t amax = unit_amax[u];
      for (int o = 1; o < a.lanes; o <<= 1) amax = max(amax, __shfl_xor_sync(kFullMask, amax, o));
      if (!active[u]) continue;
      const qcore::MxScale s = qcore::MxScaleFromAmax(amax, c, kBump);
      const int64_t i0 = kDense ? static_cast<int64_t>(unit[u]) * 8 : row[u] * a.cols + unit[u] * 8;
      float uni[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (R == Rounding::kStochastic) Uniform8(a.seed, i0, uni);
      float out[8];
      uint32_t code[8];
      if (s.nan) {  // per block, so that 2^e and 2^-e are computed once per unit
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          out[e] = qcore::QuietNan();
          code[e] = c.nan_code;
        }
      } else if constexpr (kHw) {
        // MxElementFinite with the conversion in hardware: w = x * 2^-e exactly as
        // there, value = code value * 2^e (exact).
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          const uint32_t pair = HwFp8x2<F>(ScaledPlusZero(v[u][e], s.inv_scale),
                                           ScaledPlusZero(v[u][e + 1], s.inv_scale));
          code[e] = pair & 0xFFu;
          code[e + 1] = pair >> 8;
          if (a.o.out != nullptr) {
            const float2 q = HwFp8x2Value<F>(pair);
            out[e] = q.x * s.scale;
            out[e + 1] = q.y * s.scale;
          }
        }
      } else if constexpr (R == Rounding::kNearestEven) {
        // MxElementFinite, with the zero rule as in ScaledPlusZero and RneSmall's
        // shorter rounding (E3M2, E2M3, E2M1 and, below sm_89, FP8). Two copies of
        // the loop, so that codes-only calls skip the value arithmetic.
        auto round8 = [&](auto with_values) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const Rounded r = RneSmall<F, true>(ScaledPlusZero(v[u][e], s.inv_scale));
            if constexpr (decltype(with_values)::value) out[e] = r.value * s.scale;
            code[e] = r.code;
          }
        };
        if (a.o.out != nullptr) round8(std::true_type{});
        else round8(std::false_type{});
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const Rounded r = qcore::MxElementFinite(v[u][e], s, c, R, uni[e]);
          out[e] = r.value;
          code[e] = r.code;
        }
      }
      if (a.o.codes != nullptr) StoreCodes8<c.bits>(a.o.codes, i0, code);
      if (a.o.out != nullptr) StoreOut8(a.o.out, out_bf16, i0, out);
      if (a.o.scales != nullptr && (unit[u] & (a.lanes - 1)) == 0) {
        const Index scale = kDense ? unit[u] >> a.lane_shift : row[u] * a.blocks_per_row + (unit[u] >> a.lane_shift);
        a.o.scales[scale] = static_cast<uint8_t>(s.byte);
      }
    }
  }
}

struct MxColsArgs {
  int64_t rows, cols;
  int64_t total;              // ceil(rows / block) * (cols / 2)
  IndexDiv by_pairs;          // cols / 2
  int prefetch;               // L2 prefetch of the item this many grid steps ahead; 0: none (see the kernel)
  bool bump;
  uint64_t seed;
  DeviceOutputs o;
};

// Axis 0, block kBlock rows, cols even: a thread owns columns (c0, c0 + 1) of one
// row block; consecutive threads take consecutive column pairs. kDense: rows %
// kBlock == 0 and rows * cols < 2^31, chosen by the launcher; then every block is
// whole and indices are 32-bit.
template <typename InT, ElemFormat F, Rounding R, int kBlock, bool kDense>
__global__ void __launch_bounds__(kThreads) MxColsKernel(const InT* __restrict__ x, const MxColsArgs a) {
  using Index = std::conditional_t<kDense, uint32_t, int64_t>;
  constexpr ElemConsts c = qcore::ConstsOf(F);
  using Raw = Raw2<InT>;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const Index cols = static_cast<Index>(a.cols);
  const Index total = static_cast<Index>(a.total);
  const Index step = static_cast<Index>(gridDim.x) * kThreads;
  for (Index w = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; w < total; w += step) {
    Index rb, cp;
    if constexpr (kDense) {
      a.by_pairs.fast.DivMod(w, &rb, &cp);
    } else {
      DivMod(w, a.by_pairs, &rb, &cp);
    }
    const Index r0 = rb * kBlock, c0 = cp * 2;
    const int n = kDense ? kBlock : static_cast<int>(min(static_cast<int64_t>(kBlock), a.rows - r0));
    const InT* p = x + r0 * cols + c0;
    typename Raw::Type raw[kBlock];
#pragma unroll
    for (int r = 0; r < kBlock; ++r) raw[r] = r < n ? Raw::Load(p + r * cols) : Raw::Zero();
    // An L2 prefetch of a later item. The launcher leaves it off: on the H200 it
    // made the kernel slower (MX FP8 down columns 0.24 -> 0.32 ms at 1 step ahead).
    // The branch is kept because of what it does to ptxas: with it this kernel gets
    // 70 registers instead of 89 (FP6, FP4) or 114 (FP8), so 3 CTAs per SM instead
    // of 2, and MX FP8 down columns went from 0.308 to 0.239 ms. Fences tried instead
    // (__syncwarp, asm barriers on the loaded words or the row stride,
    // __launch_bounds__ with 3 CTAs, which spills) did not get the same allocation.
    if (a.prefetch > 0 && w + a.prefetch * step < total) {
      int64_t rb2, cp2;
      DivMod(w + a.prefetch * step, a.by_pairs, &rb2, &cp2);
      const int64_t n2 = min(static_cast<int64_t>(kBlock), a.rows - rb2 * kBlock);
      const InT* p2 = x + rb2 * kBlock * a.cols + cp2 * 2;
#pragma unroll
      for (int r = 0; r < kBlock; ++r) {
        if (r < n2) asm volatile("prefetch.global.L2 [%0];" ::"l"(p2 + r * a.cols));
      }
    }
    typename Raw::AbsMax amax;
#pragma unroll
    for (int r = 0; r < kBlock; ++r) amax.Add(raw[r]);
    const qcore::MxScale s0 = qcore::MxScaleFromAmax(amax.Lo(), c, a.bump);
    const qcore::MxScale s1 = qcore::MxScaleFromAmax(amax.Hi(), c, a.bump);
    // Two copies of the loop, so that codes-only calls skip the value arithmetic.
    auto quantize_rows = [&](auto with_values) {
      constexpr bool kValues = decltype(with_values)::value;
#pragma unroll
      for (int r = 0; r < kBlock; ++r) {
        if (r >= n) break;
        const Index i = (r0 + r) * cols + c0;
        float v0, v1, u0 = 0.0f, u1 = 0.0f;
        Raw::Unpack(raw[r], &v0, &v1);
        if constexpr (R == Rounding::kStochastic) Uniform2(a.seed, i, &u0, &u1);
        // Computed unconditionally, NaN blocks selected after: keeps 2^+-e out of the loop.
        Rounded q0, q1;
        if constexpr (KEEL_HW_FP8 && kHwFp8Format<F> && R == Rounding::kNearestEven) {
          // As MxElementFinite, with the conversion of the pair in hardware.
          const uint32_t pair = HwFp8x2<F>(ScaledPlusZero(v0, s0.inv_scale), ScaledPlusZero(v1, s1.inv_scale));
          const float2 q = kValues ? HwFp8x2Value<F>(pair) : make_float2(0.0f, 0.0f);
          q0 = Rounded{q.x * s0.scale, pair & 0xFFu};
          q1 = Rounded{q.y * s1.scale, pair >> 8};
        } else if constexpr (R == Rounding::kNearestEven) {
          q0 = RneSmall<F, true>(ScaledPlusZero(v0, s0.inv_scale));
          q1 = RneSmall<F, true>(ScaledPlusZero(v1, s1.inv_scale));
          q0.value = q0.value * s0.scale;
          q1.value = q1.value * s1.scale;
        } else {
          q0 = qcore::MxElementFinite(v0, s0, c, R, u0);
          q1 = qcore::MxElementFinite(v1, s1, c, R, u1);
        }
        if (s0.nan) q0 = qcore::MxNanElement(c);
        if (s1.nan) q1 = qcore::MxNanElement(c);
        if (a.o.codes != nullptr) StoreCodes2<c.bits>(a.o.codes, i, q0.code, q1.code);
        if constexpr (kValues) StoreOut2(a.o.out, out_bf16, i, q0.value, q1.value);
      }
    };
    if (a.o.out != nullptr) quantize_rows(std::true_type{});
    else quantize_rows(std::false_type{});
    if (a.o.scales != nullptr)
      *reinterpret_cast<uint16_t*>(a.o.scales + rb * cols + c0) = static_cast<uint16_t>(s0.byte | (s1.byte << 8));
  }
}

struct MxGenericArgs {
  int64_t rows, cols, count;
  int axis;
  int block;
  int64_t blocks_per_line;
  int64_t blocks;             // MxScaleCount
  ElemConsts c;
  bool bump;
  uint64_t seed;
  uint8_t* scales;            // the scale bytes: outputs.scales or a temporary
  DeviceOutputs o;
};

// Generic path, pass 1: one thread per block computes its scale byte. Block w is
// scale index w in both layouts (axis 1: line-major; axis 0: block-row-major, so
// consecutive threads read consecutive columns).
template <typename InT>
__global__ void __launch_bounds__(kThreads) MxGenericScalesKernel(const InT* __restrict__ x, const MxGenericArgs a) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < a.blocks; w += step) {
    int64_t start, stride, n;
    if (a.axis == 1) {
      const int64_t line = w / a.blocks_per_line, b = w - line * a.blocks_per_line;
      start = line * a.cols + b * a.block;
      stride = 1;
      n = min(static_cast<int64_t>(a.block), a.cols - b * a.block);
    } else {
      const int64_t b = w / a.cols, line = w - b * a.cols;
      start = b * a.block * a.cols + line;
      stride = a.cols;
      n = min(static_cast<int64_t>(a.block), a.rows - b * a.block);
    }
    uint32_t amax = 0;
    for (int64_t k = 0; k < n; ++k) amax = max(amax, qcore::AbsBits(Load1(x + start + k * stride)));
    a.scales[w] = static_cast<uint8_t>(qcore::MxScaleFromAmax(amax, a.c, a.bump).byte);
  }
}

// Generic path, pass 2: one thread per pair of elements (2p, 2p + 1) in row-major
// order, so it alone writes their packed FP4 byte.
template <typename InT, Rounding R>
__global__ void __launch_bounds__(kThreads) MxGenericElementsKernel(const InT* __restrict__ x, const MxGenericArgs a) {
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const int64_t pairs = (a.count + 1) / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < pairs; p += step) {
    uint32_t code[2] = {0, 0};
    const int halves = 2 * p + 1 < a.count ? 2 : 1;
    for (int h = 0; h < halves; ++h) {
      const int64_t i = 2 * p + h;
      const int64_t row = i / a.cols, col = i - row * a.cols;
      const int64_t s_index = a.axis == 1 ? row * a.blocks_per_line + col / a.block
                                          : (row / a.block) * a.cols + col;
      const qcore::MxScale s = qcore::MxScaleFromByte(a.scales[s_index]);
      const float u = R == Rounding::kStochastic ? PhiloxUniform(a.seed, static_cast<uint64_t>(i)) : 0.0f;
      const Rounded r = qcore::MxElement(Load1(x + i), s, a.c, R, u);
      code[h] = r.code;
      if (a.o.out != nullptr) StoreOut1(a.o.out, out_bf16, i, r.value);
    }
    if (a.o.codes != nullptr) {
      if (a.c.bits == 4) {
        a.o.codes[p] = static_cast<uint8_t>(code[0] | (code[1] << 4));
      } else {
        a.o.codes[2 * p] = static_cast<uint8_t>(code[0]);
        if (halves == 2) a.o.codes[2 * p + 1] = static_cast<uint8_t>(code[1]);
      }
    }
  }
}

// ============================================================================
// Kernels: NVFP4 (NUMERICS.md section 3)
// ============================================================================

struct Nvfp4Args {
  int64_t rows, cols;
  int64_t total;              // work items (see each kernel)
  IndexDiv by_inner;          // work item -> (outer, inner)
  int64_t blocks_per_row;     // axis 1: cols / 16
  uint64_t seed;
  const float* amax_in;       // quantize: the tensor amax
  unsigned int* amax_out;     // amax pass: max |y| bits, atomically
  DeviceOutputs o;
};

// Axis 1 (blocks of 16 along rows), cols % 16 == 0. A unit is 8 elements, half a
// block: for 1x16, units run row by row (inner = cols / 8); for 16x16 tiles, one
// warp is one tile (inner = tiles per 16-row band), lane = 2 * row-in-tile + half.
// kAmaxOnly: the amax pass (only needed with RHT; otherwise a plain max over x).
template <typename InT, Rounding R, bool kTile, bool kRht, bool kAmaxOnly>
__global__ void __launch_bounds__(kThreads) Nvfp4RowsKernel(const InT* __restrict__ x, const Nvfp4Args a) {
  constexpr int kUnits = 2;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  qcore::Nvfp4TensorScale t{};
  if constexpr (!kAmaxOnly) {
    t = qcore::Nvfp4TensorScaleFromAmax(__ldg(a.amax_in));
    if (a.o.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.o.tensor_scale = t.s_dec;
  }
  uint32_t thread_max = 0;
  using Raw = Raw8<InT>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kThreads * kUnits);
  // Software pipelined as MxRowsKernel: step k + 1's loads are in flight while
  // step k computes.
  typename Raw::Type next[kUnits];
  int64_t next_row[kUnits], next_col[kUnits];
  bool next_active[kUnits];
  auto load_step = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t g = base + u * kThreads + threadIdx.x;
      next_active[u] = g < a.total;
      if constexpr (kTile) {
        int64_t band, tile_col;
        DivMod(g >> 5, a.by_inner, &band, &tile_col);
        next_row[u] = band * 16 + ((g & 31) >> 1);
        next_col[u] = tile_col * 16 + (g & 1) * 8;
      } else {
        int64_t unit;
        DivMod(g, a.by_inner, &next_row[u], &unit);
        next_col[u] = unit * 8;
      }
      next[u] = next_active[u] ? Raw::Load(x + next_row[u] * a.cols + next_col[u]) : Raw::Zero();
    }
  };
  load_step(static_cast<int64_t>(blockIdx.x) * (kThreads * kUnits));
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * (kThreads * kUnits); base < a.total; base += step) {
    float v[kUnits][8];
    uint32_t unit_amax[kUnits];  // of x: the amax of y without the RHT
    int64_t row[kUnits], col[kUnits];
    bool active[kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      Raw::Unpack(next[u], v[u]);
      if constexpr (!kRht) unit_amax[u] = Raw::AbsMax(next[u]);
      row[u] = next_row[u];
      col[u] = next_col[u];
      active[u] = next_active[u];
    }
    load_step(base + step);  // inactive (zeros) past the end
    const int half = threadIdx.x & 1;  // which half of its 16-chunk this lane holds
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      float y[8];
      if constexpr (kRht) {
        float lo[8], hi[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float other = __shfl_xor_sync(kFullMask, v[u][e], 1);
          lo[e] = half ? other : v[u][e];
          hi[e] = half ? v[u][e] : other;
        }
        qcore::RhtHalf(lo, hi, half, y);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = v[u][e];
      }
      uint32_t amax = 0;
      if constexpr (kRht) {
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = max(amax, qcore::AbsBits(y[e]));
      } else {
        amax = unit_amax[u];
      }
      if constexpr (kAmaxOnly) {
        thread_max = max(thread_max, amax);  // idle lanes hold zeros
        continue;
      }
      amax = max(amax, __shfl_xor_sync(kFullMask, amax, 1));
      if constexpr (kTile) {
#pragma unroll
        for (int o = 2; o < 32; o <<= 1) amax = max(amax, __shfl_xor_sync(kFullMask, amax, o));
      }
      if (!active[u]) continue;
      const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax), t);
      const int64_t i0 = row[u] * a.cols + col[u];
      float uni[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (R == Rounding::kStochastic) Uniform8(a.seed, i0, uni);
      float out[8];
      uint32_t code[8];
      if constexpr (R == Rounding::kNearestEven) {
        Nvfp4RoundRne(y, s, OutTensorScale(t, a.o), a.o.out != nullptr, code, out);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const Rounded q = qcore::Nvfp4Element(y[e], s, R, uni[e]);
          code[e] = q.code;
          out[e] = qcore::Nvfp4Dequant(q.value, s, OutTensorScale(t, a.o));
        }
      }
      if (a.o.codes != nullptr) StoreCodes8<4>(a.o.codes, i0, code);
      if (a.o.out != nullptr) StoreOut8(a.o.out, out_bf16, i0, out);
      if (a.o.scales != nullptr && half == 0)
        a.o.scales[row[u] * a.blocks_per_row + (col[u] >> 4)] = static_cast<uint8_t>(s.code);
    }
  }
  if constexpr (kAmaxOnly) CtaMaxToGlobal(thread_max, a.amax_out);
}

// NVFP4 along rows, nearest_even, no RHT, one thread per 16-element block: the
// block (or tile) scale, its correctly rounded division included, is computed
// once, not by both lanes of a pair. Each thread takes two blocks per step, at
// element offsets e0 and e1; with cols % 16 == 0 a block at element offset e has
// its codes at bytes e / 2 .. e / 2 + 7 and its scale byte at e / 16.
//   - 1x16: blocks are numbered row-major over the tensor, so e = 16 * block and
//     a thread's two blocks lie kThreads blocks apart (each warp load instruction
//     then covers 1 KiB of bf16 with its neighbour).
//   - 16x16 (kTile, cols % 64 == 0): a warp covers 4 tiles side by side, lane =
//     8 * tile + r, and holds rows r and r + 8 of its tile, so each row the warp
//     reads is 4 x 16 contiguous elements; the tile amax is a max over the thread's
//     two blocks and the tile's 8 lanes, and the tile scale serves both blocks.
// Index is uint32_t when every element index fits in 31 bits (the launcher
// decides), which shortens the address arithmetic; int64_t otherwise.
template <typename InT, bool kTile, typename Index>
__global__ void __launch_bounds__(kThreads) Nvfp4RowsRneKernel(const InT* __restrict__ x, const Nvfp4Args a) {
  using Raw = Raw8<InT>;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(__ldg(a.amax_in));
  if (a.o.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.o.tensor_scale = t.s_dec;
  const Index total = static_cast<Index>(a.total);  // thread items (see the launcher)
  const Index step = static_cast<Index>(gridDim.x) * kThreads;
  const Index cols = static_cast<Index>(a.cols);
  const Index blocks = static_cast<Index>(a.rows * a.cols / 16);
  // Element offsets of item i's two blocks, and whether each exists.
  auto blocks_of = [&](Index i, Index e[2], bool active[2]) {
    if constexpr (kTile) {
      Index band, group;
      if constexpr (sizeof(Index) == 4) {
        a.by_inner.fast.DivMod(i >> 5, &band, &group);
      } else {
        DivMod(i >> 5, a.by_inner, &band, &group);
      }
      const Index lane = i & 31;
      e[0] = (band * 16 + (lane & 7)) * cols + group * 64 + (lane >> 3) * 16;
      e[1] = e[0] + 8 * cols;
      active[0] = active[1] = i < total;
    } else {
      const Index block = 2 * (i - threadIdx.x) + threadIdx.x;  // i - threadIdx.x: this CTA's step base
      e[0] = block * 16;
      e[1] = (block + kThreads) * 16;
      active[0] = block < blocks;
      active[1] = block + kThreads < blocks;
    }
  };
  // Software pipelined as MxRowsKernel: the next step's four 16-byte loads are
  // issued before this step's arithmetic.
  typename Raw::Type next[2][2];
  auto load_step = [&](Index i) {
    Index e[2];
    bool active[2];
    blocks_of(i, e, active);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      next[b][0] = active[b] ? Raw::Load(x + e[b]) : Raw::Zero();
      next[b][1] = active[b] ? Raw::Load(x + e[b] + 8) : Raw::Zero();
    }
  };
  const Index first = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x;
  load_step(first);
  for (Index i = first; i < total; i += step) {  // tiles: a whole warp is active or not
    typename Raw::Type cur[2][2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      cur[b][0] = next[b][0];
      cur[b][1] = next[b][1];
    }
    load_step(i + step);  // inactive (zeros) past the end
    Index e[2];
    bool active[2];
    blocks_of(i, e, active);
    uint32_t amax[2];
#pragma unroll
    for (int b = 0; b < 2; ++b) amax[b] = max(Raw::AbsMax(cur[b][0]), Raw::AbsMax(cur[b][1]));
    qcore::Nvfp4BlockScale scale[2];
    if constexpr (kTile) {
      uint32_t m = max(amax[0], amax[1]);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) m = max(m, __shfl_xor_sync(kFullMask, m, o));
      scale[0] = scale[1] = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(m), t);
    } else {
#pragma unroll
      for (int b = 0; b < 2; ++b) scale[b] = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax[b]), t);
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      if (!active[b]) continue;
      const qcore::Nvfp4BlockScale& s = scale[b];
      float y[16];
      Raw::Unpack(cur[b][0], y);
      Raw::Unpack(cur[b][1], y + 8);
      float out[16];
      uint32_t code[16];
      Nvfp4RoundRne(y, s, OutTensorScale(t, a.o), a.o.out != nullptr, code, out);
      if (a.o.codes != nullptr) {  // 16 FP4 codes: one 8-byte store, element 2k in byte k's low nibble
        uint2 w = make_uint2(0u, 0u);
#pragma unroll
        for (int m = 0; m < 8; ++m) {
          w.x |= code[m] << (4 * m);
          w.y |= code[8 + m] << (4 * m);
        }
        *reinterpret_cast<uint2*>(a.o.codes + e[b] / 2) = w;
      }
      if (a.o.out != nullptr) {
        StoreOut8(a.o.out, out_bf16, e[b], out);
        StoreOut8(a.o.out, out_bf16, e[b] + 8, out + 8);
      }
      if (a.o.scales != nullptr) a.o.scales[e[b] / 16] = static_cast<uint8_t>(s.code);
    }
  }
}

// Axis 0 (blocks of 16 down columns), rows % 16 == 0, cols even. Work item = (row
// block, column pair), column pair fastest (inner = cols / 2). A thread holds its
// two 16-element column chunks; the RHT runs down each column in registers. For
// 16x16 tiles the 8 lanes of 16 adjacent columns (aligned: cols % 16 == 0) share
// the tile amax.
template <typename InT, Rounding R, bool kTile, bool kRht, bool kAmaxOnly, typename Index>
__global__ void __launch_bounds__(kThreads) Nvfp4ColsKernel(const InT* __restrict__ x, const Nvfp4Args a) {
  constexpr bool kNarrow = std::is_same_v<Index, uint32_t>;
  using Raw = Raw2<InT>;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  qcore::Nvfp4TensorScale t{};
  if constexpr (!kAmaxOnly) {
    t = qcore::Nvfp4TensorScaleFromAmax(__ldg(a.amax_in));
    if (a.o.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.o.tensor_scale = t.s_dec;
  }
  uint32_t thread_max = 0;
  const Index cols = static_cast<Index>(a.cols);
  const Index total = static_cast<Index>(a.total);
  const Index step = static_cast<Index>(gridDim.x) * kThreads;
  for (Index base = static_cast<Index>(blockIdx.x) * kThreads; base < total; base += step) {
    const Index w = base + threadIdx.x;
    const bool active = w < total;
    Index rb, cp;
    if constexpr (kNarrow) {
      a.by_inner.fast.DivMod(w, &rb, &cp);
    } else {
      DivMod(w, a.by_inner, &rb, &cp);
    }
    const Index c0 = cp * 2;
    float in0[16], in1[16];
    typename Raw::AbsMax x_amax;  // of x: the amax of y without the RHT
    {
      typename Raw::Type raw[16];
      const InT* p = x + rb * 16 * cols + c0;
#pragma unroll
      for (int r = 0; r < 16; ++r) raw[r] = active ? Raw::Load(p + r * cols) : Raw::Zero();
      if constexpr (!kRht) {
#pragma unroll
        for (int r = 0; r < 16; ++r) x_amax.Add(raw[r]);
      }
#pragma unroll
      for (int r = 0; r < 16; ++r) Raw::Unpack(raw[r], &in0[r], &in1[r]);
    }
    float y0[16], y1[16];
    if constexpr (kRht) {
      float q0[16], q1[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        q0[r] = in0[r] * 0.25f;
        q1[r] = in1[r] * 0.25f;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        y0[j] = qcore::RhtSum(q0, j);
        y1[j] = qcore::RhtSum(q1, j);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        y0[j] = in0[j];
        y1[j] = in1[j];
      }
    }
    uint32_t amax0 = 0, amax1 = 0;
    if constexpr (kRht) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        amax0 = max(amax0, qcore::AbsBits(y0[j]));
        amax1 = max(amax1, qcore::AbsBits(y1[j]));
      }
    } else {
      amax0 = x_amax.Lo();
      amax1 = x_amax.Hi();
    }
    if constexpr (kAmaxOnly) {
      thread_max = max(thread_max, max(amax0, amax1));
      continue;
    }
    if constexpr (kTile) {
      amax0 = max(amax0, amax1);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) amax0 = max(amax0, __shfl_xor_sync(kFullMask, amax0, o));
      amax1 = amax0;
    }
    if (!active) continue;
    const qcore::Nvfp4BlockScale s0 = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax0), t);
    const qcore::Nvfp4BlockScale s1 = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax1), t);
    // Two copies of the loop, so that codes-only calls skip the value arithmetic.
    auto quantize_rows = [&](auto with_values) {
      constexpr bool kValues = decltype(with_values)::value;
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const Index i = (rb * 16 + r) * cols + c0;
        float u0 = 0.0f, u1 = 0.0f;
        if constexpr (R == Rounding::kStochastic) Uniform2(a.seed, i, &u0, &u1);
        Rounded q0, q1;
        if constexpr (R == Rounding::kNearestEven) {
          // NaN blocks selected per block (see Nvfp4ElementRne), after the rounding.
          q0 = Nvfp4ElementRne(y0[r], s0.s_b);
          q1 = Nvfp4ElementRne(y1[r], s1.s_b);
          if (qcore::IsNan(s0.s_b)) q0 = Rounded{qcore::QuietNan(), 0u};
          if (qcore::IsNan(s1.s_b)) q1 = Rounded{qcore::QuietNan(), 0u};
        } else {
          q0 = qcore::Nvfp4Element(y0[r], s0, R, u0);
          q1 = qcore::Nvfp4Element(y1[r], s1, R, u1);
        }
        if (a.o.codes != nullptr) StoreCodes2<4>(a.o.codes, i, q0.code, q1.code);
        if constexpr (kValues)
          StoreOut2(a.o.out, out_bf16, i, qcore::Nvfp4Dequant(q0.value, s0, OutTensorScale(t, a.o)),
                    qcore::Nvfp4Dequant(q1.value, s1, OutTensorScale(t, a.o)));
      }
    };
    if (a.o.out != nullptr) quantize_rows(std::true_type{});
    else quantize_rows(std::false_type{});
    if (a.o.scales != nullptr)
      *reinterpret_cast<uint16_t*>(a.o.scales + rb * cols + c0) = static_cast<uint16_t>(s0.code | (s1.code << 8));
  }
  if constexpr (kAmaxOnly) CtaMaxToGlobal(thread_max, a.amax_out);
}

// Generic NVFP4 (axis 0 with an odd column count; 1x16 only, since a 16x16 tile
// needs cols % 16 == 0). Pass 1: one thread per (row block, column) writes y (the
// RHT down its column, or x) as fp32 to a temporary, row-major.
template <typename InT>
__global__ void __launch_bounds__(kThreads) Nvfp4GenericYKernel(const InT* __restrict__ x, int64_t rows, int64_t cols,
                                                                bool rht, float* __restrict__ y) {
  const int64_t work = rows / 16 * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < work; w += step) {
    const int64_t rb = w / cols, col = w - rb * cols;
    float in[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) in[r] = Load1(x + (rb * 16 + r) * cols + col);
#pragma unroll
    for (int j = 0; j < 16; ++j) y[(rb * 16 + j) * cols + col] = rht ? qcore::RhtOutput(in, j) : in[j];
  }
}

// Pass 2: one thread per (row block, column) writes the block's E4M3 scale byte.
__global__ void __launch_bounds__(kThreads) Nvfp4GenericScalesKernel(const float* __restrict__ y, const Nvfp4Args a,
                                                                     uint8_t* __restrict__ scales) {
  const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(__ldg(a.amax_in));
  const int64_t work = a.rows / 16 * a.cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < work; w += step) {
    const int64_t rb = w / a.cols, col = w - rb * a.cols;
    uint32_t amax = 0;
    for (int r = 0; r < 16; ++r) amax = max(amax, qcore::AbsBits(__ldg(y + (rb * 16 + r) * a.cols + col)));
    scales[w] = static_cast<uint8_t>(qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax), t).code);
  }
}

// Pass 3: one thread per pair of elements in row-major order (one writer per byte).
template <Rounding R>
__global__ void __launch_bounds__(kThreads) Nvfp4GenericElementsKernel(const float* __restrict__ y, const Nvfp4Args a,
                                                                       const uint8_t* __restrict__ scales) {
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(__ldg(a.amax_in));
  if (a.o.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.o.tensor_scale = t.s_dec;
  const int64_t count = a.rows * a.cols;
  const int64_t pairs = (count + 1) / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < pairs; p += step) {
    uint32_t code[2] = {0, 0};
    const int halves = 2 * p + 1 < count ? 2 : 1;
    for (int h = 0; h < halves; ++h) {
      const int64_t i = 2 * p + h;
      const int64_t row = i / a.cols, col = i - row * a.cols;
      const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromCode(scales[(row / 16) * a.cols + col], t);
      const float u = R == Rounding::kStochastic ? PhiloxUniform(a.seed, static_cast<uint64_t>(i)) : 0.0f;
      const Rounded q = qcore::Nvfp4Element(__ldg(y + i), s, R, u);
      code[h] = q.code;
      if (a.o.out != nullptr) StoreOut1(a.o.out, out_bf16, i, qcore::Nvfp4Dequant(q.value, s, OutTensorScale(t, a.o)));
    }
    if (a.o.codes != nullptr) a.o.codes[p] = static_cast<uint8_t>(code[0] | (code[1] << 4));
  }
}

// ============================================================================
// Kernels: tensor amax, per-tensor FP8, BF16
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

// Per-tensor FP8, elementwise in units of 8 (two per thread per step, loads first),
// plus a scalar tail for count % 8.
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
      float out[8];
      uint32_t code[8];
      if constexpr (KEEL_HW_FP8 && R == Rounding::kNearestEven) {
        // Fp8Element with the conversion in hardware. Saturation covers |x * scale|
        // at or above max_normal, Inf included, as RoundElem's clamp does; -0 keeps
        // its code 0x80 here (no zero rule for per-tensor FP8). A NaN x gets the
        // reference's code, its own sign with the NaN code, by a select; its value
        // (NaN code value times 1 / scale) is the GPU's canonical NaN either way.
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          const uint32_t pair = HwFp8x2<F>(v[u][e] * s.scale, v[u][e + 1] * s.scale);
          code[e] = pair & 0xFFu;
          code[e + 1] = pair >> 8;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (qcore::IsNan(v[u][e + h])) code[e + h] = ((qcore::AsBits(v[u][e + h]) >> 24) & 0x80u) | c.nan_code;
          }
          if (o.out != nullptr) {
            const float2 q = HwFp8x2Value<F>(code[e] | (code[e + 1] << 8));
            out[e] = q.x * s_out.inv;
            out[e + 1] = q.y * s_out.inv;
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const Rounded r = qcore::Fp8Element(v[u][e], s_out, c, R, uni[e]);
          out[e] = r.value;
          code[e] = r.code;
        }
      }
      if (o.codes != nullptr) StoreCodes8<8>(o.codes, unit * 8, code);
      if (o.out != nullptr) StoreOut8(o.out, out_bf16, unit * 8, out);
    }
  }
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i = units * 8 + tid; i < count; i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float u = R == Rounding::kStochastic ? PhiloxUniform(seed, static_cast<uint64_t>(i)) : 0.0f;
    const Rounded r = qcore::Fp8Element(Load1(x + i), s_out, c, R, u);
    if (o.codes != nullptr) o.codes[i] = static_cast<uint8_t>(r.code);
    if (o.out != nullptr) StoreOut1(o.out, out_bf16, i, r.value);
  }
}

// BF16 rounding, elementwise like Fp8Kernel. codes: the bf16 bits, 2 bytes each.
template <typename InT, Rounding R>
__global__ void __launch_bounds__(kThreads) Bf16Kernel(const InT* __restrict__ x, int64_t count, uint64_t seed,
                                                       const DeviceOutputs o) {
  constexpr int kUnits = 2;
  const bool out_bf16 = o.out_dtype == DType::kBF16;
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
      uint32_t b[8];
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        b[e] = qcore::Bf16Round(v[u][e], R, uni[e]);
        out[e] = qcore::Bf16Value(static_cast<uint16_t>(b[e]));
      }
      if (o.codes != nullptr) {
        *reinterpret_cast<uint4*>(o.codes + unit * 16) =
            make_uint4(b[0] | (b[1] << 16), b[2] | (b[3] << 16), b[4] | (b[5] << 16), b[6] | (b[7] << 16));
      }
      if (o.out != nullptr) StoreOut8(o.out, out_bf16, unit * 8, out);
    }
  }
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i = units * 8 + tid; i < count; i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float u = R == Rounding::kStochastic ? PhiloxUniform(seed, static_cast<uint64_t>(i)) : 0.0f;
    const uint16_t b = qcore::Bf16Round(Load1(x + i), R, u);
    if (o.codes != nullptr) reinterpret_cast<uint16_t*>(o.codes)[i] = b;
    if (o.out != nullptr) StoreOut1(o.out, out_bf16, i, qcore::Bf16Value(b));
  }
}

// ============================================================================
// Launchers
// ============================================================================

Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  return Status::Error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                       cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

// Evaluates a CUDA runtime call; on failure returns a Status naming the call, the
// file and the line from the enclosing function.
#define KEEL_CUDA_CHECK(call)                                                  \
  do {                                                                         \
    const cudaError_t keel_cuda_error_ = (call);                               \
    if (keel_cuda_error_ != cudaSuccess)                                       \
      return CudaError(keel_cuda_error_, #call, __FILE__, __LINE__);           \
  } while (0)

// KEEL_RETURN_IF_ERROR comes from kernels/base/status.h.

// Resident CTAs per SM for each kernel, per device (cudaOccupancy... is cheap but
// not free, and launchers run every training step).
std::mutex g_occupancy_mutex;
std::map<std::pair<const void*, int>, int> g_occupancy;  // guarded by g_occupancy_mutex
std::map<int, int> g_sm_count;                           // guarded by g_occupancy_mutex

// Launches kernel<<<grid, kThreads, 0, stream>>>(args...) with grid = the CTAs
// needed, at most the CTAs the GPU holds at once (the kernels loop grid-stride).
template <typename... KernelArgs, typename... Args>
Status Launch(void (*kernel)(KernelArgs...), int64_t ctas_needed, cudaStream_t stream, Args&&... args) {
  int device = 0;
  KEEL_CUDA_CHECK(cudaGetDevice(&device));
  int resident = 0;
  {
    std::lock_guard<std::mutex> lock(g_occupancy_mutex);
    auto sm = g_sm_count.find(device);
    if (sm == g_sm_count.end()) {
      int count = 0;
      KEEL_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
      sm = g_sm_count.emplace(device, count).first;
    }
    const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
    auto found = g_occupancy.find(key);
    if (found == g_occupancy.end()) {
      int per_sm = 0;
      KEEL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
      found = g_occupancy.emplace(key, std::max(per_sm, 1)).first;
    }
    resident = found->second * sm->second;
  }
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(ctas_needed, resident));
  kernel<<<static_cast<unsigned int>(grid), kThreads, 0, stream>>>(std::forward<Args>(args)...);
  KEEL_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A temporary from the stream's memory pool, freed in stream order when it goes.
class StreamBuffer {
 public:
  explicit StreamBuffer(cudaStream_t stream) : stream_(stream) {}
  ~StreamBuffer() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);  // errors surface at the next check
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  Status Allocate(size_t bytes) {
    KEEL_CUDA_CHECK(cudaMallocAsync(&ptr_, std::max<size_t>(bytes, 16), stream_));
    return Status::Ok();
  }
  template <typename T> T* get() const { return static_cast<T*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// Compile-time dispatch of the runtime choices.
template <typename Fn>
Status WithInput(DType dtype, Fn&& fn) {
  return dtype == DType::kF32 ? fn(float{}) : fn(uint16_t{});
}
template <ElemFormat F> using ElemTag = std::integral_constant<ElemFormat, F>;
template <typename Fn>
Status WithElem(ElemFormat format, Fn&& fn) {
  switch (format) {
    case ElemFormat::kE4M3: return fn(ElemTag<ElemFormat::kE4M3>{});
    case ElemFormat::kE5M2: return fn(ElemTag<ElemFormat::kE5M2>{});
    case ElemFormat::kE3M2: return fn(ElemTag<ElemFormat::kE3M2>{});
    case ElemFormat::kE2M3: return fn(ElemTag<ElemFormat::kE2M3>{});
    case ElemFormat::kE2M1: return fn(ElemTag<ElemFormat::kE2M1>{});
  }
  return Status::Error("format: unknown element format");
}
template <Rounding R> using RoundTag = std::integral_constant<Rounding, R>;
template <typename Fn>
Status WithRounding(Rounding rounding, Fn&& fn) {
  switch (rounding) {
    case Rounding::kNearestEven: return fn(RoundTag<Rounding::kNearestEven>{});
    case Rounding::kNearestAway: return fn(RoundTag<Rounding::kNearestAway>{});
    case Rounding::kStochastic: return fn(RoundTag<Rounding::kStochastic>{});
  }
  return Status::Error("rounding: unknown rounding mode");
}
// NVFP4 rounds to nearest even or stochastically (ValidateNvfp4 refuses the rest).
template <typename Fn>
Status WithNvfp4Rounding(Rounding rounding, Fn&& fn) {
  if (rounding == Rounding::kStochastic) return fn(RoundTag<Rounding::kStochastic>{});
  return fn(RoundTag<Rounding::kNearestEven>{});
}
template <bool B> using BoolTag = std::integral_constant<bool, B>;
template <typename Fn>
Status WithBool(bool value, Fn&& fn) {
  return value ? fn(BoolTag<true>{}) : fn(BoolTag<false>{});
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Checks the pointers every entry point shares. `scales_allowed` and
// `tensor_scale_allowed` say which outputs the quantizer has.
Status CheckIo(const void* x, DType x_dtype, const DeviceOutputs& o, bool scales_allowed,
               bool tensor_scale_allowed, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  if (x == nullptr) return Status::Error(prefix + "x: null; need a device pointer");
  if (x_dtype != DType::kF32 && x_dtype != DType::kBF16)
    return Status::Error(prefix + "x_dtype: " + std::to_string(static_cast<int>(x_dtype)) +
                         " is not allowed; use DType::kF32 or DType::kBF16");
  if (o.out != nullptr && o.out_dtype != DType::kF32 && o.out_dtype != DType::kBF16)
    return Status::Error(prefix + "outputs.out_dtype: " + std::to_string(static_cast<int>(o.out_dtype)) +
                         " is not allowed; use DType::kF32 or DType::kBF16");
  if (!scales_allowed && o.scales != nullptr)
    return Status::Error(prefix + "outputs.scales: must be null; this format has no block scales");
  if (!tensor_scale_allowed && o.tensor_scale != nullptr)
    return Status::Error(prefix + "outputs.tensor_scale: must be null; this format has no tensor scale");
  const std::pair<const void*, const char*> pointers[] = {
      {x, "x"}, {o.out, "outputs.out"}, {o.codes, "outputs.codes"}, {o.scales, "outputs.scales"}};
  for (const auto& p : pointers) {
    if (p.first != nullptr && !Aligned16(p.first))
      return Status::Error(prefix + p.second + ": not 16-byte aligned; the kernels load and store 16 bytes at a time");
  }
  return Status::Ok();
}

Status CheckCount(int64_t count, const char* what) {
  if (count < 1 || count > (int64_t{1} << 40))
    return Status::Error(std::string(what) + ": count: " + std::to_string(count) +
                         " is not allowed; need 1..2^40");
  return Status::Ok();
}

// ---- MX ----

Status LaunchMx(const void* x, DType x_dtype, int64_t rows, int64_t cols, const MxOptions& options,
                const DeviceOutputs& o, cudaStream_t stream) {
  const int block = options.block;
  const int lanes = block / 8;
  const bool rows_fast = options.axis == 1 && cols % 8 == 0 && block % 8 == 0 && lanes <= 32 &&
                         (lanes & (lanes - 1)) == 0;
  const bool cols_fast = options.axis == 0 && block == 32 && cols % 2 == 0;
  if (rows_fast) {
    MxRowsArgs a{};
    a.rows = rows;
    a.cols = cols;
    a.blocks_per_row = CeilDiv(cols, block);
    a.units_per_row = cols / 8;
    a.padded_units = a.blocks_per_row * lanes;
    a.lanes = lanes;
    a.lane_shift = 0;
    while ((1 << a.lane_shift) < lanes) ++a.lane_shift;
    a.total = rows * a.padded_units;
    a.by_padded = MakeIndexDiv(a.padded_units, a.total);
    a.seed = options.seed;
    a.o = o;
    const bool dense = cols % block == 0 && rows * cols < (int64_t{1} << 31);
    const int64_t ctas = CeilDiv(a.total, kThreads * 2);
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return WithElem(options.elem, [&](auto fmt) {
        return WithRounding(options.rounding, [&](auto rnd) {
          return WithBool(options.bump_exponent, [&](auto bump) {
            return WithBool(dense, [&](auto d) {
              return Launch(MxRowsKernel<InT, decltype(fmt)::value, decltype(rnd)::value, decltype(bump)::value,
                                         decltype(d)::value>,
                            ctas, stream, static_cast<const InT*>(x), a);
            });
          });
        });
      });
    });
  }
  if (cols_fast) {
    MxColsArgs a{};
    a.rows = rows;
    a.cols = cols;
    a.total = CeilDiv(rows, 32) * (cols / 2);
    a.by_pairs = MakeIndexDiv(cols / 2, a.total);
    a.prefetch = 0;  // off: slower on the H200 (see MxColsKernel)
    a.bump = options.bump_exponent;
    a.seed = options.seed;
    a.o = o;
    const bool dense = rows % 32 == 0 && rows * cols < (int64_t{1} << 31);
    const int64_t ctas = CeilDiv(a.total, kThreads);
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return WithElem(options.elem, [&](auto fmt) {
        return WithRounding(options.rounding, [&](auto rnd) {
          return WithBool(dense, [&](auto d) {
            return Launch(MxColsKernel<InT, decltype(fmt)::value, decltype(rnd)::value, 32, decltype(d)::value>, ctas,
                          stream, static_cast<const InT*>(x), a);
          });
        });
      });
    });
  }
  // Generic: scale bytes first (into outputs.scales, or a temporary), then elements.
  MxGenericArgs a{};
  a.rows = rows;
  a.cols = cols;
  a.count = rows * cols;
  a.axis = options.axis;
  a.block = block;
  a.blocks_per_line = CeilDiv(options.axis == 1 ? cols : rows, block);
  a.blocks = MxScaleCount(rows, cols, block, options.axis);
  a.c = qcore::ConstsOf(options.elem);
  a.bump = options.bump_exponent;
  a.seed = options.seed;
  a.o = o;
  StreamBuffer temp(stream);
  a.scales = o.scales;
  if (a.scales == nullptr) {
    KEEL_RETURN_IF_ERROR(temp.Allocate(static_cast<size_t>(a.blocks)));
    a.scales = temp.get<uint8_t>();
  }
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    const InT* xin = static_cast<const InT*>(x);
    KEEL_RETURN_IF_ERROR(Launch(MxGenericScalesKernel<InT>, CeilDiv(a.blocks, kThreads), stream, xin, a));
    return WithRounding(options.rounding, [&](auto rnd) {
      return Launch(MxGenericElementsKernel<InT, decltype(rnd)::value>, CeilDiv(CeilDiv(a.count, 2), kThreads),
                    stream, xin, a);
    });
  });
}

// ---- NVFP4 ----

// The amax pass: max |y| over the tensor into *amax (which it zeroes first).
Status LaunchNvfp4Amax(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                       float* amax, cudaStream_t stream) {
  unsigned int* amax_bits = reinterpret_cast<unsigned int*>(amax);
  KEEL_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  const int64_t count = rows * cols;
  if (!options.rht) {  // the RHT aside, the amax is over x in any order
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return Launch(AmaxKernel<InT, false>, CeilDiv(CeilDiv(count, 8), kThreads), stream,
                    static_cast<const InT*>(x), count, amax_bits);
    });
  }
  Nvfp4Args a{};
  a.rows = rows;
  a.cols = cols;
  a.amax_out = amax_bits;
  if (options.axis == 1) {
    a.total = count / 8;
    a.by_inner = MakeIndexDiv(cols / 8, a.total);
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return Launch(Nvfp4RowsKernel<InT, Rounding::kNearestEven, false, true, true>,
                    CeilDiv(a.total, kThreads * 2), stream, static_cast<const InT*>(x), a);
    });
  }
  if (cols % 2 == 0) {
    a.total = rows / 16 * (cols / 2);
    a.by_inner = MakeIndexDiv(cols / 2, a.total);
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return Launch(Nvfp4ColsKernel<InT, Rounding::kNearestEven, false, true, true, int64_t>, CeilDiv(a.total, kThreads),
                    stream, static_cast<const InT*>(x), a);
    });
  }
  // Odd column count: materialise y, then a plain max over it.
  StreamBuffer y(stream);
  KEEL_RETURN_IF_ERROR(y.Allocate(static_cast<size_t>(count) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return Launch(Nvfp4GenericYKernel<InT>, CeilDiv(rows / 16 * cols, kThreads), stream,
                  static_cast<const InT*>(x), rows, cols, true, y.get<float>());
  }));
  return Launch(AmaxKernel<float, false>, CeilDiv(CeilDiv(count, 8), kThreads), stream,
                static_cast<const float*>(y.get<float>()), count, amax_bits);
}

Status LaunchNvfp4(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                   const float* amax, const DeviceOutputs& o, cudaStream_t stream) {
  StreamBuffer amax_temp(stream);
  if (amax == nullptr) {
    KEEL_RETURN_IF_ERROR(amax_temp.Allocate(sizeof(float)));
    KEEL_RETURN_IF_ERROR(LaunchNvfp4Amax(x, x_dtype, rows, cols, options, amax_temp.get<float>(), stream));
    amax = amax_temp.get<float>();
  }
  Nvfp4Args a{};
  a.rows = rows;
  a.cols = cols;
  a.blocks_per_row = cols / 16;
  a.seed = options.seed;
  a.amax_in = amax;
  a.o = o;
  // Nearest even without RHT: one thread per block (tiles need cols % 64 == 0).
  const bool tile = options.tile_16x16;
  if (options.axis == 1 && !options.rht && options.rounding == Rounding::kNearestEven && (!tile || cols % 64 == 0)) {
    // Two blocks per thread item: 16x16, rows % 16 == 0 and a warp's items are 4
    // whole tiles; 1x16, items run to whole CTA steps and blocks past the end idle.
    a.total = tile ? rows * cols / 32 : CeilDiv(rows * cols / 16, 2 * kThreads) * kThreads;
    const bool narrow = rows * cols < (int64_t{1} << 31);
    if (tile) a.by_inner = MakeIndexDiv(cols / 64, a.total / 32);  // warp -> (band, group of 4 tiles)
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return WithBool(tile, [&](auto tile_tag) {
        constexpr bool kTile = decltype(tile_tag)::value;
        auto kernel = narrow ? Nvfp4RowsRneKernel<InT, kTile, uint32_t> : Nvfp4RowsRneKernel<InT, kTile, int64_t>;
        return Launch(kernel, CeilDiv(a.total, kThreads), stream, static_cast<const InT*>(x), a);
      });
    });
  }
  if (options.axis == 1) {
    a.total = rows * cols / 8;
    // 16x16: one warp (32 units) per tile, tiles numbered band by band.
    a.by_inner = options.tile_16x16 ? MakeIndexDiv(cols / 16, a.total / 32) : MakeIndexDiv(cols / 8, a.total);
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return WithNvfp4Rounding(options.rounding, [&](auto rnd) {
        return WithBool(options.tile_16x16, [&](auto tile) {
          return WithBool(options.rht, [&](auto rht) {
            return Launch(Nvfp4RowsKernel<InT, decltype(rnd)::value, decltype(tile)::value, decltype(rht)::value, false>,
                          CeilDiv(a.total, kThreads * 2), stream, static_cast<const InT*>(x), a);
          });
        });
      });
    });
  }
  if (cols % 2 == 0) {
    a.total = rows / 16 * (cols / 2);
    a.by_inner = MakeIndexDiv(cols / 2, a.total);
    const bool narrow = rows * cols < (int64_t{1} << 31);  // 32-bit element indices
    return WithInput(x_dtype, [&](auto in) {
      using InT = decltype(in);
      return WithNvfp4Rounding(options.rounding, [&](auto rnd) {
        return WithBool(options.tile_16x16, [&](auto tile) {
          return WithBool(options.rht, [&](auto rht) {
            return WithBool(narrow, [&](auto n) {
              using Index = std::conditional_t<decltype(n)::value, uint32_t, int64_t>;
              return Launch(Nvfp4ColsKernel<InT, decltype(rnd)::value, decltype(tile)::value, decltype(rht)::value,
                                            false, Index>,
                            CeilDiv(a.total, kThreads), stream, static_cast<const InT*>(x), a);
            });
          });
        });
      });
    });
  }
  // Odd column count (1x16 down columns): y to a temporary, scales, then elements.
  const int64_t count = rows * cols;
  StreamBuffer y(stream), scale_temp(stream);
  KEEL_RETURN_IF_ERROR(y.Allocate(static_cast<size_t>(count) * sizeof(float)));
  uint8_t* scales = o.scales;
  if (scales == nullptr) {
    KEEL_RETURN_IF_ERROR(scale_temp.Allocate(static_cast<size_t>(rows / 16 * cols)));
    scales = scale_temp.get<uint8_t>();
  }
  const int64_t ctas = CeilDiv(rows / 16 * cols, kThreads);
  KEEL_RETURN_IF_ERROR(WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return Launch(Nvfp4GenericYKernel<InT>, ctas, stream, static_cast<const InT*>(x), rows, cols,
                  options.rht, y.get<float>());
  }));
  const float* y_in = y.get<float>();
  KEEL_RETURN_IF_ERROR(Launch(Nvfp4GenericScalesKernel, ctas, stream, y_in, a, scales));
  const uint8_t* scales_in = scales;
  return WithNvfp4Rounding(options.rounding, [&](auto rnd) {
    return Launch(Nvfp4GenericElementsKernel<decltype(rnd)::value>, CeilDiv(CeilDiv(count, 2), kThreads),
                  stream, y_in, a, scales_in);
  });
}

}  // namespace

// ============================================================================
// Device-pointer API (quantize_cuda.h)
// ============================================================================

Status MxQuantizeCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, const MxOptions& options,
                      const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(ValidateMx(rows, cols, options));
  KEEL_RETURN_IF_ERROR(CheckIo(x, x_dtype, outputs, true, false, "MxQuantizeCuda"));
  return LaunchMx(x, x_dtype, rows, cols, options, outputs, static_cast<cudaStream_t>(stream));
}

Status Nvfp4AmaxCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                     float* amax, void* stream) {
  KEEL_RETURN_IF_ERROR(ValidateNvfp4(rows, cols, options));
  KEEL_RETURN_IF_ERROR(CheckIo(x, x_dtype, DeviceOutputs{}, false, false, "Nvfp4AmaxCuda"));
  if (amax == nullptr) return Status::Error("Nvfp4AmaxCuda: amax: null; need a device float");
  return LaunchNvfp4Amax(x, x_dtype, rows, cols, options, amax, static_cast<cudaStream_t>(stream));
}

Status Nvfp4QuantizeCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                         const float* amax, const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(ValidateNvfp4(rows, cols, options));
  KEEL_RETURN_IF_ERROR(CheckIo(x, x_dtype, outputs, true, true, "Nvfp4QuantizeCuda"));
  return LaunchNvfp4(x, x_dtype, rows, cols, options, amax, outputs, static_cast<cudaStream_t>(stream));
}

Status Fp8TensorAmaxCuda(const void* x, DType x_dtype, int64_t count, float* amax, void* stream) {
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Fp8TensorAmaxCuda"));
  KEEL_RETURN_IF_ERROR(CheckIo(x, x_dtype, DeviceOutputs{}, false, false, "Fp8TensorAmaxCuda"));
  if (amax == nullptr) return Status::Error("Fp8TensorAmaxCuda: amax: null; need a device float");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  KEEL_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return Launch(AmaxKernel<InT, true>, CeilDiv(CeilDiv(count, 8), kThreads), s, static_cast<const InT*>(x),
                  count, reinterpret_cast<unsigned int*>(amax));
  });
}

Status Fp8TensorQuantizeCuda(const void* x, DType x_dtype, int64_t count, ElemFormat elem, Rounding rounding,
                             uint64_t seed, const float* amax, const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Fp8TensorQuantizeCuda"));
  if (elem != ElemFormat::kE4M3 && elem != ElemFormat::kE5M2)
    return Status::Error(std::string("Fp8TensorQuantizeCuda: elem: ") + Spec(elem).name +
                         " is not allowed for per-tensor FP8; use e4m3 or e5m2");
  KEEL_RETURN_IF_ERROR(CheckIo(x, x_dtype, outputs, false, true, "Fp8TensorQuantizeCuda"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  StreamBuffer amax_temp(s);
  if (amax == nullptr) {
    KEEL_RETURN_IF_ERROR(amax_temp.Allocate(sizeof(float)));
    KEEL_RETURN_IF_ERROR(Fp8TensorAmaxCuda(x, x_dtype, count, amax_temp.get<float>(), stream));
    amax = amax_temp.get<float>();
  }
  const int64_t ctas = CeilDiv(CeilDiv(count, 8), kThreads * 2);
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return WithRounding(rounding, [&](auto rnd) {
      if (elem == ElemFormat::kE4M3)
        return Launch(Fp8Kernel<InT, ElemFormat::kE4M3, decltype(rnd)::value>, ctas, s,
                      static_cast<const InT*>(x), count, amax, seed, outputs);
      return Launch(Fp8Kernel<InT, ElemFormat::kE5M2, decltype(rnd)::value>, ctas, s,
                    static_cast<const InT*>(x), count, amax, seed, outputs);
    });
  });
}

Status Bf16QuantizeCuda(const void* x, DType x_dtype, int64_t count, Rounding rounding, uint64_t seed,
                        const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Bf16QuantizeCuda"));
  KEEL_RETURN_IF_ERROR(CheckIo(x, x_dtype, outputs, false, false, "Bf16QuantizeCuda"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t ctas = CeilDiv(CeilDiv(count, 8), kThreads * 2);
  return WithInput(x_dtype, [&](auto in) {
    using InT = decltype(in);
    return WithRounding(rounding, [&](auto rnd) {
      return Launch(Bf16Kernel<InT, decltype(rnd)::value>, ctas, s, static_cast<const InT*>(x), count, seed,
                    outputs);
    });
  });
}

// ============================================================================
// Device memory helpers (quantize_cuda.h)
// ============================================================================

Status CudaMalloc(void** device_ptr, size_t bytes) {
  if (device_ptr == nullptr) return Status::Error("CudaMalloc: device_ptr: null");
  KEEL_CUDA_CHECK(cudaMalloc(device_ptr, bytes));
  return Status::Ok();
}

Status CudaFree(void* device_ptr) {
  KEEL_CUDA_CHECK(cudaFree(device_ptr));
  return Status::Ok();
}

Status CudaMemcpyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  KEEL_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CudaMemcpyToHost(void* host_dst, const void* device_src, size_t bytes) {
  KEEL_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status CudaMemset(void* device_ptr, int byte, size_t bytes) {
  KEEL_CUDA_CHECK(cudaMemset(device_ptr, byte, bytes));
  return Status::Ok();
}

Status CudaSynchronize() {
  KEEL_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status CudaDeviceDescription(std::string* text) {
  int device = 0;
  KEEL_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  KEEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  *text = std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
          std::to_string(prop.multiProcessorCount) + " SMs";
  return Status::Ok();
}

// ============================================================================
// QuantizeCuda (quantizer.h): host arrays in and out
// ============================================================================

namespace {

// cudaMalloc'd memory, freed when it goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status Allocate(size_t bytes) {
    KEEL_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)));
    bytes_ = bytes;
    return Status::Ok();
  }
  template <typename T> T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

Status CopyToHost(const DeviceBuffer& from, std::vector<uint8_t>* to) {
  to->resize(from.bytes());
  if (from.bytes() > 0) KEEL_CUDA_CHECK(cudaMemcpy(to->data(), from.get<void>(), from.bytes(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

}  // namespace

Status QuantizeCuda(const QuantRequest& request, const float* x, QuantResult* result) {
  KEEL_RETURN_IF_ERROR(ValidateRequest(request));
  if (x == nullptr) return Status::Error("QuantizeCuda: x: null; need rows x cols floats");
  if (result == nullptr) return Status::Error("QuantizeCuda: result: null");
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear it: the caller may fall back to the CPU
    return Status::Error(std::string("no CUDA GPU visible: ") +
                         (probe != cudaSuccess ? cudaGetErrorString(probe) : "cudaGetDeviceCount found none"));
  }

  const int64_t count = request.rows * request.cols;
  const bool bf16 = request.format == QuantFormat::kBf16;
  const bool mx = IsMx(request.format);
  const bool nvfp4 = request.format == QuantFormat::kNvfp4;
  const ElemFormat elem = ElementOf(request.format);
  size_t code_bytes = static_cast<size_t>(count);
  if (bf16) code_bytes = static_cast<size_t>(count) * 2;
  else if (Spec(elem).bits == 4) code_bytes = static_cast<size_t>((count + 1) / 2);
  size_t scale_bytes = 0;
  if (mx) scale_bytes = static_cast<size_t>(MxScaleCount(request.rows, request.cols, request.block, request.axis));
  if (nvfp4) scale_bytes = static_cast<size_t>(MxScaleCount(request.rows, request.cols, 16, request.axis));
  const bool has_tensor_scale = !mx && !bf16;

  DeviceBuffer d_x, d_out, d_codes, d_scales, d_tensor_scale;
  KEEL_RETURN_IF_ERROR(d_x.Allocate(static_cast<size_t>(count) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(d_out.Allocate(static_cast<size_t>(count) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(d_codes.Allocate(code_bytes));
  if (scale_bytes > 0) KEEL_RETURN_IF_ERROR(d_scales.Allocate(scale_bytes));
  if (has_tensor_scale) KEEL_RETURN_IF_ERROR(d_tensor_scale.Allocate(sizeof(float)));
  KEEL_CUDA_CHECK(cudaMemcpy(d_x.get<void>(), x, static_cast<size_t>(count) * sizeof(float), cudaMemcpyHostToDevice));

  DeviceOutputs o;
  o.out = d_out.get<void>();
  o.out_dtype = DType::kF32;
  o.codes = d_codes.get<uint8_t>();
  o.scales = scale_bytes > 0 ? d_scales.get<uint8_t>() : nullptr;
  o.tensor_scale = has_tensor_scale ? d_tensor_scale.get<float>() : nullptr;
  cudaStream_t stream = nullptr;  // the legacy default stream: cudaMemcpy below waits for it
  if (bf16) {
    KEEL_RETURN_IF_ERROR(
        Bf16QuantizeCuda(d_x.get<void>(), DType::kF32, count, request.rounding, request.seed, o, stream));
  } else if (mx) {
    KEEL_RETURN_IF_ERROR(MxQuantizeCuda(d_x.get<void>(), DType::kF32, request.rows, request.cols,
                                        MxOptionsOf(request), o, stream));
  } else if (nvfp4) {
    KEEL_RETURN_IF_ERROR(Nvfp4QuantizeCuda(d_x.get<void>(), DType::kF32, request.rows, request.cols,
                                           Nvfp4OptionsOf(request), nullptr, o, stream));
  } else {
    KEEL_RETURN_IF_ERROR(Fp8TensorQuantizeCuda(d_x.get<void>(), DType::kF32, count, elem, request.rounding,
                                               request.seed, nullptr, o, stream));
  }
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream));

  QuantResult r;
  r.out.resize(static_cast<size_t>(count));
  KEEL_CUDA_CHECK(cudaMemcpy(r.out.data(), d_out.get<void>(), static_cast<size_t>(count) * sizeof(float),
                             cudaMemcpyDeviceToHost));
  KEEL_RETURN_IF_ERROR(CopyToHost(d_codes, &r.packed_codes));
  if (scale_bytes > 0) KEEL_RETURN_IF_ERROR(CopyToHost(d_scales, &r.scales));
  if (has_tensor_scale) {
    r.has_tensor_scale = true;
    KEEL_CUDA_CHECK(cudaMemcpy(&r.tensor_scale, d_tensor_scale.get<void>(), sizeof(float), cudaMemcpyDeviceToHost));
  }
  *result = std::move(r);
  return Status::Ok();
}

}  // namespace keel
