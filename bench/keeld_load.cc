// keeld under load, in one process over real loopback gRPC: keeld's services on
// a real store, and a simulated fleet of workers whose "trainers" are threads
// speaking WorkerService. Runs the same load on each backend in turn (SQLite:
// a file under --state-dir, WAL, synchronous=FULL; PostgreSQL: a server this
// benchmark starts with Debian's binaries, fsync and synchronous_commit on, or
// --postgres-url) and prints them side by side. Measures
//   1. SubmitSweep latency for a 1,000-run sweep (expansion, validation of every
//      run, one transaction);
//   2. free slot -> assignment: a fake trainer exits and the worker's next
//      assignment arrives (the queue is full, so one is always waiting);
//   3. metric points/s keeld stores while W workers stream points flat out.
//   keeld_load [--workers W] [--seconds S] [--state-dir DIR] [--backend sqlite|postgres|both]
//              [--postgres-url postgresql://...]  (default: a temporary server)
#include <grpcpp/grpcpp.h>

#include <algorithm>
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
#include "server/temp_postgres.h"

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

// What one backend's run measured.
struct LoadResult {
  std::string store;
  std::vector<double> submit_ms;
  size_t assignments = 0;
  double assign_median_ms = 0, assign_p90_ms = 0, assign_max_ms = 0;
  int64_t points = 0;
  double points_per_s = 0;
  long points_sent = 0;
};

// Runs the load on `store` (described by `label`) and prints what it measured.
int RunLoad(std::unique_ptr<keel::Store> store, const std::string& label, int workers, int seconds,
            LoadResult* result) {
  result->store = label;
  keel::CoordinatorOptions options;
  options.heartbeat_interval_ms = 1000;
  std::unique_ptr<keel::Coordinator> coordinator;
  keel::Status s = keel::Coordinator::Open(std::move(store), options, &coordinator);
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
  std::printf("keeld_load: keeld in-process on %s, store %s, %d fake workers x 1 slot, %u cores\n", address.c_str(),
              label.c_str(), workers, std::thread::hardware_concurrency());

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
    result->submit_ms.push_back(Ms(Clock::now() - t0));
    std::printf("  submit 1,000-run sweep #%d: %.1f ms (%d runs stored)\n", rep + 1, result->submit_ms.back(),
                response.runs_size());
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
        // Fencing: every message about the run names the attempt it was started as.
        const int64_t attempt = command.start().attempt();
        keel::v1::WorkerMessage m;
        m.set_worker_id(resp.worker_id());
        m.set_attempt(attempt);
        m.set_seq(seq++);
        m.mutable_started()->set_run_id(run);
        stream->Write(m);
        for (int step = 1; step <= 200 && !stop; ++step) {
          keel::v1::WorkerMessage p;
          p.set_worker_id(resp.worker_id());
          p.set_attempt(attempt);
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
        e.set_attempt(attempt);
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
  result->assignments = latencies.size();
  result->assign_median_ms = pct(0.5);
  result->assign_p90_ms = pct(0.9);
  result->assign_max_ms = latencies.empty() ? 0.0 : latencies.back();
  result->points = before.metric_points;
  result->points_per_s = before.metric_points / elapsed;
  result->points_sent = points_sent.load();
  std::printf("  free slot -> assignment: %zu assignments, median %.2f ms, p90 %.2f ms, max %.2f ms\n",
              result->assignments, result->assign_median_ms, result->assign_p90_ms, result->assign_max_ms);
  std::printf("  metric points stored: %lld in %.1f s = %.0f points/s (%ld sent by the fleet)\n",
              static_cast<long long>(result->points), elapsed, result->points_per_s, result->points_sent);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 8, seconds = 5;
  std::string state = "/tmp/keeld-load", backend = "both", postgres_url;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return std::fprintf(stderr, "keeld_load: %s needs a value\n", a.c_str()), 2;
    const std::string v = argv[++i];
    if (a == "--workers") {
      workers = std::atoi(v.c_str());
    } else if (a == "--seconds") {
      seconds = std::atoi(v.c_str());
    } else if (a == "--state-dir") {
      state = v;
    } else if (a == "--backend") {
      backend = v;
    } else if (a == "--postgres-url") {
      postgres_url = v;
    } else {
      return std::fprintf(stderr, "keeld_load: unknown flag %s\n", a.c_str()), 2;
    }
  }
  if (backend != "sqlite" && backend != "postgres" && backend != "both") {
    return std::fprintf(stderr, "keeld_load: --backend: '%s' is not allowed (sqlite, postgres or both)\n",
                        backend.c_str()), 2;
  }
  std::vector<LoadResult> results;
  if (backend != "postgres") {
    std::system(("rm -rf '" + state + "' && mkdir -p '" + state + "'").c_str());
    std::unique_ptr<keel::Store> store;
    keel::Status s = keel::OpenSqliteStore(state + "/keeld.db", &store);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    results.emplace_back();
    if (RunLoad(std::move(store), "SQLite " + state + "/keeld.db (WAL, synchronous=FULL)", workers, seconds,
                &results.back()) != 0) {
      return 1;
    }
  }
  if (backend != "sqlite") {
    std::unique_ptr<keel::TempPostgres> server;
    std::string url = postgres_url, label;
    if (url.empty()) {
      keel::Status s = keel::TempPostgres::Start(&server);
      if (!s.ok()) return std::fprintf(stderr, "keeld_load: %s\n", s.message().c_str()), 1;
      s = server->CreateDatabase("keeld_load", &url);
      if (!s.ok()) return std::fprintf(stderr, "keeld_load: %s\n", s.message().c_str()), 1;
      label = "PostgreSQL " + url + " (temporary server, " + server->bin_dir() +
              "/postgres, data in " + server->dir() + ", fsync on, synchronous_commit on)";
    } else {
      label = "PostgreSQL " + keel::RedactStoreUrl(url);
    }
    std::unique_ptr<keel::Store> store;
    keel::Status s = keel::OpenPostgresStore(url, &store);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    results.emplace_back();
    if (RunLoad(std::move(store), label, workers, seconds, &results.back()) != 0) return 1;
  }
  if (results.size() == 2) {
    std::printf("\n%-12s %28s %24s %16s\n", "store", "submit 1,000 runs (ms)", "slot->assign median (ms)",
                "points/s");
    for (const LoadResult& r : results) {
      char submits[64];
      std::snprintf(submits, sizeof(submits), "%.0f / %.0f / %.0f", r.submit_ms[0], r.submit_ms[1], r.submit_ms[2]);
      std::printf("%-12s %28s %24.2f %16.0f\n", r.store.substr(0, r.store.find(' ')).c_str(), submits,
                  r.assign_median_ms, r.points_per_s);
    }
  }
  return 0;
}
