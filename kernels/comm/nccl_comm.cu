// The NCCL communicator of nccl_comm.h: the bf16 conversion kernels, then the
// communicator (join, collectives on the backend's stream, polled waits).
#include "kernels/comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda_status.h"
#include "kernels/quant_core.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Kernels ------------------------------------------------------------------------

constexpr int kThreads = 256;

// dst[i] = bf16 of src[i], nearest even: the rounding of formats.h's
// FloatToBf16 and of the TCP communicator (qcore::Bf16Round is checked against
// it by quant_core_test).
__global__ void RoundToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = qcore::Bf16Round(src[i], Rounding::kNearestEven, 0.0f);
  }
}

// dst[i] = src[i] widened to fp32 (exact).
__global__ void WidenBf16Kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = qcore::Bf16Value(src[i]);
  }
}

int GridFor(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

// ---- The communicator ----------------------------------------------------------------
//
// Every synchronous collective ends by waiting (polled, bounded by the
// timeout) until the stream has run it. Queuing it and returning would let the
// backend's next blocking wait (Download, SumSquares: cudaStreamSynchronize, no
// timeout) be the first to wait on it, and a peer that died mid-collective
// would then hang this rank instead of failing it. The cost is one host round
// trip per collective, which the trainer pays anyway: each of its collectives
// is followed by a host read (a loss sum, a norm) within the same step.
//
// Started collectives (StartAllReduceSum) run on a stream of their own, the
// communication stream: it waits for an event recorded on the backend's stream
// at the start (the gradients' kernels have run), then runs the collective
// between two timing events. Wait makes the backend's stream wait for the end
// event and polls that event from the host with the timeout, so the same rule
// holds: the first wait on a collective is a bounded one. A synchronous
// collective first makes the backend's stream wait for the last started one,
// so the order on the device is the order of the calls.

std::string Seconds(double s) {
  std::ostringstream text;
  text << s;
  return text.str();
}

Status NcclError(ncclResult_t result, const char* call, const char* file, int line) {
  return Status::Error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                       ncclGetErrorString(result));
}

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(int rank, int world, double timeout_s, cudaStream_t stream)
      : rank_(rank), world_(world), timeout_s_(timeout_s), stream_(stream) {}
  ~NcclComm() override;

  // Joins with `id` (every rank's the same), polling until the join completes
  // or timeout_s passes.
  Status Init(const ncclUniqueId& id);

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* name() const override { return "nccl"; }

  Status AllReduceSum(float* data, int64_t count, ReducePrecision precision) override;
  Status ReduceScatterSum(const float* in, float* out, int64_t count, ReducePrecision precision) override;
  Status AllGather(const float* in, float* out, int64_t count) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;
  Status AllGatherHost(const std::string& mine, std::vector<std::string>* all) override;
  Status StartAllReduceSum(float* data, int64_t count, ReducePrecision precision, CommHandle* handle) override;
  Status Wait(CommHandle handle, double* seconds) override;

 private:
  // A started collective's events: `ready` on the backend's stream at the
  // start, `begin` and `end` on the communication stream around the
  // collective (timed: end - begin is its duration on the device).
  struct Started {
    cudaEvent_t ready = nullptr, begin = nullptr, end = nullptr;
  };
  // Ok while no collective has failed; else kFailedPrecondition quoting the failure.
  Status Usable(const char* op) const;
  // Records the first failure, aborts the communicator (its kernels stop and
  // the peers' operations with this rank fail) and returns `s`.
  Status Fail(Status s);
  // The state of an NCCL call just made: in non-blocking mode a call may
  // answer ncclInProgress, and no other NCCL call may follow until
  // ncclCommGetAsyncError says it is done; this polls that (up to timeout_s)
  // and then checks the communicator for an error a peer caused.
  Status Settle(ncclResult_t result, const char* call, const char* op, const char* file, int line);
  // Waits until the stream has run everything queued on it, polling
  // cudaStreamQuery and the communicator's error state; past timeout_s the
  // communicator is aborted.
  Status WaitStream(const char* op);
  // The loop behind every wait: polls `query` (cudaSuccess: done;
  // cudaErrorNotReady: not yet) and the communicator's error state until done,
  // an error, or timeout_s (then the communicator is aborted).
  Status PollUntilDone(const char* op, const char* query_name, const std::function<cudaError_t()>& query);
  // A synchronous collective's first step: the backend's stream waits for the
  // last started collective (and so for every one before it).
  Status AfterStarted();
  // The communication stream, created at the first start (highest priority:
  // a collective's kernels get SMs beside the backward's).
  Status CommStream();
  // Events for Started, from a pool (created with timing).
  Status TakeEvent(cudaEvent_t* event);
  void ReleaseStarted(const Started& started);
  // A CUDA failure inside `op`: fails the communicator.
  Status Cuda(cudaError_t error, const char* call, const char* file, int line);
  // Device scratch *ptr of at least `bytes` (*have now), freed and allocated in
  // `stream`'s order when it must grow: the backend stream's scratch_ and the
  // communication stream's comm_scratch_.
  Status Scratch(size_t bytes, cudaStream_t stream, void** ptr, size_t* have);
  Status Scratch(size_t bytes) { return Scratch(bytes, stream_, &scratch_, &scratch_bytes_); }
  // Queues the all-reduce of AllReduceSum (fp32, or bf16 on the wire through
  // the scratch *scratch of `stream`) on `stream`, without waiting; count > 0.
  Status EnqueueAllReduce(float* data, int64_t count, ReducePrecision precision, cudaStream_t stream,
                          void** scratch, size_t* scratch_bytes, const char* op);
  // Pinned host staging of at least `bytes`: device-to-host copies into
  // pageable memory would block the thread until the stream drains (no
  // timeout); into pinned memory they are queued and WaitStream polls.
  Status Staging(size_t bytes);
  Status Timeout(const char* what);

  const int rank_, world_;
  const double timeout_s_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;  // null before Init and after an abort
  std::string failure_;        // the first failure; empty while usable
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  char* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  // Started collectives (see the comment above the class).
  cudaStream_t comm_stream_ = nullptr;
  std::map<CommHandle, Started> started_;  // started, not yet waited for
  CommHandle next_handle_ = 1;
  CommHandle last_started_ = 0;
  std::vector<cudaEvent_t> spare_events_;
  // The bf16 wire of started collectives, ordered on the communication stream
  // (one at a time runs there, so one buffer serves them all).
  void* comm_scratch_ = nullptr;
  size_t comm_scratch_bytes_ = 0;
};

