// CUDA MPS for a worker's trainers (keel-worker --mps).
//
// Runs that share a GPU (fractional `resources.gpus`) are separate keel-train
// processes. Without MPS the GPU time-slices between them; with NVIDIA's
// Multi-Process Service their kernels run side by side (issue 14's proxy grids:
// 21 runs a GPU in 193-212 s under MPS against 358 s time-sliced, the same bits).
// StartMps starts one MPS control daemon with its pipe and log directories under
// the worker's work directory and puts them in this process's environment, which
// every trainer the worker starts inherits; StopMps tells that daemon to quit.
// One daemon serves every GPU of the host: one --mps worker a host.
#pragma once

#include <string>

#include "kernels/base/status.h"

namespace keel {

struct MpsDaemon {
  std::string control;   // the nvidia-cuda-mps-control executable (a path, or a name PATH finds)
  std::string pipe_dir;  // CUDA_MPS_PIPE_DIRECTORY
  std::string log_dir;   // CUDA_MPS_LOG_DIRECTORY
  bool started = false;
};

// Makes <work_dir>/mps/pipe and <work_dir>/mps/log, sets CUDA_MPS_PIPE_DIRECTORY
// and CUDA_MPS_LOG_DIRECTORY to them in this process, and runs `control -d` (the
// daemon forks and the command returns). An error names the command and what it
// returned (a control that is not found, or exits non-zero: an MPS daemon already
// running on that pipe directory, a GPU in a compute mode MPS refuses) and
// leaves the environment as it was.
Status StartMps(const std::string& control, const std::string& work_dir, MpsDaemon* out);

// Writes "quit" to `control` (the daemon then stops once its clients have
// exited). Nothing when the daemon was not started.
Status StopMps(MpsDaemon* daemon);

}  // namespace keel
