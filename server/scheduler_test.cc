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

}  // namespace
}  // namespace keel
