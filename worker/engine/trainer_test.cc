// The trainer on the CPU backend: the proxy learns, runs are reproducible,
// resume is bit-exact, bad checkpoints are refused, a mid-run scheme switch
// keeps training, the gradient-bias probe measures what it says, and the GPT
// learns real English text (the Debian package "fortunes").
#include "worker/engine/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "worker/engine/fortunes_shards.h"
#include "worker/io/crc32.h"
#include "worker/io/file_util.h"
#include "worker/io/safetensors.h"
#include "worker/run/checkpoint_dirs.h"

namespace keel {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

RunConfig ProxyConfig(const std::string& run_dir, const std::string& precision) {
  RunConfig c;
  std::string yaml =
      "model: {type: proxy, layers: 2, width: 32}\n"
      "batch: 64\nsteps: 200\nseed: 7\nthreads: 2\n"
      "optimizer: {type: adam, lr: 0.002}\n"
      "precision: " + precision + "\nrun_dir: " + run_dir + "\n";
  Status s = ParseRunConfig(yaml, "test", {}, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

std::vector<double> Losses(Trainer* t, int steps, std::vector<StepMetrics>* all = nullptr) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    StepMetrics m;
    Status s = t->Step(&m);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) break;
    losses.push_back(m.loss);
    if (all) all->push_back(m);
  }
  return losses;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

TEST(TrainerTest, ProxyFp32TrainsItsLossDown) {
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(ProxyConfig(TempDir("proxy_fp32"), "fp32"), &t).ok());
  std::vector<double> losses = Losses(t.get(), 200);
  ASSERT_EQ(losses.size(), 200u);
  // The student starts far from the teacher; 200 Adam steps must at least
  // halve the loss (it falls ~10x in practice).
  EXPECT_LT(Mean(losses, 190, 200), 0.5 * Mean(losses, 0, 5));
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(TrainerTest, EveryPresetTrainsTheProxy) {
  for (const PresetInfo& p : Presets()) {
    if (p.name == "chon") continue;  // llama and gla only: HcpHotSetsAreModelStateAndResumeIsBitExact
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(ProxyConfig(TempDir("proxy_presets"), p.name), &t).ok()) << p.name;
    std::vector<StepMetrics> m;
    std::vector<double> losses = Losses(t.get(), 20, &m);
    ASSERT_EQ(losses.size(), 20u) << p.name;
    EXPECT_LT(Mean(losses, 15, 20), Mean(losses, 0, 3)) << p.name;
    // Quantized roles report statistics; fp32 has none to report.
    EXPECT_EQ(m[0].operands.empty(), p.name == "fp32") << p.name;
  }
}

TEST(TrainerTest, SameSeedSameCurveOtherSeedOtherCurve) {
  RunConfig c = ProxyConfig(TempDir("proxy_seed"), "mxfp8_e4m3");
  std::unique_ptr<Trainer> a, b, other;
  ASSERT_TRUE(Trainer::Create(c, &a).ok());
  ASSERT_TRUE(Trainer::Create(c, &b).ok());
  c.seed = 8;
  ASSERT_TRUE(Trainer::Create(c, &other).ok());
  std::vector<double> la = Losses(a.get(), 6), lb = Losses(b.get(), 6), lo = Losses(other.get(), 6);
  EXPECT_EQ(la, lb);  // bit for bit
  EXPECT_NE(la, lo);
}

// The update ratio, |w_new - w_old| / |w_old| over all weights, from the
// optimizer's own sums of squared deltas: the same figure as the weights read
// back before and after the step give.
TEST(TrainerTest, UpdateRatioIsTheRelativeChangeOfTheWeights) {
  RunConfig c = ProxyConfig(TempDir("update_ratio"), "fp32");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  Losses(t.get(), 2);
  const int64_t n = t->model()->param_count();
  std::vector<float> before(static_cast<size_t>(n)), after(static_cast<size_t>(n));
  ASSERT_TRUE(t->backend()->Download(before.data(), t->model()->params(), before.size() * sizeof(float)).ok());
  StepMetrics m;
  ASSERT_TRUE(t->Step(&m).ok());
  ASSERT_TRUE(t->backend()->Download(after.data(), t->model()->params(), after.size() * sizeof(float)).ok());
  double delta = 0.0, weights = 0.0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double d = static_cast<double>(before[i] - after[i]);
    delta += d * d;
    weights += static_cast<double>(before[i]) * before[i];
  }
  ASSERT_GT(delta, 0.0);
  EXPECT_NEAR(m.update_ratio, std::sqrt(delta) / std::sqrt(weights), 1e-9 * m.update_ratio);
  EXPECT_FALSE(m.update_ratios.empty());
}

TEST(TrainerTest, ResumeIsBitExactAndRestoresTheScheme) {
  RunConfig c = ProxyConfig(TempDir("proxy_resume"), "fp32");
  std::unique_ptr<Trainer> whole, first, resumed;
  ASSERT_TRUE(Trainer::Create(c, &whole).ok());
  PrecisionScheme mx;
  ASSERT_TRUE(SchemeFromPreset("mxfp8_e4m3", &mx).ok());
  // Uninterrupted: 3 steps fp32, switch, 5 steps mxfp8.
  std::vector<double> expected = Losses(whole.get(), 3);
  ASSERT_TRUE(whole->SwitchScheme(mx).ok());
  std::vector<double> tail = Losses(whole.get(), 5);
  expected.insert(expected.end(), tail.begin(), tail.end());

  ASSERT_TRUE(Trainer::Create(c, &first).ok());
  Losses(first.get(), 3);
  ASSERT_TRUE(first->SwitchScheme(mx).ok());
  Losses(first.get(), 1);
  std::string dir;
  ASSERT_TRUE(first->SaveCheckpoint(&dir).ok());
  first.reset();

  ASSERT_TRUE(Trainer::Create(c, &resumed).ok());
  Status s = resumed->Resume(dir);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(resumed->step(), 4);
  EXPECT_EQ(resumed->scheme().name, "mxfp8_e4m3");
  std::vector<double> after = Losses(resumed.get(), 4);
  std::vector<double> want(expected.begin() + 4, expected.end());
  EXPECT_EQ(after, want);

  // "latest" finds the same checkpoint.
  std::unique_ptr<Trainer> latest;
  ASSERT_TRUE(Trainer::Create(c, &latest).ok());
  ASSERT_TRUE(latest->Resume("latest").ok());
  EXPECT_EQ(latest->step(), 4);
}

TEST(TrainerTest, CorruptOrTruncatedCheckpointIsRefusedAndChangesNothing) {
  RunConfig c = ProxyConfig(TempDir("proxy_corrupt"), "fp32");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  Losses(t.get(), 2);
  std::string dir;
  ASSERT_TRUE(t->SaveCheckpoint(&dir).ok());
  std::string path = dir + "/optimizer.safetensors";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  std::unique_ptr<Trainer> fresh;
  ASSERT_TRUE(Trainer::Create(c, &fresh).ok());
  // A flipped bit in the data.
  std::string flipped = bytes;
  flipped[flipped.size() - 5] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
  Status s = fresh->Resume(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("optimizer.safetensors"), std::string::npos) << s.message();
  // Truncated.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  s = fresh->Resume(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("optimizer.safetensors"), std::string::npos) << s.message();
  EXPECT_EQ(fresh->step(), 0);
  // The refused resume left the fresh trainer as it was: it trains like a new one.
  std::unique_ptr<Trainer> reference;
  ASSERT_TRUE(Trainer::Create(c, &reference).ok());
  EXPECT_EQ(Losses(fresh.get(), 2), Losses(reference.get(), 2));
}

// Overwrites 64 bytes near the end of a file (tensor data, under its CRC).
void Overwrite64Bytes(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(0, std::ios::end);
  f.seekp(static_cast<std::streamoff>(f.tellg()) - 100);
  f.write(std::string(64, '\x5a').data(), 64);
}

