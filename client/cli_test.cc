// RunCli against a fake KeelService: a real grpc::Server on 127.0.0.1:0 with
// canned sweeps, runs, metrics and events, checking the bearer token.
#include "client/cli.h"

#include <arpa/inet.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "proto/keel.grpc.pb.h"
#include "proto/keel.pb.h"
#include "proto/test_server.h"

namespace keel {
namespace client {
namespace {

constexpr char kToken[] = "good-token-0123456789";
constexpr char kBadYamlMessage[] =
    "sweep.yaml:3: axes.precision: \"mxfp9\" is not a precision preset; allowed: bf16, mxfp8_e4m3, nvfp4";

// Seventeen significant digits, as a double holds them: people see four.
constexpr double kRunningLoss = 2.4567890123456789;
constexpr double kFinalLoss = 1.4999999999999999;  // 1.5 to four digits

v1::Run MakeRun(const std::string& id, const std::string& sweep, int index, v1::RunState state, const std::string& lr) {
  v1::Run run;
  run.set_id(id);
  run.set_sweep_id(sweep);
  run.set_index(index);
  run.set_state(state);
  run.set_step(state == v1::QUEUED ? 0 : 50);
  run.set_steps(100);
  run.set_loss(state == v1::QUEUED ? 0 : kRunningLoss);
  run.set_precision("bf16");
  (*run.mutable_axes())["optimizer.lr"] = lr;
  return run;
}

class FakeKeel final : public v1::KeelService::Service {
 public:
  FakeKeel() {
    // r1 is a gang of 4 CPU ranks over two workers.
    v1::Run gang = MakeRun("r1", "sw-1", 0, v1::RUNNING, "6e-4");
    gang.set_cpu_slots(4);
    gang.set_worker_id("w1");
    for (int part = 0; part < 2; ++part) {
      v1::RunPart* p = gang.add_parts();
      p->set_worker_id(part == 0 ? "w1" : "w2");
      p->set_first_rank(2 * part);
      p->set_ranks(2);
    }
    AddSweep("sw-1", "lr-sweep", {gang, MakeRun("r2", "sw-1", 1, v1::QUEUED, "1e-3")});
    AddSweep("sw-fail", "",
             {MakeRun("f1", "sw-fail", 0, v1::RUNNING, "6e-4"), MakeRun("f2", "sw-fail", 1, v1::RUNNING, "1e-3")});
    // e1 is a GPU gang of 2 hosts x 2 GPUs.
    v1::Run gpu_gang = MakeRun("e1", "sw-early", 0, v1::RUNNING, "6e-4");
    gpu_gang.set_gpus(4);
    gpu_gang.set_hosts(2);
    gpu_gang.set_gpus_per_host(2);
    gpu_gang.set_worker_id("w1");
    for (int part = 0; part < 2; ++part) {
      v1::RunPart* p = gpu_gang.add_parts();
      p->set_worker_id(part == 0 ? "w1" : "w2");
      p->set_first_rank(2 * part);
      p->set_ranks(2);
      p->add_device_indices(part == 0 ? 0 : 2);
      p->add_device_indices(part == 0 ? 1 : 3);
    }
    AddSweep("sw-early", "", {gpu_gang});
    for (int step : {0, 10, 20}) {
      v1::MetricPoint p;
      p.set_run_id("r1");
      p.set_step(step);
      p.set_loss(4.0 - step * 0.1);
      p.set_lr(0.0006);
      p.set_tokens_per_s(1500);
      p.set_grad_norm(0.25);
      metrics_["r1"].push_back(p);
    }
    v1::MetricPoint p;
    p.set_run_id("r2");
    p.set_step(0);
    p.set_loss(5);
    p.set_lr(0.001);
    p.set_tokens_per_s(1400.5);
    p.set_grad_norm(1);
    metrics_["r2"].push_back(p);
    intervention_.set_run_id("r1");
    intervention_.set_step(10);
    intervention_.set_unix_ms(1700000000000);
    intervention_.set_kind("switch_precision");
    intervention_.set_message("bf16 after loss spike");
    (*intervention_.mutable_details())["from"] = "mxfp8_e4m3";
    (*intervention_.mutable_details())["precision"] = "bf16";
  }

