// The run state machine of coordinator.h, one transition per test, driven
// through the Coordinator's public API the way keel-worker and the keel CLI
// drive it: QUEUED -> ASSIGNED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED |
// DIVERGED; restarts after a failed trainer, a lost lease or a worker that
// came back without its run; fencing of old attempts; and re-attaching after
// keeld restarts on the same store file. Each test checks the run's state,
// attempt and restarts, the events stored and what the worker is told.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/coordinator.h"
#include "server/coordinator_test_util.h"

namespace keel {
namespace {

using coordinator_test::DbPath;
using coordinator_test::Fixture;
using coordinator_test::Starts;
using coordinator_test::TestOptions;

// The run's stored events as "kind STATE" (the state they record), in order.
std::vector<std::string> EventStates(Fixture& f, const std::string& run_id) {
  std::vector<std::string> out;
  for (const v1::Event& e : f.Events(run_id)) {
    auto state = e.details().find("state");
    out.push_back(e.kind() + " " + (state == e.details().end() ? "-" : state->second));
  }
  return out;
}

// The run's newest stored event of `kind` (any kind when empty); a test
// failure, and an empty event, when it has none.
v1::Event LastEvent(Fixture& f, const std::string& run_id, const std::string& kind = "") {
  const std::vector<v1::Event> events = f.Events(run_id, kind);
  if (events.empty()) {
    ADD_FAILURE() << "run " << run_id << " has no event" << (kind.empty() ? "" : " of kind " + kind);
    return v1::Event();
  }
  return events.back();
}

using Strings = std::vector<std::string>;

// Time passes, well past any restart backoff, and the worker has still had
// only `starts` start orders: what ended is never assigned again.
void ExpectNoStartLater(Fixture& f, const std::string& worker, const std::vector<v1::WorkerCommand>& sent,
                        size_t starts) {
  f.Pass(5000, worker);
  EXPECT_EQ(Starts(sent).size(), starts);
}

// The run ended `state` on its first attempt, from RUNNING and without a
// restart: its message, its events (ASSIGNED, RUNNING, then `state`) and the
// message of the last one.
void ExpectEndedFromRunning(Fixture& f, const std::string& run_id, v1::RunState state, const std::string& message,
                            const std::string& event_message) {
  const v1::Run run = f.Run(run_id);
  EXPECT_EQ(run.state(), state) << run_id;
  EXPECT_EQ(run.attempt(), 1) << run_id;
  EXPECT_EQ(run.restarts(), 0) << run_id;
  EXPECT_EQ(run.message(), message) << run_id;
  EXPECT_EQ(EventStates(f, run_id), (Strings{"state ASSIGNED", "state RUNNING", "state " + v1::RunState_Name(state)}));
  EXPECT_EQ(LastEvent(f, run_id).message(), event_message);
}

// The metric points of the run in the store (GetMetrics flushes what is buffered).
int StoredPoints(Fixture& f, const std::string& run_id) {
  v1::GetMetricsRequest request;
  request.set_run_id(run_id);
  v1::GetMetricsResponse points;
  EXPECT_TRUE(f.c->GetMetrics(request, &points).ok());
  return points.points_size();
}

// Whether ListWorkers shows the worker with a stream keeld counts as its own.
bool Connected(Fixture& f, const std::string& worker_id) {
  v1::ListWorkersResponse workers;
  EXPECT_TRUE(f.c->ListWorkers(&workers).ok());
  for (const v1::Worker& w : workers.workers()) {
    if (w.id() == worker_id) return w.connected();
  }
  ADD_FAILURE() << "worker " << worker_id << " not listed";
  return false;
}

// ---- submitted -> QUEUED ----------------------------------------------------------

TEST(CoordinatorStateTest, SubmittedRunsAreQueuedWithoutAnAttempt) {
  Fixture f(DbPath("state_submitted"));
  const std::string sweep = f.Submit(3);
  f.c->Tick();  // no worker: nothing can be placed
  std::vector<v1::Run> runs = f.Runs(sweep);
  ASSERT_EQ(runs.size(), 3u);
  for (const v1::Run& r : runs) {
    EXPECT_EQ(r.state(), v1::QUEUED) << r.id();
    EXPECT_EQ(r.attempt(), 0) << r.id();
    EXPECT_EQ(r.restarts(), 0) << r.id();
    EXPECT_EQ(r.worker_id(), "") << r.id();
    EXPECT_EQ(r.checkpoint(), "") << r.id();
    EXPECT_TRUE(f.Events(r.id()).empty()) << r.id() << ": submitting stores no run event";
  }
  const v1::Sweep s = f.Sweep(sweep);
  EXPECT_EQ(s.state(), v1::SWEEP_ACTIVE);
  EXPECT_EQ(s.runs_total(), 3);
  EXPECT_EQ(s.runs_by_state().at("QUEUED"), 3);
  // Stored before SubmitSweep returned: a restarted keeld reads them back queued.
  f.Reopen();
  for (const v1::Run& r : f.Runs(sweep)) EXPECT_EQ(r.state(), v1::QUEUED) << r.id();
  // A refused sweep creates nothing.
  v1::SweepSpec bad;
  bad.set_yaml("name: t\n");
  v1::SubmitSweepResponse out;
  EXPECT_EQ(f.c->SubmitSweep(bad, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ListSweepsResponse sweeps;
  ASSERT_TRUE(f.c->ListSweeps(v1::ListSweepsRequest(), &sweeps).ok());
  EXPECT_EQ(sweeps.sweeps_size(), 1);
}

// ---- QUEUED -> ASSIGNED --------------------------------------------------------------

TEST(CoordinatorStateTest, QueuedRunIsAssignedAsAttemptOneWhenAWorkerStreamHasRoom) {
  Fixture f(DbPath("state_assigned"));
  const std::string sweep = f.SubmitYaml("name: g\nbase: {model: {type: proxy, layers: 1, width: 16}, steps: 50}\n"
                                         "axes:\n  - grid: {seed: [1, 2, 3]}\nresources: {gpus: 1}\n");
  const std::vector<v1::Run> runs = f.Runs(sweep);
  ASSERT_EQ(runs.size(), 3u);
  // Registered but without a stream yet: nothing is placed on it.
  v1::RegisterRequest request;
  request.set_host("g");
  for (int i : {0, 1}) request.add_devices()->set_index(i);
  v1::RegisterResponse response;
  ASSERT_TRUE(f.c->RegisterWorker(request, &response).ok());
  const std::string w = response.worker_id();
  f.c->Tick();
  EXPECT_EQ(f.Run(runs[0].id()).state(), v1::QUEUED);
  // Its stream opens: the first two runs (by index) get one GPU each.
  std::vector<v1::WorkerCommand> sent;
  f.Attach(w, &sent);
  const std::vector<v1::Assignment> starts = Starts(sent);
  ASSERT_EQ(starts.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const v1::Run run = f.Run(runs[i].id());
    EXPECT_EQ(run.state(), v1::ASSIGNED);
    EXPECT_EQ(run.worker_id(), w);
    EXPECT_EQ(run.attempt(), 1);
    ASSERT_EQ(run.device_indices_size(), 1);
    EXPECT_EQ(run.device_indices(0), i);
    // What the worker is told: the run, its spec, its GPU, a fresh start, attempt 1.
    EXPECT_EQ(starts[i].run_id(), run.id());
    EXPECT_EQ(starts[i].spec().yaml(), run.spec().yaml());
    ASSERT_EQ(starts[i].device_indices_size(), 1);
    EXPECT_EQ(starts[i].device_indices(0), i);
    EXPECT_EQ(starts[i].resume_checkpoint(), "");
    EXPECT_EQ(starts[i].attempt(), 1);
    const std::vector<v1::Event> events = f.Events(run.id());
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind(), "state");
    EXPECT_EQ(events[0].details().at("state"), "ASSIGNED");
    EXPECT_EQ(events[0].message(), "assigned to " + w + " (GPUs " + std::to_string(i) + ")");
  }
  const v1::Run third = f.Run(runs[2].id());
  EXPECT_EQ(third.state(), v1::QUEUED);  // no GPU left
  EXPECT_EQ(third.attempt(), 0);
}

// ---- ASSIGNED -> RUNNING -------------------------------------------------------------

TEST(CoordinatorStateTest, AssignedRunIsRunningOnceItsTrainerStarted) {
  Fixture f(DbPath("state_running"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/1, /*start=*/false);
  EXPECT_EQ(f.Run(id).state(), v1::ASSIGNED);
  ASSERT_TRUE(f.Send(w, Fixture::Started(id, 777)));
  const v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.attempt(), 1);  // starting is not a new attempt
  EXPECT_EQ(run.worker_id(), w);
  EXPECT_EQ(EventStates(f, id), (Strings{"state ASSIGNED", "state RUNNING"}));
  EXPECT_EQ(LastEvent(f, id).message(), "trainer started on " + w + " (pid 777)");
  f.Reopen();
  EXPECT_EQ(f.Run(id).state(), v1::RUNNING);
}

// ---- RUNNING -> SUCCEEDED ------------------------------------------------------------

TEST(CoordinatorStateTest, RunningRunSucceedsOnExitZeroAndItsSlotGoesToTheNextRun) {
  Fixture f(DbPath("state_succeeded"));
  const std::string sweep = f.Submit(2);
  std::vector<v1::WorkerCommand> sent;
  const std::string w = f.AddWorker(&sent);
  ASSERT_EQ(Starts(sent).size(), 1u);
  const std::string a = Starts(sent)[0].run_id();
  ASSERT_TRUE(f.Send(w, Fixture::Started(a)));
  ASSERT_TRUE(f.Send(w, Fixture::Exit(a, 0)));
  ExpectEndedFromRunning(f, a, v1::SUCCEEDED, "", "finished");
  // The freed slot went to the other run at once; the sweep ends with it.
  ASSERT_EQ(Starts(sent).size(), 2u);
  const std::string b = Starts(sent)[1].run_id();
  EXPECT_NE(a, b);
  EXPECT_EQ(f.Run(b).state(), v1::ASSIGNED);
  EXPECT_EQ(f.Sweep(sweep).state(), v1::SWEEP_ACTIVE);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(b, 0)));
  EXPECT_EQ(f.Sweep(sweep).state(), v1::SWEEP_DONE);
  f.Reopen();
  EXPECT_EQ(f.Run(a).state(), v1::SUCCEEDED);
  EXPECT_EQ(f.Run(b).state(), v1::SUCCEEDED);
  EXPECT_EQ(f.Sweep(sweep).state(), v1::SWEEP_DONE);
}

// ---- RUNNING -> FAILED ---------------------------------------------------------------

TEST(CoordinatorStateTest, ConfigurationErrorFailsTheRunAtOnceWithRestartsLeft) {
  Fixture f(DbPath("state_failed_config"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/3);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 2, "run.yaml:3:5: model.width: 0 (allowed: >= 1)")));
  const std::string why =
      "trainer exit code 2: run.yaml:3:5: model.width: 0 (allowed: >= 1) (a configuration error: a restart cannot "
      "fix it)";
  ExpectEndedFromRunning(f, id, v1::FAILED, why, why);
  ExpectNoStartLater(f, w, sent, 1);
  EXPECT_EQ(f.Run(id).state(), v1::FAILED);
}