TEST(TrainerTest, ResumeFallsBackPastACorruptCheckpointWithAnEvent) {
  RunConfig c = ProxyConfig(TempDir("proxy_fallback"), "fp32");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  Losses(t.get(), 2);
  std::string older, newer;
  ASSERT_TRUE(t->SaveCheckpoint(&older).ok());
  Losses(t.get(), 2);
  ASSERT_TRUE(t->SaveCheckpoint(&newer).ok());
  const std::vector<double> expected = Losses(t.get(), 3);  // what follows step 4
  t.reset();
  // 64 bytes of the newest checkpoint's weights flipped.
  Overwrite64Bytes(newer + "/model.safetensors");
  // Without the fallback the newest is refused...
  std::unique_ptr<Trainer> strict;
  ASSERT_TRUE(Trainer::Create(c, &strict).ok());
  EXPECT_FALSE(strict->Resume(newer).ok());
  // ...with it, the older one is used, and the skip is an event naming the file and why.
  for (const std::string& request : {newer, std::string("latest")}) {
    SCOPED_TRACE(request);
    std::remove((c.run_dir + "/events.jsonl").c_str());
    std::unique_ptr<Trainer> r;
    ASSERT_TRUE(Trainer::Create(c, &r).ok());
    std::string resumed;
    Status s = r->ResumeNewestValid(request, &resumed);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(resumed, older);
    EXPECT_EQ(r->step(), 2);
    std::ifstream events(c.run_dir + "/events.jsonl");
    std::string line;
    ASSERT_TRUE(std::getline(events, line));
    EXPECT_NE(line.find("\"kind\":\"checkpoint_skipped\""), std::string::npos) << line;
    EXPECT_NE(line.find(newer), std::string::npos) << line;
    EXPECT_NE(line.find("model.safetensors"), std::string::npos) << line;  // the reason names the file
    // Training from the older checkpoint replays steps 3 and 4 exactly.
    std::vector<double> replay = Losses(r.get(), 5);
    EXPECT_EQ(std::vector<double>(replay.begin() + 2, replay.end()), expected);
  }
  // When no checkpoint verifies, it fails and says why for each one.
  Overwrite64Bytes(older + "/optimizer.safetensors");
  std::unique_ptr<Trainer> none;
  ASSERT_TRUE(Trainer::Create(c, &none).ok());
  std::string resumed;
  Status s = none->ResumeNewestValid("latest", &resumed);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(older), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(newer), std::string::npos) << s.message();
  EXPECT_EQ(none->step(), 0);
}

TEST(TrainerTest, KeepsTheNewestCheckpointsAndNeverTheOneJustWritten) {
  RunConfig c = ProxyConfig(TempDir("proxy_keep"), "fp32");
  c.keep_checkpoints = 2;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::string dir;
  for (int i = 0; i < 4; ++i) {
    Losses(t.get(), 1);
    ASSERT_TRUE(t->SaveCheckpoint(&dir).ok());
  }
  auto exists = [&](const std::string& name) {
    return std::ifstream(c.run_dir + "/checkpoints/" + name + "/model.safetensors").good();
  };
  EXPECT_FALSE(exists("step_00000002"));
  EXPECT_TRUE(exists("step_00000003"));
  EXPECT_TRUE(exists("step_00000004"));
  // A fresh run in the same directory: its step-1 checkpoint stays, resumable.
  std::unique_ptr<Trainer> again;
  ASSERT_TRUE(Trainer::Create(c, &again).ok());
  Losses(again.get(), 1);
  ASSERT_TRUE(again->SaveCheckpoint(&dir).ok());
  EXPECT_TRUE(exists("step_00000001"));
  std::unique_ptr<Trainer> resumed;
  ASSERT_TRUE(Trainer::Create(c, &resumed).ok());
  EXPECT_TRUE(resumed->Resume(dir).ok());
}

std::vector<int64_t> MetricSteps(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    steps.push_back(std::atoll(line.substr(line.find("\"step\":") + 7).c_str()));
  }
  return steps;
}

TEST(TrainerTest, MetricsFileHoldsOneLinePerStepAcrossResumeAndRerun) {
  RunConfig c = ProxyConfig(TempDir("proxy_metrics"), "fp32");
  c.steps = 4;
  c.checkpoint_every = 2;
  int callbacks = 0;
  {
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    ASSERT_TRUE(t->Train([&](const StepMetrics&) { ++callbacks; }, false).ok());
  }
  EXPECT_EQ(callbacks, 4);
  EXPECT_EQ(MetricSteps(c.run_dir), (std::vector<int64_t>{1, 2, 3, 4}));
  c.steps = 6;
  {
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    ASSERT_TRUE(t->Resume(c.run_dir + "/checkpoints/step_00000002").ok());
    ASSERT_TRUE(t->Train(nullptr, false).ok());
  }
  EXPECT_EQ(MetricSteps(c.run_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  c.steps = 3;
  {
    std::unique_ptr<Trainer> t;  // a fresh run in the same directory starts a fresh file
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    ASSERT_TRUE(t->Train(nullptr, false).ok());
  }
  EXPECT_EQ(MetricSteps(c.run_dir), (std::vector<int64_t>{1, 2, 3}));
}

// Outlier analytics every 2nd step over two micro-batches, block maps every
// 4th: the metric lines carry them on those steps only, every layer with its
// six roles, the hot-set overlap from the second analytics step on, the SVGs
// under analytics/<step>/ for the three map roles; and the training itself is
// the same bits as without analytics.
TEST(TrainerTest, OutlierAnalyticsEveryNthStepWithMaps) {
  RunConfig c = ProxyConfig(TempDir("proxy_analytics"), "mxfp8_e4m3");
  c.steps = 6;
  c.grad_accum = 2;
  c.analytics_every = 2;
  c.analytics.top_k = 3;
  c.analytics.maps_every = 4;
  std::vector<double> losses;
  {
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    ASSERT_TRUE(t->Train([&](const StepMetrics& m) { losses.push_back(m.loss); }, false).ok());
  }
  std::ifstream in(c.run_dir + "/metrics.jsonl");
  std::vector<MetricLine> lines;
  for (std::string text; std::getline(in, text);) {
    MetricLine line;
    ASSERT_TRUE(ParseMetricLine(text, &line).ok());
    EXPECT_EQ(MetricLineHasAnalytics(text), line.step % 2 == 0) << text;
    lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 6u);
  for (const MetricLine& line : lines) {
    EXPECT_EQ(line.has_analytics, line.step % 2 == 0) << "step " << line.step;
    if (!line.has_analytics) continue;
    ASSERT_EQ(line.outliers.size(), 4u * kRoleCount) << "2 blocks x fc1, fc2 x 6 roles";
    EXPECT_EQ(line.outliers[0].linear, "blocks.0.fc1");
    EXPECT_EQ(line.outliers[0].role, "fwd_x");
    for (const OutlierValue& o : line.outliers) {
      EXPECT_GT(o.kurtosis, 1.0) << o.linear << " " << o.role;  // Pearson kurtosis is >= 1
      EXPECT_GE(o.top1_over_median, 1.0) << o.linear << " " << o.role;
      EXPECT_GE(o.ftz_rate, 0.0);
      EXPECT_LE(o.ftz_rate, 1.0);
      if (line.step == 2) {
        EXPECT_TRUE(std::isnan(o.hot_overlap)) << "no previous analytics step";
      } else {
        EXPECT_GE(o.hot_overlap, 0.0) << o.linear << " " << o.role;
        EXPECT_LE(o.hot_overlap, 1.0) << o.linear << " " << o.role;
      }
    }
  }
  // Maps on step 4 only, for fwd_x, fwd_w and dgrad_dy.
  auto exists = [](const std::string& path) { return std::ifstream(path).good(); };
  const std::string maps = c.run_dir + "/analytics/00000004/";
  for (const char* layer : {"blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2"}) {
    for (const char* role : {"fwd_x", "fwd_w", "dgrad_dy"}) {
      EXPECT_TRUE(exists(maps + layer + "." + role + ".svg")) << maps << layer << "." << role;
    }
    EXPECT_FALSE(exists(maps + layer + ".wgrad_x.svg"));
  }
  EXPECT_FALSE(exists(c.run_dir + "/analytics/00000002/blocks.0.fc1.fwd_x.svg"));
  std::string svg;
  ASSERT_TRUE(ReadFile(maps + "blocks.0.fc1.fwd_x.svg", &svg).ok());
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("blocks.0.fc1.fwd_x, step 4"), std::string::npos);
  // The same run without analytics: the same losses, bit for bit.
  RunConfig off = c;
  off.run_dir = TempDir("proxy_analytics_off");
  off.analytics_every = 0;
  off.analytics.maps_every = 0;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(off, &t).ok());
  EXPECT_EQ(Losses(t.get(), 6), losses);
}

