// The CUDA backend's gated-linear-attention ops (nn.h): logsigmoid, swish gating
// and the gated recurrence (GlaForward / GlaBackward) in its chunked form. The CPU
// references are nn_cpu_gla.cc and gla_cpu.h (whose header holds the chunked
// formulas this file implements; ChunkedMatchesSequential in nn_cpu_test.cc
// proves them against the definition).
//
// The recurrence, fp32 on CUDA cores (no tensor cores): one block per (batch,
// head, tile of kTile value columns) walks its head's sequence a chunk of kChunk
// positions at a time, with the state's kTile columns in shared memory. The
// columns of S evolve independently (the gates scale S's rows), so the tiles
// need nothing from each other in the forward. A chunk's q, k and cumulative log
// gates (relative to the chunk's start, so every exp() argument is <= 0 and
// nothing overflows), its v tile and the intra-chunk matrix A (kChunk x kChunk)
// sit in shared memory too: about 166 KB at a key head size of 128
// (kGlaMaxKeyHead).
//
// The backward saves nothing from the forward:
//   pass 1 (GlaDqKernel) recomputes the states chunk by chunk and writes each
//     tile's part of dq (dq sums over all value columns);
//   pass 2 (GlaDkDvKernel) goes over the chunks in reverse with dS and writes
//     dv (complete within a tile) and each tile's part of dk;
//   pass 3 (GlaFinishKernel) adds the tiles' parts in tile order into dq and dk
//     and forms dgk as the reverse cumulative sum of q dq - k dk.
// Its scratch is the parts: 2 x tiles x batch*seq x dk floats (tiles = ceil(dv/H
// / kTile)); every sum runs in a fixed order, so results are deterministic.
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
};

__host__ __device__ inline int64_t SmemFloats(int dkh, bool backward) {
  const int64_t p = dkh + 1;
  const int64_t copies = backward ? 2 : 1;
  return 3 * kChunk * p + copies * kChunk * kPadTile + copies * kChunk * kChunk + int64_t{dkh} * kPadTile;
}

__device__ Smem Carve(float* base, int dkh, bool backward) {
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
  s.a = at;
  at += kChunk * kChunk;
  s.dout = backward ? at : nullptr;
  at += backward ? kChunk * kPadTile : 0;
  s.dp = backward ? at : nullptr;
  at += backward ? kChunk * kChunk : 0;
  s.st = at;
  return s;
}

// Loads chunk [c0, c0 + n) of head h of batch b: q, k and gk (made cumulative
// along the chunk), the v tile of columns j0 .. j0 + kTile (0 from column jn
// on) and, when s.dout is set, dout's tile likewise. Ends synchronised.
__device__ void LoadChunk(const GlaArgs& g, int64_t b, int h, int64_t c0, int n, int j0, int jn, const Smem& s) {
  const int dkh = g.dkh;
  for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
    const int t = idx / dkh, i = idx - t * dkh;
    const int64_t row = b * g.seq + c0 + t;
    s.q[t * s.p + i] = g.qkv[row * g.ld + h * dkh + i];
    s.k[t * s.p + i] = g.qkv[row * g.ld + g.dk + h * dkh + i];
    s.cum[t * s.p + i] = g.gk[row * g.dk + h * dkh + i];
  }
  for (int idx = threadIdx.x; idx < n * kTile; idx += blockDim.x) {
    const int t = idx / kTile, jj = idx - t * kTile;
    const int64_t row = b * g.seq + c0 + t;
    const int64_t col = int64_t{h} * g.dvh + j0 + jj;
    s.v[t * kPadTile + jj] = jj < jn ? g.qkv[row * g.ld + 2 * g.dk + col] : 0.0f;
    if (s.dout != nullptr) s.dout[t * kPadTile + jj] = jj < jn ? g.dout[row * g.dv + col] : 0.0f;
  }
  __syncthreads();
  // B_t = gk_c0 + ... + gk_t, a thread per feature, in position order.
  for (int i = threadIdx.x; i < dkh; i += blockDim.x) {
    float run = 0.0f;
    for (int t = 0; t < n; ++t) {
      run += s.cum[t * s.p + i];
      s.cum[t * s.p + i] = run;
    }
  }
  __syncthreads();
}

