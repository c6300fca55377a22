// keeld's logic (see coordinator.h).
#include "server/coordinator.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "proto/event_kinds.h"
#include "proto/gpu_share.h"
#include "proto/status_grpc.h"
#include "server/scheduler.h"
#include "worker/config/run_config.h"
#include "worker/config/scheme.h"
#include "worker/run/step_metrics.h"
#include "worker/run/trainer_exit.h"

#include <yaml-cpp/yaml.h>

namespace keel {
namespace {

bool Terminal(v1::RunState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED || s == v1::DIVERGED;
}

bool Active(v1::RunState s) { return s == v1::ASSIGNED || s == v1::RUNNING; }

// Whether `worker` holds the run or, for a gang, one of its parts.
bool OnWorker(const v1::Run& run, const std::string& worker) {
  if (run.worker_id() == worker) return true;
  for (const v1::RunPart& p : run.parts()) {
    if (p.worker_id() == worker) return true;
  }
  return false;
}

// The GPUs the run holds on `worker` (a gang: its part's there).
std::vector<int32_t> GpusOn(const v1::Run& run, const std::string& worker) {
  std::vector<int32_t> gpus;
  if (run.parts_size() == 0) {
    if (run.worker_id() == worker) gpus.assign(run.device_indices().begin(), run.device_indices().end());
    return gpus;
  }
  for (const v1::RunPart& p : run.parts()) {
    if (p.worker_id() == worker) gpus.insert(gpus.end(), p.device_indices().begin(), p.device_indices().end());
  }
  return gpus;
}

// Data-parallel ranks of a run: one per GPU, else one per CPU slot.
int32_t RanksOf(const v1::Run& run) { return run.gpus() > 0 ? run.gpus() : std::max(1, run.cpu_slots()); }

// "0,1" for GPUs {0, 1}.
std::string GpuList(const std::vector<int32_t>& gpus) {
  std::string text;
  for (int32_t g : gpus) text += (text.empty() ? "" : ",") + std::to_string(g);
  return text;
}

// The CPU slots the run holds on `worker` (a gang: its part's ranks there).
int CpuSlotsOn(const v1::Run& run, const std::string& worker) {
  if (run.gpus() > 0) return 0;
  if (run.parts_size() == 0) return run.worker_id() == worker ? std::max(1, run.cpu_slots()) : 0;
  int slots = 0;
  for (const v1::RunPart& p : run.parts()) slots += p.worker_id() == worker ? p.ranks() : 0;
  return slots;
}

// The listing position of a sweep: the number NewId gave it (creation order,
// unlike the id's text: "sweep-10" < "sweep-9"), then the id.
std::pair<uint64_t, std::string> SweepKey(const std::string& id) {
  const size_t dash = id.rfind('-');
  const uint64_t n = dash == std::string::npos ? 0 : std::strtoull(id.c_str() + dash + 1, nullptr, 10);
  return {n, id};
}

// page_size 0: the default; above the cap: the cap; negative: refused.
grpc::Status PageSize(int32_t requested, int default_size, int cap, int* out) {
  if (requested < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "page_size: " + std::to_string(requested) + " is not allowed (>= 0; 0 = the default " +
                            std::to_string(default_size) + "; values above " + std::to_string(cap) +
                            " are clamped to it)");
  }
  *out = requested == 0 ? default_size : std::min<int>(requested, cap);
  return grpc::Status::OK;
}

// Page tokens are "<listing>/<filters>/<key>": the listing and its filters
// (so a token of another RPC or filter is refused) and the sort key of the
// last item returned. Clients treat them as opaque.
grpc::Status BadToken(const std::string& token, const std::string& listing) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "page_token: '" + token + "' is not a page token of " + listing +
                          "; allowed: empty (the first page) or the next_page_token of the previous page of "
                          "the same listing (same RPC, same filters)");
}

// NOT_FOUND for a sweep or run that keeld does not know ("run 'run-7' not found").
grpc::Status NotFound(const std::string& what, const std::string& id) {
  return grpc::Status(grpc::StatusCode::NOT_FOUND, what + " '" + id + "' not found");
}

// Whether a page of `items` items and `bytes` bytes ends before the next item
// (`size` bytes): it holds `limit` items, or that item would take it past
// kPageBytes. A page always takes its first item, however large.
bool PageFull(int items, int limit, int64_t bytes, int64_t size) {
  return items > 0 && (items >= limit || bytes + size > kPageBytes);
}

// The key of `token` after `prefix` when it has that prefix and the rest is
// an integer (>= min).
bool TokenKey(const std::string& token, const std::string& prefix, int64_t min, int64_t* key) {
  if (token.compare(0, prefix.size(), prefix) != 0 || token.size() == prefix.size()) return false;
  const std::string rest = token.substr(prefix.size());
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(rest.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || !(rest[0] == '-' || std::isdigit(static_cast<unsigned char>(rest[0]))) || v < min)
    return false;
  *key = v;
  return true;
}

}  // namespace

// ---- Subscription ----------------------------------------------------------------

bool Subscription::Next(int timeout_ms, std::vector<v1::WatchUpdate>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return closed_ || !updates_.empty(); });
  out->assign(updates_.begin(), updates_.end());
  updates_.clear();
  return !(closed_ && out->empty());
}

void Subscription::Push(const v1::WatchUpdate& update) {
  std::lock_guard<std::mutex> lock(mu_);
  if (updates_.size() < 100000) updates_.push_back(update);  // a stalled watcher cannot eat keeld's memory
  cv_.notify_all();
}

void Subscription::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

// ---- Setup ---------------------------------------------------------------------------

Coordinator::Coordinator(std::unique_ptr<Store> store, CoordinatorOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

Coordinator::~Coordinator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : subscribers_) s.second->Close();
}

int64_t Coordinator::Now() const {
  if (options_.now_ms) return options_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status Coordinator::Open(std::unique_ptr<Store> store, CoordinatorOptions options,
                         std::unique_ptr<Coordinator>* out) {
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(store), std::move(options)));
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    KEEL_RETURN_IF_ERROR(c->Load());
  }
  *out = std::move(c);
  return Status::Ok();
}

Status Coordinator::Load() {
  std::vector<v1::Sweep> sweeps;
  KEEL_RETURN_IF_ERROR(store_->ListSweeps(&sweeps));
  for (const v1::Sweep& s : sweeps) sweeps_[s.id()] = s;
  std::vector<v1::Run> runs;
  KEEL_RETURN_IF_ERROR(store_->ListRuns("", &runs));
  for (const v1::Run& r : runs) runs_[r.id()] = r;
  for (const auto& s : sweeps_) {
    sweep_order_.insert(SweepKey(s.first));
    sweep_runs_[s.first];
  }
  for (auto& r : runs_) IndexRun(&r.second);
  for (auto& s : sweep_runs_) {
    std::stable_sort(s.second.begin(), s.second.end(),
                     [](const v1::Run* a, const v1::Run* b) { return a->index() < b->index(); });
  }
  std::vector<v1::Worker> workers;
  KEEL_RETURN_IF_ERROR(store_->ListWorkers(&workers));
  const int64_t grace = Now() + options_.lease_ms;
  for (v1::Worker& w : workers) {
    w.set_connected(false);
    WorkerState& state = workers_[w.id()];
    state.record = w;
    state.lease_expires_ms = grace;  // a lease to come back and re-attach its runs
  }
  // Ids stay unique across restarts: continue after the largest counter used.
  for (const auto& r : runs_) {
    size_t dash = r.first.rfind('-');
    if (dash != std::string::npos) id_counter_ = std::max<uint64_t>(id_counter_, std::strtoull(r.first.c_str() + dash + 1, nullptr, 10));
  }
  for (const auto& s : sweeps_) {
    size_t dash = s.first.rfind('-');
    if (dash != std::string::npos) id_counter_ = std::max<uint64_t>(id_counter_, std::strtoull(s.first.c_str() + dash + 1, nullptr, 10));
  }
  for (const auto& w : workers_) {
    size_t dash = w.first.rfind('-');
    if (dash != std::string::npos) id_counter_ = std::max<uint64_t>(id_counter_, std::strtoull(w.first.c_str() + dash + 1, nullptr, 10));
  }
  return Status::Ok();
}

