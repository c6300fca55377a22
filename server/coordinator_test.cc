// Coordinator logic without a server: cancellation, validation of worker and
// intervention requests, lease expiry with restart from the checkpoint,
// fencing of stale attempts and streams, restart backoff and deterministic
// failures, metric gaps, and recovery of everything from the store after a
// restart (a fake clock drives the leases).
#include "server/coordinator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

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
    EXPECT_TRUE(c->ListRuns(sweep, &out).ok());
    return std::vector<v1::Run>(out.runs().begin(), out.runs().end());
  }
  // A worker with one CPU slot whose stream records the commands sent to it.
  std::string AddWorker(std::vector<v1::WorkerCommand>* sent) {
    v1::RegisterRequest request;
    request.set_host("h");
    request.set_cpu_slots(1);
    v1::RegisterResponse response;
    EXPECT_TRUE(c->RegisterWorker(request, &response).ok());
    Attach(response.worker_id(), sent);
    return response.worker_id();
  }
  // Opens a (new) stream for the worker; its closes are counted in closed[id].
  void Attach(const std::string& id, std::vector<v1::WorkerCommand>* sent) {
    uint64_t stream = 0;
    EXPECT_TRUE(c->AttachWorker(
                     id,
                     [sent](const v1::WorkerCommand& cmd) {
                       sent->push_back(cmd);
                       return true;
                     },
                     [this, id] { ++closed[id]; }, &stream)
                    .ok());
    streams[id] = stream;
  }
  // A message on the worker's latest stream, from `attempt` of its run.
  bool Send(const std::string& worker, v1::WorkerMessage m, int64_t attempt = 1) {
    m.set_attempt(attempt);
    return c->HandleWorkerMessage(worker, streams[worker], m);
  }
  // The worker registers again (it reconnected), with one run still training.
  grpc::Status Reregister(const std::string& worker, const std::string& run_id, int64_t attempt,
                          v1::RegisterResponse* response) {
    v1::RegisterRequest again;
    again.set_worker_id(worker);
    again.set_cpu_slots(1);
    v1::LiveRun* live = again.add_live_runs();
    live->set_run_id(run_id);
    live->set_attempt(attempt);
    return c->RegisterWorker(again, response);
  }
  // Time passes; the worker keeps its lease with a heartbeat.
  void Pass(int64_t ms, const std::string& worker) {
    now += ms;
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_unix_ms(now);
    Send(worker, m, 0);
    c->Tick();
  }
  static v1::WorkerMessage Metric(const std::string& run_id, int64_t step) {
    v1::WorkerMessage m;
    m.mutable_metric()->set_run_id(run_id);
    m.mutable_metric()->set_step(step);
    m.mutable_metric()->set_loss(1.0 / static_cast<double>(step));
    return m;
  }
  static v1::WorkerMessage Exit(const std::string& run_id, int code, const std::string& message = "") {
    v1::WorkerMessage m;
    m.mutable_exit()->set_run_id(run_id);
    m.mutable_exit()->set_exit_code(code);
    m.mutable_exit()->set_message(message);
    return m;
  }
  std::vector<v1::Event> Events(const std::string& run_id, const std::string& kind) {
    v1::ListEventsRequest er;
    er.set_run_id(run_id);
    v1::ListEventsResponse events;
    EXPECT_TRUE(c->ListEvents(er, &events).ok());
    std::vector<v1::Event> out;
    for (const auto& e : events.events()) {
      if (e.kind() == kind) out.push_back(e);
    }
    return out;
  }

  std::string path;
  int64_t now = 1000000;
  std::unique_ptr<Coordinator> c;
  std::map<std::string, uint64_t> streams;  // worker -> its latest stream id
  std::map<std::string, int> closed;        // worker -> streams keeld closed
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
  f.Send(w1, m);
  m.Clear();
  m.mutable_checkpoint()->set_run_id(run_id);
  m.mutable_checkpoint()->set_step(20);
  m.mutable_checkpoint()->set_path("/ckpt/step_00000020");
  f.Send(w1, m);
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
  EXPECT_EQ(sent2[0].start().attempt(), 2);
  // A late message from w1 about the run is stale and changes nothing.
  EXPECT_FALSE(f.Send(w1, Fixture::Exit(run_id, 0)));
  EXPECT_EQ(f.Runs(sweep)[0].state(), v1::ASSIGNED);
  // max_restarts 1: the next failure is final.
  f.Send(w2, Fixture::Exit(run_id, 1), 2);
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
  f.Send(w1, m);
  for (int step = 1; step <= 5; ++step) f.Send(w1, Fixture::Metric(run_id, step));
  m.Clear();
  m.mutable_heartbeat()->set_unix_ms(1);
  f.Send(w1, m, 0);  // points are stored before anything else is handled
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
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w1, run_id, 1, &response).ok());
  EXPECT_EQ(response.worker_id(), w1);
  EXPECT_EQ(response.stop_run_ids_size(), 0);
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
  f.Send(w1, Fixture::Exit(a, 3));  // its policy stopped it as diverged
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

