// Run placement (see scheduler.h).
#include "server/scheduler.h"

#include <algorithm>

namespace keel {
namespace {

// A CPU gang: one rank per slot, over the workers with the most free slots
// first (ties by id), rank 0 on the first. All or nothing: false, and no
// capacity taken, when the free slots of all workers together are too few.
bool PlaceCpuGang(const v1::Run& run, std::vector<WorkerCapacity>* workers, Placement* out) {
  const int need = std::max(1, run.cpu_slots());
  int free = 0;
  for (const WorkerCapacity& w : *workers) free += w.free_cpu_slots;
  if (free < need) return false;
  std::vector<WorkerCapacity*> by_free;
  for (WorkerCapacity& w : *workers) {
    if (w.free_cpu_slots > 0) by_free.push_back(&w);
  }
  std::stable_sort(by_free.begin(), by_free.end(), [](const WorkerCapacity* a, const WorkerCapacity* b) {
    return a->free_cpu_slots > b->free_cpu_slots;  // workers are sorted by id already
  });
  Placement p;
  p.run_id = run.id();
  p.cpu_slots = need;
  int placed = 0;
  for (WorkerCapacity* w : by_free) {
    if (placed == need) break;
    const int take = std::min(w->free_cpu_slots, need - placed);
    p.parts.push_back({w->worker_id, placed, take});
    w->free_cpu_slots -= take;
    placed += take;
  }
  p.worker_id = p.parts.front().worker_id;
  *out = std::move(p);
  return true;
}

}  // namespace

std::vector<Placement> Schedule(const std::vector<v1::Run>& queued,
                                const std::map<std::string, int>& active_per_sweep,
                                const std::map<std::string, int>& max_concurrent,
                                std::vector<WorkerCapacity> workers) {
  std::vector<const v1::Run*> order;
  for (const v1::Run& r : queued) {
    if (r.state() == v1::QUEUED) order.push_back(&r);
  }
  std::stable_sort(order.begin(), order.end(), [](const v1::Run* a, const v1::Run* b) {
    if (a->priority() != b->priority()) return a->priority() > b->priority();
    if (a->created_unix_ms() != b->created_unix_ms()) return a->created_unix_ms() < b->created_unix_ms();
    if (a->index() != b->index()) return a->index() < b->index();
    return a->id() < b->id();
  });
  for (WorkerCapacity& w : workers) std::sort(w.free_gpus.begin(), w.free_gpus.end());
  std::sort(workers.begin(), workers.end(),
            [](const WorkerCapacity& a, const WorkerCapacity& b) { return a.worker_id < b.worker_id; });
  std::map<std::string, int> active = active_per_sweep;
  std::vector<Placement> placements;
  int32_t largest_worker = 0;  // CPU slots of the largest worker, free or not
  for (const WorkerCapacity& w : workers) largest_worker = std::max(largest_worker, w.total_cpu_slots);
  bool gang_waiting = false;  // a CPU gang ahead did not fit: no CPU backfill past it
  for (const v1::Run* run : order) {
    auto limit = max_concurrent.find(run->sweep_id());
    if (limit != max_concurrent.end() && limit->second > 0 && active[run->sweep_id()] >= limit->second) {
      continue;
    }
    if (run->gpus() == 0 && std::max(1, run->cpu_slots()) > largest_worker && largest_worker > 0) {
      if (gang_waiting) continue;
      Placement gang;
      if (PlaceCpuGang(*run, &workers, &gang)) {
        ++active[run->sweep_id()];
        placements.push_back(std::move(gang));
      } else {
        gang_waiting = true;
      }
      continue;
    }
    if (run->gpus() == 0 && gang_waiting) continue;
    WorkerCapacity* chosen = nullptr;
    if (run->gpus() > 0) {
      for (WorkerCapacity& w : workers) {
        if (static_cast<int>(w.free_gpus.size()) < run->gpus()) continue;
        if (!chosen || w.free_gpus.size() < chosen->free_gpus.size()) chosen = &w;
      }
    } else {
      const int need = std::max(1, run->cpu_slots());
      for (WorkerCapacity& w : workers) {
        if (w.free_cpu_slots < need) continue;
        if (!chosen || w.free_cpu_slots > chosen->free_cpu_slots) chosen = &w;
      }
    }
    if (!chosen) continue;
    Placement p;
    p.run_id = run->id();
    p.worker_id = chosen->worker_id;
    if (run->gpus() > 0) {
      p.gpus.assign(chosen->free_gpus.begin(), chosen->free_gpus.begin() + run->gpus());
      chosen->free_gpus.erase(chosen->free_gpus.begin(), chosen->free_gpus.begin() + run->gpus());
    } else {
      p.cpu_slots = std::max(1, run->cpu_slots());
      chosen->free_cpu_slots -= p.cpu_slots;
    }
    ++active[run->sweep_id()];
    placements.push_back(std::move(p));
  }
  return placements;
}

}  // namespace keel
