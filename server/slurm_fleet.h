// keeld's Slurm mode (keeld --slurm-sbatch SCRIPT): grows the fleet by
// submitting keel-worker batch jobs while runs wait for room, and leaves their
// end to the workers (keel-worker --exit-when-idle-s), so that a cluster's GPUs
// go back to Slurm when Keel has nothing for them. deploy/slurm/ has the batch
// script; docs/deploy.md, "Slurm cluster", the setup.
//
// The rule, checked every `poll_ms`:
//   - our jobs are the ones squeue lists under `job_name` (pending, running,
//     completing; jobs that ended are gone from the list);
//   - when runs have been QUEUED for at least `queued_for_ms` without a break,
//     no job of ours is pending, and fewer than `max_jobs` of ours exist,
//     submit one job: `sbatch --parsable --job-name=NAME [args...] SCRIPT`;
//   - so at most one job waits in Slurm's queue at a time: a job that starts
//     brings a worker, keeld places what it can there, and only runs that still
//     find no room ask for another.
// sbatch runs with keeld's environment plus KEEL_SERVER (the address workers
// reach keeld at) and, when keeld read its worker token from a file,
// KEEL_WORKER_TOKEN_FILE; Slurm passes them to the job (--export=ALL, its
// default).
#ifndef KEEL_SERVER_SLURM_FLEET_H_
#define KEEL_SERVER_SLURM_FLEET_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

struct SlurmFleetOptions {
  std::string script;                    // the batch script (deploy/slurm/keel-worker.sbatch)
  std::vector<std::string> sbatch_args;  // before the script, e.g. --partition=gpu --gres=gpu:8
  std::string job_name = "keel-worker";  // how squeue tells our jobs apart
  int max_jobs = 4;                      // ours, pending or running, at most
  int64_t queued_for_ms = 3000;          // runs must have waited this long
  int64_t poll_ms = 2000;
  std::string sbatch = "sbatch", squeue = "squeue";
  std::map<std::string, std::string> env;  // added to sbatch's environment
};

// One job of ours as squeue lists it.
struct SlurmJob {
  std::string id;
  std::string state;  // PENDING, RUNNING, CONFIGURING, COMPLETING, ...
};

// Parses `squeue --noheader --format="%i %T"` output: one "ID STATE" a line.
// A line that is not two fields is an error naming it.
Status ParseSqueue(const std::string& text, std::vector<SlurmJob>* out);

// The job id `sbatch --parsable` printed: "ID" or "ID;CLUSTER", digits only.
Status ParseSbatchId(const std::string& text, std::string* id);

// Runs argv (argv[0] looked up on PATH) with `env` added to this process's
// environment; *out gets stdout, *err stderr. Fails when it cannot start, is
// killed, exits non-zero (naming the status and stderr) or runs past timeout_ms.
Status RunCommand(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  int64_t timeout_ms, std::string* out, std::string* err);

class SlurmFleet {
 public:
  explicit SlurmFleet(SlurmFleetOptions options) : options_(std::move(options)) {}

  // Called from keeld's loop with the number of QUEUED runs; acts at most once
  // every poll_ms. Returns the submitted job's id in *submitted ("" if none).
  // Errors of squeue or sbatch are returned (and retried at the next poll).
  Status Tick(int64_t queued_runs, int64_t now_ms, std::string* submitted);

  // Our jobs at the last poll.
  const std::vector<SlurmJob>& jobs() const { return jobs_; }
  int64_t submitted_total() const { return submitted_total_; }

 private:
  SlurmFleetOptions options_;
  std::vector<SlurmJob> jobs_;
  int64_t last_poll_ms_ = -1;
  int64_t queued_since_ms_ = -1;  // -1: nothing queued at the last tick
  int64_t submitted_total_ = 0;
};

}  // namespace keel

#endif  // KEEL_SERVER_SLURM_FLEET_H_
