// The training loop (see trainer.h).
#include "worker/engine/trainer.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <map>
#include <thread>

#include "worker/engine/outlier_maps.h"
#include "worker/run/checkpoint_dirs.h"
#include "worker/run/run_dir.h"
#include "worker/run/run_lease.h"
#include "worker/io/crc32.h"
#include "worker/io/file_util.h"
#include "worker/io/json.h"
#include "worker/io/safetensors.h"
#include "proto/event_kinds.h"

namespace keel {
namespace {

constexpr char kCheckpointFormat[] = "keel-checkpoint-1";
// optimizer.safetensors' metadata: the policy engine's state (PolicyStateToJson)
// and the CRC-32 of that text. Absent from checkpoints written before them, or
// without a policy: the state then starts empty.
constexpr char kPolicyStateKey[] = "policy_state";
constexpr char kPolicyStateCrcKey[] = "policy_state.crc32";
// The Hot-Channel Patch's held sets (Model::HotSetsToText), with their own CRC.
constexpr char kHotSetsKey[] = "hcp.hot_sets";
constexpr char kHotSetsCrcKey[] = "hcp.hot_sets.crc32";

std::string Crc32Hex(const std::string& text) {
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08x", Crc32(0, text.data(), text.size()));
  return hex;
}

uint64_t Mix(uint64_t a, uint64_t b) { return RoleSeed(a ^ (b * 0x9FB21C651E98DF25ull), Role::kWgradX); }

// Every rank's `mine` (plain values, the same count on every rank), in rank
// order, through the communicator's host gather.
template <typename T>
Status GatherFromRanks(Communicator* comm, const std::vector<T>& mine, std::vector<std::vector<T>>* all) {
  const std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(T));
  std::vector<std::string> gathered;
  KEEL_RETURN_IF_ERROR(comm->AllGatherHost(bytes, &gathered));
  all->assign(gathered.size(), std::vector<T>(mine.size()));
  for (size_t r = 0; r < gathered.size(); ++r) {
    if (gathered[r].size() != bytes.size()) {
      return Status::Error("ranks: rank " + std::to_string(r) + " sent " + std::to_string(gathered[r].size()) +
                           " bytes where this rank has " + std::to_string(bytes.size()));
    }
    if (!bytes.empty()) std::memcpy((*all)[r].data(), gathered[r].data(), bytes.size());
  }
  return Status::Ok();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Adds the wall time of its scope to *comm and *exposed: a synchronous
// collective, whose whole time the trainer waits.
class CommTimer {
 public:
  CommTimer(double* comm, double* exposed) : comm_(comm), exposed_(exposed), start_(std::chrono::steady_clock::now()) {}
  ~CommTimer() {
    const double seconds = SecondsSince(start_);
    *comm_ += seconds;
    *exposed_ += seconds;
  }

 private:
  double* comm_;
  double* exposed_;
  std::chrono::steady_clock::time_point start_;
};

ReducePrecision ReducePrecisionOf(const DistConfig& dist) {
  return dist.reduce == "bf16" ? ReducePrecision::kBF16 : ReducePrecision::kF32;
}

// Deletes one checkpoint directory (its two files, then the directory).
void RemoveCheckpointDir(const std::string& dir) {
  std::remove((dir + "/model.safetensors").c_str());
  std::remove((dir + "/optimizer.safetensors").c_str());
  rmdir(dir.c_str());
}

// Renames a fully written checkpoint directory tmp_dir to final_dir, replacing
// an older one of the same step. A directory without ".tmp" is always
// complete: rename is the commit.
Status CommitCheckpointDir(const std::string& tmp_dir, const std::string& final_dir) {
  std::string old = final_dir + ".old";
  if (access(final_dir.c_str(), F_OK) == 0) {
    std::rename(final_dir.c_str(), old.c_str());
  }
  if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    return Status::Error("checkpoint: cannot rename '" + tmp_dir + "' to '" + final_dir + "'");
  }
  if (access(old.c_str(), F_OK) == 0) RemoveCheckpointDir(old);
  return Status::Ok();
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = static_cast<long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lds", s);
  }
  return text;
}

// The host's memory in MiB (0 when unknown).
int64_t HostMemoryMib() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? (static_cast<int64_t>(pages) * page) >> 20 : 0;
}

// /proc/meminfo's MemAvailable in MiB (-1 when it cannot be read).
int64_t HostAvailableMib() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long v = 0;
    if (std::sscanf(line, "MemAvailable: %lld kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib < 0 ? -1 : kib >> 10;
}

}  // namespace

// A checkpoint as read back, or a policy snapshot in memory (rank 0's).
struct Trainer::LoadedCheckpoint {
  std::vector<float> weights, m, v;  // flat, in param_info order
  PrecisionScheme scheme;
  std::string scheme_yaml;
  int64_t step = 0;
  double lr_scale = 1.0;
  int64_t rewarm_start = -1;
  int64_t micro_batches = 1;  // the global batch, in micro-batches per step
  TokenLoader::Position position;
  std::string policy_state;  // PolicyStateToJson's text, verified; "" when the checkpoint has none
  std::string hot_sets;      // Model::HotSetsToText's text, verified; "" when the checkpoint has none
};

Trainer::~Trainer() {
  if (metrics_file_) std::fclose(metrics_file_);
  comm_.reset();  // the NCCL communicator queues on backend_'s stream: it goes first
  if (backend_) {
    for (float* p : {grads_, adam_m_, adam_v_, probe_grads_, previous_, gains_, shard_grads_, gather_}) backend_->Free(p);
  }
  model_.reset();  // frees its buffers through backend_, so before it
}

Status Trainer::Create(const RunConfig& config, std::unique_ptr<Trainer>* out) {
  KEEL_RETURN_IF_ERROR(ValidateRunConfig(config));
  std::unique_ptr<Trainer> t(new Trainer);
  t->config_ = config;
  t->scheme_ = config.precision;
  t->accum_ = config.grad_accum;
  KEEL_RETURN_IF_ERROR(MakeBackend(config.backend, config.threads, &t->backend_));
  if (IsLanguageModel(config.model)) KEEL_RETURN_IF_ERROR(t->OpenData());
  KEEL_RETURN_IF_ERROR(MakeModel(config, t->backend_.get(), &t->model_));
  for (const ParamInfo& p : t->model_->param_info()) t->param_groups_.push_back(ParamGroup(p));
  KEEL_RETURN_IF_ERROR(t->AllocateState());
  KEEL_RETURN_IF_ERROR(t->model_->Init(config.seed));
  if (t->config_.policy.active()) t->StartPolicy();
  *out = std::move(t);
  return Status::Ok();
}

// The token loaders of a gpt, llama or gla run (data.train, and data.val when given).
Status Trainer::OpenData() {
  const RunConfig& config = config_;
  Status opened = TokenLoader::Open(config.data.train, config.batch, config.seq, &train_loader_);
  if (!opened.ok()) {
    return Status::Error("data.train: " + opened.message() +
                         " (make shards with `keel-train prepare-text IN.txt OUT_PREFIX`, "
                         "scripts/prepare-fortunes for the examples, or llm.c's data scripts)");
  }
  if (train_loader_->max_token() >= config.model.vocab) {
    return Status::Error("data.train: token id " + std::to_string(train_loader_->max_token()) +
                         " is outside model.vocab " + std::to_string(config.model.vocab) +
                         " (allowed: 0 .. vocab-1)");
  }
  if (config.data.shuffle) train_loader_->Shuffle(config.seed);
  if (!config.data.val.empty()) {
    KEEL_RETURN_IF_ERROR(TokenLoader::Open(config.data.val, config.batch, config.seq, &val_loader_));
  }
  return Status::Ok();
}

// The optimizer's buffers beside the model's weights: gradients, Adam m and v,
// and the probe's gradients when it runs. (The weights before an update,
// previous_, only under ZeRO-1: SetCommunicator.)
Status Trainer::AllocateState() {
  const size_t bytes = static_cast<size_t>(model_->param_count()) * sizeof(float);
  for (float** p : {&grads_, &adam_m_, &adam_v_}) {
    void* mem = nullptr;
    KEEL_RETURN_IF_ERROR(backend_->Alloc(bytes, &mem));
    *p = static_cast<float*>(mem);
  }
  if (config_.probe_every > 0) {
    void* mem = nullptr;
    KEEL_RETURN_IF_ERROR(backend_->Alloc(bytes, &mem));
    probe_grads_ = static_cast<float*>(mem);
  }
  int64_t gains = 0;
  for (const ParamInfo& p : model_->param_info()) gains += p.ln_gamma ? p.count : 0;
  if (gains > 0) {
    void* mem = nullptr;
    KEEL_RETURN_IF_ERROR(backend_->Alloc(static_cast<size_t>(gains) * sizeof(float), &mem));
    gains_ = static_cast<float*>(mem);
  }
  return Status::Ok();
}

void Trainer::StartPolicy() {
  // Rollbacks need snapshots: the policy's ring. In host memory when
  // snapshot_keep of them fit policy.snapshots.memory_mib, or at least enough
  // for the longest rollback (fewer kept); else on disk, as the run's
  // checkpoints. Each checkpoint on disk is written whole and fsynced: at a
  // snapshot every 33 steps that cost GPT runs of 51M parameters 45% of their
  // wall time in session 33's slice (docs/reproductions/policy-grid.md).
  const Policy& p = config_.policy;
  const double mib = 3.0 * sizeof(float) * static_cast<double>(model_->param_count()) / (1 << 20);
  snapshot_mib_ = mib;
  const int64_t budget = p.snapshot_memory_mib >= 0 ? p.snapshot_memory_mib : DefaultSnapshotMemoryMib(HostMemoryMib());
  std::string budget_name = "policy.snapshots.memory_mib " + std::to_string(budget);
  if (p.snapshot_memory_mib < 0) {
    budget_name += " (an eighth of this host's memory, at most " + std::to_string(kSnapshotMemoryCapMib) + ")";
  }
  char each[64];
  std::snprintf(each, sizeof(each), "%.0f MiB each", mib);
  if (p.snapshot_every > 0) {
    const int64_t needed = SnapshotsForRollback(LongestRollback(p), p.snapshot_every);
    snapshot_needed_ = needed;
    const int64_t fit = mib > 0 ? static_cast<int64_t>(static_cast<double>(budget) / mib) : 0;
    const int64_t want = p.snapshot_keep > 0 ? p.snapshot_keep : fit;  // keep 0: all that fit
    if (fit >= needed && want >= 1) {
      memory_snapshot_keep_ = static_cast<int>(std::min<int64_t>(want, fit));
      snapshot_placement_ = "every " + std::to_string(p.snapshot_every) + " steps in memory (" +
                            std::to_string(memory_snapshot_keep_) + " kept, " + each + ")";
      if (memory_snapshot_keep_ < p.snapshot_keep) {
        snapshot_placement_ += "; " + std::to_string(p.snapshot_keep) + " would pass " + budget_name;
      }
    } else {
      config_.checkpoint_every = p.snapshot_every;
      if (p.snapshot_keep > 0) config_.keep_checkpoints = p.snapshot_keep;
      const std::string why = budget == 0 ? budget_name
                                          : "the " + std::to_string(needed) + " a rollback needs pass " + budget_name;
      snapshot_placement_ =
          "every " + std::to_string(p.snapshot_every) + " steps on disk, as checkpoints (" + each + "; " + why + ")";
    }
  } else {
    snapshot_placement_ = "the run's checkpoints, on disk";
  }
  detectors_.reset(new DetectorSet(config_.policy.detectors));
  engine_.reset(new PolicyEngine(config_.policy, config_.precision.name));
}

