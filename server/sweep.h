// Sweeps: parsing a sweep file and expanding it into validated run specs.
// keeld calls ExpandSweep on a submitted SweepSpec, then PlanToMessages to get
// the v1::Sweep and v1::Run records it stores. Every run spec is checked with
// ParseRunConfig (worker/config/run_config.h), the one parser of run configs.
//
// A sweep file (examples/demo-sweep.yaml is one):
//
//   name: demo                 # required, [A-Za-z0-9_.-]+, at most 128 characters,
//                              # not starting with '.'
//   base:                      # required: a keel-train run config (run_config.h)
//     model: {type: proxy, layers: 2, width: 64}
//     batch: 256
//     steps: 300
//   axes:                      # optional list; runs = cartesian product of entries
//     - grid: {precision: [bf16, mxfp4], seed: [1, 2]}      # product over its keys
//     - zip: {optimizer.lr: [1e-3, 6e-4], model.layers: [2, 4]}  # equal lengths, in step
//     - random: {count: 4, seed: 7, params: {
//         optimizer.lr: {log_uniform: [1e-5, 1e-3]},         # exp(U(log lo, log hi))
//         optimizer.beta2: {uniform: [0.95, 0.999]},          # U(lo, hi)
//         model.width: {choice: [64, 128]}}}                  # one of the list
//   resources: {gpus: 1}       # or {cpu_slots: N}; default {cpu_slots: 1};
//                              # gpus and cpu_slots are exclusive; cpu_slots N > 1
//                              # runs N data-parallel ranks (keel-train --nproc N),
//                              # gpus N runs N ranks, one per GPU; more GPUs than
//                              # any one worker has: a gang over several workers
//                              # (scheduler.h). Or {hosts: H, gpus_per_host: G}:
//                              # a gang of exactly H workers, G GPUs each (each
//                              # 1 .. 1024, H x G <= 1024; gpus beside them must
//                              # equal H x G; not with cpu_slots). Or
//                              # {gpus: F, gpu_memory_gb: M}, 0 < F < 1 in
//                              # thousandths: one rank on a GPU it shares with
//                              # other fractional runs, reserving M GiB of its
//                              # memory (optional; default F x the GPU's)
//   max_concurrent: 4          # runs of this sweep at once; 0 (default) = unlimited
//   max_restarts: 2            # per run (default 2)
//   priority: 0                # higher runs first (default 0)
//   policy: {...}              # any mapping; stored verbatim as YAML text
//
// Axis keys are dotted run-config paths, the same as keel-train's --set
// ("optimizer.lr", "precision", "precision.rounding"); a path may appear in one
// axis only. Values may be any YAML (a mapping for `precision` works too).
//
// Order of runs: the first axis entry varies slowest; inside a grid the first
// key varies slowest; zip and random entries contribute one index each. So
// `grid: {precision: [a, b], seed: [1, 2]}` gives (a,1) (a,2) (b,1) (b,2).
//
// Random sampling is deterministic: a splitmix64 generator (Steele, Lea, Flood
// 2014; constants 0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb)
// seeded with the entry's `seed` draws, for sample 0..count-1 and each param in
// file order, one 53-bit uniform u = (next() >> 11) * 2^-53 in [0, 1):
// uniform lo + u (hi - lo); log_uniform exp(log lo + u (log hi - log lo))
// (0 < lo <= hi); choice list[floor(u n)]. Numbers are written with 6
// significant digits ("%.6g"); the same seed gives the same runs everywhere.
//
// Limits on the text (worker/io/yaml_strict.h, shared with run configs): at
// most 4 MiB of UTF-8 without control characters other than tab, CR and LF;
// one YAML document; no key twice in a mapping; at most 64 levels of nested
// mappings and lists. The source name (SweepSpec.source) is at most 256
// characters without control characters.
//
// Errors: every problem found is reported, one per line, each
// "source:line:col: field: what (allowed: ...)". The line:col is that of the
// offending node in the sweep file: an axis value for a bad value, the base
// field for a bad base, the axis key for a bad path; 1:1 for problems of the
// whole file (its size). The product size is
// computed before anything is expanded and checked against SweepLimits.
#ifndef KEEL_SERVER_SWEEP_H_
#define KEEL_SERVER_SWEEP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/base/status.h"
#include "proto/keel.pb.h"

namespace keel {

// SweepSpec.source is echoed at the start of every message.
constexpr size_t kMaxSourceLength = 256;

struct SweepLimits {
  int64_t max_runs = 10000;  // a sweep expanding to more runs is refused
};

// One run of a sweep.
struct ExpandedRun {
  std::string yaml;  // base with this run's axis values set; parses with ParseRunConfig
  // axis path -> value as YAML text (flow style), in axis order.
  std::vector<std::pair<std::string, std::string>> axes;
};

struct SweepPlan {
  std::string name;
  std::string source_yaml;  // the sweep file as submitted
  std::string source;       // its name, as given to ExpandSweep (SweepSpec.source)
  std::vector<ExpandedRun> runs;
  int gpus = 0;           // in all (hosts x gpus_per_host when those are given)
  int cpu_slots = 1;
  int hosts = 0;          // {hosts, gpus_per_host}: 0 when not given
  int gpus_per_host = 0;
  int gpu_milli = 0;              // a fraction of one GPU in thousandths (gpus is 1); 0: whole GPUs
  int64_t gpu_memory_bytes = 0;   // resources.gpu_memory_gb of a fractional run; 0: not declared
  int max_concurrent = 0;  // 0: unlimited
  int max_restarts = 2;
  int priority = 0;
  std::string policy_yaml;  // "" when absent
};

// Parses and validates a sweep file and expands it into runs. `source` names
// the file in messages. On error *out is untouched and the message lists every
// problem found, one per line.
Status ExpandSweep(const std::string& yaml_text, const std::string& source,
                   const SweepLimits& limits, SweepPlan* out);

// Fills a v1::Sweep (state SWEEP_ACTIVE, spec = the source text, runs_total,
// runs_by_state {"QUEUED": n}) and one v1::Run per planned run (state QUEUED,
// spec.yaml, axes, precision = the run's scheme name, steps). run_id(i) gives
// the id of run i. Both created_unix_ms (and the runs' updated_unix_ms) are
// now_unix_ms. *runs is replaced.
void PlanToMessages(const SweepPlan& plan, const std::string& sweep_id,
                    const std::function<std::string(int)>& run_id, int64_t now_unix_ms,
                    v1::Sweep* sweep, std::vector<v1::Run>* runs);

}  // namespace keel

#endif  // KEEL_SERVER_SWEEP_H_
