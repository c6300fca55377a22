// The gla model (model_gla.cc on model_decoder.h) on the CPU backend: its
// parameters against the formula of docs/train.md and ModelParameterCount, and
// its whole backward (embedding, RMSNorms, q/k/v/g, the gate's low-rank pair,
// bias and logsigmoid, the gated recurrence, the per-head RMSNorm and swish
// gate, o_proj, SwiGLU MLP, tied head, cross-entropy) against central
// differences of its forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/nn.h"
#include "worker/config/run_config.h"
#include "worker/engine/model.h"
#include "worker/engine/model_test_util.h"

namespace keel {
namespace {

TEST(GlaModelTest, ParametersAreTheDocumentedTensors) {
  TestNet net;
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: gla, layers: 2, width: 64, heads: 2, context: 32, vocab: 100}", "batch: 2\nseq: 32\n", &net));
  const ModelConfig& m = net.config.model;
  EXPECT_EQ(m.padded_vocab, 128);
  EXPECT_EQ(m.mlp_hidden, 192);  // 8/3 x 64 = 170 -> 192
  EXPECT_EQ(m.mlp, "swiglu");
  EXPECT_FALSE(m.bias);
  const int64_t d = 64, dk = 32, dvh = 32, h = 192, v = 128, layers = 2, rank = 16;
  std::vector<std::string> expected_names = {"embed.weight"};
  std::vector<std::vector<int64_t>> expected_shapes = {{v, d}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"attn_norm.weight", {d}},
             {"attn.qkvg.weight", {3 * d, d}},
             {"attn.gk_proj.0.weight", {rank, d}},
             {"attn.gk_proj.1.weight", {dk, rank}},
             {"attn.gk_proj.1.bias", {dk}},
             {"attn.g_norm.weight", {dvh}},
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
    const bool bias = params[i].name.find(".bias") != std::string::npos;
    EXPECT_EQ(params[i].ln_gamma, params[i].shape.size() == 1 && !bias) << params[i].name;  // the RMSNorm gains
    EXPECT_EQ(params[i].decay, params[i].shape.size() == 2) << params[i].name;  // not gains, not the bias
    total += params[i].count;
  }
  // docs/train.md: V d + L (2d + 4d^2 + 16 d + 17 d/2 + d/H + 3 h d) + d.
  const int64_t formula = v * d + layers * (2 * d + 4 * d * d + rank * d + (rank + 1) * dk + dvh + 3 * h * d) + d;
  EXPECT_EQ(formula, 118208);
  EXPECT_EQ(total, formula);
  EXPECT_EQ(ModelParameterCount(m), formula);
  EXPECT_EQ(net.model->linear_names(),
            (std::vector<std::string>{"layers.0.attn.qkvg", "layers.0.attn.gk_proj.0", "layers.0.attn.gk_proj.1",
                                      "layers.0.attn.o_proj", "layers.0.mlp.gate_up", "layers.0.mlp.down",
                                      "layers.1.attn.qkvg", "layers.1.attn.gk_proj.0", "layers.1.attn.gk_proj.1",
                                      "layers.1.attn.o_proj", "layers.1.mlp.gate_up", "layers.1.mlp.down",
                                      "lm_head"}));
}

// The initial weights: gains 1, the gate's bias 0 (every gate starts at
// logsigmoid(gk_proj(x)) / 16 with a small argument), matrices N(0, 0.02).
TEST(GlaModelTest, InitZeroesTheGateBias) {
  TestNet net;
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: gla, layers: 1, width: 32, heads: 2, context: 8, vocab: 64}", "batch: 1\nseq: 8\n", &net));
  ASSERT_TRUE(net.model->Init(7).ok());
  std::vector<float> w(net.model->param_count());
  ASSERT_TRUE(net.backend->Download(w.data(), net.model->params(), w.size() * sizeof(float)).ok());
  for (const ParamInfo& p : net.model->param_info()) {
    double sum_sq = 0.0;
    for (int64_t i = 0; i < p.count; ++i) sum_sq += static_cast<double>(w[p.offset + i]) * w[p.offset + i];
    if (p.name == "layers.0.attn.gk_proj.1.bias") {
      EXPECT_EQ(sum_sq, 0.0);
    } else if (p.ln_gamma) {
      EXPECT_EQ(sum_sq, static_cast<double>(p.count)) << p.name;
    } else if (p.name == "layers.0.attn.gk_proj.0.weight") {
      EXPECT_NEAR(std::sqrt(sum_sq / p.count), 0.02, 0.005) << p.name;
    }
  }
}

