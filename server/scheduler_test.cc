// Placement rules of scheduler.h, each pinned on a small fleet.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace keel {
namespace {

v1::Run MakeRun(const std::string& id, const std::string& sweep, int gpus, int priority = 0, int64_t created = 0,
                int index = 0) {
  v1::Run r;
  r.set_id(id);
  r.set_sweep_id(sweep);
  r.set_state(v1::QUEUED);
  r.set_gpus(gpus);
  r.set_cpu_slots(gpus == 0 ? 1 : 0);
  r.set_priority(priority);
  r.set_created_unix_ms(created);
  r.set_index(index);
  return r;
}

WorkerCapacity Gpus(const std::string& id, std::vector<int32_t> free) {
  WorkerCapacity w;
  w.worker_id = id;
  w.free_gpus = std::move(free);
  return w;
}

TEST(SchedulerTest, PriorityThenAgeThenIndex) {
  std::vector<v1::Run> q = {MakeRun("old", "s", 1, 0, 1, 0), MakeRun("urgent", "s", 1, 5, 9, 3),
                            MakeRun("new", "s", 1, 0, 2, 1)};
  auto p = Schedule(q, {}, {}, {Gpus("w", {0, 1})});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].run_id, "urgent");
  EXPECT_EQ(p[1].run_id, "old");
}

TEST(SchedulerTest, NoGpuHandedOutTwiceAndMultiGpuRunsStayOnOneHost) {
  std::vector<v1::Run> q = {MakeRun("a", "s", 2, 0, 0, 0), MakeRun("b", "s", 2, 0, 0, 1), MakeRun("c", "s", 2, 0, 0, 2)};
  auto p = Schedule(q, {}, {}, {Gpus("w1", {0, 1, 2}), Gpus("w2", {0, 1})});
  ASSERT_EQ(p.size(), 2u);  // w1 has 3 GPUs: one 2-GPU run; w2 one more; c waits
  std::set<std::pair<std::string, int>> used;
  for (const Placement& x : p) {
    EXPECT_EQ(x.gpus.size(), 2u);
    for (int g : x.gpus) EXPECT_TRUE(used.insert({x.worker_id, g}).second) << x.worker_id << " gpu " << g;
  }
}

