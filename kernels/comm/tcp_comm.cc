// The TCP communicator of tcp_comm.h: the join (hello and ack), then the
// collectives as a star through rank 0. Socket helpers first, then the join,
// then the communicator.
#include "kernels/comm/tcp_comm.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/base/host.h"
#include "kernels/formats.h"

// Headers and values go on the wire as they are in memory: every host Keel
// runs on is little-endian, and this makes sure of it.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the TCP communicator assumes little-endian hosts");

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Wire format ---------------------------------------------------------------

constexpr uint32_t kHelloMagic = 0x6C65656B;    // "keel"
constexpr uint32_t kAckMagic = 0x6B63616B;      // "kack"
constexpr uint32_t kHeaderMagic = 0x6C6F636B;   // "kcol"
constexpr uint32_t kBarrierToken = 0x6F67626B;  // "kbgo"
// Bump when anything below changes meaning: ranks of different builds refuse
// each other at the hello instead of misreading each other's bytes.
constexpr uint32_t kProtocolVersion = 1;
// An ack's message and an AllGatherHost value longer than this are taken for
// ranks out of step (garbage lengths), not allocated.
constexpr uint64_t kMaxMessageBytes = 1 << 16;
constexpr uint64_t kMaxHostValueBytes = uint64_t{1} << 30;
// A peer waits this much longer than timeout_s for rank 0's ack: rank 0 gives
// up on missing ranks timeout_s after it started, which is before this peer
// connected, so the ack (even a failure) arrives within the grace.
constexpr double kAckGraceS = 1.0;
constexpr auto kRetryInterval = std::chrono::milliseconds(20);

// Peer -> rank 0, right after connecting.
struct Hello {
  uint32_t magic, version, rank, size;
};
// Rank 0 -> peer once every rank joined (code 0) or the join failed (the
// Status's code and `message_bytes` bytes of its message follow).
struct Ack {
  uint32_t magic, code, message_bytes, reserved;
};
// Peer -> rank 0 at the start of every collective, so that rank 0 can check
// that all ranks called the same one with the same arguments.
enum class Op : uint32_t { kAllReduceSum = 1, kReduceScatterSum, kAllGather, kBroadcast, kBarrier, kAllGatherHost };
struct Header {
  uint32_t magic;
  uint32_t op;
  uint64_t arg0;  // count, bytes or (AllGatherHost) this rank's length
  uint64_t arg1;  // ReducePrecision or Broadcast's root
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduceSum: return "AllReduceSum";
    case Op::kReduceScatterSum: return "ReduceScatterSum";
    case Op::kAllGather: return "AllGather";
    case Op::kBroadcast: return "Broadcast";
    case Op::kBarrier: return "Barrier";
    case Op::kAllGatherHost: return "AllGatherHost";
  }
  return "an unknown collective";
}

const char* PrecisionName(uint64_t precision) {
  return precision == static_cast<uint64_t>(ReducePrecision::kBF16) ? "bf16" : "fp32";
}

// "AllReduceSum(count=5, fp32)": a header as the mismatch message shows it.
std::string Describe(const Header& h) {
  std::ostringstream s;
  const Op op = static_cast<Op>(h.op);
  s << OpName(op);
  switch (op) {
    case Op::kAllReduceSum:
    case Op::kReduceScatterSum: s << "(count=" << h.arg0 << ", " << PrecisionName(h.arg1) << ")"; break;
    case Op::kAllGather: s << "(count=" << h.arg0 << ")"; break;
    case Op::kBroadcast: s << "(bytes=" << h.arg0 << ", root=" << h.arg1 << ")"; break;
    default: s << "()"; break;
  }
  return s.str();
}

float RoundBf16(float x) { return Bf16ToFloat(FloatToBf16(x, Rounding::kNearestEven, 0.0f)); }

// ---- Sockets -----------------------------------------------------------------------

Clock::time_point DeadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Milliseconds until `deadline` for poll(), rounded up (so a wait never ends
// early) and capped to an int.
int MillisecondsUntil(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

enum class Io { kOk, kClosed, kTimeout, kError };

// Waits until fd is ready for `events` or `deadline` passes; EINTR retried.
// POLLERR / POLLHUP count as ready: the send or recv that follows says what happened.
Io WaitReady(int fd, short events, Clock::time_point deadline, int* err) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, MillisecondsUntil(deadline));
    if (n > 0) return Io::kOk;
    if (n < 0 && errno != EINTR) {
      *err = errno;
      return Io::kError;
    }
    if (n == 0 && Clock::now() >= deadline) return Io::kTimeout;
  }
}

bool IsClosedErrno(int err) { return err == EPIPE || err == ECONNRESET || err == ENOTCONN; }

// Sends all `bytes` on a non-blocking socket; each wait for room is at most
// timeout_s (progress starts a new wait). MSG_NOSIGNAL: a closed peer gives
// EPIPE, not SIGPIPE.
Io SendAll(int fd, const void* data, size_t bytes, double timeout_s, int* err) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const Io wait = WaitReady(fd, POLLOUT, DeadlineAfter(timeout_s), err);
      if (wait != Io::kOk) return wait;
      continue;
    }
    *err = errno;
    return IsClosedErrno(errno) ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

