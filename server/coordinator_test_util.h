// The fixture of the coordinator tests (coordinator_test.cc,
// coordinator_state_test.cc): a Coordinator over a real SQLite store file in
// the test's temp dir, a fake clock (`now`) behind its leases and backoffs,
// and workers driven through the public API the way keel-worker drives it
// (register, attach a stream that records the commands sent on it, send
// messages carrying the attempt they come from). Reopen() is a keeld restart:
// a new Coordinator over the same file.
#ifndef KEEL_SERVER_COORDINATOR_TEST_UTIL_H_
#define KEEL_SERVER_COORDINATOR_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/coordinator.h"

namespace keel {
namespace coordinator_test {

// A fresh store file named after the test (left over files removed).
inline std::string DbPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string path = std::string(base ? base : "/tmp") + "/" + name + ".db";
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return path;
}

// The options the tests run under: a lease of one second (the clock is fake,
// so nothing waits), the default restart backoff (1 s, doubling, at most 60 s).
inline CoordinatorOptions TestOptions() {
  CoordinatorOptions options;
  options.lease_ms = 1000;
  return options;
}

// The start orders among a worker's commands, in the order sent.
inline std::vector<v1::Assignment> Starts(const std::vector<v1::WorkerCommand>& sent) {
  std::vector<v1::Assignment> out;
  for (const v1::WorkerCommand& c : sent) {
    if (c.has_start()) out.push_back(c.start());
  }
  return out;
}

struct Fixture {
  // wrap: what the Coordinator gets instead of the SQLite store it is given
  // (a fault-injecting layer over it, say); null: the store itself.
  using StoreWrap = std::function<std::unique_ptr<Store>(std::unique_ptr<Store>)>;
  explicit Fixture(const std::string& db, CoordinatorOptions opts = TestOptions(), StoreWrap wrap = nullptr)
      : path(db), options(opts), wrap_store(std::move(wrap)) {
    options.now_ms = [this] { return now; };
    Open();
  }
  void Open() {
    std::unique_ptr<Store> store;
    ASSERT_TRUE(OpenSqliteStore(path, &store).ok());
    if (wrap_store) store = wrap_store(std::move(store));
    ASSERT_TRUE(Coordinator::Open(std::move(store), options, &c).ok());
  }
  // keeld restarts: the Coordinator goes away and a new one opens the same
  // file. Every worker stream ended with it.
  void Reopen() {
    c.reset();
    streams.clear();
    Open();
  }

