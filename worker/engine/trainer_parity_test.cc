// CPU vs CUDA parity of the whole trainer (needs a GPU; manual): 20 steps of the
// proxy, of a small GPT, of a small llama and of a small gla in fp32, bf16, mxfp8_e4m3 and nvfp4_recipe on both backends from the
// same initial weights and data, comparing the loss at every step.
//
// Tolerances are beside kSchemes and Compare.
// The GPT and the llama use byte-level shards of real text: KEEL_PARITY_SHARD (default
// data/fortunes_train.bin, from scripts/prepare-fortunes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <vector>
#include <unistd.h>

#include "worker/engine/trainer.h"

namespace keel {
namespace {

std::unique_ptr<Trainer> Make(const std::string& yaml, const std::string& backend) {
  static int run = 0;  // a fresh run directory per trainer
  RunConfig c;
  Status s = ParseRunConfig(yaml, "parity", {"backend=" + backend,
                            "run_dir=/tmp/keel-parity/" + std::to_string(getpid()) + "-" + std::to_string(run++)}, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Trainer> t;
  s = Trainer::Create(c, &t);
  EXPECT_TRUE(s.ok()) << s.message();
  return t;
}

double RelDiff(double a, double b) { return std::fabs(a - b) / std::fabs(a); }

// Two measurements per scheme:
//   lockstep: before every step the CUDA trainer resumes from the CPU trainer's
//     checkpoint (weights, Adam moments, data position), so each step's loss
//     difference is the backends' disagreement on one identical step;
//   free-running: 20 steps each from the same start, so the curves may drift
//     apart as rounding flips (bf16, MX) get amplified by training; Adam turns a
//     tiny gradient difference on a near-zero component into an update of up
//     to +-lr, so this drift grows with steps. Reported, and bounded loosely:
//     0.1 for fp32 and bf16, 0.25 for MX and NVFP4, whose flips are larger
//     (measured on an H200 before the fused attention: GPT bf16 1.1%, mxfp8
//     5.3%, the rest < 0.03%; on an H100 after it: GPT bf16 0.9%, mxfp8 15.8%,
//     nvfp4_recipe 5.3%; the attention's sums changed order, so the chaotic
//     part of the curve went elsewhere while lockstep and update stayed put).
// update_bound: the two backends' updates from one identical state differ by at
// most this fraction of the update's norm. fp32 1e-3 (summation order only;
// measured on an H200: proxy 1.1e-5, GPT 6.6e-5). With rounded operands 0.1:
// Adam moves every weight by about lr whatever |g| is, so a gradient component
// near zero whose sign differs between the backends (after a bf16 or E4M3
// rounding flip upstream) moves 2 lr apart; measured on an H200: proxy bf16
// 0.6%, mxfp8 0.004%; GPT bf16 3.4%, mxfp8 5.4%. nvfp4_recipe 0.5: its flips
// are E2M1 steps and its gradients are rounded stochastically from inputs that
// differ in their last bits (measured on an H100: proxy 1.2%, GPT 29.5%).
// head_chunk_floats > 0: both trainers' language-model heads run in chunks of
// that many fp32 logits (Model::SetHeadChunkFloats).
void Compare(const std::string& name, const std::string& yaml, double tolerance, double update_bound,
             double drift_bound, int64_t head_chunk_floats = 0) {
  std::unique_ptr<Trainer> cpu = Make(yaml, "cpu"), cuda = Make(yaml, "cuda");
  ASSERT_TRUE(cpu && cuda);
  if (head_chunk_floats > 0) {
    cpu->model()->SetHeadChunkFloats(head_chunk_floats);
    cuda->model()->SetHeadChunkFloats(head_chunk_floats);
  }
  double lockstep = 0, weights = 0;
  std::vector<double> cpu_losses;
  for (int i = 0; i < 20; ++i) {
    std::string dir;
    ASSERT_TRUE(cpu->SaveCheckpoint(&dir).ok());
    Status s = cuda->Resume(dir);
    ASSERT_TRUE(s.ok()) << s.message();
    const size_t n = static_cast<size_t>(cpu->model()->param_count());
    std::vector<float> before(n), wc(n), wg(n);
    ASSERT_TRUE(cpu->backend()->Download(before.data(), cpu->model()->params(), n * sizeof(float)).ok());
    StepMetrics mc, mg;
    ASSERT_TRUE(cpu->Step(&mc).ok());
    s = cuda->Step(&mg);
    ASSERT_TRUE(s.ok()) << s.message();
    lockstep = std::max(lockstep, RelDiff(mc.loss, mg.loss));
    cpu_losses.push_back(mc.loss);
    // The update too: |w_cpu - w_cuda| / |w_cpu - w_before| after the same step.
    ASSERT_TRUE(cpu->backend()->Download(wc.data(), cpu->model()->params(), n * sizeof(float)).ok());
    ASSERT_TRUE(cuda->backend()->Download(wg.data(), cuda->model()->params(), n * sizeof(float)).ok());
    double diff = 0, norm = 0;
    for (size_t j = 0; j < n; ++j) {
      diff += (static_cast<double>(wc[j]) - wg[j]) * (static_cast<double>(wc[j]) - wg[j]);
      norm += (static_cast<double>(wc[j]) - before[j]) * (static_cast<double>(wc[j]) - before[j]);
    }
    weights = std::max(weights, std::sqrt(diff / norm));
  }
  std::unique_ptr<Trainer> free_cuda = Make(yaml, "cuda");
  double drift = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    StepMetrics m;
    ASSERT_TRUE(free_cuda->Step(&m).ok());
    drift = std::max(drift, RelDiff(cpu_losses[i], m.loss));
    last = m.loss;
  }
  std::printf("%-18s loss step1 %.7f step20 cpu %.7f cuda %.7f | lockstep loss %.3g (tolerance %.0e), "
              "update %.3g (bound %.0e) | free-running loss %.3g (bound %.2g)\n",
              name.c_str(), cpu_losses[0], cpu_losses[19], last, lockstep, tolerance, weights, update_bound, drift,
              drift_bound);
  EXPECT_LE(lockstep, tolerance) << name;
  EXPECT_LE(weights, update_bound) << name;
  EXPECT_LE(drift, drift_bound) << name;
  EXPECT_LT(cpu_losses[19], cpu_losses[0]) << name << ": training did not go down";
}

// Lockstep tolerances: fp32 1e-5 (same arithmetic, other summation order: ~1e-7
// per op); bf16 1e-4 (an operand whose fp32 value differs in its last bits can
// round to the neighbouring bf16, 2^-8 relative on that element); mxfp8 1e-3
// (the same flip costs one E4M3 step, 2^-3 relative, or a block scale).
// nvfp4_recipe 1e-2 (a flip is one E2M1 step, up to 2^-1 relative, on an
// element or a 16-element block's E4M3 scale). The recipe keeps the first and
// the last block in bf16, so its models have 4 layers (2 would be all bf16).
struct Bounds {
  const char* scheme;
  double lockstep, update, drift;
};
const Bounds kSchemes[] = {{"fp32", 1e-5, 1e-3, 0.1},
                           {"bf16", 1e-4, 0.1, 0.1},
                           {"mxfp8_e4m3", 1e-3, 0.1, 0.25},
                           {"nvfp4_recipe", 1e-2, 0.5, 0.25},
                           // The recipe with the Hot-Channel Patch: CUDA's patch columns are BF16 where
                           // the CPU's are fp32 (2^-9 of a residual, far below an E2M1 flip), and both
                           // choose the same hot sets (nn_cuda_test HcpMatchesTheCpuReference): the
                           // lockstep and update bounds are the recipe's. Free-running, the runs meet
                           // a data spike at step 8 (every scheme has it: the recipe's loss goes 3.76
                           // -> 7.70 -> 3.48 on the CPU), and the patched ones leave it chaotically:
                           // on the CPU alone, the same run with hcp.every 1 instead of 100 differs
                           // by 15% at step 14. The H200 measured 0.55 (gpt) and 0.18 (llama) where
                           // the recipe gives 0.04 (docs/runs/issue15/session28_call1_parity.txt):
                           // hence 0.75 for the patched schemes.
                           {"nvfp4_hcp", 1e-2, 0.5, 0.75}};
// CHON (nvfp4_hcp and post-QK protection): llama and gla only, at nvfp4_hcp's bounds.
const Bounds kChon = {"chon", 1e-2, 0.5, 0.75};

std::string Layers(const std::string& scheme) { return scheme.rfind("nvfp4", 0) == 0 || scheme == "chon" ? "4" : "2"; }

TEST(TrainerParityTest, Proxy) {
  for (const auto& s : kSchemes) {
    Compare(std::string("proxy ") + s.scheme,
            "model: {type: proxy, layers: " + Layers(s.scheme) + ", width: 128}\nbatch: 256\nseed: 3\n"
            "optimizer: {type: adam, lr: 1.0e-3}\nprecision: " + s.scheme + "\n",
            s.lockstep, s.update, s.drift);
  }
}

// A language model of `type` (gpt, llama, gla) at one size, on the byte
// shard KEEL_PARITY_SHARD (default data/fortunes_train.bin), in every scheme.
void CompareLanguageModel(const std::string& type, int64_t head_chunk_floats = 0) {
  const char* env = std::getenv("KEEL_PARITY_SHARD");
  std::string shard = env ? env : "data/fortunes_train.bin";
  std::vector<Bounds> schemes(std::begin(kSchemes), std::end(kSchemes));
  if (type == "llama" || type == "gla") schemes.push_back(kChon);
  // gla at 128 positions: two chunks of CUDA's recurrence, so its state crosses
  // a chunk boundary (at 64 the state kernels would only ever see one chunk).
  const std::string seq = type == "gla" ? "128" : "64";
  for (const auto& s : schemes) {
    Compare(type + " " + s.scheme,
            "model: {type: " + type + ", layers: " + Layers(s.scheme) +
                ", width: 128, heads: 4, context: " + seq + ", vocab: 256}\n"
                "data: {train: " + shard + "}\nbatch: 8\nseq: " + seq + "\nseed: 3\n"
                "optimizer: {type: adamw, lr: 2.0e-3, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}\n"
                "precision: " + std::string(s.scheme) + "\n",
            s.lockstep, s.update, s.drift, head_chunk_floats);
  }
}

TEST(TrainerParityTest, Gpt) { CompareLanguageModel("gpt"); }

// The GPT with its head in chunks of 128 of its 512 rows: an MX head then runs
// its backward chunk by chunk inside the forward pass (Model::HeadAndLoss), a
// BF16 head its own chunks; the same bounds as one piece.
TEST(TrainerParityTest, GptHeadInChunks) { CompareLanguageModel("gpt", 128 * 256); }

// The llama block (RMSNorm, RoPE, SwiGLU, no biases) at the GPT's size, data
// and bounds: its new ops agree as the GPT's do (RoPE bit for bit; RMSNorm as
// LayerNorm, to its double row sums' last bit), so every difference still comes
// from the GEMMs' and attention's summation order and the roundings they flip.
TEST(TrainerParityTest, Llama) { CompareLanguageModel("llama"); }

// The gla block (the llama skeleton with gated linear attention) at the same
// size (but 128 positions, two chunks), data and bounds: its new ops differ between the backends by summation
// order alone (the CPU's sequential recurrence against CUDA's chunked form,
// agreeing to ~1e-6 normwise in nn_cuda_test's GlaMatchesCpu; logsigmoid and the
// swish gate to libm ulps), smaller than what the GEMMs' order already gives, so
// the GPT's bounds apply.
TEST(TrainerParityTest, Gla) { CompareLanguageModel("gla"); }

}  // namespace
}  // namespace keel
