// The CUDA backend's gated-linear-attention ops (nn.h): logsigmoid, swish gating
// and the gated recurrence (GlaForward / GlaBackward) in its chunked form. The CPU
// references are nn_cpu_gla.cc and gla_cpu.h (whose header holds the chunked
// formulas this file implements; ChunkedMatchesSequential in nn_cpu_test.cc
// proves them against the definition).
//
// The recurrence, fp32 on CUDA cores (no tensor cores), in two kinds of kernel:
//   - GlaIntraKernel, one block per (chunk, head, batch): the intra-chunk terms,
//     which need nothing from other chunks: A (kChunk x kChunk: q, k and the
//     decays exp(B_t - B_u)) to global memory, and in the backward the full dP
//     over all value columns and the intra parts of dq, dk and dv. Every chunk
//     of the sequence runs at once, and each term is computed once per chunk
//     (the state kernels' value tiles used to recompute A and the intra sums
//     each).
//   - the state kernels, one block per (batch, head, tile of kTile value
//     columns), walk the chunks in order with the state's tile in shared
//     memory and add the inter-chunk terms. Their decays are one exp per
//     (position, feature) (StateDecays), not one per (position, feature,
//     column). The columns of S evolve independently (the gates scale S's
//     rows), so the tiles need nothing from each other.
// Every exp() argument is <= 0: the cumulative log gates are relative to the
// chunk's start, so nothing overflows.
//
// The backward saves nothing from the forward:
//   GlaIntraKernel writes A, intra_q, intra_k and dv's intra part;
//   pass 1 (GlaDqKernel) recomputes the states chunk by chunk and writes each
//     tile's part of dq's state term (dq sums over all value columns);
//   pass 2 (GlaDkDvKernel) goes over the chunks in reverse with dS, adds dv's
//     state term (complete within a tile) and writes each tile's part of dk's;
//   pass 3 (GlaFinishKernel, every row at once) adds the intra parts and the
//     tiles' parts in tile order into dq and dk and writes each row's
//     q dq - k dk;
//   pass 4 (GlaGateScanKernel) makes dgk their reverse cumulative sum.
// Its scratch is the parts, 2 x tiles x batch*seq x dk floats (tiles =
// ceil(dv/H / kTile)), the intra parts (2 x batch*seq x dk) and A (batch x heads
// x chunks x kChunk^2); every sum runs in a fixed order, so results are
// deterministic.
#include <string>

#include "kernels/nn_cuda_internal.h"

