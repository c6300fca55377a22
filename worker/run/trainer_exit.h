// keel-train's exit statuses: part of the run protocol, since keel-worker
// reports them and keeld decides on them (restart, fail at once, diverged).
#ifndef KEEL_WORKER_RUN_TRAINER_EXIT_H_
#define KEEL_WORKER_RUN_TRAINER_EXIT_H_

namespace keel {
namespace trainer_exit {

constexpr int kDone = 0;          // trained every step
constexpr int kFailed = 1;        // training failed (I/O, CUDA, a corrupt checkpoint ...)
constexpr int kBadConfig = 2;     // bad usage or config: no restart can fix it
constexpr int kDiverged = 3;      // the stability policy stopped the run as diverged
constexpr int kSuperseded = 4;    // the lease names another attempt (fencing)
constexpr int kInterrupted = 130; // SIGINT/SIGTERM: checkpointed after the step in progress

// Whether a trainer that exited with `code` ended as its run did (done,
// interrupted, diverged: every rank of a run ends so together), not failed.
inline bool EndedAsRun(int code) { return code == kDone || code == kInterrupted || code == kDiverged; }

// How keel-train --nproc (the launcher) ends its line when a rank failed:
// "keel-train: rank R exited with status S; stopping the other ranks" (or
// "died of signal N"). That rank's own line, "keel-train: rank R: <why>",
// comes before it in the same output; keel-worker reports both.
constexpr char kStoppingOtherRanks[] = "; stopping the other ranks";

}  // namespace trainer_exit
}  // namespace keel

#endif  // KEEL_WORKER_RUN_TRAINER_EXIT_H_
