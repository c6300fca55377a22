#include "server/slurm_fleet.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

extern char** environ;

namespace keel {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string Joined(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

Status ParseSqueue(const std::string& text, std::vector<SlurmJob>* out) {
  out->clear();
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    line = Trim(line);
    if (line.empty()) continue;
    std::istringstream fields(line);
    SlurmJob job;
    std::string extra;
    if (!(fields >> job.id >> job.state) || (fields >> extra)) {
      return Status::DataLoss("squeue: line '" + line + "' is not 'JOBID STATE'");
    }
    out->push_back(job);
  }
  return Status::Ok();
}

Status ParseSbatchId(const std::string& text, std::string* id) {
  std::string t = Trim(text);
  t = t.substr(0, t.find(';'));  // "ID;CLUSTER" on federated clusters
  if (t.empty() || t.size() > 20 || t.find_first_not_of("0123456789") != std::string::npos) {
    return Status::DataLoss("sbatch --parsable printed '" + Trim(text) + "', not a job id");
  }
  *id = t;
  return Status::Ok();
}

Status RunCommand(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  int64_t timeout_ms, std::string* out, std::string* err) {
  out->clear();
  err->clear();
  if (argv.empty()) return Status::InvalidField("argv", "is empty");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (env.count(kv.substr(0, kv.find('='))) == 0) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return Status::Unavailable(std::string("pipe: ") + std::strerror(errno));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return Status::Unavailable(std::string("pipe: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (spawned != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    return Status::Unavailable("cannot run '" + argv[0] + "': " + std::strerror(spawned));
  }
  const int64_t deadline = NowMs() + timeout_ms;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const int64_t left = deadline - NowMs();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return Status::Unavailable("'" + Joined(argv) + "' ran past " + std::to_string(timeout_ms) + " ms");
  if (WIFSIGNALED(status)) {
    return Status::Unavailable("'" + Joined(argv) + "' was killed by signal " + std::to_string(WTERMSIG(status)));
  }
  if (WEXITSTATUS(status) != 0) {
    return Status::Unavailable("'" + Joined(argv) + "' exited " + std::to_string(WEXITSTATUS(status)) + ": " +
                               Trim(*err));
  }
  return Status::Ok();
}

Status SlurmFleet::Tick(int64_t queued_runs, int64_t now_ms, std::string* submitted) {
  submitted->clear();
  if (queued_runs <= 0) {
    queued_since_ms_ = -1;
  } else if (queued_since_ms_ < 0) {
    queued_since_ms_ = now_ms;
  }
  if (last_poll_ms_ >= 0 && now_ms - last_poll_ms_ < options_.poll_ms) return Status::Ok();
  last_poll_ms_ = now_ms;
  std::string out, err;
  KEEL_RETURN_IF_ERROR(RunCommand({options_.squeue, "--noheader", "--name=" + options_.job_name, "--format=%i %T"},
                                  options_.env, 30000, &out, &err));
  KEEL_RETURN_IF_ERROR(ParseSqueue(out, &jobs_));
  int pending = 0;
  for (const SlurmJob& j : jobs_) pending += (j.state == "PENDING" || j.state == "CONFIGURING") ? 1 : 0;
  const bool waited = queued_since_ms_ >= 0 && now_ms - queued_since_ms_ >= options_.queued_for_ms;
  if (!waited || pending > 0 || static_cast<int>(jobs_.size()) >= options_.max_jobs) return Status::Ok();
  std::vector<std::string> argv = {options_.sbatch, "--parsable", "--job-name=" + options_.job_name};
  argv.insert(argv.end(), options_.sbatch_args.begin(), options_.sbatch_args.end());
  argv.push_back(options_.script);
  KEEL_RETURN_IF_ERROR(RunCommand(argv, options_.env, 30000, &out, &err));
  std::string id;
  KEEL_RETURN_IF_ERROR(ParseSbatchId(out, &id));
  jobs_.push_back({id, "PENDING"});
  ++submitted_total_;
  *submitted = id;
  return Status::Ok();
}

}  // namespace keel