#define NCCL_SETTLE(call, op) Settle((call), #call, op, __FILE__, __LINE__)
#define NCCL_CUDA(call) Cuda((call), #call, __FILE__, __LINE__)
// Returns from the enclosing method when `expr` failed.
#define NCCL_TRY(expr) KEEL_RETURN_IF_ERROR(expr)

Clock::time_point DeadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Between polls: spin briefly (a collective of a training step usually ends
// within microseconds of being waited for), then sleep so that a long wait
// leaves the CPU to the other ranks.
void Pause(int polls) {
  if (polls < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) {
    // A clean end: our part of every collective has run, so finalizing
    // (flushing what NCCL's proxy still sends) needs no peer. Bounded by the
    // timeout like every wait; past it, or on any error, abort.
    bool clean = WaitStream("destroy").ok() && comm_ != nullptr;
    if (clean && comm_stream_ != nullptr) {
      clean = PollUntilDone("destroy", "cudaStreamQuery", [this] { return cudaStreamQuery(comm_stream_); }).ok() && comm_ != nullptr;
    }
    if (clean) {
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto deadline = DeadlineAfter(timeout_s_);
      for (int polls = 0; state == ncclInProgress && Clock::now() < deadline; ++polls) {
        Pause(polls);
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else if (comm_ != nullptr) {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  // Stream-ordered frees: nothing here waits for the device.
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
  if (comm_scratch_ != nullptr) cudaFreeAsync(comm_scratch_, comm_stream_);
  for (const auto& s : started_) ReleaseStarted(s.second);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);  // an event still pending is released when it completes
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);  // likewise: no wait
  if (staging_ != nullptr) {
    // cudaFreeHost waits for the device; only do it when the stream is idle.
    if (cudaStreamQuery(stream_) == cudaSuccess) cudaFreeHost(staging_);
  }
}

Status NcclComm::Init(const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // the join returns at once and is polled, so it can time out
  const auto deadline = DeadlineAfter(timeout_s_);
  ncclResult_t state = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
  for (int polls = 0; state == ncclInProgress; ++polls) {
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return Status::Unavailable("nccl comm: rank " + std::to_string(rank_) + ": NCCL init did not complete within " +
                                 Seconds(timeout_s_) + " s (world " + std::to_string(world_) + ")");
    }
    Pause(polls);
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
    if (asked != ncclSuccess) state = asked;
  }
  if (state != ncclSuccess) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    return Status::Unavailable("nccl comm: rank " + std::to_string(rank_) + ": NCCL init failed (world " +
                               std::to_string(world_) + "): " + ncclGetErrorString(state) + ": " +
                               ncclGetLastError(nullptr));
  }
  return Status::Ok();
}

Status NcclComm::Usable(const char* op) const {
  if (failure_.empty()) return Status::Ok();
  return Status::FailedPrecondition(std::string("nccl comm: ") + op + " refused: the communicator failed earlier (" +
                                    failure_ + ")");
}

Status NcclComm::Fail(Status s) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  if (failure_.empty()) failure_ = s.message();
  return s;
}

