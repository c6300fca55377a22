// Coordinator logic without a server: cancellation, validation of worker and
// intervention requests, lease expiry with restart from the checkpoint,
// fencing of stale attempts and streams, restart backoff and deterministic
// failures, metric gaps, and recovery of everything from the store after a
// restart (a fake clock drives the leases; the fixture is in
// coordinator_test_util.h). The run state machine, one transition per test,
// is tested in coordinator_state_test.cc.
#include "server/coordinator.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "server/coordinator_test_util.h"

namespace keel {
namespace {

using coordinator_test::DbPath;
using coordinator_test::Fixture;

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
  intervene.set_precision("mxfp4+bf16_head");  // a name the policies' ladders use: valid, but the run is queued
  EXPECT_EQ(f.c->Intervene(intervene, &out).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  intervene.set_precision("mxfp9");
  EXPECT_EQ(f.c->Intervene(intervene, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  intervene.set_precision("mxfp4+bf16");
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
  EXPECT_EQ(f.Events(run_id, "restart").size(), 1u);
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

// Walks every page of ListRuns(sweep) with `page_size`; `between` runs after
// each page (inserts that must not shift the pages).
std::vector<std::string> AllRunIds(Coordinator* c, const std::string& sweep, int page_size,
                                   const std::function<void()>& between = nullptr) {
  std::vector<std::string> ids;
  v1::ListRunsRequest request;
  request.set_sweep_id(sweep);
  request.set_page_size(page_size);
  for (int pages = 0; pages < 1000; ++pages) {
    v1::ListRunsResponse out;
    grpc::Status s = c->ListRuns(request, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (page_size > 0) {
      EXPECT_LE(out.runs_size(), page_size);
    }
    for (const v1::Run& r : out.runs()) ids.push_back(r.id());
    if (out.next_page_token().empty()) break;
    request.set_page_token(out.next_page_token());
    if (between) between();
  }
  return ids;
}

TEST(CoordinatorTest, ListRunsPagesReturnEveryRunOnceInOrderWhileSweepsArrive) {
  Fixture f(DbPath("page_runs"));
  std::vector<std::string> sweeps, expected;
  for (int i = 0; i < 3; ++i) sweeps.push_back(f.Submit(5));
  for (const std::string& sw : sweeps) {
    for (const v1::Run& r : f.Runs(sw)) expected.push_back(r.id());
  }
  // Sweeps submitted between pages come after every run listed so far.
  std::vector<std::string> added;
  std::vector<std::string> all = AllRunIds(f.c.get(), "", 4, [&] {
    if (added.size() < 2) added.push_back(f.Submit(3));
  });
  for (const std::string& sw : added) {
    for (const v1::Run& r : f.Runs(sw)) expected.push_back(r.id());
  }
  EXPECT_EQ(all, expected);
  // One sweep, pages of 2: its 5 runs by index, then the end.
  std::vector<std::string> one = AllRunIds(f.c.get(), sweeps[1], 2);
  EXPECT_EQ(one, std::vector<std::string>(expected.begin() + 5, expected.begin() + 10));
  // page_size 0 is the default (everything here), a huge one is clamped.
  EXPECT_EQ(AllRunIds(f.c.get(), "", 0).size(), expected.size());
  v1::ListRunsRequest request;
  request.set_page_size(1 << 30);
  v1::ListRunsResponse out;
  ASSERT_TRUE(f.c->ListRuns(request, &out).ok());
  EXPECT_EQ(out.runs_size(), static_cast<int>(expected.size()));
  EXPECT_TRUE(out.next_page_token().empty());
}

TEST(CoordinatorTest, ListSweepsPagesInCreationOrder) {
  Fixture f(DbPath("page_sweeps"));
  std::vector<std::string> expected;
  for (int i = 0; i < 11; ++i) expected.push_back(f.Submit(1));  // sweep-10 sorts after sweep-9
  std::vector<std::string> got;
  v1::ListSweepsRequest request;
  request.set_page_size(3);
  for (;;) {
    v1::ListSweepsResponse out;
    ASSERT_TRUE(f.c->ListSweeps(request, &out).ok());
    for (const v1::Sweep& s : out.sweeps()) {
      got.push_back(s.id());
      EXPECT_EQ(s.runs_total(), 1);
    }
    if (out.next_page_token().empty()) break;
    request.set_page_token(out.next_page_token());
  }
  EXPECT_EQ(got, expected);
}

TEST(CoordinatorTest, BadPageTokensAndSizesAreRefusedNamingTheField) {
  Fixture f(DbPath("page_bad"));
  const std::string a = f.Submit(3), b = f.Submit(3);
  v1::ListRunsRequest request;
  request.set_sweep_id(a);
  request.set_page_size(1);
  v1::ListRunsResponse first;
  ASSERT_TRUE(f.c->ListRuns(request, &first).ok());
  ASSERT_FALSE(first.next_page_token().empty());
  auto refused = [](const grpc::Status& s, const std::string& value) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("page_token: '" + value + "'"), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("allowed"), std::string::npos) << s.error_message();
  };
  // Malformed, and a token of sweep a's listing used for sweep b.
  for (const std::string& token : {std::string("garbage"), std::string("runs/") + a + "/" + a + "/x", first.next_page_token()}) {
    v1::ListRunsRequest bad;
    bad.set_sweep_id(token == first.next_page_token() ? b : a);
    bad.set_page_token(token);
    v1::ListRunsResponse out;
    refused(f.c->ListRuns(bad, &out), token);
    EXPECT_EQ(out.runs_size(), 0);
  }
  // A ListRuns token given to ListEvents, GetMetrics and ListSweeps.
  v1::ListEventsRequest events;
  events.set_sweep_id(a);
  events.set_page_token(first.next_page_token());
  v1::ListEventsResponse events_out;
  refused(f.c->ListEvents(events, &events_out), first.next_page_token());
  v1::GetMetricsRequest metrics;
  metrics.set_run_id(first.runs(0).id());
  metrics.set_page_token(first.next_page_token());
  v1::GetMetricsResponse metrics_out;
  refused(f.c->GetMetrics(metrics, &metrics_out), first.next_page_token());
  v1::ListSweepsRequest sweeps;
  sweeps.set_page_token(first.next_page_token());
  v1::ListSweepsResponse sweeps_out;
  refused(f.c->ListSweeps(sweeps, &sweeps_out), first.next_page_token());
  // Negative page sizes.
  request.set_page_size(-1);
  grpc::Status s = f.c->ListRuns(request, &first);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("page_size: -1"), std::string::npos) << s.error_message();
  events.clear_page_token();
  events.set_page_size(-5);
  EXPECT_EQ(f.c->ListEvents(events, &events_out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(CoordinatorTest, ListEventsPagesFollowTheStoreOrder) {
  Fixture f(DbPath("page_events"));
  const std::string sweep = f.Submit(6);
  v1::Sweep cancelled;
  ASSERT_TRUE(f.c->CancelSweep(sweep, &cancelled).ok());  // one event per run
  v1::ListEventsRequest request;
  request.set_sweep_id(sweep);
  v1::ListEventsResponse all;
  ASSERT_TRUE(f.c->ListEvents(request, &all).ok());
  ASSERT_EQ(all.events_size(), 6);
  EXPECT_TRUE(all.next_page_token().empty());
  request.set_page_size(4);
  std::vector<std::string> got;
  for (;;) {
    v1::ListEventsResponse out;
    ASSERT_TRUE(f.c->ListEvents(request, &out).ok());
    for (const v1::Event& e : out.events()) got.push_back(e.run_id());
    if (out.next_page_token().empty()) break;
    request.set_page_token(out.next_page_token());
  }
  std::vector<std::string> expected;
  for (const v1::Event& e : all.events()) expected.push_back(e.run_id());
  EXPECT_EQ(got, expected);
}

TEST(CoordinatorTest, CancelSweepEndsEveryQueuedRunWithOneEventEach) {
  Fixture f(DbPath("cancel_batch"));
  const std::string sweep = f.Submit(40);
  v1::Sweep out;
  ASSERT_TRUE(f.c->CancelSweep(sweep, &out).ok());
  EXPECT_EQ(out.runs_by_state().at("CANCELLED"), 40);
  v1::ListEventsRequest request;
  request.set_sweep_id(sweep);
  v1::ListEventsResponse events;
  ASSERT_TRUE(f.c->ListEvents(request, &events).ok());
  ASSERT_EQ(events.events_size(), 40);
  for (const v1::Event& e : events.events()) EXPECT_EQ(e.details().at("state"), "CANCELLED");
  // And it is what a restarted keeld reads back.
  f.c.reset();
  f.Open();
  for (const v1::Run& r : f.Runs(sweep)) {
    EXPECT_EQ(r.state(), v1::CANCELLED) << r.id();
    EXPECT_EQ(r.message(), "cancelled by the user");
  }
}

}  // namespace
}  // namespace keel
