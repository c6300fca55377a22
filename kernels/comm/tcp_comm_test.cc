// The TCP communicator on loopback with real sockets: ranks as threads of this
// process (one forked child for a rank whose process exits), bootstrap files
// in a temporary directory, ports chosen by the OS.
#include "kernels/comm/tcp_comm.h"

#include <ifaddrs.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/formats.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kChunkFloats = kTcpCommChunkBytes / sizeof(float);

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string NewBootstrapPath() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/tcp_comm_test.XXXXXX";
  EXPECT_NE(::mkdtemp(&dir[0]), nullptr);
  return dir + "/bootstrap";
}

TcpCommOptions Options(int rank, int size, const std::string& path, double timeout_s) {
  TcpCommOptions o;
  o.rank = rank;
  o.size = size;
  o.bootstrap_path = path;
  o.timeout_s = timeout_s;
  return o;
}

// Joins `size` ranks, each in its own thread, and runs body(rank, comm) in each.
void RunRanks(int size, const std::function<void(int, Communicator*)>& body, double timeout_s = 20) {
  const std::string path = NewBootstrapPath();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      Status s = MakeTcpComm(Options(r, size, path, timeout_s), &comm);
      ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.message();
      ASSERT_EQ(comm->rank(), r);
      ASSERT_EQ(comm->size(), size);
      EXPECT_STREQ(comm->name(), "tcp");
      body(r, comm.get());
    });
  }
  for (std::thread& t : threads) t.join();
}

// Values whose sums depend on the order they are added in: magnitudes from
// 2^-20 to 2^20, both signs.
std::vector<float> RankData(int rank, int64_t count, uint32_t salt = 0) {
  std::mt19937 gen(1000 * rank + 17 + salt);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(count);
  for (float& x : v) x = std::ldexp(mantissa(gen), exponent(gen)) * (gen() & 1 ? -1.0f : 1.0f);
  return v;
}

float Bf16(float x) { return Bf16ToFloat(FloatToBf16(x, Rounding::kNearestEven, 0.0f)); }

// The sum comm.h specifies, ((x_0 + x_1) + x_2) + ..., of element i of every
// rank's data; with bf16 each term and the sum are rounded to bf16.
float RankOrderSum(const std::vector<std::vector<float>>& data, int64_t i, ReducePrecision precision) {
  const bool bf16 = precision == ReducePrecision::kBF16;
  float acc = bf16 ? Bf16(data[0][i]) : data[0][i];
  for (size_t r = 1; r < data.size(); ++r) acc += bf16 ? Bf16(data[r][i]) : data[r][i];
  return bf16 ? Bf16(acc) : acc;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The index of the first element whose bits differ, or -1.
int64_t FirstDifference(const float* got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!SameBits(got[i], want[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

class TcpCommSizes : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Ranks, TcpCommSizes, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param); });

void CheckAllReduce(int size, int64_t count, ReducePrecision precision) {
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < size; ++r) inputs.push_back(RankData(r, count));
  std::vector<float> want(count);
  for (int64_t i = 0; i < count; ++i) want[i] = RankOrderSum(inputs, i, precision);
  if (size >= 3 && precision == ReducePrecision::kF32 && count > 100) {
    // The data can tell the orders apart: the reverse order differs somewhere.
    int64_t differ = 0;
    for (int64_t i = 0; i < count; ++i) {
      float reverse = inputs[size - 1][i];
      for (int r = size - 2; r >= 0; --r) reverse += inputs[r][i];
      differ += !SameBits(reverse, want[i]);
    }
    ASSERT_GT(differ, 0);
  }
  RunRanks(size, [&](int rank, Communicator* comm) {
    std::vector<float> data = inputs[rank];
    Status s = comm->AllReduceSum(data.data(), count, precision);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(FirstDifference(data.data(), want), -1) << "rank " << rank << ", count " << count;
  });
}

TEST_P(TcpCommSizes, AllReduceSumFp32IsTheRankOrderSumBitForBit) {
  CheckAllReduce(GetParam(), 7, ReducePrecision::kF32);
  CheckAllReduce(GetParam(), 2 * kChunkFloats + 13, ReducePrecision::kF32);  // three chunks, the last one short
}

