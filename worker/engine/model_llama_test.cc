// The llama model (model_llama.cc on model_decoder.h) on the CPU backend: its
// parameters against the formula of docs/train.md and ModelParameterCount, and
// its whole backward (embedding, RMSNorms, q/k/v, RoPE, attention, o_proj,
// SwiGLU MLP, tied head, cross-entropy) against central differences of its
// forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/nn.h"
#include "worker/config/run_config.h"
#include "worker/engine/model.h"
#include "worker/engine/model_test_util.h"

namespace keel {
namespace {

TEST(LlamaModelTest, ParametersAreTheDocumentedTensors) {
  TestNet net;
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: llama, layers: 2, width: 48, heads: 4, context: 32, vocab: 100}", "batch: 2\nseq: 32\n", &net));
  const ModelConfig& m = net.config.model;
  // The defaults: vocab padded to 128, SwiGLU hidden 8/3 x 48 = 128 (a multiple of 64).
  EXPECT_EQ(m.padded_vocab, 128);
  EXPECT_EQ(m.mlp_hidden, 128);
  const int64_t d = 48, h = 128, v = 128, layers = 2;
  std::vector<std::string> expected_names = {"embed.weight"};
  std::vector<std::vector<int64_t>> expected_shapes = {{v, d}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"attn_norm.weight", {d}},
             {"attn.qkv.weight", {3 * d, d}},
             {"attn.o_proj.weight", {d, d}},
             {"mlp_norm.weight", {d}},
             {"mlp.gate_up.weight", {2 * h, d}},
             {"mlp.down.weight", {d, h}}}) {
      expected_names.push_back(p + name);
      expected_shapes.push_back(shape);
    }
  }
  expected_names.push_back("norm.weight");
  expected_shapes.push_back({d});
  const std::vector<ParamInfo>& params = net.model->param_info();
  ASSERT_EQ(params.size(), expected_names.size());
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, expected_names[i]);
    EXPECT_EQ(params[i].shape, expected_shapes[i]) << params[i].name;
    EXPECT_EQ(params[i].ln_gamma, params[i].shape.size() == 1) << params[i].name;  // the RMSNorm gains
    EXPECT_EQ(params[i].decay, params[i].shape.size() == 2) << params[i].name;
    total += params[i].count;
  }
  // docs/train.md: V d + L (2d + 4d^2 + 3 h d) + d, the head tied to the embedding.
  const int64_t formula = v * d + layers * (2 * d + 4 * d * d + 3 * h * d) + d;
  EXPECT_EQ(formula, 61680);
  EXPECT_EQ(total, formula);
  EXPECT_EQ(ModelParameterCount(m), formula);
  EXPECT_EQ(net.model->linear_names(),
            (std::vector<std::string>{"layers.0.attn.qkv", "layers.0.attn.o_proj", "layers.0.mlp.gate_up",
                                      "layers.0.mlp.down", "layers.1.attn.qkv", "layers.1.attn.o_proj",
                                      "layers.1.mlp.gate_up", "layers.1.mlp.down", "lm_head"}));
}

