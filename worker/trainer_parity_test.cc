// CPU vs CUDA parity of the whole trainer (needs a GPU; manual): 20 steps of the
// proxy and of a small GPT in fp32, bf16 and mxfp8_e4m3 on both backends from the
// same initial weights and data, comparing the loss at every step.
//
// Tolerances (max relative loss difference over the 20 steps) and why:
//   fp32  1e-3: both backends do the same fp32 arithmetic but sum in different
//              orders (GEMM blocking, reductions), ~1e-6 per op; Adam's early
//              steps (update ~ lr * sign(g)) amplify it a little.
//   bf16  5e-3: operands differing in their last fp32 bits now and then round to
//              neighbouring bf16 values (2^-8 relative on that element).
//   mxfp8 2e-2: likewise, a value on an E4M3 rounding boundary can land one E4M3
//              step (2^-3 relative) away, and a block amax can cross a power of two.
// The GPT uses byte-level shards of real text: KEEL_PARITY_SHARD (default
// data/fortunes_train.bin, from scripts/prepare-fortunes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "worker/trainer.h"

namespace keel {
namespace {

std::vector<double> Run(const std::string& yaml, const std::string& backend) {
  RunConfig c;
  Status s = ParseRunConfig(yaml, "parity", {"backend=" + backend}, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  s = Trainer::Create(c, &t);
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<double> losses;
  if (!s.ok()) return losses;
  for (int i = 0; i < 20; ++i) {
    StepMetrics m;
    s = t->Step(&m);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) break;
    losses.push_back(m.loss);
  }
  return losses;
}

void Compare(const std::string& name, const std::string& yaml, double tolerance) {
  std::vector<double> cpu = Run(yaml, "cpu"), cuda = Run(yaml, "cuda");
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(cuda.size(), 20u);
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    double rel = std::fabs(cpu[i] - cuda[i]) / std::fabs(cpu[i]);
    worst = std::max(worst, rel);
  }
  std::printf("%-24s step1 cpu %.7f cuda %.7f | step20 cpu %.7f cuda %.7f | max rel diff %.3g (tolerance %.0e)\n",
              name.c_str(), cpu[0], cuda[0], cpu[19], cuda[19], worst, tolerance);
  EXPECT_LE(worst, tolerance) << name;
  EXPECT_LT(cpu[19], cpu[0]) << name << ": training did not go down";
}

const std::pair<const char*, double> kSchemes[] = {{"fp32", 1e-3}, {"bf16", 5e-3}, {"mxfp8_e4m3", 2e-2}};

TEST(TrainerParityTest, Proxy) {
  for (const auto& s : kSchemes) {
    Compare(std::string("proxy ") + s.first,
            std::string("model: {type: proxy, layers: 2, width: 128}\nbatch: 256\nseed: 3\n"
                        "optimizer: {type: adam, lr: 1.0e-3}\nrun_dir: /tmp/keel-parity\nprecision: ") + s.first + "\n",
            s.second);
  }
}

TEST(TrainerParityTest, Gpt) {
  const char* env = std::getenv("KEEL_PARITY_SHARD");
  std::string shard = env ? env : "data/fortunes_train.bin";
  for (const auto& s : kSchemes) {
    Compare(std::string("gpt ") + s.first,
            "model: {type: gpt, layers: 2, width: 128, heads: 4, context: 64, vocab: 256}\n"
            "data: {train: " + shard + "}\nbatch: 8\nseq: 64\nseed: 3\n"
            "optimizer: {type: adamw, lr: 2.0e-3, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}\n"
            "run_dir: /tmp/keel-parity\nprecision: " + std::string(s.first) + "\n",
            s.second);
  }
}

}  // namespace
}  // namespace keel
