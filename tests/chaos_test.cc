// Fault injection against a sweep running on keeld and two keel-workers (real
// processes on loopback, the real keel-train on the CPU). While the runs train:
// a worker is paused (SIGSTOP) past its lease and resumed; a trainer, a worker
// and keeld are killed with -9 (and the two restarted); the newest checkpoint of
// a run is corrupted before its trainer dies; a run's metrics.jsonl is
// truncated. Then, for every run:
// - its final state is SUCCEEDED;
// - exactly one attempt was live at any time: the steps each attempt wrote
//   (every metrics.jsonl line carries its attempt and wall clock, in every
//   worker's run directory) span disjoint time intervals, in attempt order;
// - every step's metric point is stored exactly once, or lies inside a gap
//   that keeld reported (a metrics_gap event);
// and the corrupted checkpoint was skipped with an event, not retried to failure.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "tests/cluster.h"

namespace {

using keel_test::Cluster;

constexpr int kSteps = 6000;
constexpr int kRuns = 4;

void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Waits until `pred` holds (polling the sweep's runs) or `seconds` pass.
bool WaitFor(Cluster& cluster, const std::string& sweep, int seconds,
             const std::function<bool(const std::vector<keel::v1::Run>&)>& pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(cluster.Runs(sweep))) return true;
    Sleep(100);
  }
  return false;
}

// A run still training (RUNNING, a live trainer, some steps left), or "".
std::string RunningRun(Cluster& cluster, const std::string& sweep, const std::set<std::string>& avoid = {}) {
  for (int tries = 0; tries < 100; ++tries) {
    for (const keel::v1::Run& r : cluster.Runs(sweep)) {
      if (r.state() == keel::v1::RUNNING && r.step() > 20 && r.step() < kSteps - 300 && !avoid.count(r.id()) &&
          cluster.Trainers(r.id()).size() == 1) {
        return r.id();
      }
    }
    Sleep(100);
  }
  return "";
}

// Every metrics.jsonl line under `dir` for `run`: attempt -> wall-clock times.
std::map<int64_t, std::vector<int64_t>> AttemptTimes(const std::string& dir, const std::string& run) {
  std::map<int64_t, std::vector<int64_t>> out;
  for (const char* worker : {"w1", "w2"}) {
    std::ifstream in(dir + "/" + worker + "/runs/" + run + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto number = [&](const std::string& key) -> int64_t {
        size_t at = line.find("\"" + key + "\":");
        return at == std::string::npos ? -1 : std::atoll(line.c_str() + at + key.size() + 3);
      };
      const int64_t attempt = number("attempt"), unix_ms = number("unix_ms");
      if (attempt > 0 && unix_ms > 0) out[attempt].push_back(unix_ms);
    }
  }
  return out;
}

