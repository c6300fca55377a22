// keeld's Prometheus metrics (see metrics.h).
#include "server/metrics.h"

#include <cmath>
#include <set>

#include "proto/event_kinds.h"

namespace keel {
namespace {

const std::vector<std::pair<std::string, std::string>>& RunGaugeNames() {
  static const std::vector<std::pair<std::string, std::string>>* names =
      new std::vector<std::pair<std::string, std::string>>{
          {"keel_run_step", "Optimizer steps the run has taken"},
          {"keel_run_loss", "The run's latest training loss"},
          {"keel_run_grad_norm", "The run's latest global gradient norm (before clipping)"},
          {"keel_run_tokens_per_second", "The run's latest throughput (samples for the proxy model)"},
          {"keel_run_gradient_cosine", "Cosine of the quantized and the fp32 gradient at the run's latest probe"},
          {"keel_run_gradient_bias_zeta", "Multiplicative gradient bias zeta at the run's latest probe"},
          {"keel_run_saturated_ratio", "Largest fraction of clipped values over the run's quantized operands"},
          {"keel_run_restarts", "Times the run was restarted from a checkpoint"},
          {"keel_run_ranks", "Data-parallel ranks (trainer processes) of the run"},
          {"keel_run_workers", "Workers the run's ranks span (a gang: more than 1)"},
          {"keel_run_gpus", "GPUs the run holds now, over all its workers (one rank each)"},
          {"keel_run_rank_step_seconds", "A data-parallel rank's latest step time (label rank)"},
          {"keel_run_rank_comm_seconds",
           "A data-parallel rank's time in gradient and weight collectives in its latest step (label rank)"},
          {"keel_run_rank_comm_exposed_seconds",
           "The part of keel_run_rank_comm_seconds the rank waited for: not overlapped with its backward "
           "(label rank)"},
          // Outlier analytics (docs/train.md, "Outlier analytics"), labels layer and role.
          {"keel_run_operand_kurtosis",
           "Kurtosis (Pearson, 3 for a Gaussian) of a linear layer's operand at the run's latest analytics step "
           "(labels layer, role: fwd_x, fwd_w, dgrad_dy)"},
          {"keel_run_operand_channel_peak_to_median",
           "Largest channel max |x| over the median channel's, at the run's latest analytics step (labels layer, "
           "role: fwd_x, fwd_w, dgrad_dy)"},
          {"keel_run_operand_ftz_ratio",
           "Fraction of an operand's nonzero elements NVFP4 rounds to zero, at the run's latest analytics step "
           "(labels layer, role: all six)"},
          {"keel_run_operand_hot_channel_overlap_ratio",
           "Jaccard overlap of an operand's top-k channels with the previous analytics step's (labels layer, "
           "role: fwd_x, fwd_w, dgrad_dy)"},
      };
  return *names;
}

// A family of the registry: `builder` is prometheus::BuildGauge(),
// BuildCounter() or BuildHistogram().
template <typename Builder>
auto& Family(Builder builder, const std::string& name, const std::string& help, prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

KeeldMetrics::KeeldMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      runs_(Family(prometheus::BuildGauge(), "keel_runs", "Runs by state", *registry_)),
      sweeps_(Family(prometheus::BuildGauge(), "keel_sweeps", "Sweeps stored", *registry_)),
      queue_(Family(prometheus::BuildGauge(), "keel_queue_depth", "Runs waiting for a slot", *registry_)),
      workers_(Family(prometheus::BuildGauge(), "keel_workers", "Workers, connected and registered", *registry_)),
      gpus_(Family(prometheus::BuildGauge(), "keel_gpus", "GPUs of connected workers, total and busy", *registry_)),
      points_(Family(prometheus::BuildCounter(), "keel_metric_points_ingested_total", "Metric points keeld stored",
                     *registry_)),
      restarts_total_(Family(prometheus::BuildCounter(), "keel_run_restarts_total",
                             "Runs restarted from a checkpoint (failed trainer or lost worker)", *registry_)),
      interventions_(Family(prometheus::BuildCounter(), "keel_interventions_total",
                            "Stability interventions the trainers reported, by action", *registry_)),
      stale_(Family(prometheus::BuildCounter(), "keel_stale_messages_total",
                    "Worker messages refused: from a run attempt that is no longer current (reason attempt), "
                    "or on a stream whose lease ran out (reason lease)",
                    *registry_)),
      gaps_(Family(prometheus::BuildCounter(), "keel_metric_gaps_total",
                   "Runs of consecutive steps whose metric points never arrived (each also an event)", *registry_)),
      missing_(Family(prometheus::BuildCounter(), "keel_metric_points_missing_total", "Steps inside those gaps",
                      *registry_)),
      store_errors_(Family(prometheus::BuildCounter(), "keel_store_write_errors_total",
                           "Failed writes of metric points to the store (the points are kept and retried)",
                           *registry_)),
      unstored_(Family(prometheus::BuildGauge(), "keel_metric_points_unstored",
                       "Metric points kept in memory after a failed store write, not yet acknowledged", *registry_)),
      rpc_(Family(prometheus::BuildHistogram(), "keel_rpc_duration_seconds",
                  "keeld's RPC latency by method and status code", *registry_)),
      store_(Family(prometheus::BuildHistogram(), "keel_store_write_duration_seconds",
                    "keeld's store write transactions, BEGIN to synced COMMIT", *registry_)),
      run_info_(Family(prometheus::BuildGauge(), "keel_run_info",
                       "A run's current precision scheme, worker and state (value 1)", *registry_)),
      run_interventions_(Family(prometheus::BuildCounter(), "keel_run_interventions_total",
                                "Stability interventions of a run, by action and rule", *registry_)) {
  for (const auto& n : RunGaugeNames()) {
    run_gauges_[n.first] = &Family(prometheus::BuildGauge(), n.first, n.second, *registry_);
  }
}

prometheus::Gauge& KeeldMetrics::GaugeFor(prometheus::Family<prometheus::Gauge>& family, const Labels& labels) {
  return family.Add(labels);
}

void KeeldMetrics::ObserveRpc(const std::string& method, const std::string& code, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  // Buckets from 100 us to 10 s: unary calls are sub-millisecond to tens of ms.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                                   0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                                   1,      2.5,     5,      10};
  rpc_.Add({{"method", method}, {"code", code}}, kBuckets).Observe(seconds);
}

void KeeldMetrics::ObserveStoreWrite(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  // fsync-bound: tens of microseconds on tmpfs to tens of milliseconds on disks.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                                   0.005,   0.01,   0.025,   0.05,   0.1,   0.25, 1};
  store_.Add({}, kBuckets).Observe(seconds);
}

void KeeldMetrics::Update(const CoordinatorStats& st) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : st.runs_by_state) GaugeFor(runs_, {{"state", kv.first}}).Set(static_cast<double>(kv.second));
  GaugeFor(sweeps_, {}).Set(static_cast<double>(st.sweeps));
  GaugeFor(queue_, {}).Set(static_cast<double>(st.queue_depth));
  GaugeFor(workers_, {{"state", "connected"}}).Set(static_cast<double>(st.workers_connected));
  GaugeFor(workers_, {{"state", "registered"}}).Set(static_cast<double>(st.workers_total));
  GaugeFor(gpus_, {{"state", "total"}}).Set(static_cast<double>(st.gpus_total));
  GaugeFor(gpus_, {{"state", "busy"}}).Set(static_cast<double>(st.gpus_busy));
  auto count = [&](prometheus::Family<prometheus::Counter>& family, const Labels& labels, const std::string& key,
                   double value) {
    prometheus::Counter& c = family.Add(labels);
    double& seen = counted_[key];
    if (value > seen) c.Increment(value - seen);
    seen = std::max(seen, value);
    return &c;
  };
  count(points_, {}, "points", static_cast<double>(st.metric_points));
  count(restarts_total_, {}, "restarts", static_cast<double>(st.restarts));
  for (const char* action : event_kind::kInterventions) {
    auto it = st.interventions.find(action);
    count(interventions_, {{"action", action}}, std::string("interventions/") + action,
          it == st.interventions.end() ? 0.0 : static_cast<double>(it->second));
  }

