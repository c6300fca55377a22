// keeld's gRPC services (see service.h).
#include "server/service.h"

#include <chrono>
#include <cstdio>
#include <mutex>

#include "proto/status_grpc.h"
#include "worker/run/checkpoint_transfer.h"

namespace keel {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    default: return "OTHER";
  }
}

// One unary RPC: the caller must be `who` (else the refusal is the answer),
// then `handler` answers; the latency is recorded by method and status code,
// refusals included.
// A standby keeld refuses first (UNAVAILABLE, whatever the token), so that a
// client moves on to its next address.
template <typename Handler>
grpc::Status Unary(grpc::ServerContext* ctx, const ServingGate& gate, const AuthConfig& auth, Caller who,
                   KeeldMetrics* metrics, const char* method, Handler handler) {
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status;
  Coordinator* c = gate.Get(&status);
  if (c != nullptr) status = Authorize(*ctx, auth, who);
  if (c != nullptr && status.ok()) status = handler(c);
  if (metrics) {
    metrics->ObserveRpc(method, CodeName(status.error_code()),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return status;
}

// The worker's id from the "keel-worker-id" metadata (its Register answer).
grpc::Status WorkerId(const grpc::ServerContext& ctx, std::string* id) {
  auto it = ctx.client_metadata().find("keel-worker-id");
  if (it == ctx.client_metadata().end()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "keel-worker-id metadata: missing (Register first)");
  }
  id->assign(it->second.data(), it->second.size());
  return grpc::Status::OK;
}

// Streams a stored checkpoint (DownloadCheckpoint, FetchCheckpoint).
grpc::Status SendArtifact(Coordinator* c, const v1::DownloadCheckpointRequest& req,
                          grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  v1::CheckpointHeader header;
  grpc::Status found = c->FindArtifact(req.run_id(), req.step(), &header);
  if (!found.ok()) return found;
  Status sent = c->artifacts()->Send(header, [writer](const v1::CheckpointChunk& chunk) { return writer->Write(chunk); });
  if (!sent.ok()) {
    return ToGrpcStatus(sent.WithPrefix("run " + req.run_id() + " step " + std::to_string(header.step()) + ": "));
  }
  return grpc::Status::OK;
}

}  // namespace

void ServingGate::SetStandbyReason(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  reason_ = reason;
}

Coordinator* ServingGate::Get(grpc::Status* refusal) const {
  Coordinator* c = coordinator_.load();
  if (c == nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    *refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, reason_);
  }
  return c;
}

// The coordinator, or the standby's refusal as the RPC's answer.
#define KEEL_ACTIVE(c)                     \
  grpc::Status _refusal;                   \
  Coordinator* c = gate_->Get(&_refusal);  \
  if (c == nullptr) return _refusal

#define KEEL_AUTHORIZE(ctx, who)                              \
  do {                                                        \
    grpc::Status _allowed = Authorize(*(ctx), *auth_, (who)); \
    if (!_allowed.ok()) return _allowed;                      \
  } while (0)

grpc::Status UserService::SubmitSweep(grpc::ServerContext* ctx, const v1::SubmitSweepRequest* req,
                                      v1::SubmitSweepResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "SubmitSweep", [&](Coordinator* c) { return c->SubmitSweep(req->spec(), out); });
}

grpc::Status UserService::GetSweep(grpc::ServerContext* ctx, const v1::GetSweepRequest* req, v1::Sweep* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "GetSweep", [&](Coordinator* c) { return c->GetSweep(req->sweep_id(), out); });
}

grpc::Status UserService::ListSweeps(grpc::ServerContext* ctx, const v1::ListSweepsRequest* req, v1::ListSweepsResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "ListSweeps", [&](Coordinator* c) { return c->ListSweeps(*req, out); });
}

grpc::Status UserService::CancelSweep(grpc::ServerContext* ctx, const v1::CancelSweepRequest* req, v1::Sweep* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "CancelSweep",
               [&](Coordinator* c) { return c->CancelSweep(req->sweep_id(), out); });
}

grpc::Status UserService::ListRuns(grpc::ServerContext* ctx, const v1::ListRunsRequest* req, v1::ListRunsResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "ListRuns", [&](Coordinator* c) { return c->ListRuns(*req, out); });
}