namespace keel {
namespace nncuda {

namespace {

constexpr int kChunk = 64;    // positions per chunk
constexpr int kTile = 32;     // value columns per block: one warp across a row of a tile
constexpr int kPadTile = kTile + 1;  // shared rows of a tile, padded against bank conflicts
constexpr int kGlaThreads = 256;

// ============================================================================
// Kernels: elementwise
// ============================================================================

struct LogSigmoidOp {
  float scale;
  __device__ float operator()(float x, float) const { return scale * (fminf(x, 0.0f) - log1pf(expf(-fabsf(x)))); }
};

struct LogSigmoidGradOp {
  float scale;
  __device__ float operator()(float x, float dy) const { return dy * scale / (1.0f + expf(x)); }
};

__global__ void SiluGateForwardKernel(const float* __restrict__ x, const float* __restrict__ g, int64_t g_ld,
                                      float* __restrict__ y, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const float a = g[r * g_ld + c];
    y[i] = x[i] * (a / (1.0f + expf(-a)));
  }
}

__global__ void SiluGateBackwardKernel(const float* __restrict__ x, const float* __restrict__ g, int64_t g_ld,
                                       const float* __restrict__ dy, float* __restrict__ dx, float* __restrict__ dg,
                                       int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const float a = g[r * g_ld + c];
    const float s = 1.0f / (1.0f + expf(-a));
    const float d = dy[i];
    dx[i] = d * (a * s);
    dg[r * g_ld + c] = d * x[i] * (s * (1.0f + a * (1.0f - s)));
  }
}

// ============================================================================
// Kernels: the recurrence
// ============================================================================

// What every recurrence kernel reads (nn.h's layout).
struct GlaArgs {
  const float* qkv;
  int64_t ld;
  const float* gk;
  const float* dout;  // backward only
  int64_t seq, dk, dv;
  int dkh, dvh;
  float scale;  // 1 / sqrt(dkh)
};

// The shared-memory arrays of one block; rows of q, k, cum are dkh + 1 floats
// apart and rows of v, dout and the state kPadTile apart (no bank conflicts
// when a warp walks a column).
struct Smem {
  int p;  // dkh + 1
  float *cum, *q, *k, *v, *dout, *a, *dp, *st;
  float* ends;  // StateDecays: B_end[i], then exp(B_end[i]) (2 dkh floats)
};

// Floats of a block's shared memory: q, k, cum; the v (and dout) tile; the
// state's tile; the chunk's end decays; then, when `chunk_matrices`, A (and dP)
// of kChunk x kChunk. The backward's state kernels carve no A or dP (that is
// what lets two of their blocks share a multiprocessor); GlaIntraKernel uses no
// state but carves the same arrays.
__host__ __device__ inline int64_t SmemFloats(int dkh, bool backward, bool chunk_matrices) {
  const int64_t p = dkh + 1;
  const int64_t copies = backward ? 2 : 1;
  return 3 * kChunk * p + copies * kChunk * kPadTile + int64_t{dkh} * kPadTile + 2 * int64_t{dkh} +
         (chunk_matrices ? copies * kChunk * kChunk : 0);
}

__device__ Smem Carve(float* base, int dkh, bool backward, bool chunk_matrices) {
  Smem s;
  s.p = dkh + 1;
  float* at = base;
  s.cum = at;
  at += kChunk * s.p;
  s.q = at;
  at += kChunk * s.p;
  s.k = at;
  at += kChunk * s.p;
  s.v = at;
  at += kChunk * kPadTile;
  s.dout = backward ? at : nullptr;
  at += backward ? kChunk * kPadTile : 0;
  s.st = at;
  at += dkh * kPadTile;
  s.ends = at;
  at += 2 * dkh;
  s.a = chunk_matrices ? at : nullptr;
  at += chunk_matrices ? kChunk * kChunk : 0;
  s.dp = chunk_matrices && backward ? at : nullptr;
  return s;
}

// The sums below give each thread kRows outputs that share one operand, read
// once from shared memory for all of them (the other operand is the same
// address across the warp: a broadcast). Each output still sums its terms in
// the order the one-output loops did, so the bits are theirs.
constexpr int kRows = 8;     // rows of a chunk (positions) per thread
constexpr int kFeatures = 4;  // rows of the state (key features) per thread

// out(t, jj) = sum_{i < len} x[t][i] y[i][jj] for the columns jj < jn of a
// tile and positions t < n, a thread per (kRows positions, column); x rows are
// px apart, y rows kPadTile apart. `store(t, jj, acc)` takes each result.
template <typename Store>
__device__ __forceinline__ void RowsTimesTile(int n, int jn, int len, const float* x, int px, const float* y,
                                              Store store) {
  for (int idx = threadIdx.x; idx < CeilDiv(n, kRows) * kTile; idx += blockDim.x) {
    const int t0 = idx / kTile * kRows, jj = idx - idx / kTile * kTile;
    if (jj >= jn) continue;
    float acc[kRows] = {};
    for (int i = 0; i < len; ++i) {
      const float yv = y[i * kPadTile + jj];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] += x[min(t0 + r, n - 1) * px + i] * yv;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (t0 + r < n) store(t0 + r, jj, acc[r]);
    }
  }
}

// out(t, i) = sum_{jj < kTile} m[i][jj] y[t][jj] for positions t < n and rows
// i < count of m (the state's features, or a tile's positions), a thread per
// (kRows positions, row of m); m and y rows kPadTile apart. `store(t, i, acc)`
// takes each result.
template <typename Store>
__device__ __forceinline__ void TileDotRows(int n, int count, const float* m, const float* y, Store store) {
  for (int idx = threadIdx.x; idx < CeilDiv(n, kRows) * count; idx += blockDim.x) {
    const int t0 = idx / count * kRows, i = idx - idx / count * count;
    float acc[kRows] = {};
#pragma unroll 4
    for (int jj = 0; jj < kTile; ++jj) {
      const float mv = m[i * kPadTile + jj];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] += mv * y[min(t0 + r, n - 1) * kPadTile + jj];
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (t0 + r < n) store(t0 + r, i, acc[r]);
    }
  }
}

