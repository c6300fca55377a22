// keeld's Prometheus metrics (prometheus-cpp, served on --metrics-listen).
// Naming follows Prometheus conventions: keel_ prefix, base units (_seconds),
// _total for counters, _ratio for 0-1 values. Labels are sweep, run, worker,
// precision, state, action, rule, method: never a step or a value. Per-run
// series carry only {sweep, run}; precision, worker and state sit on the info
// metric keel_run_info (join with `* on(run) group_left(precision) keel_run_info`),
// so a precision switch does not split a run's series. A run's series are
// dropped `retention` after it ended (bounded cardinality).
//
// Fleet and service:
//   keel_runs{state}                      gauge   runs by state
//   keel_sweeps                           gauge
//   keel_queue_depth                      gauge   runs waiting for a slot
//   keel_workers{state=connected|registered}  gauge
//   keel_gpus{state=total|busy}           gauge   over connected workers
//   keel_metric_points_ingested_total     counter
//   keel_run_restarts_total               counter restarts since keeld started
//   keel_interventions_total{action}      counter stability interventions reported
//   keel_rpc_duration_seconds{method,code} histogram
//   keel_store_write_duration_seconds     histogram one store transaction, to its synced commit
//   keel_store_write_errors_total         counter failed writes of metric points (kept, retried)
//   keel_metric_points_unstored           gauge   points kept after a failed write, unacknowledged
// Per run ({sweep, run}):
//   keel_run_info{sweep,run,precision,worker,state} 1
//   keel_run_step, keel_run_loss, keel_run_grad_norm, keel_run_tokens_per_second,
//   keel_run_gradient_cosine, keel_run_gradient_bias_zeta (latest probe),
//   keel_run_saturated_ratio (largest operand clip fraction), keel_run_restarts   gauges
//   keel_run_ranks, keel_run_workers (data-parallel ranks, and the workers they span)  gauges
//   keel_run_rank_step_seconds{sweep,run,rank}, keel_run_rank_comm_seconds{sweep,run,rank},
//   keel_run_rank_comm_exposed_seconds{sweep,run,rank}
//     (data-parallel runs: each rank's latest step time, time in collectives, and
//     the part of that time not overlapped with its backward)                      gauges
//   keel_run_operand_kurtosis{sweep,run,layer,role}, keel_run_operand_channel_peak_to_median{...},
//   keel_run_operand_hot_channel_overlap_ratio{...} (roles fwd_x, fwd_w, dgrad_dy),
//   keel_run_operand_ftz_ratio{...} (all six roles)
//     (outlier analytics of the run's latest analytics step, per quantized linear
//     layer: 15 series per layer and run; docs/service.md)                        gauges
//   keel_run_interventions_total{sweep,run,action,rule}                           counter
#ifndef KEEL_SERVER_METRICS_H_
#define KEEL_SERVER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "server/coordinator.h"

namespace keel {

class KeeldMetrics {
 public:
  KeeldMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Refreshes every gauge and counter from a coordinator snapshot (keeld calls
  // it on each tick). Series of runs missing from the snapshot are removed.
  void Update(const CoordinatorStats& stats);

  // One RPC's latency; `code` is grpc's status code name ("OK", "NOT_FOUND", ...).
  void ObserveRpc(const std::string& method, const std::string& code, double seconds);
  // One store write transaction (BEGIN to synced COMMIT).
  void ObserveStoreWrite(double seconds);

 private:
  using Labels = std::map<std::string, std::string>;
  prometheus::Gauge& GaugeFor(prometheus::Family<prometheus::Gauge>& family, const Labels& labels);

  std::mutex mu_;  // guards everything below (Update and ObserveRpc run on different threads)
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& runs_;
  prometheus::Family<prometheus::Gauge>& sweeps_;
  prometheus::Family<prometheus::Gauge>& queue_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& gpus_;
  prometheus::Family<prometheus::Counter>& points_;
  prometheus::Family<prometheus::Counter>& restarts_total_;
  prometheus::Family<prometheus::Counter>& interventions_;
  prometheus::Family<prometheus::Counter>& stale_;
  prometheus::Family<prometheus::Counter>& gaps_;
  prometheus::Family<prometheus::Counter>& missing_;
  prometheus::Family<prometheus::Counter>& store_errors_;
  prometheus::Family<prometheus::Gauge>& unstored_;
  prometheus::Family<prometheus::Histogram>& rpc_;
  prometheus::Family<prometheus::Histogram>& store_;
  prometheus::Family<prometheus::Gauge>& run_info_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> run_gauges_;  // by metric name
  prometheus::Family<prometheus::Counter>& run_interventions_;

  // Counters mirror absolute counts: the last value seen, to increment by the difference.
  std::map<std::string, double> counted_;
  // Per-run series present now, by run id, to remove those of dropped runs.
  struct RunSeries {
    Labels info;
    std::map<std::string, prometheus::Gauge*> gauges;
    std::map<std::pair<std::string, int>, prometheus::Gauge*> rank_gauges;  // (metric, rank)
    std::map<std::tuple<std::string, std::string, std::string>, prometheus::Gauge*> outlier_gauges;  // (metric, layer, role)
    std::map<std::pair<std::string, std::string>, prometheus::Counter*> interventions;
  };
  std::map<std::string, RunSeries> run_series_;
};

}  // namespace keel

#endif  // KEEL_SERVER_METRICS_H_