// Every linear layer of the GPT and the llama models reaches its analytics
// slot, under its own name, with all six roles.
TEST(TrainerTest, OutlierAnalyticsCoverEveryLanguageModelLayer) {
  std::string dir = TempDir("lm_analytics");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "fortunes"));
  for (const char* type : {"gpt", "llama"}) {
    std::string yaml = std::string("model: {type: ") + type + ", layers: 2, width: 32, heads: 2, context: 32, vocab: 256}\n" +
                       "data: {train: " + dir + "/fortunes_train.bin}\nbatch: 2\nseq: 32\nsteps: 2\nthreads: 2\n" +
                       "analytics_every: 1\nrun_dir: " + dir + "/" + type + "\n";
    RunConfig c;
    Status s = ParseRunConfig(yaml, "test", {}, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    std::vector<StepMetrics> m;
    Losses(t.get(), 2, &m);
    ASSERT_EQ(m.size(), 2u);
    const std::vector<std::string>& names = t->model()->linear_names();
    ASSERT_EQ(m[1].outliers.size(), names.size() * kRoleCount) << type;
    for (size_t i = 0; i < m[1].outliers.size(); ++i) {
      EXPECT_EQ(m[1].outliers[i].linear, names[i / kRoleCount]) << type;
      EXPECT_EQ(m[1].outliers[i].hot.size(), 8u) << type << " top_k 8 by default";
      EXPECT_TRUE(m[1].outliers[i].has_overlap) << type;
    }
  }
}

TEST(TrainerTest, RequestStopCheckpointsAfterTheCurrentStep) {
  RunConfig c = ProxyConfig(TempDir("proxy_stop"), "fp32");
  c.steps = 50;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  Trainer* raw = t.get();
  ASSERT_TRUE(t->Train([raw](const StepMetrics& m) { if (m.step == 3) raw->RequestStop(); }, false).ok());
  EXPECT_EQ(t->step(), 3);
  std::unique_ptr<Trainer> resumed;
  ASSERT_TRUE(Trainer::Create(c, &resumed).ok());
  ASSERT_TRUE(resumed->Resume("latest").ok());
  EXPECT_EQ(resumed->step(), 3);
}

// Writes a command file the way keel-worker does (tmp, then rename).
void WriteCommand(const std::string& run_dir, const std::string& name, const std::string& json) {
  ASSERT_EQ(std::system(("mkdir -p '" + run_dir + "/commands'").c_str()), 0);
  std::ofstream(run_dir + "/commands/" + name + ".tmp") << json;
  ASSERT_EQ(std::rename((run_dir + "/commands/" + name + ".tmp").c_str(),
                        (run_dir + "/commands/" + name + ".json").c_str()), 0);
}

TEST(TrainerTest, CommandFilesSwitchPrecisionAndRollBack) {
  RunConfig c = ProxyConfig(TempDir("proxy_commands"), "fp32");
  c.steps = 20;
  c.checkpoint_every = 5;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::vector<std::pair<int64_t, std::string>> seen;  // (step, scheme) per step in order
  ASSERT_TRUE(t->Train([&](const StepMetrics& m) {
                 seen.push_back({m.step, m.scheme});
                 if (m.step == 3 && seen.size() == 3) {
                   WriteCommand(c.run_dir, "0001",
                                "{\"kind\": \"switch_precision\", \"precision\": \"mxfp8_e4m3+bf16_head\"}");
                 }
                 if (m.step == 12 && seen.size() == 12) {
                   WriteCommand(c.run_dir, "0002", "{\"kind\": \"rollback\", \"steps\": 2, \"precision\": \"bf16\", \"reason\": \"test\"}");
                   WriteCommand(c.run_dir, "0003", "{\"kind\": \"explode\"}");
                 }
               }, false).ok());
  ASSERT_GE(seen.size(), 13u);
  EXPECT_EQ(seen[2].second, "fp32");
  EXPECT_EQ(seen[3].second, "mxfp8_e4m3+bf16_head");  // step 4 ran in the new scheme (a rung's name works too)
  // After step 12 the run went back to the newest checkpoint at or before step 10.
  EXPECT_EQ(seen[12].first, 11);
  EXPECT_EQ(seen[12].second, "bf16");
  EXPECT_EQ(t->step(), 20);
  EXPECT_EQ(MetricSteps(c.run_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}));
  std::ifstream events(c.run_dir + "/events.jsonl");
  std::string all((std::istreambuf_iterator<char>(events)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("\"kind\":\"switch_precision\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"to_step\":\"10\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"kind\":\"command_failed\""), std::string::npos) << all;
  EXPECT_FALSE(std::ifstream(c.run_dir + "/commands/0002.json").good());  // consumed
}

// A run hit by an injected LR fault at step 30, under a policy.
// A CPU proxy run in mxfp4 that an LR fault (x300 from step 30) throws off, under
// a policy of one rule r doing `actions` (a YAML list) with `cooldown`;
// `policy_lines`: more lines under policy: (a ladder, snapshots, probation).
std::string FaultyRunYaml(const std::string& dir, const std::string& actions, const std::string& policy_lines = "",
                          int cooldown = 100) {
  return "model: {type: proxy, layers: 1, width: 32}\nbatch: 64\nsteps: 60\nthreads: 2\nprecision: mxfp4\n"
         "optimizer: {type: adam, lr: 0.003}\n"
         "schedule: {type: constant, spike_at: 30, spike_steps: 3, spike_factor: 300}\n"
         "policy:\n  detectors: {loss_zscore: {min_samples: 10}, loss_ratio: {min_samples: 10}}\n" +
         policy_lines + "  rules:\n    - {name: r, when: [nonfinite, loss_zscore, loss_ratio], do: " + actions +
         ", cooldown: " + std::to_string(cooldown) + "}\nrun_dir: " + dir + "\n";
}

