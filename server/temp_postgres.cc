// TempPostgres (temp_postgres.h): initdb, start, wait, create databases, stop.
#include "server/temp_postgres.h"

#include <postgresql/libpq-fe.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace keel {
namespace {

namespace fs = std::filesystem;

// The directory holding initdb and postgres: $KEEL_PG_BINDIR, else the
// newest major version under /usr/lib/postgresql.
Status FindBinDir(std::string* out) {
  const char* env = std::getenv("KEEL_PG_BINDIR");
  if (env != nullptr && *env != '\0') {
    if (access((std::string(env) + "/initdb").c_str(), X_OK) != 0 ||
        access((std::string(env) + "/postgres").c_str(), X_OK) != 0) {
      return Status::NotFound("KEEL_PG_BINDIR='" + std::string(env) +
                              "' holds no executable initdb and postgres");
    }
    *out = env;
    return Status::Ok();
  }
  int best = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return std::isdigit(c) != 0; })) continue;
    const std::string bin = entry.path().string() + "/bin";
    if (access((bin + "/initdb").c_str(), X_OK) != 0 || access((bin + "/postgres").c_str(), X_OK) != 0) continue;
    if (std::atoi(name.c_str()) > best) {
      best = std::atoi(name.c_str());
      *out = bin;
    }
  }
  if (best < 0) {
    return Status::NotFound(
        "no PostgreSQL server binaries: found no /usr/lib/postgresql/*/bin with initdb and postgres "
        "(install Debian's postgresql package: scripts/install-deps), and KEEL_PG_BINDIR is not set");
  }
  return Status::Ok();
}

// A TCP port on 127.0.0.1 that nothing listens on now.
Status FreePort(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::Error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return Status::Error("bind 127.0.0.1:0: " + why);
  }
  *port = ntohs(addr.sin_port);
  close(fd);
  return Status::Ok();
}

// The last `bytes` of a file, for error messages.
std::string Tail(const std::string& path, size_t bytes = 2000) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  return s.size() <= bytes ? s : "..." + s.substr(s.size() - bytes);
}

// The account the server runs as: none (ourselves) unless we are root.
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string name;
};

Status PickUser(RunAs* as) {
  if (geteuid() != 0) return Status::Ok();
  for (const char* name : {"postgres", "nobody"}) {
    const passwd* pw = getpwnam(name);
    if (pw == nullptr) continue;
    as->drop = true;
    as->uid = pw->pw_uid;
    as->gid = pw->pw_gid;
    as->name = name;
    return Status::Ok();
  }
  return Status::NotFound("running as root, and PostgreSQL refuses root: no 'postgres' or 'nobody' user to run it as");
}

// Starts `argv` (argv[0] a full path) in `dir` as `as`, its output appended to
// `log`; SIGINT reaches it if this process dies first.
Status Spawn(const std::vector<std::string>& argv, const std::string& dir, const RunAs& as, const std::string& log,
             pid_t* pid) {
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return Status::Error("open '" + log + "': " + std::strerror(errno));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    close(log_fd);
    return Status::Error(std::string("fork: ") + std::strerror(errno));
  }
  if (child == 0) {
    // Only async-signal-safe calls from here to exec.
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    if (chdir(dir.c_str()) != 0) _exit(126);
    if (as.drop && (setgroups(0, nullptr) != 0 || setgid(as.gid) != 0 || setuid(as.uid) != 0)) _exit(126);
    // After the credentials change, which clears it.
    prctl(PR_SET_PDEATHSIG, SIGINT);
    if (getppid() != parent) _exit(126);
    execv(args[0], args.data());
    _exit(127);
  }
  close(log_fd);
  *pid = child;
  return Status::Ok();
}

}  // namespace

