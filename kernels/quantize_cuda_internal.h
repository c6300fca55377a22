// Internals shared by the CUDA quantizers' compilation units: the device helpers
// every kernel uses (loads, stores, reductions; the rounding arithmetic itself is
// in quant_core.h and quant_core_rne.h) and the launch helpers (error checks,
// occupancy-sized grids, stream-ordered temporaries, compile-time dispatch of
// runtime choices).
// Only the quantize_cuda*.cu files (and the CUDA backend's statistics, for
// AddCounts) include this (it needs the CUDA headers); the public API is
// quantize_cuda.h.
//
// The compilation units, one per format family, each with its kernels first and
// then their launchers:
//   quantize_cuda.cu        the shared launch helpers, device memory helpers and
//                           QuantizeCuda (quantizer.h) for host arrays
//   quantize_cuda_mx.cu     MX block formats (MxQuantizeCuda)
//   quantize_cuda_nvfp4.cu  NVFP4, 1x16 blocks or 16x16 tiles, optional RHT
//   quantize_cuda_fp8.cu    tensor amax, per-tensor FP8 and BF16
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
#ifndef KEEL_KERNELS_QUANTIZE_CUDA_INTERNAL_H_
#define KEEL_KERNELS_QUANTIZE_CUDA_INTERNAL_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/base/status.h"
#include "kernels/cuda_status.h"
#include "kernels/formats.h"
#include "kernels/quant_core.h"
#include "kernels/quant_core_rne.h"
#include "kernels/quantize_cuda.h"