  std::atomic<int> cancel_delay_ms{0};
  // What the handlers saw, for the tests to check.
  std::mutex mu;
  v1::SweepSpec submitted;
  std::string cancelled_sweep, cancelled_run;
  v1::InterveneRequest intervene;
  std::vector<int> max_points_seen;

  grpc::Status SubmitSweep(grpc::ServerContext* c, const v1::SubmitSweepRequest* request,
                           v1::SubmitSweepResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu);
    submitted = request->spec();
    if (request->spec().yaml().find("mxfp9") != std::string::npos)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, kBadYamlMessage);
    *response->mutable_sweep() = sweeps_.at("sw-1");
    for (const auto& run : runs_.at("sw-1")) *response->add_runs() = run;
    return grpc::Status::OK;
  }
  grpc::Status GetSweep(grpc::ServerContext* c, const v1::GetSweepRequest* request, v1::Sweep* sweep) override {
    if (!Authorized(*c)) return Unauthenticated();
    auto it = sweeps_.find(request->sweep_id());
    if (it == sweeps_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no sweep " + request->sweep_id());
    *sweep = it->second;
    return grpc::Status::OK;
  }
  grpc::Status ListSweeps(grpc::ServerContext* c, const v1::ListSweepsRequest*,
                          v1::ListSweepsResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    for (const auto& kv : sweeps_) *response->add_sweeps() = kv.second;
    return grpc::Status::OK;
  }
  grpc::Status CancelSweep(grpc::ServerContext* c, const v1::CancelSweepRequest* request, v1::Sweep* sweep) override {
    if (!Authorized(*c)) return Unauthenticated();
    // A long cancel (a 10,000-run sweep): answered late, but answered.
    std::this_thread::sleep_for(std::chrono::milliseconds(cancel_delay_ms.load()));
    std::lock_guard<std::mutex> lock(mu);
    cancelled_sweep = request->sweep_id();
    *sweep = sweeps_.at(request->sweep_id());
    sweep->set_state(v1::SWEEP_CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status ListRuns(grpc::ServerContext* c, const v1::ListRunsRequest* request,
                        v1::ListRunsResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    for (const auto& kv : runs_) {
      if (!request->sweep_id().empty() && kv.first != request->sweep_id()) continue;
      // Reversed: the client sorts by index.
      for (auto it = kv.second.rbegin(); it != kv.second.rend(); ++it) *response->add_runs() = *it;
    }
    return grpc::Status::OK;
  }
  grpc::Status GetRun(grpc::ServerContext* c, const v1::GetRunRequest* request, v1::Run* run) override {
    if (!Authorized(*c)) return Unauthenticated();
    if (!FindRun(request->run_id(), run))
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no run " + request->run_id());
    return grpc::Status::OK;
  }
  grpc::Status CancelRun(grpc::ServerContext* c, const v1::CancelRunRequest* request, v1::Run* run) override {
    if (!Authorized(*c)) return Unauthenticated();
    if (!FindRun(request->run_id(), run))
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no run " + request->run_id());
    std::lock_guard<std::mutex> lock(mu);
    cancelled_run = request->run_id();
    run->set_state(v1::CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status WatchRun(grpc::ServerContext* c, const v1::WatchRequest* request,
                        grpc::ServerWriter<v1::WatchUpdate>* writer) override {
    if (!Authorized(*c)) return Unauthenticated();
    v1::Run run;
    if (!FindRun(request->id(), &run)) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no run");
    Finish(&run, v1::SUCCEEDED);
    WriteRun(writer, run);
    return grpc::Status::OK;
  }
  grpc::Status WatchSweep(grpc::ServerContext* c, const v1::WatchRequest* request,
                          grpc::ServerWriter<v1::WatchUpdate>* writer) override {
    if (!Authorized(*c)) return Unauthenticated();
    auto it = runs_.find(request->id());
    if (it == runs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no sweep");
    if (request->id() == "sw-early") return grpc::Status::OK;  // ends before the run does
    std::vector<v1::Run> runs = it->second;
    // A metric point and the already-listed intervention (must not count twice).
    v1::WatchUpdate update;
    v1::MetricPoint* point = update.mutable_metric();
    point->set_run_id(runs[0].id());
    point->set_step(60);
    point->set_loss(2.0);
    writer->Write(update);
    update.Clear();
    *update.mutable_event() = intervention_;
    writer->Write(update);
    for (size_t i = 0; i < runs.size(); ++i) {
      bool fail = request->id() == "sw-fail" && i == 1;
      Finish(&runs[i], fail ? v1::FAILED : v1::SUCCEEDED);
      WriteRun(writer, runs[i]);
    }
    return grpc::Status::OK;
  }
  grpc::Status GetMetrics(grpc::ServerContext* c, const v1::GetMetricsRequest* request,
                          v1::GetMetricsResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu);
    max_points_seen.push_back(request->max_points());
    for (const auto& p : metrics_[request->run_id()]) *response->add_points() = p;
    return grpc::Status::OK;
  }
  grpc::Status ListEvents(grpc::ServerContext* c, const v1::ListEventsRequest* request,
                          v1::ListEventsResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    if (request->sweep_id() == "sw-1" || request->run_id() == "r1") {
      v1::Event state;
      state.set_run_id("r1");
      state.set_step(0);
      state.set_unix_ms(1699999999000);
      state.set_kind("state");
      state.set_message("RUNNING on w1");
      *response->add_events() = state;
      *response->add_events() = intervention_;
    }
    return grpc::Status::OK;
  }
  grpc::Status Intervene(grpc::ServerContext* c, const v1::InterveneRequest* request,
                         v1::InterveneResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    std::lock_guard<std::mutex> lock(mu);
    intervene = *request;
    response->mutable_event()->set_run_id(request->run_id());
    response->mutable_event()->set_step(42);
    response->mutable_event()->set_kind(request->rollback_steps() > 0 ? "rollback" : "switch_precision");
    response->mutable_event()->set_message("to " + request->precision());
    return grpc::Status::OK;
  }
  grpc::Status ListWorkers(grpc::ServerContext* c, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    if (!Authorized(*c)) return Unauthenticated();
    v1::Worker* worker = response->add_workers();
    worker->set_id("w1");
    worker->set_host("gpu-host-1");
    worker->set_connected(true);
    worker->set_cpu_slots(8);
    worker->add_run_ids("r1");
    v1::Device* device = worker->add_devices();
    device->set_index(0);
    device->set_name("NVIDIA H200");
    device->set_run_id("r1");
    worker->add_devices()->set_index(1);
    return grpc::Status::OK;
  }

 private:
  static bool Authorized(const grpc::ServerContext& context) {
    auto range = context.client_metadata().equal_range("authorization");
    for (auto it = range.first; it != range.second; ++it)
      if (std::string(it->second.data(), it->second.size()) == std::string("Bearer ") + kToken) return true;
    return false;
  }
  static grpc::Status Unauthenticated() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token");
  }
  static void Finish(v1::Run* run, v1::RunState state) {
    run->set_state(state);
    run->set_step(100);
    run->set_loss(kFinalLoss);
  }
  static void WriteRun(grpc::ServerWriter<v1::WatchUpdate>* writer, const v1::Run& run) {
    v1::WatchUpdate update;
    *update.mutable_run() = run;
    writer->Write(update);
  }
  void AddSweep(const std::string& id, const std::string& name, std::vector<v1::Run> runs) {
    v1::Sweep sweep;
    sweep.set_id(id);
    sweep.set_name(name);
    sweep.set_state(v1::SWEEP_ACTIVE);
    sweep.set_runs_total(static_cast<int>(runs.size()));
    (*sweep.mutable_runs_by_state())["RUNNING"] = 1;
    sweeps_[id] = sweep;
    runs_[id] = std::move(runs);
  }
  bool FindRun(const std::string& id, v1::Run* out) const {
    for (const auto& kv : runs_)
      for (const auto& run : kv.second)
        if (run.id() == id) {
          *out = run;
          return true;
        }
    return false;
  }

  std::map<std::string, v1::Sweep> sweeps_;
  std::map<std::string, std::vector<v1::Run>> runs_;
  std::map<std::string, std::vector<v1::MetricPoint>> metrics_;
  v1::Event intervention_;
};

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartTestServer({&service_});
    ASSERT_NE(server_.server, nullptr);
    ASSERT_GT(server_.port, 0);
    address_ = server_.address();
    // No user config or environment leaks into the tests.
    home_ = TempDir() + "/home-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    setenv("HOME", home_.c_str(), 1);
    unsetenv("KEEL_SERVER");
    unsetenv("KEEL_TOKEN");
  }
  void TearDown() override { server_.server->Shutdown(); }

  // Runs keel with --server and --token added; fills out_ and err_.
  int Keel(std::vector<std::string> args, bool add_connection = true) {
    if (add_connection) {
      args.push_back("--server");
      args.push_back(address_);
      args.push_back("--token=" + std::string(kToken));
    }
    std::ostringstream out, err;
    int code = RunCli(args, out, err);
    out_ = out.str();
    err_ = err.str();
    return code;
  }

  std::string WriteTemp(const std::string& name, const std::string& contents) {
    std::string path = TempDir() + "/" + name;
    std::ofstream(path) << contents;
    return path;
  }

  FakeKeel service_;
  TestServer server_;
  std::string address_, home_, out_, err_;
};

TEST_F(CliTest, SubmitSendsTheFileAndPrintsTheSweepIdAndRunCount) {
  std::string path = WriteTemp("sweep.yaml", "name: lr-sweep\naxes: {optimizer.lr: [6e-4, 1e-3]}\n");
  ASSERT_EQ(Keel({"submit", path}), kExitOk) << err_;
  EXPECT_EQ(out_, "submitted sweep sw-1 (lr-sweep): 2 runs\n");
  std::lock_guard<std::mutex> lock(service_.mu);
  EXPECT_EQ(service_.submitted.yaml(), "name: lr-sweep\naxes: {optimizer.lr: [6e-4, 1e-3]}\n");
  EXPECT_EQ(service_.submitted.source(), path);
}

TEST_F(CliTest, SubmitWatchFollowsTheNewSweep) {
  std::string path = WriteTemp("sweep_watch.yaml", "name: lr-sweep\n");
  EXPECT_EQ(Keel({"submit", "--watch", path}), kExitOk) << err_;
  EXPECT_NE(out_.find("submitted sweep sw-1"), std::string::npos);
  EXPECT_NE(out_.find("2 runs: SUCCEEDED=2"), std::string::npos) << out_;
}

TEST_F(CliTest, InvalidArgumentPrintsTheServerMessageVerbatim) {
  std::string path = WriteTemp("bad.yaml", "axes: {precision: [mxfp9]}\n");
  EXPECT_EQ(Keel({"submit", path}), kExitInvalidArgument);
  EXPECT_EQ(err_, std::string(kBadYamlMessage) + "\n");
  EXPECT_EQ(out_, "");
}

TEST_F(CliTest, RunsTableIsSortedAndAligned) {
  ASSERT_EQ(Keel({"runs", "sw-1"}), kExitOk) << err_;
  EXPECT_EQ(out_,
            "ID  SWEEP  STATE    STEP    LOSS   PRECISION  RESTARTS  RANKS  WORKER  GPUS  AXES\n"
            "r1  sw-1   RUNNING  50/100  2.457  bf16       0         4      w1+w2   -     optimizer.lr=6e-4\n"
            "r2  sw-1   QUEUED   0/100   -      bf16       0         1      -       -     optimizer.lr=1e-3\n");
  ASSERT_EQ(Keel({"runs", "sw-early"}), kExitOk) << err_;
  EXPECT_NE(out_.find("4      w1+w2   w1[0,1] w2[2,3]  optimizer.lr=6e-4\n"), std::string::npos) << out_;
}

TEST_F(CliTest, ListingsAsJsonParseBack) {
  ASSERT_EQ(Keel({"runs", "sw-1", "--output", "json"}), kExitOk) << err_;
  v1::ListRunsResponse runs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &runs).ok()) << out_;
  ASSERT_EQ(runs.runs_size(), 2);
  EXPECT_EQ(runs.runs(1).id(), "r1");  // the server's order, unsorted
  EXPECT_EQ(runs.runs(1).axes().at("optimizer.lr"), "6e-4");
  EXPECT_EQ(runs.runs(0).state(), v1::QUEUED);
  EXPECT_EQ(runs.runs(1).loss(), kRunningLoss);  // JSON keeps every digit: it reads back exactly

