// keel-worker's supervision of one keel-train process: starts it with its run
// directory, config and GPUs, follows what it writes (metrics.jsonl lines,
// new checkpoints) and reports how it ended. A crashing trainer is an exit to
// report, never a problem for the worker.
#ifndef KEEL_WORKER_AGENT_RUN_SUPERVISOR_H_
#define KEEL_WORKER_AGENT_RUN_SUPERVISOR_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"

namespace keel {

struct RunLaunch {
  std::string run_id;
  std::string trainer;            // path of the keel-train binary (or a stand-in)
  std::string run_dir;            // created if missing; holds run.yaml, trainer.log, metrics.jsonl
  std::string spec_yaml;          // the run config
  // CUDA_VISIBLE_DEVICES, one GPU per rank (keel-train's launcher gives its
  // k-th rank the k-th); empty: --backend cpu.
  std::vector<int32_t> gpus;
  // The GPUs are keel-worker --fake-gpus (tests, demos): CUDA_VISIBLE_DEVICES
  // is set as for real ones, but no --backend is passed, so the trainer runs
  // the backend its run config names (backend: cpu works without a GPU).
  bool fake_gpus = false;
  std::string resume_checkpoint;  // "" : fresh start; the newest beside it that verifies is used
  int64_t attempt = 1;            // the assignment's attempt (fencing, run_lease.h)
  int64_t lease_expires_unix_ms = 0;  // the trainer's first lease deadline
  std::vector<std::string> data_roots;  // --data-root: the only places data may be read from
  int ranks = 1;                  // > 1: keel-train --nproc ranks (data-parallel rank processes)
  // A part of a gang (world > ranks): ranks first_rank .. first_rank + ranks - 1
  // of world, meeting through RunDir::bootstrap() (the part with rank 0 writes
  // it; the others get it relayed by keeld).
  int first_rank = 0;
  int world = 0;                  // 0: ranks
  // A gang's part with rank 0: the address the other parts reach this host at.
  // Rank 0 then listens on every interface and publishes it (keel-train --set
  // dist.listen_host=0.0.0.0 --set dist.advertise_host=<advertise>).
  std::string advertise;
};

// What Poll saw since the previous call.
// keeld drops a run's points past the restored step when it sees a rollback's
// event, so the event must reach it after every point of the abandoned
// trajectory and before every point of the new one. The trainer closes
// metrics.jsonl, writes the event, then rewrites the file (a new inode) for
// the new trajectory. So lines read from the file Poll was already following
// were written before any event it reads in the same Poll: send the metrics
// first. Lines read from a rewritten file (events_first) come after: Poll
// reads the events again once it sees the rewrite, and they go first.
struct RunProgress {
  std::vector<v1::Event> events;                 // lines of the trainer's events.jsonl
  std::vector<v1::MetricPoint> metrics;
  bool events_first = false;                     // send `events` before `metrics`
  std::vector<v1::CheckpointNotice> checkpoints;
  bool exited = false;
  v1::RunExit exit;  // when exited: exit_code, or signal (exit_code -1)
};

// The newest complete checkpoint in the directory holding `checkpoint`
// ("step_" + 8 digits), or `checkpoint` itself when there is none. keeld knows
// the newest checkpoint a worker reported; the trainer may have written later
// ones (and pruned the reported one) before its worker died, and resuming from
// any of them is bit-exact.
std::string NewestCheckpointBeside(const std::string& checkpoint);

class RunSupervisor {
 public:
  // Writes <run_dir>/run.yaml and <run_dir>/lease, and starts
  //   trainer --config <run_dir>/run.yaml --run-dir <run_dir> --quiet --backend cpu|cuda
  //           (no --backend for fake GPUs)
  //           --lease-file <run_dir>/lease --attempt N [--data-root R ...]
  //           [--resume <checkpoint> --resume-fallback]
  //           [--nproc <ranks> [--first-rank F --world W --bootstrap <run_dir>/ranks/bootstrap]]
  //           [--set dist.listen_host=0.0.0.0 --set dist.advertise_host=<advertise>]  (gang, rank 0's part)
  // with stdout and stderr appended to <run_dir>/trainer.log and
  // CUDA_VISIBLE_DEVICES set to the GPUs ("" for a CPU run). The trainer gets
  // SIGTERM when the thread that started it dies, whatever kills the worker.
  static Status Start(const RunLaunch& launch, std::unique_ptr<RunSupervisor>* out);
  ~RunSupervisor();  // kills the process if it still runs (SIGKILL) and reaps it

  // Non-blocking: new complete metrics lines, new checkpoint directories, exit.
  Status Poll(RunProgress* progress);
  // Sends `signal` (SIGTERM: keel-train checkpoints after its step and exits 130).
  Status Signal(int signal);
  // Extends the trainer's lease to `expires_unix_ms` (run_lease.h).
  Status RenewLease(int64_t expires_unix_ms);
  // Hands the trainer a command (trainer.h ProcessCommands: switch_precision,
  // rollback) as <run_dir>/commands/<seq>.json, written atomically.
  Status SendCommand(const std::string& json);

  pid_t pid() const { return pid_; }
  const RunLaunch& launch() const { return launch_; }

 private:
  RunSupervisor() = default;
  Status ReadNewMetrics(RunProgress* progress);
  Status ReadNewEvents(RunProgress* progress);
  Status FindNewCheckpoints(RunProgress* progress);

  RunLaunch launch_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  // Follows a JSON-lines file the trainer appends to: the complete lines added
  // since the last Read; it starts over when the file is replaced (a resumed
  // trainer rewrites metrics.jsonl) or truncated.
  struct LineTail {
    int64_t offset = 0;    // bytes already consumed
    ino_t inode = 0;       // the file those bytes came from
    std::string partial;   // a line still being written
    bool restarted = false;  // the last Read started the file over
    Status Read(const std::string& path, std::vector<std::string>* lines);
  };
  LineTail metrics_tail_, events_tail_;
  std::string last_checkpoint_;  // newest checkpoint directory reported
  int command_seq_ = 0;
};

}  // namespace keel

#endif  // KEEL_WORKER_AGENT_RUN_SUPERVISOR_H_