double Trainer::LearningRate(int64_t step) const {
  double lr = ScheduledLearningRate(config_.schedule, config_.optimizer.lr * lr_scale_, config_.steps, step);
  const int64_t rewarm = config_.policy.rewarm_steps;
  if (rewarm > 0 && rewarm_start_ >= 0 && step >= rewarm_start_ && step - rewarm_start_ < rewarm) {
    lr *= static_cast<double>(step - rewarm_start_ + 1) / static_cast<double>(rewarm);
  }
  return lr;
}

Status Trainer::SwitchScheme(const PrecisionScheme& scheme) {
  KEEL_RETURN_IF_ERROR(ValidateScheme(scheme));
  scheme_ = scheme;
  return Status::Ok();
}

Status Trainer::NextBatch(int64_t micro, bool keep, Batch* batch) {
  const uint64_t index = static_cast<uint64_t>(step_) * accum_ * ranks() + micro;
  batch->data_seed = Mix(config_.seed ^ 0xDA7Aull, index);
  if (!train_loader_) return Status::Ok();
  if (keep) return train_loader_->Next(&batch->inputs, &batch->targets);
  std::vector<int32_t> inputs, targets;  // another rank's: read past it
  return train_loader_->Next(&inputs, &targets);
}

Status Trainer::SetCommunicator(std::unique_ptr<Communicator> comm) {
  comm_ = std::move(comm);
  buckets_.reset();
  if (ranks() > 1 && !config_.optimizer.shard && config_.dist.bucket_mb > 0) {
    buckets_.reset(new GradBuckets(model_->param_info(), model_->param_count(),
                                   static_cast<double>(config_.dist.bucket_mb) * (1 << 20)));
  }
  if (!config_.optimizer.shard || ranks() == 1) return Status::Ok();
  const int64_t count = model_->param_count(), n = ranks();
  shard_per_ = (count + n - 1) / n;
  shard_begin_ = std::min(count, rank() * shard_per_);
  shard_end_ = std::min(count, shard_begin_ + shard_per_);
  // Create's full-size gradient and moments give way to the sharded layout.
  for (float** p : {&grads_, &adam_m_, &adam_v_}) {
    backend_->Free(*p);
    *p = nullptr;
  }
  // previous_: the weights before an update (the update ratio's, since each
  // rank updates only its shard) and the whole moments on their way to a checkpoint.
  const std::vector<std::pair<float**, int64_t>> buffers = {
      {&grads_, n * shard_per_}, {&adam_m_, shard_per_}, {&adam_v_, shard_per_},
      {&shard_grads_, shard_per_}, {&gather_, n * shard_per_}, {&previous_, count}};
  for (const auto& b : buffers) {
    void* mem = nullptr;
    KEEL_RETURN_IF_ERROR(backend_->Alloc(static_cast<size_t>(b.second) * sizeof(float), &mem));
    *b.first = static_cast<float*>(mem);
  }
  shard_ = true;
  return Status::Ok();
}

bool Trainer::ShardRange(const ParamInfo& p, int64_t* lo, int64_t* hi) const {
  *lo = std::max(p.offset, shard_begin_);
  *hi = std::min(p.offset + p.count, shard_end_);
  return *lo < *hi;
}

Span Trainer::ShardPart(const ParamInfo& p, const float* base) const {
  int64_t lo, hi;
  if (!ShardRange(p, &lo, &hi)) return Span{base, 0};
  return Span{base + (lo - shard_begin_), hi - lo};
}

Status Trainer::GatherShards(const float* shard, float* full) {
  float* mine = gather_ + rank() * shard_per_;
  KEEL_RETURN_IF_ERROR(
      backend_->CopyBytes(mine, shard, static_cast<size_t>(shard_end_ - shard_begin_) * sizeof(float)));
  KEEL_RETURN_IF_ERROR(comm_->AllGather(mine, gather_, shard_per_));
  return backend_->CopyBytes(full, gather_, static_cast<size_t>(model_->param_count()) * sizeof(float));
}

Status Trainer::SumOverRanks(std::vector<double>* values) {
  if (ranks() == 1) return Status::Ok();
  std::vector<std::vector<double>> all;
  KEEL_RETURN_IF_ERROR(GatherFromRanks(comm_.get(), *values, &all));
  std::vector<double> sum(values->size(), 0.0);  // in rank order: the same bits on every rank
  for (const std::vector<double>& theirs : all) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += theirs[i];
  }
  *values = std::move(sum);
  return Status::Ok();
}

Status Trainer::SumOverRanks(double mine, double* total) {
  std::vector<double> values = {mine};
  KEEL_RETURN_IF_ERROR(SumOverRanks(&values));
  *total = values[0];
  return Status::Ok();
}

Status Trainer::FromLeader(std::string* text) {
  if (ranks() == 1) return Status::Ok();
  std::vector<std::string> all;
  KEEL_RETURN_IF_ERROR(comm_->AllGatherHost(leader() ? *text : std::string(), &all));
  *text = all[0];
  return Status::Ok();
}

Status Trainer::ShareLeaderStatus(const Status& leader_status) {
  std::string text = leader_status.ok() ? "" : leader_status.message();
  KEEL_RETURN_IF_ERROR(FromLeader(&text));
  if (leader()) return leader_status;
  return text.empty() ? Status::Ok() : Status::Error("rank 0: " + text);
}

// One optimizer step as its phases. Each fills its part of *m; the order is the
// data flow (the detectors read the gradient's metrics before the update).
Status Trainer::Step(StepMetrics* m) {
  const auto start = std::chrono::steady_clock::now();
  comm_seconds_ = 0;
  comm_exposed_seconds_ = 0;
  const bool probe = EveryNth(step_ + 1, config_.probe_every);
  *m = StepMetrics();
  m->step = step_ + 1;
  m->scheme = scheme_.name;
  m->lr = LearningRate(step_);
  std::vector<Batch> batches;  // kept for the probe, which replays them
  KEEL_RETURN_IF_ERROR(ForwardBackward(probe ? &batches : nullptr, m));
  KEEL_RETURN_IF_ERROR(CollectOperandStats(m));
  KEEL_RETURN_IF_ERROR(CollectOutlierAnalytics(m));
  GroupSums weight_squares;  // before the update: the update ratio's denominator
  KEEL_RETURN_IF_ERROR(MeasureGradients(m, &weight_squares));
  if (probe) KEEL_RETURN_IF_ERROR(RunProbe(batches, m));
  KEEL_RETURN_IF_ERROR(CollectLayerNormGains(m));
  const bool skip_update = RunStabilityController(*m);
  KEEL_RETURN_IF_ERROR(OptimizerStep(skip_update, m));
  KEEL_RETURN_IF_ERROR(MeasureUpdate(weight_squares, m));
  ++step_;
  KEEL_RETURN_IF_ERROR(MaybeEvaluate(m));
  KEEL_RETURN_IF_ERROR(backend_->Sync());
  m->step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The whole run's throughput: every rank's items.
  m->tokens_per_s = SafeRatio(static_cast<double>(model_->items_per_batch()) * accum_ * ranks(), m->step_seconds);
  return GatherRankTimes(m);
}

Status Trainer::GatherRankTimes(StepMetrics* m) {
  if (ranks() == 1) return Status::Ok();
  std::vector<std::vector<double>> all;
  KEEL_RETURN_IF_ERROR(GatherFromRanks(
      comm_.get(), std::vector<double>{m->step_seconds, comm_seconds_, comm_exposed_seconds_}, &all));
  for (const std::vector<double>& theirs : all) {
    m->rank_step_seconds.push_back(theirs[0]);
    m->rank_comm_seconds.push_back(theirs[1]);
    m->rank_comm_exposed_seconds.push_back(theirs[2]);
  }
  return Status::Ok();
}

bool Trainer::OperandStatsOn() const { return config_.operand_stats && scheme_.AnyQuantized(); }

// The micro-batches' forward and backward passes: the mean gradient into grads_,
// the mean loss into m->loss, and (when on) the operand counters. `kept`, when
// not null, receives the batches. With ranks the gradient is summed over them:
// in buckets started during this rank's last backward (buckets_), or in one
// collective after it.
Status Trainer::ForwardBackward(std::vector<Batch>* kept, StepMetrics* m) {
  const bool stats = OperandStatsOn();
  const ReducePrecision precision = ReducePrecisionOf(config_.dist);
  KEEL_RETURN_IF_ERROR(backend_->Fill(grads_, model_->param_count(), 0.0f));
  if (stats) KEEL_RETURN_IF_ERROR(backend_->ResetOperandStats(static_cast<int>(model_->linear_names().size())));
  if (AnalyticsStep()) {
    KEEL_RETURN_IF_ERROR(backend_->BeginOutlierAnalytics(static_cast<int>(model_->linear_names().size()), MapsStep()));
  }
  if (buckets_) buckets_->Begin(comm_.get(), grads_, precision);
  // The Hot-Channel Patch's sets: chosen at the run's first step and every
  // hcp_every steps (docs/hcp.md).
  KEEL_RETURN_IF_ERROR(
      model_->BeginHcpStep(scheme_, scheme_.hcp_channels > 0 && step_ % std::max(1, scheme_.hcp_every) == 0));
  double loss_sum = 0;
  const int64_t micro_batches = static_cast<int64_t>(accum_) * ranks();  // the global step's
  const int64_t mine = static_cast<int64_t>(rank()) * accum_;             // this rank's first
  for (int64_t j = 0; j < micro_batches; ++j) {
    Batch batch;
    const bool keep = j >= mine && j < mine + accum_;
    KEEL_RETURN_IF_ERROR(NextBatch(j, keep, &batch));
    if (!keep) continue;
    double loss = 0;
    const uint64_t quant_seed = Mix(config_.seed ^ 0x0A7Aull, static_cast<uint64_t>(step_) * micro_batches + j);
    // Only the last micro-batch's backward writes gradients for good.
    GradientReady ready;
    if (buckets_ && j == mine + accum_ - 1) ready = [this](int index) { return buckets_->Ready(index); };
    KEEL_RETURN_IF_ERROR(model_->ForwardBackward(batch, scheme_, quant_seed, 1.0f / static_cast<float>(micro_batches),
                                                 stats, grads_, &loss, ready));
    loss_sum += loss;
    if (kept) kept->push_back(std::move(batch));
  }
  model_->EndHcpStep();
  if (ranks() > 1 && model_->hcp_choosing()) {
    // Each rank chose from its own micro-batches: all hold rank 0's from here
    // on, which is what checkpoints keep.
    KEEL_RETURN_IF_ERROR(comm_->Broadcast(model_->hot_set_buffer(),
                                          static_cast<size_t>(model_->hot_set_ints()) * sizeof(int32_t), 0));
  }
  if (ranks() > 1) {
    if (buckets_) {
      KEEL_RETURN_IF_ERROR(buckets_->Flush());  // tensors the backward did not report (it wrote nothing)
      m->grad_buckets = static_cast<int>(buckets_->plan().size());
      m->grad_buckets_early = buckets_->started_early();
      // The backward's queued kernels first, so that what is timed below is
      // the wait for communication alone (the buckets' collectives go on
      // meanwhile: nothing on the backend's stream waits for them yet).
      KEEL_RETURN_IF_ERROR(backend_->Sync());
      const auto waited = std::chrono::steady_clock::now();
      KEEL_RETURN_IF_ERROR(buckets_->WaitAll(&comm_seconds_));
      comm_exposed_seconds_ += SecondsSince(waited);
    } else {
      // The backward's queued kernels first: NCCL's collectives wait for the
      // stream, and the timer is for the collective alone.
      KEEL_RETURN_IF_ERROR(backend_->Sync());
      CommTimer timer(&comm_seconds_, &comm_exposed_seconds_);
      if (shard_) {  // ZeRO-1: each rank gets the summed gradient of its shard only
        KEEL_RETURN_IF_ERROR(comm_->ReduceScatterSum(grads_, shard_grads_, shard_per_, precision));
      } else {
        KEEL_RETURN_IF_ERROR(comm_->AllReduceSum(grads_, model_->param_count(), precision));
      }
    }
    CommTimer timer(&comm_seconds_, &comm_exposed_seconds_);
    KEEL_RETURN_IF_ERROR(SumOverRanks(loss_sum, &loss_sum));
  }
  m->loss = loss_sum / static_cast<double>(micro_batches);
  return Status::Ok();
}

