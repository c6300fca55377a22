// Fused causal attention for bf16 operands (see nn_cuda_flash.h for the
// numbers). A block is 4 warps. The forward gives each warp kFwdTiles 16-row
// MMA tiles of query rows (with two, every K and V fragment read from shared
// memory feeds two products). The backward gives each warp 16 rows of a 64-row
// tile (query rows in the dQ kernel, key rows in the dK/dV kernel). The other
// side streams through shared memory 64 rows at a time.
//
// mma.sync m16n8k16 fragments (g = lane / 4, c = lane % 4; a register holds two
// bf16, the lower column in the low half):
//   A 16 x 16 row-major: a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B 16 x 8, k x n:     b0 (k 2c..2c+1, n g), b1 (k 2c+8..2c+9, n g)
//   C 16 x 8 fp32:       c0, c1 (g, 2c..2c+1), c2, c3 (g+8, 2c..2c+1)
// Every tile sits in shared memory row-major ([row][hd], padded). B fragments
// come from ldmatrix: plain for a product over hd (a tile row is a B column),
// .trans for one over the tile's rows. Tiles arrive by cp.async, the next one
// while the current one is used (two buffers). Two neighbouring C tiles of
// 16 x 8, rounded to bf16, are the A fragment of the next product (how P and dS
// stay in registers).
//
// Exponentials are exp2 of an FMA: exp(s * scale - m) = exp2(dot * (scale *
// log2 e) - m * log2 e). Masks are applied only to tiles that cross the
// diagonal or the sequence end; a warp skips key tiles wholly after its rows.
#include "kernels/nn_cuda_flash.h"

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda_status.h"

namespace keel {
namespace nncuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;         // rows of a streamed tile; rows of a backward block
constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
// 16-row MMA tiles per warp in the forward. One: 125 registers, four blocks per SM
// (two tiles took 235 registers and held two blocks, 8 warps, per SM; ncu found
// that forward latency-bound at 33% issue utilization).
constexpr int kFwdTiles = 1;
constexpr int kFwdRows = 16 * kFwdTiles * kWarps;  // query rows of a forward block
constexpr int kPad = 8;           // bf16 of padding per shared row: conflict-free fragment loads
constexpr float kLog2e = 1.4426950408889634f;

struct Lane {
  int warp, lane, g, c;
  __device__ Lane()
      : warp(threadIdx.x >> 5), lane(threadIdx.x & 31), g((threadIdx.x & 31) >> 2), c(threadIdx.x & 3) {}
};

__device__ __forceinline__ void Mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t Ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Two floats as bf16 (nearest even), lo in the low half.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// The A fragments of 16 rows (row0 = tile row of lane g) x HD of a [seq][HD]
// matrix in global memory; rows at or past seq read as zero.
template <int HD>
__device__ void LoadRowFragments(const bf16* m, int row0, int seq, const Lane& l, uint32_t a[HD / 16][4]) {
  const bf16* r0 = m + static_cast<int64_t>(row0) * HD;
  const bf16* r1 = r0 + 8 * HD;
  const bool ok0 = row0 < seq, ok1 = row0 + 8 < seq;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const int col = kk * 16 + 2 * l.c;
    a[kk][0] = ok0 ? Ld32(r0 + col) : 0u;
    a[kk][1] = ok1 ? Ld32(r1 + col) : 0u;
    a[kk][2] = ok0 ? Ld32(r0 + col + 8) : 0u;
    a[kk][3] = ok1 ? Ld32(r1 + col + 8) : 0u;
  }
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts copying rows row0 .. row0 + 63 of a [seq][HD] bf16 matrix into `rows`
// (shared, [64][HD + kPad]); rows at or past seq become zeros.
template <int HD>
__device__ void LoadTileAsync(const bf16* m, int row0, int seq, bf16 (*rows)[HD + kPad]) {
  constexpr int kChunks = kTile * HD / 8;  // 16-byte chunks
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += kBlockThreads) {
    const int r = i / (HD / 8), d = (i % (HD / 8)) * 8;
    const bool valid = row0 + r < seq;
    CpAsync16(&rows[r][d], valid ? m + static_cast<int64_t>(row0 + r) * HD + d : m, valid);
  }
}

