// Internals shared by the CUDA backend's compilation units (nn_cuda_*.cu): the
// CudaBackend class, error checks, scratch buffers, the cuBLASLt wrapper and the
// launch helpers. Only .cu files include this (it needs the CUDA headers); the
// public entry point is MakeCudaBackend in nn.h.
//
// Threading: a CudaBackend is used from one host thread at a time (the trainer's);
// everything it queues goes to its one non-blocking stream, in call order.
#ifndef KEEL_KERNELS_NN_CUDA_INTERNAL_H_
#define KEEL_KERNELS_NN_CUDA_INTERNAL_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda_status.h"
#include "kernels/nn.h"
#include "kernels/nn_cuda_cudnn.h"
#include "kernels/nn_cuda_flash.h"
#include "kernels/quantize_cuda.h"

namespace keel {
namespace nncuda {

// ---- Errors ---------------------------------------------------------------------

Status CublasError(cublasStatus_t status, const char* call, const char* file, int line);

// CUDA runtime calls are checked with KEEL_CUDA_CHECK (cuda_status.h); a cuBLASLt
// call with this, which on failure returns a Status naming the call, file and line.
#define NN_CUBLAS_CHECK(call)                                                          \
  do {                                                                                 \
    const cublasStatus_t nn_cublas_status_ = (call);                                   \
    if (nn_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      return ::keel::nncuda::CublasError(nn_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: reports a bad configuration at the launch site.
#define NN_LAUNCH_CHECK() KEEL_CUDA_CHECK(cudaGetLastError())

// ---- Launch geometry ---------------------------------------------------------------

constexpr int kThreads = 256;

__host__ __device__ inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over `work` items at `per_block` items a block:
// enough to fill the GPU a few times over, never more than the work needs.
unsigned int GridFor(int64_t work, int64_t per_block = kThreads);

inline bool Aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Sums over rows (dbias, LayerNorm dgamma / dbeta) run in two passes with a fixed
// order: pass 1 writes one partial sum per chunk of rows and column (chunks =
// ColumnChunks(rows), each ceil(rows / chunks) rows); FinalizeColumnPartials adds
// each column's partials in chunk order to out[c] (out null: nothing).
int64_t ColumnChunks(int64_t rows);
// Pass 1's split of `rows` (ColumnChunks) and its partials buffer (sets x chunks x
// cols floats, set k at partial + k * chunks * cols).
struct ColumnSplit {
  int64_t chunks = 0, rows_per_chunk = 0;
  float* partial = nullptr;
};
Status FinalizeColumnPartials(const float* partial, int64_t chunks, int64_t cols, float* out,
                              cudaStream_t stream);

// ---- Warp reductions ------------------------------------------------------------------

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The sum (float or double) over the 32 lanes, every lane getting it: an xor
// butterfly, so every lane adds in the same order and holds the same bits.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// ---- GELU -------------------------------------------------------------------------------

constexpr float kSqrt2 = 1.41421356237309504880f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)

__device__ __forceinline__ float Gelu(float x) { return x * 0.5f * (1.0f + erff(x / kSqrt2)); }

// gelu'(x) = Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)), phi the normal density.
__device__ __forceinline__ float GeluGrad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x / kSqrt2));
  const float pdf = expf(-0.5f * x * x) * kInvSqrt2Pi;
  return cdf + x * pdf;
}

// ---- Elementwise maps ------------------------------------------------------------------

// out[j] = op(a[j], b[j]) for j < n, grid-stride, four elements at a time through
// float4 when `vec` (every pointer read or written 16-byte aligned). a is read only
// when kInputs >= 1 and b only when kInputs == 2; op gets 0 for an input not read.
// out may alias an input: each element is read, then written, by one thread.
template <int kInputs, typename Op>
__global__ void MapKernel(float* out, const float* a, const float* b, int64_t n, bool vec, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    for (int64_t j = i; j < n / 4; j += stride) {
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f), y = x;
      if constexpr (kInputs >= 1) x = reinterpret_cast<const float4*>(a)[j];
      if constexpr (kInputs >= 2) y = reinterpret_cast<const float4*>(b)[j];
      reinterpret_cast<float4*>(out)[j] = make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
    }
    done = n / 4 * 4;
  }
  for (int64_t j = done + i; j < n; j += stride) {
    float x = 0.0f, y = 0.0f;
    if constexpr (kInputs >= 1) x = a[j];
    if constexpr (kInputs >= 2) y = b[j];
    out[j] = op(x, y);
  }
}

// Queues MapKernel on `stream` for n >= 1 elements, with float4 access when the
// pointers it uses allow.
template <int kInputs, typename Op>
Status LaunchMap(float* out, const float* a, const float* b, int64_t n, Op op, cudaStream_t stream) {
  const bool vec = Aligned(out, 16) && (kInputs < 1 || Aligned(a, 16)) && (kInputs < 2 || Aligned(b, 16));
  MapKernel<kInputs><<<GridFor(vec ? n / 4 + 1 : n), kThreads, 0, stream>>>(out, a, b, n, vec, op);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

// ---- Scratch memory ------------------------------------------------------------------

// A device buffer that grows on demand and is otherwise kept: the steady state
// allocates nothing. Growth frees the old buffer in stream order (cudaFreeAsync), so
// work already queued on it still finds it.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Status Reserve(size_t bytes, cudaStream_t stream);
  void Release(cudaStream_t stream);
  // Reserve fails while *flag is true (the backend's side work, which must not
  // share scratch with the main stream).
  void RefuseWhile(const bool* flag) { refuse_ = flag; }
  template <typename T> T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  const bool* refuse_ = nullptr;
};

// One side of a GEMM with the Hot-Channel Patch (nn_cuda_hcp.cu, docs/hcp.md),
// as the GEMM contracts it: A(i, j) for i < n and contraction index j is
// src[i * si + j * sj] (with rht: output j % 16 of the RHT of j's chunk of 16),
// and Q(A)(i, j) is q[i * qi + j * qj] (bf16 when q_bf16, else fp32) times
// *scale (null: 1), the GEMM's quantized operand.
struct FoldOperand;  // nn_cuda_hcp.cu

