// The CUDA backend's class (nn_cuda_internal.h) and its simple operations: set-up,
// memory, elementwise ops, RandomNormal, AdamW and the batched reductions. The
// linear layer, the other layers and attention live in nn_cuda_linear.cu,
// nn_cuda_layers.cu and nn_cuda_attention.cu; the cuBLASLt wrapper in
// nn_cuda_gemm.cu.
//
// Elementwise kernels take 16-byte vectors when every pointer allows it (a float4
// path plus a scalar tail), otherwise one float at a time; all are grid-stride.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "kernels/nn_cuda_internal.h"
#include "kernels/philox.h"

namespace keel {
namespace nncuda {

namespace {

int64_t g_grid_cap = 132 * 32;  // set from the device's SM count in Init

// ============================================================================
// Kernels
// ============================================================================

// The elementwise operations, for MapKernel (nn_cuda_internal.h).
struct FillOp {
  float value;
  __device__ float operator()(float, float) const { return value; }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
// y + alpha * x: the product rounded, then the sum (no FMA: -fmad=false), as the
// CPU's y[i] += alpha * x[i].
struct AxpyOp {
  float alpha;
  __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float x, float) const { return x * alpha; }
};

// Box-Muller of nn.h: u1 = 1 - U(2k), u2 = U(2k + 1) with k = offset + i. Both
// uniforms come from one Philox call (indices 2k and 2k + 1 share the group k / 2),
// with PhiloxUniform's exact bits.
__global__ void RandomNormalKernel(float* x, int64_t n, uint64_t seed, uint64_t offset, float stddev) {
  const float kTwoPi = 6.28318530717958647692f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t k = offset + static_cast<uint64_t>(i);
    const uint64_t group = k >> 1;  // (2k) >> 2
    const Philox4 r = Philox4x32(static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), 0u, 0u,
                                 static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const int lane = static_cast<int>((2 * k) & 3);  // 0 or 2
    const float u1 = 1.0f - static_cast<float>(r.v[lane] >> 8) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>(r.v[lane + 1] >> 8) * (1.0f / 16777216.0f);
    const float z = sqrtf(-2.0f * logf(u1)) * cosf(kTwoPi * u2);
    x[i] = stddev * z;
  }
}

struct AdamArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias1, bias2;  // 1 - beta^t
};

// The arguments of step `step` (1-based); the bias corrections in double,
// rounded once (beta2^t loses digits in float).
AdamArgs MakeAdamArgs(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale) {
  AdamArgs a;
  a.lr = lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = eps;
  a.weight_decay = weight_decay;
  a.grad_scale = grad_scale;
  a.bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  a.bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
  return a;
}

// Element i of one tensor, in nn.h's order of operations (AdamWKernel and
// AdamWTensorsKernel, so both give the same bits).
// Returns p before - p after (fp32), the update ratio's element.
__device__ __forceinline__ float AdamWElement(float* __restrict__ param, const float* __restrict__ grad,
                                              float* __restrict__ m, float* __restrict__ v, int64_t i,
                                              float weight_decay, const AdamArgs& a) {
  const float g = grad[i] * a.grad_scale;
  const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * (g * g);
  m[i] = mi;
  v[i] = vi;
  const float m_hat = mi / a.bias1;
  const float v_hat = vi / a.bias2;
  const float p = param[i];
  const float updated = p - a.lr * (m_hat / (sqrtf(v_hat) + a.eps) + weight_decay * p);
  param[i] = updated;
  return p - updated;
}

// One element per thread iteration.
__global__ void AdamWKernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                            float* __restrict__ v, int64_t n, AdamArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    AdamWElement(param, grad, m, v, i, a.weight_decay, a);
  }
}

// AdamWTensors: tensor i covers blocks first_block[i] .. first_block[i + 1] - 1,
// kAdamChunk elements each (the last one shorter).
struct AdamTensorEntry {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t count;
  float weight_decay;
  int64_t first_block;
};
constexpr int64_t kAdamChunk = 4096;

