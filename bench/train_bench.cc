// Training-step throughput of keel-train's engine (issue 3's figures):
//   - GPT-2 124M shape (12 x 768, 12 heads, context 1024, vocab 50304) at batch
//     16 x 1024: tokens/s in bf16 (the baseline), mxfp8_e4m3 and mxfp4;
//   - the proxy (L4, d512, batch 2048): steps/s in fp32 (the baseline) and mxfp8_e4m3.
// Each case: 2 warm-up steps, then the mean of `--steps` timed steps (wall clock
// around Trainer::Step, which ends with a device sync). Operand statistics on,
// as in a real run; --no-stats measures without them.
//   train_bench [--backend cuda|cpu] [--steps N] [--only gpt|proxy] [--no-stats]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/philox.h"
#include "worker/io/token_shard.h"
#include "worker/config/run_config.h"
#include "worker/engine/trainer.h"

namespace keel {
namespace {

struct Result {
  std::string name;
  double step_ms = 0;
  double items_per_s = 0;
  double loss = 0;
};

Status Measure(const std::string& yaml, const std::string& label, int steps, Result* out) {
  RunConfig c;
  Status s = ParseRunConfig(yaml, label, {}, &c);
  if (!s.ok()) return s;
  std::unique_ptr<Trainer> t;
  s = Trainer::Create(c, &t);
  if (!s.ok()) return s;
  StepMetrics m;
  for (int i = 0; i < 2; ++i) {
    s = t->Step(&m);
    if (!s.ok()) return s;
  }
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    s = t->Step(&m);
    if (!s.ok()) return s;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out->name = label;
  out->step_ms = seconds / steps * 1e3;
  out->items_per_s = static_cast<double>(t->model()->items_per_batch()) * steps / seconds;
  out->loss = m.loss;
  std::printf("  %-28s %9.2f ms/step  %12.0f %s/s  (loss %.4f) [%s]\n", label.c_str(), out->step_ms,
              out->items_per_s, c.model.type == "gpt" ? "tok" : "samples", out->loss,
              t->backend()->Describe().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

int Main(int argc, char** argv) {
  std::string backend = "cuda", only;
  int steps = 10;
  bool stats = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--no-stats") {
      stats = false;
    } else {
      std::fprintf(stderr, "usage: train_bench [--backend cuda|cpu] [--steps N] [--only gpt|proxy] [--no-stats]\n");
      return 2;
    }
  }
  const std::string common = "backend: " + backend + "\nrun_dir: /tmp/keel-train-bench\noperand_stats: " +
                             (stats ? "true" : "false") + "\n";
  std::printf("train_bench: backend %s, %d timed steps after 2 warm-up, operand stats %s\n",
              backend.c_str(), steps, stats ? "on" : "off");
  if (only.empty() || only == "gpt") {
    // Random GPT-2 tokens: throughput does not depend on the text.
    const std::string shard = "/tmp/keel-train-bench-tokens.bin";
    std::vector<uint16_t> tokens(4 << 20);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<uint16_t>(PhiloxUniform(42, i) * 50257.0f);
    }
    Status s = WriteTokenShard(shard, tokens.data(), static_cast<int64_t>(tokens.size()));
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    std::printf("GPT-2 124M shape: 12 layers, 768 wide, 12 heads, vocab 50257 padded to 50304, batch 16 x 1024\n");
    std::vector<Result> results;
    for (const char* scheme : {"bf16", "mxfp8_e4m3", "mxfp4"}) {
      std::string yaml = common +
                         "model: {type: gpt, layers: 12, width: 768, heads: 12, context: 1024, vocab: 50257, padded_vocab: 50304}\n"
                         "data: {train: " + shard + "}\nbatch: 16\nseq: 1024\nsteps: 1000000\n"
                         "optimizer: {type: adamw, lr: 6.0e-4, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}\n"
                         "precision: " + scheme + "\n";
      Result r;
      s = Measure(yaml, std::string("gpt2-124m ") + scheme, steps, &r);
      if (!s.ok()) return std::fprintf(stderr, "%s: %s\n", scheme, s.message().c_str()), 1;
      results.push_back(r);
    }
    for (const Result& r : results) {
      std::printf("  %-28s %.3fx of bf16's tokens/s\n", r.name.c_str(), r.items_per_s / results[0].items_per_s);
    }
  }
  if (only.empty() || only == "proxy") {
    std::printf("proxy: L4, d512, batch 2048, Adam lr 6e-4\n");
    std::vector<Result> results;
    for (const char* scheme : {"fp32", "mxfp8_e4m3"}) {
      std::string yaml = common + "model: {type: proxy, layers: 4, width: 512}\nbatch: 2048\nsteps: 1000000\n"
                                  "optimizer: {type: adam, lr: 6.0e-4}\nprecision: " + scheme + "\n";
      Result r;
      Status s = Measure(yaml, std::string("proxy ") + scheme, steps * 10, &r);
      if (!s.ok()) return std::fprintf(stderr, "%s: %s\n", scheme, s.message().c_str()), 1;
      std::printf("  %-28s %.1f steps/s\n", r.name.c_str(), 1e3 / r.step_ms);
      results.push_back(r);
    }
    std::printf("  mxfp8_e4m3 / fp32 steps/s: %.3f\n", results[0].step_ms / results[1].step_ms);
  }
  return 0;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) { return keel::Main(argc, argv); }
