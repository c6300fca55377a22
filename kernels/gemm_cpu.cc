// GemmCpu of gemm_cpu.h, in the GotoBLAS shape: C is cut into kMc x kNc blocks
// (one task each); a task walks k in kKc slices, packs its A and B slices into
// kMr-row and kNr-column panels (zero padded), and a kMr x kNr register
// micro-kernel accumulates into the task's fp32 accumulator tile. Alpha and
// the optional += are applied once, after the last slice, so each element is
// the plain k-ordered fp32 sum of gemm_cpu.h.
//
// No intrinsics: the micro-kernel's fixed-size loops are what GCC's -O2
// vectoriser (cost model "very cheap") turns into SSE mulps/addps without any
// -march flag; the sizes below were measured on the build machine.
#include "kernels/gemm_cpu.h"

#include <algorithm>
#include <vector>

namespace keel {
namespace {

// 4 x 8: eight 4-float accumulators plus the B row and the A broadcast fit the
// sixteen SSE registers; wider tiles spill.
constexpr int kMr = 4;
constexpr int kNr = 8;
// One A micro-panel (kMr x kKc, 4 KB) and one B micro-panel (kKc x kNr, 8 KB)
// stay in L1; the task's packed A (kMc x kKc, 128 KB) sits in L2. Measured on
// the build machine (AMD EPYC, SSE only): about 38 GFLOP/s per core at
// 512 x 2048 x 512, against about 45 for the micro-kernel alone.
constexpr int64_t kKc = 256;
constexpr int64_t kMc = 128;
constexpr int64_t kNc = 512;

// acc (kMr x kNr, row stride ld) += a_panel . b_panel over kc steps;
// a_panel[p * kMr + i], b_panel[p * kNr + j].
__attribute__((noinline)) void MicroKernel(int64_t kc, const float* __restrict a_panel,
                                           const float* __restrict b_panel, float* __restrict acc,
                                           int64_t ld) {
  float c[kMr][kNr];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) c[i][j] = acc[i * ld + j];
  for (int64_t p = 0; p < kc; ++p) {
    const float* a = a_panel + p * kMr;
    const float* b = b_panel + p * kNr;
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const float ai = a[i];
#pragma GCC unroll 8
      for (int j = 0; j < kNr; ++j) c[i][j] += ai * b[j];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) acc[i * ld + j] = c[i][j];
}

struct Operands {
  bool trans_a, trans_b;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
};

// Packs `count` lines from line l0 (rows of op(A) or columns of op(B)) over depth
// p0 .. p0+kc into kPanel-line panels, panel[p * kPanel + l], lines past count
// zero. Element (line l, depth p) is m[p * ld + l] when `depth_major`, else
// m[l * ld + p]: op(A) is depth-major when A is transposed, op(B) when B is not.
template <int kPanel>
void PackPanels(const float* m, int64_t ld, bool depth_major, int64_t l0, int64_t count, int64_t p0,
                int64_t kc, float* out) {
  for (int64_t lr = 0; lr < count; lr += kPanel) {
    const int64_t lines = std::min<int64_t>(kPanel, count - lr);
    float* panel = out + lr * kc;
    if (!depth_major) {
      for (int64_t l = 0; l < kPanel; ++l) {
        if (l >= lines) {
          for (int64_t p = 0; p < kc; ++p) panel[p * kPanel + l] = 0.0f;
          continue;
        }
        const float* src = m + (l0 + lr + l) * ld + p0;
        for (int64_t p = 0; p < kc; ++p) panel[p * kPanel + l] = src[p];
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = m + (p0 + p) * ld + l0 + lr;
        for (int64_t l = 0; l < kPanel; ++l) panel[p * kPanel + l] = l < lines ? src[l] : 0.0f;
      }
    }
  }
}

// op(A)[i0 .. i0+mc) x [p0 .. p0+kc) into kMr-row panels.
void PackA(const Operands& op, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  PackPanels<kMr>(op.a, op.lda, op.trans_a, i0, mc, p0, kc, out);
}

// op(B)[p0 .. p0+kc) x [j0 .. j0+nc) into kNr-column panels.
void PackB(const Operands& op, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  PackPanels<kNr>(op.b, op.ldb, !op.trans_b, j0, nc, p0, kc, out);
}

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Per-thread scratch, kept between calls (pool threads live as long as the pool).
struct Scratch {
  std::vector<float> a_pack, b_pack, acc;
};
thread_local Scratch tls_scratch;

}  // namespace

