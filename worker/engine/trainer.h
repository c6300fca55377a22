// The training loop of keel-train: one run's model, data, optimizer, precision
// scheme, metrics and checkpoints on one backend.
//
// Ranks (data parallel, issue 13): with a communicator of N ranks (SetCommunicator),
// each rank runs this loop on its slice of the global batch: global micro-batch j
// of a step (0 <= j < grad_accum * N) goes to rank j / grad_accum, so N ranks see
// the data and random draws a 1-rank run with grad_accum * N sees. Gradients,
// losses, operand counters and the probe's gradients are summed over the ranks
// before anything reads them, so every rank computes the same metrics, takes the
// same policy decisions and holds the same weights (compared by hash every
// check_every steps). Rank 0 alone reads commands and checkpoints and writes
// metrics.jsonl, events.jsonl and checkpoints; it sends what it read to the others.
//
// Determinism: every random draw (initial weights, proxy data, stochastic
// rounding) is a function of (config.seed, step, micro-step), and every kernel is
// deterministic, so the same config on the same backend gives the same loss
// curve, and a run resumed from a checkpoint continues bit for bit.
#ifndef KEEL_WORKER_ENGINE_TRAINER_H_
#define KEEL_WORKER_ENGINE_TRAINER_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/comm/comm.h"
#include "kernels/nn.h"
#include "kernels/base/status.h"
#include "worker/io/token_loader.h"
#include "worker/engine/grad_buckets.h"
#include "worker/engine/model.h"
#include "worker/engine/step_phases.h"
#include "worker/config/run_config.h"
#include "worker/stability/detectors.h"
#include "worker/stability/policy.h"
#include "worker/config/scheme.h"
#include "worker/run/step_metrics.h"

namespace keel {

struct Tensor;  // worker/io/safetensors.h

using MetricsCallback = std::function<void(const StepMetrics&)>;

class Trainer {
 public:
  // Builds the backend, model and data, initialises the weights.
  static Status Create(const RunConfig& config, std::unique_ptr<Trainer>* out);
  ~Trainer();

  // Makes this trainer one rank of `comm` (before Resume or Train). Without one
  // the run has a single rank. With optimizer.shard (ZeRO-1) this rank then
  // keeps the Adam moments of its 1/N of the parameters only. Otherwise, with
  // dist.bucket_mb > 0, the gradient is all-reduced in buckets started during
  // the last micro-batch's backward (grad_buckets.h); with 0 (or ZeRO-1) in
  // one collective after the backward. The communicator
  // must work on this trainer's backend memory (CPU backend: TcpComm; CUDA:
  // NcclCommunicator on backend()->NativeStream()); it is destroyed before the
  // backend.
  Status SetCommunicator(std::unique_ptr<Communicator> comm);
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int ranks() const { return comm_ ? comm_->size() : 1; }
  // Micro-batches per optimizer step on this rank: config.grad_accum, or after
  // resuming a checkpoint written with another rank count, what keeps that
  // checkpoint's global batch.
  int grad_accum() const { return accum_; }
  // Whether this rank keeps only its shard of the Adam moments (ZeRO-1).
  bool sharded() const { return shard_; }

  // One optimizer step (grad_accum micro-batches, clip, update); fills *metrics.
  Status Step(StepMetrics* metrics);

  // Steps until config.steps, writing metrics.jsonl in the run directory, calling
  // `callback` after each step, checkpointing every checkpoint_every steps and at
  // the end. progress: a status line on stderr every log_every steps.
  Status Train(const MetricsCallback& callback, bool progress);

  // Asks Train to stop after the step in progress: it writes a checkpoint and
  // returns Ok with step() < config.steps. Safe from another thread or a signal
  // handler (it only sets an atomic flag).
  void RequestStop() { stop_requested_.store(true); }
  bool stop_requested() const { return stop_requested_.load(); }
  // Whether Train ended on a stop the ranks agreed on (their vote after a step,
  // or rank 0's while it waited for the lease). The same on every rank, unlike
  // stop_requested(), which a signal may set on one rank at any moment.
  bool stopped() const { return stopped_; }

