// Tests of the Store (store.h), one suite run against both backends: SQLite on
// real files under $TEST_TMPDIR and PostgreSQL on a real server this test
// starts (TempPostgres: Debian's postgresql, a database per test). Round
// trips, atomicity, metric idempotence and downsampling, durability across
// close, _exit and SIGKILL, schema versions (upgrade of a version 1 store,
// refusal of a newer one), concurrent writers; then what only one backend has
// (SQLite's WAL mode and paths, PostgreSQL's lock, reconnects and URLs) and
// --store parsing.
#include "server/store.h"

#include <postgresql/libpq-fe.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <mutex>
#include <limits>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "server/temp_postgres.h"

namespace keel {
namespace {

using google::protobuf::util::MessageDifferencer;

#define ASSERT_OK(expr)                           \
  do {                                            \
    ::keel::Status _s = (expr);                   \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.message(); \
  } while (0)

v1::Sweep MakeSweep(const std::string& id) {
  v1::Sweep s;
  s.set_id(id);
  s.set_name("name of " + id);
  s.set_state(v1::SWEEP_ACTIVE);
  s.mutable_spec()->set_yaml("base: {}\naxes: {lr: [1, 2]}\n");
  s.mutable_spec()->set_source(id + ".yaml");
  s.set_created_unix_ms(1700000000000);
  s.set_runs_total(2);
  (*s.mutable_runs_by_state())["QUEUED"] = 2;
  (*s.mutable_runs_by_state())["RUNNING"] = 0;
  return s;
}

v1::Run MakeRun(const std::string& id, const std::string& sweep_id) {
  v1::Run r;
  r.set_id(id);
  r.set_sweep_id(sweep_id);
  r.set_state(v1::QUEUED);
  r.mutable_spec()->set_yaml("optimizer: {lr: 6e-4}\n");
  (*r.mutable_axes())["optimizer.lr"] = "6e-4";
  (*r.mutable_axes())["seed"] = "1";
  r.set_precision("mxfp8_e4m3");
  r.set_step(10);
  r.set_steps(1000);
  r.set_loss(3.25);
  r.set_restarts(1);
  r.set_worker_id("w1");
  r.set_checkpoint("/ckpt/" + id);
  r.set_message("hello");
  r.set_created_unix_ms(1700000000001);
  r.set_updated_unix_ms(1700000000002);
  return r;
}

v1::MetricPoint MakePoint(const std::string& run_id, int64_t step, double loss = -1) {
  v1::MetricPoint p;
  p.set_run_id(run_id);
  p.set_step(step);
  p.set_loss(loss < 0 ? 10.0 - 0.001 * static_cast<double>(step) : loss);
  p.set_lr(1e-3);
  p.set_tokens_per_s(12345.5);
  p.set_grad_norm(0.75);
  p.set_json("{\"step\":" + std::to_string(step) + "}");
  return p;
}

v1::Event MakeEvent(const std::string& run_id, int64_t step, const std::string& kind) {
  v1::Event e;
  e.set_run_id(run_id);
  e.set_step(step);
  e.set_unix_ms(1700000000100 + step);
  e.set_kind(kind);
  e.set_message(kind + " at " + std::to_string(step));
  (*e.mutable_details())["loss_z"] = "7.5";
  return e;
}

// A fresh SQLite path per test (the file does not exist yet).
std::string TestDbPath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string base = dir != nullptr ? dir : "/tmp";
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  std::string path = base + "/" + name + ".db";
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return path;
}

// The PostgreSQL server of this test binary, started by the first test that
// needs it and stopped when the tests end. A server that cannot start fails
// every PostgreSQL test with the reason.
class PostgresEnvironment : public ::testing::Environment {
 public:
  static TempPostgres* Get(Status* status) {
    if (!started_) {
      started_ = true;
      start_status_ = TempPostgres::Start(&server_);
    }
    *status = start_status_;
    return server_.get();
  }
  // A new, empty database; *url names it.
  static Status NewDatabase(std::string* url) {
    Status status;
    TempPostgres* server = Get(&status);
    if (server == nullptr) return status;
    return server->CreateDatabase("t" + std::to_string(++databases_), url);
  }
  void TearDown() override { server_.reset(); }

 private:
  static bool started_;
  static Status start_status_;
  static std::unique_ptr<TempPostgres> server_;
  static int databases_;
};
bool PostgresEnvironment::started_ = false;
Status PostgresEnvironment::start_status_;
std::unique_ptr<TempPostgres> PostgresEnvironment::server_;
int PostgresEnvironment::databases_ = 0;
::testing::Environment* const kPostgresEnvironment =
    ::testing::AddGlobalTestEnvironment(new PostgresEnvironment());

enum class Backend { kSqlite, kPostgres };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kSqlite ? "sqlite" : "postgres";
}

// Runs SQL on a PostgreSQL database directly, bypassing the Store.
std::string PgQueryText(const std::string& url, const std::string& sql, bool expect_ok = true) {
  PGconn* conn = PQconnectdb(url.c_str());
  std::string out;
  if (PQstatus(conn) != CONNECTION_OK) {
    out = std::string("connect failed: ") + PQerrorMessage(conn);
  } else {
    PGresult* res = PQexec(conn, sql.c_str());
    const ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK && PQntuples(res) > 0) {
      out = PQgetvalue(res, 0, 0);
    } else if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      out = std::string("error: ") + PQresultErrorMessage(res);
    }
    PQclear(res);
  }
  PQfinish(conn);
  if (expect_ok) {
    EXPECT_EQ(out.rfind("error: ", 0), std::string::npos) << sql << ": " << out;
    EXPECT_EQ(out.rfind("connect failed", 0), std::string::npos) << out;
  }
  return out;
}

// Runs SQL on a SQLite file directly, bypassing the Store.
void SqliteExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

std::string SqliteQueryText(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "open failed";
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* p = sqlite3_column_text(stmt, 0);
    out = p ? reinterpret_cast<const char*>(p) : "";
  } else {
    out = std::string("error: ") + sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

// The suite's fixture: Location() is where this test's store lives (a SQLite
// file or a PostgreSQL database URL), new and empty when the test starts.
class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kSqlite) {
      location_ = TestDbPath();
      return;
    }
    Status s = PostgresEnvironment::NewDatabase(&location_);
    ASSERT_TRUE(s.ok()) << "the PostgreSQL tests need a PostgreSQL server: " << s.message();
  }

  bool postgres() const { return GetParam() == Backend::kPostgres; }
  const std::string& Location() const { return location_; }

  Status OpenAt(const std::string& location, std::unique_ptr<Store>* out) {
    return postgres() ? OpenPostgresStore(location, out) : OpenSqliteStore(location, out);
  }
  std::unique_ptr<Store> Open(const std::string& location) {
    std::unique_ptr<Store> store;
    Status s = OpenAt(location, &store);
    EXPECT_TRUE(s.ok()) << s.message();
    return store;
  }

  // SQL run on the store directly, bypassing the Store.
  void RawExec(const std::string& location, const std::string& sql) {
    if (postgres()) {
      PgQueryText(location, sql);
    } else {
      SqliteExec(location, sql);
    }
  }
  // The first column of the first row as text ("" when none).
  std::string RawQueryText(const std::string& location, const std::string& sql) {
    return postgres() ? PgQueryText(location, sql) : SqliteQueryText(location, sql);
  }

 private:
  std::string location_;
};

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         BackendName);

std::vector<std::string> RunIds(const std::vector<v1::Run>& runs) {
  std::vector<std::string> ids;
  for (const auto& r : runs) ids.push_back(r.id());
  return ids;
}

std::vector<int64_t> Steps(const std::vector<v1::MetricPoint>& points) {
  std::vector<int64_t> steps;
  for (const auto& p : points) steps.push_back(p.step());
  return steps;
}

std::vector<std::string> EventKinds(const std::vector<v1::Event>& events) {
  std::vector<std::string> kinds;
  for (const auto& e : events) kinds.push_back(e.kind());
  return kinds;
}

// ---- Round trips -------------------------------------------------------------

TEST_P(StoreTest, SweepAndRunRoundTrip) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  v1::Sweep sweep = MakeSweep("sw1");
  std::vector<v1::Run> runs = {MakeRun("r1", "sw1"), MakeRun("r2", "sw1")};
  ASSERT_OK(store->CreateSweep(sweep, runs));

  v1::Sweep got;
  ASSERT_OK(store->GetSweep("sw1", &got));
  EXPECT_TRUE(MessageDifferencer::Equals(sweep, got)) << got.DebugString();
  v1::Run run;
  ASSERT_OK(store->GetRun("r2", &run));
  EXPECT_TRUE(MessageDifferencer::Equals(runs[1], run)) << run.DebugString();

  sweep.set_state(v1::SWEEP_DONE);
  (*sweep.mutable_runs_by_state())["SUCCEEDED"] = 2;
  ASSERT_OK(store->UpdateSweep(sweep));
  ASSERT_OK(store->GetSweep("sw1", &got));
  EXPECT_TRUE(MessageDifferencer::Equals(sweep, got)) << got.DebugString();

  runs[0].set_state(v1::RUNNING);
  runs[0].set_step(500);
  ASSERT_OK(store->UpdateRun(runs[0]));
  ASSERT_OK(store->GetRun("r1", &run));
  EXPECT_TRUE(MessageDifferencer::Equals(runs[0], run)) << run.DebugString();
}