// Receives exactly `bytes`, with the waits of SendAll.
Io RecvAll(int fd, void* data, size_t bytes, double timeout_s, int* err) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const Io wait = WaitReady(fd, POLLIN, DeadlineAfter(timeout_s), err);
      if (wait != Io::kOk) return wait;
      continue;
    }
    *err = errno;
    return IsClosedErrno(errno) ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

// Non-blocking, close-on-exec, no Nagle delay (collectives are request and
// reply: a small header must not wait for an ACK).
void ConfigureSocket(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string SecondsText(double seconds) {
  std::ostringstream s;
  s << seconds << " s";
  return s.str();
}

// "host:port", with IPv6 literals in brackets.
std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// The host rank 0 publishes (TcpCommOptions::advertise).
std::string AdvertisedHost(const TcpCommOptions& o) {
  if (!o.advertise.empty()) return o.advertise;
  if (!IsWildcardAddress(o.host)) return o.host;
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

bool SplitHostPort(const std::string& id, std::string* host, std::string* port) {
  const size_t colon = id.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == id.size()) return false;
  *host = id.substr(0, colon);
  *port = id.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return !host->empty() && port->find_first_not_of("0123456789") == std::string::npos;
}

// ---- The communicator ----------------------------------------------------------------

// Threads: the caller's (one at a time, comm.h) and, once a collective was
// started, the communication thread that runs started collectives. The socket
// state (fds_ aside, see CloseAll), op_, failed_ and failure_ belong to one of
// them at a time: to the communication thread while started collectives are
// queued or running, to the caller once Drain returned (mu_ orders the two).
class TcpComm final : public Communicator {
 public:
  // fds: on rank 0 the connection to rank r at fds[r] (fds[0] unused); on any
  // other rank the connection to rank 0 at fds[0]. Empty when size == 1.
  TcpComm(const TcpCommOptions& options, std::vector<int> fds)
      : rank_(options.rank), size_(options.size), timeout_s_(options.timeout_s), fds_(std::move(fds)) {}
  ~TcpComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }

  Status AllReduceSum(float* data, int64_t count, ReducePrecision precision) override;
  Status ReduceScatterSum(const float* in, float* out, int64_t count, ReducePrecision precision) override;
  Status AllGather(const float* in, float* out, int64_t count) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;
  Status AllGatherHost(const std::string& mine, std::vector<std::string>* all) override;
  Status StartAllReduceSum(float* data, int64_t count, ReducePrecision precision, CommHandle* handle) override;
  Status Wait(CommHandle handle, double* seconds) override;

 private:
  // A started all-reduce, queued for the communication thread.
  struct Started {
    CommHandle handle;
    float* data;
    int64_t count;
    ReducePrecision precision;
  };
  // What a started collective came to, until Wait takes it.
  struct Finished {
    Status status;
    double seconds = 0;
  };
  // The communication thread: runs the started collectives in order, until
  // the communicator is destroyed (then what is still queued fails unrun).
  void RunStarted();
  // A synchronous call's first step: waits until the communication thread has
  // run every collective started before it (they come first on the wire).
  void Drain();
  // AllReduceSum's work, on whichever thread owns the sockets.
  Status AllReduceNow(float* data, int64_t count, ReducePrecision precision);
  // Refuses a call after a failure; otherwise names the collective for the
  // error messages of the I/O that follows.
  Status Begin(Op op);
  // The header of the collective in progress.
  Header HeaderFor(uint64_t arg0, uint64_t arg1) const {
    return Header{kHeaderMagic, static_cast<uint32_t>(op_), arg0, arg1};
  }
  // Peers: sends this call's header to rank 0. Rank 0: reads every peer's
  // header, in rank order, and fails when one differs from `mine` (arg0 is
  // not compared for AllGatherHost: the lengths differ); the peers' headers
  // go to *headers when given.
  Status ExchangeHeaders(const Header& mine, std::vector<Header>* headers = nullptr);
  // The sums behind AllReduceSum (every rank gets all `total` elements:
  // scatter_count == 0) and ReduceScatterSum (rank r gets [r, r + 1) *
  // scatter_count into out[0, scatter_count)).
  Status ReduceChunks(const float* in, float* out, int64_t total, int64_t scatter_count, ReducePrecision precision);

  Status Send(int peer, const void* data, size_t bytes);
  Status Recv(int peer, void* data, size_t bytes);
  // What one Send or Recv came to: Ok, or (closed, idle longer than the
  // timeout, failed) the failure naming the peer; `idle` says what the peer
  // did not do in time, `verb` names the call.
  Status IoStatus(Io io, int err, int peer, const char* idle, const char* verb);
  // The connection a message to or from `peer` travels on.
  int FdFor(int peer) const { return rank_ == 0 ? fds_[peer] : fds_[0]; }
  // Records the first failure, closes every connection (so that the other
  // ranks stop waiting on this one) and returns `status`.
  Status Fail(Status status);
  // Closes every connection. Under mu_: the destructor may shut the same fds
  // down from its thread (to end a started collective in progress).
  void CloseAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int& fd : fds_) CloseFd(&fd);
  }

  const int rank_;
  const int size_;
  const double timeout_s_;
  std::vector<int> fds_;  // changed only by CloseAll
  Op op_ = Op::kBarrier;  // the collective in progress, for messages
  bool failed_ = false;
  std::string failure_;  // the first failure's message

  std::mutex mu_;  // guards the members below (and fds_'s changes)
  std::condition_variable cv_;              // queue_, running_, finished_ or closing_ changed
  std::deque<Started> queue_;               // started, not yet run
  bool running_ = false;                    // the communication thread runs one (taken from queue_)
  bool closing_ = false;                    // the destructor has begun
  std::set<CommHandle> outstanding_;        // started and not yet waited for
  std::map<CommHandle, Finished> finished_;  // run, not yet waited for
  CommHandle next_handle_ = 1;
  std::thread thread_;  // the communication thread, from the first collective started with size > 1
};

