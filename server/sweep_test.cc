// Tests of sweep parsing and expansion (sweep.h).
#include "server/sweep.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <tuple>
#include <sstream>

#include "worker/io/yaml_strict.h"
#include "worker/config/run_config.h"

namespace keel {
namespace {

const char kBase[] =
    "name: t\n"
    "base:\n"
    "  model: {type: proxy, layers: 2, width: 64}\n"
    "  batch: 256\n"
    "  steps: 300\n"
    "  optimizer: {type: adam, lr: 6.0e-4}\n";

Status Expand(const std::string& text, SweepPlan* plan, SweepLimits limits = SweepLimits()) {
  return ExpandSweep(text, "s.yaml", limits, plan);
}

RunConfig Parse(const ExpandedRun& run) {
  RunConfig c;
  Status s = ParseRunConfig(run.yaml, "run", {}, &c);
  EXPECT_TRUE(s.ok()) << s.message() << "\n" << run.yaml;
  return c;
}

std::vector<std::pair<std::string, std::string>> Axes(
    std::initializer_list<std::pair<std::string, std::string>> a) {
  return a;
}

TEST(SweepTest, RefusalsAreInvalidArguments) {
  SweepPlan plan;
  for (const std::string& bad : {std::string("name: x\n"), std::string("base: {steps: 1}\n"),
                                 std::string(kBase) + "axes:\n  - grid: {precision: [mxfp9]}\n"}) {
    Status s = Expand(bad, &plan);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  }
}

TEST(SweepTest, NoAxesIsOneRunOfBase) {
  SweepPlan plan;
  Status s = Expand(kBase, &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(plan.name, "t");
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_TRUE(plan.runs[0].axes.empty());
  RunConfig c = Parse(plan.runs[0]);
  EXPECT_EQ(c.batch, 256);
  EXPECT_EQ(c.steps, 300);
  EXPECT_EQ(c.model.width, 64);
  EXPECT_EQ(plan.source_yaml, kBase);
}

TEST(SweepTest, GridIsProductFirstKeySlowest) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "axes:\n  - grid: {precision: [bf16, mxfp4], seed: [1, 2, 3]}\n", &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 6u);
  const char* prec[] = {"bf16", "bf16", "bf16", "mxfp4", "mxfp4", "mxfp4"};
  const int seeds[] = {1, 2, 3, 1, 2, 3};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(plan.runs[i].axes,
              Axes({{"precision", prec[i]}, {"seed", std::to_string(seeds[i])}}))
        << i;
    RunConfig c = Parse(plan.runs[i]);
    EXPECT_EQ(c.precision.name, prec[i]);
    EXPECT_EQ(c.seed, static_cast<uint64_t>(seeds[i]));
    EXPECT_EQ(c.batch, 256);  // base kept
  }
}

TEST(SweepTest, ZipMovesInStepAndMultipliesWithGrid) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) +
                        "axes:\n"
                        "  - zip: {optimizer.lr: [1e-3, 6e-4], model.layers: [3, 4]}\n"
                        "  - grid: {seed: [5, 6]}\n",
                    &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 4u);
  EXPECT_EQ(plan.runs[0].axes, Axes({{"optimizer.lr", "1e-3"}, {"model.layers", "3"}, {"seed", "5"}}));
  EXPECT_EQ(plan.runs[1].axes, Axes({{"optimizer.lr", "1e-3"}, {"model.layers", "3"}, {"seed", "6"}}));
  EXPECT_EQ(plan.runs[2].axes, Axes({{"optimizer.lr", "6e-4"}, {"model.layers", "4"}, {"seed", "5"}}));
  EXPECT_EQ(plan.runs[3].axes, Axes({{"optimizer.lr", "6e-4"}, {"model.layers", "4"}, {"seed", "6"}}));
  RunConfig c = Parse(plan.runs[3]);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 6e-4f);
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.width, 64);           // the rest of base's model mapping kept
  EXPECT_EQ(c.optimizer.type, "adam");
  EXPECT_EQ(c.seed, 6u);
}

TEST(SweepTest, PresetThenNestedPrecisionPathKeepsPreset) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "  precision: mxfp8_e4m3\n" +
                        "axes:\n  - grid: {precision.rounding: [nearest_even, stochastic]}\n",
                    &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 2u);
  RunConfig c = Parse(plan.runs[1]);
  EXPECT_EQ(c.precision.roles[0].format, QuantFormat::kMxfp8E4M3);
  EXPECT_EQ(c.precision.roles[0].rounding, Rounding::kStochastic);
}

// The documented generator, written out independently.
uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string RandomSweep(int count, int seed) {
  return std::string(kBase) + "axes:\n  - random: {count: " + std::to_string(count) +
         ", seed: " + std::to_string(seed) +
         ", params: {optimizer.lr: {log_uniform: [1e-5, 1e-3]}, model.width: {choice: [64, 128]},"
         " optimizer.beta2: {uniform: [0.95, 0.999]}}}\n";
}