// One block per chunk of one tensor; the tensor found by binary search over the
// first blocks. With partials, partials[block] is the chunk's sum of squared
// deltas in double: each thread's strided elements in order, then a fixed tree.
__global__ void __launch_bounds__(kThreads) AdamWTensorsKernel(const AdamTensorEntry* __restrict__ table,
                                                               int tensors, AdamArgs a, double* partials) {
  const int64_t block = blockIdx.x;
  int lo = 0, hi = tensors - 1;  // the last i with first_block <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_block <= block) lo = mid; else hi = mid - 1;
  }
  const AdamTensorEntry t = table[lo];
  const int64_t begin = (block - t.first_block) * kAdamChunk;
  const int64_t end = min(t.count, begin + kAdamChunk);
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double d = AdamWElement(t.param, t.grad, t.m, t.v, i, t.weight_decay, a);
    if (partials != nullptr) acc += d * d;
  }
  if (partials == nullptr) return;
  __shared__ double sums[kThreads];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[block] = sums[0];
}

// ---- Reductions ----

struct ReduceChunk {
  const float* a;
  const float* b;
  int64_t count;
};

constexpr int kReduceThreads = 256;
constexpr int64_t kReduceChunk = int64_t{1} << 16;  // floats per block

// One block per chunk: each thread sums its strided elements in double, then a
// fixed shared-memory tree; partials[chunk] is the chunk's sum.
__global__ void __launch_bounds__(kReduceThreads) ReduceChunksKernel(const ReduceChunk* __restrict__ chunks,
                                                                     int kind, double* __restrict__ partials) {
  __shared__ double sums[kReduceThreads];
  const ReduceChunk c = chunks[blockIdx.x];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < c.count; i += kReduceThreads) {
    const double x = c.a[i];
    if (kind == 0) acc += x * x;
    else if (kind == 1) acc += x;
    else acc += x * static_cast<double>(c.b[i]);
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

// One thread per span: its chunks' partials in order.
__global__ void ReduceSpansKernel(const double* __restrict__ partials, const int64_t* __restrict__ first, int spans,
                                  double* __restrict__ out) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= spans) return;
  double acc = 0.0;
  for (int64_t c = first[s]; c < first[s + 1]; ++c) acc += partials[c];
  out[s] = acc;
}

Status CheckCount(int64_t count, const char* what) {
  if (count < 0)
    return Status::Error(std::string(what) + ": count: " + std::to_string(count) + " is negative; need >= 0");
  return Status::Ok();
}

// A copy between host and device that is done when this returns (Upload,
// Download); `pointers` names the two pointers in the error for a null one.
Status CopyAndWait(cudaStream_t stream, const char* pointers, void* dst, const void* src, size_t bytes,
                   cudaMemcpyKind kind) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr) return Status::Error(std::string(pointers) + ": null");
  KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

}  // namespace

// ============================================================================
// Shared helpers
// ============================================================================

unsigned int GridFor(int64_t work, int64_t per_block) {
  const int64_t blocks = CeilDiv(work, per_block);
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, g_grid_cap)));
}

Status Scratch::Reserve(size_t bytes, cudaStream_t stream) {
  if (refuse_ != nullptr && *refuse_)
    return Status::Error("this op needs backend scratch memory, which side work (BeginSideWork) may not use");
  if (bytes <= bytes_) return Status::Ok();
  if (ptr_ != nullptr) {
    KEEL_CUDA_CHECK(cudaFreeAsync(ptr_, stream));
    ptr_ = nullptr;
    bytes_ = 0;
  }
  // A quarter more than asked, in whole MiB, so that slowly growing shapes do not
  // reallocate every call.
  const size_t mib = size_t{1} << 20;
  const size_t want = (bytes + bytes / 4 + mib - 1) / mib * mib;
  KEEL_CUDA_CHECK(cudaMallocAsync(&ptr_, want, stream));
  bytes_ = want;
  return Status::Ok();
}

void Scratch::Release(cudaStream_t stream) {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream);
  ptr_ = nullptr;
  bytes_ = 0;
}

// ============================================================================
// Set-up, memory
// ============================================================================

std::vector<Scratch*> CudaBackend::MainStreamScratch() {
  return {&op_a_,          &op_b_,       &op_dy_cols_, &codes_,      &partials_,   &adam_table_, &quant_temp_, &hcp_partials_,
          &hcp_means_,     &hcp_scores_, &hcp_sort_,   &hcp_index_,  &hcp_cols_,   &hcp_wide_a_, &hcp_wide_b_,
          &align_in_,      &attn_q_,     &attn_k_,     &attn_v_,     &attn_o_,     &attn_delta_,
          &attn_s_,        &attn_p_,     &attn_dp_,    &attn_ds_,    &attn_dq_,    &attn_dk_,    &attn_dv_,
          &embed_,         &gla_parts_,  &gla_a_,      &reduce_desc_, &held_[0].values, &held_[1].values,
          &attn_cudnn_o_,  &attn_cudnn_lse_, &cudnn_workspace_, &attn_cudnn_dqkv_};
}