  // Switches the precision scheme; the next step uses it. Weights, optimizer
  // state and data position are untouched.
  Status SwitchScheme(const PrecisionScheme& scheme);
  const PrecisionScheme& scheme() const { return scheme_; }

  // Rolls back at least `steps` steps: resumes from the newest policy snapshot
  // in memory, else checkpoint of this run, at or before step() - steps
  // (weights, optimizer, data, scheme) and drops metrics.jsonl's later lines
  // and the snapshots and checkpoints after the restored one (the abandoned
  // trajectory's, which a restart must not resume). The policy engine keeps
  // its state (what it learnt from the blow-up that caused the rollback, and
  // the steps taken): a snapshot's is older. *restored names the checkpoint
  // directory, or "memory snapshot of step N". With `or_oldest` (the policy's
  // rollbacks), a target older than every state kept returns to the oldest one
  // instead of failing: a rule firing again soon after a rollback finds the
  // ring holding nothing older than the step that rollback restored.
  Status Rollback(int64_t steps, std::string* restored, bool or_oldest = false);

  // Commands from outside (keel-worker, for keeld's Intervene), read before each
  // step in Train: files <run_dir>/commands/*.json (written elsewhere as *.tmp
  // and renamed), applied in name order and deleted:
  //   {"kind": "switch_precision", "precision": "bf16", "reason": "..."}
  //   {"kind": "rollback", "steps": 400, "precision": "bf16", "reason": "..."}
  // (a rollback may also switch). What happened goes to <run_dir>/events.jsonl,
  // one JSON object per line: {"step", "kind" (switch_precision | rollback |
  // command_failed), "message", "details": {...}}.
  Status ProcessCommands();
  // The stability policy's decisions for the step just taken (config.policy):
  // switch, rollback, scale_lr, skip_step (already applied) and stop, each an
  // event in events.jsonl with the rule and the detector values behind it; an
  // `escalate` event first when the engine escalated instead of replaying a
  // rule (policy.h), and probation's return one rung down after them. A
  // policy rollback keeps the running scheme and learning-rate scale.
  Status ApplyPolicy();
  // Where the policy's snapshots live, for keel-train's policy line: "in memory
  // (K kept, M MiB each)" or "on disk (...)"; empty without a policy.
  const std::string& snapshot_placement() const { return snapshot_placement_; }
  // The policy's snapshot of this step into its memory ring, as Train takes one
  // every policy.snapshot_every steps (train_bench --snapshots times it). An
  // error when the run's snapshots are on disk or it has no policy.
  Status TakeSnapshot();
  // For tests: what MemAvailable says, in MiB, when the ring would grow
  // (HostHasRoomForSnapshot); by default /proc/meminfo's.
  void SetHostAvailableMib(std::function<int64_t()> probe) { host_available_mib_ = std::move(probe); }
  // True once a policy's stop action ended the run (keel-train exits 3).
  bool diverged() const { return diverged_; }
  Status RecordEvent(const std::string& kind, const std::string& message,
                     const std::vector<std::pair<std::string, std::string>>& details);
  // SwitchScheme / Rollback plus their event: "switched precision from A to B"
  // or "rolled back from step S to T", then `suffix`; `details` get from and
  // precision, or from_step, to_step and checkpoint. A failed Rollback records
  // nothing and returns its error.
  // A switch the policy makes (a rule's, probation's): SwitchAndRecord, and
  // the learning rate's re-warm (policy.rewarm_steps) from the next step.
  Status PolicySwitch(const PrecisionScheme& scheme, const std::string& suffix,
                      std::vector<std::pair<std::string, std::string>> details);
  Status SwitchAndRecord(const PrecisionScheme& scheme, const std::string& suffix,
                         std::vector<std::pair<std::string, std::string>> details);
  Status RollbackAndRecord(int64_t steps, const std::string& suffix,
                           std::vector<std::pair<std::string, std::string>> details, bool or_oldest = false);

