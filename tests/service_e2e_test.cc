// Keel as a service, end to end, with real processes on loopback: keeld (SQLite
// in a temp state dir), keel-worker processes running the real keel-train on
// the CPU, and a gRPC client. Sweeps finish; a worker killed with -9 mid-run
// loses its lease and the run resumes elsewhere from its checkpoint with the
// same final loss as an uninterrupted run; keeld killed with -9 and restarted
// loses nothing; bad tokens and bad sweeps are refused without state changes.
// The sweep and the keeld kill also run with keeld's store in PostgreSQL
// (--store postgresql://..., a real server the test starts: TempPostgres).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <functional>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "kernels/base/host.h"
#include "proto/keel.grpc.pb.h"
#include "server/temp_postgres.h"
#include "tests/cluster.h"

namespace {

using keel_test::Cluster;
using keel_test::kUserToken;
using keel_test::kWorkerToken;
using keel_test::SmallSweep;
using keel_test::StartPostgres;

// The "loss" member of a metric line, as printed (the whole "loss":... text).
std::string LossText(const std::string& json) {
  const size_t at = json.find("\"loss\":");
  return json.substr(at, json.find(",\"lr\"") - at);
}

std::string LossOf(const keel::v1::MetricPoint& p) { return LossText(p.json()); }

// The final metric line's loss, as printed, of a run keel-train ran directly.
std::string DirectLoss(Cluster* cluster, const keel::v1::Run& run, const std::string& flags) {
  const std::string dir = cluster->dir() + "/direct-" + run.id();
  std::ofstream(dir + ".yaml") << run.spec().yaml();
  EXPECT_EQ(std::system(("worker/engine/keel-train --quiet " + flags + " --config " + dir + ".yaml --run-dir " + dir).c_str()), 0);
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  return LossText(last);
}

// A run restarted from its checkpoint ends as an uninterrupted one: SUCCEEDED,
// every step stored once, and its last loss bit for bit (as printed) that of
// keel-train `flags` run directly. restarts < 0: at least one.
void ExpectEndsAsUninterrupted(Cluster* cluster, const keel::v1::Run& run, int64_t steps, int restarts,
                               const std::string& flags) {
  EXPECT_EQ(run.state(), keel::v1::SUCCEEDED) << run.id() << ": " << run.message();
  if (restarts >= 0 && run.restarts() != restarts) {
    // Why each restart happened, for a failure seen only under load.
    std::string events;
    for (const keel::v1::Event& e : cluster->Events(run.id())) {
      events += "\n  step " + std::to_string(e.step()) + " " + e.kind() + ": " + e.message();
    }
    ADD_FAILURE() << run.id() << ": restarts " << run.restarts() << ", expected " << restarts << "; events:" << events;
  }
  if (restarts < 0) EXPECT_GE(run.restarts(), 1) << run.id();
  auto points = cluster->Metrics(run.id());
  ASSERT_EQ(points.size(), static_cast<size_t>(steps)) << run.id();  // every step stored once
  EXPECT_EQ(points.back().step(), steps);
  EXPECT_EQ(LossOf(points.back()), DirectLoss(cluster, run, flags)) << run.id();
}

// A 4-run sweep on two workers, checked through the API and the CLI.
void SweepCompletesWithMetricsAndEvents(const std::string& name, std::vector<std::string> keeld_args) {
  Cluster cluster(name, keeld_args);
  cluster.AddWorker("w1");
  cluster.AddWorker("w2");
  keel::v1::SubmitSweepResponse submitted;
  grpc::Status s = cluster.Submit(SmallSweep(40, "axes:\n  - grid: {precision: [fp32, mxfp8_e4m3], seed: [1, 2]}\n"),
                                  &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(submitted.runs_size(), 4);
  auto runs = cluster.WaitDone(submitted.sweep().id(), 120);
  ASSERT_EQ(runs.size(), 4u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.state(), keel::v1::SUCCEEDED) << r.id() << ": " << r.message();
    auto points = cluster.Metrics(r.id());
    EXPECT_EQ(points.size(), 40u) << r.id();
    keel::v1::ListEventsRequest er;
    er.set_run_id(r.id());
    keel::v1::ListEventsResponse events;
    ASSERT_TRUE(cluster.stub()->ListEvents(cluster.Context().get(), er, &events).ok());
    EXPECT_GE(events.events_size(), 3) << r.id();  // assigned, started, finished
  }
  keel::v1::GetSweepRequest gs;
  gs.set_sweep_id(submitted.sweep().id());
  keel::v1::Sweep sweep;
  ASSERT_TRUE(cluster.stub()->GetSweep(cluster.Context().get(), gs, &sweep).ok());
  EXPECT_EQ(sweep.state(), keel::v1::SWEEP_DONE);
  EXPECT_EQ(sweep.runs_by_state().at("SUCCEEDED"), 4);

  // The keel CLI against the real keeld: export and plot produce valid files.
  const std::string flags = " --server " + cluster.Address() + " --token " + kUserToken + " ";
  const std::string csv = cluster.dir() + "/sweep.csv", svg = cluster.dir() + "/sweep.svg";
  ASSERT_EQ(std::system(("client/keel export " + submitted.sweep().id() + " --format csv -o " + csv + flags).c_str()), 0);
  ASSERT_EQ(std::system(("client/keel plot " + submitted.sweep().id() + " -o " + svg + flags).c_str()), 0);
  std::ifstream csv_in(csv);
  std::string header, line;
  std::getline(csv_in, header);
  EXPECT_EQ(header.rfind("sweep_id,run_id,step,loss,lr,tokens_per_s,grad_norm", 0), 0u) << header;
  EXPECT_NE(header.find("precision"), std::string::npos) << header;  // axis columns
  int rows = 0;
  while (std::getline(csv_in, line)) ++rows;
  EXPECT_EQ(rows, 4 * 40);
  std::ifstream svg_in(svg);
  std::string text((std::istreambuf_iterator<char>(svg_in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<?xml", 0) == 0 || text.rfind("<svg", 0) == 0, true) << text.substr(0, 80);
  EXPECT_NE(text.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  size_t polylines = 0;
  for (size_t at = text.find("<polyline"); at != std::string::npos; at = text.find("<polyline", at + 1)) ++polylines;
  EXPECT_EQ(polylines, 4u);
  EXPECT_EQ(text.find("nan"), std::string::npos);
  // keeld says which store it used: the one --store named, if any.
  std::ifstream log_in(cluster.dir() + "/keeld.log");
  std::string log((std::istreambuf_iterator<char>(log_in)), std::istreambuf_iterator<char>());
  const std::string store = keeld_args.size() == 2 ? "store " + keeld_args[1] + " (schema version" : "store sqlite:";
  EXPECT_NE(log.find(store), std::string::npos) << log;
}

TEST(ServiceE2eTest, SweepCompletesWithMetricsAndEvents) { SweepCompletesWithMetricsAndEvents("e2e_sweep", {}); }

TEST(ServiceE2eTest, SweepCompletesWithMetricsAndEventsOnPostgres) {
  std::vector<std::string> store;
  auto pg = StartPostgres("e2e_sweep", &store);
  ASSERT_TRUE(pg);
  SweepCompletesWithMetricsAndEvents("e2e_sweep_pg", store);
}

TEST(ServiceE2eTest, BadStoreUrlIsRefusedNamingTheFlagAndChangesNothing) {
  const std::string dir = keel_test::TempDir("e2e_bad_store");
  for (const std::string& bad : {std::string("mysql://keel@db/keel"), std::string("sqlite:"),
                                 std::string("postgresql://keel@db/keel?no_such_option=1")}) {
    const std::string log = dir + "/keeld.err";
    const int status = std::system(("server/keeld --listen 127.0.0.1:0 --metrics-listen off --state-dir " + dir +
                                    "/state --store '" + bad + "' 2>" + log)
                                       .c_str());
    ASSERT_TRUE(WIFEXITED(status)) << bad;
    EXPECT_EQ(WEXITSTATUS(status), 2) << bad;
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("keeld: --store: '" + bad + "'"), std::string::npos) << text;
    EXPECT_NE(text.find("postgresql://user@host:port/db"), std::string::npos) << text;
    struct stat st;
    EXPECT_NE(stat((dir + "/state").c_str(), &st), 0) << "keeld created its state dir for " << bad;
  }
  // A database that is not there: keeld exits 2 naming --store and the URL.
  std::vector<std::string> store;
  auto pg = StartPostgres("e2e_present", &store);
  ASSERT_TRUE(pg);
  const std::string missing = pg->Url("e2e_absent");
  const int status = std::system(("server/keeld --listen 127.0.0.1:0 --metrics-listen off --state-dir " + dir +
                                  "/state --store '" + missing + "' 2>" + dir + "/keeld.err")
                                     .c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream in(dir + "/keeld.err");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("keeld: --store: store '" + missing + "': cannot connect"), std::string::npos) << text;
  // A bad --artifact-store, or --artifact-dir with the database's: refused, naming the flag.
  const std::vector<std::pair<std::string, std::string>> artifact_cases = {
      {"--artifact-store s3", "keeld: --artifact-store: 's3' is not allowed (allowed: dir, db)"},
      {"--artifact-store db --artifact-dir " + dir + "/a",
       "keeld: --artifact-dir: given with --artifact-store db, which keeps checkpoints in the store's database"},
  };
  for (const auto& c : artifact_cases) {
    const int refused = std::system(("server/keeld --listen 127.0.0.1:0 --metrics-listen off --state-dir " + dir +
                                     "/state-artifacts " + c.first + " 2>" + dir + "/keeld.err")
                                        .c_str());
    ASSERT_TRUE(WIFEXITED(refused));
    EXPECT_EQ(WEXITSTATUS(refused), 2) << c.first;
    std::ifstream err(dir + "/keeld.err");
    std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
    EXPECT_NE(said.find(c.second), std::string::npos) << said;
    struct stat st;
    EXPECT_NE(stat((dir + "/state-artifacts").c_str(), &st), 0) << "keeld created its state dir for " << c.first;
  }
}

TEST(ServiceE2eTest, WorkerKilledMidRunResumesElsewhereWithTheSameFinalLoss) {
  Cluster cluster("e2e_worker_kill");
  keel_test::Process* first = cluster.AddWorker("w1");
  keel::v1::SubmitSweepResponse submitted;
  // Long enough (a few seconds) that the kill lands mid-run.
  const std::string sweep = SmallSweep(3000, "");
  ASSERT_TRUE(cluster.Submit(sweep, &submitted).ok());
  // Kill the worker once the run has checkpointed at least once.
  bool killed = false;
  auto runs = cluster.WaitDone(submitted.sweep().id(), 180, [&](const std::vector<keel::v1::Run>& rs) {
    if (!killed && !rs.empty() && !rs[0].checkpoint().empty() && rs[0].step() >= 30) {
      first->Kill(SIGKILL);
      killed = true;
      cluster.AddWorker("w2");
    }
  });
  ASSERT_TRUE(killed);
  ASSERT_EQ(runs.size(), 1u);
  ExpectEndsAsUninterrupted(&cluster, runs[0], 3000, 1, "");
}

// A CPU run with cpu_slots: 2 is two data-parallel ranks (keel-train --nproc 2
// under the worker). kill -9 of rank 1 mid-run stops the whole run; keeld
// requeues it from its newest checkpoint and it ends with the loss of an
// uninterrupted two-rank run, every step stored once.
TEST(ServiceE2eTest, TwoRankRunSurvivesAKilledRank) {
  Cluster cluster("e2e_ranks");
  cluster.AddWorker("w1", {"--cpu-slots", "2"});
  keel::v1::SubmitSweepResponse submitted;
  // 2,000 steps: long enough that the kill lands mid-run on a loaded machine (at
  // 600 the run once ended before the poll saw its checkpoint and rank 1).
  ASSERT_TRUE(cluster.Submit(SmallSweep(2000, "resources: {cpu_slots: 2}\n"), &submitted).ok());
  const std::string run_id = submitted.runs(0).id();
  bool killed = false;
  auto runs = cluster.WaitDone(submitted.sweep().id(), 180, [&](const std::vector<keel::v1::Run>& rs) {
    if (killed || rs.empty() || rs[0].checkpoint().empty() || rs[0].step() < 30) return;
    for (const keel_test::Trainer& t : cluster.Trainers(run_id)) {
      if (t.rank == 1) {
        kill(t.pid, SIGKILL);
        killed = true;
      }
    }
  });
  ASSERT_TRUE(killed);
  ASSERT_EQ(runs.size(), 1u);
  ExpectEndsAsUninterrupted(&cluster, runs[0], 2000, 1, "--nproc 2");  // rank 0 alone reports
}

// Two runs of 4 ranks on two workers of 2 slots each: each is a gang over both
// workers, placed whole (never half of one holding slots the other waits for),
// one after the other. kill -9 of rank 3 (on the part without rank 0) stops
// the whole gang, which is requeued from its newest checkpoint. Both end with
// the loss of an uninterrupted keel-train --nproc 4, every step stored once.
TEST(ServiceE2eTest, FourRankGangsSpanTwoWorkersAndSurviveAKilledRank) {
  Cluster cluster("e2e_gang");
  cluster.AddWorker("w1", {"--cpu-slots", "2"});
  cluster.AddWorker("w2", {"--cpu-slots", "2"});
  keel::v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(cluster.Submit(SmallSweep(300, "resources: {cpu_slots: 4}\naxes:\n  - grid: {seed: [1, 2]}\n"),
                             &submitted).ok());
  ASSERT_EQ(submitted.runs_size(), 2);
  bool killed = false, two_parts = false;
  std::string killed_run;
  auto runs = cluster.WaitDone(submitted.sweep().id(), 240, [&](const std::vector<keel::v1::Run>& rs) {
    for (const keel::v1::Run& r : rs) {
      if (r.parts_size() == 2) two_parts = true;
      if (killed || r.checkpoint().empty() || r.step() < 30) continue;
      for (const keel_test::Trainer& t : cluster.Trainers(r.id())) {
        if (t.rank == 3) {
          kill(t.pid, SIGKILL);
          killed = true;
          killed_run = r.id();
        }
      }
    }
  });
  ASSERT_TRUE(killed);
  EXPECT_TRUE(two_parts);
  ASSERT_EQ(runs.size(), 2u);
  for (const keel::v1::Run& r : runs) ExpectEndsAsUninterrupted(&cluster, r, 300, r.id() == killed_run ? 1 : 0, "--nproc 4");
}

// kill -9 of the worker holding the gang's part without rank 0: the gang stops,
// and once the worker is back the run resumes and ends as an uninterrupted one.
// 1000 steps: at 300 a loaded machine could finish the run between two polls
// before the kill (seen once in a full test run).
TEST(ServiceE2eTest, GangSurvivesAKilledWorker) {
  Cluster cluster("e2e_gang_worker");
  cluster.AddWorker("w1", {"--cpu-slots", "2"});
  cluster.AddWorker("w2", {"--cpu-slots", "2"});
  keel::v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(cluster.Submit(SmallSweep(1000, "resources: {cpu_slots: 4}\n"), &submitted).ok());
  const std::string run_id = submitted.runs(0).id();
  std::string victim;
  auto runs = cluster.WaitDone(submitted.sweep().id(), 240, [&](const std::vector<keel::v1::Run>& rs) {
    if (!victim.empty() || rs.empty() || rs[0].checkpoint().empty() || rs[0].step() < 30) return;
    for (const keel_test::Trainer& t : cluster.Trainers(run_id)) {
      if (t.rank != 3) continue;
      // The worker whose work dir holds rank 3's run directory.
      for (const std::string name : {"w1", "w2"}) {
        if (t.run_dir.rfind(cluster.dir() + "/" + name + "/", 0) == 0) victim = name;
      }
    }
    if (victim.empty()) return;
    cluster.Worker(victim)->Kill(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past its lease
    cluster.AddWorker(victim, {"--cpu-slots", "2"});
  });
  ASSERT_FALSE(victim.empty());
  ASSERT_EQ(runs.size(), 1u);
  ExpectEndsAsUninterrupted(&cluster, runs[0], 1000, -1, "--nproc 4");
}

// The value of `name` in a process's environment ("" when unset).
std::string EnvOf(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = name + "=";
  for (size_t begin = 0, end; begin < env.size(); begin = end + 1) {
    end = env.find('\0', begin);
    if (end == std::string::npos) end = env.size();
    if (env.compare(begin, key.size(), key) == 0) return env.substr(begin + key.size(), end - begin - key.size());
  }
  return "";
}

// A GPU run of 4 ranks on two workers offering 2 fake GPUs each: a gang of
// one part per worker, each rank seeing only its own GPU (CUDA_VISIBLE_DEVICES),
// training on the CPU as its config says. kill -9 of rank 2 (the part without
// rank 0) stops the whole gang; it is requeued from its newest checkpoint and
// ends with the loss of an uninterrupted keel-train --nproc 4, every step
// stored once.
TEST(ServiceE2eTest, GpuGangOnFakeGpusSpansTwoWorkersAndSurvivesAKilledRank) {
  Cluster cluster("e2e_gpu_gang");
  cluster.AddWorker("w1", {"--fake-gpus", "2"});
  cluster.AddWorker("w2", {"--fake-gpus", "2"});
  keel::v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(cluster.Submit(SmallSweep(300, "resources: {gpus: 4}\n"), &submitted).ok());
  const std::string run_id = submitted.runs(0).id();
  std::map<int, std::string> devices;  // rank -> its CUDA_VISIBLE_DEVICES, first attempt
  std::set<std::string> part_gpus;
  bool killed = false;
  auto runs = cluster.WaitDone(submitted.sweep().id(), 120, [&](const std::vector<keel::v1::Run>& rs) {
    if (killed || rs.empty() || rs[0].parts_size() != 2) return;
    for (const keel::v1::RunPart& p : rs[0].parts()) {
      std::string gpus;
      for (int g : p.device_indices()) gpus += std::to_string(g);
      part_gpus.insert(gpus);
    }
    const std::vector<keel_test::Trainer> trainers = cluster.Trainers(run_id);
    for (const keel_test::Trainer& t : trainers) {
      if (t.rank >= 0 && !devices.count(t.rank)) devices[t.rank] = EnvOf(t.pid, "CUDA_VISIBLE_DEVICES");
    }
    if (rs[0].checkpoint().empty() || rs[0].step() < 30) return;
    for (const keel_test::Trainer& t : trainers) {
      if (t.rank == 2) {
        kill(t.pid, SIGKILL);
        killed = true;
      }
    }
  });
  ASSERT_TRUE(killed);
  EXPECT_EQ(part_gpus, std::set<std::string>{"01"});  // each part: both GPUs of its worker
  // Rank r is the (r - first_rank)-th GPU of its part: 0, 1 on each worker.
  EXPECT_EQ(devices, (std::map<int, std::string>{{0, "0"}, {1, "1"}, {2, "0"}, {3, "1"}}));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].gpus(), 4);
  ExpectEndsAsUninterrupted(&cluster, runs[0], 300, 1, "--nproc 4");
  bool restarted_from_checkpoint = false;
  for (const keel::v1::Event& e : cluster.Events(run_id)) {
    if (e.kind() == "restart" && e.message().find("/checkpoints/step_") != std::string::npos) restarted_from_checkpoint = true;
  }
  EXPECT_TRUE(restarted_from_checkpoint);
}

// A gang whose ranks on one worker never join (that worker's "trainer" is a
// stand-in that starts and then hangs, as a rank stuck before joining would):
// rank 0 gives up after dist.timeout_s and the attempt fails, naming the ranks
// that did not join; with its restarts spent the run ends FAILED. Never a hang.
TEST(ServiceE2eTest, AGangWhoseRanksNeverJoinFailsWithinTheTimeout) {
  Cluster cluster("e2e_gang_join_timeout", {"--restart-backoff-ms", "200"});
  const std::string stuck = cluster.dir() + "/stuck-trainer.sh";
  std::ofstream(stuck) << "#!/bin/sh\nexec sleep 600\n";
  ASSERT_EQ(chmod(stuck.c_str(), 0755), 0);
  cluster.AddWorker("w1", {"--fake-gpus", "2"});
  cluster.AddWorker("w2", {"--fake-gpus", "2", "--trainer", stuck});
  keel::v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(cluster.Submit(SmallSweep(300, "  dist: {timeout_s: 2}\nresources: {hosts: 2, gpus_per_host: 2}\n"
                                             "max_restarts: 1\n"),
                             &submitted)
                  .ok());
  const auto start = std::chrono::steady_clock::now();
  auto runs = cluster.WaitDone(submitted.sweep().id(), 60);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].state(), keel::v1::FAILED) << runs[0].message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(40));
  EXPECT_EQ(runs[0].restarts(), 1);
  // Which worker's part holds rank 0 depends on the workers' ids: rank 0 on the
  // good worker reports the ranks that did not join; rank 0 on the stuck one
  // never publishes its id, and the good ranks report that instead.
  const std::string& why = runs[0].message();
  EXPECT_TRUE(why.find("did not join within 2 s") != std::string::npos ||
              why.find("no bootstrap id from rank 0") != std::string::npos)
      << why;
  // w2's stand-ins were stopped with each attempt: nothing of the run is left.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(cluster.Trainers(runs[0].id()).empty());
}

