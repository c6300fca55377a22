// Training-step throughput of keel-train's engine (issues 3 and 12):
//   - a GPT-2 shape (gpt2-124m: 12 x 768, 12 heads; gpt2-350m: 24 x 1024, 16
//     heads; context 1024, vocab 50257 padded to 50304; AdamW lr 6e-4, beta2
//     0.95, weight decay 0.1, clip 1.0) at batch x seq (default 16 x 1024), one
//     case per precision scheme (default bf16, the baseline, then mxfp8_e4m3,
//     mxfp4, nvfp4, nvfp4_recipe): ms/step, tokens/s, peak device memory, MFU;
//   - the proxy (L4, d512, batch 2048): steps/s in fp32 (the baseline) and mxfp8_e4m3.
// Each case: 2 warm-up steps, then the mean of `--steps` timed steps (wall clock
// around Trainer::Step, which ends with a device sync). Operand statistics on,
// as in a real run; --no-stats measures without them. Outlier analytics are off
// in the timed cases; --analytics N times each case again with analytics on every
// step and reports their cost amortized over N steps; --probe N does the same
// for the gradient-bias probe (probe_every, which a language model's
// `policy: default` turns on every 100 steps); --snapshots N times the policy's
// snapshots, in memory and on disk. bench/speed runs this
// once per case and llm.c's train_gpt2cu at the same shape (docs/benchmarks.md).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/base/flags.h"
#include "kernels/philox.h"
#include "worker/config/run_config.h"
#include "worker/config/scheme.h"
#include "worker/engine/trainer.h"
#include "worker/io/file_util.h"
#include "worker/io/json.h"
#include "worker/io/token_shard.h"