// The gradient of the mean loss along random directions, one tensor at a time:
// (L(w + s u) - L(w - s u)) / 2s against g . u. The weights are drawn larger
// than the init's (matrices N(0, 1/fan_in), gains 1 + N(0, 0.2^2)) so that the
// attention is far from uniform and RoPE's angles change the loss: a wrong
// rotation, pairing or sign in any layer moves g . u by O(|g|).
// Precision: the forward is fp32, so L carries an error of ~1e-7 relative
// (loss ~5: ~5e-7); divided by 2s = 2e-3 that is ~3e-4 on the directional
// derivative, whose size here is 0.1 to 10. The truncation error s^2/6 L''' is
// ~1e-6. The check allows 1e-2 relative with a floor of 2e-3 (observed:
// largest error 2.2e-3 relative; without RoPE's backward, errors of 10-80%).
TEST(LlamaModelTest, WholeModelGradientMatchesFiniteDifferences) {
  TestNet net;
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: llama, layers: 2, width: 16, heads: 2, context: 8, vocab: 40, ln_eps: 1.0e-5}",
              "batch: 2\nseq: 8\nthreads: 2\n", &net));
  Model* model = net.model.get();
  Backend* b = net.backend.get();
  const std::vector<ParamInfo>& params = model->param_info();
  const int64_t count = model->param_count();
  const int vocab = net.config.model.vocab;

  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> weights(count, 0.0f);
  for (const ParamInfo& p : params) {
    float* w = weights.data() + p.offset;
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.count; ++i) w[i] = 1.0f + 0.2f * normal(rng);
    } else {
      const float stddev = p.name == "embed.weight" ? 1.0f : 1.0f / std::sqrt(static_cast<float>(p.shape[1]));
      const int64_t real = p.name == "embed.weight" ? vocab * p.shape[1] : p.count;  // padded rows stay 0
      for (int64_t i = 0; i < real; ++i) w[i] = stddev * normal(rng);
    }
  }
  ASSERT_TRUE(b->Upload(model->params(), weights.data(), count * sizeof(float)).ok());

  Batch batch;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (int i = 0; i < 16; ++i) {
    batch.inputs.push_back(token(rng));
    batch.targets.push_back(i == 5 ? -1 : token(rng));  // one ignored target
  }
  PrecisionScheme fp32;
  ASSERT_TRUE(SchemeFromPreset("fp32", &fp32).ok());

  std::vector<float> grads(count, 0.0f);
  double loss = 0.0;
  ASSERT_TRUE(model->ForwardBackward(batch, fp32, 0, 1.0f, false, grads.data(), &loss, nullptr).ok());
  double evaluated = 0.0;
  ASSERT_TRUE(model->Evaluate(batch, fp32, 0, &evaluated).ok());
  EXPECT_EQ(loss, evaluated);  // the fused cross-entropy's losses are the plain forward's

  auto loss_at = [&](const std::vector<float>& w) {
    EXPECT_TRUE(b->Upload(model->params(), w.data(), count * sizeof(float)).ok());
    double l = 0.0;
    EXPECT_TRUE(model->Evaluate(batch, fp32, 0, &l).ok());
    return l;
  };
  const float step = 1e-3f;
  double worst = 0.0;
  for (const ParamInfo& p : params) {
    for (int trial = 0; trial < 2; ++trial) {
      std::vector<float> u(p.count), plus = weights, minus = weights;
      double analytic = 0.0;
      for (int64_t i = 0; i < p.count; ++i) {
        u[i] = normal(rng);
        plus[p.offset + i] += step * u[i];
        minus[p.offset + i] -= step * u[i];
        analytic += static_cast<double>(grads[p.offset + i]) * u[i];
      }
      const double numeric = (loss_at(plus) - loss_at(minus)) / (2.0 * step);
      const double error = std::fabs(numeric - analytic) / std::max(std::fabs(numeric), 0.2);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-2) << p.name << " direction " << trial << ": analytic " << analytic << ", numeric "
                             << numeric;
      EXPECT_GT(std::fabs(analytic), 1e-2) << p.name << ": a gradient this small checks nothing";
    }
  }
  std::printf("largest relative error of a directional derivative: %.2e\n", worst);
}

