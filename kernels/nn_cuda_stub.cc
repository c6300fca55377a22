// MakeCudaBackend in a build without a CUDA toolkit (no /usr/local/cuda at build
// time, or KEEL_CUDA=0): it reports that, so the caller can use the CPU backend or
// tell the user.
#include "kernels/nn.h"

namespace keel {

Status MakeCudaBackend(std::unique_ptr<Backend>* out) {
  if (out != nullptr) out->reset();
  return Status::Error("backend: cuda: this build has no CUDA (built without a CUDA toolkit)");
}

}  // namespace keel
