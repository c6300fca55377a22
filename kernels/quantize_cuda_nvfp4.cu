// CUDA NVFP4 quantization (Nvfp4AmaxCuda and Nvfp4QuantizeCuda of
// quantize_cuda.h): E2M1 elements with E4M3 scales per 1x16 block or 16x16 tile
// and an FP32 per-tensor scale, optionally after the 16-point random Hadamard
// transform. See docs/numerics.md, "NVFP4" and "Random Hadamard transform". The
// kernels first (along rows, down columns, and a generic three-pass path for an
// odd column count), then their launchers; the shared device and launch helpers
// are in quantize_cuda_internal.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

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
// Device helpers and kernels
// ============================================================================

// The tensor scale a dequantized NVFP4 output carries: t, or t with S_dec = 1 when
// outputs.out_without_tensor_scale (q * sf, exact in bf16; the caller folds S_dec
// into its GEMM's alpha). Only the output uses it: block scales still come from t.
__device__ __forceinline__ qcore::Nvfp4TensorScale OutTensorScale(qcore::Nvfp4TensorScale t,
                                                                  const DeviceOutputs& o) {
  if (o.out_without_tensor_scale) t.s_dec = 1.0f;
  return t;
}

struct Nvfp4Args {
  int64_t rows, cols;
  int64_t total;              // work items (see each kernel)
  IndexDiv by_inner;          // work item -> (outer, inner)
  int64_t blocks_per_row;     // axis 1: cols / 16
  uint64_t seed;
  bool paired_draws;          // axis 0, cols % 4 == 0: lane pairs share Philox calls (Uniform2x2Paired)
  const float* amax_in;       // quantize: the tensor amax
  unsigned int* amax_out;     // amax pass: max |y| bits, atomically
  DeviceOutputs o;
};

// The tensor scale of the amax in *a.amax_in; the grid's first thread also stores
// its S_dec to outputs.tensor_scale.
__device__ __forceinline__ qcore::Nvfp4TensorScale TensorScaleOf(const Nvfp4Args& a) {
  const qcore::Nvfp4TensorScale t = qcore::Nvfp4TensorScaleFromAmax(__ldg(a.amax_in));
  if (a.o.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.o.tensor_scale = t.s_dec;
  return t;
}

// Axis 1 (blocks of 16 along rows), cols % 16 == 0. A unit is 8 elements, half a
// block: for 1x16, units run row by row (inner = cols / 8); for 16x16 tiles, one
// warp is one tile (inner = tiles per 16-row band), lane = 2 * row-in-tile + half.
// kAmaxOnly: the amax pass (only needed with RHT; otherwise a plain max over x).
template <typename InT, Rounding R, bool kTile, bool kRht, bool kAmaxOnly>
__global__ void __launch_bounds__(kThreads) Nvfp4RowsKernel(const InT* __restrict__ x, const Nvfp4Args a) {
  unsigned int saturated = 0, nan_blocks = 0;  // a.o.counts
  constexpr int kUnits = 2;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  qcore::Nvfp4TensorScale t{};
  if constexpr (!kAmaxOnly) t = TensorScaleOf(a);
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
      const bool nan_block = amax >= qcore::kInfBits;  // the 1x16 block's, before the tile's max
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
        qcore::Nvfp4RoundRne(y, s, OutTensorScale(t, a.o), a.o.out != nullptr, code, out);
      } else {
        qcore::Nvfp4RoundSr(y, uni, s, OutTensorScale(t, a.o), code, out);
      }
      if (a.o.codes != nullptr) StoreCodes8<4>(a.o.codes, i0, code);
      if (a.o.out != nullptr) StoreOut8(a.o.out, out_bf16, i0, out);
      if (a.o.scales != nullptr && half == 0)
        a.o.scales[row[u] * a.blocks_per_row + (col[u] >> 4)] = static_cast<uint8_t>(s.code);
      if (a.o.counts != nullptr) {
        const float bound = qcore::Nvfp4SaturationBound(s.code, t.s_dec);
#pragma unroll
        for (int e = 0; e < 8; ++e) saturated += qcore::Nvfp4Saturated(y[e], code[e], bound) ? 1u : 0u;
        nan_blocks += nan_block && half == 0 ? 1u : 0u;
      }
    }
  }
  if constexpr (kAmaxOnly) {
    CtaMaxToGlobal(thread_max, a.amax_out);
  } else {
    if (a.o.counts != nullptr) AddCounts(saturated, nan_blocks, a.o.counts);
  }
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
  unsigned int saturated = 0, nan_blocks = 0;  // a.o.counts
  using Raw = Raw8<InT>;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const qcore::Nvfp4TensorScale t = TensorScaleOf(a);
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
      qcore::Nvfp4RoundRne(y, s, OutTensorScale(t, a.o), a.o.out != nullptr, code, out);
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
      if (a.o.counts != nullptr) {
        const float bound = qcore::Nvfp4SaturationBound(s.code, t.s_dec);
#pragma unroll
        for (int m = 0; m < 16; ++m) saturated += qcore::Nvfp4Saturated(y[m], code[m], bound) ? 1u : 0u;
        nan_blocks += amax[b] >= qcore::kInfBits ? 1u : 0u;
      }
    }
  }
  if (a.o.counts != nullptr) AddCounts(saturated, nan_blocks, a.o.counts);
}