// st[i][jj] <- decay[i] st[i][jj] + sum_{u < n} (mul x[u][i]) y[u][jj] over the
// tile's kTile columns and features i < dkh, a thread per (kFeatures features,
// column); x rows are px apart, y rows kPadTile apart. mul = 1 multiplies
// nothing away: (1 * x) is x. Ends synchronised.
__device__ __forceinline__ void UpdateState(int n, int dkh, const float* decay, const float* x, int px,
                                            const float* y, float mul, float* st) {
  for (int idx = threadIdx.x; idx < CeilDiv(dkh, kFeatures) * kTile; idx += blockDim.x) {
    const int i0 = idx / kTile * kFeatures, jj = idx - idx / kTile * kTile;
    float acc[kFeatures];
#pragma unroll
    for (int r = 0; r < kFeatures; ++r) {
      const int i = min(i0 + r, dkh - 1);
      acc[r] = decay[i] * st[i * kPadTile + jj];
    }
    for (int u = 0; u < n; ++u) {
      const float yv = y[u * kPadTile + jj];
#pragma unroll
      for (int r = 0; r < kFeatures; ++r) acc[r] += mul * x[u * px + min(i0 + r, dkh - 1)] * yv;
    }
#pragma unroll
    for (int r = 0; r < kFeatures; ++r) {
      if (i0 + r < dkh) st[(i0 + r) * kPadTile + jj] = acc[r];
    }
  }
  __syncthreads();
}

// Positions in the chunk starting at c0: kChunk, or what is left of seq.
__device__ __forceinline__ int ChunkLength(int64_t seq, int64_t c0) {
  return seq - c0 < kChunk ? static_cast<int>(seq - c0) : kChunk;
}

// Loads chunk [c0, c0 + n) of head h of batch b: q, k and gk, made cumulative
// along the chunk (B_t = gk_c0 + ... + gk_t, relative to the chunk's start, so
// that every exp() argument below is <= 0). Ends synchronised.
__device__ void LoadQkCum(const GlaArgs& g, int64_t b, int h, int64_t c0, int n, const Smem& s) {
  const int dkh = g.dkh;
  for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
    const int t = idx / dkh, i = idx - t * dkh;
    const int64_t row = b * g.seq + c0 + t;
    s.q[t * s.p + i] = g.qkv[row * g.ld + h * dkh + i];
    s.k[t * s.p + i] = g.qkv[row * g.ld + g.dk + h * dkh + i];
    s.cum[t * s.p + i] = g.gk[row * g.dk + h * dkh + i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < dkh; i += blockDim.x) {
    float run = 0.0f;
    for (int t = 0; t < n; ++t) {
      run += s.cum[t * s.p + i];
      s.cum[t * s.p + i] = run;
    }
  }
  __syncthreads();
}

// Loads the v tile of columns j0 .. j0 + kTile of chunk [c0, c0 + n) (0 from
// column jn on) and, when s.dout is set, dout's tile likewise. Ends synchronised.
__device__ void LoadTile(const GlaArgs& g, int64_t b, int h, int64_t c0, int n, int j0, int jn, const Smem& s) {
  for (int idx = threadIdx.x; idx < n * kTile; idx += blockDim.x) {
    const int t = idx / kTile, jj = idx - t * kTile;
    const int64_t row = b * g.seq + c0 + t;
    const int64_t col = int64_t{h} * g.dvh + j0 + jj;
    s.v[t * kPadTile + jj] = jj < jn ? g.qkv[row * g.ld + 2 * g.dk + col] : 0.0f;
    if (s.dout != nullptr) s.dout[t * kPadTile + jj] = jj < jn ? g.dout[row * g.dv + col] : 0.0f;
  }
  __syncthreads();
}

// The decays the state terms use, in place (after LoadQkCum; ends
// synchronised): s.ends = B_end[i], then exp(B_end[i]); q_t <- q_t * exp(B_t);
// k_u <- k_u * exp(B_end - B_u); cum_u <- exp(B_end - B_u). One exp per
// (position, feature), where the sums below would take one per (position,
// feature, column).
__device__ void StateDecays(int n, int dkh, const Smem& s) {
  for (int i = threadIdx.x; i < dkh; i += blockDim.x) {
    const float end = s.cum[(n - 1) * s.p + i];
    s.ends[i] = end;
    s.ends[dkh + i] = expf(end);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
    const int t = idx / dkh, i = idx - t * dkh;
    const float c = s.cum[t * s.p + i];
    const float f = expf(s.ends[i] - c);
    s.q[t * s.p + i] *= expf(c);
    s.k[t * s.p + i] *= f;
    s.cum[t * s.p + i] = f;
  }
  __syncthreads();
}

// S <- diag(exp(B_end)) S + sum_u diag(exp(B_end - B_u)) k_u^T v_u over the
// tile, with StateDecays' k (k_u exp(B_end - B_u)) and exp(B_end). Ends synchronised.
__device__ void AdvanceState(int n, int dkh, const float* exp_end, const Smem& s) {
  UpdateState(n, dkh, exp_end, s.k, s.p, s.v, 1.0f, s.st);
}