  ASSERT_EQ(Keel({"sweeps", "--output=json"}), kExitOk) << err_;
  v1::ListSweepsResponse sweeps;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &sweeps).ok()) << out_;
  ASSERT_EQ(sweeps.sweeps_size(), 3);
  EXPECT_EQ(sweeps.sweeps(0).id(), "sw-1");
  EXPECT_EQ(sweeps.sweeps(0).runs_by_state().at("RUNNING"), 1);

  ASSERT_EQ(Keel({"workers", "--output", "json"}), kExitOk) << err_;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &workers).ok()) << out_;
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).devices(0).name(), "NVIDIA H200");

  ASSERT_EQ(Keel({"show", "r1", "--output", "json"}), kExitOk) << err_;
  EXPECT_EQ(out_.rfind("{\"run\":{", 0), 0u) << out_;
  EXPECT_NE(out_.find("\"kind\":\"switch_precision\""), std::string::npos) << out_;

  EXPECT_EQ(Keel({"sweeps", "--output", "yaml"}), kExitUsage);
}

TEST_F(CliTest, SweepsAndWorkersTables) {
  ASSERT_EQ(Keel({"sweeps"}), kExitOk) << err_;
  EXPECT_EQ(out_.substr(0, out_.find('\n')), "ID        NAME      STATE   RUNS  BY STATE   CREATED");
  EXPECT_NE(out_.find("sw-1      lr-sweep  ACTIVE  2     RUNNING=1  -"), std::string::npos) << out_;
  ASSERT_EQ(Keel({"workers"}), kExitOk) << err_;
  EXPECT_NE(out_.find("w1  gpu-host-1  yes        1/2"), std::string::npos) << out_;
}

