// keel-worker's uploads and downloads of checkpoints (see artifact_client.h).
#include "worker/agent/artifact_client.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "worker/io/file_util.h"
#include "worker/run/checkpoint_transfer.h"

namespace keel {

Status SnapshotCheckpoint(const std::string& from, const std::string& to) {
  std::vector<std::string> names;
  KEEL_RETURN_IF_ERROR(ListDir(from, &names));
  RemoveFlatDir(to);
  KEEL_RETURN_IF_ERROR(MakeDirs(to));
  for (const std::string& n : names) {
    const std::string src = from + "/" + n, dst = to + "/" + n;
    if (link(src.c_str(), dst.c_str()) == 0) continue;
    std::string bytes;  // another filesystem: a copy
    Status s = ReadFile(src, &bytes);
    if (s.ok()) s = WriteFileAtomic(dst, bytes);
    if (!s.ok()) {
      RemoveFlatDir(to);
      return s;
    }
  }
  return Status::Ok();
}

Status UploadCheckpointDir(v1::WorkerService::Stub* stub, grpc::ClientContext* context, const std::string& token,
                           const std::string& worker_id, const std::string& dir, v1::CheckpointHeader header,
                           v1::UploadCheckpointResponse* result) {
  KEEL_RETURN_IF_ERROR(DescribeCheckpoint(dir, &header));
  context->AddMetadata("authorization", "Bearer " + token);
  context->AddMetadata("keel-worker-id", worker_id);
  auto writer = stub->UploadCheckpoint(context, result);
  Status sent = SendCheckpoint(dir, header, [&](const v1::CheckpointChunk& c) { return writer->Write(c); });
  if (sent.ok()) writer->WritesDone();
  // keeld may answer before taking every byte (the checkpoint is stored
  // already, or it refused the upload): its answer is the status.
  grpc::Status status = writer->Finish();
  if (!status.ok()) {
    return Status::Unavailable("keeld refused or lost the upload: " + status.error_message());
  }
  if (!sent.ok() && sent.code() != StatusCode::kUnavailable) return sent;
  if (!sent.ok() && !result->already_stored()) return sent;
  return Status::Ok();
}

Status DownloadCheckpointDir(v1::WorkerService::Stub* stub, grpc::ClientContext* context, const std::string& run_id,
                             int64_t step, const std::string& dest) {
  v1::DownloadCheckpointRequest request;
  request.set_run_id(run_id);
  request.set_step(step);
  auto reader = stub->DownloadCheckpoint(context, request);
  v1::CheckpointHeader header;
  Status s = ReceiveCheckpoint([&](v1::CheckpointChunk* c) { return reader->Read(c); }, run_id, step, dest, &header);
  if (!s.ok()) {
    // Unavailable: the stream ended (keeld's status says why); else stop keeld sending.
    if (s.code() != StatusCode::kUnavailable) context->TryCancel();
    grpc::Status status = reader->Finish();
    if (!status.ok()) return Status::Unavailable(s.message() + " (keeld: " + status.error_message() + ")");
    return s;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return Status::Unavailable("keeld: " + status.error_message());
  return Status::Ok();
}

CheckpointUploader::CheckpointUploader(std::string token, bool verbose)
    : token_(std::move(token)), verbose_(verbose), thread_([this] { Loop(); }) {}

CheckpointUploader::~CheckpointUploader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& p : pending_) RemoveFlatDir(p.second.dir);
    pending_.clear();
    if (active_ != nullptr) active_->TryCancel();
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointUploader::SetConnection(std::shared_ptr<grpc::Channel> channel, const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  channel_ = std::move(channel);
  worker_id_ = worker_id;
  cv_.notify_all();
}

void CheckpointUploader::Add(const std::string& dir, const v1::CheckpointHeader& header) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(header.run_id());
  if (it != pending_.end() && it->second.dir != dir) RemoveFlatDir(it->second.dir);
  pending_[header.run_id()] = Job{dir, header};
  cv_.notify_all();
}

void CheckpointUploader::Forget(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(run_id);
  if (it == pending_.end()) return;
  RemoveFlatDir(it->second.dir);
  pending_.erase(it);
}

void CheckpointUploader::Loop() {
  for (;;) {
    Job job;
    std::shared_ptr<grpc::Channel> channel;
    std::string worker_id;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (!pending_.empty() && channel_); });
      if (stop_) return;
      job = pending_.begin()->second;
      pending_.erase(pending_.begin());
      channel = channel_;
      worker_id = worker_id_;
    }
    const std::string what = "run " + job.header.run_id() + " checkpoint step " + std::to_string(job.header.step());
    auto stub = v1::WorkerService::NewStub(channel);
    v1::UploadCheckpointResponse result;
    const auto start = std::chrono::steady_clock::now();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kUploadDeadlineS));
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stop_;
      if (!stopping) active_ = &context;
    }
    if (stopping) {
      RemoveFlatDir(job.dir);
      return;
    }
    Status s = UploadCheckpointDir(stub.get(), &context, token_, worker_id, job.dir, job.header, &result);
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_ = nullptr;
    }
    RemoveFlatDir(job.dir);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s.ok()) {
      ++uploaded_;
      if (verbose_) {
        std::fprintf(stderr, "keel-worker: %s uploaded to keeld (%lld bytes in %.2f s%s%s)\n", what.c_str(),
                     static_cast<long long>(result.bytes()), seconds, result.already_stored() ? ", stored already" : "",
                     result.recorded() ? "" : ", not the run's newest");
      }
    } else {
      // The next checkpoint is uploaded in its turn; keeld resumes from the
      // newest one it has.
      ++failed_;
      if (verbose_) std::fprintf(stderr, "keel-worker: %s not uploaded: %s\n", what.c_str(), s.message().c_str());
    }
  }
}

}  // namespace keel