// A llama net of 2 blocks (width 32, 2 heads), weights and a batch drawn from rng.
void MakePostQkNet(TestNet* net, Batch* batch) {
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: llama, layers: 2, width: 32, heads: 2, context: 16, vocab: 40, ln_eps: 1.0e-5}",
                  "batch: 2\nseq: 16\nthreads: 2\n", net));
  Model* model = net->model.get();
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> weights(model->param_count(), 0.0f);
  for (const ParamInfo& p : model->param_info()) {
    float* w = weights.data() + p.offset;
    const float stddev = p.shape.size() == 1 ? 0.2f : 1.0f / std::sqrt(static_cast<float>(p.shape[1]));
    for (int64_t i = 0; i < p.count; ++i) w[i] = (p.shape.size() == 1 ? 1.0f : 0.0f) + stddev * normal(rng);
  }
  ASSERT_TRUE(net->backend->Upload(model->params(), weights.data(), weights.size() * sizeof(float)).ok());
  std::uniform_int_distribution<int32_t> token(0, 39);
  for (int i = 0; i < 32; ++i) {
    batch->inputs.push_back(token(rng));
    batch->targets.push_back(token(rng));
  }
}

// post_qk_bf16 runs attn.qkv's v rows as a BF16 GEMM of their own. Under the
// bf16 scheme every role is BF16 already, so the forward and the qkv weight's
// gradient are the same bits (each output column and each weight row is its
// own sum) and the rest agree to fp32 rounding (dx adds the two GEMMs' parts).
// Under nvfp4 the statistics show the v rows left NVFP4: the weight role of
// attn.qkv counts 2d x d / 16 NVFP4 blocks plus one BF16 call instead of
// 3d x d / 16 blocks.
TEST(LlamaModelTest, PostQkProtectionKeepsWvInBf16) {
  TestNet net;
  Batch batch;
  ASSERT_NO_FATAL_FAILURE(MakePostQkNet(&net, &batch));
  Model* model = net.model.get();
  Backend* b = net.backend.get();
  const int64_t count = model->param_count();
  auto run = [&](const std::string& preset, bool post_qk, std::vector<float>* grads, std::vector<OperandStats>* st) {
    PrecisionScheme s;
    EXPECT_TRUE(SchemeFromPreset(preset, &s).ok());
    s.post_qk_bf16 = post_qk;
    grads->assign(count, 0.0f);
    EXPECT_TRUE(b->ResetOperandStats(static_cast<int>(model->linear_names().size())).ok());
    double loss = 0.0;
    EXPECT_TRUE(model->ForwardBackward(batch, s, 3, 1.0f, true, grads->data(), &loss, nullptr).ok());
    EXPECT_TRUE(b->ReadOperandStats(st).ok());
    return loss;
  };
  std::vector<float> g0, g1;
  std::vector<OperandStats> st0, st1;
  const double l0 = run("bf16", false, &g0, &st0), l1 = run("bf16", true, &g1, &st1);
  EXPECT_EQ(l0, l1);
  double num = 0, den = 0;
  for (const ParamInfo& p : model->param_info()) {
    if (p.name.find("attn.qkv.weight") != std::string::npos) {
      EXPECT_EQ(0, std::memcmp(g0.data() + p.offset, g1.data() + p.offset, p.count * sizeof(float))) << p.name;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    num += (static_cast<double>(g1[i]) - g0[i]) * (static_cast<double>(g1[i]) - g0[i]);
    den += static_cast<double>(g0[i]) * g0[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-6);

  const int64_t d = 32;
  const double n0 = run("nvfp4", false, &g0, &st0), n1 = run("nvfp4", true, &g1, &st1);
  EXPECT_NE(n0, n1);
  const int fwd_w = static_cast<int>(Role::kFwdW), slots_per_block = 4;
  for (int block = 0; block < 2; ++block) {
    const OperandStats& plain = st0[(block * slots_per_block + 0) * kRoleCount + fwd_w];
    const OperandStats& protected_v = st1[(block * slots_per_block + 0) * kRoleCount + fwd_w];
    EXPECT_EQ(plain.blocks, 3 * d * d / 16) << "block " << block;
    EXPECT_EQ(protected_v.blocks, 2 * d * d / 16 + 1) << "block " << block;
    EXPECT_EQ(protected_v.elements, 3 * d * d) << "block " << block;
  }
}

// Where the backend keeps the attention's heads, the llama model makes q, k (rotated) and v in its
// gradient scratch and keeps the heads in qkv_act: the loss and every gradient keep the bits of the
// model on a backend that keeps nothing, with the post-QK split (W_v in BF16) too, and an fp32 step
// (nothing kept) takes the plain pair.
TEST(LlamaModelTest, KeptAttentionHeadsKeepTheBits) {
  const std::string yaml = "{type: llama, layers: 2, width: 48, heads: 4, context: 32, vocab: 100}";
  TestNet plain, keeping;
  ASSERT_NO_FATAL_FAILURE(MakeTestNet(yaml, "batch: 2\nseq: 32\n", &plain));
  auto* backend = new KeepingCpu();
  ASSERT_NO_FATAL_FAILURE(MakeTestNetOn(std::unique_ptr<Backend>(backend), yaml, "batch: 2\nseq: 32\n", &keeping));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(plain.model->param_count()));
  for (const ParamInfo& p : plain.model->param_info()) {
    for (int64_t i = 0; i < p.count; ++i) {
      w[static_cast<size_t>(p.offset + i)] = p.shape.size() == 1 ? 1.0f + 0.1f * normal(rng) : 0.05f * normal(rng);
    }
  }
  for (TestNet* n : {&plain, &keeping}) {
    ASSERT_TRUE(n->backend->Upload(n->model->params(), w.data(), w.size() * sizeof(float)).ok());
  }
  Batch batch;
  std::uniform_int_distribution<int32_t> token(0, 99);
  for (int i = 0; i < 64; ++i) {
    batch.inputs.push_back(token(rng));
    batch.targets.push_back(token(rng));
  }
  auto step = [&](TestNet* n, const char* preset, bool post_qk, std::vector<float>* grads) {
    PrecisionScheme s;
    EXPECT_TRUE(SchemeFromPreset(preset, &s).ok());
    s.post_qk_bf16 = post_qk;
    grads->assign(static_cast<size_t>(n->model->param_count()), 0.0f);
    double loss = 0.0;
    EXPECT_TRUE(n->model->ForwardBackward(batch, s, 3, 1.0f, false, grads->data(), &loss, nullptr).ok());
    return loss;
  };
  int kept = 0;
  for (const auto& c : {std::make_pair("bf16", false), std::make_pair("bf16", true), std::make_pair("fp32", false),
                        std::make_pair("bf16", false)}) {
    SCOPED_TRACE(std::string(c.first) + (c.second ? ", post-QK" : ""));
    std::vector<float> ga, gb;
    const double a = step(&plain, c.first, c.second, &ga), b = step(&keeping, c.first, c.second, &gb);
    ASSERT_TRUE(std::isfinite(a));
    EXPECT_EQ(a, b);
    EXPECT_EQ(ga, gb);
    if (std::string(c.first) == "bf16") kept += 2;  // both layers
    EXPECT_EQ(backend->keeps, kept);
    EXPECT_EQ(backend->kepts, kept);
  }
}

// One ForwardBackward of a 2-layer `type` decoder of width 64 (vocabulary 256)
// with random weights from `seed`, a batch of 8 x 16 random tokens, `scheme`
// and its head in chunks of `chunk_floats` logits: the loss, into *grads the
// gradient, into *done whether the head's backward ran in the forward pass,
// into *embed the tied head's offset and count in the parameters.
double DecoderHeadStep(const char* type, uint32_t seed, const char* scheme, int64_t chunk_floats,
                       std::vector<float>* grads, bool* done, std::pair<int64_t, int64_t>* embed) {
  TestNet net;
  [&] {
    ASSERT_NO_FATAL_FAILURE(MakeTestNet(std::string("{type: ") + type +
                                            ", layers: 2, width: 64, heads: 2, context: 16, vocab: 256}",
                                        "batch: 8\nseq: 16\n", &net));
  }();
  if (net.model == nullptr) return 0.0;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(net.model->param_count()), 0.0f);
  *embed = {-1, 0};
  for (const ParamInfo& p : net.model->param_info()) {
    for (int64_t i = 0; i < p.count; ++i) {
      w[static_cast<size_t>(p.offset + i)] = p.shape.size() == 1 ? 1.0f + 0.1f * normal(rng) : 0.05f * normal(rng);
    }
    if (embed->first < 0 && p.block < 0 && p.shape.size() == 2) *embed = {p.offset, p.count};  // the first matrix
  }
  EXPECT_TRUE(net.backend->Upload(net.model->params(), w.data(), w.size() * sizeof(float)).ok());
  Batch batch;
  std::uniform_int_distribution<int32_t> token(0, 255);
  for (int i = 0; i < 128; ++i) {
    batch.inputs.push_back(token(rng));
    batch.targets.push_back(token(rng));
  }
  net.model->SetHeadChunkFloats(chunk_floats);
  PrecisionScheme s;
  EXPECT_TRUE(SchemeFromPreset(scheme, &s).ok());
  grads->assign(static_cast<size_t>(net.model->param_count()), 0.0f);
  double loss = 0.0;
  EXPECT_TRUE(net.model->ForwardBackward(batch, s, 3, 1.0f, false, grads->data(), &loss, nullptr).ok());
  *done = net.model->head_backward_done();
  // One chunk's fp32 logits (or every row's in one piece), dlogits in place: nothing else.
  EXPECT_EQ(net.model->head_bytes(), chunk_floats * 4) << type << " " << scheme;
  return loss;
}

