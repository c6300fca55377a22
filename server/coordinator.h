// keeld's logic, apart from gRPC: sweeps in, runs scheduled onto workers,
// worker messages applied, leases, restarts, recovery, and the live update
// feed behind WatchRun / WatchSweep. service.cc maps RPCs onto these methods
// (validate, call, map errors), so all of this is testable without a server.
//
// Concurrency: one mutex (mu_) guards every member and is held across each
// public call, so a state change and its store write are one step that nobody
// observes half done. Every state change is committed to the store before the
// call returns (before the RPC is acknowledged). Commands to a worker are
// written to its stream while mu_ is held; the worker's agent always has a
// reader waiting, so a write never waits on keeld.
//
// Run states: QUEUED -> ASSIGNED (a worker got the assignment) -> RUNNING
// (its trainer started) -> SUCCEEDED (exit 0) | FAILED | CANCELLED. A trainer
// that fails, or a worker whose lease runs out, sends the run back to QUEUED
// with restarts + 1 and its newest checkpoint as the resume point, up to the
// sweep's max_restarts; then FAILED. A failed trainer's run waits out a backoff
// first; a configuration error (exit 2) or the same failure at the same step
// twice in a row fails the run at once.
//
// Fencing: every assignment is a new attempt (Run.attempt + 1). Worker messages
// carry their attempt and only the run's current attempt is applied; a worker
// whose lease ran out has its stream closed (after a Reregister order) and, when
// it registers again, is told to stop the trainers of runs taken from it. So a
// run has at most one attempt whose messages count, and a paused worker cannot
// wedge: it comes back as a new stream.
#ifndef KEEL_SERVER_COORDINATOR_H_
#define KEEL_SERVER_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"
#include "server/artifact_store.h"
#include "server/store.h"
#include "server/sweep.h"
#include "worker/run/step_metrics.h"

namespace keel {

struct CoordinatorOptions {
  int64_t heartbeat_interval_ms = 1000;
  int64_t lease_ms = 10000;      // a worker silent this long is gone
  // A run whose trainer failed waits restart_backoff_ms before its first
  // restart, twice as long before each further one, at most max_restart_backoff_ms.
  int64_t restart_backoff_ms = 1000;
  int64_t max_restart_backoff_ms = 60000;
  SweepLimits limits;
  std::function<int64_t()> now_ms;  // wall clock unless a test sets one
  // keeld's artifact store (uploaded checkpoints); null: none, and uploads
  // and downloads are refused. Must outlive the Coordinator.
  ArtifactStore* artifacts = nullptr;
};

// A WatchRun / WatchSweep subscriber's queue of updates.
class Subscription {
 public:
  // Waits up to timeout_ms for updates; false when closed and drained.
  bool Next(int timeout_ms, std::vector<v1::WatchUpdate>* out);
  void Push(const v1::WatchUpdate& update);
  void Close();

