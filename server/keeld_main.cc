// keeld: Keel's coordinator daemon.
//   keeld [--listen 127.0.0.1:7070] [--state-dir DIR] [--store URL] [--metrics-listen 127.0.0.1:9464]
//         [--user-tokens-file F] [--worker-token-file F]
//         [--tls-cert F --tls-key F [--tls-client-ca F]] [--lease-ms N] [--heartbeat-ms N]
//         [--standby]
//         [--artifact-store dir|db] [--artifact-dir DIR] [--artifact-keep K]
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "kernels/base/flags.h"
#include "kernels/base/stop_signal.h"
#include "server/artifact_store.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/service.h"
#include "server/slurm_fleet.h"
#include "server/store.h"
#include "worker/io/file_util.h"
#include "worker/io/yaml_strict.h"

namespace {

const char kUsage[] =
    "usage: keeld [options]\n"
    "  Keel's coordinator: accepts sweeps (KeelService, user tokens), schedules their runs\n"
    "  onto keel-workers (WorkerService, the worker join token), stores everything in\n"
    "  SQLite under the state directory (or in PostgreSQL: --store) and exports\n"
    "  Prometheus metrics.\n"
    "options:\n"
    "  --listen ADDR            gRPC address (default 127.0.0.1:7070; 0.0.0.0:PORT for all)\n"
    "  --state-dir DIR          keeld.db, keeld.lock and generated tokens (default ./keeld-state)\n"
    "  --store URL              where sweeps, runs, metrics and events live:\n"
    "                             sqlite:PATH or a plain PATH   a SQLite file\n"
    "                             postgresql://user@host:port/db  a PostgreSQL database that\n"
    "                                                           exists (libpq URL; ?host=DIR for a\n"
    "                                                           unix socket; a password may be in\n"
    "                                                           the URL or ~/.pgpass)\n"
    "                           (default: SQLite at <state-dir>/keeld.db). The schema is created,\n"
    "                           or upgraded in place from an older keeld's; a store written by a\n"
    "                           newer keeld is refused and left unchanged. One keeld per database\n"
    "                           is active: it holds a PostgreSQL advisory lock; another one is\n"
    "                           refused after 10 s, unless it is a --standby.\n"
    "  --standby                (PostgreSQL only) when another keeld holds the database's lock,\n"
    "                           listen anyway and wait: refuse every RPC with UNAVAILABLE\n"
    "                           (\"standby: the active keeld is ...\"), poll the lock every 100 ms,\n"
    "                           and once the active keeld's session ends (it stopped, was killed,\n"
    "                           lost its connection) load the store and serve, as a restarted\n"
    "                           keeld does. Give workers and the CLI both addresses\n"
    "                           (--server A,B). Without a holder it is active at once.\n"
    "  --metrics-listen ADDR    Prometheus /metrics (default 127.0.0.1:9464; 'off' disables)\n"
    "  --metrics-retention-s N  keep a finished run's per-run series this long (default 600)\n"
    "  --user-tokens-file F     user tokens, one per line (also $KEEL_USER_TOKENS, comma-separated)\n"
    "  --worker-token-file F    the worker join token (also $KEEL_WORKER_TOKEN)\n"
    "                           Without either, tokens are generated into the state dir\n"
    "                           (user.token, worker.token; mode 0600).\n"
    "  --tls-cert F --tls-key F serve TLS with this certificate and key (PEM)\n"
    "  --tls-client-ca F        also require client certificates signed by this CA\n"
    "  --lease-ms N             a worker silent this long is gone (default 10000)\n"
    "  --heartbeat-ms N         heartbeat interval asked of workers (default 1000)\n"
    "  --restart-backoff-ms N   a run whose trainer failed waits N ms before its first restart,\n"
    "                           doubling for each further one, at most 60 s (default 1000)\n"
    "  --artifact-store WHERE   the artifact store: checkpoints workers upload, so that a run\n"
    "                           resumes on a host without them and `keel fetch` can download\n"
    "                           them. 'dir' (default): files under --artifact-dir; 'db': rows of\n"
    "                           the --store database, so that a --standby keeld on another host\n"
    "                           serves them after it takes over (give both keelds 'db')\n"
    "  --artifact-dir DIR       where 'dir' keeps them (default <state-dir>/artifacts)\n"
    "  --artifact-keep K        checkpoints kept per run in the artifact store: the newest K,\n"
    "                           and always the one the run resumes from (default 3)\n"
    "Slurm (docs/deploy.md): grow the fleet with keel-worker batch jobs while runs wait\n"
    "  --slurm-sbatch SCRIPT    submit SCRIPT (deploy/slurm/keel-worker.sbatch) with sbatch when\n"
    "                           runs have been queued for 3 s, none of our jobs is pending and\n"
    "                           fewer than --slurm-max-jobs exist; the workers end themselves\n"
    "                           when idle (keel-worker --exit-when-idle-s)\n"
    "  --slurm-sbatch-args ARGS more sbatch arguments, space-separated (e.g. '--partition=gpu')\n"
    "  --slurm-max-jobs N       our worker jobs, pending or running, at most (default 4)\n"
    "  --slurm-job-name NAME    the jobs' name, how squeue tells them apart (default keel-worker)\n"
    "  --slurm-server ADDR      keeld's address as the jobs' workers reach it, given to them as\n"
    "                           KEEL_SERVER (default: --listen, with this host's name for 0.0.0.0)\n"
    "One keeld per state directory (it holds <state-dir>/keeld.lock) and per address (the\n"
    "port is bound exclusively): a second one is refused.\n"
    "SIGINT/SIGTERM shut keeld down; everything acknowledged is already on disk.\n"
    "Fencing (PostgreSQL): keeld writes only on the session that took the lock. When that\n"
    "session is lost, keeld reconnects only if it gets the lock back with no other keeld\n"
    "having taken it meanwhile (the keeld_epoch row); otherwise it exits with status 3.\n";

int Fail(const std::string& message) { return keel::FlagError("keeld", message); }

bool ReadPem(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream text;
  text << in.rdbuf();
  *out = text.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7070", state_dir = "keeld-state", metrics_listen = "127.0.0.1:9464";
  std::string user_tokens_file, worker_token_file, tls_cert, tls_key, tls_ca, store_url, artifact_dir;
  std::string artifact_store = "dir";
  bool standby = false;
  int64_t artifact_keep = keel::kDefaultArtifactKeep;
  keel::CoordinatorOptions options;
  int64_t metrics_retention_ms = 600000;
  int64_t metrics_retention_s = metrics_retention_ms / 1000;
  CLI::App app("keeld");
  app.add_option("--listen", listen);
  app.add_option("--state-dir", state_dir);
  app.add_option("--store", store_url);
  app.add_flag("--standby", standby);
  app.add_option("--metrics-listen", metrics_listen);
  app.add_option("--user-tokens-file", user_tokens_file);
  app.add_option("--worker-token-file", worker_token_file);
  app.add_option("--tls-cert", tls_cert);
  app.add_option("--tls-key", tls_key);
  app.add_option("--tls-client-ca", tls_ca);
  app.add_option("--lease-ms", options.lease_ms)->check(keel::IntFlag(100, 3600000));
  app.add_option("--metrics-retention-s", metrics_retention_s)->check(keel::IntFlag(0, 30 * 86400));
  app.add_option("--restart-backoff-ms", options.restart_backoff_ms)->check(keel::IntFlag(0, 3600000));
  app.add_option("--heartbeat-ms", options.heartbeat_interval_ms)->check(keel::IntFlag(10, 600000));
  keel::SlurmFleetOptions slurm_options;
  std::string slurm_args, slurm_server;
  app.add_option("--slurm-sbatch", slurm_options.script);
  app.add_option("--slurm-sbatch-args", slurm_args);
  app.add_option("--slurm-max-jobs", slurm_options.max_jobs)->check(keel::IntFlag(1, 10000));
  app.add_option("--slurm-job-name", slurm_options.job_name);
  app.add_option("--slurm-server", slurm_server);
  app.add_option("--artifact-store", artifact_store);
  app.add_option("--artifact-dir", artifact_dir);
  app.add_option("--artifact-keep", artifact_keep)->check(keel::IntFlag(1, 1000000));
  const keel::FlagsOutcome flags = keel::ParseFlags(app, "keeld", kUsage, argc, argv);
  if (!flags.proceed) return flags.exit_code;
  metrics_retention_ms = metrics_retention_s * 1000;
  if (tls_cert.empty() != tls_key.empty()) return Fail("--tls-cert and --tls-key go together");
  if (artifact_store != "dir" && artifact_store != "db") {
    return Fail("--artifact-store: '" + artifact_store + "' is not allowed (allowed: dir, db)");
  }
  const bool artifacts_in_db = artifact_store == "db";
  if (artifacts_in_db && app.count("--artifact-dir")) {
    return Fail("--artifact-dir: given with --artifact-store db, which keeps checkpoints in the store's database; "
                "give one or the other");
  }
  const bool slurm = !slurm_options.script.empty();
  if (!slurm && (app.count("--slurm-sbatch-args") || app.count("--slurm-max-jobs") || app.count("--slurm-job-name") ||
                 app.count("--slurm-server"))) {
    return Fail("--slurm-sbatch-args, --slurm-max-jobs, --slurm-job-name and --slurm-server need --slurm-sbatch");
  }
  if (slurm && access(slurm_options.script.c_str(), R_OK) != 0) {
    return Fail("--slurm-sbatch: '" + slurm_options.script + "' is not a readable batch script (" +
                std::strerror(errno) + ")");
  }
  if (slurm && (slurm_options.job_name.empty() ||
                slurm_options.job_name.find_first_of(" \t\n,") != std::string::npos)) {
    return Fail("--slurm-job-name: '" + slurm_options.job_name +
                "' is not allowed (a non-empty name without spaces or commas)");
  }
  {
    std::istringstream words(slurm_args);
    for (std::string w; words >> w;) slurm_options.sbatch_args.push_back(w);
  }
  // Checked before anything is created: a bad --store changes nothing.
  const bool store_given = app.count("--store") > 0;
  keel::StoreLocation store_location;
  keel::Status s = keel::ParseStoreLocation(store_given ? store_url : "sqlite:" + state_dir + "/keeld.db",
                                            &store_location);
  if (!s.ok()) return Fail(s.message());
  const bool postgres = store_location.kind == keel::StoreLocation::Kind::kPostgres;
  if (standby && !postgres) {
    return Fail("--standby: the store is '" + (store_given ? store_url : "sqlite:" + state_dir + "/keeld.db") +
                "', SQLite; a standby keeld needs --store postgresql://... (it waits for the active keeld's "
                "PostgreSQL lock). A SQLite store belongs to one keeld: run one, and restart it.");
  }
  s = keel::MakeDirs(state_dir);
  if (!s.ok()) return Fail("--state-dir: " + s.message());
  chmod(state_dir.c_str(), 0700);
  // One keeld per state directory: a second one would mark the first one's
  // workers lost and hand out the same ids. The lock is the kernel's (flock):
  // it goes away with the process, kill -9 included, so it is never stale.
  const std::string lock_path = state_dir + "/keeld.lock";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return Fail("--state-dir: cannot open '" + lock_path + "': " + std::strerror(errno));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[64] = {0};
    ssize_t n = pread(lock_fd, holder, sizeof(holder) - 1, 0);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return Fail("--state-dir: '" + state_dir + "' is in use by another keeld" + (pid.empty() ? "" : " (pid " + pid + ")") +
                "; stop it first, or give this one another --state-dir");
  }
  {
    const std::string pid = std::to_string(getpid()) + "\n";
    if (ftruncate(lock_fd, 0) != 0 || pwrite(lock_fd, pid.data(), pid.size(), 0) < 0) {
      return Fail("--state-dir: cannot write '" + lock_path + "': " + std::strerror(errno));
    }
  }
  keel::AuthConfig auth;
  s = keel::LoadAuthConfig(user_tokens_file, worker_token_file, state_dir, &auth);
  if (!s.ok()) return Fail(s.message());
  keel::KeeldMetrics metrics;
  std::atomic<bool>& stop = *keel::StopOnSignals();
  const std::string store_name = postgres ? keel::RedactStoreUrl(store_location.target) : "sqlite:" + store_location.target;
  if (artifact_dir.empty()) artifact_dir = state_dir + "/artifacts";
  std::unique_ptr<keel::ArtifactStore> artifacts;
  if (!artifacts_in_db) {
    s = keel::ArtifactStore::OpenDir(artifact_dir, static_cast<int>(artifact_keep), &artifacts);
    if (!s.ok()) return Fail(s.message());
    options.artifacts = artifacts.get();
  }

