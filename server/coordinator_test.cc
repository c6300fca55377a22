// Coordinator logic without a server: cancellation, validation of worker and
// intervention requests, lease expiry with restart from the checkpoint, and
// recovery of everything from the store after a restart (a fake clock drives
// the leases).
#include "server/coordinator.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace keel {
namespace {

std::string DbPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string path = std::string(base ? base : "/tmp") + "/" + name + ".db";
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return path;
}

struct Fixture {
  explicit Fixture(const std::string& db) : path(db) { Open(); }
  void Open() {
    std::unique_ptr<Store> store;
    ASSERT_TRUE(OpenSqliteStore(path, &store).ok());
    CoordinatorOptions options;
    options.lease_ms = 1000;
    options.now_ms = [this] { return now; };
    ASSERT_TRUE(Coordinator::Open(std::move(store), options, &c).ok());
  }
  std::string Submit(int runs) {
    std::string seeds;
    for (int i = 0; i < runs; ++i) seeds += (i ? ", " : "") + std::to_string(i + 1);
    v1::SweepSpec spec;
    spec.set_yaml("name: t\nbase: {model: {type: proxy, layers: 1, width: 16}, steps: 50}\n"
                  "axes:\n  - grid: {seed: [" + seeds + "]}\nmax_restarts: 1\n");
    v1::SubmitSweepResponse out;
    EXPECT_TRUE(c->SubmitSweep(spec, &out).ok());
    return out.sweep().id();
  }
  std::vector<v1::Run> Runs(const std::string& sweep) {
    v1::ListRunsResponse out;
    v1::ListRunsRequest request;
    request.set_sweep_id(sweep);
    EXPECT_TRUE(c->ListRuns(request, &out).ok());
    return std::vector<v1::Run>(out.runs().begin(), out.runs().end());
  }
  // A worker with one CPU slot whose stream records the commands sent to it.
  std::string AddWorker(std::vector<v1::WorkerCommand>* sent) {
    v1::RegisterRequest request;
    request.set_host("h");
    request.set_cpu_slots(1);
    v1::RegisterResponse response;
    EXPECT_TRUE(c->RegisterWorker(request, &response).ok());
    uint64_t stream = 0;
    EXPECT_TRUE(c->AttachWorker(response.worker_id(), [sent](const v1::WorkerCommand& cmd) {
                   sent->push_back(cmd);
                   return true;
                 }, &stream).ok());
    return response.worker_id();
  }

  std::string path;
  int64_t now = 1000000;
  std::unique_ptr<Coordinator> c;
};