grpc::Status UserService::GetRun(grpc::ServerContext* ctx, const v1::GetRunRequest* req, v1::Run* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "GetRun", [&](Coordinator* c) { return c->GetRun(req->run_id(), out); });
}

grpc::Status UserService::CancelRun(grpc::ServerContext* ctx, const v1::CancelRunRequest* req, v1::Run* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "CancelRun", [&](Coordinator* c) { return c->CancelRun(req->run_id(), out); });
}

grpc::Status UserService::Watch(grpc::ServerContext* ctx, Coordinator* c, const grpc::Status& found,
                                const std::string& id, grpc::ServerWriter<v1::WatchUpdate>* writer) {
  if (!found.ok()) return found;
  std::shared_ptr<Subscription> sub;
  grpc::Status s = c->Watch(id, &sub);
  if (!s.ok()) return s;
  std::vector<v1::WatchUpdate> updates;
  while (!ctx->IsCancelled() && sub->Next(200, &updates)) {
    bool ok = true;
    for (const v1::WatchUpdate& u : updates) ok = ok && writer->Write(u);
    if (!ok) break;  // the watcher went away
  }
  c->Unwatch(sub);
  return grpc::Status::OK;
}

grpc::Status UserService::WatchRun(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                                   grpc::ServerWriter<v1::WatchUpdate>* writer) {
  KEEL_ACTIVE(c);
  KEEL_AUTHORIZE(ctx, Caller::kUser);
  v1::Run run;
  return Watch(ctx, c, c->GetRun(req->id(), &run), req->id(), writer);
}

grpc::Status UserService::WatchSweep(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                                     grpc::ServerWriter<v1::WatchUpdate>* writer) {
  KEEL_ACTIVE(c);
  KEEL_AUTHORIZE(ctx, Caller::kUser);
  v1::Sweep sweep;
  return Watch(ctx, c, c->GetSweep(req->id(), &sweep), req->id(), writer);
}

grpc::Status UserService::GetMetrics(grpc::ServerContext* ctx, const v1::GetMetricsRequest* req,
                                     v1::GetMetricsResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "GetMetrics", [&](Coordinator* c) { return c->GetMetrics(*req, out); });
}

grpc::Status UserService::ListEvents(grpc::ServerContext* ctx, const v1::ListEventsRequest* req,
                                     v1::ListEventsResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "ListEvents", [&](Coordinator* c) { return c->ListEvents(*req, out); });
}

grpc::Status UserService::Intervene(grpc::ServerContext* ctx, const v1::InterveneRequest* req,
                                    v1::InterveneResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "Intervene", [&](Coordinator* c) { return c->Intervene(*req, out); });
}

grpc::Status UserService::ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                                      v1::ListWorkersResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kUser, metrics_, "ListWorkers", [&](Coordinator* c) { return c->ListWorkers(out); });
}

grpc::Status UserService::FetchCheckpoint(grpc::ServerContext* ctx, const v1::DownloadCheckpointRequest* req,
                                          grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  KEEL_ACTIVE(c);
  KEEL_AUTHORIZE(ctx, Caller::kUser);
  return SendArtifact(c, *req, writer);
}

grpc::Status FleetService::DownloadCheckpoint(grpc::ServerContext* ctx, const v1::DownloadCheckpointRequest* req,
                                              grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  KEEL_ACTIVE(c);
  KEEL_AUTHORIZE(ctx, Caller::kWorker);
  return SendArtifact(c, *req, writer);
}

