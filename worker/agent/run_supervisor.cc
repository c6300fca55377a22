// One keel-train process under keel-worker (see run_supervisor.h).
#include "worker/agent/run_supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstring>

#include "worker/run/checkpoint_dirs.h"
#include "worker/run/run_dir.h"
#include "worker/run/run_lease.h"
#include "worker/run/step_metrics.h"
#include "worker/run/trainer_exit.h"
#include "worker/io/file_util.h"
#include "worker/io/json.h"

namespace keel {
namespace {

std::string Join(const std::vector<int32_t>& gpus) {
  std::string text;
  for (int32_t g : gpus) text += (text.empty() ? "" : ",") + std::to_string(g);
  return text;
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Why the trainer stopped, from its output: the last line; when that is the
// launcher's "rank R ...; stopping the other ranks", with rank R's own last
// line ("keel-train: rank R: <why>") after it, so that keeld's message names
// the cause (a rank that never joined, a CUDA error), not only the rank.
std::string ExitReason(const std::string& log) {
  std::vector<std::string> lines;
  for (size_t begin = 0, end; begin < log.size(); begin = end + 1) {
    end = log.find('\n', begin);
    if (end == std::string::npos) end = log.size();
    if (end > begin) lines.push_back(log.substr(begin, end - begin));
  }
  if (lines.empty()) return "";
  const std::string& last = lines.back();
  const std::string prefix = "keel-train: rank ";
  if (!EndsWith(last, trainer_exit::kStoppingOtherRanks) || last.compare(0, prefix.size(), prefix) != 0) return last;
  const std::string rank = last.substr(prefix.size(), last.find(' ', prefix.size()) - prefix.size());
  const std::string own = prefix + rank + ": ";
  for (size_t i = lines.size() - 1; i-- > 0;) {
    if (lines[i].compare(0, own.size(), own) == 0) return last + ": " + lines[i].substr(std::string("keel-train: ").size());
  }
  return last;
}

}  // namespace

std::string NewestCheckpointBeside(const std::string& checkpoint) {
  const std::string dir = DirName(checkpoint);
  const auto checkpoints = ListCheckpoints(dir);
  return checkpoints.empty() ? checkpoint : dir + "/" + checkpoints.back().second;
}

Status RunSupervisor::Start(const RunLaunch& launch, std::unique_ptr<RunSupervisor>* out) {
  if (launch.run_id.empty()) return Status::Error("run: empty run id");
  KEEL_RETURN_IF_ERROR(MakeDirs(launch.run_dir));
  const std::string config = RunDir(launch.run_dir).config();
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(config, launch.spec_yaml));
  if (launch.resume_checkpoint.empty()) {
    // A fresh start owns the directory's metrics: no lines of an earlier attempt.
    unlink((RunDir(launch.run_dir).metrics()).c_str());
  }
  // The lease comes first: the trainer reads it before its first step.
  const std::string lease = RunDir(launch.run_dir).lease();
  KEEL_RETURN_IF_ERROR(WriteRunLease(lease, {launch.attempt, launch.lease_expires_unix_ms}));
  std::vector<std::string> args = {launch.trainer, "--config", config, "--run-dir", launch.run_dir, "--quiet"};
  if (launch.gpus.empty() || !launch.fake_gpus) {
    args.push_back("--backend");
    args.push_back(launch.gpus.empty() ? "cpu" : "cuda");
  }
  for (const std::string& a : {std::string("--lease-file"), lease, std::string("--attempt"),
                               std::to_string(launch.attempt)}) {
    args.push_back(a);
  }
  for (const std::string& root : launch.data_roots) {
    args.push_back("--data-root");
    args.push_back(root);
  }
  const bool gang = launch.world > launch.ranks;
  if (launch.ranks > 1 || gang) {  // keel-train starts the ranks and stops them all with any one
    args.push_back("--nproc");
    args.push_back(std::to_string(launch.ranks));
  }
  if (gang) {
    const std::string bootstrap = RunDir(launch.run_dir).bootstrap();
    KEEL_RETURN_IF_ERROR(MakeDirs(DirName(bootstrap)));
    // An id left by an earlier attempt must not be read as this one's.
    unlink(bootstrap.c_str());
    for (const std::string& a : {std::string("--first-rank"), std::to_string(launch.first_rank), std::string("--world"),
                                 std::to_string(launch.world), std::string("--bootstrap"), bootstrap}) {
      args.push_back(a);
    }
    // The other parts run on other hosts: rank 0 must not listen on loopback only.
    if (launch.first_rank == 0 && !launch.advertise.empty()) {
      for (const std::string& a : {std::string("--set"), std::string("dist.listen_host=0.0.0.0"), std::string("--set"),
                                   "dist.advertise_host=" + launch.advertise}) {
        args.push_back(a);
      }
    }
  }
  if (!launch.resume_checkpoint.empty()) {
    const std::string checkpoint = NewestCheckpointBeside(launch.resume_checkpoint);
    args.push_back("--resume");
    args.push_back(checkpoint);
    args.push_back("--resume-fallback");  // a checkpoint that does not verify costs a step, not the run
    // Resuming another attempt's checkpoint (another worker's run directory):
    // bring its metrics along. The trainer keeps the lines up to the checkpoint
    // and this supervisor sends them all again, so steps that attempt wrote but
    // never delivered (its worker died) still reach keeld.
    const std::string old_dir = DirName(DirName(checkpoint));
    std::string old_metrics;
    // (A gang's part without rank 0 reports no metrics: nothing to bring.)
    if (launch.first_rank == 0 && old_dir != launch.run_dir && ReadFile(RunDir(old_dir).metrics(), &old_metrics).ok()) {
      KEEL_RETURN_IF_ERROR(WriteFileAtomic(RunDir(launch.run_dir).metrics(), old_metrics));
    }
  }
  const std::string log = RunDir(launch.run_dir).trainer_log();
  int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return Status::Error("run " + launch.run_id + ": cannot open '" + log + "': " + strerror(errno));
  const std::string devices = Join(launch.gpus);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  const pid_t worker_pid = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return Status::Error("run " + launch.run_id + ": fork failed: " + strerror(errno));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);  // the order NVML (DetectGpus) counts in
    setenv("CUDA_VISIBLE_DEVICES", devices.c_str(), 1);
    setpgid(0, 0);  // its own process group: a signal to the worker's terminal does not reach it
    // If the worker dies (even by kill -9) the trainer stops too, checkpointing
    // on the way out, so no orphan keeps writing a run another worker resumes.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != worker_pid) _exit(126);  // the worker died before prctl took effect
    execv(argv[0], argv.data());
    const char msg[] = "keel-worker: exec of the trainer failed\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(127);
  }
  close(log_fd);
  std::unique_ptr<RunSupervisor> s(new RunSupervisor);
  s->launch_ = launch;
  s->pid_ = pid;
  *out = std::move(s);
  return Status::Ok();
}