Status NcclComm::Timeout(const char* what) {
  return Fail(Status::Unavailable("nccl comm: rank " + std::to_string(rank_) + ": " + what + " did not complete within " +
                                  Seconds(timeout_s_) + " s (world " + std::to_string(world_) +
                                  "): a peer stalled or went away"));
}

Status NcclComm::Settle(ncclResult_t result, const char* call, const char* op, const char* file, int line) {
  const auto deadline = DeadlineAfter(timeout_s_);
  for (int polls = 0; result == ncclInProgress; ++polls) {
    if (Clock::now() >= deadline) return Timeout(op);
    Pause(polls);
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &result);
    if (asked != ncclSuccess) result = asked;
  }
  if (result == ncclSuccess) {
    // An error a peer caused earlier (a closed connection) shows here.
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &result);
    if (asked != ncclSuccess) result = asked;
    if (result == ncclInProgress) result = ncclSuccess;  // queued work still running: not an error
  }
  if (result == ncclSuccess) return Status::Ok();
  const Status failed = NcclError(result, call, file, line);
  return Fail(Status::Unavailable("nccl comm: rank " + std::to_string(rank_) + ": " + op + ": " + failed.message()));
}

Status NcclComm::Cuda(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return Status::Ok();
  return Fail(CudaError(error, call, file, line).WithPrefix("nccl comm: rank " + std::to_string(rank_) + ": "));
}

Status NcclComm::WaitStream(const char* op) {
  return PollUntilDone(op, "cudaStreamQuery", [this] { return cudaStreamQuery(stream_); });
}

Status NcclComm::PollUntilDone(const char* op, const char* query_name,
                               const std::function<cudaError_t()>& query_done) {
  const auto deadline = DeadlineAfter(timeout_s_);
  for (int polls = 0;; ++polls) {
    const cudaError_t query = query_done();
    if (query == cudaSuccess) return Status::Ok();
    if (query != cudaErrorNotReady) return Cuda(query, query_name, __FILE__, __LINE__);
    if (comm_ != nullptr) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
      if (asked != ncclSuccess) state = asked;
      if (state != ncclSuccess && state != ncclInProgress) {
        return Fail(Status::Unavailable("nccl comm: rank " + std::to_string(rank_) + ": " + op + ": NCCL reported " +
                                        ncclGetErrorString(state) + ": " + ncclGetLastError(comm_)));
      }
    }
    if (Clock::now() >= deadline) return Timeout(op);
    Pause(polls);
  }
}