CudaBackend::~CudaBackend() {
  if (side_stream_ != nullptr) cudaStreamSynchronize(side_stream_);
  stream_ = main_stream_;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  ReleaseOutlierAnalytics();  // Free still works here
  outlier_scratch_.Release(stream_);
  for (Scratch* s : MainStreamScratch()) s->Release(stream_);
  for (auto* kept : {&kept_x_, &kept_w_}) {
    for (auto& k : *kept) {
      if (k != nullptr) k->values.Release(stream_);
    }
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  // Hand the pool's cached scratch back to the driver (Init keeps it cached while
  // the backend lives), so that a later backend in this process starts from zero.
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
  if (small_ != nullptr) cudaFree(small_);
  if (stats_pairs_ != nullptr) cudaFree(stats_pairs_);
  if (host_pinned_ != nullptr) cudaFreeHost(host_pinned_);
  if (many_pinned_ != nullptr) cudaFreeHost(many_pinned_);
  if (side_start_ != nullptr) cudaEventDestroy(side_start_);
  if (side_done_ != nullptr) cudaEventDestroy(side_done_);
  if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

namespace {

// Sets each flag that the environment variable `var` (a comma-separated list of
// names) names to `value`, and appends "; VAR=name,..." to *description when it
// named any; an unknown name is an error naming the allowed ones.
Status SetSwitches(const char* var, const std::vector<std::pair<const char*, bool*>>& switches, bool value,
                   std::string* description) {
  const char* env = std::getenv(var);
  if (env == nullptr) return Status::Ok();
  std::string allowed;
  for (const auto& f : switches) allowed += (allowed.empty() ? "" : ", ") + std::string(f.first);
  const std::string list = env;
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, end - start);
    start = end + 1;
    if (name.empty()) continue;
    bool* flag = nullptr;
    for (const auto& f : switches) {
      if (name == f.first) flag = f.second;
    }
    if (flag == nullptr) {
      return Status::Error(std::string("backend: cuda: ") + var + ": unknown '" + name +
                           "' (allowed: a comma-separated list of " + allowed + ")");
    }
    *flag = value;
  }
  std::string named;
  for (const auto& f : switches) {
    if (*f.second == value) named += (named.empty() ? "" : ",") + std::string(f.first);
  }
  if (!named.empty()) *description += std::string("; ") + var + "=" + named;
  return Status::Ok();
}

}  // namespace