void Coordinator::IndexRun(v1::Run* run) { sweep_runs_[run->sweep_id()].push_back(run); }

v1::Sweep Coordinator::SweepWithCounts(const v1::Sweep& sweep) {
  v1::Sweep out = sweep;
  out.clear_runs_by_state();
  const std::vector<v1::Run*>& runs = sweep_runs_[sweep.id()];
  for (const v1::Run* r : runs) ++(*out.mutable_runs_by_state())[v1::RunState_Name(r->state())];
  out.set_runs_total(static_cast<int32_t>(runs.size()));
  return out;
}

std::string Coordinator::NewId(const std::string& prefix) { return prefix + "-" + std::to_string(++id_counter_); }

grpc::Status Coordinator::FromStatus(const Status& status) const {
  return ToGrpcStatus(status);
}

void Coordinator::Publish(const v1::WatchUpdate& update, const std::string& run_id, const std::string& sweep_id) {
  for (auto& s : subscribers_) {
    if (s.first == run_id || s.first == sweep_id) s.second->Push(update);
  }
}

// Stores a run's new state with an event (SaveRuns for one run).
Status Coordinator::SaveRun(v1::Run* run, const std::string& event_kind, const std::string& message) {
  std::vector<v1::Run> one = {*run};
  KEEL_RETURN_IF_ERROR(SaveRuns(&one, event_kind, message));
  *run = one[0];
  return Status::Ok();
}

Status Coordinator::SaveRuns(std::vector<v1::Run>* runs, const std::string& event_kind, const std::string& message) {
  if (runs->empty()) return Status::Ok();
  const int64_t now = Now();
  for (v1::Run& run : *runs) run.set_updated_unix_ms(now);
  std::vector<v1::Event> events;
  if (!event_kind.empty()) {
    for (const v1::Run& run : *runs) {
      v1::Event e;
      e.set_run_id(run.id());
      e.set_step(run.step());
      e.set_unix_ms(now);
      e.set_kind(event_kind);
      e.set_message(message);
      (*e.mutable_details())["state"] = v1::RunState_Name(run.state());
      events.push_back(std::move(e));
    }
  }
  KEEL_RETURN_IF_ERROR(store_->UpdateRunsWithEvents(*runs, events));
  for (const v1::Run& run : *runs) {
    if (Terminal(run.state())) live_[run.id()].ended_unix_ms = now;
    runs_[run.id()] = run;
    if (!Active(run.state())) bootstrap_ids_.erase(run.id());
    progress_dirty_.erase(run.id());
    v1::WatchUpdate update;
    *update.mutable_run() = run;
    Publish(update, run.id(), run.sweep_id());
  }
  for (const v1::Event& e : events) {
    v1::WatchUpdate event_update;
    *event_update.mutable_event() = e;
    Publish(event_update, e.run_id(), runs_[e.run_id()].sweep_id());
  }
  return Status::Ok();
}

// ---- Users -------------------------------------------------------------------------------

grpc::Status Coordinator::SubmitSweep(const v1::SweepSpec& spec, v1::SubmitSweepResponse* out) {
  SweepPlan plan;
  const std::string source = spec.source().empty() ? "sweep.yaml" : spec.source();
  Status s = ExpandSweep(spec.yaml(), source, options_.limits, &plan);
  if (!s.ok()) return ToGrpcStatus(s);  // InvalidArgument: the sweep file's problems, one per line
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sweep_id = NewId("sweep");
  const uint64_t first_run = id_counter_ + 1;
  id_counter_ += plan.runs.size();
  v1::Sweep sweep;
  std::vector<v1::Run> runs;
  PlanToMessages(plan, sweep_id, [&](int i) { return "run-" + std::to_string(first_run + i); }, Now(), &sweep,
                 &runs);
  sweep.set_max_concurrent(plan.max_concurrent);
  sweep.set_max_restarts(plan.max_restarts);
  sweep.set_priority(plan.priority);
  sweep.set_gpus(plan.gpus);
  sweep.set_cpu_slots(plan.cpu_slots);
  sweep.set_hosts(plan.hosts);
  sweep.set_gpus_per_host(plan.gpus_per_host);
  sweep.set_gpu_milli(plan.gpu_milli);
  sweep.set_gpu_memory_bytes(plan.gpu_memory_bytes);
  sweep.mutable_policy()->set_yaml(plan.policy_yaml);
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].set_gpus(plan.gpus);
    runs[i].set_cpu_slots(plan.gpus > 0 ? 0 : plan.cpu_slots);
    runs[i].set_hosts(plan.hosts);
    runs[i].set_gpus_per_host(plan.gpus_per_host);
    runs[i].set_gpu_milli(plan.gpu_milli);
    runs[i].set_gpu_memory_bytes(plan.gpu_memory_bytes);
    runs[i].set_priority(plan.priority);
    runs[i].set_max_restarts(plan.max_restarts);
    runs[i].set_index(static_cast<int32_t>(i));
  }
  s = store_->CreateSweep(sweep, runs);
  if (!s.ok()) return FromStatus(s);
  sweeps_[sweep_id] = sweep;
  sweep_order_.insert(SweepKey(sweep_id));
  sweep_runs_[sweep_id].reserve(runs.size());
  for (const v1::Run& r : runs) IndexRun(&(runs_[r.id()] = r));
  *out->mutable_sweep() = sweep;
  for (const v1::Run& r : runs) *out->add_runs() = r;
  Schedule();
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetSweep(const std::string& id, v1::Sweep* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sweeps_.find(id);
  if (it == sweeps_.end()) return NotFound("sweep", id);
  *out = SweepWithCounts(it->second);
  return grpc::Status::OK;
}

grpc::Status Coordinator::ListSweeps(const v1::ListSweepsRequest& request, v1::ListSweepsResponse* out) {
  int limit = 0;
  grpc::Status status = PageSize(request.page_size(), kDefaultRunsPage, kMaxRunsPage, &limit);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sweep_order_.begin();
  if (!request.page_token().empty()) {
    // "sweeps/<last sweep id>"
    const std::string prefix = "sweeps/";
    const std::string last = request.page_token().substr(std::min(prefix.size(), request.page_token().size()));
    if (request.page_token().compare(0, prefix.size(), prefix) != 0 || !sweeps_.count(last)) {
      return BadToken(request.page_token(), "ListSweeps");
    }
    it = sweep_order_.upper_bound(SweepKey(last));
  }
  int64_t bytes = 0;
  for (; it != sweep_order_.end(); ++it) {
    v1::Sweep sweep = SweepWithCounts(sweeps_[it->second]);
    const int64_t size = static_cast<int64_t>(sweep.ByteSizeLong());
    if (PageFull(out->sweeps_size(), limit, bytes, size)) {
      out->set_next_page_token("sweeps/" + out->sweeps(out->sweeps_size() - 1).id());
      break;
    }
    bytes += size;
    *out->add_sweeps() = std::move(sweep);
  }
  return grpc::Status::OK;
}

