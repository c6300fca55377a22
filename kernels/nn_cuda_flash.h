// The CUDA backend's fused (flash-style) causal attention for bf16 operands:
// tensor-core kernels that never store the seq x seq scores. Only the CUDA
// backend's .cu files include this (nn_cuda_attention.cu decides when it runs).
//
// The numbers are nn.h's attention contract, computed over tiles of 64 keys
// (or 64 queries for dK / dV), with exp(s - m) as exp2(dot * scale * log2 e -
// m * log2 e) (one FMA; the stats keep m in nn.h's units):
//   forward   pass 1 walks the key tiles for each row's max m and sum l of
//             exp(s - m) (online: l is rescaled when m grows); pass 2 walks them
//             again for P = exp(s - m) * (1 / l), rounds P to bf16 and adds P v.
//             The stats (m, 1 / l) are the only thing saved.
//   backward  D = rowsum(dout * out) first; then one kernel per query tile for
//             dQ = scale * sum dS k and one per key tile for dK = scale * dS^T q
//             and dV = P^T dO, each recomputing P from the stats and
//             dS = P (dP - D) itself, so no sum is split between blocks (the
//             result does not depend on scheduling).
// Products are BF16 x BF16 -> FP32 (mma.sync m16n8k16); everything else is fp32.
#ifndef KEEL_KERNELS_NN_CUDA_FLASH_H_
#define KEEL_KERNELS_NN_CUDA_FLASH_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/status.h"

namespace keel {
namespace nncuda {

struct FlashArgs {
  // q, k, v (and dout for the backward) in bf16, [batch * heads][seq][hd].
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* v = nullptr;
  const __nv_bfloat16* dout = nullptr;
  const float* delta = nullptr;  // backward: D per row, [batch * heads][seq]
  float* out = nullptr;          // forward: (batch * seq) x dim, heads side by side
  float* stats = nullptr;        // (m, 1 / l) per row, [batch * heads][seq][2]
  float* dqkv = nullptr;         // backward: (batch * seq) x 3 dim
  int64_t batch = 0, seq = 0, heads = 0, dim = 0;
  // Forward: one walk over the keys, P rounded before it is normalized (the experiment
  // flash_one_pass, KEEL_CUDA_ON; FlashForwardKernel's comment).
  bool one_pass = false;
};

// Whether the fused kernels handle head size `hd` (32 or 64).
bool FlashSupports(int64_t hd);

// Forward: out and stats from q, k, v.
Status FlashForward(const FlashArgs& a, cudaStream_t stream);

// D[row] = sum over the head's columns of dout * out (fp32), [batch * heads][seq]; with
// dout_heads, dout rounded to bf16 into it per head ([batch * heads][seq][hd]) from the same read.
Status FlashRowDots(const float* dout, const float* out, float* delta, int64_t batch, int64_t seq,
                    int64_t heads, int64_t dim, cudaStream_t stream, __nv_bfloat16* dout_heads = nullptr);

// Backward: dqkv (all three parts written) from q, k, v, dout, the stats and D.
Status FlashBackward(const FlashArgs& a, cudaStream_t stream);

}  // namespace nncuda
}  // namespace keel

#endif  // KEEL_KERNELS_NN_CUDA_FLASH_H_