__device__ void ZeroState(int dkh, const Smem& s) {
  for (int idx = threadIdx.x; idx < dkh * kPadTile; idx += blockDim.x) s.st[idx] = 0.0f;
  __syncthreads();
}

// Where chunk c of head h of batch b keeps its A (kChunk x kChunk, row t, column u).
__device__ __forceinline__ float* ChunkA(float* a, int64_t b, int h, int64_t c, int heads, int64_t chunks) {
  return a + ((b * heads + h) * chunks + c) * (kChunk * kChunk);
}

// The intra-chunk terms, once per (chunk, head, batch): the chunks are
// independent, so every chunk of the sequence runs at once.
//   A_tu = sum_i q_t[i] k_u[i] exp(B_t[i] - B_u[i]) for u <= t (0 above), to a_out;
// and in the backward (g.dout set), with dP_tu = sum over all value columns of
// do_t v_u:
//   dq_t  (intra) = scale sum_{u<=t} dP_tu k_u exp(B_t - B_u)   -> intra_q (rows x dk)
//   dk_u  (intra) = scale sum_{t>=u} dP_tu q_t exp(B_t - B_u)   -> intra_k
//   dv_u  (intra) = scale sum_{t>=u} A_tu do_t                  -> dqkv's v columns (=)
// The state terms are the tile kernels' (they add to dv, and GlaFinishKernel
// adds the intra parts of dq and dk to the tiles').
__global__ void __launch_bounds__(kGlaThreads) GlaIntraKernel(GlaArgs g, float* __restrict__ a_out,
                                                              float* __restrict__ intra_q, float* __restrict__ intra_k,
                                                              float* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z, c = blockIdx.x, c0 = c * kChunk;
  const int h = blockIdx.y, dkh = g.dkh;
  const bool backward = g.dout != nullptr;
  const Smem s = Carve(smem, dkh, backward, true);
  const int n = ChunkLength(g.seq, c0);
  LoadQkCum(g, b, h, c0, n, s);
  float* a_global = ChunkA(a_out, b, h, c, static_cast<int>(gridDim.y), gridDim.x);
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += blockDim.x) {
    const int t = idx / kChunk, u = idx - t * kChunk;
    float acc = 0.0f;
    if (t < n && u <= t) {
      for (int i = 0; i < dkh; ++i) {
        acc += s.q[t * s.p + i] * s.k[u * s.p + i] * expf(s.cum[t * s.p + i] - s.cum[u * s.p + i]);
      }
    }
    s.a[idx] = acc;
    a_global[idx] = acc;
  }
  if (!backward) return;
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += blockDim.x) s.dp[idx] = 0.0f;
  __syncthreads();
  // dP over the value tiles, in tile order.
  for (int j0 = 0; j0 < g.dvh; j0 += kTile) {
    LoadTile(g, b, h, c0, n, j0, min(kTile, g.dvh - j0), s);
    TileDotRows(n, n, s.v, s.dout, [&](int t, int u, float acc) {
      if (u <= t) s.dp[t * kChunk + u] += acc;
    });
    __syncthreads();  // the next tile's load overwrites v and dout
  }
  for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
    const int t = idx / dkh, i = idx - t * dkh;
    const float bt = s.cum[t * s.p + i];
    float acc = 0.0f;
    for (int u = 0; u <= t; ++u) acc += s.dp[t * kChunk + u] * s.k[u * s.p + i] * expf(bt - s.cum[u * s.p + i]);
    intra_q[(b * g.seq + c0 + t) * g.dk + int64_t{h} * dkh + i] = acc * g.scale;
  }
  for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
    const int u = idx / dkh, i = idx - u * dkh;
    const float bu = s.cum[u * s.p + i];
    float acc = 0.0f;
    for (int t = u; t < n; ++t) acc += s.dp[t * kChunk + u] * s.q[t * s.p + i] * expf(s.cum[t * s.p + i] - bu);
    intra_k[(b * g.seq + c0 + u) * g.dk + int64_t{h} * dkh + i] = acc * g.scale;
  }
  for (int j0 = 0; j0 < g.dvh; j0 += kTile) {
    const int jn = min(kTile, g.dvh - j0);
    LoadTile(g, b, h, c0, n, j0, jn, s);
    // A thread per (kRows positions u, column).
    for (int idx = threadIdx.x; idx < CeilDiv(n, kRows) * kTile; idx += blockDim.x) {
      const int u0 = idx / kTile * kRows, jj = idx - idx / kTile * kTile;
      if (jj >= jn) continue;
      float acc[kRows] = {};
      for (int t = u0; t < n; ++t) {
        const float dv = s.dout[t * kPadTile + jj];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (t >= u0 + r) acc[r] += s.a[t * kChunk + u0 + r] * dv;
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (u0 + r < n) dqkv[(b * g.seq + c0 + u0 + r) * g.ld + 2 * g.dk + int64_t{h} * g.dvh + j0 + jj] = acc[r] * g.scale;
      }
    }
    __syncthreads();
  }
}