TEST(CoordinatorStateTest, FailedTrainerFailsTheRunOnceItsRestartsAreSpent) {
  Fixture f(DbPath("state_failed_spent"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/1, /*start=*/false);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 1, "out of memory")));
  EXPECT_EQ(f.Run(id).state(), v1::QUEUED);
  f.Pass(1000, w);  // the first backoff
  ASSERT_EQ(Starts(sent).size(), 2u);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 1, "NCCL timeout"), 2));
  const v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::FAILED);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(run.message(), "trainer exit code 1: NCCL timeout");
  EXPECT_EQ(EventStates(f, id), (Strings{"state ASSIGNED", "restart QUEUED", "state ASSIGNED", "state FAILED"}));
  EXPECT_EQ(LastEvent(f, id).message(), "trainer exit code 1: NCCL timeout; no restarts left (max_restarts 1)");
  ExpectNoStartLater(f, w, sent, 2);
}

// ---- restart: a failed trainer -> QUEUED -> ASSIGNED (next attempt) ------------------

TEST(CoordinatorStateTest, FailedTrainerRestartsFromItsNewestCheckpointAfterADoublingBackoff) {
  CoordinatorOptions options = TestOptions();
  options.restart_backoff_ms = 100;
  options.max_restart_backoff_ms = 300;
  Fixture f(DbPath("state_restart_backoff"), options);
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/5);
  ASSERT_TRUE(f.Send(w, Fixture::Checkpoint(id, 10, "/ckpt/step_00000010")));
  ASSERT_TRUE(f.Send(w, Fixture::Checkpoint(id, 20, "/ckpt/step_00000020")));
  // Three failures in a row, none the same as the one before (the first and the
  // third are alike, but not consecutive): each restarts, after 100, 200, then
  // 300 ms (restart_backoff_ms doubled per restart, capped at max_restart_backoff_ms).
  const std::vector<v1::WorkerMessage> failures = {Fixture::Exit(id, 1, "boom"), Fixture::Killed(id, 9),
                                                   Fixture::Exit(id, 1, "boom")};
  const std::vector<std::string> hows = {"exit code 1: boom", "killed by signal 9", "exit code 1: boom"};
  const int64_t backoffs[] = {100, 200, 300};
  for (int k = 0; k < 3; ++k) {
    const int64_t attempt = k + 1;
    ASSERT_TRUE(f.Send(w, failures[k], attempt));
    const v1::Run run = f.Run(id);
    EXPECT_EQ(run.state(), v1::QUEUED) << "failure " << k;
    EXPECT_EQ(run.restarts(), k + 1);
    EXPECT_EQ(run.attempt(), attempt);  // the next attempt begins at the next assignment
    EXPECT_EQ(run.worker_id(), "");
    EXPECT_EQ(run.not_before_unix_ms(), f.now + backoffs[k]);
    EXPECT_EQ(run.checkpoint(), "/ckpt/step_00000020");
    EXPECT_EQ(LastEvent(f, id, "restart").message(),
              "trainer " + hows[k] + "; restart " + std::to_string(k + 1) + " of 5 from /ckpt/step_00000020 in " +
                  std::to_string(backoffs[k]) + " ms");
    // Not assigned before its backoff is over, and at once when it is.
    f.Pass(backoffs[k] - 1, w);
    EXPECT_EQ(f.Run(id).state(), v1::QUEUED) << "failure " << k;
    EXPECT_EQ(Starts(sent).size(), static_cast<size_t>(attempt));
    f.Pass(1, w);
    ASSERT_EQ(Starts(sent).size(), static_cast<size_t>(attempt + 1));
    const v1::Assignment next = Starts(sent).back();
    EXPECT_EQ(next.run_id(), id);
    EXPECT_EQ(next.attempt(), attempt + 1);
    EXPECT_EQ(next.resume_checkpoint(), "/ckpt/step_00000020");  // resumes, not restarts
    EXPECT_EQ(f.Run(id).state(), v1::ASSIGNED);
    EXPECT_EQ(f.Run(id).attempt(), attempt + 1);
  }
}

