// The lease keel-worker keeps for each of its trainers: a small file in the run
// directory saying which attempt of the run may train and until when.
//
// Why: keeld hands a run to another worker once the first worker's lease runs
// out (it was paused, cut off, or died). The trainer of the old attempt may
// still be running on that host, where keeld cannot reach it. The worker
// renews the file only while keeld acknowledges its heartbeats, to a deadline
// earlier than keeld's own lease on the worker; a trainer past its deadline
// waits before its next step, and a trainer that sees another attempt's number
// in the file stops at once. So two attempts of a run never train at the same
// time, whatever happens to the worker.
//
// Format (one line): "attempt <N> expires_unix_ms <T>\n".
#ifndef KEEL_WORKER_RUN_RUN_LEASE_H_
#define KEEL_WORKER_RUN_RUN_LEASE_H_

#include <cstdint>
#include <string>

#include "kernels/base/status.h"

namespace keel {

struct RunLease {
  int64_t attempt = 0;
  int64_t expires_unix_ms = 0;
};

// Writes the lease atomically (a reader never sees half a file).
Status WriteRunLease(const std::string& path, const RunLease& lease);
// Reads it; an error names the file and what is wrong with it.
Status ReadRunLease(const std::string& path, RunLease* out);

// Wall-clock milliseconds (the worker and its trainers share a host clock).
int64_t UnixMs();

}  // namespace keel

#endif  // KEEL_WORKER_RUN_RUN_LEASE_H_