  // Checkpoint: <run_dir>/checkpoints/step_<8 digits>/{model,optimizer}.safetensors;
  // under a policy, optimizer.safetensors' metadata also holds the policy
  // engine's state (policy.h PolicyState) with its own CRC-32.
  Status SaveCheckpoint(std::string* dir);
  // Restores weights, optimizer state, step, scheme, data position and the
  // policy's state (empty from a checkpoint without one) from a checkpoint
  // directory, or from the newest one of this run when dir == "latest".
  // Everything is verified (CRCs, shapes, metadata, the policy state's fields)
  // before anything changes.
  Status Resume(const std::string& dir);
  // Resume, falling back: when `dir` does not verify, the newest older
  // checkpoint beside it that does is used ("latest": this run's newest that
  // verifies). Each checkpoint skipped is a "checkpoint_skipped" event naming it
  // and why. *resumed names the one used. Fails, listing every reason, when none
  // verifies.
  Status ResumeNewestValid(const std::string& dir, std::string* resumed);

  // Fencing under keel-worker (run_lease.h): before each step Train reads the
  // lease file (at most every 100 ms, and whenever the deadline it last read
  // has passed); it waits (no step,
  // no checkpoint) while the lease is expired, and stops without a checkpoint
  // when the file names another attempt (superseded() is then true and Train
  // returns an error). An empty path disables the lease (standalone runs).
  void SetLease(const std::string& path, int64_t attempt);
  bool superseded() const { return superseded_; }

  int64_t step() const { return step_; }
  const RunConfig& config() const { return config_; }
  Model* model() const { return model_.get(); }
  Backend* backend() const { return backend_.get(); }
  // The learning rate the schedule gives for optimizer step `step` (0-based).
  double LearningRate(int64_t step) const;