void GemmCpu(ThreadPool* pool, const GemmShape& shape, bool trans_a, bool trans_b, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c,
             int64_t ldc) {
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  if (m <= 0 || n <= 0) return;
  const Operands op{trans_a, trans_b, a, lda, b, ldb};
  // Smaller blocks when the output is too small to keep every thread busy with
  // a few tasks each. The blocking never changes a bit of the result.
  int64_t block_m = kMc, block_n = kNc;
  auto tasks = [&] { return ((m + block_m - 1) / block_m) * ((n + block_n - 1) / block_n); };
  const int64_t wanted = 4 * static_cast<int64_t>(pool->threads());
  while (tasks() < wanted && block_n > 128) block_n /= 2;
  while (tasks() < wanted && block_m > 32) block_m /= 2;
  const int64_t m_blocks = (m + block_m - 1) / block_m;
  const int64_t n_blocks = (n + block_n - 1) / block_n;
  pool->ParallelFor(m_blocks * n_blocks, [&](int64_t task, int) {
    const int64_t i0 = (task / n_blocks) * block_m, j0 = (task % n_blocks) * block_n;
    const int64_t mc = std::min(block_m, m - i0), nc = std::min(block_n, n - j0);
    const int64_t mc_pad = RoundUp(mc, kMr), nc_pad = RoundUp(nc, kNr);
    Scratch& s = tls_scratch;
    if (s.a_pack.size() < static_cast<size_t>(kMc * kKc)) s.a_pack.resize(kMc * kKc);
    if (s.b_pack.size() < static_cast<size_t>(kNc * kKc)) s.b_pack.resize(kNc * kKc);
    if (s.acc.size() < static_cast<size_t>(kMc * kNc)) s.acc.resize(kMc * kNc);
    float* acc = s.acc.data();
    std::fill(acc, acc + mc_pad * nc_pad, 0.0f);
    for (int64_t p0 = 0; p0 < k; p0 += kKc) {
      const int64_t kc = std::min(kKc, k - p0);
      PackA(op, i0, mc, p0, kc, s.a_pack.data());
      PackB(op, j0, nc, p0, kc, s.b_pack.data());
      // B's micro-panel stays in L1 while the A panels stream past it.
      for (int64_t jr = 0; jr < nc_pad; jr += kNr) {
        for (int64_t ir = 0; ir < mc_pad; ir += kMr) {
          MicroKernel(kc, s.a_pack.data() + ir * kc, s.b_pack.data() + jr * kc,
                      acc + ir * nc_pad + jr, nc_pad);
        }
      }
    }
    for (int64_t i = 0; i < mc; ++i) {
      float* dst = c + (i0 + i) * ldc + j0;
      const float* src = acc + i * nc_pad;
      if (accumulate) {
        for (int64_t j = 0; j < nc; ++j) dst[j] = alpha * src[j] + dst[j];
      } else {
        for (int64_t j = 0; j < nc; ++j) dst[j] = alpha * src[j];
      }
    }
  });
}

void GemmNaive(const GemmShape& shape, bool trans_a, bool trans_b, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  for (int64_t i = 0; i < shape.m; ++i) {
    for (int64_t j = 0; j < shape.n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < shape.k; ++p) {
        float av = trans_a ? a[p * lda + i] : a[i * lda + p];
        float bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += av * bv;
      }
      float& dst = c[i * ldc + j];
      dst = accumulate ? alpha * sum + dst : alpha * sum;
    }
  }
}

}  // namespace keel
