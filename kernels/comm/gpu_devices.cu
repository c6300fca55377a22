// gpu_devices.h on the CUDA runtime.
#include "kernels/comm/gpu_devices.h"

#include <cuda_runtime.h>

#include "kernels/cuda_status.h"

namespace keel {

int VisibleGpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it
    return 0;
  }
  return count;
}

Status UseGpu(int device) {
  KEEL_CUDA_CHECK(cudaSetDevice(device));
  return Status::Ok();
}

}  // namespace keel