// Block (tile, h, b): out's columns j0 .. j0 + jn of head h, the chunks in
// order with the state's tile in shared memory:
//   o_t = scale [ (q_t * exp(B_t)) S_in + sum_{u<=t} A_tu v_u ]
// with A from GlaIntraKernel.
__global__ void __launch_bounds__(kGlaThreads) GlaForwardKernel(GlaArgs g, const float* __restrict__ a_in,
                                                                float* __restrict__ out) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, j0 = blockIdx.x * kTile, jn = min(kTile, g.dvh - j0), dkh = g.dkh;
  const int64_t chunks = CeilDiv(g.seq, kChunk);
  const Smem s = Carve(smem, dkh, false, true);
  float* a = s.a;
  ZeroState(dkh, s);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t c0 = c * kChunk;
    const int n = ChunkLength(g.seq, c0);
    LoadQkCum(g, b, h, c0, n, s);
    StateDecays(n, dkh, s);
    const float* a_chunk = ChunkA(const_cast<float*>(a_in), b, h, c, static_cast<int>(gridDim.y), chunks);
    for (int idx = threadIdx.x; idx < n * kChunk; idx += blockDim.x) a[idx] = a_chunk[idx];
    LoadTile(g, b, h, c0, n, j0, jn, s);  // synchronises, after A's copy too
    // A thread per (kRows positions, column): the state term, then the intra one.
    for (int idx = threadIdx.x; idx < CeilDiv(n, kRows) * kTile; idx += blockDim.x) {
      const int t0 = idx / kTile * kRows, jj = idx - idx / kTile * kTile;
      if (jj >= jn) continue;
      float acc[kRows] = {};
      for (int i = 0; i < dkh; ++i) {
        const float sv = s.st[i * kPadTile + jj];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] += s.q[min(t0 + r, n - 1) * s.p + i] * sv;
      }
      for (int u = 0; u < min(t0 + kRows, n); ++u) {
        const float vv = s.v[u * kPadTile + jj];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (u <= t0 + r) acc[r] += a[min(t0 + r, n - 1) * kChunk + u] * vv;
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (t0 + r < n) out[(b * g.seq + c0 + t0 + r) * g.dv + int64_t{h} * g.dvh + j0 + jj] = acc[r] * g.scale;
      }
    }
    __syncthreads();  // the outputs read S_in before it advances
    AdvanceState(n, dkh, s.ends + dkh, s);
  }
}

// Pass 1 of the backward: this tile's part of dq's state term,
//   dq_t = scale exp(B_t) * (S_in do_t),
// into part (tile-major, batch*seq x dk).
__global__ void __launch_bounds__(kGlaThreads) GlaDqKernel(GlaArgs g, float* __restrict__ part) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, j0 = blockIdx.x * kTile, jn = min(kTile, g.dvh - j0), dkh = g.dkh;
  const int64_t rows = static_cast<int64_t>(gridDim.z) * g.seq;
  float* my_part = part + static_cast<int64_t>(blockIdx.x) * rows * g.dk;
  const Smem s = Carve(smem, dkh, true, false);
  ZeroState(dkh, s);
  for (int64_t c0 = 0; c0 < g.seq; c0 += kChunk) {
    const int n = ChunkLength(g.seq, c0);
    LoadQkCum(g, b, h, c0, n, s);
    // q is not needed here: with 1 in its place StateDecays leaves exp(B_t) there.
    for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
      const int t = idx / dkh, i = idx - t * dkh;
      s.q[t * s.p + i] = 1.0f;
    }
    StateDecays(n, dkh, s);  // synchronises before it reads q
    LoadTile(g, b, h, c0, n, j0, jn, s);
    TileDotRows(n, dkh, s.st, s.dout, [&](int t, int i, float acc) {
      my_part[(b * g.seq + c0 + t) * g.dk + int64_t{h} * dkh + i] = s.q[t * s.p + i] * acc * g.scale;
    });
    __syncthreads();
    AdvanceState(n, dkh, s.ends + dkh, s);
  }
}