RunSupervisor::~RunSupervisor() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

Status RunSupervisor::Signal(int signal) {
  if (reaped_) return Status::Ok();
  if (kill(pid_, signal) != 0 && errno != ESRCH) {
    return Status::Error("run " + launch_.run_id + ": kill failed: " + strerror(errno));
  }
  return Status::Ok();
}

Status RunSupervisor::LineTail::Read(const std::string& path, std::vector<std::string>* lines) {
  struct stat st;
  restarted = false;
  if (stat(path.c_str(), &st) != 0) return Status::Ok();  // not written yet
  if (st.st_ino != inode || st.st_size < offset) {
    restarted = offset > 0 || !partial.empty();
    // Replaced or truncated: read it again. keeld keeps one point per step and
    // ignores stale events, so lines sent twice are harmless.
    inode = st.st_ino;
    offset = 0;
    partial.clear();
  }
  if (st.st_size == offset) return Status::Ok();
  std::string chunk(static_cast<size_t>(st.st_size - offset), '\0');
  KEEL_RETURN_IF_ERROR(ReadFileRange(path, offset, static_cast<int64_t>(chunk.size()), &chunk[0]));
  offset = st.st_size;
  partial += chunk;
  size_t begin = 0;
  for (size_t end; (end = partial.find('\n', begin)) != std::string::npos; begin = end + 1) {
    lines->push_back(partial.substr(begin, end - begin));
  }
  partial.erase(0, begin);
  return Status::Ok();
}

Status RunSupervisor::ReadNewMetrics(RunProgress* progress) {
  std::vector<std::string> lines;
  KEEL_RETURN_IF_ERROR(metrics_tail_.Read(RunDir(launch_.run_dir).metrics(), &lines));
  for (std::string& line : lines) {
    MetricLine parsed;
    if (!ParseMetricLine(line, &parsed).ok()) continue;  // never a complete bad line from keel-train
    v1::MetricPoint m;
    m.set_run_id(launch_.run_id);
    m.set_step(parsed.step);
    m.set_loss(parsed.loss);
    m.set_lr(parsed.lr);
    m.set_tokens_per_s(parsed.tokens_per_s);
    m.set_grad_norm(parsed.grad_norm);
    m.set_json(std::move(line));
    progress->metrics.push_back(std::move(m));
  }
  return Status::Ok();
}

