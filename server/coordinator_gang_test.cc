// Gangs in the coordinator, CPU and GPU: one assignment per part with its
// ranks and GPUs, the bootstrap relay from rank 0's worker (again after a
// part's stream reconnects), and any part's failure, exit or lost lease
// stopping the whole gang and requeueing it from its newest checkpoint. A GPU
// run on one worker is one rank per GPU. Fixture: coordinator_test_util.h.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "server/coordinator.h"
#include "server/coordinator_test_util.h"

namespace keel {
namespace {

using coordinator_test::DbPath;
using coordinator_test::Fixture;
using coordinator_test::Starts;

std::string GpuSweep(const std::string& resources, int max_restarts = 2) {
  return "name: g\nbase: {model: {type: proxy, layers: 1, width: 16}, steps: 50}\nresources: " + resources +
         "\nmax_restarts: " + std::to_string(max_restarts) + "\n";
}

std::vector<int32_t> Ints(const google::protobuf::RepeatedField<int32_t>& field) {
  return std::vector<int32_t>(field.begin(), field.end());
}

v1::WorkerMessage Bootstrap(const std::string& run_id, const std::string& id) {
  v1::WorkerMessage m;
  m.mutable_bootstrap()->set_run_id(run_id);
  m.mutable_bootstrap()->set_id(id);
  return m;
}

// The bootstrap relays among a worker's commands.
std::vector<v1::BootstrapId> Relays(const std::vector<v1::WorkerCommand>& sent) {
  std::vector<v1::BootstrapId> out;
  for (const v1::WorkerCommand& c : sent) {
    if (c.has_bootstrap()) out.push_back(c.bootstrap());
  }
  return out;
}

bool Cancelled(const std::vector<v1::WorkerCommand>& sent, const std::string& run_id) {
  for (const v1::WorkerCommand& c : sent) {
    if (c.has_cancel() && c.cancel().run_id() == run_id) return true;
  }
  return false;
}

// Two workers of two GPUs and a run of `resources` that spans them.
struct GangFixture {
  explicit GangFixture(const std::string& name, const std::string& resources = "{gpus: 4}") : f(DbPath(name)) {
    sweep = f.SubmitYaml(GpuSweep(resources));
    w1 = f.AddGpuWorker(&sent1, 2);
    w2 = f.AddGpuWorker(&sent2, 2);
    run = f.Runs(sweep)[0].id();
  }
  Fixture f;
  std::string sweep, w1, w2, run;
  std::vector<v1::WorkerCommand> sent1, sent2;
};

TEST(CoordinatorGangTest, AGpuRunOnOneWorkerIsOneRankPerGpu) {
  Fixture f(DbPath("gpu_one_worker"));
  const std::string sweep = f.SubmitYaml(GpuSweep("{gpus: 2}"));
  std::vector<v1::WorkerCommand> sent;
  const std::string w = f.AddGpuWorker(&sent, 4);
  const std::vector<v1::Assignment> starts = Starts(sent);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].ranks(), 2);
  EXPECT_EQ(Ints(starts[0].device_indices()), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(starts[0].world(), 0);  // not a gang: the worker starts every rank
  const v1::Run run = f.Runs(sweep)[0];
  EXPECT_EQ(run.worker_id(), w);
  EXPECT_EQ(run.parts_size(), 0);
  EXPECT_EQ(Ints(run.device_indices()), (std::vector<int32_t>{0, 1}));
  const CoordinatorStats stats = f.c->Stats();
  EXPECT_EQ(stats.gpus_busy, 2);
  ASSERT_EQ(stats.runs.size(), 1u);
  EXPECT_EQ(stats.runs[0].ranks, 2);
  EXPECT_EQ(stats.runs[0].workers, 1);
}

TEST(CoordinatorGangTest, AGpuGangGetsOnePartPerWorkerWithItsRanksAndGpus) {
  GangFixture g("gpu_gang_parts");
  // Nothing while only w1 was there (2 of 4 GPUs): all or nothing.
  // Then one start per worker: ranks 0-1 on w1, 2-3 on w2, each part's GPUs.
  const std::vector<v1::Assignment> s1 = Starts(g.sent1), s2 = Starts(g.sent2);
  ASSERT_EQ(s1.size(), 1u);
  ASSERT_EQ(s2.size(), 1u);
  for (const auto& [a, first] : {std::make_pair(s1[0], 0), std::make_pair(s2[0], 2)}) {
    EXPECT_EQ(a.run_id(), g.run);
    EXPECT_EQ(a.first_rank(), first);
    EXPECT_EQ(a.ranks(), 2);
    EXPECT_EQ(a.world(), 4);
    EXPECT_EQ(Ints(a.device_indices()), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(a.attempt(), 1);
  }
  const v1::Run run = g.f.Run(g.run);
  EXPECT_EQ(run.state(), v1::ASSIGNED);
  EXPECT_EQ(run.worker_id(), g.w1);  // rank 0's
  EXPECT_EQ(run.device_indices_size(), 0);
  ASSERT_EQ(run.parts_size(), 2);
  EXPECT_EQ(run.parts(1).worker_id(), g.w2);
  EXPECT_EQ(Ints(run.parts(1).device_indices()), (std::vector<int32_t>{0, 1}));
  const std::vector<v1::Event> events = g.f.Events(g.run, "state");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].message(), "assigned to a gang of 4 ranks: " + g.w1 + " (ranks 0-1, GPUs 0,1) " + g.w2 +
                                     " (ranks 2-3, GPUs 0,1)");
  // Every GPU of both workers is the gang's.
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(g.f.c->ListWorkers(&workers).ok());
  for (const v1::Worker& w : workers.workers()) {
    EXPECT_EQ(std::vector<std::string>(w.run_ids().begin(), w.run_ids().end()), std::vector<std::string>{g.run});
    for (const v1::Device& d : w.devices()) EXPECT_EQ(d.run_id(), g.run) << w.id() << " GPU " << d.index();
  }
  const CoordinatorStats stats = g.f.c->Stats();
  EXPECT_EQ(stats.gpus_busy, 4);
  ASSERT_EQ(stats.runs.size(), 1u);
  EXPECT_EQ(stats.runs[0].ranks, 4);
  EXPECT_EQ(stats.runs[0].workers, 2);
  // A second gang finds no GPU: it is not given half the fleet.
  g.f.SubmitYaml(GpuSweep("{hosts: 2, gpus_per_host: 1}"));
  g.f.c->Tick();
  EXPECT_EQ(Starts(g.sent1).size(), 1u);
  EXPECT_EQ(Starts(g.sent2).size(), 1u);
}