 private:
  Trainer() = default;
  // Create's parts.
  Status OpenData();
  Status AllocateState();
  void StartPolicy();
  // Global micro-batch `micro` of this step: *batch when keep, else only the
  // data position moves past it (another rank's).
  Status NextBatch(int64_t micro, bool keep, Batch* batch);
  bool leader() const { return rank() == 0; }
  // Ranks: the sum over ranks of a host value, and rank 0's text (or status)
  // on every rank. Single rank: the value itself.
  Status SumOverRanks(double mine, double* total);
  Status SumOverRanks(std::vector<double>* values);  // element by element
  // Every rank's step time and collective time of this step into *m (ranks).
  Status GatherRankTimes(StepMetrics* m);
  // ZeRO-1: [*lo, *hi), the elements of parameter `p` (flat offsets) in this
  // rank's shard; false when there are none.
  bool ShardRange(const ParamInfo& p, int64_t* lo, int64_t* hi) const;
  // ZeRO-1: that part as a span of shard-local memory at base (empty when none).
  Span ShardPart(const ParamInfo& p, const float* base) const;
  // ZeRO-1: every rank's shard of `shard` (per_ floats each) into `full`
  // (param_count floats), through gather_.
  Status GatherShards(const float* shard, float* full);
  Status FromLeader(std::string* text);
  Status ShareLeaderStatus(const Status& leader_status);
  // Every check_every steps: ranks compare a hash of weights and Adam moments;
  // a difference is a rank_mismatch event and fails the run.
  Status CheckRanksAgree();
  // The commands of this step: rank 0 reads (and deletes) the command files,
  // every rank applies them. Their names and texts, in name order.
  Status ReadCommandFiles(std::vector<std::pair<std::string, std::string>>* commands);
  Status ApplyCommand(const std::string& name, const std::string& text);
  // Step's phases, in the order Step calls them; each fills its part of *m.
  Status ForwardBackward(std::vector<Batch>* kept, StepMetrics* m);
  Status CollectOperandStats(StepMetrics* m);
  // Outlier analytics (kernels/outliers.h) on the steps config.analytics_every
  // names, rank 0 only: armed before the micro-batches, read after them into
  // m->outliers (with the hot-set overlap against the previous analytics step)
  // and, every analytics.maps_every steps, the block maps under the run directory.
  bool AnalyticsStep() const;
  bool MapsStep() const;
  Status CollectOutlierAnalytics(StepMetrics* m);
  Status MeasureGradients(StepMetrics* m, GroupSums* weight_squares);
  Status RunProbe(const std::vector<Batch>& batches, StepMetrics* m);
  Status CollectLayerNormGains(StepMetrics* m);
  bool RunStabilityController(const StepMetrics& m);
  Status OptimizerStep(bool skip_update, StepMetrics* m);
  Status MeasureUpdate(const GroupSums& weight_squares, StepMetrics* m);
  Status MaybeEvaluate(StepMetrics* m);
  bool OperandStatsOn() const;  // operand counters this step (config and a quantized scheme)
  Status Evaluate(double* loss);
  Status OpenMetricsFile();
  // Train's parts: the metrics line (stamped with the time and attempt), the
  // progress line, the periodic and the final checkpoint.
  void WriteMetricsLine(StepMetrics* m);
  void PrintProgress(const StepMetrics& m, std::chrono::steady_clock::time_point start, int64_t first) const;
  Status MaybeCheckpoint();
  // The policy's snapshot of this step into the memory ring (StartPolicy chose
  // memory), every policy.snapshot_every steps.
  Status MaybeSnapshot();
  // Whether the host has room for one more memory snapshot (see the .cc);
  // when it has not, the ring stops growing.
  bool HostHasRoomForSnapshot();
  // What a checkpoint or snapshot holds of the model: the detectors' state kept
  // for a rollback to this step (every rank), then the weights and both Adam
  // moments whole (ZeRO-1: gathered, every rank taking part) in host vectors on
  // rank 0 (the others' stay as they are).
  Status CaptureState(std::vector<float>* weights, std::vector<float>* m, std::vector<float>* v);
  Status FinishTraining(bool progress);
  // One action of a policy decision (ApplyPolicy), with its event.
  Status ApplyAction(const PolicyAction& action, const DecisionEvidence& evidence);
  // policy.probation's return one rung down, with its event (after ApplyPolicy's decisions).
  Status ApplyProbation();
  // A ladder rung's scheme: the run's starting one when the name is its name, else the preset.
  Status SchemeForRung(const std::string& name, PrecisionScheme* out) const;
  // Checkpoints: the metadata written, and reading one back verified.
  struct LoadedCheckpoint;
  Status StateScalars(LoadedCheckpoint* c) const;
  std::map<std::string, std::string> CheckpointMeta(const LoadedCheckpoint& c) const;
  Status ReadCheckpoint(const std::string& dir, LoadedCheckpoint* out) const;
  // Resume's collective part: `read` is rank 0's verdict on reading `dir` into
  // *loaded (rank 0 only); when it is ok every rank takes rank 0's state
  // (scalars by host gather, weights and moments by broadcast).
  // restore_policy: whether the policy engine takes the checkpoint's state
  // (a resume) or keeps its own (a rollback: see Rollback).
  Status ApplyCheckpoint(const std::string& dir, const Status& read, bool restore_policy, LoadedCheckpoint* loaded);
  // Resume, with or without the policy's state.
  Status ResumeCheckpoint(const std::string& dir, bool restore_policy);
  Status GatherCheckpointTensors(const std::string& dir, const std::vector<Tensor>& weights,
                                 const std::vector<Tensor>& optimizer, LoadedCheckpoint* out) const;
  // Ok when the next step may run (see SetLease); waits while the lease is expired.
  Status AwaitLease();

