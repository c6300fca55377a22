// The PostgreSQL implementation of Store (store.h) over libpq: one connection
// per Store, serialised by the Store's mutex, with the same tables as SQLite's
// (store_sqlite.cc): each record is one row holding the columns that queries
// filter or sort on plus the serialized proto message, which is what reads
// return. Every value travels as a parameter in binary form (no SQL is built
// from values); results come back binary too, so bytea and float8 need no text
// decoding and a NaN or an infinity reads back exactly.
#include <postgresql/libpq-fe.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/store.h"
#include "server/store_internal.h"

namespace keel {
namespace {

using store_internal::CheckSchemaVersion;
using store_internal::DownsampledIndex;
using store_internal::PageFull;
using store_internal::ParseRecord;
using store_internal::RequireId;
using store_internal::Serialize;

// Type OIDs of the parameters we send (pg_type.h is a server header).
constexpr Oid kInt8Oid = 20;
constexpr Oid kTextOid = 25;
constexpr Oid kByteaOid = 17;
constexpr Oid kFloat8Oid = 701;
constexpr Oid kInt8ArrayOid = 1016;

// The session advisory lock that makes one keeld per database.
constexpr int64_t kKeeldLockKey = 0x6b65656c64;  // "keeld"

// Rows per multi-row statement: far below libpq's 65535 parameters, large
// enough that one of keeld's metric batches (512 points) is one statement.
constexpr size_t kRowsPerStatement = 1000;

// Version 1, PostgreSQL's spelling of store_sqlite.cc's kSchemaV1. `seq`
// (an identity: never reused) keeps creation order; one connection writes, so
// seq order is commit order.
constexpr char kSchemaV1[] = R"sql(
CREATE TABLE sweeps (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  state BIGINT NOT NULL,
  created_unix_ms BIGINT NOT NULL,
  proto BYTEA NOT NULL
);
CREATE TABLE runs (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  sweep_id TEXT NOT NULL REFERENCES sweeps(id),
  state BIGINT NOT NULL,
  proto BYTEA NOT NULL
);
CREATE INDEX runs_by_sweep ON runs(sweep_id, seq);
CREATE INDEX runs_by_state ON runs(state, seq);
CREATE TABLE metrics (
  run_id TEXT NOT NULL REFERENCES runs(id),
  step BIGINT NOT NULL,
  proto BYTEA NOT NULL,
  PRIMARY KEY (run_id, step)
);
CREATE TABLE events (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_id TEXT REFERENCES runs(id),
  sweep_id TEXT REFERENCES sweeps(id),
  proto BYTEA NOT NULL
);
CREATE INDEX events_by_run ON events(run_id, seq);
CREATE INDEX events_by_sweep ON events(sweep_id, seq);
CREATE TABLE workers (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  proto BYTEA NOT NULL
);
)sql";

uint64_t ToBigEndian64(uint64_t v) {
  return (static_cast<uint64_t>(htonl(static_cast<uint32_t>(v))) << 32) | htonl(static_cast<uint32_t>(v >> 32));
}

// The parameters of one statement, all in binary form with their types given.
class Params {
 public:
  Params& Text(const std::string& s) { return Add(kTextOid, s); }
  Params& Bytes(const std::string& s) { return Add(kByteaOid, s); }
  Params& Int(int64_t v) {
    const uint64_t be = ToBigEndian64(static_cast<uint64_t>(v));
    return Add(kInt8Oid, std::string(reinterpret_cast<const char*>(&be), 8));
  }
  Params& Double(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    const uint64_t be = ToBigEndian64(bits);
    return Add(kFloat8Oid, std::string(reinterpret_cast<const char*>(&be), 8));
  }
  // NULL for an empty string (nullable foreign keys).
  Params& TextOrNull(const std::string& s) {
    if (!s.empty()) return Text(s);
    types_.push_back(kTextOid);
    values_.emplace_back();
    null_.push_back(true);
    binary_.push_back(1);
    return *this;
  }
  // A bigint[] in the text form {1,2,3} (binary arrays carry a header).
  Params& IntArray(const std::vector<int64_t>& v) {
    std::string text = "{";
    for (size_t i = 0; i < v.size(); ++i) text += (i ? "," : "") + std::to_string(v[i]);
    text += "}";
    Add(kInt8ArrayOid, text);
    binary_.back() = 0;
    return *this;
  }

  int size() const { return static_cast<int>(values_.size()); }
  const Oid* types() const { return types_.data(); }
  const int* formats() const { return binary_.data(); }
  // Pointers into this object: valid while it lives unchanged.
  void Pointers(std::vector<const char*>* values, std::vector<int>* lengths) const {
    values->clear();
    lengths->clear();
    for (size_t i = 0; i < values_.size(); ++i) {
      values->push_back(null_[i] ? nullptr : values_[i].data());
      lengths->push_back(static_cast<int>(values_[i].size()));
    }
  }

 private:
  Params& Add(Oid type, std::string value) {
    types_.push_back(type);
    values_.push_back(std::move(value));
    null_.push_back(false);
    binary_.push_back(1);
    return *this;
  }
  std::vector<Oid> types_;
  std::vector<std::string> values_;
  std::vector<bool> null_;
  std::vector<int> binary_;
};

// A statement's result (binary columns), cleared on destruction.
class Result {
 public:
  Result() = default;
  ~Result() { PQclear(res_); }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  void Reset(PGresult* res) {
    PQclear(res_);
    res_ = res;
  }