TEST(CoordinatorGangTest, HostsTimesGpusPerHostCarriesThroughToTheRun) {
  GangFixture g("gpu_gang_hosts", "{hosts: 2, gpus_per_host: 1}");
  const v1::Run run = g.f.Run(g.run);
  EXPECT_EQ(run.hosts(), 2);
  EXPECT_EQ(run.gpus_per_host(), 1);
  EXPECT_EQ(run.gpus(), 2);
  EXPECT_EQ(g.f.Sweep(g.sweep).hosts(), 2);
  EXPECT_EQ(g.f.Sweep(g.sweep).gpus_per_host(), 1);
  ASSERT_EQ(run.parts_size(), 2);  // one GPU on each worker, though one worker has two
  EXPECT_EQ(run.parts(0).ranks(), 1);
  EXPECT_EQ(run.parts(1).ranks(), 1);
  EXPECT_NE(run.parts(0).worker_id(), run.parts(1).worker_id());
}

TEST(CoordinatorGangTest, RankZerosBootstrapIdIsRelayedToTheOtherPartsAndAgainAfterAReconnect) {
  GangFixture g("gpu_gang_bootstrap");
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Started(g.run)));
  ASSERT_TRUE(g.f.Send(g.w2, Fixture::Started(g.run)));
  ASSERT_TRUE(g.f.Send(g.w1, Bootstrap(g.run, "nccl-id-0123")));
  std::vector<v1::BootstrapId> relayed = Relays(g.sent2);
  ASSERT_EQ(relayed.size(), 1u);
  EXPECT_EQ(relayed[0].run_id(), g.run);
  EXPECT_EQ(relayed[0].id(), "nccl-id-0123");
  EXPECT_TRUE(Relays(g.sent1).empty());  // not back to rank 0's worker
  // w2's stream breaks and reconnects within its lease: it gets the id again.
  g.f.c->DetachWorker(g.w2, g.f.streams[g.w2]);
  g.f.Attach(g.w2, &g.sent2);
  relayed = Relays(g.sent2);
  ASSERT_EQ(relayed.size(), 2u);
  EXPECT_EQ(relayed[1].id(), "nccl-id-0123");
  // An id from an attempt that is not the run's current one is not relayed.
  ASSERT_TRUE(g.f.Send(g.w1, Bootstrap(g.run, "stale"), 7));
  EXPECT_EQ(Relays(g.sent2).size(), 2u);
}

