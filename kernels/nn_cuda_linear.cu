// The CUDA backend's quantized linear layer, its operand statistics and
// QuantizeDequantize (docs/numerics.md, "Operand roles and axes" and
// "Emulation on Hopper and CPU").
//
// Each GEMM quantizes its two operands afresh along its K axis (quantize_cuda.h):
//   forward  y  = Q(x) . Q(w)^T       x, w along `in` (axis 1)
//   dgrad    dx = Q(dy) . Q(w)        dy along `out` (axis 1), w down its columns (axis 0)
//   wgrad    dw += Q(dy)^T . Q(x)     dy, x along the rows (axis 0)
// When both roles are quantized, every format's values (MX, NVFP4 and per-tensor
// FP8 without their per-tensor decode scale, BF16) are exact in bf16, so the
// quantizers write bf16 straight into the GEMM's operand buffers and a BF16 x BF16
// -> FP32 cuBLASLt GEMM runs with alpha = the product of the decode scales (a
// device float). When either role is fp32, the other is dequantized in fp32 (code
// times block scale, the decode scale again in alpha) and an FP32 GEMM (no TF32)
// runs on it and the raw fp32 operand. Both are what the CPU reference computes,
// up to the order of the fp32 sums.
//
// The forward's bias and residual are added in the GEMM's epilogue (the residual
// as cuBLASLt's C with beta = 1). The backward's dbias is summed by the kernel
// that rounds dy when a dy role is BF16 (Bf16ColumnPartialsKernel, one read of dy
// for both), else by ColumnSums; both give the same bits.
//
// Statistics (OperandStats of nn.h): BF16, MX and NVFP4 quantizers count them in
// the pass that quantizes (DeviceOutputs::counts); per-tensor FP8 in a second pass
// over x and its codes. The dequantized values compared are the CPU reference's
// fp32 ones; integer atomics only, so the counts are exact and the same every
// run. Nothing here waits for the host.
#include <algorithm>
#include <string>

#include "kernels/nn_cuda_internal.h"
#include "kernels/quant_core.h"
#include "kernels/quantize_cuda_internal.h"

namespace keel {
namespace nncuda {

namespace {

// ============================================================================
// Kernels
// ============================================================================

using qcuda::AddCounts;

struct StatsArgs {
  const float* x;
  int64_t count;
  const uint8_t* codes;       // one per element
  const float* tensor_scale;  // 1 / scale
  unsigned long long* out;    // [0] saturated, [1] NaN/Inf elements
};

// Per-tensor FP8: an element saturated if its code has the largest magnitude and
// |x| exceeds |code value / scale|; the NaN/Inf elements are counted, and the
// caller turns that into 0 or 1 block.
template <ElemFormat F>
__global__ void __launch_bounds__(kThreads) Fp8StatsKernel(const StatsArgs a) {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  const float inv = *a.tensor_scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  unsigned int saturated = 0, nonfinite = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.count; i += stride) {
    const float v = a.x[i];
    nonfinite += qcore::IsFinite(v) ? 0u : 1u;
    const uint32_t code = a.codes[i];
    if ((code & 0x7Fu) == c.max_code && fabsf(v) > fabsf(qcore::DecodeElemFast(code, c) * inv)) ++saturated;
  }
  AddCounts(saturated, nonfinite, a.out);
}

// alpha = a * b, a null pointer standing for 1.
__global__ void AlphaKernel(const float* a, const float* b, float* alpha) {
  *alpha = (a != nullptr ? *a : 1.0f) * (b != nullptr ? *b : 1.0f);
}

// y[r, c] += bias[c] (when the GEMM epilogue cannot take the bias).
__global__ void AddBiasKernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t count = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    y[i] = y[i] + bias[i % cols];
}

// The column sums' fixed order inside a 32 x 8 block: thread (t, r) holds acc[j]
// for column kCols * t + j, and a column's total is row threads 0..7 added in
// order. Every thread calls it (it synchronises); total is valid where
// threadIdx.y == 0.
template <int kCols>
__device__ __forceinline__ void SumOverRowThreads(const float (&acc)[kCols], float (&total)[kCols]) {
  __shared__ float sums[8][32 * kCols + 1];
#pragma unroll
  for (int j = 0; j < kCols; ++j) sums[threadIdx.y][kCols * threadIdx.x + j] = acc[j];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    total[j] = sums[0][kCols * threadIdx.x + j];
    if (threadIdx.y == 0) {
      for (int k = 1; k < 8; ++k) total[j] += sums[k][kCols * threadIdx.x + j];
    }
  }
}
__device__ __forceinline__ float SumOverRowThreads(float acc) {
  const float a[1] = {acc};
  float total[1];
  SumOverRowThreads<1>(a, total);
  return total[0];
}

// Column sums, pass 1: block (x, y) sums columns 32x .. 32x + 31 over rows
// [y * rows_per_chunk, ...) (thread (c, r) every 8th row from r, then the 8 partial
// sums in order), into partial[y * cols + column].
__global__ void __launch_bounds__(256) ColumnPartialsKernel(const float* __restrict__ m, int64_t rows, int64_t cols,
                                                            int64_t rows_per_chunk, float* __restrict__ partial) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += m[r * cols + col];
  }
  const float total = SumOverRowThreads(acc);
  if (threadIdx.y == 0 && col < cols) partial[blockIdx.y * cols + col] = total;
}

// Pass 2: out[c] += the chunks' partials of column c. Block x takes columns 32x ..
// 32x + 31; thread (c, k) sums chunks k, k + 8, ... and the 8 sums are added in
// order, so that a column's many partials are not one thread's serial chain.
__global__ void __launch_bounds__(256) ColumnFinalizeKernel(const float* __restrict__ partial, int64_t chunks,
                                                            int64_t cols, float* __restrict__ out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t c = threadIdx.y; c < chunks; c += 8) acc += partial[c * cols + col];
  }
  const float total = SumOverRowThreads(acc);
  if (threadIdx.y == 0 && col < cols) out[col] += total;
}

// The values Bf16ColumnPartialsKernel rounds and sums: element i of a matrix,
// or of GELU's backward (dy * gelu'(x), GeluGradOp's product, computed here).
struct MatrixValues {
  const float* m;
  __device__ __forceinline__ float operator()(int64_t i) const { return m[i]; }
};
struct GeluGradValues {
  const float* x;
  const float* dy;
  __device__ __forceinline__ float operator()(int64_t i) const { return dy[i] * GeluGrad(x[i]); }
};

// BF16 rounding of m (rows x cols, fp32; element i is values(i)) fused with pass 1 of the column sums:
// the blocks, threads, rows and order of ColumnPartialsKernel, so `partial` gets
// its bits (the sums are of the unrounded m, as dbias needs), while each element
// is rounded as Bf16Kernel (quantize_cuda_fp8.cu) rounds it: the same
// qcore::Bf16Round, the same Philox uniform of index i under stochastic rounding
// and the same store (StoreOut1), so `out` gets that kernel's bits too. counts
// (may be null): [1] += the NaN/Inf elements, as Bf16Kernel counts them.
// One 4-byte load and one 2-byte store per element, a warp covering 32
// consecutive columns of a row: coalesced, and dy is read once instead of twice.
template <Rounding R, typename Values>
__global__ void __launch_bounds__(256)
    Bf16ColumnPartialsKernel(const Values values, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                             uint64_t seed, void* __restrict__ out, bool out_bf16, float* __restrict__ partial,
                             unsigned long long* counts) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  unsigned int nonfinite = 0;
  if (col < cols) {
    // Four of the thread's rows loaded before any is used (loads in flight), then
    // added in row order: the order of ColumnPartialsKernel's loop.
    constexpr int kBatch = 4;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8 * kBatch) {
      float v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t rk = r + 8 * k;
        v[k] = rk < r1 ? values(rk * cols + col) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t rk = r + 8 * k;
        if (rk >= r1) break;
        const int64_t i = rk * cols + col;
        acc += v[k];
        const float u = R == Rounding::kStochastic ? PhiloxUniform(seed, static_cast<uint64_t>(i)) : 0.0f;
        qcuda::StoreOut1(out, out_bf16, i, qcore::Bf16Value(qcore::Bf16Round(v[k], R, u)));
        nonfinite += qcore::IsFinite(v[k]) ? 0u : 1u;
      }
    }
  }
  // blockDim.x is 32, so threadIdx.x is the lane AddCounts expects; every lane calls it.
  if (counts != nullptr) AddCounts(0u, nonfinite, counts);
  const float total = SumOverRowThreads(acc);
  if (threadIdx.y == 0 && col < cols) partial[blockIdx.y * cols + col] = total;
}

// GELU's backward (dy * gelu'(x), GeluGradValues' product) rounded to BF16
// (nearest even) fused with pass 1 of the column sums, four columns per thread:
// Bf16ColumnPartialsKernel's results, bit for bit, with 16-byte loads and 8-byte
// stores. A block covers 128 columns and a chunk of rows; thread (t, r) owns
// columns 4t .. 4t + 3 and adds its rows r, r + 8, ... in order, then the 8 row
// threads' sums are added in order (SumOverRowThreads): per column the additions
// of ColumnPartialsKernel. Requires cols % 4 == 0 and 16-byte aligned x and dy.
__global__ void __launch_bounds__(256)
    GeluGradBf16ColumnPartials4Kernel(const float* __restrict__ x, const float* __restrict__ dy, int64_t rows,
                                      int64_t cols, int64_t rows_per_chunk, uint16_t* __restrict__ out,
                                      float* __restrict__ partial, unsigned long long* counts) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 128 + 4 * threadIdx.x;
  const bool active = col < cols;  // cols % 4 == 0: a thread's four columns are all in or all out
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  unsigned int nonfinite = 0;
  if (active) {
    constexpr int kBatch = 2;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8 * kBatch) {
      float4 xv[kBatch], gv[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t rk = r + 8 * k;
        const bool in = rk < r1;
        xv[k] = in ? *reinterpret_cast<const float4*>(x + rk * cols + col) : make_float4(0, 0, 0, 0);
        gv[k] = in ? *reinterpret_cast<const float4*>(dy + rk * cols + col) : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t rk = r + 8 * k;
        if (rk >= r1) break;
        const float xs[4] = {xv[k].x, xv[k].y, xv[k].z, xv[k].w};
        const float gs[4] = {gv[k].x, gv[k].y, gv[k].z, gv[k].w};
        float q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float v = gs[j] * GeluGrad(xs[j]);  // GeluGradValues' product
          acc[j] += v;
          q[j] = qcore::Bf16Value(qcore::Bf16Round(v, Rounding::kNearestEven, 0.0f));
          nonfinite += qcore::IsFinite(v) ? 0u : 1u;
        }
        *reinterpret_cast<uint2*>(out + rk * cols + col) =
            make_uint2(qcuda::ToBf16x2(q[0], q[1]), qcuda::ToBf16x2(q[2], q[3]));
      }
    }
  }
  // blockDim.x is 32, so threadIdx.x is the lane AddCounts expects; every lane calls it.
  if (counts != nullptr) AddCounts(0u, nonfinite, counts);
  float total[4];
  SumOverRowThreads<4>(acc, total);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[blockIdx.y * cols + col + j] = total[j];
  }
}

