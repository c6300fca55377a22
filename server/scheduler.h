// Placement of queued runs onto workers' free GPUs or CPU slots: a pure function
// of the queue and the fleet, so keeld calls it under its lock after every
// change (submit, exit, worker joins or leaves) and tests pin it exactly.
//
// Rules:
//   - Order: higher priority first, then older runs (created_unix_ms), then
//     their position in the sweep (index), then id.
//   - A sweep never has more than max_concurrent runs assigned or running
//     (0: unlimited).
//   - A GPU run is one rank per GPU. A run with gpus N that some worker has N
//     GPUs for in all (free or not) gets N GPUs of ONE worker, lowest free
//     device indices first, on the worker with the fewest free GPUs that still
//     fit it (best fit keeps whole machines free for big runs); so does
//     {hosts: 1, gpus_per_host: N}. A CPU run takes cpu_slots from the worker
//     with the most free slots.
//   - GPU gangs. A run with gpus N more than any one worker has in all is
//     spread over workers: those with the most free GPUs first, each taken
//     whole (fewest parts), the last part from the worker with the fewest free
//     GPUs that still cover the rest (best fit). A run with {hosts: H,
//     gpus_per_host: G}, H > 1, gets exactly H workers with G free GPUs each,
//     best fit (fewest free first). Rank 0 is on the first part; each part's
//     ranks get its GPUs in order.
//   - A CPU run needing more slots than any one worker has in all is a CPU
//     gang: its ranks (one per slot) are spread over workers, those with the
//     most free slots first; rank 0 is on the first worker.
//   - All or nothing: a gang is placed whole in one call or not at all, so no
//     gang ever holds part of its GPUs or slots while waiting for the rest,
//     and two gangs cannot deadlock holding halves.
//   - A run that does not fit now is skipped and later, smaller runs may still
//     be placed (backfill); it keeps its place at the head of the order.
//   - No starvation of gangs (a gang "can fit" when the connected fleet could
//     hold it with every GPU / slot free; one that cannot waits for workers to
//     join and holds nothing back):
//       * A CPU gang that does not fit stops backfill of CPU runs behind it:
//         free slots then only grow as runs end, so the gang starts once
//         enough have ended, however many small runs are submitted after it.
//       * The first GPU gang in the order that does not fit reserves workers:
//         for gpus N the workers with the most GPUs in all (ties: id) until
//         they hold N; for H x G the H workers with the fewest GPUs in all
//         that have G (ties: id). The choice depends only on the fleet, not on
//         what is free, so it is the same in every call. No run behind the
//         gang is placed on a reserved worker: their free GPUs only grow as
//         runs there end, until the gang fits (on them or anywhere else). GPU
//         runs behind it still backfill onto the other workers, and runs ahead
//         of it in the order (higher priority, older) are placed as usual.
//         Later gangs that do not fit wait without reserving, each in turn.
//   - Fractional GPUs. A run with gpu_milli m (resources: {gpus: m / 1000},
//     0 < m < 1000) is one rank on one GPU that it may share with other
//     fractional runs, never with a whole-GPU run or a gang. Each GPU holds
//     1000 thousandths (integers: no float error). Its memory is the total
//     the worker reported (NVML; keel-worker --fake-gpus reports 80 GiB); a
//     run reserves its gpu_memory_bytes, or, when it declares none, m / 1000
//     of that GPU's total. A fractional run fits a GPU when the thousandths
//     and the reserved memory of all runs there, its own included, stay at
//     most 1000 and the total; a GPU whose total is unknown (0) takes only
//     runs that declare no memory. Best fit: the GPU with the least room
//     (thousandths) left that still fits, a partly used one before a free
//     one, so whole GPUs stay free for whole-GPU runs and gangs; ties: the
//     worker with the fewest free GPUs, then worker id, then device index.
//     A whole-GPU run and a gang take only GPUs with nothing on them (a
//     partly used GPU is not free). A GPU gang's reserved workers take no
//     fractional run behind it either.
//   - No GPU or CPU slot is handed out twice: capacity shrinks as runs are
//     placed, and no GPU's thousandths or memory are ever oversubscribed.
#ifndef KEEL_SERVER_SCHEDULER_H_
#define KEEL_SERVER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/keel.pb.h"

namespace keel {

// A GPU that fractional runs hold part of (never in free_gpus).
struct SharedGpu {
  int32_t index = 0;
  int32_t used_milli = 0;           // thousandths held, 1 .. 1000
  int64_t used_memory_bytes = 0;    // memory the runs on it reserve
};

struct WorkerCapacity {
  std::string worker_id;
  std::vector<int32_t> free_gpus;  // device indices with nothing on them
  int32_t total_gpus = 0;          // free or not (at least free_gpus.size() is assumed)
  int32_t free_cpu_slots = 0;
  int32_t total_cpu_slots = 0;     // free or not (a gang is a run no one worker can ever take)
  std::vector<SharedGpu> shared_gpus;           // partly held by fractional runs
  std::map<int32_t, int64_t> gpu_memory_bytes;  // device index -> total memory (missing or 0: unknown)
};

// Thousandths of a GPU in all.
constexpr int32_t kGpuMilli = 1000;

// The memory a fractional run reserves on a GPU of `total_bytes`: its
// declared gpu_memory_bytes, else its share of the total.
int64_t ReservedGpuMemory(const v1::Run& run, int64_t total_bytes);

// A gang's share on one worker: ranks first_rank .. first_rank + ranks - 1.
struct PlacementPart {
  std::string worker_id;
  int32_t first_rank = 0;
  int32_t ranks = 0;
  std::vector<int32_t> gpus;  // a GPU gang: one per rank, in rank order; else empty
};

struct Placement {
  std::string run_id;
  std::string worker_id;
  std::vector<int32_t> gpus;  // a GPU run on one worker (one rank each; a fractional run: its one GPU);
                              // empty for a CPU run or a gang
  int32_t cpu_slots = 0;
  int32_t world = 1;          // data-parallel ranks in all
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