// The four 8 x 8 bf16 matrices at p (lanes 0-7, 8-15, 16-23, 24-31 give their
// rows' addresses) as B fragments: plain (a shared row is a B column) or
// transposed (a shared row is a B row).
__device__ __forceinline__ void LdMatrixX4(uint32_t r[4], const bf16* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t r[4], const bf16* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// One step of the two-buffer tile pipeline: starts copying the tile at row
// `next_row0` of m0 (and of m1 when not null) into buf0 (buf1) when `has_next`,
// then waits until the tile copied before it has landed and the whole block
// sees it.
template <int HD>
__device__ void NextTiles(bool has_next, int next_row0, int seq, const bf16* m0, bf16 (*buf0)[HD + kPad],
                          const bf16* m1, bf16 (*buf1)[HD + kPad]) {
  if (has_next) {
    LoadTileAsync<HD>(m0, next_row0, seq, buf0);
    if (m1 != nullptr) LoadTileAsync<HD>(m1, next_row0, seq, buf1);
    CpAsyncCommit();
    CpAsyncWait<1>();
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
}

// Stores this warp's 16 x HD result (C tiles acc, times mul) into rows row0 and
// row0 + 8 of `base` (row t at base + t * ld); rows at or past seq are skipped.
template <int HD>
__device__ void StoreRows(const float acc[HD / 8][4], float mul, float* base, int64_t ld, int row0, int seq,
                          const Lane& l) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 8 * r;
    if (t >= seq) continue;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      *reinterpret_cast<float2*>(base + t * ld + n * 8 + 2 * l.c) =
          make_float2(acc[n][2 * r] * mul, acc[n][2 * r + 1] * mul);
    }
  }
}

// acc[m][n] (16 x 8 each) = the warp's M x 16 rows (A fragments a[m], HD wide)
// times the 64 rows of `other` transposed: M tiles of 16 x 64 dots.
template <int HD, int M>
__device__ __forceinline__ void DotTile(const uint32_t (&a)[M][HD / 16][4], const bf16 (*other)[HD + kPad],
                                        const Lane& l, float (&acc)[M][kTile / 8][4]) {
  // Matrices: rows n0 .. n0 + 7 and n0 + 8 .. n0 + 15, at hd columns k0 and k0 + 8.
  const int row = (l.lane & 7) + ((l.lane >> 4) << 3), col = ((l.lane >> 3) & 1) * 8;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
#pragma unroll
  for (int n = 0; n < kTile / 8; n += 2) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t b[4];
      LdMatrixX4(b, &other[n * 8 + row][kk * 16 + col]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        Mma(acc[m][n], a[m][kk], b[0], b[1]);
        Mma(acc[m][n + 1], a[m][kk], b[2], b[3]);
      }
    }
  }
}

// out[m][n] (HD / 8 tiles of 16 x 8 per m) += p[m] (16 x 64 as C tiles, rounded
// to bf16 here) times the 64 x HD tile t (row-major [64][HD + kPad]).
template <int HD, int M>
__device__ __forceinline__ void AccumulateTile(const float (&p)[M][kTile / 8][4], const bf16 (*t)[HD + kPad],
                                               const Lane& l, float (&out)[M][HD / 8][4]) {
  uint32_t a[M][kTile / 16][4];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      a[m][kk][0] = PackBf16(p[m][2 * kk][0], p[m][2 * kk][1]);
      a[m][kk][1] = PackBf16(p[m][2 * kk][2], p[m][2 * kk][3]);
      a[m][kk][2] = PackBf16(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
      a[m][kk][3] = PackBf16(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
    }
  }
  // Matrices: rows k0 .. k0 + 7 and k0 + 8 .. k0 + 15, at columns n0 and n0 + 8.
  const int row = (l.lane & 7) + ((l.lane >> 3) & 1) * 8, col = (l.lane >> 4) * 8;
#pragma unroll
  for (int n = 0; n < HD / 8; n += 2) {
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t b[4];
      LdMatrixX4Trans(b, &t[kk * 16 + row][n * 8 + col]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        Mma(out[m][n], a[m][kk], b[0], b[1]);
        Mma(out[m][n + 1], a[m][kk], b[2], b[3]);
      }
    }
  }
}

