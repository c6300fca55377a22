// Store: keeld's persistent state (sweeps, runs, metric points, events,
// workers) behind one interface, so that SQLite (the default, store_sqlite.cc)
// and PostgreSQL (store_postgres.cc) are interchangeable; keeld picks one with
// --store (ParseStoreLocation, OpenStore below).
//
// Contract shared by every implementation:
// - Records are the keel.proto messages; a stored record reads back equal to
//   the message that was written.
// - Each method is one transaction. A write is durable (committed and synced)
//   before the method returns OK: keeld acknowledges nothing that a crash of
//   keeld (kill -9) or of the machine could lose. A failed method changes
//   nothing.
// - Methods are thread-safe: an implementation serialises them on one mutex
//   per Store object.
// - Errors are Status values whose message names the record, the id and what
//   was wrong. A missing record gives a message of the form
//   "<kind> '<id>' not found" (e.g. "sweep 'sw1' not found"); test for it with
//   IsNotFound(), never by matching the text elsewhere.
#ifndef KEEL_SERVER_STORE_H_
#define KEEL_SERVER_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"

namespace keel {

// True when `status` failed because the record it asked for does not exist
// (its code is StatusCode::kNotFound).
bool IsNotFound(const Status& status);

// Builds the NotFound error for a record: "<kind> '<id>' not found".
Status NotFoundError(const std::string& kind, const std::string& id);

// Which page of a listing a paged read returns: the items whose key (a
// metric point's step, an event's stored position) is greater than `after`,
// at most max_items of them, and no more once their serialized records reach
// max_bytes (but always at least one item when any remains).
struct PageRequest {
  int64_t after = INT64_MIN;       // INT64_MIN: from the first item
  int max_items = 1000;
  int64_t max_bytes = 2 << 20;
};

struct PageResult {
  int64_t last = 0;                // key of the last item returned (unset when none)
  bool more = false;               // items remain after this page
};

class Store {
 public:
  virtual ~Store() = default;

  // ---- Sweeps and their runs -------------------------------------------------

  // Inserts `sweep` and all of its `runs`, all or nothing. Ids must be
  // non-empty and unique (no sweep or run with the same id may exist, and the
  // batch may not repeat one: the error names the duplicate id). Every run's
  // sweep_id must equal sweep.id().
  virtual Status CreateSweep(const v1::Sweep& sweep, const std::vector<v1::Run>& runs) = 0;
  virtual Status GetSweep(const std::string& id, v1::Sweep* out) = 0;
  // All sweeps in creation order.
  virtual Status ListSweeps(std::vector<v1::Sweep>* out) = 0;
  // Replaces the stored sweep with the same id (NotFound when there is none).
  virtual Status UpdateSweep(const v1::Sweep& sweep) = 0;

  virtual Status GetRun(const std::string& id, v1::Run* out) = 0;
  // Runs of `sweep_id` (all runs when empty) in creation order; NotFound when
  // sweep_id names no sweep.
  virtual Status ListRuns(const std::string& sweep_id, std::vector<v1::Run>* out) = 0;
  // Runs now in `state`, in creation order.
  virtual Status ListRunsInState(v1::RunState state, std::vector<v1::Run>* out) = 0;
  // Replaces the stored run with the same id (NotFound when there is none).
  // A run's sweep_id never changes: a different one is an error.
  virtual Status UpdateRun(const v1::Run& run) = 0;
  // UpdateRun for each run, in one transaction: all or nothing.
  virtual Status UpdateRuns(const std::vector<v1::Run>& runs) = 0;
  // UpdateRuns(runs) and AppendEvents(events) in one transaction: all or
  // nothing (keeld stores a run's new state together with the event that
  // tells of it).
  virtual Status UpdateRunsWithEvents(const std::vector<v1::Run>& runs, const std::vector<v1::Event>& events) = 0;

  // ---- Metrics -----------------------------------------------------------------

  // Stores the points in one transaction. Idempotent on (run_id, step): a point
  // for a step already stored replaces the earlier one (a run restarted from a
  // checkpoint re-sends its steps). Every run_id must name a stored run.
  virtual Status AppendMetrics(const std::vector<v1::MetricPoint>& points) = 0;
  // The points of `run_id` in ascending step order. When max_points > 0 and
  // there are more points than that, returns exactly max_points of them,
  // chosen deterministically: the first and the last point and points evenly
  // spaced by index in between (point i of n for i = round(k*(n-1)/(m-1)),
  // k = 0..m-1). max_points == 1 returns only the last point. NotFound when the
  // run does not exist; an existing run without points gives an empty list.
  virtual Status GetMetrics(const std::string& run_id, int max_points,
                            std::vector<v1::MetricPoint>* out) = 0;
  // One page of GetMetrics: the points with step > page.after, in ascending
  // step order, taken from the downsampling of all the run's points when
  // max_points > 0 (the same choice as GetMetrics). result->last is the step
  // of the last point returned. Without downsampling a page costs O(page)
  // (the (run_id, step) key); with it, one pass over the run's steps.
  // omit_json: the points come without their json line, and the byte
  // budget counts them so.
  virtual Status GetMetricsPage(const std::string& run_id, int max_points, bool omit_json,
                                const PageRequest& page, std::vector<v1::MetricPoint>* out,
                                PageResult* result) = 0;
  // The point with the highest step of `run_id` (NotFound when it has none).
  virtual Status LastMetric(const std::string& run_id, v1::MetricPoint* out) = 0;
  // Deletes the points of `run_id` with step > `step` (a rollback to `step`).
  virtual Status DeleteMetricsAfter(const std::string& run_id, int64_t step) = 0;