  // The store, then the coordinator loaded from it: at once for an active
  // keeld (before it listens, so a bad store changes nothing), or once the
  // lock is free for a standby (which listens first, to refuse).
  keel::ServingGate gate;
  std::unique_ptr<keel::Coordinator> coordinator;
  keel::Store* store_raw = nullptr;
  auto open_store = [&]() -> keel::Status {
    std::unique_ptr<keel::Store> store;
    keel::Status st;
    if (postgres) {
      keel::PostgresStoreOptions pg;
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      pg.application_name = "keeld " + std::string(host) + " " + listen + " (pid " + std::to_string(getpid()) + ")";
      // The fencing rule (store.h): a keeld that may no longer write stops
      // here, in the middle of the call that found out, so that nothing it
      // holds is acknowledged afterwards; workers re-send it to the new one.
      pg.on_fenced = [](const keel::Status& why) {
        std::fprintf(stderr, "keeld: %s\nkeeld: exiting (status 3)\n", why.message().c_str());
        std::_Exit(3);
      };
      if (standby) {
        pg.lock_wait_ms = -1;
        pg.stop = &stop;
        pg.on_waiting = [&gate, &listen](const std::string& holder) {
          const std::string who = holder.empty() ? "another keeld" : "'" + holder + "'";
          gate.SetStandbyReason("standby: the active keeld is " + who +
                                "; this keeld takes over when that one's database session ends");
          std::fprintf(stderr, "keeld: standby on %s: the database's lock is held by %s; waiting for it\n",
                       listen.c_str(), who.c_str());
        };
      }
      st = keel::OpenPostgresStore(store_location.target, pg, &store);
    } else {
      st = keel::OpenStore(store_location, &store);
    }
    if (!st.ok()) return store_given ? keel::Status::Error("--store: " + st.message()) : st;
    store->SetWriteObserver([&metrics](double seconds) { metrics.ObserveStoreWrite(seconds); });
    store_raw = store.get();
    if (artifacts_in_db) {
      // In the store: opened once the store is this keeld's (a standby's too).
      KEEL_RETURN_IF_ERROR(keel::ArtifactStore::OpenInStore(store.get(), static_cast<int>(artifact_keep), &artifacts));
      options.artifacts = artifacts.get();
    }
    return keel::Coordinator::Open(std::move(store), options, &coordinator);
  };
  if (!standby) {
    s = open_store();
    if (!s.ok()) return Fail(s.message());
    gate.Activate(coordinator.get());
  }