namespace keel {
namespace qcuda {

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
// A pair of rounded elements into code[0..1] and out[0..1].
__device__ __forceinline__ void PutPair(const Rounded& q0, const Rounded& q1, uint32_t* code, float* out) {
  code[0] = q0.code;
  code[1] = q1.code;
  out[0] = q0.value;
  out[1] = q1.value;
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
// The uniforms of elements i, i + 1 (row r) and i + cols, i + cols + 1 (row r + 1)
// into u[0..3], for a column-pair lane whose neighbour (lane ^ 1) holds the other
// half of the same 4-column Philox group in the same rows: cols % 4 == 0, i even,
// column pairs 2k and 2k + 1 on lanes 2k' and 2k' + 1. One Philox call gives the
// draws of 4 consecutive elements, so rather than each lane drawing a group per row
// and using half of it, the even lane draws row r's group and the odd lane row
// r + 1's, and each passes the other the half it needs: one call per two rows, not
// two (the same draws: each element's still comes from group index / 4, word
// index % 4). Both lanes of the pair must call it.
__device__ __forceinline__ void Uniform2x2Paired(uint64_t seed, int64_t i, int64_t cols, float u[4]) {
  const unsigned lane = threadIdx.x & 31u;
  const bool odd = (lane & 1u) != 0;
  float g[4];
  qcore::PhiloxUniform4(seed, static_cast<uint64_t>(odd ? i + cols : i) >> 2, g);
  // Even lane (columns 4k, 4k + 1): keeps words 0-1 of row r, sends words 2-3 of
  // row r; odd lane (columns 4k + 2, 4k + 3): keeps words 2-3 of row r + 1, sends
  // words 0-1 of row r + 1.
  const unsigned pair_mask = 3u << (lane & 30u);
  const float got0 = __shfl_xor_sync(pair_mask, odd ? g[0] : g[2], 1);
  const float got1 = __shfl_xor_sync(pair_mask, odd ? g[1] : g[3], 1);
  u[0] = odd ? got0 : g[0];
  u[1] = odd ? got1 : g[1];
  u[2] = odd ? g[2] : got0;
  u[3] = odd ? g[3] : got1;
}
// The same without the neighbour (any even cols): two calls.
__device__ __forceinline__ void Uniform2x2(uint64_t seed, int64_t i, int64_t cols, bool paired, float u[4]) {
  if (paired) {
    Uniform2x2Paired(seed, i, cols, u);
  } else {
    Uniform2(seed, i, &u[0], &u[1]);
    Uniform2(seed, i + cols, &u[2], &u[3]);
  }
}
// The uniforms of elements i .. i + 7 for i a multiple of 8.
__device__ __forceinline__ void Uniform8(uint64_t seed, int64_t i, float u[8]) {
  qcore::PhiloxUniform4(seed, static_cast<uint64_t>(i) >> 2, u);
  qcore::PhiloxUniform4(seed, (static_cast<uint64_t>(i) >> 2) + 1, u + 4);
}

// ---- Hardware FP8 conversion (sm_89 and later) ----------------------------------
// On sm_89 and later the MX and per-tensor FP8 kernels round E4M3 and E5M2 to
// nearest even with cvt.rn.satfinite.{e4m3,e5m2}x2.f32, one instruction per pair
// instead of about a dozen per element, and to nearest away with the same
// instruction on qcore::TiesAwayInput of each input (qcore::MxFp8PairNearest,
// Fp8TensorPairNearest in quant_core_rne.h, which also says why that is the
// reference's rounding). Below sm_89 they use qcore::MxElementNearest and
// qcore::Fp8Element.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KEEL_HW_FP8 1
#else
#define KEEL_HW_FP8 0
#endif

template <ElemFormat F>
constexpr bool kHwFp8Format = F == ElemFormat::kE4M3 || F == ElemFormat::kE5M2;

// Division of a work index by a fixed divisor: a multiply-high (FastDivmod) when
// every index fits in 32 bits, a 64-bit division otherwise.
struct IndexDiv {
  qcore::FastDivmod fast;
  int64_t divisor = 1;
  bool wide = false;
};

inline IndexDiv MakeIndexDiv(int64_t divisor, int64_t max_index) {
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

// Adds a thread's two counts to out[0] and out[1] (DeviceOutputs::counts, and
// the CUDA backend's statistics kernels): a warp sum, then one 64-bit integer
// atomic per warp and count when it is not zero (exact and order-free). Every
// lane of the warp must call it.
__device__ __forceinline__ void AddCounts(unsigned int a, unsigned int b, unsigned long long* out) {
  a = __reduce_add_sync(kFullMask, a);
  b = __reduce_add_sync(kFullMask, b);
  if ((threadIdx.x & 31) == 0) {
    if (a != 0) atomicAdd(out, static_cast<unsigned long long>(a));
    if (b != 0) atomicAdd(out + 1, static_cast<unsigned long long>(b));
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
// Launch helpers (host)
// ============================================================================

// KEEL_CUDA_CHECK comes from kernels/cuda_status.h.
// KEEL_RETURN_IF_ERROR comes from kernels/base/status.h.

// The CTAs of `kernel` (kThreads each) that the current device holds at once,
// looked up once per kernel and device (cudaOccupancy... is cheap but not free,
// and launchers run every training step).
Status ResidentCtas(const void* kernel, int64_t* resident);

// Launches kernel<<<grid, kThreads, 0, stream>>>(args...) with grid = the CTAs
// needed, at most the CTAs the GPU holds at once (the kernels loop grid-stride).
template <typename... KernelArgs, typename... Args>
Status Launch(void (*kernel)(KernelArgs...), int64_t ctas_needed, cudaStream_t stream, Args&&... args) {
  int64_t resident = 0;
  KEEL_RETURN_IF_ERROR(ResidentCtas(reinterpret_cast<const void*>(kernel), &resident));
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(ctas_needed, resident));
  kernel<<<static_cast<unsigned int>(grid), kThreads, 0, stream>>>(std::forward<Args>(args)...);
  KEEL_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
template <bool B> using BoolTag = std::integral_constant<bool, B>;
template <typename Fn>
Status WithBool(bool value, Fn&& fn) {
  return value ? fn(BoolTag<true>{}) : fn(BoolTag<false>{});
}

// Checks the pointers every entry point shares. `scales_allowed` and
// `tensor_scale_allowed` say which outputs the quantizer has; `what` names the
// entry point in the message.
Status CheckIo(const void* x, DType x_dtype, const DeviceOutputs& o, bool scales_allowed,
               bool tensor_scale_allowed, const char* what);

// An elementwise quantizer's count: 1..2^40.
Status CheckCount(int64_t count, const char* what);

// max |x| over `count` elements into the device float *amax, which must hold 0
// (quantize_cuda_fp8.cu): as float bits by atomicMax, NaN winning, or with
// `ignore_nan` counted as 0.
Status LaunchTensorAmax(const void* x, DType x_dtype, int64_t count, bool ignore_nan, float* amax,
                        cudaStream_t stream);

}  // namespace qcuda
}  // namespace keel

#endif  // KEEL_KERNELS_QUANTIZE_CUDA_INTERNAL_H_
