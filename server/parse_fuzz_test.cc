// A deterministic mutation fuzzer for the two parsers of user text: sweep
// files (ExpandSweep) and run configs (ParseRunConfig). It starts from the
// repository's examples and a few inline seeds, mutates them with a fixed seed
// (byte flips, inserted/deleted/duplicated lines and characters, splices
// between files, deep nesting, long strings, duplicate keys, YAML tokens) and
// pins, for every input: nothing throws or crashes, and every refusal is
// non-empty with each line starting "source:LINE:COL: ".
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "server/sweep.h"
#include "worker/config/run_config.h"

namespace keel {
namespace {

constexpr int kInputs = 100000;
constexpr uint64_t kSeed = 0x6b65656c2d66757aull;  // "keel-fuz"

std::string ReadExample(const std::string& name) {
  std::ifstream in("examples/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// True when every line of message is "source:LINE:COL: ..." (LINE, COL >= 1),
// or the "... and N more errors" line that ends a long list.
bool EveryLinePositioned(const std::string& message, const std::string& source) {
  if (message.empty()) return false;
  std::stringstream lines(message);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, 8, "... and ") == 0) continue;
    if (line.compare(0, source.size() + 1, source + ":") != 0) return false;
    size_t pos = source.size() + 1;
    for (int part = 0; part < 2; ++part) {
      size_t digits = 0;
      while (pos < line.size() && line[pos] >= '0' && line[pos] <= '9') ++pos, ++digits;
      if (digits == 0 || line[pos - digits] == '0') return false;
      if (pos >= line.size() || line[pos] != ':') return false;
      ++pos;
    }
    if (line.compare(pos, 1, " ") != 0 || line.size() <= pos + 1) return false;
  }
  return true;
}

class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> corpus) : rng_(seed), corpus_(std::move(corpus)) {}

  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  std::string Mutate(std::string text) {
    const int rounds = 1 + static_cast<int>(Below(4));
    for (int i = 0; i < rounds; ++i) MutateOnce(&text);
    return text;
  }

 private:
  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::stringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  static std::string Unlines(const std::vector<std::string>& lines) {
    std::string out;
    for (const std::string& l : lines) out += l + "\n";
    return out;
  }

  void MutateOnce(std::string* text) {
    static const std::vector<std::string> kTokens = {
        "---\n", "...\n", "&a ", "*a", "*zz", "!!str ", "!!int ", "!!map ", "? ", "- ", ": ", "|\n", ">-\n", "{", "}",
        "[", "]", ", ", "#", "'", "\"", "\t", "\n", "~", "null", "1e309", "-1", "0x10", "<<: *a\n", "%YAML 1.2\n",
        "\\u0000", "\\x00", "\xc3\xa9", "\xef\xbb\xbf", "-9223372036854775809", "99999999999999999999", ".nan",
        "precision: mxfp4\n", "policy: {rules: [{when: nonfinite, do: [stop]}]}\n", "name: ..\n", "name: a/b\n",
        "model: {type: gpt, width: 65536, layers: 1024, heads: 16}\n", "axes: [{grid: {seed: [1, 2]}}]\n",
        "steps: 1\nsteps: 2\n", "&x [*x]", "  ", "\r\n"};
    const size_t n = text->size();
    switch (Below(12)) {
      case 0: {  // byte flip
        if (n == 0) break;
        (*text)[Below(n)] = static_cast<char>(Below(256));
        break;
      }
      case 1: {  // insert a character
        static const char kChars[] = "{}[]:,-?&*!|>'\"#% \t\n.0123456789abcxyz_\\";
        text->insert(Below(n + 1), 1, kChars[Below(sizeof(kChars) - 1)]);
        break;
      }
      case 2: {  // delete a range of characters
        if (n == 0) break;
        size_t at = Below(n);
        text->erase(at, 1 + Below(std::min<size_t>(16, n - at)));
        break;
      }
      case 3: {  // duplicate a line (often a duplicate key)
        std::vector<std::string> lines = Lines(*text);
        if (lines.empty()) break;
        size_t i = Below(lines.size());
        lines.insert(lines.begin() + static_cast<long>(Below(lines.size() + 1)), lines[i]);
        *text = Unlines(lines);
        break;
      }
      case 4: {  // delete or swap lines
        std::vector<std::string> lines = Lines(*text);
        if (lines.size() < 2) break;
        size_t i = Below(lines.size()), j = Below(lines.size());
        if (Below(2)) {
          lines.erase(lines.begin() + static_cast<long>(i));
        } else {
          std::swap(lines[i], lines[j]);
        }
        *text = Unlines(lines);
        break;
      }
      case 5: {  // splice with another file of the corpus
        std::vector<std::string> a = Lines(*text), b = Lines(corpus_[Below(corpus_.size())]);
        a.resize(Below(a.size() + 1));
        for (size_t i = Below(b.size() + 1); i < b.size(); ++i) a.push_back(b[i]);
        *text = Unlines(a);
        break;
      }
      case 6: {  // deep nesting
        static const std::vector<std::string> kOpen = {"[", "{a: ", "- ", "[{b: "};
        const std::string& open = kOpen[Below(kOpen.size())];
        size_t depth = Below(3) == 0 ? 1 + Below(5000) : 1 + Below(80);
        std::string nest;
        for (size_t i = 0; i < depth; ++i) nest += open;
        text->insert(Below(n + 1), nest);
        break;
      }
      case 7: {  // a long string
        size_t length = Below(10) == 0 ? 1 + Below(200000) : 1 + Below(300);
        text->insert(Below(n + 1), std::string(length, "a.-/_ "[Below(6)]));
        break;
      }
      case 8: {  // duplicate a key: repeat "key: value" from a line at the same indent
        std::vector<std::string> lines = Lines(*text);
        if (lines.empty()) break;
        size_t i = Below(lines.size());
        size_t colon = lines[i].find(':');
        if (colon == std::string::npos) break;
        lines.insert(lines.begin() + static_cast<long>(i) + 1, lines[i].substr(0, colon) + ": 7");
        *text = Unlines(lines);
        break;
      }
      case 9:
      case 10: {  // a YAML token
        text->insert(Below(n + 1), kTokens[Below(kTokens.size())]);
        break;
      }
      default: {  // replace a number with an extreme one
        static const std::vector<std::string> kNumbers = {"0", "-1", "2147483648", "9223372036854775807", "1e308",
                                                          "-0.0", "65536", "1024", "1e-45", "4294967296"};
        size_t at = text->find_first_of("0123456789", Below(n + 1));
        if (at == std::string::npos) break;
        size_t end = text->find_first_not_of("0123456789.e-", at);
        text->replace(at, (end == std::string::npos ? n : end) - at, kNumbers[Below(kNumbers.size())]);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> corpus_;
};

TEST(ParseFuzzTest, MutatedSweepsAndRunConfigsNeverCrashAndRefusalsCarryAPosition) {
  const std::vector<std::string> run_files = {"gpt2_124m.yaml", "gpt_fortunes_cpu.yaml", "proxy_cpu.yaml",
                                              "proxy_mxfp8_e4m3.yaml", "proxy_mxfp8_e4m3_policy.yaml",
                                              "proxy_mxfp8_e4m3_policy_tuned.yaml"};
  std::vector<std::string> runs, sweeps;
  for (const std::string& f : run_files) {
    runs.push_back(ReadExample(f));
    ASSERT_FALSE(runs.back().empty()) << "examples/" << f << " not found";
  }
  sweeps.push_back(ReadExample("demo-sweep.yaml"));
  ASSERT_FALSE(sweeps.back().empty());
  // Small sweeps covering every axis kind, so that most inputs are cheap.
  sweeps.push_back(
      "name: s1\nbase:\n  model: {type: proxy, layers: 1, width: 16}\n  batch: 32\n  steps: 5\n"
      "axes:\n  - grid: {precision: [bf16, mxfp4], seed: [1, 2]}\n"
      "resources: {cpu_slots: 1}\nmax_concurrent: 2\nmax_restarts: 1\npriority: 3\n");
  sweeps.push_back(
      "name: s2\nbase: {model: {type: proxy, layers: 2, width: 32}, batch: 16, steps: 3}\n"
      "axes:\n  - zip: {optimizer.lr: [1e-3, 6e-4], model.layers: [1, 2]}\n"
      "  - random: {count: 2, seed: 7, params: {optimizer.beta2: {uniform: [0.95, 0.999]},\n"
      "      optimizer.lr: {log_uniform: [1e-5, 1e-3]}, model.width: {choice: [16, 32]}}}\n"
      "policy:\n  ladder: [mxfp4, bf16]\n  rules:\n    - {name: r, when: [nonfinite, loss_ratio], do: [{rollback: {steps: 2}}, {switch: next}]}\n");
  sweeps.push_back(
      "name: s3\nbase:\n  model: {type: gpt, layers: 1, width: 32, heads: 2, context: 16, vocab: 256}\n"
      "  data: {train: x.bin}\n  batch: 2\n  steps: 2\n  precision: {preset: mxfp8_e4m3, rounding: stochastic}\n"
      "axes:\n  - grid: {precision.bf16_head: [true, false]}\nresources: {gpus: 1}\n");
  std::vector<std::string> corpus = runs;
  corpus.insert(corpus.end(), sweeps.begin(), sweeps.end());

  Mutator mutator(kSeed, corpus);
  SweepLimits limits;
  limits.max_runs = 64;  // the parsers are under test, not expansion at scale
  int accepted = 0, refused = 0, sweep_inputs = 0, run_inputs = 0, failures = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kInputs; ++i) {
    // Half the inputs are sweeps, half run configs; a tenth of each comes from
    // the other kind's corpus.
    const bool as_sweep = i % 2 == 0;
    const bool cross = mutator.Below(10) == 0;
    const std::vector<std::string>& pool = as_sweep != cross ? sweeps : runs;
    // The demo sweep expands to 16 runs; keep it to a fifth of the sweep inputs.
    size_t pick = mutator.Below(pool.size());
    if (&pool == &sweeps && pick == 0 && mutator.Below(5) != 0) pick = 1 + mutator.Below(pool.size() - 1);
    const std::string input = mutator.Mutate(pool[pick]);
    const std::string source = as_sweep ? "fuzz-sweep.yaml" : "fuzz-run.yaml";
    Status s;
    try {
      if (as_sweep) {
        SweepPlan plan;
        s = ExpandSweep(input, source, limits, &plan);
        ++sweep_inputs;
      } else {
        RunConfig config;
        s = ParseRunConfig(input, source, {}, &config);
        ++run_inputs;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "input " << i << ": exception escaped: " << e.what() << "\n" << input.substr(0, 2000);
      if (++failures > 20) break;
      continue;
    } catch (...) {
      ADD_FAILURE() << "input " << i << ": unknown exception escaped\n" << input.substr(0, 2000);
      if (++failures > 20) break;
      continue;
    }
    if (s.ok()) {
      ++accepted;
      continue;
    }
    ++refused;
    if (!EveryLinePositioned(s.message(), source)) {
      ADD_FAILURE() << "input " << i << ": refusal without source:LINE:COL: '" << s.message().substr(0, 500)
                    << "'\n--- input ---\n" << input.substr(0, 2000);
      if (++failures > 20) break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("parse_fuzz: %d inputs (%d sweeps, %d run configs), %d accepted, %d refused, %.1f s, seed 0x%llx\n",
              sweep_inputs + run_inputs, sweep_inputs, run_inputs, accepted, refused, seconds,
              static_cast<unsigned long long>(kSeed));
  EXPECT_EQ(sweep_inputs + run_inputs, kInputs);
  EXPECT_GT(accepted, 0);  // the mutations leave some inputs valid
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace keel
