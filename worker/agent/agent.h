// keel-worker's agent: registers this host with keeld, keeps one bidirectional
// stream open (heartbeats, metrics, events, checkpoint notices and exits up;
// start / cancel / switch / rollback commands down), starts one keel-train per
// assigned run through RunSupervisor, and reconnects with backoff when keeld
// goes away, re-attaching the runs that kept training meanwhile. Every message
// carries a sequence number and stays queued until keeld acknowledges it (a
// write into a stream whose server just died still "succeeds"); after a
// reconnect the unacknowledged ones go out again (oldest dropped beyond
// `max_pending`). keeld keeps one metric point per step and ignores a stale
// exit, so a message sent twice is harmless.
//
// Fencing: each assignment is an attempt of its run; every message about a run
// carries its attempt. Each trainer has a lease file (run_lease.h) that the
// agent extends only when keeld acknowledges a heartbeat: to the heartbeat's
// send time plus 3/4 of keeld's lease on this worker, so a trainer stops
// stepping before keeld can give its run to another worker. While keeld is
// unreachable (or this worker is paused) trainers therefore wait after at most
// 3/4 of a lease. An event's message also stamps the event with a key
// ("<worker id>#<seq>", Event.key) by which keeld's store keeps it once
// however often it is re-sent, to whichever keeld. When keeld orders a re-register (its lease on this worker ran
// out), the agent registers again and stops, without a checkpoint, the trainers
// of the runs keeld says were taken from it.
//
// Artifacts (artifact_client.h): each new checkpoint of a run is snapshotted
// and, once keeld acknowledged its notice, uploaded to keeld's artifact store.
// An assignment whose checkpoint (Assignment.resume_artifact_step) this host
// has neither in the run's directory nor, newer, beside resume_checkpoint is
// downloaded first, verified, into <work_dir>/runs/<run_id>/checkpoints/, on
// a thread of its own (the stream keeps going); then its trainer starts. A
// download that fails 3 times fails the attempt, with the reason.
#ifndef KEEL_WORKER_AGENT_AGENT_H_
#define KEEL_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"
#include "worker/agent/artifact_client.h"
#include "worker/agent/run_supervisor.h"

namespace keel {

struct AgentOptions {
  // keeld's address, or several separated by commas (ParseServerList): an
  // active keeld and its standbys. The agent stays with the one it reached;
  // when that one cannot be reached or refuses (UNAVAILABLE: a standby) it
  // tries the next at once, and waits a backoff after each full round.
  std::string server = "127.0.0.1:7070";
  std::string token;                      // the worker join token
  std::string tls_ca, tls_cert, tls_key;  // TLS to keeld (proto/channel.h); "" : plaintext
  std::string trainer;                    // keel-train binary
  std::string work_dir = "keel-worker";   // runs/<run_id>/ live here
  std::string host;                       // "" : gethostname()
  // The address other hosts reach this one at: a gang's part with rank 0 listens
  // on every interface and publishes it (dist.advertise_host). "": this host's
  // address on its route to keeld (LocalAddressToward), else `host`.
  std::string advertise;
  std::vector<v1::Device> devices;        // GPUs to offer (empty: CPU slots)
  bool fake_gpus = false;                 // `devices` are FakeGpus(): trainers run their config's backend
  std::vector<std::string> data_roots;    // trainers may read data only inside these (--data-root)
  int cpu_slots = 1;
  int poll_ms = 100;
  int max_backoff_ms = 5000;
  size_t max_pending = 100000;
  bool verbose = true;                    // one line per connect, start, exit on stderr
};

// What the agent is doing, for keel-worker's /metrics (safe from any thread).
struct AgentStats {
  int trainers = 0;                          // keel-train processes running now
  int64_t starts = 0;                        // trainers started
  std::map<std::string, int64_t> exits;      // by outcome: ok, failed, signal, interrupted, diverged
  bool connected = false;                    // stream to keeld open
  int64_t unacknowledged = 0;                // messages not yet acknowledged by keeld
  int64_t unacknowledged_work = 0;           // the same, heartbeats left out (there is nearly always one)
  int64_t checkpoints_uploaded = 0, checkpoint_uploads_failed = 0;
  int64_t checkpoints_downloaded = 0, checkpoint_downloads_failed = 0;  // downloads failed for good
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();

  // Serves until *stop becomes true; then stops accepting work, leaves running
  // trainers alone (they are killed with the agent's supervisors) and returns.
  Status Run(const std::atomic<bool>* stop);