// The gradient of the mean loss along random directions, one tensor at a time,
// as model_llama_test does: (L(w + s u) - L(w - s u)) / 2s against g . u, with
// weights larger than the init's (matrices N(0, 1/fan_in), gains
// 1 + N(0, 0.2^2)); the gate's pair is drawn 4x larger and its bias N(0, 2^2)
// so that the gates spread over (-1, 0] and their gradient is not tiny (the
// logsigmoid's 1/16 scales it down). The per-head RMSNorm of a small o (a head
// of 8 features) curves the loss sharply in q, k and v: plain central
// differences at s = 1e-3 were off by up to 9% for attn.qkvg, shrinking 4x at
// s/2 (truncation, s^2 / 6 times the third derivative, not a wrong gradient). So the numeric
// derivative is Richardson's (4 D(s/2) - D(s)) / 3, whose error is O(s^4); its
// fp32 noise is ~4/3 of the plain one at s/2, ~1e-3 absolute. The check allows
// 1e-2 relative with a floor of 2e-3, as model_llama_test (observed: 3.6e-3).
TEST(GlaModelTest, WholeModelGradientMatchesFiniteDifferences) {
  TestNet net;
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: gla, layers: 2, width: 16, heads: 2, context: 8, vocab: 40, ln_eps: 1.0e-5}",
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
    const bool gate = p.name.find("gk_proj") != std::string::npos;
    if (p.name.find(".bias") != std::string::npos) {
      for (int64_t i = 0; i < p.count; ++i) w[i] = 2.0f * normal(rng);
    } else if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.count; ++i) w[i] = 1.0f + 0.2f * normal(rng);
    } else {
      float stddev = p.name == "embed.weight" ? 1.0f : 1.0f / std::sqrt(static_cast<float>(p.shape[1]));
      if (gate) stddev *= 4.0f;
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
  EXPECT_EQ(loss, evaluated);

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
      std::vector<float> half_plus = weights, half_minus = weights;
      for (int64_t i = 0; i < p.count; ++i) {
        half_plus[p.offset + i] += 0.5f * step * u[i];
        half_minus[p.offset + i] -= 0.5f * step * u[i];
      }
      const double wide = (loss_at(plus) - loss_at(minus)) / (2.0 * step);
      const double narrow = (loss_at(half_plus) - loss_at(half_minus)) / step;
      const double numeric = (4.0 * narrow - wide) / 3.0;  // Richardson: the s^2 term cancels
      const double error = std::fabs(numeric - analytic) / std::max(std::fabs(numeric), 0.2);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-2) << p.name << " direction " << trial << ": analytic " << analytic << ", numeric "
                             << numeric;
      EXPECT_GT(std::fabs(analytic), 1e-3) << p.name << ": a gradient this small checks nothing";
    }
  }
  std::printf("largest relative error of a directional derivative: %.2e\n", worst);
}

// post_qk_bf16 keeps GLA's gate projection (both halves) and o_proj in BF16 in
// every role and leaves attn.qkvg and the MLP in the scheme's format: under
// nvfp4 their statistics slots count one BF16 block per call where NVFP4
// counts one per 16 elements.
TEST(GlaModelTest, PostQkProtectionKeepsTheGateProjectionAndOProjInBf16) {
  TestNet net;
  ASSERT_NO_FATAL_FAILURE(
      MakeTestNet("{type: gla, layers: 1, width: 64, heads: 2, context: 16, vocab: 40, ln_eps: 1.0e-5}",
                  "batch: 2\nseq: 16\nthreads: 2\n", &net));
  Model* model = net.model.get();
  Backend* b = net.backend.get();
  ASSERT_TRUE(model->Init(5).ok());
  Batch batch;
  for (int i = 0; i < 32; ++i) {
    batch.inputs.push_back((i * 7) % 40);
    batch.targets.push_back((i * 11 + 3) % 40);
  }
  const std::vector<std::string>& names = model->linear_names();
  auto stats_of = [&](bool post_qk) {
    PrecisionScheme s;
    EXPECT_TRUE(SchemeFromPreset("nvfp4", &s).ok());
    s.post_qk_bf16 = post_qk;
    std::vector<float> grads(model->param_count(), 0.0f);
    EXPECT_TRUE(b->ResetOperandStats(static_cast<int>(names.size())).ok());
    double loss = 0.0;
    EXPECT_TRUE(model->ForwardBackward(batch, s, 3, 1.0f, true, grads.data(), &loss, nullptr).ok());
    std::vector<OperandStats> st;
    EXPECT_TRUE(b->ReadOperandStats(&st).ok());
    return st;
  };
  const std::vector<OperandStats> plain = stats_of(false), chon = stats_of(true);
  const int fwd_w = static_cast<int>(Role::kFwdW);
  for (size_t slot = 0; slot < names.size(); ++slot) {
    const OperandStats& p = plain[slot * kRoleCount + fwd_w];
    const OperandStats& c = chon[slot * kRoleCount + fwd_w];
    const bool post_qk = names[slot].find("gk_proj") != std::string::npos ||
                         names[slot].find("o_proj") != std::string::npos;
    SCOPED_TRACE(names[slot]);
    EXPECT_EQ(p.blocks, p.elements / 16);  // NVFP4 without the protection
    EXPECT_EQ(c.blocks, post_qk ? 1 : p.blocks);
    EXPECT_EQ(c.elements, p.elements);
  }
}

}  // namespace
}  // namespace keel