  int rows() const { return res_ == nullptr ? 0 : PQntuples(res_); }
  bool IsNull(int row, int col) const { return PQgetisnull(res_, row, col) != 0; }
  // An int2, int4 or int8 column.
  int64_t Int(int row, int col) const {
    const char* p = PQgetvalue(res_, row, col);
    switch (PQgetlength(res_, row, col)) {
      case 2: { uint16_t v; std::memcpy(&v, p, 2); return static_cast<int16_t>(ntohs(v)); }
      case 4: { uint32_t v; std::memcpy(&v, p, 4); return static_cast<int32_t>(ntohl(v)); }
      case 8: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<int64_t>(ToBigEndian64(v)); }
      default: return 0;
    }
  }
  // A bool column (one byte in binary form).
  bool Bool(int row, int col) const {
    return !IsNull(row, col) && PQgetlength(res_, row, col) == 1 && PQgetvalue(res_, row, col)[0] != 0;
  }
  // A float8 column; NULL reads as NaN (as in the SQLite store).
  double Double(int row, int col) const {
    if (IsNull(row, col) || PQgetlength(res_, row, col) != 8) return std::nan("");
    uint64_t bits;
    std::memcpy(&bits, PQgetvalue(res_, row, col), 8);
    bits = ToBigEndian64(bits);
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  // A text or bytea column's bytes.
  std::string Text(int row, int col) const {
    return std::string(PQgetvalue(res_, row, col), static_cast<size_t>(PQgetlength(res_, row, col)));
  }
  int64_t Bytes(int row, int col) const { return PQgetlength(res_, row, col); }
  Status Parse(int row, int col, google::protobuf::Message* msg) const {
    return ParseRecord(PQgetvalue(res_, row, col), PQgetlength(res_, row, col), msg);
  }

 private:
  PGresult* res_ = nullptr;
};

// "($1,$2,$3),($4,$5,$6)" for `rows` rows of `cols` parameters each, with
// each parameter cast to the type in `casts` (e.g. {"text", "bigint"}), for
// multi-row VALUES lists. Only placeholders: the values travel as parameters.
std::string Placeholders(size_t rows, const std::vector<const char*>& casts) {
  std::string out;
  int n = 1;
  for (size_t r = 0; r < rows; ++r) {
    out += r ? ",(" : "(";
    for (size_t c = 0; c < casts.size(); ++c) {
      out += (c ? ",$" : "$") + std::to_string(n++) + "::" + casts[c];
    }
    out += ")";
  }
  return out;
}

// One libpq connection: statements, transactions, errors that name the URL,
// keeld's lock and the fencing rule (store.h, OpenPostgresStore).
class Connection {
 public:
  Connection(std::string url, PostgresStoreOptions options)
      : url_(std::move(url)), redacted_(RedactStoreUrl(url_)), options_(std::move(options)) {}
  ~Connection() { PQfinish(conn_); }

  const std::string& redacted() const { return redacted_; }

  // Connects, sets the session up and takes the keeld lock. Once the Store
  // has an epoch (TakeEpoch), this is a reconnect: it must get the lock back
  // and find keeld_epoch unchanged, or the connection is fenced for good.
  Status Connect() {
    if (!fenced_.ok()) return fenced_;
    Status s = ConnectAndLock();
    if (!s.ok() && epoch_ > 0 && s.code() == StatusCode::kFailedPrecondition) return Fence(s.message());
    if (s.ok() && epoch_ > 0) {
      Result r;
      s = Exec("SELECT epoch FROM keeld_epoch", Params(), &r);
      if (!s.ok()) return s;  // the connection failed again: fenced or not, the next call tells
      const int64_t now = r.rows() == 1 ? r.Int(0, 0) : -1;
      if (now != epoch_) {
        return Fence("keeld_epoch is " + std::to_string(now) + ", not this keeld's " + std::to_string(epoch_) +
                     ": another keeld took the database's lock while this one's session was down");
      }
    }
    return s;
  }

  // Counts this Store's taking of the lock (after Migrate: keeld_epoch exists).
  Status TakeEpoch() {
    Result r;
    KEEL_RETURN_IF_ERROR(Exec("UPDATE keeld_epoch SET epoch = epoch + 1 RETURNING epoch", Params(), &r));
    if (r.rows() != 1) return Status::Error("store '" + redacted_ + "': keeld_epoch has no row");
    epoch_ = r.Int(0, 0);
    return Status::Ok();
  }

 private:
  Status ConnectAndLock() {
    PQfinish(conn_);
    conn_ = PQconnectdb(url_.c_str());
    if (conn_ == nullptr) return Status::Unavailable("store '" + redacted_ + "': cannot connect: out of memory");
    if (PQstatus(conn_) != CONNECTION_OK) {
      return Status::Unavailable("store '" + redacted_ + "': cannot connect: " + Trimmed(PQerrorMessage(conn_)));
    }
    // Notices (e.g. "relation already exists, skipping") are not errors; keep
    // them off keeld's stderr.
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);
    // A commit returns once the server has flushed its WAL: an acknowledged
    // write survives a crash of the server, whatever its default is.
    KEEL_RETURN_IF_ERROR(Exec("SET synchronous_commit = on"));
    KEEL_RETURN_IF_ERROR(Exec("SET client_min_messages = warning"));
    if (!options_.application_name.empty()) {
      KEEL_RETURN_IF_ERROR(Exec("SELECT set_config('application_name', $1, false)",
                                Params().Text(options_.application_name)));
    }
    return TakeLock();
  }

  Status Fence(const std::string& why) {
    fenced_ = Status::FailedPrecondition("store '" + redacted_ + "': fenced: " + why +
                                         "; this keeld must not write any more (restart it: it comes back as a "
                                         "standby or waits for the lock)");
    PQfinish(conn_);
    conn_ = nullptr;
    if (options_.on_fenced) options_.on_fenced(fenced_);
    return fenced_;
  }

 public:

  // Reconnects when the connection was lost (a restarted server).
  Status EnsureConnected() {
    if (!fenced_.ok()) return fenced_;
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return Status::Ok();
    return Connect();
  }

  bool Connected() const { return conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK; }
  bool InTransaction() const { return conn_ != nullptr && PQtransactionStatus(conn_) != PQTRANS_IDLE; }

  // Runs several statements without parameters (DDL such as kSchemaV1).
  Status ExecScript(const char* sql) {
    PGresult* res = PQexec(conn_, sql);
    const bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    const std::string message = res != nullptr ? PQresultErrorMessage(res) : PQerrorMessage(conn_);
    PQclear(res);
    if (!ok) return Status::Error("postgresql '" + redacted_ + "': schema script: " + Trimmed(message));
    return Status::Ok();
  }

