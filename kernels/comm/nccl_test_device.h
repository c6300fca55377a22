// The two CUDA runtime calls nccl_comm_test.cc needs (it is plain C++ and does
// not see cuda_runtime.h): how many GPUs are visible, and making one the
// calling thread's device before its backend and communicator are made.
#ifndef KEEL_KERNELS_COMM_NCCL_TEST_DEVICE_H_
#define KEEL_KERNELS_COMM_NCCL_TEST_DEVICE_H_

#include "kernels/base/status.h"

namespace keel {

// cudaGetDeviceCount, or 0 when it fails (no driver, no GPU, no CUDA build).
int VisibleGpuCount();
// cudaSetDevice(device) for the calling thread.
Status UseGpu(int device);

}  // namespace keel

#endif  // KEEL_KERNELS_COMM_NCCL_TEST_DEVICE_H_