TEST_P(StoreTest, NotFoundErrors) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  v1::Sweep sweep;
  Status s = store->GetSweep("x", &sweep);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "sweep 'x' not found");
  EXPECT_TRUE(IsNotFound(s));
  v1::Run run;
  EXPECT_TRUE(IsNotFound(store->GetRun("nope", &run)));
  v1::Worker worker;
  EXPECT_TRUE(IsNotFound(store->GetWorker("nope", &worker)));
  EXPECT_TRUE(IsNotFound(store->UpdateSweep(MakeSweep("nope"))));
  EXPECT_TRUE(IsNotFound(store->UpdateRun(MakeRun("nope", "sw"))));
  std::vector<v1::Run> runs;
  EXPECT_TRUE(IsNotFound(store->ListRuns("nope", &runs)));
  std::vector<v1::MetricPoint> points;
  EXPECT_TRUE(IsNotFound(store->GetMetrics("nope", 0, &points)));
  EXPECT_TRUE(IsNotFound(store->AppendMetrics({MakePoint("nope", 1)})));
  EXPECT_TRUE(IsNotFound(store->AppendEvent(MakeEvent("nope", 1, "state"))));
  // Other errors are not NotFound.
  EXPECT_FALSE(IsNotFound(Status::Ok()));
  ASSERT_OK(store->CreateSweep(MakeSweep("sw"), {}));
  Status dup = store->CreateSweep(MakeSweep("sw"), {});
  EXPECT_FALSE(dup.ok());
  EXPECT_FALSE(IsNotFound(dup));
  // A run without metrics: LastMetric is NotFound, GetMetrics is empty.
  ASSERT_OK(store->CreateSweep(MakeSweep("sw2"), {MakeRun("r", "sw2")}));
  v1::MetricPoint last;
  EXPECT_TRUE(IsNotFound(store->LastMetric("r", &last)));
  ASSERT_OK(store->GetMetrics("r", 0, &points));
  EXPECT_TRUE(points.empty());
}

TEST_P(StoreTest, ListsKeepCreationOrder) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  // Ids sort differently from creation order on purpose.
  ASSERT_OK(store->CreateSweep(MakeSweep("zeta"), {MakeRun("z2", "zeta"), MakeRun("z1", "zeta")}));
  ASSERT_OK(store->CreateSweep(MakeSweep("alpha"), {MakeRun("a9", "alpha")}));
  ASSERT_OK(store->CreateSweep(MakeSweep("mid"), {}));

  std::vector<v1::Sweep> sweeps;
  ASSERT_OK(store->ListSweeps(&sweeps));
  ASSERT_EQ(sweeps.size(), 3u);
  EXPECT_EQ(sweeps[0].id(), "zeta");
  EXPECT_EQ(sweeps[1].id(), "alpha");
  EXPECT_EQ(sweeps[2].id(), "mid");

  std::vector<v1::Run> runs;
  ASSERT_OK(store->ListRuns("", &runs));
  EXPECT_EQ(RunIds(runs), (std::vector<std::string>{"z2", "z1", "a9"}));
  ASSERT_OK(store->ListRuns("zeta", &runs));
  EXPECT_EQ(RunIds(runs), (std::vector<std::string>{"z2", "z1"}));
  ASSERT_OK(store->ListRuns("mid", &runs));
  EXPECT_TRUE(runs.empty());
}

TEST_P(StoreTest, ListRunsInStateAndUpdateRuns) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  std::vector<v1::Run> runs = {MakeRun("a", "s"), MakeRun("b", "s"), MakeRun("c", "s")};
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), runs));
  runs[0].set_state(v1::RUNNING);
  runs[2].set_state(v1::RUNNING);
  runs[2].set_worker_id("w9");
  ASSERT_OK(store->UpdateRuns({runs[0], runs[2]}));

  std::vector<v1::Run> got;
  ASSERT_OK(store->ListRunsInState(v1::RUNNING, &got));
  EXPECT_EQ(RunIds(got), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(got[1].worker_id(), "w9");
  ASSERT_OK(store->ListRunsInState(v1::QUEUED, &got));
  EXPECT_EQ(RunIds(got), (std::vector<std::string>{"b"}));
  ASSERT_OK(store->ListRunsInState(v1::FAILED, &got));
  EXPECT_TRUE(got.empty());

  // UpdateRuns is all or nothing: a missing run rolls back the others.
  runs[1].set_state(v1::FAILED);
  Status s = store->UpdateRuns({runs[1], MakeRun("missing", "s")});
  EXPECT_TRUE(IsNotFound(s)) << s.message();
  v1::Run b;
  ASSERT_OK(store->GetRun("b", &b));
  EXPECT_EQ(b.state(), v1::QUEUED);

  // A run's sweep_id never changes.
  v1::Run moved = runs[1];
  moved.set_sweep_id("other");
  s = store->UpdateRun(moved);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sweep_id"), std::string::npos) << s.message();
}

TEST_P(StoreTest, WorkerRoundTripAndUpsert) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  v1::Worker w;
  w.set_id("w2");
  w.set_host("gpu-node-7");
  v1::Device* d = w.add_devices();
  d->set_index(0);
  d->set_name("NVIDIA H200");
  d->set_memory_bytes(int64_t{141} << 30);
  d->set_run_id("r1");
  w.add_devices()->set_index(1);
  w.set_cpu_slots(16);
  w.set_connected(true);
  w.set_lease_expires_unix_ms(1700000009999);
  w.add_run_ids("r1");
  ASSERT_OK(store->UpsertWorker(w));
  v1::Worker w1;
  w1.set_id("w1");
  w1.set_host("other");
  ASSERT_OK(store->UpsertWorker(w1));

  v1::Worker got;
  ASSERT_OK(store->GetWorker("w2", &got));
  EXPECT_TRUE(MessageDifferencer::Equals(w, got)) << got.DebugString();

  // Upsert replaces and keeps the first-registration order.
  w.set_connected(false);
  w.clear_run_ids();
  ASSERT_OK(store->UpsertWorker(w));
  std::vector<v1::Worker> workers;
  ASSERT_OK(store->ListWorkers(&workers));
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].id(), "w2");
  EXPECT_EQ(workers[1].id(), "w1");
  EXPECT_TRUE(MessageDifferencer::Equals(w, workers[0])) << workers[0].DebugString();
}

TEST_P(StoreTest, Counts) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  int64_t sweeps = -1, runs = -1, points = -1;
  ASSERT_OK(store->Counts(&sweeps, &runs, &points));
  EXPECT_EQ(sweeps, 0);
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(points, 0);
  ASSERT_OK(store->CreateSweep(MakeSweep("s1"), {MakeRun("a", "s1"), MakeRun("b", "s1")}));
  ASSERT_OK(store->CreateSweep(MakeSweep("s2"), {MakeRun("c", "s2")}));
  ASSERT_OK(store->AppendMetrics({MakePoint("a", 1), MakePoint("a", 2), MakePoint("c", 1)}));
  ASSERT_OK(store->Counts(&sweeps, &runs, &points));
  EXPECT_EQ(sweeps, 2);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(points, 3);
}

// ---- CreateSweep validation and atomicity ------------------------------------------