  // Runs `sql` with `params`; rows (if any) land in *out.
  Status Exec(const std::string& sql, const Params& params = Params(), Result* out = nullptr) {
    std::vector<const char*> values;
    std::vector<int> lengths;
    params.Pointers(&values, &lengths);
    PGresult* res = PQexecParams(conn_, sql.c_str(), params.size(), params.types(), values.data(),
                                 lengths.data(), params.formats(), /*resultFormat=*/1);
    const ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      std::string message = res != nullptr ? PQresultErrorMessage(res) : PQerrorMessage(conn_);
      PQclear(res);
      return Status::Error("postgresql '" + redacted_ + "': \"" + Shortened(sql) + "\": " + Trimmed(message));
    }
    if (out != nullptr) {
      out->Reset(res);
    } else {
      PQclear(res);
    }
    return Status::Ok();
  }

 private:
  static std::string Trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }
  // A long generated statement (a VALUES list) is cut in error messages.
  static std::string Shortened(const std::string& sql) {
    return sql.size() <= 200 ? sql : sql.substr(0, 200) + "...";
  }

  // The application_name of the session holding keeld's lock ("" if unknown).
  // An advisory lock on a bigint key is listed with its high 32 bits as
  // classid and its low 32 bits as objid.
  std::string LockHolder() {
    Result r;
    Status s = Exec("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                    "AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.pid <> pg_backend_pid()",
                    Params().Int(kKeeldLockKey >> 32).Int(kKeeldLockKey & 0xffffffff), &r);
    return s.ok() && r.rows() > 0 ? r.Text(0, 0) : std::string();
  }

  Status TakeLock() {
    // A reconnect waits a bounded time even for a standby: its keeld must
    // learn that it was fenced rather than hang.
    const int wait_ms = options_.lock_wait_ms >= 0 ? options_.lock_wait_ms : epoch_ > 0 ? 10000 : -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(wait_ms, 0));
    bool told = false;
    for (;;) {
      Result r;
      KEEL_RETURN_IF_ERROR(Exec("SELECT pg_try_advisory_lock($1)", Params().Int(kKeeldLockKey), &r));
      if (r.rows() == 1 && r.Bool(0, 0)) return Status::Ok();
      if (!told && options_.on_waiting) options_.on_waiting(LockHolder());
      told = true;
      if (wait_ms < 0 && options_.stop != nullptr && options_.stop->load()) {
        return Status::Unavailable("store '" + redacted_ + "': stopped while waiting for keeld's lock");
      }
      // The holder may be a keeld that was just killed, whose server process
      // has not noticed yet: wait a little before refusing.
      if (wait_ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
        return Status::FailedPrecondition(
            "store '" + redacted_ + "': the database is in use by another keeld (it holds keeld's advisory lock " +
            std::to_string(kKeeldLockKey) + "); stop it first, or give this one another database");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  const std::string url_;
  const std::string redacted_;
  const PostgresStoreOptions options_;
  PGconn* conn_ = nullptr;
  int64_t epoch_ = 0;              // keeld_epoch when this Store took the lock; 0: not yet
  Status fenced_ = Status::Ok();   // set once for good (Fence)
};

// Runs `body` inside one transaction: COMMIT when it returns OK (the commit
// waits for the WAL flush: synchronous_commit=on), ROLLBACK otherwise. Reads
// see one snapshot (REPEATABLE READ), as a SQLite read transaction does.
template <typename Body>
Status InTransaction(Connection* db, bool write, Body body) {
  const char* begin = write ? "BEGIN" : "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
  KEEL_RETURN_IF_ERROR(db->EnsureConnected());
  Status started = db->Exec(begin);
  if (!started.ok() && !db->Connected()) {
    // The server closed the connection since the last call (a restart, an
    // administrator's pg_terminate_backend): nothing was done yet, so connect
    // again and start over once.
    KEEL_RETURN_IF_ERROR(db->Connect());
    started = db->Exec(begin);
  }
  KEEL_RETURN_IF_ERROR(started);
  Status status = body();
  if (status.ok()) status = db->Exec("COMMIT");
  if (!status.ok() && db->InTransaction()) db->Exec("ROLLBACK");
  return status;
}

// A point without its json line from columns first..first+3 of `row` (loss,
// lr, tokens_per_s, grad_norm); `step_col` holds the step.
void PointFromColumns(const Result& q, int row, const std::string& run_id, int step_col, int first,
                      v1::MetricPoint* point) {
  point->set_run_id(run_id);
  point->set_step(q.Int(row, step_col));
  point->set_loss(q.Double(row, first));
  point->set_lr(q.Double(row, first + 1));
  point->set_tokens_per_s(q.Double(row, first + 2));
  point->set_grad_norm(q.Double(row, first + 3));
}

class PostgresStore : public Store {
 public:
  explicit PostgresStore(std::unique_ptr<Connection> db) : db_(std::move(db)) {}

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
        return Status::Error("CreateSweep: run '" + run.id() + "' has sweep_id '" + run.sweep_id() +
                             "'; it must be the sweep's id '" + sweep.id() + "'");
      }
      if (!ids.insert(run.id()).second) {
        return Status::Error("CreateSweep: duplicate id '" + run.id() +
                             "' within the submitted sweep; ids must be unique");
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      std::string blob;
      KEEL_RETURN_IF_ERROR(Serialize(sweep, &blob));
      // ON CONFLICT DO NOTHING: an existing id inserts no row (and returns
      // none), so the error can name it without a failed, aborted statement.
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec(
          "INSERT INTO sweeps(id, state, created_unix_ms, proto) VALUES($1, $2, $3, $4) "
          "ON CONFLICT (id) DO NOTHING RETURNING seq",
          Params().Text(sweep.id()).Int(sweep.state()).Int(sweep.created_unix_ms()).Bytes(blob), &r));
      if (r.rows() == 0) {
        return Status::Error("CreateSweep: duplicate id: sweep '" + sweep.id() + "' already exists");
      }
      // The runs in statements of kRowsPerStatement rows; VALUES rows are
      // inserted in list order, so their seq follows the sweep's order.
      for (size_t first = 0; first < runs.size(); first += kRowsPerStatement) {
        const size_t n = std::min(kRowsPerStatement, runs.size() - first);
        Params params;
        for (size_t i = first; i < first + n; ++i) {
          KEEL_RETURN_IF_ERROR(Serialize(runs[i], &blob));
          params.Text(runs[i].id()).Text(runs[i].sweep_id()).Int(runs[i].state()).Bytes(blob);
        }
        KEEL_RETURN_IF_ERROR(db_->Exec("INSERT INTO runs(id, sweep_id, state, proto) VALUES " +
                                           Placeholders(n, {"text", "text", "bigint", "bytea"}) +
                                           " ON CONFLICT (id) DO NOTHING RETURNING id",
                                       params, &r));
        if (static_cast<size_t>(r.rows()) != n) {
          std::set<std::string> inserted;
          for (int row = 0; row < r.rows(); ++row) inserted.insert(r.Text(row, 0));
          for (size_t i = first; i < first + n; ++i) {
            if (inserted.count(runs[i].id()) == 0) {
              return Status::Error("CreateSweep: duplicate id: run '" + runs[i].id() + "' already exists");
            }
          }
        }
      }
      return Status::Ok();
    });
  }

  Status GetSweep(const std::string& id, v1::Sweep* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [&]() { return GetById("sweeps", "sweep", id, out); });
  }

  Status ListSweeps(std::vector<v1::Sweep>* out) override { return ListTable("sweeps", out); }

  Status UpdateSweep(const v1::Sweep& sweep) override {
    KEEL_RETURN_IF_ERROR(RequireId(sweep.id(), "UpdateSweep: sweep"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      std::string blob;
      KEEL_RETURN_IF_ERROR(Serialize(sweep, &blob));
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec(
          "UPDATE sweeps SET state = $1, created_unix_ms = $2, proto = $3 WHERE id = $4 RETURNING seq",
          Params().Int(sweep.state()).Int(sweep.created_unix_ms()).Bytes(blob).Text(sweep.id()), &r));
      if (r.rows() == 0) return NotFoundError("sweep", sweep.id());
      return Status::Ok();
    });
  }

  Status GetRun(const std::string& id, v1::Run* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [&]() { return GetById("runs", "run", id, out); });
  }

  Status ListRuns(const std::string& sweep_id, std::vector<v1::Run>* out) override {
    if (sweep_id.empty()) return ListTable("runs", out);
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_.get(), false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("sweeps", "sweep", sweep_id));
      Result r;
      KEEL_RETURN_IF_ERROR(
          db_->Exec("SELECT proto FROM runs WHERE sweep_id = $1 ORDER BY seq", Params().Text(sweep_id), &r));
      return ReadAll(r, 0, out);
    });
  }

  Status ListRunsInState(v1::RunState state, std::vector<v1::Run>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_.get(), false, [&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(
          db_->Exec("SELECT proto FROM runs WHERE state = $1 ORDER BY seq", Params().Int(state), &r));
      return ReadAll(r, 0, out);
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
    // A step given twice in the batch stores its last point (one statement
    // may not change a row twice).
    std::map<std::pair<std::string, int64_t>, size_t> last;
    for (size_t i = 0; i < points.size(); ++i) last[{points[i].run_id(), points[i].step()}] = i;
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      // Check each run once, for an error that names it (the foreign key
      // would only name the constraint).
      std::set<std::string> runs;
      for (const v1::MetricPoint& p : points) runs.insert(p.run_id());
      for (const std::string& run : runs) KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run));
      std::vector<size_t> order;
      for (const auto& entry : last) order.push_back(entry.second);
      std::string blob;
      for (size_t first = 0; first < order.size(); first += kRowsPerStatement) {
        const size_t n = std::min(kRowsPerStatement, order.size() - first);
        Params params;
        for (size_t i = first; i < first + n; ++i) {
          const v1::MetricPoint& p = points[order[i]];
          KEEL_RETURN_IF_ERROR(Serialize(p, &blob));
          params.Text(p.run_id()).Int(p.step()).Bytes(blob);
          params.Double(p.loss()).Double(p.lr()).Double(p.tokens_per_s()).Double(p.grad_norm());
        }
        KEEL_RETURN_IF_ERROR(db_->Exec(
            "INSERT INTO metrics(run_id, step, proto, loss, lr, tokens_per_s, grad_norm) VALUES " +
                Placeholders(n, {"text", "bigint", "bytea", "float8", "float8", "float8", "float8"}) +
                " ON CONFLICT (run_id, step) DO UPDATE SET proto = excluded.proto, loss = excluded.loss, "
                "lr = excluded.lr, tokens_per_s = excluded.tokens_per_s, grad_norm = excluded.grad_norm",
            params));
      }
      return Status::Ok();
    });
  }

  Status GetMetrics(const std::string& run_id, int max_points, std::vector<v1::MetricPoint>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_.get(), false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      Result r;
      std::vector<int64_t> steps;
      bool all = true;
      if (max_points > 0) KEEL_RETURN_IF_ERROR(DownsampledSteps(run_id, max_points, INT64_MIN, &steps, &all));
      if (all) {
        KEEL_RETURN_IF_ERROR(
            db_->Exec("SELECT proto FROM metrics WHERE run_id = $1 ORDER BY step", Params().Text(run_id), &r));
        return ReadAll(r, 0, out);
      }
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT proto FROM metrics WHERE run_id = $1 AND step = ANY($2) ORDER BY step",
                                     Params().Text(run_id).IntArray(steps), &r));
      return ReadAll(r, 0, out);
    });
  }

  Status GetMetricsPage(const std::string& run_id, int max_points, bool omit_json, const PageRequest& page,
                        std::vector<v1::MetricPoint>* out, PageResult* result) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    *result = PageResult();
    return InTransaction(db_.get(), false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      // Columns: step, proto or the four numbers. One row past the page tells
      // whether more follow.
      const std::string columns = omit_json ? "step, loss, lr, tokens_per_s, grad_norm" : "step, proto";
      const int64_t limit = static_cast<int64_t>(page.max_items) + 1;
      Result r;
      std::vector<int64_t> steps;
      bool all = true;
      if (max_points > 0) KEEL_RETURN_IF_ERROR(DownsampledSteps(run_id, max_points, page.after, &steps, &all));
      if (all) {
        // The primary key (run_id, step) starts the scan at `after`.
        KEEL_RETURN_IF_ERROR(db_->Exec("SELECT " + columns +
                                           " FROM metrics WHERE run_id = $1 AND step > $2 ORDER BY step LIMIT $3",
                                       Params().Text(run_id).Int(page.after).Int(limit), &r));
      } else {
        // The same points as GetMetrics' downsampling, from `after` on.
        KEEL_RETURN_IF_ERROR(db_->Exec("SELECT " + columns +
                                           " FROM metrics WHERE run_id = $1 AND step = ANY($2) ORDER BY step LIMIT $3",
                                       Params().Text(run_id).IntArray(steps).Int(limit), &r));
      }
      int64_t bytes = 0;
      for (int row = 0; row < r.rows(); ++row) {
        v1::MetricPoint point;
        if (omit_json) {  // from the columns: no record is parsed
          PointFromColumns(r, row, run_id, 0, 1, &point);
        }
        const int64_t size = omit_json ? static_cast<int64_t>(point.ByteSizeLong()) : r.Bytes(row, 1);
        if (PageFull(page, out->size(), bytes, size)) {
          result->more = true;
          break;
        }
        if (!omit_json) KEEL_RETURN_IF_ERROR(r.Parse(row, 1, &point));
        out->push_back(std::move(point));
        bytes += size;
        result->last = r.Int(row, 0);
      }
      return Status::Ok();
    });
  }

  Status LastMetric(const std::string& run_id, v1::MetricPoint* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT proto FROM metrics WHERE run_id = $1 ORDER BY step DESC LIMIT 1",
                                     Params().Text(run_id), &r));
      if (r.rows() == 0) return NotFoundError("last metric of run", run_id);
      return r.Parse(0, 0, out);
    });
  }

  Status DeleteMetricsAfter(const std::string& run_id, int64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      return db_->Exec("DELETE FROM metrics WHERE run_id = $1 AND step > $2", Params().Text(run_id).Int(step));
    });
  }

  Status AppendEvent(const v1::Event& event) override { return AppendEvents({event}); }

  Status AppendEvents(const std::vector<v1::Event>& events) override { return UpdateRunsWithEvents({}, events); }

  Status ListEvents(const std::string& run_id, const std::string& sweep_id, std::vector<v1::Event>* out) override {
    PageRequest all;
    all.max_items = INT32_MAX;
    all.max_bytes = INT64_MAX;
    PageResult result;
    return ListEventsPage(run_id, sweep_id, all, out, &result);
  }

  Status ListEventsPage(const std::string& run_id, const std::string& sweep_id, const PageRequest& page,
                        std::vector<v1::Event>* out, PageResult* result) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    *result = PageResult();
    return InTransaction(db_.get(), false, [&]() -> Status {
      if (!run_id.empty()) KEEL_RETURN_IF_ERROR(RequireExists("runs", "run", run_id));
      if (!sweep_id.empty()) KEEL_RETURN_IF_ERROR(RequireExists("sweeps", "sweep", sweep_id));
      // One statement per filter, each an equality on the leading column of
      // an index ending in seq (events_by_run, events_by_sweep, the primary
      // key), so the scan starts at `after` and stops at the limit.
      Params params;
      std::string sql;
      if (!run_id.empty()) {
        sql = "SELECT seq, proto FROM events WHERE run_id = $1 AND ($2 = '' OR sweep_id = $2) AND seq > $3 ";
        params.Text(run_id).Text(sweep_id);
      } else if (!sweep_id.empty()) {
        sql = "SELECT seq, proto FROM events WHERE sweep_id = $1 AND seq > $2 ";
        params.Text(sweep_id);
      } else {
        sql = "SELECT seq, proto FROM events WHERE seq > $1 ";
      }
      params.Int(page.after);
      sql += "ORDER BY seq";
      // One row past the page tells whether more follow.
      if (page.max_items < INT32_MAX) {
        sql += " LIMIT $" + std::to_string(params.size() + 1);
        params.Int(static_cast<int64_t>(page.max_items) + 1);
      }
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec(sql, params, &r));
      int64_t bytes = 0;
      for (int row = 0; row < r.rows(); ++row) {
        const int64_t size = r.Bytes(row, 1);
        if (PageFull(page, out->size(), bytes, size)) {
          result->more = true;
          break;
        }
        out->emplace_back();
        KEEL_RETURN_IF_ERROR(r.Parse(row, 1, &out->back()));
        bytes += size;
        result->last = r.Int(row, 0);
      }
      return Status::Ok();
    });
  }

  Status UpsertWorker(const v1::Worker& worker) override {
    KEEL_RETURN_IF_ERROR(RequireId(worker.id(), "UpsertWorker: worker"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      std::string blob;
      KEEL_RETURN_IF_ERROR(Serialize(worker, &blob));
      // DO UPDATE keeps the row's seq, so ListWorkers stays in order of first
      // registration.
      return db_->Exec("INSERT INTO workers(id, proto) VALUES($1, $2) "
                       "ON CONFLICT (id) DO UPDATE SET proto = excluded.proto",
                       Params().Text(worker.id()).Bytes(blob));
    });
  }

  Status ListWorkers(std::vector<v1::Worker>* out) override { return ListTable("workers", out); }

  Status GetWorker(const std::string& id, v1::Worker* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [&]() { return GetById("workers", "worker", id, out); });
  }

  Status CheckOwnership() override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [] { return Status::Ok(); });
  }

  Status BeginArtifact(const std::string& run_id, int64_t step, const std::string& manifest, int64_t* id) override {
    KEEL_RETURN_IF_ERROR(RequireId(run_id, "BeginArtifact: run"));
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("INSERT INTO artifacts(run_id, step, manifest, committed) "
                                     "VALUES($1, $2, $3, FALSE) RETURNING id",
                                     Params().Text(run_id).Int(step).Text(manifest), &r));
      if (r.rows() != 1) return Status::Error("store: BeginArtifact returned no id");
      *id = r.Int(0, 0);
      return Status::Ok();
    });
  }

  Status AppendArtifactChunk(int64_t id, int file, int64_t offset, const std::string& data) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(
          db_->Exec("SELECT 1 FROM artifacts WHERE id = $1 AND NOT committed", Params().Int(id), &r));
      if (r.rows() == 0) return NotFoundError("artifact upload", std::to_string(id));
      return db_->Exec("INSERT INTO artifact_chunks(artifact_id, file, byte_offset, data) VALUES($1, $2, $3, $4)",
                       Params().Int(id).Int(file).Int(offset).Bytes(data));
    });
  }

  Status CommitArtifact(int64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT run_id, step FROM artifacts WHERE id = $1 AND NOT committed FOR UPDATE",
                                     Params().Int(id), &r));
      if (r.rows() == 0) return NotFoundError("artifact upload", std::to_string(id));
      // The checkpoint stored for this step before, with its chunks (ON DELETE CASCADE).
      KEEL_RETURN_IF_ERROR(db_->Exec("DELETE FROM artifacts WHERE run_id = $1 AND step = $2 AND committed",
                                     Params().Text(r.Text(0, 0)).Int(r.Int(0, 1))));
      return db_->Exec("UPDATE artifacts SET committed = TRUE WHERE id = $1", Params().Int(id));
    });
  }

  Status DeleteArtifact(int64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() { return db_->Exec("DELETE FROM artifacts WHERE id = $1", Params().Int(id)); });
  }

  Status DeleteUncommittedArtifacts() override {
    std::lock_guard<std::mutex> lock(mu_);
    return WriteTransaction([&]() { return db_->Exec("DELETE FROM artifacts WHERE NOT committed"); });
  }

  Status ListArtifacts(const std::string& run_id, std::vector<StoredArtifact>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_.get(), false, [&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT id, step, manifest FROM artifacts WHERE run_id = $1 AND committed "
                                     "ORDER BY step",
                                     Params().Text(run_id), &r));
      for (int i = 0; i < r.rows(); ++i) out->push_back({r.Int(i, 0), r.Int(i, 1), r.Text(i, 2)});
      return Status::Ok();
    });
  }

  Status ReadArtifactChunk(int64_t id, int file, int64_t offset, std::string* data) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT data FROM artifact_chunks WHERE artifact_id = $1 AND file = $2 AND "
                                     "byte_offset = $3",
                                     Params().Int(id).Int(file).Int(offset), &r));
      if (r.rows() == 0) {
        return NotFoundError("chunk of artifact " + std::to_string(id) + " file " + std::to_string(file) + " at byte",
                             std::to_string(offset));
      }
      *data = r.Text(0, 0);
      return Status::Ok();
    });
  }

  Status Counts(int64_t* sweeps, int64_t* runs, int64_t* metric_points) override {
    std::lock_guard<std::mutex> lock(mu_);
    return InTransaction(db_.get(), false, [&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT (SELECT COUNT(*) FROM sweeps), (SELECT COUNT(*) FROM runs), "
                                     "(SELECT COUNT(*) FROM metrics)",
                                     Params(), &r));
      if (r.rows() != 1) return Status::Error("store: Counts returned no row");
      if (sweeps != nullptr) *sweeps = r.Int(0, 0);
      if (runs != nullptr) *runs = r.Int(0, 1);
      if (metric_points != nullptr) *metric_points = r.Int(0, 2);
      return Status::Ok();
    });
  }

 private:
  // UpdateRuns' and AppendEvents' statements, with mu_ held inside a write transaction.
  Status UpdateRunsIn(const std::vector<v1::Run>& runs) {
    // A run given twice ends as its last copy, as with one UPDATE after another.
    std::map<std::string, size_t> last;
    for (size_t i = 0; i < runs.size(); ++i) last[runs[i].id()] = i;
    std::vector<size_t> order;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (last[runs[i].id()] == i) order.push_back(i);
    }
    std::string blob;
    for (size_t first = 0; first < order.size(); first += kRowsPerStatement) {
      const size_t n = std::min(kRowsPerStatement, order.size() - first);
      Params params;
      for (size_t i = first; i < first + n; ++i) {
        const v1::Run& run = runs[order[i]];
        KEEL_RETURN_IF_ERROR(Serialize(run, &blob));
        params.Text(run.id()).Text(run.sweep_id()).Int(run.state()).Bytes(blob);
      }
      // Only rows whose id and sweep_id both match change; fewer rows than
      // runs means a run is missing or names another sweep.
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec(
          "UPDATE runs SET state = v.state, proto = v.proto FROM (VALUES " +
              Placeholders(n, {"text", "text", "bigint", "bytea"}) +
              ") AS v(id, sweep_id, state, proto) WHERE runs.id = v.id AND runs.sweep_id = v.sweep_id "
              "RETURNING runs.id",
          params, &r));
      if (static_cast<size_t>(r.rows()) != n) return ExplainUpdateRunsFailure(runs);
    }
    return Status::Ok();
  }

  Status AppendEventsIn(const std::vector<v1::Event>& events) {
    std::string blob;
    for (size_t first = 0; first < events.size(); first += kRowsPerStatement) {
      const size_t n = std::min(kRowsPerStatement, events.size() - first);
      Params params;
      for (size_t i = first; i < first + n; ++i) {
        KEEL_RETURN_IF_ERROR(Serialize(events[i], &blob));
        params.Int(static_cast<int64_t>(i)).TextOrNull(events[i].run_id()).TextOrNull(events[i].key()).Bytes(blob);
      }
      const std::string values =
          "(VALUES " + Placeholders(n, {"bigint", "text", "text", "bytea"}) + ") AS v(ord, run_id, key, proto)";
      // The first event (in batch order) whose run does not exist.
      Result missing;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT v.run_id FROM " + values +
                                         " WHERE v.run_id IS NOT NULL AND NOT EXISTS "
                                         "(SELECT 1 FROM runs WHERE runs.id = v.run_id) ORDER BY v.ord LIMIT 1",
                                     params, &missing));
      if (missing.rows() > 0) return NotFoundError("run", missing.Text(0, 0));
      // Each event filed under its run's sweep; inserted in batch order, so
      // their seq is the order given. A keyed event already stored (a
      // worker's re-send) is skipped.
      KEEL_RETURN_IF_ERROR(db_->Exec("INSERT INTO events(run_id, sweep_id, key, proto) "
                                     "SELECT v.run_id, runs.sweep_id, v.key, v.proto FROM " +
                                         values + " LEFT JOIN runs ON runs.id = v.run_id ORDER BY v.ord "
                                         "ON CONFLICT (key) DO NOTHING",
                                     params));
    }
    return Status::Ok();
  }

  // Every record of `table`, in the order they were first stored (takes mu_).
  template <typename Msg>
  Status ListTable(const std::string& table, std::vector<Msg>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    out->clear();
    return InTransaction(db_.get(), false, [&]() -> Status {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT proto FROM " + table + " ORDER BY seq", Params(), &r));
      return ReadAll(r, 0, out);
    });
  }

  // Helpers below run with mu_ held, inside a transaction. `table` is always
  // one of the literal table names above, never user input.
  Status RequireExists(const std::string& table, const std::string& kind, const std::string& id) {
    Result r;
    KEEL_RETURN_IF_ERROR(db_->Exec("SELECT 1 FROM " + table + " WHERE id = $1", Params().Text(id), &r));
    return r.rows() > 0 ? Status::Ok() : NotFoundError(kind, id);
  }

  Status GetById(const std::string& table, const std::string& kind, const std::string& id,
                 google::protobuf::Message* out) {
    Result r;
    KEEL_RETURN_IF_ERROR(db_->Exec("SELECT proto FROM " + table + " WHERE id = $1", Params().Text(id), &r));
    if (r.rows() == 0) return NotFoundError(kind, id);
    return r.Parse(0, 0, out);
  }

  // The steps GetMetrics keeps of `run_id`'s points when max_points > 0,
  // those above `after` only.
  // *all: the run has no more than max_points points (*out is then empty: the
  // caller reads them by key instead).
  Status DownsampledSteps(const std::string& run_id, int max_points, int64_t after, std::vector<int64_t>* out,
                          bool* all) {
    out->clear();
    Result r;
    KEEL_RETURN_IF_ERROR(
        db_->Exec("SELECT COUNT(*) FROM metrics WHERE run_id = $1", Params().Text(run_id), &r));
    const int64_t n = r.Int(0, 0);
    const int64_t m = max_points;
    *all = n <= m;
    if (*all) return Status::Ok();
    // Only the steps are read (the primary key), never the records.
    KEEL_RETURN_IF_ERROR(
        db_->Exec("SELECT step FROM metrics WHERE run_id = $1 ORDER BY step", Params().Text(run_id), &r));
    if (r.rows() != n) return Status::Error("store: run '" + run_id + "' changed while read");
    for (int64_t k = 0; k < m; ++k) {
      const int64_t i = DownsampledIndex(k, n, m);
      const int64_t step = r.Int(static_cast<int>(i), 0);
      if (step > after) out->push_back(step);
    }
    return Status::Ok();
  }

  // UpdateRuns changed fewer rows than it was given: the error for the first
  // run (in the order given) that is missing or names another sweep.
  Status ExplainUpdateRunsFailure(const std::vector<v1::Run>& runs) {
    for (const v1::Run& run : runs) {
      Result r;
      KEEL_RETURN_IF_ERROR(db_->Exec("SELECT sweep_id FROM runs WHERE id = $1", Params().Text(run.id()), &r));
      if (r.rows() == 0) return NotFoundError("run", run.id());
      if (r.Text(0, 0) != run.sweep_id()) {
        return Status::Error("UpdateRun: run '" + run.id() + "' has sweep_id '" + run.sweep_id() +
                             "' but belongs to sweep '" + r.Text(0, 0) + "'; a run's sweep_id never changes");
      }
    }
    return Status::Error("UpdateRuns: fewer runs changed than given, yet every run exists in its sweep");
  }

  template <typename Msg>
  static Status ReadAll(const Result& r, int col, std::vector<Msg>* out) {
    out->reserve(out->size() + static_cast<size_t>(r.rows()));
    for (int row = 0; row < r.rows(); ++row) {
      out->emplace_back();
      KEEL_RETURN_IF_ERROR(r.Parse(row, col, &out->back()));
    }
    return Status::Ok();
  }

  // A write transaction, timed from BEGIN to its synced COMMIT for the observer.
  template <typename Body>
  Status WriteTransaction(Body body) {
    const auto start = std::chrono::steady_clock::now();
    Status status = InTransaction(db_.get(), true, body);
    if (write_observer_) {
      write_observer_(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return status;
  }

  // mu_ serialises every method: the one connection db_ and its transaction
  // state are used by one thread at a time.
  std::mutex mu_;
  std::function<void(double)> write_observer_;  // guarded by mu_
  const std::unique_ptr<Connection> db_;
};

// ---- Schema versions -----------------------------------------------------------------

// The schema version of the database (0 when it has no schema_version table:
// a new, empty database).
Status ReadSchemaVersion(Connection* db, int64_t* version) {
  *version = 0;
  Result r;
  KEEL_RETURN_IF_ERROR(db->Exec("SELECT to_regclass('schema_version') IS NOT NULL", Params(), &r));
  if (r.rows() == 0 || !r.Bool(0, 0)) return Status::Ok();
  KEEL_RETURN_IF_ERROR(db->Exec("SELECT MAX(version) FROM schema_version", Params(), &r));
  if (r.rows() > 0 && !r.IsNull(0, 0)) *version = r.Int(0, 0);
  return Status::Ok();
}

Status CreateV1(Connection* db) { return db->ExecScript(kSchemaV1); }

// Version 2: a metric point's numbers get columns of their own (nullable, as
// in SQLite, though PostgreSQL stores a NaN as NaN) and a covering index, so
// that a listing without the json lines parses no records. Existing points
// get them from their stored records.
Status MigrateV1ToV2(Connection* db) {
  KEEL_RETURN_IF_ERROR(db->Exec(
      "ALTER TABLE metrics ADD COLUMN loss DOUBLE PRECISION, ADD COLUMN lr DOUBLE PRECISION, "
      "ADD COLUMN tokens_per_s DOUBLE PRECISION, ADD COLUMN grad_norm DOUBLE PRECISION"));
  KEEL_RETURN_IF_ERROR(db->Exec(
      "CREATE INDEX metrics_numbers ON metrics(run_id, step) INCLUDE (loss, lr, tokens_per_s, grad_norm)"));
  // The old points, a run at a time so that a large store is not read whole.
  Result runs;
  KEEL_RETURN_IF_ERROR(db->Exec("SELECT DISTINCT run_id FROM metrics", Params(), &runs));
  for (int i = 0; i < runs.rows(); ++i) {
    const std::string run_id = runs.Text(i, 0);
    Result r;
    KEEL_RETURN_IF_ERROR(db->Exec("SELECT step, proto FROM metrics WHERE run_id = $1", Params().Text(run_id), &r));
    for (int first = 0; first < r.rows(); first += static_cast<int>(kRowsPerStatement)) {
      const int n = std::min(static_cast<int>(kRowsPerStatement), r.rows() - first);
      Params params;
      for (int row = first; row < first + n; ++row) {
        v1::MetricPoint p;
        KEEL_RETURN_IF_ERROR(r.Parse(row, 1, &p));
        params.Int(r.Int(row, 0)).Double(p.loss()).Double(p.lr()).Double(p.tokens_per_s()).Double(p.grad_norm());
      }
      params.Text(run_id);
      const std::string run_param = "$" + std::to_string(params.size());
      KEEL_RETURN_IF_ERROR(db->Exec(
          "UPDATE metrics SET loss = v.loss, lr = v.lr, tokens_per_s = v.tokens_per_s, grad_norm = v.grad_norm "
          "FROM (VALUES " +
              Placeholders(static_cast<size_t>(n), {"bigint", "float8", "float8", "float8", "float8"}) +
              ") AS v(step, loss, lr, tokens_per_s, grad_norm) WHERE metrics.run_id = " + run_param +
              "::text AND metrics.step = v.step",
          params));
    }
  }
  return Status::Ok();
}

// Version 3: events get their key (Event.key) in a column with a unique index,
// so that a worker's re-sent event is stored once (NULLs, keeld's own events,
// are never equal); and keeld_epoch, one row counting the keelds that took
// the database's lock (the fencing rule, store.h).
Status MigrateV2ToV3(Connection* db) {
  KEEL_RETURN_IF_ERROR(db->Exec("ALTER TABLE events ADD COLUMN key TEXT"));
  KEEL_RETURN_IF_ERROR(db->Exec("CREATE UNIQUE INDEX events_by_key ON events(key)"));
  KEEL_RETURN_IF_ERROR(db->Exec("CREATE TABLE keeld_epoch (epoch BIGINT NOT NULL)"));
  return db->Exec("INSERT INTO keeld_epoch(epoch) VALUES (0)");
}

// Version 4: uploaded checkpoints in the database (keeld --artifact-store db),
// as in store_sqlite.cc: an artifact is an upload until committed; its chunks
// (file index, byte offset, at most 1 MiB each) go with it.
Status MigrateV3ToV4(Connection* db) {
  return db->ExecScript(R"sql(
CREATE TABLE artifacts (
  id BIGSERIAL PRIMARY KEY,
  run_id TEXT NOT NULL,
  step BIGINT NOT NULL,
  manifest TEXT NOT NULL,
  committed BOOLEAN NOT NULL
);
CREATE INDEX artifacts_by_run ON artifacts(run_id, committed, step);
CREATE TABLE artifact_chunks (
  artifact_id BIGINT NOT NULL REFERENCES artifacts(id) ON DELETE CASCADE,
  file BIGINT NOT NULL,
  byte_offset BIGINT NOT NULL,
  data BYTEA NOT NULL,
  PRIMARY KEY (artifact_id, file, byte_offset)
);
)sql");
}

// The schema's history, as in store_sqlite.cc: step i takes a database from
// version to_version - 1 to to_version.
struct Migration {
  int64_t to_version;
  Status (*apply)(Connection* db);
};
constexpr Migration kMigrations[] = {{1, CreateV1}, {2, MigrateV1ToV2}, {3, MigrateV2ToV3}, {4, MigrateV3ToV4}};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kStoreSchemaVersion,
              "one migration step per schema version");

