// Run placement (see scheduler.h).
#include "server/scheduler.h"

#include <algorithm>
#include <set>

namespace keel {
namespace {

int32_t TotalGpus(const WorkerCapacity& w) {
  return std::max(w.total_gpus, static_cast<int32_t>(w.free_gpus.size()));
}

int32_t FreeGpus(const WorkerCapacity& w) { return static_cast<int32_t>(w.free_gpus.size()); }

// How a GPU run is placed.
enum class GpuShape {
  kOneWorker,  // all its GPUs on one worker
  kSpread,     // gpus: N over as few workers as hold them
  kHosts,      // hosts x gpus_per_host, exactly
};

GpuShape ShapeOf(const v1::Run& run, int32_t largest_gpus) {
  if (run.hosts() > 1) return GpuShape::kHosts;
  if (run.hosts() == 1) return GpuShape::kOneWorker;
  return run.gpus() > largest_gpus && largest_gpus > 0 ? GpuShape::kSpread : GpuShape::kOneWorker;
}

// Takes `count` GPUs (the lowest free indices) of `w` for ranks first_rank.. .
PlacementPart TakeGpus(WorkerCapacity* w, int32_t first_rank, int32_t count) {
  PlacementPart part;
  part.worker_id = w->worker_id;
  part.first_rank = first_rank;
  part.ranks = count;
  part.gpus.assign(w->free_gpus.begin(), w->free_gpus.begin() + count);
  w->free_gpus.erase(w->free_gpus.begin(), w->free_gpus.begin() + count);
  return part;
}

// A GPU gang on the workers not `reserved` (scheduler.h, "GPU gangs"). All or
// nothing: false, and no capacity taken, when it does not fit now.
bool PlaceGpuGang(const v1::Run& run, GpuShape shape, const std::set<std::string>& reserved,
                  std::vector<WorkerCapacity>* workers, Placement* out) {
  std::vector<WorkerCapacity*> usable;
  for (WorkerCapacity& w : *workers) {
    if (!reserved.count(w.worker_id) && FreeGpus(w) > 0) usable.push_back(&w);
  }
  Placement p;
  p.run_id = run.id();
  if (shape == GpuShape::kHosts) {
    const int32_t per_host = run.gpus_per_host();
    std::vector<WorkerCapacity*> fit;
    for (WorkerCapacity* w : usable) {
      if (FreeGpus(*w) >= per_host) fit.push_back(w);
    }
    if (static_cast<int32_t>(fit.size()) < run.hosts()) return false;
    // Best fit: the fewest free GPUs first (ties: id, the workers' order).
    std::stable_sort(fit.begin(), fit.end(),
                     [](const WorkerCapacity* a, const WorkerCapacity* b) { return FreeGpus(*a) < FreeGpus(*b); });
    for (int32_t h = 0; h < run.hosts(); ++h) p.parts.push_back(TakeGpus(fit[h], h * per_host, per_host));
    p.world = run.hosts() * per_host;
  } else {
    const int32_t need = run.gpus();
    int32_t free = 0;
    for (const WorkerCapacity* w : usable) free += FreeGpus(*w);
    if (free < need) return false;
    // The most free GPUs first: whole workers, so the fewest parts.
    std::stable_sort(usable.begin(), usable.end(),
                     [](const WorkerCapacity* a, const WorkerCapacity* b) { return FreeGpus(*a) > FreeGpus(*b); });
    int32_t placed = 0;
    for (size_t i = 0; i < usable.size() && placed < need; ++i) {
      const int32_t rest = need - placed;
      if (FreeGpus(*usable[i]) >= rest) {
        // The last part: the worker with the fewest free GPUs that still
        // covers the rest (best fit; the list is sorted by free, descending,
        // and none after i is taken yet).
        size_t best = i;
        for (size_t j = i + 1; j < usable.size(); ++j) {
          if (FreeGpus(*usable[j]) >= rest) best = j;
        }
        p.parts.push_back(TakeGpus(usable[best], placed, rest));
        placed = need;
      } else {
        const int32_t take = FreeGpus(*usable[i]);
        p.parts.push_back(TakeGpus(usable[i], placed, take));
        placed += take;
      }
    }
    p.world = need;
  }
  p.worker_id = p.parts.front().worker_id;
  *out = std::move(p);
  return true;
}

// The workers a GPU gang that does not fit reserves (scheduler.h, "No
// starvation"): chosen from the fleet's GPUs in all, so the same in every
// call. Empty when the fleet could not hold the gang even if idle.
std::set<std::string> GangReservation(const v1::Run& run, GpuShape shape, const std::vector<WorkerCapacity>& workers) {
  std::vector<const WorkerCapacity*> by_total;
  for (const WorkerCapacity& w : workers) {
    if (TotalGpus(w) > 0) by_total.push_back(&w);
  }
  std::set<std::string> reserved;
  if (shape == GpuShape::kHosts) {
    std::vector<const WorkerCapacity*> fit;
    for (const WorkerCapacity* w : by_total) {
      if (TotalGpus(*w) >= run.gpus_per_host()) fit.push_back(w);
    }
    if (static_cast<int32_t>(fit.size()) < run.hosts()) return {};
    std::stable_sort(fit.begin(), fit.end(),
                     [](const WorkerCapacity* a, const WorkerCapacity* b) { return TotalGpus(*a) < TotalGpus(*b); });
    for (int32_t h = 0; h < run.hosts(); ++h) reserved.insert(fit[h]->worker_id);
    return reserved;
  }
  std::stable_sort(by_total.begin(), by_total.end(),
                   [](const WorkerCapacity* a, const WorkerCapacity* b) { return TotalGpus(*a) > TotalGpus(*b); });
  int32_t held = 0;
  for (const WorkerCapacity* w : by_total) {
    if (held >= run.gpus()) break;
    reserved.insert(w->worker_id);
    held += TotalGpus(*w);
  }
  return held >= run.gpus() ? reserved : std::set<std::string>();
}

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
  p.world = need;
  int placed = 0;
  for (WorkerCapacity* w : by_free) {
    if (placed == need) break;
    const int take = std::min(w->free_cpu_slots, need - placed);
    p.parts.push_back({w->worker_id, placed, take, {}});
    w->free_cpu_slots -= take;
    placed += take;
  }
  p.worker_id = p.parts.front().worker_id;
  *out = std::move(p);
  return true;
}

// Where a fractional run goes (scheduler.h, "Fractional GPUs"): false, and
// nothing taken, when no GPU on a worker not `reserved` has room for it.
bool PlaceFraction(const v1::Run& run, const std::set<std::string>& reserved, std::vector<WorkerCapacity>* workers,
                   Placement* out) {
  const int32_t milli = run.gpu_milli();
  WorkerCapacity* best_worker = nullptr;
  int32_t best_index = -1;
  int32_t best_room = kGpuMilli + 1;  // thousandths left after it is placed there
  int32_t best_free = 0;              // the free GPUs of best_worker, for ties between free GPUs
  bool best_shared = false;
  auto fits = [&](const WorkerCapacity& w, int32_t index, int32_t used_milli, int64_t used_memory) {
    if (used_milli + milli > kGpuMilli) return false;
    auto total = w.gpu_memory_bytes.find(index);
    const int64_t total_bytes = total == w.gpu_memory_bytes.end() ? 0 : total->second;
    if (total_bytes <= 0) return run.gpu_memory_bytes() == 0;  // unknown memory: nothing to check against
    return used_memory + ReservedGpuMemory(run, total_bytes) <= total_bytes;
  };
  // Candidates come in worker-id order, then device order, so a strict
  // "better" keeps the first of equals.
  auto consider = [&](WorkerCapacity& w, int32_t index, int32_t used_milli, bool shared) {
    const int32_t room = kGpuMilli - used_milli - milli;
    const bool better = room < best_room || (room == best_room && !shared && !best_shared && FreeGpus(w) < best_free);
    if (!better) return;
    best_worker = &w;
    best_index = index;
    best_room = room;
    best_free = FreeGpus(w);
    best_shared = shared;
  };
  for (WorkerCapacity& w : *workers) {
    if (reserved.count(w.worker_id)) continue;
    std::sort(w.shared_gpus.begin(), w.shared_gpus.end(),
              [](const SharedGpu& a, const SharedGpu& b) { return a.index < b.index; });
    for (const SharedGpu& g : w.shared_gpus) {
      if (fits(w, g.index, g.used_milli, g.used_memory_bytes)) consider(w, g.index, g.used_milli, true);
    }
    for (int32_t index : w.free_gpus) {
      // The lowest free index of a worker stands for all of them.
      if (fits(w, index, 0, 0)) {
        consider(w, index, 0, false);
        break;
      }
    }
  }
  if (!best_worker) return false;
  auto total = best_worker->gpu_memory_bytes.find(best_index);
  const int64_t memory =
      ReservedGpuMemory(run, total == best_worker->gpu_memory_bytes.end() ? 0 : total->second);
  auto shared = std::find_if(best_worker->shared_gpus.begin(), best_worker->shared_gpus.end(),
                             [&](const SharedGpu& g) { return g.index == best_index; });
  if (shared == best_worker->shared_gpus.end()) {
    best_worker->free_gpus.erase(std::find(best_worker->free_gpus.begin(), best_worker->free_gpus.end(), best_index));
    best_worker->shared_gpus.push_back({best_index, milli, memory});
  } else {
    shared->used_milli += milli;
    shared->used_memory_bytes += memory;
  }
  Placement p;
  p.run_id = run.id();
  p.worker_id = best_worker->worker_id;
  p.gpus = {best_index};
  p.world = 1;
  *out = std::move(p);
  return true;
}

}  // namespace

