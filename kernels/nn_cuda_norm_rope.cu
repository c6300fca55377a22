// The CUDA backend's llama layers (nn.h): RMSNorm and rotary position embedding
// (RoPE), forward and backward. The CPU reference is nn_cpu_layers.cc.
//
// RMSNorm follows LayerNorm's kernels (nn_cuda_layers.cu): a warp per row, the
// row's sums in double through the fixed xor-shuffle tree, and dgain through
// per-chunk column partials added in chunk order (SplitColumnSums), so every
// result is deterministic. RoPE is one product pair per element from the host's
// cos/sin tables (RopeTables), the same fp32 operations as the CPU's: the same
// bits (nvcc builds with -fmad=false).
#include <string>

#include "kernels/nn_cuda_internal.h"

namespace keel {
namespace nncuda {

namespace {

// ============================================================================
// Kernels: RMSNorm
// ============================================================================

// One warp per row: the mean square in double, rstd = 1 / sqrt(mean square +
// eps), y = x * rstd * gain. kVec: cols % 4 == 0 and 16-byte aligned rows.
template <bool kVec>
__global__ void __launch_bounds__(256) RmsNormForwardKernel(const float* __restrict__ x, const float* __restrict__ gain,
                                                            float* __restrict__ y, float* __restrict__ rstd,
                                                            int64_t rows, int64_t cols, float eps) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  double sq = 0.0;
  if constexpr (kVec) {
    for (int64_t c = lane; c < cols / 4; c += 32) {
      const float4 v = reinterpret_cast<const float4*>(xr)[c];
      sq += static_cast<double>(v.x) * v.x;
      sq += static_cast<double>(v.y) * v.y;
      sq += static_cast<double>(v.z) * v.z;
      sq += static_cast<double>(v.w) * v.w;
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) sq += static_cast<double>(xr[c]) * xr[c];
  }
  const float mean_square = static_cast<float>(WarpSum(sq) / static_cast<double>(cols));
  const float s = 1.0f / sqrtf(mean_square + eps);
  if constexpr (kVec) {
    for (int64_t c = lane; c < cols / 4; c += 32) {
      const float4 v = reinterpret_cast<const float4*>(xr)[c];
      const float4 g = reinterpret_cast<const float4*>(gain)[c];
      reinterpret_cast<float4*>(yr)[c] = make_float4(v.x * s * g.x, v.y * s * g.y, v.z * s * g.z, v.w * s * g.w);
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) yr[c] = xr[c] * s * gain[c];
  }
  if (lane == 0) rstd[row] = s;
}

// dx += (g - xhat * mean(g * xhat)) * rstd with g = dy * gain and xhat = x *
// rstd (the mean summed in double); one warp per row, a column at a time (the
// backward reads three rows and writes one: memory, not arithmetic, bounds it).
__global__ void __launch_bounds__(256) RmsNormBackwardKernel(const float* __restrict__ x, const float* __restrict__ gain,
                                                             const float* __restrict__ rstd,
                                                             const float* __restrict__ dy, float* __restrict__ dx,
                                                             int64_t rows, int64_t cols) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  float* dxr = dx + row * cols;
  const float s = rstd[row];
  double sum_gx = 0.0;
  for (int64_t c = lane; c < cols; c += 32) {
    const float xhat = xr[c] * s;
    const float g = dyr[c] * gain[c];
    sum_gx += static_cast<double>(g) * xhat;
  }
  const float mean_gx = static_cast<float>(WarpSum(sum_gx) / static_cast<double>(cols));
  for (int64_t c = lane; c < cols; c += 32) {
    const float xhat = xr[c] * s;
    const float g = dyr[c] * gain[c];
    dxr[c] = dxr[c] + (g - xhat * mean_gx) * s;
  }
}

// dgain partials: block (x, y) covers columns 32x .. 32x + 31 and rows
// [y * rows_per_chunk, ...), as LayerNormParamPartialsKernel with the summand
// dy * xhat.
__global__ void __launch_bounds__(256) RmsNormGainPartialsKernel(const float* __restrict__ x,
                                                                 const float* __restrict__ rstd,
                                                                 const float* __restrict__ dy, int64_t rows,
                                                                 int64_t cols, int64_t rows_per_chunk,
                                                                 float* __restrict__ partial) {
  __shared__ float sums[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += dy[r * cols + col] * (x[r * cols + col] * rstd[r]);
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = sums[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) total += sums[k][threadIdx.x];
    partial[blockIdx.y * cols + col] = total;
  }
}

// ============================================================================
// Kernels: RoPE
// ============================================================================

// One thread per (row, head, i < hd/2) pair: x[i] and x[i + hd/2] turned by the
// table's angle for the row's position (kInverse: by minus it). Both inputs are
// read before either output is written, so y may alias x.
template <bool kInverse>
__global__ void RopeKernel(const float* x, float* y, const float* __restrict__ cos_table,
                           const float* __restrict__ sin_table, int64_t rows, int64_t seq, int64_t heads,
                           int64_t half, int64_t ld) {
  const int64_t n = rows * heads * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int64_t i = k % half;
    const int64_t rh = k / half;
    const int64_t h = rh % heads, r = rh / heads;
    const int64_t at = r * ld + h * 2 * half + i;
    const int64_t table = (r % seq) * half + i;
    const float a = x[at], b = x[at + half], c = cos_table[table], s = sin_table[table];
    if constexpr (kInverse) {
      y[at] = a * c + b * s;
      y[at + half] = b * c - a * s;
    } else {
      y[at] = a * c - b * s;
      y[at + half] = b * c + a * s;
    }
  }
}