TEST_F(CliTest, ShowPrintsDetailsAndRecentEvents) {
  ASSERT_EQ(Keel({"show", "r1"}), kExitOk) << err_;
  EXPECT_NE(out_.find("state:       RUNNING"), std::string::npos) << out_;
  EXPECT_NE(out_.find("axes:        optimizer.lr=6e-4"), std::string::npos) << out_;
  EXPECT_NE(out_.find("loss:        2.457\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("worker:      w1 (ranks 0-1), w2 (ranks 2-3)\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("ranks:       4\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("gpus:        -\n"), std::string::npos) << out_;  // a CPU gang
  EXPECT_NE(out_.find("recent events (2 of 2):"), std::string::npos) << out_;
  EXPECT_NE(out_.find("switch_precision  bf16 after loss spike"), std::string::npos) << out_;
  EXPECT_EQ(Keel({"show", "nope"}), kExitNotFound);
  // A GPU gang: its ranks, workers and each worker's GPUs.
  ASSERT_EQ(Keel({"show", "e1"}), kExitOk) << err_;
  EXPECT_NE(out_.find("worker:      w1 (ranks 0-1), w2 (ranks 2-3)\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("ranks:       4\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("gpus:        w1[0,1] w2[2,3]\n"), std::string::npos) << out_;
}

TEST_F(CliTest, ExportCsvIsExact) {
  ASSERT_EQ(Keel({"export", "sw-1", "--format", "csv"}), kExitOk) << err_;
  EXPECT_EQ(out_,
            "sweep_id,run_id,step,loss,lr,tokens_per_s,grad_norm,optimizer.lr\n"
            "sw-1,r1,0,4,0.0006,1500,0.25,6e-4\n"
            "sw-1,r1,10,3,0.0006,1500,0.25,6e-4\n"
            "sw-1,r1,20,2,0.0006,1500,0.25,6e-4\n"
            "sw-1,r2,0,5,0.001,1400.5,1,1e-3\n");
  std::lock_guard<std::mutex> lock(service_.mu);
  EXPECT_EQ(service_.max_points_seen, (std::vector<int>{0, 0}));
}

TEST_F(CliTest, ExportJsonlToFileIsExact) {
  std::string path = TempDir() + "/export.jsonl";
  ASSERT_EQ(Keel({"export", "sw-1", "--format", "jsonl", "-o", path}), kExitOk) << err_;
  EXPECT_EQ(out_, "");
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  EXPECT_EQ(contents.str(),
            "{\"sweep_id\":\"sw-1\",\"run_id\":\"r1\",\"step\":0,\"loss\":4,\"lr\":0.0006,\"tokens_per_s\":1500,"
            "\"grad_norm\":0.25,\"optimizer.lr\":\"6e-4\"}\n"
            "{\"sweep_id\":\"sw-1\",\"run_id\":\"r1\",\"step\":10,\"loss\":3,\"lr\":0.0006,\"tokens_per_s\":1500,"
            "\"grad_norm\":0.25,\"optimizer.lr\":\"6e-4\"}\n"
            "{\"sweep_id\":\"sw-1\",\"run_id\":\"r1\",\"step\":20,\"loss\":2,\"lr\":0.0006,\"tokens_per_s\":1500,"
            "\"grad_norm\":0.25,\"optimizer.lr\":\"6e-4\"}\n"
            "{\"sweep_id\":\"sw-1\",\"run_id\":\"r2\",\"step\":0,\"loss\":5,\"lr\":0.001,\"tokens_per_s\":1400.5,"
            "\"grad_norm\":1,\"optimizer.lr\":\"1e-3\"}\n");
  EXPECT_EQ(Keel({"export", "sw-nope", "--format", "csv"}), kExitNotFound);
  EXPECT_EQ(Keel({"export", "sw-1", "--format", "xml"}), kExitUsage);
}

TEST_F(CliTest, PlotWritesAnSvgWithOneLinePerRunAndMarkers) {
  std::string path = TempDir() + "/plot.svg";
  std::remove(path.c_str());
  ASSERT_EQ(Keel({"plot", "sw-1", "-o", path}), kExitOk) << err_;
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  std::stringstream contents;
  contents << in.rdbuf();
  std::string svg = contents.str();
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  size_t polylines = 0;
  for (size_t at = 0; (at = svg.find("<polyline", at)) != std::string::npos; ++at) ++polylines;
  EXPECT_EQ(polylines, 2u);
  // The intervention: its dashed line, its tag and its line in the list; the
  // switch's shape on r1's line.
  EXPECT_NE(svg.find("<g class=\"marker\" data-run=\"r1\" data-step=\"10\""), std::string::npos) << svg;
  EXPECT_NE(svg.find(">r1 at step 10: switch mxfp8_e4m3 -&gt; bf16<"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<path class=\"switch\" data-run=\"r1\" data-step=\"10\" data-scheme=\"bf16\""),
            std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(out_, "wrote " + path + ": 2 runs, 1 interventions\n");
  // A run id plots that run alone.
  ASSERT_EQ(Keel({"plot", "r2", "-o", path}), kExitOk) << err_;
  EXPECT_EQ(out_, "wrote " + path + ": 1 run, 0 interventions\n");
  EXPECT_EQ(Keel({"plot", "sw-1"}), kExitUsage);
}

TEST_F(CliTest, WatchExitsZeroWhenEveryRunSucceeded) {
  ASSERT_EQ(Keel({"watch", "sw-1"}), kExitOk) << err_;
  // Not a TTY: appended lines; the intervention counted once.
  // The loss to four significant digits: 2.457 while running, 1.5 at the end.
  EXPECT_NE(out_.find("r1  RUNNING  [##########..........] 50/100  2.457  bf16  0  1\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("r1  SUCCEEDED  [####################] 100/100  1.5  bf16  0  1\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("r2  SUCCEEDED  [####################] 100/100  1.5  bf16  0  0\n"), std::string::npos) << out_;
  EXPECT_EQ(out_.find("2.45678"), std::string::npos) << out_;
  EXPECT_EQ(out_.find("\x1b["), std::string::npos);
  EXPECT_NE(out_.find("2 runs: SUCCEEDED=2"), std::string::npos);
}

TEST_F(CliTest, WatchExitsOneWhenARunFailed) {
  EXPECT_EQ(Keel({"watch", "sw-fail"}), kExitFailed) << err_;
  EXPECT_NE(out_.find("f2  FAILED"), std::string::npos) << out_;
  EXPECT_NE(out_.find("2 runs: FAILED=1 SUCCEEDED=1"), std::string::npos) << out_;
}

TEST_F(CliTest, WatchOfARunAndOfAStreamThatEndsEarly) {
  EXPECT_EQ(Keel({"watch", "r2"}), kExitOk) << err_;
  EXPECT_NE(out_.find("1 run: SUCCEEDED=1"), std::string::npos) << out_;
  EXPECT_EQ(Keel({"watch", "sw-early"}), kExitFailed);
  EXPECT_NE(err_.find("ended the watch stream"), std::string::npos) << err_;
  EXPECT_EQ(Keel({"watch", "nope"}), kExitNotFound);
}

TEST_F(CliTest, CancelTriesTheSweepFirstThenTheRun) {
  ASSERT_EQ(Keel({"cancel", "sw-1"}), kExitOk) << err_;
  EXPECT_EQ(out_, "cancelled sweep sw-1 (CANCELLED)\n");
  ASSERT_EQ(Keel({"cancel", "r2"}), kExitOk) << err_;
  EXPECT_EQ(out_, "cancelled run r2 (CANCELLED)\n");
  {
    std::lock_guard<std::mutex> lock(service_.mu);
    EXPECT_EQ(service_.cancelled_sweep, "sw-1");
    EXPECT_EQ(service_.cancelled_run, "r2");
  }
  EXPECT_EQ(Keel({"cancel", "nope"}), kExitNotFound);
}

TEST_F(CliTest, ACancelLongerThanTheUnaryDeadlineIsASuccess) {
  service_.cancel_delay_ms = 6000;  // past the 5 s that every call had before
  ASSERT_EQ(Keel({"cancel", "sw-1"}), kExitOk) << err_;
  EXPECT_EQ(out_, "cancelled sweep sw-1 (CANCELLED)\n");
}

TEST_F(CliTest, ACancelThatTimesOutSaysItMayStillCompleteAndHowToCheck) {
  service_.cancel_delay_ms = 3000;
  setenv("KEEL_LONG_DEADLINE_S", "1", 1);
  const int code = Keel({"cancel", "sw-1"});
  unsetenv("KEEL_LONG_DEADLINE_S");
  EXPECT_EQ(code, kExitUnavailable);
  EXPECT_NE(err_.find("DEADLINE_EXCEEDED"), std::string::npos) << err_;
  EXPECT_NE(err_.find("may still complete it: check with `keel runs sw-1`"), std::string::npos) << err_;
}

TEST_F(CliTest, InterveneSendsTheFlags) {
  ASSERT_EQ(Keel({"intervene", "r1", "--precision", "bf16", "--rollback-steps", "200", "--reason", "spike"}), kExitOk)
      << err_;
  EXPECT_EQ(out_, "run r1: rollback at step 42: to bf16\n");
  std::lock_guard<std::mutex> lock(service_.mu);
  EXPECT_EQ(service_.intervene.precision(), "bf16");
  EXPECT_EQ(service_.intervene.rollback_steps(), 200);
  EXPECT_EQ(service_.intervene.reason(), "spike");
}

TEST_F(CliTest, WrongOrMissingTokenExitsFour) {
  EXPECT_EQ(Keel({"sweeps", "--server", address_, "--token", "wrong-token-000000000"}, false), kExitUnauthenticated);
  EXPECT_NE(err_.find("UNAUTHENTICATED"), std::string::npos) << err_;
  EXPECT_EQ(err_.find("wrong-token"), std::string::npos);  // never echoed
  EXPECT_EQ(Keel({"sweeps", "--server", address_}, false), kExitUnauthenticated);
}

TEST_F(CliTest, ServerAndTokenComeFromEnvironmentThenConfig) {
  std::string dir = home_ + "/.config/keel";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/config") << "# keel config\nserver = " << address_ << "\ntoken = \"" << kToken << "\"\n";
  EXPECT_EQ(Keel({"sweeps"}, false), kExitOk) << err_;
  setenv("KEEL_TOKEN", "wrong-token-000000000", 1);  // the environment beats the config
  EXPECT_EQ(Keel({"sweeps"}, false), kExitUnauthenticated);
  std::string token_file = WriteTemp("token", std::string(kToken) + "\n");
  EXPECT_EQ(Keel({"sweeps", "--token-file", token_file}, false), kExitOk) << err_;  // the flag beats both
  EXPECT_EQ(Keel({"sweeps", "--token-file", TempDir() + "/no-such-token"}, false), kExitUsage);
  setenv("KEEL_SERVER", "127.0.0.1:1", 1);
  EXPECT_EQ(Keel({"sweeps", "--token", kToken}, false), kExitUnavailable);
}

int ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);  // nobody listens there now
  return ntohs(addr.sin_port);
}

TEST_F(CliTest, UnreachableServerExitsThreeQuickly) {
  std::string closed = "127.0.0.1:" + std::to_string(ClosedPort());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Keel({"sweeps", "--server", closed, "--token", kToken}, false), kExitUnavailable);
  EXPECT_NE(err_.find("could not reach keeld at " + closed), std::string::npos) << err_;
  EXPECT_EQ(Keel({"watch", "sw-1", "--server", closed, "--token", kToken}, false), kExitUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(6));
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Keel({}, false), kExitUsage);
  EXPECT_NE(err_.find("Exit codes"), std::string::npos);
  EXPECT_EQ(Keel({"frobnicate"}), kExitUsage);
  EXPECT_EQ(Keel({"runs", "--bogus"}), kExitUsage);
  EXPECT_EQ(Keel({"show"}), kExitUsage);
  EXPECT_EQ(Keel({"show", "a", "b"}), kExitUsage);
  EXPECT_EQ(Keel({"submit", TempDir() + "/no-such-sweep.yaml"}), kExitUsage);
  EXPECT_EQ(Keel({"intervene", "r1"}), kExitUsage);
  EXPECT_EQ(Keel({"intervene", "r1", "--precision", "bf16", "--rollback-steps", "-3"}), kExitUsage);
  EXPECT_EQ(Keel({"sweeps", "--server"}, false), kExitUsage);
  EXPECT_EQ(Keel({"submit", "x.yaml", "--watch=yes"}), kExitUsage);
  EXPECT_EQ(Keel({"sweeps", "--token", "a", "--token-file", "b"}, false), kExitUsage);
}

// The command line is split by CLI11; the messages are keel's own.
TEST_F(CliTest, UsageErrorsSayWhatIsWrongInOneMessage) {
  EXPECT_EQ(Keel({"frobnicate"}), kExitUsage);
  EXPECT_EQ(err_, "keel: unknown command \"frobnicate\"\nrun `keel --help` for the commands\n");
  EXPECT_EQ(Keel({"runs", "--bogus"}, false), kExitUsage);
  EXPECT_EQ(err_, "keel: unknown flag --bogus for `keel runs`\nusage: keel runs [SWEEP] [--output json] (keel runs --help)\n");
  EXPECT_EQ(Keel({"sweeps", "--server"}, false), kExitUsage);
  EXPECT_EQ(err_, "keel: flag --server needs a value\nusage: keel sweeps [--output json] (keel sweeps --help)\n");
  EXPECT_EQ(Keel({"submit", "x.yaml", "--watch=yes"}, false), kExitUsage);
  EXPECT_EQ(err_, "keel: flag --watch takes no value\nusage: keel submit SWEEP.yaml [--watch] (keel submit --help)\n");
  EXPECT_EQ(Keel({"show", "a", "b"}, false), kExitUsage);
  EXPECT_EQ(err_, "keel: too many arguments\nusage: keel show RUN [--output json]\n");
  // Global flags go before or after the command; `--` ends the flags.
  std::string closed = "127.0.0.1:" + std::to_string(ClosedPort());
  EXPECT_EQ(Keel({"--server", closed, "sweeps"}, false), kExitUnavailable);
  EXPECT_NE(err_.find("could not reach keeld at " + closed), std::string::npos) << err_;
  EXPECT_EQ(Keel({"show", "--server=" + closed, "--", "-r1"}, false), kExitUnavailable);
  EXPECT_NE(err_.find("could not reach keeld at " + closed), std::string::npos) << err_;
  EXPECT_EQ(Keel({"show", "--", "-r1", "--server", closed}, false), kExitUsage);
  EXPECT_EQ(err_, "keel: too many arguments\nusage: keel show RUN [--output json]\n");
}

TEST_F(CliTest, HelpForTheToolAndEachCommand) {
  ASSERT_EQ(Keel({"--help"}, false), kExitOk);
  EXPECT_NE(out_.find("keel intervene RUN --precision NAME [--rollback-steps N] [--reason TEXT]"), std::string::npos);
  EXPECT_NE(out_.find("6  keeld rejected the input (INVALID_ARGUMENT"), std::string::npos);
  ASSERT_EQ(Keel({"watch", "--help"}, false), kExitOk);
  EXPECT_EQ(out_.rfind("Usage: keel watch SWEEP|RUN\n", 0), 0u) << out_;
  ASSERT_EQ(Keel({"plot", "--help"}, false), kExitOk);
  EXPECT_NE(out_.find("at the step where it was decided (a rollback's from_step,\nnot the step it resumed from)"),
            std::string::npos)
      << out_;
  ASSERT_EQ(Keel({"help", "export"}, false), kExitOk);
  EXPECT_EQ(out_.rfind("Usage: keel export SWEEP [--format csv|jsonl] [-o FILE]\n", 0), 0u) << out_;
}

}  // namespace
}  // namespace client
}  // namespace keel