Status Trainer::CollectOperandStats(StepMetrics* m) {
  if (!OperandStatsOn()) return Status::Ok();
  std::vector<OperandStats> counters;
  KEEL_RETURN_IF_ERROR(backend_->ReadOperandStats(&counters));
  if (ranks() > 1) {  // every rank's counts, summed
    std::vector<std::vector<OperandStats>> all;
    KEEL_RETURN_IF_ERROR(GatherFromRanks(comm_.get(), counters, &all));
    for (OperandStats& c : counters) c = OperandStats();
    for (const std::vector<OperandStats>& theirs : all) {
      for (size_t i = 0; i < counters.size(); ++i) {
        counters[i].elements += theirs[i].elements;
        counters[i].saturated += theirs[i].saturated;
        counters[i].blocks += theirs[i].blocks;
        counters[i].nan_blocks += theirs[i].nan_blocks;
      }
    }
  }
  m->operands = OperandMetrics(counters, model_->linear_names());
  return Status::Ok();
}

bool Trainer::AnalyticsStep() const { return leader() && EveryNth(step_ + 1, config_.analytics_every); }

bool Trainer::MapsStep() const { return AnalyticsStep() && EveryNth(step_ + 1, config_.analytics.maps_every); }

Status Trainer::CollectOutlierAnalytics(StepMetrics* m) {
  if (!AnalyticsStep()) return Status::Ok();
  std::vector<OperandOutliers> results;
  KEEL_RETURN_IF_ERROR(backend_->ReadOutlierAnalytics(&results));
  const std::vector<std::string>& names = model_->linear_names();
  previous_hot_.resize(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].calls == 0) continue;  // a role this layer's GEMMs did not run (no dgrad)
    const OutlierSummary s = Summarize(results[i], config_.analytics.top_k);
    OutlierMetric o;
    o.linear = names[i / kRoleCount];
    o.role = static_cast<Role>(i % kRoleCount);
    o.kurtosis = s.kurtosis;
    o.top1_over_median = s.top1_over_median;
    o.ftz_rate = s.ftz_rate;
    o.hot = s.hot;
    o.has_overlap = !previous_hot_[i].empty();
    if (o.has_overlap) o.hot_overlap = Jaccard(previous_hot_[i], s.hot);
    previous_hot_[i] = s.hot;
    m->outliers.push_back(std::move(o));
  }
  if (MapsStep()) {
    int written = 0;
    KEEL_RETURN_IF_ERROR(WriteBlockMaps(RunDir(config_.run_dir).analytics(step_ + 1), step_ + 1, names, results, &written));
  }
  return Status::Ok();
}

// Norms of the gradient, global and per group, and the weights' squares before
// the update (for the update ratio), in one batched reduction.
Status Trainer::MeasureGradients(StepMetrics* m, GroupSums* weight_squares) {
  const std::vector<ParamInfo>& params = model_->param_info();
  std::vector<Span> spans;
  for (const ParamInfo& p : params) {
    spans.push_back(shard_ ? ShardPart(p, shard_grads_) : Span{grads_ + p.offset, p.count});
  }
  for (const ParamInfo& p : params) spans.push_back(Span{model_->params() + p.offset, p.count});
  std::vector<double> squares;
  KEEL_RETURN_IF_ERROR(backend_->SumSquares(spans, &squares));
  if (shard_) {  // each rank squared its shard's part of every gradient
    std::vector<double> grad(squares.begin(), squares.begin() + params.size());
    KEEL_RETURN_IF_ERROR(SumOverRanks(&grad));
    std::copy(grad.begin(), grad.end(), squares.begin());
  }
  const GroupSums grad_squares = SumByGroup(param_groups_, squares);
  *weight_squares = SumByGroup(param_groups_, squares, params.size());
  m->grad_norm = std::sqrt(grad_squares.total);
  m->grad_norms = GroupNorms(grad_squares);
  return Status::Ok();
}

// The layernorm gains this step used (before its update), gathered on the
// backend and read back in one copy (one wait instead of one per gain).
Status Trainer::CollectLayerNormGains(StepMetrics* m) {
  if (gains_ == nullptr) return Status::Ok();
  int64_t total = 0;
  for (const ParamInfo& p : model_->param_info()) {
    if (!p.ln_gamma) continue;
    KEEL_RETURN_IF_ERROR(backend_->CopyBytes(gains_ + total, model_->params() + p.offset, p.count * sizeof(float)));
    total += p.count;
  }
  std::vector<float> all(static_cast<size_t>(total));
  KEEL_RETURN_IF_ERROR(backend_->Download(all.data(), gains_, all.size() * sizeof(float)));
  int64_t at = 0;
  for (const ParamInfo& p : model_->param_info()) {
    if (!p.ln_gamma) continue;
    m->ln_gamma.push_back(GainStats(p.name, std::vector<float>(all.begin() + at, all.begin() + at + p.count)));
    at += p.count;
  }
  return Status::Ok();
}

// Stability: the detectors read this step's metrics before its update, so a
// rule can skip the update; its other actions wait in pending_ and run after
// the step (Train calls ApplyPolicy). Returns whether the update is skipped.
bool Trainer::RunStabilityController(const StepMetrics& m) {
  if (!detectors_) return false;
  std::vector<Firing> fired = detectors_->Observe(m);
  // Cooldowns count steps taken, not step numbers: a rollback moves the step
  // number back, and the rule must still wait its cooldown.
  std::vector<PolicyEngine::Decision> decisions = engine_->Decide(++policy_steps_, m.step, scheme_.name, fired);
  const bool skip_update = SkipsUpdate(decisions);
  for (PolicyEngine::Decision& d : decisions) pending_.push_back(std::move(d));
  return skip_update;
}

// Adam(W) on every tensor; global-norm clipping folds into the gradient scale.
// The update ratio's numerator, per tensor, comes out of the update itself
// (delta_squares_); under ZeRO-1, previous_ keeps the weights before it.
Status Trainer::OptimizerStep(bool skip_update, StepMetrics* m) {
  Backend& b = *backend_;
  const OptimizerConfig& o = config_.optimizer;
  const float grad_scale = ClipScale(m->grad_norm, o.grad_clip);
  if (shard_) {
    KEEL_RETURN_IF_ERROR(b.CopyBytes(previous_, model_->params(),
                                     static_cast<size_t>(model_->param_count()) * sizeof(float)));
  }
  delta_squares_.assign(model_->param_info().size(), 0.0);
  m->skipped = skip_update;
  if (skip_update) return Status::Ok();  // weights and Adam moments stay as they were
  std::vector<AdamWTensor> tensors;
  for (const ParamInfo& p : model_->param_info()) {
    float wd = o.type == "adamw" && p.decay ? o.weight_decay : 0.0f;
    // ZeRO-1: the part of the tensor in this rank's shard (gradient and moments
    // are shard-local).
    int64_t lo = p.offset, count = p.count, local = p.offset;
    if (shard_) {
      int64_t hi;
      if (!ShardRange(p, &lo, &hi)) continue;
      count = hi - lo;
      local = lo - shard_begin_;
    }
    const float* g = shard_ ? shard_grads_ + local : grads_ + lo;
    tensors.push_back(AdamWTensor{model_->params() + lo, g, adam_m_ + local, adam_v_ + local, count, wd});
  }
  // Unsharded, the tensors are param_info()'s, one for one.
  KEEL_RETURN_IF_ERROR(b.AdamWTensors(tensors, static_cast<float>(m->lr), o.beta1, o.beta2, o.eps,
                                      static_cast<int>(step_ + 1), grad_scale, shard_ ? nullptr : &delta_squares_));
  // ZeRO-1: every rank updated its shard; all of them gather the whole.
  if (shard_) {
    KEEL_RETURN_IF_ERROR(backend_->Sync());  // the updates' kernels are not the gather's time
    CommTimer timer(&comm_seconds_, &comm_exposed_seconds_);
    KEEL_RETURN_IF_ERROR(GatherShards(model_->params() + shard_begin_, model_->params()));
  }
  return Status::Ok();
}

// The update ratio |w_new - w_old| / |w_old|, global and per group.
Status Trainer::MeasureUpdate(const GroupSums& weight_squares, StepMetrics* m) {
  std::vector<double> squares = delta_squares_;  // per tensor, from OptimizerStep
  if (shard_) {
    KEEL_RETURN_IF_ERROR(backend_->Axpy(-1.0f, model_->params(), previous_, model_->param_count()));
    std::vector<Span> spans;  // previous_ now holds w_old - w_new
    for (const ParamInfo& p : model_->param_info()) spans.push_back(Span{previous_ + p.offset, p.count});
    KEEL_RETURN_IF_ERROR(backend_->SumSquares(spans, &squares));
  }
  const GroupSums delta_squares = SumByGroup(param_groups_, squares);
  m->update_ratio = SafeRatio(std::sqrt(delta_squares.total), std::sqrt(weight_squares.total));
  m->update_ratios = GroupRatios(delta_squares, weight_squares);
  return Status::Ok();
}

