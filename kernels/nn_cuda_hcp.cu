// The CUDA backend's Hot-Channel Patch (docs/hcp.md): HCP scores, the top-k
// choice, and the patch columns the linear layer's GEMMs add.
//
// A side of a patched GEMM is A (or B) as the GEMM contracts it, A(i, j) with j
// the contraction index, read from the fp32 source the layer was given and
// from the GEMM's quantized operand (PrepareOperand's values, times the decode
// scale it left for alpha). The wgrad's sides, when their roles take the RHT,
// are the rotated tensors: A(i, j) is output j % 16 of the RHT of the 16 tokens
// of j's chunk (qcore::RhtOutput, the quantizer's rotation, bit for bit).
//
// Scores are double sums in a fixed order (the same every run; they agree with
// the CPU's within the order of the sums), the top k is a radix sort of keys
// that hold the score and the index (so ties go to the lower index and a NaN
// ranks first, nn.h's order, with no reliance on the sort's stability), and
// the patch is a BF16 GEMM over the 2k patch columns [dA_H | Q(A)_H] and
// [B_H | dB_H] that adds into the unpatched result with beta = 1 and alpha = 1:
// the decode scales are in Q's values, not in the patch's alpha.
#include <cub/device/device_radix_sort.cuh>

#include <string>

#include "kernels/nn_cuda_internal.h"
#include "kernels/quant_core.h"
#include "kernels/quantize_cuda_internal.h"

namespace keel {
namespace nncuda {

namespace {


__device__ __forceinline__ float QValue(const HcpSide& s, int64_t i, int64_t j) {
  const int64_t at = i * s.qi + j * s.qj;
  const float v = s.q_bf16 ? qcuda::Bf16Float(static_cast<const uint16_t*>(s.q)[at]) : static_cast<const float*>(s.q)[at];
  return s.scale != nullptr ? v * *s.scale : v;
}

// A(i, j): the source, or with the RHT output j % 16 of j's chunk of 16.
__device__ __forceinline__ float AValue(const HcpSide& s, int64_t i, int64_t j) {
  if (!s.rht) return s.src[i * s.si + j * s.sj];
  float chunk[16];
  const int64_t j0 = j & ~int64_t{15};
#pragma unroll
  for (int r = 0; r < 16; ++r) chunk[r] = s.src[i * s.si + (j0 + r) * s.sj];
  return qcore::RhtOutput(chunk, static_cast<int>(j & 15));
}

// Column mode (j contiguous in memory, no RHT): block (x, y) sums |A - Q| of
// indices 32x .. 32x + 31 over i in chunk y (thread (c, r) every 8th i from r,
// then the 8 sums in order) into partial[y * k_count + j].
__global__ void __launch_bounds__(256) ScoreColumnsKernel(const HcpSide s, int64_t k_count, int64_t per_chunk,
                                                          double* __restrict__ partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * per_chunk;
  const int64_t i1 = min(s.n, i0 + per_chunk);
  double acc = 0.0;
  if (j < k_count) {
    for (int64_t i = i0 + threadIdx.y; i < i1; i += 8)
      acc += fabs(static_cast<double>(AValue(s, i, j)) - static_cast<double>(QValue(s, i, j)));
  }
  __shared__ double sums[8][33];
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < k_count) {
    double total = sums[0][threadIdx.x];
    for (int r = 1; r < 8; ++r) total += sums[r][threadIdx.x];
    partial[blockIdx.y * k_count + j] = total;
  }
}

// mean[j] (+)= the chunks' partials of j, in order, over n.
__global__ void FinishColumnsKernel(const double* __restrict__ partial, int64_t chunks, int64_t k_count, int64_t n,
                                    bool add, double* __restrict__ mean) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k_count) return;
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c * k_count + j];
  const double m = total / static_cast<double>(n);
  mean[j] = add ? mean[j] + m : m;
}