// ---- restart: a worker that came back without its run ---------------------------------

TEST(CoordinatorStateTest, WorkerThatComesBackWithoutItsRunGetsItBackFromTheCheckpoint) {
  Fixture f(DbPath("state_worker_restart"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/2);
  ASSERT_TRUE(f.Send(w, Fixture::Checkpoint(id, 20, "/ckpt/step_00000020")));
  // keel-worker restarted, and its trainer died with it: it registers again,
  // under its id, with no live runs.
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w, {}, &response).ok());
  EXPECT_EQ(response.worker_id(), w);
  EXPECT_EQ(response.stop_run_ids_size(), 0);
  v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(run.worker_id(), "");
  EXPECT_EQ(LastEvent(f, id, "restart").message(),
            "worker " + w + " came back without it; restart 1 of 2 from /ckpt/step_00000020");
  // Its new stream gets the run back as attempt 2, resuming from the checkpoint.
  f.Attach(w, &sent);
  ASSERT_EQ(Starts(sent).size(), 2u);
  EXPECT_EQ(Starts(sent)[1].run_id(), id);
  EXPECT_EQ(Starts(sent)[1].attempt(), 2);
  EXPECT_EQ(Starts(sent)[1].resume_checkpoint(), "/ckpt/step_00000020");
  run = f.Run(id);
  EXPECT_EQ(run.state(), v1::ASSIGNED);
  EXPECT_EQ(run.attempt(), 2);
}