grpc::Status Coordinator::CancelSweep(const std::string& id, v1::Sweep* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sweeps_.find(id);
  if (it == sweeps_.end()) return NotFound("sweep", id);
  // Queued runs end CANCELLED together: one transaction for all of them, not
  // two synced commits per run (20,000 fsyncs for a 10,000-run sweep).
  std::vector<v1::Run> queued;
  for (const v1::Run* r : sweep_runs_[id]) {
    if (Terminal(r->state())) continue;
    if (Active(r->state())) {
      Status s = Cancel(*r);
      if (!s.ok()) return FromStatus(s);
      continue;
    }
    queued.push_back(*r);
    queued.back().set_state(v1::CANCELLED);
    queued.back().set_message("cancelled by the user");
  }
  Status s = SaveRuns(&queued, event_kind::kState, "cancelled by the user");
  if (!s.ok()) return FromStatus(s);
  v1::Sweep sweep = it->second;
  sweep.set_state(v1::SWEEP_CANCELLED);
  s = store_->UpdateSweep(sweep);
  if (!s.ok()) return FromStatus(s);
  it->second = sweep;
  *out = SweepWithCounts(sweep);
  return grpc::Status::OK;
}

grpc::Status Coordinator::ListRuns(const v1::ListRunsRequest& request, v1::ListRunsResponse* out) {
  int limit = 0;
  grpc::Status status = PageSize(request.page_size(), kDefaultRunsPage, kMaxRunsPage, &limit);
  if (!status.ok()) return status;
  const std::string& filter = request.sweep_id();
  std::lock_guard<std::mutex> lock(mu_);
  if (!filter.empty() && !sweeps_.count(filter)) {
    return NotFound("sweep", filter);
  }
  // Walk the ordered index from the page's first position; copy only the page.
  auto sweep = filter.empty() ? sweep_order_.begin() : sweep_order_.find(SweepKey(filter));
  int64_t after_index = -1;  // in *sweep: runs with a greater index
  if (!request.page_token().empty()) {
    // "runs/<filter>/<sweep of the last run>/<its index>"
    const std::string& token = request.page_token();
    const std::string prefix = "runs/" + filter + "/";
    const size_t slash = token.rfind('/');
    int64_t index = 0;
    const std::string last_sweep =
        slash != std::string::npos && slash > prefix.size() ? token.substr(prefix.size(), slash - prefix.size()) : "";
    if (last_sweep.empty() || !sweeps_.count(last_sweep) || (!filter.empty() && last_sweep != filter) ||
        !TokenKey(token, prefix + last_sweep + "/", 0, &index)) {
      return BadToken(token, filter.empty() ? "ListRuns of all runs" : "ListRuns of sweep '" + filter + "'");
    }
    sweep = sweep_order_.find(SweepKey(last_sweep));
    after_index = index;
  }
  int64_t bytes = 0;
  for (; sweep != sweep_order_.end(); ++sweep, after_index = -1) {
    if (!filter.empty() && sweep->second != filter) break;
    const std::vector<v1::Run*>& runs = sweep_runs_[sweep->second];
    auto r = std::upper_bound(runs.begin(), runs.end(), after_index,
                              [](int64_t index, const v1::Run* run) { return index < run->index(); });
    for (; r != runs.end(); ++r) {
      const int64_t size = static_cast<int64_t>((*r)->ByteSizeLong());
      if (PageFull(out->runs_size(), limit, bytes, size)) {
        const v1::Run& last = out->runs(out->runs_size() - 1);
        out->set_next_page_token("runs/" + filter + "/" + last.sweep_id() + "/" + std::to_string(last.index()));
        return grpc::Status::OK;
      }
      bytes += size;
      *out->add_runs() = **r;
    }
  }
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetRun(const std::string& id, v1::Run* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(id);
  if (it == runs_.end()) return NotFound("run", id);
  *out = it->second;
  return grpc::Status::OK;
}

Status Coordinator::Cancel(v1::Run run) {
  if (Active(run.state())) {
    // The trainer checkpoints and exits; that exit (or the worker's lost lease)
    // makes the run CANCELLED.
    run.set_cancel_requested(true);
    KEEL_RETURN_IF_ERROR(SaveRun(&run, "", ""));  // stored, so a keeld restart keeps the request
    CancelOnWorkers(run, "");  // a gang: every part's ranks stop after the same step
    return Status::Ok();
  }
  run.set_state(v1::CANCELLED);
  run.set_message("cancelled by the user");
  return SaveRun(&run, event_kind::kState, "cancelled by the user");
}

grpc::Status Coordinator::CancelRun(const std::string& id, v1::Run* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(id);
  if (it == runs_.end()) return NotFound("run", id);
  v1::Run run = it->second;
  if (Terminal(run.state())) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "run '" + id + "' already ended (" + v1::RunState_Name(run.state()) + ")");
  }
  Status s = Cancel(run);
  if (!s.ok()) return FromStatus(s);
  FinishSweepIfDone(run.sweep_id());
  *out = runs_[id];
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetMetrics(const v1::GetMetricsRequest& request, v1::GetMetricsResponse* out) {
  if (request.max_points() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "max_points: " + std::to_string(request.max_points()) + " is not allowed (>= 0; 0 = all)");
  }
  PageRequest page;
  grpc::Status status = PageSize(request.page_size(), kDefaultPointsPage, kMaxPointsPage, &page.max_items);
  if (!status.ok()) return status;
  page.max_bytes = kPageBytes;
  // "points/<run>/<max_points>/<step of the last point>"
  const std::string prefix = "points/" + request.run_id() + "/" + std::to_string(request.max_points()) +
                             (request.omit_json() ? "/nojson/" : "/");
  if (!request.page_token().empty() && !TokenKey(request.page_token(), prefix, INT64_MIN, &page.after)) {
    return BadToken(request.page_token(), "GetMetrics of run '" + request.run_id() + "' with max_points " +
                                              std::to_string(request.max_points()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!runs_.count(request.run_id())) {
      return NotFound("run", request.run_id());
    }
    FlushMetrics();  // every point received before this call is read
  }
  std::vector<v1::MetricPoint> points;
  PageResult result;
  Status s = store_->GetMetricsPage(request.run_id(), request.max_points(), request.omit_json(), page, &points,
                                    &result);
  if (!s.ok()) return FromStatus(s);
  out->mutable_points()->Reserve(static_cast<int>(points.size()));
  for (v1::MetricPoint& p : points) *out->add_points() = std::move(p);
  if (result.more) out->set_next_page_token(prefix + std::to_string(result.last));
  return grpc::Status::OK;
}

grpc::Status Coordinator::ListEvents(const v1::ListEventsRequest& request, v1::ListEventsResponse* out) {
  PageRequest page;
  grpc::Status status = PageSize(request.page_size(), kDefaultEventsPage, kMaxEventsPage, &page.max_items);
  if (!status.ok()) return status;
  page.max_bytes = kPageBytes;
  // "events/<run>/<sweep>/<stored position of the last event>"
  const std::string prefix = "events/" + request.run_id() + "/" + request.sweep_id() + "/";
  if (!request.page_token().empty() && !TokenKey(request.page_token(), prefix, 0, &page.after)) {
    return BadToken(request.page_token(), "ListEvents of run '" + request.run_id() + "' and sweep '" +
                                              request.sweep_id() + "'");
  }
  // No mu_: events are written to the store before they are published.
  std::vector<v1::Event> events;
  PageResult result;
  Status s = store_->ListEventsPage(request.run_id(), request.sweep_id(), page, &events, &result);
  if (!s.ok()) return FromStatus(s);
  out->mutable_events()->Reserve(static_cast<int>(events.size()));
  for (v1::Event& e : events) *out->add_events() = std::move(e);
  if (result.more) out->set_next_page_token(prefix + std::to_string(result.last));
  return grpc::Status::OK;
}