// The validation loss, every data.eval_every steps (after the update).
Status Trainer::MaybeEvaluate(StepMetrics* m) {
  if (!val_loader_ || !EveryNth(step_, config_.data.eval_every)) return Status::Ok();
  KEEL_RETURN_IF_ERROR(Evaluate(&m->val_loss));
  m->evaluated = true;
  return Status::Ok();
}

// The gradient-bias probe: the same batches again with the reference's operands
// (probe_reference: fp32, or bf16 at a bf16 step's cost), compared with the
// step's (quantized) gradient, overall and per group.
Status Trainer::RunProbe(const std::vector<Batch>& batches, StepMetrics* m) {
  Backend& b = *backend_;
  PrecisionScheme reference;
  KEEL_RETURN_IF_ERROR(SchemeFromPreset(config_.probe_reference, &reference));
  KEEL_RETURN_IF_ERROR(b.Fill(probe_grads_, model_->param_count(), 0.0f));
  const float scale = 1.0f / static_cast<float>(static_cast<int64_t>(accum_) * ranks());
  for (size_t k = 0; k < batches.size(); ++k) {
    double loss = 0;
    KEEL_RETURN_IF_ERROR(model_->ForwardBackward(batches[k], reference, 0, scale, false, probe_grads_, &loss, nullptr));
  }
  // The reference gradient of the whole global batch, as the step's.
  if (ranks() > 1) KEEL_RETURN_IF_ERROR(comm_->AllReduceSum(probe_grads_, model_->param_count(), ReducePrecision::kF32));
  std::vector<Span> gq, g, g_part;  // g_part: the reference over gq's elements
  for (const ParamInfo& p : model_->param_info()) {
    gq.push_back(shard_ ? ShardPart(p, shard_grads_) : Span{grads_ + p.offset, p.count});
    g.push_back(Span{probe_grads_ + p.offset, p.count});
    g_part.push_back(shard_ ? ShardPart(p, probe_grads_ + shard_begin_) : g.back());
  }
  std::vector<double> cross, gq_sq, g_sq;
  KEEL_RETURN_IF_ERROR(b.Dots(gq, g_part, &cross));
  KEEL_RETURN_IF_ERROR(b.SumSquares(gq, &gq_sq));
  KEEL_RETURN_IF_ERROR(b.SumSquares(g, &g_sq));
  if (shard_) {  // sums over each rank's shard
    KEEL_RETURN_IF_ERROR(SumOverRanks(&cross));
    KEEL_RETURN_IF_ERROR(SumOverRanks(&gq_sq));
  }
  const GroupSums c = SumByGroup(param_groups_, cross);
  const GroupSums qq = SumByGroup(param_groups_, gq_sq);
  const GroupSums gg = SumByGroup(param_groups_, g_sq);
  m->probed = true;
  m->probe = ProbeValuesFrom(c.total, qq.total, gg.total);
  for (const std::string& name : c.order) {
    m->probe_layers.push_back({name, ProbeValuesFrom(c.by_group.at(name), qq.by_group.at(name), gg.by_group.at(name))});
  }
  return Status::Ok();
}

Status Trainer::Evaluate(double* loss) {
  // The val loader restarts at the beginning each time: every evaluation sees
  // the same batches.
  KEEL_RETURN_IF_ERROR(val_loader_->Seek(TokenLoader::Position()));
  double sum = 0;
  for (int i = 0; i < config_.data.val_batches; ++i) {
    Batch batch;
    KEEL_RETURN_IF_ERROR(val_loader_->Next(&batch.inputs, &batch.targets));
    double l = 0;
    KEEL_RETURN_IF_ERROR(model_->Evaluate(batch, scheme_, Mix(config_.seed ^ 0xE7A1ull, i), &l));
    sum += l;
  }
  *loss = sum / config_.data.val_batches;
  return Status::Ok();
}

// Keeps the lines of a JSON-lines file whose "step" is <= step (a resumed or
// rolled-back run continues the trajectory up to there).
Status KeepLinesUpToStep(const std::string& path, int64_t step) {
  std::string old;
  if (!ReadFile(path, &old).ok()) return Status::Ok();
  std::string kept;
  size_t begin = 0;
  while (begin < old.size()) {
    size_t end = old.find('\n', begin);
    if (end == std::string::npos) end = old.size();
    std::string line = old.substr(begin, end - begin);
    JsonValue v;
    const JsonValue* s = nullptr;
    if (ParseJson(line, &v).ok() && (s = v.Find("step")) && s->int_value() <= step) kept += line + "\n";
    begin = end + 1;
  }
  return WriteFileAtomic(path, kept);
}

Status Trainer::OpenMetricsFile() {
  if (metrics_file_ || !leader()) return Status::Ok();  // rank 0 writes the run's files
  KEEL_RETURN_IF_ERROR(MakeDirs(config_.run_dir));
  std::string path = RunDir(config_.run_dir).metrics();
  if (step_ > 0) {
    // Resumed: keep the lines up to the checkpoint's step, so the file holds
    // one line per step of the trajectory this run continues.
    KEEL_RETURN_IF_ERROR(KeepLinesUpToStep(path, step_));
    metrics_file_ = std::fopen(path.c_str(), "a");
  } else {
    // A fresh run starts a fresh file. Appending (O_APPEND), never writing at
    // our own offset: if someone truncates the file, the next lines land at
    // its new end, where keel-worker's tail sees the file shrink, instead of
    // past a hole of zero bytes.
    std::FILE* truncate = std::fopen(path.c_str(), "w");
    if (truncate) std::fclose(truncate);
    metrics_file_ = std::fopen(path.c_str(), "a");
  }
  if (!metrics_file_) return Status::Error("run_dir: cannot append to '" + path + "'");
  return Status::Ok();
}

Status Trainer::RecordEvent(const std::string& kind, const std::string& message,
                            const std::vector<std::pair<std::string, std::string>>& details) {
  if (!leader()) return Status::Ok();  // every rank takes the decision; rank 0 records it
  JsonWriter w;
  w.Add("step", step_).Add("kind", kind).Add("message", message);
  JsonValue d = JsonValue::Object();
  for (const auto& kv : details) d.Set(kv.first, kv.second);
  w.Add("details", d);
  KEEL_RETURN_IF_ERROR(MakeDirs(config_.run_dir));  // an event can come before the first step
  const std::string path = RunDir(config_.run_dir).events();
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return Status::Error("run_dir: cannot append to '" + path + "'");
  std::fprintf(f, "%s\n", w.str().c_str());
  std::fclose(f);
  return Status::Ok();
}

Status Trainer::Rollback(int64_t steps, std::string* restored, bool or_oldest) {
  if (steps <= 0) return Status::Error("rollback: steps " + std::to_string(steps) + " is not allowed (>= 1)");
  const int64_t target = step_ - steps;
  const std::string root = RunDir(config_.run_dir).checkpoints();
  std::string best;
  LoadedCheckpoint* snapshot = nullptr;  // rank 0: the memory snapshot restored, if one is
  Status found = Status::Ok();
  if (leader()) {  // rank 0 holds the memory snapshots, and its run directory the checkpoints
    // The newest state at or before the target, in memory or on disk (a
    // checkpoint_every checkpoint may lie between two snapshots).
    for (const auto& s : memory_snapshots_) {
      if (s->step <= target) snapshot = s.get();  // oldest first: the last one wins
    }
    int64_t disk_step = -1;
    const auto disk = ListCheckpoints(root);
    for (const auto& c : disk) {
      if (c.first <= target) {  // ascending: the last one wins
        best = c.second;
        disk_step = c.first;
      }
    }
    if (best.empty() && !snapshot && or_oldest) {
      // Nothing that old: the oldest state kept, in memory or on disk.
      if (!memory_snapshots_.empty()) snapshot = memory_snapshots_.front().get();
      if (!disk.empty() && (!snapshot || disk.front().first < snapshot->step)) {
        best = disk.front().second;
        disk_step = disk.front().first;
        snapshot = nullptr;
      }
    }
    if (snapshot && snapshot->step >= disk_step) {
      best = "memory snapshot of step " + std::to_string(snapshot->step);
    } else {
      snapshot = nullptr;
    }
    if (best.empty()) {
      std::string held = "none";
      if (!memory_snapshots_.empty()) {
        held = "steps " + std::to_string(memory_snapshots_.front()->step) + " .. " +
               std::to_string(memory_snapshots_.back()->step);
      }
      found = Status::Error("rollback: no snapshot or checkpoint at or before step " + std::to_string(target) +
                            " (snapshots in memory: " + held + "; checkpoints in " + root + ")");
    }
  }
  KEEL_RETURN_IF_ERROR(ShareLeaderStatus(found));
  KEEL_RETURN_IF_ERROR(FromLeader(&best));
  // The policy keeps what it learnt: the snapshot's state is from before the
  // blow-up this rollback answers, and restoring it would replay the rescue.
  const bool from_memory = best.rfind("memory snapshot", 0) == 0;
  if (from_memory) {
    LoadedCheckpoint unused;  // the other ranks take rank 0's state
    KEEL_RETURN_IF_ERROR(ApplyCheckpoint("the " + best, Status::Ok(), /*restore_policy=*/false,
                                         snapshot ? snapshot : &unused));
  } else {
    KEEL_RETURN_IF_ERROR(ResumeCheckpoint(root + "/" + best, /*restore_policy=*/false));
  }
  // The snapshots after the restored step are the abandoned trajectory's.
  while (!memory_snapshots_.empty() && memory_snapshots_.back()->step > step_) memory_snapshots_.pop_back();
  if (leader()) {
    // The checkpoints after the restored one belong to the abandoned
    // trajectory: a restart resuming "latest" must not go back to one of them
    // (in the scheme that diverged, with a policy state from before the rescue).
    for (const auto& c : ListCheckpoints(root)) {
      if (c.first > step_) RemoveCheckpointDir(root + "/" + c.second);
    }
  }
  if (metrics_file_) {
    // Reopened (dropping the lines after the restored step) when the next line
    // is written: after the rollback's event, which keel-worker reads first.
    std::fclose(metrics_file_);
    metrics_file_ = nullptr;
  }
  *restored = from_memory ? best : root + "/" + best;
  return Status::Ok();
}

Status Trainer::SwitchAndRecord(const PrecisionScheme& scheme, const std::string& suffix,
                                std::vector<std::pair<std::string, std::string>> details) {
  const std::string from = scheme_.name;
  KEEL_RETURN_IF_ERROR(SwitchScheme(scheme));
  if (detectors_) detectors_->SchemeSwitched();
  details.push_back({"from", from});
  details.push_back({"precision", scheme.name});
  return RecordEvent(event_kind::kSwitchPrecision, "switched precision from " + from + " to " + scheme.name + suffix, details);
}