TEST(CoordinatorTest, PausedWorkerIsToldToReregisterAndStopsTheRunTakenFromIt) {
  Fixture f(DbPath("fence"));
  std::string sweep = f.Submit(1);
  std::vector<v1::WorkerCommand> sent1;
  const std::string w1 = f.AddWorker(&sent1);
  ASSERT_EQ(sent1.size(), 1u);
  const std::string run_id = sent1[0].start().run_id();
  EXPECT_EQ(sent1[0].start().attempt(), 1);
  v1::WorkerMessage started;
  started.mutable_started()->set_run_id(run_id);
  ASSERT_TRUE(f.Send(w1, started));
  // w1 is paused past its lease: keeld orders a re-register and closes its stream.
  f.now += 1500;
  f.c->Tick();
  EXPECT_EQ(f.closed[w1], 1);
  ASSERT_FALSE(sent1.empty());
  EXPECT_TRUE(sent1.back().has_reregister());
  EXPECT_EQ(f.Runs(sweep)[0].state(), v1::QUEUED);
  // What it says on that stream after waking up is refused, heartbeats included.
  v1::WorkerMessage heartbeat;
  heartbeat.mutable_heartbeat()->set_unix_ms(1);
  EXPECT_FALSE(f.Send(w1, heartbeat, 0));
  EXPECT_FALSE(f.Send(w1, Fixture::Metric(run_id, 1)));
  // Another worker resumes the run as attempt 2.
  std::vector<v1::WorkerCommand> sent2;
  const std::string w2 = f.AddWorker(&sent2);
  ASSERT_EQ(sent2.size(), 1u);
  EXPECT_EQ(sent2[0].start().run_id(), run_id);
  EXPECT_EQ(sent2[0].start().attempt(), 2);
  ASSERT_TRUE(f.Send(w2, started, 2));
  // w1 registers again with its trainer still alive: it is told to stop it.
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w1, run_id, 1, &response).ok());
  ASSERT_EQ(response.stop_run_ids_size(), 1);
  EXPECT_EQ(response.stop_run_ids(0), run_id);
  f.Attach(w1, &sent1);
  // Attempt 1's messages on the new stream are refused and counted; attempt 2 is untouched.
  EXPECT_TRUE(f.Send(w1, Fixture::Metric(run_id, 7)));
  EXPECT_TRUE(f.Send(w1, Fixture::Exit(run_id, 0)));
  v1::Run run;
  ASSERT_TRUE(f.c->GetRun(run_id, &run).ok());
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.worker_id(), w2);
  EXPECT_EQ(run.attempt(), 2);
  EXPECT_EQ(run.step(), 0);
  CoordinatorStats stats = f.c->Stats();
  EXPECT_EQ(stats.stale_messages["attempt"], 2);
  EXPECT_EQ(stats.stale_messages["lease"], 2);
  // ... and w1 gets work again (its stream counts): it is not wedged.
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(f.c->ListWorkers(&workers).ok());
  for (const v1::Worker& w : workers.workers()) EXPECT_TRUE(w.connected()) << w.id();
}

