// keel-worker's agent (see agent.h).
#include "worker/agent/agent.h"

#include <dlfcn.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/base/host.h"
#include "proto/channel.h"
#include "proto/keel.grpc.pb.h"
#include "worker/io/file_util.h"
#include "worker/io/json.h"
#include "worker/run/checkpoint_dirs.h"
#include "worker/run/checkpoint_transfer.h"
#include "worker/run/run_dir.h"
#include "proto/event_kinds.h"
#include "worker/run/trainer_exit.h"

namespace keel {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Commands read by the stream's reader thread, handled on the agent thread.
class CommandQueue {
 public:
  void Push(v1::WorkerCommand c) {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(c));
  }
  std::vector<v1::WorkerCommand> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::WorkerCommand> out(commands_.begin(), commands_.end());
    commands_.clear();
    return out;
  }

 private:
  std::mutex mu_;  // guards commands_
  std::deque<v1::WorkerCommand> commands_;
};

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The step of the newest checkpoint beside `checkpoint` (NewestCheckpointBeside)
// that this host can read; -1 when there is none here.
int64_t StepReadableBeside(const std::string& checkpoint) {
  if (checkpoint.empty()) return -1;
  const std::string newest = NewestCheckpointBeside(checkpoint);
  const size_t slash = newest.rfind('/');
  const std::string name = slash == std::string::npos ? newest : newest.substr(slash + 1);
  if (!IsDir(newest) || name.size() != 13 || name.rfind("step_", 0) != 0) return -1;
  return std::atoll(name.c_str() + 5);
}

constexpr int kDownloadTries = 3;

}  // namespace

namespace {

// NVML through dlopen: no build-time CUDA dependency, and a machine without the
// driver simply has no GPUs. Loaded once and kept (unloading it while the driver
// holds state is not safe).
struct Nvml {
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, void**) = nullptr;
  int (*name)(void*, char*, unsigned int) = nullptr;
  int (*memory)(void*, Memory*) = nullptr;
  bool ok = false;

  static const Nvml& Get() {
    static const Nvml* nvml = [] {
      Nvml* n = new Nvml;
      void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!lib) return n;
      auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
      n->count = reinterpret_cast<int (*)(unsigned int*)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
      n->handle = reinterpret_cast<int (*)(unsigned int, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
      n->name = reinterpret_cast<int (*)(void*, char*, unsigned int)>(dlsym(lib, "nvmlDeviceGetName"));
      n->memory = reinterpret_cast<int (*)(void*, Memory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
      n->ok = init && n->count && n->handle && n->name && n->memory && init() == 0;
      return n;
    }();
    return *nvml;
  }
};

}  // namespace

std::vector<v1::Device> DetectGpus() {
  // Indices are NVML's (PCI bus order); the trainer gets CUDA_DEVICE_ORDER=PCI_BUS_ID
  // so that CUDA counts the same way.
  std::vector<v1::Device> devices;
  const Nvml& nvml = Nvml::Get();
  unsigned int n = 0;
  if (!nvml.ok || nvml.count(&n) != 0) return devices;
  for (unsigned int i = 0; i < n; ++i) {
    void* h = nullptr;
    if (nvml.handle(i, &h) != 0) continue;
    char text[96] = {0};
    Nvml::Memory mem = {0, 0, 0};
    nvml.name(h, text, sizeof(text));
    nvml.memory(h, &mem);
    v1::Device d;
    d.set_index(static_cast<int32_t>(i));
    d.set_name(text);
    d.set_memory_bytes(static_cast<int64_t>(mem.total));
    devices.push_back(d);
  }
  return devices;
}

Status SelectGpus(const std::string& list, std::vector<v1::Device>* devices) {
  std::string there;
  for (const v1::Device& d : *devices) there += (there.empty() ? "" : ",") + std::to_string(d.index());
  const std::string allowed = " (allowed: a comma-separated list of this host's GPU indices: " +
                              (there.empty() ? std::string("none found") : there) + ")";
  std::vector<v1::Device> kept;
  std::set<int> seen;
  size_t begin = 0;
  for (;;) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    char* stop = nullptr;
    const long index = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || index < 0) return Status::InvalidArgument("--gpus: '" + item + "' is not a GPU index" + allowed);
    if (!seen.insert(static_cast<int>(index)).second) return Status::InvalidArgument("--gpus: " + item + " is named twice" + allowed);
    auto d = std::find_if(devices->begin(), devices->end(), [&](const v1::Device& x) { return x.index() == index; });
    if (d == devices->end()) return Status::InvalidArgument("--gpus: no GPU " + item + " on this host" + allowed);
    kept.push_back(*d);
    if (end == list.size()) break;
    begin = end + 1;
  }
  *devices = std::move(kept);
  return Status::Ok();
}