Status RunSupervisor::ReadNewEvents(RunProgress* progress) {
  std::vector<std::string> lines;
  KEEL_RETURN_IF_ERROR(events_tail_.Read(RunDir(launch_.run_dir).events(), &lines));
  for (const std::string& line : lines) {
    JsonValue v;
    if (!ParseJson(line, &v).ok() || !v.is_object()) continue;
    v1::Event e;
    e.set_run_id(launch_.run_id);
    if (const JsonValue* step = v.Find("step")) e.set_step(step->int_value());
    if (const JsonValue* kind = v.Find("kind")) e.set_kind(kind->string_value());
    if (const JsonValue* message = v.Find("message")) e.set_message(message->string_value());
    if (const JsonValue* details = v.Find("details")) {
      for (const JsonValue::Member& m : details->members()) (*e.mutable_details())[m.first] = m.second.string_value();
    }
    e.set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count());
    progress->events.push_back(std::move(e));
  }
  return Status::Ok();
}

Status RunSupervisor::RenewLease(int64_t expires_unix_ms) {
  if (reaped_) return Status::Ok();
  return WriteRunLease(RunDir(launch_.run_dir).lease(), {launch_.attempt, expires_unix_ms});
}

Status RunSupervisor::SendCommand(const std::string& json) {
  const std::string dir = RunDir(launch_.run_dir).commands();
  KEEL_RETURN_IF_ERROR(MakeDirs(dir));
  char name[32];
  std::snprintf(name, sizeof(name), "%08d", ++command_seq_);
  // The trainer reads *.json only: write the .tmp first, then rename.
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + name + ".tmp", json));
  if (std::rename((dir + "/" + name + ".tmp").c_str(), (dir + "/" + name + ".json").c_str()) != 0) {
    return Status::Error("run " + launch_.run_id + ": cannot hand the trainer a command: " + strerror(errno));
  }
  return Status::Ok();
}

Status RunSupervisor::FindNewCheckpoints(RunProgress* progress) {
  const auto checkpoints = ListCheckpoints(RunDir(launch_.run_dir).checkpoints());
  const std::string newest = checkpoints.empty() ? "" : checkpoints.back().second;
  if (newest.empty() || newest == last_checkpoint_) return Status::Ok();
  last_checkpoint_ = newest;
  v1::CheckpointNotice c;
  c.set_run_id(launch_.run_id);
  c.set_step(checkpoints.back().first);
  c.set_path(RunDir(launch_.run_dir).checkpoints() + "/" + newest);
  progress->checkpoints.push_back(std::move(c));
  return Status::Ok();
}

Status RunSupervisor::Poll(RunProgress* progress) {
  *progress = RunProgress();
  if (reaped_) return Status::Ok();
  int status = 0;
  pid_t done = waitpid(pid_, &status, WNOHANG);
  // Checkpoints first: the trainer writes a step's metric line before that
  // step's checkpoint, so every checkpoint found now has its line read below,
  // and its notice (queued after the metrics) reaches keeld after the line.
  KEEL_RETURN_IF_ERROR(FindNewCheckpoints(progress));
  // Read what the process wrote; after it exited, this is everything. The
  // events again when metrics.jsonl turned out rewritten: a rollback's event,
  // written before the rewrite, then goes before the new points (RunProgress).
  KEEL_RETURN_IF_ERROR(ReadNewEvents(progress));
  KEEL_RETURN_IF_ERROR(ReadNewMetrics(progress));
  if (metrics_tail_.restarted) {
    KEEL_RETURN_IF_ERROR(ReadNewEvents(progress));
    progress->events_first = true;
  }
  if (done == pid_) {
    reaped_ = true;
    progress->exited = true;
    progress->exit.set_run_id(launch_.run_id);
    if (WIFEXITED(status)) {
      progress->exit.set_exit_code(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      progress->exit.set_exit_code(-1);
      progress->exit.set_signal(WTERMSIG(status));
    }
    std::string log;
    if (ReadFile(RunDir(launch_.run_dir).trainer_log(), &log).ok()) progress->exit.set_message(ExitReason(log));
  } else if (done < 0 && errno != EINTR) {
    return Status::Error("run " + launch_.run_id + ": waitpid failed: " + strerror(errno));
  }
  return Status::Ok();
}

}  // namespace keel
