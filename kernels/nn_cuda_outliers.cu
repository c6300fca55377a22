// The CUDA backend's outlier analytics reductions (nn.h, "Outlier analytics";
// kernels/outliers.h): per-channel max |x|, the power sums and NVFP4
// flush-to-zero count, and the block map. The CPU reference is outliers.cc
// (*Ref); nn_cuda_test.cc compares the two.
//
// Determinism without ordered atomics: maxima are integer atomicMax on the
// magnitude bits (max does not depend on the order, and a NaN's bits beat
// Inf's, as in the reference); counts are integers; every floating-point sum
// goes through per-block partials that one block adds in a fixed order. The
// sums are double, so they differ from the reference's serial order by a few
// ulps of double only.
#include <string>

#include "kernels/nn_cuda_internal.h"
#include "kernels/quant_core.h"

namespace keel {
namespace nncuda {

namespace {

constexpr int kOutlierThreads = 256;
constexpr unsigned int kOutlierMaxBlocks = 1024;  // partials one thread adds up

// Pass 1's partial of one block: the finite elements' sum and count, and the
// largest magnitude's bits (NaN beats every number).
struct Pass1Partial {
  double sum;
  unsigned long long finite;
  unsigned int amax_bits;
  unsigned int pad;
};

// Pass 2's partial of one block.
struct Pass2Partial {
  double s1, s2, s3, s4;
  unsigned long long finite, nonfinite, nonzero, flushed;
};

__device__ __forceinline__ unsigned int AbsBits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

// The tensor a reduction reads, element (r, c) as fp32: fp32 rows `cols`
// apart, or bf16 rows `ld` apart (each value exactly, widened). Flat(i) is
// element i of the row-major rows x cols tensor: the kernels give every
// element to the same thread whichever reader they use, so a bf16 tensor's
// results are the bits of its widened copy's.
struct F32Reader {
  const float* __restrict__ p;
  __device__ __forceinline__ float At(int64_t r, int64_t c, int64_t cols) const { return p[r * cols + c]; }
  __device__ __forceinline__ float Flat(int64_t i, int64_t) const { return p[i]; }
};
struct Bf16Reader {
  const uint16_t* __restrict__ p;
  int64_t ld;
  __device__ __forceinline__ float At(int64_t r, int64_t c, int64_t) const {
    return __uint_as_float(static_cast<unsigned int>(p[r * ld + c]) << 16);
  }
  __device__ __forceinline__ float Flat(int64_t i, int64_t cols) const {
    return ld == cols ? At(0, i, cols) : At(i / cols, i % cols, cols);
  }
};

__device__ __forceinline__ unsigned int WarpMaxBits(unsigned int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// The block's sum of v (every thread passes one), valid in thread 0: the warps'
// xor-butterfly sums, then thread 0 adds the warps in order. `shared` holds one
// T per warp; the function ends with a barrier so it can be called again.
template <typename T>
__device__ T BlockSum(T v, T* shared) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = T(0);
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += shared[w];
  }
  __syncthreads();
  return total;
}

__device__ unsigned int BlockMaxBits(unsigned int v, unsigned int* shared) {
  v = WarpMaxBits(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  unsigned int total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total = max(total, shared[w]);
  }
  __syncthreads();
  return total;
}

// A block's shared room for reducing a pass's partial (one slot per warp),
// declared once per kernel and used again by the finish in its last block
// (every BlockSum ends with a barrier).
struct Pass1Shared {
  double sum[kOutlierThreads / 32];
  unsigned long long finite[kOutlierThreads / 32];
  unsigned int amax[kOutlierThreads / 32];
};
struct Pass2Shared {
  double d[kOutlierThreads / 32];
  unsigned long long u[kOutlierThreads / 32];
};

// The block's total of every thread's partial, valid in thread 0.
__device__ Pass1Partial BlockReduce(Pass1Partial p, Pass1Shared* shared) {
  p.sum = BlockSum(p.sum, shared->sum);
  p.finite = BlockSum(p.finite, shared->finite);
  p.amax_bits = BlockMaxBits(p.amax_bits, shared->amax);
  return p;
}

__device__ Pass2Partial BlockReduce(Pass2Partial p, Pass2Shared* shared) {
  p.s1 = BlockSum(p.s1, shared->d);
  p.s2 = BlockSum(p.s2, shared->d);
  p.s3 = BlockSum(p.s3, shared->d);
  p.s4 = BlockSum(p.s4, shared->d);
  p.finite = BlockSum(p.finite, shared->u);
  p.nonfinite = BlockSum(p.nonfinite, shared->u);
  p.nonzero = BlockSum(p.nonzero, shared->u);
  p.flushed = BlockSum(p.flushed, shared->u);
  return p;
}

// True in every thread of the block that finishes last among the grid's
// blocks; by then every block's partial is visible to it. Thread 0 must have
// written its block's partial before the call. That block sets *counter back
// to 0 for the next launch (launches on a stream do not overlap).
__device__ bool LastBlockDone(unsigned int* counter) {
  __shared__ bool last;
  __threadfence();  // this block's partial reaches the device before the count does
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) atomicExch(counter, 0u);
  }
  __syncthreads();
  if (last) __threadfence();  // and is read after it (the partials load through L2: __ldcg)
  return last;
}