// Row mode (i contiguous, or the RHT): block b takes indices 16b .. 16b + 15
// (one RHT chunk), thread t every 256th i from t with 16 sums, reduced over
// the warp by shuffles and over the 8 warps in order; mean[j] (+)= sum / n.
__global__ void __launch_bounds__(256) ScoreRowsKernel(const HcpSide s, int64_t k_count, bool add,
                                                       double* __restrict__ mean) {
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * 16;
  double acc[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) acc[r] = 0.0;
  for (int64_t i = threadIdx.x; i < s.n; i += 256) {
    float a[16];
    if (s.rht) {
      float chunk[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) chunk[r] = s.src[i * s.si + (j0 + r) * s.sj];
#pragma unroll
      for (int r = 0; r < 16; ++r) a[r] = qcore::RhtOutput(chunk, r);
    } else {
#pragma unroll
      for (int r = 0; r < 16; ++r) a[r] = j0 + r < k_count ? s.src[i * s.si + (j0 + r) * s.sj] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      if (j0 + r < k_count) acc[r] += fabs(static_cast<double>(a[r]) - static_cast<double>(QValue(s, i, j0 + r)));
    }
  }
  __shared__ double warp_sums[8][16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    double v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    if (lane == 0) warp_sums[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < 16 && j0 + threadIdx.x < k_count) {
    double total = warp_sums[0][threadIdx.x];
    for (int w = 1; w < 8; ++w) total += warp_sums[w][threadIdx.x];
    const double m = total / static_cast<double>(s.n);
    const int64_t j = j0 + threadIdx.x;
    mean[j] = add ? mean[j] + m : m;
  }
}

__global__ void ScoresToFloatKernel(const double* __restrict__ mean, int64_t k_count, float* __restrict__ scores) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < k_count) scores[j] = static_cast<float>(mean[j]);
}

// Sort keys: the score's order in the high 32 bits (a NaN above every number),
// the index reversed in the low 32, so that a descending sort puts equal scores
// lower index first.
__global__ void TopKKeysKernel(const float* __restrict__ scores, int64_t count, unsigned long long* __restrict__ keys) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const uint32_t b = __float_as_uint(scores[i]);
  const uint32_t order = isnan(scores[i]) ? 0xFFFFFFFFu : ((b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u));
  keys[i] = (static_cast<unsigned long long>(order) << 32) | (0xFFFFFFFFull - static_cast<unsigned long long>(i));
}

// index[rank] = the first k sorted keys' indices, ascending (rank: how many of
// the k are lower).
__global__ void TopKIndicesKernel(const unsigned long long* __restrict__ sorted, int32_t k, int32_t* __restrict__ index) {
  const int32_t h = static_cast<int32_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= k) return;
  const int32_t mine = static_cast<int32_t>(0xFFFFFFFFull - (sorted[h] & 0xFFFFFFFFull));
  int32_t rank = 0;
  for (int32_t g = 0; g < k; ++g) rank += static_cast<int32_t>(0xFFFFFFFFull - (sorted[g] & 0xFFFFFFFFull)) < mine;
  index[rank] = mine;
}

// The patch columns of one side in bf16: the A side (first) [A - Q | Q], the B
// side [A | A - Q] over the hot j, column h of the first half of row i at
// dst[i * si + h * sh] and of the second at dst[i * si + (half + h) * sh];
// columns k .. half - 1 of each half are zero. folded: every value divided by
// the side's decode scale, for a GEMM whose alpha carries it (Q / scale is the
// quantized value itself, exact).
__global__ void PatchColumnsKernel(const HcpSide s, const int32_t* __restrict__ hot, int32_t k, int32_t half,
                                   bool first, bool folded, uint16_t* __restrict__ dst, int64_t si, int64_t sh) {
  const int64_t count = s.n * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const float scale = s.scale != nullptr ? *s.scale : 1.0f;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const int64_t i = e / half;
    const int32_t h = static_cast<int32_t>(e - i * half);
    float left = 0.0f, right = 0.0f;
    if (h < k) {
      const int64_t j = hot[h];
      const int64_t at = i * s.qi + j * s.qj;
      const float raw = s.q_bf16 ? qcuda::Bf16Float(static_cast<const uint16_t*>(s.q)[at])
                                 : static_cast<const float*>(s.q)[at];
      const float a = AValue(s, i, j), q = raw * scale;
      if (folded) {
        left = first ? (a - q) / scale : a / scale;
        right = first ? raw : (a - q) / scale;
      } else {
        left = first ? a - q : a;
        right = first ? q : a - q;
      }
    }
    dst[i * si + h * sh] = static_cast<uint16_t>(qcuda::ToBf16(left));
    dst[i * si + (half + h) * sh] = static_cast<uint16_t>(qcuda::ToBf16(right));
  }
}

}  // namespace

