// Sweep files (see sweep.h): parse, size, sample, expand, and validate every
// run through ParseRunConfig.
#include "server/sweep.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "kernels/base/splitmix64.h"
#include "server/scheduler.h"
#include "worker/io/yaml_strict.h"
#include "worker/config/run_config.h"
#include "worker/config/scheme_proto.h"

namespace keel {
namespace {

// Run configs are validated under this source name so that ParseRunConfig's own
// "source:line:col: " prefix (positions in a generated text) can be stripped
// and replaced by the position of the responsible node in the sweep file.
const char kInternalSource[] = "<sweep-run>";

const std::vector<std::string> kTopKeys = {"name",         "base",         "axes",     "resources",
                                           "max_concurrent", "max_restarts", "priority", "policy"};

std::string Join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string FlowText(const YAML::Node& node) {
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.c_str();
}

std::string BlockText(const YAML::Node& node) {
  YAML::Emitter e;
  e << YAML::Block << node;
  return std::string(e.c_str()) + "\n";
}

// The length of ParseRunConfig's "<sweep-run>:3:5: " or "<sweep-run>: " prefix of
// message, 0 when there is none. *line and *col get the position (1-based), or
// 0 when the prefix has none. Plain code: the rest of the message may hold user
// text of any length, which a backtracking matcher must never see.
size_t InternalPrefix(const std::string& message, int* line = nullptr, int* col = nullptr) {
  const std::string head = kInternalSource;
  if (line) *line = 0;
  if (col) *col = 0;
  if (message.compare(0, head.size(), head) != 0) return 0;
  size_t pos = head.size();
  // Reads ":digits" at pos into *value; false (pos unchanged) when absent.
  auto number = [&](size_t* at, int* value) {
    size_t p = *at;
    if (p >= message.size() || message[p] != ':') return false;
    ++p;
    int64_t v = 0;
    size_t digits = 0;
    while (p < message.size() && message[p] >= '0' && message[p] <= '9' && digits < 9) {
      v = v * 10 + (message[p] - '0');
      ++p;
      ++digits;
    }
    if (digits == 0) return false;
    *at = p;
    *value = static_cast<int>(v);
    return true;
  };
  int l = 0, c = 0;
  size_t after = pos;
  if (number(&after, &l) && number(&after, &c)) {
    pos = after;
  } else {
    l = c = 0;
  }
  if (message.compare(pos, 2, ": ") != 0) return 0;
  if (line) *line = l;
  if (col) *col = c;
  return pos + 2;
}

// "<sweep-run>:3:5: precision: ..." or "<sweep-run>: precision: ..." -> "precision: ...".
std::string StripInternal(const std::string& message) { return message.substr(InternalPrefix(message)); }

// The field a run-config message names ("precision.rounding: unknown ..." -> "precision.rounding").
std::string FieldOf(const std::string& stripped) {
  size_t colon = stripped.find(": ");
  return colon == std::string::npos ? "" : stripped.substr(0, colon);
}

bool PathCovers(const std::string& path, const std::string& field) {
  return field == path || field.compare(0, path.size() + 1, path + ".") == 0 ||
         path.compare(0, field.size() + 1, field + ".") == 0;
}

// Collects every error of a sweep file, each "source:line:col: field: what".
class Errors {
 public:
  explicit Errors(std::string source) : source_(std::move(source)) {}

  std::string Where(const YAML::Mark& m) const { return YamlWhere(source_, m); }
  void Add(const YAML::Mark& m, const std::string& field, const std::string& what) {
    AddLine(m, Where(m) + field + ": " + what);
  }
  void Add(const YAML::Node& n, const std::string& field, const std::string& what) {
    Add(n.Mark(), field, what);
  }
  // A full line written at mark `m` (for ordering); duplicates are dropped.
  void AddLine(const YAML::Mark& m, const std::string& text) {
    const std::string line = OneLine(text);  // echoed values may hold newlines
    if (seen_.insert(line).second) lines_.push_back({{m.line, m.column}, line});
  }
  bool empty() const { return lines_.empty(); }
  size_t size() const { return lines_.size(); }
  // The lines in file order (unpositioned first), at most kShown of them.
  Status ToStatus() const {
    const size_t kShown = 50;
    std::vector<std::pair<std::pair<int, int>, std::string>> sorted = lines_;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> shown;
    for (size_t i = 0; i < std::min(kShown, sorted.size()); ++i) shown.push_back(sorted[i].second);
    if (lines_.size() > kShown) shown.push_back("... and " + std::to_string(lines_.size() - kShown) + " more errors");
    return Status::InvalidArgument(Join(shown, "\n"));
  }
  const std::string& source() const { return source_; }