Status Trainer::PolicySwitch(const PrecisionScheme& scheme, const std::string& suffix,
                             std::vector<std::pair<std::string, std::string>> details) {
  if (config_.policy.rewarm_steps > 0) {
    rewarm_start_ = step_;  // the next step is the re-warm's first
    details.push_back({"rewarm_steps", std::to_string(config_.policy.rewarm_steps)});
  }
  return SwitchAndRecord(scheme, suffix, std::move(details));
}

Status Trainer::RollbackAndRecord(int64_t steps, const std::string& suffix,
                                  std::vector<std::pair<std::string, std::string>> details, bool or_oldest) {
  const int64_t before = step_;
  std::string restored;
  KEEL_RETURN_IF_ERROR(Rollback(steps, &restored, or_oldest));
  details.push_back({"from_step", std::to_string(before)});
  details.push_back({"to_step", std::to_string(step_)});
  details.push_back({"checkpoint", restored});
  std::string shorter;
  if (step_ > before - steps) {
    shorter = " (the oldest state kept: nothing is kept at or before step " + std::to_string(before - steps) + ")";
    details.push_back({"target_step", std::to_string(before - steps)});
  }
  return RecordEvent(event_kind::kRollback,
                     "rolled back from step " + std::to_string(before) + " to " + std::to_string(step_) + shorter +
                         suffix,
                     details);
}

Status Trainer::ApplyPolicy() {
  std::vector<PolicyEngine::Decision> decisions;
  decisions.swap(pending_);
  for (const PolicyEngine::Decision& d : decisions) {
    // The detector values behind the decision go into every event it causes.
    const DecisionEvidence evidence = EvidenceOf(d);
    if (!d.probation_over.empty()) {
      KEEL_RETURN_IF_ERROR(RecordEvent(event_kind::kProbation, d.probation_over, evidence.details));
    }
    if (!d.escalation.empty()) {
      // What the engine does instead of the rule as written, and why, before
      // the actions' own events.
      auto details = evidence.details;
      details.push_back({"from", scheme_.name});
      std::string to;
      for (const PolicyAction& a : d.actions) {
        to += (to.empty() ? "" : ", ") + (a.kind == PolicyAction::Kind::kSwitch ? a.scheme
                                          : a.kind == PolicyAction::Kind::kScaleLr
                                              ? "scale_lr " + JsonNumber(a.factor)
                                              : std::string(ActionName(a.kind)));
      }
      details.push_back({"actions", to});
      KEEL_RETURN_IF_ERROR(RecordEvent(event_kind::kEscalate, d.escalation + "; " + evidence.cause, details));
    }
    for (const PolicyAction& a : d.actions) KEEL_RETURN_IF_ERROR(ApplyAction(a, evidence));
  }
  return ApplyProbation();
}

// policy.probation: back down one rung after enough healthy steps in a scheme
// the policy moved up to (PolicyEngine::ProbationReturn decides).
Status Trainer::ApplyProbation() {
  if (!engine_ || diverged_) return Status::Ok();
  const std::string target = engine_->ProbationReturn(policy_steps_, scheme_.name);
  if (target.empty()) return Status::Ok();
  PrecisionScheme scheme;
  KEEL_RETURN_IF_ERROR(SchemeForRung(target, &scheme));
  const std::string after = std::to_string(config_.policy.probation_after);
  return PolicySwitch(scheme, ": probation: " + after + " healthy steps in " + scheme_.name +
                                     " since the policy moved there (policy.probation.after " + after + ")",
                         {{"probation_after", after}});
}

// A ladder rung by name: the run's own starting scheme (it may be custom) or a
// preset, either with "+bf16_head" (keel::SchemeForRung).
Status Trainer::SchemeForRung(const std::string& name, PrecisionScheme* out) const {
  return keel::SchemeForRung(name, config_.precision, out);
}

// One action of a decision, and its event (skip_step's update was already
// skipped in Step; this records it).
Status Trainer::ApplyAction(const PolicyAction& a, const DecisionEvidence& evidence) {
  const std::string& cause = evidence.cause;
  auto details = evidence.details;
  if (a.kind == PolicyAction::Kind::kSwitch) {
    const std::string from = scheme_.name;
    // The engine resolved `next` against the scheme that ran the step.
    const std::string target = a.scheme == "next" ? engine_->NextRung(from) : a.scheme;
    if (target.empty() || target == from) {
      details.push_back({"from", from});
      return RecordEvent("switch_skipped", "no scheme above " + from + " on the ladder; " + cause, details);
    }
    PrecisionScheme scheme;
    KEEL_RETURN_IF_ERROR(SchemeForRung(target, &scheme));
    return PolicySwitch(scheme, ": " + cause, details);
  }
  if (a.kind == PolicyAction::Kind::kRollback) {
    // A policy rollback rewinds weights, moments, data and step, not the
    // policy's own decisions: the run keeps the scheme and learning-rate scale
    // it had (and the policy engine its state: Rollback) (a checkpoint from before an earlier rescue would otherwise bring
    // back the scheme that diverged, and the rung above it would be a replay).
    const PrecisionScheme running = scheme_;
    const double lr_scale = lr_scale_;
    const int64_t rewarm_start = rewarm_start_;
    details.push_back({"precision", running.name});
    Status s = RollbackAndRecord(a.steps, ": " + cause, details, /*or_oldest=*/true);
    if (!s.ok()) return RecordEvent("rollback_failed", s.message() + "; " + cause, evidence.details);
    scheme_ = running;
    lr_scale_ = lr_scale;
    // A re-warm under way stays the policy's, from no later than here.
    rewarm_start_ = rewarm_start >= 0 ? std::min(rewarm_start, step_) : -1;
    return Status::Ok();
  }
  if (a.kind == PolicyAction::Kind::kScaleLr) {
    lr_scale_ *= a.factor;
    details.push_back({"factor", JsonNumber(a.factor)});
    details.push_back({"lr_scale", JsonNumber(lr_scale_)});
    return RecordEvent(event_kind::kScaleLr, "learning rate scaled by " + JsonNumber(a.factor) + ": " + cause, details);
  }
  if (a.kind == PolicyAction::Kind::kSkipStep) {
    return RecordEvent(event_kind::kSkipStep, "skipped the update of step " + std::to_string(step_) + ": " + cause, details);
  }
  if (a.kind == PolicyAction::Kind::kStop) {
    diverged_ = true;
    return RecordEvent(event_kind::kStop, "stopped the run as diverged: " + cause, details);
  }
  return Status::Ok();
}

Status Trainer::ReadCommandFiles(std::vector<std::pair<std::string, std::string>>* commands) {
  const std::string dir = RunDir(config_.run_dir).commands();
  std::vector<std::string> names;
  if (!ListDir(dir, &names).ok()) return Status::Ok();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.size() < 5 || name.compare(name.size() - 5, 5, ".json") != 0) continue;  // skips *.tmp
    std::string text;
    if (!ReadFile(dir + "/" + name, &text).ok()) text.clear();  // unreadable: ApplyCommand says so
    commands->push_back({name, text});
  }
  return Status::Ok();
}

Status Trainer::ApplyCommand(const std::string& name, const std::string& text) {
  JsonValue command;
  std::string error;
  if (text.empty() || !ParseJson(text, &command).ok() || !command.is_object()) {
    error = "unreadable command file " + name;
  }
  const JsonValue* kind = command.Find("kind");
  const JsonValue* precision = command.Find("precision");
  const JsonValue* reason = command.Find("reason");
  const std::string why = reason && !reason->string_value().empty() ? " (" + reason->string_value() + ")" : "";
  if (error.empty() && kind && kind->string_value() == event_kind::kRollback) {
    const JsonValue* steps = command.Find("steps");
    Status s = RollbackAndRecord(steps ? steps->int_value() : 0, why, {});
    if (!s.ok()) error = s.message();
  }
  if (error.empty() && precision && !precision->string_value().empty()) {
    PrecisionScheme scheme;
    Status s = SchemeFromName(precision->string_value(), &scheme);  // a preset, or one + "+bf16_head"
    if (s.ok()) s = SwitchAndRecord(scheme, why, {});
    if (!s.ok()) error = s.message();
  }
  if (error.empty() && !(kind && event_kind::ChangesTrajectory(kind->string_value()))) {
    error = "unknown command kind in " + name + " (allowed: switch_precision, rollback)";
  }
  if (!error.empty()) KEEL_RETURN_IF_ERROR(RecordEvent(event_kind::kCommandFailed, error, {{"file", name}}));
  return Status::Ok();
}

Status Trainer::ProcessCommands() {
  std::vector<std::pair<std::string, std::string>> commands;
  if (leader()) KEEL_RETURN_IF_ERROR(ReadCommandFiles(&commands));
  if (ranks() > 1) {  // rank 0's commands, applied by every rank before the same step
    JsonValue list = JsonValue::Array();
    for (const auto& c : commands) {
      JsonValue pair = JsonValue::Array();
      pair.Append(JsonValue(c.first));
      pair.Append(JsonValue(c.second));
      list.Append(pair);
    }
    std::string text = ToJson(list);
    KEEL_RETURN_IF_ERROR(FromLeader(&text));
    JsonValue got;
    KEEL_RETURN_IF_ERROR(ParseJson(text, &got));
    commands.clear();
    for (const JsonValue& pair : got.array()) {
      commands.push_back({pair.array()[0].string_value(), pair.array()[1].string_value()});
    }
  }
  for (const auto& c : commands) {
    KEEL_RETURN_IF_ERROR(ApplyCommand(c.first, c.second));
    if (leader()) std::remove((RunDir(config_.run_dir).commands() + "/" + c.first).c_str());
  }
  return Status::Ok();
}

namespace {

// Test hook (nproc_test.sh): KEEL_TEST_SIGNAL_AFTER_VOTE=R:S makes rank R
// raise SIGTERM right after its stop vote of step S: the moment where a signal
// must not make one rank leave while the others train on.
bool SignalAfterVote(int rank, int64_t step) {
  const char* spec = std::getenv("KEEL_TEST_SIGNAL_AFTER_VOTE");
  if (spec == nullptr) return false;
  int want_rank = -1;
  long long want_step = -1;
  return std::sscanf(spec, "%d:%lld", &want_rank, &want_step) == 2 && want_rank == rank && want_step == step;
}

}  // namespace

