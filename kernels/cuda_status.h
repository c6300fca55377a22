// CUDA runtime failures as a Status, for the .cu files of kernels/ (the quantizers
// and the CUDA backend): the failed call, its file and line, and CUDA's name and
// description of the error. Only .cu files include this (it needs cuda_runtime.h).
#ifndef KEEL_KERNELS_CUDA_STATUS_H_
#define KEEL_KERNELS_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>

#include "kernels/base/status.h"

namespace keel {

inline Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  return Status::Error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                       cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

}  // namespace keel

// Evaluates a CUDA runtime call; on failure returns CudaError's Status from the
// enclosing function.
#define KEEL_CUDA_CHECK(call)                                                     \
  do {                                                                            \
    const cudaError_t keel_cuda_error_ = (call);                                  \
    if (keel_cuda_error_ != cudaSuccess)                                          \
      return ::keel::CudaError(keel_cuda_error_, #call, __FILE__, __LINE__);      \
  } while (0)

#endif  // KEEL_KERNELS_CUDA_STATUS_H_