TEST(ChaosTest, SweepSurvivesPausesKillsCorruptionAndTruncation) {
  Cluster cluster("chaos", {"--restart-backoff-ms", "200"});
  cluster.AddWorker("w1", {"--cpu-slots", "2"});
  keel::v1::SubmitSweepResponse submitted;
  const std::string yaml = "name: chaos\n"
                           "base:\n"
                           "  model: {type: proxy, layers: 2, width: 32}\n"
                           "  batch: 64\n  threads: 1\n  checkpoint_every: 50\n"
                           "  steps: " + std::to_string(kSteps) + "\n"
                           "axes:\n  - grid: {seed: [1, 2, 3, 4]}\n"
                           "max_restarts: 30\n";
  grpc::Status submit = cluster.Submit(yaml, &submitted);
  ASSERT_TRUE(submit.ok()) << submit.error_message();
  const std::string sweep = submitted.sweep().id();
  ASSERT_EQ(submitted.runs_size(), kRuns);
  // w1 takes two runs; w2 (four slots) the other two, with room for w1's.
  ASSERT_TRUE(WaitFor(cluster, sweep, 60, [](const std::vector<keel::v1::Run>& rs) {
    int running = 0;
    for (const auto& r : rs) running += r.state() == keel::v1::RUNNING && r.step() > 0;
    return running == 2;
  }));
  cluster.AddWorker("w2", {"--cpu-slots", "4"});
  ASSERT_TRUE(WaitFor(cluster, sweep, 60, [](const std::vector<keel::v1::Run>& rs) {
    int running = 0;
    for (const auto& r : rs) running += r.state() == keel::v1::RUNNING && r.step() > 20;
    return running == kRuns;
  }));

  // 1. w1 paused for twice its lease: its runs move to w2 while its trainers
  //    still exist; resumed, it must register again and stop them.
  std::fprintf(stderr, "chaos: SIGSTOP w1\n");
  cluster.Worker("w1")->Signal(SIGSTOP);
  Sleep(3000);
  std::fprintf(stderr, "chaos: SIGCONT w1\n");
  cluster.Worker("w1")->Signal(SIGCONT);
  // It comes back: registered again and connected, not wedged on a dead stream.
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    keel::v1::ListWorkersRequest request;
    keel::v1::ListWorkersResponse workers;
    ASSERT_TRUE(cluster.stub()->ListWorkers(cluster.Context().get(), request, &workers).ok());
    int connected = 0;
    for (const keel::v1::Worker& w : workers.workers()) connected += w.connected();
    back = connected == 2 && workers.workers_size() == 2;
    Sleep(100);
  }
  EXPECT_TRUE(back) << "w1 did not register again after its pause";
  Sleep(1000);

  // 2. kill -9 of one trainer.
  const std::string victim = RunningRun(cluster, sweep);
  ASSERT_FALSE(victim.empty());
  std::fprintf(stderr, "chaos: kill -9 the trainer of %s\n", victim.c_str());
  kill(cluster.Trainers(victim)[0].pid, SIGKILL);
  Sleep(1500);

  // 3. kill -9 of w2, restarted on the same work dir.
  std::fprintf(stderr, "chaos: kill -9 w2\n");
  cluster.Worker("w2")->Kill(SIGKILL);
  Sleep(500);
  cluster.AddWorker("w2", {"--cpu-slots", "4"});
  Sleep(2500);

  // 4. kill -9 of keeld, restarted.
  std::fprintf(stderr, "chaos: kill -9 keeld\n");
  cluster.KillKeeld();
  Sleep(500);
  cluster.StartKeeld();
  Sleep(2500);

  // 5. The newest checkpoint of a run is corrupted (its trainer paused first, so
  //    that it writes no newer one), then the trainer dies.
  const std::string corrupted_run = RunningRun(cluster, sweep);
  ASSERT_FALSE(corrupted_run.empty());
  std::vector<keel_test::Trainer> trainers = cluster.Trainers(corrupted_run);
  ASSERT_EQ(trainers.size(), 1u);
  kill(trainers[0].pid, SIGSTOP);
  std::string newest;
  {
    std::string listing = trainers[0].run_dir + "/checkpoints";
    FILE* ls = popen(("ls -1 '" + listing + "' | grep -E '^step_[0-9]{8}$' | sort | tail -1").c_str(), "r");
    char name[64] = {0};
    if (ls && fgets(name, sizeof(name), ls)) newest = listing + "/" + std::string(name).substr(0, 13);
    if (ls) pclose(ls);
  }
  ASSERT_FALSE(newest.empty());
  {
    const std::string file = newest + "/model.safetensors";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << file;
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekp(size - 200);
    std::string junk(64, '\xA5');
    f.write(junk.data(), 64);
  }
  std::fprintf(stderr, "chaos: corrupted %s, kill -9 its trainer\n", newest.c_str());
  kill(trainers[0].pid, SIGKILL);
  Sleep(1500);

  // 6. A run's metrics.jsonl truncated mid-run.
  const std::string truncated_run = RunningRun(cluster, sweep, {corrupted_run});
  if (!truncated_run.empty()) {
    trainers = cluster.Trainers(truncated_run);
    if (trainers.size() == 1) {
      std::fprintf(stderr, "chaos: truncate %s/metrics.jsonl\n", trainers[0].run_dir.c_str());
      ASSERT_EQ(truncate((trainers[0].run_dir + "/metrics.jsonl").c_str(), 0), 0);
    }
  }

  std::vector<keel::v1::Run> runs = cluster.WaitDone(sweep, 300);
  ASSERT_EQ(runs.size(), static_cast<size_t>(kRuns));
  for (const keel::v1::Run& run : runs) {
    SCOPED_TRACE(run.id());
    EXPECT_EQ(run.state(), keel::v1::SUCCEEDED) << run.message();
    // One live attempt at a time.
    std::map<int64_t, std::vector<int64_t>> times = AttemptTimes(cluster.dir(), run.id());
    int64_t previous_end = 0, previous_attempt = 0;
    for (auto& kv : times) {
      const int64_t begin = *std::min_element(kv.second.begin(), kv.second.end());
      const int64_t end = *std::max_element(kv.second.begin(), kv.second.end());
      EXPECT_LT(previous_end, begin) << "attempt " << previous_attempt << " wrote a step at " << previous_end
                                     << " after attempt " << kv.first << " began at " << begin;
      previous_end = end;
      previous_attempt = kv.first;
    }
    EXPECT_GE(times.size(), 1u);
    // Every step stored once, or inside a reported gap.
    std::vector<std::pair<int64_t, int64_t>> gaps;
    bool skipped_checkpoint = false;
    for (const keel::v1::Event& e : cluster.Events(run.id())) {
      if (e.kind() == "metrics_gap") {
        gaps.push_back({std::atoll(e.details().at("first_step").c_str()), std::atoll(e.details().at("last_step").c_str())});
      }
      skipped_checkpoint |= e.kind() == "checkpoint_skipped" && e.details().at("checkpoint") == newest;
    }
    std::vector<keel::v1::MetricPoint> points = cluster.Metrics(run.id());
    std::set<int64_t> stored;
    for (size_t i = 0; i < points.size(); ++i) {
      EXPECT_TRUE(stored.insert(points[i].step()).second) << "step " << points[i].step() << " stored twice";
      if (i > 0) EXPECT_LT(points[i - 1].step(), points[i].step());
    }
    int missing = 0;
    for (int64_t step = 1; step <= kSteps; ++step) {
      if (stored.count(step)) continue;
      bool in_gap = false;
      for (const auto& g : gaps) in_gap |= g.first <= step && step <= g.second;
      if (!in_gap) ++missing;
    }
    EXPECT_EQ(missing, 0) << "steps neither stored nor reported as a gap";
    if (run.id() == corrupted_run) {
      EXPECT_TRUE(skipped_checkpoint) << "no checkpoint_skipped event for " << newest;
    }
    std::fprintf(stderr, "chaos: %s %s, %d restarts, %zu attempts wrote steps, %zu points, %zu gaps\n",
                 run.id().c_str(), keel::v1::RunState_Name(run.state()).c_str(), run.restarts(), times.size(),
                 points.size(), gaps.size());
  }
}

}  // namespace