Status Trainer::Train(const MetricsCallback& callback, bool progress) {
  KEEL_RETURN_IF_ERROR(OpenMetricsFile());
  if (progress) {
    std::fprintf(stderr, "keel-train: %s on %s, %lld parameters, scheme %s\n", config_.model.type.c_str(),
                 backend_->Describe().c_str(), static_cast<long long>(model_->param_count()),
                 scheme_.name.c_str());
  }
  // The policy's ring starts with the state the run starts from (step 0, or
  // the step it resumed at), so that a rollback reaching back before the first
  // periodic snapshot returns there instead of failing: a blow-up at step 538
  // under a rollback of 500 found nothing at or before step 38, and its run
  // switched on from the state that had blown up (session 35's grid).
  if (memory_snapshot_keep_ > 0 && memory_snapshots_.empty() && step_ < config_.steps) {
    KEEL_RETURN_IF_ERROR(TakeSnapshot());
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = step_;
  while (step_ < config_.steps) {
    KEEL_RETURN_IF_ERROR(AwaitLease());
    if (ranks() > 1) {  // rank 0 holds the lease; every rank stops with it
      std::string lapsed = lease_lapsed_ ? "1" : "0";
      KEEL_RETURN_IF_ERROR(FromLeader(&lapsed));
      lease_lapsed_ = lapsed == "1";
    }
    if (lease_lapsed_) {
      stopped_ = true;  // rank 0's decision, which every rank received
      break;
    }
    KEEL_RETURN_IF_ERROR(ProcessCommands());
    // Reopened here after a rollback closed it (before the step: it keeps the
    // lines up to the restored step).
    KEEL_RETURN_IF_ERROR(OpenMetricsFile());
    StepMetrics m;
    KEEL_RETURN_IF_ERROR(Step(&m));
    WriteMetricsLine(&m);
    if (callback) callback(m);
    if (progress && (EveryNth(step_, config_.log_every) || step_ == config_.steps)) PrintProgress(m, start, first);
    KEEL_RETURN_IF_ERROR(ApplyPolicy());
    KEEL_RETURN_IF_ERROR(CheckRanksAgree());
    // The stop vote: a stop asked of any rank stops every rank after this step.
    // Only the vote decides, never a fresh read of stop_requested(): a signal
    // landing after it would make this rank leave alone while the others wait
    // in the next step's collectives. Such a stop is voted on after the next step.
    bool stop = stop_requested();
    if (ranks() > 1) {
      std::vector<std::string> stops;
      KEEL_RETURN_IF_ERROR(comm_->AllGatherHost(stop ? "1" : "0", &stops));
      stop = std::find(stops.begin(), stops.end(), "1") != stops.end();
      if (SignalAfterVote(rank(), step_)) raise(SIGTERM);
    }
    if (stop) {
      stopped_ = true;
      break;
    }
    if (diverged_) break;
    KEEL_RETURN_IF_ERROR(MaybeCheckpoint());
    KEEL_RETURN_IF_ERROR(MaybeSnapshot());
  }
  return FinishTraining(progress);
}

void Trainer::WriteMetricsLine(StepMetrics* m) {
  if (!leader()) return;
  m->unix_ms = UnixMs();
  m->attempt = lease_attempt_;
  std::string line = m->ToJson();
  std::fprintf(metrics_file_, "%s\n", line.c_str());
  std::fflush(metrics_file_);
}

void Trainer::PrintProgress(const StepMetrics& m, std::chrono::steady_clock::time_point start,
                            int64_t first) const {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double eta = elapsed / static_cast<double>(step_ - first) * static_cast<double>(config_.steps - step_);
  // Ranks: this rank's time in collectives and how much of it overlapped its backward.
  char comm[64] = "";
  if (static_cast<size_t>(rank()) < m.rank_comm_seconds.size()) {
    const double total = m.rank_comm_seconds[rank()], exposed = m.rank_comm_exposed_seconds[rank()];
    std::snprintf(comm, sizeof(comm), " | comm %.1f ms, %.0f%% overlapped", total * 1e3,
                  total > 0 ? 100.0 * std::max(0.0, 1.0 - exposed / total) : 0.0);
  }
  std::fprintf(stderr, "step %lld/%lld | loss %.6g | lr %.3g | %.0f %s/s%s | ETA %s%s\n",
               static_cast<long long>(step_), static_cast<long long>(config_.steps), m.loss, m.lr,
               m.tokens_per_s, IsLanguageModel(config_.model) ? "tok" : "samples", comm,
               FormatDuration(eta).c_str(),
               m.evaluated ? (" | val " + std::to_string(m.val_loss)).c_str() : "");
}

// The periodic checkpoint, every checkpoint_every steps; the last step's is
// FinishTraining's.
Status Trainer::MaybeCheckpoint() {
  if (!EveryNth(step_, config_.checkpoint_every) || step_ >= config_.steps) return Status::Ok();
  std::string dir;
  return SaveCheckpoint(&dir);
}

// After the loop: the final checkpoint (unless the lease lapsed) and the
// closing progress line.
Status Trainer::FinishTraining(bool progress) {
  std::string dir;
  if (lease_lapsed_) {
    // Stopped while another attempt may own the run: write nothing more.
    if (progress) std::fprintf(stderr, "keel-train: stopped at step %lld without a checkpoint (lease expired)\n",
                               static_cast<long long>(step_));
    return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(SaveCheckpoint(&dir));
  if (progress) {
    std::fprintf(stderr, "keel-train: %s at step %lld, checkpoint %s\n",
                 diverged_ ? "stopped as diverged" : step_ < config_.steps ? "stopped" : "done",
                 static_cast<long long>(step_), dir.c_str());
  }
  return Status::Ok();
}

Status Trainer::CaptureState(std::vector<float>* weights, std::vector<float>* m, std::vector<float>* v) {
  if (detectors_) {  // every rank: the detectors run on each (a rollback drops the later ones)
    detector_snapshots_.insert_or_assign(step_, *detectors_);
    while (detector_snapshots_.size() > 64) detector_snapshots_.erase(detector_snapshots_.begin());
  }
  const float* adam_m = adam_m_;
  const float* adam_v = adam_v_;
  if (shard_) {
    // ZeRO-1: the moments gathered whole (today's format), into the buffers
    // the next step rewrites before reading: previous_ and grads_.
    KEEL_RETURN_IF_ERROR(GatherShards(adam_m_, previous_));
    KEEL_RETURN_IF_ERROR(GatherShards(adam_v_, grads_));
    adam_m = previous_;
    adam_v = grads_;
  }
  if (!leader()) return Status::Ok();  // the ranks hold the same state: rank 0 keeps it once
  const size_t count = static_cast<size_t>(model_->param_count());
  weights->resize(count);
  m->resize(count);
  v->resize(count);
  KEEL_RETURN_IF_ERROR(backend_->Download(weights->data(), model_->params(), count * sizeof(float)));
  KEEL_RETURN_IF_ERROR(backend_->Download(m->data(), adam_m, count * sizeof(float)));
  return backend_->Download(v->data(), adam_v, count * sizeof(float));
}

Status Trainer::MaybeSnapshot() {
  if (memory_snapshot_keep_ == 0 || !EveryNth(step_, config_.policy.snapshot_every) || step_ >= config_.steps) {
    return Status::Ok();
  }
  return TakeSnapshot();
}

Status Trainer::TakeSnapshot() {
  if (memory_snapshot_keep_ == 0) {
    return Status::Error("TakeSnapshot: this run keeps no snapshots in memory (" +
                         (snapshot_placement_.empty() ? std::string("no policy") : snapshot_placement_) + ")");
  }
  // A step snapshotted before (the step a rollback returned to) is taken again,
  // as a checkpoint directory is rewritten: the scheme may have changed since.
  // Otherwise the oldest entry's buffers are reused once the ring is full.
  std::unique_ptr<LoadedCheckpoint> s;
  if (!memory_snapshots_.empty() && memory_snapshots_.back()->step == step_) {
    s = std::move(memory_snapshots_.back());
    memory_snapshots_.pop_back();
  } else if (static_cast<int>(memory_snapshots_.size()) >= memory_snapshot_keep_ ||
             (!memory_snapshots_.empty() && leader() && !HostHasRoomForSnapshot())) {
    // (Only rank 0 holds the state, so only its host's room counts; every rank
    // still captures, for ZeRO-1's gather.)
    s = std::move(memory_snapshots_.front());
    memory_snapshots_.pop_front();
  } else {
    s.reset(new LoadedCheckpoint);
  }
  KEEL_RETURN_IF_ERROR(CaptureState(&s->weights, &s->m, &s->v));
  KEEL_RETURN_IF_ERROR(StateScalars(s.get()));
  memory_snapshots_.push_back(std::move(s));
  return Status::Ok();
}

bool Trainer::HostHasRoomForSnapshot() {
  // Runs that share a host each take their budget: a new entry is held back
  // when it would leave the host less than 2 GiB or a tenth of its memory,
  // whichever is more. The ring then stays at the size it has (its oldest
  // entry is reused), said once.
  const int64_t available = host_available_mib_ ? host_available_mib_() : HostAvailableMib();
  if (available < 0) return true;  // unknown: the budget alone decides
  const int64_t reserve = std::max<int64_t>(2048, HostMemoryMib() / 10);
  if (static_cast<double>(available) - snapshot_mib_ >= static_cast<double>(reserve)) return true;
  std::fprintf(stderr,
               "keel-train: the host has %lld MiB available: the policy keeps %zu snapshots in memory instead of "
               "%d (a rollback reaching further back uses the run's checkpoints; the longest needs %lld)\n",
               static_cast<long long>(available), memory_snapshots_.size(), memory_snapshot_keep_,
               static_cast<long long>(snapshot_needed_));
  memory_snapshot_keep_ = static_cast<int>(memory_snapshots_.size());
  return false;
}

Status Trainer::SaveCheckpoint(std::string* out_dir) {
  const std::string root = RunDir(config_.run_dir).checkpoints();
  const std::string final_dir = root + "/" + CheckpointDirName(step_);
  *out_dir = final_dir;
  LoadedCheckpoint c;
  KEEL_RETURN_IF_ERROR(CaptureState(&c.weights, &c.m, &c.v));
  if (!leader()) return Status::Ok();  // the ranks hold the same state: rank 0 writes it once
  KEEL_RETURN_IF_ERROR(StateScalars(&c));
  const std::vector<ParamInfo>& params = model_->param_info();
  std::vector<TensorRef> model_tensors, optimizer_tensors;
  for (const ParamInfo& p : params) {
    model_tensors.push_back(TensorRef{p.name, p.shape, c.weights.data() + p.offset});
    optimizer_tensors.push_back(TensorRef{"m." + p.name, p.shape, c.m.data() + p.offset});
    optimizer_tensors.push_back(TensorRef{"v." + p.name, p.shape, c.v.data() + p.offset});
  }
  std::map<std::string, std::string> meta = CheckpointMeta(c);
  const std::string tmp_dir = final_dir + ".tmp";
  KEEL_RETURN_IF_ERROR(MakeDirs(tmp_dir));
  KEEL_RETURN_IF_ERROR(WriteSafetensors(tmp_dir + "/model.safetensors", model_tensors, {{"format", kCheckpointFormat}, {"step", meta["step"]}}));
  KEEL_RETURN_IF_ERROR(WriteSafetensors(tmp_dir + "/optimizer.safetensors", optimizer_tensors, meta));
  KEEL_RETURN_IF_ERROR(CommitCheckpointDir(tmp_dir, final_dir));
  // Keep the newest keep_checkpoints.
  if (config_.keep_checkpoints > 0) {
    for (const std::string& name : CheckpointsToPrune(ListCheckpoints(root), step_, config_.keep_checkpoints)) {
      RemoveCheckpointDir(root + "/" + name);
    }
  }
  return Status::Ok();
}

// What a checkpoint or a memory snapshot holds besides the tensors, as
// ApplyCheckpoint restores it: the scheme, step, learning-rate scale and
// re-warm, the global batch, the data position, the policy's state (empty
// without a policy) and the hot sets (empty without them).
Status Trainer::StateScalars(LoadedCheckpoint* c) const {
  c->scheme = scheme_;
  c->scheme_yaml = SchemeToYaml(scheme_);
  c->step = step_;
  c->lr_scale = lr_scale_;
  c->rewarm_start = rewarm_start_;
  c->micro_batches = static_cast<int64_t>(accum_) * ranks();
  c->position = train_loader_ ? train_loader_->position() : TokenLoader::Position{};
  c->policy_state = engine_ ? PolicyStateToJson(engine_->State(policy_steps_)) : "";
  return model_->HotSetsToText(&c->hot_sets);
}

// What optimizer.safetensors' metadata holds besides the tensors: format,
// model, seed and rank count, and `c`'s scalars (StateScalars): step, scheme,
// lr_scale, the data position and, where they are, the policy's state and the
// hot sets.
std::map<std::string, std::string> Trainer::CheckpointMeta(const LoadedCheckpoint& c) const {
  std::map<std::string, std::string> meta;
  meta["format"] = kCheckpointFormat;
  meta["step"] = std::to_string(c.step);
  meta["model"] = config_.model.type;
  meta["seed"] = std::to_string(config_.seed);
  meta["scheme"] = c.scheme_yaml;
  meta["lr_scale"] = JsonNumber(c.lr_scale);
  meta["rewarm_start"] = std::to_string(c.rewarm_start);
  // The global batch in micro-batches per step, which a resume with another
  // rank count keeps; and the rank count, for the reader.
  meta["micro_batches"] = std::to_string(c.micro_batches);
  meta["ranks"] = std::to_string(ranks());
  if (!c.policy_state.empty()) {
    // What the policy has learnt (policy.h PolicyState), so that a restart
    // escalates where the run would have instead of replaying a rescued
    // blow-up. Metadata is outside keel.crc32 (the data's): it has its own.
    meta[kPolicyStateKey] = c.policy_state;
    meta[kPolicyStateCrcKey] = Crc32Hex(c.policy_state);
  }
  if (train_loader_) {
    meta["data.shard"] = std::to_string(c.position.shard);
    meta["data.offset"] = std::to_string(c.position.offset);
    meta["data.epoch"] = std::to_string(c.position.epoch);
  }
  if (!c.hot_sets.empty()) {
    meta[kHotSetsKey] = c.hot_sets;
    meta[kHotSetsCrcKey] = Crc32Hex(c.hot_sets);
  }
  return meta;
}

void Trainer::SetLease(const std::string& path, int64_t attempt) {
  lease_path_ = path;
  lease_attempt_ = attempt;
  lease_expires_ms_ = 0;
}

Status Trainer::AwaitLease() {
  if (!leader()) return Status::Ok();  // rank 0 holds the run's lease for every rank
  // The file is read again when the deadline read last has passed, and at
  // least every 100 ms, so that another attempt's number is seen quickly.
  const int64_t now = UnixMs();
  if (lease_path_.empty() || (now < lease_expires_ms_ && now < lease_read_ms_ + 100)) return Status::Ok();
  bool said = false;
  for (;;) {
    RunLease lease;
    lease_read_ms_ = UnixMs();
    Status read = ReadRunLease(lease_path_, &lease);
    if (read.ok() && lease.attempt != lease_attempt_) {
      superseded_ = true;
      return Status::Error("superseded: the lease file names attempt " + std::to_string(lease.attempt) +
                           ", this trainer is attempt " + std::to_string(lease_attempt_) +
                           "; stopping without a checkpoint");
    }
    if (read.ok()) lease_expires_ms_ = lease.expires_unix_ms;
    if (read.ok() && UnixMs() < lease_expires_ms_) {
      if (said) std::fprintf(stderr, "keel-train: lease renewed; training on at step %lld\n", static_cast<long long>(step_));
      return Status::Ok();
    }
    if (!said) {
      // keel-worker has not heard from keeld lately: another attempt may be
      // given this run, so no step until the worker renews the lease (or stops us).
      std::fprintf(stderr, "keel-train: lease expired before step %lld (%s); waiting for keel-worker\n",
                   static_cast<long long>(step_ + 1), read.ok() ? "not renewed" : read.message().c_str());
      said = true;
    }
    if (stop_requested()) {
      lease_lapsed_ = true;
      return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

// A checkpoint's scalars as rank 0 sends them to the other ranks.
std::string ScalarsJson(const std::string& scheme_yaml, int64_t step, double lr_scale, int64_t micro_batches,
                        const TokenLoader::Position& p, const std::string& policy_state,
                        const std::string& hot_sets, int64_t rewarm_start) {
  JsonWriter w;
  w.Add("scheme", scheme_yaml).Add("step", step).Add("lr_scale", lr_scale).Add("micro_batches", micro_batches);
  w.Add("policy_state", policy_state).Add("hot_sets", hot_sets).Add("rewarm_start", rewarm_start);
  w.Add("shard", static_cast<int64_t>(p.shard)).Add("offset", static_cast<int64_t>(p.offset));
  w.Add("epoch", static_cast<int64_t>(p.epoch));
  return w.str();
}

}  // namespace

Status Trainer::ResumeNewestValid(const std::string& requested, std::string* resumed) {
  // Rank 0 finds the newest checkpoint that verifies; then every rank resumes it.
  LoadedCheckpoint c;
  std::string chosen;
  std::vector<std::pair<std::string, std::string>> skipped;
  Status found = Status::Ok();
  if (leader()) {
    // Candidates, newest first: the requested checkpoint, then the older ones beside it.
    std::string path = requested;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string root = path == "latest" ? RunDir(config_.run_dir).checkpoints() : DirName(path);
    std::vector<std::string> candidates;
    if (path != "latest") candidates.push_back(path);
    const std::string requested_name = path == "latest" ? "" : path.substr(path.rfind('/') + 1);
    const auto beside = ListCheckpoints(root);
    int64_t limit = INT64_MAX;
    for (const auto& c : beside) {
      if (c.second == requested_name) limit = c.first;
    }
    if (path != "latest" && limit == INT64_MAX) limit = -1;  // not a checkpoint of this layout: no fallback
    for (auto it = beside.rbegin(); it != beside.rend(); ++it) {
      if (it->first < limit) candidates.push_back(root + "/" + it->second);
    }
    for (const std::string& dir : candidates) {
      Status s = ReadCheckpoint(dir, &c);  // kept: the one that verifies is applied below
      if (s.ok()) {
        chosen = dir;
        break;
      }
      skipped.push_back({dir, s.message()});
    }
    if (candidates.empty()) {
      found = Status::Error("no checkpoints under '" + root + "'");
    } else if (chosen.empty()) {
      std::string why;
      for (const auto& bad : skipped) why += (why.empty() ? "" : "; ") + bad.first + ": " + bad.second;
      found = Status::Error("no checkpoint verifies (" + why + ")");
    }
  }
  KEEL_RETURN_IF_ERROR(ApplyCheckpoint(chosen, found, /*restore_policy=*/true, &c));
  KEEL_RETURN_IF_ERROR(FromLeader(&chosen));
  *resumed = chosen;
  for (const auto& bad : skipped) {
    std::fprintf(stderr, "keel-train: skipped checkpoint %s: %s\n", bad.first.c_str(), bad.second.c_str());
    KEEL_RETURN_IF_ERROR(RecordEvent(event_kind::kCheckpointSkipped,
                                     "checkpoint " + bad.first + " does not verify (" + bad.second +
                                         "); resumed from " + chosen,
                                     {{"checkpoint", bad.first}, {"reason", bad.second}, {"resumed_from", chosen}}));
  }
  return Status::Ok();
}

Status Trainer::Resume(const std::string& requested) { return ResumeCheckpoint(requested, /*restore_policy=*/true); }

Status Trainer::ResumeCheckpoint(const std::string& requested, bool restore_policy) {
  // Rank 0 reads and verifies everything before anything changes; the other
  // ranks take its state.
  LoadedCheckpoint c;
  Status read = Status::Ok();
  std::string dir = requested;
  if (leader()) {
    if (requested == "latest") {
      const std::string root = RunDir(config_.run_dir).checkpoints();
      const auto checkpoints = ListCheckpoints(root);
      if (checkpoints.empty()) {
        read = Status::Error("no checkpoints under '" + root + "'");
      } else {
        dir = root + "/" + checkpoints.back().second;
      }
    }
    if (read.ok()) read = ReadCheckpoint(dir, &c);
  }
  return ApplyCheckpoint(dir, read, restore_policy, &c);
}

Status Trainer::ApplyCheckpoint(const std::string& dir, const Status& read, bool restore_policy,
                                LoadedCheckpoint* loaded) {
  LoadedCheckpoint& c = *loaded;
  KEEL_RETURN_IF_ERROR(ShareLeaderStatus(read));
  std::string scalars =
      leader() ? ScalarsJson(c.scheme_yaml, c.step, c.lr_scale, c.micro_batches, c.position, c.policy_state,
                             c.hot_sets, c.rewarm_start)
               : "";
  KEEL_RETURN_IF_ERROR(FromLeader(&scalars));
  JsonValue v;
  KEEL_RETURN_IF_ERROR(ParseJson(scalars, &v));
  KEEL_RETURN_IF_ERROR(ParseSchemeYaml(v.Find("scheme")->string_value(), &c.scheme));
  c.step = v.Find("step")->int_value();
  c.lr_scale = v.Find("lr_scale")->number();
  c.micro_batches = v.Find("micro_batches")->int_value();
  c.position.shard = v.Find("shard")->int_value();
  c.position.offset = v.Find("offset")->int_value();
  c.position.epoch = v.Find("epoch")->int_value();
  c.policy_state = v.Find("policy_state")->string_value();
  c.hot_sets = v.Find("hot_sets")->string_value();
  c.rewarm_start = v.Find("rewarm_start")->int_value();
  PolicyState policy_state;  // empty for a checkpoint without one
  if (!c.policy_state.empty()) {
    KEEL_RETURN_IF_ERROR(ParsePolicyState(c.policy_state, "checkpoint " + dir + "/optimizer.safetensors: " +
                                                              kPolicyStateKey, &policy_state));
  }
  // The global batch stays the checkpoint's: each rank takes its share.
  if (c.micro_batches % ranks() != 0) {
    return Status::InvalidArgument("checkpoint " + dir + ": its global batch is " + std::to_string(c.micro_batches) +
                                   " micro-batches per step, which " + std::to_string(ranks()) +
                                   " ranks cannot split evenly (allowed: a rank count that divides " +
                                   std::to_string(c.micro_batches) + ")");
  }
  if (train_loader_) KEEL_RETURN_IF_ERROR(train_loader_->Seek(c.position));
  const size_t bytes = static_cast<size_t>(model_->param_count()) * sizeof(float);
  // ZeRO-1: the whole moments travel through previous_ and grads_ (rewritten
  // by the next step before it reads them); each rank keeps its shard.
  float* full_m = shard_ ? previous_ : adam_m_;
  float* full_v = shard_ ? grads_ : adam_v_;
  if (leader()) {
    KEEL_RETURN_IF_ERROR(backend_->Upload(model_->params(), c.weights.data(), bytes));
    KEEL_RETURN_IF_ERROR(backend_->Upload(full_m, c.m.data(), bytes));
    KEEL_RETURN_IF_ERROR(backend_->Upload(full_v, c.v.data(), bytes));
  }
  if (ranks() > 1) {
    for (float* p : {model_->params(), full_m, full_v}) KEEL_RETURN_IF_ERROR(comm_->Broadcast(p, bytes, 0));
  }
  if (shard_) {
    const size_t mine = static_cast<size_t>(shard_end_ - shard_begin_) * sizeof(float);
    KEEL_RETURN_IF_ERROR(backend_->CopyBytes(adam_m_, full_m + shard_begin_, mine));
    KEEL_RETURN_IF_ERROR(backend_->CopyBytes(adam_v_, full_v + shard_begin_, mine));
  }
  const int accum = static_cast<int>(c.micro_batches / ranks());
  if (leader() && accum != accum_) {
    std::fprintf(stderr, "keel-train: the checkpoint's global batch is %lld micro-batches per step: each of %d ranks takes %d\n",
                 static_cast<long long>(c.micro_batches), ranks(), accum);
  }
  accum_ = accum;
  scheme_ = c.scheme;
  // The hot sets held at that step (none: the next step chooses them).
  KEEL_RETURN_IF_ERROR(model_->HotSetsFromText(c.hot_sets, c.scheme).WithPrefix("checkpoint " + dir + ": "));
  step_ = c.step;
  lr_scale_ = c.lr_scale;
  rewarm_start_ = c.rewarm_start;
  if (engine_ && restore_policy) policy_steps_ = engine_->Restore(policy_state);
  if (detectors_) {
    // A rollback within this process: the detectors as they were at this
    // step, so that a replay that diverges again in its first steps is seen
    // (their statistics describe the healthy run up to here). A resume from
    // disk: the stream starts again from here.
    const auto kept = detector_snapshots_.find(step_);
    if (kept != detector_snapshots_.end()) {
      *detectors_ = kept->second;
    } else {
      detectors_->Reset();
    }
    detector_snapshots_.erase(detector_snapshots_.upper_bound(step_), detector_snapshots_.end());
  }
  return Status::Ok();
}

Status Trainer::CheckRanksAgree() {
  if (ranks() == 1 || !EveryNth(step_, config_.check_every)) return Status::Ok();
  // FNV-1a over the bytes of the weights and both Adam moments (ZeRO-1: the
  // weights only; each rank holds other moments).
  const size_t count = static_cast<size_t>(model_->param_count());
  std::vector<float> host(count);
  uint64_t hash = 1469598103934665603ull;
  std::vector<const float*> hashed = {model_->params()};
  if (!shard_) hashed.insert(hashed.end(), {adam_m_, adam_v_});
  for (const float* p : hashed) {
    KEEL_RETURN_IF_ERROR(backend_->Download(host.data(), p, count * sizeof(float)));
    const unsigned char* b = reinterpret_cast<const unsigned char*>(host.data());
    for (size_t i = 0; i < count * sizeof(float); ++i) hash = (hash ^ b[i]) * 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  std::vector<std::string> all;
  KEEL_RETURN_IF_ERROR(comm_->AllGatherHost(text, &all));
  if (std::all_of(all.begin(), all.end(), [&](const std::string& h) { return h == all[0]; })) return Status::Ok();
  std::string listed;
  for (size_t r = 0; r < all.size(); ++r) listed += (r ? ", rank " : "rank ") + std::to_string(r) + " " + all[r];
  const std::string message = "ranks hold different weights after step " + std::to_string(step_) + " (" + listed + ")";
  KEEL_RETURN_IF_ERROR(RecordEvent(event_kind::kRankMismatch, message, {{"hashes", listed}}));
  return Status::Error(message);
}

// Reads and verifies a checkpoint directory (CRCs, format, matching steps,
// model type, every tensor's presence and shape, the scheme); changes nothing.
namespace {

// *value = meta[key] when it is there with meta[crc_key] its CRC-32, "" when
// neither is; DataLoss (naming `where` and the key) when one is missing or
// the CRC does not match. Metadata lies outside keel.crc32 (the data's).
Status VerifiedMeta(std::map<std::string, std::string>& meta, const char* key, const char* crc_key,
                    const std::string& where, std::string* value) {
  value->clear();
  const bool has = meta.count(key) > 0, has_crc = meta.count(crc_key) > 0;
  if (has != has_crc) {
    return Status::DataLoss(where + key + (has ? ": " + std::string(crc_key) + " is missing"
                                               : " is missing beside its " + std::string(crc_key)));
  }
  if (!has) return Status::Ok();
  if (meta[crc_key] != Crc32Hex(meta[key])) {
    return Status::DataLoss(where + key + ": CRC-32 " + Crc32Hex(meta[key]) + " does not match " + crc_key + " " +
                            meta[crc_key] + " (corrupt)");
  }
  *value = meta[key];
  return Status::Ok();
}

}  // namespace

Status Trainer::ReadCheckpoint(const std::string& dir, LoadedCheckpoint* out) const {
  std::vector<Tensor> weights, optimizer;
  std::map<std::string, std::string> wmeta, meta;
  KEEL_RETURN_IF_ERROR(ReadSafetensors(dir + "/model.safetensors", &weights, &wmeta));
  KEEL_RETURN_IF_ERROR(ReadSafetensors(dir + "/optimizer.safetensors", &optimizer, &meta));
  if (meta["format"] != kCheckpointFormat) {
    return Status::Error("checkpoint " + dir + ": format '" + meta["format"] + "' is not " + kCheckpointFormat);
  }
  if (wmeta["step"] != meta["step"]) {
    return Status::Error("checkpoint " + dir + ": model.safetensors is from step " + wmeta["step"] +
                         " but optimizer.safetensors from step " + meta["step"]);
  }
  if (meta["model"] != config_.model.type) {
    return Status::Error("checkpoint " + dir + ": holds a '" + meta["model"] + "' model, the config a '" +
                         config_.model.type + "'");
  }
  KEEL_RETURN_IF_ERROR(GatherCheckpointTensors(dir, weights, optimizer, out));
  KEEL_RETURN_IF_ERROR(ParseSchemeYaml(meta["scheme"], &out->scheme));
  out->scheme_yaml = meta["scheme"];
  // Before ranks, a checkpoint's global batch was its writer's grad_accum.
  out->micro_batches = meta.count("micro_batches") ? std::atoll(meta["micro_batches"].c_str()) : config_.grad_accum;
  if (out->micro_batches < 1) {
    return Status::DataLoss("checkpoint " + dir + ": micro_batches '" + meta["micro_batches"] + "' is not a positive count");
  }
  out->step = std::atoll(meta["step"].c_str());
  out->position.shard = std::atoll(meta["data.shard"].c_str());
  out->position.offset = std::atoll(meta["data.offset"].c_str());
  out->position.epoch = std::atoll(meta["data.epoch"].c_str());
  out->lr_scale = meta.count("lr_scale") ? std::atof(meta["lr_scale"].c_str()) : 1.0;
  out->rewarm_start = meta.count("rewarm_start") ? std::atoll(meta["rewarm_start"].c_str()) : -1;
  // The policy's state and the hot sets, verified whether or not this run
  // uses them: a checkpoint with a corrupt part is not one to resume.
  const std::string where = "checkpoint " + dir + "/optimizer.safetensors: ";
  KEEL_RETURN_IF_ERROR(VerifiedMeta(meta, kPolicyStateKey, kPolicyStateCrcKey, where, &out->policy_state));
  if (!out->policy_state.empty()) {
    PolicyState parsed;
    KEEL_RETURN_IF_ERROR(ParsePolicyState(out->policy_state, where + kPolicyStateKey, &parsed));
  }
  KEEL_RETURN_IF_ERROR(VerifiedMeta(meta, kHotSetsKey, kHotSetsCrcKey, where, &out->hot_sets));
  if (!out->hot_sets.empty()) {
    // Refused here, before anything is applied: the sets must fit this model.
    PrecisionScheme scheme;
    KEEL_RETURN_IF_ERROR(ParseSchemeYaml(meta["scheme"], &scheme).WithPrefix(where + "scheme: "));
    KEEL_RETURN_IF_ERROR(model_->CheckHotSetsText(out->hot_sets, scheme).WithPrefix(where + kHotSetsKey + ": "));
  }
  return Status::Ok();
}

// The model's tensors and their Adam moments, by name, into flat buffers:
// every one must be there with the model's shape, and nothing else in
// model.safetensors.
Status Trainer::GatherCheckpointTensors(const std::string& dir, const std::vector<Tensor>& weights,
                                        const std::vector<Tensor>& optimizer, LoadedCheckpoint* out) const {
  const std::vector<ParamInfo>& params = model_->param_info();
  std::map<std::string, const Tensor*> by_name;
  for (const Tensor& t : weights) by_name[t.name] = &t;
  for (const Tensor& t : optimizer) by_name["opt:" + t.name] = &t;
  const size_t count = static_cast<size_t>(model_->param_count());
  std::vector<float> w(count, 0.0f), m(count, 0.0f), v(count, 0.0f);
  for (const ParamInfo& p : params) {
    for (const std::string& key : {p.name, "opt:m." + p.name, "opt:v." + p.name}) {
      auto it = by_name.find(key);
      if (it == by_name.end()) return Status::Error("checkpoint " + dir + ": tensor '" + key + "' is missing");
      if (it->second->shape != p.shape) {
        return Status::Error("checkpoint " + dir + ": tensor '" + key + "' has another shape than the model's");
      }
    }
    std::copy(by_name[p.name]->data.begin(), by_name[p.name]->data.end(), w.begin() + p.offset);
    std::copy(by_name["opt:m." + p.name]->data.begin(), by_name["opt:m." + p.name]->data.end(), m.begin() + p.offset);
    std::copy(by_name["opt:v." + p.name]->data.begin(), by_name["opt:v." + p.name]->data.end(), v.begin() + p.offset);
  }
  if (weights.size() != params.size()) {
    return Status::Error("checkpoint " + dir + ": holds " + std::to_string(weights.size()) +
                         " tensors, the model has " + std::to_string(params.size()));
  }
  out->weights = std::move(w);
  out->m = std::move(m);
  out->v = std::move(v);
  return Status::Ok();
}

}  // namespace keel