// Of the four lanes holding one row (lanes 4g .. 4g + 3): max and sum, every
// lane getting the same bits.
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}

// Sets to -inf the dots of a 16 x 64 tile (rows row0 and row0 + 8 for this
// lane, columns col0 + ...) that causality or the sequence end excludes.
// transposed: the tile's rows are keys and its columns queries.
__device__ __forceinline__ void Mask(float (&s)[kTile / 8][4], int row0, int col0, int seq, bool transposed,
                                     const Lane& l) {
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + (e >> 1) * 8;
      const int col = col0 + n * 8 + 2 * l.c + (e & 1);
      const int query = transposed ? col : row, key = transposed ? row : col;
      if (key > query || key >= seq || query >= seq) s[n][e] = -INFINITY;
    }
  }
}

// One (batch, head) of a [batch * heads][seq][hd] tensor.
template <typename T>
__device__ __forceinline__ T* Head(T* base, int64_t bh, int seq, int hd) {
  return base + bh * seq * hd;
}

// Two tiles of shared memory, each double-buffered: k and v (forward, dQ) or q
// and dout (dK / dV).
template <int HD>
struct TilePair {
  __align__(16) bf16 a[2][kTile][HD + kPad];
  __align__(16) bf16 b[2][kTile][HD + kPad];
};

// The block's tile (rows of the side it owns), its (batch, head) and that head's
// [seq][HD] slices of q, k, v and dout.
template <int HD>
struct HeadBlock {
  int tile, seq;
  int64_t bh, b, h;
  const bf16 *q, *k, *v, *dout;
  // longest_first: the tiles whose loops are longest start first (query tiles run
  // over the keys before them, so the last one is the longest).
  __device__ HeadBlock(const FlashArgs& a, bool longest_first)
      : tile(longest_first ? gridDim.x - 1 - blockIdx.x : blockIdx.x),
        seq(static_cast<int>(a.seq)),
        bh(blockIdx.y),
        b(bh / a.heads),
        h(bh % a.heads),
        q(Head(a.q, bh, seq, HD)),
        k(Head(a.k, bh, seq, HD)),
        v(Head(a.v, bh, seq, HD)),
        dout(a.dout != nullptr ? Head(a.dout, bh, seq, HD) : nullptr) {}
};

// ============================================================================
// Forward: one block per (128 query rows, batch * head), the longest rows first.
// ============================================================================