TcpComm::~TcpComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    // A started collective in progress ends now rather than after its
    // timeout: shutdown wakes its poll (the fds stay open until the thread is
    // joined, so their numbers cannot be reused under it).
    if (running_) {
      for (int fd : fds_) {
        if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
      }
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  CloseAll();
}

void TcpComm::RunStarted() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closing, nothing left
    const Started started = queue_.front();
    queue_.pop_front();
    running_ = true;
    const bool abandoned = closing_;
    lock.unlock();
    Finished finished;
    if (abandoned) {
      finished.status = Status::FailedPrecondition("tcp comm: rank " + std::to_string(rank_) +
                                                   ": a started AllReduceSum did not run: the communicator was destroyed");
    } else {
      const auto start = Clock::now();
      finished.status = AllReduceNow(started.data, started.count, started.precision);
      finished.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
    lock.lock();
    running_ = false;
    finished_[started.handle] = std::move(finished);
    cv_.notify_all();
  }
}

void TcpComm::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !running_; });
}

Status TcpComm::StartAllReduceSum(float* data, int64_t count, ReducePrecision precision, CommHandle* handle) {
  if (handle == nullptr) return Status::InvalidField("handle", "is null; a place for the handle is required");
  if (count < 0) return Status::InvalidField("count", std::to_string(count) + " is negative; 0 or more is allowed");
  if (count > 0 && data == nullptr) {
    return Status::InvalidField("data", "is null with count " + std::to_string(count) + "; a buffer is required");
  }
  std::unique_lock<std::mutex> lock(mu_);
  const CommHandle h = next_handle_++;
  outstanding_.insert(h);
  *handle = h;
  if (size_ == 1) {
    // Nothing to wait for: the local sum (bf16 rounding) now.
    lock.unlock();
    Finished finished;
    const auto start = Clock::now();
    finished.status = AllReduceNow(data, count, precision);
    finished.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    lock.lock();
    finished_[h] = std::move(finished);
    return Status::Ok();
  }
  queue_.push_back(Started{h, data, count, precision});
  if (!thread_.joinable()) thread_ = std::thread([this] { RunStarted(); });
  cv_.notify_all();
  return Status::Ok();
}

Status TcpComm::Wait(CommHandle handle, double* seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (outstanding_.count(handle) == 0) {
    return Status::InvalidField("handle", std::to_string(handle) +
                                              " is not a started collective (never started, or already waited for)");
  }
  // No deadline of its own: every wait of the collective's I/O on the
  // communication thread is bounded by timeout_s, so it finishes.
  cv_.wait(lock, [&] { return finished_.count(handle) > 0; });
  Finished finished = std::move(finished_[handle]);
  finished_.erase(handle);
  outstanding_.erase(handle);
  if (seconds != nullptr) *seconds = finished.seconds;
  return finished.status;
}

Status TcpComm::Begin(Op op) {
  if (failed_) {
    return Status::FailedPrecondition(std::string("tcp comm: rank ") + std::to_string(rank_) + ": " + OpName(op) +
                                      " refused: the communicator failed earlier (" + failure_ + ")");
  }
  op_ = op;
  return Status::Ok();
}

Status TcpComm::Fail(Status status) {
  if (!failed_) {
    failed_ = true;
    failure_ = status.message();
  }
  CloseAll();
  return status;
}

// "tcp comm: rank R: WHAT during OP (seen from rank ME)".
Status PeerError(StatusCode code, int peer, const std::string& what, Op op, int me) {
  std::string message = "tcp comm: rank " + std::to_string(peer) + ": " + what + " during " + OpName(op) +
                        " (seen from rank " + std::to_string(me) + ")";
  return code == StatusCode::kUnavailable ? Status::Unavailable(message) : Status::Error(message);
}

Status TcpComm::Send(int peer, const void* data, size_t bytes) {
  int err = 0;
  return IoStatus(SendAll(FdFor(peer), data, bytes, timeout_s_, &err), err, peer, "took no data", "send");
}

Status TcpComm::Recv(int peer, void* data, size_t bytes) {
  int err = 0;
  return IoStatus(RecvAll(FdFor(peer), data, bytes, timeout_s_, &err), err, peer, "sent nothing", "receive");
}

