// NcclCommunicator in a build without a CUDA toolkit (no /usr/local/cuda at
// build time, or KEEL_CUDA=0): there is no NCCL to link, so Create reports it
// and keel-train refuses CUDA ranks up front (Available() is false).
#include "kernels/comm/nccl_comm.h"

namespace keel {

bool NcclCommunicator::Available() { return false; }

Status NcclCommunicator::Create(int, int, const std::string&, double, void*, std::unique_ptr<Communicator>* out) {
  if (out != nullptr) out->reset();
  return Status::Unimplemented("nccl comm: built without NCCL (this build has no CUDA toolkit)");
}

}  // namespace keel