Status NcclComm::AfterStarted() {
  if (started_.count(last_started_) == 0) return Status::Ok();  // none, or waited for (the stream waits already)
  return NCCL_CUDA(cudaStreamWaitEvent(stream_, started_[last_started_].end, 0));
}

Status NcclComm::CommStream() {
  if (comm_stream_ != nullptr) return Status::Ok();
  int least = 0, greatest = 0;
  NCCL_TRY(NCCL_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest)));
  return NCCL_CUDA(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
}

Status NcclComm::TakeEvent(cudaEvent_t* event) {
  if (!spare_events_.empty()) {
    *event = spare_events_.back();
    spare_events_.pop_back();
    return Status::Ok();
  }
  return NCCL_CUDA(cudaEventCreate(event));
}

void NcclComm::ReleaseStarted(const Started& started) {
  for (cudaEvent_t e : {started.ready, started.begin, started.end}) {
    if (e != nullptr) spare_events_.push_back(e);
  }
}

Status NcclComm::StartAllReduceSum(float* data, int64_t count, ReducePrecision precision, CommHandle* handle) {
  if (handle == nullptr) return Status::InvalidField("handle", "is null (a place for the handle is required)");
  NCCL_TRY(Usable("StartAllReduceSum"));
  if (count < 0) return Status::InvalidField("count", std::to_string(count) + " is negative (allowed: >= 0)");
  if (count > 0 && data == nullptr) return Status::InvalidField("data", "is null with count > 0");
  NCCL_TRY(CommStream());
  const CommHandle h = next_handle_++;
  // Entered first, so that whatever fails below, the events go back (Wait or
  // the destructor releases them).
  Started& started = started_[h];
  NCCL_TRY(TakeEvent(&started.ready));
  NCCL_TRY(TakeEvent(&started.begin));
  NCCL_TRY(TakeEvent(&started.end));
  last_started_ = h;
  *handle = h;
  // The communication stream goes on once the backend's stream has run what
  // was queued before this call: the kernels that wrote `data`.
  NCCL_TRY(NCCL_CUDA(cudaEventRecord(started.ready, stream_)));
  NCCL_TRY(NCCL_CUDA(cudaStreamWaitEvent(comm_stream_, started.ready, 0)));
  NCCL_TRY(NCCL_CUDA(cudaEventRecord(started.begin, comm_stream_)));
  // AllReduceSum's collective, on the communication stream and its own scratch.
  if (count > 0) {
    NCCL_TRY(EnqueueAllReduce(data, count, precision, comm_stream_, &comm_scratch_, &comm_scratch_bytes_,
                              "StartAllReduceSum"));
  }
  return NCCL_CUDA(cudaEventRecord(started.end, comm_stream_));
}

Status NcclComm::Wait(CommHandle handle, double* seconds) {
  auto it = started_.find(handle);
  if (it == started_.end()) {
    return Status::InvalidField("handle", std::to_string(handle) +
                                              " is not a started collective (never started, or already waited for)");
  }
  const Started started = it->second;
  started_.erase(it);
  // Its events go back to the pool however the wait ends; recording them
  // again later does not disturb a wait already queued on them.
  struct Release {
    NcclComm* comm;
    Started started;
    ~Release() { comm->ReleaseStarted(started); }
  } release{this, started};
  NCCL_TRY(Usable("Wait"));
  // The backend's later kernels read the sum.
  NCCL_TRY(NCCL_CUDA(cudaStreamWaitEvent(stream_, started.end, 0)));
  NCCL_TRY(PollUntilDone("AllReduceSum (started)", "cudaEventQuery", [&] { return cudaEventQuery(started.end); }));
  if (seconds != nullptr) {
    float ms = 0;
    NCCL_TRY(NCCL_CUDA(cudaEventElapsedTime(&ms, started.begin, started.end)));
    *seconds = ms / 1e3;
  }
  return Status::Ok();
}

