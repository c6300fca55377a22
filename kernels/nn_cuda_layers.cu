// The CUDA backend's layers other than linear and attention: LayerNorm, exact
// GELU, SwiGLU, token + position embedding and softmax cross-entropy.
//
// Determinism: every sum has a fixed order. Row reductions are per-thread strided
// sums followed by a fixed xor-shuffle tree (a warp per row) or a fixed shared-
// memory tree (a block per row); the parameter gradients summed over rows (LayerNorm
// dgamma / dbeta) go through per-chunk partial sums and a second pass in chunk
// order; the embedding gradients add each position's row in position order, as
// the CPU does (dwte after ranking equal tokens: integer work only), so they are
// the CPU's bits. No float atomics anywhere.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/nn_cuda_internal.h"
#include "kernels/quant_core.h"

namespace keel {
namespace nncuda {

namespace {

// ============================================================================
// Kernels: LayerNorm
// ============================================================================

// Outputs of the layers that write either fp32 or the bf16 operand of the
// linear layer they feed (LinearQuant::x_bf16): a bf16 output is the rounding a
// BF16 nearest-even operand gets (qcore::Bf16Round), and `nonfinite` counts the
// non-finite values rounded, as that rounding's statistics count them.
__device__ __forceinline__ void StoreValue(float* p, float v, unsigned int&) { *p = v; }
__device__ __forceinline__ void StoreValue(uint16_t* p, float v, unsigned int& nonfinite) {
  *p = qcore::Bf16Round(v, Rounding::kNearestEven, 0.0f);
  nonfinite += qcore::IsFinite(v) ? 0u : 1u;
}
// Four values at p (16-byte aligned for fp32, 8-byte for bf16).
__device__ __forceinline__ void StoreValue4(float* p, float4 v, unsigned int&) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void StoreValue4(uint16_t* p, float4 v, unsigned int& nonfinite) {
  auto bits = [&](float f) -> uint32_t {
    nonfinite += qcore::IsFinite(f) ? 0u : 1u;
    return qcore::Bf16Round(f, Rounding::kNearestEven, 0.0f);
  };
  const uint32_t lo = bits(v.x) | (bits(v.y) << 16), hi = bits(v.z) | (bits(v.w) << 16);
  *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
}
// Adds a warp's non-finite counts to pair[1] (pair null: nothing counted).
__device__ __forceinline__ void AddNonfinite(unsigned int nonfinite, unsigned long long* pair) {
  if (pair == nullptr) return;
  const unsigned long long total = WarpSum(static_cast<unsigned long long>(nonfinite));
  if ((threadIdx.x & 31) == 0 && total > 0) atomicAdd(pair + 1, total);
}

// One warp per row: mean, then the population variance around the rounded mean
// (two passes, the row stays in L1; both sums in double, as the CPU reference
// sums them), then y = (x - mean) * rstd * gamma + beta, stored as Out
// (StoreValue; nonfinite: the bf16 output's count). kVec: cols % 4 == 0 and
// 16-byte aligned rows, loaded as float4. With `residual` (AddLayerNormForward),
// the row normalized is x + residual, written to `added` in the first pass
// (which may be x itself: each lane reads its elements before it writes them,
// and the later passes read back only what the same lane wrote).
template <bool kVec, typename Out>
__global__ void __launch_bounds__(256) LayerNormForwardKernel(const float* x, const float* __restrict__ gamma,
                                                              const float* __restrict__ beta, Out* __restrict__ y,
                                                              float* __restrict__ mean, float* __restrict__ rstd,
                                                              int64_t rows, int64_t cols, float eps,
                                                              unsigned long long* nonfinite_pair,
                                                              const float* __restrict__ residual = nullptr,
                                                              float* added = nullptr) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps: rows are warp-uniform
  const float* xr = (residual != nullptr ? added : x) + row * cols;  // what passes 2 and 3 read
  Out* yr = y + row * cols;
  unsigned int nonfinite = 0;
  double sum = 0.0;
  if (residual != nullptr) {
    const float* ar = x + row * cols;
    const float* rr = residual + row * cols;
    float* sr = added + row * cols;
    if constexpr (kVec) {
      for (int64_t c = lane; c < cols / 4; c += 32) {
        const float4 a = reinterpret_cast<const float4*>(ar)[c];
        const float4 r = reinterpret_cast<const float4*>(rr)[c];
        const float4 v = make_float4(a.x + r.x, a.y + r.y, a.z + r.z, a.w + r.w);
        reinterpret_cast<float4*>(sr)[c] = v;
        sum += v.x;
        sum += v.y;
        sum += v.z;
        sum += v.w;
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32) {
        const float v = ar[c] + rr[c];
        sr[c] = v;
        sum += v;
      }
    }
  } else if constexpr (kVec) {
    for (int64_t c = lane; c < cols / 4; c += 32) {
      const float4 v = reinterpret_cast<const float4*>(xr)[c];
      sum += v.x;
      sum += v.y;
      sum += v.z;
      sum += v.w;
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) sum += xr[c];
  }
  const float m = static_cast<float>(WarpSum(sum) / static_cast<double>(cols));
  const double md = m;
  double sq = 0.0;
  if constexpr (kVec) {
    for (int64_t c = lane; c < cols / 4; c += 32) {
      const float4 v = reinterpret_cast<const float4*>(xr)[c];
      const double d0 = v.x - md, d1 = v.y - md, d2 = v.z - md, d3 = v.w - md;
      sq += d0 * d0;
      sq += d1 * d1;
      sq += d2 * d2;
      sq += d3 * d3;
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const double d = xr[c] - md;
      sq += d * d;
    }
  }
  const float var = static_cast<float>(WarpSum(sq) / static_cast<double>(cols));
  const float s = 1.0f / sqrtf(var + eps);
  if constexpr (kVec) {
    for (int64_t c = lane; c < cols / 4; c += 32) {
      const float4 v = reinterpret_cast<const float4*>(xr)[c];
      const float4 g = reinterpret_cast<const float4*>(gamma)[c];
      float4 o;
      o.x = (v.x - m) * s * g.x;
      o.y = (v.y - m) * s * g.y;
      o.z = (v.z - m) * s * g.z;
      o.w = (v.w - m) * s * g.w;
      if (beta != nullptr) {
        const float4 b = reinterpret_cast<const float4*>(beta)[c];
        o.x = o.x + b.x;
        o.y = o.y + b.y;
        o.z = o.z + b.z;
        o.w = o.w + b.w;
      }
      StoreValue4(yr + 4 * c, o, nonfinite);
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      float o = (xr[c] - m) * s * gamma[c];
      if (beta != nullptr) o = o + beta[c];
      StoreValue(yr + c, o, nonfinite);
    }
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = s;
  }
  AddNonfinite(nonfinite, nonfinite_pair);
}

// dx += ((g - mean(g)) - xhat * mean(g * xhat)) * rstd with g = dy * gamma and
// xhat = (x - mean) * rstd (the two means summed in double); one warp per row.
// kVec: cols % 4 == 0 and every pointer 16-byte aligned, four columns a step.
template <bool kVec>
__global__ void __launch_bounds__(256) LayerNormBackwardKernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                                               const float* __restrict__ mean,
                                                               const float* __restrict__ rstd,
                                                               const float* __restrict__ dy, float* __restrict__ dx,
                                                               int64_t rows, int64_t cols) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  float* dxr = dx + row * cols;
  const float m = mean[row], s = rstd[row];
  constexpr int kWidth = kVec ? 4 : 1;
  // Loads kWidth consecutive floats at column c (a multiple of kWidth).
  auto load = [](const float* p, int64_t c, float v[kWidth]) {
    if constexpr (kVec) {
      const float4 q = *reinterpret_cast<const float4*>(p + c);
      v[0] = q.x;
      v[1] = q.y;
      v[2] = q.z;
      v[3] = q.w;
    } else {
      v[0] = p[c];
    }
  };
  // g = dy * gamma and xhat at the kWidth columns from c.
  auto terms = [&](int64_t c, float g[kWidth], float xhat[kWidth]) {
    float xv[kWidth], dv[kWidth], gv[kWidth];
    load(xr, c, xv);
    load(dyr, c, dv);
    load(gamma, c, gv);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      g[k] = dv[k] * gv[k];
      xhat[k] = (xv[k] - m) * s;
    }
  };
  double sum_g = 0.0, sum_gx = 0.0;
  for (int64_t c = lane * kWidth; c < cols; c += 32 * kWidth) {
    float g[kWidth], xhat[kWidth];
    terms(c, g, xhat);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      sum_g += g[k];
      sum_gx += static_cast<double>(g[k]) * xhat[k];
    }
  }
  const float mean_g = static_cast<float>(WarpSum(sum_g) / static_cast<double>(cols));
  const float mean_gx = static_cast<float>(WarpSum(sum_gx) / static_cast<double>(cols));
  for (int64_t c = lane * kWidth; c < cols; c += 32 * kWidth) {
    float g[kWidth], xhat[kWidth], ov[kWidth];
    terms(c, g, xhat);
    load(dxr, c, ov);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) ov[k] = ov[k] + ((g[k] - mean_g) - xhat[k] * mean_gx) * s;
    if constexpr (kVec) {
      *reinterpret_cast<float4*>(dxr + c) = make_float4(ov[0], ov[1], ov[2], ov[3]);
    } else {
      dxr[c] = ov[0];
    }
  }
}

