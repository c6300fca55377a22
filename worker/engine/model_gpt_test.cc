// The gpt model on the CPU backend: the activations whose width follows the
// step's scheme (ln1, ln2 and act: bf16 when the layer they feed reads them in
// bf16, else fp32) take half the bytes under bf16, grow when a later step needs
// fp32, and give the bits of a model that ran in that scheme from the start;
// and no buffer but the weights is the size of every parameter; where the backend
// keeps the attention's heads (Backend::KeepsAttentionHeads), the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/nn.h"
#include "worker/config/run_config.h"
#include "worker/engine/model.h"
#include "worker/engine/model_test_util.h"

namespace keel {
namespace {

constexpr int kLayers = 2, kWidth = 64, kSeq = 16, kBatch = 2, kVocab = 256;

void MakeGpt(TestNet* net) {
  MakeTestNet("{type: gpt, layers: " + std::to_string(kLayers) + ", width: " + std::to_string(kWidth) +
                  ", heads: 2, context: " + std::to_string(kSeq) + ", vocab: " + std::to_string(kVocab) + "}",
              "batch: " + std::to_string(kBatch) + "\nseq: " + std::to_string(kSeq) + "\n", net);
}

// Random weights from rng into the model: gains near 1, the rest small.
void RandomWeights(TestNet* net, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(net->model->param_count()), 0.0f);
  for (const ParamInfo& p : net->model->param_info()) {
    for (int64_t i = 0; i < p.count; ++i) {
      w[static_cast<size_t>(p.offset + i)] = p.shape.size() == 1 ? 1.0f + 0.1f * normal(*rng) : 0.05f * normal(*rng);
    }
  }
  ASSERT_TRUE(net->backend->Upload(net->model->params(), w.data(), w.size() * sizeof(float)).ok());
}

// The same random weights into every model (seeded), and one batch.
void Init(TestNet* net, Batch* batch) {
  std::mt19937 rng(11);
  RandomWeights(net, &rng);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  batch->inputs.clear();
  batch->targets.clear();
  for (int i = 0; i < kBatch * kSeq; ++i) {
    batch->inputs.push_back(token(rng));
    batch->targets.push_back(token(rng));
  }
}

PrecisionScheme Preset(const std::string& name) {
  PrecisionScheme s;
  EXPECT_TRUE(SchemeFromPreset(name, &s).ok()) << name;
  return s;
}

struct StepResult {
  double loss = 0.0;
  std::vector<float> grads;
};

StepResult Step(TestNet* net, const Batch& batch, const PrecisionScheme& scheme) {
  StepResult r;
  r.grads.assign(static_cast<size_t>(net->model->param_count()), 0.0f);
  EXPECT_TRUE(net->model->ForwardBackward(batch, scheme, 5, 1.0f, false, r.grads.data(), &r.loss, nullptr).ok());
  return r;
}

TEST(GptModelTest, SchemeSizedActivationsAreHalfInBf16GrowForFp32AndKeepTheBits) {
  const PrecisionScheme bf16 = Preset("bf16"), fp32 = Preset("fp32");
  // The three buffers of a layer: ln1 and ln2 (rows x width) and act (rows x 4 width); and qkv (rows x 3
  // width), fp32 on a backend that keeps no attention heads (KeptAttentionHeadsKeepTheBits has the other).
  const int64_t rows = kBatch * kSeq, per_layer = rows * kWidth * (1 + 1 + 4);
  const int64_t qkv = kLayers * rows * 3 * kWidth * 4;

  TestNet a;
  Batch batch;
  ASSERT_NO_FATAL_FAILURE(MakeGpt(&a));
  ASSERT_NO_FATAL_FAILURE(Init(&a, &batch));
  EXPECT_EQ(a.model->scheme_sized_bytes(), 0);  // nothing before the first forward
  const StepResult a_bf16 = Step(&a, batch, bf16);
  EXPECT_EQ(a.model->scheme_sized_bytes(), kLayers * per_layer * 2 + qkv);  // bf16: 2 bytes an element
  double a_fp32_eval = 0.0;
  ASSERT_TRUE(a.model->Evaluate(batch, fp32, 5, &a_fp32_eval).ok());
  EXPECT_EQ(a.model->scheme_sized_bytes(), kLayers * per_layer * 4 + qkv);  // grown for fp32
  const StepResult a_bf16_again = Step(&a, batch, bf16);
  EXPECT_EQ(a.model->scheme_sized_bytes(), kLayers * per_layer * 4 + qkv);  // never shrinks

  // Fresh models with the same weights, each in one scheme from the start.
  TestNet b, c;
  Batch b_batch, c_batch;
  ASSERT_NO_FATAL_FAILURE(MakeGpt(&b));
  ASSERT_NO_FATAL_FAILURE(Init(&b, &b_batch));
  ASSERT_NO_FATAL_FAILURE(MakeGpt(&c));
  ASSERT_NO_FATAL_FAILURE(Init(&c, &c_batch));
  double b_fp32_eval = 0.0;
  ASSERT_TRUE(b.model->Evaluate(b_batch, fp32, 5, &b_fp32_eval).ok());
  const StepResult c_bf16 = Step(&c, c_batch, bf16);

  ASSERT_TRUE(std::isfinite(a_bf16.loss));
  EXPECT_EQ(a_fp32_eval, b_fp32_eval);
  EXPECT_EQ(a_bf16.loss, c_bf16.loss);
  EXPECT_EQ(a_bf16_again.loss, c_bf16.loss);
  EXPECT_EQ(a_bf16.grads, c_bf16.grads);
  EXPECT_EQ(a_bf16_again.grads, c_bf16.grads);  // in the grown (fp32-sized) buffers
  EXPECT_NE(a_fp32_eval, a_bf16.loss);          // the two schemes do differ
}

// A 2-layer GPT of width 64 (vocabulary 256) with random weights from `seed`
// and a batch of 8 x 16 tokens, every `skip`-th target (from the 5th) not
// counted: what the head-in-chunks tests compare.
constexpr int kHeadRows = 8 * kSeq;  // 128 rows
void MakeHeadNet(uint32_t seed, int skip, TestNet* net, Batch* batch) {
  MakeTestNet("{type: gpt, layers: 2, width: 64, heads: 2, context: 16, vocab: 256}", "batch: 8\nseq: 16\n", net);
  std::mt19937 rng(seed);
  RandomWeights(net, &rng);
  std::uniform_int_distribution<int32_t> token(0, 255);
  for (int i = 0; i < kHeadRows; ++i) {
    batch->inputs.push_back(token(rng));
    batch->targets.push_back(i % skip == 4 % skip ? -1 : token(rng));  // some targets that do not count
  }
}

// Where the backend keeps the attention's heads, the gpt model writes qkv into its gradient scratch, has
// the heads kept in the block's qkv buffer and runs the attention's backward from them: the loss and every
// gradient keep the bits of the model on a backend that keeps nothing, step after step (each forward
// overwrites the last one's heads), and under fp32 operands, which nothing keeps, it takes the plain pair.
TEST(GptModelTest, KeptAttentionHeadsKeepTheBits) {
  TestNet plain, keeping;
  ASSERT_NO_FATAL_FAILURE(MakeGpt(&plain));
  auto* backend = new KeepingCpu();
  ASSERT_NO_FATAL_FAILURE(MakeTestNetOn(std::unique_ptr<Backend>(backend),
                                        "{type: gpt, layers: " + std::to_string(kLayers) + ", width: " +
                                            std::to_string(kWidth) + ", heads: 2, context: " + std::to_string(kSeq) +
                                            ", vocab: " + std::to_string(kVocab) + "}",
                                        "batch: " + std::to_string(kBatch) + "\nseq: " + std::to_string(kSeq) + "\n",
                                        &keeping));
  Batch batch, same;
  Init(&plain, &batch);
  Init(&keeping, &same);
  const PrecisionScheme bf16 = Preset("bf16");
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepResult a = Step(&plain, batch, bf16), b = Step(&keeping, same, bf16);
    ASSERT_TRUE(std::isfinite(a.loss));
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grads, b.grads);
  }
  EXPECT_EQ(backend->keeps, 2 * kLayers);
  EXPECT_EQ(backend->kepts, 2 * kLayers);
  // The kept heads take half of qkv's fp32 bytes; an fp32 step grows the buffer to qkv's.
  const int64_t rows = kBatch * kSeq, others = kLayers * rows * kWidth * (1 + 1 + 4) * 2;
  EXPECT_EQ(keeping.model->scheme_sized_bytes(), others + kLayers * rows * 3 * kWidth * 2);
  EXPECT_EQ(plain.model->scheme_sized_bytes(), others + kLayers * rows * 3 * kWidth * 4);
  const StepResult c = Step(&plain, batch, Preset("fp32")), d = Step(&keeping, same, Preset("fp32"));
  EXPECT_EQ(c.loss, d.loss);
  EXPECT_EQ(c.grads, d.grads);
  EXPECT_EQ(backend->keeps, 2 * kLayers);
  EXPECT_EQ(keeping.model->scheme_sized_bytes(), plain.model->scheme_sized_bytes());
  // Back to bf16: the heads kept in the grown buffer, the bits unchanged.
  const StepResult e = Step(&plain, batch, bf16), f = Step(&keeping, same, bf16);
  EXPECT_EQ(e.loss, f.loss);
  EXPECT_EQ(e.grads, f.grads);
  EXPECT_EQ(backend->keeps, 3 * kLayers);
}