int64_t ReservedGpuMemory(const v1::Run& run, int64_t total_bytes) {
  if (run.gpu_memory_bytes() > 0) return run.gpu_memory_bytes();
  // Rounded down, so shares that fill the thousandths never sum past the total.
  return std::max<int64_t>(0, total_bytes) / kGpuMilli * run.gpu_milli() +
         std::max<int64_t>(0, total_bytes) % kGpuMilli * run.gpu_milli() / kGpuMilli;
}

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
  int32_t largest_cpu = 0, all_cpu = 0;  // CPU slots of the largest worker, and of all, free or not
  int32_t largest_gpus = 0;              // GPUs of the largest worker, free or not
  for (const WorkerCapacity& w : workers) {
    largest_cpu = std::max(largest_cpu, w.total_cpu_slots);
    all_cpu += w.total_cpu_slots;
    largest_gpus = std::max(largest_gpus, TotalGpus(w));
  }
  bool cpu_gang_waiting = false;  // a CPU gang ahead did not fit: no CPU backfill past it
  bool gpu_gang_waiting = false;  // a GPU gang ahead did not fit and holds `reserved`
  std::set<std::string> reserved;
  for (const v1::Run* run : order) {
    auto limit = max_concurrent.find(run->sweep_id());
    if (limit != max_concurrent.end() && limit->second > 0 && active[run->sweep_id()] >= limit->second) {
      continue;
    }
    if (run->gpu_milli() > 0) {
      Placement p;
      if (PlaceFraction(*run, reserved, &workers, &p)) {
        ++active[run->sweep_id()];
        placements.push_back(std::move(p));
      }
      continue;
    }
    if (run->gpus() > 0) {
      const GpuShape shape = ShapeOf(*run, largest_gpus);
      if (shape != GpuShape::kOneWorker) {
        Placement gang;
        if (PlaceGpuGang(*run, shape, reserved, &workers, &gang)) {
          ++active[run->sweep_id()];
          placements.push_back(std::move(gang));
        } else if (!gpu_gang_waiting) {
          reserved = GangReservation(*run, shape, workers);
          gpu_gang_waiting = !reserved.empty();
        }
        continue;
      }
    } else if (std::max(1, run->cpu_slots()) > largest_cpu && largest_cpu > 0) {
      if (cpu_gang_waiting) continue;
      Placement gang;
      if (PlaceCpuGang(*run, &workers, &gang)) {
        ++active[run->sweep_id()];
        placements.push_back(std::move(gang));
      } else {
        // Only a gang the fleet could hold holds the others back.
        cpu_gang_waiting = std::max(1, run->cpu_slots()) <= all_cpu;
      }
      continue;
    }
    if (run->gpus() == 0 && cpu_gang_waiting) continue;
    WorkerCapacity* chosen = nullptr;
    if (run->gpus() > 0) {
      for (WorkerCapacity& w : workers) {
        if (FreeGpus(w) < run->gpus() || reserved.count(w.worker_id)) continue;
        if (!chosen || FreeGpus(w) < FreeGpus(*chosen)) chosen = &w;
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
      p.world = run->gpus();
    } else {
      p.cpu_slots = std::max(1, run->cpu_slots());
      chosen->free_cpu_slots -= p.cpu_slots;
      p.world = p.cpu_slots;
    }
    ++active[run->sweep_id()];
    placements.push_back(std::move(p));
  }
  return placements;
}

}  // namespace keel