Status CudaBackend::Init() {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear it: the caller may fall back to the CPU
    return Status::Error(std::string("backend: cuda: no CUDA GPU visible (") +
                         (probe != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(probe)
                                               : std::string("cudaGetDeviceCount found none")) +
                         ")");
  }
  KEEL_CUDA_CHECK(cudaGetDevice(&device_));
  cudaDeviceProp prop;
  KEEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  sm_count_ = prop.multiProcessorCount;
  g_grid_cap = static_cast<int64_t>(sm_count_) * 32;
  description_ = std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
                 std::to_string(prop.multiProcessorCount) +
                 " SMs; attention: Keel's fused kernels for bf16 operands at head size 32 or 64, else cuBLASLt "
                 "GEMMs";
  KEEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  main_stream_ = stream_;
  // KEEL_CUDA_OFF turns fusions off, KEEL_CUDA_ON experiments on (comma-separated names).
  const std::vector<std::pair<const char*, bool*>> fusions = {{"dy_one_pass", &dy_one_pass_},
                                                              {"mx_cols_tiles", &mx_cols_in_tiles_},
                                                              {"ln_backward_fused", &ln_backward_fused_},
                                                              {"mx_tiles_prefetch", &mx_tiles_prefetch_},
                                                              {"held_weight", &held_weight_},
                                                              {"kept_heads", &kept_heads_}};
  const std::vector<std::pair<const char*, bool*>> experiments = {{"mx_keep_x", &mx_keep_x_},
                                                                  {"flash_one_pass", &flash_one_pass_},
                                                                  {"cudnn_attention", &cudnn_attention_},
                                                                  {"cudnn_attention_bwd", &cudnn_attention_bwd_}};
  // Both named in the backend's description (what train_bench and keel-train print with their figures).
  KEEL_RETURN_IF_ERROR(SetSwitches("KEEL_CUDA_OFF", fusions, false, &description_));
  KEEL_RETURN_IF_ERROR(SetSwitches("KEEL_CUDA_ON", experiments, true, &description_));
  if (cudnn_attention_ || cudnn_attention_bwd_) {
    cudnn_ = std::make_unique<CudnnAttention>();
    const Status loaded = cudnn_->Load();
    const std::string which = cudnn_attention_ && cudnn_attention_bwd_ ? "forward and backward"
                              : cudnn_attention_                      ? "forward"
                                                                      : "backward";
    if (loaded.ok()) {
      description_ += "; attention " + which + ": cuDNN " + cudnn_->Version() + " SDPA where an engine takes the shape";
    } else {
      cudnn_attention_ = cudnn_attention_bwd_ = false;
      description_ += "; cudnn_attention unavailable (" + loaded.message() + "): Keel's kernels";
      std::fprintf(stderr, "keel: KEEL_CUDA_ON cuDNN attention (%s): %s; Keel's attention kernels run\n",
                   which.c_str(), loaded.message().c_str());
    }
  }
  for (Scratch* s : MainStreamScratch()) s->RefuseWhile(&on_side_);
  // Scratch comes from the device's default pool (cudaMallocAsync): keep what it
  // holds instead of returning it to the driver at every synchronisation.
  cudaMemPool_t pool;
  KEEL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
  uint64_t threshold = UINT64_MAX;
  KEEL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  KEEL_RETURN_IF_ERROR(blas_.Init(stream_));
  KEEL_CUDA_CHECK(cudaMalloc(&small_, kSmallFloats * sizeof(float)));
  KEEL_CUDA_CHECK(cudaMemset(small_, 0, kSmallFloats * sizeof(float)));
  // Room for a GPT-2 step's counting quantizations; more fold early (FoldStats).
  stats_pair_capacity_ = 1024;
  KEEL_CUDA_CHECK(cudaMalloc(&stats_pairs_, stats_pair_capacity_ * 2 * sizeof(unsigned long long)));
  KEEL_CUDA_CHECK(cudaMemset(stats_pairs_, 0, stats_pair_capacity_ * 2 * sizeof(unsigned long long)));
  host_pinned_bytes_ = size_t{1} << 20;
  KEEL_CUDA_CHECK(cudaHostAlloc(&host_pinned_, host_pinned_bytes_, cudaHostAllocDefault));
  return Status::Ok();
}

Status CudaBackend::Alloc(size_t bytes, void** ptr) {
  if (ptr == nullptr) return Status::Error("Alloc: ptr: null");
  *ptr = nullptr;
  if (bytes == 0) bytes = 1;
  // cudaMalloc aligns to 256 bytes; the memset is queued so later work sees zeros.
  KEEL_CUDA_CHECK(cudaMalloc(ptr, bytes));
  KEEL_CUDA_CHECK(cudaMemsetAsync(*ptr, 0, bytes, stream_));
  return Status::Ok();
}

void CudaBackend::Free(void* ptr) {
  if (ptr == nullptr) return;
  cudaStreamSynchronize(stream_);  // queued work may still use it
  cudaFree(ptr);
}

Status CudaBackend::Upload(void* dst, const void* host_src, size_t bytes) {
  NN_PROFILE("Upload");
  // The caller may reuse host_src when this returns.
  return CopyAndWait(stream_, "Upload: dst or host_src", dst, host_src, bytes, cudaMemcpyHostToDevice);
}

Status CudaBackend::Download(void* host_dst, const void* src, size_t bytes) {
  NN_PROFILE("Download");
  return CopyAndWait(stream_, "Download: host_dst or src", host_dst, src, bytes, cudaMemcpyDeviceToHost);
}

Status CudaBackend::DownloadMany(const std::vector<DownloadItem>& items) {
  NN_PROFILE("Download");
  size_t total = 0;
  for (const DownloadItem& item : items) {
    if (item.bytes > 0 && (item.host_dst == nullptr || item.src == nullptr))
      return Status::Error("DownloadMany: host_dst or src: null");
    total += (item.bytes + 15) / 16 * 16;
  }
  if (total == 0) return Status::Ok();
  if (total > many_pinned_bytes_) {
    if (many_pinned_ != nullptr) KEEL_CUDA_CHECK(cudaFreeHost(many_pinned_));
    many_pinned_ = nullptr;
    many_pinned_bytes_ = 0;
    KEEL_CUDA_CHECK(cudaHostAlloc(&many_pinned_, total * 2, cudaHostAllocDefault));
    many_pinned_bytes_ = total * 2;
  }
  char* staging = static_cast<char*>(many_pinned_);
  size_t offset = 0;
  for (const DownloadItem& item : items) {
    if (item.bytes == 0) continue;
    KEEL_CUDA_CHECK(cudaMemcpyAsync(staging + offset, item.src, item.bytes, cudaMemcpyDeviceToHost, stream_));
    offset += (item.bytes + 15) / 16 * 16;
  }
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  offset = 0;
  for (const DownloadItem& item : items) {
    if (item.bytes == 0) continue;
    std::memcpy(item.host_dst, staging + offset, item.bytes);
    offset += (item.bytes + 15) / 16 * 16;
  }
  return Status::Ok();
}

