// Causal multi-head attention of the CUDA backend (nn.h's contract).
//
// bf16 operands with a head size the fused kernels take (32 or 64): q, k, v (and
// dout) are copied out of qkv into [b, h, t, d] bf16, and nn_cuda_flash.cu does
// the rest without storing any seq x seq matrix.
//
// Otherwise (fp32, or another head size) cuBLASLt strided-batched GEMMs over
// (batch, head) and a softmax kernel, through a seq x seq scratch of this backend:
// Forward:  S = q k^T lands in the scratch, the softmax rewrites it in place
//           (scaled by 1 / sqrt(hd), zero above the diagonal), writes the stats
//           and, for bf16, a bf16 copy for the next product; O = P v, and O goes
//           back to heads side by side in `out`.
// Backward: S again and P from the stats (the forward's values), dP = dO v^T,
//           dS = P (dP - D) with D = dout . out per row, then dV = P^T dO,
//           dQ = dS k / sqrt(hd), dK = dS^T q / sqrt(hd) (the scale as the GEMMs'
//           alpha), written back into dqkv.
// The order of operations is the CPU reference's (nn_cpu_attention.cc), so the
// two differ only in the order of fp32 sums. With bf16 operands every GEMM
// operand (q, k, v, P, dO, dS) is bf16 (nearest even) and the GEMMs run
// BF16 x BF16 -> FP32; otherwise FP32 GEMMs without TF32.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/nn_cuda_flash.h"
#include "kernels/nn_cuda_internal.h"

namespace keel {
namespace nncuda {

namespace {

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

template <typename T> __device__ __forceinline__ T FromFloat(float v);
template <> __device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

struct Shape {
  int64_t batch, seq, heads, hd, dim;
};

// ============================================================================
// Kernels
// ============================================================================

// Where element i of a [b, h, t, d] tensor sits in a row-major (batch*seq) x ld
// matrix whose columns h * hd .. h * hd + hd - 1 hold head h: (b * seq + t) * ld +
// h * hd + d.
__device__ __forceinline__ int64_t RowMajorOffset(int64_t i, const Shape& s, int64_t ld) {
  const int64_t d = i % s.hd;
  const int64_t t = (i / s.hd) % s.seq;
  const int64_t bh = i / (s.hd * s.seq);
  const int64_t b = bh / s.heads, h = bh - b * s.heads;
  return (b * s.seq + t) * ld + h * s.hd + d;
}

// [b, t, col0 + h * hd + d] of a row-major (batch*seq) x ld matrix -> [b, h, t, d],
// for up to three column offsets at once (q, k, v). One thread per element.
template <typename OutT>
__global__ void PermuteKernel(const float* __restrict__ src, int64_t ld, int64_t off0, int64_t off1, int64_t off2,
                              OutT* __restrict__ out0, OutT* __restrict__ out1, OutT* __restrict__ out2, Shape s) {
  const int64_t n = s.batch * s.heads * s.seq * s.hd;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float* row = src + RowMajorOffset(i, s, ld);
    out0[i] = FromFloat<OutT>(row[off0]);
    if (out1 != nullptr) out1[i] = FromFloat<OutT>(row[off1]);
    if (out2 != nullptr) out2[i] = FromFloat<OutT>(row[off2]);
  }
}

// The bf16 case of PermuteKernel for a head size that is a multiple of 8 and
// 16-byte aligned rows (the fused path): one thread per 8 consecutive columns
// of one head of one token, for up to three column offsets (q, k, v), with
// 32-bit index arithmetic. The same bits as PermuteKernel<bf16> (each element
// rounded to nearest even on its own).
__global__ void __launch_bounds__(256) PackBf16Kernel(const float* __restrict__ src, int ld, int off0, int off1,
                                                      int off2, __nv_bfloat16* __restrict__ out0,
                                                      __nv_bfloat16* __restrict__ out1,
                                                      __nv_bfloat16* __restrict__ out2, int rows, int seq, int heads,
                                                      int hd) {
  const int chunks_per_row = heads * hd / 8;  // 8-column chunks of one token
  const int n = rows * chunks_per_row;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int row = i / chunks_per_row, chunk = i - row * chunks_per_row;
    const int col = chunk * 8, h = col / hd, d = col - h * hd;
    const int b = row / seq, t = row - b * seq;
    const size_t dst = ((static_cast<size_t>(b) * heads + h) * seq + t) * hd + d;
    const float* in = src + static_cast<size_t>(row) * ld + col;
    __nv_bfloat16* outs[3] = {out0, out1, out2};
    const int offs[3] = {off0, off1, off2};
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (outs[k] == nullptr) continue;
      const float4 lo = *reinterpret_cast<const float4*>(in + offs[k]);
      const float4 hi = *reinterpret_cast<const float4*>(in + offs[k] + 4);
      const __nv_bfloat162 p0 = __floats2bfloat162_rn(lo.x, lo.y), p1 = __floats2bfloat162_rn(lo.z, lo.w);
      const __nv_bfloat162 p2 = __floats2bfloat162_rn(hi.x, hi.y), p3 = __floats2bfloat162_rn(hi.z, hi.w);
      uint4 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&p0);
      packed.y = *reinterpret_cast<const uint32_t*>(&p1);
      packed.z = *reinterpret_cast<const uint32_t*>(&p2);
      packed.w = *reinterpret_cast<const uint32_t*>(&p3);
      *reinterpret_cast<uint4*>(outs[k] + dst) = packed;
    }
  }
}