// A_tu = sum_i q_t[i] k_u[i] exp(B_t[i] - B_u[i]) for u <= t < n (into s.a) and,
// when s.dp is set, dP_tu = sum over the tile of dout_t v_u (into s.dp). Ends
// synchronised.
__device__ void IntraChunk(int n, int dkh, bool with_a, const Smem& s) {
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int t = idx / n, u = idx - t * n;
    if (u > t) continue;
    if (with_a) {
      float acc = 0.0f;
      for (int i = 0; i < dkh; ++i) {
        acc += s.q[t * s.p + i] * s.k[u * s.p + i] * expf(s.cum[t * s.p + i] - s.cum[u * s.p + i]);
      }
      s.a[t * kChunk + u] = acc;
    }
    if (s.dp != nullptr) {
      float acc = 0.0f;
      for (int jj = 0; jj < kTile; ++jj) acc += s.dout[t * kPadTile + jj] * s.v[u * kPadTile + jj];
      s.dp[t * kChunk + u] = acc;
    }
  }
  __syncthreads();
}

// S <- diag(exp(B_end)) S + sum_u diag(exp(B_end - B_u)) k_u^T v_u over the
// tile. Ends synchronised.
__device__ void AdvanceState(int n, int dkh, const Smem& s) {
  for (int idx = threadIdx.x; idx < dkh * kTile; idx += blockDim.x) {
    const int i = idx / kTile, jj = idx - i * kTile;
    const float end = s.cum[(n - 1) * s.p + i];
    float acc = expf(end) * s.st[i * kPadTile + jj];
    for (int u = 0; u < n; ++u) acc += s.k[u * s.p + i] * expf(end - s.cum[u * s.p + i]) * s.v[u * kPadTile + jj];
    s.st[i * kPadTile + jj] = acc;
  }
  __syncthreads();
}

// Positions in the chunk starting at c0: kChunk, or what is left of seq.
__device__ __forceinline__ int ChunkLength(int64_t seq, int64_t c0) {
  return seq - c0 < kChunk ? static_cast<int>(seq - c0) : kChunk;
}

__device__ void ZeroState(int dkh, const Smem& s) {
  for (int idx = threadIdx.x; idx < dkh * kPadTile; idx += blockDim.x) s.st[idx] = 0.0f;
  __syncthreads();
}

// Block (tile, h, b): out's columns j0 .. j0 + jn of head h.
__global__ void __launch_bounds__(kGlaThreads) GlaForwardKernel(GlaArgs g, float* __restrict__ out) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, j0 = blockIdx.x * kTile, jn = min(kTile, g.dvh - j0), dkh = g.dkh;
  const Smem s = Carve(smem, dkh, false);
  ZeroState(dkh, s);
  for (int64_t c0 = 0; c0 < g.seq; c0 += kChunk) {
    const int n = ChunkLength(g.seq, c0);
    LoadChunk(g, b, h, c0, n, j0, jn, s);
    IntraChunk(n, dkh, true, s);
    // o_t = scale [ (q_t * exp(B_t)) S_in + sum_{u<=t} A_tu v_u ]: a warp per t.
    for (int idx = threadIdx.x; idx < n * kTile; idx += blockDim.x) {
      const int t = idx / kTile, jj = idx - t * kTile;
      if (jj >= jn) continue;
      float acc = 0.0f;
      for (int i = 0; i < dkh; ++i) acc += s.q[t * s.p + i] * expf(s.cum[t * s.p + i]) * s.st[i * kPadTile + jj];
      for (int u = 0; u <= t; ++u) acc += s.a[t * kChunk + u] * s.v[u * kPadTile + jj];
      out[(b * g.seq + c0 + t) * g.dv + int64_t{h} * g.dvh + j0 + jj] = acc * g.scale;
    }
    __syncthreads();  // the outputs read S_in before it advances
    AdvanceState(n, dkh, s);
  }
}

