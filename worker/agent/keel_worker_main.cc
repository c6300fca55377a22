// keel-worker: runs keel-train for keeld on this host.
//   keel-worker [--server HOST:PORT[,HOST:PORT...]] [--token-file F] [--trainer PATH]
//               [--work-dir DIR] [--cpu-slots N] [--no-gpus | --fake-gpus N] [--mps]
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <chrono>
#include <thread>

#include "kernels/base/flags.h"
#include "kernels/base/host.h"
#include "kernels/base/stop_signal.h"
#include "proto/channel.h"
#include "worker/agent/agent.h"
#include "worker/agent/mps.h"
#include "worker/io/file_util.h"

namespace {

const char kUsage[] =
    "usage: keel-worker [options]\n"
    "  Registers this host with keeld, offers its GPUs (found through NVML) or, without\n"
    "  GPUs, CPU slots, and runs one keel-train per assigned run under <work-dir>/runs/\n"
    "  (keel-train --nproc N for a run of N ranks: one per GPU, or one per CPU slot; a\n"
    "  gang's part on this host is ranks F..F+N-1 of the run's W).\n"
    "options:\n"
    "  --server HOST:PORT[,HOST:PORT...]\n"
    "                       keeld's address (default $KEEL_SERVER or 127.0.0.1:7070); several,\n"
    "                       comma-separated, for an active keeld and its standbys: the\n"
    "                       worker tries them in order, moves to the next when one cannot be\n"
    "                       reached or refuses (a standby: UNAVAILABLE), backs off after\n"
    "                       each round, and re-sends everything keeld did not acknowledge\n"
    "                       (a re-sent metric point or event is stored once)\n"
    "  --advertise HOST     the address other workers reach this host at: a gang's rank 0\n"
    "                       here listens on every interface and publishes HOST:port to\n"
    "                       the other parts (default: this host's address on its route to\n"
    "                       keeld, e.g. 127.0.0.1 when keeld is on loopback)\n"
    "  --token-file FILE    the worker join token (default $KEEL_WORKER_TOKEN)\n"
    "  --trainer PATH       keel-train (default: keel-train beside this binary)\n"
    "  --work-dir DIR       run directories (default ./keel-worker)\n"
    "  --data-root DIR      trainers may read data (data.train, data.val) only inside DIR,\n"
    "                       checked after resolving symlinks; repeatable (default ./data)\n"
    "  --cpu-slots N        CPU slots offered when there is no GPU, one rank each: N one-rank\n"
    "                       runs at once, or a run's N ranks (default 1)\n"
    "  --no-gpus            offer CPU slots even when GPUs are present\n"
    "  --gpus LIST          offer only these of this host's GPUs (NVML indices, e.g. 0,1), so\n"
    "                       that several workers can share a host (default: all)\n"
    "  --fake-gpus N        for tests and demos: offer N GPUs that do not exist (indices\n"
    "                       0..N-1) instead of the real ones. Runs placed on them get\n"
    "                       CUDA_VISIBLE_DEVICES as for real GPUs (rank k its k-th), but no\n"
    "                       --backend: their trainers run the backend their config names, so\n"
    "                       a run with backend: cpu trains on the CPU. Not with --no-gpus\n"
    "  --mps                run the trainers through CUDA MPS, so that runs sharing a GPU\n"
    "                       (fractional resources.gpus) run side by side instead of taking\n"
    "                       turns: the worker starts an MPS control daemon (pipe and log under\n"
    "                       <work-dir>/mps/) before its first run and tells it to quit when it\n"
    "                       exits. One daemon serves every GPU of the host: one --mps worker a\n"
    "                       host. Not with --no-gpus\n"
    "  --mps-control PATH   the MPS control program (default nvidia-cuda-mps-control, from PATH)\n"
    "  --tls-ca FILE        speak TLS to keeld, trusting certificates this CA signed\n"
    "  --tls-cert F --tls-key F  a client certificate (keeld --tls-client-ca)\n"
    "  --quiet              no connection/run lines on stderr\n"
    "  --metrics-listen ADDR  Prometheus /metrics (default 127.0.0.1:9465; 'off' disables):\n"
    "                       keel_worker_trainers, keel_worker_trainer_starts_total,\n"
    "                       keel_worker_trainer_exits_total{outcome}, keel_worker_connected,\n"
    "                       keel_worker_unacknowledged_messages, keel_worker_gpu_memory_{used,total}_bytes{gpu},\n"
    "                       keel_worker_checkpoint_uploads_total{outcome=committed|failed},\n"
    "                       keel_worker_checkpoint_downloads_total{outcome=ok|failed}\n"
    "  --exit-when-idle-s N  exit (status 0) after N seconds holding no run, with every message but\n"
    "                       heartbeats acknowledged, connected to keeld or not: how a Slurm job's\n"
    "                       worker gives its allocation back (deploy/slurm/; default 0: never)\n"
    "Ctrl-C or SIGTERM stops the worker; its trainers are stopped with it.\n";

int Fail(const std::string& message) { return keel::FlagError("keel-worker", message); }

}  // namespace