TEST_P(StoreTest, CreateSweepIsAtomicOnDuplicateRunId) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s1"), {MakeRun("r1", "s1")}));

  // r1 exists already: neither s2 nor r2 (inserted before r1 in the batch) stay.
  Status s = store->CreateSweep(MakeSweep("s2"), {MakeRun("r2", "s2"), MakeRun("r1", "s2")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'r1'"), std::string::npos) << s.message();
  v1::Sweep sweep;
  EXPECT_TRUE(IsNotFound(store->GetSweep("s2", &sweep)));
  v1::Run run;
  EXPECT_TRUE(IsNotFound(store->GetRun("r2", &run)));
  int64_t sweeps = 0, runs = 0;
  ASSERT_OK(store->Counts(&sweeps, &runs, nullptr));
  EXPECT_EQ(sweeps, 1);
  EXPECT_EQ(runs, 1);

  // A duplicate inside the batch names the id and stores nothing.
  s = store->CreateSweep(MakeSweep("s3"), {MakeRun("x", "s3"), MakeRun("x", "s3")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  EXPECT_TRUE(IsNotFound(store->GetSweep("s3", &sweep)));

  // A duplicate sweep id names it.
  s = store->CreateSweep(MakeSweep("s1"), {MakeRun("fresh", "s1")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'s1'"), std::string::npos) << s.message();
  EXPECT_TRUE(IsNotFound(store->GetRun("fresh", &run)));

  // A run of another sweep, or with no id, is refused.
  s = store->CreateSweep(MakeSweep("s4"), {MakeRun("y", "elsewhere")});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sweep_id"), std::string::npos) << s.message();
  s = store->CreateSweep(MakeSweep("s4"), {MakeRun("", "s4")});
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(IsNotFound(store->GetSweep("s4", &sweep)));
}

// ---- Metrics -------------------------------------------------------------------

TEST_P(StoreTest, MetricsIdempotentPerStep) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s"), MakeRun("q", "s")}));
  std::vector<v1::MetricPoint> batch;
  for (int step = 1; step <= 5; ++step) batch.push_back(MakePoint("r", step));
  ASSERT_OK(store->AppendMetrics(batch));
  ASSERT_OK(store->AppendMetrics({MakePoint("q", 3)}));
  // A restart from step 2 re-sends steps 3 and 4 with new values, out of order.
  ASSERT_OK(store->AppendMetrics({MakePoint("r", 4, 2.5), MakePoint("r", 3, 1.5)}));

  std::vector<v1::MetricPoint> got;
  ASSERT_OK(store->GetMetrics("r", 0, &got));
  EXPECT_EQ(Steps(got), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(got[2].loss(), 1.5);
  EXPECT_EQ(got[3].loss(), 2.5);
  EXPECT_TRUE(MessageDifferencer::Equals(got[0], batch[0])) << got[0].DebugString();
  v1::MetricPoint last;
  ASSERT_OK(store->LastMetric("r", &last));
  EXPECT_TRUE(MessageDifferencer::Equals(last, batch[4])) << last.DebugString();
  int64_t points = 0;
  ASSERT_OK(store->Counts(nullptr, nullptr, &points));
  EXPECT_EQ(points, 6);

  // A batch with an unknown run stores nothing of the batch.
  Status s = store->AppendMetrics({MakePoint("r", 6), MakePoint("ghost", 1)});
  EXPECT_TRUE(IsNotFound(s)) << s.message();
  ASSERT_OK(store->LastMetric("r", &last));
  EXPECT_EQ(last.step(), 5);
}

TEST_P(StoreTest, MetricsDownsamplingIsExact) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));
  // Steps 0, 10, ..., 990: point i has step 10*i.
  const int n = 100;
  std::vector<v1::MetricPoint> batch;
  for (int i = n - 1; i >= 0; --i) batch.push_back(MakePoint("r", 10 * i));
  ASSERT_OK(store->AppendMetrics(batch));

  std::vector<v1::MetricPoint> got;
  ASSERT_OK(store->GetMetrics("r", 0, &got));
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i].step(), 10 * i);
  ASSERT_OK(store->GetMetrics("r", n, &got));
  EXPECT_EQ(got.size(), static_cast<size_t>(n));
  ASSERT_OK(store->GetMetrics("r", 1000, &got));
  EXPECT_EQ(got.size(), static_cast<size_t>(n));

  // m = 4 of 100: indices round(k*99/3) = 0, 33, 66, 99.
  ASSERT_OK(store->GetMetrics("r", 4, &got));
  EXPECT_EQ(Steps(got), (std::vector<int64_t>{0, 330, 660, 990}));
  // m = 2: first and last only.
  ASSERT_OK(store->GetMetrics("r", 2, &got));
  EXPECT_EQ(Steps(got), (std::vector<int64_t>{0, 990}));
  // m = 1: the last point.
  ASSERT_OK(store->GetMetrics("r", 1, &got));
  EXPECT_EQ(Steps(got), (std::vector<int64_t>{990}));
  // m = 7: round(k*99/6) = 0, 17 (16.5 rounds up), 33, 50 (49.5), 66, 83 (82.5), 99.
  ASSERT_OK(store->GetMetrics("r", 7, &got));
  EXPECT_EQ(Steps(got), (std::vector<int64_t>{0, 170, 330, 500, 660, 830, 990}));

  // Every m: exactly m points, first and last kept, ascending, and the same
  // answer twice (deterministic); the full records come back.
  for (int m = 2; m < n; ++m) {
    ASSERT_OK(store->GetMetrics("r", m, &got));
    ASSERT_EQ(got.size(), static_cast<size_t>(m)) << "m=" << m;
    EXPECT_EQ(got.front().step(), 0) << "m=" << m;
    EXPECT_EQ(got.back().step(), 10 * (n - 1)) << "m=" << m;
    for (int k = 1; k < m; ++k) {
      EXPECT_LT(got[k - 1].step(), got[k].step()) << "m=" << m;
      // Even spacing: index within half a step of the ideal k*(n-1)/(m-1).
      const double ideal = static_cast<double>(k) * (n - 1) / (m - 1);
      EXPECT_LE(std::abs(got[k].step() / 10 - ideal), 0.5) << "m=" << m << " k=" << k;
    }
    std::vector<v1::MetricPoint> again;
    ASSERT_OK(store->GetMetrics("r", m, &again));
    EXPECT_EQ(Steps(got), Steps(again));
    EXPECT_EQ(got[1].json(), "{\"step\":" + std::to_string(got[1].step()) + "}");
  }
}

TEST_P(StoreTest, DeleteMetricsAfterRollsBack) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s"), MakeRun("other", "s")}));
  std::vector<v1::MetricPoint> batch;
  for (int step = 1; step <= 10; ++step) {
    batch.push_back(MakePoint("r", step));
    batch.push_back(MakePoint("other", step));
  }
  ASSERT_OK(store->AppendMetrics(batch));
  ASSERT_OK(store->DeleteMetricsAfter("r", 6));

  std::vector<v1::MetricPoint> got;
  ASSERT_OK(store->GetMetrics("r", 0, &got));
  EXPECT_EQ(Steps(got), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  v1::MetricPoint last;
  ASSERT_OK(store->LastMetric("r", &last));
  EXPECT_EQ(last.step(), 6);
  // Other runs keep theirs.
  ASSERT_OK(store->GetMetrics("other", 0, &got));
  EXPECT_EQ(got.size(), 10u);
  // After the rollback the run re-sends steps from 7.
  ASSERT_OK(store->AppendMetrics({MakePoint("r", 7, 0.5)}));
  ASSERT_OK(store->LastMetric("r", &last));
  EXPECT_EQ(last.step(), 7);
  EXPECT_EQ(last.loss(), 0.5);
  // Rolling back before the first step empties the run.
  ASSERT_OK(store->DeleteMetricsAfter("r", 0));
  ASSERT_OK(store->GetMetrics("r", 0, &got));
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(IsNotFound(store->DeleteMetricsAfter("ghost", 0)));
}

// ---- Events ----------------------------------------------------------------------

TEST_P(StoreTest, EventFilters) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s1"), {MakeRun("a", "s1"), MakeRun("b", "s1")}));
  ASSERT_OK(store->CreateSweep(MakeSweep("s2"), {MakeRun("c", "s2")}));
  const v1::Event e1 = MakeEvent("a", 1, "e1");
  ASSERT_OK(store->AppendEvent(e1));
  ASSERT_OK(store->AppendEvent(MakeEvent("c", 2, "e2")));
  ASSERT_OK(store->AppendEvent(MakeEvent("b", 3, "e3")));
  ASSERT_OK(store->AppendEvent(MakeEvent("a", 4, "e4")));
  ASSERT_OK(store->AppendEvent(MakeEvent("", 5, "e5")));  // keeld-level

  std::vector<v1::Event> got;
  ASSERT_OK(store->ListEvents("", "", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"e1", "e2", "e3", "e4", "e5"}));
  EXPECT_TRUE(MessageDifferencer::Equals(got[0], e1)) << got[0].DebugString();
  ASSERT_OK(store->ListEvents("a", "", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"e1", "e4"}));
  ASSERT_OK(store->ListEvents("", "s1", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"e1", "e3", "e4"}));
  ASSERT_OK(store->ListEvents("", "s2", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"e2"}));
  ASSERT_OK(store->ListEvents("b", "s1", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"e3"}));
  ASSERT_OK(store->ListEvents("b", "s2", &got));
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(IsNotFound(store->ListEvents("ghost", "", &got)));
  EXPECT_TRUE(IsNotFound(store->ListEvents("", "ghost", &got)));
}