// Four consecutive elements of one MX block along a row, rounded with the
// block's scale as MxRowsKernel rounds them (nearest even or away): NaN for a
// NaN block, the hardware FP8 pair conversion from sm_89, else
// qcore::MxElementNearest.
template <ElemFormat F, Rounding R>
__device__ __forceinline__ void MxRoundRow4(const float e[4], const qcore::MxScale& sc, float q[4],
                                            uint32_t code[4]) {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  if (sc.nan) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q[j] = qcore::QuietNan();
      code[j] = c.nan_code;
    }
  } else if constexpr (KEEL_HW_FP8 && qcuda::kHwFp8Format<F>) {
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      qcore::Rounded q0, q1;
      qcore::MxFp8PairNearest<F, R>(e[j], e[j + 1], sc, sc, true, &q0, &q1);
      q[j] = q0.value;
      q[j + 1] = q1.value;
      code[j] = q0.code;
      code[j + 1] = q1.code;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const qcore::Rounded rj = qcore::MxElementNearest<F, R>(e[j], sc);
      q[j] = rj.value;
      code[j] = rj.code;
    }
  }
}

// The AbsBits maximum of one row's MX block of 32 columns, held four a lane by
// 8 adjacent lanes (MxRowsKernel's maximum over the same elements); every lane
// of the warp calls it.
__device__ __forceinline__ uint32_t RowBlockAbsMax(const float e[4]) {
  uint32_t amax = max(max(qcore::AbsBits(e[0]), qcore::AbsBits(e[1])), max(qcore::AbsBits(e[2]), qcore::AbsBits(e[3])));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = max(amax, __shfl_xor_sync(qcuda::kFullMask, amax, o));
  return amax;
}

// q[0..3] at out + i: bf16 in one 8-byte store, or fp32 in one 16-byte store.
__device__ __forceinline__ void StoreOut4(void* out, bool out_bf16, int64_t i, const float q[4]) {
  if (out_bf16) {
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + i) =
        make_uint2(qcuda::ToBf16x2(q[0], q[1]), qcuda::ToBf16x2(q[2], q[3]));
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + i) = make_float4(q[0], q[1], q[2], q[3]);
  }
}

// MX quantization along rows (blocks of 32 columns; cols % 32 == 0) with nearest
// rounding (even or away), fused with pass 1 of the column sums. A block covers
// 128 columns and a chunk of rows; thread (t, r) owns columns 4t .. 4t + 3 of the
// block and adds its rows r, r + 8, ... in order, then the 8 row threads' sums are
// added in order: per column exactly ColumnPartialsKernel's additions, so
// `partial` gets its bits. Eight lanes hold one row's MX block of 32 columns: its
// scale comes from their max of AbsBits (MxRowsKernel's max over the same 32
// elements), and the elements are rounded as MxRowsKernel rounds them (the
// hardware FP8 pair conversion from sm_89, else qcore::MxElementNearest), so
// `out` (the dequantized values) gets its bits. counts: saturated elements and
// NaN blocks, as MxRowsKernel counts them. Requires 16-byte aligned rows (cols % 4
// == 0 and an aligned m, which PrepareOperand guarantees).
template <ElemFormat F, Rounding R, bool kBump>
__global__ void __launch_bounds__(256)
    MxRowsColumnPartialsKernel(const float* __restrict__ m, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                               void* __restrict__ out, bool out_bf16, float* __restrict__ partial,
                               unsigned long long* counts) {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 128 + 4 * threadIdx.x;
  const bool active = col < cols;  // whole MX blocks: cols % 32 == 0
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  unsigned int saturated = 0, nan_blocks = 0;
  constexpr int kBatch = 2;
  for (int64_t r = r0 + threadIdx.y; r < r1; r += 8 * kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t rk = r + 8 * k;
      v[k] = rk < r1 && active ? *reinterpret_cast<const float4*>(m + rk * cols + col) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t rk = r + 8 * k;
      if (rk >= r1) break;  // the same for the whole warp: one row
      const float e[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] += e[j];
      const uint32_t amax = RowBlockAbsMax(e);
      if (!active) continue;
      const qcore::MxScale sc = qcore::MxScaleFromAmax(amax, c, kBump);
      float q[4];
      uint32_t code[4];
      MxRoundRow4<F, R>(e, sc, q, code);
      StoreOut4(out, out_bf16, rk * cols + col, q);
#pragma unroll
      for (int j = 0; j < 4; ++j) saturated += qcore::MxSaturated(e[j], code[j], sc, c) ? 1u : 0u;
      nan_blocks += sc.nan && (threadIdx.x & 7) == 0 ? 1u : 0u;
    }
  }
  if (counts != nullptr) AddCounts(saturated, nan_blocks, counts);
  float total[4];
  SumOverRowThreads<4>(acc, total);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[blockIdx.y * cols + col + j] = total[j];
  }
}

// MX quantization of m (rows x cols, fp32) along rows AND down columns (blocks
// of 32 both ways) in one read, fused with pass 1 of the column sums: the two
// roles of a linear backward's dy (the dgrad's along its rows, the wgrad's down
// its columns) and dbias, where MxRowsColumnPartialsKernel and MxColsKernel read
// dy once each. The layout is MxRowsColumnPartialsKernel's: a block covers 128
// columns and a chunk of rows, thread (t, r) owns columns 4t .. 4t + 3 and rows
// r, r + 8, r + 16, r + 24 of each group of 32 rows, in order, so `partial` gets
// ColumnPartialsKernel's bits. Along rows, eight lanes hold one row's block of
// 32 columns (MxRowsColumnPartialsKernel's scale and rounding, hence its bits in
// out_rows and counts_rows). Down columns, a column's block of 32 rows is spread
// over the 8 row threads: their per-column AbsBits maxima meet in shared memory,
// and each element is rounded with its column's scale as MxColsKernel rounds it
// (the hardware FP8 pair conversion from sm_89, else qcore::MxElementNearest;
// NaN blocks as qcore::MxNanElement), hence its bits in out_cols and
// counts_cols. Both outputs are row-major like m. Requires rows_per_chunk % 32
// == 0 and rows % 32 == 0 (whole column blocks in every chunk), cols % 32 == 0,
// 16-byte aligned rows, and nearest rounding; the launcher checks. partial may
// be null (no dbias). With out_rows null it quantizes down columns only
// (QuantizeMxDownColumnsInTiles): then cols % 4 == 0 is enough, and the chunks
// are any multiple of 32 rows. kPrefetch (mx_tiles_prefetch) issues the next
// group's loads before this group's rounding, a software pipeline: without it
// a block has no load in flight while it rounds. Either way 80 registers or
// fewer, so that 3 blocks fit an SM.
template <ElemFormat F, Rounding R, bool kBump, bool kPrefetch>
__global__ void __launch_bounds__(256, 3)
    MxBothAxesColumnPartialsKernel(const float* __restrict__ m, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                   void* __restrict__ out_rows, void* __restrict__ out_cols, bool out_bf16,
                                   float* __restrict__ partial, unsigned long long* counts_rows,
                                   unsigned long long* counts_cols) {
  constexpr qcore::ElemConsts c = qcore::ConstsOf(F);
  constexpr bool kHw = KEEL_HW_FP8 && qcuda::kHwFp8Format<F>;
  __shared__ uint4 column_amax[8][32];  // [row thread][t]: the AbsBits maxima of t's four columns over its 4 rows
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 128 + 4 * threadIdx.x;
  const bool active = col < cols;  // whole MX blocks: cols % 32 == 0
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  unsigned int sat_rows = 0, nan_rows = 0, sat_cols = 0, nan_cols = 0;
  // The thread's four float4 of the group of 32 rows from row g.
  const auto load = [&](int64_t g, float4 v[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = active ? *reinterpret_cast<const float4*>(m + (g + threadIdx.y + 8 * k) * cols + col)
                    : make_float4(0, 0, 0, 0);
    }
  };
  float4 next[4];
  if constexpr (kPrefetch) {
    if (r0 < r1) load(r0, next);
  }
  // r1 - r0 is a multiple of 32: every thread of the block runs the same groups.
  for (int64_t g = r0; g < r1; g += 32) {
    float4 v[4];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = next[k];
      if (g + 32 < r1) load(g + 32, next);
    } else {
      load(g, v);
    }
    float e[4][4];  // [k][j]: row g + threadIdx.y + 8k, column col + j
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      e[k][0] = v[k].x;
      e[k][1] = v[k].y;
      e[k][2] = v[k].z;
      e[k][3] = v[k].w;
    }
    // The column sums, the thread's rows in order.
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] += e[k][j];
    }
    // Along rows (the same branch for the whole block).
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (out_rows == nullptr) break;
      const uint32_t amax = RowBlockAbsMax(e[k]);
      if (!active) continue;
      const qcore::MxScale sc = qcore::MxScaleFromAmax(amax, c, kBump);
      float q[4];
      uint32_t code[4];
      MxRoundRow4<F, R>(e[k], sc, q, code);
      StoreOut4(out_rows, out_bf16, (g + threadIdx.y + 8 * k) * cols + col, q);
#pragma unroll
      for (int j = 0; j < 4; ++j) sat_rows += qcore::MxSaturated(e[k][j], code[j], sc, c) ? 1u : 0u;
      nan_rows += sc.nan && (threadIdx.x & 7) == 0 ? 1u : 0u;
    }
    // Down columns: each column's maximum over the 32 rows, through shared memory.
    uint32_t mine[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mine[j] = max(max(qcore::AbsBits(e[0][j]), qcore::AbsBits(e[1][j])),
                    max(qcore::AbsBits(e[2][j]), qcore::AbsBits(e[3][j])));
    }
    column_amax[threadIdx.y][threadIdx.x] = make_uint4(mine[0], mine[1], mine[2], mine[3]);
    __syncthreads();
    uint32_t amax[4] = {0, 0, 0, 0};
#pragma unroll
    for (int y = 0; y < 8; ++y) {
      const uint4 a = column_amax[y][threadIdx.x];
      amax[0] = max(amax[0], a.x);
      amax[1] = max(amax[1], a.y);
      amax[2] = max(amax[2], a.z);
      amax[3] = max(amax[3], a.w);
    }
    __syncthreads();  // read before the next group writes
    if (!active) continue;
    qcore::MxScale sc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sc[j] = qcore::MxScaleFromAmax(amax[j], c, kBump);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float q[4];
      uint32_t code[4];
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        // Computed unconditionally, NaN blocks selected after (as MxColsKernel).
        qcore::Rounded q0, q1;
        if constexpr (kHw) {
          qcore::MxFp8PairNearest<F, R>(e[k][j], e[k][j + 1], sc[j], sc[j + 1], true, &q0, &q1);
        } else {
          q0 = qcore::MxElementNearest<F, R>(e[k][j], sc[j]);
          q1 = qcore::MxElementNearest<F, R>(e[k][j + 1], sc[j + 1]);
        }
        if (sc[j].nan) q0 = qcore::MxNanElement(c);
        if (sc[j + 1].nan) q1 = qcore::MxNanElement(c);
        q[j] = q0.value;
        q[j + 1] = q1.value;
        code[j] = q0.code;
        code[j + 1] = q1.code;
      }
      StoreOut4(out_cols, out_bf16, (g + threadIdx.y + 8 * k) * cols + col, q);