Status CudaBackend::CopyBytes(void* dst, const void* src, size_t bytes) {
  NN_PROFILE("CopyBytes");
  if (bytes == 0 || dst == src) return Status::Ok();
  KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  return Status::Ok();
}

Status CudaBackend::BeginSideWork() {
  if (on_side_) return Status::Error("BeginSideWork: already in side work (EndSideWork first)");
  if (side_pending_) return Status::Error("BeginSideWork: the last side work is not joined (JoinSideWork first)");
  if (side_stream_ == nullptr) {
    KEEL_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&side_start_, cudaEventDisableTiming));
    KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
  }
  KEEL_CUDA_CHECK(cudaEventRecord(side_start_, main_stream_));
  KEEL_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, side_start_, 0));
  KEEL_RETURN_IF_ERROR(blas_.UseSide(side_stream_, true));
  stream_ = side_stream_;
  on_side_ = true;
  return Status::Ok();
}

Status CudaBackend::EndSideWork() {
  if (!on_side_) return Status::Error("EndSideWork: not in side work (BeginSideWork first)");
  KEEL_CUDA_CHECK(cudaEventRecord(side_done_, side_stream_));
  KEEL_RETURN_IF_ERROR(blas_.UseSide(side_stream_, false));
  stream_ = main_stream_;
  on_side_ = false;
  side_pending_ = true;
  return Status::Ok();
}

Status CudaBackend::JoinSideWork() {
  if (on_side_) return Status::Error("JoinSideWork: still in side work (EndSideWork first)");
  if (side_pending_) KEEL_CUDA_CHECK(cudaStreamWaitEvent(main_stream_, side_done_, 0));
  side_pending_ = false;
  return Status::Ok();
}

Status CudaBackend::Sync() {
  if (on_side_) return Status::Error("Sync: in side work (EndSideWork first)");
  KEEL_RETURN_IF_ERROR(JoinSideWork());
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  KEEL_CUDA_CHECK(cudaGetLastError());
  timer_.Fold();
  return Status::Ok();
}

// ============================================================================
// Per-op timer
// ============================================================================

OpTimer::~OpTimer() {
  for (const std::vector<Region>* regions : {&open_, &finished_}) {
    for (const Region& r : *regions) {
      if (r.start != nullptr) cudaEventDestroy(r.start);
      if (r.end != nullptr) cudaEventDestroy(r.end);
    }
  }
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpTimer::NewEvent() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreate(&e);
  if (err != cudaSuccess) {
    if (error_.ok()) error_ = Status::Error(std::string("profile: cudaEventCreate: ") + cudaGetErrorString(err));
    return nullptr;
  }
  return e;
}

void OpTimer::Push(const char* name, cudaStream_t stream) {
  Region r;
  r.host_start = std::chrono::steady_clock::now();
  r.name = open_.empty() ? std::string(name) : open_.back().name + " > " + name;
  r.start = NewEvent();
  if (r.start != nullptr) cudaEventRecord(r.start, stream);
  open_.push_back(std::move(r));
}

void OpTimer::Pop(cudaStream_t stream) {
  if (open_.empty()) return;
  Region r = std::move(open_.back());
  open_.pop_back();
  r.end = NewEvent();
  if (r.end != nullptr) cudaEventRecord(r.end, stream);
  r.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r.host_start).count();
  finished_.push_back(std::move(r));
  // A long stretch without Sync: wait here rather than hold thousands of events.
  if (finished_.size() >= 8192 && open_.empty()) {
    cudaStreamSynchronize(stream);
    Fold();
  }
}