  for (const char* reason : {"attempt", "lease"}) {
    auto it = st.stale_messages.find(reason);
    count(stale_, {{"reason", reason}}, std::string("stale/") + reason,
          it == st.stale_messages.end() ? 0.0 : static_cast<double>(it->second));
  }
  count(gaps_, {}, "gaps", static_cast<double>(st.metric_gaps));
  count(missing_, {}, "missing", static_cast<double>(st.metric_points_missing));
  count(store_errors_, {}, "store_errors", static_cast<double>(st.store_write_errors));
  GaugeFor(unstored_, {}).Set(static_cast<double>(st.metric_points_unstored));

  std::set<std::string> present;
  for (const RunGauges& g : st.runs) {
    present.insert(g.run);
    RunSeries& series = run_series_[g.run];
    const Labels id = {{"sweep", g.sweep}, {"run", g.run}};
    Labels info = id;
    info["precision"] = g.precision;
    info["worker"] = g.worker;
    info["state"] = g.state;
    if (info != series.info) {
      // The info metric has one series per run: replace it when a label changes.
      if (!series.info.empty()) run_info_.Remove(&run_info_.Add(series.info));
      series.info = info;
    }
    run_info_.Add(info).Set(1);
    auto set = [&](const std::string& name, bool has, double value) {
      if (!has || !std::isfinite(value)) return;  // no sample rather than a made-up one
      prometheus::Gauge& gauge = run_gauges_[name]->Add(id);
      series.gauges[name] = &gauge;
      gauge.Set(value);
    };
    set("keel_run_step", true, static_cast<double>(g.step));
    set("keel_run_restarts", true, g.restarts);
    set("keel_run_ranks", true, g.ranks);
    set("keel_run_workers", true, g.workers);
    set("keel_run_gpus", true, g.gpus);
    set("keel_run_loss", g.has_metric, g.loss);
    set("keel_run_grad_norm", g.has_metric, g.grad_norm);
    set("keel_run_tokens_per_second", g.has_metric, g.tokens_per_s);
    set("keel_run_gradient_cosine", g.has_probe, g.cosine);
    set("keel_run_gradient_bias_zeta", g.has_probe, g.zeta);
    set("keel_run_saturated_ratio", g.has_saturation, g.saturated);
    // Data-parallel runs: each rank's step and communication time, and the
    // part of that time which the backward did not hide.
    for (const auto& per_rank : {std::make_pair("keel_run_rank_step_seconds", &g.rank_step_seconds),
                                 std::make_pair("keel_run_rank_comm_seconds", &g.rank_comm_seconds),
                                 std::make_pair("keel_run_rank_comm_exposed_seconds", &g.rank_comm_exposed_seconds)}) {
      for (size_t r = 0; r < per_rank.second->size(); ++r) {
        const double value = (*per_rank.second)[r];
        if (!std::isfinite(value)) continue;
        Labels labels = id;
        labels["rank"] = std::to_string(r);
        prometheus::Gauge& gauge = run_gauges_[per_rank.first]->Add(labels);
        series.rank_gauges[{per_rank.first, static_cast<int>(r)}] = &gauge;
        gauge.Set(value);
      }
    }
    // Outlier analytics: per layer and role. Cardinality: the wgrad roles read
    // the tensors of fwd_x and dgrad_dy (kurtosis, peak and hot set equal
    // theirs) and dgrad_w fwd_w's, so only the flush rate, which depends on the
    // blocking axis, is exported for those three: 3 x 3 + 6 = 15 series per
    // quantized linear layer and run.
    for (const OutlierValue& o : g.outliers) {
      const bool tensor_role = o.role == "fwd_x" || o.role == "fwd_w" || o.role == "dgrad_dy";
      for (const auto& metric : {std::make_pair("keel_run_operand_kurtosis", o.kurtosis),
                                 std::make_pair("keel_run_operand_channel_peak_to_median", o.top1_over_median),
                                 std::make_pair("keel_run_operand_ftz_ratio", o.ftz_rate),
                                 std::make_pair("keel_run_operand_hot_channel_overlap_ratio", o.hot_overlap)}) {
        const std::string name = metric.first;
        if (!std::isfinite(metric.second) || (!tensor_role && name != "keel_run_operand_ftz_ratio")) continue;
        Labels labels = id;
        labels["layer"] = o.linear;
        labels["role"] = o.role;
        prometheus::Gauge& gauge = run_gauges_[name]->Add(labels);
        series.outlier_gauges[std::make_tuple(name, o.linear, o.role)] = &gauge;
        gauge.Set(metric.second);
      }
    }
    for (const auto& kv : g.interventions) {
      Labels labels = id;
      labels["action"] = kv.first.first;
      labels["rule"] = kv.first.second;
      series.interventions[kv.first] =
          count(run_interventions_, labels, "run/" + g.run + "/" + kv.first.first + "/" + kv.first.second,
                static_cast<double>(kv.second));
    }
  }
  // Runs gone from the snapshot (ended longer than the retention ago): drop their series.
  for (auto it = run_series_.begin(); it != run_series_.end();) {
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    RunSeries& series = it->second;
    if (!series.info.empty()) run_info_.Remove(&run_info_.Add(series.info));
    for (const auto& kv : series.gauges) run_gauges_[kv.first]->Remove(kv.second);
    for (const auto& kv : series.rank_gauges) run_gauges_[kv.first.first]->Remove(kv.second);
    for (const auto& kv : series.outlier_gauges) run_gauges_[std::get<0>(kv.first)]->Remove(kv.second);
    for (const auto& kv : series.interventions) run_interventions_.Remove(kv.second);
    for (auto c = counted_.begin(); c != counted_.end();) {
      c = c->first.rfind("run/" + it->first + "/", 0) == 0 ? counted_.erase(c) : std::next(c);
    }
    it = run_series_.erase(it);
  }
}

}  // namespace keel