TEST_P(TcpCommSizes, AllReduceSumBf16RoundsEachTermAndTheSum) {
  CheckAllReduce(GetParam(), 5, ReducePrecision::kBF16);
  CheckAllReduce(GetParam(), kChunkFloats + 3, ReducePrecision::kBF16);
}

TEST_P(TcpCommSizes, AllReduceSumBf16RoundsEachContributionFirst) {
  // 1 + 2^-8 lies halfway between the bf16 values 1 and 1 + 2^-7: nearest even
  // gives 1 on every rank, so the sum is exactly size. Summing first would give
  // size * (1 + 2^-8), which for 3 and 4 ranks rounds to another bf16 value.
  const int size = GetParam();
  RunRanks(size, [&](int, Communicator* comm) {
    float data[2] = {1.0f + std::ldexp(1.0f, -8), -0.0f};
    ASSERT_TRUE(comm->AllReduceSum(data, 2, ReducePrecision::kBF16).ok());
    EXPECT_EQ(data[0], static_cast<float>(size));
    EXPECT_EQ(data[1], 0.0f);
  });
}

TEST_P(TcpCommSizes, AllReduceSumOfNothingSucceeds) {
  RunRanks(GetParam(), [&](int, Communicator* comm) {
    EXPECT_TRUE(comm->AllReduceSum(nullptr, 0, ReducePrecision::kF32).ok());
    float one = 1.0f;
    ASSERT_TRUE(comm->AllReduceSum(&one, 1, ReducePrecision::kF32).ok());  // still in step
    EXPECT_EQ(one, static_cast<float>(GetParam()));
  });
}

TEST_P(TcpCommSizes, ReduceScatterSumGivesEachRankItsPartOfTheSum) {
  const int size = GetParam();
  for (ReducePrecision precision : {ReducePrecision::kF32, ReducePrecision::kBF16}) {
    // Parts that do not line up with chunks: a part straddles a chunk border.
    for (int64_t count : {int64_t{3}, kChunkFloats / 2 + 3}) {
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < size; ++r) inputs.push_back(RankData(r, count * size, 5));
      RunRanks(size, [&](int rank, Communicator* comm) {
        std::vector<float> out(count, std::nanf(""));
        Status s = comm->ReduceScatterSum(inputs[rank].data(), out.data(), count, precision);
        ASSERT_TRUE(s.ok()) << s.message();
        std::vector<float> want(count);
        for (int64_t i = 0; i < count; ++i) want[i] = RankOrderSum(inputs, rank * count + i, precision);
        EXPECT_EQ(FirstDifference(out.data(), want), -1) << "rank " << rank << ", count " << count;
      });
    }
  }
}

TEST_P(TcpCommSizes, AllGatherConcatenatesInRankOrder) {
  const int size = GetParam();
  const int64_t count = 1001;
  std::vector<float> want;
  for (int r = 0; r < size; ++r) {
    std::vector<float> part = RankData(r, count, 9);
    want.insert(want.end(), part.begin(), part.end());
  }
  RunRanks(size, [&](int rank, Communicator* comm) {
    const std::vector<float> mine = RankData(rank, count, 9);
    std::vector<float> out(size * count, -1.0f);
    ASSERT_TRUE(comm->AllGather(mine.data(), out.data(), count).ok());
    EXPECT_EQ(FirstDifference(out.data(), want), -1) << "rank " << rank;

    // In place: this rank's part already sits at out + rank * count.
    std::vector<float> in_place(size * count, -1.0f);
    std::copy(mine.begin(), mine.end(), in_place.begin() + rank * count);
    ASSERT_TRUE(comm->AllGather(in_place.data() + rank * count, in_place.data(), count).ok());
    EXPECT_EQ(FirstDifference(in_place.data(), want), -1) << "rank " << rank << " (in place)";
  });
}