RunConfig FaultyRun(const std::string& dir, const std::string& actions) {
  RunConfig c;
  Status s = ParseRunConfig(FaultyRunYaml(dir, actions), "test", {}, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

// The ladder and snapshots the escalation and probation tests climb and roll back on.
constexpr char kLadderLines[] = "  ladder: [mxfp4, mxfp8_e4m3, bf16]\n  snapshots: {every: 5, keep: 8}\n";

TEST(TrainerTest, PolicyStopEndsTheRunAsDivergedWithItsEvent) {
  RunConfig c = FaultyRun(TempDir("policy_stop"), "[stop]");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  ASSERT_TRUE(t->Train(nullptr, false).ok());
  EXPECT_TRUE(t->diverged());
  EXPECT_GT(t->step(), 30);
  EXPECT_LT(t->step(), 40);  // right after the fault, not at the end
  std::ifstream events(c.run_dir + "/events.jsonl");
  std::string all((std::istreambuf_iterator<char>(events)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("\"kind\":\"stop\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"rule\":\"r\""), std::string::npos) << all;
}

TEST(TrainerTest, PolicySkipStepKeepsTheWeights) {
  RunConfig c = FaultyRun(TempDir("policy_skip"), "[skip_step]");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::vector<StepMetrics> m;
  ASSERT_TRUE(t->Train([&](const StepMetrics& s) { m.push_back(s); }, false).ok());
  int skipped = 0;
  for (const StepMetrics& s : m) {
    if (!s.skipped) continue;
    ++skipped;
    EXPECT_EQ(s.update_ratio, 0.0) << s.step;  // nothing moved
  }
  EXPECT_GE(skipped, 1);
  EXPECT_FALSE(t->diverged());
}

std::string ReadAll(const std::string& path, size_t from = 0) {
  std::ifstream f(path);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return from < all.size() ? all.substr(from) : "";
}

// issue 14: a restart does not forget the policy's escalation. Run A is
// rescued once (rollback 15, scale_lr 0.5 as written) and stopped right after
// the rollback; run B, a new Trainer resuming "latest", replays into the same
// LR fault, and the rule firing again escalates to the next rung instead of
// scaling the learning rate again (what a fresh engine would do).
TEST(TrainerTest, PolicyEscalationSurvivesACheckpointAndResume) {
  const std::string dir = TempDir("policy_resume");
  RunConfig c;
  Status s = ParseRunConfig(FaultyRunYaml(dir, "[{rollback: 15}, {scale_lr: 0.5}]", kLadderLines, 5), "test", {}, &c);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::string events = c.run_dir + "/events.jsonl";
  int64_t stopped_at = 0, fired_at = 0;
  {
    std::unique_ptr<Trainer> a;
    ASSERT_TRUE(Trainer::Create(c, &a).ok());
    int64_t previous = 0;
    // The first step after the rollback stops the run: its checkpoint is the restart's.
    ASSERT_TRUE(a->Train([&](const StepMetrics& m) {
                   if (m.step < previous) {
                     fired_at = previous;
                     a->RequestStop();
                   }
                   previous = m.step;
                 }, false).ok());
    stopped_at = a->step();
    ASSERT_GT(fired_at, 29);
    ASSERT_LT(stopped_at, fired_at);
    const std::string all = ReadAll(events);
    EXPECT_NE(all.find("\"kind\":\"scale_lr\""), std::string::npos) << all;
    EXPECT_EQ(all.find("\"kind\":\"escalate\""), std::string::npos) << all;  // the rule as written
  }
  // The rollback dropped the abandoned trajectory's checkpoints: "latest" is the stop's.
  const size_t before = ReadAll(events).size();
  std::unique_ptr<Trainer> b;
  ASSERT_TRUE(Trainer::Create(c, &b).ok());
  std::string resumed;
  s = b->ResumeNewestValid("latest", &resumed);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(b->step(), stopped_at) << resumed;
  EXPECT_EQ(b->scheme().name, "mxfp4");
  std::vector<StepMetrics> m;
  ASSERT_TRUE(b->Train([&](const StepMetrics& x) { m.push_back(x); }, false).ok());
  const std::string after = ReadAll(events, before);
  // The first thing B's policy does is escalate, naming the step A's rule fired at.
  ASSERT_EQ(after.find("{\"step\":"), 0u) << after;
  const std::string first = after.substr(0, after.find('\n'));
  EXPECT_NE(first.find("\"kind\":\"escalate\""), std::string::npos) << first;
  EXPECT_NE(first.find("where it last fired: escalating to mxfp8_e4m3 instead of replaying"), std::string::npos)
      << first;
  EXPECT_NE(first.find("step " + std::to_string(fired_at)), std::string::npos) << first;
  EXPECT_NE(after.find("switched precision from mxfp4 to mxfp8_e4m3"), std::string::npos) << after;
  // The learning rate was not scaled again by the rule as written: the next
  // scale_lr (if the fault drives the run that far) is the fallback past bf16.
  const size_t scaled = after.find("\"kind\":\"scale_lr\"");
  if (scaled != std::string::npos) {
    EXPECT_GT(scaled, after.find("switched precision from mxfp8_e4m3 to bf16")) << after;
  }
  ASSERT_FALSE(m.empty());
  EXPECT_NE(m.back().scheme, "mxfp4");
}

// The policy's snapshots live in host memory when they fit
// policy.snapshots.memory_mib: nothing is written to disk before the end, the
// rollback's event names the memory snapshot, and the run is bit for bit the
// one whose snapshots are checkpoints on disk (memory_mib: 0). A budget that
// holds fewer than keep keeps fewer, down to what the longest rollback needs
// (ceil(15 / 5) + 1 = 4 here); under that the snapshots go to disk.
TEST(TrainerTest, PolicySnapshotsInMemoryRollBackLikeCheckpointsOnDisk) {
  struct Outcome {
    std::vector<StepMetrics> metrics;
    std::string events, placement;
    size_t most_checkpoints = 0;  // on disk at any step, before the final one is written
  };
  auto run = [](const std::string& name, const std::string& snapshots, const std::string& width, Outcome* out) {
    const std::string dir = TempDir(name);
    std::string yaml = FaultyRunYaml(dir, "[{rollback: 15}, {switch: next}]",
                                     "  ladder: [mxfp4, mxfp8_e4m3, bf16]\n  snapshots: " + snapshots + "\n");
    yaml.replace(yaml.find("width: 32"), 9, "width: " + width);
    RunConfig c;
    Status s = ParseRunConfig(yaml, "test", {}, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    t->SetHostAvailableMib([] { return int64_t{1} << 20; });  // plenty: the ring's size is the budget's
    out->placement = t->snapshot_placement();
    const std::string root = c.run_dir + "/checkpoints";
    ASSERT_TRUE(t->Train([&](const StepMetrics& m) {
                   out->metrics.push_back(m);
                   out->most_checkpoints = std::max(out->most_checkpoints, ListCheckpoints(root).size());
                 }, false).ok());
    out->events = ReadAll(c.run_dir + "/events.jsonl");
  };
  Outcome memory, disk;
  ASSERT_NO_FATAL_FAILURE(run("snap_memory", "{every: 5, keep: 8}", "32", &memory));
  ASSERT_NO_FATAL_FAILURE(run("snap_disk", "{every: 5, keep: 8, memory_mib: 0}", "32", &disk));
  EXPECT_EQ(memory.placement.find("every 5 steps in memory (8 kept, "), 0u) << memory.placement;
  EXPECT_EQ(disk.placement.find("every 5 steps on disk, as checkpoints ("), 0u) << disk.placement;
  EXPECT_NE(disk.placement.find("policy.snapshots.memory_mib 0"), std::string::npos) << disk.placement;
  // The rollback happened in both, from memory in one and from disk in the other.
  EXPECT_NE(memory.events.find("\"checkpoint\":\"memory snapshot of step "), std::string::npos) << memory.events;
  EXPECT_EQ(memory.events.find("checkpoints/step_"), std::string::npos) << memory.events;
  EXPECT_NE(disk.events.find("checkpoints/step_"), std::string::npos) << disk.events;
  EXPECT_EQ(memory.most_checkpoints, 0u);
  EXPECT_GT(disk.most_checkpoints, 0u);
  // TakeSnapshot (train_bench --snapshots) needs the memory ring.
  {
    RunConfig c;
    Status s = ParseRunConfig(FaultyRunYaml(TempDir("snap_take"), "[stop]", "  snapshots: {every: 5, memory_mib: 0}\n"),
                              "test", {}, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    std::unique_ptr<Trainer> t;
    ASSERT_TRUE(Trainer::Create(c, &t).ok());
    s = t->TakeSnapshot();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("TakeSnapshot: this run keeps no snapshots in memory (every 5 steps on disk"),
              std::string::npos)
        << s.message();
  }
  // The same trajectory, bit for bit: the steps (the replay's included), the
  // losses, the gradient norms and the scheme of every step.
  ASSERT_EQ(memory.metrics.size(), disk.metrics.size());
  ASSERT_GT(memory.metrics.size(), 60u);  // replayed steps
  for (size_t i = 0; i < memory.metrics.size(); ++i) {
    EXPECT_EQ(memory.metrics[i].step, disk.metrics[i].step) << i;
    EXPECT_EQ(memory.metrics[i].loss, disk.metrics[i].loss) << i;
    EXPECT_EQ(memory.metrics[i].grad_norm, disk.metrics[i].grad_norm) << i;
    EXPECT_EQ(memory.metrics[i].scheme, disk.metrics[i].scheme) << i;
  }
  // The budget: a wider proxy's snapshot is about 6 MiB (width 256: 12 bytes
  // for each of its ~530k parameters, printed in the placement); 30 MiB hold 4
  // or 5 of them, fewer than keep 8 but the 4 the rollback needs; 12 MiB fewer.
  Outcome fewer, over;
  ASSERT_NO_FATAL_FAILURE(run("snap_fewer", "{every: 5, keep: 8, memory_mib: 30}", "256", &fewer));
  ASSERT_NO_FATAL_FAILURE(run("snap_over", "{every: 5, keep: 8, memory_mib: 12}", "256", &over));
  EXPECT_EQ(fewer.placement.find("every 5 steps in memory ("), 0u) << fewer.placement;
  EXPECT_NE(fewer.placement.find("; 8 would pass policy.snapshots.memory_mib 30"), std::string::npos) << fewer.placement;
  EXPECT_NE(fewer.events.find("memory snapshot of step "), std::string::npos) << fewer.events;
  EXPECT_EQ(over.placement.find("every 5 steps on disk, as checkpoints ("), 0u) << over.placement;
  EXPECT_NE(over.placement.find("the 4 a rollback needs pass policy.snapshots.memory_mib 12"), std::string::npos)
      << over.placement;
  EXPECT_NE(over.events.find("checkpoints/step_"), std::string::npos) << over.events;
}

// A rollback returns to the newest state at or before its target, whether a
// memory snapshot (every 5 here) or one of the run's checkpoints (every 7).
TEST(TrainerTest, ARollbackTakesTheNewestSnapshotOrCheckpointAtOrBeforeItsTarget) {
  const std::string dir = TempDir("snap_or_checkpoint");
  RunConfig c;
  Status s = ParseRunConfig(FaultyRunYaml(dir, "[stop]", "  snapshots: {every: 5, keep: 8}\n") +
                                "checkpoint_every: 7\nkeep_checkpoints: 0\n",
                            "test", {"steps=23", "schedule.spike_at=1000"}, &c);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  t->SetHostAvailableMib([] { return int64_t{1} << 20; });
  ASSERT_TRUE(t->Train(nullptr, false).ok());
  ASSERT_EQ(t->step(), 23);
  std::string restored;
  // Target 22: snapshot 20, checkpoint 21.
  ASSERT_TRUE(t->Rollback(1, &restored).ok());
  EXPECT_EQ(t->step(), 21);
  EXPECT_NE(restored.find("checkpoints/step_00000021"), std::string::npos) << restored;
  // Target 16: snapshot 15, checkpoint 14.
  ASSERT_TRUE(t->Rollback(5, &restored).ok());
  EXPECT_EQ(t->step(), 15);
  EXPECT_EQ(restored, "memory snapshot of step 15");
  // Target 3, before the first periodic snapshot: the state the run started from.
  ASSERT_TRUE(t->Rollback(12, &restored).ok());
  EXPECT_EQ(t->step(), 0);
  EXPECT_EQ(restored, "memory snapshot of step 0");
  // Target -1: nothing at or before it; the error says what there is.
  s = t->Rollback(1, &restored);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rollback: no snapshot or checkpoint at or before step -1 (snapshots in memory: steps 0 .. 0; "
                             "checkpoints in "),
            std::string::npos)
      << s.message();
  EXPECT_EQ(t->step(), 0);  // nothing changed
}

// The events of FaultyRunYaml's run (fault at step 30) under a rule that rolls
// back 20 steps and moves one rung up, with `snapshots` (a YAML mapping).
std::string EventsOfAShortRollback(const std::string& name, const std::string& snapshots) {
  const std::string dir = TempDir(name);
  RunConfig c;
  Status s = ParseRunConfig(FaultyRunYaml(dir, "[{rollback: 20}, {switch: next}]",
                                          "  ladder: [mxfp4, mxfp8_e4m3, bf16]\n  snapshots: " + snapshots + "\n"),
                            "test", {}, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  EXPECT_TRUE(Trainer::Create(c, &t).ok());
  if (t == nullptr) return "";
  t->SetHostAvailableMib([] { return int64_t{1} << 20; });
  EXPECT_TRUE(t->Train(nullptr, false).ok());
  return ReadAll(c.run_dir + "/events.jsonl");
}

// A blow-up before the policy's first periodic snapshot (every 50 steps here;
// the fault is at step 30) rolls back to the state the run started from
// instead of failing and switching on from the state that blew up.
TEST(TrainerTest, ARollbackBeforeTheFirstSnapshotReturnsToTheStart) {
  const std::string events = EventsOfAShortRollback("snap_start", "{every: 50, keep: 2}");
  EXPECT_EQ(events.find("rollback_failed"), std::string::npos) << events;
  EXPECT_NE(events.find("\"to_step\":\"0\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"checkpoint\":\"memory snapshot of step 0\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"kind\":\"switch_precision\""), std::string::npos) << events;
}

// A policy rollback reaching further back than the ring (2 snapshots every 5
// steps: 25 and 30 when the fault fires at 31, target 11) returns to the
// oldest snapshot kept and says so, instead of failing and switching on from
// the state that blew up (MemorySnapshotsStopGrowingWhenTheHostRunsShort: an
// explicit rollback, keel intervene's, still fails).
TEST(TrainerTest, APolicyRollbackPastTheRingReturnsToItsOldestSnapshot) {
  const std::string events = EventsOfAShortRollback("snap_oldest", "{every: 5, keep: 2}");
  EXPECT_EQ(events.find("rollback_failed"), std::string::npos) << events;
  EXPECT_NE(events.find("rolled back from step 31 to 25 (the oldest state kept: nothing is kept at or before step 11)"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("\"target_step\":\"11\""), std::string::npos) << events;
}

// When the host runs short of memory (MemAvailable, here from a probe), the
// ring of memory snapshots stops growing and reuses its oldest entry: it keeps
// the newest ones it has, and a rollback further back than they reach finds
// nothing in memory.
TEST(TrainerTest, MemorySnapshotsStopGrowingWhenTheHostRunsShort) {
  const std::string dir = TempDir("snap_host_short");
  RunConfig c;
  Status s = ParseRunConfig(FaultyRunYaml(dir, "[stop]", "  snapshots: {every: 5, keep: 8}\n"), "test",
                            {"steps=23", "schedule.spike_at=1000"}, &c);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  int probes = 0;
  t->SetHostAvailableMib([&probes] { return ++probes <= 1 ? int64_t{1} << 20 : int64_t{100}; });
  ASSERT_TRUE(t->Train(nullptr, false).ok());
  // Snapshots 0 (the start's; no probe: the first is always taken) and 5
  // (room); at 10 the host is short: the ring keeps 2 and reuses its oldest,
  // so it ends holding 15 and 20.
  EXPECT_EQ(probes, 2);
  std::string restored;
  ASSERT_TRUE(t->Rollback(4, &restored).ok());  // target 19
  EXPECT_EQ(restored, "memory snapshot of step 15");
  s = t->Rollback(3, &restored);  // target 12: 10 is gone, and no checkpoint is that old
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("(snapshots in memory: steps 15 .. 15; checkpoints in "), std::string::npos)
      << s.message();
  EXPECT_EQ(t->step(), 15);
  // On to step 23 again: at 20 the host is still short, and the ring, down to
  // 15 alone, keeps 1 (20). A rollback to step 11 finds nothing that old; the
  // policy's kind (or_oldest) returns to the oldest state kept, 20.
  ASSERT_TRUE(t->Train(nullptr, false).ok());
  ASSERT_EQ(t->step(), 23);
  EXPECT_FALSE(t->Rollback(12, &restored).ok());
  EXPECT_EQ(t->step(), 23);
  ASSERT_TRUE(t->Rollback(12, &restored, /*or_oldest=*/true).ok());
  EXPECT_EQ(t->step(), 20);
  EXPECT_EQ(restored, "memory snapshot of step 20");
}

// A rollback restores the detectors' statistics of the step it returns to, so
// a replay that diverges again is judged from its first step. Here the
// rollback (5 steps) is shorter than the statistics' min_samples (10): with
// the statistics started afresh, the replay's fault (the schedule's, at the
// same step) would pass unseen; restored, it is seen at once, and the rule
// escalates (cooldown 100 does not hold it back in the replay).
TEST(TrainerTest, ARollbackJudgesTheReplayWithTheStatisticsOfTheStepItReturnsTo) {
  const std::string dir = TempDir("policy_replay_seen");
  RunConfig c;
  Status s = ParseRunConfig(FaultyRunYaml(dir, "[{rollback: 5}, {switch: next}]", kLadderLines), "test", {}, &c);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  ASSERT_TRUE(t->Train(nullptr, false).ok());
  const std::string all = ReadAll(c.run_dir + "/events.jsonl");
  // The first firing, then the replay's, escalated before the run passed it.
  ASSERT_NE(all.find("\"kind\":\"rollback\""), std::string::npos) << all;
  const size_t escalated = all.find("\"kind\":\"escalate\"");
  ASSERT_NE(escalated, std::string::npos) << all;
  const std::string line = all.substr(all.rfind('\n', escalated) + 1,
                                      all.find('\n', escalated) - all.rfind('\n', escalated) - 1);
  EXPECT_NE(line.find("where it last fired: escalating to bf16 instead of replaying"), std::string::npos) << line;
  EXPECT_NE(all.find("switched precision from mxfp4 to mxfp8_e4m3"), std::string::npos) << all;
  EXPECT_NE(all.find("switched precision from mxfp8_e4m3 to bf16"), std::string::npos) << all;
  EXPECT_EQ(t->scheme().name, "bf16");
}

// Rewrites optimizer.safetensors of `dir` with `edit` applied to its metadata
// (WriteSafetensors recomputes the data's CRC, not the policy state's).
void EditOptimizerMeta(const std::string& dir, const std::function<void(std::map<std::string, std::string>*)>& edit) {
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(ReadSafetensors(dir + "/optimizer.safetensors", &tensors, &meta).ok());
  edit(&meta);
  std::vector<TensorRef> refs;
  for (const Tensor& t : tensors) refs.push_back(TensorRef{t.name, t.shape, t.data.data()});
  ASSERT_TRUE(WriteSafetensors(dir + "/optimizer.safetensors", refs, meta).ok());
}

// A checkpoint whose policy state does not verify is skipped like any corrupt
// one, the event naming the file and the field; one without a state (written
// before it existed) resumes with the state empty.
TEST(TrainerTest, CorruptPolicyStateFallsBackAndAMissingOneStartsEmpty) {
  RunConfig c = FaultyRun(TempDir("policy_state_corrupt"), "[{rollback: 5}, {switch: bf16}]");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  Losses(t.get(), 2);
  std::string older, newer;
  ASSERT_TRUE(t->SaveCheckpoint(&older).ok());
  Losses(t.get(), 2);
  ASSERT_TRUE(t->SaveCheckpoint(&newer).ok());
  t.reset();
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(ReadSafetensors(newer + "/optimizer.safetensors", &tensors, &meta).ok());
  ASSERT_EQ(meta.count("policy_state"), 1u);
  EXPECT_NE(meta["policy_state"].find("\"tick\":4"), std::string::npos) << meta["policy_state"];
  EditOptimizerMeta(newer, [](std::map<std::string, std::string>* m) {
    const size_t at = (*m)["policy_state"].find("\"tick\":4");
    (*m)["policy_state"].replace(at, 8, "\"tick\":5");  // one flipped digit
  });
  std::unique_ptr<Trainer> strict;
  ASSERT_TRUE(Trainer::Create(c, &strict).ok());
  Status s = strict->Resume(newer);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(newer + "/optimizer.safetensors: policy_state: CRC-32"), std::string::npos)
      << s.message();
  EXPECT_EQ(strict->step(), 0);  // nothing changed
  std::unique_ptr<Trainer> r;
  ASSERT_TRUE(Trainer::Create(c, &r).ok());
  std::string resumed;
  s = r->ResumeNewestValid("latest", &resumed);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(resumed, older);
  const std::string events = ReadAll(c.run_dir + "/events.jsonl");
  EXPECT_NE(events.find("\"kind\":\"checkpoint_skipped\""), std::string::npos) << events;
  EXPECT_NE(events.find("optimizer.safetensors: policy_state"), std::string::npos) << events;
  // A state with the right CRC but a bad field: refused naming the field.
  EditOptimizerMeta(newer, [](std::map<std::string, std::string>* m) {
    std::string state = (*m)["policy_state"];
    state.replace(state.find("\"interventions\":0"), 17, "\"interventions\":-3");
    (*m)["policy_state"] = state;
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", Crc32(0, state.data(), state.size()));
    (*m)["policy_state.crc32"] = hex;
  });
  s = strict->Resume(newer);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("policy_state: interventions is -3"), std::string::npos) << s.message();
  // Without the state (an older checkpoint): it resumes.
  EditOptimizerMeta(newer, [](std::map<std::string, std::string>* m) {
    m->erase("policy_state");
    m->erase("policy_state.crc32");
  });
  s = strict->Resume(newer);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(strict->step(), 4);
}

// probation on a real trainer: the rescue (rollback, mxfp8_e4m3, a lower LR)
// carries the run past the fault, and after 10 healthy steps in mxfp8_e4m3 the
// run goes back down to mxfp4, where it ends.
TEST(TrainerTest, ProbationReturnsToTheCheaperSchemeAfterHealthySteps) {
  const std::string dir = TempDir("policy_probation");
  RunConfig c;
  Status s = ParseRunConfig(
      FaultyRunYaml(dir, "[{rollback: 10}, {switch: next}, {scale_lr: 0.01}]",
                    std::string(kLadderLines) + "  probation: {after: 10}\n", 5),
      "test", {}, &c);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::vector<StepMetrics> m;
  ASSERT_TRUE(t->Train([&](const StepMetrics& x) { m.push_back(x); }, false).ok());
  EXPECT_FALSE(t->diverged());
  EXPECT_EQ(t->step(), 60);
  EXPECT_EQ(t->scheme().name, "mxfp4");  // back down, and it stayed healthy there
  int rescued = 0;
  for (const StepMetrics& x : m) rescued += x.scheme == "mxfp8_e4m3";
  EXPECT_GE(rescued, 10);  // the healthy steps probation waited for
  std::ifstream events(c.run_dir + "/events.jsonl");
  std::string all((std::istreambuf_iterator<char>(events)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("switched precision from mxfp4 to mxfp8_e4m3: rule r"), std::string::npos) << all;
  EXPECT_NE(all.find("switched precision from mxfp8_e4m3 to mxfp4: probation: 10 healthy steps in mxfp8_e4m3"),
            std::string::npos)
      << all;
  EXPECT_EQ(all.find("\"kind\":\"escalate\""), std::string::npos) << all;
}

// policy.rewarm: after the policy's switch the learning rate restarts from
// 1/N of the schedule's value and ramps back over N steps (the same run
// without rewarm gives the schedule's values); a resume in the middle of the
// ramp continues it bit for bit (rewarm_start is in the checkpoint).
TEST(TrainerTest, PolicyRewarmRampsTheLearningRateAfterASwitchAndSurvivesAResume) {
  auto config = [](const std::string& dir, const std::string& rewarm) {
    RunConfig c;
    Status s = ParseRunConfig(
        FaultyRunYaml(dir, "[{rollback: 10}, {switch: next}]", std::string(kLadderLines) + rewarm), "test", {}, &c);
    EXPECT_TRUE(s.ok()) << s.message();
    return c;
  };
  const RunConfig c = config(TempDir("policy_rewarm"), "  rewarm: 8\n");
  const RunConfig plain_c = config(TempDir("policy_rewarm_plain"), "");
  // Steps as Train takes them: each followed by the policy's actions.
  auto steps = [](Trainer* t, int n, std::vector<StepMetrics>* m) {
    for (int i = 0; i < n; ++i) {
      StepMetrics x;
      ASSERT_TRUE(t->Step(&x).ok());
      ASSERT_TRUE(t->ApplyPolicy().ok());
      m->push_back(x);
    }
  };
  auto run = [&](const RunConfig& rc, int n) {
    std::unique_ptr<Trainer> t;
    EXPECT_TRUE(Trainer::Create(rc, &t).ok());
    std::vector<StepMetrics> m;
    steps(t.get(), n, &m);
    return m;
  };
  const std::vector<StepMetrics> m = run(c, 50), plain = run(plain_c, 50);
  size_t k = 0;  // the first step in the rescue scheme
  while (k < m.size() && m[k].scheme != "mxfp8_e4m3") ++k;
  ASSERT_LT(k + 10, m.size()) << "the policy did not switch";
  ASSERT_EQ(plain[k].scheme, "mxfp8_e4m3");  // the same run up to here, and the same switch
  for (size_t i = 0; i < 10; ++i) {
    const double want = i < 8 ? static_cast<double>(i + 1) / 8.0 : 1.0;
    EXPECT_NEAR(m[k + i].lr / plain[k + i].lr, want, 1e-6) << "step " << m[k + i].step;
  }
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(m[i].lr, plain[i].lr) << "before the switch, step " << m[i].step;
  // Stopped 3 steps into the ramp and resumed: the same steps.
  std::unique_ptr<Trainer> part, resumed;
  ASSERT_TRUE(Trainer::Create(c, &part).ok());
  std::vector<StepMetrics> first;
  steps(part.get(), static_cast<int>(k + 3), &first);
  std::string dir;
  ASSERT_TRUE(part->SaveCheckpoint(&dir).ok());
  part.reset();
  ASSERT_TRUE(Trainer::Create(c, &resumed).ok());
  ASSERT_TRUE(resumed->Resume(dir).ok());
  std::vector<StepMetrics> rest;
  steps(resumed.get(), 8, &rest);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].lr, m[k + 3 + i].lr) << i;
    EXPECT_EQ(rest[i].loss, m[k + 3 + i].loss) << i;
  }
}