struct HcpSide {
  const float* src;
  int64_t si, sj;
  const void* q;
  const float* scale;
  bool q_bf16;
  int64_t qi, qj;
  bool rht;
  int64_t n;
};

// The two shapes a linear layer's GEMMs contract their operands in, for a
// source (rows x cols, row-major) and its quantized operand q laid out alike:
// along each row (j a column: the forward's x and w, the dgrad's dy), or down
// each column (j a row: the dgrad's w, the wgrad's dy and x, rotated when rht).
inline HcpSide HcpAlongRows(const float* src, int64_t rows, int64_t cols, const void* q, const float* scale,
                            bool q_bf16) {
  return HcpSide{src, cols, 1, q, scale, q_bf16, cols, 1, false, rows};
}
inline HcpSide HcpDownColumns(const float* src, int64_t cols, const void* q, const float* scale, bool q_bf16,
                              bool rht) {
  return HcpSide{src, 1, cols, q, scale, q_bf16, 1, cols, rht, cols};
}

// ---- cuBLASLt ------------------------------------------------------------------------

// One (strided-batched) GEMM in cuBLASLt's column-major terms:
//   C (m x n, ldc) = alpha * op(A) . op(B) + beta * C [+ bias broadcast along n]
// (cuBLASLt's order: the bias is added to alpha * op(A) . op(B) + beta * C), where
// the C read may come from another matrix of the same layout (c_in).
// op(A) is m x k (A stored k x m when trans_a), op(B) is k x n (B stored n x k when
// trans_b). A row-major r x c matrix is a column-major c x r one with ld = c, so
// the callers compute row-major products as transposed column-major ones.
struct GemmArgs {
  bool bf16 = false;             // A and B bf16 (else fp32); C always fp32
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  float* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  const float* alpha = nullptr;  // device float
  bool accumulate = false;       // beta = 1, else 0
  const float* c_in = nullptr;   // with accumulate: beta * C read from here (ldc, stride_c), not c
  const float* bias = nullptr;   // m floats added to every column, or null

  // The shape and the three matrices, a line at each call site. stride: elements
  // between consecutive matrices of a batch (0 when batch is 1).
  GemmArgs& Shape(int64_t rows_m, int64_t cols_n, int64_t depth_k) {
    m = rows_m;
    n = cols_n;
    k = depth_k;
    return *this;
  }
  GemmArgs& A(const void* p, int64_t ld, int64_t stride = 0) {
    a = p;
    lda = ld;
    stride_a = stride;
    return *this;
  }
  GemmArgs& B(const void* p, int64_t ld, int64_t stride = 0) {
    b = p;
    ldb = ld;
    stride_b = stride;
    return *this;
  }
  GemmArgs& C(float* p, int64_t ld, int64_t stride = 0) {
    c = p;
    ldc = ld;
    stride_c = stride;
    return *this;
  }
};

// The cuBLASLt handle, its workspace and a cache of matmul plans (descriptors and
// the heuristic's algorithm) per shape, so a training step queries the heuristic
// only on its first pass. Compute type CUBLAS_COMPUTE_32F everywhere: FP32
// accumulation, and no TF32 for fp32 operands. Pointer mode device: alpha and beta
// are device floats (the decode scales of NVFP4 / FP8 operands are only known there).
class Blas {
 public:
  Blas() = default;
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  Status Init(cudaStream_t stream);
  Status Gemm(const GemmArgs& g);
  // GEMMs go to `side` with a workspace of their own (allocated on first use)
  // while on, back to Init's stream and workspace when off.
  Status UseSide(cudaStream_t side, bool on);
  // Device floats 1.0f and 0.0f, for alpha.
  const float* one() const { return constants_ + 1; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  // Everything but the pointers, plus the pointers' alignments (the heuristic's
  // algorithm may assume them).
  using Key = std::tuple<bool, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, bool, int>;
  Status MakePlan(const GemmArgs& g, int alignment, Plan* plan);

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  cudaStream_t main_stream_ = nullptr;  // Init's
  void* main_workspace_ = nullptr;
  void* side_workspace_ = nullptr;
  float* constants_ = nullptr;  // device: [0] = 0.0f, [1] = 1.0f
  std::map<Key, Plan> plans_;
};

// ---- Per-op timer ----------------------------------------------------------------------

// CUDA events around named regions of work on one stream, summed by name. Regions
// nest: a region opened inside another is named "outer > inner". Used from the
// backend's one host thread.
class OpTimer {
 public:
  ~OpTimer();
  bool on() const { return on_; }
  void Enable(bool on) { on_ = on; }
  void Push(const char* name, cudaStream_t stream);
  void Pop(cudaStream_t stream);
  // Adds the finished regions to the totals; call after the stream is synchronized.
  void Fold();
  // The totals, longest first, and resets them (the stream must be synchronized).
  Status Take(std::vector<OpTime>* out);

 private:
  struct Region {
    std::string name;
    cudaEvent_t start = nullptr, end = nullptr;
    std::chrono::steady_clock::time_point host_start;
    double host_ms = 0.0;
  };
  cudaEvent_t NewEvent();