TEST_P(TcpCommSizes, BroadcastCopiesTheRootsBytes) {
  const int size = GetParam();
  const size_t bytes = 12345;
  for (int root : {0, size - 1, size / 2}) {
    RunRanks(size, [&](int rank, Communicator* comm) {
      std::string data(bytes, static_cast<char>('a' + rank));
      if (rank == root) {
        for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 7 + root);
      }
      ASSERT_TRUE(comm->Broadcast(&data[0], bytes, root).ok());
      for (size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(data[i], static_cast<char>(i * 7 + root)) << "rank " << rank << ", root " << root << ", byte " << i;
      }
    });
  }
}

TEST_P(TcpCommSizes, BarrierWaitsForEveryRank) {
  const int size = GetParam();
  std::vector<std::atomic<bool>> arrived(size);
  RunRanks(size, [&](int rank, Communicator* comm) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40 * rank));  // the last rank arrives last
    arrived[rank] = true;
    ASSERT_TRUE(comm->Barrier().ok());
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(arrived[r]) << "rank " << rank << " left before rank " << r << " arrived";
    }
  });
}

TEST_P(TcpCommSizes, AllGatherHostGathersValuesOfAnyLength) {
  const int size = GetParam();
  // Rank 0's value is empty; the others differ in length and hold a NUL byte.
  auto value = [](int r) {
    return r == 0 ? std::string() : std::string(3 * r, static_cast<char>('a' + r)) + '\0' + "x";
  };
  RunRanks(size, [&](int rank, Communicator* comm) {
    std::vector<std::string> all = {"stale"};
    ASSERT_TRUE(comm->AllGatherHost(value(rank), &all).ok());
    ASSERT_EQ(all.size(), static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) EXPECT_EQ(all[r], value(r)) << "rank " << rank << " sees rank " << r;
  });
}

TEST_P(TcpCommSizes, CollectivesInSequenceStayInStep) {
  const int size = GetParam();
  RunRanks(size, [&](int rank, Communicator* comm) {
    for (int round = 0; round < 20; ++round) {
      float x = static_cast<float>(rank + round);
      ASSERT_TRUE(comm->AllReduceSum(&x, 1, ReducePrecision::kF32).ok());
      EXPECT_EQ(x, static_cast<float>(size * round + size * (size - 1) / 2));
      int64_t token = rank == 0 ? round : -1;
      ASSERT_TRUE(comm->Broadcast(&token, sizeof(token), 0).ok());
      EXPECT_EQ(token, round);
      std::vector<std::string> all;
      ASSERT_TRUE(comm->AllGatherHost(std::to_string(rank * round), &all).ok());
      EXPECT_EQ(all.back(), std::to_string((size - 1) * round));
    }
  });
}

// ---- Started (asynchronous) all-reduces ------------------------------------------------------