// ============================================================================
// Kernels: per-channel max |x|
// ============================================================================

// Channels are columns: a 32 x 8 block covers 32 columns (coalesced) and a
// stripe of rows; the 8 row lanes meet in shared memory, and one atomicMax per
// column and block reaches out.
template <typename Reader>
__global__ void __launch_bounds__(256) ColumnAbsMaxKernel(Reader x, int64_t rows, int64_t cols, float* out) {
  __shared__ unsigned int lanes[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  unsigned int m = 0;
  if (c < cols) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * 8 + threadIdx.y; r < rows;
         r += static_cast<int64_t>(gridDim.y) * 8) {
      m = max(m, AbsBits(x.At(r, c, cols)));
    }
  }
  lanes[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int y = 1; y < 8; ++y) m = max(m, lanes[y][threadIdx.x]);
    atomicMax(reinterpret_cast<unsigned int*>(out) + c, m);
  }
}

// Channels are rows: a warp per row.
template <typename Reader>
__global__ void __launch_bounds__(256) RowAbsMaxKernel(Reader x, int64_t rows, int64_t cols, float* out) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    unsigned int m = 0;
    for (int64_t c = lane; c < cols; c += 32) m = max(m, AbsBits(x.At(r, c, cols)));
    m = WarpMaxBits(m);
    if (lane == 0) atomicMax(reinterpret_cast<unsigned int*>(out) + r, m);
  }
}

// ============================================================================
// Kernels: power sums and flush-to-zero
// ============================================================================

// The finishes run in one block of kFinishThreads (the last of the pass's
// blocks): thread t adds the partials t, t + kFinishThreads, ... in order, then
// BlockSum adds the threads in its fixed order. The same order every run (so the same bits), and no
// thread walks all the partials alone (a lone thread's chain of dependent
// global loads took ~0.3 ms per tensor).
constexpr int kFinishThreads = 256;
static_assert(kFinishThreads == kOutlierThreads, "the finishes run in a pass's last block");

// The tensor's amax (into *amax_out) and, on the slot's first finite call, the shift.
__device__ void Finish1(const Pass1Partial* partials, int blocks, OutlierSums* sums, float* amax_out,
                        Pass1Shared* shared) {
  Pass1Partial t{0, 0, 0, 0};
  for (int b = threadIdx.x; b < blocks; b += kFinishThreads) {
    t.sum += __ldcg(&partials[b].sum);
    t.finite += __ldcg(&partials[b].finite);
    t.amax_bits = max(t.amax_bits, __ldcg(&partials[b].amax_bits));
  }
  t = BlockReduce(t, shared);
  if (threadIdx.x != 0) return;
  *amax_out = __uint_as_float(t.amax_bits);
  if (sums->finite == 0 && t.finite > 0) sums->shift = t.sum / static_cast<double>(t.finite);
}

// The partials (in the finishing order above), added to the slot's sums.
__device__ void Finish2(const Pass2Partial* partials, int blocks, OutlierSums* sums, Pass2Shared* shared) {
  Pass2Partial t{0, 0, 0, 0, 0, 0, 0, 0};
  for (int b = threadIdx.x; b < blocks; b += kFinishThreads) {
    t.s1 += __ldcg(&partials[b].s1);
    t.s2 += __ldcg(&partials[b].s2);
    t.s3 += __ldcg(&partials[b].s3);
    t.s4 += __ldcg(&partials[b].s4);
    t.finite += __ldcg(&partials[b].finite);
    t.nonfinite += __ldcg(&partials[b].nonfinite);
    t.nonzero += __ldcg(&partials[b].nonzero);
    t.flushed += __ldcg(&partials[b].flushed);
  }
  t = BlockReduce(t, shared);
  if (threadIdx.x != 0) return;
  sums->s1 += t.s1;
  sums->s2 += t.s2;
  sums->s3 += t.s3;
  sums->s4 += t.s4;
  sums->finite += static_cast<int64_t>(t.finite);
  sums->nonfinite += static_cast<int64_t>(t.nonfinite);
  sums->nonzero += static_cast<int64_t>(t.nonzero);
  sums->flushed += static_cast<int64_t>(t.flushed);
}