  // Scalar readers: on error they add a line and return false.
  bool Int(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi, int64_t* out) {
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
      Add(n, field, "'" + Text(n) + "' is not an integer");
      return false;
    }
    if (v < lo || v > hi) {
      Add(n, field, std::to_string(v) + " is out of range (allowed: " + std::to_string(lo) + " .. " +
                        std::to_string(hi) + ")");
      return false;
    }
    *out = v;
    return true;
  }
  bool Int(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi, int* out) {
    int64_t v;
    if (!Int(n, field, lo, hi, &v)) return false;
    *out = static_cast<int>(v);
    return true;
  }
  bool Number(const YAML::Node& n, const std::string& field, double* out) {
    double v;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
      Add(n, field, "'" + Text(n) + "' is not a finite number");
      return false;
    }
    *out = v;
    return true;
  }
  // Unknown keys of a mapping; false if `map` is not a mapping.
  bool Keys(const YAML::Node& map, const std::string& field, const std::vector<std::string>& allowed) {
    if (!map.IsMap()) {
      Add(map, field, "expected a mapping, got " + Text(map));
      return false;
    }
    for (auto it = map.begin(); it != map.end(); ++it) {
      std::string key = it->first.IsScalar() ? it->first.Scalar() : FlowText(it->first);
      bool ok = false;
      for (const std::string& a : allowed) ok = ok || a == key;
      if (!ok) {
        Add(it->first, field.empty() ? key : field + "." + key,
            "unknown key (allowed: " + Join(allowed, ", ") + ")");
      }
    }
    return true;
  }

  static std::string Text(const YAML::Node& n) {
    if (n.IsScalar()) return n.Scalar();
    return n.IsMap() ? "a mapping" : n.IsSequence() ? "a sequence" : "nothing";
  }

 private:
  std::string source_;
  std::vector<std::pair<std::pair<int, int>, std::string>> lines_;  // ((line, col), text)
  std::set<std::string> seen_;
};

// One value an axis column takes.
struct AxisValue {
  YAML::Node node;   // what is set at the path
  std::string text;  // its flow YAML text
  YAML::Mark mark;   // where it is written in the sweep file
};

// A dotted path and its values (all columns of one factor have equal length).
struct Column {
  std::string path;
  YAML::Mark key_mark;
  std::vector<AxisValue> values;
  bool sampled = false;  // random: report one error per column, not one per sample
};

// A factor of the cartesian product: a grid key, a zip entry or a random entry.
struct Factor {
  std::string label;  // for the size message: "grid precision", "zip lr,layers", "random"
  int64_t size = 0;
  std::vector<Column> columns;
  // random: sampled after the size check.
  bool random = false;
  YAML::Node random_params;
  uint64_t random_seed = 0;
};

std::string NumberText(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

bool ValidPath(const std::string& path) {
  if (path.empty() || path.front() == '.' || path.back() == '.') return false;
  if (path.find("..") != std::string::npos) return false;
  return path.find_first_of(" =\t") == std::string::npos;
}

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> keys;
  std::stringstream parts(path);
  for (std::string key; std::getline(parts, key, '.');) keys.push_back(key);
  return keys;
}

// Sets root[path] = value the way keel-train's --set does (worker/config/run_config.cc
// ApplyOverride): mappings are created on the way, and a preset name met on the
// way ("precision: mxfp4", path precision.rounding) becomes {preset: mxfp4}.
// Paths were checked by ParseRunConfig before, so a non-mapping is overwritten.
void SetPath(YAML::Node root, const std::string& path, const YAML::Node& value) {
  std::vector<std::string> keys = SplitPath(path);
  std::vector<YAML::Node> chain = {root};
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    YAML::Node next = chain.back()[keys[i]];
    if (!next.IsMap()) {
      YAML::Node map(YAML::NodeType::Map);
      if (next.IsDefined() && next.IsScalar() && keys[i] == "precision") map["preset"] = next.Scalar();
      chain.back()[keys[i]] = map;
    }
    chain.push_back(chain.back()[keys[i]]);
  }
  chain.back()[keys.back()] = YAML::Clone(value);
}

// The base mapping as text whose line:column positions are those of the sweep
// file: every character outside base is blanked (lines kept). Falls back to the
// emitted base (positions lost) when the blanked text does not read back as the
// same YAML. *exact tells which.
std::string BaseText(const std::string& text, const YAML::Node& root, const YAML::Node& base,
                     bool* exact) {
  *exact = false;
  std::string fallback = BlockText(base);
  const YAML::Mark start = base.Mark();
  if (start.line < 0) return fallback;
  // Base ends where the next top-level key (by position) begins.
  int end_line = std::numeric_limits<int>::max();
  for (auto it = root.begin(); it != root.end(); ++it) {
    YAML::Mark m = it->first.Mark();
    if (m.line == start.line && m.column > start.column) return fallback;  // one-line root
    if (m.line > start.line) end_line = std::min(end_line, m.line);
  }
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (int i = 0; i < static_cast<int>(lines.size()); ++i) {
    if (i == start.line) {
      std::string line = lines[i];
      if (static_cast<int>(line.size()) < start.column) return fallback;
      out += std::string(start.column, ' ') + line.substr(start.column);
    } else if (i > start.line && i < end_line) {
      out += lines[i];
    }
    out += "\n";
  }
  try {
    YAML::Node again = YAML::Load(out);
    if (BlockText(again) != fallback) return fallback;
  } catch (const YAML::Exception&) {
    return fallback;
  }
  *exact = true;
  return out;
}

// Reads a non-empty list of axis values.
bool ReadList(Errors* err, const YAML::Node& list, const std::string& field, Column* col) {
  if (!list.IsSequence() || list.size() == 0) {
    err->Add(list, field, "expected a non-empty list of values, got " + Errors::Text(list));
    return false;
  }
  for (const YAML::Node& v : list) col->values.push_back({v, FlowText(v), v.Mark()});
  return true;
}

