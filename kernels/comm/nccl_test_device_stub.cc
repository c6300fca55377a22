// nccl_test_device.h in a build without CUDA: no GPU is ever visible.
#include "kernels/comm/nccl_test_device.h"

namespace keel {

int VisibleGpuCount() { return 0; }

Status UseGpu(int device) {
  return Status::Unimplemented("UseGpu(" + std::to_string(device) + "): built without CUDA");
}

}  // namespace keel
