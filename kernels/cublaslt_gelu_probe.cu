// CublasLtGeluEpilogue: one fp32 GEMM, D (n x 1) = GELU(A (n x 1) . B (1 x 1)) with
// B = 1, through cuBLASLt with CUBLASLT_EPILOGUE_GELU, on its own handle and stream.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cublaslt_gelu_probe.h"

namespace keel {

namespace {

Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Error(std::string("CublasLtGeluEpilogue: ") + what + ": " + cudaGetErrorString(e));
}

Status Lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Error(std::string("CublasLtGeluEpilogue: ") + what + ": " + cublasLtGetStatusName(s));
}

// The handles and buffers of one probe, released however it ends.
struct Probe {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  float *x = nullptr, *one = nullptr, *y = nullptr;
  void* workspace = nullptr;
  ~Probe() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (handle != nullptr) cublasLtDestroy(handle);
    cudaFree(x);
    cudaFree(one);
    cudaFree(y);
    cudaFree(workspace);
  }
};

}  // namespace

Status CublasLtGeluEpilogue(const std::vector<float>& x, std::vector<float>* y) {
  const int64_t n = static_cast<int64_t>(x.size());
  if (n <= 0 || n % 4 != 0) {
    return Status::Error("CublasLtGeluEpilogue: x: " + std::to_string(n) +
                         " values is not allowed (allowed: a positive multiple of 4)");
  }
  Probe p;
  const size_t workspace_bytes = size_t{4} << 20;
  KEEL_RETURN_IF_ERROR(Cuda(cudaMalloc(&p.x, n * sizeof(float)), "cudaMalloc"));
  KEEL_RETURN_IF_ERROR(Cuda(cudaMalloc(&p.y, n * sizeof(float)), "cudaMalloc"));
  KEEL_RETURN_IF_ERROR(Cuda(cudaMalloc(&p.one, 4 * sizeof(float)), "cudaMalloc"));
  KEEL_RETURN_IF_ERROR(Cuda(cudaMalloc(&p.workspace, workspace_bytes), "cudaMalloc"));
  const float one[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  KEEL_RETURN_IF_ERROR(Cuda(cudaMemcpy(p.x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy"));
  KEEL_RETURN_IF_ERROR(Cuda(cudaMemcpy(p.one, one, sizeof(one), cudaMemcpyHostToDevice), "cudaMemcpy"));
  KEEL_RETURN_IF_ERROR(Lt(cublasLtCreate(&p.handle), "cublasLtCreate"));
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_GELU;
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                         sizeof(epilogue)),
                          "epilogue GELU"));
  // Column-major: A is n x 1 (ld n), B 1 x 1 (ld 4, for alignment), D n x 1 (ld n).
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, n, 1, n), "layout A"));
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, 1, 1, 4), "layout B"));
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, n, 1, n), "layout D"));
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatmulPreferenceCreate(&p.pref), "PreferenceCreate"));
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &workspace_bytes, sizeof(workspace_bytes)),
                          "preference"));
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatmulAlgoGetHeuristic(p.handle, p.desc, p.a, p.b, p.d, p.d, p.pref, 1, &result,
                                                         &returned),
                          "AlgoGetHeuristic"));
  if (returned == 0) return Status::Error("CublasLtGeluEpilogue: cuBLASLt offers no fp32 GEMM with a GELU epilogue");
  const float alpha = 1.0f, beta = 0.0f;
  KEEL_RETURN_IF_ERROR(Lt(cublasLtMatmul(p.handle, p.desc, &alpha, p.x, p.a, p.one, p.b, &beta, p.y, p.d, p.y, p.d,
                                         &result.algo, p.workspace, workspace_bytes, nullptr),
                          "cublasLtMatmul"));
  y->assign(static_cast<size_t>(n), 0.0f);
  return Cuda(cudaMemcpy(y->data(), p.y, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace keel