// The finish (the tensor's amax and, on the slot's first finite call, the
// shift) runs in the block that finishes last (LastBlockDone).
template <typename Reader>
__global__ void __launch_bounds__(kOutlierThreads) OutlierPass1Kernel(Reader x, int64_t n, int64_t cols,
                                                                      Pass1Partial* partials, unsigned int* counter,
                                                                      OutlierSums* sums, float* amax_out) {
  __shared__ Pass1Shared shared;
  Pass1Partial t{0, 0, 0, 0};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x.Flat(i, cols);
    t.amax_bits = max(t.amax_bits, AbsBits(v));
    if (isfinite(v)) {
      t.sum += v;
      ++t.finite;
    }
  }
  t = BlockReduce(t, &shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = t;
  if (LastBlockDone(counter)) Finish1(partials, static_cast<int>(gridDim.x), sums, amax_out, &shared);
}

// One NVFP4 block of up to 16 elements per work item: its amax and scale, then
// each element's power sums and whether it rounds to zero. Axis 1: item
// (row, block), elements consecutive in the row; axis 0: item (block, column),
// adjacent threads on adjacent columns.
template <typename Reader>
__global__ void __launch_bounds__(kOutlierThreads) OutlierPass2Kernel(Reader x, int64_t rows,
                                                                      int64_t cols, int axis, const float* amax_t,
                                                                      OutlierSums* sums, Pass2Partial* partials,
                                                                      unsigned int* counter) {
  __shared__ Pass2Shared shared;
  const double shift = sums->shift;
  const qcore::Nvfp4TensorScale tensor = qcore::Nvfp4TensorScaleFromAmax(*amax_t);
  const int64_t length = axis == 1 ? cols : rows;
  const int64_t lines = axis == 1 ? rows : cols;
  const int64_t per_line = (length + 15) / 16;
  const int64_t items = lines * per_line;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  unsigned long long finite = 0, nonfinite = 0, nonzero = 0, flushed = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < items; item += stride) {
    int64_t line, k0;
    if (axis == 1) {
      line = item / per_line;
      k0 = (item % per_line) * 16;
    } else {
      line = item % cols;
      k0 = (item / cols) * 16;
    }
    const int count = static_cast<int>(length - k0 < 16 ? length - k0 : 16);
    float v[16];
    unsigned int amax_b = 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      v[k] = 0.0f;
      if (k < count) v[k] = axis == 1 ? x.At(line, k0 + k, cols) : x.At(k0 + k, line, cols);
      amax_b = max(amax_b, AbsBits(v[k]));
    }
    // The reference's NaN-propagating max: any NaN magnitude's bits exceed Inf's.
    const qcore::Nvfp4BlockScale block = qcore::Nvfp4BlockScaleFromAmax(
        amax_b > 0x7F800000u ? qcore::QuietNan() : __uint_as_float(amax_b), tensor);
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      if (k >= count) break;
      if (!isfinite(v[k])) {
        ++nonfinite;
        continue;
      }
      const double d = static_cast<double>(v[k]) - shift;
      const double d2 = d * d;
      s1 += d;
      s2 += d2;
      s3 += d2 * d;
      s4 += d2 * d2;
      ++finite;
      if (v[k] != 0.0f) {
        ++nonzero;
        if (qcore::Nvfp4Element(v[k], block, Rounding::kNearestEven, 0.0f).value == 0.0f) ++flushed;
      }
    }
  }
  const Pass2Partial t =
      BlockReduce(Pass2Partial{s1, s2, s3, s4, finite, nonfinite, nonzero, flushed}, &shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = t;
  if (LastBlockDone(counter)) Finish2(partials, static_cast<int>(gridDim.x), sums, &shared);
}

// ============================================================================
// Kernels: block map
// ============================================================================