// The paths swept so far, each with the position of its key: a path may be
// swept by one axis only.
using SweptPaths = std::map<std::string, YAML::Mark>;

// Claims `key` as a swept path (*path): it must be a dotted run-config path
// not swept by an earlier axis. On error adds a line and returns false.
bool ClaimPath(Errors* err, SweptPaths* paths, const YAML::Node& key, const std::string& field,
               std::string* path) {
  if (!key.IsScalar() || !ValidPath(key.Scalar())) {
    err->Add(key, field, "'" + Errors::Text(key) +
                             "' is not a run-config path (allowed: dotted keys, e.g. optimizer.lr)");
    return false;
  }
  *path = key.Scalar();
  auto seen = paths->find(*path);
  if (seen != paths->end()) {
    err->Add(key, field, "'" + *path + "' is already swept at line " +
                             std::to_string(seen->second.line + 1) + " (allowed: one axis per path)");
    return false;
  }
  (*paths)[*path] = key.Mark();
  return true;
}

// The body of a grid or zip entry is a mapping of path: [values]. False when
// it is not a mapping; an empty one is reported too, but reads as no paths.
bool CheckPathListMapping(Errors* err, const YAML::Node& body, const std::string& field) {
  if (!body.IsMap()) {
    err->Add(body, field, "expected a mapping of path: [values]");
    return false;
  }
  if (body.size() == 0) err->Add(body, field, "expected at least one path: [values]");
  return true;
}

// grid: {path: [values], ...}: one factor per path, so the runs are the
// product over its paths.
void ReadGrid(Errors* err, const YAML::Node& body, const std::string& field, SweptPaths* paths,
              std::vector<Factor>* factors) {
  if (!CheckPathListMapping(err, body, field)) return;
  for (auto it = body.begin(); it != body.end(); ++it) {
    Column col;
    if (!ClaimPath(err, paths, it->first, field, &col.path)) continue;
    col.key_mark = it->first.Mark();
    if (!ReadList(err, it->second, field + "." + col.path, &col)) continue;
    Factor factor;
    factor.label = "grid " + col.path;
    factor.size = static_cast<int64_t>(col.values.size());
    factor.columns.push_back(std::move(col));
    factors->push_back(std::move(factor));
  }
}

// A zip column (read from `list`) must have as many values as the zip's first.
bool ZipLengthMatches(Errors* err, const YAML::Node& list, const std::string& field, const Column& first,
                      const Column& col) {
  if (col.values.size() == first.values.size()) return true;
  err->Add(list, field + "." + col.path,
           "has " + std::to_string(col.values.size()) + " values but " + first.path + " has " +
               std::to_string(first.values.size()) + " (allowed: lists of equal length in a zip)");
  return false;
}

// zip: {path: [values], ...}: one factor whose paths move in step. Any error
// in the entry drops the whole factor.
void ReadZip(Errors* err, const YAML::Node& body, const std::string& field, SweptPaths* paths,
             std::vector<Factor>* factors) {
  if (!CheckPathListMapping(err, body, field)) return;
  Factor factor;
  std::vector<std::string> names;
  bool ok = true;
  for (auto it = body.begin(); it != body.end(); ++it) {
    Column col;
    if (!ClaimPath(err, paths, it->first, field, &col.path) ||
        !ReadList(err, it->second, field + "." + col.path, &col)) {
      ok = false;
      continue;
    }
    col.key_mark = it->first.Mark();
    names.push_back(col.path);
    if (!factor.columns.empty() && !ZipLengthMatches(err, it->second, field, factor.columns[0], col)) ok = false;
    factor.columns.push_back(std::move(col));
  }
  if (!ok || factor.columns.empty()) return;
  factor.label = "zip " + Join(names, ",");
  factor.size = static_cast<int64_t>(factor.columns[0].values.size());
  factors->push_back(std::move(factor));
}

// A random entry's count (1 .. 2^40, the factor's size) and seed (>= 0), both
// required. False when either is missing or bad (each is reported).
bool ReadCountAndSeed(Errors* err, const YAML::Node& body, const std::string& field, Factor* factor) {
  bool ok = true;
  if (!body["count"]) {
    err->Add(body, field + ".count", "missing (the number of samples)");
    ok = false;
  } else {
    ok = err->Int(body["count"], field + ".count", 1, int64_t(1) << 40, &factor->size) && ok;
  }
  int64_t seed = 0;
  if (!body["seed"]) {
    err->Add(body, field + ".seed", "missing (random axes are reproducible from their seed)");
    ok = false;
  } else {
    ok = err->Int(body["seed"], field + ".seed", 0, std::numeric_limits<int64_t>::max(), &seed) && ok;
  }
  factor->random_seed = static_cast<uint64_t>(seed);
  return ok;
}