// Started collectives give the synchronous call's bits; a synchronous call made
// while some are outstanding runs after them; handles are waited for in any
// order, once each.
TEST_P(TcpCommSizes, StartedAllReducesGiveTheSynchronousBitsInCallOrder) {
  const int size = GetParam();
  struct Buffer {
    int64_t count;
    ReducePrecision precision;
    uint32_t salt;
  };
  const std::vector<Buffer> buffers = {{7, ReducePrecision::kF32, 1},
                                       {2 * kChunkFloats + 13, ReducePrecision::kF32, 2},
                                       {kChunkFloats + 3, ReducePrecision::kBF16, 3}};
  std::vector<std::vector<float>> want(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < size; ++r) inputs.push_back(RankData(r, buffers[b].count, buffers[b].salt));
    for (int64_t i = 0; i < buffers[b].count; ++i) want[b].push_back(RankOrderSum(inputs, i, buffers[b].precision));
  }
  RunRanks(size, [&](int rank, Communicator* comm) {
    std::vector<std::vector<float>> data;
    for (const Buffer& b : buffers) data.push_back(RankData(rank, b.count, b.salt));
    CommHandle h[3] = {0, 0, 0};
    ASSERT_TRUE(comm->StartAllReduceSum(data[0].data(), buffers[0].count, buffers[0].precision, &h[0]).ok());
    ASSERT_TRUE(comm->StartAllReduceSum(data[1].data(), buffers[1].count, buffers[1].precision, &h[1]).ok());
    // Synchronous, with two started before it: it goes on the wire after them.
    std::vector<std::string> all;
    ASSERT_TRUE(comm->AllGatherHost("rank " + std::to_string(rank), &all).ok());
    ASSERT_EQ(all.size(), static_cast<size_t>(size));
    EXPECT_EQ(all.back(), "rank " + std::to_string(size - 1));
    ASSERT_TRUE(comm->StartAllReduceSum(data[2].data(), buffers[2].count, buffers[2].precision, &h[2]).ok());
    EXPECT_NE(h[0], 0u);
    EXPECT_NE(h[0], h[1]);
    EXPECT_NE(h[1], h[2]);
    for (int b : {2, 0, 1}) {  // not the order they were started in
      double seconds = -1;
      const Status s = comm->Wait(h[b], &seconds);
      ASSERT_TRUE(s.ok()) << "rank " << rank << ", buffer " << b << ": " << s.message();
      EXPECT_GE(seconds, 0.0);
      EXPECT_EQ(FirstDifference(data[b].data(), want[b]), -1) << "rank " << rank << ", buffer " << b;
    }
    // Each handle once; 0 is never one.
    for (CommHandle bad : {h[0], CommHandle{0}}) {
      const Status again = comm->Wait(bad, nullptr);
      EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.message();
      EXPECT_EQ(again.field(), "handle");
    }
    // Bad arguments start nothing, and the communicator stays usable.
    CommHandle h_bad = 0;
    EXPECT_EQ(comm->StartAllReduceSum(data[0].data(), -1, ReducePrecision::kF32, &h_bad).field(), "count");
    EXPECT_EQ(comm->StartAllReduceSum(nullptr, 4, ReducePrecision::kF32, &h_bad).field(), "data");
    EXPECT_EQ(comm->StartAllReduceSum(data[0].data(), 4, ReducePrecision::kF32, nullptr).field(), "handle");
    EXPECT_EQ(h_bad, 0u);
    ASSERT_TRUE(comm->Barrier().ok());
    CommHandle empty = 0;
    ASSERT_TRUE(comm->StartAllReduceSum(nullptr, 0, ReducePrecision::kF32, &empty).ok());
    ASSERT_TRUE(comm->Wait(empty, nullptr).ok());
  });
}

// StartAllReduceSum returns at once: rank 0 starts, a late rank 1 starts 300 ms
// later, and rank 0's wait is what takes the time.
TEST(TcpComm, StartReturnsAtOnceAndWaitWaitsForTheLatePeer) {
  RunRanks(2, [&](int rank, Communicator* comm) {
    std::vector<float> data(kChunkFloats + 5, static_cast<float>(rank + 1));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = Clock::now();
    CommHandle h = 0;
    ASSERT_TRUE(comm->StartAllReduceSum(data.data(), data.size(), ReducePrecision::kF32, &h).ok());
    const double started = SecondsSince(start);
    double seconds = 0;
    ASSERT_TRUE(comm->Wait(h, &seconds).ok());
    const double waited = SecondsSince(start);
    for (float x : data) ASSERT_EQ(x, 3.0f);
    if (rank == 0) {
      EXPECT_LT(started, 0.1) << "Start waited for the collective";
      EXPECT_GE(waited, 0.25);
      // The collective began on the communication thread at the start and
      // waited there for rank 1: its own time covers that wait.
      EXPECT_GE(seconds, 0.2);
      EXPECT_LE(seconds, waited);
    }
  });
}