// Fractional GPUs: four runs of gpus: 0.25 share the one fake GPU of one
// worker, all at once (their trainers' start and finish events overlap), each
// with CUDA_VISIBLE_DEVICES of that GPU, and all finish.
TEST(ServiceE2eTest, FourQuarterGpuRunsShareOneFakeGpuAtOnce) {
  Cluster cluster("e2e_fraction");
  cluster.AddWorker("w1", {"--fake-gpus", "1"});
  keel::v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(cluster.Submit(SmallSweep(600, "  backend: cpu\naxes:\n  - grid: {seed: [1, 2, 3, 4]}\n"
                                             "resources: {gpus: 0.25}\n"),
                             &submitted)
                  .ok());
  ASSERT_EQ(submitted.runs_size(), 4);
  size_t most_running = 0;
  std::map<std::string, std::string> devices;  // run -> its trainer's CUDA_VISIBLE_DEVICES
  std::map<std::string, std::vector<int>> held;  // run -> its device_indices while running
  auto runs = cluster.WaitDone(submitted.sweep().id(), 40, [&](const std::vector<keel::v1::Run>& rs) {
    size_t running = 0;
    for (const keel::v1::Run& r : rs) {
      if (r.state() != keel::v1::RUNNING) continue;
      ++running;
      held[r.id()].assign(r.device_indices().begin(), r.device_indices().end());
      for (const keel_test::Trainer& t : cluster.Trainers(r.id())) {
        if (!devices.count(r.id())) devices[r.id()] = EnvOf(t.pid, "CUDA_VISIBLE_DEVICES");
      }
    }
    most_running = std::max(most_running, running);
  });
  ASSERT_EQ(runs.size(), 4u);
  int64_t last_start = 0, first_finish = INT64_MAX;
  for (const keel::v1::Run& r : runs) {
    EXPECT_EQ(r.state(), keel::v1::SUCCEEDED) << r.id() << ": " << r.message();
    EXPECT_EQ(r.gpu_milli(), 250);
    EXPECT_EQ(held[r.id()], std::vector<int>{0}) << r.id();
    int64_t started = 0, finished = 0;
    for (const keel::v1::Event& e : cluster.Events(r.id())) {
      if (e.message().rfind("trainer started on w", 0) == 0) started = e.unix_ms();
      if (e.message() == "finished") finished = e.unix_ms();
    }
    ASSERT_GT(started, 0) << r.id();
    ASSERT_GT(finished, 0) << r.id();
    last_start = std::max(last_start, started);
    first_finish = std::min(first_finish, finished);
  }
  // All four were running at once: the last started before the first finished.
  EXPECT_LT(last_start, first_finish);
  EXPECT_EQ(most_running, 4u);
  ASSERT_EQ(devices.size(), 4u);
  for (const auto& d : devices) EXPECT_EQ(d.second, "0") << d.first;
}

