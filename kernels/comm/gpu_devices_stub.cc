// gpu_devices.h in a build without CUDA: no GPU is ever visible.
#include "kernels/comm/gpu_devices.h"

namespace keel {

int VisibleGpuCount() { return 0; }

Status UseGpu(int device) {
  return Status::Unimplemented("UseGpu(" + std::to_string(device) + "): built without CUDA");
}

}  // namespace keel