// Pass 2: the chunks in reverse with dS (this tile's columns of the gradient of
// the state after the chunk), the state terms only:
//   dk_u  = exp(B_end - B_u) * (dS v_u)                    (this tile's part)
//   dv_u += (k_u * exp(B_end - B_u)) dS                     (complete: onto GlaIntraKernel's)
//   dS   <- diag(exp(B_end)) dS + scale sum_t (q_t * exp(B_t))^T do_t
__global__ void __launch_bounds__(kGlaThreads) GlaDkDvKernel(GlaArgs g, float* __restrict__ part,
                                                             float* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, j0 = blockIdx.x * kTile, jn = min(kTile, g.dvh - j0), dkh = g.dkh;
  const int64_t rows = static_cast<int64_t>(gridDim.z) * g.seq;
  float* my_part = part + static_cast<int64_t>(blockIdx.x) * rows * g.dk;
  const Smem s = Carve(smem, dkh, true, false);
  ZeroState(dkh, s);
  const int64_t chunks = CeilDiv(g.seq, kChunk);
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * kChunk;
    const int n = ChunkLength(g.seq, c0);
    LoadQkCum(g, b, h, c0, n, s);
    StateDecays(n, dkh, s);  // q_t exp(B_t), k_u exp(B_end - B_u), cum_u = exp(B_end - B_u)
    LoadTile(g, b, h, c0, n, j0, jn, s);
    TileDotRows(n, dkh, s.st, s.v, [&](int u, int i, float acc) {
      my_part[(b * g.seq + c0 + u) * g.dk + int64_t{h} * dkh + i] = s.cum[u * s.p + i] * acc;
    });
    RowsTimesTile(n, jn, dkh, s.k, s.p, s.st, [&](int u, int jj, float acc) {
      dqkv[(b * g.seq + c0 + u) * g.ld + 2 * g.dk + int64_t{h} * g.dvh + j0 + jj] += acc;
    });
    __syncthreads();  // dk and dv read dS before it moves
    UpdateState(n, dkh, s.ends + dkh, s.q, s.p, s.dout, g.scale, s.st);
  }
}

// Pass 3, a thread per (row, key column): dq and dk as the intra-chunk parts
// plus the tiles' state parts in tile order, and each row's term of dgk,
// q dq - k dk, into dgk (GlaGateScanKernel sums them).
__global__ void GlaFinishKernel(GlaArgs g, int64_t batch, int tiles, const float* __restrict__ intra_q,
                                const float* __restrict__ intra_k, const float* __restrict__ part_q,
                                const float* __restrict__ part_k, float* __restrict__ dqkv, float* __restrict__ dgk) {
  const int64_t rows = batch * g.seq;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * g.dk) return;
  const int64_t row = idx / g.dk, c = idx - row * g.dk;
  float dq = intra_q[idx], dk = intra_k[idx];
  for (int tile = 0; tile < tiles; ++tile) {
    dq += part_q[tile * rows * g.dk + idx];
    dk += part_k[tile * rows * g.dk + idx];
  }
  dqkv[row * g.ld + c] = dq;
  dqkv[row * g.ld + g.dk + c] = dk;
  dgk[idx] = g.qkv[row * g.ld + c] * dq - g.qkv[row * g.ld + g.dk + c] * dk;
}

// Pass 4, a thread per (batch, key column): dgk_t = sum_{u>=t} of the terms,
// in place, walking the sequence backwards (the loads of a group of positions
// are issued before its sums).
__global__ void GlaGateScanKernel(int64_t batch, int64_t seq, int64_t dk, float* __restrict__ dgk) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= batch * dk) return;
  const int64_t b = idx / dk, c = idx - b * dk;
  float* col = dgk + b * seq * dk + c;
  constexpr int kGroup = 8;
  float run = 0.0f;
  int64_t t = seq - 1;
  for (; t >= kGroup - 1; t -= kGroup) {
    float w[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) w[j] = col[(t - j) * dk];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      run += w[j];
      col[(t - j) * dk] = run;
    }
  }
  for (; t >= 0; --t) {
    run += col[t * dk];
    col[t * dk] = run;
  }
}

Status CheckGla(const char* op, int64_t ld, int64_t batch, int64_t seq, int64_t heads, int64_t dk, int64_t dv) {
  const auto bad = [&](const std::string& field, int64_t value, const std::string& need) {
    return Status::Error(std::string(op) + ": " + field + ": " + std::to_string(value) + " is not allowed; need " +
                         need);
  };
  if (batch < 0 || batch > 65535) return bad("batch", batch, "0 .. 65535");
  if (seq < 1) return bad("seq", seq, ">= 1");
  if (heads < 1 || heads > 65535) return bad("heads", heads, "1 .. 65535");
  if (dk < 1 || dk % heads != 0) return bad("dk", dk, "a positive multiple of heads " + std::to_string(heads));
  if (dv < 1 || dv % heads != 0) return bad("dv", dv, "a positive multiple of heads " + std::to_string(heads));
  if (dk / heads > kGlaMaxKeyHead) {
    return bad("dk / heads", dk / heads, "<= " + std::to_string(kGlaMaxKeyHead) + " (kGlaMaxKeyHead)");
  }
  if (ld < 2 * dk + dv) return bad("ld", ld, ">= 2 dk + dv = " + std::to_string(2 * dk + dv));
  return Status::Ok();
}