std::vector<v1::Device> FakeGpus(int count) {
  std::vector<v1::Device> devices;
  for (int i = 0; i < count; ++i) {
    v1::Device d;
    d.set_index(i);
    d.set_name("fake GPU");
    d.set_memory_bytes(kFakeGpuMemoryBytes);
    devices.push_back(d);
  }
  return devices;
}

std::vector<GpuMemory> GpuMemoryInUse() {
  std::vector<GpuMemory> out;
  const Nvml& nvml = Nvml::Get();
  unsigned int n = 0;
  if (!nvml.ok || nvml.count(&n) != 0) return out;
  for (unsigned int i = 0; i < n; ++i) {
    void* h = nullptr;
    Nvml::Memory mem = {0, 0, 0};
    if (nvml.handle(i, &h) != 0 || nvml.memory(h, &mem) != 0) continue;
    out.push_back({static_cast<int>(i), static_cast<int64_t>(mem.used), static_cast<int64_t>(mem.total)});
  }
  return out;
}

AgentStats Agent::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Agent::PublishStats(bool connected) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.trainers = static_cast<int>(runs_.size());
  stats_.connected = connected;
  stats_.unacknowledged = static_cast<int64_t>(pending_.size() + unacked_.size());
  int64_t work = 0;
  for (const auto* queue : {&pending_, &unacked_}) {
    for (const v1::WorkerMessage& m : *queue) work += m.has_heartbeat() ? 0 : 1;
  }
  stats_.unacknowledged_work = work;
  stats_.checkpoints_uploaded = uploader_->uploaded();
  stats_.checkpoint_uploads_failed = uploader_->failed();
}

Agent::Agent(AgentOptions options) : options_(std::move(options)) {
  // Checkpoint paths go to keeld and may be resumed by another worker on a
  // shared filesystem: make them absolute.
  options_.work_dir = AbsolutePath(options_.work_dir);
  // keel-worker checked the list (ParseServerList); a bad one here is tried as given.
  if (!ParseServerList(options_.server, "server", &servers_).ok()) servers_ = {options_.server};
  if (options_.host.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    options_.host = name;
  }
  // Snapshots an earlier keel-worker left here were never uploaded: their
  // runs have moved on (another attempt uploads its own).
  std::vector<std::string> left;
  if (ListDir(options_.work_dir + "/uploads", &left).ok()) {
    for (const std::string& n : left) RemoveFlatDir(options_.work_dir + "/uploads/" + n);
  }
  uploader_.reset(new CheckpointUploader(options_.token, options_.verbose));
}

Agent::~Agent() {
  for (auto& d : downloads_) EndDownload(d.second.get());
}

void Agent::EndDownload(Download* d) {
  d->cancelled = true;
  {
    std::lock_guard<std::mutex> lock(d->mu);
    if (d->context) d->context->TryCancel();
  }
  if (d->thread.joinable()) d->thread.join();
}

void Agent::Queue(v1::WorkerMessage message, int64_t attempt) {
  message.set_worker_id(worker_id_);
  message.set_attempt(attempt);
  message.set_seq(next_seq_++);
  // The seq is this message's for good (re-sends keep it), and worker_id_ is
  // set before any run exists: the key names this event alone.
  if (message.has_event()) message.mutable_event()->set_key(worker_id_ + "#" + std::to_string(message.seq()));
  pending_.push_back(std::move(message));
  while (pending_.size() > options_.max_pending) pending_.pop_front();
}