  // For tests and status lines.
  std::string worker_id() const { return worker_id_; }
  // The address now used (one of AgentOptions::server's).
  const std::string& server() const { return servers_[current_server_]; }
  int connects() const { return connects_.load(); }
  AgentStats stats() const;

 private:
  bool Serve(const std::atomic<bool>* stop);  // one connection; false when keeld is unreachable
  void HandleCommand(const v1::WorkerCommand& command);
  // Starts the assignment's trainer, resuming from `resume` ("": fresh).
  void StartRun(const v1::Assignment& a, const std::string& resume);
  // Starts the trainers whose checkpoint finished downloading; fails the
  // attempts whose download failed.
  void PollDownloads();
  // A checkpoint notice keeld acknowledged: its snapshot goes to the uploader.
  void Acknowledged(const v1::WorkerMessage& message);
  void PollRuns();
  void Queue(v1::WorkerMessage message, int64_t attempt = 0);
  // Kills a run's trainer (no checkpoint) and forgets its unsent messages.
  void StopRun(const std::string& run_id, const std::string& why);
  // Extends every trainer's lease to `expires_unix_ms`.
  void RenewLeases(int64_t expires_unix_ms);
  int64_t TrainerLeaseMs() const { return lease_ms_ * 3 / 4; }

  AgentOptions options_;
  std::vector<std::string> servers_;   // options_.server's addresses; never empty
  size_t current_server_ = 0;          // the one Serve uses
  std::string worker_id_;
  std::atomic<int> connects_{0};
  std::map<std::string, std::unique_ptr<RunSupervisor>> runs_;  // by run id; agent thread only
  // Assignments waiting for their checkpoint's download (agent thread only).
  struct Download {
    v1::Assignment assignment;
    std::string dest;                      // the run's checkpoints/step_<8 digits>
    std::unique_ptr<grpc::ClientContext> context;  // of the try in flight (cancel: TryCancel)
    std::mutex mu;                         // guards context between the threads
    std::atomic<bool> done{false}, cancelled{false};
    Status result = Status::Ok();          // once done
    std::thread thread;
  };
  std::map<std::string, std::unique_ptr<Download>> downloads_;  // by run id
  // Ends a download (cancelled) and waits for its thread.
  void EndDownload(Download* d);
  // Snapshots of checkpoints whose notice keeld has not acknowledged yet, by
  // run: (step, snapshot directory); the newest only.
  std::map<std::string, std::pair<int64_t, std::string>> snapshots_;
  std::unique_ptr<CheckpointUploader> uploader_;
  std::shared_ptr<grpc::Channel> channel_;  // the current connection's
  std::map<std::string, int64_t> bootstrap_sent_;  // gangs: the attempt whose rank-0 id went to keeld (runs_ keys)
  std::deque<v1::WorkerMessage> pending_;                        // not yet written; agent thread only
  std::deque<v1::WorkerMessage> unacked_;                        // written, not yet acknowledged
  uint64_t next_seq_ = 1;
  int64_t lease_ms_ = 10000;  // keeld's lease on this worker (RegisterResponse)
  mutable std::mutex stats_mu_;  // guards stats_
  AgentStats stats_;
  void PublishStats(bool connected);
};

// The CUDA devices this process can see (empty without CUDA or GPUs).
std::vector<v1::Device> DetectGpus();

// Keeps of *devices only those whose indices `list` names ("0,1": keel-worker
// --gpus). An index twice, one that is not a number, or one *devices does not
// hold is an error naming the value and the indices there are; *devices is
// then unchanged.
Status SelectGpus(const std::string& list, std::vector<v1::Device>* devices);

// The memory a fake GPU reports: 80 GiB, an H100's, so fractional runs
// (resources.gpus below 1) are packed and memory-checked as on a real one.
constexpr int64_t kFakeGpuMemoryBytes = int64_t{80} << 30;

// `count` GPUs that do not exist (keel-worker --fake-gpus, for tests and
// demos): indices 0 .. count-1, named "fake GPU", kFakeGpuMemoryBytes each.
std::vector<v1::Device> FakeGpus(int count);

// Memory in use and total per GPU (NVML order), for /metrics; empty without NVML.
struct GpuMemory {
  int index = 0;
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
};
std::vector<GpuMemory> GpuMemoryInUse();

}  // namespace keel

#endif  // KEEL_WORKER_AGENT_AGENT_H_