// Axis 0 (blocks of 16 down columns), rows % 16 == 0, cols even. Work item = (row
// block, column pair), column pair fastest (inner = cols / 2). A thread holds its
// two 16-element column chunks; the RHT runs down each column in registers. For
// 16x16 tiles the 8 lanes of 16 adjacent columns (aligned: cols % 16 == 0) share
// the tile amax.
template <typename InT, Rounding R, bool kTile, bool kRht, bool kAmaxOnly, typename Index>
__global__ void __launch_bounds__(kThreads) Nvfp4ColsKernel(const InT* __restrict__ x, const Nvfp4Args a) {
  unsigned int saturated = 0, nan_blocks = 0;  // a.o.counts
  constexpr bool kNarrow = std::is_same_v<Index, uint32_t>;
  using Raw = Raw2<InT>;
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  qcore::Nvfp4TensorScale t{};
  if constexpr (!kAmaxOnly) t = TensorScaleOf(a);
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
    // The two 1x16 blocks' NaN flags, before the tile's max.
    const unsigned int nan_pair = (amax0 >= qcore::kInfBits ? 1u : 0u) + (amax1 >= qcore::kInfBits ? 1u : 0u);
    if constexpr (kTile) {
      amax0 = max(amax0, amax1);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) amax0 = max(amax0, __shfl_xor_sync(kFullMask, amax0, o));
      amax1 = amax0;
    }
    if (!active) continue;
    nan_blocks += nan_pair;
    const qcore::Nvfp4BlockScale s0 = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax0), t);
    const qcore::Nvfp4BlockScale s1 = qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax1), t);
    const float bound0 = qcore::Nvfp4SaturationBound(s0.code, t.s_dec);
    const float bound1 = qcore::Nvfp4SaturationBound(s1.code, t.s_dec);
    // Two copies of the loop, so that codes-only calls skip the value arithmetic.
    auto quantize_rows = [&](auto with_values) {
      constexpr bool kValues = decltype(with_values)::value;
      [[maybe_unused]] float uni[4];  // stochastic: the uniforms of rows r and r + 1 (r even)
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const Index i = (rb * 16 + r) * cols + c0;
        [[maybe_unused]] float u0 = 0.0f, u1 = 0.0f;
        if constexpr (R == Rounding::kStochastic) {
          if (r % 2 == 0) Uniform2x2(a.seed, i, a.cols, a.paired_draws, uni);
          u0 = uni[(r % 2) * 2];
          u1 = uni[(r % 2) * 2 + 1];
        }
        Rounded q0, q1;
        // NaN blocks selected per block (see Nvfp4ElementRne), after the rounding.
        if constexpr (R == Rounding::kNearestEven) {
          q0 = qcore::Nvfp4ElementRne(y0[r], s0.s_b);
          q1 = qcore::Nvfp4ElementRne(y1[r], s1.s_b);
        } else {
          q0 = qcore::Nvfp4ElementSr(y0[r], s0.s_b, u0);
          q1 = qcore::Nvfp4ElementSr(y1[r], s1.s_b, u1);
        }
        if (qcore::IsNan(s0.s_b)) q0 = Rounded{qcore::QuietNan(), 0u};
        if (qcore::IsNan(s1.s_b)) q1 = Rounded{qcore::QuietNan(), 0u};
        if (a.o.codes != nullptr) StoreCodes2<4>(a.o.codes, i, q0.code, q1.code);
        if (a.o.counts != nullptr) {
          saturated += (qcore::Nvfp4Saturated(y0[r], q0.code, bound0) ? 1u : 0u) +
                       (qcore::Nvfp4Saturated(y1[r], q1.code, bound1) ? 1u : 0u);
        }
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
  if constexpr (kAmaxOnly) {
    CtaMaxToGlobal(thread_max, a.amax_out);
  } else {
    if (a.o.counts != nullptr) AddCounts(saturated, nan_blocks, a.o.counts);
  }
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
  unsigned int nan_blocks = 0;  // a.o.counts
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < work; w += step) {
    const int64_t rb = w / a.cols, col = w - rb * a.cols;
    uint32_t amax = 0;
    for (int r = 0; r < 16; ++r) amax = max(amax, qcore::AbsBits(__ldg(y + (rb * 16 + r) * a.cols + col)));
    scales[w] = static_cast<uint8_t>(qcore::Nvfp4BlockScaleFromAmax(__uint_as_float(amax), t).code);
    nan_blocks += amax >= qcore::kInfBits ? 1u : 0u;
  }
  if (a.o.counts != nullptr) AddCounts(0u, nan_blocks, a.o.counts);
}

