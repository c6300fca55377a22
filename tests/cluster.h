// A Keel cluster of real processes on loopback for end-to-end tests: keeld with
// its state in a temp directory, keel-workers (each with its own work dir)
// running the real keel-train on the CPU, and a gRPC client. Shared by
// service_e2e_test and chaos_test; paths are the Bazel runfiles of //tests.
#ifndef KEEL_TESTS_CLUSTER_H_
#define KEEL_TESTS_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/keel.grpc.pb.h"
#include "server/temp_postgres.h"

namespace keel_test {

constexpr char kUserToken[] = "user-token-0123456789abcdef";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef";

// An empty directory under $TEST_TMPDIR.
std::string TempDir(const std::string& name);

// A child process with its stderr appended to a log file; killed (SIGKILL) and
// reaped when destroyed.
class Process {
 public:
  Process(std::vector<std::string> args, const std::string& log);
  ~Process() { Kill(SIGKILL); }
  // Sends `signal` and reaps the process.
  void Kill(int signal);
  // Sends `signal` only (SIGSTOP, SIGCONT).
  void Signal(int signal);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// A live keel-train found through /proc: its pid and --run-dir.
struct Trainer {
  pid_t pid = -1;
  std::string run_dir;
  int rank = -1;  // --rank R of a data-parallel rank; -1: a whole run or a launcher (--nproc)
};

class Cluster {
 public:
  // keeld gets --lease-ms 1500 --heartbeat-ms 200 plus `keeld_args`.
  explicit Cluster(const std::string& name, std::vector<std::string> keeld_args = {});

  void StartKeeld();
  void KillKeeld();
  // Points stub() at another keeld (a standby that took over).
  void UseKeeldAt(const std::string& address);
  Process* keeld() { return keeld_.get(); }
  // A worker with one CPU slot (unless `args` say --cpu-slots), connected to this cluster's keeld (unless
  // `args` say --server) and its own work dir <dir>/<name> (restarting a name reuses the dir).
  Process* AddWorker(const std::string& name, std::vector<std::string> args = {});
  Process* Worker(const std::string& name) { return workers_.at(name).get(); }

  std::string Address() const { return "127.0.0.1:" + std::to_string(port_); }
  keel::v1::KeelService::Stub* stub() { return stub_.get(); }
  const std::string& dir() const { return dir_; }
  std::unique_ptr<grpc::ClientContext> Context(const std::string& token = kUserToken);

  grpc::Status Submit(const std::string& yaml, keel::v1::SubmitSweepResponse* out);
  std::vector<keel::v1::Run> Runs(const std::string& sweep);
  // Polls until every run of the sweep ended (or timeout); returns the runs.
  std::vector<keel::v1::Run> WaitDone(const std::string& sweep, int seconds,
                                      const std::function<void(const std::vector<keel::v1::Run>&)>& each = nullptr);
  std::vector<keel::v1::MetricPoint> Metrics(const std::string& run);
  std::vector<keel::v1::Event> Events(const std::string& run);
  // The live keel-train processes of `run` under this cluster's directory.
  std::vector<Trainer> Trainers(const std::string& run) const;

 private:
  // Every item of a paged listing: `rpc` once per page until next_page_token
  // is empty; `items` are a page's items.
  template <typename Item, typename Request, typename Response, typename Items>
  std::vector<Item> AllPages(Request request,
                             grpc::Status (keel::v1::KeelService::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                                               Response*),
                             Items items) {
    std::vector<Item> all;
    do {
      Response response;
      if (!(stub_.get()->*rpc)(Context().get(), request, &response).ok()) break;
      const auto& page = items(response);
      all.insert(all.end(), page.begin(), page.end());
      request.set_page_token(response.next_page_token());
    } while (!request.page_token().empty());
    return all;
  }

  std::string dir_;
  int port_;
  std::vector<std::string> keeld_args_;
  std::unique_ptr<Process> keeld_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  std::unique_ptr<keel::v1::KeelService::Stub> stub_;
};

// A small proxy sweep: width 16, one layer, a checkpoint every 10 steps.
std::string SmallSweep(int steps, const std::string& axes);

// A PostgreSQL server (Debian's, started by the test) with a new database
// `db`; *store_args is keeld's --store for it. Null, with a test failure, when
// it cannot start.
std::unique_ptr<keel::TempPostgres> StartPostgres(const std::string& db, std::vector<std::string>* store_args);

}  // namespace keel_test

#endif  // KEEL_TESTS_CLUSTER_H_