#pragma unroll
      for (int j = 0; j < 4; ++j) sat_cols += qcore::MxSaturated(e[k][j], code[j], sc[j], c) ? 1u : 0u;
    }
    if (threadIdx.y == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) nan_cols += sc[j].nan ? 1u : 0u;
    }
  }
  // blockDim.x is 32, so threadIdx.x is the lane AddCounts expects; every lane calls it.
  if (counts_rows != nullptr) AddCounts(sat_rows, nan_rows, counts_rows);
  if (counts_cols != nullptr) AddCounts(sat_cols, nan_cols, counts_cols);
  if (partial == nullptr) return;
  float total[4];
  SumOverRowThreads<4>(acc, total);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[blockIdx.y * cols + col + j] = total[j];
  }
}

// ============================================================================
// Host helpers
// ============================================================================

// Whether an MX quantization along rows of a (rows x cols) operand can carry the
// column sums (QuantizeMxWithColumnSums): blocks of 32 columns, whole, nearest rounding.
bool MxRowsCarryColumnSums(const OperandFormat& f, int64_t cols) {
  return f.quantized() && IsMx(f.format) && f.mx_block == 32 && cols % 32 == 0 &&
         (f.rounding == Rounding::kNearestEven || f.rounding == Rounding::kNearestAway);
}

int64_t ColumnChunksOf(int64_t rows) { return std::min<int64_t>(128, CeilDiv(rows, 64)); }

// Whether LinearBackward's dy can be quantized for both of its GEMMs in one read
// (QuantizeMxBothAxesWithColumnSums): along rows a format that carries the column
// sums, down columns the same format, rounding and exponent rule, and whole
// 32-row blocks in every chunk of the column sums' split (rows % 32 == 0 and
// rows_per_chunk % 32 == 0).
bool MxBothAxesInOnePass(const OperandFormat& along_rows, const OperandFormat& down_columns, int64_t rows,
                         int64_t cols) {
  if (!MxRowsCarryColumnSums(along_rows, cols) || !down_columns.quantized()) return false;
  if (down_columns.format != along_rows.format || down_columns.mx_block != 32 ||
      down_columns.rounding != along_rows.rounding || down_columns.bump_exponent != along_rows.bump_exponent) {
    return false;
  }
  return rows % 32 == 0 && CeilDiv(rows, ColumnChunksOf(rows)) % 32 == 0;
}

// Whether an MX quantization down columns can take QuantizeMxDownColumnsInTiles.
bool MxDownColumnsInTiles(const OperandFormat& f, int axis, int64_t rows, int64_t cols) {
  return axis == 0 && f.quantized() && IsMx(f.format) && f.mx_block == 32 && rows % 32 == 0 && cols % 4 == 0 &&
         (f.rounding == Rounding::kNearestEven || f.rounding == Rounding::kNearestAway);
}

// MxBothAxesColumnPartialsKernel for `options`' element format, exponent rule and
// (nearest) rounding, in blocks of 32 x 8 threads, with the next group's loads
// in flight when `prefetch`.
Status LaunchMxBothAxes(const MxOptions& options, bool prefetch, dim3 grid, cudaStream_t stream, const float* x,
                        int64_t rows, int64_t cols, int64_t rows_per_chunk, void* out_rows, void* out_cols,
                        bool out_bf16, float* partial, unsigned long long* counts_rows,
                        unsigned long long* counts_cols) {
  return qcuda::WithElem(options.elem, [&](auto fmt) {
    return qcuda::WithBool(options.bump_exponent, [&](auto bump) {
      return qcuda::WithBool(prefetch, [&](auto ahead) {
        constexpr ElemFormat F = decltype(fmt)::value;
        constexpr bool kBump = decltype(bump)::value;
        constexpr bool kPrefetch = decltype(ahead)::value;
        if (options.rounding == Rounding::kNearestAway) {
          MxBothAxesColumnPartialsKernel<F, Rounding::kNearestAway, kBump, kPrefetch>
              <<<grid, dim3(32, 8), 0, stream>>>(x, rows, cols, rows_per_chunk, out_rows, out_cols, out_bf16, partial,
                                                 counts_rows, counts_cols);
        } else {
          MxBothAxesColumnPartialsKernel<F, Rounding::kNearestEven, kBump, kPrefetch>
              <<<grid, dim3(32, 8), 0, stream>>>(x, rows, cols, rows_per_chunk, out_rows, out_cols, out_bf16, partial,
                                                 counts_rows, counts_cols);
        }
        NN_LAUNCH_CHECK();
        return Status::Ok();
      });
    });
  });
}

bool IsPerTensor(QuantFormat f) { return f == QuantFormat::kFp8E4M3 || f == QuantFormat::kFp8E5M2; }
bool HasTensorScale(QuantFormat f) { return f == QuantFormat::kNvfp4 || IsPerTensor(f); }

std::string ShapeText(int64_t rows, int64_t in, int64_t out) {
  return "rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " + std::to_string(out);
}

Status CheckLinearShape(const char* what, int64_t rows, int64_t in, int64_t out) {
  if (rows < 1 || in < 1 || out < 1)
    return Status::Error(std::string(what) + ": shape: " + ShapeText(rows, in, out) +
                         " is not allowed; need every dimension >= 1");
  return Status::Ok();
}

// RHT belongs to NVFP4 and to the wgrad pair only, and then to both of its roles
// (so that the transforms cancel in dY^T X).
Status CheckRht(const LinearQuant& q, int64_t rows) {
  for (int r = 0; r < kRoleCount; ++r) {
    const OperandFormat& f = q.role[r];
    if (!f.quantized() || !f.rht) continue;
    if (f.format != QuantFormat::kNvfp4)
      return Status::Error(std::string("linear: role ") + RoleName(static_cast<Role>(r)) + ": rht is set for " +
                           QuantFormatName(f.format) + "; only nvfp4 has a random Hadamard transform");
    if (r != static_cast<int>(Role::kWgradDy) && r != static_cast<int>(Role::kWgradX))
      return Status::Error(std::string("linear: role ") + RoleName(static_cast<Role>(r)) +
                           ": rht is not allowed; only the wgrad roles (wgrad_dy, wgrad_x) take it");
  }
  const OperandFormat& dy = q.role[static_cast<int>(Role::kWgradDy)];
  const OperandFormat& x = q.role[static_cast<int>(Role::kWgradX)];
  const bool rht_dy = dy.quantized() && dy.rht, rht_x = x.quantized() && x.rht;
  if (rht_dy != rht_x)
    return Status::Error(std::string("linear: rht is set on ") + (rht_dy ? "wgrad_dy" : "wgrad_x") +
                         " only; set it on both wgrad roles (the transforms must cancel) or on neither");
  if (rht_dy && rows % 16 != 0)
    return Status::Error("linear: rows: " + std::to_string(rows) +
                         " is not allowed with the RHT on the wgrad roles; need a multiple of 16 (the RHT "
                         "rotates chunks of 16 tokens)");
  return Status::Ok();
}

}  // namespace

int64_t ColumnChunks(int64_t rows) { return ColumnChunksOf(rows); }

Status FinalizeColumnPartials(const float* partial, int64_t chunks, int64_t cols, float* out, cudaStream_t stream) {
  if (out == nullptr) return Status::Ok();
  ColumnFinalizeKernel<<<static_cast<unsigned int>(CeilDiv(cols, 32)), dim3(32, 8), 0, stream>>>(partial, chunks, cols,
                                                                                                 out);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

// ============================================================================
// Quantization
// ============================================================================

Status CudaBackend::Quantize(const float* x, int64_t rows, int64_t cols, int axis, const OperandFormat& f,
                             uint64_t seed, void* out, bool out_bf16, bool out_without_tensor_scale, uint8_t* codes,
                             float* amax, float* tensor_scale, unsigned long long* counts) {
  DeviceOutputs o;
  o.out = out;
  o.out_dtype = out_bf16 ? DType::kBF16 : DType::kF32;
  o.codes = codes;
  o.out_without_tensor_scale = out_without_tensor_scale;
  const int64_t count = rows * cols;
  if (f.format == QuantFormat::kBf16) {
    o.codes = nullptr;  // the stats need no bf16 codes
    o.counts = counts;
    return Bf16QuantizeCuda(x, DType::kF32, count, f.rounding, seed, o, stream_);
  }
  if (IsMx(f.format)) {
    o.counts = counts;
    // Down columns in tiles where it can (the same bits and counts), else the quantizer's own kernels.
    if (mx_cols_in_tiles_ && codes == nullptr && MxDownColumnsInTiles(f, axis, rows, cols) && Aligned(x, 16) &&
        Aligned(out, out_bf16 ? 8 : 16)) {
      return QuantizeMxDownColumnsInTiles(x, rows, cols, f, out, out_bf16, counts);
    }
    return MxQuantizeCuda(x, DType::kF32, rows, cols, MxOptionsOf(f, axis, seed), o, stream_);
  }
  if (f.format == QuantFormat::kNvfp4) {
    const Nvfp4Options options = Nvfp4OptionsOf(f, axis, seed);
    o.tensor_scale = tensor_scale;
    o.counts = counts;
    KEEL_RETURN_IF_ERROR(Nvfp4AmaxCuda(x, DType::kF32, rows, cols, options, amax, stream_));
    return Nvfp4QuantizeCuda(x, DType::kF32, rows, cols, options, amax, o, stream_);
  }
  o.tensor_scale = tensor_scale;
  KEEL_RETURN_IF_ERROR(Fp8TensorAmaxCuda(x, DType::kF32, count, amax, stream_));
  return Fp8TensorQuantizeCuda(x, DType::kF32, count, ElementOf(f.format), f.rounding, seed, amax, o, stream_);
}

Status CudaBackend::AddOperandStats(const float* x, int64_t count, const OperandFormat& f, const uint8_t* codes,
                                    const float* tensor_scale, int slot, Role role) {
  unsigned long long* pair = nullptr;
  int64_t index = 0;
  KEEL_RETURN_IF_ERROR(NextStatsPair(&pair, &index));
  const StatsArgs a{x, count, codes, tensor_scale, pair};
  // BF16, MX and NVFP4 count inside their quantizers (PrepareOperand); FP8 here.
  const unsigned int grid = GridFor(count);
  if (f.format == QuantFormat::kFp8E4M3) {
    Fp8StatsKernel<ElemFormat::kE4M3><<<grid, kThreads, 0, stream_>>>(a);
  } else if (f.format == QuantFormat::kFp8E5M2) {
    Fp8StatsKernel<ElemFormat::kE5M2><<<grid, kThreads, 0, stream_>>>(a);
  } else {
    return Status::Error(std::string("AddOperandStats: format ") + QuantFormatName(f.format) +
                         " counts its statistics in its quantizer");
  }
  NN_LAUNCH_CHECK();
  RecordStats(count, 1, true, slot, role, index);
  return Status::Ok();
}

Status CudaBackend::NextStatsPair(unsigned long long** pair, int64_t* index) {
  if (stats_pairs_used_ == stats_pair_capacity_) {
    // Every pair is counting: fold them (a wait) and reuse them, with twice the
    // room if one fold per step was not enough.
    KEEL_RETURN_IF_ERROR(FoldStats());
    const int64_t grown = stats_pair_capacity_ * 2;
    unsigned long long* bigger = nullptr;
    KEEL_CUDA_CHECK(cudaMalloc(&bigger, grown * 2 * sizeof(unsigned long long)));
    KEEL_CUDA_CHECK(cudaMemsetAsync(bigger, 0, grown * 2 * sizeof(unsigned long long), stream_));
    KEEL_CUDA_CHECK(cudaFree(stats_pairs_));
    stats_pairs_ = bigger;
    stats_pair_capacity_ = grown;
  }
  *index = stats_pairs_used_++;
  *pair = stats_pairs_ + 2 * *index;
  return Status::Ok();
}

void CudaBackend::RecordStats(int64_t count, int64_t blocks, bool per_tensor, int slot, Role role, int64_t index) {
  stats_calls_.push_back(StatsCall{slot, role, count, blocks, per_tensor, index});
}

void CudaBackend::RecordKeptStats(const KeptStats& kept, int64_t count, int slot, Role role) {
  if (kept.pair < 0 && !kept.folded) return;  // nothing was kept: the first use did not count
  if (!kept.folded) {
    RecordStats(count, kept.blocks, kept.per_tensor, slot, role, kept.pair);
    return;
  }
  OperandStats& s = host_stats_[static_cast<size_t>(slot) * kRoleCount + static_cast<int>(role)];
  s.elements += count;
  s.saturated += static_cast<int64_t>(kept.counts[0]);
  s.blocks += kept.blocks;
  s.nan_blocks += kept.per_tensor ? (kept.counts[1] > 0 ? 1 : 0) : static_cast<int64_t>(kept.counts[1]);
}

std::vector<CudaBackend::KeptStats*> CudaBackend::AllKeptStats() {
  std::vector<KeptStats*> all{&kept_dy_};
  for (ProducedBf16& p : produced_) all.push_back(&p.stats);
  for (auto* kept : {&kept_x_, &kept_w_}) {
    for (auto& k : *kept) {
      if (k != nullptr) all.push_back(&k->stats);
    }
  }
  return all;
}

namespace {

// Non-finite bf16 values of a rows x cols view (rows ld apart), into pair[1].
__global__ void Bf16NonfiniteKernel(const uint16_t* __restrict__ src, int64_t ld, int64_t rows, int64_t cols,
                                    unsigned long long* pair) {
  unsigned long long count = 0;
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    count += (src[(i / cols) * ld + i % cols] & 0x7F80u) == 0x7F80u ? 1 : 0;
  }
  count = WarpSum(count);
  if ((threadIdx.x & 31) == 0 && count > 0) atomicAdd(pair + 1, count);
}

}  // namespace