 private:
  std::mutex mu_;  // guards updates_ and closed_
  std::condition_variable cv_;
  std::deque<v1::WatchUpdate> updates_;
  bool closed_ = false;
};

// One run as the Prometheus exporter shows it.
struct RunGauges {
  std::string run, sweep, precision, worker, state;
  int64_t step = 0;
  int32_t restarts = 0;
  int32_t ranks = 1, workers = 1;  // data-parallel ranks, and the workers they span (a gang: > 1)
  int32_t gpus = 0;                // GPUs it holds now, over all its workers
  bool has_metric = false;  // the values below come from its latest metric point
  double loss = 0, grad_norm = 0, tokens_per_s = 0;
  bool has_probe = false;
  double cosine = 0, zeta = 0;                // its latest gradient-bias probe
  bool has_saturation = false;
  double saturated = 0;                       // the largest saturated fraction over operands
  // Data-parallel runs, by rank: step time, time in collectives, and the part of
  // it the rank waited for (not overlapped with its backward).
  std::vector<double> rank_step_seconds, rank_comm_seconds, rank_comm_exposed_seconds;
  // Outlier analytics from the run's latest metric line that had them (they
  // come every analytics_every steps): per layer and role.
  std::vector<OutlierValue> outliers;
  std::map<std::pair<std::string, std::string>, int64_t> interventions;  // (action, rule) -> count
  int64_t ended_unix_ms = 0;                  // 0 while not terminal
};

// Counters for the Prometheus exporter.
struct CoordinatorStats {
  std::map<std::string, int64_t> runs_by_state;  // RunState name -> count
  int64_t sweeps = 0;
  int64_t workers_connected = 0;
  int64_t metric_points = 0;                     // ingested since start
  int64_t restarts = 0;                          // since start
  // Interventions the trainers reported since start, by kind (switch_precision,
  // rollback, scale_lr, skip_step, stop).
  std::map<std::string, int64_t> interventions;
  // Worker messages refused since start, by reason: "attempt" (about a run
  // attempt that is no longer the run's current one: fencing) or "lease" (on a
  // stream keeld stopped counting as the worker's, after its lease ran out).
  std::map<std::string, int64_t> stale_messages;
  int64_t metric_gaps = 0;                       // runs of steps that never arrived, since start
  int64_t metric_points_missing = 0;             // steps in those gaps
  // Failed writes of metric points to the store since start; the points stay
  // buffered (and unacknowledged) until a write succeeds.
  int64_t store_write_errors = 0;
  int64_t metric_points_unstored = 0;            // buffered after a failed write, now
  int64_t queue_depth = 0;                       // runs QUEUED
  int64_t workers_total = 0;
  int64_t gpus_total = 0, gpus_busy = 0;         // over connected workers
  std::vector<RunGauges> runs;                   // every run not ended more than retention ago
};

// Paging of the listings (keel.proto, "Paging"): the page_size used when a
// request gives 0, the largest honoured (larger ones are clamped), and the
// serialized bytes after which a page ends early (at least one item a page),
// so that a response stays well under gRPC's 4 MB default message limit.
constexpr int kDefaultRunsPage = 1000;      // runs and sweeps
constexpr int kMaxRunsPage = 5000;
constexpr int kDefaultEventsPage = 5000;
constexpr int kMaxEventsPage = 20000;
constexpr int kDefaultPointsPage = 10000;
constexpr int kMaxPointsPage = 50000;
constexpr int64_t kPageBytes = 2 << 20;

class Coordinator {
 public:
  // Loads everything from the store. Runs that were assigned or running when
  // keeld stopped stay with their worker for one lease, waiting for it to
  // reconnect and re-attach them; then they are requeued.
  static Status Open(std::unique_ptr<Store> store, CoordinatorOptions options,
                     std::unique_ptr<Coordinator>* out);
  ~Coordinator();

  // ---- Users (grpc::Status codes are the RPCs' answers) ----
  grpc::Status SubmitSweep(const v1::SweepSpec& spec, v1::SubmitSweepResponse* out);
  grpc::Status GetSweep(const std::string& id, v1::Sweep* out);
  // The listings return one page each (see kDefaultRunsPage); a bad
  // page_size or page_token is INVALID_ARGUMENT. GetMetrics and ListEvents
  // read the store without holding mu_ (the store is thread-safe and they
  // change nothing), so a long read does not stall workers and the Tick.
  grpc::Status ListSweeps(const v1::ListSweepsRequest& request, v1::ListSweepsResponse* out);
  // Cancels every queued run of the sweep in one store transaction (and their
  // events in a second), and tells workers to stop the active ones.
  grpc::Status CancelSweep(const std::string& id, v1::Sweep* out);
  grpc::Status ListRuns(const v1::ListRunsRequest& request, v1::ListRunsResponse* out);
  grpc::Status GetRun(const std::string& id, v1::Run* out);
  grpc::Status CancelRun(const std::string& id, v1::Run* out);
  grpc::Status GetMetrics(const v1::GetMetricsRequest& request, v1::GetMetricsResponse* out);
  grpc::Status ListEvents(const v1::ListEventsRequest& request, v1::ListEventsResponse* out);
  grpc::Status Intervene(const v1::InterveneRequest& request, v1::InterveneResponse* out);
  grpc::Status ListWorkers(v1::ListWorkersResponse* out);
  // Subscribes to a run or a sweep (whichever `id` names); the first updates
  // are the current runs. NOT_FOUND when it names neither.
  grpc::Status Watch(const std::string& id, std::shared_ptr<Subscription>* out);
  void Unwatch(const std::shared_ptr<Subscription>& subscription);