GlaArgs MakeArgs(const float* qkv, int64_t ld, const float* gk, const float* dout, int64_t seq, int64_t heads,
                 int64_t dk, int64_t dv) {
  GlaArgs g;
  g.qkv = qkv;
  g.ld = ld;
  g.gk = gk;
  g.dout = dout;
  g.seq = seq;
  g.dk = dk;
  g.dv = dv;
  g.dkh = static_cast<int>(dk / heads);
  g.dvh = static_cast<int>(dv / heads);
  g.scale = 1.0f / sqrtf(static_cast<float>(g.dkh));  // the CPU's 1 / sqrt(float(dkh))
  return g;
}

// Lets `kernel` use `bytes` of dynamic shared memory (above the default 48 KB).
template <typename Kernel>
Status AllowSmem(Kernel kernel, size_t bytes) {
  KEEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return Status::Ok();
}

}  // namespace

// ============================================================================
// Launchers
// ============================================================================

Status CudaBackend::LogSigmoidForward(const float* x, float* y, int64_t count, float scale) {
  NN_PROFILE("LogSigmoidForward");
  if (count < 0) return Status::Error("LogSigmoidForward: count: " + std::to_string(count) + " is negative");
  if (count == 0) return Status::Ok();
  return LaunchMap<1>(y, x, nullptr, count, LogSigmoidOp{scale}, stream_);
}

Status CudaBackend::LogSigmoidBackward(const float* x, const float* dy, float* dx, int64_t count, float scale) {
  NN_PROFILE("LogSigmoidBackward");
  if (count < 0) return Status::Error("LogSigmoidBackward: count: " + std::to_string(count) + " is negative");
  if (count == 0) return Status::Ok();
  return LaunchMap<2>(dx, x, dy, count, LogSigmoidGradOp{scale}, stream_);
}

