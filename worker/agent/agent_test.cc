// The agent against a real gRPC WorkerService on loopback (a stand-in for
// keeld's, which records what it receives): it registers with the worker token,
// runs the assigned keel-train, streams every step's metrics, survives the
// coordinator dropping the stream mid-run (reconnects, re-registers with the
// live run, and delivers the rest), and reports the exit.
#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "proto/keel.grpc.pb.h"
#include "proto/test_server.h"

namespace keel {
namespace {

constexpr char kToken[] = "worker-token-0123456789";

class FakeCoordinator final : public v1::WorkerService::Service {
 public:
  explicit FakeCoordinator(std::string run_dir_spec) : spec_(std::move(run_dir_spec)) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    auto it = context->client_metadata().find("authorization");
    if (it == context->client_metadata().end() || std::string(it->second.data(), it->second.size()) !=
                                                      std::string("Bearer ") + kToken) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad token");
    }
    std::lock_guard<std::mutex> lock(mu_);
    registrations.push_back(*request);
    response->set_worker_id("w1");
    response->set_heartbeat_interval_ms(100);
    return grpc::Status::OK;
  }

  grpc::Status Connect(grpc::ServerContext*,
                       grpc::ServerReaderWriter<v1::WorkerCommand, v1::WorkerMessage>* stream) override {
    int connection;
    {
      std::lock_guard<std::mutex> lock(mu_);
      connection = ++connections;
    }
    if (connection == 1) {
      v1::WorkerCommand start;
      start.mutable_start()->set_run_id("r1");
      start.mutable_start()->set_attempt(1);
      start.mutable_start()->mutable_spec()->set_yaml(spec_);
      stream->Write(start);
    }
    v1::WorkerMessage m;
    int metrics_here = 0;
    while (stream->Read(&m)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (m.has_heartbeat()) ++heartbeats;
      if (m.has_started()) started = true;
      if (m.has_metric()) {
        steps.insert(m.metric().step());
        ++metrics_here;
      }
      if (m.has_checkpoint()) last_checkpoint = m.checkpoint().step();
      if (m.has_exit()) {
        exit = m.exit();
        exited = true;
        cv.notify_all();
      }
      // The first connection "crashes" after a few steps: the stream ends.
      if (connection == 1 && metrics_here >= 5) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "bye");
    }
    return grpc::Status::OK;
  }

  std::mutex mu_;
  std::condition_variable cv;
  std::vector<v1::RegisterRequest> registrations;
  int connections = 0;
  int heartbeats = 0;
  bool started = false;
  std::set<int64_t> steps;
  int64_t last_checkpoint = 0;
  bool exited = false;
  v1::RunExit exit;

 private:
  std::string spec_;
};

TEST(AgentTest, RunsAnAssignmentAcrossAReconnectAndReportsEveryStep) {
  FakeCoordinator coordinator(
      "model: {type: proxy, layers: 1, width: 16}\nbatch: 32\nthreads: 1\nsteps: 60\ncheckpoint_every: 20\n");
  const TestServer server = StartTestServer({&coordinator});
  ASSERT_TRUE(server.started());

  const char* tmp = std::getenv("TEST_TMPDIR");
  AgentOptions options;
  options.server = server.address();
  options.token = kToken;
  options.trainer = "worker/engine/keel-train";
  options.work_dir = std::string(tmp ? tmp : "/tmp") + "/agent";
  options.poll_ms = 20;
  options.verbose = false;
  Agent agent(options);
  std::atomic<bool> stop{false};
  std::thread thread([&] { agent.Run(&stop); });
  {
    std::unique_lock<std::mutex> lock(coordinator.mu_);
    coordinator.cv.wait_for(lock, std::chrono::seconds(60), [&] { return coordinator.exited; });
  }
  stop = true;
  thread.join();
  server.server->Shutdown();

  std::lock_guard<std::mutex> lock(coordinator.mu_);
  ASSERT_TRUE(coordinator.exited);
  EXPECT_EQ(coordinator.exit.run_id(), "r1");
  EXPECT_EQ(coordinator.exit.exit_code(), 0) << coordinator.exit.message();
  EXPECT_TRUE(coordinator.started);
  EXPECT_EQ(coordinator.steps.size(), 60u);  // every step arrived, across the reconnect
  EXPECT_EQ(*coordinator.steps.begin(), 1);
  EXPECT_EQ(*coordinator.steps.rbegin(), 60);
  EXPECT_EQ(coordinator.last_checkpoint, 60);
  EXPECT_GE(coordinator.connections, 2);
  ASSERT_GE(coordinator.registrations.size(), 2u);
  EXPECT_EQ(coordinator.registrations[0].cpu_slots(), 1);
  EXPECT_EQ(coordinator.registrations[1].worker_id(), "w1");  // re-registers as itself
  EXPECT_GT(coordinator.heartbeats, 0);
}

TEST(AgentTest, WrongTokenNeverRegisters) {
  FakeCoordinator coordinator("");
  const TestServer server = StartTestServer({&coordinator});
  ASSERT_TRUE(server.started());
  AgentOptions options;
  options.server = server.address();
  options.token = "not-the-token-0123456789";
  options.trainer = "worker/engine/keel-train";
  options.verbose = false;
  options.max_backoff_ms = 100;
  Agent agent(options);
  std::atomic<bool> stop{false};
  std::thread thread([&] { agent.Run(&stop); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  thread.join();
  server.server->Shutdown();
  EXPECT_EQ(agent.connects(), 0);
  std::lock_guard<std::mutex> lock(coordinator.mu_);
  EXPECT_EQ(coordinator.connections, 0);
  EXPECT_TRUE(coordinator.registrations.empty());
}

TEST(AgentTest, FakeGpusAreNumberedFromZeroAndSelectGpusKeepsTheNamedOnes) {
  const std::vector<v1::Device> fake = FakeGpus(3);
  ASSERT_EQ(fake.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fake[i].index(), i);
  std::vector<v1::Device> devices = fake;
  ASSERT_TRUE(SelectGpus("2,0", &devices).ok());
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].index(), 2);
  EXPECT_EQ(devices[1].index(), 0);
  for (const auto& [list, message] : std::vector<std::pair<std::string, std::string>>{
           {"3", "--gpus: no GPU 3 on this host (allowed: a comma-separated list of this host's GPU indices: 0,1,2)"},
           {"0,x", "--gpus: 'x' is not a GPU index (allowed: a comma-separated list of this host's GPU indices: 0,1,2)"},
           {"1,1", "--gpus: 1 is named twice (allowed: a comma-separated list of this host's GPU indices: 0,1,2)"},
           {"0,", "--gpus: '' is not a GPU index (allowed: a comma-separated list of this host's GPU indices: 0,1,2)"}}) {
    devices = fake;
    Status s = SelectGpus(list, &devices);
    EXPECT_EQ(s.message(), message) << list;
    EXPECT_EQ(devices.size(), 3u) << list;  // unchanged
  }
}

}  // namespace
}  // namespace keel
