// The host side of an outlier-analytics step (kernels/outliers.h): Summarize
// over every analysed operand of a model, what Trainer::CollectOutlierAnalytics
// does once per `analytics_every` steps while the GPU waits for the next step's
// launches. Beside it, in the same run, the baseline that summarize used until
// session 31: the median from a full sort of the channels with the NaN-aware
// order, the top k from a partial sort of all channel indices.
// Shapes: the proxy (L4 d512: fc1 512 -> 2048, fc2 2048 -> 512 per block) and
// GPT-2 124M (12 blocks of c_attn 768 -> 2304, c_proj 768 -> 768, c_fc 768 ->
// 3072, mlp c_proj 3072 -> 768, and lm_head 768 -> 50304). A linear's six roles
// see in, in, out, out, out, in channels (outliers.h, "How a role sees its
// operand"). Channel maxima are |N(0, 3)| with a few NaN-free hot channels.
//   outliers_bench [--reps R] [--top-k K]
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/base/host.h"
#include "kernels/outliers.h"

namespace keel {
namespace {

volatile double g_sink = 0;  // what the timed loops computed

double NowMs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// The baseline: the same results by sorting (the order TopChannels and
// TopOverMedian define: NaN above every number, ties by the lower index).
bool Hotter(float a, float b) {
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
}

OutlierSummary SummarizeBySorting(const OperandOutliers& operand, int top_k) {
  OutlierSummary s;
  s.kurtosis = Kurtosis(operand.sums);
  const std::vector<float>& m = operand.channel_max;
  std::vector<float> sorted = m;
  std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return Hotter(b, a); });
  const double median = sorted[(sorted.size() - 1) / 2];
  s.top1_over_median = median == 0 ? std::nan("") : sorted.back() / median;
  std::vector<int64_t> order(m.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  const size_t keep = std::min(order.size(), static_cast<size_t>(top_k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](int64_t a, int64_t b) {
                      if (Hotter(m[a], m[b])) return true;
                      if (Hotter(m[b], m[a])) return false;
                      return a < b;
                    });
  order.resize(keep);
  s.hot = order;
  return s;
}

std::vector<OperandOutliers> Operands(const std::vector<std::pair<int, int>>& linears, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<OperandOutliers> out;
  for (const auto& [in, out_features] : linears) {
    for (int channels : {in, in, out_features, out_features, out_features, in}) {
      OperandOutliers o;
      o.calls = 1;
      o.channel_max.resize(static_cast<size_t>(channels));
      for (float& v : o.channel_max) v = std::fabs(normal(rng));
      for (int h = 0; h < 4; ++h) o.channel_max[rng() % o.channel_max.size()] *= 40.0f;  // hot channels
      o.sums.finite = 1000;
      o.sums.s2 = 1000;
      o.sums.s4 = 3000;
      out.push_back(std::move(o));
    }
  }
  return out;
}

template <typename F>
double MedianMs(int reps, F f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double start = NowMs();
    f();
    t.push_back(NowMs() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Run(int reps, int top_k) {
  std::vector<std::pair<int, int>> proxy, gpt;
  for (int b = 0; b < 4; ++b) {
    proxy.push_back({512, 2048});
    proxy.push_back({2048, 512});
  }
  for (int b = 0; b < 12; ++b) {
    gpt.push_back({768, 2304});
    gpt.push_back({768, 768});
    gpt.push_back({768, 3072});
    gpt.push_back({3072, 768});
  }
  gpt.push_back({768, 50304});
  std::printf("outliers_bench: CPU %s, one thread; median of %d repetitions, top_k %d\n", CpuModel().c_str(), reps, top_k);
  std::printf("%-34s %9s %14s %14s %8s\n", "model", "operands", "summarize ms", "by sorting ms", "speed-up");
  for (const auto& [name, linears] : {std::make_pair(std::string("proxy L4 d512"), proxy),
                                      std::make_pair(std::string("gpt2-124m (with lm_head)"), gpt)}) {
    const std::vector<OperandOutliers> ops = Operands(linears, 1);
    // The two must agree, or the timing compares different work.
    for (const OperandOutliers& o : ops) {
      const OutlierSummary a = Summarize(o, top_k), b = SummarizeBySorting(o, top_k);
      if (a.hot != b.hot || a.top1_over_median != b.top1_over_median) {
        std::fprintf(stderr, "outliers_bench: Summarize and the sorting baseline disagree on %s\n", name.c_str());
        return 1;
      }
    }
    double sink = 0;  // read below, so that the timed loops are not optimized away
    const double fast = MedianMs(reps, [&] {
      for (const OperandOutliers& o : ops) sink += Summarize(o, top_k).top1_over_median;
    });
    const double slow = MedianMs(reps, [&] {
      for (const OperandOutliers& o : ops) sink += SummarizeBySorting(o, top_k).top1_over_median;
    });
    g_sink = sink;
    std::printf("%-34s %9zu %14.3f %14.3f %7.1fx\n", name.c_str(), ops.size(), fast, slow, slow / fast);
  }
  return 0;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  int reps = 21, top_k = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--reps" || a == "--top-k") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v < 1 || v > 100000) {
        std::fprintf(stderr, "outliers_bench: %s: '%s' is not allowed (1 .. 100000)\n", a.c_str(), argv[i]);
        return 2;
      }
      (a == "--reps" ? reps : top_k) = v;
    } else {
      std::fprintf(stderr, "usage: outliers_bench [--reps R] [--top-k K]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  return keel::Run(reps, top_k);
}
