// The backend factory of nn.h.
#include "kernels/nn.h"

namespace keel {

Status MakeBackend(const std::string& name, int threads, std::unique_ptr<Backend>* out) {
  if (name == "cpu") return MakeCpuBackend(threads, out);
  if (name == "cuda") return MakeCudaBackend(out);
  return Status::Error("backend: unknown value '" + name + "' (allowed: cpu, cuda)");
}

}  // namespace keel