// dgamma / dbeta partials: block (x, y) covers columns 32x .. 32x + 31 and rows
// [y * rows_per_chunk, ...), as ColumnPartialsKernel (nn_cuda_linear.cu) with the
// summands dy * xhat and dy.
__global__ void __launch_bounds__(256) LayerNormParamPartialsKernel(const float* __restrict__ x,
                                                                    const float* __restrict__ mean,
                                                                    const float* __restrict__ rstd,
                                                                    const float* __restrict__ dy, int64_t rows,
                                                                    int64_t cols, int64_t rows_per_chunk,
                                                                    float* __restrict__ partial_gamma,
                                                                    float* __restrict__ partial_beta) {
  __shared__ float sums_g[8][33];
  __shared__ float sums_b[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc_g = 0.0f, acc_b = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float d = dy[r * cols + col];
      const float xhat = (x[r * cols + col] - mean[r]) * rstd[r];
      acc_g += d * xhat;
      acc_b += d;
    }
  }
  sums_g[threadIdx.y][threadIdx.x] = acc_g;
  sums_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float tg = sums_g[0][threadIdx.x], tb = sums_b[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) {
      tg += sums_g[k][threadIdx.x];
      tb += sums_b[k][threadIdx.x];
    }
    partial_gamma[blockIdx.y * cols + col] = tg;
    partial_beta[blockIdx.y * cols + col] = tb;
  }
}

// LayerNormBackwardKernel<true>'s dx and LayerNormParamPartialsKernel's
// partials in one kernel, with the bits of both (for the same split): block x
// covers chunk x, kFusedLnRows rows (the split LayerNormBackward gives both
// paths); warp w takes its rows r0 + w, r0 + w + 8, ..., in the order thread
// (c, w) of LayerNormParamPartialsKernel adds them. Per row the warp computes dx
// as LayerNormBackwardKernel<true> does (lane columns 4 lane + 128 i, the sums in
// double, then x, dy and gamma read again, from L1) and each lane adds dy * xhat
// and dy to its columns' accumulators, which live in the warp's rows of shared
// memory (in registers, ptxas hoisted every load of the unrolled groups: 194
// registers at 768 columns, or spills under a bound). At the end the 8 warps'
// accumulators are added in warp order, as the partials kernel adds its 8 row
// threads. x and dy are read from memory once for both. kGroups = cols / 128
// (1 .. 6: the two accumulators of 8 warps fill the 48 KiB of static shared
// memory at 768 columns); every pointer 16-byte aligned.
constexpr int kFusedLnRows = 32;
constexpr int kFusedLnMaxGroups = 6;
template <int kGroups>
__global__ void __launch_bounds__(256)
    LayerNormBackwardFusedKernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                 const float* __restrict__ dy, float* __restrict__ dx, int64_t rows,
                                 float* __restrict__ partial_gamma, float* __restrict__ partial_beta) {
  constexpr int kCols = 128 * kGroups;
  __shared__ __align__(16) float acc_g[8][kCols];
  __shared__ __align__(16) float acc_b[8][kCols];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kFusedLnRows;
  const int64_t r1 = min(rows, r0 + kFusedLnRows);
  for (int c = 4 * lane; c < kCols; c += 128) {
    *reinterpret_cast<float4*>(&acc_g[warp][c]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    *reinterpret_cast<float4*>(&acc_b[warp][c]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  auto load4 = [](const float* p, float v[4]) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  };
  for (int64_t row = r0 + warp; row < r1; row += 8) {
    const float* xr = x + row * kCols;
    const float* dyr = dy + row * kCols;
    float* dxr = dx + row * kCols;
    const float m = mean[row], s = rstd[row];
    double sum_g = 0.0, sum_gx = 0.0;
#pragma unroll 2
    for (int i = 0; i < kGroups; ++i) {
      const int c = 4 * lane + 128 * i;
      float xv[4], dv[4], gv[4];
      load4(xr + c, xv);
      load4(dyr + c, dv);
      load4(gamma + c, gv);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float g = dv[k] * gv[k];
        const float xhat = (xv[k] - m) * s;
        sum_g += g;
        sum_gx += static_cast<double>(g) * xhat;
      }
    }
    const float mean_g = static_cast<float>(WarpSum(sum_g) / static_cast<double>(kCols));
    const float mean_gx = static_cast<float>(WarpSum(sum_gx) / static_cast<double>(kCols));
#pragma unroll 2
    for (int i = 0; i < kGroups; ++i) {
      const int c = 4 * lane + 128 * i;
      float xv[4], dv[4], gv[4], ov[4], ag[4], ab[4];
      load4(xr + c, xv);
      load4(dyr + c, dv);
      load4(gamma + c, gv);
      load4(dxr + c, ov);
      load4(&acc_g[warp][c], ag);
      load4(&acc_b[warp][c], ab);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float g = dv[k] * gv[k];
        const float xhat = (xv[k] - m) * s;
        ov[k] = ov[k] + ((g - mean_g) - xhat * mean_gx) * s;
        ag[k] += dv[k] * xhat;
        ab[k] += dv[k];
      }
      *reinterpret_cast<float4*>(dxr + c) = make_float4(ov[0], ov[1], ov[2], ov[3]);
      *reinterpret_cast<float4*>(&acc_g[warp][c]) = make_float4(ag[0], ag[1], ag[2], ag[3]);
      *reinterpret_cast<float4*>(&acc_b[warp][c]) = make_float4(ab[0], ab[1], ab[2], ab[3]);
    }
  }
  __syncthreads();
  // The 8 warps' partials of each column, added in warp order.
  float* out_g = partial_gamma + static_cast<int64_t>(blockIdx.x) * kCols;
  float* out_b = partial_beta + static_cast<int64_t>(blockIdx.x) * kCols;
  for (int col = threadIdx.x; col < kCols; col += 256) {
    float tg = acc_g[0][col], tb = acc_b[0][col];
    for (int w = 1; w < 8; ++w) {
      tg += acc_g[w][col];
      tb += acc_b[w][col];
    }
    out_g[col] = tg;
    out_b[col] = tb;
  }
}