TEST(TrainerTest, SchemeSwitchMidRunKeepsTraining) {
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(ProxyConfig(TempDir("proxy_switch"), "fp32"), &t).ok());
  std::vector<StepMetrics> metrics;
  std::vector<double> before = Losses(t.get(), 60, &metrics);
  PrecisionScheme mx;
  ASSERT_TRUE(SchemeFromPreset("mxfp8_e4m3", &mx).ok());
  ASSERT_TRUE(t->SwitchScheme(mx).ok());
  std::vector<double> after = Losses(t.get(), 60, &metrics);
  EXPECT_EQ(metrics[59].scheme, "fp32");
  EXPECT_EQ(metrics[60].scheme, "mxfp8_e4m3");
  EXPECT_TRUE(metrics[59].operands.empty());
  EXPECT_FALSE(metrics[60].operands.empty());  // quantized operands report their stats
  // No restart: the first step after the switch continues from where fp32 was
  // (within 2x), and training keeps going down.
  EXPECT_LT(after[0], 2.0 * before.back());
  EXPECT_LT(Mean(after, 50, 60), Mean(after, 0, 5));
}

TEST(TrainerTest, GradientBiasProbe) {
  RunConfig c = ProxyConfig(TempDir("proxy_probe"), "fp32");
  c.probe_every = 2;
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::vector<StepMetrics> m;
  Losses(t.get(), 2, &m);
  EXPECT_FALSE(m[0].probed);
  ASSERT_TRUE(m[1].probed);
  // fp32 against fp32: the same gradient.
  EXPECT_NEAR(m[1].probe.cosine, 1.0, 1e-6);
  EXPECT_NEAR(m[1].probe.rel_error, 0.0, 1e-3);
  EXPECT_NEAR(m[1].probe.zeta, 0.0, 1e-6);
  PrecisionScheme mx;
  ASSERT_TRUE(SchemeFromPreset("mxfp4", &mx).ok());
  ASSERT_TRUE(t->SwitchScheme(mx).ok());
  Losses(t.get(), 2, &m);
  ASSERT_TRUE(m[3].probed);
  // probe_reference: bf16: the reference is the bf16 scheme's gradient. A bf16
  // step against it is the same gradient; an MXFP4 one is biased about as
  // against fp32 (bf16's own bias is far smaller).
  RunConfig cb = c;
  cb.run_dir = TempDir("proxy_probe_bf16");
  cb.probe_reference = "bf16";
  PrecisionScheme bf16;
  ASSERT_TRUE(SchemeFromPreset("bf16", &bf16).ok());
  cb.precision = bf16;
  std::unique_ptr<Trainer> tb;
  ASSERT_TRUE(Trainer::Create(cb, &tb).ok());
  std::vector<StepMetrics> mb;
  Losses(tb.get(), 2, &mb);
  ASSERT_TRUE(mb[1].probed);
  EXPECT_EQ(mb[1].probe.rel_error, 0.0);
  EXPECT_EQ(mb[1].probe.zeta, 0.0);
  ASSERT_TRUE(tb->SwitchScheme(mx).ok());
  Losses(tb.get(), 2, &mb);
  ASSERT_TRUE(mb[3].probed);
  EXPECT_NEAR(mb[3].probe.zeta, m[3].probe.zeta, 0.02 + 0.2 * std::fabs(m[3].probe.zeta));
  EXPECT_GT(mb[3].probe.rel_error, 1e-3);
  // MXFP4 gradients point the same way but are visibly off.
  EXPECT_GT(m[3].probe.cosine, 0.5);
  EXPECT_LT(m[3].probe.cosine, 0.99999);
  EXPECT_GT(m[3].probe.rel_error, 1e-3);
  EXPECT_EQ(m[3].probe_layers.size(), 2u);  // blocks 0 and 1
  std::string json = m[3].ToJson();
  for (const char* key : {"\"probe\"", "\"zeta\"", "\"grad_norm_layers\"", "\"ln_gamma\"",
                          "\"quant\"", "\"saturated\"", "\"nan_blocks\"", "\"update_ratio\"",
                          "\"tokens_per_s\"", "\"lr\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
}

TEST(TrainerTest, GptLearnsEnglishFromByteShards) {
  std::string dir = TempDir("gpt_text");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "fortunes"));
  // GPT-2's block, then the options: SwiGLU, QK-LayerNorm, no biases.
  const std::vector<std::vector<std::string>> variants = {
      {"model.mlp=gelu"}, {"model.mlp=swiglu", "model.qk_layernorm=true", "model.bias=false"}};
  for (const std::vector<std::string>& variant : variants) {
    std::string yaml = std::string("model: {type: gpt, layers: 2, width: 64, heads: 4, context: 64, vocab: 256}\n") +
                       "data: {train: " + dir + "/fortunes_train.bin, val: " + dir +
                       "/fortunes_val.bin, eval_every: 40, val_batches: 2}\n" +
                       "batch: 8\nseq: 64\nsteps: 40\nthreads: 2\n" +
                       "optimizer: {type: adamw, lr: 0.003, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}\n" +
                       "schedule: {type: cosine, warmup_steps: 5, min_lr_ratio: 0.1}\nrun_dir: " + dir + "/run\n";
    RunConfig c;
    Status s = ParseRunConfig(yaml, "test", variant, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    std::unique_ptr<Trainer> t;
    s = Trainer::Create(c, &t);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<StepMetrics> m;
    std::vector<double> losses = Losses(t.get(), 40, &m);
    ASSERT_EQ(losses.size(), 40u);
    // Uniform over 256 bytes is ln 256 = 5.55; English bytes quickly fall below 3.5.
    EXPECT_NEAR(losses[0], std::log(256.0), 0.3) << variant[0];
    EXPECT_LT(Mean(losses, 35, 40), 3.5) << variant[0];
    ASSERT_TRUE(m[39].evaluated);
    EXPECT_LT(m[39].val_loss, 3.6) << variant[0];
  }
}

// A decoder of the llama skeleton (`model_line`, width 64, context 64, bytes)
// on the same text and budget as the GPT above: its loss goes down as the
// GPT's does, and its `gains` RMSNorm gains are logged as gains.
void ExpectDecoderLearnsEnglish(const std::string& model_line, const std::string& name, size_t gains) {
  std::string dir = TempDir(name);
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "fortunes"));
  std::string yaml = "model: " + model_line + "\n" +
                     "data: {train: " + dir + "/fortunes_train.bin, val: " + dir +
                     "/fortunes_val.bin, eval_every: 40, val_batches: 2}\n" +
                     "batch: 8\nseq: 64\nsteps: 40\nthreads: 2\n" +
                     "optimizer: {type: adamw, lr: 0.003, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}\n" +
                     "schedule: {type: cosine, warmup_steps: 5, min_lr_ratio: 0.1}\nrun_dir: " + dir + "/run\n";
  RunConfig c;
  Status s = ParseRunConfig(yaml, "test", {}, &c);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  s = Trainer::Create(c, &t);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<StepMetrics> m;
  std::vector<double> losses = Losses(t.get(), 40, &m);
  ASSERT_EQ(losses.size(), 40u);
  // Uniform over 256 bytes is ln 256 = 5.55; English bytes quickly fall below 3.5.
  EXPECT_NEAR(losses[0], std::log(256.0), 0.3);
  EXPECT_LT(Mean(losses, 35, 40), 3.5);
  ASSERT_TRUE(m[39].evaluated);
  EXPECT_LT(m[39].val_loss, 3.6);
  EXPECT_EQ(m[39].ln_gamma.size(), gains);
}

