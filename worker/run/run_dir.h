// The layout of a run directory, one definition for keel-train (which writes
// it) and keel-worker (which writes run.yaml and lease and follows the rest):
//
//   <run_dir>/run.yaml        the run config keel-worker hands the trainer
//   <run_dir>/lease           the trainer's lease (run_lease.h)
//   <run_dir>/trainer.log     the trainer's stdout and stderr under keel-worker
//   <run_dir>/metrics.jsonl   one JSON line per step (docs/train.md)
//   <run_dir>/events.jsonl    one JSON line per event (proto/event_kinds.h)
//   <run_dir>/commands/       command files for the trainer (trainer.h ProcessCommands)
//   <run_dir>/checkpoints/    step_<8 digits>/ (checkpoint_dirs.h)
//   <run_dir>/ranks/bootstrap rank 0's address for the other ranks (kernels/comm/comm.h)
//   <run_dir>/analytics/<step, 8 digits>/<linear>.<role>.svg  outlier block maps
//                             (worker/engine/outlier_maps.h)
#ifndef KEEL_WORKER_RUN_RUN_DIR_H_
#define KEEL_WORKER_RUN_RUN_DIR_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace keel {

class RunDir {
 public:
  explicit RunDir(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }
  std::string config() const { return root_ + "/run.yaml"; }
  std::string lease() const { return root_ + "/lease"; }
  std::string trainer_log() const { return root_ + "/trainer.log"; }
  std::string metrics() const { return root_ + "/metrics.jsonl"; }
  std::string events() const { return root_ + "/events.jsonl"; }
  std::string commands() const { return root_ + "/commands"; }
  std::string checkpoints() const { return root_ + "/checkpoints"; }
  std::string bootstrap() const { return root_ + "/ranks/bootstrap"; }
  std::string analytics(int64_t step) const {
    char name[32];
    std::snprintf(name, sizeof(name), "%08lld", static_cast<long long>(step));
    return root_ + "/analytics/" + name;
  }

 private:
  std::string root_;
};

}  // namespace keel

#endif  // KEEL_WORKER_RUN_RUN_DIR_H_