Status CudaBackend::NoteProduced(const uint16_t* out, unsigned long long** pair) {
  int64_t index = 0;
  KEEL_RETURN_IF_ERROR(NextStatsPair(pair, &index));
  auto it = std::find_if(produced_.begin(), produced_.end(), [out](const ProducedBf16& p) { return p.out == out; });
  if (it == produced_.end()) it = produced_.insert(produced_.end(), ProducedBf16{out, KeptStats()});
  it->stats = KeptStats();
  it->stats.pair = index;
  return Status::Ok();
}

Status CudaBackend::ContinueProduced(const uint16_t* out, unsigned long long** pair) {
  auto it = std::find_if(produced_.begin(), produced_.end(), [out](const ProducedBf16& p) { return p.out == out; });
  if (it != produced_.end() && it->stats.pair >= 0 && !it->stats.folded) {
    *pair = stats_pairs_ + 2 * it->stats.pair;
    return Status::Ok();
  }
  if (it != produced_.end()) produced_.erase(it);
  int64_t index = 0;
  return NextStatsPair(pair, &index);  // counted into, never read
}

Status CudaBackend::RecordBf16Stats(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, int slot,
                                    Role role) {
  for (const ProducedBf16& p : produced_) {
    if (p.out == src && (p.stats.pair >= 0 || p.stats.folded)) {
      RecordKeptStats(p.stats, rows * cols, slot, role);
      return Status::Ok();
    }
  }
  unsigned long long* pair = nullptr;
  int64_t index = 0;
  KEEL_RETURN_IF_ERROR(NextStatsPair(&pair, &index));
  Bf16NonfiniteKernel<<<GridFor(rows * cols), kThreads, 0, stream_>>>(src, ld, rows, cols, pair);
  NN_LAUNCH_CHECK();
  RecordStats(rows * cols, 1, true, slot, role, index);
  return Status::Ok();
}

namespace {

// Whether `a` and `b` round a tensor to the same BF16 bits: both BF16 with the
// same deterministic rounding.
bool SameBf16Rounding(const OperandFormat& a, const OperandFormat& b) {
  return a.quantized() && b.quantized() && a.format == QuantFormat::kBf16 && b.format == QuantFormat::kBf16 &&
         a.rounding == b.rounding && a.rounding != Rounding::kStochastic;
}

// Whether two operand formats quantize alike (kind, format, rounding, block, exponent rule, tiles, RHT).
bool SameFormat(const OperandFormat& a, const OperandFormat& b) {
  return a.kind == b.kind && a.format == b.format && a.rounding == b.rounding && a.mx_block == b.mx_block &&
         a.bump_exponent == b.bump_exponent && a.tile_16x16 == b.tile_16x16 && a.rht == b.rht;
}

}  // namespace

CudaBackend::KeptOperand* CudaBackend::KeptEntry(std::vector<std::unique_ptr<KeptOperand>>* kept, int slot) {
  const size_t i = static_cast<size_t>(slot);
  if (i >= kept->size()) kept->resize(i + 1);
  std::unique_ptr<KeptOperand>& k = (*kept)[i];
  if (k == nullptr) {
    k = std::make_unique<KeptOperand>();
    k->values.RefuseWhile(&on_side_);  // like every scratch: not from side work
  }
  return k.get();
}

CudaBackend::KeptOperand* CudaBackend::KeepFor(std::vector<std::unique_ptr<KeptOperand>>* kept, const LinearQuant& q,
                                                Role forward, Role backward, bool gemms_bf16) {
  if (q.keep_slot < 0) return nullptr;
  KeptOperand* k = KeptEntry(kept, q.keep_slot);
  k->valid = false;  // not keepable, or until the rounding below is queued
  const bool keepable =
      gemms_bf16 && SameBf16Rounding(q.role[static_cast<int>(forward)], q.role[static_cast<int>(backward)]);
  if (!keepable) return nullptr;
  k->mx = false;
  return k;
}

CudaBackend::KeptOperand* CudaBackend::KeepMxX(const LinearQuant& q, int64_t rows, int64_t cols, bool gemms_bf16) {
  if (!mx_keep_x_ || q.keep_slot < 0 || !gemms_bf16 || q.x_bf16 != nullptr) return nullptr;
  const OperandFormat& fwd = q.role[static_cast<int>(Role::kFwdX)];
  const OperandFormat& wgrad = q.role[static_cast<int>(Role::kWgradX)];
  if (q.hcp_fwd.count != 0 || q.hcp_wgrad_rows != 0 || fwd.rht || wgrad.rht) return nullptr;
  if (!MxBothAxesInOnePass(fwd, wgrad, rows, cols)) return nullptr;
  KeptOperand* k = KeptEntry(&kept_x_, q.keep_slot);
  k->valid = false;  // until the quantization is queued
  return k;
}

bool CudaBackend::TakeKept(std::vector<std::unique_ptr<KeptOperand>>* kept, const LinearQuant& q, const float* source,
                           int64_t rows, int64_t cols, Role backward, Operand* out) {
  if (q.keep_slot < 0 || static_cast<size_t>(q.keep_slot) >= kept->size()) return false;
  KeptOperand* k = (*kept)[static_cast<size_t>(q.keep_slot)].get();
  if (k == nullptr || !k->valid || k->source != source || k->rows != rows || k->cols != cols) return false;
  // A held w's copy serves every chunk's backward while the hold lasts (w unchanged), none after it.
  const bool held = held_w_ != nullptr && source == held_w_ && k->hold == hold_count_;
  if (k->taken && !held) {
    k->valid = false;
    return false;
  }
  const OperandFormat& f = q.role[static_cast<int>(backward)];
  if (k->mx ? !SameFormat(f, k->format)
            : (!f.quantized() || f.format != QuantFormat::kBf16 || f.rounding != k->rounding)) {
    return false;
  }
  // Statistics wanted but the forward's pair is gone (a reset between): round again.
  if (q.stats_slot >= 0 && k->stats.pair < 0 && !k->stats.folded) return false;
  out->data = k->values.get<void>();
  out->tensor_scale = nullptr;
  // Counted once a hold, as a held MX w's dgrad copy is (HoldWeight).
  if (q.stats_slot >= 0 && !k->taken) RecordKeptStats(k->stats, rows * cols, q.stats_slot, backward);
  if (held) {
    k->taken = true;
  } else {
    k->valid = false;  // one backward per forward
  }
  return true;
}

Status CudaBackend::FoldStats() {
  std::vector<unsigned long long> raw(static_cast<size_t>(stats_pairs_used_) * 2);
  if (!raw.empty()) {
    KEEL_CUDA_CHECK(cudaMemcpyAsync(raw.data(), stats_pairs_, raw.size() * sizeof(unsigned long long),
                                   cudaMemcpyDeviceToHost, stream_));
  }
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const StatsCall& c : stats_calls_) {
    OperandStats& s = host_stats_[static_cast<size_t>(c.slot) * kRoleCount + static_cast<int>(c.role)];
    const unsigned long long saturated = raw[2 * c.pair], nonfinite = raw[2 * c.pair + 1];
    s.elements += c.elements;
    s.saturated += static_cast<int64_t>(saturated);
    s.blocks += c.blocks;
    s.nan_blocks += c.per_tensor ? (nonfinite > 0 ? 1 : 0) : static_cast<int64_t>(nonfinite);
  }
  for (KeptStats* k : AllKeptStats()) {
    if (k->pair < 0 || k->folded) continue;
    k->counts[0] = raw[2 * k->pair];
    k->counts[1] = raw[2 * k->pair + 1];
    k->folded = true;
  }
  if (!raw.empty())
    KEEL_CUDA_CHECK(cudaMemsetAsync(stats_pairs_, 0, raw.size() * sizeof(unsigned long long), stream_));
  stats_calls_.clear();
  stats_pairs_used_ = 0;
  return Status::Ok();
}

