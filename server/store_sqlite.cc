// The SQLite implementation of Store (store.h): one connection per Store,
// serialised by the Store's mutex. Each record is one row holding the columns
// that queries filter or sort on plus the serialized proto message, which is
// what reads return.
#include <sqlite3.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <chrono>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "server/store.h"
#include "server/store_internal.h"

namespace keel {
namespace {

using store_internal::CheckSchemaVersion;
using store_internal::DownsampledIndex;
using store_internal::PageFull;
using store_internal::RequireId;
using store_internal::Serialize;

// Version 1. Every table keeps insertion order in an INTEGER PRIMARY KEY `seq`
// (AUTOINCREMENT: a deleted row's seq is never reused, so order stays creation
// order). Metrics are keyed by (run_id, step) so that a re-sent step replaces
// the earlier point.
constexpr char kSchemaV1[] = R"sql(
CREATE TABLE sweeps (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  proto BLOB NOT NULL
);
CREATE TABLE runs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  sweep_id TEXT NOT NULL REFERENCES sweeps(id),
  state INTEGER NOT NULL,
  proto BLOB NOT NULL
);
CREATE INDEX runs_by_sweep ON runs(sweep_id, seq);
CREATE INDEX runs_by_state ON runs(state, seq);
CREATE TABLE metrics (
  run_id TEXT NOT NULL REFERENCES runs(id),
  step INTEGER NOT NULL,
  proto BLOB NOT NULL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT REFERENCES runs(id),
  sweep_id TEXT REFERENCES sweeps(id),
  proto BLOB NOT NULL
);
CREATE INDEX events_by_run ON events(run_id, seq);
CREATE INDEX events_by_sweep ON events(sweep_id, seq);
CREATE TABLE workers (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  proto BLOB NOT NULL
);
)sql";

std::string SqliteError(sqlite3* db, const std::string& what) {
  return "sqlite: " + what + ": " + (db != nullptr ? sqlite3_errmsg(db) : "out of memory");
}