// The inverse for up to three sources: dst[b, t, off_k + h * hd + d] = src_k[b, h, t, d].
__global__ void UnpermuteKernel(const float* __restrict__ src0, const float* __restrict__ src1,
                                const float* __restrict__ src2, float* __restrict__ dst, int64_t ld, int64_t off0,
                                int64_t off1, int64_t off2, Shape s) {
  const int64_t n = s.batch * s.heads * s.seq * s.hd;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float* row = dst + RowMajorOffset(i, s, ld);
    row[off0] = src0[i];
    if (src1 != nullptr) row[off1] = src1[i];
    if (src2 != nullptr) row[off2] = src2[i];
  }
}

// One warp per row (b, h, t) of the scores in p: s_j = p_j * scale for j <= t,
// softmax over those, written back in place with zeros for j > t, and to pb in bf16
// when pb is not null. Without `recompute` the row's (m, 1 / l) go to stats (three
// passes over the row: max, sum, write); with it they are read from stats and P is
// the forward's, bit for bit.
__global__ void __launch_bounds__(256) SoftmaxForwardKernel(float* p, __nv_bfloat16* __restrict__ pb,
                                                            float* __restrict__ stats, bool recompute, int64_t rows,
                                                            int64_t seq, float scale) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t t = r % seq;
  float* row = p + r * seq;
  float m, inv_sum;
  if (recompute) {
    m = stats[2 * r];
    inv_sum = stats[2 * r + 1];
  } else {
    m = -INFINITY;
    for (int64_t j = lane; j <= t; j += 32) m = fmaxf(m, row[j] * scale);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int64_t j = lane; j <= t; j += 32) sum += expf(row[j] * scale - m);
    sum = WarpSum(sum);
    inv_sum = 1.0f / sum;
    if (lane == 0) {
      stats[2 * r] = m;
      stats[2 * r + 1] = inv_sum;
    }
  }
  __nv_bfloat16* brow = pb != nullptr ? pb + r * seq : nullptr;
  for (int64_t j = lane; j < seq; j += 32) {
    const float v = j <= t ? expf(row[j] * scale - m) * inv_sum : 0.0f;
    row[j] = v;
    if (brow != nullptr) brow[j] = __float2bfloat16_rn(v);
  }
}