Status Migrate(Connection* db) {
  int64_t version = 0;
  // Refuse a newer schema before changing anything.
  KEEL_RETURN_IF_ERROR(ReadSchemaVersion(db, &version));
  KEEL_RETURN_IF_ERROR(CheckSchemaVersion(db->redacted(), version));
  if (version == kStoreSchemaVersion) return Status::Ok();
  // Older versions (0: a new database) are upgraded in place, one step at a
  // time, inside one transaction (PostgreSQL's DDL is transactional): a
  // failure leaves the database as it was. keeld's advisory lock keeps other
  // keelds out meanwhile.
  return InTransaction(db, true, [&]() -> Status {
    KEEL_RETURN_IF_ERROR(ReadSchemaVersion(db, &version));
    KEEL_RETURN_IF_ERROR(CheckSchemaVersion(db->redacted(), version));
    if (version == 0) {
      KEEL_RETURN_IF_ERROR(db->Exec("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)"));
      KEEL_RETURN_IF_ERROR(db->Exec(
          "INSERT INTO schema_version(version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version)"));
    }
    for (const Migration& step : kMigrations) {
      if (step.to_version <= version) continue;
      KEEL_RETURN_IF_ERROR(step.apply(db));
      version = step.to_version;
    }
    return db->Exec("UPDATE schema_version SET version = $1", Params().Int(version));
  });
}

}  // namespace

Status OpenPostgresStore(const std::string& url, const PostgresStoreOptions& options, std::unique_ptr<Store>* out) {
  if (url.empty()) return Status::InvalidArgument("OpenPostgresStore: url is empty; give postgresql://user@host:port/db");
  auto db = std::make_unique<Connection>(url, options);
  KEEL_RETURN_IF_ERROR(db->Connect());
  KEEL_RETURN_IF_ERROR(Migrate(db.get()));
  KEEL_RETURN_IF_ERROR(db->TakeEpoch());
  out->reset(new PostgresStore(std::move(db)));
  return Status::Ok();
}

Status OpenPostgresStore(const std::string& url, std::unique_ptr<Store>* out, int lock_wait_ms) {
  PostgresStoreOptions options;
  options.lock_wait_ms = lock_wait_ms;
  return OpenPostgresStore(url, options, out);
}

}  // namespace keel