// kOnePass (the experiment flash_one_pass): one walk over the keys. Each tile's
// P is exp(s - the running max), rounded to bf16 unnormalized, its product with
// v added to O after O is rescaled to the new max, and O divided by l at the
// end: the stats are the two-pass kernel's bit for bit (the same pass 1), O is
// not (P is rounded before it is normalized, which nn.h's contract does not
// allow today: an experiment to measure what that contract costs).
template <int HD, bool kOnePass>
__global__ void __launch_bounds__(kBlockThreads) FlashForwardKernel(const FlashArgs a, float scale) {
  constexpr int M = kFwdTiles;
  __shared__ TilePair<HD> tiles;
  auto& ks = tiles.a;
  auto& vs = tiles.b;
  const Lane l;
  const HeadBlock<HD> at(a, true);
  const int seq = at.seq;
  const bf16* k = at.k;
  const bf16* v = at.v;
  // This warp's rows: first .. first + 31; lane rows first + 16 m + g (+ 8).
  const int first = at.tile * kFwdRows + l.warp * 16 * M;
  const int last_tile = min((seq - 1) / kTile, (at.tile * kFwdRows + kFwdRows - 1) / kTile);
  const float sl2 = scale * kLog2e;  // dot -> exponent in base 2
  uint32_t qa[M][HD / 16][4];
#pragma unroll
  for (int m = 0; m < M; ++m) LoadRowFragments<HD>(at.q, first + 16 * m + l.g, seq, l, qa[m]);
  float s[M][kTile / 8][4];

  // Pass 1: each row's largest dot mx and sum of exp(s - m) (online: rescaled
  // when the max grows), key tiles 0 .. last_tile. Index [m][r]: lane row
  // first + 16 m + 8 r + g.
  float mx[M][2], sum[M][2];
#pragma unroll
  for (int m = 0; m < M; ++m) mx[m][0] = mx[m][1] = -INFINITY, sum[m][0] = sum[m][1] = 0.0f;
  float o[M][HD / 8][4] = {};
  LoadTileAsync<HD>(k, 0, seq, ks[0]);
  if (kOnePass) LoadTileAsync<HD>(v, 0, seq, vs[0]);
  CpAsyncCommit();
  for (int kb = 0; kb <= last_tile; ++kb) {
    NextTiles<HD>(kb < last_tile, (kb + 1) * kTile, seq, k, ks[(kb + 1) & 1], kOnePass ? v : nullptr,
                  vs[(kb + 1) & 1]);
    if (kb * kTile <= first + 16 * M - 1) {  // else the tile is wholly after this warp's rows
      DotTile<HD, M>(qa, ks[kb & 1], l, s);
      const bool edge = kb * kTile + kTile - 1 > first || kb * kTile + kTile > seq;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (edge) Mask(s[m], first + 16 * m + l.g, kb * kTile, seq, false, l);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tile_max = -INFINITY;
#pragma unroll
          for (int n = 0; n < kTile / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[m][n][2 * r], s[m][n][2 * r + 1]));
          const float m_new = fmaxf(mx[m][r], QuadMax(tile_max));
          // A row that has seen no key yet keeps mx = -inf and sum = 0; every
          // lane still takes part in the shuffles.
          const bool seen = m_new != -INFINITY;
          const float neg = -m_new * sl2;
          float part = 0.0f;
#pragma unroll
          for (int n = 0; n < kTile / 8; ++n) {
            const float p0 = seen ? exp2f(fmaf(s[m][n][2 * r], sl2, neg)) : 0.0f;
            const float p1 = seen ? exp2f(fmaf(s[m][n][2 * r + 1], sl2, neg)) : 0.0f;
            part += seen ? p0 + p1 : 0.0f;
            if (kOnePass) s[m][n][2 * r] = p0, s[m][n][2 * r + 1] = p1;  // P against the running max
          }
          part = QuadSum(part);
          if (seen) {
            const float rescale = exp2f(fmaf(mx[m][r], sl2, neg));
            sum[m][r] = sum[m][r] * rescale + part;
            mx[m][r] = m_new;
            if (kOnePass) {
#pragma unroll
              for (int d = 0; d < HD / 8; ++d) o[m][d][2 * r] *= rescale, o[m][d][2 * r + 1] *= rescale;
            }
          }
        }
      }
      if (kOnePass) AccumulateTile<HD, M>(s, vs[kb & 1], l, o);
    }
    __syncthreads();  // the buffer is refilled next
  }
  // A row past the sequence end saw no key: P = 0 there (it is not stored).
  float inv[M][2], neg[M][2];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      inv[m][r] = sum[m][r] > 0.0f ? 1.0f / sum[m][r] : 0.0f;
      if (mx[m][r] == -INFINITY) mx[m][r] = 0.0f;
      neg[m][r] = -mx[m][r] * sl2;
    }
  }

  // Pass 2: O = bf16(P) v with P = exp(s - m) / l (one pass: O / l).
  if (kOnePass) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int d = 0; d < HD / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[m][d][e] *= inv[m][e >> 1];
  } else {
    LoadTileAsync<HD>(k, 0, seq, ks[0]);
    LoadTileAsync<HD>(v, 0, seq, vs[0]);
    CpAsyncCommit();
    for (int kb = 0; kb <= last_tile; ++kb) {
      NextTiles<HD>(kb < last_tile, (kb + 1) * kTile, seq, k, ks[(kb + 1) & 1], v, vs[(kb + 1) & 1]);
      if (kb * kTile <= first + 16 * M - 1) {
        DotTile<HD, M>(qa, ks[kb & 1], l, s);
        const bool edge = kb * kTile + kTile - 1 > first || kb * kTile + kTile > seq;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          if (edge) Mask(s[m], first + 16 * m + l.g, kb * kTile, seq, false, l);
#pragma unroll
          for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[m][n][e] = exp2f(fmaf(s[m][n][e], sl2, neg[m][e >> 1])) * inv[m][e >> 1];
        }
        AccumulateTile<HD, M>(s, vs[kb & 1], l, o);
      }
      __syncthreads();
    }
  }
  // Stats hold the largest scaled dot, as the CPU computes it (scaling by a
  // positive number keeps the order).
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int row0 = first + 16 * m + l.g;
    StoreRows<HD>(o[m], 1.0f, a.out + at.b * seq * a.dim + at.h * HD, a.dim, row0, seq, l);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = row0 + 8 * r;
      if (t < seq && l.c == 0) {
        *reinterpret_cast<float2*>(a.stats + 2 * (at.bh * seq + t)) = make_float2(mx[m][r] * scale, inv[m][r]);
      }
    }
  }
}