// ============================================================================
// Kernels: GELU, SwiGLU
// ============================================================================

// Gelu and GeluGrad: nn_cuda_internal.h (GeluBackwardBf16 in nn_cuda_linear.cu uses GeluGrad too).

// GELU and its backward, for MapKernel (nn_cuda_internal.h).
struct GeluOp {
  __device__ float operator()(float x, float) const { return Gelu(x); }
};
struct GeluGradOp {
  __device__ float operator()(float x, float dy) const { return dy * GeluGrad(x); }
};

// y = the bf16 rounding of GELU(x) (StoreValue), eight elements a step (two
// float4 loads, one 16-byte store) when `vec` (x 16-byte and y 16-byte
// aligned), then the tail one by one; non-finite values counted into pair[1].
__global__ void __launch_bounds__(kThreads) GeluBf16Kernel(const float* __restrict__ x, uint16_t* __restrict__ y,
                                                           int64_t n, bool vec, unsigned long long* pair) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned int nonfinite = 0;
  int64_t done = 0;
  if (vec) {
    for (int64_t j = i; j < n / 8; j += stride) {
      const float4 a = reinterpret_cast<const float4*>(x)[2 * j];
      const float4 b = reinterpret_cast<const float4*>(x)[2 * j + 1];
      StoreValue4(y + 8 * j, make_float4(Gelu(a.x), Gelu(a.y), Gelu(a.z), Gelu(a.w)), nonfinite);
      StoreValue4(y + 8 * j + 4, make_float4(Gelu(b.x), Gelu(b.y), Gelu(b.z), Gelu(b.w)), nonfinite);
    }
    done = n / 8 * 8;
  }
  for (int64_t j = done + i; j < n; j += stride) StoreValue(y + j, Gelu(x[j]), nonfinite);
  AddNonfinite(nonfinite, pair);
}

__device__ __forceinline__ float Sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

__global__ void SwigluForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t h) {
  const int64_t n = rows * h;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / h, c = i - r * h;
    const float a = x[r * 2 * h + c], u = x[r * 2 * h + h + c];
    y[i] = a / (1.0f + expf(-a)) * u;
  }
}

// d gate = dy * up * silu'(a), silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a);
// d up = dy * silu(a).
__global__ void SwigluBackwardKernel(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx,
                                     int64_t rows, int64_t h) {
  const int64_t n = rows * h;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / h, c = i - r * h;
    const float a = x[r * 2 * h + c], u = x[r * 2 * h + h + c];
    const float s = Sigmoid(a);
    const float silu = a * s;
    const float d = dy[i];
    dx[r * 2 * h + c] = d * u * (s * (1.0f + a * (1.0f - s)));
    dx[r * 2 * h + h + c] = d * silu;
  }
}

// ============================================================================
// Kernels: embedding
// ============================================================================

__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ tokens, const float* __restrict__ wte,
                                       const float* __restrict__ wpe, float* __restrict__ out, int64_t positions,
                                       int64_t seq, int64_t dim) {
  const int64_t n = positions * dim;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t p = i / dim, c = i - p * dim;
    const int64_t t = p % seq;
    const float token = wte[static_cast<int64_t>(tokens[p]) * dim + c];
    out[i] = wpe != nullptr ? token + wpe[t * dim + c] : token;
  }
}

// For every position p: rank[p] = positions q < p with the same token, head[p] =
// the first such position (p itself when rank is 0), count[p] = all positions with
// that token. Every pair is compared (tokens staged in shared memory): N^2 integer
// compares, a few microseconds for N = 16K.
__global__ void __launch_bounds__(256) EmbeddingRankKernel(const int32_t* __restrict__ tokens, int n,
                                                           int* __restrict__ rank, int* __restrict__ head,
                                                           int* __restrict__ count) {
  __shared__ int32_t tile[256];
  const int p = blockIdx.x * 256 + threadIdx.x;
  const int32_t mine = p < n ? tokens[p] : 0;
  int before = 0, total = 0, first = p;
  for (int base = 0; base < n; base += 256) {
    __syncthreads();
    if (base + static_cast<int>(threadIdx.x) < n) tile[threadIdx.x] = tokens[base + threadIdx.x];
    __syncthreads();
    const int limit = min(256, n - base);
    for (int k = 0; k < limit; ++k) {
      if (tile[k] == mine) {
        const int q = base + k;
        ++total;
        if (q < p) ++before;
        first = min(first, q);
      }
    }
  }
  if (p < n) {
    rank[p] = before;
    head[p] = first;
    count[p] = total;
  }
}

// Exclusive scan of (rank[p] == 0 ? count[p] : 0) in one block: start[p] is where
// head p's positions begin in the sorted list (integers: any order is exact).
__global__ void __launch_bounds__(1024) EmbeddingScanKernel(const int* __restrict__ rank, const int* __restrict__ count,
                                                            int n, int* __restrict__ start) {
  __shared__ int sums[1024];
  const int per = (n + 1023) / 1024;
  const int begin = threadIdx.x * per, end = min(n, begin + per);
  int local = 0;
  for (int p = begin; p < end; ++p) local += rank[p] == 0 ? count[p] : 0;
  sums[threadIdx.x] = local;
  __syncthreads();
  for (int o = 1; o < 1024; o <<= 1) {
    const int add = threadIdx.x >= o ? sums[threadIdx.x - o] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int running = sums[threadIdx.x] - local;  // exclusive
  for (int p = begin; p < end; ++p) {
    start[p] = running;
    running += rank[p] == 0 ? count[p] : 0;
  }
}

__global__ void EmbeddingScatterKernel(const int* __restrict__ rank, const int* __restrict__ head,
                                       const int* __restrict__ start, int n, int* __restrict__ sorted) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < n) sorted[start[head[p]] + rank[p]] = p;
}