TEST(SweepTest, RandomCountRangesAndGenerator) {
  SweepPlan plan;
  Status s = Expand(RandomSweep(40, 7), &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 40u);
  std::set<int> widths;
  uint64_t state = 7;
  for (const ExpandedRun& run : plan.runs) {
    ASSERT_EQ(run.axes.size(), 3u);
    EXPECT_EQ(run.axes[0].first, "optimizer.lr");
    EXPECT_EQ(run.axes[1].first, "model.width");
    EXPECT_EQ(run.axes[2].first, "optimizer.beta2");
    RunConfig c = Parse(run);
    EXPECT_GE(c.optimizer.lr, 1e-5f);
    EXPECT_LE(c.optimizer.lr, 1e-3f);
    EXPECT_GE(c.optimizer.beta2, 0.95f);
    EXPECT_LE(c.optimizer.beta2, 0.999f);
    EXPECT_TRUE(c.model.width == 64 || c.model.width == 128) << c.model.width;
    widths.insert(c.model.width);
    // Same values as the documented splitmix64 recipe.
    double u_lr = static_cast<double>(SplitMix(&state) >> 11) / 9007199254740992.0;
    double u_w = static_cast<double>(SplitMix(&state) >> 11) / 9007199254740992.0;
    double u_b = static_cast<double>(SplitMix(&state) >> 11) / 9007199254740992.0;
    char lr[32], b2[32];
    std::snprintf(lr, sizeof(lr), "%.6g", std::exp(std::log(1e-5) + u_lr * (std::log(1e-3) - std::log(1e-5))));
    std::snprintf(b2, sizeof(b2), "%.6g", 0.95 + u_b * (0.999 - 0.95));
    EXPECT_EQ(run.axes[0].second, lr);
    EXPECT_EQ(run.axes[1].second, u_w < 0.5 ? "64" : "128");
    EXPECT_EQ(run.axes[2].second, b2);
  }
  EXPECT_EQ(widths.size(), 2u);  // 40 draws hit both choices
}

TEST(SweepTest, RandomIsDeterministicPerSeed) {
  SweepPlan a, b, c;
  ASSERT_TRUE(Expand(RandomSweep(5, 7), &a).ok());
  ASSERT_TRUE(Expand(RandomSweep(5, 7), &b).ok());
  ASSERT_TRUE(Expand(RandomSweep(5, 8), &c).ok());
  ASSERT_EQ(a.runs.size(), 5u);
  for (size_t i = 0; i < a.runs.size(); ++i) {
    EXPECT_EQ(a.runs[i].axes, b.runs[i].axes);
    EXPECT_EQ(a.runs[i].yaml, b.runs[i].yaml);
  }
  int same = 0;
  for (size_t i = 0; i < a.runs.size(); ++i) same += a.runs[i].axes == c.runs[i].axes;
  EXPECT_EQ(same, 0);
}

TEST(SweepTest, FullProductOfGridZipRandom) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) +
                        "axes:\n"
                        "  - grid: {precision: [bf16, mxfp8_e4m3, mxfp6_e2m3, mxfp4], seed: [1, 2]}\n"
                        "  - zip: {optimizer.lr: [1e-3, 6e-4], model.layers: [2, 4]}\n"
                        "  - random: {count: 4, seed: 7, params: {optimizer.beta2: {uniform: [0.95, 0.999]}}}\n",
                    &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(plan.runs.size(), 4u * 2u * 2u * 4u);
  std::set<std::string> distinct;
  for (const ExpandedRun& r : plan.runs) {
    EXPECT_EQ(r.axes.size(), 5u);
    distinct.insert(r.yaml);
  }
  EXPECT_EQ(distinct.size(), plan.runs.size());
}

TEST(SweepTest, ResourcesAndLimits) {
  SweepPlan plan;
  ASSERT_TRUE(Expand(kBase, &plan).ok());
  EXPECT_EQ(plan.gpus, 0);
  EXPECT_EQ(plan.cpu_slots, 1);
  EXPECT_EQ(plan.max_concurrent, 0);
  EXPECT_EQ(plan.max_restarts, 2);
  EXPECT_EQ(plan.priority, 0);
  EXPECT_EQ(plan.policy_yaml, "");

  ASSERT_TRUE(Expand(std::string(kBase) +
                         "resources: {gpus: 2}\nmax_concurrent: 4\nmax_restarts: 5\npriority: -3\n"
                         "policy: {ladder: [mxfp4, bf16], rules: [{when: [loss_zscore], do: [{switch: next}]}]}\n",
                     &plan)
                  .ok());
  EXPECT_EQ(plan.gpus, 2);
  EXPECT_EQ(plan.cpu_slots, 0);
  EXPECT_EQ(plan.max_concurrent, 4);
  EXPECT_EQ(plan.max_restarts, 5);
  EXPECT_EQ(plan.priority, -3);
  EXPECT_NE(plan.policy_yaml.find("switch"), std::string::npos) << plan.policy_yaml;
  EXPECT_NE(plan.policy_yaml.find("loss_zscore"), std::string::npos);
  // Every run carries the policy in its own config.
  for (const ExpandedRun& run : plan.runs) {
    RunConfig config;
    ASSERT_TRUE(ParseRunConfig(run.yaml, "run", {}, &config).ok());
    ASSERT_EQ(config.policy.rules.size(), 1u);
    EXPECT_EQ(config.policy.ladder, (std::vector<std::string>{"mxfp4", "bf16"}));
  }
  // An invalid policy is refused at its line in the sweep file.
  Status bad = Expand(std::string(kBase) + "policy:\n  rules:\n    - {when: [loss_zscore], do: [{switch: mxfp9}]}\n", &plan);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("s.yaml:"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("mxfp9"), std::string::npos) << bad.message();

  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {cpu_slots: 3}\n", &plan).ok());
  EXPECT_EQ(plan.gpus, 0);
  EXPECT_EQ(plan.cpu_slots, 3);

  Status s = Expand(std::string(kBase) + "resources: {gpus: 1, cpu_slots: 1}\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:7:12: resources: gpus and cpu_slots"), std::string::npos) << s.message();
  s = Expand(std::string(kBase) + "max_concurrent: -1\nmax_restarts: many\npolicy: strict\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:7:17: max_concurrent: -1 is out of range"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("s.yaml:8:15: max_restarts: 'many' is not an integer"), std::string::npos);
  EXPECT_NE(s.message().find("s.yaml:9:9: policy: unknown policy 'strict' (allowed: default, or a mapping of "
                             "detectors, ladder, rules, ...)"),
            std::string::npos)
      << s.message();
  s = Expand(std::string(kBase) + "policy: [default]\n", &plan);
  EXPECT_NE(s.message().find("s.yaml:7:9: policy: expected a mapping or a policy name, got a sequence"),
            std::string::npos)
      << s.message();
}