  bool on_ = false;
  Status error_;                  // the first event failure, reported by Take
  std::vector<Region> open_;      // innermost last
  std::vector<Region> finished_;  // waiting for Fold
  std::vector<cudaEvent_t> free_;
  std::map<std::string, OpTime> totals_;
};

// Times the enclosing block as region `name` of `timer` when it is on.
class OpScope {
 public:
  OpScope(OpTimer* timer, const char* name, cudaStream_t stream)
      : timer_(timer->on() ? timer : nullptr), stream_(stream) {
    if (timer_ != nullptr) timer_->Push(name, stream_);
  }
  ~OpScope() {
    if (timer_ != nullptr) timer_->Pop(stream_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpTimer* timer_;
  cudaStream_t stream_;
};

// Inside a CudaBackend method: time the rest of the block as `name`.
#define NN_PROFILE_JOIN2(a, b) a##b
#define NN_PROFILE_JOIN(a, b) NN_PROFILE_JOIN2(a, b)
#define NN_PROFILE(name) \
  const ::keel::nncuda::OpScope NN_PROFILE_JOIN(nn_op_scope_, __LINE__)(&timer_, name, stream_)

// ---- The backend -----------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend() = default;
  ~CudaBackend() override;
  Status Init();

  const char* name() const override { return "cuda"; }
  std::string Describe() const override { return description_; }
  void* NativeStream() const override { return main_stream_; }

  Status Alloc(size_t bytes, void** ptr) override;
  void Free(void* ptr) override;
  Status Upload(void* dst, const void* host_src, size_t bytes) override;
  Status Download(void* host_dst, const void* src, size_t bytes) override;
  Status DownloadMany(const std::vector<DownloadItem>& items) override;
  Status CopyBytes(void* dst, const void* src, size_t bytes) override;
  Status Fill(float* x, int64_t count, float value) override;
  Status Sync() override;
  Status BeginSideWork() override;
  Status EndSideWork() override;
  Status JoinSideWork() override;

  Status Add(const float* a, const float* b, float* out, int64_t count) override;
  Status Axpy(float alpha, const float* x, float* y, int64_t count) override;
  Status Scale(float* x, int64_t count, float alpha) override;
  Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                int64_t cols) override;
  Status RandomNormal(float* x, int64_t count, uint64_t seed, uint64_t offset,
                      float stddev) override;

  Status QuantizeDequantize(const float* x, int64_t rows, int64_t cols, int axis,
                            const OperandFormat& format, uint64_t seed, float* out) override;