Status CudaBackend::PrepareOperand(const float* x, int64_t rows, int64_t cols, int axis, Role role,
                                   const LinearQuant& q, bool bf16, Scratch* scratch, Operand* out, KeptStats* keep,
                                   float* column_sums) {
  const OperandFormat& f = q.role[static_cast<int>(role)];
  out->tensor_scale = nullptr;
  if (keep != nullptr) *keep = KeptStats();
  const bool mx_sums = column_sums != nullptr && axis == 1 && MxRowsCarryColumnSums(f, cols);
  if (column_sums != nullptr && !mx_sums && !(f.quantized() && f.format == QuantFormat::kBf16))
    return Status::Error(std::string("linear: role ") + RoleName(role) +
                         ": column sums ride only on a bf16 rounding or an MX quantization along rows (block 32, "
                         "nearest rounding); this role is " + (f.quantized() ? QuantFormatName(f.format) : "fp32"));
  if (!f.quantized()) {  // fp32 GEMM on the unquantized operand
    out->data = x;
    return Status::Ok();
  }
  const int64_t count = rows * cols;
  KEEL_RETURN_IF_ERROR(Aligned16Input(&x, count));  // the quantizers load 16 bytes at a time
  KEEL_RETURN_IF_ERROR(scratch->Reserve(static_cast<size_t>(count) * (bf16 ? 2 : 4), stream_));
  const bool stats = q.stats_slot >= 0;
  // BF16, MX and NVFP4 count their statistics while they quantize: no codes,
  // scales or second pass. Per-tensor FP8 keeps its codes for its statistics kernel.
  const bool fused_stats =
      stats && (f.format == QuantFormat::kBf16 || IsMx(f.format) || f.format == QuantFormat::kNvfp4);
  uint8_t* codes = nullptr;
  if (stats && !fused_stats) {
    KEEL_RETURN_IF_ERROR(codes_.Reserve(static_cast<size_t>(count) + 16, stream_));
    codes = codes_.get<uint8_t>();
  }
  const int r = static_cast<int>(role);
  float* amax = small_ + kAmaxSlot + r;
  float* tensor_scale = small_ + kTensorScaleSlot + r;
  // The per-tensor decode scale stays out of the values and goes into alpha.
  unsigned long long* counts = nullptr;
  int64_t pair = -1;
  if (fused_stats) KEEL_RETURN_IF_ERROR(NextStatsPair(&counts, &pair));
  if (mx_sums) {
    NN_PROFILE("quantize + dbias");
    const Status s = QuantizeMxWithColumnSums(x, rows, cols, f, scratch->get<void>(), bf16, counts, column_sums);
    if (!s.ok()) return Status::Error(std::string("linear: role ") + RoleName(role) + ": " + s.message());
  } else if (column_sums != nullptr) {
    NN_PROFILE("quantize + dbias");
    const Status s = QuantizeBf16WithColumnSums(x, rows, cols, f, RoleSeed(q.seed, role), scratch->get<void>(), bf16,
                                                counts, column_sums);
    if (!s.ok()) return Status::Error(std::string("linear: role ") + RoleName(role) + ": " + s.message());
  } else {
    NN_PROFILE("quantize");
    const Status s = Quantize(x, rows, cols, axis, f, RoleSeed(q.seed, role), scratch->get<void>(), bf16, true,
                              codes, amax, tensor_scale, counts);
    if (!s.ok()) return Status::Error(std::string("linear: role ") + RoleName(role) + ": " + s.message());
  }
  if (fused_stats) {
    const bool bf16_stats = f.format == QuantFormat::kBf16;
    const int64_t blocks = bf16_stats ? 1 : IsMx(f.format) ? MxScaleCount(rows, cols, f.mx_block, axis) : count / 16;
    RecordStats(count, blocks, bf16_stats, q.stats_slot, role, pair);
    if (keep != nullptr) keep->pair = pair;
  } else if (stats) {
    NN_PROFILE("operand stats");
    KEEL_RETURN_IF_ERROR(AddOperandStats(x, count, f, codes, tensor_scale, q.stats_slot, role));
  }
  out->data = scratch->get<void>();
  if (HasTensorScale(f.format)) out->tensor_scale = tensor_scale;
  return Status::Ok();
}

Status CudaBackend::Alpha(const Operand& a, const Operand& b, int gemm, const float** alpha) {
  if (a.tensor_scale == nullptr && b.tensor_scale == nullptr) {
    *alpha = blas_.one();
    return Status::Ok();
  }
  float* slot = small_ + kAlphaSlot + gemm;
  AlphaKernel<<<1, 1, 0, stream_>>>(a.tensor_scale, b.tensor_scale, slot);
  NN_LAUNCH_CHECK();
  *alpha = slot;
  return Status::Ok();
}

Status CudaBackend::QuantizeBf16WithColumnSums(const float* x, int64_t rows, int64_t cols, const OperandFormat& f,
                                               uint64_t seed, void* out, bool out_bf16, unsigned long long* counts,
                                               float* column_sums) {
  if (f.format != QuantFormat::kBf16)
    return Status::Error(std::string("QuantizeBf16WithColumnSums: format ") + QuantFormatName(f.format) +
                         " is not allowed; only bf16 rounds elementwise");
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 1, &split));
  const int64_t chunks = split.chunks, rows_per_chunk = split.rows_per_chunk;
  float* partial = split.partial;
  const dim3 grid(static_cast<unsigned int>(CeilDiv(cols, 32)), static_cast<unsigned int>(chunks));
  switch (f.rounding) {
    case Rounding::kNearestEven:
      Bf16ColumnPartialsKernel<Rounding::kNearestEven><<<grid, dim3(32, 8), 0, stream_>>>(
          MatrixValues{x}, rows, cols, rows_per_chunk, seed, out, out_bf16, partial, counts);
      break;
    case Rounding::kNearestAway:
      Bf16ColumnPartialsKernel<Rounding::kNearestAway><<<grid, dim3(32, 8), 0, stream_>>>(
          MatrixValues{x}, rows, cols, rows_per_chunk, seed, out, out_bf16, partial, counts);
      break;
    case Rounding::kStochastic:
      Bf16ColumnPartialsKernel<Rounding::kStochastic><<<grid, dim3(32, 8), 0, stream_>>>(
          MatrixValues{x}, rows, cols, rows_per_chunk, seed, out, out_bf16, partial, counts);
      break;
    default:
      return Status::Error("QuantizeBf16WithColumnSums: rounding: " + std::to_string(static_cast<int>(f.rounding)) +
                           " is not a rounding mode");
  }
  NN_LAUNCH_CHECK();
  return FinalizeColumnPartials(partial, chunks, cols, column_sums, stream_);
}

Status CudaBackend::GeluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t cols,
                                     float* column_sums) {
  NN_PROFILE("GeluBackwardBf16");
  if (rows < 0 || cols < 0)
    return Status::Error("GeluBackwardBf16: rows " + std::to_string(rows) + ", cols " + std::to_string(cols) +
                         " is not allowed; need both >= 0");
  if (rows == 0 || cols == 0) return Status::Ok();
  if (x == nullptr || dy == nullptr || dx == nullptr) return Status::Error("GeluBackwardBf16: x, dy or dx: null");
  unsigned long long* pair = nullptr;
  KEEL_RETURN_IF_ERROR(NoteProduced(dx, &pair));
  // LinearBackward's dbias pass for a BF16 dy (QuantizeBf16WithColumnSums),
  // reading GELU's backward instead of a stored dy: the same rounding, the same
  // partials in the same order.
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 1, &split));
  const bool by4 = cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(dy) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dx) % 8 == 0;
  if (by4) {
    // Four columns per thread, the same bits (GeluGradBf16ColumnPartials4Kernel).
    const dim3 grid(static_cast<unsigned int>(CeilDiv(cols, 128)), static_cast<unsigned int>(split.chunks));
    GeluGradBf16ColumnPartials4Kernel<<<grid, dim3(32, 8), 0, stream_>>>(x, dy, rows, cols, split.rows_per_chunk, dx,
                                                                         split.partial, pair);
  } else {
    const dim3 grid(static_cast<unsigned int>(CeilDiv(cols, 32)), static_cast<unsigned int>(split.chunks));
    Bf16ColumnPartialsKernel<Rounding::kNearestEven><<<grid, dim3(32, 8), 0, stream_>>>(
        GeluGradValues{x, dy}, rows, cols, split.rows_per_chunk, 0, dx, true, split.partial, pair);
  }
  NN_LAUNCH_CHECK();
  if (column_sums == nullptr) return Status::Ok();
  return FinalizeColumnPartials(split.partial, split.chunks, cols, column_sums, stream_);
}

Status CudaBackend::QuantizeMxWithColumnSums(const float* x, int64_t rows, int64_t cols, const OperandFormat& f,
                                             void* out, bool out_bf16, unsigned long long* counts,
                                             float* column_sums) {
  if (!MxRowsCarryColumnSums(f, cols))
    return Status::Error(std::string("QuantizeMxWithColumnSums: format ") + QuantFormatName(f.format) + ", block " +
                         std::to_string(f.mx_block) + ", cols " + std::to_string(cols) +
                         " is not allowed; need an MX format, block 32, cols a multiple of 32, nearest rounding");
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 1, &split));
  const int64_t chunks = split.chunks, rows_per_chunk = split.rows_per_chunk;
  float* partial = split.partial;
  const dim3 grid(static_cast<unsigned int>(CeilDiv(cols, 128)), static_cast<unsigned int>(chunks));
  const MxOptions options = MxOptionsOf(f, 1, 0);
  KEEL_RETURN_IF_ERROR(qcuda::WithElem(options.elem, [&](auto fmt) {
    return qcuda::WithBool(options.bump_exponent, [&](auto bump) {
      constexpr ElemFormat F = decltype(fmt)::value;
      constexpr bool kBump = decltype(bump)::value;
      if (options.rounding == Rounding::kNearestAway) {
        MxRowsColumnPartialsKernel<F, Rounding::kNearestAway, kBump><<<grid, dim3(32, 8), 0, stream_>>>(
            x, rows, cols, rows_per_chunk, out, out_bf16, partial, counts);
      } else {
        MxRowsColumnPartialsKernel<F, Rounding::kNearestEven, kBump><<<grid, dim3(32, 8), 0, stream_>>>(
            x, rows, cols, rows_per_chunk, out, out_bf16, partial, counts);
      }
      NN_LAUNCH_CHECK();
      return Status::Ok();
    });
  }));
  return FinalizeColumnPartials(partial, chunks, cols, column_sums, stream_);
}

Status CudaBackend::QuantizeMxBothAxesWithColumnSums(const float* x, int64_t rows, int64_t cols,
                                                     const OperandFormat& along_rows, const OperandFormat& down_columns,
                                                     void* out_rows, void* out_cols, bool out_bf16,
                                                     unsigned long long* counts_rows, unsigned long long* counts_cols,
                                                     float* column_sums) {
  if (!MxBothAxesInOnePass(along_rows, down_columns, rows, cols))
    return Status::Error("QuantizeMxBothAxesWithColumnSums: formats " + std::string(QuantFormatName(along_rows.format)) +
                         " along rows and " + QuantFormatName(down_columns.format) + " down columns, shape " +
                         std::to_string(rows) + " x " + std::to_string(cols) +
                         " is not allowed; need one MX format, block 32 and nearest rounding both ways, cols a "
                         "multiple of 32, rows a multiple of 32 whose column-sum chunks are too");
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 1, &split));
  const int64_t chunks = split.chunks, rows_per_chunk = split.rows_per_chunk;
  float* partial = column_sums != nullptr ? split.partial : nullptr;
  const dim3 grid(static_cast<unsigned int>(CeilDiv(cols, 128)), static_cast<unsigned int>(chunks));
  KEEL_RETURN_IF_ERROR(LaunchMxBothAxes(MxOptionsOf(along_rows, 1, 0), mx_tiles_prefetch_, grid, stream_, x, rows, cols,
                                        rows_per_chunk, out_rows, out_cols, out_bf16, partial, counts_rows,
                                        counts_cols));
  if (column_sums == nullptr) return Status::Ok();
  return FinalizeColumnPartials(partial, chunks, cols, column_sums, stream_);
}

