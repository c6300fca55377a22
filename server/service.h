// keeld's gRPC services: thin layers that authorize the caller, call the
// Coordinator and return its status. KeelService needs a user token,
// WorkerService the worker join token.
#ifndef KEEL_SERVER_SERVICE_H_
#define KEEL_SERVER_SERVICE_H_

#include <atomic>
#include <mutex>
#include <string>

#include "proto/keel.grpc.pb.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace keel {

// Whether keeld's services answer. A standby keeld (keeld --standby) serves
// from the start but refuses every RPC with UNAVAILABLE and the reason
// ("standby: ..."), so that clients given several addresses move on to the
// next; Activate hands it the Coordinator once it holds the database's lock.
// A gate is activated at most once and never goes back: a keeld that loses
// the lock exits (the fencing rule, store.h).
class ServingGate {
 public:
  ServingGate() = default;
  explicit ServingGate(Coordinator* coordinator) : coordinator_(coordinator) {}

  // The refusal's text while standby.
  void SetStandbyReason(const std::string& reason);
  void Activate(Coordinator* coordinator) { coordinator_.store(coordinator); }
  // The coordinator once active; else null, with *refusal the UNAVAILABLE answer.
  Coordinator* Get(grpc::Status* refusal) const;

 private:
  std::atomic<Coordinator*> coordinator_{nullptr};
  mutable std::mutex mu_;  // guards reason_
  std::string reason_ = "standby: this keeld waits for the active keeld's database lock";
};

class UserService final : public v1::KeelService::Service {
 public:
  // metrics may be null (no RPC latency histograms).
  UserService(Coordinator* coordinator, const AuthConfig* auth, KeeldMetrics* metrics = nullptr)
      : own_gate_(coordinator), gate_(&own_gate_), auth_(auth), metrics_(metrics) {}
  // Serves through `gate` (which must outlive the service): refuses while standby.
  UserService(const ServingGate* gate, const AuthConfig* auth, KeeldMetrics* metrics = nullptr)
      : gate_(gate), auth_(auth), metrics_(metrics) {}

  grpc::Status SubmitSweep(grpc::ServerContext* ctx, const v1::SubmitSweepRequest* req, v1::SubmitSweepResponse* out) override;
  grpc::Status GetSweep(grpc::ServerContext* ctx, const v1::GetSweepRequest* req, v1::Sweep* out) override;
  grpc::Status ListSweeps(grpc::ServerContext* ctx, const v1::ListSweepsRequest* req, v1::ListSweepsResponse* out) override;
  grpc::Status CancelSweep(grpc::ServerContext* ctx, const v1::CancelSweepRequest* req, v1::Sweep* out) override;
  grpc::Status ListRuns(grpc::ServerContext* ctx, const v1::ListRunsRequest* req, v1::ListRunsResponse* out) override;
  grpc::Status GetRun(grpc::ServerContext* ctx, const v1::GetRunRequest* req, v1::Run* out) override;
  grpc::Status CancelRun(grpc::ServerContext* ctx, const v1::CancelRunRequest* req, v1::Run* out) override;
  grpc::Status WatchRun(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                        grpc::ServerWriter<v1::WatchUpdate>* writer) override;
  grpc::Status WatchSweep(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                          grpc::ServerWriter<v1::WatchUpdate>* writer) override;
  grpc::Status GetMetrics(grpc::ServerContext* ctx, const v1::GetMetricsRequest* req, v1::GetMetricsResponse* out) override;
  grpc::Status ListEvents(grpc::ServerContext* ctx, const v1::ListEventsRequest* req, v1::ListEventsResponse* out) override;
  grpc::Status Intervene(grpc::ServerContext* ctx, const v1::InterveneRequest* req, v1::InterveneResponse* out) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req, v1::ListWorkersResponse* out) override;
  grpc::Status FetchCheckpoint(grpc::ServerContext* ctx, const v1::DownloadCheckpointRequest* req,
                               grpc::ServerWriter<v1::CheckpointChunk>* writer) override;

 private:
  // Streams the updates of run or sweep `id` once `found`, the look-up of `id`
  // as what the RPC watches, is OK; else `found` is the answer.
  grpc::Status Watch(grpc::ServerContext* ctx, Coordinator* c, const grpc::Status& found, const std::string& id,
                     grpc::ServerWriter<v1::WatchUpdate>* writer);
  ServingGate own_gate_;
  const ServingGate* gate_;
  const AuthConfig* auth_;
  KeeldMetrics* metrics_;
};

class FleetService final : public v1::WorkerService::Service {
 public:
  FleetService(Coordinator* coordinator, const AuthConfig* auth, KeeldMetrics* metrics = nullptr)
      : own_gate_(coordinator), gate_(&own_gate_), auth_(auth), metrics_(metrics) {}
  FleetService(const ServingGate* gate, const AuthConfig* auth, KeeldMetrics* metrics = nullptr)
      : gate_(gate), auth_(auth), metrics_(metrics) {}

  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req, v1::RegisterResponse* out) override;
  // The worker names itself with the "keel-worker-id" metadata (its Register answer).
  grpc::Status Connect(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<v1::WorkerCommand, v1::WorkerMessage>* stream) override;
  // Receives a checkpoint into the artifact store (Coordinator::CheckUpload
  // first, then the store's commit protocol), records it as the run's
  // artifact_step and applies retention. The worker names itself with the
  // "keel-worker-id" metadata.
  grpc::Status UploadCheckpoint(grpc::ServerContext* ctx, grpc::ServerReader<v1::CheckpointChunk>* reader,
                                v1::UploadCheckpointResponse* out) override;
  grpc::Status DownloadCheckpoint(grpc::ServerContext* ctx, const v1::DownloadCheckpointRequest* req,
                                  grpc::ServerWriter<v1::CheckpointChunk>* writer) override;

 private:
  ServingGate own_gate_;
  const ServingGate* gate_;
  const AuthConfig* auth_;
  KeeldMetrics* metrics_;
};

}  // namespace keel

#endif  // KEEL_SERVER_SERVICE_H_