// policy: default on a sweep: every run resolves it against its own scheme.
TEST(SweepTest, PolicyDefaultReachesEveryRunWithItsOwnLadder) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "axes:\n  - grid: {precision: [mxfp4, bf16]}\npolicy: default\n", &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 2u);
  for (const auto& run : plan.runs) {
    RunConfig config = Parse(run);
    EXPECT_EQ(config.policy.preset, "default");
    ASSERT_FALSE(config.policy.ladder.empty());
    EXPECT_EQ(config.policy.ladder.front(), config.precision.name);
    EXPECT_EQ(config.policy.ladder.back(), "fp32");
  }
}

TEST(SweepTest, HostsTimesGpusPerHostIsAGangOfExactlyThatShape) {
  SweepPlan plan;
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {hosts: 2, gpus_per_host: 4}\n", &plan).ok());
  EXPECT_EQ(plan.hosts, 2);
  EXPECT_EQ(plan.gpus_per_host, 4);
  EXPECT_EQ(plan.gpus, 8);
  EXPECT_EQ(plan.cpu_slots, 0);
  // gpus beside them is allowed when it says the same.
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {hosts: 2, gpus_per_host: 4, gpus: 8}\n", &plan).ok());
  EXPECT_EQ(plan.gpus, 8);
  // Plain gpus leaves the shape to the scheduler.
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {gpus: 8}\n", &plan).ok());
  EXPECT_EQ(plan.hosts, 0);
  EXPECT_EQ(plan.gpus_per_host, 0);
  EXPECT_EQ(plan.gpus, 8);
}

// A `resources:` value the parser must refuse, and its exact message.
struct ResourcesCase {
  const char* resources;
  std::string message;
};

// Each case is refused with its message, and the plan is left as it was.
template <size_t N>
void ExpectResourcesRefused(const ResourcesCase (&cases)[N]) {
  for (const ResourcesCase& c : cases) {
    SweepPlan plan;
    plan.name = "untouched";
    Status s = Expand(std::string(kBase) + "resources: " + c.resources + "\n", &plan);
    ASSERT_FALSE(s.ok()) << c.resources;
    EXPECT_EQ(s.message(), c.message) << c.resources;
    EXPECT_EQ(plan.name, "untouched");  // nothing changes on error
    EXPECT_EQ(plan.gpu_milli, 0);
  }
}

TEST(SweepTest, BadHostsAndGpusPerHostNameFieldValueAndWhatIsAllowed) {
  const ResourcesCase cases[] = {
      {"{hosts: 0, gpus_per_host: 4}", "s.yaml:7:20: resources.hosts: 0 is out of range (allowed: 1 .. 1024)"},
      {"{hosts: 2, gpus_per_host: -1}", "s.yaml:7:38: resources.gpus_per_host: -1 is out of range (allowed: 1 .. 1024)"},
      {"{hosts: two, gpus_per_host: 4}", "s.yaml:7:20: resources.hosts: 'two' is not an integer"},
      {"{hosts: 1.5, gpus_per_host: 4}", "s.yaml:7:20: resources.hosts: '1.5' is not an integer"},
      {"{hosts: 2}", "s.yaml:7:20: resources.hosts: needs resources.gpus_per_host (allowed: both, e.g. "
                     "{hosts: 2, gpus_per_host: 4})"},
      {"{gpus_per_host: 4}", "s.yaml:7:28: resources.gpus_per_host: needs resources.hosts (allowed: both, e.g. "
                             "{hosts: 2, gpus_per_host: 4})"},
      {"{hosts: 2, gpus_per_host: 4, gpus: 6}",
       "s.yaml:7:47: resources.gpus: 6 is not hosts x gpus_per_host = 2 x 4 (allowed: 8, or leave gpus out)"},
      {"{hosts: 64, gpus_per_host: 32}",
       "s.yaml:7:12: resources: hosts x gpus_per_host = 64 x 32 = 2048 GPUs (allowed: at most 1024)"},
      {"{hosts: 2, gpus_per_host: 4, cpu_slots: 1}",
       "s.yaml:7:12: resources: hosts and cpu_slots are both set (allowed: one of them)"},
  };
  ExpectResourcesRefused(cases);
}

TEST(SweepTest, AFractionOfAGpuIsOneRankInThousandths) {
  SweepPlan plan;
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {gpus: 0.25}\n", &plan).ok());
  EXPECT_EQ(plan.gpus, 1);
  EXPECT_EQ(plan.gpu_milli, 250);
  EXPECT_EQ(plan.gpu_memory_bytes, 0);
  EXPECT_EQ(plan.cpu_slots, 0);
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {gpus: 0.125, gpu_memory_gb: 1.5}\n", &plan).ok());
  EXPECT_EQ(plan.gpu_milli, 125);
  EXPECT_EQ(plan.gpu_memory_bytes, int64_t{3} << 29);
  // Whole numbers stay whole GPUs, "2.0" too.
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {gpus: 2.0}\n", &plan).ok());
  EXPECT_EQ(plan.gpus, 2);
  EXPECT_EQ(plan.gpu_milli, 0);
  ASSERT_TRUE(Expand(std::string(kBase) + "resources: {gpus: 0.5, gpu_memory_gb: 8}\n", &plan).ok());
  EXPECT_EQ(plan.gpu_milli, 500);
  EXPECT_EQ(plan.gpu_memory_bytes, int64_t{8} << 30);
}