TEST(SchedulerTest, BestFitKeepsBigMachinesFree) {
  std::vector<v1::Run> q = {MakeRun("small", "s", 1, 0, 0, 0), MakeRun("big", "s", 4, 0, 0, 1)};
  auto p = Schedule(q, {}, {}, {Gpus("eight", {0, 1, 2, 3}), Gpus("one", {5})});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].worker_id, "one");
  EXPECT_EQ(p[0].gpus, std::vector<int32_t>{5});
  EXPECT_EQ(p[1].worker_id, "eight");
  EXPECT_EQ(p[1].gpus, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(SchedulerTest, SweepConcurrencyLimitCountsActiveRuns) {
  std::vector<v1::Run> q = {MakeRun("a1", "a", 1, 0, 0, 0), MakeRun("a2", "a", 1, 0, 0, 1), MakeRun("b1", "b", 1, 0, 1, 0)};
  auto p = Schedule(q, {{"a", 1}}, {{"a", 2}}, {Gpus("w", {0, 1, 2, 3})});
  ASSERT_EQ(p.size(), 2u);  // one more of sweep a (1 active, limit 2), and b1
  EXPECT_EQ(p[0].run_id, "a1");
  EXPECT_EQ(p[1].run_id, "b1");
}

TEST(SchedulerTest, CpuRunsUseCpuSlotsAndBackfill) {
  WorkerCapacity cpu;
  cpu.worker_id = "laptop";
  cpu.free_cpu_slots = 2;
  std::vector<v1::Run> q = {MakeRun("gpu-run", "s", 1, 0, 0, 0), MakeRun("c1", "s", 0, 0, 0, 1),
                            MakeRun("c2", "s", 0, 0, 0, 2), MakeRun("c3", "s", 0, 0, 0, 3)};
  auto p = Schedule(q, {}, {}, {cpu});
  ASSERT_EQ(p.size(), 2u);  // the GPU run cannot fit; two CPU runs backfill
  EXPECT_EQ(p[0].run_id, "c1");
  EXPECT_EQ(p[1].run_id, "c2");
  EXPECT_EQ(p[0].cpu_slots, 1);
  EXPECT_TRUE(p[0].gpus.empty());
}

TEST(SchedulerTest, IgnoresRunsThatAreNotQueued) {
  v1::Run running = MakeRun("r", "s", 1);
  running.set_state(v1::RUNNING);
  EXPECT_TRUE(Schedule({running}, {}, {}, {Gpus("w", {0})}).empty());
}

WorkerCapacity Cpus(const std::string& id, int free, int total) {
  WorkerCapacity w;
  w.worker_id = id;
  w.free_cpu_slots = free;
  w.total_cpu_slots = total;
  return w;
}

v1::Run CpuRun(const std::string& id, int slots, int64_t created) {
  v1::Run r = MakeRun(id, "s", 0, 0, created);
  r.set_cpu_slots(slots);
  return r;
}

TEST(SchedulerTest, ACpuRunLargerThanAnyWorkerIsAGangOverSeveralWorkers) {
  // 5 ranks over workers of 2, 3 and 1 free slots (totals 4, 3, 2): the most free first.
  auto p = Schedule({CpuRun("gang", 5, 1)}, {}, {}, {Cpus("a", 2, 4), Cpus("b", 3, 3), Cpus("c", 1, 2)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].worker_id, "b");  // rank 0's worker
  ASSERT_EQ(p[0].parts.size(), 2u);
  EXPECT_EQ(p[0].parts[0].worker_id, "b");
  EXPECT_EQ(p[0].parts[0].first_rank, 0);
  EXPECT_EQ(p[0].parts[0].ranks, 3);
  EXPECT_EQ(p[0].parts[1].worker_id, "a");
  EXPECT_EQ(p[0].parts[1].first_rank, 3);
  EXPECT_EQ(p[0].parts[1].ranks, 2);
  // A run one worker can take stays on one worker.
  auto single = Schedule({CpuRun("small", 3, 1)}, {}, {}, {Cpus("a", 2, 4), Cpus("b", 3, 3)});
  ASSERT_EQ(single.size(), 1u);
  EXPECT_TRUE(single[0].parts.empty());
  EXPECT_EQ(single[0].worker_id, "b");
}

TEST(SchedulerTest, AGangIsPlacedWholeOrNotAtAllAndTwoGangsNeverSplitTheFleet) {
  // Two gangs of 4 on two workers of 2: the first takes both workers, the second waits whole.
  auto p = Schedule({CpuRun("g1", 4, 1), CpuRun("g2", 4, 2)}, {}, {}, {Cpus("a", 2, 2), Cpus("b", 2, 2)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].run_id, "g1");
  ASSERT_EQ(p[0].parts.size(), 2u);
  // Only 3 slots free: nothing of the gang is placed.
  EXPECT_TRUE(Schedule({CpuRun("g", 4, 1)}, {}, {}, {Cpus("a", 1, 2), Cpus("b", 2, 2)}).empty());
}

TEST(SchedulerTest, AWaitingGangStopsCpuBackfillBehindIt) {
  // 3 of the gang's 4 slots are free: the one-slot runs submitted after it wait,
  // so the gang is not starved; a run ahead of it is still placed.
  std::vector<v1::Run> q = {CpuRun("first", 1, 1), CpuRun("gang", 4, 2), CpuRun("late1", 1, 3),
                            CpuRun("late2", 1, 4)};
  auto p = Schedule(q, {}, {}, {Cpus("a", 2, 2), Cpus("b", 2, 2)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].run_id, "first");
  // GPU runs do not compete for CPU slots: they still go.
  q.push_back(MakeRun("gpu", "s", 1, 0, 5));
  WorkerCapacity g = Gpus("g", {0});
  auto with_gpu = Schedule(q, {}, {}, {Cpus("a", 2, 2), Cpus("b", 2, 2), g});
  ASSERT_EQ(with_gpu.size(), 2u);
  EXPECT_EQ(with_gpu[1].run_id, "gpu");
}

TEST(SchedulerTest, ACpuGangTheFleetCannotHoldDoesNotStopBackfill) {
  // 8 slots wanted, 4 in the whole fleet: the gang waits for workers to join,
  // and the one-slot runs behind it still run.
  auto p = Schedule({CpuRun("huge", 8, 1), CpuRun("late", 1, 2)}, {}, {}, {Cpus("a", 2, 2), Cpus("b", 2, 2)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].run_id, "late");
}

// ---- GPU runs: one rank per GPU; gangs across workers ----

WorkerCapacity Gpus(const std::string& id, std::vector<int32_t> free, int total) {
  WorkerCapacity w = Gpus(id, std::move(free));
  w.total_gpus = total;
  return w;
}

v1::Run HostsRun(const std::string& id, int hosts, int per_host, int64_t created = 0) {
  v1::Run r = MakeRun(id, "s", hosts * per_host, 0, created);
  r.set_hosts(hosts);
  r.set_gpus_per_host(per_host);
  return r;
}

// The GPUs a placement holds, as "worker:gpu" in rank order.
std::vector<std::string> RankGpus(const Placement& p) {
  std::vector<std::string> out;
  if (p.parts.empty()) {
    for (int32_t g : p.gpus) out.push_back(p.worker_id + ":" + std::to_string(g));
  }
  for (const PlacementPart& part : p.parts) {
    EXPECT_EQ(part.first_rank, static_cast<int>(out.size())) << part.worker_id;  // ranks are contiguous
    EXPECT_EQ(part.ranks, static_cast<int>(part.gpus.size())) << part.worker_id;  // one rank per GPU
    for (int32_t g : part.gpus) out.push_back(part.worker_id + ":" + std::to_string(g));
  }
  return out;
}

TEST(SchedulerTest, BestFitSingleWorkerGpuRunsAreOneRankPerGpuAndUnchanged) {
  // 3 GPUs fit on one worker of 4 in all: no gang, best fit (fewest free that fit).
  auto p = Schedule({MakeRun("r", "s", 3)}, {}, {},
                    {Gpus("a", {0, 1, 2, 3}, 4), Gpus("b", {1, 2, 3}, 4), Gpus("c", {0, 1}, 2)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].parts.empty());
  EXPECT_EQ(p[0].worker_id, "b");
  EXPECT_EQ(p[0].gpus, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p[0].world, 3);
  // A run that one worker can hold in all waits for it rather than becoming a gang.
  EXPECT_TRUE(Schedule({MakeRun("r", "s", 4)}, {}, {}, {Gpus("a", {0, 1}, 4), Gpus("b", {0, 1, 2}, 4)}).empty());
  // {hosts: 1, gpus_per_host: 2} is a run on one worker too.
  auto one = Schedule({HostsRun("h1", 1, 2)}, {}, {}, {Gpus("a", {0, 1, 2, 3}, 4), Gpus("b", {5, 6}, 2)});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].parts.empty());
  EXPECT_EQ(RankGpus(one[0]), (std::vector<std::string>{"b:5", "b:6"}));
}

