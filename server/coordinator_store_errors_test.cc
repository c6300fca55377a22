// Metric points through a store whose writes fail for a while: a real SQLite
// store under a layer that refuses AppendMetrics on demand (fault injection).
// keeld keeps the points, does not call them stored (so the worker stream does
// not acknowledge them), counts the errors, and stores every point exactly
// once when the store takes writes again.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/coordinator.h"
#include "server/coordinator_test_util.h"
#include "server/store.h"

namespace keel {
namespace {

using coordinator_test::DbPath;
using coordinator_test::Fixture;
using coordinator_test::TestOptions;

// Forwards everything to the real store; AppendMetrics fails while *fail.
class FlakyStore : public Store {
 public:
  FlakyStore(std::unique_ptr<Store> inner, std::atomic<bool>* fail) : inner_(std::move(inner)), fail_(fail) {}
  Store* inner() { return inner_.get(); }
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
  Status UpdateRun(const v1::Run& run) override { return inner_->UpdateRun(run); }
  Status UpdateRuns(const std::vector<v1::Run>& runs) override { return inner_->UpdateRuns(runs); }
  Status GetMetrics(const std::string& run_id, int max_points, std::vector<v1::MetricPoint>* out) override { return inner_->GetMetrics(run_id, max_points, out); }
  Status GetMetricsPage(const std::string& run_id, int max_points, bool omit_json, const PageRequest& page, std::vector<v1::MetricPoint>* out, PageResult* result) override { return inner_->GetMetricsPage(run_id, max_points, omit_json, page, out, result); }
  Status LastMetric(const std::string& run_id, v1::MetricPoint* out) override { return inner_->LastMetric(run_id, out); }
  Status DeleteMetricsAfter(const std::string& run_id, int64_t step) override { return inner_->DeleteMetricsAfter(run_id, step); }
  Status AppendEvent(const v1::Event& event) override { return inner_->AppendEvent(event); }
  Status AppendEvents(const std::vector<v1::Event>& events) override { return inner_->AppendEvents(events); }
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
  std::unique_ptr<Store> inner_;
  std::atomic<bool>* fail_;
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

}  // namespace
}  // namespace keel