void Agent::HandleCommand(const v1::WorkerCommand& command) {
  auto event = [&](const std::string& run_id, const std::string& kind, const std::string& text) {
    v1::WorkerMessage m;
    m.mutable_event()->set_run_id(run_id);
    m.mutable_event()->set_unix_ms(NowMs());
    m.mutable_event()->set_kind(kind);
    m.mutable_event()->set_message(text);
    Queue(std::move(m));
  };
  if (command.has_start()) {
    const v1::Assignment& a = command.start();
    auto existing = runs_.find(a.run_id());
    if (existing != runs_.end()) {
      if (existing->second->launch().attempt == a.attempt()) return;  // a re-sent assignment
      StopRun(a.run_id(), "keeld started attempt " + std::to_string(a.attempt()) + " of it");
    }
    auto downloading = downloads_.find(a.run_id());
    if (downloading != downloads_.end()) {
      if (downloading->second->assignment.attempt() == a.attempt()) return;  // a re-sent assignment
      StopRun(a.run_id(), "keeld started attempt " + std::to_string(a.attempt()) + " of it");
    }
    std::string resume = a.resume_checkpoint();
    const int64_t artifact = a.resume_artifact_step();
    if (artifact > 0 && StepReadableBeside(resume) < artifact) {
      // keeld stored a newer checkpoint than this host can see: this run's
      // own copy of it, or a download.
      const std::string checkpoints = RunDir(options_.work_dir + "/runs/" + a.run_id()).checkpoints();
      const std::string own = checkpoints + "/" + CheckpointDirName(artifact);
      if (IsDir(own)) {
        resume = own;
      } else {
        std::unique_ptr<Download> d(new Download);
        d->assignment = a;
        d->dest = own;
        Download* raw = d.get();
        Status made = MakeDirs(checkpoints);
        if (!made.ok()) {
          raw->result = made;
          raw->done = true;
        } else {
          if (options_.verbose) {
            std::fprintf(stderr, "keel-worker: run %s: downloading checkpoint step %lld from keeld\n",
                         a.run_id().c_str(), static_cast<long long>(artifact));
          }
          raw->thread = std::thread([raw, channel = channel_, token = options_.token, worker = worker_id_,
                                     verbose = options_.verbose] {
            Status s = Status::Unavailable("not connected to keeld");
            for (int attempt = 1; attempt <= kDownloadTries && !raw->cancelled.load() && channel; ++attempt) {
              grpc::ClientContext* context = nullptr;
              {
                std::lock_guard<std::mutex> lock(raw->mu);
                raw->context.reset(new grpc::ClientContext);
                context = raw->context.get();
                context->AddMetadata("authorization", "Bearer " + token);
                context->AddMetadata("keel-worker-id", worker);
              }
              auto stub = v1::WorkerService::NewStub(channel);
              s = DownloadCheckpointDir(stub.get(), context, raw->assignment.run_id(),
                                        raw->assignment.resume_artifact_step(), raw->dest);
              if (s.ok() || raw->cancelled.load()) break;
              if (verbose) {
                std::fprintf(stderr, "keel-worker: run %s: download of checkpoint step %lld, try %d of %d: %s\n",
                             raw->assignment.run_id().c_str(),
                             static_cast<long long>(raw->assignment.resume_artifact_step()), attempt, kDownloadTries,
                             s.message().c_str());
              }
              for (int i = 0; i < 5 * attempt && !raw->cancelled.load(); ++i) {
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
              }
            }
            raw->result = s;
            raw->done = true;
          });
        }
        downloads_[a.run_id()] = std::move(d);
        return;
      }
    }
    StartRun(a, resume);
  } else if (command.has_bootstrap()) {
    // A gang's rendezvous, relayed by keeld from rank 0's worker: where this
    // worker's ranks wait for it.
    auto it = runs_.find(command.bootstrap().run_id());
    if (it == runs_.end()) return;
    Status st = WriteFileAtomic(RunDir(it->second->launch().run_dir).bootstrap(), command.bootstrap().id());
    if (!st.ok()) event(command.bootstrap().run_id(), event_kind::kCommandFailed, "bootstrap id: " + st.message());
  } else if (command.has_cancel()) {
    auto it = runs_.find(command.cancel().run_id());
    if (it != runs_.end()) it->second->Signal(SIGTERM);  // checkpoint, then exit 130
    auto downloading = downloads_.find(command.cancel().run_id());
    if (downloading != downloads_.end()) {  // PollDownloads reports the exit
      Download* d = downloading->second.get();
      d->cancelled = true;
      std::lock_guard<std::mutex> lock(d->mu);
      if (d->context) d->context->TryCancel();
    }
  } else if (command.has_switch_precision() || command.has_rollback()) {
    // Handed to the trainer as a command file; it reports what it did in events.jsonl.
    const std::string run_id =
        command.has_rollback() ? command.rollback().run_id() : command.switch_precision().run_id();
    auto it = runs_.find(run_id);
    if (it == runs_.end()) {
      event(run_id, event_kind::kCommandFailed, "run " + run_id + " is not running on this worker");
      return;
    }
    JsonWriter w;
    if (command.has_rollback()) {
      w.Add("kind", event_kind::kRollback).Add("steps", command.rollback().steps());
      w.Add("precision", command.rollback().precision()).Add("reason", command.rollback().reason());
    } else {
      w.Add("kind", event_kind::kSwitchPrecision).Add("precision", command.switch_precision().precision());
      w.Add("reason", command.switch_precision().reason());
    }
    Status st = it->second->SendCommand(w.str());
    if (!st.ok()) event(run_id, event_kind::kCommandFailed, st.message());
  }
}