// ---- RUNNING / QUEUED -> CANCELLED ---------------------------------------------------

TEST(CoordinatorStateTest, CancellingAQueuedRunEndsItAtOnce) {
  Fixture f(DbPath("state_cancel_queued"));
  const std::string sweep = f.Submit(1);
  const std::string id = f.Runs(sweep).at(0).id();
  v1::Run out = f.Cancel(id);
  EXPECT_EQ(out.state(), v1::CANCELLED);
  EXPECT_EQ(out.message(), "cancelled by the user");
  EXPECT_EQ(out.attempt(), 0);
  EXPECT_EQ(EventStates(f, id), (Strings{"state CANCELLED"}));
  EXPECT_EQ(LastEvent(f, id).message(), "cancelled by the user");
  EXPECT_EQ(f.Sweep(sweep).state(), v1::SWEEP_DONE);  // its only run ended
  // A worker that joins later is given nothing.
  std::vector<v1::WorkerCommand> sent;
  f.AddWorker(&sent);
  f.c->Tick();
  EXPECT_TRUE(Starts(sent).empty());
  // It ended: cancelling again is refused.
  const grpc::Status again = f.c->CancelRun(id, &out);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(again.error_message(), "run '" + id + "' already ended (CANCELLED)");
  f.Reopen();
  EXPECT_EQ(f.Run(id).state(), v1::CANCELLED);
}

TEST(CoordinatorStateTest, CancellingARunningRunStopsItsTrainerThenEndsCancelled) {
  Fixture f(DbPath("state_cancel_running"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/3);
  const v1::Run out = f.Cancel(id);
  // Still running until its trainer has checkpointed and exited; the worker is told to stop it.
  EXPECT_EQ(out.state(), v1::RUNNING);
  ASSERT_FALSE(sent.empty());
  ASSERT_TRUE(sent.back().has_cancel());
  EXPECT_EQ(sent.back().cancel().run_id(), id);
  EXPECT_EQ(EventStates(f, id), (Strings{"state ASSIGNED", "state RUNNING"}));
  // keel-worker's SIGTERM: the trainer checkpoints and exits 130, which ends
  // the run CANCELLED (not a failure to restart).
  ASSERT_TRUE(f.Send(w, Fixture::Checkpoint(id, 30, "/ckpt/step_00000030")));
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 130)));
  ExpectEndedFromRunning(f, id, v1::CANCELLED, "cancelled by the user", "cancelled by the user (exit code 130)");
  EXPECT_EQ(f.Run(id).checkpoint(), "/ckpt/step_00000030");
  ExpectNoStartLater(f, w, sent, 1);
}

