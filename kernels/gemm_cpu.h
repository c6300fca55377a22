// GemmCpu: the CPU backend's fp32 matrix product, C = alpha * op(A) . op(B)
// (+ C), cache-blocked and spread over a ThreadPool.
//
// Every element of C is computed exactly as the naive loop
//   float sum = 0; for (p = 0; p < k; ++p) sum += op(A)[i][p] * op(B)[p][j];
//   C[i][j] = alpha * sum            (accumulate: C[i][j] = alpha * sum + C[i][j])
// would compute it (fp32, k in increasing order, no fused multiply-add under the
// repo's -ffp-contract=off), so the result is the same bits for any thread
// count or blocking, and a test can compare it with that loop exactly.
#ifndef KEEL_KERNELS_GEMM_CPU_H_
#define KEEL_KERNELS_GEMM_CPU_H_

#include <cstdint>

#include "kernels/thread_pool_cpu.h"

namespace keel {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // C is m x n; the sum runs over k
};

// A: m x k (lda >= k), or when trans_a its transpose is stored (k x m, lda >= m).
// B: k x n (ldb >= n), or when trans_b its transpose is stored (n x k, ldb >= k).
// C: m x n, ldc >= n. k == 0 gives C = 0 (or leaves C as is when accumulating).
// The caller checks the shapes; C must not overlap A or B.
void GemmCpu(ThreadPool* pool, const GemmShape& shape, bool trans_a, bool trans_b, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c,
             int64_t ldc);

// The loop above, single-threaded: the test and the benchmark's baseline.
void GemmNaive(const GemmShape& shape, bool trans_a, bool trans_b, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace keel

#endif  // KEEL_KERNELS_GEMM_CPU_H_