// A head in chunks runs its backward chunk by chunk inside the forward pass:
// the loss, the head's dx and so every gradient below it keep the bits of the
// one-piece pass; the tied embedding's gradient (the head's dW summed chunk by
// chunk, plus the embedding's) is the one-piece one up to summation order. The
// head holds one chunk's fp32 logits and nothing else (dlogits in place: bf16
// over them for a BF16 head). One chunk of every row is the one-piece pass,
// with the backward where the model runs it. An evaluation runs in the same
// chunks with the same loss.
void ExpectTheHeadInChunksKeepsTheBitsBelowIt(const char* preset, uint32_t seed, int skip) {
  SCOPED_TRACE(preset);
  constexpr int kRows = kHeadRows;  // two chunks of 64
  const int64_t padded = 256;
  TestNet whole, chunked;
  Batch batch, same;
  ASSERT_NO_FATAL_FAILURE(MakeHeadNet(seed, skip, &whole, &batch));
  ASSERT_NO_FATAL_FAILURE(MakeHeadNet(seed, skip, &chunked, &same));
  whole.model->SetHeadChunkFloats(kRows * padded);  // one chunk: one piece
  chunked.model->SetHeadChunkFloats(64 * padded);
  const PrecisionScheme scheme = Preset(preset);
  const StepResult a = Step(&whole, batch, scheme), b = Step(&chunked, same, scheme);
  ASSERT_TRUE(std::isfinite(a.loss));
  EXPECT_FALSE(whole.model->head_backward_done());
  EXPECT_TRUE(chunked.model->head_backward_done());
  EXPECT_EQ(a.loss, b.loss);
  const ParamInfo* wte = nullptr;
  for (const ParamInfo& p : chunked.model->param_info()) {
    if (p.name == "wte") wte = &p;
  }
  ASSERT_NE(wte, nullptr);
  int64_t differ = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const bool in_wte = static_cast<int64_t>(i) >= wte->offset && static_cast<int64_t>(i) < wte->offset + wte->count;
    if (in_wte) {
      EXPECT_NEAR(b.grads[i], a.grads[i], 1e-5 * (std::fabs(a.grads[i]) + 1e-3)) << "wte element " << i;
      differ += b.grads[i] != a.grads[i];
    } else {
      ASSERT_EQ(b.grads[i], a.grads[i]) << "gradient element " << i << " (outside wte)";
    }
  }
  EXPECT_EQ(whole.model->head_bytes(), kRows * padded * 4);  // every row's fp32 logits, dlogits over them
  EXPECT_EQ(chunked.model->head_bytes(), 64 * padded * 4);   // one chunk's
  double ea = 0.0, eb = 0.0;
  ASSERT_TRUE(whole.model->Evaluate(batch, scheme, 5, &ea).ok());
  ASSERT_TRUE(chunked.model->Evaluate(same, scheme, 5, &eb).ok());
  EXPECT_EQ(ea, eb);
  EXPECT_EQ(chunked.model->head_bytes(), 64 * padded * 4);  // the evaluation in chunks too
  std::printf("%s: wte gradient elements that differ in their last bits: %lld of %lld\n", preset,
              static_cast<long long>(differ), static_cast<long long>(wte->count));
}