TEST(CoordinatorTest, CancelSweepEndsQueuedRunsAndStopsScheduling) {
  Fixture f(DbPath("cancel"));
  std::string sweep = f.Submit(3);
  v1::Sweep out;
  ASSERT_TRUE(f.c->CancelSweep(sweep, &out).ok());
  EXPECT_EQ(out.state(), v1::SWEEP_CANCELLED);
  for (const v1::Run& r : f.Runs(sweep)) EXPECT_EQ(r.state(), v1::CANCELLED) << r.id();
  std::vector<v1::WorkerCommand> sent;
  f.AddWorker(&sent);
  f.c->Tick();
  EXPECT_TRUE(sent.empty());  // nothing of a cancelled sweep is assigned
  v1::Run run;
  EXPECT_EQ(f.c->CancelRun(f.Runs(sweep)[0].id(), &run).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(CoordinatorTest, RefusesBadWorkersAndInterventionsWithoutChangingState) {
  Fixture f(DbPath("refuse"));
  v1::RegisterRequest request;  // neither GPUs nor CPU slots
  v1::RegisterResponse response;
  EXPECT_EQ(f.c->RegisterWorker(request, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(f.c->ListWorkers(&workers).ok());
  EXPECT_EQ(workers.workers_size(), 0);
  std::string sweep = f.Submit(1);
  v1::InterveneRequest intervene;
  intervene.set_run_id(f.Runs(sweep)[0].id());
  intervene.set_precision("bf16");
  v1::InterveneResponse out;
  EXPECT_EQ(f.c->Intervene(intervene, &out).error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // queued
  intervene.set_precision("mxfp9");
  EXPECT_EQ(f.c->Intervene(intervene, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  intervene.set_run_id("run-404");
  EXPECT_EQ(f.c->Intervene(intervene, &out).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(CoordinatorTest, LostLeaseRequeuesFromTheCheckpointThenFailsPastMaxRestarts) {
  Fixture f(DbPath("lease"));
  std::string sweep = f.Submit(1);
  std::vector<v1::WorkerCommand> sent;
  std::string w1 = f.AddWorker(&sent);
  ASSERT_EQ(sent.size(), 1u);
  const std::string run_id = sent[0].start().run_id();
  EXPECT_TRUE(sent[0].start().resume_checkpoint().empty());
  v1::WorkerMessage m;
  m.mutable_started()->set_run_id(run_id);
  f.c->HandleWorkerMessage(w1, m);
  m.Clear();
  m.mutable_checkpoint()->set_run_id(run_id);
  m.mutable_checkpoint()->set_step(20);
  m.mutable_checkpoint()->set_path("/ckpt/step_00000020");
  f.c->HandleWorkerMessage(w1, m);
  EXPECT_EQ(f.Runs(sweep)[0].state(), v1::RUNNING);
  f.now += 1500;  // w1 is silent past its lease
  f.c->Tick();
  v1::Run run = f.Runs(sweep)[0];
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.restarts(), 1);
  std::vector<v1::WorkerCommand> sent2;
  std::string w2 = f.AddWorker(&sent2);
  ASSERT_EQ(sent2.size(), 1u);
  EXPECT_EQ(sent2[0].start().resume_checkpoint(), "/ckpt/step_00000020");  // resumes, not restarts
  // A late message from w1 about the run is stale and changes nothing.
  m.Clear();
  m.mutable_exit()->set_run_id(run_id);
  m.mutable_exit()->set_exit_code(0);
  f.c->HandleWorkerMessage(w1, m);
  EXPECT_EQ(f.Runs(sweep)[0].state(), v1::ASSIGNED);
  // max_restarts 1: the next failure is final.
  m.mutable_exit()->set_exit_code(1);
  f.c->HandleWorkerMessage(w2, m);
  run = f.Runs(sweep)[0];
  EXPECT_EQ(run.state(), v1::FAILED);
  v1::ListEventsRequest er;
  er.set_run_id(run_id);
  v1::ListEventsResponse events;
  ASSERT_TRUE(f.c->ListEvents(er, &events).ok());
  int restarts = 0;
  for (const auto& e : events.events()) restarts += e.kind() == "restart";
  EXPECT_EQ(restarts, 1);
}

TEST(CoordinatorTest, RecoversEverythingAfterARestart) {
  Fixture f(DbPath("recover"));
  std::string sweep = f.Submit(2);
  std::vector<v1::WorkerCommand> sent;
  std::string w1 = f.AddWorker(&sent);
  const std::string run_id = sent[0].start().run_id();
  v1::WorkerMessage m;
  m.mutable_started()->set_run_id(run_id);
  f.c->HandleWorkerMessage(w1, m);
  for (int step = 1; step <= 5; ++step) {
    m.Clear();
    m.mutable_metric()->set_run_id(run_id);
    m.mutable_metric()->set_step(step);
    m.mutable_metric()->set_loss(1.0 / step);
    f.c->HandleWorkerMessage(w1, m);
  }
  m.Clear();
  m.mutable_heartbeat()->set_unix_ms(1);
  f.c->HandleWorkerMessage(w1, m);  // points are stored before anything else is handled
  f.c.reset();                     // keeld goes away
  f.Open();
  std::vector<v1::Run> runs = f.Runs(sweep);
  ASSERT_EQ(runs.size(), 2u);
  v1::GetMetricsRequest gm;
  gm.set_run_id(run_id);
  v1::GetMetricsResponse points;
  ASSERT_TRUE(f.c->GetMetrics(gm, &points).ok());
  EXPECT_EQ(points.points_size(), 5);
  v1::Run run;
  ASSERT_TRUE(f.c->GetRun(run_id, &run).ok());
  EXPECT_EQ(run.state(), v1::RUNNING);  // waits one lease for its worker to come back
  // The worker re-registers with the run alive: it stays, no restart.
  v1::RegisterRequest again;
  again.set_worker_id(w1);
  again.set_cpu_slots(1);
  again.add_live_run_ids(run_id);
  v1::RegisterResponse response;
  ASSERT_TRUE(f.c->RegisterWorker(again, &response).ok());
  EXPECT_EQ(response.worker_id(), w1);
  f.now += 500;
  f.c->Tick();
  ASSERT_TRUE(f.c->GetRun(run_id, &run).ok());
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.restarts(), 0);
}

TEST(CoordinatorTest, SweepRuleSwitchesTheSchemesOtherRunsAfterADivergence) {
  Fixture f(DbPath("sweep_rule"));
  v1::SweepSpec spec;
  spec.set_yaml("name: t\nbase: {model: {type: proxy, layers: 1, width: 16}, steps: 50, precision: mxfp4}\n"
                "axes:\n  - grid: {seed: [1, 2, 3]}\n"
                "policy:\n  sweep_rules:\n    - {when_diverged: 1, scheme: mxfp4, switch: bf16}\n");
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(f.c->SubmitSweep(spec, &submitted).ok());
  std::vector<v1::WorkerCommand> sent1, sent2;
  std::string w1 = f.AddWorker(&sent1), w2 = f.AddWorker(&sent2);
  ASSERT_EQ(sent1.size(), 1u);
  ASSERT_EQ(sent2.size(), 1u);
  const std::string a = sent1[0].start().run_id(), b = sent2[0].start().run_id();
  v1::WorkerMessage m;
  m.mutable_exit()->set_run_id(a);
  m.mutable_exit()->set_exit_code(3);  // its policy stopped it as diverged
  f.c->HandleWorkerMessage(w1, m);
  v1::Run run;
  ASSERT_TRUE(f.c->GetRun(a, &run).ok());
  EXPECT_EQ(run.state(), v1::DIVERGED);
  EXPECT_EQ(run.restarts(), 0);  // diverged runs are not restarted
  // The running one is told to switch...
  ASSERT_GE(sent2.size(), 2u);
  EXPECT_EQ(sent2[1].switch_precision().run_id(), b);
  EXPECT_EQ(sent2[1].switch_precision().precision(), "bf16");
  // ...and the queued one, now started on w1's free slot, starts in bf16.
  bool queued_started_in_bf16 = false;
  for (const v1::WorkerCommand& c : sent1) {
    if (c.has_start() && c.start().run_id() != a) {
      queued_started_in_bf16 = c.start().spec().yaml().find("precision: bf16") != std::string::npos;
    }
  }
  EXPECT_TRUE(queued_started_in_bf16);
  v1::ListEventsRequest er;
  er.set_sweep_id(submitted.sweep().id());
  v1::ListEventsResponse events;
  ASSERT_TRUE(f.c->ListEvents(er, &events).ok());
  int rule_events = 0;
  for (const auto& e : events.events()) rule_events += e.kind() == "sweep_rule";
  EXPECT_EQ(rule_events, 2);
}

}  // namespace
}  // namespace keel