int main(int argc, char** argv) {
  keel::AgentOptions options;
  if (const char* env = std::getenv("KEEL_SERVER")) options.server = env;
  std::string token_origin = "KEEL_WORKER_TOKEN";
  if (const char* env = std::getenv("KEEL_WORKER_TOKEN")) options.token = env;
  std::string self = argv[0];
  options.trainer = self.substr(0, self.rfind('/') + 1) + "keel-train";
  bool gpus = true;
  std::string metrics_listen = "127.0.0.1:9465";
  std::string token_file;
  bool no_gpus = false, quiet = false, mps = false;
  std::string mps_control = "nvidia-cuda-mps-control";
  int fake_gpus = 0;
  std::string only_gpus;
  CLI::App app("keel-worker");
  app.add_option("--server", options.server);
  app.add_option("--advertise", options.advertise);
  app.add_option("--token-file", token_file);
  app.add_option("--trainer", options.trainer);
  app.add_option("--data-root", options.data_roots)->allow_extra_args(false);
  app.add_option("--work-dir", options.work_dir);
  app.add_option("--cpu-slots", options.cpu_slots)->check(keel::IntFlag(1, 1024));
  app.add_option("--tls-ca", options.tls_ca);
  app.add_option("--tls-cert", options.tls_cert);
  app.add_option("--tls-key", options.tls_key);
  app.add_flag("--no-gpus", no_gpus);
  app.add_flag("--mps", mps);
  app.add_option("--mps-control", mps_control);
  app.add_option("--fake-gpus", fake_gpus)->check(keel::IntFlag(1, 1024));
  app.add_option("--gpus", only_gpus);
  app.add_option("--metrics-listen", metrics_listen);
  app.add_flag("--quiet", quiet);
  int exit_when_idle_s = 0;
  app.add_option("--exit-when-idle-s", exit_when_idle_s)->check(keel::IntFlag(0, 30 * 86400));
  const keel::FlagsOutcome flags = keel::ParseFlags(app, "keel-worker", kUsage, argc, argv);
  if (!flags.proceed) return flags.exit_code;
  gpus = !no_gpus;
  if (fake_gpus > 0 && no_gpus) return Fail("--fake-gpus: not allowed with --no-gpus (allowed: one of them)");
  if (mps && no_gpus) return Fail("--mps: not allowed with --no-gpus (MPS shares GPUs; allowed: --mps on a worker with GPUs)");
  if (!mps && app.count("--mps-control") > 0) return Fail("--mps-control: not allowed without --mps (allowed: with --mps)");
  if (!only_gpus.empty() && (no_gpus || fake_gpus > 0)) {
    return Fail("--gpus: not allowed with " + std::string(no_gpus ? "--no-gpus" : "--fake-gpus") +
                " (allowed: one of them)");
  }
  if (!options.advertise.empty() &&
      (!keel::IsHostAddress(options.advertise) || keel::IsWildcardAddress(options.advertise))) {
    return Fail("--advertise: '" + options.advertise +
                "' is not allowed (allowed: an IP address or host name of this host that other workers reach, "
                "without a port, not 0.0.0.0 or ::)");
  }
  if (quiet) options.verbose = false;
  if (!token_file.empty()) {
    keel::Status s = keel::ReadTokenFile(token_file, &options.token);
    if (!s.ok()) return Fail(s.message());
    token_origin = "--token-file " + token_file;
  }
  if (options.token.empty()) return Fail("no worker token (--token-file or KEEL_WORKER_TOKEN)");
  // gRPC aborts on a metadata value with a newline or control character.
  if (keel::Status s = keel::CheckToken(options.token, token_origin); !s.ok()) return Fail(s.message());
  if (options.data_roots.empty()) options.data_roots.push_back("data");
  // Absolute, so that trainers (in their run directories' terms) check the same place, and the
  // MPS daemon's directories are where the agent's work dir is.
  for (std::string& root : options.data_roots) root = keel::AbsolutePath(root);
  options.work_dir = keel::AbsolutePath(options.work_dir);
  std::vector<std::string> servers;
  if (keel::Status s = keel::ParseServerList(options.server, "--server", &servers); !s.ok()) return Fail(s.message());
  {
    keel::ChannelOptions check{servers[0], options.tls_ca, options.tls_cert, options.tls_key};
    std::shared_ptr<grpc::Channel> channel;
    keel::Status s = keel::MakeChannel(check, &channel);  // bad TLS files are a usage error, now
    if (!s.ok()) return Fail(s.message());
  }
  if (access(options.trainer.c_str(), X_OK) != 0) {
    return Fail("--trainer: '" + options.trainer + "' is not an executable keel-train");
  }
  if (fake_gpus > 0) {
    options.devices = keel::FakeGpus(fake_gpus);
    options.fake_gpus = true;
  } else if (gpus) {
    options.devices = keel::DetectGpus();
    if (!only_gpus.empty()) {
      keel::Status s = keel::SelectGpus(only_gpus, &options.devices);
      if (!s.ok()) return Fail(s.message());
    }
  }
  if (mps && options.devices.empty()) return Fail("--mps: no GPU found on this host (NVML), so nothing to share");
  // The MPS daemon, before the agent starts any trainer (they inherit its pipe directory);
  // the guard quits it on every way out, the end of main reports how that went.
  keel::MpsDaemon mps_daemon;
  if (mps) {
    keel::Status s = keel::StartMps(mps_control, options.work_dir, &mps_daemon);
    if (!s.ok()) return Fail(s.message());
    if (!quiet) std::fprintf(stderr, "keel-worker: CUDA MPS started (CUDA_MPS_PIPE_DIRECTORY=%s)\n", mps_daemon.pipe_dir.c_str());
  }
  struct MpsGuard {
    keel::MpsDaemon* daemon;
    ~MpsGuard() { (void)keel::StopMps(daemon); }
  } mps_guard{&mps_daemon};
  std::atomic<bool>& stop = *keel::StopOnSignals();
  keel::Agent agent(options);
  // /metrics: refreshed once a second from the agent's counters and NVML.
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  std::thread metrics_thread;
  if (metrics_listen != "off") {
    try {
      exposer = std::make_unique<prometheus::Exposer>(metrics_listen);
    } catch (const std::exception& e) {
      return Fail("--metrics-listen: cannot listen on '" + metrics_listen + "': " + e.what());
    }
    exposer->RegisterCollectable(registry);
    metrics_thread = std::thread([&agent, &stop, registry] {
      auto& trainers = prometheus::BuildGauge().Name("keel_worker_trainers").Help("keel-train processes running").Register(*registry).Add({});
      auto& connected = prometheus::BuildGauge().Name("keel_worker_connected").Help("1 while the stream to keeld is open").Register(*registry).Add({});
      auto& unacked = prometheus::BuildGauge()
                          .Name("keel_worker_unacknowledged_messages")
                          .Help("Messages keeld has not acknowledged yet")
                          .Register(*registry)
                          .Add({});
      auto& starts = prometheus::BuildCounter().Name("keel_worker_trainer_starts_total").Help("Trainers started").Register(*registry).Add({});
      auto& exits = prometheus::BuildCounter()
                        .Name("keel_worker_trainer_exits_total")
                        .Help("Trainer exits by outcome (ok, failed, signal, interrupted, diverged)")
                        .Register(*registry);
      auto& used = prometheus::BuildGauge().Name("keel_worker_gpu_memory_used_bytes").Help("GPU memory in use (NVML)").Register(*registry);
      auto& total = prometheus::BuildGauge().Name("keel_worker_gpu_memory_total_bytes").Help("GPU memory (NVML)").Register(*registry);
      // Checkpoints through keeld's artifact store: uploads committed or failed,
      // downloads verified or failed for good (after their retries).
      auto& uploads = prometheus::BuildCounter()
                          .Name("keel_worker_checkpoint_uploads_total")
                          .Help("Checkpoint uploads to keeld's artifact store by outcome (committed, failed)")
                          .Register(*registry);
      auto& downloads = prometheus::BuildCounter()
                            .Name("keel_worker_checkpoint_downloads_total")
                            .Help("Checkpoint downloads from keeld's artifact store by outcome (ok, failed for good)")
                            .Register(*registry);
      // Each counter is brought up to the agent's total (they only grow).
      std::map<std::string, double> counted;
      auto bring_up = [&counted](prometheus::Counter& counter, const std::string& key, int64_t total) {
        const double n = static_cast<double>(total);
        if (n > counted[key]) counter.Increment(n - counted[key]);
        counted[key] = std::max(counted[key], n);
      };
      double started = 0;
      std::map<std::string, double> exited;
      while (!stop.load()) {
        keel::AgentStats st = agent.stats();
        trainers.Set(st.trainers);
        connected.Set(st.connected ? 1 : 0);
        unacked.Set(static_cast<double>(st.unacknowledged));
        if (st.starts > started) starts.Increment(st.starts - started);
        started = std::max<double>(started, st.starts);
        for (const char* outcome : {"ok", "failed", "signal", "interrupted", "diverged"}) {
          auto it = st.exits.find(outcome);
          const double n = it == st.exits.end() ? 0 : static_cast<double>(it->second);
          auto& counter = exits.Add({{"outcome", outcome}});
          if (n > exited[outcome]) counter.Increment(n - exited[outcome]);
          exited[outcome] = std::max(exited[outcome], n);
        }
        bring_up(uploads.Add({{"outcome", "committed"}}), "uploads committed", st.checkpoints_uploaded);
        bring_up(uploads.Add({{"outcome", "failed"}}), "uploads failed", st.checkpoint_uploads_failed);
        bring_up(downloads.Add({{"outcome", "ok"}}), "downloads ok", st.checkpoints_downloaded);
        bring_up(downloads.Add({{"outcome", "failed"}}), "downloads failed", st.checkpoint_downloads_failed);
        for (const keel::GpuMemory& g : keel::GpuMemoryInUse()) {
          used.Add({{"gpu", std::to_string(g.index)}}).Set(static_cast<double>(g.used_bytes));
          total.Add({{"gpu", std::to_string(g.index)}}).Set(static_cast<double>(g.total_bytes));
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    });
  }
  // --exit-when-idle-s: the agent stops like on SIGTERM once it has held no run
  // and had nothing unacknowledged for that long.
  std::thread idle_thread;
  if (exit_when_idle_s > 0) {
    idle_thread = std::thread([&agent, &stop, exit_when_idle_s] {
      using Clock = std::chrono::steady_clock;
      Clock::time_point idle_since = Clock::now();
      while (!stop.load()) {
        const keel::AgentStats st = agent.stats();
        // Heartbeats do not count: one is nearly always on its way.
        if (st.trainers > 0 || st.unacknowledged_work > 0) idle_since = Clock::now();
        if (Clock::now() - idle_since >= std::chrono::seconds(exit_when_idle_s)) {
          std::fprintf(stderr, "keel-worker: idle for %d s (no run, nothing but heartbeats unacknowledged): exiting\n",
                       exit_when_idle_s);
          stop = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  keel::Status s = agent.Run(&stop);
  stop = true;
  if (idle_thread.joinable()) idle_thread.join();
  if (metrics_thread.joinable()) metrics_thread.join();
  if (!s.ok()) {
    std::fprintf(stderr, "keel-worker: %s\n", s.message().c_str());
    return 1;
  }
  if (keel::Status q = keel::StopMps(&mps_daemon); !q.ok()) {
    std::fprintf(stderr, "keel-worker: --mps: %s\n", q.message().c_str());
    return 1;
  }
  return 0;
}