TEST(SweepTest, BadFractionalGpusNameFieldValueAndWhatIsAllowed) {
  const std::string rule = " (allowed: a whole number 1 .. 1024, or a fraction 0 < gpus < 1 in thousandths, e.g. 0.25)";
  const ResourcesCase cases[] = {
      {"{gpus: 1.5}", "s.yaml:7:19: resources.gpus: 1.5 is not whole: a fraction above 1 GPU is not allowed" + rule},
      {"{gpus: 0.0001}", "s.yaml:7:19: resources.gpus: 0.0001 is not a whole number of thousandths" + rule},
      {"{gpus: -0.5}", "s.yaml:7:19: resources.gpus: -0.5 is out of range" + rule},
      {"{gpus: half}", "s.yaml:7:19: resources.gpus: 'half' is not a number" + rule},
      {"{gpus: 0}", "s.yaml:7:19: resources.gpus: 0 is out of range (allowed: 1 .. 1024)"},
      {"{gpus: 1, gpu_memory_gb: 8}",
       "s.yaml:7:37: resources.gpu_memory_gb: is not allowed with gpus: 1 (allowed: only beside a fractional gpus, "
       "e.g. {gpus: 0.25, gpu_memory_gb: 16})"},
      {"{gpu_memory_gb: 8}",
       "s.yaml:7:28: resources.gpu_memory_gb: needs a fractional resources.gpus (allowed: e.g. {gpus: 0.25, "
       "gpu_memory_gb: 16})"},
      {"{gpus: 0.5, gpu_memory_gb: 0}",
       "s.yaml:7:39: resources.gpu_memory_gb: 0 is out of range (allowed: 0 < GiB <= 1048576)"},
      {"{hosts: 2, gpus_per_host: 1, gpus: 0.5}",
       "s.yaml:7:47: resources.gpus: 0.5 is not hosts x gpus_per_host = 2 x 1 (allowed: 2, or leave gpus out)"},
  };
  ExpectResourcesRefused(cases);
}

TEST(SweepTest, MaxRunsLimitIsApplied) {
  SweepPlan plan;
  SweepLimits limits;
  limits.max_runs = 5;
  Status s = Expand(std::string(kBase) + "axes:\n  - grid: {seed: [1, 2, 3], batch: [8, 16]}\n", &plan, limits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("grid seed (3) x grid batch (2) = 6 runs, more than the limit of 5"),
            std::string::npos)
      << s.message();
  limits.max_runs = 6;
  EXPECT_TRUE(Expand(std::string(kBase) + "axes:\n  - grid: {seed: [1, 2, 3], batch: [8, 16]}\n", &plan, limits).ok());
}

TEST(SweepTest, MillionRunGridIsRefusedQuickly) {
  std::string ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
  std::string text = std::string(kBase) + "axes:\n  - grid: {seed: " + ten + ", batch: " + ten +
                     ", steps: " + ten + ", model.layers: " + ten + ", model.width: " + ten +
                     ", log_every: " + ten + "}\n";
  SweepPlan plan;
  plan.name = "untouched";
  auto t0 = std::chrono::steady_clock::now();
  Status s = Expand(text, &plan);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_LT(seconds, 1.0);
  EXPECT_NE(s.message().find("= 1000000 runs, more than the limit of 10000"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("grid seed (10) x grid batch (10)"), std::string::npos);
  EXPECT_NE(s.message().find("s.yaml:8:3: axes:"), std::string::npos);
  EXPECT_EQ(plan.name, "untouched");
  EXPECT_TRUE(plan.runs.empty());

  // A random count is checked before anything is sampled.
  t0 = std::chrono::steady_clock::now();
  s = Expand(std::string(kBase) + "axes:\n  - random: {count: 1000000000000, seed: 1, params: {seed: {uniform: [0, 9]}}}\n",
             &plan);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_LT(seconds, 1.0);
  EXPECT_NE(s.message().find("random (1000000000000) = 1000000000000 runs"), std::string::npos) << s.message();
}

TEST(SweepTest, SweepAtTheLimitExpandsFully) {
  std::string hundred = "[";
  for (int i = 1; i <= 100; ++i) hundred += std::to_string(i) + (i < 100 ? ", " : "]");
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "axes:\n  - grid: {seed: " + hundred + ", steps: " + hundred + "}\n", &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 10000u);
  EXPECT_EQ(plan.runs[9999].axes, Axes({{"seed", "100"}, {"steps", "100"}}));
  EXPECT_EQ(Parse(plan.runs[150]).steps, 51);
}

