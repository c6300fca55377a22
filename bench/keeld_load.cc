// keeld under load, in one process over real loopback gRPC: keeld's services on
// a real SQLite file, and a simulated fleet of workers whose "trainers" are
// threads speaking WorkerService. Measures
//   1. SubmitSweep latency for a 1,000-run sweep (expansion, validation of every
//      run, one transaction);
//   2. free slot -> assignment: a fake trainer exits and the worker's next
//      assignment arrives (the queue is full, so one is always waiting);
//   3. metric points/s keeld stores while W workers stream points flat out.
//   keeld_load [--workers W] [--seconds S] [--state-dir DIR]
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "proto/keel.grpc.pb.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/service.h"
#include "server/store.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

const char kUser[] = "bench-user-token-0123456789";
const char kWorker[] = "bench-worker-token-0123456789";

std::string Sweep(int runs) {
  std::string seeds;
  for (int i = 0; i < runs; ++i) seeds += (i ? ", " : "") + std::to_string(i);
  return "name: load\nbase:\n  model: {type: proxy, layers: 1, width: 16}\n  steps: 1000000\n"
         "axes:\n  - grid: {seed: [" + seeds + "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 8, seconds = 5;
  std::string state = "/tmp/keeld-load";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--workers") workers = std::atoi(argv[i + 1]);
    if (a == "--seconds") seconds = std::atoi(argv[i + 1]);
    if (a == "--state-dir") state = argv[i + 1];
  }
  std::system(("rm -rf '" + state + "' && mkdir -p '" + state + "'").c_str());
  std::unique_ptr<keel::Store> store;
  keel::Status s = keel::OpenSqliteStore(state + "/keeld.db", &store);
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
  keel::CoordinatorOptions options;
  options.heartbeat_interval_ms = 1000;
  std::unique_ptr<keel::Coordinator> coordinator;
  s = keel::Coordinator::Open(std::move(store), options, &coordinator);
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
  keel::AuthConfig auth;
  auth.user_tokens = {kUser};
  auth.worker_token = kWorker;
  keel::UserService users(coordinator.get(), &auth);
  keel::FleetService fleet(coordinator.get(), &auth);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&users);
  builder.RegisterService(&fleet);
  auto server = builder.BuildAndStart();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop) {
      coordinator->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  unsigned cores = std::thread::hardware_concurrency();
  std::printf("keeld_load: keeld in-process on %s, SQLite at %s/keeld.db (WAL, synchronous=FULL), %d fake workers x 1 slot, %u cores\n",
              address.c_str(), state.c_str(), workers, cores);

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto user = keel::v1::KeelService::NewStub(channel);
  // 1. Submit a 1,000-run sweep (3 times; the first warms up).
  for (int rep = 0; rep < 3; ++rep) {
    keel::v1::SubmitSweepRequest request;
    request.mutable_spec()->set_yaml(Sweep(1000));
    keel::v1::SubmitSweepResponse response;
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kUser);
    auto t0 = Clock::now();
    grpc::Status st = user->SubmitSweep(&context, request, &response);
    if (!st.ok()) return std::fprintf(stderr, "submit: %s\n", st.error_message().c_str()), 1;
    std::printf("  submit 1,000-run sweep #%d: %.1f ms (%d runs stored)\n", rep + 1, Ms(Clock::now() - t0), response.runs_size());
  }

  // 2 and 3. The fleet: each worker takes an assignment, streams metrics for its
  // run flat out; every 200 points it "finishes" the run and times the next assignment.
  std::atomic<long> points_sent{0};
  std::mutex latency_mu;
  std::vector<double> latencies;
  std::vector<std::thread> fleet_threads;
  for (int w = 0; w < workers; ++w) {
    fleet_threads.emplace_back([&, w] {
      auto stub = keel::v1::WorkerService::NewStub(channel);
      keel::v1::RegisterRequest reg;
      reg.set_host("fake-" + std::to_string(w));
      reg.set_cpu_slots(1);
      keel::v1::RegisterResponse resp;
      {
        grpc::ClientContext c;
        c.AddMetadata("authorization", std::string("Bearer ") + kWorker);
        if (!stub->Register(&c, reg, &resp).ok()) return;
      }
      grpc::ClientContext c;
      c.AddMetadata("authorization", std::string("Bearer ") + kWorker);
      c.AddMetadata("keel-worker-id", resp.worker_id());
      auto stream = stub->Connect(&c);
      uint64_t seq = 1;
      keel::v1::WorkerCommand command;
      auto waiting_since = Clock::now();
      while (!stop && stream->Read(&command)) {
        if (!command.has_start()) continue;
        {
          std::lock_guard<std::mutex> lock(latency_mu);
          latencies.push_back(Ms(Clock::now() - waiting_since));
        }
        const std::string run = command.start().run_id();
        keel::v1::WorkerMessage m;
        m.set_worker_id(resp.worker_id());
        m.set_seq(seq++);
        m.mutable_started()->set_run_id(run);
        stream->Write(m);
        for (int step = 1; step <= 200 && !stop; ++step) {
          keel::v1::WorkerMessage p;
          p.set_worker_id(resp.worker_id());
          p.set_seq(seq++);
          auto* point = p.mutable_metric();
          point->set_run_id(run);
          point->set_step(step);
          point->set_loss(1.0 / step);
          point->set_json("{\"step\":" + std::to_string(step) + "}");
          if (!stream->Write(p)) break;
          ++points_sent;
        }
        keel::v1::WorkerMessage e;
        e.set_worker_id(resp.worker_id());
        e.set_seq(seq++);
        e.mutable_exit()->set_run_id(run);
        e.mutable_exit()->set_exit_code(0);
        stream->Write(e);
        waiting_since = Clock::now();
      }
      c.TryCancel();
    });
  }
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  keel::CoordinatorStats before = coordinator->Stats();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  for (auto& t : fleet_threads) t.join();
  ticker.join();
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double q) { return latencies.empty() ? 0.0 : latencies[static_cast<size_t>(q * (latencies.size() - 1))]; };
  std::printf("  free slot -> assignment: %zu assignments, median %.2f ms, p90 %.2f ms, max %.2f ms\n",
              latencies.size(), pct(0.5), pct(0.9), latencies.empty() ? 0.0 : latencies.back());
  std::printf("  metric points stored: %lld in %.1f s = %.0f points/s (%ld sent by the fleet)\n",
              static_cast<long long>(before.metric_points), elapsed, before.metric_points / elapsed,
              points_sent.load());
  return 0;
}