// A worker re-sends what keeld did not acknowledge, possibly to a standby
// that took over: an event whose key is stored is skipped, in a batch or
// alone, and events without a key (keeld's own) are never merged.
TEST_P(StoreTest, KeyedEventsAreStoredOnceAndUnkeyedOnesAlways) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s1"), {MakeRun("a", "s1")}));
  v1::Event first = MakeEvent("a", 1, "e1");
  first.set_key("worker-1#7");
  v1::Event second = MakeEvent("a", 2, "e2");
  second.set_key("worker-1#8");
  ASSERT_OK(store->AppendEvent(first));
  ASSERT_OK(store->AppendEvents({first, second, second}));  // a re-send, and a repeat within the batch
  ASSERT_OK(store->AppendEvent(MakeEvent("a", 3, "mine")));
  ASSERT_OK(store->AppendEvent(MakeEvent("a", 3, "mine")));
  ASSERT_OK(store->AppendEvent(second));
  std::vector<v1::Event> got;
  ASSERT_OK(store->ListEvents("a", "", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"e1", "e2", "mine", "mine"}));
  EXPECT_EQ(got[0].key(), "worker-1#7");
  // A keyed event for a missing run is still an error.
  v1::Event ghost = MakeEvent("ghost", 4, "g");
  ghost.set_key("worker-1#9");
  EXPECT_TRUE(IsNotFound(store->AppendEvent(ghost)));
}

// ---- Paging ------------------------------------------------------------------------

TEST_P(StoreTest, EventPagesReturnEveryEventOnceInOrderWhileEventsArrive) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s1"), {MakeRun("a", "s1"), MakeRun("b", "s1")}));
  ASSERT_OK(store->CreateSweep(MakeSweep("s2"), {MakeRun("c", "s2")}));
  std::vector<std::string> expected_s1, expected_a;
  for (int i = 0; i < 20; ++i) {
    const std::string run = i % 3 == 0 ? "a" : i % 3 == 1 ? "b" : "c";
    ASSERT_OK(store->AppendEvent(MakeEvent(run, i, "e" + std::to_string(i))));
    if (run != "c") expected_s1.push_back("e" + std::to_string(i));
    if (run == "a") expected_a.push_back("e" + std::to_string(i));
  }
  // Filter by sweep, pages of 4, one event of each sweep appended between pages:
  // the new s1 events come after everything read so far, none twice.
  std::vector<std::string> got;
  PageRequest page;
  page.max_items = 4;
  for (int n = 20;; ++n) {
    std::vector<v1::Event> events;
    PageResult result;
    ASSERT_OK(store->ListEventsPage("", "s1", page, &events, &result));
    EXPECT_LE(events.size(), 4u);
    for (const v1::Event& e : events) got.push_back(e.kind());
    if (!result.more) break;
    page.after = result.last;
    if (n < 26) {
      ASSERT_OK(store->AppendEvents({MakeEvent("b", n, "e" + std::to_string(n)), MakeEvent("c", n, "x")}));
      expected_s1.push_back("e" + std::to_string(n));
    }
  }
  EXPECT_EQ(got, expected_s1);
  // By run, with a byte budget smaller than one event: one event a page.
  got.clear();
  page = PageRequest();
  page.max_bytes = 1;
  int pages = 0;
  for (;; ++pages) {
    std::vector<v1::Event> events;
    PageResult result;
    ASSERT_OK(store->ListEventsPage("a", "", page, &events, &result));
    ASSERT_EQ(events.size(), 1u);
    got.push_back(events[0].kind());
    if (!result.more) break;
    page.after = result.last;
  }
  EXPECT_EQ(got, expected_a);
  EXPECT_EQ(pages + 1, static_cast<int>(expected_a.size()));
  std::vector<v1::Event> events;
  PageResult result;
  EXPECT_TRUE(IsNotFound(store->ListEventsPage("ghost", "", PageRequest(), &events, &result)));
}

TEST_P(StoreTest, AppendEventsIsAllOrNothing) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));
  Status s = store->AppendEvents({MakeEvent("r", 1, "kept?"), MakeEvent("ghost", 2, "bad")});
  EXPECT_TRUE(IsNotFound(s)) << s.message();
  std::vector<v1::Event> got;
  ASSERT_OK(store->ListEvents("", "", &got));
  EXPECT_TRUE(got.empty());
  ASSERT_OK(store->AppendEvents({MakeEvent("r", 1, "one"), MakeEvent("r", 2, "two")}));
  ASSERT_OK(store->ListEvents("r", "s", &got));
  EXPECT_EQ(EventKinds(got), (std::vector<std::string>{"one", "two"}));
}

TEST_P(StoreTest, MetricPagesReturnEveryPointOnceInStepOrderWhilePointsArrive) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s"), MakeRun("other", "s")}));
  std::vector<v1::MetricPoint> points;
  std::vector<int64_t> expected;
  for (int64_t step = 0; step < 30; ++step) {
    points.push_back(MakePoint("r", step * 10));
    expected.push_back(step * 10);
  }
  ASSERT_OK(store->AppendMetrics(points));
  ASSERT_OK(store->AppendMetrics({MakePoint("other", 5)}));
  std::vector<int64_t> got;
  PageRequest page;
  page.max_items = 7;
  for (int64_t next = 300;; next += 10) {
    std::vector<v1::MetricPoint> part;
    PageResult result;
    ASSERT_OK(store->GetMetricsPage("r", 0, false, page, &part, &result));
    EXPECT_LE(part.size(), 7u);
    for (const v1::MetricPoint& p : part) got.push_back(p.step());
    if (!result.more) break;
    page.after = result.last;
    if (next < 340) {  // the run goes on training between pages
      ASSERT_OK(store->AppendMetrics({MakePoint("r", next)}));
      expected.push_back(next);
    }
  }
  EXPECT_EQ(got, expected);

  // Downsampled pages are GetMetrics' downsampled list, cut into pages.
  std::vector<v1::MetricPoint> whole;
  ASSERT_OK(store->GetMetrics("r", 9, &whole));
  got.clear();
  page = PageRequest();
  page.max_items = 2;
  for (;;) {
    std::vector<v1::MetricPoint> part;
    PageResult result;
    ASSERT_OK(store->GetMetricsPage("r", 9, false, page, &part, &result));
    for (const v1::MetricPoint& p : part) got.push_back(p.step());
    if (!result.more) break;
    page.after = result.last;
  }
  EXPECT_EQ(got, Steps(whole));
  // A byte budget below one point still makes progress: one point a page.
  page = PageRequest();
  page.max_bytes = 1;
  std::vector<v1::MetricPoint> part;
  PageResult result;
  ASSERT_OK(store->GetMetricsPage("r", 0, false, page, &part, &result));
  EXPECT_EQ(Steps(part), (std::vector<int64_t>{0}));
  EXPECT_TRUE(result.more);
  EXPECT_TRUE(IsNotFound(store->GetMetricsPage("ghost", 0, false, PageRequest(), &part, &result)));
  // omit_json: the same points without their lines, all in one page here.
  ASSERT_OK(store->GetMetricsPage("r", 0, true, PageRequest(), &part, &result));
  EXPECT_EQ(Steps(part), expected);
  EXPECT_FALSE(result.more);
  for (const v1::MetricPoint& p : part) EXPECT_TRUE(p.json().empty()) << p.step();
  std::vector<v1::MetricPoint> with_json;
  ASSERT_OK(store->GetMetrics("r", 0, &with_json));
  ASSERT_EQ(with_json.size(), part.size());
  EXPECT_FALSE(with_json[0].json().empty());  // the stored points keep them

}

// ---- Durability ---------------------------------------------------------------------

// Writes one of everything; CheckAll verifies it.
void WriteAll(Store* store) {
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r1", "s"), MakeRun("r2", "s")}));
  v1::Run r1 = MakeRun("r1", "s");
  r1.set_state(v1::SUCCEEDED);
  ASSERT_OK(store->UpdateRun(r1));
  ASSERT_OK(store->AppendMetrics({MakePoint("r1", 1), MakePoint("r1", 2)}));
  ASSERT_OK(store->AppendEvent(MakeEvent("r1", 2, "state")));
  v1::Worker w;
  w.set_id("w");
  w.set_host("h");
  ASSERT_OK(store->UpsertWorker(w));
}

void CheckAll(Store* store) {
  v1::Sweep sweep;
  ASSERT_OK(store->GetSweep("s", &sweep));
  EXPECT_TRUE(MessageDifferencer::Equals(sweep, MakeSweep("s")));
  std::vector<v1::Run> runs;
  ASSERT_OK(store->ListRuns("s", &runs));
  EXPECT_EQ(RunIds(runs), (std::vector<std::string>{"r1", "r2"}));
  v1::Run r1;
  ASSERT_OK(store->GetRun("r1", &r1));
  EXPECT_EQ(r1.state(), v1::SUCCEEDED);
  std::vector<v1::MetricPoint> points;
  ASSERT_OK(store->GetMetrics("r1", 0, &points));
  EXPECT_EQ(Steps(points), (std::vector<int64_t>{1, 2}));
  std::vector<v1::Event> events;
  ASSERT_OK(store->ListEvents("r1", "", &events));
  EXPECT_EQ(EventKinds(events), (std::vector<std::string>{"state"}));
  v1::Worker w;
  ASSERT_OK(store->GetWorker("w", &w));
  EXPECT_EQ(w.host(), "h");
}