Status TempPostgres::Start(std::unique_ptr<TempPostgres>* out) {
  std::unique_ptr<TempPostgres> pg(new TempPostgres());
  KEEL_RETURN_IF_ERROR(FindBinDir(&pg->bin_dir_));
  RunAs as;
  KEEL_RETURN_IF_ERROR(PickUser(&as));
  // Under /tmp, not $TEST_TMPDIR: a unix socket path must stay under 108
  // bytes, and the server's user must reach it (root's home is closed to it).
  char dir_template[] = "/tmp/keel-pg-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return Status::Error(std::string("mkdtemp /tmp/keel-pg-XXXXXX: ") + std::strerror(errno));
  pg->dir_ = dir_template;
  if (as.drop && chown(pg->dir_.c_str(), as.uid, as.gid) != 0) {
    return Status::Error("chown '" + pg->dir_ + "' to " + as.name + ": " + std::strerror(errno));
  }
  const std::string log = pg->dir_ + "/postgres.log";
  // initdb: superuser `keel`, trust authentication (only this machine's
  // loopback and a socket in a 0700 directory reach it), no fsync of the
  // fresh cluster (it is thrown away anyway; the server itself syncs).
  pid_t initdb = -1;
  KEEL_RETURN_IF_ERROR(Spawn({pg->bin_dir_ + "/initdb", "-D", pg->dir_ + "/data", "-U", "keel", "-A", "trust", "-E",
                              "UTF8", "--locale=C", "--no-sync", "--no-instructions"},
                             pg->dir_, as, pg->dir_ + "/initdb.log", &initdb));
  int status = 0;
  if (waitpid(initdb, &status, 0) != initdb || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Error("initdb (" + pg->bin_dir_ + "/initdb" + (as.drop ? ", as user " + as.name : "") +
                         ") failed: " + Tail(pg->dir_ + "/initdb.log"));
  }
  // The port was free a moment ago; another process may take it first, in
  // which case the server exits and we try another.
  for (int attempt = 0; attempt < 5; ++attempt) {
    KEEL_RETURN_IF_ERROR(FreePort(&pg->port_));
    KEEL_RETURN_IF_ERROR(Spawn({pg->bin_dir_ + "/postgres", "-D", pg->dir_ + "/data", "-p", std::to_string(pg->port_),
                                "-k", pg->dir_, "-c", "listen_addresses=127.0.0.1"},
                               pg->dir_, as, log, &pg->pid_));
    const std::string conninfo =
        "host=127.0.0.1 port=" + std::to_string(pg->port_) + " user=keel dbname=postgres connect_timeout=2";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (PQping(conninfo.c_str()) == PQPING_OK) {
        *out = std::move(pg);
        return Status::Ok();
      }
      if (waitpid(pg->pid_, &status, WNOHANG) == pg->pid_) {
        exited = true;
        pg->pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!exited) {
      return Status::Unavailable("postgres did not accept connections within 60 s on port " +
                                 std::to_string(pg->port_) + ": " + Tail(log));
    }
    if (Tail(log).find("could not bind") == std::string::npos) {
      return Status::Error("postgres exited at start: " + Tail(log));
    }
  }
  return Status::Unavailable("postgres found no free port in 5 attempts: " + Tail(log));
}

TempPostgres::~TempPostgres() {
  if (pid_ > 0) {
    // Immediate shutdown: the cluster is thrown away, so the shutdown
    // checkpoint (seconds of fsyncs after a test's many databases) is skipped.
    kill(pid_, SIGQUIT);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string TempPostgres::Url(const std::string& name) const {
  return "postgresql://keel@127.0.0.1:" + std::to_string(port_) + "/" + name;
}

std::string TempPostgres::SocketUrl(const std::string& name) const {
  return "postgresql://keel@/" + name + "?host=" + dir_ + "&port=" + std::to_string(port_);
}

Status TempPostgres::CreateDatabase(const std::string& name, std::string* url) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return std::islower(c) || std::isdigit(c) || c == '_'; })) {
    return Status::InvalidArgument("CreateDatabase: name '" + name + "' must be lowercase letters, digits and '_'");
  }
  PGconn* conn = PQconnectdb(Url("postgres").c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    const std::string why = PQerrorMessage(conn);
    PQfinish(conn);
    return Status::Unavailable("connect to " + Url("postgres") + ": " + why);
  }
  // An identifier cannot be a parameter; `name` was checked above.
  PGresult* res = PQexec(conn, ("CREATE DATABASE " + name).c_str());
  Status status = PQresultStatus(res) == PGRES_COMMAND_OK
                      ? Status::Ok()
                      : Status::Error("CREATE DATABASE " + name + ": " + PQresultErrorMessage(res));
  PQclear(res);
  PQfinish(conn);
  if (status.ok()) *url = Url(name);
  return status;
}

}  // namespace keel
