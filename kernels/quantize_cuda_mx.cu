// CUDA MX block quantization (MxQuantizeCuda of quantize_cuda.h): E8M0 block
// scales with E4M3, E5M2, E3M2, E2M3 or E2M1 elements, every rounding mode. See
// docs/numerics.md, "MX block scaling". The kernels first (fast paths along rows
// and down 32-row column blocks, and a generic two-pass path for other shapes),
// then their launcher; the shared device and launch helpers are in
// quantize_cuda_internal.h.
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
// Kernels
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
  // Nearest even or away: the short paths (nearest_away through TiesAwayInput).
  constexpr bool kNearest = R != Rounding::kStochastic;
  constexpr bool kHw = KEEL_HW_FP8 && kHwFp8Format<F> && kNearest;
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
  unsigned int saturated = 0, nan_blocks = 0;  // a.o.counts
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
        // MxElementFinite with the conversion in hardware.
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          Rounded q0, q1;
          qcore::MxFp8PairNearest<F, R>(v[u][e], v[u][e + 1], s, s, a.o.out != nullptr, &q0, &q1);
          PutPair(q0, q1, code + e, out + e);
        }
      } else if constexpr (kNearest) {
        // MxElementFinite with RneSmall's shorter rounding (E3M2, E2M3, E2M1 and,
        // below sm_89, FP8). Two copies of the loop, so that codes-only calls skip
        // the value arithmetic.
        auto round8 = [&](auto with_values) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const Rounded r = qcore::MxElementNearest<F, R>(v[u][e], s);
            if constexpr (decltype(with_values)::value) out[e] = r.value;
            code[e] = r.code;
          }
        };
        if (a.o.out != nullptr) round8(std::true_type{});
        else round8(std::false_type{});
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const Rounded r = qcore::MxElementSr<F>(v[u][e], s, uni[e]);
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
      if (a.o.counts != nullptr) {
#pragma unroll
        for (int e = 0; e < 8; ++e) saturated += qcore::MxSaturated(v[u][e], code[e], s, c) ? 1u : 0u;
        nan_blocks += s.nan && (unit[u] & (a.lanes - 1)) == 0 ? 1u : 0u;
      }
    }
  }
  if (a.o.counts != nullptr) AddCounts(saturated, nan_blocks, a.o.counts);
}

struct MxColsArgs {
  int64_t rows, cols;
  int64_t total;              // ceil(rows / block) * (cols / 2)
  IndexDiv by_pairs;          // cols / 2
  int prefetch;               // L2 prefetch of the item this many grid steps ahead; 0: none (see the kernel)
  bool bump;
  bool paired_draws;          // cols % 4 == 0: lane pairs share Philox calls (Uniform2x2Paired)
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
  unsigned int saturated = 0, nan_blocks = 0;  // a.o.counts
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
      [[maybe_unused]] float uni[4];  // stochastic: the uniforms of rows r and r + 1 (r even)
#pragma unroll
      for (int r = 0; r < kBlock; ++r) {
        if (r >= n) break;
        const Index i = (r0 + r) * cols + c0;
        float v0, v1;
        [[maybe_unused]] float u0 = 0.0f, u1 = 0.0f;
        Raw::Unpack(raw[r], &v0, &v1);
        if constexpr (R == Rounding::kStochastic) {
          // Both lanes of a pair reach this (same row block, same n).
          if (r % 2 == 0) Uniform2x2(a.seed, i, a.cols, a.paired_draws, uni);
          u0 = uni[(r % 2) * 2];
          u1 = uni[(r % 2) * 2 + 1];
        }
        // Computed unconditionally, NaN blocks selected after: keeps 2^+-e out of the loop.
        Rounded q0, q1;
        if constexpr (KEEL_HW_FP8 && kHwFp8Format<F> && R != Rounding::kStochastic) {
          // As MxElementFinite, with the conversion of the pair in hardware.
          qcore::MxFp8PairNearest<F, R>(v0, v1, s0, s1, kValues, &q0, &q1);
        } else if constexpr (R != Rounding::kStochastic) {
          q0 = qcore::MxElementNearest<F, R>(v0, s0);
          q1 = qcore::MxElementNearest<F, R>(v1, s1);
        } else {
          q0 = qcore::MxElementSr<F>(v0, s0, u0);
          q1 = qcore::MxElementSr<F>(v1, s1, u1);
        }
        if (s0.nan) q0 = qcore::MxNanElement(c);
        if (s1.nan) q1 = qcore::MxNanElement(c);
        if (a.o.counts != nullptr) {
          saturated += (qcore::MxSaturated(v0, q0.code, s0, c) ? 1u : 0u) + (qcore::MxSaturated(v1, q1.code, s1, c) ? 1u : 0u);
        }
        if (a.o.codes != nullptr) StoreCodes2<c.bits>(a.o.codes, i, q0.code, q1.code);
        if constexpr (kValues) StoreOut2(a.o.out, out_bf16, i, q0.value, q1.value);
      }
    };
    if (a.o.out != nullptr) quantize_rows(std::true_type{});
    else quantize_rows(std::false_type{});
    if (a.o.scales != nullptr)
      *reinterpret_cast<uint16_t*>(a.o.scales + rb * cols + c0) = static_cast<uint16_t>(s0.byte | (s1.byte << 8));
    nan_blocks += (s0.nan ? 1u : 0u) + (s1.nan ? 1u : 0u);
  }
  if (a.o.counts != nullptr) AddCounts(saturated, nan_blocks, a.o.counts);
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
  unsigned int nan_blocks = 0;  // a.o.counts
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
    const qcore::MxScale s = qcore::MxScaleFromAmax(amax, a.c, a.bump);
    a.scales[w] = static_cast<uint8_t>(s.byte);
    nan_blocks += s.nan ? 1u : 0u;
  }
  if (a.o.counts != nullptr) AddCounts(0u, nan_blocks, a.o.counts);
}

// Generic path, pass 2: one thread per pair of elements (2p, 2p + 1) in row-major
// order, so it alone writes their packed FP4 byte.
template <typename InT, Rounding R>
__global__ void __launch_bounds__(kThreads) MxGenericElementsKernel(const InT* __restrict__ x, const MxGenericArgs a) {
  const bool out_bf16 = a.o.out_dtype == DType::kBF16;
  const int64_t pairs = (a.count + 1) / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  unsigned int saturated = 0;  // a.o.counts
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
      const float xi = Load1(x + i);
      const Rounded r = qcore::MxElement(xi, s, a.c, R, u);
      code[h] = r.code;
      saturated += qcore::MxSaturated(xi, r.code, s, a.c) ? 1u : 0u;
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
  if (a.o.counts != nullptr) AddCounts(saturated, 0u, a.o.counts);
}

// ============================================================================
// Launcher
// ============================================================================

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
    a.paired_draws = cols % 4 == 0;
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

}  // namespace
}  // namespace qcuda

// ============================================================================
// Device-pointer API (quantize_cuda.h)
// ============================================================================

Status MxQuantizeCuda(const void* x, DType x_dtype, int64_t rows, int64_t cols, const MxOptions& options,
                      const DeviceOutputs& outputs, void* stream) {
  KEEL_RETURN_IF_ERROR(ValidateMx(rows, cols, options));
  KEEL_RETURN_IF_ERROR(qcuda::CheckIo(x, x_dtype, outputs, true, false, "MxQuantizeCuda"));
  return qcuda::LaunchMx(x, x_dtype, rows, cols, options, outputs, static_cast<cudaStream_t>(stream));
}

}  // namespace keel
