// Names of a run's checkpoint directories, one definition for the trainer
// (which writes, prunes and resumes them) and keel-worker (which reports them):
// <run_dir>/checkpoints/step_<8 digits>; one still being written ends in ".tmp"
// and is never listed.
#ifndef KEEL_WORKER_RUN_CHECKPOINT_DIRS_H_
#define KEEL_WORKER_RUN_CHECKPOINT_DIRS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace keel {

// "step_00000100" for step 100.
std::string CheckpointDirName(int64_t step);

// The complete checkpoints under `root` as (step, directory name), ascending by
// step; empty when `root` does not exist.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root);

}  // namespace keel

#endif  // KEEL_WORKER_RUN_CHECKPOINT_DIRS_H_