grpc::Status Coordinator::Intervene(const v1::InterveneRequest& request, v1::InterveneResponse* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(request.run_id());
  if (it == runs_.end()) return NotFound("run", request.run_id());
  if (request.precision().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "precision: empty (a preset name, e.g. bf16)");
  }
  PrecisionScheme scheme;
  Status s = SchemeFromName(request.precision(), &scheme);  // a preset, or one + "+bf16_head"
  if (!s.ok()) return ToGrpcStatus(s);
  if (request.rollback_steps() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "rollback_steps: " + std::to_string(request.rollback_steps()) + " is not allowed (>= 0)");
  }
  v1::Run run = it->second;
  if (!Active(run.state())) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "run '" + run.id() + "' is " + v1::RunState_Name(run.state()) + ", not running");
  }
  v1::Event e;
  e.set_run_id(run.id());
  e.set_step(run.step());
  e.set_unix_ms(Now());
  // The request; the trainer's own switch_precision / rollback events follow
  // when it has acted on it.
  e.set_kind(event_kind::kInterventionRequested);
  e.set_message("requested by the user: switch to " + request.precision() +
                (request.rollback_steps() > 0 ? " after rolling back " + std::to_string(request.rollback_steps()) + " steps" : "") +
                (request.reason().empty() ? "" : " (" + request.reason() + ")"));
  (*e.mutable_details())["precision"] = request.precision();
  (*e.mutable_details())["rollback_steps"] = std::to_string(request.rollback_steps());
  (*e.mutable_details())["from"] = run.precision();
  s = store_->AppendEvent(e);
  if (!s.ok()) return FromStatus(s);
  v1::WorkerCommand c;
  if (request.rollback_steps() > 0) {
    c.mutable_rollback()->set_run_id(run.id());
    c.mutable_rollback()->set_steps(request.rollback_steps());
    c.mutable_rollback()->set_precision(request.precision());
    c.mutable_rollback()->set_reason(request.reason());
  } else {
    c.mutable_switch_precision()->set_run_id(run.id());
    c.mutable_switch_precision()->set_precision(request.precision());
    c.mutable_switch_precision()->set_reason(request.reason());
  }
  SendToWorker(run.worker_id(), c);
  v1::WatchUpdate update;
  *update.mutable_event() = e;
  Publish(update, run.id(), run.sweep_id());
  *out->mutable_event() = e;
  return grpc::Status::OK;
}

grpc::Status Coordinator::ListWorkers(v1::ListWorkersResponse* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : workers_) {
    v1::Worker record = w.second.record;
    record.clear_run_ids();
    for (const auto& r : runs_) {
      if (Active(r.second.state()) && OnWorker(r.second, w.first)) record.add_run_ids(r.first);
    }
    for (v1::Device& d : *record.mutable_devices()) {
      d.clear_run_id();
      for (const auto& r : runs_) {
        if (!Active(r.second.state())) continue;
        for (int32_t g : GpusOn(r.second, w.first)) {
          // Fractional runs share a GPU: all their ids, comma-separated.
          if (g == d.index()) d.set_run_id(d.run_id().empty() ? r.first : d.run_id() + "," + r.first);
        }
      }
    }
    record.set_lease_expires_unix_ms(w.second.lease_expires_ms);
    *out->add_workers() = record;
  }
  return grpc::Status::OK;
}

grpc::Status Coordinator::Watch(const std::string& id, std::shared_ptr<Subscription>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool is_run = runs_.count(id) > 0;
  if (!is_run && !sweeps_.count(id)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "'" + id + "' is neither a run nor a sweep");
  }
  auto sub = std::make_shared<Subscription>();
  for (const auto& r : runs_) {
    if (r.first == id || r.second.sweep_id() == id) {
      v1::WatchUpdate u;
      *u.mutable_run() = r.second;
      sub->Push(u);
    }
  }
  subscribers_.emplace_back(id, sub);
  *out = sub;
  return grpc::Status::OK;
}

void Coordinator::Unwatch(const std::shared_ptr<Subscription>& subscription) {
  std::lock_guard<std::mutex> lock(mu_);
  subscribers_.erase(std::remove_if(subscribers_.begin(), subscribers_.end(),
                                    [&](const auto& s) { return s.second == subscription; }),
                     subscribers_.end());
}

// ---- Workers ------------------------------------------------------------------------------

grpc::Status Coordinator::RegisterWorker(const v1::RegisterRequest& request, v1::RegisterResponse* out) {
  if (request.devices_size() == 0 && request.cpu_slots() <= 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "cpu_slots: " + std::to_string(request.cpu_slots()) + " with no devices (offer GPUs or >= 1 CPU slot)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = request.worker_id();
  if (id.empty() || !workers_.count(id)) id = NewId("worker");
  WorkerState& w = workers_[id];
  w.record.set_id(id);
  w.record.set_host(request.host());
  w.record.clear_devices();
  for (const v1::Device& d : request.devices()) *w.record.add_devices() = d;
  w.record.set_cpu_slots(request.devices_size() > 0 ? 0 : request.cpu_slots());
  w.lease_expires_ms = Now() + options_.lease_ms;
  Status s = store_->UpsertWorker(w.record);
  if (!s.ok()) return FromStatus(s);
  // Live runs that are still this worker's current attempt stay with it; the
  // others were given away while it was gone (lease expired, requeued): it must
  // stop their trainers, so that a run never has two live attempts.
  std::set<std::string> live;
  for (const v1::LiveRun& l : request.live_runs()) {
    auto run = runs_.find(l.run_id());
    if (run != runs_.end() && OnWorker(run->second, id) && Active(run->second.state()) &&
        run->second.attempt() == l.attempt()) {
      live.insert(l.run_id());
    } else {
      out->add_stop_run_ids(l.run_id());
    }
  }
  // Runs this worker had but no longer runs (it restarted) go back to the queue.
  ReleaseWorkerRuns(id, live, "worker " + id + " came back without it");
  out->set_worker_id(id);
  out->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  out->set_lease_ms(options_.lease_ms);
  return grpc::Status::OK;
}

grpc::Status Coordinator::AttachWorker(const std::string& worker_id,
                                       std::function<bool(const v1::WorkerCommand&)> send,
                                       std::function<void()> close, uint64_t* stream_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "worker '" + worker_id + "' is not registered");
  }
  // A stream still attached belongs to an earlier connection of this worker.
  if (it->second.send) DropWorkerStream(&it->second, "a newer stream of this worker replaced it");
  it->second.send = std::move(send);
  it->second.close = std::move(close);
  it->second.stream_id = ++stream_counter_;
  *stream_id = it->second.stream_id;
  it->second.record.set_connected(true);
  it->second.lease_expires_ms = Now() + options_.lease_ms;
  store_->UpsertWorker(it->second.record);
  // A gang's bootstrap id relayed while this worker's stream was down (or
  // written into a stream that broke) reaches its ranks now; writing it twice
  // is harmless.
  for (const auto& b : bootstrap_ids_) {
    auto run = runs_.find(b.first);
    if (run == runs_.end() || !Active(run->second.state()) || run->second.attempt() != b.second.first ||
        run->second.worker_id() == worker_id || !OnWorker(run->second, worker_id)) {
      continue;
    }
    v1::WorkerCommand c;
    c.mutable_bootstrap()->set_run_id(b.first);
    c.mutable_bootstrap()->set_id(b.second.second);
    it->second.send(c);
  }
  Schedule();
  return grpc::Status::OK;
}

void Coordinator::DetachWorker(const std::string& worker_id, uint64_t stream_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.stream_id != stream_id) return;
  // Its runs keep their place until the lease runs out: the worker may reconnect.
  it->second.send = nullptr;
  it->second.close = nullptr;
  it->second.record.set_connected(false);
  store_->UpsertWorker(it->second.record);
}

void Coordinator::DropWorkerStream(WorkerState* worker, const std::string& why) {
  if (worker->send) {
    v1::WorkerCommand c;
    c.mutable_reregister()->set_reason(why);
    worker->send(c);
  }
  if (worker->close) worker->close();
  worker->send = nullptr;
  worker->close = nullptr;
  worker->record.set_connected(false);
  store_->UpsertWorker(worker->record);
}