TEST(SchedulerTest, AGpuRunLargerThanAnyWorkerSpreadsOverTheFewestWorkers) {
  // 8 GPUs, no worker has more than 4: the most free first, whole (a: 4, c: 3),
  // the last GPU from the worker with the fewest free that covers it (d, not b).
  auto p = Schedule({MakeRun("gang", "s", 8)}, {}, {},
                    {Gpus("a", {0, 1, 2, 3}, 4), Gpus("b", {2, 3}, 4), Gpus("c", {4, 5, 6}, 4), Gpus("d", {7}, 4)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].worker_id, "a");  // rank 0's
  EXPECT_EQ(p[0].world, 8);
  EXPECT_TRUE(p[0].gpus.empty());
  ASSERT_EQ(p[0].parts.size(), 3u);
  EXPECT_EQ(RankGpus(p[0]),
            (std::vector<std::string>{"a:0", "a:1", "a:2", "a:3", "c:4", "c:5", "c:6", "d:7"}));
}

TEST(SchedulerTest, HostsTimesGpusPerHostTakesExactlyThatManyWorkers) {
  // 2 x 2: the two workers with the fewest free GPUs that have 2 (b and c);
  // a keeps its 4 for a bigger run.
  auto p = Schedule({HostsRun("g", 2, 2)}, {}, {},
                    {Gpus("a", {0, 1, 2, 3}, 4), Gpus("b", {1, 3}, 4), Gpus("c", {0, 1, 2}, 4), Gpus("d", {0}, 4)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(RankGpus(p[0]), (std::vector<std::string>{"b:1", "b:3", "c:0", "c:1"}));
  EXPECT_EQ(p[0].world, 4);
  // Never more GPUs of one worker, nor fewer workers: 2 x 2 waits while only
  // one worker has 2 free, even though 4 GPUs are free in all.
  EXPECT_TRUE(Schedule({HostsRun("g", 2, 2)}, {}, {}, {Gpus("a", {0, 1, 2}, 4), Gpus("b", {0}, 4)}).empty());
}

TEST(SchedulerTest, AGpuGangIsPlacedWholeOrNotAtAll) {
  // 7 of 8 free: nothing of the gang is placed, and no GPU is taken.
  std::vector<WorkerCapacity> fleet = {Gpus("a", {0, 1, 2, 3}, 4), Gpus("b", {0, 1, 2}, 4)};
  EXPECT_TRUE(Schedule({MakeRun("gang", "s", 8)}, {}, {}, fleet).empty());
  EXPECT_TRUE(Schedule({HostsRun("g", 2, 4)}, {}, {}, fleet).empty());
}

TEST(SchedulerTest, TwoGpuGangsNeverDeadlockHoldingHalves) {
  // Two gangs of 4 on two workers of 2: the first gets both workers, the
  // second waits whole; it does not hold one worker while the first holds the other.
  std::vector<WorkerCapacity> fleet = {Gpus("a", {0, 1}, 2), Gpus("b", {0, 1}, 2)};
  for (bool hosts : {false, true}) {
    std::vector<v1::Run> q = {hosts ? HostsRun("g1", 2, 2, 1) : MakeRun("g1", "s", 4, 0, 1),
                              hosts ? HostsRun("g2", 2, 2, 2) : MakeRun("g2", "s", 4, 0, 2)};
    auto p = Schedule(q, {}, {}, fleet);
    ASSERT_EQ(p.size(), 1u) << hosts;
    EXPECT_EQ(p[0].run_id, "g1");
    EXPECT_EQ(RankGpus(p[0]), (std::vector<std::string>{"a:0", "a:1", "b:0", "b:1"}));
    // With the first gang running, the second still takes nothing.
    EXPECT_TRUE(Schedule({q[1]}, {}, {}, {Gpus("a", {}, 2), Gpus("b", {}, 2)}).empty());
  }
}

TEST(SchedulerTest, AWaitingGpuGangIsNotStarvedByAStreamOfSmallRuns) {
  // Workers a and b (4 GPUs each) are busy with small runs; c has 2. A gang of
  // 8 waits and reserves a and b (the most GPUs in all). Every round one
  // busy GPU frees and two new 1-GPU runs arrive: they only ever go to c, so
  // the gang starts once a and b are free, and then takes them.
  std::map<std::string, std::vector<int32_t>> busy = {{"a", {0, 1, 2, 3}}, {"b", {0, 1, 2, 3}}};
  std::vector<int32_t> c_free = {0, 1};
  std::vector<v1::Run> queue = {MakeRun("gang", "s", 8, 0, 1)};
  bool placed = false;
  for (int round = 0; round < 20 && !placed; ++round) {
    // One GPU of a (then b) is freed.
    for (auto& w : busy) {
      if (!w.second.empty()) {
        w.second.pop_back();
        break;
      }
    }
    queue.push_back(MakeRun("small" + std::to_string(2 * round), "s", 1, 0, 100 + 2 * round));
    queue.push_back(MakeRun("small" + std::to_string(2 * round + 1), "s", 1, 0, 101 + 2 * round));
    std::vector<WorkerCapacity> fleet;
    for (const std::string id : {"a", "b"}) {
      std::vector<int32_t> free;
      for (int32_t g = 0; g < 4; ++g) {
        if (std::find(busy[id].begin(), busy[id].end(), g) == busy[id].end()) free.push_back(g);
      }
      fleet.push_back(Gpus(id, free, 4));
    }
    fleet.push_back(Gpus("c", c_free, 2));
    for (const Placement& p : Schedule(queue, {}, {}, fleet)) {
      if (p.run_id == "gang") {
        placed = true;
        EXPECT_EQ(round, 7) << "the gang starts as soon as a and b are free";
        EXPECT_EQ(RankGpus(p), (std::vector<std::string>{"a:0", "a:1", "a:2", "a:3", "b:0", "b:1", "b:2", "b:3"}));
      } else {
        EXPECT_EQ(p.worker_id, "c") << p.run_id << " backfilled onto a GPU the gang waits for";
        for (int32_t g : p.gpus) {
          auto at = std::find(c_free.begin(), c_free.end(), g);
          if (at != c_free.end()) c_free.erase(at);
        }
      }
      for (v1::Run& r : queue) {
        if (r.id() == p.run_id) r.set_state(v1::ASSIGNED);
      }
    }
  }
  EXPECT_TRUE(placed);
  EXPECT_TRUE(c_free.empty());  // c was used by the backfill all along
}

TEST(SchedulerTest, OnlyTheFirstWaitingGpuGangReservesAndGangsBehindItMayBackfill) {
  // gang1 (2 x 4) waits and reserves a and b (the two smallest that have 4);
  // gang2 (2 x 2) fits on c and d, which are not reserved; the 1-GPU run finds
  // no free GPU outside the reservation and waits.
  std::vector<v1::Run> q = {HostsRun("gang1", 2, 4, 1), HostsRun("gang2", 2, 2, 2), MakeRun("one", "s", 1, 0, 3)};
  auto p = Schedule(q, {}, {},
                    {Gpus("a", {0, 1}, 4), Gpus("b", {0, 1, 2}, 4), Gpus("c", {0, 1}, 8), Gpus("d", {4, 5}, 8)});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].run_id, "gang2");
  EXPECT_EQ(RankGpus(p[0]), (std::vector<std::string>{"c:0", "c:1", "d:4", "d:5"}));
}