// One block per head position: the token's dout rows added to dwte[token] one by one
// in position order (the CPU reference's order, so the same bits).
__global__ void __launch_bounds__(256) EmbeddingTokenGradKernel(const int32_t* __restrict__ tokens,
                                                                const float* __restrict__ dout,
                                                                const int* __restrict__ rank,
                                                                const int* __restrict__ count,
                                                                const int* __restrict__ start,
                                                                const int* __restrict__ sorted, int64_t dim,
                                                                float* __restrict__ dwte) {
  const int p = blockIdx.x;
  if (rank[p] != 0) return;
  const int first = start[p], k_end = first + count[p];
  float* row = dwte + static_cast<int64_t>(tokens[p]) * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float acc = row[c];
    for (int k = first; k < k_end; ++k) acc += dout[static_cast<int64_t>(sorted[k]) * dim + c];
    row[c] = acc;
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in turn (the CPU's order and bits).
__global__ void EmbeddingPositionGradKernel(const float* __restrict__ dout, int64_t batch, int64_t seq, int64_t dim,
                                            float* __restrict__ dwpe) {
  const int64_t n = seq * dim;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * n + i];
    dwpe[i] = acc;
  }
}

// ============================================================================
// Kernels: cross-entropy
// ============================================================================

constexpr int kCeThreads = 512;

// (max, sum of exp(v - max)) of the row's first `vocab` logits: one pass per
// thread with a running max (the sum rescaled when the max grows; the sum in
// double, as the CPU reference keeps it), then a fixed shared-memory tree. Every
// thread gets the row's pair. One pass instead of two: the rows (200 KB for GPT-2)
// do not stay in cache between passes.
//
// Thread t reads the elements RowCopyToShared gives it, in the same order: vec,
// float4 t, t + kCeThreads, ... of the ceil(vocab / 4) that hold real columns
// (the padding after them adds nothing, so it is not read); else columns t,
// t + kCeThreads, ... . The reduction order, and so the bits, depend on vec, the
// thread count and nothing else; where each element is read from (CeRow) does
// not change them.
// A row of logits: its columns [0, split) from `shared` (the fused kernel's copy
// in shared memory), the rest from `global`. split = 0: all from global memory.
// In vec mode split is a multiple of 4.
struct CeRow {
  const float* global;
  const float* shared;
  int64_t split;
  __device__ float4 Get4(int64_t c4) const {
    const float* from = c4 * 4 < split ? shared : global;
    return reinterpret_cast<const float4*>(from)[c4];
  }
  __device__ float Get(int64_t c) const { return c < split ? shared[c] : global[c]; }
};

__device__ __forceinline__ void RowMaxSum(const CeRow& row, int64_t vocab, bool vec, float* max_out,
                                          double* sum_out) {
  __shared__ float ms[kCeThreads];
  __shared__ double ss[kCeThreads];
  float m = -INFINITY;
  double s = 0.0;
  auto add = [&](float v) {
    if (v > m) {
      s = s * static_cast<double>(expf(m - v)) + 1.0;  // m = -inf: s is 0 and expf(-inf) is 0
      m = v;
    } else {
      s += expf(v - m);
    }
  };
  if (vec) {
    // Unrolled so that several loads are in flight when the row is in global
    // memory (the sums still go in the same order).
#pragma unroll 4
    for (int64_t c4 = threadIdx.x; c4 < CeilDiv(vocab, 4); c4 += kCeThreads) {
      const float4 v = row.Get4(c4);
      const int64_t c = c4 * 4;
      add(v.x);
      if (c + 1 < vocab) add(v.y);
      if (c + 2 < vocab) add(v.z);
      if (c + 3 < vocab) add(v.w);
    }
  } else {
    for (int64_t c = threadIdx.x; c < vocab; c += kCeThreads) add(row.Get(c));
  }
  ms[threadIdx.x] = m;
  ss[threadIdx.x] = s;
  __syncthreads();
  for (int half = kCeThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      const float m1 = ms[threadIdx.x], m2 = ms[threadIdx.x + half];
      const float mm = fmaxf(m1, m2);
      const double s1 = m1 == -INFINITY ? 0.0 : ss[threadIdx.x] * static_cast<double>(expf(m1 - mm));
      const double s2 = m2 == -INFINITY ? 0.0 : ss[threadIdx.x + half] * static_cast<double>(expf(m2 - mm));
      ms[threadIdx.x] = mm;
      ss[threadIdx.x] = s1 + s2;
    }
    __syncthreads();
  }
  *max_out = ms[0];
  *sum_out = ss[0];
}

// logsumexp - logit[target], formed in double and rounded once (as the CPU does);
// NaN for a target the host did not check (>= vocab).
__device__ __forceinline__ float RowLoss(const CeRow& row, int32_t target, int64_t vocab, float m, double s) {
  return target < vocab ? static_cast<float>(static_cast<double>(m) + log(s) - static_cast<double>(row.Get(target)))
                        : NAN;
}