// keeld killed with -9 while two runs stream metrics, then restarted on the
// same store: both runs re-attach and every step is stored once.
void KeeldKilledAndRestartedLosesNothing(const std::string& name, std::vector<std::string> keeld_args) {
  Cluster cluster(name, keeld_args);
  cluster.AddWorker("w1");
  cluster.AddWorker("w2");
  keel::v1::SubmitSweepResponse submitted;
  ASSERT_TRUE(cluster.Submit(SmallSweep(300, "axes:\n  - grid: {seed: [1, 2]}\n"), &submitted).ok());
  bool killed = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    auto rs = cluster.Runs(submitted.sweep().id());
    if (rs.size() == 2 && rs[0].step() >= 20 && rs[1].step() >= 20) {
      cluster.KillKeeld();
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(killed);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cluster.StartKeeld();
  auto runs = cluster.WaitDone(submitted.sweep().id(), 120);
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.state(), keel::v1::SUCCEEDED) << r.message();
    EXPECT_EQ(r.restarts(), 0) << r.id() << " was restarted instead of re-attached";
    auto points = cluster.Metrics(r.id());
    ASSERT_EQ(points.size(), 300u) << r.id();  // every step, across the outage
    EXPECT_EQ(points.back().step(), 300);
  }
}

TEST(ServiceE2eTest, KeeldKilledAndRestartedLosesNothing) { KeeldKilledAndRestartedLosesNothing("e2e_keeld_kill", {}); }