void OpTimer::Fold() {
  for (Region& r : finished_) {
    float ms = 0.0f;
    if (r.start != nullptr && r.end != nullptr) {
      const cudaError_t err = cudaEventElapsedTime(&ms, r.start, r.end);
      if (err != cudaSuccess && error_.ok())
        error_ = Status::Error(std::string("profile: cudaEventElapsedTime: ") + cudaGetErrorString(err));
    }
    OpTime& t = totals_[r.name];
    t.op = r.name;
    ++t.calls;
    t.ms += ms;
    t.host_ms += r.host_ms;
    for (cudaEvent_t e : {r.start, r.end}) {
      if (e != nullptr) free_.push_back(e);
    }
  }
  finished_.clear();
}

Status OpTimer::Take(std::vector<OpTime>* out) {
  Fold();
  out->clear();
  for (auto& entry : totals_) out->push_back(entry.second);
  std::sort(out->begin(), out->end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  totals_.clear();
  Status s = error_;
  error_ = Status::Ok();
  return s;
}

bool CudaBackend::DeviceMemoryInUse(int64_t* bytes) const {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error for the next call
    *bytes = 0;
    return false;
  }
  *bytes = static_cast<int64_t>(total_bytes - free_bytes);
  return true;
}

Status CudaBackend::SetProfiling(bool on) {
  KEEL_RETURN_IF_ERROR(Sync());
  timer_.Fold();
  timer_.Enable(on);
  return Status::Ok();
}

Status CudaBackend::TakeProfile(std::vector<OpTime>* out) {
  if (out == nullptr) return Status::Error("TakeProfile: out: null");
  KEEL_RETURN_IF_ERROR(Sync());
  return timer_.Take(out);
}

// ============================================================================
// Elementwise
// ============================================================================

Status CudaBackend::Fill(float* x, int64_t count, float value) {
  NN_PROFILE("Fill");
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Fill"));
  if (count == 0) return Status::Ok();
  return LaunchMap<0>(x, nullptr, nullptr, count, FillOp{value}, stream_);
}

Status CudaBackend::Add(const float* a, const float* b, float* out, int64_t count) {
  NN_PROFILE("Add");
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Add"));
  if (count == 0) return Status::Ok();
  return LaunchMap<2>(out, a, b, count, AddOp{}, stream_);  // out may alias a or b
}

Status CudaBackend::Axpy(float alpha, const float* x, float* y, int64_t count) {
  NN_PROFILE("Axpy");
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Axpy"));
  if (count == 0) return Status::Ok();
  return LaunchMap<2>(y, y, x, count, AxpyOp{alpha}, stream_);
}

Status CudaBackend::Scale(float* x, int64_t count, float alpha) {
  NN_PROFILE("Scale");
  KEEL_RETURN_IF_ERROR(CheckCount(count, "Scale"));
  if (count == 0) return Status::Ok();
  return LaunchMap<1>(x, x, nullptr, count, ScaleOp{alpha}, stream_);
}

Status CudaBackend::Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                           int64_t cols) {
  NN_PROFILE("Copy2D");
  if (rows < 0 || cols < 0 || src_ld < cols || dst_ld < cols)
    return Status::Error("Copy2D: shape: rows " + std::to_string(rows) + ", cols " + std::to_string(cols) +
                         ", src_ld " + std::to_string(src_ld) + ", dst_ld " + std::to_string(dst_ld) +
                         " is not allowed; need rows, cols >= 0 and both ld >= cols");
  if (rows == 0 || cols == 0) return Status::Ok();
  KEEL_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_ld * sizeof(float), src, src_ld * sizeof(float), cols * sizeof(float),
                                   rows, cudaMemcpyDeviceToDevice, stream_));
  return Status::Ok();
}

