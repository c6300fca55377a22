// Collectives between the ranks of one run (issue 13: data-parallel training).
// One small interface with two implementations: a TCP communicator on the CPU
// (tcp_comm.h; host memory, any host reachable over TCP, what CI runs) and NCCL
// on CUDA (device memory on the CUDA backend's stream).
//
// Contract shared by every implementation:
//   - Every rank calls the same collectives in the same order with the same
//     counts; a call returns once this rank's part is done and the data is in
//     place (NCCL: queued on the backend's stream, in order with its work, and
//     waited for). StartAllReduceSum is the exception: it returns at once, and
//     Wait says when its data is in place.
//   - Results are deterministic and identical on every rank: the TCP
//     communicator sums in rank order, ((x_0 + x_1) + x_2) + ..., and sends every
//     rank the same bits; NCCL sums in its own order (fixed for a world size and
//     machine) and also gives every rank the same bits.
//   - No call waits forever: a peer that does not connect within the timeout, or
//     goes away (closed socket, exited process) or stalls for longer than the
//     timeout in the middle of a collective, makes the call fail with
//     kUnavailable naming the peer's rank (NCCL, which does not say which peer
//     is late, names the rank that saw it); the communicator is then unusable.
//   - Pointers are the backend's memory (CPU backend: host memory).
#ifndef KEEL_KERNELS_COMM_COMM_H_
#define KEEL_KERNELS_COMM_COMM_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

// The precision gradients travel in (RunConfig's `dist.reduce`).
//   kF32:  sums of fp32 values.
//   kBF16: each rank's contribution is rounded to bf16 (nearest even) first;
//          TCP sums those in fp32 in rank order and rounds the sum to bf16;
//          NCCL sums in bf16 in its own (fixed) order. The result is written
//          back as fp32.
enum class ReducePrecision { kF32, kBF16 };

// A collective started by Communicator::StartAllReduceSum, until Wait takes it.
// 0 is never a handle.
using CommHandle = uint64_t;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "tcp" or "nccl".
  virtual const char* name() const = 0;

  // data (count floats) = the sum over ranks of every rank's data, in place.
  virtual Status AllReduceSum(float* data, int64_t count, ReducePrecision precision) = 0;
  // out (count floats) = the sum over ranks of in[rank() * count, (rank() + 1) * count)
  // (in holds size() * count floats on every rank). in and out do not alias.
  virtual Status ReduceScatterSum(const float* in, float* out, int64_t count, ReducePrecision precision) = 0;
  // out (size() * count floats) = every rank's in (count floats), rank-major.
  // in may be out + rank() * count (in place).
  virtual Status AllGather(const float* in, float* out, int64_t count) = 0;
  // `bytes` bytes of root's data into every rank's data.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;

  // Host values (metrics, decisions, weight hashes): every rank's `mine` (any
  // length) into (*all)[r] on every rank.
  virtual Status AllGatherHost(const std::string& mine, std::vector<std::string>* all) = 0;

  // ---- Asynchronous all-reduce (gradient buckets that overlap the backward) ----
  //
  // StartAllReduceSum begins the sum AllReduceSum(data, count, precision) would
  // compute and returns at once with *handle; the sum is in data only once
  // Wait(*handle) returned Ok, and until then the caller neither reads nor
  // writes data[0, count). Started collectives and the synchronous calls above
  // run in the order this rank called them (a synchronous call runs after every
  // collective started before it), so every rank must start and call the same
  // sequence, as for the synchronous calls alone. The results are the bits the
  // synchronous call would give.
  //   - TCP: a background thread of the communicator runs the started
  //     collectives one after the other; data is host memory.
  //   - NCCL: the collective is queued on the communicator's own stream once
  //     the backend's stream has run the work queued before the start (an
  //     event), so it reads data after the kernels that wrote it and runs
  //     beside the kernels queued after.
  // Bad arguments (negative count, null data) are refused with
  // kInvalidArgument and start nothing; a communicator that failed earlier
  // refuses with kFailedPrecondition (TCP reports that at Wait).
  virtual Status StartAllReduceSum(float* data, int64_t count, ReducePrecision precision, CommHandle* handle) = 0;

  // Waits until the started collective `handle` is done; every handle is
  // waited for once, in any order. *seconds (when not null) = how long the
  // collective itself ran, measured where it ran (TCP: wall time on the
  // communication thread; NCCL: CUDA events on the communication stream
  // around it), so a caller compares it with its own waiting to see how much
  // of it overlapped its work. NCCL: the backend's stream also waits for the
  // collective (kernels queued after Wait see the sum). No wait is unbounded:
  // a peer that never starts the same collective, or goes away, fails it with
  // kUnavailable within the communicator's timeout (TCP: of silence from the
  // peer; NCCL: from the call to Wait), as a synchronous call would, and the
  // communicator is unusable after. A handle that was not started or was
  // already waited for is refused with kInvalidArgument.
  virtual Status Wait(CommHandle handle, double* seconds) = 0;
};

// The rendezvous: rank 0 publishes how to reach it (TCP: "host:port"; NCCL:
// its ncclUniqueId in hex) in a bootstrap file, and every other rank waits for
// that file. The launcher (keel-train --nproc) gives all ranks one path on the
// same host; across hosts keel-worker writes the file keeld relayed from rank
// 0's host. Writes are atomic (a temporary file renamed into place), so a
// reader never sees half an id.
Status WriteBootstrapId(const std::string& path, const std::string& id);
// Waits until `path` exists and holds an id, polling every 20 ms; after
// timeout_s seconds fails with kUnavailable ("no bootstrap id from rank 0 at
// PATH after T s").
Status WaitBootstrapId(const std::string& path, double timeout_s, std::string* id);

// A binary id (NCCL's ncclUniqueId) as the text of a bootstrap file: two
// lowercase hex digits per byte, nothing else.
std::string BootstrapIdToHex(const void* bytes, size_t size);
// The reverse: `text` (read from `path`, named in errors) must be exactly
// 2 * size hex digits (either case); anything else is kInvalidArgument naming
// the path, the length found and the first character that is not a hex digit,
// and leaves *bytes unchanged.
Status BootstrapIdFromHex(const std::string& path, const std::string& text, void* bytes, size_t size);

}  // namespace keel

#endif  // KEEL_KERNELS_COMM_COMM_H_
