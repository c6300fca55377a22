// Placement rules of scheduler.h, each pinned on a small fleet.
#include "server/scheduler.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace keel