  RunConfig config_;
  PrecisionScheme scheme_;
  std::unique_ptr<Communicator> comm_;  // null: one rank
  // This step's time in the gradient and weight collectives (the collectives'
  // own durations: bucketed all-reduces as measured where they ran, the others
  // as wall time around the call), and the part of it the trainer waited for
  // after its backward had finished (1 - exposed / comm: the overlap).
  double comm_seconds_ = 0, comm_exposed_seconds_ = 0;
  std::unique_ptr<GradBuckets> buckets_;  // null: one reduction after the backward
  int accum_ = 1;                       // micro-batches per step on this rank
  // ZeRO-1 (optimizer.shard with ranks): rank r owns parameters
  // [r * shard_per_, (r + 1) * shard_per_) clipped to param_count; grads_ is
  // padded to ranks * shard_per_ for the reduce-scatter, shard_grads_ holds the
  // summed gradient of the shard, adam_m_ / adam_v_ hold the shard's moments.
  bool shard_ = false;
  int64_t shard_per_ = 0, shard_begin_ = 0, shard_end_ = 0;
  float* shard_grads_ = nullptr;
  float* gather_ = nullptr;  // ranks * shard_per_ floats
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<std::string> param_groups_;  // ParamGroup of each of model_'s parameters
  std::unique_ptr<TokenLoader> train_loader_;
  std::unique_ptr<TokenLoader> val_loader_;
  float* grads_ = nullptr;
  float* adam_m_ = nullptr;
  float* adam_v_ = nullptr;
  float* probe_grads_ = nullptr;
  float* previous_ = nullptr;  // ZeRO-1 only: weights before the update (update ratio)
  std::vector<double> delta_squares_;  // per parameter tensor: sum of (w_old - w_new)^2 of the last update
  float* gains_ = nullptr;     // the layernorm gains side by side, read back in one copy
  // The previous analytics step's hot channels, per slot and role (empty: none
  // yet). Not in checkpoints: after a resume the first analytics step has no overlap.
  std::vector<std::vector<int64_t>> previous_hot_;
  int64_t step_ = 0;
  FILE* metrics_file_ = nullptr;
  std::atomic<bool> stop_requested_{false};
  bool stopped_ = false;  // Train's loop ended on the ranks' stop vote (stopped())
  std::unique_ptr<DetectorSet> detectors_;       // null without a policy
  // The detectors as they were at each checkpoint this process wrote (the
  // last 64): a rollback restores the statistics of the step it returns to,
  // so that the replay is judged from its first step.
  std::map<int64_t, DetectorSet> detector_snapshots_;
  // The policy's snapshots in host memory, oldest first (rank 0 holds the
  // state; the others' entries stay empty), when StartPolicy found room for at
  // least the longest rollback's: memory_snapshot_keep_ of them. 0: the
  // snapshots are checkpoints on disk (checkpoint_every = snapshot_every).
  std::deque<std::unique_ptr<LoadedCheckpoint>> memory_snapshots_;
  int memory_snapshot_keep_ = 0;
  double snapshot_mib_ = 0;       // one snapshot's size
  int64_t snapshot_needed_ = 0;   // how many the longest rollback needs
  std::string snapshot_placement_;
  std::function<int64_t()> host_available_mib_;
  std::unique_ptr<PolicyEngine> engine_;         // reads config_.policy
  std::vector<PolicyEngine::Decision> pending_;  // decided in Step, applied by ApplyPolicy
  double lr_scale_ = 1.0;                        // scale_lr actions, kept in checkpoints
  // The step of the policy's last switch, from which the learning rate re-warms
  // over policy.rewarm_steps (-1: none); kept in checkpoints.
  int64_t rewarm_start_ = -1;
  int64_t policy_steps_ = 0;                     // steps taken (rollbacks do not rewind it)
  bool diverged_ = false;
  std::string lease_path_;          // "" : no lease
  int64_t lease_attempt_ = 0;
  int64_t lease_expires_ms_ = 0;    // the deadline last read from the lease file
  int64_t lease_read_ms_ = 0;       // when it was read
  bool superseded_ = false;
  bool lease_lapsed_ = false;       // stopped while waiting for the lease: no final checkpoint
};

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_TRAINER_H_