// One warp per row: dS_j = P_j (dP_j - D) (0 above the diagonal) with the row's
// D = dout . out given. bf16: dS and P to ds_b and p_b; fp32: dS in place of dP.
__global__ void __launch_bounds__(256) SoftmaxBackwardKernel(const float* __restrict__ p, float* dp,
                                                             const float* __restrict__ delta,
                                                             __nv_bfloat16* __restrict__ ds_b,
                                                             __nv_bfloat16* __restrict__ p_b, int64_t rows,
                                                             int64_t seq) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t t = r % seq;
  const float* prow = p + r * seq;
  float* dprow = dp + r * seq;
  const float dot = delta[r];
  for (int64_t j = lane; j < seq; j += 32) {
    const float pj = j <= t ? prow[j] : 0.0f;
    const float ds = j <= t ? pj * (dprow[j] - dot) : 0.0f;
    if (ds_b != nullptr) {
      ds_b[r * seq + j] = __float2bfloat16_rn(ds);
      p_b[r * seq + j] = __float2bfloat16_rn(pj);
    } else {
      dprow[j] = ds;
    }
  }
}

__global__ void SetFloatKernel(float* p, float value) { *p = value; }

// cudnn_attention's results into the fused forward's: out = O (bf16 -> fp32, the
// same (b * t) x dim layout) and stats[r] = (lse[r], 1), which the backward reads as
// (m, 1 / l).
__global__ void CudnnOutKernel(const __nv_bfloat16* __restrict__ o, const float* __restrict__ lse,
                               float* __restrict__ out, float* __restrict__ stats, int64_t n, int64_t rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = __bfloat162float(o[i]);
    if (i < rows) {
      stats[2 * i] = lse[i];
      stats[2 * i + 1] = 1.0f;
    }
  }
}

// The fused forward's stats (m, 1 / l) as cuDNN's lse = m + log l.
__global__ void LseKernel(const float* __restrict__ stats, float* __restrict__ lse, int64_t rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
    lse[r] = stats[2 * r] - logf(stats[2 * r + 1]);
  }
}

__global__ void WidenBf16Kernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = __bfloat162float(in[i]);
  }
}

Status CheckAttentionShape(const char* what, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  if (batch < 1 || seq < 1 || heads < 1 || dim < 1 || dim % heads != 0)
    return Status::Error(std::string(what) + ": shape: batch " + std::to_string(batch) + ", seq " +
                         std::to_string(seq) + ", heads " + std::to_string(heads) + ", dim " + std::to_string(dim) +
                         " is not allowed; need all >= 1 and dim a multiple of heads");
  if (batch * heads > (int64_t{1} << 30))
    return Status::Error(std::string(what) + ": batch * heads: " + std::to_string(batch * heads) + " is too large");
  return Status::Ok();
}

}  // namespace

// ============================================================================
// Launchers
// ============================================================================