TEST(CoordinatorStateTest, CancelledRunWhoseWorkerIsLostEndsCancelledNotRequeued) {
  Fixture f(DbPath("state_cancel_lost"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/3);
  f.Cancel(id);
  f.now += 1000;  // the worker is never heard from again
  f.c->Tick();
  ExpectEndedFromRunning(f, id, v1::CANCELLED, "cancelled by the user",
                         "cancelled by the user (worker " + w + " lost (no heartbeat for 1000 ms))");
}

TEST(CoordinatorStateTest, CancellingASweepEndsItsQueuedRunsAndStopsItsRunningOne) {
  Fixture f(DbPath("state_cancel_sweep"));
  const std::string sweep = f.Submit(3, /*max_restarts=*/3);
  std::vector<v1::WorkerCommand> sent;
  const std::string w = f.AddWorker(&sent);
  const std::string running = Starts(sent).at(0).run_id();
  ASSERT_TRUE(f.Send(w, Fixture::Started(running)));
  v1::Sweep out;
  ASSERT_TRUE(f.c->CancelSweep(sweep, &out).ok());
  EXPECT_EQ(out.state(), v1::SWEEP_CANCELLED);
  EXPECT_EQ(out.runs_by_state().at("CANCELLED"), 2);
  EXPECT_EQ(out.runs_by_state().at("RUNNING"), 1);
  for (const v1::Run& r : f.Runs(sweep)) {
    if (r.id() == running) continue;
    EXPECT_EQ(r.state(), v1::CANCELLED) << r.id();
    EXPECT_EQ(r.attempt(), 0) << r.id();
    EXPECT_EQ(EventStates(f, r.id()), (Strings{"state CANCELLED"})) << r.id();
  }
  ASSERT_FALSE(sent.empty());
  ASSERT_TRUE(sent.back().has_cancel());
  EXPECT_EQ(sent.back().cancel().run_id(), running);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(running, 130)));
  EXPECT_EQ(f.Run(running).state(), v1::CANCELLED);
  EXPECT_EQ(f.Sweep(sweep).state(), v1::SWEEP_CANCELLED);  // cancelled, not done
  ExpectNoStartLater(f, w, sent, 1);
}

// ---- RUNNING -> DIVERGED -------------------------------------------------------------

TEST(CoordinatorStateTest, RunStoppedByItsPolicyIsDivergedAndNotRestarted) {
  Fixture f(DbPath("state_diverged"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/3);
  const std::string sweep = f.Run(id).sweep_id();
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 3)));  // keel-train's exit status for "stopped as diverged"
  ExpectEndedFromRunning(f, id, v1::DIVERGED, "stopped as diverged by its stability policy",
                         "stopped as diverged by its stability policy");
  EXPECT_EQ(f.Sweep(sweep).state(), v1::SWEEP_DONE);
  ExpectNoStartLater(f, w, sent, 1);
  v1::Run out;
  EXPECT_EQ(f.c->CancelRun(id, &out).error_message(), "run '" + id + "' already ended (DIVERGED)");
}

// ---- lost lease: ASSIGNED / RUNNING -> QUEUED, then a new attempt --------------------

TEST(CoordinatorStateTest, WorkerSilentForALeaseLosesItsRunToTheQueueAndANewAttempt) {
  Fixture f(DbPath("state_lost_lease"));
  std::vector<v1::WorkerCommand> sent1;
  const auto [w1, id] = f.OneRunOnAWorker(&sent1, /*max_restarts=*/2);
  ASSERT_TRUE(f.Send(w1, Fixture::Checkpoint(id, 20, "/ckpt/step_00000020")));
  // Every message renews the lease (1000 ms): a heartbeat at 900 ms keeps it to 1900 ms.
  f.now += 900;
  ASSERT_TRUE(f.Heartbeat(w1));
  f.now += 999;
  f.c->Tick();
  EXPECT_EQ(f.Run(id).state(), v1::RUNNING);
  EXPECT_EQ(f.closed[w1], 0);
  // A whole lease without a message: keeld orders it to register again, closes
  // its stream and requeues its run, at once (a lost worker is no reason to back off).
  f.now += 1;
  f.c->Tick();
  const v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(run.attempt(), 1);
  EXPECT_EQ(run.worker_id(), "");
  EXPECT_EQ(run.not_before_unix_ms(), 0);
  EXPECT_EQ(f.closed[w1], 1);
  ASSERT_FALSE(sent1.empty());
  ASSERT_TRUE(sent1.back().has_reregister());
  EXPECT_EQ(sent1.back().reregister().reason(), "lease expired: no message for 1000 ms");
  EXPECT_FALSE(Connected(f, w1));
  EXPECT_EQ(EventStates(f, id), (Strings{"state ASSIGNED", "state RUNNING", "restart QUEUED"}));
  EXPECT_EQ(LastEvent(f, id).message(),
            "worker " + w1 + " lost (no heartbeat for 1000 ms); restart 1 of 2 from /ckpt/step_00000020");
  // The next worker resumes it as attempt 2.
  std::vector<v1::WorkerCommand> sent2;
  const std::string w2 = f.AddWorker(&sent2);
  ASSERT_EQ(Starts(sent2).size(), 1u);
  EXPECT_EQ(Starts(sent2)[0].attempt(), 2);
  EXPECT_EQ(Starts(sent2)[0].resume_checkpoint(), "/ckpt/step_00000020");
  EXPECT_EQ(f.Run(id).worker_id(), w2);
  EXPECT_EQ(f.Run(id).attempt(), 2);
  // The old stream counts for nothing now, not even a heartbeat.
  EXPECT_FALSE(f.Heartbeat(w1));
  EXPECT_FALSE(f.Send(w1, Fixture::Exit(id, 0)));
  EXPECT_EQ(f.Run(id).state(), v1::ASSIGNED);
  EXPECT_EQ(f.c->Stats().stale_messages["lease"], 2);
}