Status CudaBackend::QuantizeMxDownColumnsInTiles(const float* x, int64_t rows, int64_t cols, const OperandFormat& f,
                                                 void* out, bool out_bf16, unsigned long long* counts) {
  if (!MxDownColumnsInTiles(f, 0, rows, cols))
    return Status::Error("QuantizeMxDownColumnsInTiles: format " + std::string(QuantFormatName(f.format)) +
                         ", block " + std::to_string(f.mx_block) + ", shape " + std::to_string(rows) + " x " +
                         std::to_string(cols) +
                         " is not allowed; need an MX format, block 32, nearest rounding, rows a multiple of 32 "
                         "and cols of 4");
  NN_PROFILE("mx down columns in tiles");
  // Chunks of whole 32-row blocks, about 64 rows each and at most 128 of them (the
  // column sums' split, rounded up to blocks).
  const int64_t rows_per_chunk = CeilDiv(CeilDiv(rows, ColumnChunksOf(rows)), 32) * 32;
  const int64_t chunks = CeilDiv(rows, rows_per_chunk);
  const dim3 grid(static_cast<unsigned int>(CeilDiv(cols, 128)), static_cast<unsigned int>(chunks));
  return LaunchMxBothAxes(MxOptionsOf(f, 0, 0), mx_tiles_prefetch_, grid, stream_, x, rows, cols, rows_per_chunk,
                          nullptr, out, out_bf16, nullptr, nullptr, counts);
}

Status CudaBackend::Aligned16Input(const float** x, int64_t count) {
  if (Aligned(*x, 16)) return Status::Ok();
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  KEEL_RETURN_IF_ERROR(align_in_.Reserve(bytes, stream_));
  KEEL_CUDA_CHECK(cudaMemcpyAsync(align_in_.get<float>(), *x, bytes, cudaMemcpyDeviceToDevice, stream_));
  *x = align_in_.get<float>();
  return Status::Ok();
}

Status CudaBackend::QuantizeBothAxes(const float* x, int64_t rows, int64_t cols, Role along_rows, Role down_columns,
                                     const LinearQuant& q, Scratch* rows_out, Scratch* cols_out, float* column_sums,
                                     const char* part, int64_t* pair_rows, int64_t* pair_cols) {
  const OperandFormat& f_rows = q.role[static_cast<int>(along_rows)];
  const OperandFormat& f_cols = q.role[static_cast<int>(down_columns)];
  const int64_t count = rows * cols;
  KEEL_RETURN_IF_ERROR(Aligned16Input(&x, count));  // the kernel loads 16 bytes at a time
  KEEL_RETURN_IF_ERROR(rows_out->Reserve(static_cast<size_t>(count) * 2, stream_));
  KEEL_RETURN_IF_ERROR(cols_out->Reserve(static_cast<size_t>(count) * 2, stream_));
  unsigned long long *counts_rows = nullptr, *counts_cols = nullptr;
  *pair_rows = *pair_cols = -1;
  if (q.stats_slot >= 0) {
    KEEL_RETURN_IF_ERROR(NextStatsPair(&counts_rows, pair_rows));
    KEEL_RETURN_IF_ERROR(NextStatsPair(&counts_cols, pair_cols));
    // The second call folded and regrew the pairs: the first one went with them.
    if (*pair_cols < *pair_rows) KEEL_RETURN_IF_ERROR(NextStatsPair(&counts_rows, pair_rows));
  }
  NN_PROFILE(part);
  const Status s = QuantizeMxBothAxesWithColumnSums(x, rows, cols, f_rows, f_cols, rows_out->get<void>(),
                                                    cols_out->get<void>(), true, counts_rows, counts_cols,
                                                    column_sums);
  if (!s.ok()) {
    return Status::Error(std::string("linear: roles ") + RoleName(along_rows) + " and " + RoleName(down_columns) +
                         ": " + s.message());
  }
  return Status::Ok();
}

Status CudaBackend::PrepareDyBothAxes(const float* dy, int64_t rows, int64_t cols, const LinearQuant& q,
                                      Operand* along_rows, Operand* down_columns, float* column_sums) {
  int64_t pair_rows = -1, pair_cols = -1;
  KEEL_RETURN_IF_ERROR(QuantizeBothAxes(dy, rows, cols, Role::kDgradDy, Role::kWgradDy, q, &op_a_, &op_dy_cols_,
                                        column_sums,
                                        column_sums != nullptr ? "quantize dy both ways + dbias" : "quantize dy both ways",
                                        &pair_rows, &pair_cols));
  if (q.stats_slot >= 0) {
    const int64_t count = rows * cols;
    RecordStats(count, MxScaleCount(rows, cols, 32, 1), false, q.stats_slot, Role::kDgradDy, pair_rows);
    RecordStats(count, MxScaleCount(rows, cols, 32, 0), false, q.stats_slot, Role::kWgradDy, pair_cols);
  }
  along_rows->data = op_a_.get<void>();
  along_rows->tensor_scale = nullptr;
  down_columns->data = op_dy_cols_.get<void>();
  down_columns->tensor_scale = nullptr;
  return Status::Ok();
}

Status CudaBackend::PrepareXBothAxes(const float* x, int64_t rows, int64_t cols, const LinearQuant& q,
                                     Operand* along_rows, KeptOperand* k) {
  int64_t pair_rows = -1, pair_cols = -1;
  KEEL_RETURN_IF_ERROR(QuantizeBothAxes(x, rows, cols, Role::kFwdX, Role::kWgradX, q, &op_a_, &k->values, nullptr,
                                        "quantize x both ways", &pair_rows, &pair_cols));
  k->stats = KeptStats();
  if (q.stats_slot >= 0) {
    RecordStats(rows * cols, MxScaleCount(rows, cols, 32, 1), false, q.stats_slot, Role::kFwdX, pair_rows);
    k->stats.pair = pair_cols;  // wgrad_x's, recorded by the backward that takes the copy
    k->stats.blocks = MxScaleCount(rows, cols, 32, 0);
    k->stats.per_tensor = false;
  }
  along_rows->data = op_a_.get<void>();
  along_rows->tensor_scale = nullptr;
  return Status::Ok();
}

Status CudaBackend::SplitColumnSums(int64_t rows, int64_t cols, int sets, ColumnSplit* split,
                                    int64_t rows_per_chunk) {
  split->chunks = rows_per_chunk > 0 ? CeilDiv(rows, rows_per_chunk) : ColumnChunks(rows);  // a fixed function of the shape
  split->rows_per_chunk = rows_per_chunk > 0 ? rows_per_chunk : CeilDiv(rows, split->chunks);
  KEEL_RETURN_IF_ERROR(
      partials_.Reserve(static_cast<size_t>(sets * split->chunks * cols) * sizeof(float), stream_));
  split->partial = partials_.get<float>();
  return Status::Ok();
}

Status CudaBackend::ColumnSums(const float* m, int64_t rows, int64_t cols, float* out) {
  if (rows <= 0 || cols <= 0) return Status::Ok();
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 1, &split));
  const int64_t chunks = split.chunks, rows_per_chunk = split.rows_per_chunk;
  float* partial = split.partial;
  ColumnPartialsKernel<<<dim3(static_cast<unsigned int>(CeilDiv(cols, 32)), static_cast<unsigned int>(chunks)),
                         dim3(32, 8), 0, stream_>>>(m, rows, cols, rows_per_chunk, partial);
  NN_LAUNCH_CHECK();
  return FinalizeColumnPartials(partial, chunks, cols, out, stream_);
}

// ============================================================================
// Linear layer
// ============================================================================

Status CudaBackend::CheckStatsSlot(const char* op, int slot) const {
  if (slot >= -1 && slot < stats_slots_) return Status::Ok();
  return Status::Error(std::string(op) + ": stats_slot: " + std::to_string(slot) +
                       " is not allowed; need -1 or 0.." + std::to_string(stats_slots_ - 1) +
                       " (ResetOperandStats made " + std::to_string(stats_slots_) + " slots)");
}

namespace {

// A weight's quantized copy that is the same bits on every call: nearest
// rounding (stochastic draws could differ by call), no per-tensor scale (alpha
// reads it from a slot the next quantization overwrites), no RHT.
bool HoldableWeight(const OperandFormat& f) {
  return f.quantized() && f.rounding != Rounding::kStochastic && !HasTensorScale(f.format) && !f.rht;
}

}  // namespace

Status CudaBackend::HoldWeight(const float* w) {
  held_w_ = held_weight_ ? w : nullptr;  // KEEL_CUDA_OFF=held_weight: every call quantizes afresh
  if (held_w_ != nullptr) ++hold_count_;
  for (HeldOperand& h : held_) h.valid = false;
  return Status::Ok();
}

bool CudaBackend::ReuseHeldKept(const LinearQuant& q, const float* w, int64_t rows, int64_t cols, Operand* out) {
  if (held_w_ == nullptr || w != held_w_ || q.keep_slot < 0 || static_cast<size_t>(q.keep_slot) >= kept_w_.size())
    return false;
  const KeptOperand* k = kept_w_[static_cast<size_t>(q.keep_slot)].get();
  const OperandFormat& f = q.role[static_cast<int>(Role::kFwdW)];
  // Rounded in this hold (w unchanged since), from this w and shape, the same rounding.
  if (k == nullptr || !k->valid || k->hold != hold_count_ || k->source != w || k->rows != rows || k->cols != cols ||
      !SameBf16Rounding(f, q.role[static_cast<int>(Role::kDgradW)]) || k->rounding != f.rounding)
    return false;
  out->data = k->values.get<void>();  // no pass, no statistics: counted by the forward that rounded it
  out->tensor_scale = nullptr;
  return true;
}

Status CudaBackend::PrepareWeight(const float* w, int64_t rows, int64_t cols, int axis, Role role,
                                  const LinearQuant& q, bool bf16, Operand* out) {
  const OperandFormat& f = q.role[static_cast<int>(role)];
  if (w != held_w_ || !HoldableWeight(f)) return PrepareOperand(w, rows, cols, axis, role, q, bf16, &op_b_, out);
  HeldOperand& h = held_[role == Role::kFwdW ? 0 : 1];
  if (h.valid && h.rows == rows && h.cols == cols && h.bf16 == bf16 && SameFormat(h.format, f)) {
    out->data = h.values.get<void>();  // quantized by an earlier call: no pass, no statistics
    out->tensor_scale = nullptr;
    return Status::Ok();
  }
  h.valid = false;
  KEEL_RETURN_IF_ERROR(PrepareOperand(w, rows, cols, axis, role, q, bf16, &h.values, out));
  h.format = f;
  h.rows = rows;
  h.cols = cols;
  h.bf16 = bf16;
  h.valid = true;
  return Status::Ok();
}