Status NcclComm::Scratch(size_t bytes, cudaStream_t stream, void** ptr, size_t* have) {
  if (bytes <= *have) return Status::Ok();
  if (*ptr != nullptr) NCCL_TRY(NCCL_CUDA(cudaFreeAsync(*ptr, stream)));
  *ptr = nullptr;
  *have = 0;
  NCCL_TRY(NCCL_CUDA(cudaMallocAsync(ptr, bytes, stream)));
  *have = bytes;
  return Status::Ok();
}

Status NcclComm::EnqueueAllReduce(float* data, int64_t count, ReducePrecision precision, cudaStream_t stream,
                                  void** scratch, size_t* scratch_bytes, const char* op) {
  if (precision == ReducePrecision::kF32) {
    return NCCL_SETTLE(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream), op);
  }
  // bf16: each rank's contribution rounded to bf16, summed by NCCL in bf16,
  // widened back into data.
  NCCL_TRY(Scratch(static_cast<size_t>(count) * sizeof(uint16_t), stream, scratch, scratch_bytes));
  uint16_t* wire = static_cast<uint16_t*>(*scratch);
  RoundToBf16Kernel<<<GridFor(count), kThreads, 0, stream>>>(data, wire, count);
  NCCL_TRY(NCCL_CUDA(cudaGetLastError()));
  NCCL_TRY(NCCL_SETTLE(ncclAllReduce(wire, wire, count, ncclBfloat16, ncclSum, comm_, stream), op));
  WidenBf16Kernel<<<GridFor(count), kThreads, 0, stream>>>(wire, data, count);
  return NCCL_CUDA(cudaGetLastError());
}

Status NcclComm::Staging(size_t bytes) {
  if (bytes <= staging_bytes_) return Status::Ok();
  if (staging_ != nullptr) {
    NCCL_TRY(WaitStream("AllGatherHost"));  // cudaFreeHost waits for the device: not while work is queued
    NCCL_TRY(NCCL_CUDA(cudaFreeHost(staging_)));
  }
  staging_ = nullptr;
  staging_bytes_ = 0;
  const size_t grown = std::max<size_t>(bytes, 4096);
  NCCL_TRY(NCCL_CUDA(cudaMallocHost(&staging_, grown)));
  staging_bytes_ = grown;
  return Status::Ok();
}

Status NcclComm::AllReduceSum(float* data, int64_t count, ReducePrecision precision) {
  NCCL_TRY(Usable("AllReduceSum"));
  NCCL_TRY(AfterStarted());
  if (count < 0) return Status::InvalidField("count", std::to_string(count) + " is negative (allowed: >= 0)");
  if (count == 0) return Status::Ok();
  NCCL_TRY(EnqueueAllReduce(data, count, precision, stream_, &scratch_, &scratch_bytes_, "AllReduceSum"));
  return WaitStream("AllReduceSum");
}