namespace keel {
namespace {

const char kUsage[] =
    "usage: train_bench [options]\n"
    "Throughput of keel-train's training step: GPT-2 shapes, one case per precision scheme,\n"
    "and the proxy model. Each case: 2 warm-up steps, then the mean of --steps timed steps.\n"
    "\n"
    "  --backend cuda|cpu   backend to measure (default cuda)\n"
    "  --steps N            timed steps per GPT case (default 10; the proxy times 10 x N)\n"
    "  --only gpt|proxy     run only the GPT cases or only the proxy (default both)\n"
    "  --no-stats           operand statistics off (default on, as in a real run)\n"
    "  --analytics N        also time each case with outlier analytics on every step and\n"
    "                       report their cost per analytics step and amortized over a\n"
    "                       period of N steps (analytics_every: N; the target is < 3%%\n"
    "                       of the step at the default 100). 0: off (default); the plain\n"
    "                       cases always run with analytics off\n"
    "  --analytics-maps     with --analytics: also draw the block maps on every analytics\n"
    "                       step (analytics.maps_every)\n"
    "  --probe N            also time each case with the gradient-bias probe on every step\n"
    "                       (its recomputation of the gradient with the reference's operands)\n"
    "                       and report its cost amortized over N steps (probe_every: N; a\n"
    "                       language model's policy: default probes every 100). 0: off (default)\n"
    "  --probe-reference fp32|bf16\n"
    "                       with --probe: the probe's reference gradient (probe_reference;\n"
    "                       default fp32)\n"
    "  --snapshots N        also time the policy's snapshots of each case: 3 into memory (the\n"
    "                       first allocating the ring's entry, 2 reusing it) and 2 written as\n"
    "                       checkpoints on disk (whole, fsynced; then removed), and report each\n"
    "                       one's cost amortized over N steps (policy.snapshots.every; the\n"
    "                       default policy's is 100, or steps / 90 on a shorter run). 0: off\n"
    "  --head-chunk-mib N   GPT cases: the most fp32 logits a BF16 or MX head holds at once, in\n"
    "                       MiB (Model::HeadAndLoss; 0: the default, 1024; one chunk of every\n"
    "                       row is the one-piece pass)\n"
    "  --profile            time every backend op over the timed steps (CUDA events, and on\n"
    "                       the host; cuda backend only) and print the per-op breakdown of\n"
    "                       each case, with the host time outside every op (with\n"
    "                       --analytics, of its analytics-on run too)\n"
    "GPT cases:\n"
    "  --model NAME         gpt2-124m (12 layers, width 768, 12 heads) or gpt2-350m (24 layers,\n"
    "                       width 1024, 16 heads); both: context 1024, vocab 50257 padded to\n"
    "                       50304, AdamW lr 6e-4 beta2 0.95 weight decay 0.1, clip 1.0\n"
    "                       (default gpt2-124m)\n"
    "  --batch N            sequences per step, 1 .. 65536 (default 16)\n"
    "  --seq N              tokens per sequence, 1 .. 1024 (default 1024)\n"
    "  --schemes A,B,...    precision presets, one case each, in this order (default\n"
    "                       bf16,mxfp8_e4m3,mxfp4,nvfp4,nvfp4_recipe; `keel-train presets`\n"
    "                       lists them; a preset may be followed by +bf16_head, the head in\n"
    "                       BF16); ratios are to the bf16 case when there is one.\n"
    "                       The proxy keeps fp32,mxfp8_e4m3\n"
    "  --tokens FILE        where the random token shard is written, in llm.c's .bin format\n"
    "                       (default /tmp/keel-train-bench-tokens.bin); bench/speed hands the\n"
    "                       same file to llm.c's train_gpt2cu\n"
    "  --json FILE          also write one JSON object per GPT case, one per line: model,\n"
    "                       scheme, batch, seq, steps, ms_per_step, tokens_per_s, peak_mib,\n"
    "                       mfu, loss, params, flops_per_token, peak_tflops, peak_tflops_source,\n"
    "                       device (peak_mib, mfu and peak_tflops are null where unknown);\n"
    "                       with --analytics also analytics_every, analytics_maps,\n"
    "                       analytics_ms_per_step, analytics_overhead, analytics_peak_mib;\n"
    "                       with --probe also probe_every, probe_ms_per_step,\n"
    "                       probe_overhead, probe_peak_mib; with --snapshots also\n"
    "                       snapshot_every, snapshot_memory_ms, snapshot_alloc_ms,\n"
    "                       snapshot_disk_ms, snapshot_memory_overhead, snapshot_disk_overhead\n"
    "  --peak-tflops X      the GPU's dense BF16 peak in TFLOP/s for MFU (default: the figure\n"
    "                       llm.c's llmc/mfu.h gives the device; MFU is n/a for other devices)\n"
    "  --help               this text\n"
    "\n"
    "peak MiB: device memory in use (cudaMemGetInfo total - free, as llm.c's train_gpt2cu\n"
    "reports it) after the timed steps; n/a on the CPU backend and in builds without CUDA.\n"
    "MFU: llm.c's formula, FLOPs per token = 6 N + 6 L C T (N parameters with the padded\n"
    "vocab, L layers, C width, T seq), times tokens/s, over the dense BF16 peak.\n";

constexpr int kContext = 1024;  // GPT-2's; --seq may be shorter
constexpr int kVocab = 50257;
constexpr int kPaddedVocab = 50304;
constexpr int kWarmupSteps = 2;

// The GPT-2 shapes llm.c's train_gpt2cu builds from -e d12 and -e d24.
struct GptShape {
  const char* name;
  int layers;
  int width;
  int heads;
};
constexpr GptShape kGptShapes[] = {{"gpt2-124m", 12, 768, 12}, {"gpt2-350m", 24, 1024, 16}};

// Dense BF16 peaks (TFLOP/s) by CUDA device name, for MFU. llm.c's llmc/mfu.h
// scales a family's whitepaper figure by tensor cores and clock (HOPPER: 756
// TFLOP/s at 456 TCs, 1620 MHz) and lists no H200; NVIDIA gives the H200 (SXM)
// the H100 SXM's dense BF16 figure, so it gets that one.
struct Bf16Peak {
  const char* device;
  double tflops;
  const char* source;
};
const Bf16Peak kBf16Peaks[] = {
    {"NVIDIA H100 80GB HBM3", 756.0 * 528 / 456 * 1830 / 1620, "llm.c mfu.h, H100 SXM: 756 x 528/456 TCs x 1830/1620 MHz"},
    {"NVIDIA H100 PCIe", 756.0, "llm.c mfu.h, H100 PCIe"},
    {"NVIDIA H200", 756.0 * 528 / 456 * 1830 / 1620, "llm.c mfu.h's H100 SXM figure; mfu.h lists no H200, same dense BF16"},
};

std::string Format(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// A value only some runs have (device memory, MFU): "n/a" or null when absent.
std::string Show(const std::optional<double>& m, const char* format) { return m ? Format(format, *m) : "n/a"; }

JsonValue ToJsonValue(const std::optional<double>& m) { return m ? JsonValue(*m) : JsonValue(); }

// Device memory the process holds now (Backend::DeviceMemoryInUse: the measure
// llm.c's train_gpt2cu prints as "device memory usage"), in MiB.
std::optional<double> DeviceMemoryInUseMib(const Backend& backend) {
  int64_t bytes = 0;
  if (!backend.DeviceMemoryInUse(&bytes)) return std::nullopt;
  return static_cast<double>(bytes) / (1 << 20);
}

// The device name in a Backend::Describe text ("NVIDIA H200, sm_90, 132 SMs").
std::string DeviceName(const std::string& described) { return described.substr(0, described.find(", ")); }

// The dense BF16 peak for MFU: --peak-tflops, else kBf16Peaks by device name.
std::optional<double> PeakTflops(double flag, const std::string& device, std::string* source) {
  if (flag > 0) {
    *source = "--peak-tflops";
    return flag;
  }
  for (const Bf16Peak& p : kBf16Peaks) {
    if (device == p.device) {
      *source = p.source;
      return p.tflops;
    }
  }
  *source = "no figure for '" + device + "' (pass --peak-tflops)";
  return std::nullopt;
}

struct Result {
  std::string label;
  std::string scheme;
  double step_ms = 0;
  double items_per_s = 0;
  double loss = 0;
  int64_t params = 0;
  std::string device;
  std::optional<double> peak_mib;
};

// profile: time every backend op over the timed steps (Backend::SetProfiling)
// and print the breakdown; the events add a little to the step time.
Status Measure(const std::string& yaml, const std::string& label, int steps, bool profile, int64_t head_chunk_floats,
               Result* out) {
  RunConfig c;
  Status s = ParseRunConfig(yaml, label, {}, &c);
  if (!s.ok()) return s;
  std::unique_ptr<Trainer> t;
  s = Trainer::Create(c, &t);
  if (!s.ok()) return s;
  if (head_chunk_floats > 0) t->model()->SetHeadChunkFloats(head_chunk_floats);
  StepMetrics m;
  for (int i = 0; i < kWarmupSteps; ++i) {
    s = t->Step(&m);
    if (!s.ok()) return s;
  }
  if (profile) {
    s = t->backend()->SetProfiling(true);
    if (!s.ok()) return s;
  }
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    s = t->Step(&m);
    if (!s.ok()) return s;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (profile) {
    std::vector<OpTime> times;
    s = t->backend()->TakeProfile(&times);
    if (!s.ok()) return s;
    std::printf("  profile of %s over %d steps (step time includes the timer's events):\n%s", label.c_str(), steps,
                FormatProfile(times, steps, seconds / steps * 1e3).c_str());
  }
  out->label = label;
  out->scheme = c.precision.name;
  out->step_ms = seconds / steps * 1e3;
  out->items_per_s = static_cast<double>(t->model()->items_per_batch()) * steps / seconds;
  out->loss = m.loss;
  out->params = t->model()->param_count();
  out->device = t->backend()->Describe();
  out->peak_mib = DeviceMemoryInUseMib(*t->backend());
  t.reset();  // the CUDA backend hands its cached scratch back: the next case's peak is its own
  return Status::Ok();
}

// A CLI11 check that accepts one of `allowed`: "'VALUE' is not allowed (a, b)".
CLI::Validator OneOf(const std::vector<std::string>& allowed) {
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return CLI::Validator(
      [allowed, list](std::string& text) -> std::string {
        for (const std::string& a : allowed) {
          if (text == a) return std::string();
        }
        return "'" + text + "' is not allowed (" + list + ")";
      },
      list);
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) parts.push_back(part);
  if (!text.empty() && text.back() == ',') parts.push_back("");
  return parts;
}

struct GptOptions {
  const GptShape* shape = nullptr;
  int batch = 16;
  int seq = 1024;
  std::vector<std::string> schemes;
  std::string tokens_path;
  std::string json_path;
  double peak_tflops_flag = 0;
  int steps = 10;
  bool profile = false;
  int analytics = 0;           // --analytics: the period the cost is amortized over (0: off)
  bool analytics_maps = false;
  int probe = 0;               // --probe: the period the probe's cost is amortized over (0: off)
  std::string probe_reference = "fp32";  // --probe-reference
  int64_t head_chunk_mib = 0;  // --head-chunk-mib: the head's fp32 logits at once (0: the model's default)
  int snapshots = 0;           // --snapshots: the period the policy snapshots' cost is amortized over (0: off)
};

// The YAML lines of a case without analytics, and of its analytics twin
// (analytics on every step, so that each timed step pays them).
std::string AnalyticsOff() { return "analytics_every: 0\n"; }
std::string AnalyticsOn(bool maps) {
  return std::string("analytics_every: 1\n") + (maps ? "analytics: {maps_every: 1}\n" : "");
}

// The probe's twin: probe_every 1, so that each timed step pays it.
std::string ProbeOn(const std::string& reference) {
  return AnalyticsOff() + "probe_every: 1\nprobe_reference: " + reference + "\n";
}

// A twin of case `r` with something on every step (`extra`: its YAML lines;
// `what`: its name in the line): its step time, and the overhead per step and
// amortized over `period` steps, printed under the case (`target`: the
// overhead's target, or empty).
struct TwinCost {
  double step_ms = 0, extra_ms = 0, amortized = 0;  // amortized: fraction of the plain step
  std::optional<double> peak_mib;  // device memory after the twin's steps
};
Status MeasureTwin(const std::string& yaml, const std::string& extra, const std::string& what, const char* target,
                   const Result& plain, int steps, int period, bool profile, int64_t head_chunk_floats,
                   TwinCost* cost) {
  Result on;
  KEEL_RETURN_IF_ERROR(Measure(yaml + extra, plain.label + " +" + what, steps, profile, head_chunk_floats, &on));
  cost->step_ms = on.step_ms;
  cost->extra_ms = on.step_ms - plain.step_ms;
  cost->amortized = cost->extra_ms / (static_cast<double>(period) * plain.step_ms);
  cost->peak_mib = on.peak_mib;
  std::printf("  %-32s %9.2f ms/step with %s on every step: +%.2f ms (+%.1f%%); every %d steps: "
              "+%.3f%% of the step%s; peak %s MiB (without: %s)\n",
              "", on.step_ms, what.c_str(), cost->extra_ms, 100.0 * cost->extra_ms / plain.step_ms, period,
              100.0 * cost->amortized, target, Show(on.peak_mib, "%.0f").c_str(), Show(plain.peak_mib, "%.0f").c_str());
  std::fflush(stdout);
  return Status::Ok();
}

Status MeasureAnalytics(const std::string& yaml, const Result& plain, int steps, int period, bool maps, bool profile,
                        int64_t head_chunk_floats, TwinCost* cost) {
  return MeasureTwin(yaml, AnalyticsOn(maps), maps ? "analytics and maps" : "analytics", " (target < 3%)", plain,
                     steps, period, profile, head_chunk_floats, cost);
}

Status MeasureProbe(const std::string& yaml, const Result& plain, int steps, int period, const std::string& reference,
                    bool profile, int64_t head_chunk_floats, TwinCost* cost) {
  return MeasureTwin(yaml, ProbeOn(reference), "the gradient-bias probe (" + reference + " reference)", "", plain,
                     steps, period, profile, head_chunk_floats, cost);
}

// The policy's snapshots (--snapshots N): a case's trainer with a policy that
// keeps 1 in memory takes 3 (the first allocating the ring's entry, the others
// reusing it), then writes 2 checkpoints, what the snapshots were before
// session 33 (whole, fsynced), each removed once timed. Each is timed alone
// (all end with the state on the host); the cost is amortized over N steps of
// the plain case.
struct SnapshotCost {
  double alloc_ms = 0, memory_ms = 0, disk_ms = 0;
  double memory_overhead = 0, disk_overhead = 0;  // fractions of the plain step at every N steps
};
Status MeasureSnapshots(const std::string& yaml, const Result& plain, int period, SnapshotCost* cost) {
  const std::string policy = "policy:\n  snapshots: {every: " + std::to_string(period) +
                             ", keep: 1, memory_mib: 1048576}\n  rules:\n    - {when: nonfinite, do: [stop]}\n";
  RunConfig c;
  KEEL_RETURN_IF_ERROR(ParseRunConfig(yaml + AnalyticsOff() + policy, plain.label + " +snapshots", {}, &c));
  std::unique_ptr<Trainer> t;
  KEEL_RETURN_IF_ERROR(Trainer::Create(c, &t));
  StepMetrics m;
  for (int i = 0; i < kWarmupSteps; ++i) KEEL_RETURN_IF_ERROR(t->Step(&m));
  auto timed = [](const std::function<Status()>& f, double* ms) {
    const auto start = std::chrono::steady_clock::now();
    const Status s = f();
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return s;
  };
  double ms[3], disk[2];
  for (double& x : ms) KEEL_RETURN_IF_ERROR(timed([&] { return t->TakeSnapshot(); }, &x));
  for (double& x : disk) {
    std::string dir;
    const Status saved = timed([&] { return t->SaveCheckpoint(&dir); }, &x);
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    KEEL_RETURN_IF_ERROR(saved);
  }
  cost->alloc_ms = ms[0];
  cost->memory_ms = (ms[1] + ms[2]) / 2;
  cost->disk_ms = (disk[0] + disk[1]) / 2;
  cost->memory_overhead = cost->memory_ms / (static_cast<double>(period) * plain.step_ms);
  cost->disk_overhead = cost->disk_ms / (static_cast<double>(period) * plain.step_ms);
  std::printf("  %-32s policy snapshots: in memory %.1f ms each (the ring's first entry, allocating: %.1f ms), "
              "as a checkpoint on disk %.1f ms; every %d steps: memory +%.3f%%, disk +%.3f%% of the step (%s)\n",
              "", cost->memory_ms, cost->alloc_ms, cost->disk_ms, period, 100.0 * cost->memory_overhead,
              100.0 * cost->disk_overhead, t->snapshot_placement().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

int RunGpt(const std::string& common, const GptOptions& o) {
  // Random GPT-2 tokens: throughput does not depend on the text. 4 Mi tokens:
  // 256 steps of 16 x 1024 before llm.c's loader wraps around.
  std::vector<uint16_t> tokens(4 << 20);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint16_t>(PhiloxUniform(42, i) * static_cast<float>(kVocab));
  }
  Status s = WriteTokenShard(o.tokens_path, tokens.data(), static_cast<int64_t>(tokens.size()));
  if (!s.ok()) return std::fprintf(stderr, "train_bench: --tokens: %s\n", s.message().c_str()), 1;
  const GptShape& g = *o.shape;
  std::printf("%s shape: %d layers, %d wide, %d heads, context %d, vocab %d padded to %d, batch %d x %d; tokens in %s\n",
              g.name, g.layers, g.width, g.heads, kContext, kVocab, kPaddedVocab, o.batch, o.seq,
              o.tokens_path.c_str());
  std::fflush(stdout);
  const std::string shape = "B" + std::to_string(o.batch) + "xT" + std::to_string(o.seq);
  std::vector<Result> results;
  std::string json_lines;
  std::optional<double> peak;
  std::string peak_source;
  double flops_per_token = 0;
  for (const std::string& scheme : o.schemes) {
    const std::string yaml =
        common + "model: {type: gpt, layers: " + std::to_string(g.layers) + ", width: " + std::to_string(g.width) +
        ", heads: " + std::to_string(g.heads) + ", context: " + std::to_string(kContext) +
        ", vocab: " + std::to_string(kVocab) + ", padded_vocab: " + std::to_string(kPaddedVocab) + "}\n" +
        "data: {train: " + o.tokens_path + "}\nbatch: " + std::to_string(o.batch) + "\nseq: " + std::to_string(o.seq) +
        "\nsteps: 1000000\n"
        "optimizer: {type: adamw, lr: 6.0e-4, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}\n"
        "precision: " + scheme + "\n";
    Result r;
    s = Measure(yaml + AnalyticsOff(), std::string(g.name) + " " + scheme + " " + shape, o.steps, o.profile,
                o.head_chunk_mib << 18, &r);
    if (!s.ok()) return std::fprintf(stderr, "train_bench: %s: %s\n", scheme.c_str(), s.message().c_str()), 1;
    // llm.c's gpt2_estimate_mfu: 6 N for the weight matmuls, 6 L C T for attention.
    flops_per_token = 6.0 * r.params + 6.0 * g.layers * g.width * o.seq;
    peak = PeakTflops(o.peak_tflops_flag, DeviceName(r.device), &peak_source);
    std::optional<double> mfu, percent;
    if (peak) {
      mfu = r.items_per_s * flops_per_token / (*peak * 1e12);
      percent = *mfu * 100;
    }
    std::printf("  %-32s %9.2f ms/step  %10.0f tok/s  peak %9s MiB  MFU %6s%%  (loss %.4f) [%s]\n", r.label.c_str(),
                r.step_ms, r.items_per_s, Show(r.peak_mib, "%.0f").c_str(), Show(percent, "%.1f").c_str(), r.loss,
                r.device.c_str());
    std::fflush(stdout);
    results.push_back(r);
    TwinCost cost, probe;
    if (o.analytics > 0) {
      s = MeasureAnalytics(yaml, r, o.steps, o.analytics, o.analytics_maps, o.profile, o.head_chunk_mib << 18, &cost);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: %s +analytics: %s\n", scheme.c_str(), s.message().c_str()), 1;
    }
    if (o.probe > 0) {
      s = MeasureProbe(yaml, r, o.steps, o.probe, o.probe_reference, o.profile, o.head_chunk_mib << 18, &probe);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: %s +probe: %s\n", scheme.c_str(), s.message().c_str()), 1;
    }
    SnapshotCost snap;
    if (o.snapshots > 0) {
      s = MeasureSnapshots(yaml, r, o.snapshots, &snap);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: %s +snapshots: %s\n", scheme.c_str(), s.message().c_str()), 1;
    }
    if (!o.json_path.empty()) {
      JsonWriter w;
      w.Add("model", g.name).Add("scheme", scheme).Add("batch", o.batch).Add("seq", o.seq).Add("steps", o.steps);
      w.Add("ms_per_step", r.step_ms).Add("tokens_per_s", r.items_per_s).Add("peak_mib", ToJsonValue(r.peak_mib));
      w.Add("mfu", ToJsonValue(mfu)).Add("loss", r.loss).Add("params", r.params);
      w.Add("flops_per_token", flops_per_token).Add("peak_tflops", ToJsonValue(peak));
      w.Add("peak_tflops_source", peak_source).Add("device", r.device);
      if (o.analytics > 0) {
        w.Add("analytics_every", o.analytics).Add("analytics_maps", o.analytics_maps);
        w.Add("analytics_ms_per_step", cost.step_ms).Add("analytics_overhead", cost.amortized);
        w.Add("analytics_peak_mib", ToJsonValue(cost.peak_mib));
      }
      if (o.probe > 0) {
        w.Add("probe_every", o.probe).Add("probe_reference", o.probe_reference);
        w.Add("probe_ms_per_step", probe.step_ms).Add("probe_overhead", probe.amortized);
        w.Add("probe_peak_mib", ToJsonValue(probe.peak_mib));
      }
      if (o.snapshots > 0) {
        w.Add("snapshot_every", o.snapshots).Add("snapshot_memory_ms", snap.memory_ms);
        w.Add("snapshot_alloc_ms", snap.alloc_ms).Add("snapshot_disk_ms", snap.disk_ms);
        w.Add("snapshot_memory_overhead", snap.memory_overhead).Add("snapshot_disk_overhead", snap.disk_overhead);
      }
      json_lines += w.str() + "\n";
      // Rewritten after every case, so a later failure keeps the earlier cases.
      s = WriteFileAtomic(o.json_path, json_lines);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: --json: %s\n", s.message().c_str()), 1;
    }
  }
  std::printf("  MFU: %.1fM FLOPs/token (6 N + 6 L C T, N = %lld with the padded vocab) over %s TFLOP/s dense BF16 (%s)\n",
              flops_per_token / 1e6, static_cast<long long>(results.back().params), Show(peak, "%.1f").c_str(),
              peak_source.c_str());
  const Result* bf16 = nullptr;
  for (const Result& r : results) {
    if (r.scheme == "bf16") bf16 = &r;
  }
  if (bf16 == nullptr) {
    std::printf("  (no bf16 case: no ratios)\n");
  } else {
    for (const Result& r : results) {
      std::printf("  %-32s %.3fx of bf16's tokens/s\n", r.label.c_str(), r.items_per_s / bf16->items_per_s);
    }
  }
  return 0;
}

int RunProxy(const std::string& common, int steps, bool profile, int analytics, bool analytics_maps, int probe,
             const std::string& probe_reference, int snapshots) {
  std::printf("proxy: L4, d512, batch 2048, Adam lr 6e-4\n");
  std::vector<Result> results;
  for (const char* scheme : {"fp32", "mxfp8_e4m3"}) {
    std::string yaml = common + "model: {type: proxy, layers: 4, width: 512}\nbatch: 2048\nsteps: 1000000\n"
                                "optimizer: {type: adam, lr: 6.0e-4}\nprecision: " + scheme + "\n";
    Result r;
    Status s = Measure(yaml + AnalyticsOff(), std::string("proxy ") + scheme, steps * 10, profile, 0, &r);
    if (!s.ok()) return std::fprintf(stderr, "train_bench: %s: %s\n", scheme, s.message().c_str()), 1;
    std::printf("  %-28s %9.2f ms/step  %12.0f samples/s  (loss %.4f) [%s]\n", r.label.c_str(), r.step_ms,
                r.items_per_s, r.loss, r.device.c_str());
    std::printf("  %-28s %.1f steps/s\n", r.label.c_str(), 1e3 / r.step_ms);
    if (analytics > 0) {
      TwinCost cost;
      s = MeasureAnalytics(yaml, r, steps * 10, analytics, analytics_maps, profile, 0, &cost);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: %s +analytics: %s\n", scheme, s.message().c_str()), 1;
    }
    if (probe > 0) {
      TwinCost cost;
      s = MeasureProbe(yaml, r, steps * 10, probe, probe_reference, profile, 0, &cost);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: %s +probe: %s\n", scheme, s.message().c_str()), 1;
    }
    if (snapshots > 0) {
      SnapshotCost cost;
      s = MeasureSnapshots(yaml, r, snapshots, &cost);
      if (!s.ok()) return std::fprintf(stderr, "train_bench: %s +snapshots: %s\n", scheme, s.message().c_str()), 1;
    }
    results.push_back(r);
  }
  std::printf("  mxfp8_e4m3 / fp32 steps/s: %.3f\n", results[0].step_ms / results[1].step_ms);
  return 0;
}

int Main(int argc, char** argv) {
  std::string backend = "cuda", only, model = "gpt2-124m";
  std::string schemes = "bf16,mxfp8_e4m3,mxfp4,nvfp4,nvfp4_recipe";
  GptOptions gpt;
  gpt.tokens_path = "/tmp/keel-train-bench-tokens.bin";
  bool no_stats = false;
  CLI::App app("train_bench");
  app.add_option("--backend", backend)->check(OneOf({"cuda", "cpu"}));
  app.add_option("--steps", gpt.steps)->check(IntFlag(1, 1000000));
  app.add_option("--only", only)->check(OneOf({"gpt", "proxy"}));
  app.add_flag("--no-stats", no_stats);
  app.add_flag("--profile", gpt.profile);
  app.add_option("--analytics", gpt.analytics)->check(IntFlag(0, 1 << 30));
  app.add_flag("--analytics-maps", gpt.analytics_maps);
  app.add_option("--probe", gpt.probe)->check(IntFlag(0, 1 << 30));
  app.add_option("--probe-reference", gpt.probe_reference)->check(OneOf({"fp32", "bf16"}));
  app.add_option("--head-chunk-mib", gpt.head_chunk_mib)->check(IntFlag(0, 1 << 20));
  app.add_option("--snapshots", gpt.snapshots)->check(IntFlag(0, 1 << 30));
  std::vector<std::string> model_names;
  for (const GptShape& g : kGptShapes) model_names.push_back(g.name);
  app.add_option("--model", model)->check(OneOf(model_names));
  app.add_option("--batch", gpt.batch)->check(IntFlag(1, 65536));
  app.add_option("--seq", gpt.seq)->check(IntFlag(1, kContext));
  app.add_option("--schemes", schemes);
  app.add_option("--tokens", gpt.tokens_path);
  app.add_option("--json", gpt.json_path);
  app.add_option("--peak-tflops", gpt.peak_tflops_flag)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || !(v > 0 && v < 1e6)) {
              return "'" + text + "' is not allowed (a number of TFLOP/s above 0)";
            }
            return std::string();
          },
          "TFLOP/s"));
  const FlagsOutcome flags = ParseFlags(app, "train_bench", kUsage, argc, argv);
  if (!flags.proceed) return flags.exit_code;
  for (const GptShape& g : kGptShapes) {
    if (model == g.name) gpt.shape = &g;
  }
  gpt.schemes = SplitCommas(schemes);
  if (gpt.schemes.empty()) return FlagError("train_bench", "--schemes: '' is not allowed (one or more of " + PresetNames() + ")");
  for (const std::string& scheme : gpt.schemes) {
    PrecisionScheme unused;
    if (!SchemeFromName(scheme, &unused).ok()) {
      return FlagError("train_bench", "--schemes: '" + scheme + "' is not allowed (comma-separated, each one of " +
                                          PresetNames() + ", each optionally followed by +bf16_head)");
    }
  }
  if (gpt.tokens_path.empty()) return FlagError("train_bench", "--tokens: '' is not allowed (a file path)");
  if (gpt.analytics_maps && gpt.analytics == 0) {
    return FlagError("train_bench", "--analytics-maps: not allowed without --analytics N (N >= 1)");
  }

  const std::string common = "backend: " + backend + "\nrun_dir: /tmp/keel-train-bench\noperand_stats: " +
                             (no_stats ? "false" : "true") + "\n";
  std::printf("train_bench: backend %s, %d timed steps after %d warm-up, operand stats %s, outlier analytics %s\n",
              backend.c_str(), gpt.steps, kWarmupSteps, no_stats ? "off" : "on",
              gpt.analytics == 0 ? "off"
                                 : ("off, then on every step (cost amortized over " + std::to_string(gpt.analytics) +
                                    " steps, top_k 8" + (gpt.analytics_maps ? ", block maps" : ", no maps") + ")")
                                       .c_str());
  if (gpt.probe > 0)
    std::printf("then with the gradient-bias probe on every step (%s reference; cost amortized over %d steps)\n",
                gpt.probe_reference.c_str(), gpt.probe);
  if (gpt.snapshots > 0)
    std::printf("then the policy's snapshots, in memory and as checkpoints on disk (cost amortized over %d steps)\n",
                gpt.snapshots);
  if (gpt.head_chunk_mib > 0)
    std::printf("GPT cases: a BF16 or MX head holds at most %lld MiB of fp32 logits at once (--head-chunk-mib)\n",
                static_cast<long long>(gpt.head_chunk_mib));
  if (only.empty() || only == "gpt") {
    const int code = RunGpt(common, gpt);
    if (code != 0) return code;
  }
  if (only.empty() || only == "proxy")
    return RunProxy(common, gpt.steps, gpt.profile, gpt.analytics, gpt.analytics_maps, gpt.probe, gpt.probe_reference,
                    gpt.snapshots);
  return 0;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) { return keel::Main(argc, argv); }