// A peer that never starts the collective fails it at Wait after the timeout
// (never a hang), naming the peer; the communicator then refuses everything.
TEST(TcpComm, AStartedAllReduceAPeerNeverStartsFailsAtWait) {
  std::mutex mu;
  std::condition_variable cv;
  bool rank0_done = false;
  RunRanks(
      2,
      [&](int rank, Communicator* comm) {
        if (rank == 1) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return rank0_done; });
          return;
        }
        std::vector<float> data(100, 1.0f);
        const auto start = Clock::now();
        CommHandle h = 0;
        ASSERT_TRUE(comm->StartAllReduceSum(data.data(), data.size(), ReducePrecision::kF32, &h).ok());
        const Status s = comm->Wait(h, nullptr);
        const double seconds = SecondsSince(start);
        EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
        EXPECT_EQ(s.message(), "tcp comm: rank 1: sent nothing for 1 s during AllReduceSum (seen from rank 0)");
        EXPECT_GE(seconds, 1.0);
        EXPECT_LT(seconds, 4.0);
        const Status barrier = comm->Barrier();
        EXPECT_EQ(barrier.code(), StatusCode::kFailedPrecondition) << barrier.message();
        EXPECT_NE(barrier.message().find(s.message()), std::string::npos) << barrier.message();
        CommHandle later = 0;
        ASSERT_TRUE(comm->StartAllReduceSum(data.data(), data.size(), ReducePrecision::kF32, &later).ok());
        EXPECT_EQ(comm->Wait(later, nullptr).code(), StatusCode::kFailedPrecondition);
        std::lock_guard<std::mutex> lock(mu);
        rank0_done = true;
        cv.notify_all();
      },
      1.0);
}

// Destroying a communicator whose started collectives wait for a peer ends
// them at once (not after the 30 s timeout), and the peer sees it go.
TEST(TcpComm, DestroyingACommunicatorEndsItsStartedCollectivesAtOnce) {
  const std::string path = NewBootstrapPath();
  std::mutex mu;
  std::condition_variable cv;
  bool rank0_gone = false;
  std::thread peer([&] {
    std::unique_ptr<Communicator> comm;
    ASSERT_TRUE(MakeTcpComm(Options(1, 2, path, 30), &comm).ok());
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return rank0_gone; });
    }
    const Status s = comm->Barrier();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  });
  {
    std::unique_ptr<Communicator> comm;
    ASSERT_TRUE(MakeTcpComm(Options(0, 2, path, 30), &comm).ok());
    std::vector<float> a(10, 1.0f), b(10, 2.0f);
    CommHandle ha = 0, hb = 0;
    ASSERT_TRUE(comm->StartAllReduceSum(a.data(), a.size(), ReducePrecision::kF32, &ha).ok());
    ASSERT_TRUE(comm->StartAllReduceSum(b.data(), b.size(), ReducePrecision::kF32, &hb).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first is waiting for rank 1 now
    const auto start = Clock::now();
    comm.reset();
    EXPECT_LT(SecondsSince(start), 5.0);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    rank0_gone = true;
  }
  cv.notify_all();
  peer.join();
}

// ---- Refusals and failures -------------------------------------------------------------

TEST(TcpComm, RefusesBadOptionsNamingTheField) {
  struct Case {
    TcpCommOptions options;
    std::string field, value;
  };
  const std::string path = NewBootstrapPath();
  std::vector<Case> cases = {
      {Options(0, 0, path, 1), "size", "0"},
      {Options(-1, 2, path, 1), "rank", "-1"},
      {Options(2, 2, path, 1), "rank", "2"},
      {Options(0, 2, path, 0), "timeout_s", "0 s"},
      {Options(0, 2, path, -3), "timeout_s", "-3 s"},
      {Options(0, 2, path, std::numeric_limits<double>::quiet_NaN()), "timeout_s", "nan"},
      {Options(1, 2, "", 1), "bootstrap_path", "is empty"},
  };
  TcpCommOptions no_host = Options(0, 2, path, 1);
  no_host.host = "";
  cases.push_back({no_host, "host", "is empty"});
  TcpCommOptions wildcard_advertised = Options(0, 2, path, 1);
  wildcard_advertised.host = "0.0.0.0";
  wildcard_advertised.advertise = "0.0.0.0";
  cases.push_back({wildcard_advertised, "advertise", "\"0.0.0.0\" cannot be connected to"});
  for (const Case& c : cases) {
    std::unique_ptr<Communicator> comm;
    Status s = MakeTcpComm(c.options, &comm);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.field(), c.field) << s.message();
    EXPECT_NE(s.message().find(c.value), std::string::npos) << s.message();
    EXPECT_EQ(comm, nullptr);
  }
  // One rank needs no bootstrap file.
  std::unique_ptr<Communicator> comm;
  EXPECT_TRUE(MakeTcpComm(Options(0, 1, "", 1), &comm).ok());
}

