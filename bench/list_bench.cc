// Listing latency of a real keeld under load (issue 10, item 6). Starts keeld
// as a process on loopback (SQLite in a fresh state dir, Prometheus off), feeds
// one run `--points` metric points through the worker API (a fake worker's
// Connect stream, acknowledged before measuring), submits a `--runs`-run CPU
// sweep (no worker takes it: every run stays QUEUED), then
//   1. idle: a separate client times a full ListRuns of the sweep (all pages)
//      and a full GetMetrics of the run (all pages), `--samples` times each;
//   2. loaded: the same while `--clients` processes loop `keel runs SWEEP`.
// Page sizes: the server's default, and the largest page the server allows
// (the baseline: one call for the whole listing, as before paging) when
// --page-size is given.
// The client follows next_page_token through protobuf reflection, so this file
// builds and runs unchanged against a keeld from before paging (whose answers
// have no such field: one call returns everything).
//   list_bench --keeld PATH --keel PATH [--runs 2000] [--points 10000]
//              [--clients 10] [--samples 30] [--json-bytes 600] [--state-dir DIR]
//              [--page-size N]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/base/host.h"
#include "proto/keel.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

const char kUser[] = "bench-user-token-0123456789";
const char kWorker[] = "bench-worker-token-0123456789";

std::string SweepYaml(const std::string& name, int runs) {
  std::string seeds;
  for (int i = 0; i < runs; ++i) seeds += (i ? ", " : "") + std::to_string(i);
  return "name: " + name + "\nbase:\n  model: {type: proxy, layers: 1, width: 16}\n  steps: 1000000\n"
         "axes:\n  - grid: {seed: [" + seeds + "]}\n";
}

// next_page_token / page_token / page_size when this build's keel.proto has them.
std::string NextToken(const google::protobuf::Message& response) {
  const auto* f = response.GetDescriptor()->FindFieldByName("next_page_token");
  return f ? response.GetReflection()->GetString(response, f) : "";
}
void SetPage(google::protobuf::Message* request, const std::string& token, int page_size) {
  const auto* t = request->GetDescriptor()->FindFieldByName("page_token");
  if (t) request->GetReflection()->SetString(request, t, token);
  const auto* s = request->GetDescriptor()->FindFieldByName("page_size");
  if (s && page_size > 0) request->GetReflection()->SetInt32(request, s, page_size);
}

std::unique_ptr<grpc::ClientContext> Context(const char* token) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->AddMetadata("authorization", std::string("Bearer ") + token);
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return c;
}

// Every page of a listing (`rpc` of `request`, `page_size` items a page);
// returns the number of items (`count` of each page), -1 on error.
template <typename Request, typename Response>
int AllPages(keel::v1::KeelService::Stub* stub, const char* name,
             grpc::Status (keel::v1::KeelService::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
             Request request, int (Response::*count)() const, int page_size, int* calls) {
  int n = 0;
  std::string token;
  *calls = 0;
  do {
    SetPage(&request, token, page_size);
    Response response;
    grpc::Status s = (stub->*rpc)(Context(kUser).get(), request, &response);
    ++*calls;
    if (!s.ok()) return std::fprintf(stderr, "%s: %s\n", name, s.error_message().c_str()), -1;
    n += (response.*count)();
    token = NextToken(response);
  } while (!token.empty());
  return n;
}

// Every run of `sweep`, all pages; returns the run count (-1 on error).
int ListAllRuns(keel::v1::KeelService::Stub* stub, const std::string& sweep, int page_size, int* calls) {
  keel::v1::ListRunsRequest request;
  request.set_sweep_id(sweep);
  return AllPages(stub, "ListRuns", &keel::v1::KeelService::Stub::ListRuns, request,
                  &keel::v1::ListRunsResponse::runs_size, page_size, calls);
}

// Every metric point of `run`, all pages; returns the point count (-1 on
// error). omit_json: as keel export asks (when this build's keel.proto has the field).
int GetAllMetrics(keel::v1::KeelService::Stub* stub, const std::string& run, int page_size, bool omit_json,
                  int* calls) {
  keel::v1::GetMetricsRequest request;
  request.set_run_id(run);
  const auto* omit = request.GetDescriptor()->FindFieldByName("omit_json");
  if (omit && omit_json) request.GetReflection()->SetBool(&request, omit, true);
  return AllPages(stub, "GetMetrics", &keel::v1::KeelService::Stub::GetMetrics, request,
                  &keel::v1::GetMetricsResponse::points_size, page_size, calls);
}

struct Summary {
  double median = 0, p90 = 0, max = 0;
};
Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v[v.size() / 2];
  s.p90 = v[static_cast<size_t>(0.9 * (v.size() - 1))];
  s.max = v.back();
  return s;
}