// Where a row's gradient goes: fp32 as computed, or bf16 rounded to nearest even
// (the hardware conversion: Bf16Kernel's bits) with its non-finite values
// added to *nonfinite.
__device__ __forceinline__ void StoreGradient4(float* drow, int64_t c4, float4 g, unsigned long long*) {
  reinterpret_cast<float4*>(drow)[c4] = g;
}
__device__ __forceinline__ uint32_t Bf16Pair(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
__device__ __forceinline__ unsigned long long NonfiniteBf16s(uint32_t two) {
  return ((two & 0x7F80u) == 0x7F80u ? 1 : 0) + ((two & 0x7F800000u) == 0x7F800000u ? 1 : 0);
}
__device__ __forceinline__ void StoreGradient4(uint16_t* drow, int64_t c4, float4 g, unsigned long long* nonfinite) {
  const uint2 out = make_uint2(Bf16Pair(g.x, g.y), Bf16Pair(g.z, g.w));
  *nonfinite += NonfiniteBf16s(out.x) + NonfiniteBf16s(out.y);
  reinterpret_cast<uint2*>(drow)[c4] = out;
}
__device__ __forceinline__ void StoreGradient(float* drow, int64_t c, float g, unsigned long long*) { drow[c] = g; }
__device__ __forceinline__ void StoreGradient(uint16_t* drow, int64_t c, float g, unsigned long long* nonfinite) {
  const uint16_t out = static_cast<uint16_t>(Bf16Pair(g, 0.0f) & 0xFFFFu);
  *nonfinite += NonfiniteBf16s(out);
  drow[c] = out;
}

// drow = scale * (softmax - onehot(target)) from the row's (m, s), 0 in the
// padding, stored as Out (StoreGradient); thread t writes the elements
// RowMaxSum read (plus, with vec, the padding's float4s). drow may be row when
// row is global memory and Out is float: each element is read, then written,
// by one thread.
template <typename Out>
__device__ __forceinline__ void RowGradient(const CeRow& row, Out* drow, int64_t padded, int64_t vocab,
                                            int32_t target, float m, double s, float scale, bool vec,
                                            unsigned long long* nonfinite) {
  const float inv_sum = static_cast<float>(1.0 / s);
  auto grad = [&](float v, int64_t c) {
    if (c >= vocab) return 0.0f;
    const float p = expf(v - m) * inv_sum;
    return scale * (p - (c == target ? 1.0f : 0.0f));
  };
  if (vec) {
    const int64_t real4 = CeilDiv(vocab, 4);
    for (int64_t c4 = threadIdx.x; c4 < padded / 4; c4 += kCeThreads) {
      const int64_t c = c4 * 4;
      const float4 v = c4 < real4 ? row.Get4(c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      StoreGradient4(drow, c4, make_float4(grad(v.x, c), grad(v.y, c + 1), grad(v.z, c + 2), grad(v.w, c + 3)),
                     nonfinite);
    }
  } else {
    for (int64_t c = threadIdx.x; c < padded; c += kCeThreads) {
      StoreGradient(drow, c, grad(c < vocab ? row.Get(c) : 0.0f, c), nonfinite);
    }
  }
}

// An ignored row's gradient.
template <typename Out>
__device__ __forceinline__ void RowZero(Out* drow, int64_t padded) {
  for (int64_t c = threadIdx.x; c < padded; c += kCeThreads) drow[c] = 0;
}

__global__ void __launch_bounds__(kCeThreads) CrossEntropyForwardKernel(const float* __restrict__ logits,
                                                                        const int32_t* __restrict__ targets,
                                                                        float* __restrict__ losses, int64_t padded,
                                                                        int64_t vocab, bool vec) {
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  if (target < 0) {  // ignored (uniform across the block)
    if (threadIdx.x == 0) losses[r] = 0.0f;
    return;
  }
  const CeRow row{logits + r * padded, nullptr, 0};
  float m;
  double s;
  RowMaxSum(row, vocab, vec, &m, &s);
  if (threadIdx.x == 0) losses[r] = RowLoss(row, target, vocab, m, s);
}

// dlogits may alias logits: the row's max and sum are complete (a barrier inside
// RowMaxSum) before any thread writes, and each element is read and then written
// by the same thread.
__global__ void __launch_bounds__(kCeThreads) CrossEntropyBackwardKernel(const float* logits,
                                                                         const int32_t* __restrict__ targets,
                                                                         float* dlogits, int64_t padded, int64_t vocab,
                                                                         float scale, bool vec) {
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  float* drow = dlogits + r * padded;
  if (target < 0) {
    RowZero(drow, padded);
    return;
  }
  const CeRow row{logits + r * padded, nullptr, 0};
  float m;
  double s;
  RowMaxSum(row, vocab, vec, &m, &s);
  __syncthreads();  // every thread has read m and s from shared memory before anyone writes
  unsigned long long unused = 0;
  RowGradient(row, drow, padded, vocab, target, m, s, scale, vec, &unused);
}

// Columns [0, split) of the row into shared memory, thread t taking the
// elements RowMaxSum will give it (so it reads back its own stores: no barrier
// needed for that). Eight loads in flight per thread before their stores.
__device__ __forceinline__ void RowCopyToShared(const float* row, float4* shared, int64_t split, bool vec) {
  if (vec) {
#pragma unroll 8
    for (int64_t c4 = threadIdx.x; c4 < split / 4; c4 += kCeThreads) shared[c4] = reinterpret_cast<const float4*>(row)[c4];
  } else {
    float* shared1 = reinterpret_cast<float*>(shared);
#pragma unroll 8
    for (int64_t c = threadIdx.x; c < split; c += kCeThreads) shared1[c] = row[c];
  }
}

// The columns a whole-row copy holds: vec, the float4s holding real columns;
// else the real columns.
int64_t CeRowColumns(int64_t vocab, bool vec) { return vec ? CeilDiv(vocab, 4) * 4 : vocab; }

// The columns a half-row copy holds: half the row's real columns, and at least
// the first padded / 2, the fp32 columns whose bytes a bf16 gradient written
// over the row (ld = 2 padded) covers; so that part is read from shared memory
// before it is overwritten and the rest, read from global memory, never is.
int64_t CeHalfColumns(int64_t vocab, int64_t padded, bool vec) {
  const int64_t full = CeRowColumns(vocab, vec);
  int64_t half = std::max(CeilDiv(full, 2), CeilDiv(padded, 2));
  if (vec) half = CeilDiv(half, 4) * 4;
  return std::min(half, full);
}

// CrossEntropyForwardKernel's loss and CrossEntropyBackwardKernel's gradient,
// the same bits (same helpers, same vec, same per-thread order), the gradient
// into drow = dlogits + r * ld as Out: fp32, or bf16 with its non-finite values
// counted into nonfinite[1] (CrossEntropyFusedBf16). kShared: columns [0,
// split) of the row are read from global memory once, into dynamic shared
// memory, and both passes read them there (the rest from global memory twice,
// the second time mostly from L2); else both read global memory, as the unfused
// kernels do. With split at half the row (CeHalfColumns) two blocks share an SM,
// so one's copy overlaps the other's arithmetic; with the whole row one block
// fills the SM. An fp32 dlogits may alias logits (ld = padded): the target's
// logit is read before the barrier that precedes the first write. A bf16 one
// may lie in the row's own first half (ld = 2 padded) only with kShared and
// split >= padded / 2: the part it overwrites is in shared memory before
// RowMaxSum's barriers (the launchers see to it).
template <bool kShared, typename Out>
__global__ void __launch_bounds__(kCeThreads) CrossEntropyFusedKernel(const float* logits,
                                                                      const int32_t* __restrict__ targets,
                                                                      float* __restrict__ losses, Out* dlogits,
                                                                      int64_t ld, int64_t padded, int64_t vocab,
                                                                      int64_t split, float scale, bool vec,
                                                                      unsigned long long* nonfinite) {
  extern __shared__ float4 ce_row[];
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  Out* drow = dlogits + r * ld;
  if (target < 0) {
    if (threadIdx.x == 0) losses[r] = 0.0f;
    RowZero(drow, padded);
    return;
  }
  CeRow row{logits + r * padded, nullptr, 0};
  if constexpr (kShared) {
    RowCopyToShared(row.global, ce_row, split, vec);
    row.shared = reinterpret_cast<const float*>(ce_row);
    row.split = split;
  }
  float m;
  double s;
  RowMaxSum(row, vocab, vec, &m, &s);
  if (threadIdx.x == 0) losses[r] = RowLoss(row, target, vocab, m, s);
  // row may be drow where it is read from global memory: thread 0 has read the target's logit.
  if (!kShared || row.split < vocab) __syncthreads();
  unsigned long long count = 0;
  RowGradient(row, drow, padded, vocab, target, m, s, scale, vec, &count);
  if constexpr (std::is_same<Out, uint16_t>::value) {
    count = WarpSum(count);
    if ((threadIdx.x & 31) == 0 && count > 0) atomicAdd(nonfinite + 1, count);
  }
}

Status CheckRowsCols(const char* what, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 1)
    return Status::Error(std::string(what) + ": shape: rows " + std::to_string(rows) + ", cols " +
                         std::to_string(cols) + " is not allowed; need rows >= 0, cols >= 1");
  return Status::Ok();
}

}  // namespace

// ============================================================================
// Launchers
// ============================================================================