// This machine's first IPv4 address that is not loopback; "" when it has none.
std::string NonLoopbackIpv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const in_addr ip = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr;
    if ((ntohl(ip.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &ip, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// Rank 0 listens on 0.0.0.0 and publishes `advertise`; the bootstrap file must
// then read "<published>:<port>", and rank 1 joins through it (or, with
// connect_via, through a copy naming that host instead) and sums with rank 0.
void JoinThroughEveryInterface(const std::string& advertise, const std::string& published,
                               const std::string& connect_via = "") {
  SCOPED_TRACE("advertise \"" + advertise + "\"");
  const std::string path = NewBootstrapPath();
  std::vector<float> sums[2];
  std::thread root([&] {
    TcpCommOptions o = Options(0, 2, path, 10);
    o.host = "0.0.0.0";
    o.advertise = advertise;
    std::unique_ptr<Communicator> comm;
    Status s = MakeTcpComm(o, &comm);
    ASSERT_TRUE(s.ok()) << s.message();
    sums[0] = {1, 2};
    ASSERT_TRUE(comm->AllReduceSum(sums[0].data(), 2, ReducePrecision::kF32).ok());
  });
  std::string id;
  ASSERT_TRUE(WaitBootstrapId(path, 10, &id).ok());
  EXPECT_EQ(id.rfind(published + ":", 0), 0u) << id;
  const std::string port = id.substr(id.rfind(':') + 1);
  EXPECT_GT(std::atoi(port.c_str()), 0) << id;
  std::string peer_path = path;
  if (!connect_via.empty()) {
    peer_path = path + ".via";
    ASSERT_TRUE(WriteBootstrapId(peer_path, connect_via + ":" + port).ok());
  }
  std::unique_ptr<Communicator> comm;
  Status s = MakeTcpComm(Options(1, 2, peer_path, 10), &comm);
  EXPECT_TRUE(s.ok()) << s.message();
  if (s.ok()) {
    sums[1] = {10, 20};
    EXPECT_TRUE(comm->AllReduceSum(sums[1].data(), 2, ReducePrecision::kF32).ok());
  }
  root.join();
  EXPECT_EQ(sums[0], (std::vector<float>{11, 22}));
  EXPECT_EQ(sums[1], (std::vector<float>{11, 22}));
}

// A run spanning hosts (dist.listen_host 0.0.0.0): rank 0 is reachable at an
// address other than the loopback one the single-host default listens on.
TEST(TcpComm, RankZeroOnEveryInterfacePublishesTheAdvertisedAddress) {
  // 127.0.0.2 reaches a socket bound to 0.0.0.0, never one bound to 127.0.0.1.
  JoinThroughEveryInterface("127.0.0.2", "127.0.0.2");
  const std::string lan = NonLoopbackIpv4();
  std::printf("this machine's non-loopback IPv4 address: %s\n", lan.empty() ? "(none)" : lan.c_str());
  if (!lan.empty()) JoinThroughEveryInterface(lan, lan);
  // Nothing advertised: the machine's name (here reached through loopback,
  // since a test machine's name need not resolve).
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  JoinThroughEveryInterface("", name, "127.0.0.1");
}

TEST(TcpComm, RefusesABroadcastRootThatIsNotARank) {
  RunRanks(2, [&](int, Communicator* comm) {
    char byte = 0;
    Status s = comm->Broadcast(&byte, 1, 2);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.field(), "root");
    EXPECT_TRUE(comm->Barrier().ok());  // a refused call leaves the communicator usable
  });
}

// Starts ranks `ranks` of a run of `size` as threads; results[r] gets each
// MakeTcpComm's status and seconds[r] how long it took.
struct JoinResults {
  std::vector<Status> status;
  std::vector<double> seconds;
};
JoinResults JoinSome(int size, const std::vector<int>& ranks, const std::vector<int>& claimed_sizes, double timeout_s) {
  const std::string path = NewBootstrapPath();
  JoinResults results{std::vector<Status>(ranks.size()), std::vector<double>(ranks.size())};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      const auto start = Clock::now();
      std::unique_ptr<Communicator> comm;
      const int claimed = claimed_sizes.empty() ? size : claimed_sizes[i];
      results.status[i] = MakeTcpComm(Options(ranks[i], claimed, path, timeout_s), &comm);
      results.seconds[i] = SecondsSince(start);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(TcpComm, ARankThatNeverJoinsFailsTheJoinNamingIt) {
  // Ranks 0, 1 and 3 of 4 start; rank 2 never does.
  JoinResults r = JoinSome(4, {0, 1, 3}, {}, 1.0);
  for (size_t i = 0; i < r.status.size(); ++i) {
    EXPECT_EQ(r.status[i].code(), StatusCode::kUnavailable) << r.status[i].message();
    EXPECT_NE(r.status[i].message().find("rank 2: did not join within 1 s"), std::string::npos)
        << r.status[i].message();
    EXPECT_LT(r.seconds[i], 3.0);
  }
  EXPECT_GE(r.seconds[0], 1.0);  // rank 0 waited the whole timeout
}

TEST(TcpComm, APeerWithoutRankZeroTimesOut) {
  JoinResults r = JoinSome(2, {1}, {}, 0.3);
  EXPECT_EQ(r.status[0].code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status[0].message().find("no bootstrap id from rank 0"), std::string::npos) << r.status[0].message();
  EXPECT_LT(r.seconds[0], 2.0);
}

TEST(TcpComm, RefusesAPeerThatClaimsAnotherRunSize) {
  JoinResults r = JoinSome(2, {0, 1}, {2, 3}, 5.0);
  for (const Status& s : r.status) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("rank 1: says the run has 3 ranks; rank 0 has size 2"), std::string::npos)
        << s.message();
  }
  EXPECT_LT(r.seconds[0], 3.0);  // refused at the hello, not after the timeout
}

TEST(TcpComm, RefusesTwoPeersWithOneRank) {
  JoinResults r = JoinSome(3, {0, 1, 1}, {}, 5.0);
  for (const Status& s : r.status) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("rank 1: joined twice"), std::string::npos) << s.message();
  }
  EXPECT_LT(r.seconds[0], 3.0);
}