Coordinator::MessageResult Coordinator::HandleWorkerMessage(const std::string& worker_id, uint64_t stream_id, const v1::WorkerMessage& m) {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker_id);
  if (w == workers_.end() || w->second.stream_id != stream_id || !w->second.send) {
    // keeld stopped counting this stream as the worker's (its lease ran out and
    // its runs went back to the queue): nothing on it is applied, not even a
    // heartbeat, until the worker registers again and learns what to stop.
    ++counters_.stale_messages["lease"];
    return MessageResult::kNotTheWorkers;
  }
  w->second.lease_expires_ms = Now() + options_.lease_ms;
  if (!m.has_metric()) FlushMetrics();  // everything before this message is stored first
  // The first store write of this message that failed. The message is then
  // not acknowledged: the stream ends, and the worker re-sends it with
  // everything after it when it reconnects. Each write below is all or nothing
  // and leaves keeld's view unchanged when it fails, so the re-send applies
  // the message whole.
  Status stored = Status::Ok();
  auto note = [&stored](const Status& s) {
    if (!s.ok() && stored.ok()) stored = s;
  };
  // The run a message is about, when the message comes from the run's current
  // attempt on this worker and the run is still active. A message of another
  // attempt (fencing) is refused and counted; a duplicate of the current
  // attempt's after the run ended is ignored.
  auto run_of = [&](const std::string& run_id) -> v1::Run* {
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return nullptr;
    if (m.attempt() != it->second.attempt() || !OnWorker(it->second, worker_id)) {
      ++counters_.stale_messages["attempt"];
      return nullptr;
    }
    if (!Active(it->second.state())) return nullptr;
    return &it->second;
  };
  if (m.has_started()) {
    // Already RUNNING in this attempt: a re-send after a reconnect (perhaps to
    // a standby that took over), whose state event is stored already.
    v1::Run* r = run_of(m.started().run_id());
    if (r != nullptr && r->state() != v1::RUNNING) {
      v1::Run run = *r;
      run.set_state(v1::RUNNING);
      note(SaveRun(&run, event_kind::kState, "trainer started on " + worker_id + " (pid " + std::to_string(m.started().pid()) + ")"));
    }
  } else if (m.has_metric()) {
    if (v1::Run* r = run_of(m.metric().run_id())) AcceptMetric(r, m.metric());
  } else if (m.has_checkpoint()) {
    if (v1::Run* r = run_of(m.checkpoint().run_id())) {
      v1::Run run = *r;
      run.set_checkpoint(m.checkpoint().path());
      note(SaveRun(&run, "", ""));
    }
  } else if (m.has_event()) {
    v1::Event e = m.event();
    // Attempt 0: a note of the worker's own (a command it could not hand on),
    // about no attempt; stored, and changes nothing.
    v1::Run* r = m.attempt() == 0 ? nullptr : run_of(e.run_id());
    if (m.attempt() != 0 && !r) return MessageResult::kApplied;
    if (r) {
      // The trainer acted on an intervention: the run's precision and, after a
      // rollback, its trajectory (points past the restored step are gone).
      v1::Run run = *r;
      auto detail = [&](const char* key) {
        auto it = e.details().find(key);
        return it == e.details().end() ? std::string() : it->second;
      };
      if (e.kind() == event_kind::kRollback && !detail("to_step").empty()) {
        const int64_t to = std::atoll(detail("to_step").c_str());
        FlushMetrics();
        // Points past `to` still buffered (the flush failed) belong to the abandoned trajectory too.
        metric_buffer_.erase(std::remove_if(metric_buffer_.begin(), metric_buffer_.end(),
                                            [&](const v1::MetricPoint& p) {
                                              return p.run_id() == run.id() && p.step() > to;
                                            }),
                             metric_buffer_.end());
        if (counters_.metric_points_unstored > 0)
          counters_.metric_points_unstored = static_cast<int64_t>(metric_buffer_.size());
        note(store_->DeleteMetricsAfter(run.id(), to));
        run.set_step(to);
        live_[run.id()].last_step = to;  // the next point expected is to + 1
        live_[run.id()].rollback_seq = m.seq();
        // The stored checkpoints after `to` are the abandoned trajectory's.
        if (options_.artifacts && run.artifact_step() > to) {
          int64_t newest = 0;
          Status dropped = options_.artifacts->DropAfter(run.id(), to, &newest);
          if (!dropped.ok()) std::fprintf(stderr, "keeld: run %s: %s\n", run.id().c_str(), dropped.message().c_str());
          run.set_artifact_step(newest);
        }
      }
      if (event_kind::ChangesTrajectory(e.kind()) && !detail("precision").empty()) {
        run.set_precision(detail("precision"));
      }
      note(SaveRun(&run, "", ""));
    }
    if (event_kind::IsIntervention(e.kind())) {
      ++counters_.interventions[e.kind()];
      auto rule = e.details().find("rule");
      ++live_[e.run_id()].interventions[{e.kind(), rule == e.details().end() ? "manual" : rule->second}];
    }
    if (runs_.count(e.run_id()) && stored.ok()) {
      note(store_->AppendEvent(e));
      v1::WatchUpdate u;
      *u.mutable_event() = e;
      Publish(u, e.run_id(), runs_[e.run_id()].sweep_id());
    }
  } else if (m.has_bootstrap()) {
    // A gang's rendezvous: rank 0's worker read the id; the other parts wait for it.
    if (v1::Run* r = run_of(m.bootstrap().run_id())) {
      bootstrap_ids_[r->id()] = {r->attempt(), m.bootstrap().id()};
      v1::WorkerCommand c;
      *c.mutable_bootstrap() = m.bootstrap();
      for (const v1::RunPart& p : r->parts()) {
        if (p.worker_id() != worker_id) SendToWorker(p.worker_id(), c);
      }
    }
  } else if (m.has_exit()) {
    v1::Run* gang = run_of(m.exit().run_id());
    const bool other_part = gang != nullptr && gang->parts_size() > 0 && gang->worker_id() != worker_id;
    if (other_part && m.exit().signal() == 0 && trainer_exit::EndedAsRun(m.exit().exit_code())) {
      return MessageResult::kApplied;  // a part without rank 0 ended as the gang does: rank 0's exit tells how
    }
    if (v1::Run* r = gang) {
      v1::Run run = *r;
      CancelOnWorkers(run, worker_id);  // a gang: any part's end ends the others
      run.clear_device_indices();
      const int code = m.exit().exit_code();
      std::string how = m.exit().signal() ? "killed by signal " + std::to_string(m.exit().signal())
                                          : "exit code " + std::to_string(code);
      if (!m.exit().message().empty()) how += ": " + m.exit().message();
      if (run.cancel_requested()) {
        run.set_cancel_requested(false);
        run.set_state(v1::CANCELLED);
        run.set_message("cancelled by the user");
        note(SaveRun(&run, event_kind::kState, "cancelled by the user (" + how + ")"));
      } else if (code == 0 && m.exit().signal() == 0) {
        // Every step up to the last must have arrived; a missing tail is a gap too.
        Live& live = live_[run.id()];
        if (live.last_step >= 0 && live.last_step < run.steps()) {
          ReportGap(run, live.last_step + 1, run.steps(), "the trainer finished, but these steps' metrics never arrived");
        }
        run.set_state(v1::SUCCEEDED);
        run.set_message("");
        note(SaveRun(&run, event_kind::kState, "finished"));
      } else if (code == trainer_exit::kDiverged) {
        // The run's own policy stopped it: restarting would diverge again.
        run.set_state(v1::DIVERGED);
        run.set_message("stopped as diverged by its stability policy");
        note(SaveRun(&run, event_kind::kState, "stopped as diverged by its stability policy"));
        ApplySweepRules(run.sweep_id());
      } else {
        // A configuration error, or the same failure at the same step as the
        // attempt before, will happen again: fail now rather than spend the
        // restarts. Anything else restarts after a backoff.
        const std::string failure = "step " + std::to_string(run.step()) + ": " + how;
        const bool repeated = run.last_failure() == failure;
        run.set_last_failure(failure);
        std::string why = "trainer " + how;
        if (code == trainer_exit::kBadConfig) {
          why += " (a configuration error: a restart cannot fix it)";
        } else if (repeated) {
          why += " (the same failure at the same step as the attempt before: a restart cannot fix it)";
        } else {
          const int64_t backoff = std::min<int64_t>(options_.restart_backoff_ms << std::min(run.restarts(), 16),
                                                    options_.max_restart_backoff_ms);
          run.set_not_before_unix_ms(Now() + backoff);
        }
        note(RequeueOrFail(&run, why, code == trainer_exit::kBadConfig || repeated));
      }
      FinishSweepIfDone(run.sweep_id());
      Schedule();  // its slot is free
    }
  }
  if (!stored.ok()) {
    ++counters_.store_write_errors;
    std::fprintf(stderr, "keeld: storing worker %s's message %lld failed (not acknowledged; the worker re-sends it): %s\n",
                 worker_id.c_str(), static_cast<long long>(m.seq()), stored.message().c_str());
    return MessageResult::kNotStored;
  }
  return MessageResult::kApplied;
}