void Agent::StartRun(const v1::Assignment& a, const std::string& resume) {
  RunLaunch launch;
  launch.attempt = a.attempt();
  launch.lease_expires_unix_ms = NowMs() + TrainerLeaseMs();
  launch.data_roots = options_.data_roots;
  launch.run_id = a.run_id();
  launch.trainer = options_.trainer;
  launch.run_dir = options_.work_dir + "/runs/" + a.run_id();
  launch.spec_yaml = a.spec().yaml();
  launch.gpus.assign(a.device_indices().begin(), a.device_indices().end());
  launch.fake_gpus = options_.fake_gpus;
  launch.resume_checkpoint = resume;
  launch.ranks = std::max(1, a.ranks());
  launch.first_rank = a.first_rank();
  launch.world = a.world();
  if (launch.world > launch.ranks && launch.first_rank == 0) {
    launch.advertise = options_.advertise;
    if (launch.advertise.empty()) launch.advertise = LocalAddressToward(server());
    if (launch.advertise.empty()) launch.advertise = options_.host;
  }
  std::unique_ptr<RunSupervisor> s;
  Status st = RunSupervisor::Start(launch, &s);
  if (!st.ok()) {
    v1::WorkerMessage m;
    m.mutable_exit()->set_run_id(a.run_id());
    m.mutable_exit()->set_exit_code(-1);
    m.mutable_exit()->set_message("keel-worker could not start the trainer: " + st.message());
    Queue(std::move(m), a.attempt());
    return;
  }
  v1::WorkerMessage m;
  m.mutable_started()->set_run_id(a.run_id());
  m.mutable_started()->set_pid(s->pid());
  Queue(std::move(m), a.attempt());
  if (options_.verbose) std::fprintf(stderr, "keel-worker: started run %s (pid %d)\n", a.run_id().c_str(), s->pid());
  runs_[a.run_id()] = std::move(s);
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.starts;
}

void Agent::PollDownloads() {
  for (auto it = downloads_.begin(); it != downloads_.end();) {
    Download* d = it->second.get();
    if (!d->done.load()) {
      ++it;
      continue;
    }
    if (d->thread.joinable()) d->thread.join();
    const v1::Assignment a = d->assignment;
    const std::string what = "checkpoint step " + std::to_string(a.resume_artifact_step()) + " of run " + a.run_id();
    v1::WorkerMessage m;
    m.mutable_exit()->set_run_id(a.run_id());
    if (d->cancelled.load()) {
      m.mutable_exit()->set_exit_code(trainer_exit::kInterrupted);
      m.mutable_exit()->set_message("cancelled while keel-worker was downloading " + what);
      Queue(std::move(m), a.attempt());
    } else if (!d->result.ok()) {
      m.mutable_exit()->set_exit_code(trainer_exit::kFailed);
      m.mutable_exit()->set_message("keel-worker could not download " + what + " from keeld (" +
                                    std::to_string(kDownloadTries) + " tries): " + d->result.message());
      if (options_.verbose) std::fprintf(stderr, "keel-worker: %s\n", m.exit().message().c_str());
      Queue(std::move(m), a.attempt());
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.checkpoint_downloads_failed;
    } else {
      if (options_.verbose) std::fprintf(stderr, "keel-worker: run %s: downloaded and verified %s\n", a.run_id().c_str(), what.c_str());
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        ++stats_.checkpoints_downloaded;
      }
      StartRun(a, d->dest);
    }
    it = downloads_.erase(it);
  }
}