  Status LinearForward(const float* x, const float* w, const float* bias, const float* residual,
                       float* y, int64_t rows, int64_t in, int64_t out,
                       const LinearQuant& q) override;
  Status HoldWeight(const float* w) override;
  Status LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                        float* dbias, int64_t rows, int64_t in, int64_t out,
                        const LinearQuant& q) override;
  Status ResetOperandStats(int slots) override;
  Status ReadOperandStats(std::vector<OperandStats>* stats) override;
  // Outlier analytics reductions (nn_cuda_outliers.cu).
  Status ChannelAbsMax(const float* x, int64_t rows, int64_t cols, int channel_axis, float* out) override;
  Status AddOutlierSums(const float* x, int64_t rows, int64_t cols, int nvfp4_axis, OutlierSums* sums) override;
  Status AddBlockAbsSums(const float* x, int64_t rows, int64_t cols, const MapGrid& grid, double* map) override;
  Status ChannelAbsMaxBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int channel_axis,
                           float* out) override;
  Status AddOutlierSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, int nvfp4_axis,
                            OutlierSums* sums) override;
  Status AddBlockAbsSumsBf16(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, const MapGrid& grid,
                             double* map) override;

  bool DeviceMemoryInUse(int64_t* bytes) const override;
  Status SetProfiling(bool on) override;
  Status TakeProfile(std::vector<OpTime>* out) override;

  Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* rstd, int64_t rows, int64_t cols,
                          float eps) override;
  Status LayerNormForwardBf16(const float* x, const float* gamma, const float* beta, uint16_t* y, float* mean,
                              float* rstd, int64_t rows, int64_t cols, float eps) override;
  Status AddLayerNormForward(const float* y, const float* residual, float* sum, const float* gamma,
                             const float* beta, float* out, uint16_t* out_bf16, float* mean, float* rstd,
                             int64_t rows, int64_t cols, float eps) override;
  Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                           const float* rstd, const float* dy, float* dx, float* dgamma,
                           float* dbeta, int64_t rows, int64_t cols) override;
  Status RmsNormForward(const float* x, const float* gain, float* y, float* rstd, int64_t rows,
                        int64_t cols, float eps) override;
  Status RmsNormBackward(const float* x, const float* gain, const float* rstd, const float* dy,
                         float* dx, float* dgain, int64_t rows, int64_t cols) override;
  Status RopeForward(const float* x, float* y, const float* cos, const float* sin, int64_t batch,
                     int64_t seq, int64_t heads, int64_t hd, int64_t ld) override;
  Status RopeBackward(const float* dy, float* dx, const float* cos, const float* sin,
                      int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                      int64_t ld) override;
  Status GeluForward(const float* x, float* y, int64_t count) override;
  Status GeluForwardBf16(const float* x, uint16_t* y, int64_t count) override;
  Status GeluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t cols,
                          float* column_sums) override;
  Status GeluBackward(const float* x, const float* dy, float* dx, int64_t count) override;
  Status SwigluForward(const float* x, float* y, int64_t rows, int64_t h) override;
  Status SwigluBackward(const float* x, const float* dy, float* dx, int64_t rows,
                        int64_t h) override;
  Status EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                          int64_t batch, int64_t seq, int64_t dim) override;
  Status EmbeddingBackward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                           int64_t batch, int64_t seq, int64_t dim) override;
  Status AttentionForward(const float* qkv, float* out, float* stats, int64_t batch, int64_t seq,
                          int64_t heads, int64_t dim, bool bf16_operands) override;
  Status AttentionBackward(const float* qkv, const float* out, const float* stats,
                           const float* dout, float* dqkv, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim, bool bf16_operands) override;
  bool KeepsAttentionHeads(int64_t head_dim, bool bf16_operands) const override;
  Status AttentionForwardKeep(const float* qkv, float* kept, float* out, float* stats, int64_t batch,
                              int64_t seq, int64_t heads, int64_t dim, bool bf16_operands) override;
  Status AttentionBackwardKept(const float* kept, const float* out, const float* stats,
                               const float* dout, float* dqkv, int64_t batch, int64_t seq,
                               int64_t heads, int64_t dim, bool bf16_operands) override;
  Status LogSigmoidForward(const float* x, float* y, int64_t count, float scale) override;
  Status LogSigmoidBackward(const float* x, const float* dy, float* dx, int64_t count,
                            float scale) override;
  Status SiluGateForward(const float* x, const float* g, int64_t g_ld, float* y, int64_t rows,
                         int64_t cols) override;
  Status SiluGateBackward(const float* x, const float* g, int64_t g_ld, const float* dy, float* dx,
                          float* dg, int64_t rows, int64_t cols) override;
  Status GlaForward(const float* qkv, int64_t ld, const float* gk, float* out, int64_t batch,
                    int64_t seq, int64_t heads, int64_t dk, int64_t dv) override;
  Status GlaBackward(const float* qkv, int64_t ld, const float* gk, const float* dout,
                     float* dqkv, float* dgk, int64_t batch, int64_t seq, int64_t heads,
                     int64_t dk, int64_t dv) override;
  Status CrossEntropyForward(const float* logits, const int32_t* targets, float* losses,
                             int64_t rows, int64_t padded_vocab, int64_t vocab) override;
  Status CrossEntropyBackward(const float* logits, const int32_t* targets, float* dlogits,
                              int64_t rows, int64_t padded_vocab, int64_t vocab,
                              float scale) override;
  Status CrossEntropyFusedBf16(const float* logits, const int32_t* targets, float* losses, uint16_t* dlogits,
                               int64_t ld, int64_t rows, int64_t padded_vocab, int64_t vocab, float scale,
                               int64_t row0) override;
  Status CrossEntropyFused(const float* logits, const int32_t* targets, float* losses,
                           float* dlogits, int64_t rows, int64_t padded_vocab, int64_t vocab,
                           float scale) override;

  Status HcpScores(HcpGemm gemm, const float* x, const float* w, int64_t rows, int64_t in, int64_t out,
                   const LinearQuant& q, float* scores) override;
  Status HcpTopK(const float* scores, int64_t count, int32_t k, int32_t* index) override;

  Status AdamWTensors(const std::vector<AdamWTensor>& tensors, float lr, float beta1, float beta2, float eps,
                      int step, float grad_scale, std::vector<double>* delta_squares) override;
  Status AdamW(float* param, const float* grad, float* m, float* v, int64_t count, float lr,
               float beta1, float beta2, float eps, float weight_decay, int step,
               float grad_scale) override;

  Status SumSquares(const std::vector<Span>& spans, std::vector<double>* out) override;
  Status Sums(const std::vector<Span>& spans, std::vector<double>* out) override;
  Status Dots(const std::vector<Span>& a, const std::vector<Span>& b,
              std::vector<double>* out) override;

 private:
  // Small device floats the linear layer passes between its kernels and cuBLASLt.
  // Slots per role: the quantizer's amax and its tensor decode scale.
  static constexpr int kAmaxSlot = 0;         // + role
  static constexpr int kTensorScaleSlot = 8;  // + role
  static constexpr int kAlphaSlot = 16;       // + GEMM (0 fwd, 1 dgrad, 2 wgrad)
  static constexpr int kAttentionScaleSlot = 20;  // 1 / sqrt(hd) for dQ and dK
  static constexpr int kSmallFloats = 32;

  // One GEMM operand after its role's quantization.
  // The statistics pair of a BF16 operand that a later GEMM reuses, and its
  // counts once a fold has read them (pair -1: nothing counted).
  struct KeptStats {
    int64_t pair = -1;
    bool folded = false;
    unsigned long long counts[2] = {0, 0};
    // How the pair's non-finite count becomes nan_blocks: per tensor (a bf16 rounding: one block,
    // non-finite if any) or per block (an MX quantization: `blocks` scales, the count is theirs).
    int64_t blocks = 1;
    bool per_tensor = true;
  };
  // A forward operand kept for the backward (LinearQuant::keep_slot).
  struct KeptOperand {
    const float* source = nullptr;
    int64_t rows = 0, cols = 0;
    Rounding rounding = Rounding::kNearestEven;
    // An MX x kept by the forward down its columns for the wgrad (mx_keep_x): `format` is the
    // wgrad_x format it was quantized in; else a bf16 rounding shared by the two roles.
    bool mx = false;
    OperandFormat format;
    bool valid = false;
    Scratch values;  // bf16, row-major like the source
    KeptStats stats;
    int64_t hold = 0;  // the HoldWeight (hold_count_) during which it was rounded, 0: none
    // Taken by a backward during that hold (TakeKept): it stays kept for the next chunk's forward and
    // backward, its dgrad statistics already counted; once the hold ends no backward may take it.
    bool taken = false;
  };
  struct Operand {
    const void* data = nullptr;          // bf16 or fp32 values, row-major like the source
    const float* tensor_scale = nullptr; // device decode scale for alpha (NVFP4, FP8), or null
  };
  // Quantizes x (rows x cols) for `role` along `axis` into buffer `scratch`, bf16
  // when `bf16` else fp32, without the per-tensor decode scale (returned in
  // out->tensor_scale for alpha); kFp32 roles pass x through. Adds the role's
  // statistics when stats_slot >= 0.
  // keep: remember the counters of this (BF16) operand there, for a later GEMM
  // that reuses it (RecordKeptStats). column_sums (only for a BF16 role, else an
  // error): also column_sums += the column sums of x, computed by the rounding
  // pass (QuantizeBf16WithColumnSums: ColumnSums' bits).
  Status PrepareOperand(const float* x, int64_t rows, int64_t cols, int axis, Role role,
                        const LinearQuant& q, bool bf16, Scratch* scratch, Operand* out,
                        KeptStats* keep = nullptr, float* column_sums = nullptr);
  // "op: stats_slot: N is not allowed ..." unless -1 <= slot < the slots ResetOperandStats made.
  Status CheckStatsSlot(const char* op, int slot) const;
  // Device counters of one per-tensor FP8 quantization (see OperandStats) added
  // to slot/role, from its codes (the other formats count in their quantizers).
  Status AddOperandStats(const float* x, int64_t count, const OperandFormat& f, const uint8_t* codes,
                         const float* tensor_scale, int slot, Role role);
  // Quantize x (fp32) with `format` into out (fp32 or bf16), codes when non-null
  // (per-tensor FP8's statistics); tensor_scale receives NVFP4 / FP8 decode scales.
  // counts: BF16, MX and NVFP4, the two device counters the quantizer adds its
  // statistics to (DeviceOutputs::counts).
  Status Quantize(const float* x, int64_t rows, int64_t cols, int axis,
                  const OperandFormat& format, uint64_t seed, void* out, bool out_bf16,
                  bool out_without_tensor_scale, uint8_t* codes, float* amax, float* tensor_scale,
                  unsigned long long* counts = nullptr);
  // Operand statistics cost no kernel of their own. Every counting quantization
  // gets a fresh pair of device counters (saturated, non-finite) that its kernel
  // adds to, and a host record of what the pair counts for (slot, role,
  // elements, blocks); ReadOperandStats downloads the pairs in one copy and
  // folds them into the slots on the host. NextStatsPair hands out the pair (the
  // pairs fold early, with a wait, when all are in use); RecordStats files it.
  Status NextStatsPair(unsigned long long** pair, int64_t* index);
  // slot/role += `count` elements, `blocks` blocks and pair `index`'s counts
  // (per_tensor: any non-finite element counts as one NaN block).
  void RecordStats(int64_t count, int64_t blocks, bool per_tensor, int slot, Role role, int64_t index);
  // A role counted as the reused operand that `kept` remembered.
  void RecordKeptStats(const KeptStats& kept, int64_t count, int slot, Role role);
  // Every KeptStats whose pair a fold must read (kept_dy_ and the kept operands').
  std::vector<KeptStats*> AllKeptStats();
  // Waits for the queued work, folds every recorded pair into host_stats_ and
  // zeroes the pairs for reuse.
  Status FoldStats();
  // ---- Hot-Channel Patch (nn_cuda_hcp.cu) ----
  // mean (k_count doubles) = (add: +=) mean over i of |A - Q(A)| per j.
  Status HcpSideMeans(const HcpSide& s, int64_t k_count, bool add, double* mean);
  // scores (k_count floats) = both sides' means, summed.
  Status HcpScoresOf(const HcpSide& a, const HcpSide& b, int64_t k_count, float* scores);
  // index (k) = the k best of scores[0..count), ascending (nn.h HcpTopK).
  Status TopKOnDevice(const float* scores, int64_t count, int32_t k, int32_t* index);
  // *index = the set the GEMM patches: hot.index, or with choose_into the
  // hot.count best scores of a and b, chosen now and written there.
  Status HotSet(const HcpSide& a, const HcpSide& b, int64_t k_count, const HotChannels& hot, const int32_t** index);
  // c (a.n x b.n, ldc) += [dA_H | Q(A)_H] . [B_H | dB_H]^T: bf16 patch columns,
  // a BF16 GEMM with fp32 accumulation, alpha 1 and beta 1.
  Status AddHcpPatch(const HcpSide& a, const HcpSide& b, const int32_t* index, int32_t k, float* c, int64_t ldc);
  // The patch folded into a BF16 GEMM (gemm 0 forward, 1 dgrad, 2 wgrad: the
  // shapes LinearForward / LinearBackward give *g): its operands copied into
  // buffers that have the 2 x round_up(k, 4) patch columns after their own
  // contraction (columns or rows), each divided by its side's decode scale so
  // that the GEMM's alpha restores it; K grows by as much. One GEMM, no second
  // pass over the output (docs/hcp.md, "The CUDA implementation").
  Status FoldHcpPatch(int gemm, const HcpSide& a, const HcpSide& b, const int32_t* index, int32_t k, GemmArgs* g);
  Status FoldOperandWithPatch(const FoldOperand& op, const HcpSide& side, bool first, const int32_t* index,
                              int32_t k, int32_t half, Scratch* buffer, const void** out, int64_t* out_ld);

  // alpha = product of the two decode scales (null ones count as 1) in slot `gemm`.
  Status Alpha(const Operand& a, const Operand& b, int gemm, const float** alpha);
  // out (+)= column sums of m (rows x cols, row-major), in a fixed order.
  Status ColumnSums(const float* m, int64_t rows, int64_t cols, float* out);
  // The split every pass 1 over rows x cols uses, with room for `sets` partial
  // arrays in partials_ (the one split, so that fused and plain sums agree).
  // rows_per_chunk > 0: chunks of that many rows instead (LayerNormBackward's
  // fused kernel, whose blocks are chunks of kFusedLnRows rows).
  Status SplitColumnSums(int64_t rows, int64_t cols, int sets, ColumnSplit* split, int64_t rows_per_chunk = 0);
  // BF16 rounding of x (rows x cols, fp32) into out (bf16 when out_bf16, else
  // the rounded values in fp32) with the bits Quantize gives, counts as Quantize
  // adds them, in one pass that also adds x's column sums to column_sums with
  // ColumnSums' partials and order, hence its bits (dbias without a second read
  // of dy). format must be bf16 (any rounding).
  Status QuantizeBf16WithColumnSums(const float* x, int64_t rows, int64_t cols, const OperandFormat& format,
                                    uint64_t seed, void* out, bool out_bf16, unsigned long long* counts,
                                    float* column_sums);
  // MX quantization of x (rows x cols, fp32) along rows into out with
  // MxQuantizeCuda's bits (fake-quant values, counts), fused with x's column sums
  // added to column_sums with ColumnSums' partials and order (hence its bits):
  // for MxRowsCarryColumnSums formats only (block 32, cols % 32 == 0, nearest
  // rounding), else an error.
  Status QuantizeMxWithColumnSums(const float* x, int64_t rows, int64_t cols, const OperandFormat& format,
                                  void* out, bool out_bf16, unsigned long long* counts, float* column_sums);
  // MX quantization of x (rows x cols, fp32) along rows with `along_rows` into
  // out_rows and down columns with `down_columns` into out_cols, in one read,
  // each with the bits and counts MxQuantizeCuda gives it, fused with x's column
  // sums (when column_sums is not null) with ColumnSums' bits: for
  // MxBothAxesInOnePass shapes and formats only, else an error.
  Status QuantizeMxBothAxesWithColumnSums(const float* x, int64_t rows, int64_t cols, const OperandFormat& along_rows,
                                          const OperandFormat& down_columns, void* out_rows, void* out_cols,
                                          bool out_bf16, unsigned long long* counts_rows,
                                          unsigned long long* counts_cols, float* column_sums);
  // MX quantization of x (rows x cols, fp32) down columns into out with
  // MxQuantizeCuda's bits and counts, by MxBothAxesColumnPartialsKernel's tiles
  // (coalesced 16-byte loads) instead of MxColsKernel: for MxDownColumnsInTiles
  // formats and shapes (block 32, nearest rounding, rows % 32 == 0, cols % 4 ==
  // 0) and 16-byte aligned x, else an error. Quantize routes them here.
  Status QuantizeMxDownColumnsInTiles(const float* x, int64_t rows, int64_t cols, const OperandFormat& format,
                                      void* out, bool out_bf16, unsigned long long* counts);
  // *x itself when 16-byte aligned, else a copy of its `count` floats in align_in_
  // (the quantizers load 16 bytes at a time).
  Status Aligned16Input(const float** x, int64_t count);
  // Both of an MX operand's quantizations in one read (QuantizeMxBothAxesWithColumnSums), profiled
  // as `part`: role along_rows's into *rows_out, down_columns' into *cols_out (bf16 values), with a
  // statistics pair each when q.stats_slot >= 0 (*pair_rows, *pair_cols; else -1); column_sums as
  // PrepareOperand's. x as given (any alignment).
  Status QuantizeBothAxes(const float* x, int64_t rows, int64_t cols, Role along_rows, Role down_columns,
                          const LinearQuant& q, Scratch* rows_out, Scratch* cols_out, float* column_sums,
                          const char* part, int64_t* pair_rows, int64_t* pair_cols);
  // LinearBackward's dy for both of its GEMMs in one read
  // (QuantizeMxBothAxesWithColumnSums): the dgrad's along rows into op_a_, the
  // wgrad's down columns into op_dy_cols_, bf16, with both roles' statistics;
  // column_sums as PrepareOperand's.
  Status PrepareDyBothAxes(const float* dy, int64_t rows, int64_t cols, const LinearQuant& q, Operand* along_rows,
                           Operand* down_columns, float* column_sums);
  // LinearForward's MX x for both of its GEMMs in one read (mx_keep_x): fwd_x along rows into op_a_
  // (*along_rows, its statistics recorded), wgrad_x down columns into k->values, its statistics
  // pair left in k->stats for the backward that takes it (TakeKept). x as given (any alignment).
  Status PrepareXBothAxes(const float* x, int64_t rows, int64_t cols, const LinearQuant& q, Operand* along_rows,
                          KeptOperand* k);
  // The keep_slot entry of kept_x_ for an MX x that LinearForward may quantize both ways
  // (mx_keep_x on, fwd_x and wgrad_x one MX format that MxBothAxesInOnePass allows, both GEMMs
  // in bf16, no Hot-Channel Patch or RHT, x not given in bf16), grown on demand; else null.
  KeptOperand* KeepMxX(const LinearQuant& q, int64_t rows, int64_t cols, bool gemms_bf16);
  // Attention: q, k, v of qkv (and dout when not null) into attn_q_, attn_k_,
  // attn_v_ (attn_o_) per head [b, h, t, d], bf16 or fp32.
  Status AttentionHeads(const float* qkv, const float* dout, int64_t batch, int64_t seq, int64_t heads,
                        int64_t dim, bool bf16);
  // Columns off0, off1, off2 of a row-major (batch * seq) x ld matrix, head by head, into
  // [b, h, t, d] arrays out0, out1, out2 (out1 and out2 may be null), bf16 or fp32.
  Status PackHeads(const float* src, int64_t ld, int64_t off0, int64_t off1, int64_t off2, void* out0, void* out1,
                   void* out2, int64_t batch, int64_t seq, int64_t heads, int64_t dim, bool bf16);
  // The fused kernels' arguments for the bf16 heads AttentionHeads left in
  // attn_q_, attn_k_ and attn_v_, or (kept not null) those AttentionForwardKeep
  // wrote to kept: q, k, v one after the other, each [b, h, t, d].
  FlashArgs FlashHeads(int64_t batch, int64_t seq, int64_t heads, int64_t dim, const void* kept = nullptr);
  // The fused backward into dqkv from the heads FlashHeads(..., kept) names, dout's heads in
  // attn_o_ and D in attn_delta_.
  // With cudnn_attention_bwd on, cuDNN's backward (out packed to bf16 heads for it; a failure
  // turns the experiment off, says why, and Keel's kernels run).
  Status FlashBackwardOf(const void* kept, const float* out, const float* stats, float* dqkv, int64_t batch,
                         int64_t seq, int64_t heads, int64_t dim);
  Status CudnnBackward(const FlashArgs& f, const float* out);
  // The fused forward of f (out and stats): cuDNN's where cudnn_attention is on and it
  // runs (a failure turns the experiment off, says why, and Keel's kernels run), else Keel's.
  Status FusedForward(const FlashArgs& f);
  Status CudnnForward(const FlashArgs& f);
  // A cuDNN experiment (`name`, its switch `on`) that failed: turned off for the backend's
  // life, the reason added to the description and printed once to stderr.
  void CudnnFellBack(const char* name, const Status& why, bool* on);
  // Ok where KeepsAttentionHeads holds, else an error naming `what` and why.
  Status CheckKept(const char* what, int64_t head_dim, bool bf16_operands) const;
  // The GEMM path's P in attn_s_ (and bf16 in attn_p_) from attn_q_ and attn_k_,
  // writing the stats, or with `recompute` reading them.
  Status AttentionProbabilities(float* stats, bool recompute, int64_t batch, int64_t seq, int64_t heads,
                                int64_t dim, bool bf16);
  // Shared by the three reductions: kind 0 sum of squares, 1 sum, 2 dot.
  Status Reduce(int kind, const std::vector<Span>& a, const std::vector<Span>* b,
                std::vector<double>* out);

  int device_ = 0;
  int sm_count_ = 1;
  OpTimer timer_;
  std::string description_;
  cudaStream_t stream_ = nullptr;       // where ops queue now: main_stream_, or side_stream_ in side work
  cudaStream_t main_stream_ = nullptr;
  cudaStream_t side_stream_ = nullptr;  // created on first side work
  cudaEvent_t side_start_ = nullptr, side_done_ = nullptr;
  bool on_side_ = false;       // between BeginSideWork and EndSideWork
  bool side_pending_ = false;  // side work not joined yet
  Blas blas_;
  float* small_ = nullptr;             // kSmallFloats device floats
  // Statistics (see NextStatsPair): the device pairs, what each counts for, and
  // the folded totals, slots x roles.
  struct StatsCall {
    int slot;
    Role role;
    int64_t elements, blocks;
    bool per_tensor;
    int64_t pair;
  };
  unsigned long long* stats_pairs_ = nullptr;  // 2 counters per pair, zero until counted
  int64_t stats_pair_capacity_ = 0;
  int64_t stats_pairs_used_ = 0;
  std::vector<StatsCall> stats_calls_;
  std::vector<OperandStats> host_stats_;
  int stats_slots_ = 0;
  KeptStats kept_dy_;  // the dgrad's bf16 dy that the wgrad reuses
  // The non-finite counts of the producers of bf16 operands
  // (CrossEntropyFusedBf16's dlogits, LayerNormForwardBf16's and
  // GeluForwardBf16's y), one entry per output buffer, the newest write's.
  struct ProducedBf16 {
    const uint16_t* out = nullptr;
    KeptStats stats;
  };
  std::vector<ProducedBf16> produced_;
  // A fresh statistics pair for the producer about to write `out` (*pair: the
  // counters its kernel adds to), recorded as out's entry.
  Status NoteProduced(const uint16_t* out, unsigned long long** pair);
  // The counters of out's entry, for a later chunk of the same output
  // (CrossEntropyFusedBf16 with row0 > 0). When out has no entry, or its pair
  // was folded in between (a wait when every pair was counting), *pair is a
  // scratch pair nothing reads and out's entry goes: its reader then counts the
  // whole tensor itself (RecordBf16Stats).
  Status ContinueProduced(const uint16_t* out, unsigned long long** pair);
  // Statistics for `role` of a bf16 operand given by its producer (rows x cols,
  // rows ld apart): the producer's count when it wrote src, else a counting pass.
  Status RecordBf16Stats(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, int slot, Role role);
  // AddOutlierSums' two passes over x, an fp32 or bf16 reader (nn_cuda_outliers.cu).
  template <typename Reader>
  Status LaunchOutlierSums(Reader x, int64_t rows, int64_t cols, int nvfp4_axis, OutlierSums* sums);
  // Sets ce_shared_limit_ and ce_sm_shared_ and opts the one-read cross-entropy
  // kernels in to the limit.
  Status CeSharedLimit();
  // The columns of each row the fused cross-entropy kernels copy into shared
  // memory (after CeSharedLimit): half the row when two blocks then share an SM,
  // else the whole row when it fits, else 0 (no copy).
  int64_t CeSplit(int64_t vocab, int64_t padded, bool vec) const;
  std::vector<std::unique_ptr<KeptOperand>> kept_x_, kept_w_;  // by keep_slot
  // The weight HoldWeight names and its quantized copies, the forward's
  // (kFwdW, along rows) and the dgrad's (kDgradW, down the columns).
  struct HeldOperand {
    OperandFormat format;
    int64_t rows = 0, cols = 0;
    bool bf16 = false;
    bool valid = false;
    Scratch values;
  };
  const float* held_w_ = nullptr;
  int64_t hold_count_ = 0;  // HoldWeight(w) calls so far: the current hold's number while held_w_ is set
  HeldOperand held_[2];
  // A BF16 w kept for the backward (keep_slot) by an earlier forward of this
  // hold: points *out at it and leaves it kept (the chunks' forwards round w
  // once; each chunk's backward takes it, TakeKept, and leaves it kept too).
  bool ReuseHeldKept(const LinearQuant& q, const float* w, int64_t rows, int64_t cols, Operand* out);
  // PrepareOperand for w in role kFwdW (axis 1) or kDgradW (axis 0): while w is
  // held and its format can be held, the held copy (quantized on first use);
  // else a fresh one in op_b_.
  Status PrepareWeight(const float* w, int64_t rows, int64_t cols, int axis, Role role, const LinearQuant& q,
                       bool bf16, Operand* out);
  // The entry for `slot` (>= 0) in *kept, created (and *kept grown) on demand.
  KeptOperand* KeptEntry(std::vector<std::unique_ptr<KeptOperand>>* kept, int slot);
  // The entry for keep_slot in *kept (grown on demand), or null when the two
  // roles cannot share one rounding (see LinearQuant::keep_slot); an entry
  // that cannot be kept is invalidated.
  KeptOperand* KeepFor(std::vector<std::unique_ptr<KeptOperand>>* kept, const LinearQuant& q, Role forward,
                       Role backward, bool gemms_bf16);
  // When q.keep_slot holds a valid kept rounding of `source` that `backward`
  // may use (and whose statistics can be recorded, if wanted): points *out at
  // it, records the role's statistics from the kept pair, uses the entry up
  // and returns true. Else false, and the caller rounds afresh.
  bool TakeKept(std::vector<std::unique_ptr<KeptOperand>>* kept, const LinearQuant& q, const float* source,
                int64_t rows, int64_t cols, Role backward, Operand* out);
  void* host_pinned_ = nullptr;        // staging for reductions' descriptors and results
  void* many_pinned_ = nullptr;        // DownloadMany's staging
  size_t many_pinned_bytes_ = 0;
  size_t host_pinned_bytes_ = 0;
  // Dynamic shared memory (bytes) CrossEntropyFused's one-read kernel may use, set
  // on its first call: the device's opt-in limit less the kernel's static shared
  // memory; -1 before.
  int64_t ce_shared_limit_ = -1;
  // An SM's shared memory (bytes) and what two of those kernels' blocks take of
  // it besides their rows: static shared memory and the driver's reserve.
  int64_t ce_sm_shared_ = 0, ce_block_overhead_ = 0;

  // Scratch, grown on demand and kept.
  Scratch op_a_, op_b_;                // quantized GEMM operands
  Scratch op_dy_cols_;                 // dy down its columns when both of its roles come from one read
  // Fusions that keep the bits of the kernels they replace, each on unless
  // KEEL_CUDA_OFF (read at Init, a comma-separated list of these names) names it,
  // for A/B timings and the tests that compare the two paths (kCudaFusions):
  // dy_one_pass: LinearBackward quantizes an MX dy for both GEMMs in one read (PrepareDyBothAxes);
  // mx_cols_tiles: Quantize sends MX down columns to QuantizeMxDownColumnsInTiles (else MxColsKernel);
  // ln_backward_fused: LayerNormBackward computes dx and the dgamma / dbeta partials in one kernel;
  // mx_tiles_prefetch: MxBothAxesColumnPartialsKernel (the kernel of the first two) loads a group of rows ahead;
  // held_weight: see HoldWeight; kept_heads: see KeepsAttentionHeads.
  bool dy_one_pass_ = true;
  bool mx_cols_in_tiles_ = true;
  bool ln_backward_fused_ = true;
  bool mx_tiles_prefetch_ = true;
  // held_weight: HoldWeight keeps a weight's quantized copies across the calls that read it.
  bool held_weight_ = true;
  // kept_heads: KeepsAttentionHeads says yes (bf16 operands, head size 32 or 64): the attention's
  // backward reads the heads its forward packed instead of packing qkv again.
  bool kept_heads_ = true;
  // Experiments, each off unless KEEL_CUDA_ON (read at Init, a comma-separated list of these
  // names) names it, for A/B timings:
  // mx_keep_x: LinearForward quantizes an MX x both ways in one read and keeps the wgrad's copy
  // (KeepMxX): the same bits; the backward's "mx down columns in tiles" pass over x goes, for
  // rows x in bf16 values a layer held from the forward to the backward.
  bool mx_keep_x_ = false;
  // flash_one_pass: the fused attention forward walks the keys once (FlashForwardKernel's kOnePass):
  // the same stats, O from P rounded before it is normalized, which nn.h's contract does not allow.
  bool flash_one_pass_ = false;
  // cudnn_attention: the fused attention's forward runs cuDNN's SDPA graph (nn_cuda_cudnn.h)
  // when libcudnn.so.9 loads and an engine takes the shape, else Keel's kernels, with the
  // reason in the description and on stderr (once). O comes back in bf16 and the stats as
  // (lse, 1), which Keel's backward reads as (m, 1 / l): P = exp(s - lse).
  bool cudnn_attention_ = false;
  // cudnn_attention_bwd: the fused attention's backward runs cuDNN's SDPA backward graph
  // (P from the stats as exp(s - lse): the normalized probabilities, as nn.h's contract has
  // them), reading Keel's or cuDNN's forward; dq, dk, dv come back in bf16.
  bool cudnn_attention_bwd_ = false;
  std::unique_ptr<CudnnAttention> cudnn_;
  Scratch codes_;                      // per-tensor FP8 codes, for its statistics
  Scratch partials_;                   // column-sum and reduction partials
  Scratch adam_table_;                 // AdamWTensors' tensor table and per-chunk delta partials
  Scratch quant_temp_;                 // QuantizeDequantize with out == x
  Scratch hcp_partials_, hcp_means_;   // HCP scores: per-chunk sums, per-index means
  Scratch hcp_scores_, hcp_sort_;      // HCP choice: scores, sort keys and cub's temporary
  Scratch hcp_index_;                  // the wgrad's chosen tokens
  Scratch hcp_cols_;                   // the patch columns of both sides, bf16
  Scratch hcp_wide_a_, hcp_wide_b_;    // a folded patch's widened GEMM operands, bf16
  Scratch align_in_;                   // a quantizer input that is not 16-byte aligned
  Scratch attn_q_, attn_k_, attn_v_, attn_o_;  // attention, per head [b, h, t, d] (attn_o_: dO)
  Scratch attn_delta_;                 // attention backward: D = dout . out per row
  Scratch attn_cudnn_o_, attn_cudnn_lse_, cudnn_workspace_;  // cudnn_attention's O (bf16), lse, workspace
  Scratch attn_cudnn_dqkv_;            // cudnn_attention_bwd's dq | dk | dv in bf16 rows
  // The GEMM path of attention (fp32, or a head size the fused kernels lack):
  Scratch attn_s_;                     // scores, then probabilities, fp32 seq x seq per head
  Scratch attn_p_, attn_dp_, attn_ds_; // probabilities in bf16, dP, dS in bf16
  Scratch attn_dq_, attn_dk_, attn_dv_;
  Scratch embed_;                      // embedding backward's sort
  Scratch gla_parts_;                  // GlaBackward: the value tiles' parts of dq and dk, and their intra parts
  Scratch gla_a_;                      // GLA: every chunk's intra-chunk matrix A
  Scratch reduce_desc_;                // the reductions' span descriptors
  Scratch outlier_scratch_;            // AddOutlierSums' partials, tensor amax and block counter
  unsigned int* outlier_counter_ = nullptr;  // the counter last zeroed (a new scratch needs zeroing)
  // Every scratch above but outlier_scratch_: the main stream's, refused to side
  // work (Init) and released with the backend (with outlier_scratch_). One list,
  // so that a new scratch gets both.
  std::vector<Scratch*> MainStreamScratch();
};

}  // namespace nncuda
}  // namespace keel

#endif  // KEEL_KERNELS_NN_CUDA_INTERNAL_H_
