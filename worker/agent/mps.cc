#include "worker/agent/mps.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "worker/io/file_util.h"

namespace keel {

namespace {

// The exit of a waited-for process, as words.
std::string ExitWords(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Runs `control` with `arg` (none when empty), `input` on its stdin, in this
// process's environment with `env`'s variables set (in the child only); *status
// its wait status. 127: not found or not runnable. The child only calls
// async-signal-safe functions before exec (argv and envp are built here).
Status RunControl(const std::string& control, const std::string& arg, const std::string& input,
                  const std::vector<std::pair<std::string, std::string>>& env, int* status) {
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    bool replaced = false;
    for (const auto& [name, value] : env) replaced |= std::string(*e).rfind(name + "=", 0) == 0;
    if (!replaced) vars.push_back(*e);
  }
  for (const auto& [name, value] : env) vars.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::vector<char*> argv{const_cast<char*>(control.c_str())};
  if (!arg.empty()) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return Status::Error("mps: pipe() failed");
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::Error("mps: fork() failed");
  }
  if (pid == 0) {
    dup2(fds[0], 0);
    close(fds[0]);
    close(fds[1]);
    execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(fds[0]);
  if (!input.empty()) {
    // A command that exits without reading fails the write; its status says why.
    const ssize_t written = write(fds[1], input.data(), input.size());
    (void)written;
  }
  close(fds[1]);
  if (waitpid(pid, status, 0) != pid) return Status::Error("mps: waitpid() failed for '" + control + "'");
  return Status::Ok();
}

}  // namespace

Status StartMps(const std::string& control, const std::string& work_dir, MpsDaemon* out) {
  MpsDaemon d;
  d.control = control;
  d.pipe_dir = work_dir + "/mps/pipe";
  d.log_dir = work_dir + "/mps/log";
  KEEL_RETURN_IF_ERROR(MakeDirs(d.pipe_dir));
  KEEL_RETURN_IF_ERROR(MakeDirs(d.log_dir));
  const std::vector<std::pair<std::string, std::string>> env = {{"CUDA_MPS_PIPE_DIRECTORY", d.pipe_dir},
                                                                {"CUDA_MPS_LOG_DIRECTORY", d.log_dir}};
  int status = 0;
  KEEL_RETURN_IF_ERROR(RunControl(control, "-d", "", env, &status));
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    return Status::Error("--mps: '" + control + " -d' (CUDA_MPS_PIPE_DIRECTORY=" + d.pipe_dir + ") ended with " +
                         ExitWords(status) +
                         (WIFEXITED(status) && WEXITSTATUS(status) == 127
                              ? " (not found or not executable; allowed: --mps-control PATH to nvidia-cuda-mps-control)"
                              : " (see " + d.log_dir + "/control.log; is an MPS daemon already running there?)"));
  }
  // Started: the worker's trainers (and StopMps) inherit the directories from here on.
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  d.started = true;
  *out = d;
  return Status::Ok();
}

Status StopMps(MpsDaemon* daemon) {
  if (!daemon->started) return Status::Ok();
  daemon->started = false;
  int status = 0;
  KEEL_RETURN_IF_ERROR(RunControl(daemon->control, "", "quit\n", {}, &status));
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    return Status::Error("mps: 'echo quit | " + daemon->control + "' ended with " + ExitWords(status));
  }
  return Status::Ok();
}

}  // namespace keel