  // ---- Events --------------------------------------------------------------------

  // Appends an event. A non-empty run_id must name a stored run; the event is
  // then also filed under that run's sweep. An empty run_id is a keeld-level
  // event (listed only when both filters are empty). An event with a non-empty
  // key that is already stored (a worker's re-send) is skipped: OK, nothing
  // changes.
  virtual Status AppendEvent(const v1::Event& event) = 0;
  // AppendEvent for each event, in one transaction (one fsync for a batch such
  // as cancelling a 10,000-run sweep): all or nothing.
  virtual Status AppendEvents(const std::vector<v1::Event>& events) = 0;
  // Events in insertion order, filtered by run_id and/or sweep_id (an empty
  // filter matches everything). NotFound when a filter names no run / sweep.
  virtual Status ListEvents(const std::string& run_id, const std::string& sweep_id,
                            std::vector<v1::Event>* out) = 0;
  // One page of ListEvents: the events stored after position page.after, in
  // order. result->last is the position of the last event returned (the
  // `after` of the next page); positions only grow, so events appended
  // between pages come after every page already read. Costs O(page): the
  // filters and the position are answered by an index.
  virtual Status ListEventsPage(const std::string& run_id, const std::string& sweep_id,
                                const PageRequest& page, std::vector<v1::Event>* out,
                                PageResult* result) = 0;

  // ---- Workers -------------------------------------------------------------------

  // Inserts the worker or replaces the stored one with the same id.
  virtual Status UpsertWorker(const v1::Worker& worker) = 0;
  // All workers in order of first registration.
  virtual Status ListWorkers(std::vector<v1::Worker>* out) = 0;
  virtual Status GetWorker(const std::string& id, v1::Worker* out) = 0;

  // ---- Artifacts ---------------------------------------------------------------------
  // Checkpoints workers upload, kept in the database when keeld runs with
  // --artifact-store db (artifact_store.h), so that a keeld on another host
  // (a standby taking over) serves them. An artifact is one checkpoint of one
  // run and step: its MANIFEST text (checkpoint_transfer.h FormatManifest) and
  // its files' bytes as the chunks that arrived. It is an upload, listed by
  // nobody, until CommitArtifact.

  struct StoredArtifact {
    int64_t id = 0;
    int64_t step = 0;
    std::string manifest;
  };
  // Starts an upload of run_id's checkpoint at `step`; *id names it. The run
  // need not be stored (the artifact store checks uploads against keeld's runs).
  virtual Status BeginArtifact(const std::string& run_id, int64_t step, const std::string& manifest,
                               int64_t* id) = 0;
  // Stores the bytes of file `file` (its index in the manifest) at `offset`.
  virtual Status AppendArtifactChunk(int64_t id, int file, int64_t offset, const std::string& data) = 0;
  // Makes upload `id` its run's checkpoint of its step, in one transaction
  // with deleting the one stored for that step before (if any). NotFound when
  // `id` names no upload.
  virtual Status CommitArtifact(int64_t id) = 0;
  // Deletes an upload or a committed artifact, with its chunks (none: OK).
  virtual Status DeleteArtifact(int64_t id) = 0;
  // Deletes every upload never committed (keeld's start: they were cut off).
  virtual Status DeleteUncommittedArtifacts() = 0;
  // The committed artifacts of run_id, ascending by step.
  virtual Status ListArtifacts(const std::string& run_id, std::vector<StoredArtifact>* out) = 0;
  // The chunk of file `file` of artifact `id` stored at `offset`: NotFound
  // when there is none (the reader asks for the offsets that were stored).
  virtual Status ReadArtifactChunk(int64_t id, int file, int64_t offset, std::string* data) = 0;

  // ---- Export ----------------------------------------------------------------------

  // Totals for the Prometheus exporter; any pointer may be null.
  // Called with the seconds each write transaction took (BEGIN to synced
  // COMMIT), on the writing thread; for keeld's store latency histogram.
  virtual void SetWriteObserver(std::function<void(double)> observer) = 0;
  virtual Status Counts(int64_t* sweeps, int64_t* runs, int64_t* metric_points) = 0;

  // ---- Ownership -------------------------------------------------------------------