TEST(SchedulerTest, AGpuGangTheFleetCannotHoldReservesNothing) {
  // 16 GPUs wanted, 8 in the fleet (or 3 hosts wanted, 2 there): the gang
  // waits for workers to join and the small run behind it is placed.
  for (const v1::Run& gang : {MakeRun("gang", "s", 16, 0, 1), HostsRun("gang", 3, 2, 1)}) {
    auto p = Schedule({gang, MakeRun("small", "s", 1, 0, 2)}, {}, {}, {Gpus("a", {0, 1}, 4), Gpus("b", {0}, 4)});
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].run_id, "small");
  }
}

TEST(SchedulerTest, GpuGangsAndCpuGangsDoNotHoldEachOtherBack) {
  // A waiting GPU gang does not stop CPU runs; a waiting CPU gang does not stop GPU runs.
  std::vector<v1::Run> q = {MakeRun("gpu-gang", "s", 8, 0, 1), CpuRun("cpu-gang", 4, 2), CpuRun("cpu", 1, 3),
                            MakeRun("gpu", "s", 1, 0, 4)};
  auto p = Schedule(q, {}, {}, {Gpus("a", {0}, 4), Gpus("b", {0, 1, 2, 3}, 4), Gpus("c", {0}, 1), Cpus("x", 2, 2), Cpus("y", 1, 2)});
  std::set<std::string> ids;
  for (const Placement& x : p) ids.insert(x.run_id);
  // gpu-gang (8 of 9 in all, 6 free) waits and reserves b and a; "gpu" goes to c.
  // cpu-gang (4 of 4 in all, 3 free) waits and stops "cpu".
  EXPECT_EQ(ids, (std::set<std::string>{"gpu"}));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].worker_id, "c");
}