// The [lo, hi] of a uniform or log_uniform distribution: two finite numbers,
// lo <= hi, and lo > 0 when `log`.
bool CheckRange(Errors* err, const YAML::Node& arg, const std::string& field, bool log) {
  double lo = 0, hi = 0;
  if (!arg.IsSequence() || arg.size() != 2) {
    err->Add(arg, field, "expected [lo, hi]");
    return false;
  }
  if (!err->Number(arg[0], field, &lo) || !err->Number(arg[1], field, &hi)) return false;
  if (lo > hi || (log && lo <= 0)) {
    err->Add(arg, field,
             "[" + arg[0].Scalar() + ", " + arg[1].Scalar() + "] is not a range (allowed: lo <= hi" +
                 (log ? ", lo > 0)" : ")"));
    return false;
  }
  return true;
}

// One random param's distribution: {uniform: [lo, hi]}, {log_uniform: [lo, hi]}
// or {choice: [values]}. Only checked here; Sample draws from it.
bool CheckDistribution(Errors* err, const YAML::Node& spec, const std::string& field) {
  if (!spec.IsMap() || spec.size() != 1) {
    err->Add(spec, field, "expected one of {uniform: [lo, hi]}, {log_uniform: [lo, hi]}, {choice: [values]}");
    return false;
  }
  const std::string dist = spec.begin()->first.as<std::string>("");
  const YAML::Node arg = spec.begin()->second;
  if (dist == "uniform" || dist == "log_uniform") return CheckRange(err, arg, field + "." + dist, dist == "log_uniform");
  if (dist == "choice") {
    if (arg.IsSequence() && arg.size() > 0) return true;
    err->Add(arg, field + ".choice", "expected a non-empty list of values");
    return false;
  }
  err->Add(spec.begin()->first, field, "unknown distribution '" + dist + "' (allowed: uniform, log_uniform, choice)");
  return false;
}

// random: {count, seed, params: {path: distribution, ...}}: one factor of
// `count` samples, drawn by Sample once the product size is allowed. Any error
// in the entry drops the whole factor.
void ReadRandom(Errors* err, const YAML::Node& body, const std::string& field, SweptPaths* paths,
                std::vector<Factor>* factors) {
  if (!err->Keys(body, field, {"count", "seed", "params"})) return;
  Factor factor;
  factor.label = "random";
  bool ok = ReadCountAndSeed(err, body, field, &factor);
  const YAML::Node params = body["params"];
  if (!params || !params.IsMap() || params.size() == 0) {
    err->Add(params ? params : body, field + ".params", "expected a mapping of path: {uniform|log_uniform|choice: ...}");
    return;
  }
  for (auto it = params.begin(); it != params.end(); ++it) {
    Column col;
    if (!ClaimPath(err, paths, it->first, field + ".params", &col.path)) {
      ok = false;
      continue;
    }
    col.key_mark = it->first.Mark();
    col.sampled = true;
    if (!CheckDistribution(err, it->second, field + ".params." + col.path)) {
      ok = false;
      continue;
    }
    factor.columns.push_back(std::move(col));
  }
  if (!ok) return;
  factor.random = true;
  factor.random_params = params;
  factors->push_back(std::move(factor));
}

// Parses `axes` (a list of one-key entries: grid, zip or random) into factors,
// random ones not sampled yet.
void ReadAxes(Errors* err, const YAML::Node& axes, std::vector<Factor>* factors) {
  if (!axes.IsSequence()) {
    err->Add(axes, "axes", "expected a list of {grid: ...}, {zip: ...} or {random: ...}");
    return;
  }
  SweptPaths paths;
  for (size_t i = 0; i < axes.size(); ++i) {
    const YAML::Node entry = axes[i];
    const std::string at = "axes[" + std::to_string(i) + "]";
    if (!entry.IsMap() || entry.size() != 1) {
      err->Add(entry, at, "expected one of {grid: ...}, {zip: ...}, {random: ...}");
      continue;
    }
    const std::string kind = entry.begin()->first.as<std::string>("");
    const YAML::Node body = entry.begin()->second;
    const std::string field = at + "." + kind;
    if (kind == "grid") {
      ReadGrid(err, body, field, &paths, factors);
    } else if (kind == "zip") {
      ReadZip(err, body, field, &paths, factors);
    } else if (kind == "random") {
      ReadRandom(err, body, field, &paths, factors);
    } else {
      err->Add(entry.begin()->first, field, "unknown axis kind (allowed: grid, zip, random)");
    }
  }
}

// Draws the samples of a random factor (columns in params order).
void Sample(Factor* factor) {
  SplitMix64 rng(factor->random_seed);
  std::vector<YAML::Node> specs;
  for (auto it = factor->random_params.begin(); it != factor->random_params.end(); ++it) {
    specs.push_back(it->second);
  }
  for (int64_t s = 0; s < factor->size; ++s) {
    for (size_t c = 0; c < factor->columns.size(); ++c) {
      const YAML::Node spec = specs[c];
      const std::string dist = spec.begin()->first.Scalar();
      const YAML::Node arg = spec.begin()->second;
      const double u = rng.Uniform01();
      AxisValue v;
      if (dist == "choice") {
        size_t n = arg.size();
        size_t k = std::min(n - 1, static_cast<size_t>(u * static_cast<double>(n)));
        v.node = arg[k];
        v.text = FlowText(v.node);
        v.mark = arg[k].Mark();
      } else {
        const double lo = arg[0].as<double>(), hi = arg[1].as<double>();
        double x = dist == "uniform" ? lo + u * (hi - lo)
                                     : std::exp(std::log(lo) + u * (std::log(hi) - std::log(lo)));
        x = std::min(hi, std::max(lo, x));
        v.text = NumberText(x);
        v.node = YAML::Node(v.text);
        v.mark = spec.Mark();
      }
      factor->columns[c].values.push_back(std::move(v));
    }
  }
}

