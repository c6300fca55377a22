// What cuBLASLt's GELU epilogue computes (issue 12's "GELU in the cuBLASLt
// epilogue" item): Keel's models use the exact GELU, x * Phi(x) with the error
// function (docs/numerics.md); an epilogue that computes the tanh approximation
// would change the model, not only its speed. nn_cuda_test asks the library.
#pragma once

#include <vector>

#include "kernels/base/status.h"

namespace keel {

// *y = GELU(x) elementwise as cuBLASLt's CUBLASLT_EPILOGUE_GELU applies it to an
// fp32 GEMM's output (D = GELU(A B) with A the column x and B = 1), on GPU 0 of
// this process. x.size() must be a positive multiple of 4. Without a CUDA
// toolkit in the build, an error saying so.
Status CublasLtGeluEpilogue(const std::vector<float>& x, std::vector<float>* y);

}  // namespace keel