void Agent::Acknowledged(const v1::WorkerMessage& message) {
  if (!message.has_checkpoint()) return;
  const v1::CheckpointNotice& notice = message.checkpoint();
  auto it = snapshots_.find(notice.run_id());
  if (it == snapshots_.end() || it->second.first != notice.step()) return;  // a newer one waits for its own ack
  v1::CheckpointHeader header;
  header.set_run_id(notice.run_id());
  header.set_step(notice.step());
  header.set_attempt(message.attempt());
  header.set_notice_seq(message.seq());
  uploader_->Add(it->second.second, header);
  snapshots_.erase(it);
}

void Agent::StopRun(const std::string& run_id, const std::string& why) {
  auto downloading = downloads_.find(run_id);
  if (downloading != downloads_.end()) {
    EndDownload(downloading->second.get());
    downloads_.erase(downloading);
  }
  auto snapshot = snapshots_.find(run_id);
  if (snapshot != snapshots_.end()) {
    RemoveFlatDir(snapshot->second.second);
    snapshots_.erase(snapshot);
  }
  uploader_->Forget(run_id);
  auto it = runs_.find(run_id);
  if (it != runs_.end()) {
    if (options_.verbose) std::fprintf(stderr, "keel-worker: stopping run %s (pid %d): %s\n", run_id.c_str(), it->second->pid(), why.c_str());
    runs_.erase(it);  // SIGKILL and reap: a superseded trainer writes no checkpoint
    bootstrap_sent_.erase(run_id);
  }
  auto about = [&](const v1::WorkerMessage& m) {
    switch (m.body_case()) {
      case v1::WorkerMessage::kMetric: return m.metric().run_id() == run_id;
      case v1::WorkerMessage::kEvent: return m.event().run_id() == run_id;
      case v1::WorkerMessage::kCheckpoint: return m.checkpoint().run_id() == run_id;
      case v1::WorkerMessage::kExit: return m.exit().run_id() == run_id;
      case v1::WorkerMessage::kStarted: return m.started().run_id() == run_id;
      default: return false;
    }
  };
  for (auto* queue : {&pending_, &unacked_}) {
    queue->erase(std::remove_if(queue->begin(), queue->end(), about), queue->end());
  }
}

void Agent::RenewLeases(int64_t expires_unix_ms) {
  for (auto& run : runs_) {
    Status s = run.second->RenewLease(expires_unix_ms);
    if (!s.ok() && options_.verbose) std::fprintf(stderr, "keel-worker: %s\n", s.message().c_str());
  }
}