Status NcclComm::ReduceScatterSum(const float* in, float* out, int64_t count, ReducePrecision precision) {
  NCCL_TRY(Usable("ReduceScatterSum"));
  NCCL_TRY(AfterStarted());
  if (count < 0) return Status::InvalidField("count", std::to_string(count) + " is negative (allowed: >= 0)");
  if (count == 0) return Status::Ok();
  if (precision == ReducePrecision::kF32) {
    NCCL_TRY(NCCL_SETTLE(ncclReduceScatter(in, out, count, ncclFloat32, ncclSum, comm_, stream_), "ReduceScatterSum"));
    return WaitStream("ReduceScatterSum");
  }
  const int64_t total = count * world_;
  NCCL_TRY(Scratch(static_cast<size_t>(total) * sizeof(uint16_t)));
  uint16_t* wire = static_cast<uint16_t*>(scratch_);
  RoundToBf16Kernel<<<GridFor(total), kThreads, 0, stream_>>>(in, wire, total);
  NCCL_TRY(NCCL_CUDA(cudaGetLastError()));
  // In place: this rank's part of the sum lands on its own part of the input.
  uint16_t* mine = wire + static_cast<int64_t>(rank_) * count;
  NCCL_TRY(NCCL_SETTLE(ncclReduceScatter(wire, mine, count, ncclBfloat16, ncclSum, comm_, stream_),
                       "ReduceScatterSum"));
  WidenBf16Kernel<<<GridFor(count), kThreads, 0, stream_>>>(mine, out, count);
  NCCL_TRY(NCCL_CUDA(cudaGetLastError()));
  return WaitStream("ReduceScatterSum");
}

Status NcclComm::AllGather(const float* in, float* out, int64_t count) {
  NCCL_TRY(Usable("AllGather"));
  NCCL_TRY(AfterStarted());
  if (count < 0) return Status::InvalidField("count", std::to_string(count) + " is negative (allowed: >= 0)");
  if (count == 0) return Status::Ok();
  // in == out + rank * count is NCCL's in-place all-gather.
  NCCL_TRY(NCCL_SETTLE(ncclAllGather(in, out, count, ncclFloat32, comm_, stream_), "AllGather"));
  return WaitStream("AllGather");
}

Status NcclComm::Broadcast(void* data, size_t bytes, int root) {
  NCCL_TRY(Usable("Broadcast"));
  NCCL_TRY(AfterStarted());
  if (root < 0 || root >= world_) {
    return Status::InvalidField("root", std::to_string(root) + " is not a rank (allowed: 0 .. " +
                                            std::to_string(world_ - 1) + ")");
  }
  if (bytes == 0) return Status::Ok();
  NCCL_TRY(NCCL_SETTLE(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "Broadcast"));
  return WaitStream("Broadcast");
}

Status NcclComm::Barrier() {
  NCCL_TRY(Usable("Barrier"));
  NCCL_TRY(AfterStarted());
  // One float summed over the ranks: it completes on this rank only once every
  // rank has queued it, so the wait for it is a host-side barrier.
  NCCL_TRY(Scratch(sizeof(float)));
  NCCL_TRY(NCCL_SETTLE(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), "Barrier"));
  return WaitStream("Barrier");
}