// Checks each distinct value of each column against base alone (so an error
// points at the value in the sweep file); bad paths are reported at their key.
void CheckValues(Errors* err, const std::string& base_text, const std::vector<Factor>& factors) {
  for (const Factor& factor : factors) {
    for (const Column& col : factor.columns) {
      std::set<std::string> done;
      for (const AxisValue& v : col.values) {
        if (!done.insert(v.text).second) continue;
        RunConfig config;
        Status s = ParseRunConfig(base_text, kInternalSource, {col.path + "=" + v.text}, &config);
        if (s.ok()) continue;
        std::string msg = StripInternal(s.message());
        const std::string set_prefix = "--set " + col.path + ": ";
        if (msg.compare(0, set_prefix.size(), set_prefix) == 0) {  // ApplyOverride: the path crosses a non-mapping
          err->Add(col.key_mark, col.path, msg.substr(set_prefix.size()));
          break;
        }
        if (msg.compare(0, 6, "--set ") == 0) {  // the value itself (e.g. aliases expanded past a limit)
          err->Add(v.mark, col.path, msg.substr(msg.find(": ") + 2));
          if (col.sampled) break;
          continue;
        }
        if (msg.find("unknown key (allowed:") != std::string::npos && FieldOf(msg) != "") {
          std::string field = FieldOf(msg);
          if (col.path.compare(0, field.size(), field) == 0) {  // the path itself is unknown
            err->AddLine(col.key_mark, err->Where(col.key_mark) + msg);
            break;
          }
        }
        err->AddLine(v.mark, err->Where(v.mark) + msg);
        if (col.sampled) break;
      }
    }
  }
}

// The source name starts every message, so it is checked first, and a bad
// one is not echoed whole.
Status CheckSourceName(const std::string& source) {
  if (source.size() > kMaxSourceLength) {
    return Status::InvalidArgument(source.substr(0, 64) + "...:1:1: source: a name of " + std::to_string(source.size()) +
                         " characters is too long (allowed: at most " + std::to_string(kMaxSourceLength) +
                         " characters)");
  }
  for (size_t i = 0; i < source.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(source[i]);
    if (c < 0x20 || c == 0x7F) {
      return Status::InvalidArgument("sweep.yaml:1:1: source: a control character at offset " + std::to_string(i) +
                           " (allowed: a file name without control characters)");
    }
  }
  return Status::Ok();
}

// The readers of the top level take root as the same non-const handle that
// ExpandSweep holds (not a const reference): a non-const operator[] on a
// missing key records it in the map, a const one does not, so this keeps every
// lookup as it was when ExpandSweep was one function.

// name: required, a valid run name (kNameRule).
void ReadName(Errors* err, YAML::Node root, SweepPlan* plan) {
  if (!root["name"]) {
    err->Add(root, "name", std::string("missing (allowed: ") + kNameRule + ")");
  } else if (!root["name"].IsScalar()) {
    err->Add(root["name"], "name", "'" + Errors::Text(root["name"]) + "' is not allowed (allowed: " + kNameRule + ")");
  } else if (std::string problem = NameProblem(root["name"].Scalar()); !problem.empty()) {
    err->Add(root["name"], "name", problem);
  } else {
    plan->name = root["name"].Scalar();
  }
}

// What resources.gpus allows, for its errors.
constexpr char kGpusRule[] =
    "a whole number 1 .. 1024, or a fraction 0 < gpus < 1 in thousandths, e.g. 0.25";

// resources.gpus: a whole number 1 .. 1024 (*gpus, *milli 0), or a fraction
// of one GPU (*gpus 1, *milli its thousandths, 1 .. 999). A non-integer above
// 1 is refused.
bool ReadGpus(Errors* err, const YAML::Node& n, int* gpus, int* milli) {
  int64_t whole = 0;
  if (n.IsScalar() && YAML::convert<int64_t>::decode(n, whole)) {
    if (!err->Int(n, "resources.gpus", 1, 1024, gpus)) return false;
    *milli = 0;
    return true;
  }
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
    err->Add(n, "resources.gpus", "'" + Errors::Text(n) + "' is not a number (allowed: " + kGpusRule + ")");
    return false;
  }
  if (v >= 1 && v <= 1024 && v == std::floor(v)) {  // "2.0"
    *gpus = static_cast<int>(v);
    *milli = 0;
    return true;
  }
  const double thousandths = v * kGpuMilli;
  const int64_t rounded = std::llround(thousandths);
  if (v <= 0 || v >= 1 || rounded < 1 || rounded >= kGpuMilli || std::fabs(thousandths - rounded) > 1e-6) {
    const char* why = v >= 1 ? "a fraction above 1 GPU is not allowed"
                      : v <= 0 ? "is out of range"
                               : "is not a whole number of thousandths";
    err->Add(n, "resources.gpus", n.Scalar() + " " + (v >= 1 ? std::string("is not whole: ") + why : why) +
                                      " (allowed: " + kGpusRule + ")");
    return false;
  }
  *gpus = 1;
  *milli = static_cast<int>(rounded);
  return true;
}

