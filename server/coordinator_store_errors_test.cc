// A worker's messages through a store whose writes fail for a while: a real
// SQLite store under a layer that refuses writes on demand (fault injection).
// Metric points: keeld keeps them, does not call them stored (so the worker
// stream does not acknowledge them), counts the errors, and stores every point
// exactly once when the store takes writes again. Run updates and events: the
// message that needed them changes nothing and is answered kNotStored (the
// stream ends unacknowledged), and the worker's re-send applies it whole, once.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/event_kinds.h"
#include "server/coordinator.h"
#include "server/coordinator_test_util.h"
#include "server/store.h"

namespace keel {
namespace {

using coordinator_test::DbPath;
using coordinator_test::Fixture;
using coordinator_test::TestOptions;

// Forwards everything to the real store; AppendMetrics fails while *fail, and
// the writes of runs and events while *fail_runs (when given).
class FlakyStore : public Store {
 public:
  FlakyStore(std::unique_ptr<Store> inner, std::atomic<bool>* fail, std::atomic<bool>* fail_runs = nullptr)
      : inner_(std::move(inner)), fail_(fail), fail_runs_(fail_runs) {}
  Store* inner() { return inner_.get(); }
  bool RunsFail() const { return fail_runs_ != nullptr && fail_runs_->load(); }
  Status AppendMetrics(const std::vector<v1::MetricPoint>& points) override {
    if (fail_->load()) return Status::Error("disk I/O error (injected)");
    return inner_->AppendMetrics(points);
  }
  Status CreateSweep(const v1::Sweep& sweep, const std::vector<v1::Run>& runs) override { return inner_->CreateSweep(sweep, runs); }
  Status GetSweep(const std::string& id, v1::Sweep* out) override { return inner_->GetSweep(id, out); }
  Status ListSweeps(std::vector<v1::Sweep>* out) override { return inner_->ListSweeps(out); }
  Status UpdateSweep(const v1::Sweep& sweep) override { return inner_->UpdateSweep(sweep); }
  Status GetRun(const std::string& id, v1::Run* out) override { return inner_->GetRun(id, out); }
  Status ListRuns(const std::string& sweep_id, std::vector<v1::Run>* out) override { return inner_->ListRuns(sweep_id, out); }
  Status ListRunsInState(v1::RunState state, std::vector<v1::Run>* out) override { return inner_->ListRunsInState(state, out); }
  Status UpdateRun(const v1::Run& run) override { return RunsFail() ? Injected() : inner_->UpdateRun(run); }
  Status UpdateRuns(const std::vector<v1::Run>& runs) override { return RunsFail() ? Injected() : inner_->UpdateRuns(runs); }
  Status UpdateRunsWithEvents(const std::vector<v1::Run>& runs, const std::vector<v1::Event>& events) override { return RunsFail() ? Injected() : inner_->UpdateRunsWithEvents(runs, events); }
  Status GetMetrics(const std::string& run_id, int max_points, std::vector<v1::MetricPoint>* out) override { return inner_->GetMetrics(run_id, max_points, out); }
  Status GetMetricsPage(const std::string& run_id, int max_points, bool omit_json, const PageRequest& page, std::vector<v1::MetricPoint>* out, PageResult* result) override { return inner_->GetMetricsPage(run_id, max_points, omit_json, page, out, result); }
  Status LastMetric(const std::string& run_id, v1::MetricPoint* out) override { return inner_->LastMetric(run_id, out); }
  Status DeleteMetricsAfter(const std::string& run_id, int64_t step) override { return RunsFail() ? Injected() : inner_->DeleteMetricsAfter(run_id, step); }
  Status AppendEvent(const v1::Event& event) override { return RunsFail() ? Injected() : inner_->AppendEvent(event); }
  Status AppendEvents(const std::vector<v1::Event>& events) override { return RunsFail() ? Injected() : inner_->AppendEvents(events); }
  Status ListEvents(const std::string& run_id, const std::string& sweep_id, std::vector<v1::Event>* out) override { return inner_->ListEvents(run_id, sweep_id, out); }
  Status ListEventsPage(const std::string& run_id, const std::string& sweep_id, const PageRequest& page, std::vector<v1::Event>* out, PageResult* result) override { return inner_->ListEventsPage(run_id, sweep_id, page, out, result); }
  Status UpsertWorker(const v1::Worker& worker) override { return inner_->UpsertWorker(worker); }
  Status ListWorkers(std::vector<v1::Worker>* out) override { return inner_->ListWorkers(out); }
  Status GetWorker(const std::string& id, v1::Worker* out) override { return inner_->GetWorker(id, out); }
  Status BeginArtifact(const std::string& run_id, int64_t step, const std::string& manifest, int64_t* id) override { return inner_->BeginArtifact(run_id, step, manifest, id); }
  Status AppendArtifactChunk(int64_t id, int file, int64_t offset, const std::string& data) override { return inner_->AppendArtifactChunk(id, file, offset, data); }
  Status CommitArtifact(int64_t id) override { return inner_->CommitArtifact(id); }
  Status DeleteArtifact(int64_t id) override { return inner_->DeleteArtifact(id); }
  Status DeleteUncommittedArtifacts() override { return inner_->DeleteUncommittedArtifacts(); }
  Status ListArtifacts(const std::string& run_id, std::vector<StoredArtifact>* out) override { return inner_->ListArtifacts(run_id, out); }
  Status ReadArtifactChunk(int64_t id, int file, int64_t offset, std::string* data) override { return inner_->ReadArtifactChunk(id, file, offset, data); }
  Status Counts(int64_t* sweeps, int64_t* runs, int64_t* metric_points) override { return inner_->Counts(sweeps, runs, metric_points); }
  void SetWriteObserver(std::function<void(double)> observer) override { inner_->SetWriteObserver(std::move(observer)); }
  Status CheckOwnership() override { return inner_->CheckOwnership(); }