// The llama block (RMSNorm, RoPE, SwiGLU, no biases). Gains: every block's two
// RMSNorms and the final one.
TEST(TrainerTest, LlamaLearnsEnglishFromByteShards) {
  ExpectDecoderLearnsEnglish("{type: llama, layers: 2, width: 64, heads: 4, context: 64, vocab: 256}", "llama_text", 5);
}

// The gla block (the llama skeleton with gated linear attention as the mixer).
// Gains: every block's two RMSNorms and its output norm, and the final one.
TEST(TrainerTest, GlaLearnsEnglishFromByteShards) {
  ExpectDecoderLearnsEnglish("{type: gla, layers: 2, width: 64, heads: 2, context: 64, vocab: 256}", "gla_text", 7);
}

// In llm.c's order and in the shuffled one (data.shuffle): a run resumed from a
// checkpoint at step 3 reads the same batches as one that never stopped. The
// shuffled run reads other batches than the in-order one from the first step.
TEST(TrainerTest, GptResumeRestoresDataPosition) {
  std::string dir = TempDir("gpt_resume");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "t"));
  std::vector<std::vector<double>> runs;
  for (const char* shuffle : {"false", "true"}) {
    RunConfig c;
    Status s = ParseRunConfig(
        "model: {type: gpt, layers: 1, width: 32, heads: 2, context: 32, vocab: 256}\n"
        "data: {train: " + dir + "/t_train.bin, shuffle: " + shuffle + "}\nbatch: 4\nseq: 32\nthreads: 2\n"
        "precision: mxfp8_e4m3\nrun_dir: " + dir + "/run\n", "test", {}, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    std::unique_ptr<Trainer> whole, part, resumed;
    ASSERT_TRUE(Trainer::Create(c, &whole).ok());
    std::vector<double> expected = Losses(whole.get(), 6);
    ASSERT_TRUE(Trainer::Create(c, &part).ok());
    Losses(part.get(), 3);
    std::string ckpt;
    ASSERT_TRUE(part->SaveCheckpoint(&ckpt).ok());
    ASSERT_TRUE(Trainer::Create(c, &resumed).ok());
    ASSERT_TRUE(resumed->Resume(ckpt).ok());
    EXPECT_EQ(Losses(resumed.get(), 3), std::vector<double>(expected.begin() + 3, expected.end())) << shuffle;
    runs.push_back(expected);
  }
  EXPECT_NE(runs[0][0], runs[1][0]);  // the same initial weights, other batches
}