TEST(ServiceE2eTest, KeeldKilledAndRestartedLosesNothingOnPostgres) {
  std::vector<std::string> store;
  auto pg = StartPostgres("e2e_keeld_kill", &store);
  ASSERT_TRUE(pg);
  KeeldKilledAndRestartedLosesNothing("e2e_keeld_kill_pg", store);
}

TEST(ServiceE2eTest, InterveneSwitchesARunningTrainerAndRollsItBack) {
  Cluster cluster("e2e_intervene");
  cluster.AddWorker("w1");
  keel::v1::SubmitSweepResponse submitted;
  // Every 50 steps a checkpoint, all kept: a rollback needs one far enough back.
  ASSERT_TRUE(cluster.Submit(SmallSweep(6000, "") + "  keep_checkpoints: 0\n", &submitted).ok());
  const std::string run_id = submitted.runs(0).id();
  auto wait_for = [&](const std::function<bool(const keel::v1::Run&)>& ok) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    keel::v1::Run run;
    while (std::chrono::steady_clock::now() < deadline) {
      keel::v1::GetRunRequest r;
      r.set_run_id(run_id);
      cluster.stub()->GetRun(cluster.Context().get(), r, &run);
      if (ok(run)) return run;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return run;
  };
  keel::v1::Run run = wait_for([](const keel::v1::Run& r) { return r.step() >= 250; });
  ASSERT_GE(run.step(), 250);
  EXPECT_EQ(run.precision(), "fp32");
  keel::v1::InterveneRequest request;
  request.set_run_id(run_id);
  request.set_precision("bf16");
  request.set_reason("e2e");
  keel::v1::InterveneResponse response;
  grpc::Status s = cluster.stub()->Intervene(cluster.Context().get(), request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  run = wait_for([](const keel::v1::Run& r) { return r.precision() == "bf16"; });
  EXPECT_EQ(run.precision(), "bf16");
  // Roll back 100 steps into mxfp8_e4m3: the run's step goes back, then on.
  request.set_precision("mxfp8_e4m3");
  request.set_rollback_steps(100);
  ASSERT_TRUE(cluster.stub()->Intervene(cluster.Context().get(), request, &response).ok());
  run = wait_for([](const keel::v1::Run& r) { return r.precision() == "mxfp8_e4m3"; });
  EXPECT_EQ(run.precision(), "mxfp8_e4m3");
  keel::v1::ListEventsRequest er;
  er.set_run_id(run_id);
  keel::v1::ListEventsResponse events;
  ASSERT_TRUE(cluster.stub()->ListEvents(cluster.Context().get(), er, &events).ok());
  std::map<std::string, int> kinds;
  int64_t rolled_to = -1, rolled_from = -1;
  for (const auto& e : events.events()) {
    ++kinds[e.kind()];
    if (e.kind() == "rollback") {
      rolled_to = std::atoll(e.details().at("to_step").c_str());
      rolled_from = std::atoll(e.details().at("from_step").c_str());
    }
  }
  EXPECT_EQ(kinds["intervention_requested"], 2);
  EXPECT_EQ(kinds["switch_precision"], 2);  // bf16, then mxfp8_e4m3 after the rollback
  EXPECT_EQ(kinds["rollback"], 1);
  EXPECT_LE(rolled_to, rolled_from - 100);
  EXPECT_GE(rolled_to, 0);
  // Bad interventions change nothing.
  request.set_precision("mxfp9");
  EXPECT_EQ(cluster.stub()->Intervene(cluster.Context().get(), request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  keel::v1::CancelRunRequest cancel;
  cancel.set_run_id(run_id);
  ASSERT_TRUE(cluster.stub()->CancelRun(cluster.Context().get(), cancel, &run).ok());
  run = wait_for([](const keel::v1::Run& r) { return r.state() == keel::v1::CANCELLED; });
  EXPECT_EQ(run.state(), keel::v1::CANCELLED);
}

// A small MXFP4 proxy whose learning rate spikes 300x for 3 steps at step 150
// (fault injection): without a policy it blows up and never recovers; with one,
// the detectors catch the spike, the trainer rolls back to a snapshot before it,
// moves up the ladder and scales the LR down, and the run ends healthy.
TEST(ServiceE2eTest, PolicyRescuesARunThatDivergesWithoutIt) {
  Cluster cluster("e2e_policy");
  cluster.AddWorker("w1");
  cluster.AddWorker("w2");
  const std::string sweep =
      "name: rescue\n"
      "base:\n"
      "  model: {type: proxy, layers: 2, width: 64}\n"
      "  precision: mxfp4\n  batch: 256\n  steps: 300\n  seed: 1\n  threads: 1\n"
      "  optimizer: {type: adam, lr: 0.003}\n"
      "  schedule: {type: constant, spike_at: 150, spike_steps: 3, spike_factor: 300}\n"
      "  operand_stats: false\n"
      "axes:\n  - grid: {policy.max_interventions: [0, 5]}\n"
      "policy:\n"
      "  ladder: [mxfp4, mxfp8_e4m3, bf16]\n"
      "  snapshots: {every: 25, keep: 8}\n"
      "  rules:\n"
      "    - name: spike\n"
      "      when: [nonfinite, loss_zscore, loss_ratio]\n"
      "      do: [{rollback: {steps: 50}}, {switch: next}, {scale_lr: 0.01}]\n"
      "      cooldown: 20\n";
  keel::v1::SubmitSweepResponse submitted;
  grpc::Status s = cluster.Submit(sweep, &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto runs = cluster.WaitDone(submitted.sweep().id(), 180);
  ASSERT_EQ(runs.size(), 2u);
  const keel::v1::Run& without = runs[0].axes().at("policy.max_interventions") == "0" ? runs[0] : runs[1];
  const keel::v1::Run& with = &without == &runs[0] ? runs[1] : runs[0];
  // Without the policy (it may never act): the loss explodes and stays up.
  auto without_points = cluster.Metrics(without.id());
  ASSERT_EQ(without_points.size(), 300u);
  EXPECT_GT(without_points.back().loss(), 1e3) << "the fault did not make the unprotected run diverge";
  EXPECT_EQ(without.precision(), "mxfp4");
  // With it: healthy at the end (the pre-spike loss is ~0.02), in a finer scheme.
  EXPECT_EQ(with.state(), keel::v1::SUCCEEDED) << with.message();
  auto with_points = cluster.Metrics(with.id());
  ASSERT_FALSE(with_points.empty());
  EXPECT_EQ(with_points.back().step(), 300);
  EXPECT_LT(with_points.back().loss(), 0.1);
  EXPECT_EQ(with.precision(), "mxfp8_e4m3");
  // The events are in the store with the values behind them.
  keel::v1::ListEventsRequest er;
  er.set_run_id(with.id());
  keel::v1::ListEventsResponse events;
  ASSERT_TRUE(cluster.stub()->ListEvents(cluster.Context().get(), er, &events).ok());
  bool rollback = false, switched = false, scaled = false;
  for (const auto& e : events.events()) {
    if (e.kind() == "rollback") {
      rollback = true;
      EXPECT_EQ(e.details().at("rule"), "spike");
      EXPECT_LE(std::atoll(e.details().at("to_step").c_str()), 150 - 50);
      EXPECT_GE(std::atoll(e.details().at("from_step").c_str()), 150);
      EXPECT_FALSE(e.details().at("detectors").empty());
    }
    if (e.kind() == "switch_precision") {
      switched = true;
      EXPECT_EQ(e.details().at("from"), "mxfp4");
      EXPECT_EQ(e.details().at("precision"), "mxfp8_e4m3");
    }
    scaled |= e.kind() == "scale_lr";
  }
  EXPECT_TRUE(rollback && switched && scaled);
  // The trajectory after the rollback replaced the one before it: one point per step.
  std::set<int64_t> steps;
  for (const auto& p : with_points) steps.insert(p.step());
  EXPECT_EQ(steps.size(), with_points.size());
}

// Runs `command` in a shell; its stdout into *out, its exit status returned.
int Shell(const std::string& command, std::string* out) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[65536];
  size_t n;
  out->clear();
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out->append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Table rows of `keel runs` output (lines after the header) and how many of
// them are in `state`.
int Rows(const std::string& table, const std::string& state, int* in_state) {
  std::istringstream lines(table);
  std::string line;
  int rows = -1;  // the header
  *in_state = 0;
  while (std::getline(lines, line)) {
    ++rows;
    if (line.find("  " + state + "  ") != std::string::npos) ++*in_state;
  }
  return rows;
}

TEST(ServiceE2eTest, CliListsAndCancelsSweepsOfTenThousandRuns) {
  Cluster cluster("e2e_big");
  // 10,000 + 3,000 queued runs and no worker. Before paging, one ListRuns
  // answer for all of them passed gRPC's 4 MB limit ("Received message larger
  // than max") and a CancelSweep of the 10,000 outlived the CLI's 5 s deadline
  // (exit 3) although it succeeded.
  auto submit = [&](int runs) {
    std::string seeds;
    for (int i = 0; i < runs; ++i) seeds += (i ? "," : "") + std::to_string(i);
    keel::v1::SubmitSweepRequest request;
    request.mutable_spec()->set_yaml(SmallSweep(10, "axes:\n  - grid: {seed: [" + seeds + "]}\n"));
    keel::v1::SubmitSweepResponse response;
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kUserToken);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    grpc::Status s = cluster.stub()->SubmitSweep(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.sweep().id();
  };
  const std::string big = submit(10000), small = submit(3000);
  const std::string flags = " --server " + cluster.Address() + " --token " + kUserToken;
  std::string out;
  int queued = 0, cancelled = 0;
  ASSERT_EQ(Shell("client/keel runs" + flags, &out), 0);
  EXPECT_EQ(Rows(out, "QUEUED", &queued), 13000);
  EXPECT_EQ(queued, 13000);
  std::set<std::string> ids;  // each run once
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) ids.insert(line.substr(0, line.find(' ')));
  EXPECT_EQ(ids.size(), 13001u);  // and the header's "ID"
  // Small pages: the CLI follows every one of them.
  ASSERT_EQ(Shell("KEEL_PAGE_SIZE=7 client/keel runs " + small + flags, &out), 0);
  EXPECT_EQ(Rows(out, "QUEUED", &queued), 3000);

  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(Shell("client/keel cancel " + big + flags, &out), 0) << out;
  std::fprintf(stderr, "keel cancel of a 10,000-run sweep: %.2f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_NE(out.find("cancelled sweep " + big + " (CANCELLED)"), std::string::npos) << out;
  ASSERT_EQ(Shell("client/keel runs " + big + flags, &out), 0);
  EXPECT_EQ(Rows(out, "CANCELLED", &cancelled), 10000);
  EXPECT_EQ(cancelled, 10000);
  ASSERT_EQ(Shell("client/keel runs " + small + flags, &out), 0);
  EXPECT_EQ(Rows(out, "QUEUED", &queued), 3000);
  EXPECT_EQ(queued, 3000);  // the other sweep is untouched
}

TEST(ServiceE2eTest, WrongTokensAndBadSweepsAreRefusedWithoutStateChanges) {
  Cluster cluster("e2e_refusals");
  keel::v1::SubmitSweepRequest request;
  request.mutable_spec()->set_yaml(SmallSweep(10, ""));
  keel::v1::SubmitSweepResponse response;
  auto none = std::make_unique<grpc::ClientContext>();
  EXPECT_EQ(cluster.stub()->SubmitSweep(none.get(), request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(cluster.stub()->SubmitSweep(cluster.Context("wrong-token-0123456789").get(), request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(cluster.stub()->SubmitSweep(cluster.Context(kWorkerToken).get(), request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  struct Bad {
    std::string yaml, expect;
  };
  const std::vector<Bad> bad = {
      {"name: x\nbase: {model: {type: proxy}\n", "test-sweep.yaml"},  // malformed YAML
      {SmallSweep(10, "axes:\n  - grid: {precision: [mxfp9]}\n"), "mxfp9"},
      {"name: x\nbase:\n  batch: -4\n", "batch"},
      {SmallSweep(10, "axes:\n  - grid: {seed: [1,2,3,4,5,6,7,8,9,10], batch: [1,2,3,4,5,6,7,8,9,10], steps: [1,2,3,4,5,6,7,8,9,10],"
                      " threads: [1,2,3,4,5,6,7,8,9,10], log_every: [1,2,3,4,5,6,7,8,9,10], probe_every: [1,2,3,4,5,6,7,8,9,10]}\n"),
       "1000000"},
  };
  for (const Bad& b : bad) {
    request.mutable_spec()->set_yaml(b.yaml);
    request.mutable_spec()->set_source("test-sweep.yaml");
    grpc::Status s = cluster.stub()->SubmitSweep(cluster.Context().get(), request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.yaml;
    EXPECT_NE(s.error_message().find(b.expect), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("test-sweep.yaml:"), std::string::npos) << s.error_message();
  }
  keel::v1::ListSweepsResponse sweeps;
  ASSERT_TRUE(cluster.stub()->ListSweeps(cluster.Context().get(), keel::v1::ListSweepsRequest(), &sweeps).ok());
  EXPECT_EQ(sweeps.sweeps_size(), 0);  // nothing was stored
}

// Runs a shell command line; returns its exit status (128 + signal when
// killed) and its stdout and stderr together in *output.
int RunTool(const std::string& command, const std::string& dir, std::string* output) {
  const std::string log = dir + "/tool.out";
  int status = std::system((command + " > '" + log + "' 2>&1").c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  *output = text.str();
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
}

// Issue 10: input that crashed keeld or the tools, or was refused without a
// reason. Each refusal must come with a reason and a position, and change
// nothing.
TEST(ServiceE2eTest, HostileInputIsRefusedWithReasonsAndNothingCrashes) {
  Cluster cluster("e2e_hostile");
  const std::string dir = cluster.dir();
  keel::v1::SubmitSweepResponse response;

  // A 40,000-character name overflowed keeld's stack in std::regex_match.
  grpc::Status s = cluster.Submit("name: " + std::string(40000, 'n') + "\nbase: {steps: 1}\n", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("test-sweep.yaml:1:7: name: a name of 40000 characters is not allowed: too long"),
            std::string::npos)
      << s.error_message().substr(0, 300);
  // Just over the file limit still reaches ExpandSweep (keeld's gRPC limit has
  // room), which names the size and the limit.
  s = cluster.Submit(SmallSweep(1, "") + "#" + std::string(4u << 20, 'x') + "\n", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("test-sweep.yaml:1:1: size: "), std::string::npos) << s.error_message().substr(0, 300);
  EXPECT_NE(s.error_message().find("bytes is more than the limit of 4194304 bytes"), std::string::npos);

  const std::string keel = "client/keel --server " + cluster.Address();
  const std::string env = std::string("KEEL_TOKEN=") + kUserToken + " ";
  std::string out;
  // 50 MB: refused by the CLI before sending, with the size and the limit.
  WriteFile(dir + "/big.yaml", std::string(50u << 20, 'a'));
  EXPECT_EQ(RunTool(env + keel + " submit " + dir + "/big.yaml", dir, &out), 6) << out;
  EXPECT_EQ(out, dir + "/big.yaml:1:1: size: 52428800 bytes is more than the limit of 4194304 bytes (allowed: at most "
                       "4 MiB)\n");
  // Binary garbage: gRPC could not serialize it (a proto string must be
  // UTF-8) and the CLI printed an empty reason.
  std::string garbage = "name: x\n";
  uint32_t x = 12345;
  for (int i = 0; i < 3000; ++i) {
    x = x * 1664525u + 1013904223u;
    garbage += static_cast<char>(0x80 | (x >> 24));
  }
  WriteFile(dir + "/garbage.yaml", garbage);
  EXPECT_EQ(RunTool(env + keel + " submit " + dir + "/garbage.yaml", dir, &out), 6) << out;
  EXPECT_NE(out.find(dir + "/garbage.yaml:2:1: not a text file: byte 0x"), std::string::npos) << out;
  // A token with a newline made gRPC abort the CLI (exit 134).
  EXPECT_EQ(RunTool("KEEL_TOKEN=\"$(printf 'tok\\nen')\" " + keel + " sweeps", dir, &out), 2) << out;
  EXPECT_EQ(out, "keel: KEEL_TOKEN: contains a newline at offset 3 (allowed: printable ASCII without spaces)\n");
  EXPECT_EQ(RunTool(keel + " --token 'a b' sweeps", dir, &out), 2) << out;
  EXPECT_EQ(out, "keel: --token: contains a space at offset 1 (allowed: printable ASCII without spaces)\n");
  // A token file keeps working with its trailing newline.
  WriteFile(dir + "/user.token", std::string(kUserToken) + "\n");
  EXPECT_EQ(RunTool(keel + " --token-file " + dir + "/user.token sweeps", dir, &out), 0) << out;
  WriteFile(dir + "/bad.token", "tok\x1b" + std::string(kUserToken) + "\n");
  EXPECT_EQ(RunTool(keel + " --token-file " + dir + "/bad.token sweeps", dir, &out), 2) << out;
  EXPECT_EQ(out, "keel: --token-file " + dir + "/bad.token: contains a control character 0x1B at offset 3 (allowed: "
                 "printable ASCII without spaces)\n");
  // keel-worker: the same rule for its join token.
  EXPECT_EQ(RunTool("KEEL_WORKER_TOKEN=\"$(printf 'worker\\ntoken')\" worker/agent/keel-worker --server " + cluster.Address() +
                        " --work-dir " + dir + "/w --metrics-listen off",
                    dir, &out),
            2)
      << out;
  EXPECT_EQ(out, "keel-worker: KEEL_WORKER_TOKEN: contains a newline at offset 6 (allowed: printable ASCII without "
                 "spaces)\n");

  // keel-train: garbage config has a reason; a name with ".." creates nothing.
  const std::string train_dir = dir + "/train";
  ASSERT_EQ(std::system(("mkdir -p '" + train_dir + "'").c_str()), 0);
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string trainer = std::string(cwd) + "/worker/engine/keel-train";
  EXPECT_EQ(RunTool("cd '" + train_dir + "' && " + trainer + " --config " + dir + "/garbage.yaml", dir, &out), 2) << out;
  EXPECT_NE(out.find(dir + "/garbage.yaml:2:1: not a text file: byte 0x"), std::string::npos) << out;
  WriteFile(dir + "/escape.yaml", "name: ../escape\nmodel: {type: proxy, layers: 1, width: 8}\nsteps: 1\nbatch: 4\n");
  EXPECT_EQ(RunTool("cd '" + train_dir + "' && " + trainer + " --config " + dir + "/escape.yaml", dir, &out), 2) << out;
  EXPECT_NE(out.find(dir + "/escape.yaml:1:7: name: '../escape' is not allowed: it starts with '.'"), std::string::npos)
      << out;
  EXPECT_EQ(RunTool("ls -A '" + train_dir + "' && ls -d '" + dir + "/escape'", dir, &out), 2) << out;
  EXPECT_EQ(out.find("runs"), std::string::npos) << out;

  keel::v1::ListSweepsResponse sweeps;
  ASSERT_TRUE(cluster.stub()->ListSweeps(cluster.Context().get(), keel::v1::ListSweepsRequest(), &sweeps).ok());
  EXPECT_EQ(sweeps.sweeps_size(), 0);  // keeld is alive and stored nothing
}

}  // namespace

namespace {

// Runs a command line, returning its exit status and what it wrote to stderr.
int RunCapture(const std::string& command, std::string* err) {
  const std::string path = keel_test::TempDir("capture") + "/err";
  const int rc = std::system((command + " 2>" + path).c_str());
  std::ifstream in(path);
  err->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(ServiceE2eTest, PolicyRollbacksLoseNoPointsAndReportNoGaps) {
  // A rollback rewrites metrics.jsonl while the worker follows it; its event
  // must reach keeld before the new trajectory's points, or keeld drops some of
  // them with the old trajectory (and reports them as a gap).
  Cluster cluster("e2e_rollback_points");
  cluster.AddWorker("w1", {"--cpu-slots", "2"});
  keel::v1::SubmitSweepResponse submitted;
  grpc::Status s = cluster.Submit(
      "name: rollbacks\n"
      "base:\n"
      "  model: {type: proxy, layers: 2, width: 64}\n"
      "  batch: 256\n  steps: 300\n  threads: 1\n  precision: mxfp8_e4m3\n"
      "  optimizer: {type: adam, lr: 3.0e-3}\n"
      "  schedule: {type: constant, spike_at: 150, spike_steps: 3, spike_factor: 300}\n"
      "axes:\n  - grid: {seed: [1, 2, 3, 4]}\n"
      "policy:\n"
      "  ladder: [mxfp8_e4m3, mx_w_e4m3_a_bf16, bf16]\n"
      "  snapshots: {every: 25, keep: 8}\n"
      "  max_interventions: 3\n"
      "  rules:\n"
      "    - {name: loss-spike, when: [nonfinite, loss_zscore, loss_ratio],\n"
      "       do: [{rollback: {steps: 50}}, {switch: next}, {scale_lr: 0.01}], cooldown: 20}\n",
      &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto runs = cluster.WaitDone(submitted.sweep().id(), 180);
  ASSERT_EQ(runs.size(), 4u);
  int rollbacks = 0;
  for (const auto& r : runs) {
    SCOPED_TRACE(r.id());
    EXPECT_EQ(r.state(), keel::v1::SUCCEEDED) << r.message();
    for (const keel::v1::Event& e : cluster.Events(r.id())) {
      rollbacks += e.kind() == "rollback";
      EXPECT_NE(e.kind(), "metrics_gap") << e.message();
    }
    auto points = cluster.Metrics(r.id());
    ASSERT_EQ(points.size(), 300u);
    for (size_t i = 0; i < points.size(); ++i) EXPECT_EQ(points[i].step(), static_cast<int64_t>(i + 1));
  }
  EXPECT_GE(rollbacks, 4);  // every run was rolled back at its spike
}

TEST(ServiceE2eTest, ASecondKeeldOnTheSameStateOrPortIsRefused) {
  Cluster cluster("e2e_second_keeld");
  keel::v1::SubmitSweepResponse first;
  ASSERT_TRUE(cluster.Submit(SmallSweep(10, ""), &first).ok());
  std::string err;
  // Same state directory, another port.
  const std::string other = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  EXPECT_EQ(RunCapture("server/keeld --metrics-listen off --listen " + other + " --state-dir " + cluster.dir() + "/state", &err), 2);
  EXPECT_NE(err.find("is in use by another keeld (pid"), std::string::npos) << err;
  // Same port, another state directory.
  EXPECT_EQ(RunCapture("server/keeld --metrics-listen off --listen " + cluster.Address() + " --state-dir " +
                           cluster.dir() + "/other-state",
                       &err),
            2);
  EXPECT_NE(err.find("cannot listen on '" + cluster.Address() + "'"), std::string::npos) << err;
  // The first keeld is untouched: every call still reaches it, ids go on.
  for (int i = 0; i < 6; ++i) {
    keel::v1::GetSweepRequest request;
    request.set_sweep_id(first.sweep().id());
    keel::v1::Sweep sweep;
    EXPECT_TRUE(cluster.stub()->GetSweep(cluster.Context().get(), request, &sweep).ok());
  }
  keel::v1::SubmitSweepResponse second;
  grpc::Status s = cluster.Submit(SmallSweep(10, ""), &second);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(second.sweep().id(), first.sweep().id());
}

TEST(ServiceE2eTest, DataOutsideTheWorkersDataRootsIsRefusedAndFailsAtOnce) {
  Cluster cluster("e2e_data_root");
  const std::string root = cluster.dir() + "/data";
  ASSERT_EQ(std::system(("mkdir -p " + root).c_str()), 0);
  // A link inside the root that points outside it is outside too.
  ASSERT_EQ(std::system(("ln -s /etc/passwd " + root + "/linked.bin").c_str()), 0);
  cluster.AddWorker("w1", {"--data-root", root});
  for (const std::string& path : {std::string("/etc/passwd"), root + "/linked.bin", root + "/../../../../../../../../../../../../etc/passwd"}) {
    SCOPED_TRACE(path);
    keel::v1::SubmitSweepResponse submitted;
    grpc::Status s = cluster.Submit("name: data\nbase:\n  model: {type: gpt, layers: 1, width: 16, heads: 2, context: 16, vocab: 256}\n"
                                    "  data: {train: '" + path + "'}\n  batch: 2\n  seq: 16\n  steps: 5\nmax_restarts: 3\n",
                                    &submitted);
    ASSERT_TRUE(s.ok()) << s.error_message();
    auto runs = cluster.WaitDone(submitted.sweep().id(), 60);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].state(), keel::v1::FAILED);
    EXPECT_EQ(runs[0].restarts(), 0);  // a configuration error is not retried
    EXPECT_NE(runs[0].message().find("outside the allowed data roots (" + root + ")"), std::string::npos)
        << runs[0].message();
  }
}



// The whole of `path` ("" when missing).
std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A policy sweep of 180 steps whose runs roll back at a loss spike at step 90:
// the worker sends events (rollback, switch_precision) besides its points.
std::string PolicySweep(int runs) {
  std::string seeds;
  for (int i = 1; i <= runs; ++i) seeds += (i > 1 ? ", " : "") + std::to_string(i);
  return "name: standby\n"
         "base:\n"
         "  model: {type: proxy, layers: 2, width: 64}\n"
         "  batch: 256\n  steps: 180\n  threads: 1\n  precision: mxfp8_e4m3\n"
         "  checkpoint_every: 25\n"
         "  optimizer: {type: adam, lr: 3.0e-3}\n"
         "  schedule: {type: constant, spike_at: 90, spike_steps: 3, spike_factor: 300}\n"
         "axes:\n  - grid: {seed: [" + seeds + "]}\n"
         "policy:\n"
         "  ladder: [mxfp8_e4m3, mx_w_e4m3_a_bf16, bf16]\n"
         "  snapshots: {every: 25, keep: 8}\n"
         "  max_interventions: 3\n"
         "  rules:\n"
         "    - {name: loss-spike, when: [nonfinite, loss_zscore, loss_ratio],\n"
         "       do: [{rollback: {steps: 50}}, {switch: next}, {scale_lr: 0.01}], cooldown: 20}\n";
}

// keeld A active and keeld B a standby on one PostgreSQL database; a worker
// and the CLI know both. B refuses RPCs while standby; A is killed with -9
// mid-sweep; B takes over within 10 s (measured from the kill to B's first
// answer), the worker moves to it and re-sends what A did not acknowledge;
// the sweep finishes with every run's points exactly steps 1..180 once each
// and no event stored twice.
TEST(ServiceE2eTest, StandbyKeeldTakesOverAfterKillNineAndLosesOrDuplicatesNothing) {
  std::vector<std::string> store;
  auto pg = StartPostgres("e2e_standby", &store);
  ASSERT_TRUE(pg);
  Cluster cluster("e2e_standby", store);  // keeld A, active
  const std::string a = cluster.Address();
  const std::string b = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  keel_test::Process standby({"server/keeld", "--listen", b, "--state-dir", cluster.dir() + "/state-b", "--metrics-listen",
                              "off", "--lease-ms", "1500", "--heartbeat-ms", "200", "--standby", store[0], store[1]},
                             cluster.dir() + "/keeld-b.log");
  const std::string b_log = cluster.dir() + "/keeld-b.log";
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ReadAll(b_log).find("waiting for it") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(ReadAll(b_log).find("waiting for it"), std::string::npos) << ReadAll(b_log);

  // The standby refuses, naming the active keeld, whatever the token.
  auto b_stub = keel::v1::KeelService::NewStub(grpc::CreateChannel(b, grpc::InsecureChannelCredentials()));
  for (const std::string token : {std::string(kUserToken), std::string("wrong-token")}) {
    keel::v1::ListSweepsResponse sweeps;
    grpc::Status refused = b_stub->ListSweeps(cluster.Context(token).get(), keel::v1::ListSweepsRequest(), &sweeps);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_NE(refused.error_message().find("standby: the active keeld is 'keeld "), std::string::npos)
        << refused.error_message();
    EXPECT_NE(refused.error_message().find(a), std::string::npos) << refused.error_message();
  }
  {
    auto worker_stub = keel::v1::WorkerService::NewStub(grpc::CreateChannel(b, grpc::InsecureChannelCredentials()));
    keel::v1::RegisterRequest request;
    request.set_cpu_slots(1);
    keel::v1::RegisterResponse response;
    grpc::Status refused = worker_stub->Register(cluster.Context(kWorkerToken).get(), request, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  }

  // One worker with both addresses, the standby's first: it moves on to A.
  cluster.AddWorker("w1", {"--server", b + "," + a, "--cpu-slots", "2"});
  keel::v1::SubmitSweepResponse submitted;
  grpc::Status s = cluster.Submit(PolicySweep(4), &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string sweep_id = submitted.sweep().id();
  // The CLI with both addresses, the standby's first, reaches A.
  std::string err;
  const std::string cli = "client/keel --token " + std::string(kUserToken) + " ";
  EXPECT_EQ(RunCapture(cli + "runs " + sweep_id + " --server " + b + "," + a + " >/dev/null", &err), 0) << err;

  // Mid-sweep: two runs streaming (past step 40), two still queued.
  bool killed = false;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    int streaming = 0;
    for (const auto& r : cluster.Runs(sweep_id)) streaming += r.step() >= 40;
    if (streaming >= 2) {
      cluster.KillKeeld();
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(killed) << "the runs never got past step 40 on keeld A";
  const auto killed_at = std::chrono::steady_clock::now();
  // Takeover: from the kill to B's first answer.
  double takeover_s = -1;
  while (std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(30)) {
    keel::v1::GetSweepRequest request;
    request.set_sweep_id(sweep_id);
    keel::v1::Sweep sweep;
    if (b_stub->GetSweep(cluster.Context().get(), request, &sweep).ok()) {
      takeover_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("standby takeover: %.3f s from kill -9 of the active keeld to the standby's first answer\n", takeover_s);
  ASSERT_GT(takeover_s, 0) << ReadAll(b_log);
  EXPECT_LT(takeover_s, 10.0);
  EXPECT_NE(ReadAll(b_log).find("took over after"), std::string::npos) << ReadAll(b_log);

  // The CLI with both addresses, the dead one first, reaches B.
  EXPECT_EQ(RunCapture(cli + "runs " + sweep_id + " --server " + a + "," + b + " >/dev/null", &err), 0) << err;

  cluster.UseKeeldAt(b);
  auto runs = cluster.WaitDone(sweep_id, 240);
  ASSERT_EQ(runs.size(), 4u);
  for (const auto& r : runs) {
    SCOPED_TRACE(r.id());
    EXPECT_EQ(r.state(), keel::v1::SUCCEEDED) << r.message();
    std::printf("%s: restarts %d\n", r.id().c_str(), r.restarts());
    auto points = cluster.Metrics(r.id());
    ASSERT_EQ(points.size(), 180u);
    for (size_t i = 0; i < points.size(); ++i) ASSERT_EQ(points[i].step(), static_cast<int64_t>(i + 1));
    // No event twice: no two equal records (a worker's event re-sent without
    // its key would be one), one "finished", one "trainer started" per pid.
    std::set<std::string> seen, started;
    int finished = 0, worker_events = 0;
    for (const keel::v1::Event& e : cluster.Events(r.id())) {
      std::string bytes;
      ASSERT_TRUE(e.SerializeToString(&bytes));
      EXPECT_TRUE(seen.insert(bytes).second) << "stored twice: " << e.DebugString();
      finished += e.message() == "finished";
      if (e.message().rfind("trainer started on", 0) == 0) {
        EXPECT_TRUE(started.insert(e.message()).second) << "stored twice: " << e.message();
      }
      worker_events += !e.key().empty();
    }
    EXPECT_EQ(finished, 1);
    EXPECT_GE(worker_events, 1);  // the rollback at the spike, at least
  }
  // The sweep as B serves it, through the CLI given both addresses.
  EXPECT_EQ(RunCapture(cli + "runs " + sweep_id + " --server " + a + "," + b + " >/dev/null", &err), 0) << err;
}

TEST(ServiceE2eTest, AStandbyOnSqliteIsRefusedNamingTheFlag) {
  const std::string dir = keel_test::TempDir("e2e_standby_sqlite");
  const std::string listen = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  std::string err;
  EXPECT_EQ(RunCapture("server/keeld --standby --metrics-listen off --listen " + listen + " --state-dir " + dir + "/state", &err), 2);
  EXPECT_NE(err.find("--standby: the store is 'sqlite:" + dir + "/state/keeld.db', SQLite; a standby keeld needs "
                     "--store postgresql://"),
            std::string::npos)
      << err;
  EXPECT_EQ(RunCapture("server/keeld --standby --metrics-listen off --listen " + listen + " --state-dir " + dir +
                           "/state --store sqlite:" + dir + "/x.db",
                       &err),
            2);
  EXPECT_NE(err.find("--standby: the store is 'sqlite:" + dir + "/x.db'"), std::string::npos) << err;
  // Nothing was created: the refusal comes before the state directory.
  struct stat st;
  EXPECT_NE(stat((dir + "/state").c_str(), &st), 0);
}

// An unreachable list: the CLI tries every address, then exits 3 naming each.
TEST(ServiceE2eTest, CliWithSeveralUnreachableAddressesExitsThreeNamingEach) {
  const std::string x = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  const std::string y = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  std::string err;
  EXPECT_EQ(RunCapture("client/keel sweeps --token t --server " + x + "," + y, &err), 3);
  EXPECT_NE(err.find("could not reach an active keeld at any of 2 addresses within 15 s"), std::string::npos) << err;
  EXPECT_NE(err.find(x + ": "), std::string::npos) << err;
  EXPECT_NE(err.find(y + ": "), std::string::npos) << err;
  EXPECT_EQ(RunCapture("client/keel sweeps --token t --server " + x + ",,", &err), 2);
  EXPECT_NE(err.find("--server: '" + x + ",,' has an empty address"), std::string::npos) << err;
}

}  // namespace