Status CudaBackend::RandomNormal(float* x, int64_t count, uint64_t seed, uint64_t offset, float stddev) {
  NN_PROFILE("RandomNormal");
  KEEL_RETURN_IF_ERROR(CheckCount(count, "RandomNormal"));
  if (count == 0) return Status::Ok();
  RandomNormalKernel<<<GridFor(count), kThreads, 0, stream_>>>(x, count, seed, offset, stddev);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

// ============================================================================
// Optimizer
// ============================================================================

Status CudaBackend::AdamW(float* param, const float* grad, float* m, float* v, int64_t count, float lr,
                          float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale) {
  NN_PROFILE("AdamW");
  KEEL_RETURN_IF_ERROR(CheckCount(count, "AdamW"));
  if (step < 1) return Status::Error("AdamW: step: " + std::to_string(step) + " is not allowed; need >= 1 (1-based)");
  if (count == 0) return Status::Ok();
  const AdamArgs a = MakeAdamArgs(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  AdamWKernel<<<GridFor(count), kThreads, 0, stream_>>>(param, grad, m, v, count, a);
  NN_LAUNCH_CHECK();
  return Status::Ok();
}

Status CudaBackend::AdamWTensors(const std::vector<AdamWTensor>& tensors, float lr, float beta1, float beta2,
                                 float eps, int step, float grad_scale, std::vector<double>* delta_squares) {
  NN_PROFILE("AdamW");
  if (step < 1) return Status::Error("AdamW: step: " + std::to_string(step) + " is not allowed; need >= 1 (1-based)");
  std::vector<AdamTensorEntry> table;
  std::vector<int> entry_of(tensors.size(), -1);  // the table row of tensor i (-1: empty)
  int64_t blocks = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    KEEL_RETURN_IF_ERROR(CheckCount(t.count, "AdamW"));
    if (t.count == 0) continue;
    if (t.param == nullptr || t.grad == nullptr || t.m == nullptr || t.v == nullptr)
      return Status::Error("AdamW: tensor " + std::to_string(i) + ": param, grad, m or v: null");
    entry_of[i] = static_cast<int>(table.size());
    table.push_back(AdamTensorEntry{t.param, t.grad, t.m, t.v, t.count, t.weight_decay, blocks});
    blocks += CeilDiv(t.count, kAdamChunk);
  }
  if (delta_squares != nullptr) delta_squares->assign(tensors.size(), 0.0);
  if (table.empty()) return Status::Ok();
  if (blocks > (int64_t{1} << 31) - 1) return Status::Error("AdamW: " + std::to_string(blocks) + " chunks: too many");
  // weight_decay is per tensor (the table's).
  const AdamArgs a = MakeAdamArgs(lr, beta1, beta2, eps, 0.0f, step, grad_scale);
  // Scratch: the table | the chunks' partials (with delta_squares).
  const size_t bytes = table.size() * sizeof(AdamTensorEntry);
  const size_t partial_offset = (bytes + 15) / 16 * 16;
  const size_t partial_bytes = delta_squares != nullptr ? static_cast<size_t>(blocks) * sizeof(double) : 0;
  KEEL_RETURN_IF_ERROR(adam_table_.Reserve(partial_offset + partial_bytes, stream_));
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so
  // `table` may go out of scope.
  KEEL_CUDA_CHECK(cudaMemcpyAsync(adam_table_.get<void>(), table.data(), bytes, cudaMemcpyHostToDevice, stream_));
  double* partials = delta_squares != nullptr ? reinterpret_cast<double*>(adam_table_.get<char>() + partial_offset)
                                              : nullptr;
  AdamWTensorsKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream_>>>(
      adam_table_.get<AdamTensorEntry>(), static_cast<int>(table.size()), a, partials);
  NN_LAUNCH_CHECK();
  if (delta_squares == nullptr) return Status::Ok();
  // Each tensor's chunks in order, on the host.
  std::vector<double> host(static_cast<size_t>(blocks));
  KEEL_RETURN_IF_ERROR(Download(host.data(), partials, partial_bytes));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (entry_of[i] < 0) continue;
    const AdamTensorEntry& e = table[static_cast<size_t>(entry_of[i])];
    double sum = 0.0;
    for (int64_t c = 0; c < CeilDiv(e.count, kAdamChunk); ++c) sum += host[static_cast<size_t>(e.first_block + c)];
    (*delta_squares)[i] = sum;
  }
  return Status::Ok();
}

// ============================================================================
// Reductions
// ============================================================================