TEST(TcpComm, IgnoresAStrayConnection) {
  const std::string path = NewBootstrapPath();
  Status root_status, peer_status;
  std::unique_ptr<Communicator> root, peer;
  std::thread root_thread([&] { root_status = MakeTcpComm(Options(0, 2, path, 10), &root); });
  // Something that is not a rank connects first and sends junk.
  std::string id;
  ASSERT_TRUE(WaitBootstrapId(path, 10, &id).ok());
  const size_t colon = id.rfind(':');
  addrinfo* addrs = nullptr;
  ASSERT_EQ(::getaddrinfo(id.substr(0, colon).c_str(), id.substr(colon + 1).c_str(), nullptr, &addrs), 0);
  const int stray = ::socket(addrs->ai_family, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(stray, addrs->ai_addr, addrs->ai_addrlen), 0);
  ::freeaddrinfo(addrs);
  ASSERT_EQ(::send(stray, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL), 18);
  std::thread peer_thread([&] { peer_status = MakeTcpComm(Options(1, 2, path, 10), &peer); });
  root_thread.join();
  peer_thread.join();
  ::close(stray);
  ASSERT_TRUE(root_status.ok()) << root_status.message();
  ASSERT_TRUE(peer_status.ok()) << peer_status.message();
}

TEST(TcpComm, APeerReadsTheBootstrapFileAgainWhenItsAddressIsStale) {
  // A file an earlier run left: nothing listens at port 1 of loopback.
  const std::string path = NewBootstrapPath();
  ASSERT_TRUE(WriteBootstrapId(path, "127.0.0.1:1").ok());
  Status root_status, peer_status;
  std::unique_ptr<Communicator> root, peer;
  std::thread peer_thread([&] { peer_status = MakeTcpComm(Options(1, 2, path, 10), &peer); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the peer has tried the stale address
  std::thread root_thread([&] { root_status = MakeTcpComm(Options(0, 2, path, 10), &root); });
  root_thread.join();
  peer_thread.join();
  ASSERT_TRUE(root_status.ok()) << root_status.message();
  ASSERT_TRUE(peer_status.ok()) << peer_status.message();
}

// Runs body(rank, comm) for ranks 0 and 1 of a run of 3 whose rank 2 is a
// child process that joins and then exits without a word.
void WithRankTwoExiting(const std::function<void(int, Communicator*)>& body, double timeout_s) {
  const std::string path = NewBootstrapPath();
  // Fork before any thread starts: the child runs only socket code.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<Communicator> comm;
    _exit(MakeTcpComm(Options(2, 3, path, timeout_s), &comm).ok() ? 0 : 1);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      Status s = MakeTcpComm(Options(r, 3, path, timeout_s), &comm);
      ASSERT_TRUE(s.ok()) << s.message();
      body(r, comm.get());
    });
  }
  for (std::thread& t : threads) t.join();
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "the child rank did not join";
}