  keel::UserService users(&gate, &auth, &metrics);
  keel::FleetService fleet(&gate, &auth, &metrics);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!tls_cert.empty()) {
    grpc::SslServerCredentialsOptions ssl(tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                         : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    if (!ReadPem(tls_key, &pair.private_key)) return Fail("--tls-key: cannot read '" + tls_key + "'");
    if (!ReadPem(tls_cert, &pair.cert_chain)) return Fail("--tls-cert: cannot read '" + tls_cert + "'");
    ssl.pem_key_cert_pairs.push_back(pair);
    if (!tls_ca.empty() && !ReadPem(tls_ca, &ssl.pem_root_certs)) return Fail("--tls-client-ca: cannot read '" + tls_ca + "'");
    credentials = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, credentials, &port);
  // gRPC binds with SO_REUSEPORT by default, so a second keeld on the same
  // port would share it and take part of the calls: bind exclusively.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&users);
  builder.RegisterService(&fleet);
  // gRPC's default limit (4 MiB) equals the sweep file limit, so a file just
  // under it plus the request's framing would be cut off by gRPC with a bare
  // RESOURCE_EXHAUSTED. With 1 MiB of room, ExpandSweep sees the file and
  // names its size and the limit; only far larger requests stop at gRPC.
  builder.SetMaxReceiveMessageSize(static_cast<int>(keel::kMaxYamlBytes + (size_t{1} << 20)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail("--listen: cannot listen on '" + listen + "' (in use by another process, e.g. another keeld, or not a valid address)");
  }

  std::unique_ptr<prometheus::Exposer> exposer;
  if (metrics_listen != "off") {
    try {
      exposer = std::make_unique<prometheus::Exposer>(metrics_listen);
      exposer->RegisterCollectable(metrics.registry());
    } catch (const std::exception& e) {
      return Fail("--metrics-listen: cannot listen on '" + metrics_listen + "': " + e.what());
    }
  }

  if (standby) {
    std::fprintf(stderr, "keeld: standby: listening on %s (port %d), refusing RPCs until it holds the lock of %s\n",
                 listen.c_str(), port, store_name.c_str());
    const auto waited_from = std::chrono::steady_clock::now();
    s = open_store();
    if (!s.ok()) {
      if (stop.load()) {
        std::fprintf(stderr, "keeld: shutting down (standby)\n");
        server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
        return 0;
      }
      return Fail(s.message());
    }
    gate.Activate(coordinator.get());
    std::fprintf(stderr, "keeld: took over after %.1f s as standby: the lock is this keeld's, state loaded\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count());
  }
  std::fprintf(stderr,
               "keeld: listening on %s (port %d%s), state in %s, store %s (schema version %d), artifacts in %s "
               "(keep %d a run), metrics on %s\n",
               listen.c_str(), port, tls_cert.empty() ? "" : ", TLS", state_dir.c_str(), store_name.c_str(),
               keel::kStoreSchemaVersion, artifacts->Where().c_str(), artifacts->keep(), metrics_listen.c_str());
  std::unique_ptr<keel::SlurmFleet> fleet_jobs;
  if (slurm) {
    if (slurm_server.empty()) {
      slurm_server = listen;
      const std::string host = listen.substr(0, listen.rfind(':'));
      if (host == "0.0.0.0" || host == "[::]" || host == "::") {
        char name[256] = {0};
        gethostname(name, sizeof(name) - 1);
        slurm_server = std::string(name) + listen.substr(listen.rfind(':'));
      }
    }
    slurm_options.env["KEEL_SERVER"] = slurm_server;
    if (!worker_token_file.empty()) slurm_options.env["KEEL_WORKER_TOKEN_FILE"] = worker_token_file;
    else if (std::getenv("KEEL_WORKER_TOKEN") == nullptr) slurm_options.env["KEEL_WORKER_TOKEN_FILE"] = state_dir + "/worker.token";
    std::fprintf(stderr, "keeld: slurm: submitting %s (job name %s, at most %d jobs) for workers of %s\n",
                 slurm_options.script.c_str(), slurm_options.job_name.c_str(), slurm_options.max_jobs,
                 slurm_server.c_str());
    fleet_jobs = std::make_unique<keel::SlurmFleet>(slurm_options);
  }
  std::string last_slurm_error;
  const auto started = std::chrono::steady_clock::now();
  auto ownership_checked = started;
  while (!stop.load()) {
    coordinator->Tick();
    const keel::CoordinatorStats stats = coordinator->Stats(metrics_retention_ms);
    metrics.Update(stats);
    if (fleet_jobs) {
      const int64_t now_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
      std::string job;
      const keel::Status fs = fleet_jobs->Tick(stats.queue_depth, now_ms, &job);
      if (!job.empty()) {
        std::fprintf(stderr, "keeld: slurm: submitted job %s (%lld runs queued, %zu jobs of ours)\n", job.c_str(),
                     static_cast<long long>(stats.queue_depth), fleet_jobs->jobs().size());
      }
      if (!fs.ok() && fs.message() != last_slurm_error) std::fprintf(stderr, "keeld: slurm: %s\n", fs.message().c_str());
      last_slurm_error = fs.ok() ? "" : fs.message();
    }
    // An idle keeld notices a lost database session too (fenced: it exits in
    // CheckOwnership; any other error, e.g. the server restarting, is retried).
    if (std::chrono::steady_clock::now() - ownership_checked >= std::chrono::seconds(1)) {
      store_raw->CheckOwnership();
      ownership_checked = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "keeld: shutting down\n");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