// ============================================================================
// Backward
// ============================================================================

// D[bh][t] = sum_d dout * out over the head's columns; one warp per row. With
// dout_heads, also dout rounded to bf16 (nearest even) per head, [b, h, t, d]: the
// packed dout the backward kernels read (the bits of PackBf16Kernel's), from the
// same read.
__global__ void __launch_bounds__(256) RowDotsKernel(const float* __restrict__ dout, const float* __restrict__ out,
                                                     float* __restrict__ delta,
                                                     __nv_bfloat16* __restrict__ dout_heads, int64_t rows,
                                                     int64_t seq, int64_t heads, int64_t dim) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t hd = dim / heads;
  const int64_t t = r % seq, bh = r / seq, b = bh / heads, h = bh % heads;
  const int64_t at = (b * seq + t) * dim + h * hd;
  float acc = 0.0f;
  for (int64_t d = lane; d < hd; d += 32) {
    const float g = dout[at + d];
    acc += g * out[at + d];
    if (dout_heads != nullptr) dout_heads[r * hd + d] = __float2bfloat16_rn(g);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (lane == 0) delta[r] = acc;
}

// P (from the stats) and dS = P (dP - D) of a 16 x 64 tile whose dots s and dp
// are given; per query: -m log2 e, 1 / l and D. transposed: rows are keys,
// columns queries (the dK / dV kernel), with per-query values from shared memory.
__device__ __forceinline__ void SoftmaxGrad(float (&s)[kTile / 8][4], float (&dp)[kTile / 8][4], float sl2,
                                            const float* qneg, const float* qinv, const float* qd, bool transposed,
                                            const Lane& l) {
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = transposed ? n * 8 + 2 * l.c + (e & 1) : (e >> 1);
      const float p = exp2f(fmaf(s[n][e], sl2, qneg[i])) * qinv[i];
      s[n][e] = p;
      dp[n][e] = p * (dp[n][e] - qd[i]);
    }
  }
}

