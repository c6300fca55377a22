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
//   - A CPU run needing more slots than any one worker has in all is a gang: its
//     ranks (one per slot) are spread over workers, those with the most free
//     slots first, all or nothing; rank 0 is on the first worker.
//   - A run that does not fit now is skipped and later, smaller runs may still
//     be placed (backfill); it keeps its place at the head of the order. A gang
//     that does not fit stops backfill of CPU runs behind it: free slots then
//     only grow as runs end, so the gang starts once enough have ended, however
//     many small runs are submitted after it (no starvation).
//   - No gang ever holds part of its slots while waiting for the rest (a
//     placement is made whole in one call), so two gangs cannot deadlock.
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
  int32_t total_cpu_slots = 0;     // free or not (a gang is a run no one worker can ever take)
};

// A gang's share on one worker: ranks first_rank .. first_rank + ranks - 1.
struct PlacementPart {
  std::string worker_id;
  int32_t first_rank = 0;
  int32_t ranks = 0;
};

struct Placement {
  std::string run_id;
  std::string worker_id;
  std::vector<int32_t> gpus;  // empty for a CPU run
  int32_t cpu_slots = 0;
  std::vector<PlacementPart> parts;  // a gang: rank 0's part first (worker_id is its); else empty
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