Status CudaBackend::SiluGateForward(const float* x, const float* g, int64_t g_ld, float* y, int64_t rows,
                                    int64_t cols) {
  NN_PROFILE("SiluGateForward");
  if (rows < 0 || cols < 1 || g_ld < cols)
    return Status::Error("SiluGateForward: shape: rows " + std::to_string(rows) + ", cols " + std::to_string(cols) +
                         ", g_ld " + std::to_string(g_ld) + " is not allowed; need rows >= 0, cols >= 1, g_ld >= cols");
  if (rows == 0) return Status::Ok();
  SiluGateForwardKernel<<<GridFor(rows * cols), kThreads, 0, stream_>>>(x, g, g_ld, y, rows, cols);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::SiluGateBackward(const float* x, const float* g, int64_t g_ld, const float* dy, float* dx,
                                     float* dg, int64_t rows, int64_t cols) {
  NN_PROFILE("SiluGateBackward");
  if (rows < 0 || cols < 1 || g_ld < cols)
    return Status::Error("SiluGateBackward: shape: rows " + std::to_string(rows) + ", cols " + std::to_string(cols) +
                         ", g_ld " + std::to_string(g_ld) + " is not allowed; need rows >= 0, cols >= 1, g_ld >= cols");
  if (rows == 0) return Status::Ok();
  SiluGateBackwardKernel<<<GridFor(rows * cols), kThreads, 0, stream_>>>(x, g, g_ld, dy, dx, dg, rows, cols);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::GlaForward(const float* qkv, int64_t ld, const float* gk, float* out, int64_t batch,
                               int64_t seq, int64_t heads, int64_t dk, int64_t dv) {
  NN_PROFILE("GlaForward");
  KEEL_RETURN_IF_ERROR(CheckGla("GlaForward", ld, batch, seq, heads, dk, dv));
  if (batch == 0) return Status::Ok();
  if (qkv == nullptr || gk == nullptr || out == nullptr) return Status::Error("GlaForward: qkv, gk or out: null");
  const GlaArgs g = MakeArgs(qkv, ld, gk, nullptr, seq, heads, dk, dv);
  const int64_t chunks = CeilDiv(seq, kChunk);
  KEEL_RETURN_IF_ERROR(
      gla_a_.Reserve(static_cast<size_t>(batch * heads * chunks) * kChunk * kChunk * sizeof(float), stream_));
  const size_t smem = static_cast<size_t>(SmemFloats(g.dkh, false, true)) * sizeof(float);
  KEEL_RETURN_IF_ERROR(
      AllowSmem(GlaIntraKernel, static_cast<size_t>(SmemFloats(g.dkh, true, true)) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaForwardKernel, smem));
  // Every chunk's A at once, then the state's walk over the chunks.
  GlaIntraKernel<<<dim3(static_cast<unsigned int>(chunks), static_cast<unsigned int>(heads),
                        static_cast<unsigned int>(batch)),
                   kGlaThreads, smem, stream_>>>(g, gla_a_.get<float>(), nullptr, nullptr, nullptr);
  NN_LAUNCH_CHECK();
  const dim3 grid(static_cast<unsigned int>(CeilDiv(g.dvh, kTile)), static_cast<unsigned int>(heads),
                  static_cast<unsigned int>(batch));
  GlaForwardKernel<<<grid, kGlaThreads, smem, stream_>>>(g, gla_a_.get<float>(), out);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::GlaBackward(const float* qkv, int64_t ld, const float* gk, const float* dout, float* dqkv,
                                float* dgk, int64_t batch, int64_t seq, int64_t heads, int64_t dk, int64_t dv) {
  NN_PROFILE("GlaBackward");
  KEEL_RETURN_IF_ERROR(CheckGla("GlaBackward", ld, batch, seq, heads, dk, dv));
  if (batch == 0) return Status::Ok();
  if (qkv == nullptr || gk == nullptr || dout == nullptr || dqkv == nullptr || dgk == nullptr)
    return Status::Error("GlaBackward: qkv, gk, dout, dqkv or dgk: null");
  const GlaArgs g = MakeArgs(qkv, ld, gk, dout, seq, heads, dk, dv);
  const int tiles = static_cast<int>(CeilDiv(g.dvh, kTile));
  const int64_t part_floats = static_cast<int64_t>(tiles) * batch * seq * dk;
  const int64_t intra_floats = batch * seq * dk;
  KEEL_RETURN_IF_ERROR(
      gla_parts_.Reserve(2 * static_cast<size_t>(part_floats + intra_floats) * sizeof(float), stream_));
  float* part_q = gla_parts_.get<float>();
  float* part_k = part_q + part_floats;
  float* intra_q = part_k + part_floats;
  float* intra_k = intra_q + intra_floats;
  const int64_t chunks = CeilDiv(seq, kChunk);
  KEEL_RETURN_IF_ERROR(
      gla_a_.Reserve(static_cast<size_t>(batch * heads * chunks) * kChunk * kChunk * sizeof(float), stream_));
  const size_t smem = static_cast<size_t>(SmemFloats(g.dkh, true, true)) * sizeof(float);
  const size_t state_smem = static_cast<size_t>(SmemFloats(g.dkh, true, false)) * sizeof(float);
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaIntraKernel, smem));
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaDqKernel, state_smem));
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaDkDvKernel, state_smem));
  // The intra-chunk terms of every chunk at once (dv's first, written), then
  // the state's walks over the chunks (dv's second, added), then the sums.
  GlaIntraKernel<<<dim3(static_cast<unsigned int>(chunks), static_cast<unsigned int>(heads),
                        static_cast<unsigned int>(batch)),
                   kGlaThreads, smem, stream_>>>(g, gla_a_.get<float>(), intra_q, intra_k, dqkv);
  NN_LAUNCH_CHECK();
  const dim3 grid(static_cast<unsigned int>(tiles), static_cast<unsigned int>(heads), static_cast<unsigned int>(batch));
  GlaDqKernel<<<grid, kGlaThreads, state_smem, stream_>>>(g, part_q);
  NN_LAUNCH_CHECK();
  GlaDkDvKernel<<<grid, kGlaThreads, state_smem, stream_>>>(g, part_k, dqkv);
  NN_LAUNCH_CHECK();
  GlaFinishKernel<<<static_cast<unsigned int>(CeilDiv(batch * seq * dk, kThreads)), kThreads, 0, stream_>>>(
      g, batch, tiles, intra_q, intra_k, part_q, part_k, dqkv, dgk);
  NN_LAUNCH_CHECK();
  GlaGateScanKernel<<<static_cast<unsigned int>(CeilDiv(batch * dk, kThreads)), kThreads, 0, stream_>>>(
      batch, seq, dk, dgk);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