namespace {

// CheckUpload's rule for one run.
grpc::Status UploadAllowed(const v1::Run& run, const std::string& worker_id, const v1::CheckpointHeader& header) {
  if (header.attempt() != run.attempt() || !OnWorker(run, worker_id)) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "run " + run.id() + ": attempt " + std::to_string(header.attempt()) + " on worker '" +
                            worker_id + "' is not its current attempt (" + std::to_string(run.attempt()) +
                            (run.worker_id().empty() ? "" : " on '" + run.worker_id() + "'") + "): upload refused");
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status Coordinator::CheckUpload(const std::string& worker_id, const v1::CheckpointHeader& header) {
  if (!options_.artifacts) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "keeld has no artifact store");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(header.run_id());
  if (it == runs_.end()) return NotFound("run", header.run_id());
  return UploadAllowed(it->second, worker_id, header);
}

grpc::Status Coordinator::CheckpointUploaded(const std::string& worker_id, const v1::CheckpointHeader& header,
                                             bool* recorded, int64_t* protect) {
  *recorded = false;
  *protect = 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(header.run_id());
  if (it == runs_.end()) return NotFound("run", header.run_id());
  *protect = it->second.artifact_step();
  grpc::Status allowed = UploadAllowed(it->second, worker_id, header);
  if (!allowed.ok()) return allowed;
  if (live_[header.run_id()].rollback_seq > header.notice_seq()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "run " + header.run_id() + ": step " + std::to_string(header.step()) +
                            " was reported before a rollback keeld has applied (an abandoned trajectory): not recorded");
  }
  *recorded = header.step() >= it->second.artifact_step();
  if (header.step() > it->second.artifact_step()) {
    v1::Run run = it->second;
    run.set_artifact_step(header.step());
    Status saved = SaveRun(&run, "", "");
    if (!saved.ok()) return FromStatus(saved);
  }
  *protect = runs_[header.run_id()].artifact_step();
  return grpc::Status::OK;
}

grpc::Status Coordinator::FindArtifact(const std::string& run_id, int64_t step, v1::CheckpointHeader* header) {
  if (!options_.artifacts) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "keeld has no artifact store");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!runs_.count(run_id)) return NotFound("run", run_id);
  }
  if (step < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "step: " + std::to_string(step) + " is not allowed (allowed: 0 for the newest, or a step)");
  }
  return FromStatus(options_.artifacts->Find(run_id, step, header));
}

void Coordinator::AcceptMetric(v1::Run* r, const v1::MetricPoint& point) {
  Live& live = live_[r->id()];
  if (live.last_step < 0) {
    // First point since keeld started: continue from the newest stored one (the
    // stored points are exactly the acknowledged ones; run.step() may lag).
    v1::MetricPoint last;
    live.last_step = store_->LastMetric(r->id(), &last).ok() ? last.step() : 0;
  }
  // Steps arrive in order from one attempt; a resumed attempt sends its steps
  // from the start again (going back is never a gap), a jump forward is one.
  if (point.step() > live.last_step + 1) {
    ReportGap(*r, live.last_step + 1, point.step() - 1, "these steps' metrics never arrived");
  }
  live.last_step = point.step();
  metric_buffer_.push_back(point);
  if (metric_buffer_.size() >= 512) FlushMetrics();
  r->set_step(point.step());
  r->set_loss(point.loss());
  live.metric_json = point.json();
  live.parsed = false;  // parsed by Stats, once, if it is asked for
  // Analytics come on few lines: the latest such line is kept apart, so that a
  // later line without them does not hide them (a substring test, not a parse).
  if (MetricLineHasAnalytics(point.json())) {
    live.analytics_json = point.json();
    live.analytics_parsed = false;
  }
  progress_dirty_.insert(r->id());
  v1::WatchUpdate u;
  *u.mutable_metric() = point;
  Publish(u, r->id(), r->sweep_id());
}

void Coordinator::ReportGap(const v1::Run& run, int64_t first, int64_t last, const std::string& why) {
  const int64_t missing = last - first + 1;
  ++counters_.metric_gaps;
  counters_.metric_points_missing += missing;
  v1::Event e;
  e.set_run_id(run.id());
  e.set_step(first);
  e.set_unix_ms(Now());
  e.set_kind(event_kind::kMetricsGap);
  e.set_message("steps " + std::to_string(first) + ".." + std::to_string(last) + " (" + std::to_string(missing) +
                " points): " + why);
  (*e.mutable_details())["first_step"] = std::to_string(first);
  (*e.mutable_details())["last_step"] = std::to_string(last);
  (*e.mutable_details())["missing"] = std::to_string(missing);
  (*e.mutable_details())["attempt"] = std::to_string(run.attempt());
  std::fprintf(stderr, "keeld: run %s: metrics gap, %s\n", run.id().c_str(), e.message().c_str());
  if (store_->AppendEvent(e).ok()) {
    v1::WatchUpdate u;
    *u.mutable_event() = e;
    Publish(u, run.id(), run.sweep_id());
  }
}

bool Coordinator::SendToWorker(const std::string& worker_id, const v1::WorkerCommand& command) {
  auto w = workers_.find(worker_id);
  return w != workers_.end() && w->second.send && w->second.send(command);
}

void Coordinator::CancelOnWorkers(const v1::Run& run, const std::string& except_worker) {
  std::set<std::string> holders;
  if (!run.worker_id().empty()) holders.insert(run.worker_id());
  for (const v1::RunPart& p : run.parts()) holders.insert(p.worker_id());
  holders.erase(except_worker);
  v1::WorkerCommand c;
  c.mutable_cancel()->set_run_id(run.id());
  for (const std::string& w : holders) SendToWorker(w, c);
}

Status Coordinator::RequeueOrFail(v1::Run* run, const std::string& why, bool deterministic) {
  run->clear_device_indices();
  run->clear_parts();
  if (!deterministic && run->restarts() < run->max_restarts()) {
    run->set_restarts(run->restarts() + 1);
    run->set_state(v1::QUEUED);
    run->set_worker_id("");
    run->set_message(why);
    const int64_t wait = run->not_before_unix_ms() - Now();
    KEEL_RETURN_IF_ERROR(SaveRun(
        run, event_kind::kRestart,
        why + "; restart " + std::to_string(run->restarts()) + " of " + std::to_string(run->max_restarts()) +
            (run->checkpoint().empty() ? " from the beginning" : " from " + run->checkpoint()) +
            (wait > 0 ? " in " + std::to_string(wait) + " ms" : "")));
    ++counters_.restarts;
    return Status::Ok();
  } else {
    run->set_state(v1::FAILED);
    run->set_message(why);
    return SaveRun(run, event_kind::kState,
                   deterministic ? why : why + "; no restarts left (max_restarts " + std::to_string(run->max_restarts()) + ")");
  }
}