// ---- Fractional GPUs --------------------------------------------------------

constexpr int64_t kGiB = int64_t{1} << 30;

// A run of `milli` thousandths of a GPU (gpus: 0.25 is 250), declaring
// `memory` bytes (0: none).
v1::Run FractionRun(const std::string& id, int32_t milli, int64_t memory = 0, int64_t created = 0) {
  v1::Run r = MakeRun(id, "s", 1, 0, created);
  r.set_gpu_milli(milli);
  r.set_gpu_memory_bytes(memory);
  return r;
}

// A worker whose GPUs `free` have nothing on them, `shared` are partly held,
// every one with 80 GiB.
WorkerCapacity Shared(const std::string& id, std::vector<int32_t> free, std::vector<SharedGpu> shared) {
  WorkerCapacity w = Gpus(id, std::move(free));
  w.shared_gpus = std::move(shared);
  w.total_gpus = static_cast<int32_t>(w.free_gpus.size() + w.shared_gpus.size());
  for (int32_t g : w.free_gpus) w.gpu_memory_bytes[g] = 80 * kGiB;
  for (const SharedGpu& g : w.shared_gpus) w.gpu_memory_bytes[g.index] = 80 * kGiB;
  return w;
}

// "worker:gpu" of every placement, in order.
std::vector<std::string> Where(const std::vector<Placement>& p) {
  std::vector<std::string> out;
  for (const Placement& x : p) {
    for (int32_t g : x.gpus) out.push_back(x.worker_id + ":" + std::to_string(g));
  }
  return out;
}