Status NcclComm::AllGatherHost(const std::string& mine, std::vector<std::string>* all) {
  NCCL_TRY(Usable("AllGatherHost"));
  NCCL_TRY(AfterStarted());
  if (all == nullptr) return Status::InvalidField("all", "is null");
  // 1. Every rank's length: an all-gather of one int64 each.
  const size_t lengths_bytes = static_cast<size_t>(world_) * sizeof(int64_t);
  NCCL_TRY(Staging(lengths_bytes));
  NCCL_TRY(WaitStream("AllGatherHost"));  // the staging buffer may still be read by an earlier copy
  int64_t* host_lengths = reinterpret_cast<int64_t*>(staging_);
  host_lengths[rank_] = static_cast<int64_t>(mine.size());
  NCCL_TRY(Scratch(lengths_bytes));
  int64_t* lengths = static_cast<int64_t*>(scratch_);
  NCCL_TRY(NCCL_CUDA(cudaMemcpyAsync(lengths + rank_, host_lengths + rank_, sizeof(int64_t), cudaMemcpyHostToDevice,
                                     stream_)));
  NCCL_TRY(NCCL_SETTLE(ncclAllGather(lengths + rank_, lengths, 1, ncclInt64, comm_, stream_), "AllGatherHost"));
  NCCL_TRY(NCCL_CUDA(cudaMemcpyAsync(host_lengths, lengths, lengths_bytes, cudaMemcpyDeviceToHost, stream_)));
  NCCL_TRY(WaitStream("AllGatherHost"));
  std::vector<int64_t> length(host_lengths, host_lengths + world_);
  int64_t longest = 0;
  for (int r = 0; r < world_; ++r) {
    if (length[r] < 0) {
      return Fail(Status::Error("nccl comm: rank " + std::to_string(rank_) + ": AllGatherHost: rank " +
                                std::to_string(r) + " sent a negative length (ranks out of step)"));
    }
    longest = std::max(longest, length[r]);
  }
  all->assign(world_, std::string());
  if (longest == 0) return Status::Ok();
  // 2. Every rank's bytes, padded to the longest.
  const size_t slot = static_cast<size_t>(longest);
  const size_t total = slot * world_;
  NCCL_TRY(Staging(total));
  NCCL_TRY(Scratch(total));
  char* device = static_cast<char*>(scratch_);
  std::memset(staging_ + rank_ * slot, 0, slot);
  if (!mine.empty()) std::memcpy(staging_ + rank_ * slot, mine.data(), mine.size());
  NCCL_TRY(NCCL_CUDA(
      cudaMemcpyAsync(device + rank_ * slot, staging_ + rank_ * slot, slot, cudaMemcpyHostToDevice, stream_)));
  NCCL_TRY(NCCL_SETTLE(ncclAllGather(device + rank_ * slot, device, slot, ncclUint8, comm_, stream_), "AllGatherHost"));
  NCCL_TRY(NCCL_CUDA(cudaMemcpyAsync(staging_, device, total, cudaMemcpyDeviceToHost, stream_)));
  NCCL_TRY(WaitStream("AllGatherHost"));
  for (int r = 0; r < world_; ++r) (*all)[r].assign(staging_ + r * slot, static_cast<size_t>(length[r]));
  return Status::Ok();
}

}  // namespace

bool NcclCommunicator::Available() { return true; }

Status NcclCommunicator::Create(int rank, int world, const std::string& bootstrap_path, double timeout_s, void* stream,
                                std::unique_ptr<Communicator>* out) {
  if (out == nullptr) return Status::InvalidField("out", "is null");
  out->reset();
  if (world < 1) return Status::InvalidField("world", std::to_string(world) + " is not allowed (>= 1)");
  if (rank < 0 || rank >= world) {
    return Status::InvalidField("rank", std::to_string(rank) + " is not allowed (0 .. " + std::to_string(world - 1) + ")");
  }
  if (!(timeout_s > 0)) return Status::InvalidField("timeout_s", Seconds(timeout_s) + " is not allowed (> 0)");
  if (stream == nullptr) return Status::InvalidField("stream", "is null (the CUDA backend's stream is required)");
  if (world > 1 && bootstrap_path.empty()) {
    return Status::InvalidField("bootstrap_path", "is empty; a file path is required with more than one rank");
  }
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) {
      return Status::Unavailable("nccl comm: rank 0: " + NcclError(made, "ncclGetUniqueId", __FILE__, __LINE__).message());
    }
    if (!bootstrap_path.empty()) {
      KEEL_RETURN_IF_ERROR(WriteBootstrapId(bootstrap_path, BootstrapIdToHex(&id, sizeof(id))));
    }
  } else {
    std::string text;
    KEEL_RETURN_IF_ERROR(WaitBootstrapId(bootstrap_path, timeout_s, &text));
    KEEL_RETURN_IF_ERROR(BootstrapIdFromHex(bootstrap_path, text, &id, sizeof(id)));
  }
  auto comm = std::make_unique<NcclComm>(rank, world, timeout_s, static_cast<cudaStream_t>(stream));
  KEEL_RETURN_IF_ERROR(comm->Init(id));
  *out = std::move(comm);
  return Status::Ok();
}

}  // namespace keel
