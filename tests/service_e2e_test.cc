// Keel as a service, end to end, with real processes on loopback: keeld (SQLite
// in a temp state dir), keel-worker processes running the real keel-train on
// the CPU, and a gRPC client. Sweeps finish; a worker killed with -9 mid-run
// loses its lease and the run resumes elsewhere from its checkpoint with the
// same final loss as an uninterrupted run; keeld killed with -9 and restarted
// loses nothing; bad tokens and bad sweeps are refused without state changes.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "proto/keel.grpc.pb.h"

namespace {

constexpr char kUserToken[] = "user-token-0123456789abcdef";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef";

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// A child process with its output in a log file; killed (SIGKILL) when destroyed.
class Process {
 public:
  Process(std::vector<std::string> args, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = freopen(log.c_str(), "a", stderr);
      (void)f;
      setenv("KEEL_USER_TOKENS", kUserToken, 1);
      setenv("KEEL_WORKER_TOKEN", kWorkerToken, 1);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(&a[0]);
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Process() { Kill(SIGKILL); }
  void Kill(int signal) {
    if (pid_ > 0) {
      kill(pid_, signal);
      int status;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
};

class Cluster {
 public:
  explicit Cluster(const std::string& name) : dir_(TempDir(name)), port_(FreePort()) { StartKeeld(); }

  void StartKeeld() {
    keeld_.reset(new Process({"server/keeld", "--listen", Address(), "--state-dir", dir_ + "/state",
                              "--metrics-listen", "off", "--lease-ms", "1500", "--heartbeat-ms", "200"},
                             dir_ + "/keeld.log"));
    auto channel = grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials());
    ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)));
    stub_ = keel::v1::KeelService::NewStub(channel);
  }
  void KillKeeld() { keeld_->Kill(SIGKILL); }

  // A worker with one CPU slot and its own work dir.
  Process* AddWorker(const std::string& name) {
    workers_[name].reset(new Process({"worker/keel-worker", "--server", Address(), "--trainer", "worker/keel-train",
                                      "--work-dir", dir_ + "/" + name, "--cpu-slots", "1", "--metrics-listen", "off"},
                                     dir_ + "/" + name + ".log"));
    return workers_[name].get();
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(port_); }
  keel::v1::KeelService::Stub* stub() { return stub_.get(); }
  const std::string& dir() const { return dir_; }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token = kUserToken) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->AddMetadata("authorization", "Bearer " + token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  }

  grpc::Status Submit(const std::string& yaml, keel::v1::SubmitSweepResponse* out) {
    keel::v1::SubmitSweepRequest request;
    request.mutable_spec()->set_yaml(yaml);
    request.mutable_spec()->set_source("test-sweep.yaml");
    return stub_->SubmitSweep(Context().get(), request, out);
  }

  std::vector<keel::v1::Run> Runs(const std::string& sweep) {
    keel::v1::ListRunsRequest request;
    request.set_sweep_id(sweep);
    keel::v1::ListRunsResponse response;
    grpc::Status s = stub_->ListRuns(Context().get(), request, &response);
    return std::vector<keel::v1::Run>(response.runs().begin(), response.runs().end());
  }

  // Polls until every run of the sweep ended (or timeout); returns the runs.
  std::vector<keel::v1::Run> WaitDone(const std::string& sweep, int seconds,
                                      const std::function<void(const std::vector<keel::v1::Run>&)>& each = nullptr) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    std::vector<keel::v1::Run> runs;
    while (std::chrono::steady_clock::now() < deadline) {
      runs = Runs(sweep);
      if (each) each(runs);
      bool done = !runs.empty();
      for (const auto& r : runs) {
        done = done && (r.state() == keel::v1::SUCCEEDED || r.state() == keel::v1::FAILED ||
                        r.state() == keel::v1::CANCELLED);
      }
      if (done) return runs;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return runs;
  }

  std::vector<keel::v1::MetricPoint> Metrics(const std::string& run) {
    keel::v1::GetMetricsRequest request;
    request.set_run_id(run);
    keel::v1::GetMetricsResponse response;
    stub_->GetMetrics(Context().get(), request, &response);
    return std::vector<keel::v1::MetricPoint>(response.points().begin(), response.points().end());
  }

 private:
  std::string dir_;
  int port_;
  std::unique_ptr<Process> keeld_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  std::unique_ptr<keel::v1::KeelService::Stub> stub_;
};

std::string SmallSweep(int steps, const std::string& axes) {
  return "name: small\n"
         "base:\n"
         "  model: {type: proxy, layers: 1, width: 16}\n"
         "  batch: 32\n  threads: 1\n  checkpoint_every: 10\n"
         "  steps: " + std::to_string(steps) + "\n" + axes;
}

TEST(ServiceE2eTest, SweepCompletesWithMetricsAndEvents) {
  Cluster cluster("e2e_sweep");
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
}

TEST(ServiceE2eTest, WorkerKilledMidRunResumesElsewhereWithTheSameFinalLoss) {
  Cluster cluster("e2e_worker_kill");
  Process* first = cluster.AddWorker("w1");
  keel::v1::SubmitSweepResponse submitted;
  // Long enough (a few seconds) that the kill lands mid-run.
  const std::string sweep = SmallSweep(3000, "");
  ASSERT_TRUE(cluster.Submit(sweep, &submitted).ok());
  const std::string run_id = submitted.runs(0).id();
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
  EXPECT_EQ(runs[0].state(), keel::v1::SUCCEEDED) << runs[0].message();
  EXPECT_EQ(runs[0].restarts(), 1);
  auto points = cluster.Metrics(run_id);
  ASSERT_FALSE(points.empty());
  EXPECT_EQ(points.back().step(), 3000);
  EXPECT_EQ(points.size(), 3000u);  // every step stored once

  // The same run uninterrupted, by keel-train directly.
  const std::string dir = cluster.dir() + "/direct";
  std::ofstream(cluster.dir() + "/direct.yaml") << submitted.runs(0).spec().yaml();
  ASSERT_EQ(std::system(("worker/keel-train --quiet --config " + cluster.dir() + "/direct.yaml --run-dir " + dir).c_str()), 0);
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  const std::string json = points.back().json();
  auto loss_of = [](const std::string& j) { return j.substr(j.find("\"loss\":"), j.find(",\"lr\"") - j.find("\"loss\":")); };
  EXPECT_EQ(loss_of(json), loss_of(last));  // bit for bit, as printed
}

TEST(ServiceE2eTest, KeeldKilledAndRestartedLosesNothing) {
  Cluster cluster("e2e_keeld_kill");
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

}  // namespace
