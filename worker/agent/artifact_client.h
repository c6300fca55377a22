// keel-worker's side of keeld's artifact store (docs/service.md, "Artifacts"):
// uploading the checkpoints its trainers keep, and downloading the one a run
// resumes from when this host does not have it.
//
// Upload order: the agent snapshots a new checkpoint at once (hard links into
// <work_dir>/uploads/, so the trainer's pruning cannot take it away), and hands
// it to the CheckpointUploader only once keeld has acknowledged the
// checkpoint's notice: by then every metric point up to its step is stored, so
// a run resumed from it elsewhere leaves no gap.
#ifndef KEEL_WORKER_AGENT_ARTIFACT_CLIENT_H_
#define KEEL_WORKER_AGENT_ARTIFACT_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kernels/base/status.h"
#include "proto/keel.grpc.pb.h"

namespace keel {

// Copies checkpoint directory `from` to the new directory `to` as hard links
// (a copy where links are not possible). The trainer never rewrites a file in
// place, so the links are a snapshot.
Status SnapshotCheckpoint(const std::string& from, const std::string& to);

// Uploads checkpoint directory `dir` as run_id/step (UploadCheckpoint, one
// stream, `worker_id` in the metadata). *result: keeld's answer. `context`
// (fresh; its deadline, if any, set by the caller) lets another thread cancel it.
Status UploadCheckpointDir(v1::WorkerService::Stub* stub, grpc::ClientContext* context, const std::string& token,
                           const std::string& worker_id, const std::string& dir, v1::CheckpointHeader header,
                           v1::UploadCheckpointResponse* result);

// How long one checkpoint's upload may take before it is given up (the next
// checkpoint is uploaded in its turn).
constexpr int kUploadDeadlineS = 1800;

// Downloads run_id/step (DownloadCheckpoint) into the new directory `dest`,
// verified (checkpoint_transfer.h ReceiveCheckpoint). `context` lets another
// thread cancel it.
Status DownloadCheckpointDir(v1::WorkerService::Stub* stub, grpc::ClientContext* context, const std::string& run_id,
                             int64_t step, const std::string& dest);

// One background thread uploading snapshots, the newest per run: a newer
// checkpoint of a run replaces its pending one (whose snapshot is deleted).
// Every snapshot handed over is deleted once uploaded or given up.
class CheckpointUploader {
 public:
  CheckpointUploader(std::string token, bool verbose);
  ~CheckpointUploader();  // gives up what is pending, cancels the upload under way, joins the thread

  // The channel and worker id of the agent's current connection.
  void SetConnection(std::shared_ptr<grpc::Channel> channel, const std::string& worker_id);
  // Queues snapshot `dir` (run, step, attempt and notice_seq in `header`).
  void Add(const std::string& dir, const v1::CheckpointHeader& header);
  // Drops the run's pending upload (its trainer was stopped: another attempt owns it).
  void Forget(const std::string& run_id);
  int64_t uploaded() const { return uploaded_.load(); }
  int64_t failed() const { return failed_.load(); }

 private:
  struct Job {
    std::string dir;
    v1::CheckpointHeader header;
  };
  void Loop();

  const std::string token_;
  const bool verbose_;
  std::mutex mu_;  // guards everything below but the counters and thread_
  std::condition_variable cv_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string worker_id_;
  grpc::ClientContext* active_ = nullptr;  // the upload under way (cancelled by the destructor)
  std::map<std::string, Job> pending_;  // by run id
  bool stop_ = false;
  std::atomic<int64_t> uploaded_{0}, failed_{0};
  std::thread thread_;
};

}  // namespace keel

#endif  // KEEL_WORKER_AGENT_ARTIFACT_CLIENT_H_