// dQ: one block per (query tile, batch * head), the longest rows first.
template <int HD>
__global__ void __launch_bounds__(kBlockThreads) FlashDqKernel(const FlashArgs a, float scale) {
  __shared__ TilePair<HD> tiles;
  const HeadBlock<HD> at(a, true);
  LoadTileAsync<HD>(at.k, 0, at.seq, tiles.a[0]);
  LoadTileAsync<HD>(at.v, 0, at.seq, tiles.b[0]);
  CpAsyncCommit();
  auto& ks = tiles.a;
  auto& vs = tiles.b;
  const Lane l;
  const int qb = at.tile, seq = at.seq;
  const int64_t bh = at.bh;
  const bf16* k = at.k;
  const bf16* v = at.v;
  const float sl2 = scale * kLog2e;
  const int row0 = qb * kTile + l.warp * 16 + l.g;
  uint32_t qa[1][HD / 16][4], da[1][HD / 16][4];
  LoadRowFragments<HD>(at.q, row0, seq, l, qa[0]);
  LoadRowFragments<HD>(at.dout, row0, seq, l, da[0]);
  float qneg[2], qinv[2], qd[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 8 * r;
    const bool ok = t < seq;
    qneg[r] = ok ? -a.stats[2 * (bh * seq + t)] * kLog2e : 0.0f;
    qinv[r] = ok ? a.stats[2 * (bh * seq + t) + 1] : 0.0f;
    qd[r] = ok ? a.delta[bh * seq + t] : 0.0f;
  }
  float dq[1][HD / 8][4] = {};
  float s[1][kTile / 8][4], dp[1][kTile / 8][4];
  for (int kb = 0; kb <= qb; ++kb) {
    NextTiles<HD>(kb < qb, (kb + 1) * kTile, seq, k, ks[(kb + 1) & 1], v, vs[(kb + 1) & 1]);
    DotTile<HD, 1>(qa, ks[kb & 1], l, s);
    if (kb == qb || kb * kTile + kTile > seq) Mask(s[0], row0, kb * kTile, seq, false, l);
    DotTile<HD, 1>(da, vs[kb & 1], l, dp);
    SoftmaxGrad(s[0], dp[0], sl2, qneg, qinv, qd, false, l);
    AccumulateTile<HD, 1>(dp, ks[kb & 1], l, dq);
    __syncthreads();
  }
  StoreRows<HD>(dq[0], scale, a.dqkv + at.b * seq * 3 * a.dim + at.h * HD, 3 * a.dim, row0, seq, l);
}

// dK and dV: one block per (key tile, batch * head), the longest columns first.
template <int HD>
__global__ void __launch_bounds__(kBlockThreads) FlashDkvKernel(const FlashArgs a, float scale) {
  __shared__ TilePair<HD> tiles;
  __shared__ float qneg[2][kTile], qinv[2][kTile], qd[2][kTile];
  auto& qs = tiles.a;
  auto& ds = tiles.b;
  const Lane l;
  const HeadBlock<HD> at(a, false);
  const int kb = at.tile, seq = at.seq;
  const int64_t bh = at.bh;
  const bf16* q = at.q;
  const bf16* dout = at.dout;
  const float sl2 = scale * kLog2e;
  const int query_tiles = (seq + kTile - 1) / kTile;
  // The per-query values of query tile `qt` into buffer `buf` (plain loads; they
  // are small).
  auto load_rows = [&](int qt, int buf) {
    for (int i = threadIdx.x; i < kTile; i += kBlockThreads) {
      const int t = qt * kTile + i;
      const bool ok = t < seq;
      qneg[buf][i] = ok ? -a.stats[2 * (bh * seq + t)] * kLog2e : 0.0f;
      qinv[buf][i] = ok ? a.stats[2 * (bh * seq + t) + 1] : 0.0f;
      qd[buf][i] = ok ? a.delta[bh * seq + t] : 0.0f;
    }
  };
  LoadTileAsync<HD>(q, kb * kTile, seq, qs[0]);
  LoadTileAsync<HD>(dout, kb * kTile, seq, ds[0]);
  CpAsyncCommit();
  load_rows(kb, 0);
  const int key0 = kb * kTile + l.warp * 16 + l.g;
  uint32_t ka[1][HD / 16][4], va[1][HD / 16][4];
  LoadRowFragments<HD>(at.k, key0, seq, l, ka[0]);
  LoadRowFragments<HD>(at.v, key0, seq, l, va[0]);
  float dk[1][HD / 8][4] = {}, dv[1][HD / 8][4] = {};
  float s[1][kTile / 8][4], dp[1][kTile / 8][4];
  for (int qb = kb; qb < query_tiles; ++qb) {
    const int buf = (qb - kb) & 1;
    if (qb + 1 < query_tiles) load_rows(qb + 1, buf ^ 1);
    NextTiles<HD>(qb + 1 < query_tiles, (qb + 1) * kTile, seq, q, qs[buf ^ 1], dout, ds[buf ^ 1]);
    DotTile<HD, 1>(ka, qs[buf], l, s);
    if (qb == kb || qb * kTile + kTile > seq) Mask(s[0], key0, qb * kTile, seq, true, l);
    DotTile<HD, 1>(va, ds[buf], l, dp);
    SoftmaxGrad(s[0], dp[0], sl2, qneg[buf], qinv[buf], qd[buf], true, l);
    AccumulateTile<HD, 1>(s, ds[buf], l, dv);
    AccumulateTile<HD, 1>(dp, qs[buf], l, dk);
    __syncthreads();
  }
  float* rows = a.dqkv + at.b * seq * 3 * a.dim + at.h * HD;
  StoreRows<HD>(dk[0], scale, rows + a.dim, 3 * a.dim, key0, seq, l);
  StoreRows<HD>(dv[0], 1.0f, rows + 2 * a.dim, 3 * a.dim, key0, seq, l);
}