grpc::Status FleetService::UploadCheckpoint(grpc::ServerContext* ctx, grpc::ServerReader<v1::CheckpointChunk>* reader,
                                            v1::UploadCheckpointResponse* out) {
  KEEL_ACTIVE(c);
  KEEL_AUTHORIZE(ctx, Caller::kWorker);
  std::string worker_id;
  grpc::Status s = WorkerId(*ctx, &worker_id);
  if (!s.ok()) return s;
  v1::CheckpointChunk chunk;
  if (!reader->Read(&chunk)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "upload: no header");
  if (!chunk.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "upload: the first chunk has no header (allowed: header first)");
  }
  const v1::CheckpointHeader header = chunk.header();
  s = c->CheckUpload(worker_id, header);
  if (!s.ok()) return s;
  std::unique_ptr<ArtifactStore::Upload> upload;
  Status st = c->artifacts()->BeginUpload(header, &upload);
  if (!st.ok()) return ToGrpcStatus(st);
  // An identical checkpoint is stored already: answered now, without its
  // bytes (the worker's writes then fail, and its Finish reads this answer).
  if (!upload->already_stored()) {
    while (reader->Read(&chunk)) {
      st = upload->Add(chunk);
      if (!st.ok()) return ToGrpcStatus(st);  // the upload's directory goes with it
    }
    st = upload->Commit();
    if (!st.ok()) return ToGrpcStatus(st);
  }
  bool recorded = false;
  int64_t protect = 0;
  s = c->CheckpointUploaded(worker_id, header, &recorded, &protect);
  // Retention applies whatever became of this one (it is the newest, or kept
  // only while it is among the newest).
  Status pruned = c->artifacts()->Prune(header.run_id(), protect);
  if (!pruned.ok()) std::fprintf(stderr, "keeld: run %s: %s\n", header.run_id().c_str(), pruned.message().c_str());
  if (!s.ok()) return s;
  out->set_step(header.step());
  out->set_bytes(upload->bytes());
  out->set_already_stored(upload->already_stored());
  out->set_recorded(recorded);
  return grpc::Status::OK;
}

grpc::Status FleetService::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                                    v1::RegisterResponse* out) {
  return Unary(ctx, *gate_, *auth_, Caller::kWorker, metrics_, "Register", [&](Coordinator* c) { return c->RegisterWorker(*req, out); });
}

grpc::Status FleetService::Connect(grpc::ServerContext* ctx,
                                   grpc::ServerReaderWriter<v1::WorkerCommand, v1::WorkerMessage>* stream) {
  KEEL_ACTIVE(c_);
  KEEL_AUTHORIZE(ctx, Caller::kWorker);
  auto it = ctx->client_metadata().find("keel-worker-id");
  if (it == ctx->client_metadata().end()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "keel-worker-id metadata: missing (Register first)");
  }
  const std::string worker_id(it->second.data(), it->second.size());
  // Commands come from other threads (scheduling, cancels); one writer at a time.
  auto write_mu = std::make_shared<std::mutex>();
  uint64_t stream_id = 0;
  grpc::Status attached = c_->AttachWorker(
      worker_id,
      [stream, write_mu](const v1::WorkerCommand& command) {
        std::lock_guard<std::mutex> lock(*write_mu);
        return stream->Write(command);
      },
      // keeld ends the stream (lease expired): the pending Read returns false
      // here and the worker's reads end, so it registers again.
      [ctx]() { ctx->TryCancel(); },
      &stream_id);
  if (!attached.ok()) return attached;
  v1::WorkerMessage message;
  grpc::Status result = grpc::Status::OK;
  while (stream->Read(&message)) {
    const Coordinator::MessageResult handled = c_->HandleWorkerMessage(worker_id, stream_id, message);
    if (handled == Coordinator::MessageResult::kNotStored) {
      // Unacknowledged: the worker keeps it, and re-sends it once reconnected.
      result = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "keeld could not store message " + std::to_string(message.seq()) +
                                " (its store failed a write); reconnect and send it again");
      break;
    }
    if (handled == Coordinator::MessageResult::kNotTheWorkers) {
      // This stream no longer counts as the worker's: say so and end it.
      v1::WorkerCommand order;
      order.mutable_reregister()->set_reason("this stream is no longer the worker's (lease expired): register again");
      {
        std::lock_guard<std::mutex> lock(*write_mu);
        stream->Write(order);
      }
      result = grpc::Status(grpc::StatusCode::ABORTED, "worker '" + worker_id + "': lease expired; register again");
      break;
    }
    // Messages are handled in stream order, so after a heartbeat everything
    // before it is stored: acknowledge up to there (once a heartbeat interval).
    // Not while points sit unstored after a failed store write: the worker
    // keeps them and sends them again if keeld goes away meanwhile.
    if (message.has_heartbeat() && message.seq() > 0 && c_->MetricsStored()) {
      v1::WorkerCommand ack;
      ack.mutable_ack()->set_seq(message.seq());
      std::lock_guard<std::mutex> lock(*write_mu);
      if (!stream->Write(ack)) break;
    }
  }
  c_->DetachWorker(worker_id, stream_id);
  return result;
}

}  // namespace keel