// Pass 3: one thread per pair of elements in row-major order (one writer per byte).
template <Rounding R>
__global__ void __launch_bounds__(kThreads) Nvfp4GenericElementsKernel(const float* __restrict__ y, const Nvfp4Args a,
                                                                       const uint8_t* __restrict__ scales) {
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const qcore::Nvfp4TensorScale t = TensorScaleOf(a);
  const int64_t count = a.rows * a.cols;
  const int64_t pairs = (count + 1) / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  unsigned int saturated = 0;  // a.o.counts
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < pairs; p += step) {
    uint32_t code[2] = {0, 0};
    const int halves = 2 * p + 1 < count ? 2 : 1;
    for (int h = 0; h < halves; ++h) {
      const int64_t i = 2 * p + h;
      const int64_t row = i / a.cols, col = i - row * a.cols;
      const uint32_t scale_code = scales[(row / 16) * a.cols + col];
      const qcore::Nvfp4BlockScale s = qcore::Nvfp4BlockScaleFromCode(scale_code, t);
      const float u = R == Rounding::kStochastic ? PhiloxUniform(a.seed, static_cast<uint64_t>(i)) : 0.0f;
      const float yi = __ldg(y + i);
      const Rounded q = qcore::Nvfp4Element(yi, s, R, u);
      code[h] = q.code;
      saturated += qcore::Nvfp4Saturated(yi, q.code, qcore::Nvfp4SaturationBound(scale_code, t.s_dec)) ? 1u : 0u;
      if (a.o.out != nullptr) StoreOut1(a.o.out, out_bf16, i, qcore::Nvfp4Dequant(q.value, s, OutTensorScale(t, a.o)));
    }
    if (a.o.codes != nullptr) a.o.codes[p] = static_cast<uint8_t>(code[0] | (code[1] << 4));
  }
  if (a.o.counts != nullptr) AddCounts(saturated, 0u, a.o.counts);
}

// ============================================================================
// Launchers
// ============================================================================

// NVFP4 rounds to nearest even or stochastically (ValidateNvfp4 refuses the rest).
template <typename Fn>
Status WithNvfp4Rounding(Rounding rounding, Fn&& fn) {
  if (rounding == Rounding::kStochastic) return fn(RoundTag<Rounding::kStochastic>{});
  return fn(RoundTag<Rounding::kNearestEven>{});
}

// The amax pass: max |y| over the tensor into *amax (which it zeroes first).
Status LaunchNvfp4Amax(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                       float* amax, cudaStream_t stream) {
  unsigned int* amax_bits = reinterpret_cast<unsigned int*>(amax);
  KEEL_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  const int64_t count = rows * cols;
  if (!options.rht) {  // the RHT aside, the amax is over x in any order
    return LaunchTensorAmax(x, x_dtype, count, /*ignore_nan=*/false, amax, stream);
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
  return LaunchTensorAmax(y.get<float>(), DType::kF32, count, /*ignore_nan=*/false, amax, stream);
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
    a.paired_draws = cols % 4 == 0;
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
}  // namespace qcuda

// ============================================================================
// Device-pointer API (quantize_cuda.h)
// ============================================================================

Status Nvfp4AmaxCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                     float* amax, void* stream) {
  KEEL_RETURN_IF_ERROR(ValidateNvfp4(rows, cols, options));
  KEEL_RETURN_IF_ERROR(qcuda::CheckIo(x, x_dtype, DeviceOutputs{}, false, false, "Nvfp4AmaxCuda"));
  if (amax == nullptr) return Status::Error("Nvfp4AmaxCuda: amax: null; need a device float");
  return qcuda::LaunchNvfp4Amax(x, x_dtype, rows, cols, options, amax, static_cast<cudaStream_t>(stream));
}

Status Nvfp4QuantizeCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, const Nvfp4Options& options,
                         const float* amax, const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(ValidateNvfp4(rows, cols, options));
  KEEL_RETURN_IF_ERROR(qcuda::CheckIo(x, x_dtype, outputs, true, true, "Nvfp4QuantizeCuda"));
  return qcuda::LaunchNvfp4(x, x_dtype, rows, cols, options, amax, outputs, static_cast<cudaStream_t>(stream));
}

}  // namespace keel