 private:
  static Status Injected() { return Status::Error("database is locked (injected)"); }
  std::unique_ptr<Store> inner_;
  std::atomic<bool>* fail_;
  std::atomic<bool>* fail_runs_;
};

TEST(CoordinatorStoreErrorsTest, PointsAStoreRefusedAreKeptUnacknowledgedAndStoredOnceLater) {
  std::atomic<bool> fail{false};
  FlakyStore* flaky = nullptr;
  Fixture f(DbPath("store_errors"), TestOptions(), [&](std::unique_ptr<Store> inner) -> std::unique_ptr<Store> {
    auto s = std::make_unique<FlakyStore>(std::move(inner), &fail);
    flaky = s.get();
    return s;
  });
  ASSERT_NE(flaky, nullptr);
  std::vector<v1::WorkerCommand> sent;
  const auto [worker, run] = f.OneRunOnAWorker(&sent, 1);
  auto stored_steps = [&] {
    std::vector<v1::MetricPoint> points;
    EXPECT_TRUE(flaky->inner()->GetMetrics(run, 1000000, &points).ok());
    std::vector<int64_t> steps;
    for (const v1::MetricPoint& p : points) steps.push_back(p.step());
    return steps;
  };
  auto steps_up_to = [](int64_t n) {
    std::vector<int64_t> v;
    for (int64_t i = 1; i <= n; ++i) v.push_back(i);
    return v;
  };

  for (int step = 1; step <= 10; ++step) f.Send(worker, Fixture::Metric(run, step));
  f.Heartbeat(worker);  // a non-metric message: everything before it is written
  EXPECT_TRUE(f.c->MetricsStored());
  EXPECT_EQ(stored_steps(), steps_up_to(10));

  fail = true;
  for (int step = 11; step <= 20; ++step) f.Send(worker, Fixture::Metric(run, step));
  f.Heartbeat(worker);
  EXPECT_FALSE(f.c->MetricsStored());  // the stream must not acknowledge now
  EXPECT_EQ(stored_steps(), steps_up_to(10));
  CoordinatorStats stats = f.c->Stats();
  EXPECT_GE(stats.store_write_errors, 1);
  EXPECT_EQ(stats.metric_points_unstored, 10);
  f.c->Tick();  // a retry that fails again changes nothing
  EXPECT_FALSE(f.c->MetricsStored());
  EXPECT_EQ(f.c->Stats().metric_points_unstored, 10);

  fail = false;
  for (int step = 21; step <= 25; ++step) f.Send(worker, Fixture::Metric(run, step));
  f.Heartbeat(worker);
  EXPECT_TRUE(f.c->MetricsStored());
  EXPECT_EQ(stored_steps(), steps_up_to(25));  // each point once, in order
  stats = f.c->Stats();
  EXPECT_EQ(stats.metric_points_unstored, 0);
  EXPECT_EQ(stats.metric_gaps, 0);
}

TEST(CoordinatorStoreErrorsTest, AMessageWhoseRunOrEventWriteFailsChangesNothingAndItsResendAppliesOnce) {
  std::atomic<bool> fail{false}, fail_runs{false};
  FlakyStore* flaky = nullptr;
  Fixture f(DbPath("store_errors_runs"), TestOptions(), [&](std::unique_ptr<Store> inner) -> std::unique_ptr<Store> {
    auto s = std::make_unique<FlakyStore>(std::move(inner), &fail, &fail_runs);
    flaky = s.get();
    return s;
  });
  ASSERT_NE(flaky, nullptr);
  std::vector<v1::WorkerCommand> sent;
  const auto [worker, run] = f.OneRunOnAWorker(&sent, 1);
  for (int step = 1; step <= 5; ++step) f.Send(worker, Fixture::Metric(run, step));
  auto stored_run = [&] {
    v1::Run r;
    EXPECT_TRUE(flaky->inner()->GetRun(run, &r).ok());
    return r;
  };
  auto stored_events = [&](const std::string& kind) {
    std::vector<v1::Event> events, out;
    EXPECT_TRUE(flaky->inner()->ListEvents(run, "", &events).ok());
    for (const v1::Event& e : events) {
      if (e.kind() == kind) out.push_back(e);
    }
    return out;
  };
  const int64_t errors_before = f.c->Stats().store_write_errors;

  // A worker's keyed event (the trainer rolled back to step 3) while the
  // store refuses: nothing changes, in the store or in keeld's view.
  v1::WorkerMessage rollback;
  rollback.set_seq(41);
  v1::Event* e = rollback.mutable_event();
  e->set_run_id(run);
  e->set_step(5);
  e->set_kind(event_kind::kRollback);
  e->set_key(worker + "/1/41");
  (*e->mutable_details())["to_step"] = "3";
  fail_runs = true;
  EXPECT_EQ(f.SendFor(worker, rollback), Coordinator::MessageResult::kNotStored);
  EXPECT_GT(f.c->Stats().store_write_errors, errors_before);
  EXPECT_TRUE(stored_events(event_kind::kRollback).empty());
  v1::MetricPoint last;
  ASSERT_TRUE(flaky->inner()->LastMetric(run, &last).ok());
  EXPECT_EQ(last.step(), 5);  // not rolled back in the store
  // The trainer's exit while the store refuses: the run stays RUNNING.
  v1::WorkerMessage exit = Fixture::Exit(run, 0);
  exit.set_seq(42);
  EXPECT_EQ(f.SendFor(worker, exit), Coordinator::MessageResult::kNotStored);
  EXPECT_EQ(stored_run().state(), v1::RUNNING);
  EXPECT_EQ(f.Runs("")[0].state(), v1::RUNNING);  // keeld's view agrees with its store
  EXPECT_TRUE(stored_events(event_kind::kState).size() >= 1);
  const size_t state_events = stored_events(event_kind::kState).size();

  // The store takes writes again; the worker reconnects and re-sends both.
  fail_runs = false;
  EXPECT_EQ(f.SendFor(worker, rollback), Coordinator::MessageResult::kApplied);
  ASSERT_TRUE(flaky->inner()->LastMetric(run, &last).ok());
  EXPECT_EQ(last.step(), 3);
  for (int step = 4; step <= 5; ++step) f.Send(worker, Fixture::Metric(run, step));
  EXPECT_EQ(f.SendFor(worker, exit), Coordinator::MessageResult::kApplied);
  EXPECT_EQ(stored_run().state(), v1::SUCCEEDED);
  EXPECT_EQ(f.Runs("")[0].state(), v1::SUCCEEDED);
  EXPECT_EQ(stored_events(event_kind::kRollback).size(), 1u);
  const std::vector<v1::Event> states = stored_events(event_kind::kState);
  ASSERT_EQ(states.size(), state_events + 1);  // one "finished"
  EXPECT_EQ(states.back().message(), "finished");
  // Sent once more (a second reconnect): stored once all the same.
  EXPECT_EQ(f.SendFor(worker, rollback), Coordinator::MessageResult::kApplied);
  EXPECT_EQ(f.SendFor(worker, exit), Coordinator::MessageResult::kApplied);
  EXPECT_EQ(stored_events(event_kind::kRollback).size(), 1u);
  EXPECT_EQ(stored_events(event_kind::kState).size(), state_events + 1);
}

}  // namespace
}  // namespace keel