// A 3-block llama on the fortunes byte shards under `dir` (the NVFP4 recipe keeps
// the first and last block in BF16: the middle one is NVFP4), with `rest`
// (precision and anything else) appended to its YAML.
RunConfig SmallLlama(const std::string& dir, const std::string& rest) {
  RunConfig c;
  Status s = ParseRunConfig(
      "model: {type: llama, layers: 3, width: 64, heads: 4, context: 32, vocab: 256}\n"
      "data: {train: " + dir + "/t_train.bin}\nbatch: 4\nseq: 32\nthreads: 2\n"
      "optimizer: {type: adamw, lr: 0.003}\nrun_dir: " + dir + "/run\n" + rest,
      "test", {}, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

// CHON on a llama (3 blocks: the recipe keeps the first and last in BF16, so
// the middle one is NVFP4 and patched). The hot sets are chosen at steps 0, 3,
// 6, held in between and kept in checkpoints: a run resumed at step 4, inside
// an interval, continues bit for bit (a resume that chose afresh from step 4's
// data would not). The patch changes the run: without it the curve differs.
TEST(TrainerTest, HcpHotSetsAreModelStateAndResumeIsBitExact) {
  std::string dir = TempDir("hcp_resume");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "t"));
  auto config = [&](const std::string& precision) { return SmallLlama(dir, "precision: " + precision + "\n"); };
  const RunConfig c = config("{preset: chon, hcp: {channels: 8, every: 3, wgrad_rows: 16}}");
  std::unique_ptr<Trainer> whole, part, resumed, plain;
  ASSERT_TRUE(Trainer::Create(c, &whole).ok());
  const std::vector<double> expected = Losses(whole.get(), 8);
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_TRUE(Trainer::Create(c, &part).ok());
  Losses(part.get(), 4);
  std::string ckpt;
  ASSERT_TRUE(part->SaveCheckpoint(&ckpt).ok());
  // The checkpoint holds the sets, one line per patched GEMM's layer.
  std::map<std::string, std::string> meta;
  std::vector<Tensor> tensors;
  ASSERT_TRUE(ReadSafetensors(ckpt + "/optimizer.safetensors", &tensors, &meta).ok());
  ASSERT_TRUE(meta.count("hcp.hot_sets"));
  const std::string& sets = meta["hcp.hot_sets"];
  EXPECT_EQ(sets.rfind("scheme custom ", 0), 0u) << sets;
  EXPECT_NE(sets.find("hcp=8/fwd+dgrad/every3"), std::string::npos) << sets;
  // The middle block's four layers (slots 4..7), 8 forward and 8 dgrad channels each.
  for (const char* layer : {"\n4 8 8 ", "\n5 8 8 ", "\n6 8 8 ", "\n7 8 8 "}) {
    EXPECT_NE(sets.find(layer), std::string::npos) << layer << " in " << sets;
  }
  EXPECT_EQ(sets.find("\n0 "), std::string::npos) << "the first block is BF16: nothing to patch";
  EXPECT_TRUE(meta.count("hcp.hot_sets.crc32"));
  ASSERT_TRUE(Trainer::Create(c, &resumed).ok());
  Status s = resumed->Resume(ckpt);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Losses(resumed.get(), 4), std::vector<double>(expected.begin() + 4, expected.end()));
  // Sets that do not fit the model (an index past its layer's width), under a
  // CRC that matches: refused naming them, before anything is applied.
  EditOptimizerMeta(ckpt, [](std::map<std::string, std::string>* m) {
    std::string sets = (*m)["hcp.hot_sets"];
    const size_t first = sets.find("\n4 8 8 ") + 7;
    sets.replace(first, sets.find(' ', first) - first, "9999");
    (*m)["hcp.hot_sets"] = sets;
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", Crc32(0, sets.data(), sets.size()));
    (*m)["hcp.hot_sets.crc32"] = hex;
  });
  std::unique_ptr<Trainer> refused;
  ASSERT_TRUE(Trainer::Create(c, &refused).ok());
  s = refused->Resume(ckpt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("hcp.hot_sets: hot sets: layer 4 (layers.1.attn.qkv) forward index 0: 9999 is not "
                             "allowed (need ascending indices below 64)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(refused->step(), 0);  // nothing applied
  // The same run without the patch (post-QK protection alone) is another run.
  ASSERT_TRUE(Trainer::Create(config("{preset: chon, hcp: off}"), &plain).ok());
  const std::vector<double> unpatched = Losses(plain.get(), 8);
  EXPECT_NE(unpatched[0], expected[0]);  // the forward patch acts from the first step
  EXPECT_NE(unpatched, expected);
}

// CHON's detector in a policy: an NVFP4 llama with outlier analytics every
// other step; a rule on hot_channel_growth (at a ratio any change trips)
// switches the run to chon, and the run goes on patched. The event names the
// detector, and the metrics lines the new scheme.
TEST(TrainerTest, HotChannelGrowthCanSwitchARunToChon) {
  std::string dir = TempDir("hcp_detector");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "t"));
  const RunConfig c = SmallLlama(
      dir, "steps: 16\nprecision: nvfp4\nanalytics_every: 2\n"
           "policy:\n  detectors: {hot_channel_growth: {window: 4, min_samples: 1, ratio: 1.000001}}\n"
           "  rules:\n    - {name: outliers, when: [hot_channel_growth], do: [{switch: chon}], max: 1}\n");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::vector<StepMetrics> m;
  const Status s = t->Train([&](const StepMetrics& x) { m.push_back(x); }, false);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(m.size(), 16u);
  EXPECT_EQ(m.front().scheme, "nvfp4");
  EXPECT_EQ(m.back().scheme, "chon");
  const std::string events = ReadAll(c.run_dir + "/events.jsonl");
  EXPECT_NE(events.find("hot_channel_growth"), std::string::npos) << events;
  EXPECT_NE(events.find("chon"), std::string::npos) << events;
  for (const StepMetrics& x : m) EXPECT_TRUE(std::isfinite(x.loss)) << x.step;
}

