// Two CUDA runtime calls for plain C++ code that does not see cuda_runtime.h:
// how many GPUs are visible (keel-train --nproc auto, nccl_comm_test), and making
// one the calling thread's device before its backend and communicator are made.
#ifndef KEEL_KERNELS_COMM_GPU_DEVICES_H_
#define KEEL_KERNELS_COMM_GPU_DEVICES_H_

#include "kernels/base/status.h"

namespace keel {

// cudaGetDeviceCount (CUDA_VISIBLE_DEVICES applies), or 0 when it fails (no driver, no GPU, no CUDA build).
int VisibleGpuCount();
// cudaSetDevice(device) for the calling thread.
Status UseGpu(int device);

}  // namespace keel

#endif  // KEEL_KERNELS_COMM_GPU_DEVICES_H_