// resources: {gpus: N} or {cpu_slots: N} (1 .. 1024), not both; or
// {hosts: H, gpus_per_host: G} (each 1 .. 1024, H x G at most 1024), with gpus
// allowed beside them only as H x G; absent: one CPU slot. gpus may be a
// fraction of one GPU (0 < gpus < 1), with gpu_memory_gb (GiB, optional)
// beside it and nowhere else.
void ReadResources(Errors* err, YAML::Node root, SweepPlan* plan) {
  const YAML::Node r = root["resources"];
  if (!r || !err->Keys(r, "resources", {"gpus", "cpu_slots", "hosts", "gpus_per_host", "gpu_memory_gb"})) return;
  const bool gang = r["hosts"] || r["gpus_per_host"];
  if (r["cpu_slots"] && (r["gpus"] || gang)) {
    err->Add(r, "resources", std::string(r["gpus"] ? "gpus" : r["hosts"] ? "hosts" : "gpus_per_host") +
                                 " and cpu_slots are both set (allowed: one of them)");
    return;
  }
  if (gang) {
    int hosts = 0, per_host = 0;
    bool ok = true;
    if (!r["hosts"]) {
      err->Add(r["gpus_per_host"], "resources.gpus_per_host",
               "needs resources.hosts (allowed: both, e.g. {hosts: 2, gpus_per_host: 4})");
      ok = false;
    } else {
      ok = err->Int(r["hosts"], "resources.hosts", 1, 1024, &hosts) && ok;
    }
    if (!r["gpus_per_host"]) {
      err->Add(r["hosts"], "resources.hosts",
               "needs resources.gpus_per_host (allowed: both, e.g. {hosts: 2, gpus_per_host: 4})");
      ok = false;
    } else {
      ok = err->Int(r["gpus_per_host"], "resources.gpus_per_host", 1, 1024, &per_host) && ok;
    }
    if (r["gpu_memory_gb"]) {
      err->Add(r["gpu_memory_gb"], "resources.gpu_memory_gb",
               "is not allowed with hosts and gpus_per_host (allowed: only beside a fractional gpus, e.g. "
               "{gpus: 0.25, gpu_memory_gb: 16})");
      ok = false;
    }
    if (!ok) return;
    const int64_t total = static_cast<int64_t>(hosts) * per_host;
    if (total > 1024) {
      err->Add(r, "resources", "hosts x gpus_per_host = " + std::to_string(hosts) + " x " + std::to_string(per_host) +
                                   " = " + std::to_string(total) + " GPUs (allowed: at most 1024)");
      return;
    }
    if (r["gpus"]) {
      int gpus = 0, milli = 0;
      if (!ReadGpus(err, r["gpus"], &gpus, &milli)) return;
      if (milli > 0 || gpus != total) {
        err->Add(r["gpus"], "resources.gpus",
                 r["gpus"].Scalar() + " is not hosts x gpus_per_host = " + std::to_string(hosts) + " x " +
                     std::to_string(per_host) + " (allowed: " + std::to_string(total) + ", or leave gpus out)");
        return;
      }
    }
    plan->hosts = hosts;
    plan->gpus_per_host = per_host;
    plan->gpus = static_cast<int>(total);
    plan->cpu_slots = 0;
  } else if (r["gpus"]) {
    int gpus = 0, milli = 0;
    if (!ReadGpus(err, r["gpus"], &gpus, &milli)) return;
    if (r["gpu_memory_gb"]) {
      if (milli == 0) {
        err->Add(r["gpu_memory_gb"], "resources.gpu_memory_gb",
                 "is not allowed with gpus: " + r["gpus"].Scalar() +
                     " (allowed: only beside a fractional gpus, e.g. {gpus: 0.25, gpu_memory_gb: 16})");
        return;
      }
      double gib = 0;
      if (!err->Number(r["gpu_memory_gb"], "resources.gpu_memory_gb", &gib)) return;
      if (gib <= 0 || gib > 1 << 20) {
        err->Add(r["gpu_memory_gb"], "resources.gpu_memory_gb",
                 r["gpu_memory_gb"].Scalar() + " is out of range (allowed: 0 < GiB <= 1048576)");
        return;
      }
      plan->gpu_memory_bytes = static_cast<int64_t>(std::llround(gib * (int64_t{1} << 30)));
    }
    plan->gpus = gpus;
    plan->gpu_milli = milli;
    plan->cpu_slots = 0;
  } else if (r["gpu_memory_gb"]) {
    err->Add(r["gpu_memory_gb"], "resources.gpu_memory_gb",
             "needs a fractional resources.gpus (allowed: e.g. {gpus: 0.25, gpu_memory_gb: 16})");
  } else if (r["cpu_slots"]) {
    err->Int(r["cpu_slots"], "resources.cpu_slots", 1, 1024, &plan->cpu_slots);
  }
}