TEST(TcpComm, APeerProcessThatExitsFailsTheOthersQuickly) {
  WithRankTwoExiting(
      [](int rank, Communicator* comm) {
        std::vector<float> data(3 * kChunkFloats, 1.0f);
        const auto start = Clock::now();
        Status s = comm->AllReduceSum(data.data(), data.size(), ReducePrecision::kF32);
        EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
        // Rank 0 reads rank 2's closed socket; rank 1 then sees rank 0 close.
        const std::string culprit = rank == 0 ? "tcp comm: rank 2: closed the connection during AllReduceSum"
                                              : "tcp comm: rank 0: closed the connection during AllReduceSum";
        EXPECT_EQ(s.message().rfind(culprit, 0), 0u) << s.message();
        EXPECT_LT(SecondsSince(start), 5.0);  // far less than the 30 s timeout: no waiting it out
        Status again = comm->Barrier();
        EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
        EXPECT_NE(again.message().find(s.message()), std::string::npos) << again.message();
      },
      30.0);
}

TEST(TcpComm, ACommunicatorClosedMidRunFailsTheOthers) {
  // Rank 1 goes away (its communicator destroyed) while ranks 0 and 2 gather.
  RunRanks(
      3,
      [&](int rank, Communicator* comm) {
        if (rank == 1) return;  // RunRanks destroys it on return
        std::vector<std::string> all;
        const auto start = Clock::now();
        Status s = comm->AllGatherHost("x", &all);
        EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
        EXPECT_LT(SecondsSince(start), 5.0);
        if (rank == 0) {
          EXPECT_EQ(s.message().rfind("tcp comm: rank 1: closed the connection", 0), 0u) << s.message();
        }
      },
      30.0);
}

TEST(TcpComm, AStalledPeerFailsTheOthersAfterTheTimeout) {
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;  // ranks 0 and 1 done with their barrier
  RunRanks(
      3,
      [&](int rank, Communicator* comm) {
        if (rank == 2) {
          // Stalls: calls nothing until the others gave up, then finds itself cut off.
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return finished == 2; });
          EXPECT_EQ(comm->Barrier().code(), StatusCode::kUnavailable);
          return;
        }
        const auto start = Clock::now();
        Status s = comm->Barrier();
        const double seconds = SecondsSince(start);
        EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
        if (rank == 0) {
          EXPECT_EQ(s.message(), "tcp comm: rank 2: sent nothing for 1 s during Barrier (seen from rank 0)");
          EXPECT_GE(seconds, 1.0);
        }
        EXPECT_LT(seconds, 4.0);
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
        cv.notify_all();
      },
      1.0);
}

TEST(TcpComm, ACollectiveMismatchFailsEveryRank) {
  RunRanks(
      2,
      [&](int rank, Communicator* comm) {
        std::vector<float> data(6, 1.0f);
        Status s = comm->AllReduceSum(data.data(), rank == 0 ? 5 : 6, ReducePrecision::kF32);
        EXPECT_FALSE(s.ok());
        if (rank == 0) {
          EXPECT_EQ(s.code(), StatusCode::kInternal);
          EXPECT_EQ(s.message().rfind("tcp comm: rank 1 called AllReduceSum(count=6, fp32) while rank 0 called "
                                      "AllReduceSum(count=5, fp32)",
                                      0),
                    0u)
              << s.message();
        } else {
          EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
        }
      },
      10.0);
}

}  // namespace
}  // namespace keel