// Pass 1 of the backward: this tile's part of dq,
//   dq_t = scale [ exp(B_t) * (S_in do_t) + sum_{u<=t} dP_tu k_u * exp(B_t - B_u) ],
// into part (tile-major, batch*seq x dk).
__global__ void __launch_bounds__(kGlaThreads) GlaDqKernel(GlaArgs g, float* __restrict__ part) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, j0 = blockIdx.x * kTile, jn = min(kTile, g.dvh - j0), dkh = g.dkh;
  const int64_t rows = static_cast<int64_t>(gridDim.z) * g.seq;
  float* my_part = part + static_cast<int64_t>(blockIdx.x) * rows * g.dk;
  const Smem s = Carve(smem, dkh, true);
  ZeroState(dkh, s);
  for (int64_t c0 = 0; c0 < g.seq; c0 += kChunk) {
    const int n = ChunkLength(g.seq, c0);
    LoadChunk(g, b, h, c0, n, j0, jn, s);
    IntraChunk(n, dkh, false, s);
    for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
      const int t = idx / dkh, i = idx - t * dkh;
      float acc = 0.0f;
      for (int jj = 0; jj < kTile; ++jj) acc += s.st[i * kPadTile + jj] * s.dout[t * kPadTile + jj];
      acc = expf(s.cum[t * s.p + i]) * acc;
      for (int u = 0; u <= t; ++u) {
        acc += s.dp[t * kChunk + u] * s.k[u * s.p + i] * expf(s.cum[t * s.p + i] - s.cum[u * s.p + i]);
      }
      my_part[(b * g.seq + c0 + t) * g.dk + int64_t{h} * dkh + i] = acc * g.scale;
    }
    __syncthreads();
    AdvanceState(n, dkh, s);
  }
}

// Pass 2: the chunks in reverse with dS (this tile's columns of the gradient of
// the state after the chunk):
//   dk_u = exp(B_end - B_u) * (dS v_u) + scale sum_{t>=u} dP_tu q_t * exp(B_t - B_u)   (this tile's part)
//   dv_u = (k_u * exp(B_end - B_u)) dS + scale sum_{t>=u} A_tu do_t                      (complete)
//   dS  <- diag(exp(B_end)) dS + scale sum_t (q_t * exp(B_t))^T do_t
__global__ void __launch_bounds__(kGlaThreads) GlaDkDvKernel(GlaArgs g, float* __restrict__ part,
                                                             float* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, j0 = blockIdx.x * kTile, jn = min(kTile, g.dvh - j0), dkh = g.dkh;
  const int64_t rows = static_cast<int64_t>(gridDim.z) * g.seq;
  float* my_part = part + static_cast<int64_t>(blockIdx.x) * rows * g.dk;
  const Smem s = Carve(smem, dkh, true);
  ZeroState(dkh, s);
  const int64_t chunks = CeilDiv(g.seq, kChunk);
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * kChunk;
    const int n = ChunkLength(g.seq, c0);
    LoadChunk(g, b, h, c0, n, j0, jn, s);
    IntraChunk(n, dkh, true, s);
    for (int idx = threadIdx.x; idx < n * dkh; idx += blockDim.x) {
      const int u = idx / dkh, i = idx - u * dkh;
      const float bu = s.cum[u * s.p + i];
      float acc = 0.0f;
      for (int jj = 0; jj < kTile; ++jj) acc += s.st[i * kPadTile + jj] * s.v[u * kPadTile + jj];
      acc = expf(s.cum[(n - 1) * s.p + i] - bu) * acc;
      for (int t = u; t < n; ++t) {
        acc += g.scale * s.dp[t * kChunk + u] * s.q[t * s.p + i] * expf(s.cum[t * s.p + i] - bu);
      }
      my_part[(b * g.seq + c0 + u) * g.dk + int64_t{h} * dkh + i] = acc;
    }
    for (int idx = threadIdx.x; idx < n * kTile; idx += blockDim.x) {
      const int u = idx / kTile, jj = idx - u * kTile;
      if (jj >= jn) continue;
      float acc = 0.0f;
      for (int i = 0; i < dkh; ++i) {
        acc += s.k[u * s.p + i] * expf(s.cum[(n - 1) * s.p + i] - s.cum[u * s.p + i]) * s.st[i * kPadTile + jj];
      }
      for (int t = u; t < n; ++t) acc += g.scale * s.a[t * kChunk + u] * s.dout[t * kPadTile + jj];
      dqkv[(b * g.seq + c0 + u) * g.ld + 2 * g.dk + int64_t{h} * g.dvh + j0 + jj] = acc;
    }
    __syncthreads();  // dk and dv read dS before it moves
    for (int idx = threadIdx.x; idx < dkh * kTile; idx += blockDim.x) {
      const int i = idx / kTile, jj = idx - i * kTile;
      float acc = expf(s.cum[(n - 1) * s.p + i]) * s.st[i * kPadTile + jj];
      for (int t = 0; t < n; ++t) {
        acc += g.scale * s.q[t * s.p + i] * expf(s.cum[t * s.p + i]) * s.dout[t * kPadTile + jj];
      }
      s.st[i * kPadTile + jj] = acc;
    }
    __syncthreads();
  }
}