Status CudaBackend::HcpSideMeans(const HcpSide& s, int64_t k_count, bool add, double* mean) {
  if (s.sj == 1 && !s.rht) {
    const int64_t chunks = std::min<int64_t>(64, CeilDiv(s.n, 256));
    const int64_t per_chunk = CeilDiv(s.n, chunks);
    KEEL_RETURN_IF_ERROR(hcp_partials_.Reserve(static_cast<size_t>(chunks * k_count) * sizeof(double), stream_));
    double* partial = hcp_partials_.get<double>();
    ScoreColumnsKernel<<<dim3(static_cast<unsigned int>(CeilDiv(k_count, 32)), static_cast<unsigned int>(chunks)),
                         dim3(32, 8), 0, stream_>>>(s, k_count, per_chunk, partial);
    NN_LAUNCH_CHECK();
    FinishColumnsKernel<<<static_cast<unsigned int>(CeilDiv(k_count, 256)), 256, 0, stream_>>>(partial, chunks,
                                                                                              k_count, s.n, add, mean);
  } else {
    ScoreRowsKernel<<<static_cast<unsigned int>(CeilDiv(k_count, 16)), 256, 0, stream_>>>(s, k_count, add, mean);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::HcpScoresOf(const HcpSide& a, const HcpSide& b, int64_t k_count, float* scores) {
  KEEL_RETURN_IF_ERROR(hcp_means_.Reserve(static_cast<size_t>(k_count) * sizeof(double), stream_));
  double* mean = hcp_means_.get<double>();
  KEEL_RETURN_IF_ERROR(HcpSideMeans(a, k_count, false, mean));
  KEEL_RETURN_IF_ERROR(HcpSideMeans(b, k_count, true, mean));
  ScoresToFloatKernel<<<static_cast<unsigned int>(CeilDiv(k_count, 256)), 256, 0, stream_>>>(mean, k_count, scores);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::TopKOnDevice(const float* scores, int64_t count, int32_t k, int32_t* index) {
  if (k == 0) return Status::Ok();
  size_t temp_bytes = 0;
  KEEL_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(nullptr, temp_bytes, static_cast<unsigned long long*>(nullptr),
                                                      static_cast<unsigned long long*>(nullptr),
                                                      static_cast<int>(count), 0, 64, stream_));
  const size_t key_bytes = (static_cast<size_t>(count) * sizeof(unsigned long long) + 255) / 256 * 256;
  KEEL_RETURN_IF_ERROR(hcp_sort_.Reserve(2 * key_bytes + temp_bytes, stream_));
  char* base = hcp_sort_.get<char>();
  auto* keys = reinterpret_cast<unsigned long long*>(base);
  auto* sorted = reinterpret_cast<unsigned long long*>(base + key_bytes);
  TopKKeysKernel<<<static_cast<unsigned int>(CeilDiv(count, 256)), 256, 0, stream_>>>(scores, count, keys);
  NN_LAUNCH_CHECK();
  KEEL_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(base + 2 * key_bytes, temp_bytes, keys, sorted,
                                                      static_cast<int>(count), 0, 64, stream_));
  TopKIndicesKernel<<<static_cast<unsigned int>(CeilDiv(k, 256)), 256, 0, stream_>>>(sorted, k, index);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::HotSet(const HcpSide& a, const HcpSide& b, int64_t k_count, const HotChannels& hot,
                           const int32_t** index) {
  *index = hot.index;
  if (hot.choose_into == nullptr || hot.count == 0) return Status::Ok();
  KEEL_RETURN_IF_ERROR(hcp_scores_.Reserve(static_cast<size_t>(k_count) * sizeof(float), stream_));
  KEEL_RETURN_IF_ERROR(HcpScoresOf(a, b, k_count, hcp_scores_.get<float>()));
  KEEL_RETURN_IF_ERROR(TopKOnDevice(hcp_scores_.get<float>(), k_count, hot.count, hot.choose_into));
  *index = hot.choose_into;
  return Status::Ok();
}

Status CudaBackend::AddHcpPatch(const HcpSide& a, const HcpSide& b, const int32_t* index, int32_t k, float* c,
                                int64_t ldc) {
  if (k == 0) return Status::Ok();
  NN_PROFILE("hcp_patch");
  const int32_t half = static_cast<int32_t>(CeilDiv(k, 4) * 4);  // rows of 2 * half bf16: 16-byte aligned
  const int64_t width = 2 * static_cast<int64_t>(half);
  const size_t a_bytes = (static_cast<size_t>(a.n * width) * sizeof(uint16_t) + 255) / 256 * 256;
  KEEL_RETURN_IF_ERROR(hcp_cols_.Reserve(a_bytes + static_cast<size_t>(b.n * width) * sizeof(uint16_t), stream_));
  auto* pa = hcp_cols_.get<uint16_t>();
  auto* pb = reinterpret_cast<uint16_t*>(hcp_cols_.get<char>() + a_bytes);
  PatchColumnsKernel<<<GridFor(a.n * half), kThreads, 0, stream_>>>(a, index, k, half, true, false, pa, width, 1);
  NN_LAUNCH_CHECK();
  PatchColumnsKernel<<<GridFor(b.n * half), kThreads, 0, stream_>>>(b, index, k, half, false, false, pb, width, 1);
  NN_LAUNCH_CHECK();
  // c^T (b.n x a.n, column-major, ldc) += PB (stored width x b.n) ^T . PA (stored width x a.n).
  GemmArgs g;
  g.bf16 = true;
  g.trans_a = true;
  g.accumulate = true;
  g.alpha = blas_.one();
  g.Shape(b.n, a.n, width).A(pb, width).B(pa, width).C(c, ldc);
  return blas_.Gemm(g);
}

// One bf16 operand of a folded GEMM (FoldHcpPatch): rows x cols stored row-major
// ld apart; widen: the contraction runs along its columns (the patch is 2 x half
// columns more), else along its rows (2 x half rows more).
struct FoldOperand {
  const void* data;
  int64_t rows, cols, ld;
  bool widen;
};

Status CudaBackend::FoldOperandWithPatch(const FoldOperand& op, const HcpSide& side, bool first, const int32_t* index,
                                         int32_t k, int32_t half, Scratch* buffer, const void** out, int64_t* out_ld) {
  const int64_t width = 2 * static_cast<int64_t>(half);
  const int64_t out_cols = op.widen ? op.cols + width : op.cols;
  const int64_t out_rows = op.widen ? op.rows : op.rows + width;
  KEEL_RETURN_IF_ERROR(buffer->Reserve(static_cast<size_t>(out_rows * out_cols) * sizeof(uint16_t), stream_));
  auto* wide = buffer->get<uint16_t>();
  KEEL_CUDA_CHECK(cudaMemcpy2DAsync(wide, out_cols * sizeof(uint16_t), op.data, op.ld * sizeof(uint16_t),
                                    op.cols * sizeof(uint16_t), op.rows, cudaMemcpyDeviceToDevice, stream_));
  // Patch element (i, h): i runs over the operand's other axis (side.n of it).
  uint16_t* dst = op.widen ? wide + op.cols : wide + op.rows * op.cols;
  const int64_t si = op.widen ? out_cols : 1, sh = op.widen ? 1 : op.cols;
  PatchColumnsKernel<<<GridFor(side.n * half), kThreads, 0, stream_>>>(side, index, k, half, first, true, dst, si, sh);
  NN_LAUNCH_CHECK();
  *out = wide;
  *out_ld = out_cols;
  return Status::Ok();
}

Status CudaBackend::FoldHcpPatch(int gemm, const HcpSide& a, const HcpSide& b, const int32_t* index, int32_t k,
                                 GemmArgs* g) {
  if (k == 0) return Status::Ok();
  NN_PROFILE("hcp_fold");
  const int32_t half = static_cast<int32_t>(CeilDiv(k, 4) * 4);
  // The GEMM's A holds side b's operand and its B side a's (cuBLASLt's
  // column-major view of the row-major layer; nn_cuda_linear.cu).
  FoldOperand op_a{}, op_b{};
  if (gemm == 0) {         // forward: w (out x in) and x (rows x in), both along in
    op_a = FoldOperand{g->a, b.n, g->k, g->lda, true};
    op_b = FoldOperand{g->b, a.n, g->k, g->ldb, true};
  } else if (gemm == 1) {  // dgrad: w (out x in) down its rows, dy (rows x out) along out
    op_a = FoldOperand{g->a, g->k, g->m, g->lda, false};
    op_b = FoldOperand{g->b, a.n, g->k, g->ldb, true};
  } else {                 // wgrad: x (rows x in) and dy (rows x out), both down the tokens
    op_a = FoldOperand{g->a, g->k, g->m, g->lda, false};
    op_b = FoldOperand{g->b, g->k, g->n, g->ldb, false};
  }
  const void *wide_a = nullptr, *wide_b = nullptr;
  int64_t lda = 0, ldb = 0;
  KEEL_RETURN_IF_ERROR(FoldOperandWithPatch(op_a, b, false, index, k, half, &hcp_wide_a_, &wide_a, &lda));
  KEEL_RETURN_IF_ERROR(FoldOperandWithPatch(op_b, a, true, index, k, half, &hcp_wide_b_, &wide_b, &ldb));
  g->a = wide_a;
  g->lda = lda;
  g->b = wide_b;
  g->ldb = ldb;
  g->k += 2 * static_cast<int64_t>(half);
  return Status::Ok();
}

Status CudaBackend::HcpScores(HcpGemm gemm, const float* x, const float* w, int64_t rows, int64_t in, int64_t out,
                              const LinearQuant& q, float* scores) {
  NN_PROFILE("HcpScores");
  if (rows < 1 || in < 1 || out < 1)
    return Status::Error("HcpScores: shape: rows " + std::to_string(rows) + ", in " + std::to_string(in) + ", out " +
                         std::to_string(out) + " is not allowed; need every dimension >= 1");
  if (x == nullptr || w == nullptr || scores == nullptr) return Status::Error("HcpScores: x, w or scores: null");
  LinearQuant quiet = q;
  quiet.stats_slot = -1;  // scoring is not a GEMM: it counts nothing
  const bool fwd = gemm == HcpGemm::kFwd;
  const Role ra = fwd ? Role::kFwdX : Role::kDgradDy, rb = fwd ? Role::kFwdW : Role::kDgradW;
  const bool bf16 = q.role[static_cast<int>(ra)].quantized() && q.role[static_cast<int>(rb)].quantized();
  const int64_t a_cols = fwd ? in : out;
  Operand qa, qb;
  KEEL_RETURN_IF_ERROR(PrepareOperand(x, rows, a_cols, 1, ra, quiet, bf16, &op_a_, &qa).WithPrefix("HcpScores: "));
  KEEL_RETURN_IF_ERROR(PrepareOperand(w, out, in, fwd ? 1 : 0, rb, quiet, bf16, &op_b_, &qb).WithPrefix("HcpScores: "));
  // The sides LinearForward and LinearBackward's dgrad patch.
  const HcpSide a = HcpAlongRows(x, rows, a_cols, qa.data, qa.tensor_scale, bf16);
  const HcpSide b = fwd ? HcpAlongRows(w, out, in, qb.data, qb.tensor_scale, bf16)
                        : HcpDownColumns(w, in, qb.data, qb.tensor_scale, bf16, false);
  return HcpScoresOf(a, b, a_cols, scores);
}

Status CudaBackend::HcpTopK(const float* scores, int64_t count, int32_t k, int32_t* index) {
  NN_PROFILE("HcpTopK");
  if (count < 0 || k < 0 || k > count) {
    return Status::Error("HcpTopK: k: " + std::to_string(k) + " of count " + std::to_string(count) +
                         " is not allowed; need 0 <= k <= count");
  }
  if (k == 0) return Status::Ok();
  if (scores == nullptr || index == nullptr) return Status::Error("HcpTopK: scores or index: null");
  return TopKOnDevice(scores, count, k, index);
}

}  // namespace nncuda
}  // namespace keel
