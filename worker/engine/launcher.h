// keel-train --nproc N: one process per rank on this host (issue 13).
//
// The launcher starts N copies of keel-train (this very binary) with the
// arguments it was given plus --rank R --world N --bootstrap PATH; rank 0
// publishes its address in PATH (kernels/comm/comm.h) and the others join it.
// On CUDA each rank sees one GPU (CUDA_VISIBLE_DEVICES: the R-th of those the
// launcher sees, or R); so does a CPU rank when the launcher's
// CUDA_VISIBLE_DEVICES is set (keel-worker --fake-gpus). Ranks other than 0 run with --quiet: rank 0 prints the
// run's progress. SIGINT and SIGTERM are passed on to every rank (each stops
// after the same step and rank 0 checkpoints). When a rank fails (exits with a
// status that is neither 0 nor 130, or dies by a signal) the launcher stops the
// others (SIGTERM, then SIGKILL after grace_s) and exits with that rank's
// status (a signal death counts as 1), never leaving a rank behind; a launcher
// that is killed outright takes its ranks along (they get SIGTERM).
#ifndef KEEL_WORKER_ENGINE_LAUNCHER_H_
#define KEEL_WORKER_ENGINE_LAUNCHER_H_

#include <string>
#include <vector>

namespace keel {

struct LaunchOptions {
  int nproc = 1;                   // ranks started here: first_rank .. first_rank + nproc - 1
  int first_rank = 0;
  int world = 0;                   // ranks of the run in all (0: nproc)
  std::string binary;              // the keel-train to start ("/proc/self/exe")
  std::string argv0;               // the ranks' argv[0] (the launcher's own; "": binary)
  std::vector<std::string> args;   // keel-train's arguments, without --nproc
  std::string bootstrap_path;      // removed first when rank 0 is here, so no stale id is read
  bool cuda = false;               // one GPU per rank
  double grace_s = 10;
};

// Runs the ranks to the end; returns the exit status keel-train should exit with.
int LaunchRanks(const LaunchOptions& options);

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_LAUNCHER_H_