TEST(CoordinatorStateTest, MessagesOfAnOldAttemptAreRefusedAndChangeNothing) {
  Fixture f(DbPath("state_stale_attempt"));
  std::vector<v1::WorkerCommand> sent1, sent2;
  const auto [w1, id] = f.OneRunOnAWorker(&sent1, /*max_restarts=*/2);
  f.now += 1000;  // w1 is lost; attempt 2 goes to w2
  f.c->Tick();
  const std::string w2 = f.AddWorker(&sent2);
  ASSERT_TRUE(f.Send(w2, Fixture::Started(id), 2));
  ASSERT_TRUE(f.Send(w2, Fixture::Checkpoint(id, 5, "/ckpt/attempt2"), 2));
  // w1 comes back and is told to stop its trainer of attempt 1...
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w1, id, 1, &response).ok());
  ASSERT_EQ(response.stop_run_ids_size(), 1);
  EXPECT_EQ(response.stop_run_ids(0), id);
  f.Attach(w1, &sent1);
  // ...but what attempt 1 sent before it stopped still arrives, on the new
  // stream: each is refused and counted. So is attempt 2 said by the wrong worker.
  EXPECT_TRUE(f.Send(w1, Fixture::Started(id), 1));
  EXPECT_TRUE(f.Send(w1, Fixture::Metric(id, 9), 1));
  EXPECT_TRUE(f.Send(w1, Fixture::Checkpoint(id, 9, "/ckpt/attempt1"), 1));
  EXPECT_TRUE(f.Send(w1, Fixture::Exit(id, 1, "killed"), 1));
  EXPECT_TRUE(f.Send(w1, Fixture::Exit(id, 0), 2));
  EXPECT_EQ(f.c->Stats().stale_messages["attempt"], 5);
  v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.worker_id(), w2);
  EXPECT_EQ(run.attempt(), 2);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(run.checkpoint(), "/ckpt/attempt2");
  EXPECT_EQ(run.step(), 0);
  EXPECT_EQ(StoredPoints(f, id), 0);
  // Attempt 2 carries on and finishes.
  ASSERT_TRUE(f.Send(w2, Fixture::Exit(id, 0), 2));
  EXPECT_EQ(f.Run(id).state(), v1::SUCCEEDED);
}

TEST(CoordinatorStateTest, OlderAttemptOnTheSameWorkerIsFencedOffByItsAttemptNumber) {
  Fixture f(DbPath("state_stale_same_worker"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/3);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 1, "boom"), 1));
  f.Pass(1000, w);  // the backoff: the same worker gets attempt 2
  ASSERT_EQ(Starts(sent).size(), 2u);
  ASSERT_EQ(Starts(sent)[1].attempt(), 2);
  ASSERT_TRUE(f.Send(w, Fixture::Started(id), 2));
  // Attempt 1's messages, resent after a reconnect, come from the run's worker
  // but not from its current attempt: each is refused and counted.
  EXPECT_TRUE(f.Send(w, Fixture::Metric(id, 5), 1));
  EXPECT_TRUE(f.Send(w, Fixture::Checkpoint(id, 5, "/ckpt/attempt1"), 1));
  EXPECT_TRUE(f.Send(w, Fixture::Exit(id, 0), 1));
  EXPECT_EQ(f.c->Stats().stale_messages["attempt"], 3);
  v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.attempt(), 2);
  EXPECT_EQ(run.checkpoint(), "");
  EXPECT_EQ(StoredPoints(f, id), 0);
  // The worker registers again claiming attempt 1 alive (not the current one):
  // it is told to stop that trainer, and attempt 2, which it did not claim, is requeued.
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w, id, 1, &response).ok());
  ASSERT_EQ(response.stop_run_ids_size(), 1);
  EXPECT_EQ(response.stop_run_ids(0), id);
  run = f.Run(id);
  EXPECT_EQ(run.state(), v1::QUEUED);
  EXPECT_EQ(run.restarts(), 2);
  EXPECT_EQ(LastEvent(f, id, "restart").message(), "worker " + w + " came back without it; restart 2 of 3 from the beginning");
}