// max_concurrent, max_restarts and priority: optional integers in their ranges.
void ReadLimits(Errors* err, YAML::Node root, SweepPlan* plan) {
  if (root["max_concurrent"]) {
    err->Int(root["max_concurrent"], "max_concurrent", 0, 1 << 20, &plan->max_concurrent);
  }
  if (root["max_restarts"]) err->Int(root["max_restarts"], "max_restarts", 0, 1000, &plan->max_restarts);
  if (root["priority"]) {
    err->Int(root["priority"], "priority", std::numeric_limits<int32_t>::min(),
             std::numeric_limits<int32_t>::max(), &plan->priority);
  }
}

// policy: optional, a mapping or a policy's name (`policy: default`). Checked
// here, on the sweep file's own nodes, so errors carry its lines; every run
// then gets it as its config's policy section.
void ReadPolicy(Errors* err, YAML::Node root, const std::string& source, SweepPlan* plan) {
  const YAML::Node p = root["policy"];
  if (!p) return;
  if (!p.IsMap() && !p.IsScalar()) {
    err->Add(p, "policy", "expected a mapping or a policy name, got " + Errors::Text(p));
    return;
  }
  Policy policy;
  Status ps = ParsePolicyNode(p, source, &policy);
  if (!ps.ok()) {
    err->AddLine(p.Mark(), ps.message());
  } else {
    plan->policy_yaml = BlockText(p);
  }
}

// The top level's keys, and its settings other than base and axes.
void ReadSettings(Errors* err, YAML::Node root, const std::string& source, SweepPlan* plan) {
  err->Keys(root, "", kTopKeys);
  ReadName(err, root, plan);
  ReadResources(err, root, plan);
  ReadLimits(err, root, plan);
  ReadPolicy(err, root, source, plan);
}

// Where an error of base (parsed from BaseText) is reported: at the position
// ParseRunConfig gave when base_text keeps the sweep file's positions
// (`exact`), else at base itself.
YAML::Mark BaseErrorMark(const Status& s, const YAML::Node& base, bool exact) {
  YAML::Mark where = base.Mark();
  int line = 0, col = 0;
  if (exact && InternalPrefix(s.message(), &line, &col) > 0 && line > 0 && col > 0) {
    where.line = line - 1;
    where.column = col - 1;
  }
  return where;
}

// base: required, a run config, validated alone, at its own positions.
// *base_text gets its text (see BaseText); true when it parses.
bool ReadBase(Errors* err, const std::string& yaml_text, const YAML::Node& root, const YAML::Node& base,
              std::string* base_text) {
  if (!base) {
    err->Add(root, "base", "missing (a keel-train run config)");
    return false;
  }
  if (!base.IsMap()) {
    err->Add(base, "base", "expected a mapping (a keel-train run config), got " + Errors::Text(base));
    return false;
  }
  bool exact = false;
  *base_text = BaseText(yaml_text, root, base, &exact);
  RunConfig config;
  Status s = ParseRunConfig(*base_text, kInternalSource, {}, &config);
  if (s.ok()) return true;
  const YAML::Mark where = BaseErrorMark(s, base, exact);
  err->AddLine(where, err->Where(where) + "base." + StripInternal(s.message()));
  return false;
}

// The number of runs, the product of the factors' sizes, into *total; false,
// with an error at axes, when it is over limits.max_runs (or over int64).
bool CheckRunCount(Errors* err, YAML::Node root, const std::vector<Factor>& factors, const SweepLimits& limits,
                   int64_t* total) {
  *total = 1;
  bool saturated = false;
  std::vector<std::string> sizes;
  for (const Factor& f : factors) {
    sizes.push_back(f.label + " (" + std::to_string(f.size) + ")");
    if (*total > std::numeric_limits<int64_t>::max() / std::max<int64_t>(f.size, 1)) {
      saturated = true;
    } else {
      *total *= f.size;
    }
  }
  if (!saturated && *total <= limits.max_runs) return true;
  err->Add(root["axes"], "axes",
           Join(sizes, " x ") + " = " + (saturated ? "more than 2^63" : std::to_string(*total)) +
               " runs, more than the limit of " + std::to_string(limits.max_runs) + " (allowed: at most " +
               std::to_string(limits.max_runs) + " runs per sweep)");
  return false;
}

// One expanded run before it is checked, and for each column set in it (in
// axis order) the value chosen, to place an error at the value responsible.
struct DraftRun {
  ExpandedRun run;
  std::vector<const Column*> columns;
  std::vector<const AxisValue*> values;
};

// Run r of the product (the first factor varies slowest): base, with the
// sweep's policy when base has none of its own, and each column's value.
DraftRun Draft(YAML::Node root, const YAML::Node& base, const std::vector<Factor>& factors, int64_t r) {
  std::vector<int64_t> index(factors.size());
  int64_t rest = r;
  for (size_t f = factors.size(); f-- > 0;) {
    index[f] = rest % factors[f].size;
    rest /= factors[f].size;
  }
  YAML::Node node = YAML::Clone(base);
  if (root["policy"] && !node["policy"]) node["policy"] = YAML::Clone(root["policy"]);
  DraftRun draft;
  for (size_t f = 0; f < factors.size(); ++f) {
    for (const Column& col : factors[f].columns) {
      const AxisValue& v = col.values[index[f]];
      SetPath(node, col.path, v.node);
      draft.run.axes.emplace_back(col.path, v.text);
      draft.values.push_back(&v);
      draft.columns.push_back(&col);
    }
  }
  draft.run.yaml = BlockText(node);
  return draft;
}