TEST(SchedulerTest, FourQuarterRunsShareOneGpuAndAFifthGoesToAnother) {
  std::vector<v1::Run> q;
  for (int i = 0; i < 5; ++i) q.push_back(FractionRun("q" + std::to_string(i), 250, 0, i));
  auto p = Schedule(q, {}, {}, {Shared("w", {0, 1}, {})});
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(Where(p), (std::vector<std::string>{"w:0", "w:0", "w:0", "w:0", "w:1"}));
  for (const Placement& x : p) {
    EXPECT_EQ(x.world, 1);
    EXPECT_TRUE(x.parts.empty());
  }
}

TEST(SchedulerTest, AFifthQuarterRunWaitsWhenTheOnlyGpuIsFull) {
  std::vector<v1::Run> q;
  for (int i = 0; i < 5; ++i) q.push_back(FractionRun("q" + std::to_string(i), 250, 0, i));
  auto p = Schedule(q, {}, {}, {Shared("w", {0}, {})});
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[3].run_id, "q3");
  // The same when the GPU is already held by four: nothing more goes there.
  p = Schedule({FractionRun("late", 250)}, {}, {}, {Shared("w", {}, {{0, 1000, 80 * kGiB}})});
  EXPECT_TRUE(p.empty());
}

TEST(SchedulerTest, AHalfAndTwoQuartersFillAGpu) {
  std::vector<v1::Run> q = {FractionRun("half", 500, 0, 1), FractionRun("qa", 250, 0, 2), FractionRun("qb", 250, 0, 3),
                            FractionRun("qc", 250, 0, 4)};
  auto p = Schedule(q, {}, {}, {Shared("w", {0, 1}, {})});
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(Where(p), (std::vector<std::string>{"w:0", "w:0", "w:0", "w:1"}));
  // A 0.75 run does not fit beside a 0.5 one.
  p = Schedule({FractionRun("big", 750)}, {}, {}, {Shared("w", {}, {{0, 500, 40 * kGiB}})});
  EXPECT_TRUE(p.empty());
}

TEST(SchedulerTest, FractionsGoToTheGpuWithTheLeastRoomLeftBeforeAFreeOne) {
  // w1's GPU 0 has 0.5 left, w2's GPU 3 has 0.25 left, w3 has a free GPU: a
  // 0.25 run fills w2's; then a 0.5 run fills w1's, and the next takes w3's
  // free GPU (the worker with the fewest free GPUs: w3, not w1).
  std::vector<v1::Run> q = {FractionRun("q", 250, 0, 1), FractionRun("h", 500, 0, 2), FractionRun("h2", 500, 0, 3)};
  auto p = Schedule(q, {}, {}, {Shared("w1", {1, 2}, {{0, 500, 40 * kGiB}}), Shared("w2", {}, {{3, 750, 60 * kGiB}}),
                                Shared("w3", {7}, {})});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(Where(p), (std::vector<std::string>{"w2:3", "w1:0", "w3:7"}));
}

