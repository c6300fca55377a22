// The JSON and CRC-32 work on Keel's hot paths, through Keel's own API, with the
// libraries Debian ships measured beside it in the same run:
//   1. metric writing: StepMetrics::ToJson, what keel-train does once per step;
//   2. metric ingest: ParseMetricLine, what keel-worker does for every line it
//      tails from metrics.jsonl and keeld for a run's latest line; ParseJson
//      alone (the tree, no field look-ups) and ParseJsonBytewise (the parser
//      ParseJson was before simdjson) beside it;
//   3. CRC-32 over a buffer, what a checkpoint's safetensors write and load do.
// The lines are those of two real runs' shapes: GPT-2 124M (12 blocks, 49
// linears x 6 quantized roles = 294 operands, a probe every 100th step) and
// the proxy (4 blocks x 2 linears). Each case is timed `--reps` times; the
// median is printed.
//   json_bench [--lines N] [--proxy-lines N] [--crc-mib M] [--reps R]
#include <time.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "kernels/base/host.h"
#include "worker/io/crc32.h"
#include "worker/io/json.h"
#include "worker/run/step_metrics.h"

namespace keel {
namespace {

// A ratio count / total as the trainer computes it: many significant digits,
// like the real saturated fractions and norms.
double Ratio(std::mt19937_64& rng, double scale) {
  const double total = 1 << 20;
  return scale * static_cast<double>(rng() % (1 << 20)) / total;
}

// One step of a run shaped like keel-train's: `blocks` blocks whose linears are
// `linears` (prefixed "h.L." for the GPT, "blocks.L." for the proxy), all six
// roles quantized, per-group norms, layernorm gains and, every `probe_every`
// steps, the gradient-bias probe.
StepMetrics MakeStep(int64_t step, int blocks, const std::vector<std::string>& linears,
                     const std::string& prefix, bool lm_head, std::vector<std::string> ln_names,
                     int probe_every, std::mt19937_64& rng) {
  StepMetrics m;
  m.step = step;
  m.unix_ms = 1767225600000 + step * 81;
  m.attempt = 1;
  m.loss = 3.0 + Ratio(rng, 2.0);
  m.lr = 6e-4 * (1.0 - static_cast<double>(step) / 100000.0);
  m.tokens_per_s = 200000.0 + Ratio(rng, 5000.0);
  m.step_seconds = 0.08 + Ratio(rng, 0.001);
  m.grad_norm = Ratio(rng, 3.0);
  m.update_ratio = Ratio(rng, 1e-3);
  m.scheme = "mxfp8_e4m3";
  std::vector<std::string> groups = {"embed"};
  for (int l = 0; l < blocks; ++l) groups.push_back(std::to_string(l));
  groups.push_back("final");
  for (const std::string& g : groups) {
    m.grad_norms.push_back({g, Ratio(rng, 1.0)});
    m.update_ratios.push_back({g, Ratio(rng, 1e-3)});
  }
  for (int l = 0; l < blocks; ++l) {
    for (const std::string& n : ln_names) {
      m.ln_gamma.push_back({prefix + std::to_string(l) + "." + n, 1.0 + Ratio(rng, 0.1), Ratio(rng, 0.05)});
    }
  }
  std::vector<std::string> names;
  for (int l = 0; l < blocks; ++l) {
    for (const std::string& n : linears) names.push_back(prefix + std::to_string(l) + "." + n);
  }
  if (lm_head) names.push_back("lm_head");
  for (const std::string& n : names) {
    for (int r = 0; r < kRoleCount; ++r) {
      // Most operands saturate rarely; some never (an exact 0 in the line).
      const double sat = (rng() % 4 == 0) ? 0.0 : Ratio(rng, 1e-3);
      m.operands.push_back({n, static_cast<Role>(r), sat, 0.0});
    }
  }
  if (probe_every > 0 && step % probe_every == 0) {
    m.probed = true;
    m.probe = {0.9 + Ratio(rng, 0.1), Ratio(rng, 0.3), -Ratio(rng, 0.1)};
    for (const std::string& g : groups) {
      m.probe_layers.push_back({g, {0.9 + Ratio(rng, 0.1), Ratio(rng, 0.3), -Ratio(rng, 0.1)}});
    }
  }
  return m;
}

std::vector<StepMetrics> GptSteps(int n) {
  std::mt19937_64 rng(124);
  std::vector<StepMetrics> steps;
  for (int i = 1; i <= n; ++i) {
    steps.push_back(MakeStep(i, 12, {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}, "h.", true,
                             {"ln_1.weight", "ln_2.weight"}, 100, rng));
  }
  return steps;
}

std::vector<StepMetrics> ProxySteps(int n) {
  std::mt19937_64 rng(4);
  std::vector<StepMetrics> steps;
  for (int i = 1; i <= n; ++i) {
    steps.push_back(MakeStep(i, 4, {"fc1", "fc2"}, "blocks.", false, {"ln.weight"}, 100, rng));
  }
  return steps;
}

// Median over `reps` timings of fn(), in seconds of this thread's CPU time:
// the 2-core machine is shared, and wall time would count the other tenants.
double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double Median(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double start = ThreadSeconds();
    fn();
    t.push_back(ThreadSeconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void Report(const char* group, const std::string& what, double seconds, size_t items, size_t bytes) {
  std::printf("  %-9s %-58s %9.2f us/line %8.1f MB/s\n", group, what.c_str(), seconds * 1e6 / items,
              bytes / seconds / 1e6);
}

// The library baselines: the same fields ParseMetricLine extracts (a missing or
// non-numeric value reads as NaN), straight from each library's own tree.
double NlohmannNumber(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end()) return std::nan("");
  if (it->is_number()) return it->get<double>();
  return std::nan("");  // (the non-finite strings are not exercised: all values are finite)
}

// The top-level numbers of a metric line, through a library's `number(object, key)`.
template <typename Object, typename Number>
void TopLevelFields(const Object& v, Number number, MetricLine* m) {
  m->step = static_cast<int64_t>(number(v, "step"));
  m->loss = number(v, "loss");
  m->lr = number(v, "lr");
  m->tokens_per_s = number(v, "tokens_per_s");
  m->grad_norm = number(v, "grad_norm");
}

bool NlohmannMetricLine(const std::string& line, MetricLine* out) {
  nlohmann::json v = nlohmann::json::parse(line, nullptr, false);
  if (!v.is_object()) return false;
  MetricLine m;
  TopLevelFields(v, NlohmannNumber, &m);
  auto probe = v.find("probe");
  if (probe != v.end()) {
    m.has_probe = true;
    m.probe_cosine = NlohmannNumber(*probe, "cosine");
    m.probe_zeta = NlohmannNumber(*probe, "zeta");
  }
  auto quant = v.find("quant");
  if (quant != v.end()) {
    for (const auto& layer : quant->items()) {
      for (const auto& role : layer.value().items()) {
        m.has_saturation = true;
        m.max_saturated = std::max(m.max_saturated, NlohmannNumber(role.value(), "saturated"));
      }
    }
  }
  *out = m;
  return true;
}

double SimdNumber(simdjson::dom::object o, const char* key) {
  double d;
  if (o[key].get_double().get(d) != simdjson::SUCCESS) {
    int64_t i;
    if (o[key].get_int64().get(i) != simdjson::SUCCESS) return std::nan("");
    return static_cast<double>(i);
  }
  return d;
}

bool SimdDomMetricLine(simdjson::dom::parser& parser, const std::string& line, MetricLine* out) {
  simdjson::dom::object v;
  if (parser.parse(line).get_object().get(v) != simdjson::SUCCESS) return false;
  MetricLine m;
  TopLevelFields(v, SimdNumber, &m);
  simdjson::dom::object probe;
  if (v["probe"].get_object().get(probe) == simdjson::SUCCESS) {
    m.has_probe = true;
    m.probe_cosine = SimdNumber(probe, "cosine");
    m.probe_zeta = SimdNumber(probe, "zeta");
  }
  simdjson::dom::object quant;
  if (v["quant"].get_object().get(quant) == simdjson::SUCCESS) {
    for (auto layer : quant) {
      simdjson::dom::object roles;
      if (layer.value.get_object().get(roles) != simdjson::SUCCESS) continue;
      for (auto role : roles) {
        simdjson::dom::object r;
        if (role.value.get_object().get(r) != simdjson::SUCCESS) continue;
        m.has_saturation = true;
        m.max_saturated = std::max(m.max_saturated, SimdNumber(r, "saturated"));
      }
    }
  }
  *out = m;
  return true;
}

// The candidate from nlohmann_json for ParseJson behind keel's API: its SAX
// interface filling the JsonValue every caller reads (no nlohmann::json in
// between). It refuses duplicate keys like ParseJson but leaves out its error
// messages. (The simdjson candidate became ParseJson itself; json.cc.)
class NlohmannSax {
 public:
  bool null() { return Put(JsonValue()); }
  bool boolean(bool v) { return Put(JsonValue(v)); }
  bool number_integer(int64_t v) { return Put(JsonValue(v)); }
  bool number_unsigned(uint64_t v) { return Put(JsonValue(v)); }
  bool number_float(double v, const std::string&) { return Put(JsonValue(v)); }
  bool string(std::string& v) { return Put(JsonValue(std::move(v))); }
  bool binary(nlohmann::json::binary_t&) { return false; }
  bool start_object(size_t) {
    stack_.push_back({JsonValue::Object(), {}});
    return true;
  }
  bool key(std::string& k) {
    if (stack_.back().value.Find(k) != nullptr) return false;
    stack_.back().key = std::move(k);
    return true;
  }
  bool start_array(size_t) {
    stack_.push_back({JsonValue::Array(), {}});
    return true;
  }
  bool end_object() { return Pop(); }
  bool end_array() { return Pop(); }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
  JsonValue& result() { return result_; }

 private:
  struct Open {
    JsonValue value;
    std::string key;
  };
  bool Put(JsonValue v) {
    if (stack_.empty()) {
      result_ = std::move(v);
    } else if (stack_.back().value.is_object()) {
      stack_.back().value.Set(stack_.back().key, std::move(v));
    } else {
      stack_.back().value.Append(std::move(v));
    }
    return true;
  }
  bool Pop() {
    JsonValue v = std::move(stack_.back().value);
    stack_.pop_back();
    return Put(std::move(v));
  }
  std::vector<Open> stack_;
  JsonValue result_;
};

bool NlohmannParseJson(const std::string& text, JsonValue* out) {
  NlohmannSax sax;
  if (!nlohmann::json::sax_parse(text, &sax)) return false;
  *out = std::move(sax.result());
  return true;
}

// The writer baseline: the same object built as an nlohmann::ordered_json
// (insertion order, as the metrics line has it) and dumped.
std::string NlohmannLine(const StepMetrics& s) {
  nlohmann::ordered_json o;
  o["step"] = s.step;
  if (s.attempt > 0) o["attempt"] = s.attempt;
  o["unix_ms"] = s.unix_ms;
  o["loss"] = s.loss;
  o["lr"] = s.lr;
  o["tokens_per_s"] = s.tokens_per_s;
  o["step_ms"] = s.step_seconds * 1e3;
  o["scheme"] = s.scheme;
  o["grad_norm"] = s.grad_norm;
  nlohmann::ordered_json& g = o["grad_norm_layers"] = nlohmann::ordered_json::object();
  for (const GroupValue& v : s.grad_norms) g[v.name] = v.value;
  o["update_ratio"] = s.update_ratio;
  nlohmann::ordered_json& u = o["update_ratio_layers"] = nlohmann::ordered_json::object();
  for (const GroupValue& v : s.update_ratios) u[v.name] = v.value;
  nlohmann::ordered_json& ln = o["ln_gamma"] = nlohmann::ordered_json::object();
  for (const StepMetrics::LnGamma& v : s.ln_gamma) ln[v.name] = {{"mean", v.mean}, {"std", v.std}};
  nlohmann::ordered_json& q = o["quant"] = nlohmann::ordered_json::object();
  for (const OperandMetric& op : s.operands) {
    q[op.linear][RoleName(op.role)] = {{"saturated", op.saturated}, {"nan_blocks", op.nan_blocks}};
  }
  if (s.probed) {
    nlohmann::ordered_json& p = o["probe"];
    p["cosine"] = s.probe.cosine;
    p["rel_error"] = s.probe.rel_error;
    p["zeta"] = s.probe.zeta;
    nlohmann::ordered_json& layers = p["layers"] = nlohmann::ordered_json::object();
    for (const ProbeLayer& l : s.probe_layers) {
      layers[l.name] = {{"cosine", l.values.cosine}, {"rel_error", l.values.rel_error}, {"zeta", l.values.zeta}};
    }
  }
  if (s.evaluated) o["val_loss"] = s.val_loss;
  if (s.skipped) o["skipped"] = true;
  return o.dump();
}

void BenchLines(const char* shape, const std::vector<StepMetrics>& steps, int reps) {
  std::vector<std::string> lines(steps.size());
  size_t bytes = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    lines[i] = steps[i].ToJson();
    bytes += lines[i].size();
  }
  std::printf("%s: %zu lines, %.0f bytes per line on average (%.1f MB)\n", shape, lines.size(),
              static_cast<double>(bytes) / lines.size(), bytes / 1e6);
  const size_t n = lines.size();
  size_t sink = 0;  // keeps the optimizer from dropping the work

  // 1. Writing.
  Report("write", "keel: StepMetrics::ToJson", Median(reps, [&] {
           for (const StepMetrics& s : steps) sink += s.ToJson().size();
         }), n, bytes);
  size_t nl_bytes = 0;
  for (const StepMetrics& s : steps) nl_bytes += NlohmannLine(s).size();
  Report("write", "nlohmann::ordered_json built and dump()ed (baseline)", Median(reps, [&] {
           for (const StepMetrics& s : steps) sink += NlohmannLine(s).size();
         }), n, nl_bytes);

  // 2. Ingest. A metric-line parser fills one MetricLine, reused across lines
  // as keel-worker does; a tree parser builds a JsonValue per line.
  auto ingest_fields = [&](const char* name, auto parse) {
    Report("ingest", name, Median(reps, [&] {
             MetricLine m;
             for (const std::string& l : lines) {
               if (!parse(l, &m)) std::abort();
               sink += static_cast<size_t>(m.step);
             }
           }), n, bytes);
  };
  auto ingest_tree = [&](const char* name, auto parse) {
    Report("ingest", name, Median(reps, [&] {
             for (const std::string& l : lines) {
               JsonValue v;
               if (!parse(l, &v)) std::abort();
               sink += v.size();
             }
           }), n, bytes);
  };
  ingest_fields("keel: ParseMetricLine",
                [](const std::string& l, MetricLine* m) { return ParseMetricLine(l, m).ok(); });
  ingest_tree("keel: ParseJson (the tree only)",
              [](const std::string& l, JsonValue* v) { return ParseJson(l, v).ok(); });
  ingest_fields("nlohmann::json::parse + the same fields (baseline)",
                [](const std::string& l, MetricLine* m) { return NlohmannMetricLine(l, m); });
  simdjson::dom::parser parser;
  ingest_fields("simdjson dom::parser + the same fields (baseline)",
                [&parser](const std::string& l, MetricLine* m) { return SimdDomMetricLine(parser, l, m); });
  ingest_tree("keel: ParseJsonBytewise (refusals only; was ParseJson)",
              [](const std::string& l, JsonValue* v) { return ParseJsonBytewise(l, v).ok(); });
  ingest_tree("candidate: nlohmann SAX -> JsonValue",
              [](const std::string& l, JsonValue* v) { return NlohmannParseJson(l, v); });

  // Serialization alone, of trees built beforehand (the lines parsed).
  std::vector<JsonValue> trees(n);
  std::vector<nlohmann::ordered_json> nl_trees(n);
  for (size_t i = 0; i < n; ++i) {
    if (!ParseJson(lines[i], &trees[i]).ok()) std::abort();
    nl_trees[i] = nlohmann::ordered_json::parse(lines[i]);
  }
  size_t dump_bytes = 0;
  for (const nlohmann::ordered_json& t : nl_trees) dump_bytes += t.dump().size();
  Report("serialize", "keel: ToJson(JsonValue)", Median(reps, [&] {
           for (const JsonValue& t : trees) sink += ToJson(t).size();
         }), n, bytes);
  Report("serialize", "nlohmann: ordered_json::dump()", Median(reps, [&] {
           for (const nlohmann::ordered_json& t : nl_trees) sink += t.dump().size();
         }), n, dump_bytes);

  // Check that the baselines read what keel reads (all values here are finite).
  for (size_t i = 0; i < n; i += 97) {
    MetricLine a, b, c;
    if (!ParseMetricLine(lines[i], &a).ok() || !NlohmannMetricLine(lines[i], &b) ||
        !SimdDomMetricLine(parser, lines[i], &c) || a.step != b.step || a.step != c.step ||
        a.max_saturated != b.max_saturated || a.max_saturated != c.max_saturated || a.loss != b.loss ||
        a.loss != c.loss || a.probe_zeta != b.probe_zeta || a.probe_zeta != c.probe_zeta) {
      std::fprintf(stderr, "json_bench: the baselines disagree with ParseMetricLine on line %zu\n", i);
      std::exit(1);
    }
    JsonValue x, y, z;
    if (!ParseJson(lines[i], &x).ok() || !ParseJsonBytewise(lines[i], &y).ok() ||
        !NlohmannParseJson(lines[i], &z) || !(x == y) || !(x == z)) {
      std::fprintf(stderr, "json_bench: a candidate's tree differs from ParseJson's on line %zu\n", i);
      std::exit(1);
    }
  }
  if (sink == 42) std::printf(" ");
}

void BenchCrc(size_t mib, int reps) {
  std::vector<unsigned char> data(mib << 20);
  std::mt19937_64 rng(32);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t r = rng();
    std::copy(reinterpret_cast<const unsigned char*>(&r), reinterpret_cast<const unsigned char*>(&r) + 8, &data[i]);
  }
  std::printf("crc32: %zu MiB of random bytes\n", mib);
  uint32_t keel_crc = 0, zlib_crc = 0;
  const double keel_s = Median(reps, [&] { keel_crc = Crc32(0, data.data(), data.size()); });
  // zlib's length argument is 32-bit (uInt): feed it 1 GiB at most at a time.
  const double zlib_s = Median(reps, [&] {
    uLong c = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < data.size(); off += size_t{1} << 30) {
      c = crc32(c, data.data() + off, static_cast<uInt>(std::min(data.size() - off, size_t{1} << 30)));
    }
    zlib_crc = static_cast<uint32_t>(c);
  });
  std::printf("  %-9s %-58s %9.2f ms      %8.1f MB/s\n", "crc32", "keel: Crc32", keel_s * 1e3,
              data.size() / keel_s / 1e6);
  std::printf("  %-9s %-58s %9.2f ms      %8.1f MB/s\n", "crc32", "zlib crc32() (baseline)", zlib_s * 1e3,
              data.size() / zlib_s / 1e6);
  if (keel_crc != zlib_crc) {
    std::fprintf(stderr, "json_bench: Crc32 %08x != zlib %08x\n", keel_crc, zlib_crc);
    std::exit(1);
  }
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  int lines = 1000, proxy_lines = 10000, crc_mib = 64, reps = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return std::fprintf(stderr, "json_bench: %s needs a value\n", a.c_str()), 2;
    const int v = std::atoi(argv[++i]);
    if (v <= 0) return std::fprintf(stderr, "json_bench: %s is %s, expected a positive integer\n", a.c_str(), argv[i]), 2;
    if (a == "--lines") {
      lines = v;
    } else if (a == "--proxy-lines") {
      proxy_lines = v;
    } else if (a == "--crc-mib") {
      crc_mib = v;
    } else if (a == "--reps") {
      reps = v;
    } else {
      return std::fprintf(stderr, "json_bench: unknown flag %s (--lines, --proxy-lines, --crc-mib, --reps)\n", a.c_str()), 2;
    }
  }
#ifdef __OPTIMIZE__
  const char* optimized = "optimized";
#else
  const char* optimized = "NOT optimized";
#endif
  std::printf("json_bench: CPU %s, %u hardware threads; g++ %s, %s build (.bazelrc: -O2); "
              "simdjson %d.%d.%d (%s kernel), nlohmann_json %d.%d.%d, zlib %s; median of %d\n",
              keel::CpuModel().c_str(), std::thread::hardware_concurrency(), __VERSION__, optimized,
              simdjson::SIMDJSON_VERSION_MAJOR, simdjson::SIMDJSON_VERSION_MINOR,
              simdjson::SIMDJSON_VERSION_REVISION, simdjson::get_active_implementation()->name().c_str(),
              NLOHMANN_JSON_VERSION_MAJOR, NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH,
              zlibVersion(), reps);
  keel::BenchLines("GPT-2 124M lines (294 operands, probe every 100th)", keel::GptSteps(lines), reps);
  keel::BenchLines("proxy L4 lines (48 operands, probe every 100th)", keel::ProxySteps(proxy_lines), reps);
  keel::BenchCrc(static_cast<size_t>(crc_mib), reps);
  return 0;
}
