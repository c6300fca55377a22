// cuBLASLt GEMMs of the CUDA backend (Blas in nn_cuda_internal.h): BF16 x BF16 or
// FP32 x FP32 operands, FP32 output, CUBLAS_COMPUTE_32F (FP32 accumulation; for
// fp32 operands no TF32, so the fp32 scheme agrees with the CPU reference to fp32
// summation order), alpha and beta as device floats, optional bias epilogue,
// strided batches. Plans (descriptors plus the heuristic's algorithm) are cached
// per shape: the same shape always runs the same algorithm, which keeps results
// bit-reproducible from run to run.
#include <algorithm>
#include <cstdio>

#include "kernels/nn_cuda_internal.h"

namespace keel {
namespace nncuda {

namespace {

// The largest power of two up to 256 dividing the address and the batch stride
// (in bytes): what the algorithm may assume of every batch's pointer.
int AlignmentOf(const void* p, int64_t stride_bytes, int64_t batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(stride_bytes);
  return static_cast<int>(bits & (~bits + 1));
}

const char* OpName(bool trans) { return trans ? "T" : "N"; }

}  // namespace

Status CublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  return Status::Error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                       " failed: cuBLAS status " + std::to_string(static_cast<int>(status)) + " (" +
                       cublasLtGetStatusName(status) + ": " + cublasLtGetStatusString(status) + ")");
}

Blas::~Blas() {
  for (auto& entry : plans_) {
    Plan& p = entry.second;
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (main_workspace_ != nullptr) cudaFree(main_workspace_);
  if (side_workspace_ != nullptr) cudaFree(side_workspace_);
  if (constants_ != nullptr) cudaFree(constants_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status Blas::Init(cudaStream_t stream) {
  stream_ = stream;
  NN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  // 64 MiB: what cuBLASLt's Hopper kernels ask for at most (split-K and stream-K
  // partials), allocated once.
  workspace_bytes_ = size_t{64} << 20;
  KEEL_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  main_stream_ = stream;
  main_workspace_ = workspace_;
  KEEL_CUDA_CHECK(cudaMalloc(&constants_, 2 * sizeof(float)));
  const float constants[2] = {0.0f, 1.0f};
  KEEL_CUDA_CHECK(cudaMemcpy(constants_, constants, sizeof(constants), cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status Blas::MakePlan(const GemmArgs& g, int alignment, Plan* plan) {
  const cudaDataType_t ab_type = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  NN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_DEVICE;
  NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode,
                                                 sizeof(pointer_mode)));
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                   sizeof(epilogue)));
    NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
    NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                   sizeof(g.bias)));
  }
  auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride) -> Status {
    NN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
    if (g.batch > 1) {
      const int32_t batch = static_cast<int32_t>(g.batch);
      NN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      NN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                       sizeof(stride)));
    }
    return Status::Ok();
  };
  KEEL_RETURN_IF_ERROR(layout(&plan->a, ab_type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a));
  KEEL_RETURN_IF_ERROR(layout(&plan->b, ab_type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b));
  KEEL_RETURN_IF_ERROR(layout(&plan->c, CUDA_R_32F, g.m, g.n, g.ldc, g.stride_c));

  cublasLtMatmulPreference_t pref = nullptr;
  NN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint32_t align_a = alignment & 511, align_b = (alignment >> 9) & 511, align_c = (alignment >> 18) & 511;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes_, sizeof(workspace_bytes_));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                        &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  NN_CUBLAS_CHECK(st);
  if (returned == 0) {
    char what[256];
    std::snprintf(what, sizeof(what), "%s GEMM %s%s m=%lld n=%lld k=%lld batch=%lld", g.bf16 ? "bf16" : "fp32",
                  OpName(g.trans_a), OpName(g.trans_b), static_cast<long long>(g.m), static_cast<long long>(g.n),
                  static_cast<long long>(g.k), static_cast<long long>(g.batch));
    return Status::Error(std::string("cuBLASLt has no algorithm for ") + what);
  }
  plan->algo = result.algo;
  return Status::Ok();
}

Status Blas::UseSide(cudaStream_t side, bool on) {
  if (on && side_workspace_ == nullptr) KEEL_CUDA_CHECK(cudaMalloc(&side_workspace_, workspace_bytes_));
  stream_ = on ? side : main_stream_;
  workspace_ = on ? side_workspace_ : main_workspace_;
  return Status::Ok();
}

Status Blas::Gemm(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0) return Status::Ok();
  const float* c_in = g.accumulate && g.c_in != nullptr ? g.c_in : g.c;
  if (g.k <= 0) {  // an empty sum: C = beta * C
    for (int64_t i = 0; i < g.batch; ++i) {
      float* d = g.c + i * g.stride_c;
      const size_t pitch = g.ldc * sizeof(float);
      if (!g.accumulate) {
        KEEL_CUDA_CHECK(cudaMemset2DAsync(d, pitch, 0, g.m * sizeof(float), g.n, stream_));
      } else if (c_in != g.c) {
        KEEL_CUDA_CHECK(cudaMemcpy2DAsync(d, pitch, c_in + i * g.stride_c, pitch, g.m * sizeof(float), g.n,
                                          cudaMemcpyDeviceToDevice, stream_));
      }
    }
    return Status::Ok();
  }
  const int elem = g.bf16 ? 2 : 4;
  // C and D share one layout and one alignment preference: the smaller of the two.
  const int alignment = AlignmentOf(g.a, g.stride_a * elem, g.batch) |
                        (AlignmentOf(g.b, g.stride_b * elem, g.batch) << 9) |
                        (std::min(AlignmentOf(g.c, g.stride_c * 4, g.batch), AlignmentOf(c_in, g.stride_c * 4, g.batch))
                         << 18);
  const Key key(g.bf16, g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.stride_a, g.stride_b,
                g.stride_c, g.batch, g.bias != nullptr, alignment);
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    Plan plan;
    const Status s = MakePlan(g, alignment, &plan);
    if (!s.ok()) {
      if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
      if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
      if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
      if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
      return s;
    }
    found = plans_.emplace(key, plan).first;
  }
  Plan& plan = found->second;
  if (g.bias != nullptr) {
    NN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                   sizeof(g.bias)));
  }
  const float* beta = constants_ + (g.accumulate ? 1 : 0);
  NN_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, g.alpha, g.a, plan.a, g.b, plan.b, beta, c_in, plan.c, g.c,
                                 plan.c, &plan.algo, workspace_, workspace_bytes_, stream_));
  return Status::Ok();
}

}  // namespace nncuda
}  // namespace keel