TEST_P(StoreTest, ReopenAfterCloseKeepsEverything) {
  const std::string path = Location();
  {
    auto store = Open(path);
    ASSERT_TRUE(store);
    WriteAll(store.get());
  }
  auto store = Open(path);
  ASSERT_TRUE(store);
  CheckAll(store.get());
}

TEST_P(StoreTest, ChildExitingWithoutCloseLosesNothing) {
  const std::string path = Location();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: writes, then ends without destroying the Store or running
    // any destructor (the store's connection is never closed).
    std::unique_ptr<Store> store;
    if (!OpenAt(path, &store).ok()) _exit(2);
    WriteAll(store.get());
    if (::testing::Test::HasFailure()) _exit(3);
    store.release();  // leak on purpose: no sqlite3_close, no checkpoint
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // The WAL was never checkpointed into the main file: recovery reads it.
  auto store = Open(path);
  ASSERT_TRUE(store);
  CheckAll(store.get());
}

TEST_P(StoreTest, KillNineKeepsEveryAcknowledgedWrite) {
  const std::string path = Location();
  {
    auto store = Open(path);
    ASSERT_TRUE(store);
    ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));
  }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child appends steps forever and reports each step once AppendMetrics
    // returned OK (acknowledged).
    close(fds[0]);
    std::unique_ptr<Store> store;
    if (!OpenAt(path, &store).ok()) _exit(2);
    for (int64_t step = 1;; ++step) {
      if (!store->AppendMetrics({MakePoint("r", step)}).ok()) _exit(3);
      if (write(fds[1], &step, sizeof(step)) != sizeof(step)) _exit(4);
    }
  }
  close(fds[1]);
  int64_t acked = 0, step = 0;
  while (acked < 50 && read(fds[0], &step, sizeof(step)) == sizeof(step)) acked = step;
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  // Drain what the child acknowledged before it died.
  while (read(fds[0], &step, sizeof(step)) == sizeof(step)) acked = step;
  close(fds[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  ASSERT_GE(acked, 50);

  auto store = Open(path);
  ASSERT_TRUE(store);
  v1::MetricPoint last;
  ASSERT_OK(store->LastMetric("r", &last));
  // Every acknowledged step is there (one more may have committed unreported).
  EXPECT_GE(last.step(), acked);
  EXPECT_LE(last.step(), acked + 1);
  std::vector<v1::MetricPoint> points;
  ASSERT_OK(store->GetMetrics("r", 0, &points));
  ASSERT_EQ(points.size(), static_cast<size_t>(last.step()));
  for (size_t i = 0; i < points.size(); ++i) EXPECT_EQ(points[i].step(), int64_t(i) + 1);
}

// ---- Schema ------------------------------------------------------------------------

// The hex of bytes, for an SQL blob literal.
std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  return hex;
}

std::string HexOf(const google::protobuf::Message& m) { return Hex(m.SerializeAsString()); }

// Version 1 as the previous release wrote it (store_sqlite.cc's kSchemaV1
// before version 2), copied here so that a change to the code cannot change
// the fixture: metric points as records only, without the number columns.
const char kSqliteSchemaV1[] =
    "CREATE TABLE schema_version (version INTEGER NOT NULL);"
    "CREATE TABLE sweeps (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " state INTEGER NOT NULL, created_unix_ms INTEGER NOT NULL, proto BLOB NOT NULL);"
    "CREATE TABLE runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " sweep_id TEXT NOT NULL REFERENCES sweeps(id), state INTEGER NOT NULL, proto BLOB NOT NULL);"
    "CREATE INDEX runs_by_sweep ON runs(sweep_id, seq);"
    "CREATE INDEX runs_by_state ON runs(state, seq);"
    "CREATE TABLE metrics (run_id TEXT NOT NULL REFERENCES runs(id), step INTEGER NOT NULL,"
    " proto BLOB NOT NULL, PRIMARY KEY (run_id, step)) WITHOUT ROWID;"
    "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id),"
    " sweep_id TEXT REFERENCES sweeps(id), proto BLOB NOT NULL);"
    "CREATE INDEX events_by_run ON events(run_id, seq);"
    "CREATE INDEX events_by_sweep ON events(sweep_id, seq);"
    "CREATE TABLE workers (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, proto BLOB NOT NULL);"
    "INSERT INTO schema_version(version) VALUES(1);"
    "PRAGMA journal_mode = WAL;";

// PostgreSQL's version 1 (store_postgres.cc's kSchemaV1, the same tables), as
// a keeld of schema version 1 would have written it.
const char kPostgresSchemaV1[] =
    "CREATE TABLE schema_version (version BIGINT NOT NULL);"
    "CREATE TABLE sweeps (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
    " state BIGINT NOT NULL, created_unix_ms BIGINT NOT NULL, proto BYTEA NOT NULL);"
    "CREATE TABLE runs (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
    " sweep_id TEXT NOT NULL REFERENCES sweeps(id), state BIGINT NOT NULL, proto BYTEA NOT NULL);"
    "CREATE INDEX runs_by_sweep ON runs(sweep_id, seq);"
    "CREATE INDEX runs_by_state ON runs(state, seq);"
    "CREATE TABLE metrics (run_id TEXT NOT NULL REFERENCES runs(id), step BIGINT NOT NULL,"
    " proto BYTEA NOT NULL, PRIMARY KEY (run_id, step));"
    "CREATE TABLE events (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id TEXT REFERENCES runs(id),"
    " sweep_id TEXT REFERENCES sweeps(id), proto BYTEA NOT NULL);"
    "CREATE INDEX events_by_run ON events(run_id, seq);"
    "CREATE INDEX events_by_sweep ON events(sweep_id, seq);"
    "CREATE TABLE workers (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
    " proto BYTEA NOT NULL);"
    "INSERT INTO schema_version(version) VALUES(1);";

std::string BlobLiteral(bool postgres, const std::string& hex) {
  return postgres ? "decode('" + hex + "', 'hex')" : "X'" + hex + "'";
}

// Whether table metrics has a column `name`.
std::string MetricsHasColumnQuery(bool postgres, const std::string& name) {
  return postgres ? "SELECT COUNT(*) FROM information_schema.columns WHERE table_name = 'metrics' AND column_name = '" +
                        name + "'"
                  : "SELECT COUNT(*) FROM pragma_table_info('metrics') WHERE name = '" + name + "'";
}

TEST_P(StoreTest, CreatesTheCurrentSchemaWithOneVersionRow) {
  const std::string path = Location();
  {
    auto store = Open(path);
    ASSERT_TRUE(store);
  }
  EXPECT_EQ(RawQueryText(path, "SELECT version FROM schema_version"), std::to_string(kStoreSchemaVersion));
  EXPECT_EQ(RawQueryText(path, MetricsHasColumnQuery(postgres(), "grad_norm")), "1");
  // Reopening an existing store keeps its schema and one version row.
  auto store = Open(path);
  ASSERT_TRUE(store);
  EXPECT_EQ(RawQueryText(path, "SELECT COUNT(*) FROM schema_version"), "1");
  EXPECT_EQ(RawQueryText(path, "SELECT version FROM schema_version"), std::to_string(kStoreSchemaVersion));
}

TEST_P(StoreTest, RefusesNewerSchemaVersion) {
  const std::string path = Location();
  {
    auto store = Open(path);
    ASSERT_TRUE(store);
    ASSERT_OK(store->CreateSweep(MakeSweep("s"), {}));
  }
  RawExec(path, "UPDATE schema_version SET version = 999");
  std::unique_ptr<Store> store;
  Status s = OpenAt(path, &store);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(store);
  // Both versions are named.
  EXPECT_NE(s.message().find("schema version 999 is newer than version " + std::to_string(kStoreSchemaVersion)),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("left unchanged"), std::string::npos) << s.message();
  // The store is unchanged: data and version as they were.
  EXPECT_EQ(RawQueryText(path, "SELECT version FROM schema_version"), "999");
  EXPECT_EQ(RawQueryText(path, "SELECT id FROM sweeps"), "s");
  // Back at the supported version it opens again.
  RawExec(path, "UPDATE schema_version SET version = " + std::to_string(kStoreSchemaVersion));
  ASSERT_OK(OpenAt(path, &store));
  v1::Sweep sweep;
  ASSERT_OK(store->GetSweep("s", &sweep));
}