// policy: default on a language model: the probe it turns on (probe_every was
// not given) measures the MXFP4 run's gradient bias, the bias rule fires after
// three biased probes in a row and moves the run to the same scheme with its
// head in BF16, the first rung of a language model's ladder; the count then
// starts afresh in the new scheme.
TEST(TrainerTest, ALanguageModelsDefaultPolicyMovesABiasedRunsHeadToBf16First) {
  std::string dir = TempDir("bias_head");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "t"));
  const RunConfig c = SmallLlama(dir, "steps: 12\nprecision: mxfp4\npolicy: default\n");
  ASSERT_EQ(c.probe_every, 1);  // DefaultProbeEvery(12)
  ASSERT_EQ(c.policy.ladder.at(1), "mxfp4+bf16_head");
  std::unique_ptr<Trainer> t;
  ASSERT_TRUE(Trainer::Create(c, &t).ok());
  std::vector<StepMetrics> m;
  const Status s = t->Train([&](const StepMetrics& x) { m.push_back(x); }, false);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(m.size(), 12u);
  // On the build machine: zeta -0.29, -0.18, -0.18 with the MX head; then
  // -0.007 and the like with the BF16 head, one probe aside (-0.46 at step 7).
  int biased_after = 0;
  for (const StepMetrics& x : m) {
    ASSERT_TRUE(x.probed) << x.step;
    if (x.step <= 3) {
      EXPECT_EQ(x.scheme, "mxfp4") << x.step;
      EXPECT_GT(std::fabs(x.probe.zeta), 0.1) << x.step;
    } else {
      EXPECT_EQ(x.scheme, "mxfp4+bf16_head") << x.step;  // one rung, and it stayed there
      biased_after += std::fabs(x.probe.zeta) > 0.1;
    }
  }
  EXPECT_LE(biased_after, 2);
  EXPECT_TRUE(t->scheme().bf16_head);
  EXPECT_EQ(t->scheme().roles[static_cast<int>(Role::kFwdX)].format, QuantFormat::kMxfp4);  // the rest stays MXFP4
  const std::string events = ReadAll(c.run_dir + "/events.jsonl");
  EXPECT_NE(events.find("switched precision from mxfp4 to mxfp4+bf16_head: rule bias"), std::string::npos) << events;
  EXPECT_NE(events.find("gradient bias (overall)"), std::string::npos) << events;
  EXPECT_EQ(events.find("\"kind\":\"rollback\""), std::string::npos) << events;  // the bias rule does not roll back
}

}  // namespace
}  // namespace keel