  // ---- Workers ----
  grpc::Status RegisterWorker(const v1::RegisterRequest& request, v1::RegisterResponse* out);
  // The worker's stream is open: `send` writes one command to it (false when
  // the stream is broken); `close` ends the stream from keeld's side (the
  // worker's reads end), called at most once, with mu_ held. Returns NOT_FOUND
  // for an unregistered worker id. *stream_id identifies this stream for
  // DetachWorker and HandleWorkerMessage, so that an old stream ending after the
  // worker reconnected does not detach the new one.
  grpc::Status AttachWorker(const std::string& worker_id, std::function<bool(const v1::WorkerCommand&)> send,
                            std::function<void()> close, uint64_t* stream_id);
  void DetachWorker(const std::string& worker_id, uint64_t stream_id);
  // What became of a worker's message (HandleWorkerMessage).
  enum class MessageResult {
    // Applied, or ignored as a re-send or a stale attempt's.
    kApplied,
    // The stream is no longer the worker's (its lease ran out, or a newer
    // stream replaced it): the message was refused and counted; the caller
    // sends a Reregister order and ends the stream.
    kNotTheWorkers,
    // A store write it needed failed (logged, counted in store_write_errors):
    // nothing of it changed. The caller acknowledges nothing more on this
    // stream and ends it; the worker reconnects and re-sends the message with
    // everything after it.
    kNotStored,
  };
  // Applies one message from the worker's stream `stream_id`.
  MessageResult HandleWorkerMessage(const std::string& worker_id, uint64_t stream_id, const v1::WorkerMessage& message);

  // Whether every metric point received so far is in the store: false after a
  // failed write until a later flush succeeds. The worker stream acknowledges
  // messages only while it is true, so the worker keeps what the store lacks.
  bool MetricsStored();

  // ---- Artifacts (docs/service.md, "Artifacts"; null options.artifacts: FAILED_PRECONDITION) ----
  ArtifactStore* artifacts() const { return options_.artifacts; }
  // Whether worker_id may upload the checkpoint `header` describes: the run
  // exists and header.attempt is its current attempt, on this worker (the run
  // may have ended since: its final checkpoint still counts).
  grpc::Status CheckUpload(const std::string& worker_id, const v1::CheckpointHeader& header);
  // The upload of `header` is committed in the store. It becomes the run's
  // artifact_step (*recorded) when CheckUpload still holds, no rollback
  // reported after its CheckpointNotice (header.notice_seq) has been applied
  // (it would be an abandoned trajectory's), and it is not older than the one
  // recorded. *protect: the run's artifact_step, which retention must keep.
  grpc::Status CheckpointUploaded(const std::string& worker_id, const v1::CheckpointHeader& header, bool* recorded,
                                  int64_t* protect);
  // A stored checkpoint of a run keeld knows (step 0: the newest): its
  // manifest (artifacts()->Send streams it). NOT_FOUND names the run, the
  // step and what exists.
  grpc::Status FindArtifact(const std::string& run_id, int64_t step, v1::CheckpointHeader* header);

  // Lease expiry, run progress saving and scheduling; keeld calls it every ~100 ms.
  void Tick();

  // retention_ms: runs that ended longer ago than this are left out of runs.
  CoordinatorStats Stats(int64_t retention_ms = 600000);

 private:
  struct WorkerState {
    v1::Worker record;
    std::function<bool(const v1::WorkerCommand&)> send;  // empty while no stream
    std::function<void()> close;                         // ends that stream (see AttachWorker)
    uint64_t stream_id = 0;                              // of the attached stream
    int64_t lease_expires_ms = 0;
  };