// One prepared statement, finalized on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
    if (rc_ != SQLITE_OK) error_ = SqliteError(db, std::string("prepare \"") + sql + "\"");
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Status status() const { return rc_ == SQLITE_OK ? Status::Ok() : Status::Error(error_); }

  // Binds are 1-based as in SQLite. A bind error shows up in the next Step().
  Stmt& Bind(int i, const std::string& text) {
    Check(sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& bytes) {
    Check(sqlite3_bind_blob(stmt_, i, bytes.data(), static_cast<int>(bytes.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    Check(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  Stmt& BindDouble(int i, double v) {
    Check(sqlite3_bind_double(stmt_, i, v));
    return *this;
  }
  // NULL for an empty string (nullable foreign keys).
  Stmt& BindOrNull(int i, const std::string& text) {
    if (text.empty()) {
      Check(sqlite3_bind_null(stmt_, i));
      return *this;
    }
    return Bind(i, text);
  }

  // Runs one step: *row is true when a row is available.
  Status Step(bool* row) {
    *row = false;
    if (rc_ != SQLITE_OK) return Status::Error(error_);
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) {
      *row = true;
      return Status::Ok();
    }
    if (rc == SQLITE_DONE) return Status::Ok();
    return Status::Error(SqliteError(db_, std::string("step \"") + sqlite3_sql(stmt_) + "\""));
  }
  // Runs a statement that returns no rows.
  Status Run() {
    bool row;
    KEEL_RETURN_IF_ERROR(Step(&row));
    return Status::Ok();
  }
  // Makes the statement reusable with new binds.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  // NULL (how SQLite stores a NaN) reads as NaN.
  double Double(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? std::nan("") : sqlite3_column_double(stmt_, col);
  }
  int64_t Bytes(int col) const { return sqlite3_column_bytes(stmt_, col); }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  // Parses the blob in `col` into `msg`.
  Status Parse(int col, google::protobuf::Message* msg) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return store_internal::ParseRecord(p, sqlite3_column_bytes(stmt_, col), msg);
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && rc_ == SQLITE_OK) {
      rc_ = rc;
      error_ = SqliteError(db_, "bind");
    }
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
  std::string error_;
};

Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = std::string("sqlite: \"") + sql + "\": " +
                      (err != nullptr ? err : sqlite3_errmsg(db));
    sqlite3_free(err);
    return Status::Error(msg);
  }
  return Status::Ok();
}

// Runs `body` inside one transaction: COMMIT when it returns OK (the commit is
// synced: synchronous=FULL), ROLLBACK otherwise. Writes take the write lock at
// BEGIN (IMMEDIATE) so that a commit never fails for a lock upgrade.
template <typename Body>
Status InTransaction(sqlite3* db, bool write, Body body) {
  KEEL_RETURN_IF_ERROR(Exec(db, write ? "BEGIN IMMEDIATE" : "BEGIN"));
  Status status = body();
  if (status.ok()) status = Exec(db, "COMMIT");
  if (!status.ok() && !sqlite3_get_autocommit(db)) Exec(db, "ROLLBACK");
  return status;
}

// A point without its json line, from a row whose column 0 is the step and
// columns first..first+3 are loss, lr, tokens_per_s and grad_norm.
void PointFromColumns(const Stmt& q, const std::string& run_id, int first, v1::MetricPoint* point) {
  point->set_run_id(run_id);
  point->set_step(q.Int(0));
  point->set_loss(q.Double(first));
  point->set_lr(q.Double(first + 1));
  point->set_tokens_per_s(q.Double(first + 2));
  point->set_grad_norm(q.Double(first + 3));
}

class SqliteStore : public Store {
 public:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override { sqlite3_close_v2(db_); }

  void SetWriteObserver(std::function<void(double)> observer) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_observer_ = std::move(observer);
  }

  Status CreateSweep(const v1::Sweep& sweep, const std::vector<v1::Run>& runs) override {
    KEEL_RETURN_IF_ERROR(RequireId(sweep.id(), "CreateSweep: sweep"));
    std::set<std::string> ids = {sweep.id()};
    for (const v1::Run& run : runs) {
      KEEL_RETURN_IF_ERROR(RequireId(run.id(), "CreateSweep: run of sweep '" + sweep.id() + "'"));
      if (run.sweep_id() != sweep.id()) {
        return Status::Error("CreateSweep: run '" + run.id() + "' has sweep_id '" +
                             run.sweep_id() + "'; it must be the sweep's id '" + sweep.id() +
                             "'");
      }
      if (!ids.insert(run.id()).second) {
        return Status::Error("CreateSweep: duplicate id '" + run.id() +
                             "' within the submitted sweep; ids must be unique");
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      bool exists;
      KEEL_RETURN_IF_ERROR(Exists("sweeps", sweep.id(), &exists));
      if (exists) {
        return Status::Error("CreateSweep: duplicate id: sweep '" + sweep.id() +
                             "' already exists");
      }
      std::string blob;
      KEEL_RETURN_IF_ERROR(Serialize(sweep, &blob));
      Stmt ins_sweep(db_,
                     "INSERT INTO sweeps(id, state, created_unix_ms, proto) VALUES(?,?,?,?)");
      ins_sweep.Bind(1, sweep.id())
          .Bind(2, static_cast<int64_t>(sweep.state()))
          .Bind(3, sweep.created_unix_ms())
          .BindBlob(4, blob);
      KEEL_RETURN_IF_ERROR(ins_sweep.Run());
      Stmt ins_run(db_, "INSERT INTO runs(id, sweep_id, state, proto) VALUES(?,?,?,?)");
      for (const v1::Run& run : runs) {
        KEEL_RETURN_IF_ERROR(Exists("runs", run.id(), &exists));
        if (exists) {
          return Status::Error("CreateSweep: duplicate id: run '" + run.id() +
                               "' already exists");
        }
        KEEL_RETURN_IF_ERROR(Serialize(run, &blob));
        ins_run.Reset();
        ins_run.Bind(1, run.id())
            .Bind(2, run.sweep_id())
            .Bind(3, static_cast<int64_t>(run.state()))
            .BindBlob(4, blob);
        KEEL_RETURN_IF_ERROR(ins_run.Run());
      }
      return Status::Ok();
    });
  }

  Status GetSweep(const std::string& id, v1::Sweep* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_, false, [&]() { return GetById("sweeps", "sweep", id, out); });
  }

  Status ListSweeps(std::vector<v1::Sweep>* out) override { return ListTable("sweeps", out); }

  Status UpdateSweep(const v1::Sweep& sweep) override {
    KEEL_RETURN_IF_ERROR(RequireId(sweep.id(), "UpdateSweep: sweep"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      std::string blob;
      KEEL_RETURN_IF_ERROR(Serialize(sweep, &blob));
      Stmt q(db_, "UPDATE sweeps SET state = ?, created_unix_ms = ?, proto = ? WHERE id = ?");
      q.Bind(1, static_cast<int64_t>(sweep.state()))
          .Bind(2, sweep.created_unix_ms())
          .BindBlob(3, blob)
          .Bind(4, sweep.id());
      KEEL_RETURN_IF_ERROR(q.Run());
      if (sqlite3_changes(db_) == 0) return NotFoundError("sweep", sweep.id());
      return Status::Ok();
    });
  }

  Status GetRun(const std::string& id, v1::Run* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_, false, [&]() { return GetById("runs", "run", id, out); });
  }

  Status ListRuns(const std::string& sweep_id, std::vector<v1::Run>* out) override {
    if (sweep_id.empty()) return ListTable("runs", out);
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_, false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("sweeps", "sweep", sweep_id));
      Stmt q(db_, "SELECT proto FROM runs WHERE sweep_id = ? ORDER BY seq");
      q.Bind(1, sweep_id);
      return ReadAll(&q, out);
    });
  }

  Status ListRunsInState(v1::RunState state, std::vector<v1::Run>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_, false, [&]() -> Status {
      Stmt q(db_, "SELECT proto FROM runs WHERE state = ? ORDER BY seq");
      q.Bind(1, static_cast<int64_t>(state));
      return ReadAll(&q, out);
    });
  }

  Status UpdateRun(const v1::Run& run) override { return UpdateRuns({run}); }

  Status UpdateRuns(const std::vector<v1::Run>& runs) override { return UpdateRunsWithEvents(runs, {}); }

  Status UpdateRunsWithEvents(const std::vector<v1::Run>& runs, const std::vector<v1::Event>& events) override {
    for (const v1::Run& run : runs) KEEL_RETURN_IF_ERROR(RequireId(run.id(), "UpdateRun: run"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      KEEL_RETURN_IF_ERROR(UpdateRunsIn(runs));
      return AppendEventsIn(events);
    });
  }

  Status AppendMetrics(const std::vector<v1::MetricPoint>& points) override {
    for (const v1::MetricPoint& p : points) {
      KEEL_RETURN_IF_ERROR(RequireId(p.run_id(), "AppendMetrics: run_id of a metric point"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      // Check each run once, for an error that names it (the foreign key would
      // only say "FOREIGN KEY constraint failed").
      std::set<std::string> runs;
      for (const v1::MetricPoint& p : points) runs.insert(p.run_id());
      for (const std::string& run : runs) KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run));
      Stmt ins(db_,
               "INSERT OR REPLACE INTO metrics(run_id, step, proto, loss, lr, tokens_per_s, grad_norm) "
               "VALUES(?,?,?,?,?,?,?)");
      std::string blob;
      for (const v1::MetricPoint& p : points) {
        KEEL_RETURN_IF_ERROR(Serialize(p, &blob));
        ins.Reset();
        ins.Bind(1, p.run_id()).Bind(2, p.step()).BindBlob(3, blob);
        ins.BindDouble(4, p.loss()).BindDouble(5, p.lr()).BindDouble(6, p.tokens_per_s()).BindDouble(7, p.grad_norm());
        KEEL_RETURN_IF_ERROR(ins.Run());
      }
      return Status::Ok();
    });
  }

  Status GetMetrics(const std::string& run_id, int max_points,
                    std::vector<v1::MetricPoint>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_, false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      int64_t n = 0;
      KEEL_RETURN_IF_ERROR(CountMetrics(run_id, &n));
      Stmt q(db_, "SELECT proto FROM metrics WHERE run_id = ? ORDER BY step");
      q.Bind(1, run_id);
      if (max_points <= 0 || n <= max_points) return ReadAll(&q, out);
      const int64_t m = max_points;
      int64_t k = 0;
      out->reserve(static_cast<size_t>(m));
      for (int64_t i = 0; k < m; ++i) {
        bool row;
        KEEL_RETURN_IF_ERROR(q.Step(&row));
        if (!row) break;
        if (i != DownsampledIndex(k, n, m)) continue;  // skipped rows are never parsed
        out->emplace_back();
        KEEL_RETURN_IF_ERROR(q.Parse(0, &out->back()));
        ++k;
      }
      return Status::Ok();
    });
  }

  Status GetMetricsPage(const std::string& run_id, int max_points, bool omit_json,
                        const PageRequest& page, std::vector<v1::MetricPoint>* out,
                        PageResult* result) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    *result = PageResult();
    return InTransaction(db_, false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      int64_t n = 0;
      if (max_points > 0) KEEL_RETURN_IF_ERROR(CountMetrics(run_id, &n));
      if (max_points <= 0 || n <= max_points) {
        // The primary key (run_id, step) starts the scan at `after`.
        if (omit_json) {
          // The numbers have columns of their own: no record is parsed.
          Stmt q(db_,
                 "SELECT step, loss, lr, tokens_per_s, grad_norm FROM metrics WHERE run_id = ? AND step > ? "
                 "ORDER BY step LIMIT ?");
          q.Bind(1, run_id).Bind(2, page.after).Bind(3, static_cast<int64_t>(page.max_items) + 1);
          return ReadNumericPage(&q, run_id, page, out, result);
        }
        Stmt q(db_, "SELECT step, proto FROM metrics WHERE run_id = ? AND step > ? ORDER BY step LIMIT ?");
        q.Bind(1, run_id).Bind(2, page.after).Bind(3, static_cast<int64_t>(page.max_items) + 1);
        return ReadPage(&q, page, out, result);
      }
      // The same points as GetMetrics' downsampling, from `after` on.
      const int64_t m = max_points;
      Stmt q(db_, "SELECT step, proto, loss, lr, tokens_per_s, grad_norm FROM metrics WHERE run_id = ? ORDER BY step");
      q.Bind(1, run_id);
      int64_t bytes = 0;
      int64_t k = 0;
      for (int64_t i = 0; k < m; ++i) {
        bool row;
        KEEL_RETURN_IF_ERROR(q.Step(&row));
        if (!row) break;
        if (i != DownsampledIndex(k, n, m)) continue;  // skipped rows are never parsed
        ++k;
        if (q.Int(0) <= page.after) continue;
        v1::MetricPoint point;
        if (omit_json) {  // from the columns: no record is parsed
          PointFromColumns(q, run_id, 2, &point);
        } else {
          KEEL_RETURN_IF_ERROR(q.Parse(1, &point));
        }
        const int64_t size = omit_json ? static_cast<int64_t>(point.ByteSizeLong()) : q.Bytes(1);
        if (PageFull(page, out->size(), bytes, size)) {
          result->more = true;
          break;
        }
        out->push_back(std::move(point));
        bytes += size;
        result->last = q.Int(0);
      }
      return Status::Ok();
    });
  }

  Status LastMetric(const std::string& run_id, v1::MetricPoint* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_, false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      Stmt q(db_, "SELECT proto FROM metrics WHERE run_id = ? ORDER BY step DESC LIMIT 1");
      q.Bind(1, run_id);
      bool row;
      KEEL_RETURN_IF_ERROR(q.Step(&row));
      if (!row) return NotFoundError("last metric of run", run_id);
      return q.Parse(0, out);
    });
  }

  Status DeleteMetricsAfter(const std::string& run_id, int64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      Stmt q(db_, "DELETE FROM metrics WHERE run_id = ? AND step > ?");
      q.Bind(1, run_id).Bind(2, step);
      return q.Run();
    });
  }

  Status AppendEvent(const v1::Event& event) override { return AppendEvents({event}); }

  Status AppendEvents(const std::vector<v1::Event>& events) override { return UpdateRunsWithEvents({}, events); }

  Status ListEvents(const std::string& run_id, const std::string& sweep_id,
                    std::vector<v1::Event>* out) override {
    PageRequest all;
    all.max_items = INT32_MAX;
    all.max_bytes = INT64_MAX;
    PageResult result;
    return ListEventsPage(run_id, sweep_id, all, out, &result);
  }

  Status ListEventsPage(const std::string& run_id, const std::string& sweep_id,
                        const PageRequest& page, std::vector<v1::Event>* out,
                        PageResult* result) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    *result = PageResult();
    return InTransaction(db_, false, [&]() -> Status {
      if (!run_id.empty()) KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      if (!sweep_id.empty()) KEEL_RETURN_IF_ERROR(RequireExists("sweeps", "sweep", sweep_id));
      // One statement per filter, each equality on the leading column of an
      // index ending in seq (events_by_run, events_by_sweep, the primary key):
      // SQLite starts at `after` and stops at the limit. A filter written as
      // "(?1 = '' OR run_id = ?1)" can use no index and scans every event.
      const char* sql =
          !run_id.empty()
              ? "SELECT seq, proto FROM events WHERE run_id = ?1 AND (?2 = '' OR sweep_id = ?2) "
                "AND seq > ?3 ORDER BY seq LIMIT ?4"
          : !sweep_id.empty()
              ? "SELECT seq, proto FROM events WHERE sweep_id = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4"
              : "SELECT seq, proto FROM events WHERE ?1 = '' AND ?2 = '' AND seq > ?3 ORDER BY seq LIMIT ?4";
      Stmt q(db_, sql);
      // One row past the page tells whether more follow.
      const int64_t limit = page.max_items >= INT32_MAX ? -1 : static_cast<int64_t>(page.max_items) + 1;
      q.Bind(1, run_id).Bind(2, sweep_id).Bind(3, page.after).Bind(4, limit);
      return ReadPage(&q, page, out, result);
    });
  }

  Status UpsertWorker(const v1::Worker& worker) override {
    KEEL_RETURN_IF_ERROR(RequireId(worker.id(), "UpsertWorker: worker"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      std::string blob;
      KEEL_RETURN_IF_ERROR(Serialize(worker, &blob));
      // ON CONFLICT DO UPDATE (not INSERT OR REPLACE) keeps the row's seq, so
      // ListWorkers stays in order of first registration.
      Stmt q(db_,
             "INSERT INTO workers(id, proto) VALUES(?,?) "
             "ON CONFLICT(id) DO UPDATE SET proto = excluded.proto");
      q.Bind(1, worker.id()).BindBlob(2, blob);
      return q.Run();
    });
  }

  Status ListWorkers(std::vector<v1::Worker>* out) override { return ListTable("workers", out); }

  Status GetWorker(const std::string& id, v1::Worker* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_, false, [&]() { return GetById("workers", "worker", id, out); });
  }

  Status BeginArtifact(const std::string& run_id, int64_t step, const std::string& manifest, int64_t* id) override {
    KEEL_RETURN_IF_ERROR(RequireId(run_id, "BeginArtifact: run"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      Stmt q(db_, "INSERT INTO artifacts(run_id, step, manifest, committed) VALUES(?,?,?,0)");
      q.Bind(1, run_id).Bind(2, step).Bind(3, manifest);
      KEEL_RETURN_IF_ERROR(q.Run());
      *id = sqlite3_last_insert_rowid(db_);
      return Status::Ok();
    });
  }

  Status AppendArtifactChunk(int64_t id, int file, int64_t offset, const std::string& data) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireUpload(id));
      Stmt q(db_, "INSERT INTO artifact_chunks(artifact_id, file, byte_offset, data) VALUES(?,?,?,?)");
      q.Bind(1, id).Bind(2, static_cast<int64_t>(file)).Bind(3, offset).BindBlob(4, data);
      return q.Run();
    });
  }

  Status CommitArtifact(int64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      Stmt q(db_, "SELECT run_id, step FROM artifacts WHERE id = ? AND committed = 0");
      q.Bind(1, id);
      bool row;
      KEEL_RETURN_IF_ERROR(q.Step(&row));
      if (!row) return NotFoundError("artifact upload", std::to_string(id));
      // The checkpoint stored for this step before, with its chunks (ON DELETE CASCADE).
      Stmt old(db_, "DELETE FROM artifacts WHERE run_id = ? AND step = ? AND committed = 1");
      old.Bind(1, q.Text(0)).Bind(2, q.Int(1));
      KEEL_RETURN_IF_ERROR(old.Run());
      Stmt set(db_, "UPDATE artifacts SET committed = 1 WHERE id = ?");
      set.Bind(1, id);
      return set.Run();
    });
  }

  Status DeleteArtifact(int64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      Stmt q(db_, "DELETE FROM artifacts WHERE id = ?");
      q.Bind(1, id);
      return q.Run();
    });
  }

  Status DeleteUncommittedArtifacts() override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() { return Exec(db_, "DELETE FROM artifacts WHERE committed = 0"); });
  }

  Status ListArtifacts(const std::string& run_id, std::vector<StoredArtifact>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_, false, [&]() -> Status {
      Stmt q(db_, "SELECT id, step, manifest FROM artifacts WHERE run_id = ? AND committed = 1 ORDER BY step");
      q.Bind(1, run_id);
      for (;;) {
        bool row;
        KEEL_RETURN_IF_ERROR(q.Step(&row));
        if (!row) return Status::Ok();
        out->push_back({q.Int(0), q.Int(1), q.Text(2)});
      }
    });
  }

  Status ReadArtifactChunk(int64_t id, int file, int64_t offset, std::string* data) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_, false, [&]() -> Status {
      Stmt q(db_, "SELECT data FROM artifact_chunks WHERE artifact_id = ? AND file = ? AND byte_offset = ?");
      q.Bind(1, id).Bind(2, static_cast<int64_t>(file)).Bind(3, offset);
      bool row;
      KEEL_RETURN_IF_ERROR(q.Step(&row));
      if (!row) {
        return NotFoundError("chunk of artifact " + std::to_string(id) + " file " + std::to_string(file) + " at byte",
                             std::to_string(offset));
      }
      *data = q.Blob(0);
      return Status::Ok();
    });
  }

  Status Counts(int64_t* sweeps, int64_t* runs, int64_t* metric_points) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_, false, [&]() -> Status {
      Stmt q(db_,
             "SELECT (SELECT COUNT(*) FROM sweeps), (SELECT COUNT(*) FROM runs), "
             "(SELECT COUNT(*) FROM metrics)");
      bool row;
      KEEL_RETURN_IF_ERROR(q.Step(&row));
      if (!row) return Status::Error("store: Counts returned no row");
      if (sweeps != nullptr) *sweeps = q.Int(0);
      if (runs != nullptr) *runs = q.Int(1);
      if (metric_points != nullptr) *metric_points = q.Int(2);
      return Status::Ok();
    });
  }

 private:
  // UpdateRuns' and AppendEvents' statements, with mu_ held inside a write transaction.
  Status UpdateRunsIn(const std::vector<v1::Run>& runs) {

    Stmt sweep_of(db_, "SELECT sweep_id FROM runs WHERE id = ?");
    Stmt update(db_, "UPDATE runs SET state = ?, proto = ? WHERE id = ?");
    std::string blob;
    for (const v1::Run& run : runs) {
      sweep_of.Reset();
      sweep_of.Bind(1, run.id());
      bool row;
      KEEL_RETURN_IF_ERROR(sweep_of.Step(&row));
      if (!row) return NotFoundError("run", run.id());
      if (sweep_of.Text(0) != run.sweep_id()) {
        return Status::Error("UpdateRun: run '" + run.id() + "' has sweep_id '" +
                             run.sweep_id() + "' but belongs to sweep '" + sweep_of.Text(0) +
                             "'; a run's sweep_id never changes");
      }
      KEEL_RETURN_IF_ERROR(Serialize(run, &blob));
      update.Reset();
      update.Bind(1, static_cast<int64_t>(run.state())).BindBlob(2, blob).Bind(3, run.id());
      KEEL_RETURN_IF_ERROR(update.Run());
    }
    return Status::Ok();
  }

  Status AppendEventsIn(const std::vector<v1::Event>& events) {
    Stmt sweep_of(db_, "SELECT sweep_id FROM runs WHERE id = ?");
    // A keyed event already stored (a worker's re-send) is skipped.
    Stmt ins(db_, "INSERT INTO events(run_id, sweep_id, key, proto) VALUES(?,?,?,?) ON CONFLICT(key) DO NOTHING");
    std::string blob;
    for (const v1::Event& event : events) {
      std::string sweep_id;
      if (!event.run_id().empty()) {
        sweep_of.Reset();
        sweep_of.Bind(1, event.run_id());
        bool row;
        KEEL_RETURN_IF_ERROR(sweep_of.Step(&row));
        if (!row) return NotFoundError("run", event.run_id());
        sweep_id = sweep_of.Text(0);
      }
      KEEL_RETURN_IF_ERROR(Serialize(event, &blob));
      ins.Reset();
      ins.BindOrNull(1, event.run_id()).BindOrNull(2, sweep_id).BindOrNull(3, event.key()).BindBlob(4, blob);
      KEEL_RETURN_IF_ERROR(ins.Run());
    }
    return Status::Ok();
  }

  // Every record of `table`, in the order they were first stored (takes mu_).
  template <typename Msg>
  Status ListTable(const std::string& table, std::vector<Msg>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_, false, [&]() -> Status {
      const std::string sql = "SELECT proto FROM " + table + " ORDER BY seq";
      Stmt q(db_, sql.c_str());
      return ReadAll(&q, out);
    });
  }

  // Helpers below run with mu_ held, inside a transaction. `table` is always
  // one of the literal table names above, never user input.
  // NotFound unless `id` names an upload not yet committed.
  Status RequireUpload(int64_t id) {
    Stmt q(db_, "SELECT 1 FROM artifacts WHERE id = ? AND committed = 0");
    q.Bind(1, id);
    bool row;
    KEEL_RETURN_IF_ERROR(q.Step(&row));
    return row ? Status::Ok() : NotFoundError("artifact upload", std::to_string(id));
  }
  Status Exists(const std::string& table, const std::string& id, bool* exists) {
    const std::string sql = "SELECT 1 FROM " + table + " WHERE id = ?";
    Stmt q(db_, sql.c_str());
    q.Bind(1, id);
    return q.Step(exists);
  }

  // The number of stored points of `run_id`.
  Status CountMetrics(const std::string& run_id, int64_t* n) {
    Stmt count(db_, "SELECT COUNT(*) FROM metrics WHERE run_id = ?");
    count.Bind(1, run_id);
    bool row;
    KEEL_RETURN_IF_ERROR(count.Step(&row));
    *n = row ? count.Int(0) : 0;
    return Status::Ok();
  }

  Status RequireExists(const std::string& table, const std::string& kind, const std::string& id) {
    bool exists;
    KEEL_RETURN_IF_ERROR(Exists(table, id, &exists));
    return exists ? Status::Ok() : NotFoundError(kind, id);
  }

  Status GetById(const std::string& table, const std::string& kind, const std::string& id,
                 google::protobuf::Message* out) {
    const std::string sql = "SELECT proto FROM " + table + " WHERE id = ?";
    Stmt q(db_, sql.c_str());
    q.Bind(1, id);
    bool row;
    KEEL_RETURN_IF_ERROR(q.Step(&row));
    if (!row) return NotFoundError(kind, id);
    return q.Parse(0, out);
  }

  // Reads rows of (key, proto) into one page: up to page.max_items items and
  // page.max_bytes of records (at least one); result->more when a row remains.
  // `trim`, when given, drops fields from each record and returns its size after.
  template <typename Msg>
  Status ReadPage(Stmt* q, const PageRequest& page, std::vector<Msg>* out, PageResult* result,
                  int64_t (*trim)(Msg*) = nullptr) {
    int64_t bytes = 0;
    for (;;) {
      bool row;
      KEEL_RETURN_IF_ERROR(q->Step(&row));
      if (!row) return Status::Ok();
      Msg record;
      if (trim != nullptr) KEEL_RETURN_IF_ERROR(q->Parse(1, &record));
      const int64_t size = trim != nullptr ? trim(&record) : q->Bytes(1);
      if (PageFull(page, out->size(), bytes, size)) {
        result->more = true;
        return Status::Ok();
      }
      if (trim == nullptr) KEEL_RETURN_IF_ERROR(q->Parse(1, &record));
      out->push_back(std::move(record));
      bytes += size;
      result->last = q->Int(0);
    }
  }

  // ReadPage for rows of (step, loss, lr, tokens_per_s, grad_norm): points without their json.
  Status ReadNumericPage(Stmt* q, const std::string& run_id, const PageRequest& page,
                         std::vector<v1::MetricPoint>* out, PageResult* result) {
    int64_t bytes = 0;
    for (;;) {
      bool row;
      KEEL_RETURN_IF_ERROR(q->Step(&row));
      if (!row) return Status::Ok();
      v1::MetricPoint point;
      PointFromColumns(*q, run_id, 1, &point);
      const int64_t size = static_cast<int64_t>(point.ByteSizeLong());
      if (PageFull(page, out->size(), bytes, size)) {
        result->more = true;
        return Status::Ok();
      }
      out->push_back(std::move(point));
      bytes += size;
      result->last = q->Int(0);
    }
  }

  template <typename Msg>
  Status ReadAll(Stmt* q, std::vector<Msg>* out) {
    for (;;) {
      bool row;
      KEEL_RETURN_IF_ERROR(q->Step(&row));
      if (!row) return Status::Ok();
      out->emplace_back();
      KEEL_RETURN_IF_ERROR(q->Parse(0, &out->back()));
    }
  }

  // mu_ serialises every method: the one SQLite connection db_ (opened
  // SQLITE_OPEN_NOMUTEX) and its transaction state are used by one thread at a
  // time.
  // A write transaction, timed from BEGIN to its synced COMMIT for the observer.
  template <typename Body>
  Status WriteTransaction(Body body) {
    const auto start = std::chrono::steady_clock::now();
    Status status = InTransaction(db_, true, body);
    if (write_observer_) {
      write_observer_(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return status;
  }

  std::function<void(double)> write_observer_;  // guarded by mu_ (held by every caller)
  std::mutex mu_;
  sqlite3* const db_;
};

// Reads the schema version of an existing database into *version (0 when the
// schema_version table does not exist: a new, empty file).
Status ReadSchemaVersion(sqlite3* db, int64_t* version) {
  *version = 0;
  Stmt exists(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'");
  bool row;
  KEEL_RETURN_IF_ERROR(exists.Step(&row));
  if (!row) return Status::Ok();
  Stmt q(db, "SELECT MAX(version) FROM schema_version");
  KEEL_RETURN_IF_ERROR(q.Step(&row));
  if (row) *version = q.Int(0);
  return Status::Ok();
}

// Version 2: a metric point's numbers get columns of their own, so that a
// listing without the json lines (keel export, keel plot) parses no records.
// Existing points get them from their stored records.
Status MigrateV1ToV2(sqlite3* db) {
  for (const char* column : {"loss", "lr", "tokens_per_s", "grad_norm"}) {
    // Nullable: SQLite stores a NaN as NULL (read back as NaN), and a diverged
    // run's loss is NaN.
    const std::string sql = std::string("ALTER TABLE metrics ADD COLUMN ") + column + " REAL";
    KEEL_RETURN_IF_ERROR(Exec(db, sql.c_str()));
  }
  // A covering index: the numbers of a run's points in step order, read
  // without touching the (much larger) records.
  KEEL_RETURN_IF_ERROR(
      Exec(db, "CREATE INDEX metrics_numbers ON metrics(run_id, step, loss, lr, tokens_per_s, grad_norm)"));
  Stmt q(db, "SELECT run_id, step, proto FROM metrics");
  Stmt set(db, "UPDATE metrics SET loss = ?, lr = ?, tokens_per_s = ?, grad_norm = ? WHERE run_id = ? AND step = ?");
  for (;;) {
    bool row;
    KEEL_RETURN_IF_ERROR(q.Step(&row));
    if (!row) return Status::Ok();
    v1::MetricPoint p;
    KEEL_RETURN_IF_ERROR(q.Parse(2, &p));
    set.Reset();
    set.BindDouble(1, p.loss()).BindDouble(2, p.lr()).BindDouble(3, p.tokens_per_s()).BindDouble(4, p.grad_norm());
    set.Bind(5, q.Text(0)).Bind(6, q.Int(1));
    KEEL_RETURN_IF_ERROR(set.Run());
  }
}

Status CreateV1(sqlite3* db) { return Exec(db, kSchemaV1); }

// Version 3: an event's key (Event.key, set by the worker that sent it) has a
// column and a unique index, so that an event a worker re-sends after a
// reconnect is stored once. NULL (keeld's own events, and every older one) is
// never equal to another NULL, so those are not constrained.
Status MigrateV2ToV3(sqlite3* db) {
  KEEL_RETURN_IF_ERROR(Exec(db, "ALTER TABLE events ADD COLUMN key TEXT"));
  return Exec(db, "CREATE UNIQUE INDEX events_by_key ON events(key)");
}

// Version 4: uploaded checkpoints in the database (keeld --artifact-store db).
// An artifact row is an upload until `committed` is 1; its chunks are the
// bytes as they arrived, keyed by file index and byte offset (each at most a
// transfer chunk, 1 MiB), and go with it (ON DELETE CASCADE).
Status MigrateV3ToV4(sqlite3* db) {
  return Exec(db, R"sql(
CREATE TABLE artifacts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  manifest TEXT NOT NULL,
  committed INTEGER NOT NULL
);
CREATE INDEX artifacts_by_run ON artifacts(run_id, committed, step);
CREATE TABLE artifact_chunks (
  artifact_id INTEGER NOT NULL REFERENCES artifacts(id) ON DELETE CASCADE,
  file INTEGER NOT NULL,
  byte_offset INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (artifact_id, file, byte_offset)
);
)sql");
}

// The schema's history: step i takes a store from version to_version - 1 to
// to_version. A new file runs them all; kStoreSchemaVersion is the last one's.
struct Migration {
  int64_t to_version;
  Status (*apply)(sqlite3* db);
};
constexpr Migration kMigrations[] = {{1, CreateV1}, {2, MigrateV1ToV2}, {3, MigrateV2ToV3}, {4, MigrateV3ToV4}};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kStoreSchemaVersion,
              "one migration step per schema version");