  // OK while this Store may still write its database as the only keeld doing
  // so. PostgreSQL: one round trip on the session that holds keeld's lock
  // (reconnecting as any method does, under the fencing rule of
  // OpenPostgresStore); once fenced, every method fails. SQLite: always OK
  // (one keeld per state directory is the kernel's flock).
  virtual Status CheckOwnership() { return Status::Ok(); }
};

// The schema version this build writes and reads (the `schema_version` table,
// one row, in both backends). Each backend keeps an ordered list of migration
// steps, step v taking a store from version v-1 to v; opening a store applies
// the missing steps in one transaction (a new store runs them all).
// 1: the first released schema (sweeps, runs, metrics, events, workers).
// 2: metric points' loss, lr, tokens_per_s and grad_norm also have columns of
//    their own, filled from the stored records when a version 1 store is
//    upgraded.
// 3: events have a `key` column (Event.key) with a unique index: an event
//    whose key is already stored is not stored again. PostgreSQL also gets
//    `keeld_epoch`, one row counting the times a keeld took the database's
//    lock (the fencing rule: OpenPostgresStore).
// 4: artifacts and artifact_chunks: uploaded checkpoints kept in the
//    database (keeld --artifact-store db).
constexpr int kStoreSchemaVersion = 4;

// Opens the SQLite store at `path`, creating the file and its schema when
// missing, and upgrading an older schema in place (one transaction). The
// database runs in WAL mode with synchronous=FULL (a commit survives kill -9
// and power loss) and foreign keys on. Refuses a file whose schema version is
// newer than kStoreSchemaVersion (written by a newer keeld) and changes
// nothing in it. On success *out owns the store; the file stays open until the
// Store is destroyed. Open one Store per file per process.
Status OpenSqliteStore(const std::string& path, std::unique_ptr<Store>* out);

// Opens the PostgreSQL store in the database that `url` names (a libpq
// connection URI: postgresql://user[:password]@host[:port]/db[?param=value],
// e.g. postgresql://keel@db.example:5432/keel; ?host=/dir reaches a unix
// socket in /dir). The database must exist; the schema is created in it when
// missing and upgraded in place when older (one transaction), and a newer one
// is refused with nothing changed, as for SQLite. Every commit waits for the
// server's WAL flush (synchronous_commit=on for keeld's connection).
// One Store per database: the connection holds a session advisory lock, and
// a second Store (another keeld) waiting more than lock_wait_ms for it is
// refused with an error saying so. Errors name the URL with any password
// replaced by "***".
//
// The fencing rule. PostgreSQL drops a session's advisory lock with the
// session, so the lock means "this keeld writes" only while that session
// lives. Each time a Store takes the lock it adds 1 to keeld_epoch and keeps
// the number. A dropped connection is reopened at the next method call, and
// the Store writes again only when it gets the lock back within lock_wait_ms
// AND keeld_epoch still holds its number (no other keeld took the lock
// meanwhile). Otherwise the Store is fenced: that method and every later one
// fail with FailedPrecondition ("fenced: ..."), and on_fenced is called once.
// A write committed on the lock's session was therefore made while no other
// keeld could write.
struct PostgresStoreOptions {
  // How long to wait for the lock when another session holds it; < 0: until it
  // is free (a standby keeld) or *stop.
  int lock_wait_ms = 10000;
  // While waiting with lock_wait_ms < 0, polled every 100 ms: true ends the
  // wait with an error (keeld's SIGTERM).
  const std::atomic<bool>* stop = nullptr;
  // The session's application_name (pg_stat_activity): how another keeld's
  // messages name this one, e.g. "keeld 10.0.0.5:7070 (pid 1234)".
  std::string application_name;
  // Called once, when the lock is found held by another session, with that
  // session's application_name ("" when not known).
  std::function<void(const std::string& holder)> on_waiting;
  // Called once, on the thread whose method found the Store fenced, with the
  // error; keeld exits there (see keeld_main.cc).
  std::function<void(const Status& why)> on_fenced;
};
Status OpenPostgresStore(const std::string& url, const PostgresStoreOptions& options,
                         std::unique_ptr<Store>* out);
Status OpenPostgresStore(const std::string& url, std::unique_ptr<Store>* out,
                         int lock_wait_ms = 10000);

// `url` with the password (user:PASSWORD@ or password=...) replaced by "***",
// for messages and logs.
std::string RedactStoreUrl(const std::string& url);

// Where a store lives, as keeld's --store flag names it.
struct StoreLocation {
  enum class Kind { kSqlite, kPostgres };
  Kind kind = Kind::kSqlite;
  std::string target;  // the SQLite file, or the PostgreSQL URL
};

// Parses a --store value: "sqlite:PATH" or a plain PATH is SQLite at PATH;
// "postgresql://..." or "postgres://..." is PostgreSQL (the URL checked by
// libpq's parser, nothing connected). Anything else (an empty value or path,
// another scheme, a URL libpq cannot parse) is InvalidField("--store", ...)
// naming the value and the forms allowed.
Status ParseStoreLocation(const std::string& value, StoreLocation* out);

// Opens the store at `location` (OpenSqliteStore or OpenPostgresStore).
Status OpenStore(const StoreLocation& location, std::unique_ptr<Store>* out);

}  // namespace keel

#endif  // KEEL_SERVER_STORE_H_