TEST_P(StoreTest, UpgradesAVersionOneStoreInPlace) {
  // A store as the previous release (schema version 1) wrote it.
  const std::string path = Location();
  RawExec(path, postgres() ? kPostgresSchemaV1 : kSqliteSchemaV1);
  const v1::Sweep sweep = MakeSweep("s");
  const v1::Run run = MakeRun("r", "s");
  RawExec(path, "INSERT INTO sweeps(id, state, created_unix_ms, proto) VALUES('s', 1, 0, " +
                    BlobLiteral(postgres(), HexOf(sweep)) + ")");
  RawExec(path, "INSERT INTO runs(id, sweep_id, state, proto) VALUES('r', 's', 1, " +
                    BlobLiteral(postgres(), HexOf(run)) + ")");
  std::vector<v1::MetricPoint> points;
  for (int step = 1; step <= 3; ++step) {
    points.push_back(MakePoint("r", step, 0.5 * step));
    points.back().set_lr(1e-3 * step);
    points.back().set_tokens_per_s(100.0 * step);
    points.back().set_grad_norm(0.25 * step);
    RawExec(path, "INSERT INTO metrics(run_id, step, proto) VALUES('r', " + std::to_string(step) + ", " +
                      BlobLiteral(postgres(), HexOf(points.back())) + ")");
  }
  RawExec(path, "INSERT INTO events(run_id, sweep_id, proto) VALUES('r', 's', " +
                    BlobLiteral(postgres(), HexOf(MakeEvent("r", 2, "old"))) + ")");
  EXPECT_EQ(RawQueryText(path, MetricsHasColumnQuery(postgres(), "loss")), "0");

  auto store = Open(path);
  ASSERT_TRUE(store);
  EXPECT_EQ(RawQueryText(path, "SELECT version FROM schema_version"), std::to_string(kStoreSchemaVersion));
  EXPECT_EQ(RawQueryText(path, "SELECT COUNT(*) FROM schema_version"), "1");
  // The old points read back whole, and their numbers come from the new columns.
  std::vector<v1::MetricPoint> whole;
  ASSERT_OK(store->GetMetrics("r", 0, &whole));
  ASSERT_EQ(whole.size(), 3u);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(MessageDifferencer::Equals(whole[i], points[i]));
  std::vector<v1::MetricPoint> numbers;
  PageResult result;
  ASSERT_OK(store->GetMetricsPage("r", 0, /*omit_json=*/true, PageRequest(), &numbers, &result));
  ASSERT_EQ(numbers.size(), 3u);
  for (size_t i = 0; i < numbers.size(); ++i) {
    v1::MetricPoint want = points[i];
    want.clear_json();
    EXPECT_TRUE(MessageDifferencer::Equals(numbers[i], want)) << numbers[i].DebugString();
  }
  EXPECT_EQ(RawQueryText(path, "SELECT grad_norm FROM metrics WHERE step = 2"), "0.5");
  // New points get their columns too, and the sweep, run and event are still there.
  ASSERT_OK(store->AppendMetrics({MakePoint("r", 4, 9.0)}));
  EXPECT_EQ(RawQueryText(path, "SELECT CAST(loss AS INTEGER) FROM metrics WHERE step = 4"), "9");
  v1::Run read;
  ASSERT_OK(store->GetRun("r", &read));
  EXPECT_TRUE(MessageDifferencer::Equals(read, run));
  v1::Sweep read_sweep;
  ASSERT_OK(store->GetSweep("s", &read_sweep));
  EXPECT_TRUE(MessageDifferencer::Equals(read_sweep, sweep));
  std::vector<v1::Event> events;
  ASSERT_OK(store->ListEvents("", "s", &events));
  EXPECT_EQ(EventKinds(events), (std::vector<std::string>{"old"}));
  // New rows continue the old ones' order.
  ASSERT_OK(store->CreateSweep(MakeSweep("s2"), {MakeRun("r2", "s2")}));
  std::vector<v1::Run> runs;
  ASSERT_OK(store->ListRuns("", &runs));
  EXPECT_EQ(RunIds(runs), (std::vector<std::string>{"r", "r2"}));
  // The upgraded store keeps artifacts (version 4).
  int64_t id = 0;
  ASSERT_OK(store->BeginArtifact("r", 10, "m", &id));
  ASSERT_OK(store->AppendArtifactChunk(id, 0, 0, "bytes"));
  ASSERT_OK(store->CommitArtifact(id));
  std::vector<Store::StoredArtifact> listed;
  ASSERT_OK(store->ListArtifacts("r", &listed));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 10);
}

// Uploaded checkpoints as rows (keeld --artifact-store db): an upload is
// listed by nobody until committed; a commit replaces the step's checkpoint in
// one transaction; chunks read back at the offsets they were stored at; a
// deleted artifact takes its chunks along; uploads that were cut off go at
// DeleteUncommittedArtifacts; everything survives a reopen.
TEST_P(StoreTest, ArtifactsAreListedOnlyOnceCommittedAndReplaceTheirStep) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  const std::string big(1 << 20, 'x');  // a full transfer chunk
  int64_t first = 0, second = 0, cut = 0;
  ASSERT_OK(store->BeginArtifact("r1", 100, "manifest A", &first));
  ASSERT_OK(store->AppendArtifactChunk(first, 0, 0, big));
  ASSERT_OK(store->AppendArtifactChunk(first, 0, 1 << 20, std::string("\0\1\2\377", 4)));
  ASSERT_OK(store->AppendArtifactChunk(first, 1, 0, "opt"));
  std::vector<Store::StoredArtifact> listed;
  ASSERT_OK(store->ListArtifacts("r1", &listed));
  EXPECT_TRUE(listed.empty());
  ASSERT_OK(store->CommitArtifact(first));
  EXPECT_TRUE(IsNotFound(store->CommitArtifact(first)));  // not an upload any more
  EXPECT_TRUE(IsNotFound(store->AppendArtifactChunk(first, 1, 3, "late")));
  ASSERT_OK(store->ListArtifacts("r1", &listed));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, first);
  EXPECT_EQ(listed[0].step, 100);
  EXPECT_EQ(listed[0].manifest, "manifest A");
  std::string data;
  ASSERT_OK(store->ReadArtifactChunk(first, 0, 0, &data));
  EXPECT_EQ(data, big);
  ASSERT_OK(store->ReadArtifactChunk(first, 0, 1 << 20, &data));
  EXPECT_EQ(data, std::string("\0\1\2\377", 4));  // bytes, not text
  Status s = store->ReadArtifactChunk(first, 0, 7, &data);
  EXPECT_TRUE(IsNotFound(s)) << s.message();
  EXPECT_NE(s.message().find("chunk of artifact " + std::to_string(first) + " file 0 at byte '7' not found"),
            std::string::npos)
      << s.message();

  // A second checkpoint of step 100 replaces the first at its commit, not before.
  ASSERT_OK(store->BeginArtifact("r1", 100, "manifest B", &second));
  ASSERT_OK(store->AppendArtifactChunk(second, 0, 0, "new"));
  ASSERT_OK(store->ListArtifacts("r1", &listed));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].manifest, "manifest A");
  ASSERT_OK(store->CommitArtifact(second));
  ASSERT_OK(store->ListArtifacts("r1", &listed));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, second);
  EXPECT_EQ(listed[0].manifest, "manifest B");
  EXPECT_TRUE(IsNotFound(store->ReadArtifactChunk(first, 0, 0, &data)));
  EXPECT_EQ(RawQueryText(Location(), "SELECT COUNT(*) FROM artifact_chunks"), "1");

  // Steps list in order, per run; an upload cut off is deleted with its chunks.
  int64_t id = 0;
  ASSERT_OK(store->BeginArtifact("r1", 50, "manifest 50", &id));
  ASSERT_OK(store->CommitArtifact(id));
  ASSERT_OK(store->BeginArtifact("r2", 10, "other run", &id));
  ASSERT_OK(store->CommitArtifact(id));
  ASSERT_OK(store->BeginArtifact("r1", 200, "cut off", &cut));
  ASSERT_OK(store->AppendArtifactChunk(cut, 0, 0, "part"));
  store.reset();
  store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->ListArtifacts("r1", &listed));
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].step, 50);
  EXPECT_EQ(listed[1].step, 100);
  ASSERT_OK(store->ReadArtifactChunk(second, 0, 0, &data));
  EXPECT_EQ(data, "new");
  EXPECT_EQ(RawQueryText(Location(), "SELECT COUNT(*) FROM artifacts"), "4");
  ASSERT_OK(store->DeleteUncommittedArtifacts());
  EXPECT_EQ(RawQueryText(Location(), "SELECT COUNT(*) FROM artifacts"), "3");
  EXPECT_TRUE(IsNotFound(store->ReadArtifactChunk(cut, 0, 0, &data)));
  ASSERT_OK(store->DeleteArtifact(second));
  ASSERT_OK(store->DeleteArtifact(second));  // gone already: fine
  ASSERT_OK(store->ListArtifacts("r1", &listed));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 50);
  EXPECT_EQ(RawQueryText(Location(), "SELECT COUNT(*) FROM artifact_chunks"), "0");
  ASSERT_OK(store->ListArtifacts("r2", &listed));
  EXPECT_EQ(listed.size(), 1u);
}