Status CheckRms(const char* op, int64_t rows, int64_t cols) {
  if (rows >= 0 && cols >= 1) return Status::Ok();
  return Status::Error(std::string(op) + ": shape: rows " + std::to_string(rows) + ", cols " + std::to_string(cols) +
                       " is not allowed; need rows >= 0, cols >= 1");
}

Status CheckRope(const char* op, int64_t batch, int64_t seq, int64_t heads, int64_t hd, int64_t ld) {
  if (batch >= 0 && seq >= 1 && heads >= 1 && hd >= 2 && hd % 2 == 0 && ld >= heads * hd) return Status::Ok();
  return Status::Error(std::string(op) + ": shape: batch " + std::to_string(batch) + ", seq " + std::to_string(seq) +
                       ", heads " + std::to_string(heads) + ", hd " + std::to_string(hd) + ", ld " +
                       std::to_string(ld) + " is not allowed; need seq, heads >= 1, an even hd >= 2, ld >= heads * hd");
}

}  // namespace

// ============================================================================
// Launchers
// ============================================================================

Status CudaBackend::RmsNormForward(const float* x, const float* gain, float* y, float* rstd, int64_t rows,
                                   int64_t cols, float eps) {
  NN_PROFILE("RmsNormForward");
  KEEL_RETURN_IF_ERROR(CheckRms("RmsNormForward", rows, cols));
  if (rows == 0) return Status::Ok();
  if (x == nullptr || gain == nullptr || y == nullptr || rstd == nullptr)
    return Status::Error("RmsNormForward: x, gain, y or rstd: null");
  const bool vec = cols % 4 == 0 && Aligned(x, 16) && Aligned(y, 16) && Aligned(gain, 16);
  const unsigned int blocks = static_cast<unsigned int>(CeilDiv(rows, 8));  // 8 warps (rows) per block
  if (vec) {
    RmsNormForwardKernel<true><<<blocks, 256, 0, stream_>>>(x, gain, y, rstd, rows, cols, eps);
  } else {
    RmsNormForwardKernel<false><<<blocks, 256, 0, stream_>>>(x, gain, y, rstd, rows, cols, eps);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::RmsNormBackward(const float* x, const float* gain, const float* rstd, const float* dy,
                                    float* dx, float* dgain, int64_t rows, int64_t cols) {
  NN_PROFILE("RmsNormBackward");
  KEEL_RETURN_IF_ERROR(CheckRms("RmsNormBackward", rows, cols));
  if (rows == 0) return Status::Ok();
  if (x == nullptr || gain == nullptr || rstd == nullptr || dy == nullptr || dx == nullptr || dgain == nullptr)
    return Status::Error("RmsNormBackward: x, gain, rstd, dy, dx or dgain: null");
  RmsNormBackwardKernel<<<static_cast<unsigned int>(CeilDiv(rows, 8)), 256, 0, stream_>>>(x, gain, rstd, dy, dx,
                                                                                          rows, cols);
  NN_LAUNCH_CHECK();
  ColumnSplit split;
  KEEL_RETURN_IF_ERROR(SplitColumnSums(rows, cols, 1, &split));
  RmsNormGainPartialsKernel<<<dim3(static_cast<unsigned int>(CeilDiv(cols, 32)),
                                   static_cast<unsigned int>(split.chunks)),
                              dim3(32, 8), 0, stream_>>>(x, rstd, dy, rows, cols, split.rows_per_chunk, split.partial);
  NN_LAUNCH_CHECK();
  return FinalizeColumnPartials(split.partial, split.chunks, cols, dgain, stream_);
}

Status CudaBackend::RopeForward(const float* x, float* y, const float* cos, const float* sin, int64_t batch,
                                int64_t seq, int64_t heads, int64_t hd, int64_t ld) {
  NN_PROFILE("RopeForward");
  KEEL_RETURN_IF_ERROR(CheckRope("RopeForward", batch, seq, heads, hd, ld));
  if (batch == 0) return Status::Ok();
  if (x == nullptr || y == nullptr || cos == nullptr || sin == nullptr)
    return Status::Error("RopeForward: x, y, cos or sin: null");
  const int64_t pairs = batch * seq * heads * (hd / 2);
  RopeKernel<false><<<GridFor(pairs), kThreads, 0, stream_>>>(x, y, cos, sin, batch * seq, seq, heads, hd / 2, ld);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::RopeBackward(const float* dy, float* dx, const float* cos, const float* sin, int64_t batch,
                                 int64_t seq, int64_t heads, int64_t hd, int64_t ld) {
  NN_PROFILE("RopeBackward");
  KEEL_RETURN_IF_ERROR(CheckRope("RopeBackward", batch, seq, heads, hd, ld));
  if (batch == 0) return Status::Ok();
  if (dy == nullptr || dx == nullptr || cos == nullptr || sin == nullptr)
    return Status::Error("RopeBackward: dy, dx, cos or sin: null");
  const int64_t pairs = batch * seq * heads * (hd / 2);
  RopeKernel<true><<<GridFor(pairs), kThreads, 0, stream_>>>(dy, dx, cos, sin, batch * seq, seq, heads, hd / 2, ld);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