TEST(CoordinatorTest, AnOlderAttemptsExitOnTheSameWorkerIsNotTheNewOnes) {
  Fixture f(DbPath("same_worker"));
  std::string sweep = f.Submit(1);
  std::vector<v1::WorkerCommand> sent;
  const std::string w1 = f.AddWorker(&sent);
  const std::string run_id = sent[0].start().run_id();
  // Attempt 1 fails; after the backoff the same worker gets attempt 2.
  f.Send(w1, Fixture::Exit(run_id, 1, "boom"));
  f.Pass(600, w1);
  f.Pass(600, w1);
  ASSERT_EQ(sent.back().start().attempt(), 2);
  // A duplicate of attempt 1's exit (resent after a reconnect) is refused.
  f.Send(w1, Fixture::Exit(run_id, 0));
  v1::Run run;
  ASSERT_TRUE(f.c->GetRun(run_id, &run).ok());
  EXPECT_EQ(run.state(), v1::ASSIGNED);
  EXPECT_EQ(f.c->Stats().stale_messages["attempt"], 1);
}

TEST(CoordinatorTest, FailedTrainersBackOffAndDeterministicFailuresFailAtOnce) {
  Fixture f(DbPath("backoff"));
  v1::SweepSpec spec;
  spec.set_yaml("name: t\nbase: {model: {type: proxy, layers: 1, width: 16}, steps: 50}\n"
                "axes:\n  - grid: {seed: [1, 2]}\nmax_restarts: 5\n");
  v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(f.c->SubmitSweep(spec, &submitted).ok());
  std::vector<v1::WorkerCommand> sent;
  const std::string w1 = f.AddWorker(&sent);
  ASSERT_EQ(sent.size(), 1u);
  const std::string a = sent[0].start().run_id();
  // A first failure: requeued, but not assigned again before its backoff (1 s).
  f.Send(w1, Fixture::Exit(a, 1, "checkpoint step_00000020: CRC mismatch"));
  v1::Run run;
  ASSERT_TRUE(f.c->GetRun(a, &run).ok());
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.not_before_unix_ms(), f.now + 1000);
  const std::string b = sent.back().start().run_id();  // the free slot went to the other run
  EXPECT_NE(a, b);
  f.Send(w1, Fixture::Exit(b, 2, "run.yaml:3:5: model.width: 0 (allowed: >= 1)"));
  // A configuration error (exit 2) fails at once: no restart can fix it.
  ASSERT_TRUE(f.c->GetRun(b, &run).ok());
  EXPECT_EQ(run.state(), v1::FAILED);
  EXPECT_EQ(run.restarts(), 0);
  f.Pass(500, w1);
  ASSERT_TRUE(f.c->GetRun(a, &run).ok());
  EXPECT_EQ(run.state(), v1::QUEUED);  // still backing off
  f.Pass(600, w1);
  ASSERT_TRUE(f.c->GetRun(a, &run).ok());
  EXPECT_EQ(run.state(), v1::ASSIGNED);
  // The same failure at the same step again: deterministic, FAILED with 4 restarts left.
  f.Send(w1, Fixture::Exit(a, 1, "checkpoint step_00000020: CRC mismatch"), 2);
  ASSERT_TRUE(f.c->GetRun(a, &run).ok());
  EXPECT_EQ(run.state(), v1::FAILED);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_NE(run.message().find("the same failure at the same step"), std::string::npos) << run.message();
}

TEST(CoordinatorTest, MissingStepsAreReportedAsGaps) {
  Fixture f(DbPath("gaps"));
  f.Submit(1);
  std::vector<v1::WorkerCommand> sent;
  const std::string w1 = f.AddWorker(&sent);
  const std::string run_id = sent[0].start().run_id();
  for (int step : {1, 2, 3, 7, 8, 3, 4, 5, 6, 7, 8, 9, 10}) f.Send(w1, Fixture::Metric(run_id, step));
  // 4..6 never came before 7; resending from an earlier step is not a gap.
  std::vector<v1::Event> gaps = f.Events(run_id, "metrics_gap");
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].details().at("first_step"), "4");
  EXPECT_EQ(gaps[0].details().at("last_step"), "6");
  // It finishes (50 steps) but the points after step 10 never arrived.
  f.Send(w1, Fixture::Exit(run_id, 0));
  gaps = f.Events(run_id, "metrics_gap");
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_EQ(gaps[1].details().at("first_step"), "11");
  EXPECT_EQ(gaps[1].details().at("last_step"), "50");
  CoordinatorStats stats = f.c->Stats();
  EXPECT_EQ(stats.metric_gaps, 2);
  EXPECT_EQ(stats.metric_points_missing, 3 + 40);
}

}  // namespace
}  // namespace keel
