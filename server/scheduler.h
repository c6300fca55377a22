// Placement of queued runs onto workers' free GPUs or CPU slots: a pure function
// of the queue and the fleet, so keeld calls it under its lock after every
// change (submit, exit, worker joins or leaves) and tests pin it exactly.
//
// Rules:
//   - Order: higher priority first, then older runs (created_unix_ms), then
//     their position in the sweep (index), then id.
//   - A sweep never has more than max_concurrent runs assigned or running
//     (0: unlimited).
//   - A GPU run (gpus > 0) gets that many GPUs of ONE worker (multi-host comes
//     later), lowest free device indices first, on the worker with the fewest
//     free GPUs that still fit it (best fit keeps whole machines free for big
//     runs). A CPU run takes cpu_slots from the worker with the most free slots.
//   - A run that does not fit now is skipped and later, smaller runs may still
//     be placed (backfill); it keeps its place at the head of the order.
//   - No GPU or CPU slot is handed out twice: capacity shrinks as runs are placed.
#ifndef KEEL_SERVER_SCHEDULER_H_
#define KEEL_SERVER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/keel.pb.h"

namespace keel {

struct WorkerCapacity {
  std::string worker_id;
  std::vector<int32_t> free_gpus;  // device indices
  int32_t free_cpu_slots = 0;
};

struct Placement {
  std::string run_id;
  std::string worker_id;
  std::vector<int32_t> gpus;  // empty for a CPU run
  int32_t cpu_slots = 0;
};

// queued: runs in state QUEUED (others are ignored). active_per_sweep: runs of
// each sweep assigned or running now. max_concurrent: per sweep (missing or 0:
// unlimited).
std::vector<Placement> Schedule(const std::vector<v1::Run>& queued,
                                const std::map<std::string, int>& active_per_sweep,
                                const std::map<std::string, int>& max_concurrent,
                                std::vector<WorkerCapacity> workers);

}  // namespace keel

#endif  // KEEL_SERVER_SCHEDULER_H_