TEST_P(StoreTest, AFailedUpgradeLeavesTheVersionOneStoreAsItWas) {
  // A version 1 store with a corrupt metric record: the upgrade, which reads
  // every record for the new columns, fails half way.
  const std::string path = Location();
  RawExec(path, postgres() ? kPostgresSchemaV1 : kSqliteSchemaV1);
  RawExec(path, "INSERT INTO sweeps(id, state, created_unix_ms, proto) VALUES('s', 1, 0, " +
                    BlobLiteral(postgres(), HexOf(MakeSweep("s"))) + ")");
  RawExec(path, "INSERT INTO runs(id, sweep_id, state, proto) VALUES('r', 's', 1, " +
                    BlobLiteral(postgres(), HexOf(MakeRun("r", "s"))) + ")");
  RawExec(path, "INSERT INTO metrics(run_id, step, proto) VALUES('r', 1, " +
                    BlobLiteral(postgres(), HexOf(MakePoint("r", 1))) + ")");
  // 0xff: a tag whose varint never ends.
  RawExec(path, "INSERT INTO metrics(run_id, step, proto) VALUES('r', 2, " + BlobLiteral(postgres(), "ff") + ")");

  std::unique_ptr<Store> store;
  Status s = OpenAt(path, &store);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(store);
  EXPECT_NE(s.message().find("corrupt"), std::string::npos) << s.message();
  // Nothing of the upgrade stayed: version 1, no new columns, the points as they were.
  EXPECT_EQ(RawQueryText(path, "SELECT version FROM schema_version"), "1");
  EXPECT_EQ(RawQueryText(path, MetricsHasColumnQuery(postgres(), "loss")), "0");
  EXPECT_EQ(RawQueryText(path, "SELECT COUNT(*) FROM metrics"), "2");
  // Without the corrupt record the upgrade goes through.
  RawExec(path, "DELETE FROM metrics WHERE step = 2");
  ASSERT_OK(OpenAt(path, &store));
  EXPECT_EQ(RawQueryText(path, "SELECT version FROM schema_version"), std::to_string(kStoreSchemaVersion));
  v1::MetricPoint last;
  ASSERT_OK(store->LastMetric("r", &last));
  EXPECT_TRUE(MessageDifferencer::Equals(last, MakePoint("r", 1)));
}

TEST_P(StoreTest, NonFiniteNumbersRoundTripWithAndWithoutJson) {
  // A diverged run reports NaN and infinite values; SQLite stores a NaN as NULL.
  auto store = Open(Location());
  ASSERT_TRUE(store);
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));
  v1::MetricPoint p = MakePoint("r", 1);
  p.set_loss(std::nan(""));
  p.set_grad_norm(std::numeric_limits<double>::infinity());
  p.set_lr(-std::numeric_limits<double>::infinity());
  ASSERT_OK(store->AppendMetrics({p}));
  for (bool omit_json : {false, true}) {
    std::vector<v1::MetricPoint> out;
    PageResult result;
    ASSERT_OK(store->GetMetricsPage("r", 0, omit_json, PageRequest(), &out, &result));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(std::isnan(out[0].loss())) << omit_json;
    EXPECT_EQ(out[0].grad_norm(), std::numeric_limits<double>::infinity()) << omit_json;
    EXPECT_EQ(out[0].lr(), -std::numeric_limits<double>::infinity()) << omit_json;
    EXPECT_EQ(out[0].tokens_per_s(), p.tokens_per_s());
  }
}

// ---- Concurrency ----------------------------------------------------------------------

TEST_P(StoreTest, ConcurrentWritersLoseNothing) {
  auto store = Open(Location());
  ASSERT_TRUE(store);
  constexpr int kThreads = 6;
  constexpr int kRounds = 40;
  std::vector<v1::Run> runs;
  for (int t = 0; t < kThreads; ++t) runs.push_back(MakeRun("r" + std::to_string(t), "s"));
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), runs));

  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string id = "r" + std::to_string(t);
      for (int i = 1; i <= kRounds && errors[t].empty(); ++i) {
        Status s = store->AppendMetrics({MakePoint(id, 2 * i - 1), MakePoint(id, 2 * i)});
        if (s.ok()) s = store->AppendEvent(MakeEvent(id, i, "tick"));
        v1::Run run = MakeRun(id, "s");
        run.set_step(2 * i);
        if (s.ok()) s = store->UpdateRun(run);
        v1::Worker w;
        w.set_id("w" + std::to_string(t));
        w.set_cpu_slots(i);
        if (s.ok()) s = store->UpsertWorker(w);
        if (s.ok()) {  // a reader in the middle of the writers
          std::vector<v1::Event> events;
          s = store->ListEvents(id, "", &events);
          if (s.ok() && events.size() != static_cast<size_t>(i)) {
            s = Status::Error("read " + std::to_string(events.size()) + " events, want " +
                              std::to_string(i));
          }
        }
        if (!s.ok()) errors[t] = s.message();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;

  int64_t points = 0;
  ASSERT_OK(store->Counts(nullptr, nullptr, &points));
  EXPECT_EQ(points, int64_t{kThreads} * kRounds * 2);
  std::vector<v1::Event> events;
  ASSERT_OK(store->ListEvents("", "s", &events));
  EXPECT_EQ(events.size(), static_cast<size_t>(kThreads * kRounds));
  for (int t = 0; t < kThreads; ++t) {
    const std::string id = "r" + std::to_string(t);
    v1::Run run;
    ASSERT_OK(store->GetRun(id, &run));
    EXPECT_EQ(run.step(), 2 * kRounds);
    std::vector<v1::MetricPoint> got;
    ASSERT_OK(store->GetMetrics(id, 0, &got));
    EXPECT_EQ(got.size(), static_cast<size_t>(2 * kRounds));
    v1::Worker w;
    ASSERT_OK(store->GetWorker("w" + std::to_string(t), &w));
    EXPECT_EQ(w.cpu_slots(), kRounds);
  }
}

// ---- SQLite only -------------------------------------------------------------------

TEST(SqliteStoreTest, UsesWalMode) {
  const std::string path = TestDbPath();
  {
    std::unique_ptr<Store> store;
    ASSERT_OK(OpenSqliteStore(path, &store));
  }
  EXPECT_EQ(SqliteQueryText(path, "PRAGMA journal_mode"), "wal");
}

TEST(SqliteStoreTest, RefusesUnusablePath) {
  std::unique_ptr<Store> store;
  EXPECT_FALSE(OpenSqliteStore("", &store).ok());
  Status s = OpenSqliteStore("/nonexistent-dir-for-keel/x.db", &store);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir-for-keel/x.db"), std::string::npos) << s.message();
  EXPECT_FALSE(store);
}

// ---- PostgreSQL only ----------------------------------------------------------------

TEST(PostgresStoreTest, ASecondStoreOnTheSameDatabaseIsRefusedUntilTheFirstCloses) {
  std::string url;
  ASSERT_OK(PostgresEnvironment::NewDatabase(&url));
  std::unique_ptr<Store> first;
  ASSERT_OK(OpenPostgresStore(url, &first));
  std::unique_ptr<Store> second;
  Status s = OpenPostgresStore(url, &second, /*lock_wait_ms=*/300);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(second);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.message();
  EXPECT_NE(s.message().find("in use by another keeld"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(url), std::string::npos) << s.message();
  first.reset();
  ASSERT_OK(OpenPostgresStore(url, &second));
}

// A standby keeld: waits for the lock as long as it takes, is told who holds
// it (the holder's application_name), and opens once the holder closes.
TEST(PostgresStoreTest, AStandbyWaitsForTheLockAndTakesItWhenTheHolderCloses) {
  std::string url;
  ASSERT_OK(PostgresEnvironment::NewDatabase(&url));
  PostgresStoreOptions active_options;
  active_options.application_name = "keeld 127.0.0.1:1 (pid 1)";
  std::unique_ptr<Store> active;
  ASSERT_OK(OpenPostgresStore(url, active_options, &active));
  ASSERT_OK(active->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));

  std::atomic<bool> stop{false};
  std::atomic<bool> opened{false};
  std::mutex mu;
  std::string holder;
  int waits = 0;
  PostgresStoreOptions standby_options;
  standby_options.lock_wait_ms = -1;
  standby_options.stop = &stop;
  standby_options.on_waiting = [&](const std::string& h) {
    std::lock_guard<std::mutex> lock(mu);
    holder = h;
    ++waits;
  };
  std::unique_ptr<Store> standby;
  Status standby_status;
  std::thread waiter([&] {
    standby_status = OpenPostgresStore(url, standby_options, &standby);
    opened = true;
  });
  // Longer than the default lock_wait_ms would be is not needed: 1.5 s of
  // waiting already shows it neither gives up nor gets the lock.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(opened.load());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(holder, "keeld 127.0.0.1:1 (pid 1)");
    EXPECT_EQ(waits, 1);
  }
  const auto released = std::chrono::steady_clock::now();
  active.reset();
  waiter.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - released).count();
  ASSERT_OK(standby_status);
  EXPECT_LT(took, 2.0);  // polled every 100 ms
  v1::Run run;
  ASSERT_OK(standby->GetRun("r", &run));
  EXPECT_EQ(PgQueryText(url, "SELECT epoch FROM keeld_epoch"), "2");  // two keelds took the lock

  // A standby asked to stop while waiting gives up with an error.
  std::unique_ptr<Store> third;
  stop = true;
  Status s = OpenPostgresStore(url, standby_options, &third);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(third);
  EXPECT_NE(s.message().find("stopped while waiting"), std::string::npos) << s.message();
}

