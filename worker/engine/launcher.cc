// keel-train --nproc N (see launcher.h).
#include "worker/engine/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "worker/run/trainer_exit.h"

namespace keel {
namespace {

volatile sig_atomic_t g_forward = 0;  // the signal to pass on, 0 when none is pending

void OnSignal(int signal_number) { g_forward = signal_number; }

// Whether the launcher was given devices (a non-empty CUDA_VISIBLE_DEVICES).
bool VisibleDevicesSet() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible != nullptr && *visible != '\0';
}

// The devices rank r may use: the r-th entry of CUDA_VISIBLE_DEVICES when set,
// else r.
std::string DeviceFor(int rank) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr || *visible == '\0') return std::to_string(rank);
  std::vector<std::string> ids;
  std::string item;
  for (const char* p = visible;; ++p) {
    if (*p == ',' || *p == '\0') {
      ids.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return rank < static_cast<int>(ids.size()) ? ids[rank] : std::to_string(rank);
}

// Starts the launcher's rank `local` (global rank first_rank + local).
pid_t StartRank(const LaunchOptions& o, int local) {
  const int rank = o.first_rank + local;
  const int world = o.world > 0 ? o.world : o.nproc;
  std::vector<std::string> args = {o.argv0.empty() ? o.binary : o.argv0};
  args.insert(args.end(), o.args.begin(), o.args.end());
  for (const std::string& a : {std::string("--rank"), std::to_string(rank), std::string("--world"),
                               std::to_string(world), std::string("--bootstrap"), o.bootstrap_path}) {
    args.push_back(a);
  }
  if (rank > 0) args.push_back("--quiet");
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;  // the launcher (or -1)
  // A launcher killed outright (kill -9, keel-worker's SIGKILL) must not leave
  // its ranks training: each stops as if interrupted.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) _exit(trainer_exit::kFailed);  // it died before prctl took effect
  // CPU ranks too when the launcher was given GPUs (keel-worker --fake-gpus):
  // every rank sees only its own device, whatever its backend.
  if (o.cuda || VisibleDevicesSet()) setenv("CUDA_VISIBLE_DEVICES", DeviceFor(local).c_str(), 1);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  execv(o.binary.c_str(), argv.data());
  std::fprintf(stderr, "keel-train: rank %d: cannot start %s: %s\n", rank, o.binary.c_str(), std::strerror(errno));
  _exit(trainer_exit::kFailed);
}

// A rank's wait status as keel-train's exit status.
int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return trainer_exit::kFailed;
}

}  // namespace

int LaunchRanks(const LaunchOptions& o) {
  // Rank 0 publishes the id; elsewhere the file is written for this launch
  // (keel-worker, from keeld's relay) and must not be removed.
  if (o.first_rank == 0) std::remove(o.bootstrap_path.c_str());
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::vector<pid_t> pids(o.nproc, -1);
  std::vector<bool> running(o.nproc, false);
  for (int r = 0; r < o.nproc; ++r) {
    pids[r] = StartRank(o, r);
    running[r] = pids[r] > 0;
  }
  int result = trainer_exit::kDone;
  bool failed = false;  // a rank failed: the others are being stopped
  auto stop_all = [&](int signal_number) {
    for (int r = 0; r < o.nproc; ++r) {
      if (running[r]) kill(pids[r], signal_number);
    }
  };
  for (int r = 0; r < o.nproc; ++r) {
    if (pids[r] <= 0) {
      std::fprintf(stderr, "keel-train: cannot start rank %d: %s\n", o.first_rank + r, std::strerror(errno));
      failed = true;
      result = trainer_exit::kFailed;
    }
  }
  if (failed) stop_all(SIGTERM);
  auto stopping_since = std::chrono::steady_clock::now();
  int left = 0;
  for (bool r : running) left += r;
  bool killed = false;
  // One rank's end.
  struct Exit {
    int rank, status;
  };
  auto reap = [&](std::vector<Exit>* exits) {
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (int r = 0; r < o.nproc; ++r) {
        if (pids[r] == pid && running[r]) {
          running[r] = false;
          --left;
          exits->push_back({o.first_rank + r, status});
        }
      }
    }
  };
  auto failure = [](int status) { return !WIFEXITED(status) || !trainer_exit::EndedAsRun(ExitCode(status)); };
  while (left > 0) {
    if (g_forward != 0) {
      stop_all(g_forward);
      g_forward = 0;
    }
    std::vector<Exit> exits;
    reap(&exits);
    bool any_failed = false;
    for (const Exit& e : exits) any_failed = any_failed || failure(e.status);
    if (!failed && any_failed) {
      // The ranks a failure takes down fail too, a moment later: collect them,
      // and report a rank killed by a signal (the likely cause) before a rank
      // that exited because its peer went away.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      reap(&exits);
      const Exit* cause = nullptr;
      for (const Exit& e : exits) {
        if (failure(e.status) && (cause == nullptr || (!WIFEXITED(e.status) && WIFEXITED(cause->status)))) cause = &e;
      }
      std::fprintf(stderr, "keel-train: rank %d %s%s\n", cause->rank,
                   WIFEXITED(cause->status) ? ("exited with status " + std::to_string(ExitCode(cause->status))).c_str()
                                            : ("died of signal " + std::to_string(WTERMSIG(cause->status))).c_str(),
                   trainer_exit::kStoppingOtherRanks);
      failed = true;
      result = ExitCode(cause->status);
      stopping_since = std::chrono::steady_clock::now();
      stop_all(SIGTERM);
    } else if (!failed) {
      for (const Exit& e : exits) {
        if (ExitCode(e.status) != trainer_exit::kDone) result = ExitCode(e.status);  // interrupted or diverged
      }
    }
    if (!exits.empty()) continue;
    if (failed && !killed &&
        std::chrono::steady_clock::now() - stopping_since > std::chrono::duration<double>(o.grace_s)) {
      stop_all(SIGKILL);  // a rank stuck in a collective with the failed one
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (o.first_rank == 0) std::remove(o.bootstrap_path.c_str());
  return result;
}

}  // namespace keel