Status CudaBackend::LinearForward(const float* x, const float* w, const float* bias, const float* residual,
                                  float* y, int64_t rows, int64_t in, int64_t out, const LinearQuant& q) {
  NN_PROFILE("LinearForward");
  KEEL_RETURN_IF_ERROR(CheckLinearShape("LinearForward", rows, in, out));
  // x arrives rounded to bf16 by its producer: x itself is not read.
  const bool bf16_x = q.x_bf16 != nullptr;
  KEEL_RETURN_IF_ERROR(CheckXBf16("LinearForward", q, in));
  if ((x == nullptr && !bf16_x) || w == nullptr || y == nullptr) return Status::Error("LinearForward: x, w or y: null");
  if (residual == y)
    return Status::Error("LinearForward: residual: the same buffer as y is not allowed; pass a separate residual "
                         "(as the CPU backend requires)");
  KEEL_RETURN_IF_ERROR(CheckRht(q, rows));
  KEEL_RETURN_IF_ERROR(CheckStatsSlot("LinearForward", q.stats_slot));
  KEEL_RETURN_IF_ERROR(CheckHotChannelCounts("LinearForward", "hcp_fwd", q.hcp_fwd, in));
  // x given in bf16 is analysed where it lies (no fp32 copy).
  if (bf16_x) {
    KEEL_RETURN_IF_ERROR(
        AnalyzeOperandBf16("LinearForward", Role::kFwdX, q.x_bf16, q.x_bf16_ld, rows, in, q.analytics_slot));
  } else {
    KEEL_RETURN_IF_ERROR(AnalyzeOperand("LinearForward", Role::kFwdX, x, rows, in, q.analytics_slot));
  }
  KEEL_RETURN_IF_ERROR(AnalyzeOperand("LinearForward", Role::kFwdW, w, out, in, q.analytics_slot));
  const bool bf16 = q.role[static_cast<int>(Role::kFwdX)].quantized() && q.role[static_cast<int>(Role::kFwdW)].quantized();
  Operand qx, qw;
  // The backward's wgrad (for x) and dgrad (for w) may reuse these roundings.
  auto quantized = [&q](Role r) { return q.role[static_cast<int>(r)].quantized(); };
  // (x given in bf16 needs no copy kept: the backward reads it again.)
  const bool wgrad_bf16 = quantized(Role::kWgradDy) && quantized(Role::kWgradX);
  // An MX x quantized both ways in one read, its wgrad copy kept (mx_keep_x), else a shared bf16 rounding.
  KeptOperand* kmx = KeepMxX(q, rows, in, bf16 && wgrad_bf16);
  KeptOperand* kx = kmx != nullptr ? nullptr : KeepFor(&kept_x_, q, Role::kFwdX, Role::kWgradX, !bf16_x && bf16 && wgrad_bf16);
  const bool keep_w = bf16 && quantized(Role::kDgradDy) && quantized(Role::kDgradW);
  // A held BF16 w that an earlier chunk's forward rounded and kept: used as it is, still kept.
  const bool w_reused = keep_w && ReuseHeldKept(q, w, out, in, &qw);
  KeptOperand* kw = w_reused ? nullptr : KeepFor(&kept_w_, q, Role::kFwdW, Role::kDgradW, keep_w);
  if (bf16_x) {
    qx.data = q.x_bf16;
    if (q.stats_slot >= 0)
      KEEL_RETURN_IF_ERROR(RecordBf16Stats(q.x_bf16, q.x_bf16_ld, rows, in, q.stats_slot, Role::kFwdX));
  } else if (kmx != nullptr) {
    KEEL_RETURN_IF_ERROR(PrepareXBothAxes(x, rows, in, q, &qx, kmx));
    kmx->source = x;
    kmx->rows = rows;
    kmx->cols = in;
    kmx->rounding = q.role[static_cast<int>(Role::kWgradX)].rounding;
    kmx->format = q.role[static_cast<int>(Role::kWgradX)];
    kmx->mx = true;
    kmx->hold = 0;
    kmx->taken = false;
    kmx->valid = true;
  } else {
    KEEL_RETURN_IF_ERROR(PrepareOperand(x, rows, in, 1, Role::kFwdX, q, bf16, kx != nullptr ? &kx->values : &op_a_,
                                        &qx, kx != nullptr ? &kx->stats : nullptr));
  }
  if (kw != nullptr) {
    KEEL_RETURN_IF_ERROR(PrepareOperand(w, out, in, 1, Role::kFwdW, q, bf16, &kw->values, &qw, &kw->stats));
    kw->hold = w == held_w_ ? hold_count_ : 0;
  } else if (!w_reused) {
    KEEL_RETURN_IF_ERROR(PrepareWeight(w, out, in, 1, Role::kFwdW, q, bf16, &qw));  // held, or fresh in op_b_
  }
  for (auto [k, source, k_rows, role] : {std::make_tuple(kx, x, rows, Role::kFwdX), std::make_tuple(kw, w, out, Role::kFwdW)}) {
    if (k == nullptr) continue;
    k->source = source;
    k->rows = k_rows;
    k->cols = in;
    k->rounding = q.role[static_cast<int>(role)].rounding;
    k->taken = false;
    k->valid = true;
  }
  GemmArgs g;
  // y^T (out x rows, column-major) = W (stored in x out) ^T . X^T (stored in x rows).
  g.bf16 = bf16;
  g.trans_a = true;
  g.Shape(out, rows, in).A(qw.data, in).B(qx.data, bf16_x ? q.x_bf16_ld : in).C(y, out);
  KEEL_RETURN_IF_ERROR(Alpha(qx, qw, 0, &g.alpha));
  // The hot input channels' residual products (docs/hcp.md): folded into this
  // GEMM when it is BF16, else a second GEMM after it.
  const HcpSide hcp_a = HcpAlongRows(x, rows, in, qx.data, qx.tensor_scale, bf16);
  const HcpSide hcp_b = HcpAlongRows(w, out, in, qw.data, qw.tensor_scale, bf16);
  const int32_t* hot = nullptr;
  if (q.hcp_fwd.count > 0) {
    KEEL_RETURN_IF_ERROR(HotSet(hcp_a, hcp_b, in, q.hcp_fwd, &hot));
    if (bf16) KEEL_RETURN_IF_ERROR(FoldHcpPatch(0, hcp_a, hcp_b, hot, q.hcp_fwd.count, &g));
  }
  // The residual is the GEMM's C with beta = 1 (D = y): it is read in the
  // epilogue instead of by a separate Add, and alpha (the decode scales) does
  // not touch it.
  if (residual != nullptr) {
    g.accumulate = true;
    g.c_in = residual;
  }
  // The bias rides in the GEMM's epilogue (y = alpha * acc + bias, what the CPU
  // computes in two steps; with a residual cuBLASLt adds the bias last:
  // y = (alpha * acc + residual) + bias, the CPU's three terms in another order)
  // unless cuBLASLt has no such algorithm for the shape; then the same sum with
  // the bias added by a kernel of its own.
  NN_PROFILE("gemm");
  bool epilogue_bias = bias != nullptr && Aligned(bias, 16);
  if (epilogue_bias) {
    g.bias = bias;
    if (!blas_.Gemm(g).ok()) epilogue_bias = false;
    g.bias = nullptr;
  }
  if (!epilogue_bias) KEEL_RETURN_IF_ERROR(blas_.Gemm(g));
  if (bias != nullptr && !epilogue_bias) {
    AddBiasKernel<<<GridFor(rows * out), kThreads, 0, stream_>>>(y, bias, rows, out);
    NN_LAUNCH_CHECK();
  }
  if (q.hcp_fwd.count > 0 && !bf16) KEEL_RETURN_IF_ERROR(AddHcpPatch(hcp_a, hcp_b, hot, q.hcp_fwd.count, y, out));
  return Status::Ok();
}

