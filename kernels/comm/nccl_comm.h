// The NCCL communicator: comm.h's collectives between ranks on CUDA device
// memory, queued on the CUDA backend's stream (in order with its kernels), one
// GPU per rank. kernels/comm/README.md ("The NCCL communicator") describes the
// join, the waits and the failures.
//
// Only the CUDA build has it (nccl_comm.cu, linked with libnccl); a build
// without a CUDA toolkit links nccl_comm_stub.cc, whose Create fails with
// kUnimplemented and whose Available() is false.
//
// A NcclCommunicator is used by one thread at a time (the trainer's), the one
// whose current CUDA device is the backend's; it holds no lock.
#ifndef KEEL_KERNELS_COMM_NCCL_COMM_H_
#define KEEL_KERNELS_COMM_NCCL_COMM_H_

#include <memory>
#include <string>

#include "kernels/base/status.h"
#include "kernels/comm/comm.h"

namespace keel {

class NcclCommunicator : public Communicator {
 public:
  // False in a build without CUDA (and so without NCCL): Create would fail.
  static bool Available();

  // Joins the run's `world` ranks as `rank` on the current CUDA device and
  // returns this rank's communicator in *out. `stream` is the backend's
  // cudaStream_t (Backend::NativeStream()); every collective is queued on it,
  // and it must outlive the communicator.
  //   - Bad arguments (rank outside 0 .. world - 1, world < 1, timeout_s <= 0,
  //     a null stream, no bootstrap_path with world > 1): kInvalidArgument
  //     naming the argument; nothing is opened.
  //   - Rank 0 creates an ncclUniqueId and writes it, hex-encoded (256
  //     digits), to bootstrap_path (WriteBootstrapId); the others wait for it
  //     up to timeout_s (WaitBootstrapId: kUnavailable "no bootstrap id from
  //     rank 0 ...") and refuse a file that is not 256 hex digits
  //     (kInvalidArgument naming the path and what it holds, e.g. a TCP
  //     rank's "host:port" left by a CPU run).
  //   - The join itself (ncclCommInitRankConfig, non-blocking) is polled; when
  //     it has not completed timeout_s after it started (a rank that never
  //     joins) the half-made communicator is aborted and Create returns
  //     kUnavailable "nccl comm: rank R: NCCL init did not complete within T s
  //     (world N)".
  // Inside a collective: the work is queued on `stream` after the backend's,
  // and the call returns once the stream has run it (the data is in place, as
  // with TCP), waiting by polling with the timeout, never with a blocking
  // synchronize (nccl_comm.cu says why). A started collective
  // (StartAllReduceSum) runs on the communicator's own stream after an event
  // recorded on `stream` at the start; Wait makes `stream` wait for it and
  // polls its end with the timeout. A wait that runs past timeout_s (a peer
  // stalled or went away), or an error NCCL reports, aborts the communicator
  // and returns kUnavailable "nccl comm: rank R: ..."; every later call is
  // refused with kFailedPrecondition quoting that first failure. A call with
  // bad arguments is refused with kInvalidArgument before anything is queued
  // and leaves the communicator usable.
  static Status Create(int rank, int world, const std::string& bootstrap_path, double timeout_s, void* stream,
                       std::unique_ptr<Communicator>* out);

 protected:
  NcclCommunicator() = default;
};

}  // namespace keel

#endif  // KEEL_KERNELS_COMM_NCCL_COMM_H_