Status Open(const std::string& path, sqlite3* db) {
  if (sqlite3_busy_timeout(db, 10000) != SQLITE_OK) {
    return Status::Error(SqliteError(db, "busy_timeout"));
  }
  // Refuse a newer schema before changing anything in the file (journal mode
  // included).
  int64_t version = 0;
  KEEL_RETURN_IF_ERROR(ReadSchemaVersion(db, &version));
  KEEL_RETURN_IF_ERROR(CheckSchemaVersion(path, version));

  // WAL: readers never block the writer and a commit is one append. FULL: the
  // WAL is fsynced at every commit, so an acknowledged write survives power
  // loss, not only a killed process (NORMAL would not).
  {
    Stmt wal(db, "PRAGMA journal_mode = WAL");
    bool row;
    KEEL_RETURN_IF_ERROR(wal.Step(&row));
    if (!row || wal.Text(0) != "wal") {
      return Status::Error("store '" + path + "': cannot switch to WAL journal mode (got '" +
                           (row ? wal.Text(0) : std::string()) +
                           "'); the store needs a local file system that supports it");
    }
  }
  KEEL_RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous = FULL"));
  KEEL_RETURN_IF_ERROR(Exec(db, "PRAGMA foreign_keys = ON"));

  return InTransaction(db, true, [&]() -> Status {
    // Read again under the write lock: another process may have created the
    // schema since.
    KEEL_RETURN_IF_ERROR(ReadSchemaVersion(db, &version));
    KEEL_RETURN_IF_ERROR(CheckSchemaVersion(path, version));
    if (version == kStoreSchemaVersion) return Status::Ok();
    if (version == 0) {
      KEEL_RETURN_IF_ERROR(Exec(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"));
      KEEL_RETURN_IF_ERROR(Exec(db, "INSERT INTO schema_version(version) SELECT 0 "
                                    "WHERE NOT EXISTS (SELECT 1 FROM schema_version)"));
    }
    // Older versions (0: a new file) are upgraded in place, one step at a
    // time, inside this transaction: a failure leaves the file as it was.
    for (const Migration& step : kMigrations) {
      if (step.to_version <= version) continue;
      KEEL_RETURN_IF_ERROR(step.apply(db));
      version = step.to_version;
    }
    Stmt set(db, "UPDATE schema_version SET version = ?");
    set.Bind(1, version);
    return set.Run();
  });
}

}  // namespace

bool IsNotFound(const Status& status) { return status.code() == StatusCode::kNotFound; }

Status NotFoundError(const std::string& kind, const std::string& id) {
  return Status::NotFound(kind + " '" + id + "' not found");
}

Status OpenSqliteStore(const std::string& path, std::unique_ptr<Store>* out) {
  if (path.empty()) return Status::Error("OpenSqliteStore: path is empty; give a database file");
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    Status status = Status::Error("store '" + path + "': " + SqliteError(db, "open"));
    sqlite3_close_v2(db);
    return status;
  }
  Status status = Open(path, db);
  if (!status.ok()) {
    sqlite3_close_v2(db);
    return status;
  }
  out->reset(new SqliteStore(db));
  return Status::Ok();
}

}  // namespace keel