dim3 Grid(const FlashArgs& a, int rows_per_block) {
  return dim3(static_cast<unsigned>((a.seq + rows_per_block - 1) / rows_per_block),
              static_cast<unsigned>(a.batch * a.heads));
}

float Scale(const FlashArgs& a) { return 1.0f / sqrtf(static_cast<float>(a.dim / a.heads)); }

Status CheckSize(const FlashArgs& a, const char* what) {
  // Row indices inside the kernels are 32-bit.
  if (a.seq > (int64_t{1} << 30)) return Status::Error(std::string(what) + ": seq " + std::to_string(a.seq) + " is too long");
  return Status::Ok();
}

}  // namespace

bool FlashSupports(int64_t hd) { return hd == 32 || hd == 64; }

Status FlashForward(const FlashArgs& a, cudaStream_t stream) {
  KEEL_RETURN_IF_ERROR(CheckSize(a, "FlashForward"));
  const int64_t hd = a.dim / a.heads;
  if (hd == 64) {
    if (a.one_pass) {
      FlashForwardKernel<64, true><<<Grid(a, kFwdRows), kBlockThreads, 0, stream>>>(a, Scale(a));
    } else {
      FlashForwardKernel<64, false><<<Grid(a, kFwdRows), kBlockThreads, 0, stream>>>(a, Scale(a));
    }
  } else if (hd == 32) {
    if (a.one_pass) {
      FlashForwardKernel<32, true><<<Grid(a, kFwdRows), kBlockThreads, 0, stream>>>(a, Scale(a));
    } else {
      FlashForwardKernel<32, false><<<Grid(a, kFwdRows), kBlockThreads, 0, stream>>>(a, Scale(a));
    }
  } else {
    return Status::Error("FlashForward: head size " + std::to_string(hd) + " is not supported (32 or 64)");
  }
  KEEL_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status FlashRowDots(const float* dout, const float* out, float* delta, int64_t batch, int64_t seq, int64_t heads,
                    int64_t dim, cudaStream_t stream, __nv_bfloat16* dout_heads) {
  const int64_t rows = batch * heads * seq;
  RowDotsKernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(dout, out, delta, dout_heads, rows, seq,
                                                                           heads, dim);
  KEEL_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status FlashBackward(const FlashArgs& a, cudaStream_t stream) {
  KEEL_RETURN_IF_ERROR(CheckSize(a, "FlashBackward"));
  const int64_t hd = a.dim / a.heads;
  if (hd == 64) {
    FlashDqKernel<64><<<Grid(a, kTile), kBlockThreads, 0, stream>>>(a, Scale(a));
    KEEL_CUDA_CHECK(cudaGetLastError());
    FlashDkvKernel<64><<<Grid(a, kTile), kBlockThreads, 0, stream>>>(a, Scale(a));
  } else if (hd == 32) {
    FlashDqKernel<32><<<Grid(a, kTile), kBlockThreads, 0, stream>>>(a, Scale(a));
    KEEL_CUDA_CHECK(cudaGetLastError());
    FlashDkvKernel<32><<<Grid(a, kTile), kBlockThreads, 0, stream>>>(a, Scale(a));
  } else {
    return Status::Error("FlashBackward: head size " + std::to_string(hd) + " is not supported (32 or 64)");
  }
  KEEL_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