// One block per cell: sum |x| over the cell in double, in a fixed order.
template <typename Reader>
__global__ void __launch_bounds__(kOutlierThreads) BlockAbsSumsKernel(Reader x, int64_t rows, int64_t cols,
                                                                      MapGrid grid, double* map) {
  __shared__ double shared[kOutlierThreads / 32];
  const int64_t cell = blockIdx.x;
  const int64_t r0 = (cell / grid.cols) * grid.cell_rows, c0 = (cell % grid.cols) * grid.cell_cols;
  const int64_t h = min(grid.cell_rows, rows - r0), w = min(grid.cell_cols, cols - c0);
  // Each of the cell's rows is read by `lanes` adjacent threads (a multiple of
  // 32, coalesced), `together` rows at a time: no division per element.
  const int lanes = static_cast<int>(min(static_cast<int64_t>(blockDim.x), (w + 31) / 32 * 32));
  const int together = static_cast<int>(blockDim.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes, first = static_cast<int>(threadIdx.x) / lanes;
  double sum = 0;
  if (first < together) {
    for (int64_t i = first; i < h; i += together) {
      for (int64_t j = lane; j < w; j += lanes) sum += fabsf(x.At(r0 + i, c0 + j, cols));
    }
  }
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) map[cell] += sum;
}

Status CheckShape(const char* op, int64_t rows, int64_t cols, const void* x, const void* out, const char* axis_name,
                  int axis) {
  if (rows < 1 || cols < 1)
    return Status::Error(std::string(op) + ": rows x cols: " + std::to_string(rows) + " x " + std::to_string(cols) +
                         " is not allowed; need both >= 1");
  if (x == nullptr || out == nullptr) return Status::Error(std::string(op) + ": null pointer; pass backend memory");
  if (axis != 0 && axis != 1)
    return Status::Error(std::string(op) + ": " + axis_name + ": " + std::to_string(axis) +
                         " is not allowed; use 1 or 0");
  return Status::Ok();
}

}  // namespace

// ============================================================================
// Launchers
// ============================================================================

namespace {

// The launchers' bodies, for either reader (the checks are the callers').
template <typename Reader>
Status LaunchChannelAbsMax(Reader x, int64_t rows, int64_t cols, int channel_axis, float* out, int sm_count,
                           cudaStream_t stream) {
  if (channel_axis == 1) {
    // Enough row stripes to fill the GPU, at least 8 rows each.
    const int64_t column_blocks = CeilDiv(cols, 32);
    const int64_t stripes =
        std::max<int64_t>(1, std::min<int64_t>(CeilDiv(rows, 8), 4 * sm_count / std::max<int64_t>(1, column_blocks) + 1));
    ColumnAbsMaxKernel<<<dim3(static_cast<unsigned int>(column_blocks),
                              static_cast<unsigned int>(std::min<int64_t>(stripes, 65535))),
                         dim3(32, 8), 0, stream>>>(x, rows, cols, out);
  } else {
    RowAbsMaxKernel<<<GridFor(rows, 8), 256, 0, stream>>>(x, rows, cols, out);
  }
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CheckBf16Ld(const char* op, int64_t ld, int64_t cols) {
  if (ld < cols)
    return Status::Error(std::string(op) + ": ld: " + std::to_string(ld) + " is not allowed; need >= cols (" +
                         std::to_string(cols) + ")");
  return Status::Ok();
}

Status CheckGrid(const char* op, int64_t rows, int64_t cols, const MapGrid& grid) {
  const MapGrid expected = MapGridFor(rows, cols);
  if (grid.cell_rows != expected.cell_rows || grid.cell_cols != expected.cell_cols || grid.rows != expected.rows ||
      grid.cols != expected.cols)
    return Status::Error(std::string(op) + ": grid: " + std::to_string(grid.rows) + " x " + std::to_string(grid.cols) +
                         " cells is not allowed; use MapGridFor(rows, cols)");
  return Status::Ok();
}

}  // namespace

Status CudaBackend::ChannelAbsMax(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out) {
  NN_PROFILE("ChannelAbsMax");
  KEEL_RETURN_IF_ERROR(CheckShape("ChannelAbsMax", rows, cols, x, out, "channel_axis", channel_axis));
  return LaunchChannelAbsMax(F32Reader{x}, rows, cols, channel_axis, out, sm_count_, stream_);
}

Status CudaBackend::ChannelAbsMaxBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int channel_axis,
                                      float* out) {
  NN_PROFILE("ChannelAbsMax");
  KEEL_RETURN_IF_ERROR(CheckShape("ChannelAbsMaxBf16", rows, cols, x, out, "channel_axis", channel_axis));
  KEEL_RETURN_IF_ERROR(CheckBf16Ld("ChannelAbsMaxBf16", ld, cols));
  return LaunchChannelAbsMax(Bf16Reader{x, ld}, rows, cols, channel_axis, out, sm_count_, stream_);
}