void Coordinator::ReleaseWorkerRuns(const std::string& worker_id, const std::set<std::string>& keep,
                                    const std::string& why) {
  std::vector<std::string> ids;
  for (const auto& r : runs_) {
    if (Active(r.second.state()) && OnWorker(r.second, worker_id) && !keep.count(r.first)) ids.push_back(r.first);
  }
  for (const std::string& id : ids) {
    v1::Run run = runs_[id];
    CancelOnWorkers(run, worker_id);  // a gang's other parts cannot go on without this one
    if (run.cancel_requested()) {
      run.set_cancel_requested(false);
      run.set_state(v1::CANCELLED);
      run.set_message("cancelled by the user");
      run.clear_device_indices();
      SaveRun(&run, event_kind::kState, "cancelled by the user (" + why + ")");
    } else {
      Status saved = RequeueOrFail(&run, why);
      if (!saved.ok()) {
        ++counters_.store_write_errors;
        std::fprintf(stderr, "keeld: run %s: storing its release failed: %s\n", run.id().c_str(), saved.message().c_str());
      }
    }
    FinishSweepIfDone(run.sweep_id());
  }
}

void Coordinator::ApplySweepRules(const std::string& sweep_id) {
  auto sweep = sweeps_.find(sweep_id);
  if (sweep == sweeps_.end() || sweep->second.policy().yaml().empty()) return;
  Policy policy;
  try {
    if (!ParsePolicyNode(YAML::Load(sweep->second.policy().yaml()), "sweep " + sweep_id + " policy", &policy).ok()) return;
  } catch (const YAML::Exception&) {
    return;  // validated at submit; nothing sensible to do with a damaged store row
  }
  for (size_t i = 0; i < policy.sweep_rules.size(); ++i) {
    const SweepRule& rule = policy.sweep_rules[i];
    const std::string key = sweep_id + "#" + std::to_string(i);
    if (sweep_rules_applied_.count(key)) continue;
    auto matches = [&](const v1::Run& r) {
      return r.sweep_id() == sweep_id && (rule.scheme == "any" || r.scheme().name() == rule.scheme);
    };
    int diverged = 0;
    for (const auto& r : runs_) diverged += matches(r.second) && r.second.state() == v1::DIVERGED;
    if (diverged < rule.diverged) continue;
    sweep_rules_applied_.insert(key);
    const std::string why = std::to_string(diverged) + " runs of scheme " + rule.scheme + " in sweep " + sweep_id +
                            " diverged (sweep rule " + std::to_string(i) + "): switch the others to " + rule.switch_to;
    std::vector<std::string> ids;
    for (const auto& r : runs_) {
      if (matches(r.second) && !Terminal(r.second.state())) ids.push_back(r.first);
    }
    for (const std::string& id : ids) {
      v1::Run run = runs_[id];
      if (run.state() == v1::QUEUED) {
        // Not started: its spec starts in the new scheme.
        YAML::Node spec = YAML::Load(run.spec().yaml());
        spec["precision"] = rule.switch_to;
        YAML::Emitter e;
        e << spec;
        run.mutable_spec()->set_yaml(e.c_str());
        run.set_precision(rule.switch_to);
        SaveRun(&run, event_kind::kSweepRule, why);
      } else {
        v1::WorkerCommand c;
        c.mutable_switch_precision()->set_run_id(id);
        c.mutable_switch_precision()->set_precision(rule.switch_to);
        c.mutable_switch_precision()->set_reason(why);
        SendToWorker(run.worker_id(), c);
        SaveRun(&run, event_kind::kSweepRule, why);
      }
    }
  }
}

void Coordinator::FinishSweepIfDone(const std::string& sweep_id) {
  auto it = sweeps_.find(sweep_id);
  if (it == sweeps_.end() || it->second.state() != v1::SWEEP_ACTIVE) return;
  for (const auto& r : runs_) {
    if (r.second.sweep_id() == sweep_id && !Terminal(r.second.state())) return;
  }
  v1::Sweep sweep = it->second;
  sweep.set_state(v1::SWEEP_DONE);
  if (store_->UpdateSweep(sweep).ok()) it->second = sweep;
}

void Coordinator::Schedule() {
  std::vector<v1::Run> queued;
  std::map<std::string, int> active;
  const int64_t now = Now();
  for (const auto& r : runs_) {
    // A restarted run waits out its backoff.
    if (r.second.state() == v1::QUEUED && r.second.not_before_unix_ms() <= now) queued.push_back(r.second);
    if (Active(r.second.state())) ++active[r.second.sweep_id()];
  }
  if (queued.empty()) return;
  std::map<std::string, int> limits;
  for (const auto& s : sweeps_) {
    limits[s.first] = s.second.max_concurrent();
    if (s.second.state() == v1::SWEEP_CANCELLED) limits[s.first] = -1;
  }
  std::vector<WorkerCapacity> capacity;
  for (const auto& w : workers_) {
    if (!w.second.send) continue;  // no stream: cannot take work now
    WorkerCapacity c;
    c.worker_id = w.first;
    std::map<int32_t, int64_t> memory;  // device index -> total memory reported
    for (const v1::Device& d : w.second.record.devices()) memory[d.index()] = d.memory_bytes();
    std::set<int32_t> busy;  // held whole (a whole-GPU run or a gang's part)
    std::map<int32_t, SharedGpu> shared;  // held in part by fractional runs
    int cpu_used = 0;
    for (const auto& r : runs_) {
      if (!Active(r.second.state()) || !OnWorker(r.second, w.first)) continue;
      for (int32_t g : GpusOn(r.second, w.first)) {
        if (r.second.gpu_milli() > 0) {
          SharedGpu& s = shared[g];
          s.index = g;
          s.used_milli += r.second.gpu_milli();
          s.used_memory_bytes += ReservedGpuMemory(r.second, memory[g]);
        } else {
          busy.insert(g);
        }
      }
      cpu_used += CpuSlotsOn(r.second, w.first);
    }
    for (const v1::Device& d : w.second.record.devices()) {
      if (busy.count(d.index())) continue;
      auto part = shared.find(d.index());
      if (part == shared.end()) {
        c.free_gpus.push_back(d.index());
      } else {
        c.shared_gpus.push_back(part->second);
      }
    }
    c.gpu_memory_bytes = memory;
    c.total_gpus = w.second.record.devices_size();
    c.free_cpu_slots = std::max(0, w.second.record.cpu_slots() - cpu_used);
    c.total_cpu_slots = w.second.record.cpu_slots();
    capacity.push_back(c);
  }
  for (const Placement& p : keel::Schedule(queued, active, limits, capacity)) {
    v1::Run run = runs_[p.run_id];
    if (limits[run.sweep_id()] < 0) continue;  // its sweep was cancelled
    run.set_state(v1::ASSIGNED);
    run.set_worker_id(p.worker_id);
    run.set_attempt(run.attempt() + 1);  // fencing: messages of older attempts are refused from now on
    run.clear_device_indices();
    for (int32_t g : p.gpus) run.add_device_indices(g);
    run.clear_parts();
    std::string where = p.worker_id + (p.gpus.empty() ? "" : " (GPUs " + GpuList(p.gpus) + ")");
    if (run.gpu_milli() > 0) {
      where = p.worker_id + " (" + GpuShareText(run.gpu_milli()) + " of GPU " + GpuList(p.gpus) + ")";
    }
    if (!p.parts.empty()) {
      where = "a gang of " + std::to_string(p.world) + " ranks:";
      for (const PlacementPart& part : p.parts) {
        v1::RunPart* rp = run.add_parts();
        rp->set_worker_id(part.worker_id);
        rp->set_first_rank(part.first_rank);
        rp->set_ranks(part.ranks);
        for (int32_t g : part.gpus) rp->add_device_indices(g);
        where += " " + part.worker_id + " (ranks " + std::to_string(part.first_rank) + "-" +
                 std::to_string(part.first_rank + part.ranks - 1) +
                 (part.gpus.empty() ? "" : ", GPUs " + GpuList(part.gpus)) + ")";
      }
    }
    if (!SaveRun(&run, event_kind::kState, "assigned to " + where).ok()) continue;
    // One assignment per worker: the whole run, or each part of a gang. A run
    // is one rank per GPU or CPU slot (keel-train --nproc under the worker).
    std::vector<PlacementPart> parts = p.parts;
    if (parts.empty()) parts.push_back({p.worker_id, 0, p.world, p.gpus});
    for (const PlacementPart& part : parts) {
      v1::WorkerCommand c;
      v1::Assignment* a = c.mutable_start();
      a->set_run_id(run.id());
      *a->mutable_spec() = run.spec();
      for (int32_t g : part.gpus) a->add_device_indices(g);
      a->set_resume_checkpoint(run.checkpoint());
      a->set_resume_artifact_step(run.artifact_step());
      a->set_attempt(run.attempt());
      a->set_ranks(part.ranks);
      if (!p.parts.empty()) {
        a->set_first_rank(part.first_rank);
        a->set_world(p.world);
      }
      if (!SendToWorker(part.worker_id, c)) {
        // The stream broke under us: the lease logic requeues the run if the worker is gone.
        std::fprintf(stderr, "keeld: could not send run %s to %s\n", run.id().c_str(), part.worker_id.c_str());
      }
    }
  }
}