Status CudaBackend::LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                                   float* dbias, int64_t rows, int64_t in, int64_t out, const LinearQuant& q) {
  NN_PROFILE("LinearBackward");
  KEEL_RETURN_IF_ERROR(CheckLinearShape("LinearBackward", rows, in, out));
  // dy arrives rounded to bf16 (the head's, from CrossEntropyFusedBf16): dy itself is not read.
  const bool bf16_dy = q.dy_bf16 != nullptr;
  KEEL_RETURN_IF_ERROR(CheckDyBf16("LinearBackward", q, out, dbias));
  // x arrives rounded to bf16 by its producer (as the forward read it): x itself is not read.
  const bool bf16_x = q.x_bf16 != nullptr;
  KEEL_RETURN_IF_ERROR(CheckXBf16("LinearBackward", q, in));
  if ((x == nullptr && !bf16_x) || w == nullptr || (dy == nullptr && !bf16_dy) || dw == nullptr) {
    return Status::Error("LinearBackward: x, w, dy or dw: null");
  }
  KEEL_RETURN_IF_ERROR(CheckHotChannelCounts("LinearBackward", "hcp_dgrad", q.hcp_dgrad, out));
  KEEL_RETURN_IF_ERROR(CheckHcpWgradRows("LinearBackward", q, rows));
  KEEL_RETURN_IF_ERROR(CheckRht(q, rows));
  KEEL_RETURN_IF_ERROR(CheckStatsSlot("LinearBackward", q.stats_slot));
  // dy or x given in bf16 is analysed where it lies (no fp32 copy: the head's
  // dy would be bt x padded_vocab floats).
  auto analyze_dy = [&](Role role) {
    return bf16_dy ? AnalyzeOperandBf16("LinearBackward", role, q.dy_bf16, q.dy_bf16_ld, rows, out, q.analytics_slot)
                   : AnalyzeOperand("LinearBackward", role, dy, rows, out, q.analytics_slot);
  };
  if (dx != nullptr) {  // the dgrad GEMM runs only when dx is wanted
    KEEL_RETURN_IF_ERROR(analyze_dy(Role::kDgradDy));
    KEEL_RETURN_IF_ERROR(AnalyzeOperand("LinearBackward", Role::kDgradW, w, out, in, q.analytics_slot));
  }
  KEEL_RETURN_IF_ERROR(analyze_dy(Role::kWgradDy));
  if (bf16_x) {
    KEEL_RETURN_IF_ERROR(
        AnalyzeOperandBf16("LinearBackward", Role::kWgradX, q.x_bf16, q.x_bf16_ld, rows, in, q.analytics_slot));
  } else {
    KEEL_RETURN_IF_ERROR(AnalyzeOperand("LinearBackward", Role::kWgradX, x, rows, in, q.analytics_slot));
  }
  const int64_t dy_ld = bf16_dy ? q.dy_bf16_ld : out;
  const OperandFormat& f_ddy = q.role[static_cast<int>(Role::kDgradDy)];
  const OperandFormat& f_dw = q.role[static_cast<int>(Role::kDgradW)];
  const OperandFormat& f_wdy = q.role[static_cast<int>(Role::kWgradDy)];
  const OperandFormat& f_wx = q.role[static_cast<int>(Role::kWgradX)];
  const bool bf16_dgrad = f_ddy.quantized() && f_dw.quantized();
  const bool bf16_wgrad = f_wdy.quantized() && f_wx.quantized();
  // BF16 rounding is elementwise, so a deterministic bf16 dy from the dgrad serves
  // the wgrad too (the same bits as quantizing it again down the columns).
  const bool reuse_dy = dx != nullptr && bf16_dgrad && bf16_wgrad && f_ddy.format == QuantFormat::kBf16 &&
                        f_wdy.format == QuantFormat::kBf16 && f_ddy.rounding == f_wdy.rounding &&
                        f_ddy.rounding != Rounding::kStochastic;
  // dbias: the column sums of dy ride on the first BF16 rounding of dy (which
  // reads dy anyway); with no BF16 dy role, a pass of its own. Either way the
  // same partials in the same order: the same bits.
  auto rounds_bf16 = [](const OperandFormat& f) { return f.quantized() && f.format == QuantFormat::kBf16; };
  // An MX dgrad dy (quantized along rows) carries them as well when its blocks
  // are whole warps of 32 columns.
  float* dbias_with_dgrad =
      dbias != nullptr && dx != nullptr && (rounds_bf16(f_ddy) || MxRowsCarryColumnSums(f_ddy, out)) ? dbias : nullptr;
  float* dbias_with_wgrad =
      dbias != nullptr && dbias_with_dgrad == nullptr && !reuse_dy && rounds_bf16(f_wdy) ? dbias : nullptr;
  // An MX dy of one kind for both GEMMs: both of its roundings (and dbias) from
  // one read of dy, with the bits of the two passes. Not for a dy whose second
  // bf16 copy would exceed 256 MiB (the head's, bt x padded_vocab): the peak
  // matters more there than the read.
  const bool dy_one_pass = dy_one_pass_ && dx != nullptr && !bf16_dy && bf16_dgrad && bf16_wgrad &&
                           MxBothAxesInOnePass(f_ddy, f_wdy, rows, out) &&
                           rows * out * 2 <= (int64_t{256} << 20);
  Operand qdy, qdy_cols;
  if (dy_one_pass) KEEL_RETURN_IF_ERROR(PrepareDyBothAxes(dy, rows, out, q, &qdy, &qdy_cols, dbias_with_dgrad));
  if (dx != nullptr) {
    // dx^T (in x rows) = W^T (stored in x out) . dY^T (stored out x rows).
    Operand qw;
    if (bf16_dy) {
      qdy.data = q.dy_bf16;
      if (q.stats_slot >= 0)
        KEEL_RETURN_IF_ERROR(RecordBf16Stats(q.dy_bf16, q.dy_bf16_ld, rows, out, q.stats_slot, Role::kDgradDy));
    } else if (!dy_one_pass) {
      KEEL_RETURN_IF_ERROR(PrepareOperand(dy, rows, out, 1, Role::kDgradDy, q, bf16_dgrad, &op_a_, &qdy,
                                          reuse_dy ? &kept_dy_ : nullptr, dbias_with_dgrad));
    }
    // The forward's rounding of w when it was kept (the same bits), else a fresh one.
    if (!bf16_dgrad || !TakeKept(&kept_w_, q, w, out, in, Role::kDgradW, &qw)) {
      KEEL_RETURN_IF_ERROR(PrepareWeight(w, out, in, 0, Role::kDgradW, q, bf16_dgrad, &qw));  // held, or fresh
    }
    GemmArgs g;
    g.bf16 = bf16_dgrad;
    g.Shape(in, rows, out).A(qw.data, in).B(qdy.data, dy_ld).C(dx, in);
    KEEL_RETURN_IF_ERROR(Alpha(qdy, qw, 1, &g.alpha));
    // The hot output channels (A = dy along out, B = w down its columns):
    // folded into a BF16 GEMM, else a second GEMM after it.
    const HcpSide hcp_a = HcpAlongRows(dy, rows, out, qdy.data, qdy.tensor_scale, bf16_dgrad);
    const HcpSide hcp_b = HcpDownColumns(w, in, qw.data, qw.tensor_scale, bf16_dgrad, false);
    const int32_t* hot = nullptr;
    if (q.hcp_dgrad.count > 0) {
      KEEL_RETURN_IF_ERROR(HotSet(hcp_a, hcp_b, out, q.hcp_dgrad, &hot));
      if (bf16_dgrad) KEEL_RETURN_IF_ERROR(FoldHcpPatch(1, hcp_a, hcp_b, hot, q.hcp_dgrad.count, &g));
    }
    NN_PROFILE("gemm");
    KEEL_RETURN_IF_ERROR(blas_.Gemm(g));
    if (q.hcp_dgrad.count > 0 && !bf16_dgrad) {
      KEEL_RETURN_IF_ERROR(AddHcpPatch(hcp_a, hcp_b, hot, q.hcp_dgrad.count, dx, in));
    }
  }
  if (dbias != nullptr && dbias_with_dgrad == nullptr && dbias_with_wgrad == nullptr) {
    NN_PROFILE("dbias");
    KEEL_RETURN_IF_ERROR(ColumnSums(dy, rows, out, dbias));
  }
  {
    // dW^T (in x out) += X^T (stored in x rows) . dY (stored out x rows, transposed).
    Operand qdy_w, qx;
    if (bf16_dy) {
      qdy_w.data = q.dy_bf16;
      if (q.stats_slot >= 0)
        KEEL_RETURN_IF_ERROR(RecordBf16Stats(q.dy_bf16, q.dy_bf16_ld, rows, out, q.stats_slot, Role::kWgradDy));
    } else if (dy_one_pass) {
      qdy_w = qdy_cols;  // rounded and counted with the dgrad's
    } else if (reuse_dy) {
      qdy_w = qdy;
      // The same elements as the dgrad's dy: its counts.
      if (q.stats_slot >= 0) RecordKeptStats(kept_dy_, rows * out, q.stats_slot, Role::kWgradDy);
    } else {
      KEEL_RETURN_IF_ERROR(PrepareOperand(dy, rows, out, 0, Role::kWgradDy, q, bf16_wgrad, &op_a_, &qdy_w,
                                          /*keep=*/nullptr, dbias_with_wgrad));
    }
    // x as its producer rounded it, or the forward's rounding of x when it was
    // kept (the same bits), else a fresh one.
    if (bf16_x) {
      qx.data = q.x_bf16;
      if (q.stats_slot >= 0)
        KEEL_RETURN_IF_ERROR(RecordBf16Stats(q.x_bf16, q.x_bf16_ld, rows, in, q.stats_slot, Role::kWgradX));
    } else if (!bf16_wgrad || !TakeKept(&kept_x_, q, x, rows, in, Role::kWgradX, &qx)) {
      KEEL_RETURN_IF_ERROR(PrepareOperand(x, rows, in, 0, Role::kWgradX, q, bf16_wgrad, &op_b_, &qx));
    }
    GemmArgs g;
    g.bf16 = bf16_wgrad;
    g.trans_b = true;
    g.accumulate = true;
    g.Shape(in, out, rows).A(qx.data, bf16_x ? q.x_bf16_ld : in).B(qdy_w.data, dy_ld).C(dw, in);
    KEEL_RETURN_IF_ERROR(Alpha(qdy_w, qx, 2, &g.alpha));
    // The wgrad's best tokens (A = dy^T, B = x^T over the tokens, rotated when
    // the wgrad roles take the RHT), chosen now: folded into a BF16 GEMM, else
    // a second GEMM after it.
    const bool rht = f_wdy.quantized() && f_wdy.rht;
    const HcpSide hcp_a = HcpDownColumns(dy, out, qdy_w.data, qdy_w.tensor_scale, bf16_wgrad, rht);
    const HcpSide hcp_b = HcpDownColumns(x, in, qx.data, qx.tensor_scale, bf16_wgrad, rht);
    const int32_t* hot = nullptr;
    if (q.hcp_wgrad_rows > 0) {
      KEEL_RETURN_IF_ERROR(hcp_index_.Reserve(static_cast<size_t>(q.hcp_wgrad_rows) * sizeof(int32_t), stream_));
      KEEL_RETURN_IF_ERROR(
          HotSet(hcp_a, hcp_b, rows, HotChannels{nullptr, q.hcp_wgrad_rows, hcp_index_.get<int32_t>()}, &hot));
      if (bf16_wgrad) KEEL_RETURN_IF_ERROR(FoldHcpPatch(2, hcp_a, hcp_b, hot, q.hcp_wgrad_rows, &g));
    }
    NN_PROFILE("gemm");
    KEEL_RETURN_IF_ERROR(blas_.Gemm(g));
    if (q.hcp_wgrad_rows > 0 && !bf16_wgrad) {
      KEEL_RETURN_IF_ERROR(AddHcpPatch(hcp_a, hcp_b, hot, q.hcp_wgrad_rows, dw, in));
    }
  }
  return Status::Ok();
}

// ============================================================================
// Statistics, QuantizeDequantize
// ============================================================================

Status CudaBackend::ResetOperandStats(int slots) {
  if (slots < 0)
    return Status::Error("ResetOperandStats: slots: " + std::to_string(slots) + " is not allowed; need >= 0");
  // Pairs counted but not read are dropped: zeroed in stream order, before any
  // quantization queued after this call adds to them again.
  if (stats_pairs_used_ > 0) {
    KEEL_CUDA_CHECK(cudaMemsetAsync(stats_pairs_, 0, stats_pairs_used_ * 2 * sizeof(unsigned long long), stream_));
  }
  stats_pairs_used_ = 0;
  stats_calls_.clear();
  // The pairs are zeroed: what kept operands counted is gone with them.
  for (KeptStats* k : AllKeptStats()) *k = KeptStats();
  stats_slots_ = slots;
  host_stats_.assign(static_cast<size_t>(slots) * kRoleCount, OperandStats{});
  return Status::Ok();
}

Status CudaBackend::ReadOperandStats(std::vector<OperandStats>* stats) {
  NN_PROFILE("ReadOperandStats");
  if (stats == nullptr) return Status::Error("ReadOperandStats: stats: null");
  KEEL_RETURN_IF_ERROR(FoldStats());
  *stats = host_stats_;
  return Status::Ok();
}

Status CudaBackend::QuantizeDequantize(const float* x, int64_t rows, int64_t cols, int axis,
                                       const OperandFormat& format, uint64_t seed, float* out) {
  NN_PROFILE("QuantizeDequantize");
  if (rows < 0 || cols < 0)
    return Status::Error("QuantizeDequantize: shape: " + std::to_string(rows) + " x " + std::to_string(cols) +
                         " is not allowed; need rows, cols >= 0");
  if (axis != 0 && axis != 1)
    return Status::Error("QuantizeDequantize: axis: " + std::to_string(axis) + " is not allowed; use 0 or 1");
  if (rows == 0 || cols == 0) return Status::Ok();
  if (x == nullptr || out == nullptr) return Status::Error("QuantizeDequantize: x or out: null");
  const int64_t count = rows * cols;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (!format.quantized()) return CopyBytes(out, x, bytes);
  if (format.rht)
    return Status::Error("QuantizeDequantize: rht: true is not allowed; the RHT applies only to the two wgrad "
                         "operands of LinearBackward");
  const float* src = x;
  KEEL_RETURN_IF_ERROR(Aligned16Input(&src, count));
  // In place (or unaligned out): quantize into a temporary, then copy.
  float* dst = out;
  if (out == x || !Aligned(out, 16)) {
    KEEL_RETURN_IF_ERROR(quant_temp_.Reserve(bytes, stream_));
    dst = quant_temp_.get<float>();
  }
  const Status s = Quantize(src, rows, cols, axis, format, seed, dst, false, false, nullptr,
                            small_ + kAmaxSlot + kRoleCount, small_ + kTensorScaleSlot + kRoleCount);
  if (!s.ok()) return Status::Error("QuantizeDequantize: " + s.message());
  if (dst != out) KEEL_CUDA_CHECK(cudaMemcpyAsync(out, dst, bytes, cudaMemcpyDeviceToDevice, stream_));
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