Status TcpComm::IoStatus(Io io, int err, int peer, const char* idle, const char* verb) {
  switch (io) {
    case Io::kOk: return Status::Ok();
    case Io::kClosed: return Fail(PeerError(StatusCode::kUnavailable, peer, "closed the connection", op_, rank_));
    case Io::kTimeout:
      return Fail(PeerError(StatusCode::kUnavailable, peer, std::string(idle) + " for " + SecondsText(timeout_s_), op_,
                            rank_));
    case Io::kError: break;
  }
  return Fail(PeerError(StatusCode::kUnavailable, peer, std::string(verb) + " failed: " + std::strerror(err), op_, rank_));
}

Status TcpComm::ExchangeHeaders(const Header& mine, std::vector<Header>* headers) {
  if (rank_ != 0) return Send(0, &mine, sizeof(mine));
  if (headers) headers->assign(size_, mine);
  for (int r = 1; r < size_; ++r) {
    Header h;
    KEEL_RETURN_IF_ERROR(Recv(r, &h, sizeof(h)));
    if (h.magic != kHeaderMagic) {
      return Fail(PeerError(StatusCode::kInternal, r,
                            "sent bytes that are not a collective's header (ranks out of step)", op_, rank_));
    }
    const bool same_args =
        h.op == static_cast<uint32_t>(Op::kAllGatherHost) || (h.arg0 == mine.arg0 && h.arg1 == mine.arg1);
    if (h.op != mine.op || !same_args) {
      return Fail(Status::Error("tcp comm: rank " + std::to_string(r) + " called " + Describe(h) +
                                " while rank 0 called " + Describe(mine) +
                                " (every rank must call the same collectives, in the same order, with "
                                "the same counts)"));
    }
    if (headers) (*headers)[r] = h;
  }
  return Status::Ok();
}

Status TcpComm::ReduceChunks(const float* in, float* out, int64_t total, int64_t scatter_count,
                             ReducePrecision precision) {
  const bool bf16 = precision == ReducePrecision::kBF16;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(kTcpCommChunkBytes / sizeof(float), total));
  const size_t wire_bytes = bf16 ? sizeof(uint16_t) : sizeof(float);
  // Rank r's part of the result, as indices into `in`'s `total` elements.
  auto part_begin = [&](int r) { return scatter_count == 0 ? int64_t{0} : r * scatter_count; };
  auto part_end = [&](int r) { return scatter_count == 0 ? total : (r + 1) * scatter_count; };
  std::vector<uint16_t> wire16(bf16 ? chunk : 0);

  if (rank_ != 0) {
    const int64_t lo_part = part_begin(rank_), hi_part = part_end(rank_);
    for (int64_t a = 0; a < total; a += chunk) {
      const int64_t n = std::min(chunk, total - a);
      if (bf16) {
        for (int64_t i = 0; i < n; ++i) wire16[i] = FloatToBf16(in[a + i], Rounding::kNearestEven, 0.0f);
        KEEL_RETURN_IF_ERROR(Send(0, wire16.data(), n * wire_bytes));
      } else {
        KEEL_RETURN_IF_ERROR(Send(0, in + a, n * wire_bytes));
      }
      const int64_t lo = std::max(a, lo_part), hi = std::min(a + n, hi_part);
      if (lo >= hi) continue;
      float* dst = out + (lo - lo_part);
      if (bf16) {
        KEEL_RETURN_IF_ERROR(Recv(0, wire16.data(), (hi - lo) * wire_bytes));
        for (int64_t i = 0; i < hi - lo; ++i) dst[i] = Bf16ToFloat(wire16[i]);
      } else {
        KEEL_RETURN_IF_ERROR(Recv(0, dst, (hi - lo) * wire_bytes));
      }
    }
    return Status::Ok();
  }

  // Rank 0: acc holds one chunk's sum, ((x_0 + x_1) + x_2) + ..., in fp32.
  std::vector<float> acc(chunk), incoming(bf16 ? 0 : chunk);
  for (int64_t a = 0; a < total; a += chunk) {
    const int64_t n = std::min(chunk, total - a);
    for (int64_t i = 0; i < n; ++i) acc[i] = bf16 ? RoundBf16(in[a + i]) : in[a + i];
    for (int r = 1; r < size_; ++r) {
      if (bf16) {
        KEEL_RETURN_IF_ERROR(Recv(r, wire16.data(), n * wire_bytes));
        for (int64_t i = 0; i < n; ++i) acc[i] += Bf16ToFloat(wire16[i]);
      } else {
        KEEL_RETURN_IF_ERROR(Recv(r, incoming.data(), n * wire_bytes));
        for (int64_t i = 0; i < n; ++i) acc[i] += incoming[i];
      }
    }
    if (bf16) {
      // The sum rounded once more; every rank gets these bf16 bits.
      for (int64_t i = 0; i < n; ++i) {
        wire16[i] = FloatToBf16(acc[i], Rounding::kNearestEven, 0.0f);
        acc[i] = Bf16ToFloat(wire16[i]);
      }
    }
    for (int r = 0; r < size_; ++r) {
      const int64_t lo = std::max(a, part_begin(r)), hi = std::min(a + n, part_end(r));
      if (lo >= hi) continue;
      if (r == 0) {
        std::memcpy(out + (lo - part_begin(0)), acc.data() + (lo - a), (hi - lo) * sizeof(float));
      } else if (bf16) {
        KEEL_RETURN_IF_ERROR(Send(r, wire16.data() + (lo - a), (hi - lo) * wire_bytes));
      } else {
        KEEL_RETURN_IF_ERROR(Send(r, acc.data() + (lo - a), (hi - lo) * wire_bytes));
      }
    }
  }
  return Status::Ok();
}