void Coordinator::FlushMetrics() {
  if (metric_buffer_.empty()) return;
  Status s = store_->AppendMetrics(metric_buffer_);
  if (!s.ok()) {
    // Kept for the next flush, and not acknowledged meanwhile (MetricsStored):
    // the store writes a batch whole or not at all, so nothing lands twice.
    ++counters_.store_write_errors;
    counters_.metric_points_unstored = static_cast<int64_t>(metric_buffer_.size());
    std::fprintf(stderr, "keeld: storing %zu metric points failed (kept, retried at the next flush): %s\n",
                 metric_buffer_.size(), s.message().c_str());
    return;
  }
  counters_.metric_points += static_cast<int64_t>(metric_buffer_.size());
  counters_.metric_points_unstored = 0;
  metric_buffer_.clear();
}

bool Coordinator::MetricsStored() {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_.metric_points_unstored == 0;
}

void Coordinator::SaveProgress() {
  for (const std::string& id : progress_dirty_) {
    auto it = runs_.find(id);
    if (it != runs_.end()) store_->UpdateRun(it->second);
  }
  progress_dirty_.clear();
}

void Coordinator::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  FlushMetrics();
  const int64_t now = Now();
  for (auto& w : workers_) {
    if (w.second.lease_expires_ms > now) continue;
    bool had_runs = false;
    for (const auto& r : runs_) had_runs |= Active(r.second.state()) && OnWorker(r.second, w.first);
    if (w.second.record.connected() || had_runs || w.second.send) {
      // The worker may only be paused or cut off, and come back: close its
      // stream and order it to register again, where it learns that the runs
      // requeued below are no longer its own and stops their trainers.
      DropWorkerStream(&w.second, "lease expired: no message for " + std::to_string(options_.lease_ms) + " ms");
      ReleaseWorkerRuns(w.first, {}, "worker " + w.first + " lost (no heartbeat for " +
                                         std::to_string(options_.lease_ms) + " ms)");
    }
  }
  if (now - progress_saved_ms_ >= 1000) {
    SaveProgress();
    progress_saved_ms_ = now;
  }
  Schedule();
}

CoordinatorStats Coordinator::Stats(int64_t retention_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  CoordinatorStats s = counters_;
  for (int st = v1::QUEUED; st <= v1::DIVERGED; ++st) s.runs_by_state[v1::RunState_Name(static_cast<v1::RunState>(st))] = 0;
  for (const auto& r : runs_) ++s.runs_by_state[v1::RunState_Name(r.second.state())];
  s.queue_depth = s.runs_by_state["QUEUED"];
  s.sweeps = static_cast<int64_t>(sweeps_.size());
  s.workers_total = static_cast<int64_t>(workers_.size());
  for (const auto& w : workers_) {
    if (!w.second.send) continue;
    ++s.workers_connected;
    s.gpus_total += w.second.record.devices_size();
  }
  const int64_t now = Now();
  std::set<std::pair<std::string, int32_t>> busy_gpus;  // (worker, device) held by an active run
  for (const auto& r : runs_) {
    auto live = live_.find(r.first);
    const bool ended = Terminal(r.second.state());
    // Bounded cardinality: a run's series go away `retention_ms` after it ended
    // (runs that ended before keeld started have no end time here: left out).
    if (ended && (live == live_.end() || live->second.ended_unix_ms == 0 ||
                  now - live->second.ended_unix_ms > retention_ms)) {
      continue;
    }
    RunGauges g;  // the values of the run's latest metric line, then its identity
    if (live != live_.end()) {
      Live& l = live->second;
      // A run's latest line is parsed once, not on every tick.
      MetricLine line;
      if (!l.parsed && !l.metric_json.empty() && ParseMetricLine(l.metric_json, &line).ok()) {
        RunGauges& p = l.gauges;
        p = RunGauges();
        p.has_metric = true;
        p.loss = line.loss;
        p.grad_norm = line.grad_norm;
        p.tokens_per_s = line.tokens_per_s;
        p.has_probe = line.has_probe;
        p.cosine = line.probe_cosine;
        p.zeta = line.probe_zeta;
        p.has_saturation = line.has_saturation;
        p.saturated = line.max_saturated;
        p.rank_step_seconds = line.rank_step_seconds;
        p.rank_comm_seconds = line.rank_comm_seconds;
        p.rank_comm_exposed_seconds = line.rank_comm_exposed_seconds;
      }
      l.parsed = true;
      if (!l.analytics_parsed && !l.analytics_json.empty()) {
        MetricLine with;
        l.outliers.clear();
        if (ParseMetricLine(l.analytics_json, &with).ok()) l.outliers = std::move(with.outliers);
        l.analytics_parsed = true;
      }
      g = l.gauges;
      g.outliers = l.outliers;
      g.interventions = l.interventions;
      g.ended_unix_ms = l.ended_unix_ms;
    }
    g.run = r.first;
    g.sweep = r.second.sweep_id();
    g.precision = r.second.precision();
    g.worker = r.second.worker_id();
    g.state = v1::RunState_Name(r.second.state());
    g.step = r.second.step();
    g.restarts = r.second.restarts();
    g.ranks = RanksOf(r.second);
    if (Active(r.second.state())) {
      g.gpus = r.second.device_indices_size();
      for (const v1::RunPart& p : r.second.parts()) g.gpus += p.device_indices_size();
    }
    g.workers = std::max(1, r.second.parts_size());
    if (Active(r.second.state())) {
      // A GPU that fractional runs share counts once.
      for (int32_t d : r.second.device_indices()) busy_gpus.insert({r.second.worker_id(), d});
      for (const v1::RunPart& p : r.second.parts()) {
        for (int32_t d : p.device_indices()) busy_gpus.insert({p.worker_id(), d});
      }
    }
    s.runs.push_back(std::move(g));
  }
  s.gpus_busy = static_cast<int64_t>(busy_gpus.size());
  return s;
}

}  // namespace keel