// ---- re-attach after keeld restarts ---------------------------------------------------

TEST(CoordinatorStateTest, AfterAKeeldRestartLiveRunsReattachAndRunsGivenAwayAreStopped) {
  Fixture f(DbPath("state_reattach"));
  f.Submit(2, /*max_restarts=*/2);
  std::vector<v1::WorkerCommand> sent1, sent2, sent3;
  const std::string w1 = f.AddWorker(&sent1);
  const std::string w2 = f.AddWorker(&sent2);
  const std::string a = Starts(sent1).at(0).run_id(), b = Starts(sent2).at(0).run_id();
  ASSERT_TRUE(f.Send(w1, Fixture::Started(a)));
  ASSERT_TRUE(f.Send(w1, Fixture::Checkpoint(a, 20, "/ckpt/a/step_00000020")));
  ASSERT_TRUE(f.Send(w2, Fixture::Started(b)));
  // w1 goes silent: a is requeued, then resumed on w3 as attempt 2.
  f.Pass(600, w2);
  f.Pass(600, w2);
  ASSERT_EQ(f.Run(a).state(), v1::QUEUED);
  const std::string w3 = f.AddWorker(&sent3);
  ASSERT_EQ(Starts(sent3).size(), 1u);
  ASSERT_EQ(Starts(sent3)[0].attempt(), 2);
  ASSERT_TRUE(f.Send(w3, Fixture::Started(a), 2));

  // keeld restarts on the same store file.
  f.Reopen();
  // Active runs stay with their workers for one lease, waiting for them to come back.
  v1::Run run = f.Run(a);
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.worker_id(), w3);
  EXPECT_EQ(run.attempt(), 2);
  EXPECT_EQ(run.restarts(), 1);
  run = f.Run(b);
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.worker_id(), w2);
  EXPECT_EQ(run.attempt(), 1);
  for (const std::string& w : {w1, w2, w3}) EXPECT_FALSE(Connected(f, w)) << w;
  // w1 comes back still training attempt 1 of a, which was given away: stop it.
  v1::RegisterResponse r1;
  ASSERT_TRUE(f.Reregister(w1, a, 1, &r1).ok());
  EXPECT_EQ(r1.worker_id(), w1);
  ASSERT_EQ(r1.stop_run_ids_size(), 1);
  EXPECT_EQ(r1.stop_run_ids(0), a);
  // w3 comes back training attempt 2 of a, the current one: it keeps it.
  v1::RegisterResponse r3;
  ASSERT_TRUE(f.Reregister(w3, a, 2, &r3).ok());
  EXPECT_EQ(r3.stop_run_ids_size(), 0);
  f.Attach(w1, &sent1);
  f.Attach(w3, &sent3);
  run = f.Run(a);
  EXPECT_EQ(run.state(), v1::RUNNING);
  EXPECT_EQ(run.worker_id(), w3);
  EXPECT_EQ(run.restarts(), 1);
  // w2 never comes back: b waits out the lease given at the restart, then is
  // requeued, and w1's free slot takes it as attempt 2.
  f.Pass(999, w1);
  EXPECT_EQ(f.Run(b).state(), v1::RUNNING);
  f.now += 1;
  ASSERT_TRUE(f.Heartbeat(w1));
  ASSERT_TRUE(f.Heartbeat(w3));
  f.c->Tick();
  run = f.Run(b);
  EXPECT_EQ(run.state(), v1::ASSIGNED);
  EXPECT_EQ(run.worker_id(), w1);
  EXPECT_EQ(run.attempt(), 2);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(LastEvent(f, b, "restart").message(),
            "worker " + w2 + " lost (no heartbeat for 1000 ms); restart 1 of 2 from the beginning");
  ASSERT_EQ(Starts(sent1).size(), 2u);
  EXPECT_EQ(Starts(sent1)[1].run_id(), b);
  EXPECT_EQ(Starts(sent1)[1].attempt(), 2);
  // a's attempt 2 goes on across the restart and finishes.
  ASSERT_TRUE(f.Send(w3, Fixture::Exit(a, 0), 2));
  EXPECT_EQ(f.Run(a).state(), v1::SUCCEEDED);
}

// A cancel request is stored with the run (Run.cancel_requested): a keeld
// restart between CancelRun and the trainer's exit 130 still ends it CANCELLED,
// not restarted.
TEST(CoordinatorStateTest, CancelRequestedBeforeAKeeldRestartStillEndsTheRunCancelled) {
  Fixture f(DbPath("state_cancel_restart"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/3);
  f.Cancel(id);
  f.Reopen();
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w, id, 1, &response).ok());
  EXPECT_EQ(response.stop_run_ids_size(), 0);
  f.Attach(w, &sent);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 130)));
  const v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::CANCELLED);
  EXPECT_EQ(run.restarts(), 0);
}

