// The TCP communicator: comm.h's collectives between ranks on host memory,
// over plain sockets (any host reachable over TCP; loopback for one machine and
// for CI). The topology is a star through rank 0: every other rank holds one
// connection to rank 0, which sums, in rank order, and sends the result back.
// kernels/comm/README.md describes the protocol, the timeouts and the failures.
//
// A TcpComm is used by one thread at a time (the trainer's). Collectives
// started with StartAllReduceSum run on a thread of the communicator's own,
// one after the other; a synchronous call first waits for them, so the order
// on the wire is the order of the calls.
#ifndef KEEL_KERNELS_COMM_TCP_COMM_H_
#define KEEL_KERNELS_COMM_TCP_COMM_H_

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/base/status.h"
#include "kernels/comm/comm.h"

namespace keel {

struct TcpCommOptions {
  int rank = 0, size = 1;
  std::string bootstrap_path;      // the bootstrap file (comm.h); required when size > 1
  std::string host = "127.0.0.1";  // rank 0 listens here (port chosen by the OS); "0.0.0.0", "::": every interface
  // The host rank 0 publishes in the bootstrap file ("advertise:port"): the
  // address the other ranks connect to. "": `host`, or this machine's name
  // (gethostname) when `host` is a wildcard. A wildcard here is refused.
  std::string advertise;
  double timeout_s = 60;           // joining, and any one wait for a peer inside a collective
};

// Reductions and gathers travel in chunks of this many bytes of fp32 values
// (bf16 values: half as many bytes), so the extra memory of a collective stays
// a few chunks whatever the buffer's size.
constexpr size_t kTcpCommChunkBytes = size_t{1} << 20;

// Joins the run's ranks and returns this rank's communicator in *out.
//   - Bad options: kInvalidArgument naming the field (nothing is opened).
//   - size == 1: no sockets; the collectives are local copies (kBF16 still
//     rounds, so one rank computes what N ranks would).
//   - Rank 0 listens on options.host (port 0: the OS picks), writes
//     "advertise:port" to bootstrap_path and waits up to timeout_s for the other
//     ranks; the others wait for that file, connect (retrying while rank 0 is
//     not listening yet) and introduce themselves. A rank missing after
//     timeout_s makes every rank's MakeTcpComm fail (kUnavailable, naming the
//     missing ranks); a peer that claims a wrong run size or a rank already
//     taken or out of range fails the join for all (kInvalidArgument).
// Any failure inside a collective, started or synchronous (a peer closed,
// stalled longer than timeout_s, or sent what the protocol does not allow)
// returns kUnavailable "tcp comm: rank R: ..." (or kInternal for a protocol
// mismatch; a started one's at its Wait), closes every connection, so the
// other ranks fail promptly too, and leaves the communicator refusing further
// calls (kFailedPrecondition). Destroying the communicator ends a started
// collective in progress at once (its connections are shut down) and fails
// the ones still queued unrun.
Status MakeTcpComm(const TcpCommOptions& options, std::unique_ptr<Communicator>* out);

}  // namespace keel

#endif  // KEEL_KERNELS_COMM_TCP_COMM_H_