Status CudaBackend::Reduce(int kind, const std::vector<Span>& a, const std::vector<Span>* b,
                           std::vector<double>* out) {
  const char* what = kind == 0 ? "SumSquares" : kind == 1 ? "Sums" : "Dots";
  if (out == nullptr) return Status::Error(std::string(what) + ": out: null");
  if (b != nullptr && b->size() != a.size())
    return Status::Error(std::string(what) + ": a has " + std::to_string(a.size()) + " spans and b " +
                         std::to_string(b->size()) + "; need the same count");
  const int spans = static_cast<int>(a.size());
  out->assign(a.size(), 0.0);
  if (spans == 0) return Status::Ok();
  std::vector<ReduceChunk> chunks;
  std::vector<int64_t> first(a.size() + 1, 0);
  for (int s = 0; s < spans; ++s) {
    first[s] = static_cast<int64_t>(chunks.size());
    const int64_t n = a[s].count;
    if (n < 0 || (n > 0 && a[s].data == nullptr))
      return Status::Error(std::string(what) + ": span " + std::to_string(s) + ": count " + std::to_string(n) +
                           " with data " + (a[s].data ? "set" : "null") + "; need count >= 0 and data");
    if (b != nullptr && ((*b)[s].count != n || (n > 0 && (*b)[s].data == nullptr)))
      return Status::Error(std::string(what) + ": span " + std::to_string(s) + ": b has " +
                           std::to_string((*b)[s].count) + " floats, a " + std::to_string(n) + "; need equal");
    for (int64_t off = 0; off < n; off += kReduceChunk) {
      chunks.push_back(ReduceChunk{a[s].data + off, b != nullptr ? (*b)[s].data + off : nullptr,
                                   std::min(kReduceChunk, n - off)});
    }
  }
  first[spans] = static_cast<int64_t>(chunks.size());
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  const size_t chunk_bytes = chunks.size() * sizeof(ReduceChunk);
  const size_t first_bytes = first.size() * sizeof(int64_t);
  const size_t result_bytes = a.size() * sizeof(double);
  const size_t desc_bytes = chunk_bytes + first_bytes;
  // Device layout: chunks | first | partials (nchunks doubles) | results.
  const size_t partial_offset = (desc_bytes + 15) / 16 * 16;
  const size_t result_offset = partial_offset + static_cast<size_t>(nchunks) * sizeof(double);
  KEEL_RETURN_IF_ERROR(reduce_desc_.Reserve(result_offset + result_bytes + 16, stream_));
  const size_t host_need = std::max(desc_bytes, result_bytes);
  if (host_need > host_pinned_bytes_) {
    KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    KEEL_CUDA_CHECK(cudaFreeHost(host_pinned_));
    host_pinned_ = nullptr;
    host_pinned_bytes_ = host_need * 2;
    KEEL_CUDA_CHECK(cudaHostAlloc(&host_pinned_, host_pinned_bytes_, cudaHostAllocDefault));
  }
  // The pinned buffer is free: every earlier use ended with a synchronisation.
  char* host = static_cast<char*>(host_pinned_);
  if (chunk_bytes > 0) std::memcpy(host, chunks.data(), chunk_bytes);
  std::memcpy(host + chunk_bytes, first.data(), first_bytes);
  char* dev = reduce_desc_.get<char>();
  KEEL_CUDA_CHECK(cudaMemcpyAsync(dev, host, desc_bytes, cudaMemcpyHostToDevice, stream_));
  double* partials = reinterpret_cast<double*>(dev + partial_offset);
  double* results = reinterpret_cast<double*>(dev + result_offset);
  if (nchunks > 0) {
    ReduceChunksKernel<<<static_cast<unsigned int>(nchunks), kReduceThreads, 0, stream_>>>(
        reinterpret_cast<const ReduceChunk*>(dev), kind, partials);
    NN_LAUNCH_CHECK();
  }
  ReduceSpansKernel<<<static_cast<unsigned int>(CeilDiv(spans, 128)), 128, 0, stream_>>>(
      partials, reinterpret_cast<const int64_t*>(dev + chunk_bytes), spans, results);
  NN_LAUNCH_CHECK();
  KEEL_CUDA_CHECK(cudaMemcpyAsync(host, results, result_bytes, cudaMemcpyDeviceToHost, stream_));
  KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(out->data(), host, result_bytes);
  return Status::Ok();
}

Status CudaBackend::SumSquares(const std::vector<Span>& spans, std::vector<double>* out) {
  NN_PROFILE("SumSquares");
  return Reduce(0, spans, nullptr, out);
}

Status CudaBackend::Sums(const std::vector<Span>& spans, std::vector<double>* out) {
  NN_PROFILE("Sums");
  return Reduce(1, spans, nullptr, out);
}

Status CudaBackend::Dots(const std::vector<Span>& a, const std::vector<Span>& b, std::vector<double>* out) {
  NN_PROFILE("Dots");
  return Reduce(2, a, &b, out);
}

}  // namespace nncuda

Status MakeCudaBackend(std::unique_ptr<Backend>* out) {
  if (out == nullptr) return Status::Error("MakeCudaBackend: out: null");
  auto backend = std::make_unique<nncuda::CudaBackend>();
  KEEL_RETURN_IF_ERROR(backend->Init());
  *out = std::move(backend);
  return Status::Ok();
}

}  // namespace keel