TEST(SchedulerTest, AWholeGpuRunNeverLandsOnAPartlyUsedGpu) {
  // The fraction comes first in the order and takes GPU 0: the whole-GPU run
  // gets GPU 1, and the 2-GPU run finds no two empty GPUs and waits.
  std::vector<v1::Run> q = {FractionRun("frac", 250, 0, 1), MakeRun("whole", "s", 1, 0, 2), MakeRun("two", "s", 2, 0, 3)};
  auto p = Schedule(q, {}, {}, {Shared("w", {0, 1}, {})});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(Where(p), (std::vector<std::string>{"w:0", "w:1"}));
  // Only partly used GPUs: a whole-GPU run and a GPU gang wait.
  for (const v1::Run& r : {MakeRun("whole", "s", 1), HostsRun("gang", 2, 1)}) {
    p = Schedule({r}, {}, {}, {Shared("a", {}, {{0, 250, 20 * kGiB}}), Shared("b", {}, {{0, 250, 20 * kGiB}})});
    EXPECT_TRUE(p.empty()) << r.id();
  }
}

TEST(SchedulerTest, DeclaredMemoryIsNeverOversubscribed) {
  // 50 GiB each on 80 GiB GPUs: only one per GPU, though a quarter each.
  std::vector<v1::Run> q = {FractionRun("a", 250, 50 * kGiB, 1), FractionRun("b", 250, 50 * kGiB, 2),
                            FractionRun("c", 250, 50 * kGiB, 3)};
  auto p = Schedule(q, {}, {}, {Shared("w", {0, 1}, {})});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(Where(p), (std::vector<std::string>{"w:0", "w:1"}));
  // Undeclared, a half reserves 40 GiB: 40 + 50 > 80, so the 50 GiB quarter
  // waits, and a 40 GiB one fits exactly.
  p = Schedule({FractionRun("half", 500, 0, 1), FractionRun("fat", 250, 50 * kGiB, 2),
                FractionRun("fits", 250, 40 * kGiB, 3)},
               {}, {}, {Shared("w", {0}, {})});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].run_id, "half");
  EXPECT_EQ(p[1].run_id, "fits");
  // More than a GPU has: never placed.
  p = Schedule({FractionRun("huge", 100, 81 * kGiB)}, {}, {}, {Shared("w", {0}, {})});
  EXPECT_TRUE(p.empty());
}

TEST(SchedulerTest, AGpuOfUnknownMemoryTakesOnlyRunsThatDeclareNone) {
  WorkerCapacity w = Gpus("w", {0});  // no memory figure
  auto p = Schedule({FractionRun("declared", 250, kGiB, 1), FractionRun("plain", 250, 0, 2)}, {}, {}, {w});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].run_id, "plain");
}

TEST(SchedulerTest, UndeclaredSharesOfAnOddTotalStillFillTheGpu) {
  WorkerCapacity w = Gpus("w", {0});
  w.gpu_memory_bytes[0] = 80 * kGiB + 3;  // not a multiple of four
  std::vector<v1::Run> q;
  for (int i = 0; i < 4; ++i) q.push_back(FractionRun("q" + std::to_string(i), 250, 0, i));
  EXPECT_EQ(Schedule(q, {}, {}, {w}).size(), 4u);
  v1::Run r = FractionRun("x", 333);
  EXPECT_EQ(ReservedGpuMemory(r, 1000), 333);
  EXPECT_EQ(ReservedGpuMemory(r, 80 * kGiB + 3), (80 * kGiB + 3) * 333 / 1000);
}

TEST(SchedulerTest, AWaitingGpuGangsReservedWorkersTakeNoFraction) {
  // The gang wants 4 GPUs: it reserves "big" (4 in all, 3 free); the fraction
  // behind it goes to "small", not to big's free GPUs.
  std::vector<v1::Run> q = {MakeRun("gang", "s", 4, 0, 1), FractionRun("frac", 250, 0, 2)};
  WorkerCapacity big = Shared("big", {1, 2, 3}, {});
  big.total_gpus = 4;
  WorkerCapacity small = Shared("small", {0}, {});
  auto p = Schedule(q, {}, {}, {big, small});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(Where(p), (std::vector<std::string>{"small:0"}));
}

}  // namespace
}  // namespace keel