// An error of run r's emitted config: at the value of the first column whose
// path covers the field it names (else at axes), naming the run and its values.
void ReportRunError(Errors* err, YAML::Node root, const DraftRun& draft, int64_t r, const Status& s) {
  const std::string msg = StripInternal(s.message());
  const std::string field = FieldOf(msg);
  YAML::Mark where = root["axes"].Mark();
  for (size_t c = 0; c < draft.columns.size(); ++c) {
    if (PathCovers(draft.columns[c]->path, field)) {
      where = draft.values[c]->mark;
      break;
    }
  }
  std::vector<std::string> desc;
  for (const auto& a : draft.run.axes) desc.push_back(a.first + "=" + a.second);
  err->AddLine(where, err->Where(where) + msg + " (in run " + std::to_string(r) + ": " + Join(desc, ", ") + ")");
}

// Expands all `total` runs into plan->runs. Each run is emitted, then parsed as
// stored, so combinations (e.g. gpt width x heads) are checked too.
void ExpandRuns(Errors* err, YAML::Node root, const YAML::Node& base, const std::vector<Factor>& factors,
                int64_t total, SweepPlan* plan) {
  for (int64_t r = 0; r < total; ++r) {
    DraftRun draft = Draft(root, base, factors, r);
    RunConfig config;
    Status s = ParseRunConfig(draft.run.yaml, kInternalSource, {}, &config);
    if (!s.ok()) {
      ReportRunError(err, root, draft, r, s);
      continue;
    }
    plan->runs.push_back(std::move(draft.run));
  }
}

}  // namespace

Status ExpandSweep(const std::string& yaml_text, const std::string& source,
                   const SweepLimits& limits, SweepPlan* out) {
  KEEL_RETURN_IF_ERROR(CheckSourceName(source));
  Errors err(source);
  YAML::Node root;
  Status loaded = LoadYamlStrict(yaml_text, source, &root);
  if (!loaded.ok()) return loaded;
  if (!root.IsMap()) {
    err.Add(root, "sweep", "expected a mapping at the top level (keys: " + Join(kTopKeys, ", ") + ")");
    return err.ToStatus();
  }
  SweepPlan plan;
  plan.source_yaml = yaml_text;
  plan.source = source;
  try {
    ReadSettings(&err, root, source, &plan);
    const YAML::Node base = root["base"];
    std::string base_text;
    const bool base_ok = ReadBase(&err, yaml_text, root, base, &base_text);
    // Axes: structure, then the size, then (only if the size is allowed) values.
    std::vector<Factor> factors;
    if (const YAML::Node axes = root["axes"]) ReadAxes(&err, axes, &factors);
    int64_t total = 0;
    if (CheckRunCount(&err, root, factors, limits, &total)) {
      for (Factor& f : factors) {
        if (f.random) Sample(&f);
      }
      // Against a broken base every value would fail with base's error.
      if (base_ok) CheckValues(&err, base_text, factors);
    }
    if (!err.empty()) return err.ToStatus();
    ExpandRuns(&err, root, base, factors, total, &plan);
  } catch (const YAML::Exception& e) {
    err.Add(e.mark, "sweep", e.what());
  }
  if (!err.empty()) return err.ToStatus();
  *out = std::move(plan);
  return Status::Ok();
}

void PlanToMessages(const SweepPlan& plan, const std::string& sweep_id,
                    const std::function<std::string(int)>& run_id, int64_t now_unix_ms,
                    v1::Sweep* sweep, std::vector<v1::Run>* runs) {
  sweep->Clear();
  sweep->set_id(sweep_id);
  sweep->set_name(plan.name);
  sweep->set_state(v1::SWEEP_ACTIVE);
  sweep->mutable_spec()->set_yaml(plan.source_yaml);
  sweep->mutable_spec()->set_source(plan.source);
  sweep->set_created_unix_ms(now_unix_ms);
  sweep->set_runs_total(static_cast<int32_t>(plan.runs.size()));
  (*sweep->mutable_runs_by_state())[v1::RunState_Name(v1::QUEUED)] = static_cast<int32_t>(plan.runs.size());
  runs->clear();
  runs->reserve(plan.runs.size());
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const ExpandedRun& er = plan.runs[i];
    v1::Run run;
    run.set_id(run_id(static_cast<int>(i)));
    run.set_sweep_id(sweep_id);
    run.set_state(v1::QUEUED);
    run.mutable_spec()->set_yaml(er.yaml);
    for (const auto& a : er.axes) (*run.mutable_axes())[a.first] = a.second;
    // The plan's runs were validated by ExpandSweep; parse for the scheme name and steps.
    RunConfig config;
    if (ParseRunConfig(er.yaml, kInternalSource, {}, &config).ok()) {
      run.set_precision(config.precision.name);
      SchemeToProto(config.precision, run.mutable_scheme());
      run.set_steps(config.steps);
    }
    run.set_created_unix_ms(now_unix_ms);
    run.set_updated_unix_ms(now_unix_ms);
    runs->push_back(std::move(run));
  }
}

}  // namespace keel