// Columns off0, off1, off2 (those not null: out1, out2) of a row-major (batch * seq) x ld matrix, head by head,
// into [b, h, t, d] arrays of bf16 or fp32: the packed kernel where its alignment and index limits hold,
// else PermuteKernel (the same bits).
Status CudaBackend::PackHeads(const float* src, int64_t ld, int64_t off0, int64_t off1, int64_t off2, void* out0,
                              void* out1, void* out2, int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                              bool bf16) {
  const Shape s{batch, seq, heads, dim / heads, dim};
  const int64_t n = batch * heads * seq * s.hd;
  // The packed kernel needs 16-byte aligned 8-column chunks and 32-bit indices.
  auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool packed = bf16 && s.hd % 8 == 0 && ld % 4 == 0 && off0 % 4 == 0 && off1 % 4 == 0 && off2 % 4 == 0 &&
                      aligned(src) && aligned(out0) && aligned(out1) && aligned(out2) &&
                      batch * seq * ld < (int64_t{1} << 31);
  if (packed) {
    PackBf16Kernel<<<GridFor(n / 8), kThreads, 0, stream_>>>(
        src, static_cast<int>(ld), static_cast<int>(off0), static_cast<int>(off1), static_cast<int>(off2),
        static_cast<__nv_bfloat16*>(out0), static_cast<__nv_bfloat16*>(out1), static_cast<__nv_bfloat16*>(out2),
        static_cast<int>(batch * seq), static_cast<int>(seq), static_cast<int>(heads), static_cast<int>(s.hd));
  } else if (bf16) {
    PermuteKernel<__nv_bfloat16><<<GridFor(n), kThreads, 0, stream_>>>(
        src, ld, off0, off1, off2, static_cast<__nv_bfloat16*>(out0), static_cast<__nv_bfloat16*>(out1),
        static_cast<__nv_bfloat16*>(out2), s);
  } else {
    PermuteKernel<float><<<GridFor(n), kThreads, 0, stream_>>>(src, ld, off0, off1, off2, static_cast<float*>(out0),
                                                               static_cast<float*>(out1), static_cast<float*>(out2), s);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AttentionHeads(const float* qkv, const float* dout, int64_t batch, int64_t seq, int64_t heads,
                                   int64_t dim, bool bf16) {
  const int64_t n = batch * heads * seq * (dim / heads);
  const size_t elem = bf16 ? 2 : 4;
  KEEL_RETURN_IF_ERROR(attn_q_.Reserve(n * elem, stream_));
  KEEL_RETURN_IF_ERROR(attn_k_.Reserve(n * elem, stream_));
  KEEL_RETURN_IF_ERROR(attn_v_.Reserve(n * elem, stream_));
  KEEL_RETURN_IF_ERROR(PackHeads(qkv, 3 * dim, 0, dim, 2 * dim, attn_q_.get<void>(), attn_k_.get<void>(),
                                 attn_v_.get<void>(), batch, seq, heads, dim, bf16));
  if (dout == nullptr) return Status::Ok();
  KEEL_RETURN_IF_ERROR(attn_o_.Reserve(n * elem, stream_));
  return PackHeads(dout, dim, 0, 0, 0, attn_o_.get<void>(), nullptr, nullptr, batch, seq, heads, dim, bf16);
}

FlashArgs CudaBackend::FlashHeads(int64_t batch, int64_t seq, int64_t heads, int64_t dim, const void* kept) {
  FlashArgs f;
  if (kept != nullptr) {
    // KeptHeads' layout: q, k, v one after the other, each [b, h, t, d] bf16.
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(kept);
    const int64_t n = batch * seq * dim;
    f.q = q, f.k = q + n, f.v = q + 2 * n;
  } else {
    f.q = attn_q_.get<__nv_bfloat16>();
    f.k = attn_k_.get<__nv_bfloat16>();
    f.v = attn_v_.get<__nv_bfloat16>();
  }
  f.batch = batch, f.seq = seq, f.heads = heads, f.dim = dim;
  return f;
}

bool CudaBackend::KeepsAttentionHeads(int64_t head_dim, bool bf16_operands) const {
  return kept_heads_ && bf16_operands && FlashSupports(head_dim);
}

Status CudaBackend::CheckKept(const char* what, int64_t head_dim, bool bf16_operands) const {
  if (KeepsAttentionHeads(head_dim, bf16_operands)) return Status::Ok();
  return Status::Error(std::string(what) + ": head size " + std::to_string(head_dim) +
                       (bf16_operands ? "" : " with fp32 operands") +
                       " is not kept (KeepsAttentionHeads: bf16 operands, head size 32 or 64, kept_heads on)");
}

Status CudaBackend::CudnnForward(const FlashArgs& f) {
  const SdpaShape s{f.batch, f.heads, f.seq, f.dim / f.heads};
  size_t workspace = 0;
  std::string engine;
  KEEL_RETURN_IF_ERROR(cudnn_->PrepareForward(s, &workspace, &engine));
  const int64_t n = f.batch * f.seq * f.dim, rows = f.batch * f.heads * f.seq;
  KEEL_RETURN_IF_ERROR(attn_cudnn_o_.Reserve(static_cast<size_t>(n) * 2, stream_));
  KEEL_RETURN_IF_ERROR(attn_cudnn_lse_.Reserve(static_cast<size_t>(rows) * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(cudnn_workspace_.Reserve(std::max<size_t>(workspace, 1), stream_));
  KEEL_RETURN_IF_ERROR(cudnn_->Forward(s, f.q, f.k, f.v, attn_cudnn_o_.get<void>(), attn_cudnn_lse_.get<float>(),
                                       1.0f / sqrtf(static_cast<float>(s.hd)), cudnn_workspace_.get<void>(),
                                       cudnn_workspace_.bytes(), stream_));
  CudnnOutKernel<<<GridFor(n), kThreads, 0, stream_>>>(attn_cudnn_o_.get<__nv_bfloat16>(),
                                                       attn_cudnn_lse_.get<float>(), f.out, f.stats, n, rows);
  NN_LAUNCH_CHECK();
  const std::string said = "; attention forward ran on cuDNN " + cudnn_->Version() + " " + engine;
  if (description_.find(said) == std::string::npos) description_ += said;
  return Status::Ok();
}

void CudaBackend::CudnnFellBack(const char* name, const Status& why, bool* on) {
  cudaGetLastError();  // a failed launch must not be reported by the next op
  *on = false;
  description_ += std::string("; ") + name + " fell back to Keel's kernels (" + why.message() + ")";
  std::fprintf(stderr, "keel: KEEL_CUDA_ON=%s: %s; Keel's attention kernels run instead\n", name,
               why.message().c_str());
}

Status CudaBackend::FusedForward(const FlashArgs& f) {
  if (cudnn_attention_) {
    const Status s = CudnnForward(f);
    if (s.ok()) return s;
    CudnnFellBack("cudnn_attention", s, &cudnn_attention_);
  }
  return FlashForward(f, stream_);
}

Status CudaBackend::AttentionForwardKeep(const float* qkv, float* kept, float* out, float* stats, int64_t batch,
                                         int64_t seq, int64_t heads, int64_t dim, bool bf16_operands) {
  NN_PROFILE("AttentionForward");
  KEEL_RETURN_IF_ERROR(CheckAttentionShape("AttentionForwardKeep", batch, seq, heads, dim));
  if (qkv == nullptr || kept == nullptr || out == nullptr || stats == nullptr)
    return Status::Error("AttentionForwardKeep: qkv, kept, out or stats: null");
  KEEL_RETURN_IF_ERROR(CheckKept("AttentionForwardKeep", dim / heads, bf16_operands));
  // The heads go to `kept` (q, k, v one after the other, [b, h, t, d] bf16: half of qkv's bytes) instead of
  // attn_q_, attn_k_ and attn_v_, and the fused forward reads them from there.
  const int64_t n = batch * seq * dim;
  __nv_bfloat16* q = reinterpret_cast<__nv_bfloat16*>(kept);
  KEEL_RETURN_IF_ERROR(PackHeads(qkv, 3 * dim, 0, dim, 2 * dim, q, q + n, q + 2 * n, batch, seq, heads, dim, true));
  FlashArgs f = FlashHeads(batch, seq, heads, dim, kept);
  f.out = out;
  f.stats = stats;
  f.one_pass = flash_one_pass_;
  return FusedForward(f);
}

Status CudaBackend::AttentionBackwardKept(const float* kept, const float* out, const float* stats, const float* dout,
                                          float* dqkv, int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                                          bool bf16_operands) {
  NN_PROFILE("AttentionBackward");
  KEEL_RETURN_IF_ERROR(CheckAttentionShape("AttentionBackwardKept", batch, seq, heads, dim));
  if (kept == nullptr || out == nullptr || stats == nullptr || dout == nullptr || dqkv == nullptr)
    return Status::Error("AttentionBackwardKept: kept, out, stats, dout or dqkv: null");
  KEEL_RETURN_IF_ERROR(CheckKept("AttentionBackwardKept", dim / heads, bf16_operands));
  const int64_t bh = batch * heads, n = batch * seq * dim;
  KEEL_RETURN_IF_ERROR(attn_delta_.Reserve(static_cast<size_t>(bh * seq) * sizeof(float), stream_));
  // D and dout's bf16 heads from one read of dout.
  KEEL_RETURN_IF_ERROR(attn_o_.Reserve(n * 2, stream_));
  KEEL_RETURN_IF_ERROR(FlashRowDots(dout, out, attn_delta_.get<float>(), batch, seq, heads, dim, stream_,
                                    attn_o_.get<__nv_bfloat16>()));
  return FlashBackwardOf(kept, out, stats, dqkv, batch, seq, heads, dim);
}

Status CudaBackend::FlashBackwardOf(const void* kept, const float* out, const float* stats, float* dqkv,
                                    int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  FlashArgs f = FlashHeads(batch, seq, heads, dim, kept);
  f.dout = attn_o_.get<__nv_bfloat16>();
  f.delta = attn_delta_.get<float>();
  f.stats = const_cast<float*>(stats);  // read only by the backward kernels
  f.dqkv = dqkv;
  if (cudnn_attention_bwd_) {
    const Status s = CudnnBackward(f, out);
    if (s.ok()) return s;
    CudnnFellBack("cudnn_attention_bwd", s, &cudnn_attention_bwd_);
  }
  return FlashBackward(f, stream_);
}

Status CudaBackend::CudnnBackward(const FlashArgs& f, const float* out) {
  const SdpaShape s{f.batch, f.heads, f.seq, f.dim / f.heads};
  size_t workspace = 0;
  std::string engine;
  KEEL_RETURN_IF_ERROR(cudnn_->PrepareBackward(s, &workspace, &engine));
  const int64_t n = f.batch * f.seq * f.dim, rows = f.batch * f.heads * f.seq;
  // O's bf16 heads (as dout's), the stats as lse, row sums for cuDNN, dq | dk | dv in bf16 rows.
  KEEL_RETURN_IF_ERROR(attn_cudnn_o_.Reserve(static_cast<size_t>(n) * 2, stream_));
  KEEL_RETURN_IF_ERROR(attn_cudnn_lse_.Reserve(static_cast<size_t>(2 * rows) * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(attn_cudnn_dqkv_.Reserve(static_cast<size_t>(3 * n) * 2, stream_));
  KEEL_RETURN_IF_ERROR(cudnn_workspace_.Reserve(std::max<size_t>(workspace, 1), stream_));
  KEEL_RETURN_IF_ERROR(PackHeads(out, f.dim, 0, 0, 0, attn_cudnn_o_.get<void>(), nullptr, nullptr, f.batch, f.seq,
                                 f.heads, f.dim, true));
  float* lse = attn_cudnn_lse_.get<float>();
  LseKernel<<<GridFor(rows), kThreads, 0, stream_>>>(f.stats, lse, rows);
  NN_LAUNCH_CHECK();
  KEEL_RETURN_IF_ERROR(cudnn_->Backward(s, f.q, f.k, f.v, attn_cudnn_o_.get<void>(), f.dout, lse, lse + rows,
                                        attn_cudnn_dqkv_.get<void>(), 1.0f / sqrtf(static_cast<float>(s.hd)),
                                        cudnn_workspace_.get<void>(), cudnn_workspace_.bytes(), stream_));
  WidenBf16Kernel<<<GridFor(3 * n), kThreads, 0, stream_>>>(attn_cudnn_dqkv_.get<__nv_bfloat16>(), f.dqkv, 3 * n);
  NN_LAUNCH_CHECK();
  const std::string said = "; attention backward ran on cuDNN " + cudnn_->Version() + " " + engine;
  if (description_.find(said) == std::string::npos) description_ += said;
  return Status::Ok();
}

Status CudaBackend::AttentionProbabilities(float* stats, bool recompute, int64_t batch, int64_t seq, int64_t heads,
                                           int64_t dim, bool bf16) {
  const int64_t hd = dim / heads, bh = batch * heads, head_elems = seq * hd;
  KEEL_RETURN_IF_ERROR(attn_s_.Reserve(static_cast<size_t>(bh * seq * seq) * sizeof(float), stream_));
  if (bf16) KEEL_RETURN_IF_ERROR(attn_p_.Reserve(static_cast<size_t>(bh * seq * seq) * 2, stream_));
  // S (row-major t x t) = q k^T: column-major S^T... = k (stored d x t, transposed) . q^T (stored d x t).
  GemmArgs g;
  g.bf16 = bf16;
  g.trans_a = true;
  g.batch = bh;
  g.alpha = blas_.one();
  g.Shape(seq, seq, hd)
      .A(attn_k_.get<void>(), hd, head_elems)
      .B(attn_q_.get<void>(), hd, head_elems)
      .C(attn_s_.get<float>(), seq, seq * seq);
  KEEL_RETURN_IF_ERROR(blas_.Gemm(g));
  const int64_t rows = bh * seq;
  SoftmaxForwardKernel<<<static_cast<unsigned int>(CeilDiv(rows, 8)), 256, 0, stream_>>>(
      attn_s_.get<float>(), bf16 ? attn_p_.get<__nv_bfloat16>() : nullptr, stats, recompute, rows, seq,
      1.0f / sqrtf(static_cast<float>(hd)));
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AttentionForward(const float* qkv, float* out, float* stats, int64_t batch, int64_t seq,
                                     int64_t heads, int64_t dim, bool bf16) {
  NN_PROFILE("AttentionForward");
  KEEL_RETURN_IF_ERROR(CheckAttentionShape("AttentionForward", batch, seq, heads, dim));
  if (qkv == nullptr || out == nullptr || stats == nullptr)
    return Status::Error("AttentionForward: qkv, out or stats: null");
  const Shape s{batch, seq, heads, dim / heads, dim};
  KEEL_RETURN_IF_ERROR(AttentionHeads(qkv, nullptr, batch, seq, heads, dim, bf16));
  if (bf16 && FlashSupports(s.hd)) {
    FlashArgs f = FlashHeads(batch, seq, heads, dim);
    f.out = out;
    f.stats = stats;
    f.one_pass = flash_one_pass_;
    return FusedForward(f);
  }
  const int64_t bh = batch * heads;
  const int64_t head_elems = seq * s.hd;
  const int64_t n = bh * head_elems;
  KEEL_RETURN_IF_ERROR(attn_dq_.Reserve(n * sizeof(float), stream_));  // O per head
  KEEL_RETURN_IF_ERROR(AttentionProbabilities(stats, false, batch, seq, heads, dim, bf16));
  // O (row-major t x d) = P v: column-major O^T = v^T (stored d x t) . P^T (stored t x t).
  GemmArgs o;
  o.bf16 = bf16;
  o.batch = bh;
  o.alpha = blas_.one();
  o.Shape(s.hd, seq, seq)
      .A(attn_v_.get<void>(), s.hd, head_elems)
      .B(bf16 ? attn_p_.get<void>() : attn_s_.get<void>(), seq, seq * seq)
      .C(attn_dq_.get<float>(), s.hd, head_elems);
  KEEL_RETURN_IF_ERROR(blas_.Gemm(o));
  UnpermuteKernel<<<GridFor(n), kThreads, 0, stream_>>>(attn_dq_.get<float>(), nullptr, nullptr, out, dim, 0, 0, 0,
                                                        s);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AttentionBackward(const float* qkv, const float* out, const float* stats, const float* dout,
                                      float* dqkv, int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                                      bool bf16) {
  NN_PROFILE("AttentionBackward");
  KEEL_RETURN_IF_ERROR(CheckAttentionShape("AttentionBackward", batch, seq, heads, dim));
  if (qkv == nullptr || out == nullptr || stats == nullptr || dout == nullptr || dqkv == nullptr)
    return Status::Error("AttentionBackward: qkv, out, stats, dout or dqkv: null");
  const Shape s{batch, seq, heads, dim / heads, dim};
  const int64_t bh = batch * heads;
  KEEL_RETURN_IF_ERROR(attn_delta_.Reserve(static_cast<size_t>(bh * seq) * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(FlashRowDots(dout, out, attn_delta_.get<float>(), batch, seq, heads, dim, stream_));
  KEEL_RETURN_IF_ERROR(AttentionHeads(qkv, dout, batch, seq, heads, dim, bf16));
  if (bf16 && FlashSupports(s.hd)) return FlashBackwardOf(nullptr, out, stats, dqkv, batch, seq, heads, dim);
  const int64_t head_elems = seq * s.hd;
  const int64_t n = bh * head_elems;
  const int64_t square = bh * seq * seq;
  KEEL_RETURN_IF_ERROR(attn_dq_.Reserve(n * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(attn_dk_.Reserve(n * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(attn_dv_.Reserve(n * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(attn_dp_.Reserve(static_cast<size_t>(square) * sizeof(float), stream_));
  if (bf16) KEEL_RETURN_IF_ERROR(attn_ds_.Reserve(static_cast<size_t>(square) * 2, stream_));
  // P as the forward had it, from the stats.
  KEEL_RETURN_IF_ERROR(AttentionProbabilities(const_cast<float*>(stats), true, batch, seq, heads, dim, bf16));
  const float* probs = attn_s_.get<float>();
  const void* q = attn_q_.get<void>();
  const void* k = attn_k_.get<void>();
  const void* v = attn_v_.get<void>();
  const void* d_o = attn_o_.get<void>();
  float* dp = attn_dp_.get<float>();

  // dP (row-major t x t) = dO v^T: column-major = v (stored d x t, transposed) . dO^T (stored d x t).
  GemmArgs g;
  g.bf16 = bf16;
  g.trans_a = true;
  g.batch = bh;
  g.alpha = blas_.one();
  g.Shape(seq, seq, s.hd).A(v, s.hd, head_elems).B(d_o, s.hd, head_elems).C(dp, seq, seq * seq);
  KEEL_RETURN_IF_ERROR(blas_.Gemm(g));

  const int64_t rows = bh * seq;
  SoftmaxBackwardKernel<<<static_cast<unsigned int>(CeilDiv(rows, 8)), 256, 0, stream_>>>(
      probs, dp, attn_delta_.get<float>(), bf16 ? attn_ds_.get<__nv_bfloat16>() : nullptr,
      bf16 ? attn_p_.get<__nv_bfloat16>() : nullptr, rows, seq);
  NN_LAUNCH_CHECK();
  float* scale = small_ + kAttentionScaleSlot;
  SetFloatKernel<<<1, 1, 0, stream_>>>(scale, 1.0f / sqrtf(static_cast<float>(s.hd)));
  NN_LAUNCH_CHECK();
  const void* p_op = bf16 ? attn_p_.get<void>() : static_cast<const void*>(probs);
  const void* ds_op = bf16 ? attn_ds_.get<void>() : static_cast<const void*>(dp);

  // Three products with m = d, n = t, k = t into [b, h, t, d] fp32.
  auto head_gemm = [&](const void* a, const void* b, bool trans_b, const float* alpha, float* c) {
    GemmArgs h;
    h.bf16 = bf16;
    h.trans_b = trans_b;
    h.batch = bh;
    h.alpha = alpha;
    h.Shape(s.hd, seq, seq).A(a, s.hd, head_elems).B(b, seq, seq * seq).C(c, s.hd, head_elems);
    return blas_.Gemm(h);
  };
  // dV (t x d) = P^T dO: column-major dV^T = dO^T (stored d x t) . P (stored as P^T, transposed).
  KEEL_RETURN_IF_ERROR(head_gemm(d_o, p_op, true, blas_.one(), attn_dv_.get<float>()));
  // dQ (t x d) = dS k: column-major dQ^T = k^T (stored d x t) . dS^T (stored t x t).
  KEEL_RETURN_IF_ERROR(head_gemm(k, ds_op, false, scale, attn_dq_.get<float>()));
  // dK (t x d) = dS^T q: column-major dK^T = q^T (stored d x t) . dS (stored as dS^T, transposed).
  KEEL_RETURN_IF_ERROR(head_gemm(q, ds_op, true, scale, attn_dk_.get<float>()));
  UnpermuteKernel<<<GridFor(n), kThreads, 0, stream_>>>(attn_dq_.get<float>(), attn_dk_.get<float>(),
                                                        attn_dv_.get<float>(), dqkv, 3 * dim, 0, dim, 2 * dim, s);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