TEST(GptModelTest, ABf16HeadInChunksRunsItsBackwardPerChunkWithTheBits) {
  ExpectTheHeadInChunksKeepsTheBitsBelowIt("bf16", 12, 9);
}

TEST(GptModelTest, AnMxHeadInChunksRunsItsBackwardPerChunkWithTheBits) {
  ExpectTheHeadInChunksKeepsTheBitsBelowIt("mxfp8_e4m3", 14, 7);
}

// An fp32 head runs in one piece (every row's fp32 logits, dlogits over them)
// whatever the chunk size: its buffer grows from a BF16 step's one chunk.
TEST(GptModelTest, AnFp32HeadRunsInOnePiece) {
  constexpr int kRows = kHeadRows;
  const int64_t padded = 256;
  TestNet net;
  Batch batch;
  ASSERT_NO_FATAL_FAILURE(MakeHeadNet(12, 9, &net, &batch));
  net.model->SetHeadChunkFloats(64 * padded);
  const StepResult b = Step(&net, batch, Preset("bf16"));
  EXPECT_TRUE(net.model->head_backward_done());
  EXPECT_EQ(net.model->head_bytes(), 64 * padded * 4);
  const StepResult c = Step(&net, batch, Preset("fp32"));
  EXPECT_TRUE(std::isfinite(c.loss));
  EXPECT_NE(c.loss, b.loss);
  EXPECT_FALSE(net.model->head_backward_done());
  EXPECT_EQ(net.model->head_bytes(), kRows * padded * 4);
}

// The layernorms' rounded affine copies take their own few floats, not a
// buffer the size of every parameter: the weights are the one allocation that
// large (the update's copies live in the trainer).
TEST(GptModelTest, OnlyTheWeightsTakeABufferTheSizeOfEveryParameter) {
  for (const char* extra : {"", ", qk_layernorm: true"}) {
    int large = 0;
    ASSERT_NO_FATAL_FAILURE(ParamSizedAllocations(
        "{type: gpt, layers: 2, width: 64, heads: 2, context: 16, vocab: 256" + std::string(extra) + "}",
        "batch: 2\nseq: 16\n", &large));
    EXPECT_EQ(large, 1) << extra;
  }
}

}  // namespace
}  // namespace keel