void Agent::PollRuns() {
  PollDownloads();
  for (auto it = runs_.begin(); it != runs_.end();) {
    const int64_t attempt = it->second->launch().attempt;
    RunProgress p;
    Status st = it->second->Poll(&p);
    if (!st.ok() && options_.verbose) std::fprintf(stderr, "keel-worker: %s\n", st.message().c_str());
    // In the order RunProgress gives: a rollback's event reaches keeld after
    // the abandoned trajectory's points and before the new trajectory's.
    auto queue_events = [&] {
      for (v1::Event& e : p.events) {
        v1::WorkerMessage m;
        *m.mutable_event() = std::move(e);
        Queue(std::move(m), attempt);
      }
    };
    if (p.events_first) queue_events();
    for (v1::MetricPoint& metric : p.metrics) {
      v1::WorkerMessage m;
      *m.mutable_metric() = std::move(metric);
      Queue(std::move(m), attempt);
    }
    if (!p.events_first) queue_events();
    // A gang's part with rank 0: once rank 0 has published its id, keeld
    // relays it to the other parts' workers (once per attempt).
    const RunLaunch& launch = it->second->launch();
    if (launch.world > launch.ranks && launch.first_rank == 0 && bootstrap_sent_[it->first] != attempt) {
      std::string id;
      if (ReadFile(RunDir(launch.run_dir).bootstrap(), &id).ok() && !id.empty()) {
        v1::WorkerMessage m;
        m.mutable_bootstrap()->set_run_id(it->first);
        m.mutable_bootstrap()->set_id(id);
        Queue(std::move(m), attempt);
        bootstrap_sent_[it->first] = attempt;
      }
    }
    for (v1::CheckpointNotice& c : p.checkpoints) {
      // A snapshot now, uploaded once keeld acknowledged the notice.
      const std::string snapshot = options_.work_dir + "/uploads/" + c.run_id() + "-" + CheckpointDirName(c.step());
      Status taken = SnapshotCheckpoint(c.path(), snapshot);
      if (taken.ok()) {
        auto old = snapshots_.find(c.run_id());
        if (old != snapshots_.end() && old->second.second != snapshot) RemoveFlatDir(old->second.second);
        snapshots_[c.run_id()] = {c.step(), snapshot};
      } else if (options_.verbose) {
        std::fprintf(stderr, "keel-worker: run %s: no upload of checkpoint step %lld: %s\n", c.run_id().c_str(),
                     static_cast<long long>(c.step()), taken.message().c_str());
      }
      v1::WorkerMessage m;
      *m.mutable_checkpoint() = std::move(c);
      Queue(std::move(m), attempt);
    }
    if (p.exited) {
      if (options_.verbose) {
        std::fprintf(stderr, "keel-worker: run %s exited (code %d, signal %d)\n", it->first.c_str(),
                     p.exit.exit_code(), p.exit.signal());
      }
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        const int code = p.exit.exit_code();
        ++stats_.exits[p.exit.signal() ? "signal" : code == trainer_exit::kDone ? "ok" : code == trainer_exit::kDiverged ? "diverged"
                                                     : code == trainer_exit::kInterrupted ? "interrupted" : "failed"];
      }
      v1::WorkerMessage m;
      *m.mutable_exit() = p.exit;
      Queue(std::move(m), attempt);
      bootstrap_sent_.erase(it->first);
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Agent::Serve(const std::atomic<bool>* stop) {
  ChannelOptions channel_options;
  channel_options.address = server();
  channel_options.tls_ca = options_.tls_ca;
  channel_options.tls_cert = options_.tls_cert;
  channel_options.tls_key = options_.tls_key;
  std::shared_ptr<grpc::Channel> channel;
  Status made = MakeChannel(channel_options, &channel);
  if (!made.ok()) {
    if (options_.verbose) std::fprintf(stderr, "keel-worker: %s\n", made.message().c_str());
    return false;
  }
  auto stub = v1::WorkerService::NewStub(channel);
  v1::RegisterRequest request;
  request.set_host(options_.host);
  for (const v1::Device& d : options_.devices) *request.add_devices() = d;
  request.set_cpu_slots(options_.devices.empty() ? options_.cpu_slots : 0);
  request.set_worker_id(worker_id_);
  // Live runs: still training here, or ended with their exit not yet delivered
  // (keeld must keep them assigned to us until that exit arrives).
  std::map<std::string, int64_t> live;
  for (const auto& run : runs_) live[run.first] = run.second->launch().attempt;
  for (const auto& d : downloads_) live[d.first] = d.second->assignment.attempt();
  for (const auto* queue : {&unacked_, &pending_}) {
    for (const v1::WorkerMessage& m : *queue) {
      if (m.has_exit()) live[m.exit().run_id()] = m.attempt();
    }
  }
  for (const auto& run : live) {
    v1::LiveRun* l = request.add_live_runs();
    l->set_run_id(run.first);
    l->set_attempt(run.second);
  }
  v1::RegisterResponse response;
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + options_.token);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status status = stub->Register(&context, request, &response);
    if (!status.ok()) {
      if (options_.verbose) {
        std::fprintf(stderr, "keel-worker: register with %s failed: %s\n", server().c_str(),
                     status.error_message().c_str());
      }
      return false;
    }
  }
  const bool first = worker_id_.empty();
  worker_id_ = response.worker_id();
  channel_ = channel;
  uploader_->SetConnection(channel, worker_id_);
  if (response.lease_ms() > 0) lease_ms_ = response.lease_ms();
  // Runs keeld gave to another attempt while this worker was away.
  for (const std::string& run_id : response.stop_run_ids()) {
    StopRun(run_id, "keeld gave it to another attempt while this worker was away");
  }
  // What the last connection wrote but keeld never acknowledged goes out again first.
  pending_.insert(pending_.begin(), unacked_.begin(), unacked_.end());
  unacked_.clear();
  for (v1::WorkerMessage& m : pending_) m.set_worker_id(worker_id_);
  ++connects_;
  if (options_.verbose) {
    std::fprintf(stderr, "keel-worker: %s %s as %s (%zu GPUs, %d CPU slots, %zu live runs)\n",
                 first ? "registered with" : "reconnected to", server().c_str(), worker_id_.c_str(),
                 options_.devices.size(), request.cpu_slots(), runs_.size());
  }
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + options_.token);
  context.AddMetadata("keel-worker-id", worker_id_);
  auto stream = stub->Connect(&context);
  CommandQueue commands;
  std::atomic<bool> reader_done{false};
  std::thread reader([&] {
    v1::WorkerCommand command;
    while (stream->Read(&command)) commands.Push(command);
    reader_done = true;
  });
  const int64_t heartbeat_ms = response.heartbeat_interval_ms() > 0 ? response.heartbeat_interval_ms() : 1000;
  int64_t last_heartbeat = 0;
  bool healthy = true;
  while (!stop->load() && healthy && !reader_done.load()) {
    for (const v1::WorkerCommand& c : commands.Take()) {
      if (c.has_ack()) {
        int64_t heartbeat_sent = 0;
        while (!unacked_.empty() && unacked_.front().seq() <= c.ack().seq()) {
          if (unacked_.front().has_heartbeat()) heartbeat_sent = unacked_.front().heartbeat().unix_ms();
          Acknowledged(unacked_.front());
          unacked_.pop_front();
        }
        // keeld heard us at or after heartbeat_sent, so its lease on this worker
        // runs at least until heartbeat_sent + lease: the trainers' ends earlier.
        if (heartbeat_sent > 0) RenewLeases(heartbeat_sent + TrainerLeaseMs());
      } else if (c.has_reregister()) {
        if (options_.verbose) std::fprintf(stderr, "keel-worker: keeld: %s; registering again\n", c.reregister().reason().c_str());
        healthy = false;
      } else {
        HandleCommand(c);
      }
    }
    PollRuns();
    if (NowMs() - last_heartbeat >= heartbeat_ms) {
      v1::WorkerMessage m;
      m.mutable_heartbeat()->set_unix_ms(NowMs());
      Queue(std::move(m));
      last_heartbeat = NowMs();
    }
    while (!pending_.empty()) {
      if (!stream->Write(pending_.front())) {
        healthy = false;  // keeld went away: keep the message for the next connection
        break;
      }
      unacked_.push_back(std::move(pending_.front()));
      pending_.pop_front();
      while (unacked_.size() > options_.max_pending) unacked_.pop_front();
    }
    PublishStats(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.poll_ms));
  }
  PublishStats(false);
  context.TryCancel();
  reader.join();
  return true;
}

Status Agent::Run(const std::atomic<bool>* stop) {
  int backoff_ms = 100;
  size_t failed_in_a_row = 0;  // addresses that could not be served, since the last that could
  while (!stop->load()) {
    bool reached = Serve(stop);
    if (stop->load()) break;
    if (reached) {
      // The stream ended: this address first again, after a short pause.
      failed_in_a_row = 0;
      backoff_ms = 100;
    } else {
      // Unreachable, or a standby refusing: the next address at once; a
      // backoff only once every address failed in a row.
      current_server_ = (current_server_ + 1) % servers_.size();
      if (++failed_in_a_row % servers_.size() != 0) continue;
    }
    // Keep the runs going while keeld is away; their output waits in pending_.
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms);
    while (std::chrono::steady_clock::now() < until && !stop->load()) {
      PollRuns();
      PublishStats(false);
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.poll_ms));
    }
    if (!reached) backoff_ms = std::min(options_.max_backoff_ms, backoff_ms * 2);
  }
  return Status::Ok();
}

}  // namespace keel