TEST(CoordinatorGangTest, AnyRanksFailureStopsTheWholeGangAndRequeuesItFromItsCheckpoint) {
  GangFixture g("gpu_gang_fail");
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Started(g.run)));
  ASSERT_TRUE(g.f.Send(g.w2, Fixture::Started(g.run)));
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Checkpoint(g.run, 20, "/shared/runs/r/checkpoints/step_00000020")));
  // A rank on w2 (no rank 0) is killed: its part's launcher exits with it.
  ASSERT_TRUE(g.f.Send(g.w2, Fixture::Killed(g.run, 9)));
  v1::Run run = g.f.Run(g.run);
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(run.parts_size(), 0);  // no GPU held while queued
  EXPECT_TRUE(Cancelled(g.sent1, g.run));  // rank 0's part is stopped
  EXPECT_EQ(g.f.c->Stats().gpus_busy, 0);
  // Rank 0's part then exits (interrupted by the cancel): an attempt no longer current.
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Exit(g.run, 130)));
  EXPECT_EQ(g.f.Run(g.run).state(), v1::QUEUED);
  // After the backoff both parts start again as attempt 2 from the checkpoint.
  g.f.now += 1100;
  g.f.Heartbeat(g.w1);
  g.f.Heartbeat(g.w2);
  g.f.c->Tick();
  for (const std::vector<v1::WorkerCommand>* sent : {&g.sent1, &g.sent2}) {
    const std::vector<v1::Assignment> starts = Starts(*sent);
    ASSERT_EQ(starts.size(), 2u);
    EXPECT_EQ(starts[1].attempt(), 2);
    EXPECT_EQ(starts[1].resume_checkpoint(), "/shared/runs/r/checkpoints/step_00000020");
    EXPECT_EQ(starts[1].world(), 4);
  }
  EXPECT_EQ(g.f.Run(g.run).state(), v1::ASSIGNED);
  EXPECT_EQ(g.f.Events(g.run, "restart").size(), 1u);
}

TEST(CoordinatorGangTest, AFailedExitOfRankZerosPartStopsTheOtherParts) {
  GangFixture g("gpu_gang_rank0_fail");
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Exit(g.run, 1, "rank 1: cuda error")));
  EXPECT_EQ(g.f.Run(g.run).state(), v1::QUEUED);
  EXPECT_EQ(g.f.Run(g.run).restarts(), 1);
  EXPECT_TRUE(Cancelled(g.sent2, g.run));
}

TEST(CoordinatorGangTest, APartsLostLeaseStopsTheWholeGang) {
  GangFixture g("gpu_gang_lease");
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Started(g.run)));
  ASSERT_TRUE(g.f.Send(g.w2, Fixture::Started(g.run)));
  // w2 goes silent past its lease; w1 keeps heartbeating.
  for (int i = 0; i < 3; ++i) g.f.Pass(500, g.w1);
  v1::Run run = g.f.Run(g.run);
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_TRUE(Cancelled(g.sent1, g.run));
  EXPECT_NE(run.message().find("worker " + g.w2 + " lost"), std::string::npos) << run.message();
  // With w2 gone the gang (4 GPUs, w1 has 2) waits whole: nothing is started on w1.
  EXPECT_EQ(Starts(g.sent1).size(), 1u);
}

TEST(CoordinatorGangTest, APartWithoutRankZeroEndingAsTheGangDoesLeavesTheVerdictToRankZero) {
  GangFixture g("gpu_gang_done");
  ASSERT_TRUE(g.f.Send(g.w2, Fixture::Exit(g.run, 0)));
  EXPECT_TRUE(g.f.Run(g.run).state() == v1::ASSIGNED);
  EXPECT_FALSE(Cancelled(g.sent1, g.run));
  ASSERT_TRUE(g.f.Send(g.w1, Fixture::Exit(g.run, 0)));
  EXPECT_EQ(g.f.Run(g.run).state(), v1::SUCCEEDED);
  EXPECT_EQ(g.f.c->Stats().gpus_busy, 0);
}

}  // namespace
}  // namespace keel