// The fencing rule: a Store whose session died while another Store took the
// lock never writes again, whether the other still holds the lock or has let
// it go (keeld_epoch moved on); on_fenced is called once.
TEST(PostgresStoreTest, AStoreWhoseSessionDiedWhileAnotherTookTheLockIsFenced) {
  for (const bool other_still_holds : {true, false}) {
    SCOPED_TRACE(other_still_holds ? "the other still holds the lock" : "the other let it go");
    std::string url;
    ASSERT_OK(PostgresEnvironment::NewDatabase(&url));
    int fenced_calls = 0;
    PostgresStoreOptions options;
    options.lock_wait_ms = 300;
    options.application_name = "keeld A";
    options.on_fenced = [&](const Status&) { ++fenced_calls; };
    std::unique_ptr<Store> a;
    ASSERT_OK(OpenPostgresStore(url, options, &a));
    ASSERT_OK(a->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));
    ASSERT_OK(a->AppendMetrics({MakePoint("r", 1)}));
    // A's session dies (a network cut, an administrator), and B takes over.
    EXPECT_EQ(PgQueryText(url, "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = 'keeld A'"),
              "1");
    std::unique_ptr<Store> b;
    ASSERT_OK(OpenPostgresStore(url, &b, /*lock_wait_ms=*/5000));
    ASSERT_OK(b->AppendMetrics({MakePoint("r", 2)}));
    if (!other_still_holds) b.reset();
    // A's next write finds its session gone and may not reconnect.
    Status s = a->AppendMetrics({MakePoint("r", 3)});
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.message();
    EXPECT_NE(s.message().find("fenced"), std::string::npos) << s.message();
    EXPECT_EQ(fenced_calls, 1);
    // Fenced for good: reads, writes and the ownership check all fail, and on_fenced is not called again.
    EXPECT_FALSE(a->CheckOwnership().ok());
    v1::Run run;
    EXPECT_FALSE(a->GetRun("r", &run).ok());
    EXPECT_FALSE(a->AppendMetrics({MakePoint("r", 4)}).ok());
    EXPECT_EQ(fenced_calls, 1);
    // Only B's point was stored after the takeover.
    EXPECT_EQ(PgQueryText(url, "SELECT string_agg(step::text, ',' ORDER BY step) FROM metrics"), "1,2");
  }
}

// CheckOwnership is a round trip: an idle Store notices its session's loss.
TEST(PostgresStoreTest, CheckOwnershipReconnectsWhenNobodyElseTookTheLock) {
  std::string url;
  ASSERT_OK(PostgresEnvironment::NewDatabase(&url));
  PostgresStoreOptions options;
  options.application_name = "keeld idle";
  std::unique_ptr<Store> store;
  ASSERT_OK(OpenPostgresStore(url, options, &store));
  ASSERT_OK(store->CheckOwnership());
  EXPECT_EQ(PgQueryText(url, "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE application_name = 'keeld idle'"),
            "1");
  ASSERT_OK(store->CheckOwnership());  // back, with the lock and the same epoch
  EXPECT_EQ(PgQueryText(url, "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"), "1");
}

TEST(PostgresStoreTest, ReconnectsAfterTheServerDropsTheConnection) {
  std::string url;
  ASSERT_OK(PostgresEnvironment::NewDatabase(&url));
  std::unique_ptr<Store> store;
  ASSERT_OK(OpenPostgresStore(url, &store));
  ASSERT_OK(store->CreateSweep(MakeSweep("s"), {MakeRun("r", "s")}));
  // An administrator ends keeld's server process (as a server restart would).
  EXPECT_EQ(PgQueryText(url, "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()"),
            "1");
  // The next calls connect again, and the store still holds keeld's lock.
  v1::Run run;
  ASSERT_OK(store->GetRun("r", &run));
  ASSERT_OK(store->AppendMetrics({MakePoint("r", 1)}));
  v1::MetricPoint last;
  ASSERT_OK(store->LastMetric("r", &last));
  EXPECT_EQ(last.step(), 1);
  std::unique_ptr<Store> second;
  EXPECT_FALSE(OpenPostgresStore(url, &second, /*lock_wait_ms=*/200).ok());
}

TEST(PostgresStoreTest, ConnectionErrorsNameTheUrlWithoutItsPassword) {
  Status status;
  TempPostgres* server = PostgresEnvironment::Get(&status);
  ASSERT_TRUE(server != nullptr) << status.message();
  std::unique_ptr<Store> store;
  // No such database on a running server.
  Status s = OpenPostgresStore("postgresql://keel:hunter2@127.0.0.1:" + std::to_string(server->port()) +
                                   "/no_such_database",
                               &store);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(store);
  EXPECT_NE(s.message().find("postgresql://keel:***@127.0.0.1:" + std::to_string(server->port()) +
                             "/no_such_database"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("no_such_database\" does not exist"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.message();
  // Nothing listening (port 1).
  s = OpenPostgresStore("postgresql://keel@127.0.0.1:1/x?password=hunter2&connect_timeout=2", &store);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  EXPECT_NE(s.message().find("cannot connect"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.message();
}

TEST(PostgresStoreTest, RedactStoreUrlHidesPasswordsOnly) {
  EXPECT_EQ(RedactStoreUrl("postgresql://keel@db:5432/keel"), "postgresql://keel@db:5432/keel");
  EXPECT_EQ(RedactStoreUrl("postgresql://keel:s3cr@t@db:5432/keel"), "postgresql://keel:***@db:5432/keel");
  EXPECT_EQ(RedactStoreUrl("postgres://u:p@h/d?sslmode=require"), "postgres://u:***@h/d?sslmode=require");
  EXPECT_EQ(RedactStoreUrl("postgresql://u@h/d?password=p&sslmode=require"),
            "postgresql://u@h/d?password=***&sslmode=require");
  EXPECT_EQ(RedactStoreUrl("postgresql://h:5432/d"), "postgresql://h:5432/d");
}

// ---- --store -------------------------------------------------------------------------

TEST(StoreLocationTest, ParsesEachForm) {
  StoreLocation loc;
  ASSERT_OK(ParseStoreLocation("sqlite:/var/lib/keel/keeld.db", &loc));
  EXPECT_EQ(loc.kind, StoreLocation::Kind::kSqlite);
  EXPECT_EQ(loc.target, "/var/lib/keel/keeld.db");
  ASSERT_OK(ParseStoreLocation("state/keeld.db", &loc));
  EXPECT_EQ(loc.kind, StoreLocation::Kind::kSqlite);
  EXPECT_EQ(loc.target, "state/keeld.db");
  ASSERT_OK(ParseStoreLocation("postgresql://keel@db.example:5432/keel", &loc));
  EXPECT_EQ(loc.kind, StoreLocation::Kind::kPostgres);
  EXPECT_EQ(loc.target, "postgresql://keel@db.example:5432/keel");
  ASSERT_OK(ParseStoreLocation("postgres://keel@/keel?host=/run/postgresql", &loc));
  EXPECT_EQ(loc.kind, StoreLocation::Kind::kPostgres);
}

TEST(StoreLocationTest, RefusesBadValuesNamingTheFlagTheValueAndTheForms) {
  const std::string forms = "sqlite:PATH, a plain PATH (SQLite), or postgresql://user@host:port/db";
  for (const std::string& bad : {std::string(""), std::string("sqlite:"), std::string("mysql://keel@db/keel"),
                                 std::string("postgresql://keel@db/keel?no_such_option=1")}) {
    StoreLocation loc;
    Status s = ParseStoreLocation(bad, &loc);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_EQ(s.field(), "--store") << s.message();
    EXPECT_NE(s.message().find("'" + bad + "'"), bad.empty() ? 0 : std::string::npos) << s.message();
    EXPECT_NE(s.message().find(forms), std::string::npos) << s.message();
  }
  StoreLocation loc;
  Status s = ParseStoreLocation("postgresql://keel:pw@db/keel?no_such_option=1", &loc);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().find("pw@"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no_such_option"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace keel