  // A sweep of `runs` CPU runs (seeds 1..runs, 50 steps each).
  std::string Submit(int runs, int max_restarts = 1) {
    std::string seeds;
    for (int i = 0; i < runs; ++i) seeds += (i ? ", " : "") + std::to_string(i + 1);
    return SubmitYaml("name: t\nbase: {model: {type: proxy, layers: 1, width: 16}, steps: 50}\n"
                      "axes:\n  - grid: {seed: [" + seeds + "]}\nmax_restarts: " + std::to_string(max_restarts) +
                      "\n");
  }
  std::string SubmitYaml(const std::string& yaml) {
    v1::SweepSpec spec;
    spec.set_yaml(yaml);
    v1::SubmitSweepResponse out;
    grpc::Status s = c->SubmitSweep(spec, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.sweep().id();
  }
  std::vector<v1::Run> Runs(const std::string& sweep) {
    v1::ListRunsResponse out;
    v1::ListRunsRequest request;
    request.set_sweep_id(sweep);
    EXPECT_TRUE(c->ListRuns(request, &out).ok());
    return std::vector<v1::Run>(out.runs().begin(), out.runs().end());
  }
  v1::Run Run(const std::string& run_id) {
    v1::Run run;
    grpc::Status s = c->GetRun(run_id, &run);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return run;
  }
  v1::Sweep Sweep(const std::string& sweep_id) {
    v1::Sweep sweep;
    grpc::Status s = c->GetSweep(sweep_id, &sweep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return sweep;
  }
  // The user cancels the run, and keeld accepts; returns the run as CancelRun does.
  v1::Run Cancel(const std::string& run_id) {
    v1::Run run;
    grpc::Status s = c->CancelRun(run_id, &run);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return run;
  }
  // A worker with `cpu_slots` CPU slots whose stream records the commands sent to it.
  std::string AddWorker(std::vector<v1::WorkerCommand>* sent, int cpu_slots = 1) {
    v1::RegisterRequest request;
    request.set_host("h");
    request.set_cpu_slots(cpu_slots);
    return RegisterAndAttach(request, sent);
  }
  // A sweep of one run (`max_restarts`) placed on a new worker whose commands
  // go to *sent, as attempt 1, and that attempt's trainer started (RUNNING)
  // unless `start` is false (ASSIGNED). Returns {the worker's id, the run's id}.
  std::pair<std::string, std::string> OneRunOnAWorker(std::vector<v1::WorkerCommand>* sent, int max_restarts,
                                                      bool start = true) {
    Submit(1, max_restarts);
    const std::string worker = AddWorker(sent);
    const std::vector<v1::Assignment> starts = Starts(*sent);
    EXPECT_EQ(starts.size(), 1u);
    const std::string run = starts.empty() ? "" : starts[0].run_id();
    if (start) {
      EXPECT_TRUE(Send(worker, Started(run)));
    }
    return {worker, run};
  }
  // A worker offering GPUs 0 .. gpus-1.
  std::string AddGpuWorker(std::vector<v1::WorkerCommand>* sent, int gpus) {
    v1::RegisterRequest request;
    request.set_host("g");
    for (int i = 0; i < gpus; ++i) {
      v1::Device* d = request.add_devices();
      d->set_index(i);
      d->set_name("test GPU");
    }
    return RegisterAndAttach(request, sent);
  }
  std::string RegisterAndAttach(const v1::RegisterRequest& request, std::vector<v1::WorkerCommand>* sent) {
    v1::RegisterResponse response;
    grpc::Status s = c->RegisterWorker(request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
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
  // True when applied (Coordinator::MessageResult::kApplied).
  bool Send(const std::string& worker, v1::WorkerMessage m, int64_t attempt = 1) {
    return SendFor(worker, std::move(m), attempt) == Coordinator::MessageResult::kApplied;
  }
  Coordinator::MessageResult SendFor(const std::string& worker, v1::WorkerMessage m, int64_t attempt = 1) {
    m.set_attempt(attempt);
    return c->HandleWorkerMessage(worker, streams[worker], m);
  }
  bool Heartbeat(const std::string& worker) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_unix_ms(now);
    return Send(worker, m, 0);
  }
  // The worker registers again (it reconnected), with one run still training.
  grpc::Status Reregister(const std::string& worker, const std::string& run_id, int64_t attempt,
                          v1::RegisterResponse* response) {
    return Reregister(worker, {{run_id, attempt}}, response);
  }
  // ... with these (run, attempt) still training (none: its trainers are gone).
  grpc::Status Reregister(const std::string& worker, const std::vector<std::pair<std::string, int64_t>>& live,
                          v1::RegisterResponse* response, int cpu_slots = 1) {
    v1::RegisterRequest again;
    again.set_worker_id(worker);
    again.set_host("h");
    again.set_cpu_slots(cpu_slots);
    for (const auto& l : live) {
      v1::LiveRun* run = again.add_live_runs();
      run->set_run_id(l.first);
      run->set_attempt(l.second);
    }
    return c->RegisterWorker(again, response);
  }
  // Time passes; the worker keeps its lease with a heartbeat.
  void Pass(int64_t ms, const std::string& worker) {
    now += ms;
    Heartbeat(worker);
    c->Tick();
  }
  static v1::WorkerMessage Started(const std::string& run_id, int64_t pid = 4242) {
    v1::WorkerMessage m;
    m.mutable_started()->set_run_id(run_id);
    m.mutable_started()->set_pid(pid);
    return m;
  }
  static v1::WorkerMessage Metric(const std::string& run_id, int64_t step) {
    v1::WorkerMessage m;
    m.mutable_metric()->set_run_id(run_id);
    m.mutable_metric()->set_step(step);
    m.mutable_metric()->set_loss(1.0 / static_cast<double>(step));
    return m;
  }
  static v1::WorkerMessage Checkpoint(const std::string& run_id, int64_t step, const std::string& path) {
    v1::WorkerMessage m;
    m.mutable_checkpoint()->set_run_id(run_id);
    m.mutable_checkpoint()->set_step(step);
    m.mutable_checkpoint()->set_path(path);
    return m;
  }
  static v1::WorkerMessage Exit(const std::string& run_id, int code, const std::string& message = "") {
    v1::WorkerMessage m;
    m.mutable_exit()->set_run_id(run_id);
    m.mutable_exit()->set_exit_code(code);
    m.mutable_exit()->set_message(message);
    return m;
  }
  // A trainer killed by `signal`, reported as run_supervisor.cc does (exit code -1).
  static v1::WorkerMessage Killed(const std::string& run_id, int signal) {
    v1::WorkerMessage m = Exit(run_id, -1);
    m.mutable_exit()->set_signal(signal);
    return m;
  }
  // The stored events of a run, of one kind (all kinds when empty).
  std::vector<v1::Event> Events(const std::string& run_id, const std::string& kind = "") {
    v1::ListEventsRequest er;
    er.set_run_id(run_id);
    v1::ListEventsResponse events;
    EXPECT_TRUE(c->ListEvents(er, &events).ok());
    std::vector<v1::Event> out;
    for (const auto& e : events.events()) {
      if (kind.empty() || e.kind() == kind) out.push_back(e);
    }
    return out;
  }

  std::string path;
  CoordinatorOptions options;
  StoreWrap wrap_store;
  int64_t now = 1000000;
  std::unique_ptr<Coordinator> c;
  std::map<std::string, uint64_t> streams;  // worker -> its latest stream id
  std::map<std::string, int> closed;        // worker -> streams keeld closed
};

}  // namespace coordinator_test
}  // namespace keel

#endif  // KEEL_SERVER_COORDINATOR_TEST_UTIL_H_