Status CheckCount(int64_t count, const void* a, const void* b) {
  if (count < 0) return Status::InvalidField("count", std::to_string(count) + " is negative; 0 or more is allowed");
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return Status::InvalidField("data", "is null with count " + std::to_string(count) + "; a buffer is required");
  }
  return Status::Ok();
}

Status TcpComm::AllReduceSum(float* data, int64_t count, ReducePrecision precision) {
  Drain();
  return AllReduceNow(data, count, precision);
}

Status TcpComm::AllReduceNow(float* data, int64_t count, ReducePrecision precision) {
  KEEL_RETURN_IF_ERROR(Begin(Op::kAllReduceSum));
  KEEL_RETURN_IF_ERROR(CheckCount(count, data, data));
  if (size_ == 1) {
    if (precision == ReducePrecision::kBF16) {
      for (int64_t i = 0; i < count; ++i) data[i] = RoundBf16(data[i]);
    }
    return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(ExchangeHeaders(HeaderFor(count, static_cast<uint64_t>(precision))));
  return ReduceChunks(data, data, count, 0, precision);
}

Status TcpComm::ReduceScatterSum(const float* in, float* out, int64_t count, ReducePrecision precision) {
  Drain();
  KEEL_RETURN_IF_ERROR(Begin(Op::kReduceScatterSum));
  KEEL_RETURN_IF_ERROR(CheckCount(count, in, out));
  if (size_ == 1) {
    for (int64_t i = 0; i < count; ++i) out[i] = precision == ReducePrecision::kBF16 ? RoundBf16(in[i]) : in[i];
    return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(ExchangeHeaders(HeaderFor(count, static_cast<uint64_t>(precision))));
  return ReduceChunks(in, out, count * size_, count, precision);
}

Status TcpComm::AllGather(const float* in, float* out, int64_t count) {
  Drain();
  KEEL_RETURN_IF_ERROR(Begin(Op::kAllGather));
  KEEL_RETURN_IF_ERROR(CheckCount(count, in, out));
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  // memmove: in may be out + rank * count (in place).
  if (size_ == 1 || rank_ == 0) {
    if (bytes > 0) std::memmove(out + rank_ * count, in, bytes);
    if (size_ == 1) return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(ExchangeHeaders(HeaderFor(count, 0)));
  // No buffer of our own: the peers' parts land in `out` directly, and the
  // kernel's socket buffers bound what is in flight.
  if (rank_ != 0) {
    KEEL_RETURN_IF_ERROR(Send(0, in, bytes));
    return Recv(0, out, bytes * size_);
  }
  for (int r = 1; r < size_; ++r) KEEL_RETURN_IF_ERROR(Recv(r, out + r * count, bytes));
  for (int r = 1; r < size_; ++r) KEEL_RETURN_IF_ERROR(Send(r, out, bytes * size_));
  return Status::Ok();
}

Status TcpComm::Broadcast(void* data, size_t bytes, int root) {
  Drain();
  KEEL_RETURN_IF_ERROR(Begin(Op::kBroadcast));
  if (root < 0 || root >= size_) {
    return Status::InvalidField(
        "root", std::to_string(root) + " is not a rank; 0 .. " + std::to_string(size_ - 1) + " is allowed");
  }
  if (bytes > 0 && data == nullptr) return Status::InvalidField("data", "is null with bytes > 0; a buffer is required");
  if (size_ == 1) return Status::Ok();
  KEEL_RETURN_IF_ERROR(ExchangeHeaders(HeaderFor(bytes, root)));
  // Rank 0 relays a root's data: root -> rank 0 -> the others, in rank order.
  if (rank_ != 0) return rank_ == root ? Send(0, data, bytes) : Recv(0, data, bytes);
  if (root != 0) KEEL_RETURN_IF_ERROR(Recv(root, data, bytes));
  for (int r = 1; r < size_; ++r) {
    if (r != root) KEEL_RETURN_IF_ERROR(Send(r, data, bytes));
  }
  return Status::Ok();
}

Status TcpComm::Barrier() {
  Drain();
  KEEL_RETURN_IF_ERROR(Begin(Op::kBarrier));
  if (size_ == 1) return Status::Ok();
  // Every header reached rank 0 (everyone arrived) before any token leaves it.
  KEEL_RETURN_IF_ERROR(ExchangeHeaders(HeaderFor(0, 0)));
  uint32_t token = kBarrierToken;
  if (rank_ != 0) {
    KEEL_RETURN_IF_ERROR(Recv(0, &token, sizeof(token)));
    if (token != kBarrierToken) {
      return Fail(PeerError(StatusCode::kInternal, 0, "sent a wrong barrier token (ranks out of step)", op_, rank_));
    }
    return Status::Ok();
  }
  for (int r = 1; r < size_; ++r) KEEL_RETURN_IF_ERROR(Send(r, &token, sizeof(token)));
  return Status::Ok();
}

Status TcpComm::AllGatherHost(const std::string& mine, std::vector<std::string>* all) {
  Drain();
  KEEL_RETURN_IF_ERROR(Begin(Op::kAllGatherHost));
  if (mine.size() > kMaxHostValueBytes) {
    return Status::InvalidField(
        "mine", std::to_string(mine.size()) + " bytes; at most " + std::to_string(kMaxHostValueBytes) + " are allowed");
  }
  if (size_ == 1) {
    *all = {mine};
    return Status::Ok();
  }
  std::vector<Header> headers;
  KEEL_RETURN_IF_ERROR(ExchangeHeaders(HeaderFor(mine.size(), 0), &headers));
  std::vector<std::string> values(size_);
  if (rank_ != 0) {
    KEEL_RETURN_IF_ERROR(Send(0, mine.data(), mine.size()));
    // Rank 0's answer: for every rank, its length (8 bytes) then its bytes.
    for (int r = 0; r < size_; ++r) {
      uint64_t length = 0;
      KEEL_RETURN_IF_ERROR(Recv(0, &length, sizeof(length)));
      if (length > kMaxHostValueBytes) {
        return Fail(PeerError(StatusCode::kInternal, 0,
                              "sent a host value of " + std::to_string(length) + " bytes (ranks out of step)", op_,
                              rank_));
      }
      values[r].resize(length);
      KEEL_RETURN_IF_ERROR(Recv(0, &values[r][0], length));
    }
    *all = std::move(values);
    return Status::Ok();
  }
  values[0] = mine;
  for (int r = 1; r < size_; ++r) {
    if (headers[r].arg0 > kMaxHostValueBytes) {
      return Fail(PeerError(
          StatusCode::kInternal, r,
          "announced a host value of " + std::to_string(headers[r].arg0) + " bytes (ranks out of step)", op_, rank_));
    }
    values[r].resize(headers[r].arg0);
    KEEL_RETURN_IF_ERROR(Recv(r, &values[r][0], values[r].size()));
  }
  std::string reply;
  for (const std::string& v : values) {
    const uint64_t length = v.size();
    reply.append(reinterpret_cast<const char*>(&length), sizeof(length));
    reply += v;
  }
  for (int r = 1; r < size_; ++r) KEEL_RETURN_IF_ERROR(Send(r, reply.data(), reply.size()));
  *all = std::move(values);
  return Status::Ok();
}

// ---- Joining ---------------------------------------------------------------------------

Status ValidateOptions(const TcpCommOptions& o) {
  if (o.size < 1) return Status::InvalidField("size", std::to_string(o.size) + " ranks; 1 or more is allowed");
  if (o.rank < 0 || o.rank >= o.size) {
    return Status::InvalidField("rank", std::to_string(o.rank) + " is outside 0 .. " + std::to_string(o.size - 1) +
                                            " (size " + std::to_string(o.size) + ")");
  }
  if (!(o.timeout_s > 0) || !std::isfinite(o.timeout_s)) {
    return Status::InvalidField("timeout_s", SecondsText(o.timeout_s) + "; a finite number of seconds > 0 is allowed");
  }
  if (o.size > 1 && o.bootstrap_path.empty()) {
    return Status::InvalidField(
        "bootstrap_path", "is empty with size " + std::to_string(o.size) + "; a file path is required when size > 1");
  }
  if (o.size > 1 && o.rank == 0 && o.host.empty()) {
    return Status::InvalidField("host", "is empty; rank 0 needs an address to listen on (\"127.0.0.1\", a host name)");
  }
  if (IsWildcardAddress(o.advertise)) {
    return Status::InvalidField("advertise", "\"" + o.advertise +
                                                 "\" cannot be connected to; an address or name of this machine that "
                                                 "the other ranks reach is allowed (\"\": the listen host)");
  }
  return Status::Ok();
}

// Rank 0's answer to a peer's hello. Best effort: a peer that went away
// already learns nothing, and the join's outcome does not change.
void SendAck(int fd, const Status& status, double timeout_s) {
  const std::string message = status.message().substr(0, kMaxMessageBytes);
  Ack ack{kAckMagic, static_cast<uint32_t>(status.code()), static_cast<uint32_t>(message.size()), 0};
  int err = 0;
  if (SendAll(fd, &ack, sizeof(ack), timeout_s, &err) == Io::kOk)
    SendAll(fd, message.data(), message.size(), timeout_s, &err);
}

Status StatusFromCode(uint32_t code, std::string message) {
  switch (static_cast<StatusCode>(code)) {
    case StatusCode::kInvalidArgument: return Status::InvalidArgument(std::move(message));
    case StatusCode::kNotFound: return Status::NotFound(std::move(message));
    case StatusCode::kFailedPrecondition: return Status::FailedPrecondition(std::move(message));
    case StatusCode::kDataLoss: return Status::DataLoss(std::move(message));
    case StatusCode::kUnavailable: return Status::Unavailable(std::move(message));
    default: return Status::Error(std::move(message));
  }
}

std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// Rank 0: listen, publish, accept every peer's hello, answer with the outcome.
Status JoinAsRoot(const TcpCommOptions& o, std::vector<int>* fds) {
  const auto deadline = DeadlineAfter(o.timeout_s);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addrs = nullptr;
  const int gai = ::getaddrinfo(o.host.c_str(), "0", &hints, &addrs);
  if (gai != 0) {
    return Status::InvalidField("host", "\"" + o.host + "\" does not resolve (" + ::gai_strerror(gai) +
                                            "); an address or name of this machine is required");
  }
  int listen_fd = -1;
  std::string bind_error;
  for (addrinfo* a = addrs; a != nullptr && listen_fd < 0; a = a->ai_next) {
    listen_fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (listen_fd < 0) continue;
    if (::bind(listen_fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(listen_fd, o.size) != 0) {
      bind_error = std::strerror(errno);
      CloseFd(&listen_fd);
    }
  }
  ::freeaddrinfo(addrs);
  if (listen_fd < 0) {
    return Status::InvalidField(
        "host", "cannot listen on \"" + o.host + "\" (" + bind_error + "); an address of this machine is required");
  }
  ConfigureSocket(listen_fd);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                     : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const std::string address = JoinHostPort(AdvertisedHost(o), port);
  Status published = WriteBootstrapId(o.bootstrap_path, address);
  if (!published.ok()) {
    CloseFd(&listen_fd);
    return published.WithPrefix("tcp comm: rank 0: ");
  }

  fds->assign(o.size, -1);
  std::vector<int> pending;  // accepted, hello not read yet
  auto close_all = [&]() {
    CloseFd(&listen_fd);
    for (int& fd : pending) CloseFd(&fd);
    for (int& fd : *fds) CloseFd(&fd);
  };
  // Tells every joined peer (and `extra`, the peer whose hello failed the
  // join) why, then closes everything.
  auto fail = [&](const Status& status, int extra) {
    for (int fd : *fds) {
      if (fd >= 0) SendAck(fd, status, 0.2);
    }
    if (extra >= 0) SendAck(extra, status, 0.2);
    CloseFd(&extra);
    close_all();
    return status;
  };

  int joined = 0;
  while (joined < o.size - 1) {
    std::vector<pollfd> polls{{listen_fd, POLLIN, 0}};
    for (int fd : pending) polls.push_back({fd, POLLIN, 0});
    const int n = ::poll(polls.data(), polls.size(), MillisecondsUntil(deadline));
    if (n < 0 && errno != EINTR)
      return fail(Status::Error(std::string("tcp comm: rank 0: poll: ") + std::strerror(errno)), -1);
    if (n <= 0) {
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int r = 1; r < o.size; ++r) {
        if ((*fds)[r] < 0) missing.push_back(r);
      }
      return fail(
          Status::Unavailable("tcp comm: rank" + std::string(missing.size() > 1 ? "s " : " ") + RankList(missing) +
                              ": did not join within " + SecondsText(o.timeout_s) + " (rank 0 listening at " + address +
                              ", bootstrap file " + o.bootstrap_path + ")"),
          -1);
    }
    // Hellos first (the accepted list changes below).
    std::vector<int> still_pending;
    for (size_t i = 1; i < polls.size(); ++i) {
      int fd = polls[i].fd;
      if (polls[i].revents == 0) {
        still_pending.push_back(fd);
        continue;
      }
      Hello hello{};
      int err = 0;
      if (RecvAll(fd, &hello, sizeof(hello), std::max(0.0, MillisecondsUntil(deadline) / 1000.0), &err) != Io::kOk ||
          hello.magic != kHelloMagic) {
        CloseFd(&fd);  // not a Keel rank (or gone before saying so): ignored
        continue;
      }
      std::string refusal;
      if (hello.version != kProtocolVersion) {
        refusal = "speaks protocol version " + std::to_string(hello.version) + ", rank 0 speaks " +
                  std::to_string(kProtocolVersion) + " (every rank must run the same build)";
      } else if (hello.size != static_cast<uint32_t>(o.size)) {
        refusal =
            "says the run has " + std::to_string(hello.size) + " ranks; rank 0 has size " + std::to_string(o.size);
      } else if (hello.rank < 1 || hello.rank >= static_cast<uint32_t>(o.size)) {
        refusal = "is not a rank of this run; 1 .. " + std::to_string(o.size - 1) + " may join rank 0";
      } else if ((*fds)[hello.rank] >= 0) {
        refusal = "joined twice (two processes were given this rank)";
      }
      if (!refusal.empty()) {
        // The connections not looked at yet are closed unanswered.
        for (int& p : still_pending) CloseFd(&p);
        for (size_t j = i + 1; j < polls.size(); ++j) ::close(polls[j].fd);
        pending.clear();
        return fail(Status::InvalidArgument("tcp comm: rank " + std::to_string(hello.rank) + ": " + refusal), fd);
      }
      (*fds)[hello.rank] = fd;
      ++joined;
    }
    pending = std::move(still_pending);
    if (polls[0].revents != 0) {
      for (;;) {
        const int fd = ::accept(listen_fd, nullptr, nullptr);
        if (fd < 0) {
          if (errno == EINTR) continue;
          break;  // EAGAIN: no more waiting; any other error: the peer retries
        }
        ConfigureSocket(fd);
        pending.push_back(fd);
      }
    }
  }
  for (int& fd : pending) CloseFd(&fd);
  CloseFd(&listen_fd);
  for (int r = 1; r < o.size; ++r) {
    int err = 0;
    Ack ack{kAckMagic, 0, 0, 0};
    if (SendAll((*fds)[r], &ack, sizeof(ack), o.timeout_s, &err) != Io::kOk) {
      return fail(Status::Unavailable("tcp comm: rank " + std::to_string(r) + ": closed the connection while joining"),
                  -1);
    }
  }
  return Status::Ok();
}

// A peer: wait for rank 0's address, connect, say hello, read the ack.
Status JoinAsPeer(const TcpCommOptions& o, int* fd_out) {
  const auto deadline = DeadlineAfter(o.timeout_s);
  const std::string me = "tcp comm: rank " + std::to_string(o.rank) + ": ";
  std::string id;
  KEEL_RETURN_IF_ERROR(WaitBootstrapId(o.bootstrap_path, o.timeout_s, &id).WithPrefix(me));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  int fd = -1;
  // Rank 0 may be slow to accept, or the file may be one an earlier run left
  // (its rank 0 gone): retry until the join's deadline, reading the file
  // again each time, so that the new rank 0's address replaces the old one.
  while (fd < 0) {
    std::string fresh;
    if (WaitBootstrapId(o.bootstrap_path, 0, &fresh).ok()) id = fresh;  // else removed meanwhile: the last one
    std::string host, port;
    if (!SplitHostPort(id, &host, &port)) {
      return Status::InvalidArgument(me + "bootstrap file " + o.bootstrap_path + " holds \"" + id.substr(0, 100) +
                                     "\", not host:port");
    }
    addrinfo* addrs = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs);
    if (gai != 0) last_error = std::string("resolving: ") + ::gai_strerror(gai);
    for (addrinfo* a = addrs; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      ConfigureSocket(fd);
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        int err = 0;
        if (WaitReady(fd, POLLOUT, deadline, &err) == Io::kOk) {
          socklen_t len = sizeof(err);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err == 0 ? ETIMEDOUT : err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc != 0) {
        last_error = std::strerror(errno);
        CloseFd(&fd);
      }
    }
    if (addrs) ::freeaddrinfo(addrs);
    if (fd >= 0) break;
    if (Clock::now() + kRetryInterval >= deadline) {
      return Status::Unavailable("tcp comm: rank 0: not reachable at " + id + " within " + SecondsText(o.timeout_s) +
                                 " (" + last_error + "; seen from rank " + std::to_string(o.rank) + ")");
    }
    std::this_thread::sleep_for(kRetryInterval);
  }

  const Hello hello{kHelloMagic, kProtocolVersion, static_cast<uint32_t>(o.rank), static_cast<uint32_t>(o.size)};
  int err = 0;
  Ack ack{};
  Io io = SendAll(fd, &hello, sizeof(hello), o.timeout_s, &err);
  if (io == Io::kOk) io = RecvAll(fd, &ack, sizeof(ack), o.timeout_s + kAckGraceS, &err);
  std::string message;
  if (io == Io::kOk && ack.magic == kAckMagic && ack.message_bytes <= kMaxMessageBytes) {
    message.resize(ack.message_bytes);
    io = RecvAll(fd, &message[0], message.size(), o.timeout_s, &err);
  }
  if (io != Io::kOk || ack.magic != kAckMagic || ack.message_bytes > kMaxMessageBytes) {
    CloseFd(&fd);
    const std::string what = io == Io::kClosed    ? "closed the connection"
                             : io == Io::kTimeout ? "did not answer for " + SecondsText(o.timeout_s + kAckGraceS)
                             : io == Io::kError   ? std::string("failed: ") + std::strerror(err)
                                                  : "answered with bytes that are not an ack (not a Keel rank 0?)";
    return Status::Unavailable("tcp comm: rank 0 at " + id + ": " + what + " while rank " + std::to_string(o.rank) +
                               " was joining");
  }
  if (ack.code != 0) {
    CloseFd(&fd);
    return StatusFromCode(ack.code, message + " (reported by rank 0 to rank " + std::to_string(o.rank) + ")");
  }
  *fd_out = fd;
  return Status::Ok();
}

}  // namespace

Status MakeTcpComm(const TcpCommOptions& options, std::unique_ptr<Communicator>* out) {
  KEEL_RETURN_IF_ERROR(ValidateOptions(options));
  std::vector<int> fds;
  if (options.size > 1) {
    if (options.rank == 0) {
      KEEL_RETURN_IF_ERROR(JoinAsRoot(options, &fds));
    } else {
      fds.assign(1, -1);
      KEEL_RETURN_IF_ERROR(JoinAsPeer(options, &fds[0]));
    }
  }
  *out = std::make_unique<TcpComm>(options, std::move(fds));
  return Status::Ok();
}

}  // namespace keel