Status CudaBackend::LayerNormForward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                     float* rstd, int64_t rows, int64_t cols, float eps) {
  NN_PROFILE("LayerNormForward");
  KEEL_RETURN_IF_ERROR(CheckRowsCols("LayerNormForward", rows, cols));
  if (rows == 0) return Status::Ok();
  if (x == nullptr || gamma == nullptr || y == nullptr) return Status::Error("LayerNormForward: x, gamma or y: null");
  const bool vec = cols % 4 == 0 && Aligned(x, 16) && Aligned(y, 16) && Aligned(gamma, 16) &&
                   (beta == nullptr || Aligned(beta, 16));
  const unsigned int blocks = static_cast<unsigned int>(CeilDiv(rows, 8));  // 8 warps (rows) per block
  if (vec) {
    LayerNormForwardKernel<true, float>
        <<<blocks, 256, 0, stream_>>>(x, gamma, beta, y, mean, rstd, rows, cols, eps, nullptr);
  } else {
    LayerNormForwardKernel<false, float>
        <<<blocks, 256, 0, stream_>>>(x, gamma, beta, y, mean, rstd, rows, cols, eps, nullptr);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::LayerNormForwardBf16(const float* x, const float* gamma, const float* beta, uint16_t* y,
                                         float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  NN_PROFILE("LayerNormForwardBf16");
  KEEL_RETURN_IF_ERROR(CheckRowsCols("LayerNormForwardBf16", rows, cols));
  if (rows == 0) return Status::Ok();
  if (x == nullptr || gamma == nullptr || y == nullptr)
    return Status::Error("LayerNormForwardBf16: x, gamma or y: null");
  const bool vec = cols % 4 == 0 && Aligned(x, 16) && Aligned(y, 8) && Aligned(gamma, 16) &&
                   (beta == nullptr || Aligned(beta, 16));
  unsigned long long* pair = nullptr;
  KEEL_RETURN_IF_ERROR(NoteProduced(y, &pair));
  const unsigned int blocks = static_cast<unsigned int>(CeilDiv(rows, 8));
  if (vec) {
    LayerNormForwardKernel<true, uint16_t>
        <<<blocks, 256, 0, stream_>>>(x, gamma, beta, y, mean, rstd, rows, cols, eps, pair);
  } else {
    LayerNormForwardKernel<false, uint16_t>
        <<<blocks, 256, 0, stream_>>>(x, gamma, beta, y, mean, rstd, rows, cols, eps, pair);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AddLayerNormForward(const float* y, const float* residual, float* sum, const float* gamma,
                                        const float* beta, float* out, uint16_t* out_bf16, float* mean, float* rstd,
                                        int64_t rows, int64_t cols, float eps) {
  NN_PROFILE("AddLayerNormForward");
  KEEL_RETURN_IF_ERROR(CheckRowsCols("AddLayerNormForward", rows, cols));
  if ((out == nullptr) == (out_bf16 == nullptr)) {
    return Status::Error("AddLayerNormForward: out and out_bf16: give exactly one");
  }
  if (y == nullptr || residual == nullptr || sum == nullptr || gamma == nullptr || residual == sum)
    return Status::Error("AddLayerNormForward: y, residual, sum or gamma: null, or sum aliases residual");
  if (rows == 0) return Status::Ok();
  const bool vec = cols % 4 == 0 && Aligned(y, 16) && Aligned(residual, 16) && Aligned(sum, 16) &&
                   Aligned(gamma, 16) && (beta == nullptr || Aligned(beta, 16)) &&
                   (out == nullptr ? Aligned(out_bf16, 8) : Aligned(out, 16));
  const unsigned int blocks = static_cast<unsigned int>(CeilDiv(rows, 8));
  if (out != nullptr) {
    if (vec) {
      LayerNormForwardKernel<true, float>
          <<<blocks, 256, 0, stream_>>>(y, gamma, beta, out, mean, rstd, rows, cols, eps, nullptr, residual, sum);
    } else {
      LayerNormForwardKernel<false, float>
          <<<blocks, 256, 0, stream_>>>(y, gamma, beta, out, mean, rstd, rows, cols, eps, nullptr, residual, sum);
    }
  } else {
    unsigned long long* pair = nullptr;
    KEEL_RETURN_IF_ERROR(NoteProduced(out_bf16, &pair));
    if (vec) {
      LayerNormForwardKernel<true, uint16_t>
          <<<blocks, 256, 0, stream_>>>(y, gamma, beta, out_bf16, mean, rstd, rows, cols, eps, pair, residual, sum);
    } else {
      LayerNormForwardKernel<false, uint16_t>
          <<<blocks, 256, 0, stream_>>>(y, gamma, beta, out_bf16, mean, rstd, rows, cols, eps, pair, residual, sum);
    }
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::LayerNormBackward(const float* x, const float* gamma, const float* mean, const float* rstd,
                                      const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows,
                                      int64_t cols) {
  NN_PROFILE("LayerNormBackward");
  KEEL_RETURN_IF_ERROR(CheckRowsCols("LayerNormBackward", rows, cols));
  if (rows == 0) return Status::Ok();
  if (x == nullptr || gamma == nullptr || mean == nullptr || rstd == nullptr || dy == nullptr)
    return Status::Error("LayerNormBackward: x, gamma, mean, rstd or dy: null");
  const bool vec = dx != nullptr && cols % 4 == 0 && Aligned(x, 16) && Aligned(gamma, 16) && Aligned(dy, 16) &&
                   Aligned(dx, 16);
  // Widths of whole 128-column groups up to 768 (GPT-2 124M's, the proxy's
  // 256-512): dx and the parameters' partials in one kernel, over chunks of
  // kFusedLnRows rows; the two kernels below use the same chunks then, so either
  // path gives the same bits.
  const bool fusable =
      vec && (dgamma != nullptr || dbeta != nullptr) && cols % 128 == 0 && cols <= 128 * kFusedLnMaxGroups;
  if (fusable && ln_backward_fused_) {
    NN_PROFILE("dx and parameters in one pass");
    ColumnSplit split;
    KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 2, &split, kFusedLnRows));
    float* pg = split.partial;
    float* pb = pg + split.chunks * cols;
    const unsigned int blocks = static_cast<unsigned int>(split.chunks);
    switch (cols / 128) {
      case 1: LayerNormBackwardFusedKernel<1><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, pg, pb); break;
      case 2: LayerNormBackwardFusedKernel<2><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, pg, pb); break;
      case 3: LayerNormBackwardFusedKernel<3><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, pg, pb); break;
      case 4: LayerNormBackwardFusedKernel<4><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, pg, pb); break;
      case 5: LayerNormBackwardFusedKernel<5><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, pg, pb); break;
      default: LayerNormBackwardFusedKernel<6><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, pg, pb); break;
    }
    NN_LAUNCH_CHECK();
    KEEL_RETURN_IF_ERROR(FinalizeColumnPartials(pg, split.chunks, cols, dgamma, stream_));
    return FinalizeColumnPartials(pb, split.chunks, cols, dbeta, stream_);
  }
  if (dx != nullptr) {
    const unsigned int blocks = static_cast<unsigned int>(CeilDiv(rows, 8));
    if (vec) {
      LayerNormBackwardKernel<true><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, cols);
    } else {
      LayerNormBackwardKernel<false><<<blocks, 256, 0, stream_>>>(x, gamma, mean, rstd, dy, dx, rows, cols);
    }
    NN_LAUNCH_CHECK();
  }
  if (dgamma == nullptr && dbeta == nullptr) return Status::Ok();
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 2, &split, fusable ? kFusedLnRows : 0));
  const int64_t chunks = split.chunks, rows_per_chunk = split.rows_per_chunk;
  float* pg = split.partial;
  float* pb = pg + chunks * cols;
  LayerNormParamPartialsKernel<<<dim3(static_cast<unsigned int>(CeilDiv(cols, 32)), static_cast<unsigned int>(chunks)),
                                 dim3(32, 8), 0, stream_>>>(x, mean, rstd, dy, rows, cols, rows_per_chunk, pg, pb);
  NN_LAUNCH_CHECK();
  KEEL_RETURN_IF_ERROR(FinalizeColumnPartials(pg, chunks, cols, dgamma, stream_));
  return FinalizeColumnPartials(pb, chunks, cols, dbeta, stream_);
}

