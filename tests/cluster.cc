// Real-process Keel clusters for end-to-end tests (see cluster.h).
#include "tests/cluster.h"

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "kernels/base/host.h"

namespace keel_test {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

Process::Process(std::vector<std::string> args, const std::string& log) {
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

void Process::Kill(int signal) {
  if (pid_ > 0) {
    kill(pid_, signal);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

void Process::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

Cluster::Cluster(const std::string& name, std::vector<std::string> keeld_args)
    : dir_(TempDir(name)), port_(keel::FreeLoopbackPort()), keeld_args_(std::move(keeld_args)) {
  StartKeeld();
}

void Cluster::StartKeeld() {
  std::vector<std::string> args = {"server/keeld",  "--listen",     Address(), "--state-dir",    dir_ + "/state",
                                   "--metrics-listen", "off",       "--lease-ms", "1500", "--heartbeat-ms", "200"};
  args.insert(args.end(), keeld_args_.begin(), keeld_args_.end());
  keeld_.reset(new Process(args, dir_ + "/keeld.log"));
  auto channel = grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)));
  stub_ = keel::v1::KeelService::NewStub(channel);
}

void Cluster::KillKeeld() { keeld_->Kill(SIGKILL); }

void Cluster::UseKeeldAt(const std::string& address) {
  stub_ = keel::v1::KeelService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

Process* Cluster::AddWorker(const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> args = {"worker/agent/keel-worker", "--trainer", "worker/engine/keel-train",
                                   "--work-dir", dir_ + "/" + name};
  if (std::find(extra.begin(), extra.end(), "--metrics-listen") == extra.end()) {
    args.insert(args.end(), {"--metrics-listen", "off"});
  }
  if (std::find(extra.begin(), extra.end(), "--server") == extra.end()) args.insert(args.end(), {"--server", Address()});
  if (std::find(extra.begin(), extra.end(), "--cpu-slots") == extra.end()) {
    args.insert(args.end(), {"--cpu-slots", "1"});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  workers_[name].reset(new Process(args, dir_ + "/" + name + ".log"));
  return workers_[name].get();
}

std::unique_ptr<grpc::ClientContext> Cluster::Context(const std::string& token) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->AddMetadata("authorization", "Bearer " + token);
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return c;
}

grpc::Status Cluster::Submit(const std::string& yaml, keel::v1::SubmitSweepResponse* out) {
  keel::v1::SubmitSweepRequest request;
  request.mutable_spec()->set_yaml(yaml);
  request.mutable_spec()->set_source("test-sweep.yaml");
  return stub_->SubmitSweep(Context().get(), request, out);
}

std::vector<keel::v1::Run> Cluster::Runs(const std::string& sweep) {
  keel::v1::ListRunsRequest request;
  request.set_sweep_id(sweep);
  return AllPages<keel::v1::Run>(request, &keel::v1::KeelService::Stub::ListRuns,
                                 [](const keel::v1::ListRunsResponse& r) { return r.runs(); });
}

std::vector<keel::v1::Run> Cluster::WaitDone(const std::string& sweep, int seconds,
                                             const std::function<void(const std::vector<keel::v1::Run>&)>& each) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<keel::v1::Run> runs;
  while (std::chrono::steady_clock::now() < deadline) {
    runs = Runs(sweep);
    if (each) each(runs);
    bool done = !runs.empty();
    for (const auto& r : runs) {
      done = done && (r.state() == keel::v1::SUCCEEDED || r.state() == keel::v1::FAILED ||
                      r.state() == keel::v1::CANCELLED || r.state() == keel::v1::DIVERGED);
    }
    if (done) return runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return runs;
}

std::vector<keel::v1::MetricPoint> Cluster::Metrics(const std::string& run) {
  keel::v1::GetMetricsRequest request;
  request.set_run_id(run);
  return AllPages<keel::v1::MetricPoint>(request, &keel::v1::KeelService::Stub::GetMetrics,
                                         [](const keel::v1::GetMetricsResponse& r) { return r.points(); });
}

std::vector<keel::v1::Event> Cluster::Events(const std::string& run) {
  keel::v1::ListEventsRequest request;
  request.set_run_id(run);
  return AllPages<keel::v1::Event>(request, &keel::v1::KeelService::Stub::ListEvents,
                                   [](const keel::v1::ListEventsResponse& r) { return r.events(); });
}

std::vector<Trainer> Cluster::Trainers(const std::string& run) const {
  std::vector<Trainer> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  const std::string suffix = "/runs/" + run;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    for (size_t begin = 0, end; begin < cmdline.size(); begin = end + 1) {
      end = cmdline.find('\0', begin);
      if (end == std::string::npos) end = cmdline.size();
      args.push_back(cmdline.substr(begin, end - begin));
    }
    if (args.empty() || args[0].find("keel-train") == std::string::npos) continue;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      const std::string& d = args[i + 1];
      if (args[i] == "--run-dir" && d.rfind(dir_, 0) == 0 && d.size() >= suffix.size() &&
          d.compare(d.size() - suffix.size(), suffix.size(), suffix) == 0) {
        // A zombie (exited, not yet reaped by its worker) is not live.
        std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
        std::string stat_text;
        std::getline(stat, stat_text);
        const size_t paren = stat_text.rfind(')');
        if (paren != std::string::npos && paren + 2 < stat_text.size() && stat_text[paren + 2] == 'Z') continue;
        int rank = -1;
        for (size_t k = 0; k + 1 < args.size(); ++k) {
          if (args[k] == "--rank") rank = std::atoi(args[k + 1].c_str());
        }
        out.push_back({pid, d, rank});
      }
    }
  }
  closedir(proc);
  return out;
}

std::string SmallSweep(int steps, const std::string& axes) {
  return "name: small\n"
         "base:\n"
         "  model: {type: proxy, layers: 1, width: 16}\n"
         "  batch: 32\n  threads: 1\n  checkpoint_every: 10\n"
         "  steps: " + std::to_string(steps) + "\n" + axes;
}

std::unique_ptr<keel::TempPostgres> StartPostgres(const std::string& db, std::vector<std::string>* store_args) {
  std::unique_ptr<keel::TempPostgres> pg;
  keel::Status s = keel::TempPostgres::Start(&pg);
  EXPECT_TRUE(s.ok()) << "this test needs a PostgreSQL server: " << s.message();
  if (!s.ok()) return nullptr;
  std::string url;
  s = pg->CreateDatabase(db, &url);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return nullptr;
  *store_args = {"--store", url};
  return pg;
}

}  // namespace keel_test