// Pass 3, a thread per (batch, key column): dq and dk as the sums of the tiles'
// parts in tile order, and dgk_t = sum_{u>=t} (q_u dq_u - k_u dk_u), walking the
// sequence backwards.
__global__ void GlaFinishKernel(GlaArgs g, int64_t batch, int tiles, const float* __restrict__ part_q,
                                const float* __restrict__ part_k, float* __restrict__ dqkv,
                                float* __restrict__ dgk) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= batch * g.dk) return;
  const int64_t b = idx / g.dk, c = idx - b * g.dk;
  const int64_t rows = batch * g.seq;
  float run = 0.0f;
  for (int64_t t = g.seq - 1; t >= 0; --t) {
    const int64_t row = b * g.seq + t;
    float dq = 0.0f, dk = 0.0f;
    for (int tile = 0; tile < tiles; ++tile) {
      dq += part_q[(tile * rows + row) * g.dk + c];
      dk += part_k[(tile * rows + row) * g.dk + c];
    }
    dqkv[row * g.ld + c] = dq;
    dqkv[row * g.ld + g.dk + c] = dk;
    run += g.qkv[row * g.ld + c] * dq - g.qkv[row * g.ld + g.dk + c] * dk;
    dgk[row * g.dk + c] = run;
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
  const size_t smem = static_cast<size_t>(SmemFloats(g.dkh, false)) * sizeof(float);
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaForwardKernel, smem));
  const dim3 grid(static_cast<unsigned int>(CeilDiv(g.dvh, kTile)), static_cast<unsigned int>(heads),
                  static_cast<unsigned int>(batch));
  GlaForwardKernel<<<grid, kGlaThreads, smem, stream_>>>(g, out);
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
  KEEL_RETURN_IF_ERROR(gla_parts_.Reserve(2 * static_cast<size_t>(part_floats) * sizeof(float), stream_));
  float* part_q = gla_parts_.get<float>();
  float* part_k = part_q + part_floats;
  const size_t smem = static_cast<size_t>(SmemFloats(g.dkh, true)) * sizeof(float);
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaDqKernel, smem));
  KEEL_RETURN_IF_ERROR(AllowSmem(GlaDkDvKernel, smem));
  const dim3 grid(static_cast<unsigned int>(tiles), static_cast<unsigned int>(heads), static_cast<unsigned int>(batch));
  GlaDqKernel<<<grid, kGlaThreads, smem, stream_>>>(g, part_q);
  NN_LAUNCH_CHECK();
  GlaDkDvKernel<<<grid, kGlaThreads, smem, stream_>>>(g, part_k, dqkv);
  NN_LAUNCH_CHECK();
  GlaFinishKernel<<<static_cast<unsigned int>(CeilDiv(batch * dk, kThreads)), kThreads, 0, stream_>>>(
      g, batch, tiles, part_q, part_k, dqkv, dgk);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