TEST(SweepTest, UnknownSchemeInAxisPointsAtTheValue) {
  SweepPlan plan;
  plan.name = "untouched";
  Status s = Expand(std::string(kBase) + "axes:\n  - grid: {seed: [1], precision: [bf16, mxfp9, mxfp4]}\n", &plan);
  ASSERT_FALSE(s.ok());
  // Line 8, column of "mxfp9".
  EXPECT_EQ(s.message().rfind("s.yaml:8:41: precision: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("mxfp9"), std::string::npos);
  EXPECT_NE(s.message().find(PresetNames()), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one error only:\n" << s.message();
  EXPECT_EQ(plan.name, "untouched");
}

TEST(SweepTest, BadValueInBlockListAndRandomChoice) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) +
                        "axes:\n"
                        "  - grid:\n"
                        "      batch:\n"
                        "        - 16\n"
                        "        - -4\n"
                        "  - random: {count: 30, seed: 3, params: {model.width: {choice: [64, 0]}}}\n",
                    &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:11:11: batch: -4 is out of range (allowed: 1 .."), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("s.yaml:12:70: model.width: 0 is out of range"), std::string::npos) << s.message();
}

TEST(SweepTest, NegativeBatchInBasePointsAtBase) {
  SweepPlan plan;
  std::string text =
      "# comment\n"
      "name: t\n"
      "axes:\n"
      "  - grid: {seed: [1, 2]}\n"
      "base:\n"
      "  model: {type: proxy, layers: 2, width: 64}\n"
      "  batch: -5\n"
      "max_concurrent: 1\n";
  Status s = Expand(text, &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:7:10: base.batch: -5 is out of range (allowed: 1 .. 16777216)");

  // Flow-style base on the key's line.
  s = Expand("name: t\nbase: {steps: 10, model: {type: proxy, width: -1}}\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("s.yaml:2:47: base.model.width: -1 is out of range", 0), 0u) << s.message();
}

TEST(SweepTest, UnknownKeyInBaseListsAllowed) {
  SweepPlan plan;
  Status s = Expand("name: t\nbase:\n  steps: 10\n  bach: 3\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("s.yaml:4:3: base.bach: unknown key (allowed: analytics, analytics_every, backend, batch,", 0), 0u)
      << s.message();
}

TEST(SweepTest, ZipLengthMismatch) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "axes:\n  - zip: {optimizer.lr: [1e-3, 6e-4], model.layers: [2, 4, 8]}\n",
                    &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "s.yaml:8:53: axes[0].zip.model.layers: has 3 values but optimizer.lr has 2 "
            "(allowed: lists of equal length in a zip)");
}

TEST(SweepTest, UnknownKeysAreErrorsWithAllowedList) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "axis: []\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "s.yaml:7:1: axis: unknown key (allowed: name, base, axes, resources, max_concurrent, "
            "max_restarts, priority, policy)");

  s = Expand(std::string(kBase) + "axes:\n  - grid: {optimizer.lrr: [1e-3]}\n  - cross: {seed: [1]}\n"
                                  "resources: {tpus: 1}\n",
             &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:8:12: optimizer.lrr: unknown key (allowed: "), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("s.yaml:9:5: axes[1].cross: unknown axis kind (allowed: grid, zip, random)"),
            std::string::npos);
  EXPECT_NE(s.message().find("s.yaml:10:13: resources.tpus: unknown key (allowed: gpus, cpu_slots, hosts, gpus_per_host, gpu_memory_gb)"),
            std::string::npos);

  s = Expand(std::string(kBase) +
                 "axes:\n  - random: {count: 2, seed: 1, extra: 1, params: {seed: {normal: [0, 1]}}}\n",
             &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("axes[0].random.extra: unknown key (allowed: count, seed, params)"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("unknown distribution 'normal' (allowed: uniform, log_uniform, choice)"),
            std::string::npos);
}

TEST(SweepTest, MissingAndMalformedTopLevel) {
  SweepPlan plan;
  Status s = Expand("base: {steps: 10}\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("name: missing"), std::string::npos) << s.message();
  s = Expand("name: a/b\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:1:7: name: 'a/b' is not allowed: '/' at offset 1 (allowed: [A-Za-z0-9_.-]+, "
                             "at most 128 characters, not starting with '.')"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("base: missing"), std::string::npos);
  s = Expand("name: [unclosed\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("invalid YAML"), std::string::npos) << s.message();
}

// std::regex_match recursed once per character: a 40,000-character name
// overflowed keeld's stack (SIGSEGV). Names are now bounded before any check
// of their characters, and checked by a loop.
TEST(SweepTest, LongNamesAreRefusedByLengthWithoutCrashing) {
  SweepPlan plan;
  for (size_t n : {size_t{129}, size_t{20000}, size_t{40000}, size_t{1} << 20}) {
    Status s = Expand("name: " + std::string(n, 'a') + "\nbase: {steps: 10}\n", &plan);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "s.yaml:1:7: name: a name of " + std::to_string(n) +
                               " characters is not allowed: too long (allowed: [A-Za-z0-9_.-]+, at most 128 "
                               "characters, not starting with '.')");
  }
  ASSERT_TRUE(Expand("name: " + std::string(128, 'a') + "\nbase: {steps: 10}\n", &plan).ok());
  EXPECT_EQ(plan.name.size(), 128u);
}

TEST(SweepTest, DotNamesAreRefused) {
  SweepPlan plan;
  for (const char* name : {"'.'", "'..'", "...", ".hidden"}) {
    Status s = Expand(std::string("name: ") + name + "\nbase: {steps: 10}\n", &plan);
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_NE(s.message().find("is not allowed: it starts with '.'"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(Expand("name: a..b\nbase: {steps: 10}\n", &plan).ok());
}

TEST(SweepTest, FileOverFourMiBIsRefusedWithSizeAndLimit) {
  SweepPlan plan;
  std::string text = std::string(kBase) + "# " + std::string(kMaxYamlBytes, 'x') + "\n";
  Status s = Expand(text, &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:1:1: size: " + std::to_string(text.size()) +
                             " bytes is more than the limit of 4194304 bytes (allowed: at most 4 MiB)");
}

TEST(SweepTest, OverlongOrControlCharacterSourceIsRefused) {
  SweepPlan plan;
  Status s = ExpandSweep(kBase, std::string(300, 's'), SweepLimits(), &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(":1:1: source: a name of 300 characters is too long (allowed: at most 256"),
            std::string::npos)
      << s.message();
  EXPECT_LT(s.message().size(), 300u);
  s = ExpandSweep(kBase, "a\nb.yaml", SweepLimits(), &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("source: a control character at offset 1"), std::string::npos) << s.message();
  EXPECT_TRUE(ExpandSweep(kBase, std::string(256, 's'), SweepLimits(), &plan).ok());
}

TEST(SweepTest, DuplicateKeysAreRefusedAnywhere) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "name: u\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:7:1: name: duplicate key (first at line 1)");
  s = Expand("name: t\nbase:\n  steps: 10\n  batch: 8\n  steps: 20\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:5:3: base.steps: duplicate key (first at line 3)");
  s = Expand(std::string(kBase) + "axes:\n  - grid: {seed: [1, 2], seed: [3]}\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:8:26: axes[0].grid.seed: duplicate key (first at line 8)");
  s = Expand(std::string(kBase) + "policy:\n  max_interventions: 1\n  max_interventions: 2\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:9:3: policy.max_interventions: duplicate key (first at line 8)");
}

TEST(SweepTest, SecondDocumentIsRefused) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "---\nname: other\n", &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:7:1: document: a second YAML document starts at line 7"), std::string::npos)
      << s.message();
}

TEST(SweepTest, DeepNestingAndBinaryBytesAreRefusedWithAPosition) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) + "policy: " + std::string(100000, '['), &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s.yaml:7:"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("nesting: more than 64 levels"), std::string::npos) << s.message();
  s = Expand(std::string(kBase) + std::string("policy: {}\0\xff", 12), &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "s.yaml:7:11: not a text file: byte 0x00 at line 7 col 11 (allowed: UTF-8 text without "
                         "control characters other than tab, CR, LF)");
}

TEST(SweepTest, EveryErrorIsReportedTogether) {
  SweepPlan plan;
  plan.name = "untouched";
  std::string text = std::string(kBase) +
                     "axes:\n"
                     "  - grid: {precision: [mxfp9]}\n"
                     "  - zip: {seed: [1, 2], batch: [8]}\n"
                     "  - grid: {seed: [3]}\n"
                     "prio: 1\n"
                     "max_restarts: -1\n";
  Status s = Expand(text, &plan);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_NE(m.find("s.yaml:8:24: precision: unknown"), std::string::npos) << m;
  EXPECT_NE(m.find("s.yaml:9:32: axes[1].zip.batch: has 1 values but seed has 2"), std::string::npos) << m;
  EXPECT_NE(m.find("s.yaml:10:12: axes[2].grid: 'seed' is already swept at line 9"), std::string::npos) << m;
  EXPECT_NE(m.find("s.yaml:11:1: prio: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("s.yaml:12:15: max_restarts: -1 is out of range"), std::string::npos) << m;
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 4) << m;
  EXPECT_LT(m.find("s.yaml:8:24"), m.find("s.yaml:9:32")) << "in file order:\n" << m;
  EXPECT_LT(m.find("s.yaml:11:1"), m.find("s.yaml:12:15")) << m;
  EXPECT_EQ(plan.name, "untouched");
}

TEST(SweepTest, CombinationErrorsNameTheRun) {
  // Each value is valid alone; gpt heads 3 does not divide width 64.
  SweepPlan plan;
  std::string text =
      "name: t\n"
      "base:\n"
      "  model: {type: gpt, layers: 1, width: 48, heads: 4, context: 16, vocab: 256}\n"
      "  data: {train: x.bin}\n"
      "axes:\n"
      "  - grid: {model.width: [48, 64], model.heads: [4, 3]}\n";
  Status s = Expand(text, &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.heads: 3 does not divide model.width 64 (in run 3: model.width=64, model.heads=3)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().rfind("s.yaml:6:52: ", 0), 0u) << s.message();  // the heads value 3
  EXPECT_TRUE(plan.runs.empty());
}

// ---- The pieces of ReadAxes and ExpandSweep, one test each ----

// The full message of an expansion that must fail.
std::string Refusal(const std::string& text, SweepLimits limits = SweepLimits()) {
  SweepPlan plan;
  plan.name = "untouched";
  Status s = Expand(text, &plan, limits);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_EQ(plan.name, "untouched");
  return s.message();
}

// ClaimPath: an axis key is a dotted run-config path, and one axis sweeps it.
TEST(SweepTest, AxisKeysMustBeRunConfigPathsSweptByOneAxisOnly) {
  EXPECT_EQ(Refusal(std::string(kBase) + "axes:\n  - grid: {' seed': [1], .x: [1], a..b: [1], c=d: [1]}\n"),
            "s.yaml:8:12: axes[0].grid: ' seed' is not a run-config path (allowed: dotted keys, e.g. optimizer.lr)\n"
            "s.yaml:8:26: axes[0].grid: '.x' is not a run-config path (allowed: dotted keys, e.g. optimizer.lr)\n"
            "s.yaml:8:35: axes[0].grid: 'a..b' is not a run-config path (allowed: dotted keys, e.g. optimizer.lr)\n"
            "s.yaml:8:46: axes[0].grid: 'c=d' is not a run-config path (allowed: dotted keys, e.g. optimizer.lr)");
  // The second claim of a path names the line of the first, whatever the axis kinds.
  EXPECT_EQ(Refusal(std::string(kBase) +
                    "axes:\n"
                    "  - grid: {seed: [1, 2]}\n"
                    "  - zip: {batch: [8], seed: [3]}\n"
                    "  - random: {count: 2, seed: 1, params: {batch: {choice: [4]}}}\n"),
            "s.yaml:9:23: axes[1].zip: 'seed' is already swept at line 8 (allowed: one axis per path)\n"
            "s.yaml:10:42: axes[2].random.params: 'batch' is already swept at line 9 (allowed: one axis per path)");
}

// CheckPathListMapping and ReadList: grid and zip map paths to non-empty lists.
TEST(SweepTest, GridAndZipBodiesAreMappingsOfNonEmptyLists) {
  EXPECT_EQ(Refusal(std::string(kBase) +
                    "axes:\n"
                    "  - grid: [seed]\n"
                    "  - zip: {}\n"
                    "  - grid: {seed: []}\n"
                    "  - zip: {batch: 8}\n"),
            "s.yaml:8:11: axes[0].grid: expected a mapping of path: [values]\n"
            "s.yaml:9:10: axes[1].zip: expected at least one path: [values]\n"
            "s.yaml:10:18: axes[2].grid.seed: expected a non-empty list of values, got a sequence\n"
            "s.yaml:11:18: axes[3].zip.batch: expected a non-empty list of values, got 8");
}

// ZipLengthMatches: every column against the first; the zip is dropped whole.
TEST(SweepTest, ZipColumnsAreComparedWithTheFirstColumn) {
  EXPECT_EQ(Refusal(std::string(kBase) + "axes:\n  - zip: {seed: [1, 2], batch: [8, 16], steps: [5]}\n"),
            "s.yaml:8:48: axes[0].zip.steps: has 1 values but seed has 2 (allowed: lists of equal length in a zip)");
}

// ReadCountAndSeed: both required, count in 1 .. 2^40, seed >= 0.
TEST(SweepTest, RandomCountAndSeedAreRequiredAndInRange) {
  EXPECT_EQ(Refusal(std::string(kBase) +
                    "axes:\n"
                    "  - random: {params: {seed: {choice: [1]}}}\n"
                    "  - random: {count: 0, seed: -1, params: {batch: {choice: [8]}}}\n"
                    "  - random: {count: 1099511627777, seed: 1, params: {steps: {choice: [5]}}}\n"),
            "s.yaml:8:13: axes[0].random.count: missing (the number of samples)\n"
            "s.yaml:8:13: axes[0].random.seed: missing (random axes are reproducible from their seed)\n"
            "s.yaml:9:21: axes[1].random.count: 0 is out of range (allowed: 1 .. 1099511627776)\n"
            "s.yaml:9:30: axes[1].random.seed: -1 is out of range (allowed: 0 .. 9223372036854775807)\n"
            "s.yaml:10:21: axes[2].random.count: 1099511627777 is out of range (allowed: 1 .. 1099511627776)");
}

// CheckDistribution and CheckRange: each param's distribution is checked
// before anything is sampled, and every bad one is reported.
TEST(SweepTest, RandomDistributionsAreCheckedBeforeSampling) {
  EXPECT_EQ(Refusal(std::string(kBase) +
                    "axes:\n"
                    "  - random:\n"
                    "      count: 2\n"
                    "      seed: 1\n"
                    "      params:\n"
                    "        optimizer.lr: {log_uniform: [0, 1e-3]}\n"
                    "        optimizer.beta2: {uniform: [0.999, 0.95]}\n"
                    "        seed: {uniform: [1]}\n"
                    "        batch: {uniform: [8, many]}\n"
                    "        steps: {choice: []}\n"
                    "        model.width: {normal: [0, 1]}\n"
                    "        model.layers: 3\n"),
            "s.yaml:12:37: axes[0].random.params.optimizer.lr.log_uniform: [0, 1e-3] is not a range (allowed: lo <= hi, lo > 0)\n"
            "s.yaml:13:36: axes[0].random.params.optimizer.beta2.uniform: [0.999, 0.95] is not a range (allowed: lo <= hi)\n"
            "s.yaml:14:25: axes[0].random.params.seed.uniform: expected [lo, hi]\n"
            "s.yaml:15:30: axes[0].random.params.batch.uniform: 'many' is not a finite number\n"
            "s.yaml:16:25: axes[0].random.params.steps.choice: expected a non-empty list of values\n"
            "s.yaml:17:23: axes[0].random.params.model.width: unknown distribution 'normal' (allowed: uniform, "
            "log_uniform, choice)\n"
            "s.yaml:18:23: axes[0].random.params.model.layers: expected one of {uniform: [lo, hi]}, "
            "{log_uniform: [lo, hi]}, {choice: [values]}");
  // lo == hi is a range; log_uniform needs lo > 0 only.
  SweepPlan plan;
  Status s = Expand(std::string(kBase) +
                        "axes:\n  - random: {count: 3, seed: 1, params: {optimizer.lr: {log_uniform: [1e-3, 1e-3]},"
                        " optimizer.beta2: {uniform: [-0.5, 0.9]}}}\n",
                    &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 3u);
  for (const ExpandedRun& run : plan.runs) EXPECT_EQ(run.axes[0].second, "0.001");
}

// CheckRunCount: a product past int64 is reported without overflowing.
TEST(SweepTest, RunCountPastInt64IsReportedAsMoreThan2To63) {
  EXPECT_EQ(Refusal(std::string(kBase) +
                    "axes:\n"
                    "  - random: {count: 1099511627776, seed: 1, params: {seed: {choice: [1]}}}\n"
                    "  - random: {count: 1099511627776, seed: 2, params: {batch: {choice: [8]}}}\n"
                    "  - grid: {steps: [1, 2, 3]}\n"),
            "s.yaml:8:3: axes: random (1099511627776) x random (1099511627776) x grid steps (3) = more than 2^63 "
            "runs, more than the limit of 10000 (allowed: at most 10000 runs per sweep)");
}

// Draft: run r takes factor f's value (r / (product of the later sizes)) mod
// size f, i.e. the first factor varies slowest; a zip moves its paths together.
TEST(SweepTest, RunsVaryTheFirstFactorSlowestAndZipColumnsTogether) {
  SweepPlan plan;
  Status s = Expand(std::string(kBase) +
                        "axes:\n"
                        "  - grid: {seed: [1, 2]}\n"
                        "  - zip: {batch: [8, 16, 32], steps: [10, 20, 30]}\n"
                        "  - grid: {log_every: [1, 5]}\n",
                    &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<std::vector<std::pair<std::string, std::string>>> want;
  for (const char* seed : {"1", "2"}) {
    for (int z = 0; z < 3; ++z) {
      for (const char* every : {"1", "5"}) {
        want.push_back({{"seed", seed},
                        {"batch", std::to_string(8 << z)},
                        {"steps", std::to_string(10 * (z + 1))},
                        {"log_every", every}});
      }
    }
  }
  ASSERT_EQ(plan.runs.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(plan.runs[r].axes, want[r]) << "run " << r;
    RunConfig c = Parse(plan.runs[r]);
    EXPECT_EQ(std::to_string(c.batch), want[r][1].second) << "run " << r;
    EXPECT_EQ(std::to_string(c.steps), want[r][2].second) << "run " << r;
  }
}

// Draft: the sweep's policy goes to runs whose base has none of its own.
TEST(SweepTest, SweepPolicyGoesOnlyToRunsWithoutTheirOwn) {
  const std::string policy = "policy: {max_interventions: 9, rules: [{when: [loss_zscore], do: [stop]}]}\n";
  SweepPlan plan;
  Status own = Expand(std::string(kBase) + policy, &plan);
  ASSERT_TRUE(own.ok()) << own.message();
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(Parse(plan.runs[0]).policy.max_interventions, 9);
  Status s = Expand(std::string(kBase) +
                        "  policy: {max_interventions: 2, rules: [{when: [nonfinite], do: [stop]}]}\n" + policy,
                    &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(Parse(plan.runs[0]).policy.max_interventions, 2);
}

// BaseErrorMark: when base's text cannot keep the file's positions (a one-line
// file), its errors are reported at base itself.
TEST(SweepTest, BaseErrorsFallBackToBasesPositionWhenItsTextIsNotExact) {
  EXPECT_EQ(Refusal("{name: t, base: {steps: 10, batch: -5}}\n"),
            "s.yaml:1:17: base.batch: -5 is out of range (allowed: 1 .. 16777216)");
}

// ReadName: a scalar, checked by NameProblem.
TEST(SweepTest, NameMustBeAScalar) {
  EXPECT_EQ(Refusal("name: [a]\nbase: {steps: 10}\n"),
            "s.yaml:1:7: name: 'a sequence' is not allowed (allowed: [A-Za-z0-9_.-]+, at most 128 characters, not "
            "starting with '.')");
}

// The demo sweep, a data dependency (runfiles path from the test's directory).
std::string ReadDemo() {
  std::ifstream in("examples/demo-sweep.yaml");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SweepTest, DemoSweepExpandsToSixteenRunsEachWithAndWithoutThePolicy) {
  std::string text = ReadDemo();
  ASSERT_FALSE(text.empty()) << "examples/demo-sweep.yaml not found";
  SweepPlan plan;
  Status s = ExpandSweep(text, "examples/demo-sweep.yaml", SweepLimits(), &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(plan.name, "demo");
  ASSERT_EQ(plan.runs.size(), 16u);
  std::set<std::tuple<std::string, uint64_t, int>> seen;
  for (const ExpandedRun& run : plan.runs) {
    RunConfig c = Parse(run);
    EXPECT_EQ(c.model.type, "proxy");
    EXPECT_EQ(c.model.layers, 2);
    EXPECT_EQ(c.model.width, 64);
    EXPECT_EQ(c.batch, 256);
    EXPECT_EQ(c.steps, 300);
    EXPECT_EQ(c.backend, "cpu");
    EXPECT_EQ(c.schedule.spike_at, 150);       // the injected fault
    EXPECT_TRUE(c.policy.active());             // every run carries the policy...
    seen.insert({c.precision.name, c.seed, c.policy.max_interventions});  // ...allowed to act or not
  }
  std::set<std::tuple<std::string, uint64_t, int>> want;
  for (const char* p : {"bf16", "mxfp8_e4m3", "mxfp6_e2m3", "mxfp4"}) {
    for (uint64_t seed : {1, 2}) {
      for (int acts : {0, 3}) want.insert({p, seed, acts});
    }
  }
  EXPECT_EQ(seen, want);
}

TEST(SweepTest, PlanToMessagesFillsSweepAndRuns) {
  SweepPlan plan;
  ASSERT_TRUE(ExpandSweep(std::string(kBase) + "axes:\n  - grid: {precision: [bf16, mxfp4]}\nresources: {gpus: 1}\n",
                          "sweep.yaml", SweepLimits(), &plan)
                  .ok());
  v1::Sweep sweep;
  std::vector<v1::Run> runs = {v1::Run()};
  PlanToMessages(plan, "sw1", [](int i) { return "sw1-r" + std::to_string(i); }, 1234, &sweep, &runs);
  EXPECT_EQ(sweep.id(), "sw1");
  EXPECT_EQ(sweep.name(), "t");
  EXPECT_EQ(sweep.state(), v1::SWEEP_ACTIVE);
  EXPECT_EQ(sweep.spec().yaml(), plan.source_yaml);
  EXPECT_EQ(sweep.spec().source(), "sweep.yaml");
  EXPECT_EQ(sweep.created_unix_ms(), 1234);
  EXPECT_EQ(sweep.runs_total(), 2);
  EXPECT_EQ(sweep.runs_by_state().at("QUEUED"), 2);
  ASSERT_EQ(runs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(runs[i].id(), "sw1-r" + std::to_string(i));
    EXPECT_EQ(runs[i].sweep_id(), "sw1");
    EXPECT_EQ(runs[i].state(), v1::QUEUED);
    EXPECT_EQ(runs[i].spec().yaml(), plan.runs[i].yaml);
    EXPECT_EQ(runs[i].steps(), 300);
    EXPECT_EQ(runs[i].created_unix_ms(), 1234);
    EXPECT_EQ(runs[i].updated_unix_ms(), 1234);
  }
  EXPECT_EQ(runs[0].precision(), "bf16");
  EXPECT_EQ(runs[1].precision(), "mxfp4");
  EXPECT_EQ(runs[1].axes().at("precision"), "mxfp4");
  // The full scheme travels with the run, every role spelled out.
  EXPECT_EQ(runs[1].scheme().name(), "mxfp4");
  EXPECT_EQ(runs[1].scheme().wgrad_x().format(), "mxfp4");
  EXPECT_EQ(runs[0].scheme().dgrad_dy().format(), "bf16");
}

}  // namespace
}  // namespace keel