Status CudaBackend::GeluForward(const float* x, float* y, int64_t count) {
  NN_PROFILE("GeluForward");
  if (count < 0) return Status::Error("GeluForward: count: " + std::to_string(count) + " is negative");
  if (count == 0) return Status::Ok();
  return LaunchMap<1>(y, x, nullptr, count, GeluOp{}, stream_);
}

Status CudaBackend::GeluForwardBf16(const float* x, uint16_t* y, int64_t count) {
  NN_PROFILE("GeluForwardBf16");
  if (count < 0) return Status::Error("GeluForwardBf16: count: " + std::to_string(count) + " is negative");
  if (count == 0) return Status::Ok();
  if (x == nullptr || y == nullptr) return Status::Error("GeluForwardBf16: x or y: null");
  unsigned long long* pair = nullptr;
  KEEL_RETURN_IF_ERROR(NoteProduced(y, &pair));
  const bool vec = Aligned(x, 16) && Aligned(y, 16);
  GeluBf16Kernel<<<GridFor(vec ? count / 8 + 1 : count), kThreads, 0, stream_>>>(x, y, count, vec, pair);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::GeluBackward(const float* x, const float* dy, float* dx, int64_t count) {
  NN_PROFILE("GeluBackward");
  if (count < 0) return Status::Error("GeluBackward: count: " + std::to_string(count) + " is negative");
  if (count == 0) return Status::Ok();
  return LaunchMap<2>(dx, x, dy, count, GeluGradOp{}, stream_);
}

Status CudaBackend::SwigluForward(const float* x, float* y, int64_t rows, int64_t h) {
  NN_PROFILE("SwigluForward");
  KEEL_RETURN_IF_ERROR(CheckRowsCols("SwigluForward", rows, h));
  if (rows == 0) return Status::Ok();
  SwigluForwardKernel<<<GridFor(rows * h), kThreads, 0, stream_>>>(x, y, rows, h);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::SwigluBackward(const float* x, const float* dy, float* dx, int64_t rows, int64_t h) {
  NN_PROFILE("SwigluBackward");
  KEEL_RETURN_IF_ERROR(CheckRowsCols("SwigluBackward", rows, h));
  if (rows == 0) return Status::Ok();
  SwigluBackwardKernel<<<GridFor(rows * h), kThreads, 0, stream_>>>(x, dy, dx, rows, h);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                                     int64_t batch, int64_t seq, int64_t dim) {
  NN_PROFILE("EmbeddingForward");
  if (batch < 0 || seq < 0 || dim < 1)
    return Status::Error("EmbeddingForward: shape: batch " + std::to_string(batch) + ", seq " + std::to_string(seq) +
                         ", dim " + std::to_string(dim) + " is not allowed");
  if (batch * seq == 0) return Status::Ok();
  EmbeddingForwardKernel<<<GridFor(batch * seq * dim), kThreads, 0, stream_>>>(tokens, wte, wpe, out, batch * seq,
                                                                                seq, dim);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::EmbeddingBackward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                                      int64_t batch, int64_t seq, int64_t dim) {
  NN_PROFILE("EmbeddingBackward");
  if (batch < 0 || seq < 0 || dim < 1)
    return Status::Error("EmbeddingBackward: shape: batch " + std::to_string(batch) + ", seq " + std::to_string(seq) +
                         ", dim " + std::to_string(dim) + " is not allowed");
  const int64_t positions = batch * seq;
  if (positions == 0) return Status::Ok();
  if (positions >= (int64_t{1} << 30))
    return Status::Error("EmbeddingBackward: batch * seq: " + std::to_string(positions) + " is too large; need < 2^30");
  if (dwte != nullptr) {
    const int n = static_cast<int>(positions);
    KEEL_RETURN_IF_ERROR(embed_.Reserve(static_cast<size_t>(5) * n * sizeof(int), stream_));
    int* rank = embed_.get<int>();
    int* head = rank + n;
    int* count = head + n;
    int* start = count + n;
    int* sorted = start + n;
    const unsigned int blocks = static_cast<unsigned int>(CeilDiv(n, 256));
    EmbeddingRankKernel<<<blocks, 256, 0, stream_>>>(tokens, n, rank, head, count);
    NN_LAUNCH_CHECK();
    EmbeddingScanKernel<<<1, 1024, 0, stream_>>>(rank, count, n, start);
    NN_LAUNCH_CHECK();
    EmbeddingScatterKernel<<<blocks, 256, 0, stream_>>>(rank, head, start, n, sorted);
    NN_LAUNCH_CHECK();
    EmbeddingTokenGradKernel<<<static_cast<unsigned int>(n), 256, 0, stream_>>>(tokens, dout, rank, count, start,
                                                                                sorted, dim, dwte);
    NN_LAUNCH_CHECK();
  }
  if (dwpe != nullptr) {
    EmbeddingPositionGradKernel<<<GridFor(seq * dim), kThreads, 0, stream_>>>(dout, batch, seq, dim, dwpe);
    NN_LAUNCH_CHECK();
  }
  return Status::Ok();
}

namespace {

Status CheckCrossEntropyShape(const char* op, int64_t rows, int64_t padded_vocab, int64_t vocab) {
  if (rows >= 0 && vocab >= 1 && padded_vocab >= vocab) return Status::Ok();
  return Status::Error(std::string(op) + ": shape: rows " + std::to_string(rows) + ", padded_vocab " +
                       std::to_string(padded_vocab) + ", vocab " + std::to_string(vocab) +
                       " is not allowed; need 1 <= vocab <= padded_vocab");
}

}  // namespace

Status CudaBackend::CrossEntropyForward(const float* logits, const int32_t* targets, float* losses, int64_t rows,
                                        int64_t padded_vocab, int64_t vocab) {
  NN_PROFILE("CrossEntropyForward");
  KEEL_RETURN_IF_ERROR(CheckCrossEntropyShape("CrossEntropyForward", rows, padded_vocab, vocab));
  if (rows == 0) return Status::Ok();
  const bool vec = padded_vocab % 4 == 0 && Aligned(logits, 16);
  CrossEntropyForwardKernel<<<static_cast<unsigned int>(rows), kCeThreads, 0, stream_>>>(logits, targets, losses,
                                                                                         padded_vocab, vocab, vec);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::CrossEntropyBackward(const float* logits, const int32_t* targets, float* dlogits, int64_t rows,
                                         int64_t padded_vocab, int64_t vocab, float scale) {
  NN_PROFILE("CrossEntropyBackward");
  KEEL_RETURN_IF_ERROR(CheckCrossEntropyShape("CrossEntropyBackward", rows, padded_vocab, vocab));
  if (rows == 0) return Status::Ok();
  const bool vec = padded_vocab % 4 == 0 && Aligned(logits, 16) && Aligned(dlogits, 16);
  CrossEntropyBackwardKernel<<<static_cast<unsigned int>(rows), kCeThreads, 0, stream_>>>(
      logits, targets, dlogits, padded_vocab, vocab, scale, vec);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::CeSharedLimit() {
  // Once per backend: the most dynamic shared memory a block may opt in to, less
  // what the one-read kernels' reduction trees take statically.
  int optin = 0;
  KEEL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  cudaFuncAttributes fp32_kernel, bf16_kernel;
  KEEL_CUDA_CHECK(cudaFuncGetAttributes(&fp32_kernel, CrossEntropyFusedKernel<true, float>));
  KEEL_CUDA_CHECK(cudaFuncGetAttributes(&bf16_kernel, CrossEntropyFusedKernel<true, uint16_t>));
  const int limit =
      optin - static_cast<int>(std::max(fp32_kernel.sharedSizeBytes, bf16_kernel.sharedSizeBytes));
  KEEL_CUDA_CHECK(
      cudaFuncSetAttribute(CrossEntropyFusedKernel<true, float>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  KEEL_CUDA_CHECK(
      cudaFuncSetAttribute(CrossEntropyFusedKernel<true, uint16_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  ce_shared_limit_ = limit;
  int per_sm = 0, reserved = 0;
  KEEL_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_));
  KEEL_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device_));
  ce_sm_shared_ = per_sm;
  ce_block_overhead_ =
      static_cast<int64_t>(std::max(fp32_kernel.sharedSizeBytes, bf16_kernel.sharedSizeBytes)) + reserved;
  return Status::Ok();
}

int64_t CudaBackend::CeSplit(int64_t vocab, int64_t padded, bool vec) const {
  const int64_t full = CeRowColumns(vocab, vec), half = CeHalfColumns(vocab, padded, vec);
  const int64_t bytes = static_cast<int64_t>(sizeof(float));
  if (half < full && half * bytes <= ce_shared_limit_ && 2 * (half * bytes + ce_block_overhead_) <= ce_sm_shared_) {
    return half;
  }
  return full * bytes <= ce_shared_limit_ ? full : 0;
}

Status CudaBackend::CrossEntropyFusedBf16(const float* logits, const int32_t* targets, float* losses,
                                          uint16_t* dlogits, int64_t ld, int64_t rows, int64_t padded_vocab,
                                          int64_t vocab, float scale, int64_t row0) {
  NN_PROFILE("CrossEntropyFusedBf16");
  static const char kOp[] = "CrossEntropyFusedBf16";
  KEEL_RETURN_IF_ERROR(CheckCrossEntropyShape(kOp, rows, padded_vocab, vocab));
  if (rows == 0) return Status::Ok();
  if (logits == nullptr || targets == nullptr || losses == nullptr || dlogits == nullptr)
    return Status::Error(std::string(kOp) + ": logits, targets, losses or dlogits: null");
  const bool aliased = static_cast<const void*>(dlogits) == static_cast<const void*>(logits);
  if (ld < padded_vocab || (aliased && ld != 2 * padded_vocab))
    return Status::Error(std::string(kOp) + ": ld: " + std::to_string(ld) + " is not allowed; need >= padded_vocab (" +
                         std::to_string(padded_vocab) + "), and 2 * padded_vocab when dlogits is logits");
  if (row0 < 0 || (row0 > 0 && aliased))
    return Status::Error(std::string(kOp) + ": row0: " + std::to_string(row0) +
                         " is not allowed; need >= 0, and 0 when dlogits is logits");
  unsigned long long* pair = nullptr;
  if (row0 == 0) {
    KEEL_RETURN_IF_ERROR(NoteProduced(dlogits, &pair));
  } else {
    KEEL_RETURN_IF_ERROR(ContinueProduced(dlogits, &pair));
  }
  dlogits += row0 * ld;
  const bool vec = padded_vocab % 4 == 0 && ld % 4 == 0 && Aligned(logits, 16) && Aligned(dlogits, 8);
  if (ce_shared_limit_ < 0) KEEL_RETURN_IF_ERROR(CeSharedLimit());
  const unsigned int blocks = static_cast<unsigned int>(rows);
  const int64_t split = CeSplit(vocab, padded_vocab, vec);
  if (split > 0) {
    CrossEntropyFusedKernel<true, uint16_t>
        <<<blocks, kCeThreads, static_cast<size_t>(split) * sizeof(float), stream_>>>(
            logits, targets, losses, dlogits, ld, padded_vocab, vocab, split, scale, vec, pair);
  } else if (!aliased) {
    CrossEntropyFusedKernel<false, uint16_t><<<blocks, kCeThreads, 0, stream_>>>(
        logits, targets, losses, dlogits, ld, padded_vocab, vocab, 0, scale, vec, pair);
  } else {
    return Status::Error(std::string(kOp) + ": vocab: " + std::to_string(vocab) +
                         " is too large for a row in shared memory, which writing bf16 over logits needs; pass a "
                         "separate dlogits");
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::CrossEntropyFused(const float* logits, const int32_t* targets, float* losses, float* dlogits,
                                      int64_t rows, int64_t padded_vocab, int64_t vocab, float scale) {
  NN_PROFILE("CrossEntropyFused");
  KEEL_RETURN_IF_ERROR(CheckCrossEntropyShape("CrossEntropyFused", rows, padded_vocab, vocab));
  if (rows == 0) return Status::Ok();
  const unsigned int blocks = static_cast<unsigned int>(rows);
  // The unfused ops' vec: the forward's from logits, the backward's from both.
  const bool forward_vec = padded_vocab % 4 == 0 && Aligned(logits, 16);
  const bool vec = forward_vec && Aligned(dlogits, 16);
  if (vec != forward_vec) {
    // dlogits not 16-byte aligned where logits are: the unfused ops reduce the
    // row in two different orders, so the losses and the dlogits come from
    // their two kernels (the bits this op promises).
    CrossEntropyForwardKernel<<<blocks, kCeThreads, 0, stream_>>>(logits, targets, losses, padded_vocab, vocab,
                                                                  forward_vec);
    NN_LAUNCH_CHECK();
    CrossEntropyBackwardKernel<<<blocks, kCeThreads, 0, stream_>>>(logits, targets, dlogits, padded_vocab, vocab,
                                                                   scale, vec);
    NN_LAUNCH_CHECK();
    return Status::Ok();
  }
  if (ce_shared_limit_ < 0) KEEL_RETURN_IF_ERROR(CeSharedLimit());
  const int64_t split = CeSplit(vocab, padded_vocab, vec);
  if (split > 0) {
    CrossEntropyFusedKernel<true, float><<<blocks, kCeThreads, static_cast<size_t>(split) * sizeof(float), stream_>>>(
        logits, targets, losses, dlogits, padded_vocab, padded_vocab, vocab, split, scale, vec, nullptr);
  } else {  // no part of the row fits: read it from global memory twice
    CrossEntropyFusedKernel<false, float><<<blocks, kCeThreads, 0, stream_>>>(
        logits, targets, losses, dlogits, padded_vocab, padded_vocab, vocab, 0, scale, vec, nullptr);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