// ---- invalid transitions --------------------------------------------------------------

TEST(CoordinatorStateTest, MessagesAndRequestsForAFinishedRunAreRefusedAndChangeNothing) {
  Fixture f(DbPath("state_invalid"));
  std::vector<v1::WorkerCommand> sent;
  const auto [w, id] = f.OneRunOnAWorker(&sent, /*max_restarts=*/2);
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 0)));
  const v1::Run done = f.Run(id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED);
  const size_t events = f.Events(id).size();
  // The same attempt's messages after its end (resent after a reconnect) are
  // accepted on the stream but change nothing: no restart, no new state.
  EXPECT_TRUE(f.Send(w, Fixture::Started(id)));
  EXPECT_TRUE(f.Send(w, Fixture::Metric(id, 3)));
  EXPECT_TRUE(f.Send(w, Fixture::Checkpoint(id, 3, "/ckpt/late")));
  EXPECT_TRUE(f.Send(w, Fixture::Exit(id, 1, "late")));
  v1::Run run = f.Run(id);
  EXPECT_EQ(run.state(), v1::SUCCEEDED);
  EXPECT_EQ(run.restarts(), 0);
  EXPECT_EQ(run.attempt(), 1);
  EXPECT_EQ(run.checkpoint(), done.checkpoint());
  EXPECT_EQ(f.Events(id).size(), events);
  EXPECT_EQ(StoredPoints(f, id), 0);
  ExpectNoStartLater(f, w, sent, 1);
  // The user can neither cancel nor steer it.
  grpc::Status s = f.c->CancelRun(id, &run);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "run '" + id + "' already ended (SUCCEEDED)");
  v1::InterveneRequest intervene;
  intervene.set_run_id(id);
  intervene.set_precision("bf16");
  v1::InterveneResponse intervened;
  s = f.c->Intervene(intervene, &intervened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "run '" + id + "' is SUCCEEDED, not running");
  // A worker claiming it as live after a reconnect is told to stop it.
  v1::RegisterResponse response;
  ASSERT_TRUE(f.Reregister(w, id, 1, &response).ok());
  ASSERT_EQ(response.stop_run_ids_size(), 1);
  EXPECT_EQ(response.stop_run_ids(0), id);
  // A message about a run that does not exist creates nothing; a worker that
  // does not exist can neither send nor attach.
  f.Attach(w, &sent);
  EXPECT_TRUE(f.Send(w, Fixture::Exit("run-404", 0)));
  v1::Run missing;
  EXPECT_EQ(f.c->GetRun("run-404", &missing).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(f.c->HandleWorkerMessage("worker-404", 1, Fixture::Exit(id, 1)),
            Coordinator::MessageResult::kNotTheWorkers);
  uint64_t stream = 0;
  EXPECT_EQ(f.c->AttachWorker(
                     "worker-404", [](const v1::WorkerCommand&) { return true; }, [] {}, &stream)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(f.Run(id).state(), v1::SUCCEEDED);
  EXPECT_EQ(f.Events(id).size(), events);
  CoordinatorStats stats = f.c->Stats();
  EXPECT_EQ(stats.stale_messages["attempt"], 0);  // duplicates of the current attempt are not fencing
  EXPECT_EQ(stats.stale_messages["lease"], 1);
}

// ---- watchers -------------------------------------------------------------------------

TEST(CoordinatorStateTest, WatchersSeeEveryTransitionInOrder) {
  Fixture f(DbPath("state_watch"));
  const std::string sweep = f.Submit(1);
  const std::string id = f.Runs(sweep).at(0).id();
  std::shared_ptr<Subscription> sub;
  ASSERT_TRUE(f.c->Watch(id, &sub).ok());
  std::vector<v1::WorkerCommand> sent;
  const std::string w = f.AddWorker(&sent);
  ASSERT_TRUE(f.Send(w, Fixture::Started(id)));
  ASSERT_TRUE(f.Send(w, Fixture::Exit(id, 0)));
  std::vector<v1::WatchUpdate> updates;
  ASSERT_TRUE(sub->Next(0, &updates));
  Strings states, events;
  for (const v1::WatchUpdate& u : updates) {
    if (u.has_run()) states.push_back(v1::RunState_Name(u.run().state()));
    if (u.has_event()) events.push_back(u.event().details().at("state"));
  }
  EXPECT_EQ(states, (Strings{"QUEUED", "ASSIGNED", "RUNNING", "SUCCEEDED"}));
  EXPECT_EQ(events, (Strings{"ASSIGNED", "RUNNING", "SUCCEEDED"}));
  f.c->Unwatch(sub);
}

}  // namespace
}  // namespace keel