// Times `samples` calls of `call` (which returns the item count or -1).
void Measure(const char* what, int samples, const std::function<int(int*)>& call) {
  std::vector<double> ms;
  int items = 0, calls = 0;
  for (int i = 0; i < samples; ++i) {
    auto t0 = Clock::now();
    items = call(&calls);
    ms.push_back(Ms(Clock::now() - t0));
    if (items < 0) {  // the error is printed; the figure is left out
      std::printf("    %-44s FAILED (see the error above)\n", what);
      std::fflush(stdout);
      return;
    }
  }
  Summary s = Summarize(ms);
  std::printf("    %-44s %6d items in %3d call(s): median %8.1f ms  p90 %8.1f ms  max %8.1f ms\n", what, items, calls,
              s.median, s.p90, s.max);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string keeld, keel_cli, state = "/tmp/keel-list-bench";
  int runs = 2000, points = 10000, clients = 10, samples = 30, json_bytes = 600, page_size = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--keeld") keeld = v;
    else if (a == "--keel") keel_cli = v;
    else if (a == "--runs") runs = std::atoi(v.c_str());
    else if (a == "--points") points = std::atoi(v.c_str());
    else if (a == "--clients") clients = std::atoi(v.c_str());
    else if (a == "--samples") samples = std::atoi(v.c_str());
    else if (a == "--json-bytes") json_bytes = std::atoi(v.c_str());
    else if (a == "--state-dir") state = v;
    else if (a == "--page-size") page_size = std::atoi(v.c_str());
    else return std::fprintf(stderr, "list_bench: unknown flag %s\n", a.c_str()), 2;
  }
  if (keeld.empty() || keel_cli.empty()) {
    return std::fprintf(stderr, "usage: list_bench --keeld PATH --keel PATH [--runs N] [--points N] [--clients N] "
                                "[--samples N] [--json-bytes N] [--state-dir DIR] [--page-size N]\n"), 2;
  }
  std::system(("rm -rf '" + state + "' && mkdir -p '" + state + "'").c_str());
  const std::string address = "127.0.0.1:" + std::to_string(keel::FreeLoopbackPort());
  utsname host;
  uname(&host);
  std::printf("list_bench: %s (%s), %u cores, %s %s\n", host.nodename, keel::CpuModel().c_str(),
              std::thread::hardware_concurrency(), host.sysname, host.release);
  std::printf("  keeld %s on %s, state %s (SQLite WAL, synchronous=FULL), Prometheus off\n", keeld.c_str(),
              address.c_str(), state.c_str());
  std::printf("  %d-run CPU sweep (all QUEUED, no workers), 1 run with %d metric points of ~%d json bytes,\n"
              "  %d concurrent `keel runs SWEEP` loops (%s), %d samples per figure, page_size %s\n",
              runs, points, json_bytes, clients, keel_cli.c_str(), samples,
              page_size > 0 ? std::to_string(page_size).c_str() : "server default");
  std::fflush(stdout);

  static pid_t keeld_pid = -1;
  keeld_pid = fork();
  if (keeld_pid == 0) {
    setenv("KEEL_USER_TOKENS", kUser, 1);
    setenv("KEEL_WORKER_TOKEN", kWorker, 1);
    FILE* f = freopen((state + "/keeld.log").c_str(), "a", stderr);
    (void)f;
    execl(keeld.c_str(), keeld.c_str(), "--listen", address.c_str(), "--state-dir", (state + "/state").c_str(),
          "--metrics-listen", "off", static_cast<char*>(nullptr));
    _exit(127);
  }
  // keeld holds our stdout: it must not outlive us, whatever way we exit.
  std::atexit([] {
    if (keeld_pid > 0) kill(keeld_pid, SIGKILL);
  });
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
    kill(keeld_pid, SIGKILL);
    return std::fprintf(stderr, "list_bench: keeld did not come up (see %s/keeld.log)\n", state.c_str()), 1;
  }
  auto user = keel::v1::KeelService::NewStub(channel);
  auto fleet = keel::v1::WorkerService::NewStub(channel);
  auto fail = [&](const std::string& what) {
    kill(keeld_pid, SIGKILL);
    std::fprintf(stderr, "list_bench: %s\n", what.c_str());
    return 1;
  };

  // The metrics run: a one-run sweep that a fake worker takes and feeds.
  std::string metrics_run;
  {
    keel::v1::SubmitSweepRequest request;
    request.mutable_spec()->set_yaml(SweepYaml("metrics", 1));
    keel::v1::SubmitSweepResponse response;
    grpc::Status s = user->SubmitSweep(Context(kUser).get(), request, &response);
    if (!s.ok()) return fail("submit: " + s.error_message());
    metrics_run = response.runs(0).id();
    keel::v1::RegisterRequest reg;
    reg.set_host("bench");
    reg.set_cpu_slots(1);
    keel::v1::RegisterResponse registered;
    s = fleet->Register(Context(kWorker).get(), reg, &registered);
    if (!s.ok()) return fail("register: " + s.error_message());
    grpc::ClientContext c;
    c.AddMetadata("authorization", std::string("Bearer ") + kWorker);
    c.AddMetadata("keel-worker-id", registered.worker_id());
    auto stream = fleet->Connect(&c);
    keel::v1::WorkerCommand command;
    while (stream->Read(&command) && !command.has_start()) {
    }
    if (command.start().run_id() != metrics_run) return fail("the fake worker got run " + command.start().run_id());
    const keel::v1::WorkerCommand assignment = command;
    uint64_t seq = 0;
    keel::v1::WorkerMessage m;
    m.set_worker_id(registered.worker_id());
    m.set_seq(++seq);
    m.set_attempt(assignment.start().attempt());  // fencing: keeld applies only this attempt's messages
    m.mutable_started()->set_run_id(metrics_run);
    stream->Write(m);
    std::string pad(std::max(0, json_bytes - 120), 'x');
    for (int step = 1; step <= points; ++step) {
      keel::v1::WorkerMessage p;
      p.set_worker_id(registered.worker_id());
      p.set_seq(++seq);
      p.set_attempt(assignment.start().attempt());
      auto* point = p.mutable_metric();
      point->set_run_id(metrics_run);
      point->set_step(step);
      point->set_loss(4.0 / step);
      point->set_lr(6e-4);
      point->set_tokens_per_s(1500);
      point->set_grad_norm(0.5);
      point->set_json("{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(4.0 / step) +
                      ",\"lr\":0.0006,\"tokens_per_s\":1500,\"grad_norm\":0.5,\"pad\":\"" + pad + "\"}");
      if (!stream->Write(p)) return fail("the worker stream broke while sending points");
    }
    keel::v1::WorkerMessage beat;
    beat.set_worker_id(registered.worker_id());
    beat.set_seq(++seq);
    beat.mutable_heartbeat()->set_unix_ms(0);
    stream->Write(beat);
    while (stream->Read(&command)) {
      if (command.has_ack() && command.ack().seq() >= seq) break;  // every point is stored
    }
    c.TryCancel();  // the worker leaves; its run is requeued after its lease and nobody takes it
  }
  std::string sweep;
  {
    keel::v1::SubmitSweepRequest request;
    request.mutable_spec()->set_yaml(SweepYaml("listing", runs));
    keel::v1::SubmitSweepResponse response;
    auto t0 = Clock::now();
    grpc::Status s = user->SubmitSweep(Context(kUser).get(), request, &response);
    if (!s.ok()) return fail("submit: " + s.error_message());
    sweep = response.sweep().id();
    std::printf("  submitted %s (%d runs) in %.0f ms; %s has %d points\n", sweep.c_str(), runs,
                Ms(Clock::now() - t0), metrics_run.c_str(), points);
  }

  {
    // The figures below mean nothing unless keeld stored every point it was fed.
    int calls = 0;
    const int stored = GetAllMetrics(user.get(), metrics_run, 0, true, &calls);
    if (stored != points) return fail(metrics_run + " holds " + std::to_string(stored) + " points, not the " +
                                      std::to_string(points) + " fed");
  }
  auto measure_all = [&](const char* phase) {
    std::printf("  %s:\n", phase);
    Measure(("ListRuns " + sweep + ", page_size default").c_str(), samples,
            [&](int* calls) { return ListAllRuns(user.get(), sweep, 0, calls); });
    if (page_size > 0) {
      Measure(("ListRuns " + sweep + ", page_size " + std::to_string(page_size)).c_str(), samples,
              [&](int* calls) { return ListAllRuns(user.get(), sweep, page_size, calls); });
    }
    Measure(("GetMetrics " + metrics_run + ", page_size default").c_str(), samples,
            [&](int* calls) { return GetAllMetrics(user.get(), metrics_run, 0, false, calls); });
    Measure(("GetMetrics " + metrics_run + ", omit_json (keel export)").c_str(), samples,
            [&](int* calls) { return GetAllMetrics(user.get(), metrics_run, 0, true, calls); });
    if (page_size > 0) {
      Measure(("GetMetrics " + metrics_run + ", page_size " + std::to_string(page_size)).c_str(), samples,
              [&](int* calls) { return GetAllMetrics(user.get(), metrics_run, page_size, false, calls); });
    }
  };
  measure_all("idle");

  // The load: `clients` shells each looping `keel runs SWEEP` into /dev/null.
  std::atomic<bool> stop{false};
  std::mutex cli_mu;
  std::vector<double> cli_ms;
  int cli_failures = 0;
  std::vector<std::thread> loops;
  const std::string cli = "KEEL_TOKEN=" + std::string(kUser) + " '" + keel_cli + "' --server " + address + " runs " +
                          sweep + " > /dev/null";
  for (int i = 0; i < clients; ++i) {
    loops.emplace_back([&] {
      while (!stop) {
        auto t0 = Clock::now();
        int rc = std::system(cli.c_str());
        std::lock_guard<std::mutex> lock(cli_mu);
        cli_ms.push_back(Ms(Clock::now() - t0));
        if (rc != 0) ++cli_failures;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // let the loops get going
  measure_all(("under " + std::to_string(clients) + " `keel runs` loops").c_str());
  stop = true;
  for (auto& t : loops) t.join();
  Summary cli_summary = Summarize(cli_ms);
  std::printf("  `keel runs %s` in the loops: %zu calls, %d failed, median %.0f ms, p90 %.0f ms, max %.0f ms\n",
              sweep.c_str(), cli_ms.size(), cli_failures, cli_summary.median, cli_summary.p90, cli_summary.max);
  kill(keeld_pid, SIGTERM);
  int status;
  waitpid(keeld_pid, &status, 0);
  keeld_pid = -1;
  return 0;
}