  explicit Coordinator(std::unique_ptr<Store> store, CoordinatorOptions options);
  int64_t Now() const;
  Status Load();
  Status SaveRun(v1::Run* run, const std::string& event_kind, const std::string& message);
  // SaveRun for many runs: one UpdateRuns and one AppendEvents transaction.
  Status SaveRuns(std::vector<v1::Run>* runs, const std::string& event_kind, const std::string& message);
  // Files a run of runs_ under its sweep in sweep_runs_ (Load, SubmitSweep).
  void IndexRun(v1::Run* run);
  // The sweep with runs_total and runs_by_state counted from its runs.
  v1::Sweep SweepWithCounts(const v1::Sweep& sweep);
  void Publish(const v1::WatchUpdate& update, const std::string& run_id, const std::string& sweep_id);
  void Schedule();
  void SaveProgress();
  // Writes the buffered points; on a store error they stay buffered for the
  // next flush (nothing acknowledged is lost; MetricsStored says when).
  void FlushMetrics();
  // Sends the run back to the queue (restarts + 1, after a backoff) or, with
  // no restarts left or when `deterministic`, ends it FAILED.
  Status RequeueOrFail(v1::Run* run, const std::string& why, bool deterministic = false);
  // The command to the worker's stream, when it has one; false when not sent.
  bool SendToWorker(const std::string& worker_id, const v1::WorkerCommand& command);
  // A cancel to every worker holding the run (a gang: every part's, rank 0's
  // included) but `except_worker`. After a requeue, their exits belong to an
  // attempt no longer current and are ignored.
  void CancelOnWorkers(const v1::Run& run, const std::string& except_worker);
  // Tells a worker its stream no longer counts (Reregister) and closes it.
  void DropWorkerStream(WorkerState* worker, const std::string& why);
  // A metric point of the run's current attempt: stored (buffered), and a jump
  // past the next expected step is reported as a gap (event + counters).
  void AcceptMetric(v1::Run* run, const v1::MetricPoint& point);
  void ReportGap(const v1::Run& run, int64_t first, int64_t last, const std::string& why);
  // A queued run ends CANCELLED now; an active one is told to stop.
  Status Cancel(v1::Run run);
  void ReleaseWorkerRuns(const std::string& worker_id, const std::set<std::string>& keep, const std::string& why);
  void FinishSweepIfDone(const std::string& sweep_id);
  // The sweep policy's sweep_rules (policy.h SweepRule), after a run diverged.
  void ApplySweepRules(const std::string& sweep_id);
  grpc::Status FromStatus(const Status& status) const;
  std::string NewId(const std::string& prefix);

  std::mutex mu_;  // guards everything below (see the file comment)
  std::unique_ptr<Store> store_;
  CoordinatorOptions options_;
  std::map<std::string, v1::Run> runs_;             // every run, by id
  std::map<std::string, v1::Sweep> sweeps_;         // every sweep, by id
  // The listing order: sweeps by creation (the number in their id, then the
  // id), and each sweep's runs by index. Pointers into runs_ stay valid: a
  // std::map node never moves and runs are never erased. A sweep's runs are
  // all created with it, so its vector never grows after SubmitSweep.
  std::set<std::pair<uint64_t, std::string>> sweep_order_;
  std::map<std::string, std::vector<v1::Run*>> sweep_runs_;
  std::map<std::string, WorkerState> workers_;      // by id
  // Metric points received but not yet committed: flushed in one transaction
  // when 512 gather, before any other worker message is handled (so a
  // heartbeat's acknowledgement covers them), before metrics are read, and on
  // every Tick.
  std::vector<v1::MetricPoint> metric_buffer_;
  std::set<std::string> progress_dirty_;            // runs whose step/loss changed since saved
  int64_t progress_saved_ms_ = 0;
  std::vector<std::pair<std::string, std::shared_ptr<Subscription>>> subscribers_;  // (id, queue)
  CoordinatorStats counters_;
  uint64_t id_counter_ = 0;
  uint64_t stream_counter_ = 0;
  std::set<std::string> sweep_rules_applied_;       // "sweep#rule" already acted on
  struct Live {                                     // a run's latest values, for Stats
    std::string metric_json;                        // its latest metrics.jsonl line
    bool parsed = false;                            // gauges below are from metric_json
    RunGauges gauges;                               // its metric values (has_metric ... saturated), parsed once per line
    std::string analytics_json;                     // its latest line with outlier analytics
    bool analytics_parsed = false;                  // outliers below are from analytics_json
    std::vector<OutlierValue> outliers;
    std::map<std::pair<std::string, std::string>, int64_t> interventions;
    int64_t ended_unix_ms = 0;
    int64_t last_step = -1;                         // newest step received (-1: not known yet)
    // The seq of the newest rollback event applied (its worker's numbering):
    // checkpoints reported before it are an abandoned trajectory's.
    uint64_t rollback_seq = 0;
  };
  std::map<std::string, Live> live_;
  // Gangs: the bootstrap id rank 0's worker sent, by run, with the attempt it
  // belongs to; sent again to a part's worker whose stream reconnects. Dropped
  // when the run stops being active (SaveRun).
  std::map<std::string, std::pair<int64_t, std::string>> bootstrap_ids_;
};

}  // namespace keel

#endif  // KEEL_SERVER_COORDINATOR_H_