template <typename Reader>
Status CudaBackend::LaunchOutlierSums(Reader x, int64_t rows, int64_t cols, int nvfp4_axis, OutlierSums* sums) {
  const int64_t n = rows * cols;
  const unsigned int blocks1 = std::min(GridFor(n, kOutlierThreads), kOutlierMaxBlocks);
  const int64_t items = (nvfp4_axis == 1 ? rows * CeilDiv(cols, 16) : cols * CeilDiv(rows, 16));
  const unsigned int blocks2 = std::min(GridFor(items, kOutlierThreads), kOutlierMaxBlocks);
  // Scratch: pass 1's partials | pass 2's partials | the tensor amax | the
  // passes' block counter (LastBlockDone), zeroed whenever the scratch is new.
  const size_t p2_offset = kOutlierMaxBlocks * sizeof(Pass1Partial);
  const size_t amax_offset = p2_offset + kOutlierMaxBlocks * sizeof(Pass2Partial);
  const size_t counter_offset = amax_offset + 16;
  KEEL_RETURN_IF_ERROR(outlier_scratch_.Reserve(counter_offset + 16, stream_));
  char* base = outlier_scratch_.get<char>();
  unsigned int* counter = reinterpret_cast<unsigned int*>(base + counter_offset);
  if (outlier_counter_ != counter) {
    KEEL_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned int), stream_));
    outlier_counter_ = counter;
  }
  Pass1Partial* p1 = reinterpret_cast<Pass1Partial*>(base);
  Pass2Partial* p2 = reinterpret_cast<Pass2Partial*>(base + p2_offset);
  float* amax = reinterpret_cast<float*>(base + amax_offset);
  // Two launches: each pass's last block runs its finish.
  OutlierPass1Kernel<<<blocks1, kOutlierThreads, 0, stream_>>>(x, n, cols, p1, counter, sums, amax);
  NN_LAUNCH_CHECK();
  OutlierPass2Kernel<<<blocks2, kOutlierThreads, 0, stream_>>>(x, rows, cols, nvfp4_axis, amax, sums, p2, counter);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AddOutlierSums(const float* x, int64_t rows, int64_t cols, int nvfp4_axis, OutlierSums* sums) {
  NN_PROFILE("AddOutlierSums");
  KEEL_RETURN_IF_ERROR(CheckShape("AddOutlierSums", rows, cols, x, sums, "nvfp4_axis", nvfp4_axis));
  return LaunchOutlierSums(F32Reader{x}, rows, cols, nvfp4_axis, sums);
}

Status CudaBackend::AddOutlierSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int nvfp4_axis,
                                       OutlierSums* sums) {
  NN_PROFILE("AddOutlierSums");
  KEEL_RETURN_IF_ERROR(CheckShape("AddOutlierSumsBf16", rows, cols, x, sums, "nvfp4_axis", nvfp4_axis));
  KEEL_RETURN_IF_ERROR(CheckBf16Ld("AddOutlierSumsBf16", ld, cols));
  return LaunchOutlierSums(Bf16Reader{x, ld}, rows, cols, nvfp4_axis, sums);
}

Status CudaBackend::AddBlockAbsSums(const float* x, int64_t rows, int64_t cols, const MapGrid& grid, double* map) {
  NN_PROFILE("AddBlockAbsSums");
  KEEL_RETURN_IF_ERROR(CheckShape("AddBlockAbsSums", rows, cols, x, map, "axis", 1));
  KEEL_RETURN_IF_ERROR(CheckGrid("AddBlockAbsSums", rows, cols, grid));
  BlockAbsSumsKernel<<<static_cast<unsigned int>(grid.cells()), kOutlierThreads, 0, stream_>>>(F32Reader{x}, rows,
                                                                                              cols, grid, map);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AddBlockAbsSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols,
                                        const MapGrid& grid, double* map) {
  NN_PROFILE("AddBlockAbsSums");
  KEEL_RETURN_IF_ERROR(CheckShape("AddBlockAbsSumsBf16", rows, cols, x, map, "axis", 1));
  KEEL_RETURN_IF_ERROR(CheckBf16Ld("AddBlockAbsSumsBf16", ld, cols));
  KEEL_RETURN_IF_ERROR(CheckGrid("AddBlockAbsSumsBf16", rows, cols, grid));
  BlockAbsSumsKernel<<<static_cast<unsigned int>(grid.cells()), kOutlierThreads, 0, stream_>>>(Bf16Reader{x, ld},
                                                                                              rows, cols, grid, map);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