// A BF16 or MX head in chunks (Model::HeadAndLoss) runs its backward in the
// forward's chunks: the loss and every gradient but the tied embedding's keep
// the one-piece bits, the embedding's within summation order (llama and gla
// share this code).
TEST(DecoderModelTest, TheHeadInChunksKeepsTheBitsBelowTheHead) {
  for (const char* scheme : {"bf16", "mxfp8_e4m3"}) {
    for (const char* type : {"llama", "gla"}) {
      SCOPED_TRACE(std::string(type) + " " + scheme);
      std::vector<float> g_whole, g_chunks;
      bool whole_done = true, chunks_done = false;
      std::pair<int64_t, int64_t> embed;
      const uint32_t seed = std::string(scheme) == "bf16" ? 13 : 15;
      const double whole = DecoderHeadStep(type, seed, scheme, 128 * 256, &g_whole, &whole_done, &embed);
      const double chunks = DecoderHeadStep(type, seed, scheme, 64 * 256, &g_chunks, &chunks_done, &embed);
      ASSERT_TRUE(std::isfinite(whole));
      EXPECT_FALSE(whole_done);
      EXPECT_TRUE(chunks_done);
      EXPECT_EQ(whole, chunks);
      ASSERT_EQ(g_whole.size(), g_chunks.size());
      ASSERT_GE(embed.first, 0);
      for (size_t i = 0; i < g_whole.size(); ++i) {
        if (static_cast<int64_t>(i) >= embed.first && static_cast<int64_t>(i) < embed.first + embed.second) {
          EXPECT_NEAR(g_chunks[i], g_whole[i], 1e-5 * (std::fabs(g_whole[i]) + 1e-3)) << "embedding " << i;
        } else {
          ASSERT_EQ(g_chunks[i], g_whole[i]) << "gradient element " << i;
        }
      }
    }
  }
}

// The rounded copies of the RMSNorm gains take their own few floats, not a
// buffer the size of every parameter (llama and gla share this code).
TEST(DecoderModelTest, OnlyTheWeightsTakeABufferTheSizeOfEveryParameter) {
  for (const char* type : {"llama", "gla"}) {
    int large = 0;
    ASSERT_NO_FATAL_FAILURE(ParamSizedAllocations(
        std::string("{type: ") + type + ", layers: 2, width: 64, heads: 2, context: 16, vocab: 256}",
        "batch: 2\nseq: 16\n", &large));
    EXPECT_EQ(large, 1) << type;
  }
}

}  // namespace
}  // namespace keel
