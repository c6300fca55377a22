// The CUDA backend against the CPU backend (the reference): every operation on
// the same random inputs, determinism (two runs, identical bits), the operand
// statistics, and timings of the GPT-2-sized operations.
//
// What agrees how closely, and why (each check repeats its tolerance):
//   - Same fp32 operations in the same order on both sides (Fill, Add, Axpy,
//     Scale, Copy2D, AdamW, the embedding, the quantizers): bit for bit. So is
//     the GPU's dbias summed inside the bf16 rounding of dy against its own
//     ColumnSums (the same partials in the same order). nvcc
//     builds with -fmad=false and IEEE division and square root, the CPU with
//     -ffp-contract=off, so no fused multiply-add changes a rounding.
//   - Libm functions (logf, cosf, erff, expf): CUDA's and glibc's differ by an
//     ulp or two, so a few 1e-7 relative, plus an absolute floor where a value
//     is a difference near zero.
//   - Sums whose order differs (GEMMs, row and column reductions, softmax
//     normalisers): normwise, max |gpu - cpu| / max |cpu| <= 1e-5. The two sides
//     sum the same rounded operands (quantized operands are bit-identical, and
//     both fold the NVFP4 / FP8 decode scales into the GEMM's alpha), so the only
//     difference is fp32 rounding of K terms: sqrt(K) * 2^-24 * |terms| ~ 1e-6 of
//     the largest output here.
//   - bf16 attention: the fp32 probabilities (and dS) differ in their last bits,
//     and rounding them to bf16 turns that into a 2^-8 step for the rare element
//     near a rounding boundary; 99% of the outputs stay within 1e-5 normwise and
//     all within 4e-3.
//
// Needs a GPU, so CI does not run it (tag manual). Run it on the GPU machine from
// dist/ (scripts/dist) or with bazel run //kernels:nn_cuda_test.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cublaslt_gelu_probe.h"
#include "kernels/formats.h"
#include "kernels/nn.h"
#include "kernels/nn_test_util.h"
#include "kernels/quantize.h"
#include "kernels/quantize_cuda.h"

namespace keel {
namespace {

using nn_test::Normal;
using nn_test::Quant;
using nn_test::WithOutliers;

#define EXPECT_OK(expr)                                         \
  do {                                                          \
    const Status status_ = (expr);                              \
    EXPECT_TRUE(status_.ok()) << #expr << ": " << status_.message(); \
  } while (0)

#define ASSERT_OK(expr)                                         \
  do {                                                          \
    const Status status_ = (expr);                              \
    ASSERT_TRUE(status_.ok()) << #expr << ": " << status_.message(); \
  } while (0)

// ---- Inputs ------------------------------------------------------------------------

std::vector<int32_t> Tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& v : t) v = pick(rng);
  return t;
}

// ---- Comparisons ----------------------------------------------------------------------

bool SameBits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Elements whose bits differ (any NaN equals any NaN).
void ExpectBits(const std::string& what, const std::vector<float>& ref, const std::vector<float>& got) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!SameBits(ref[i], got[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << ref.size() << " elements differ, first at " << first
                       << " (cpu " << (first >= 0 ? ref[first] : 0.0f) << ", cuda "
                       << (first >= 0 ? got[first] : 0.0f) << ")";
}

// max |got - ref| / max |ref|; NaN positions must agree.
double Normwise(const std::string& what, const std::vector<float>& ref, const std::vector<float>& got) {
  EXPECT_EQ(ref.size(), got.size()) << what;
  double max_ref = 0.0, max_diff = 0.0;
  int64_t nan_mismatch = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    if (std::isnan(ref[i]) || std::isnan(got[i])) {
      if (std::isnan(ref[i]) != std::isnan(got[i])) ++nan_mismatch;
      continue;
    }
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  EXPECT_EQ(nan_mismatch, 0) << what << ": NaN in one backend only";
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

void ExpectNormwise(const std::string& what, const std::vector<float>& ref, const std::vector<float>& got,
                    double tolerance) {
  const double err = Normwise(what, ref, got);
  EXPECT_LE(err, tolerance) << what << ": normwise error " << err;
  std::printf("  %-44s normwise %.2e (tolerance %.0e)\n", what.c_str(), err, tolerance);
}

// |got - ref| <= abs_tol + rel_tol |ref| for every element.
void ExpectElementwise(const std::string& what, const std::vector<float>& ref, const std::vector<float>& got,
                       double rel_tol, double abs_tol) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  int64_t bad = 0, worst = -1;
  double worst_excess = 0.0, max_rel = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) && std::isnan(got[i])) continue;
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double allowed = abs_tol + rel_tol * std::fabs(ref[i]);
    if (ref[i] != 0.0f) max_rel = std::max(max_rel, d / std::fabs(ref[i]));
    if (!(d <= allowed)) {
      ++bad;
      if (d - allowed > worst_excess || worst < 0) {
        worst_excess = d - allowed;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements outside " << rel_tol << " rel + " << abs_tol
                    << " abs; worst at " << worst << " (cpu " << (worst >= 0 ? ref[worst] : 0.0f) << ", cuda "
                    << (worst >= 0 ? got[worst] : 0.0f) << ")";
  std::printf("  %-44s max relative %.2e\n", what.c_str(), max_rel);
}

// ---- Fixture: both backends, tensors on both --------------------------------------------

// The same data on the CPU backend (host memory) and on the GPU.
struct Dual {
  void* cpu = nullptr;
  void* gpu = nullptr;
  size_t bytes = 0;
  float* c() const { return static_cast<float*>(cpu); }
  float* g() const { return static_cast<float*>(gpu); }
  int32_t* ci() const { return static_cast<int32_t*>(cpu); }
  int32_t* gi() const { return static_cast<int32_t*>(gpu); }
};

class NnCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Status s = MakeCpuBackend(0, &cpu_);
    if (!s.ok()) std::fprintf(stderr, "cpu backend: %s\n", s.message().c_str());
    s = MakeCudaBackend(&gpu_);
    if (!s.ok()) {
      std::fprintf(stderr, "cuda backend: %s\n", s.message().c_str());
    } else {
      std::printf("cpu: %s\ncuda: %s\n", cpu_->Describe().c_str(), gpu_->Describe().c_str());
    }
  }
  static void TearDownTestSuite() {
    gpu_.reset();
    cpu_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(cpu_ != nullptr) << "no CPU backend";
    ASSERT_TRUE(gpu_ != nullptr) << "no CUDA backend (see stderr): this test needs a GPU";
  }
  void TearDown() override {
    for (Dual& d : tensors_) {
      cpu_->Free(d.cpu);
      gpu_->Free(d.gpu);
    }
    tensors_.clear();
  }

  Dual Make(const void* host, size_t bytes) {
    Dual d;
    d.bytes = bytes;
    Status s = cpu_->Alloc(bytes, &d.cpu);
    EXPECT_TRUE(s.ok()) << s.message();
    s = gpu_->Alloc(bytes, &d.gpu);
    EXPECT_TRUE(s.ok()) << s.message();
    if (host != nullptr && bytes > 0) {
      EXPECT_TRUE(cpu_->Upload(d.cpu, host, bytes).ok());
      s = gpu_->Upload(d.gpu, host, bytes);
      EXPECT_TRUE(s.ok()) << s.message();
    }
    tensors_.push_back(d);
    return d;
  }
  Dual Floats(const std::vector<float>& v) { return Make(v.data(), v.size() * sizeof(float)); }
  Dual Ints(const std::vector<int32_t>& v) { return Make(v.data(), v.size() * sizeof(int32_t)); }
  Dual Zeros(int64_t floats) { return Make(nullptr, static_cast<size_t>(floats) * sizeof(float)); }

  // Re-uploads host data into both copies (e.g. to reset a "+=" output).
  void Set(const Dual& d, const std::vector<float>& v) {
    ASSERT_EQ(v.size() * sizeof(float), d.bytes);
    ASSERT_OK(cpu_->Upload(d.cpu, v.data(), d.bytes));
    ASSERT_OK(gpu_->Upload(d.gpu, v.data(), d.bytes));
  }
  static std::vector<float> Get(Backend* b, const void* p, size_t bytes) {
    std::vector<float> v(bytes / sizeof(float));
    const Status s = b->Download(v.data(), p, bytes);
    EXPECT_TRUE(s.ok()) << s.message();
    return v;
  }
  std::vector<float> Cpu(const Dual& d) { return Get(cpu_.get(), d.cpu, d.bytes); }
  std::vector<float> Gpu(const Dual& d) { return Get(gpu_.get(), d.gpu, d.bytes); }

  static std::unique_ptr<Backend> cpu_, gpu_;
  std::vector<Dual> tensors_;
};

std::unique_ptr<Backend> NnCudaTest::cpu_;
std::unique_ptr<Backend> NnCudaTest::gpu_;

// ---- Formats ------------------------------------------------------------------------------

int R(Role role) { return static_cast<int>(role); }

LinearQuant AllRoles(const OperandFormat& f) {
  LinearQuant q;
  for (OperandFormat& r : q.role) r = f;
  return q;
}

// The NVFP4 training recipe: 16x16 weight tiles, RHT on the wgrad pair, stochastic
// rounding of the gradients.
LinearQuant Nvfp4Recipe() {
  LinearQuant q = AllRoles(Quant(QuantFormat::kNvfp4));
  q.role[R(Role::kFwdW)].tile_16x16 = true;
  q.role[R(Role::kDgradW)].tile_16x16 = true;
  q.role[R(Role::kWgradDy)].rht = true;
  q.role[R(Role::kWgradX)].rht = true;
  q.role[R(Role::kDgradDy)].rounding = Rounding::kStochastic;
  q.role[R(Role::kWgradDy)].rounding = Rounding::kStochastic;
  return q;
}

struct Scheme {
  std::string name;
  LinearQuant q;
  bool needs_16 = false;  // NVFP4: every dimension a multiple of 16
};

std::vector<Scheme> Schemes() {
  std::vector<Scheme> s;
  s.push_back({"fp32", LinearQuant{}});
  s.push_back({"bf16", AllRoles(Quant(QuantFormat::kBf16))});
  s.push_back({"mxfp8_e4m3", AllRoles(Quant(QuantFormat::kMxfp8E4M3))});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3, Rounding::kNearestAway));
    for (Role r : {Role::kDgradDy, Role::kWgradDy}) q.role[R(r)] = Quant(QuantFormat::kMxfp8E5M2, Rounding::kStochastic);
    for (OperandFormat& f : q.role) f.bump_exponent = true;
    s.push_back({"mxfp8 e4m3 fwd / e5m2 sr bwd, bump", q});
  }
  s.push_back({"mxfp6_e2m3", AllRoles(Quant(QuantFormat::kMxfp6E2M3))});
  s.push_back({"mxfp6_e3m2 sr", AllRoles(Quant(QuantFormat::kMxfp6E3M2, Rounding::kStochastic))});
  s.push_back({"mxfp4", AllRoles(Quant(QuantFormat::kMxfp4))});
  s.push_back({"nvfp4 recipe", Nvfp4Recipe(), true});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kFp8E4M3));
    for (Role r : {Role::kDgradDy, Role::kWgradDy}) q.role[R(r)] = Quant(QuantFormat::kFp8E5M2);
    s.push_back({"fp8 e4m3 / e5m2 per tensor", q});
  }
  {
    // FP32 GEMMs with one quantized operand each, and a bf16 wgrad.
    LinearQuant q;
    q.role[R(Role::kFwdW)] = Quant(QuantFormat::kMxfp8E4M3);
    q.role[R(Role::kDgradDy)] = Quant(QuantFormat::kFp8E4M3);
    q.role[R(Role::kWgradDy)] = Quant(QuantFormat::kBf16, Rounding::kStochastic);
    q.role[R(Role::kWgradX)] = Quant(QuantFormat::kBf16);
    s.push_back({"mixed fp32 / quantized", q});
  }
  return s;
}

void ExpectStatsEqual(const std::string& what, const std::vector<OperandStats>& cpu,
                      const std::vector<OperandStats>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::string role = what + " slot " + std::to_string(i / kRoleCount) + " " +
                             RoleName(static_cast<Role>(i % kRoleCount));
    EXPECT_EQ(cpu[i].elements, gpu[i].elements) << role << " elements";
    EXPECT_EQ(cpu[i].saturated, gpu[i].saturated) << role << " saturated";
    EXPECT_EQ(cpu[i].blocks, gpu[i].blocks) << role << " blocks";
    EXPECT_EQ(cpu[i].nan_blocks, gpu[i].nan_blocks) << role << " nan_blocks";
  }
}

// ============================================================================
// Memory and elementwise
// ============================================================================

TEST_F(NnCudaTest, ElementwiseOpsMatchBitForBit) {
  const int64_t n = (1 << 20) + 3;  // a scalar tail after the float4 part
  Dual a = Floats(Normal(n, 1)), b = Floats(Normal(n, 2)), out = Zeros(n);
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    float* pa = g ? a.g() : a.c();
    float* pb = g ? b.g() : b.c();
    float* po = g ? out.g() : out.c();
    ASSERT_OK(be->Add(pa, pb, po, n));
    ASSERT_OK(be->Add(po, pb, po, n));  // out aliases a
    ASSERT_OK(be->Axpy(-0.37f, pa, po, n));
    ASSERT_OK(be->Scale(po, n, 1.7f));
    ASSERT_OK(be->Axpy(0.5f, pa + 1, pb + 3, n - 5));  // unaligned views: the scalar path
    ASSERT_OK(be->Copy2D(pa + 7, 1000, po + 11, 999, 300, 500));
    ASSERT_OK(be->Fill(pa + 1, 1001, 3.25f));
  }
  // Same fp32 operations in the same order: bit for bit.
  ExpectBits("add/axpy/scale/copy2d out", Cpu(out), Gpu(out));
  ExpectBits("axpy on unaligned views", Cpu(b), Gpu(b));
  ExpectBits("fill", Cpu(a), Gpu(a));
}

// Side work: a chain of fp32 GEMMs and elementwise ops queued beside a main
// chain gives exactly the bits of the same work queued in order (each chain's
// ops are the same, only their overlap differs); an op that needs scratch is
// refused there; the calls out of order are refused by name.
TEST_F(NnCudaTest, SideWorkGivesTheInOrderBits) {
  const int64_t rows = 1024, d = 512;
  Dual x = Floats(Normal(rows * d, 81)), w = Floats(Normal(d * d, 82, 0.05f)), side_out = Zeros(rows * d),
       side_tmp = Zeros(rows * d), main_out = Zeros(rows * d);
  LinearQuant fp32, bf16 = AllRoles(Quant(QuantFormat::kBf16));
  auto side_chain = [&](Backend* be, float* xp, float* wp, float* tmp, float* out) -> Status {
    for (int i = 0; i < 4; ++i) {
      KEEL_RETURN_IF_ERROR(be->LinearForward(i == 0 ? xp : out, wp, nullptr, nullptr, tmp, rows, d, d, fp32));
      KEEL_RETURN_IF_ERROR(be->GeluForward(tmp, out, rows * d));
    }
    return be->RandomNormal(tmp, rows * d, 7, 0, 0.5f);
  };
  std::vector<std::vector<float>> got;
  for (bool side : {false, true}) {
    Set(side_out, std::vector<float>(rows * d, 0.0f));
    Set(main_out, std::vector<float>(rows * d, 0.0f));
    Backend* be = gpu_.get();
    if (side) ASSERT_OK(be->BeginSideWork());
    ASSERT_OK(side_chain(be, x.g(), w.g(), side_tmp.g(), side_out.g()));
    if (side) ASSERT_OK(be->EndSideWork());
    // The main chain reads x too, and uses scratch (a bf16 linear layer).
    ASSERT_OK(be->LinearForward(x.g(), w.g(), nullptr, nullptr, main_out.g(), rows, d, d, bf16));
    ASSERT_OK(be->GeluForward(main_out.g(), main_out.g(), rows * d));
    if (side) ASSERT_OK(be->JoinSideWork());
    ASSERT_OK(be->Add(side_out.g(), main_out.g(), main_out.g(), rows * d));
    got.push_back(Gpu(main_out));
    got.push_back(Gpu(side_tmp));
  }
  ExpectBits("side + main", got[0], got[2]);
  ExpectBits("side's last op", got[1], got[3]);
  Backend* be = gpu_.get();
  ASSERT_OK(be->BeginSideWork());
  const Status refused = be->LinearForward(x.g(), w.g(), nullptr, nullptr, main_out.g(), rows, d, d, bf16);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("side work"), std::string::npos) << refused.message();
  EXPECT_FALSE(be->BeginSideWork().ok());
  EXPECT_FALSE(be->JoinSideWork().ok());
  EXPECT_FALSE(be->Sync().ok());
  ASSERT_OK(be->EndSideWork());
  EXPECT_FALSE(be->EndSideWork().ok());
  EXPECT_FALSE(be->BeginSideWork().ok());  // not joined yet
  ASSERT_OK(be->Sync());                   // joins
  ASSERT_OK(be->BeginSideWork());
  ASSERT_OK(be->EndSideWork());
  ASSERT_OK(be->JoinSideWork());
}

TEST_F(NnCudaTest, RandomNormalMatchesToLibmUlps) {
  const int64_t n = 1 << 20;
  Dual x = Zeros(n);
  ASSERT_OK(cpu_->RandomNormal(x.c(), n, 0x1234567ull, 777, 0.02f));
  ASSERT_OK(gpu_->RandomNormal(x.g(), n, 0x1234567ull, 777, 0.02f));
  const std::vector<float> c = Cpu(x), g = Gpu(x);
  // logf and cosf differ by an ulp or two between CUDA and glibc; the uniforms are
  // the same bits. The absolute floor covers cos near its zeros.
  ExpectElementwise("random normal", c, g, 1e-5, 2e-8);
  double mean = 0, var = 0;
  for (float v : g) mean += v;
  mean /= n;
  for (float v : g) var += (v - mean) * (v - mean);
  var /= n;
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(var), 0.02, 1e-4);
}

TEST_F(NnCudaTest, AdamWMatchesBitForBit) {
  const int64_t n = 100003;
  Dual p = Floats(Normal(n, 3)), g = Floats(Normal(n, 4, 1e-2f)), m = Floats(Normal(n, 5, 1e-3f)),
       v = Floats(std::vector<float>(n, 1e-5f));
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK(cpu_->AdamW(p.c(), g.c(), m.c(), v.c(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step * 7, 0.5f));
    ASSERT_OK(gpu_->AdamW(p.g(), g.g(), m.g(), v.g(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step * 7, 0.5f));
  }
  // The same fp32 operations (IEEE division and sqrt, no FMA) and the same bias
  // corrections: bit for bit.
  ExpectBits("adamw param", Cpu(p), Gpu(p));
  ExpectBits("adamw m", Cpu(m), Gpu(m));
  ExpectBits("adamw v", Cpu(v), Gpu(v));
}

// The optimizer's one-launch form: tensors of sizes around its 4096-element
// chunks, each with its own decay, give the bits of one AdamW call per tensor
// (on the GPU and on the CPU). Asked for them, both give each tensor's sum of
// squared deltas (the update ratio's numerator) to double rounding.
TEST_F(NnCudaTest, AdamWTensorsMatchesOneCallPerTensor) {
  const std::vector<int64_t> sizes = {1, 0, 4095, 4096, 4097, 100003, 3};
  std::vector<Dual> p1, p2, g, m1, m2, v1, v2;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = std::max<int64_t>(1, sizes[i]);
    for (auto* list : {&p1, &p2}) list->push_back(Floats(Normal(n, 30 + i)));
    g.push_back(Floats(Normal(n, 40 + i, 1e-2f)));
    for (auto* list : {&m1, &m2}) list->push_back(Floats(Normal(n, 50 + i, 1e-3f)));
    for (auto* list : {&v1, &v2}) list->push_back(Floats(std::vector<float>(n, 1e-5f)));
  }
  std::vector<double> cpu_delta, gpu_delta;
  std::vector<std::vector<float>> params_before;
  for (int step = 1; step <= 3; ++step) {
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool on_gpu = be == gpu_.get();
      auto f = [&](const Dual& d) { return on_gpu ? d.g() : d.c(); };
      std::vector<AdamWTensor> tensors;
      if (on_gpu && step == 3) {
        params_before.clear();
        for (const Dual& d : p2) params_before.push_back(Gpu(d));
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        const float wd = i % 2 == 0 ? 0.1f : 0.0f;
        ASSERT_OK(be->AdamW(f(p1[i]), f(g[i]), f(m1[i]), f(v1[i]), sizes[i], 6e-4f, 0.9f, 0.95f, 1e-8f, wd,
                            step * 5, 0.5f));
        tensors.push_back(AdamWTensor{f(p2[i]), f(g[i]), f(m2[i]), f(v2[i]), sizes[i], wd});
      }
      std::vector<double>* delta = step < 3 ? nullptr : on_gpu ? &gpu_delta : &cpu_delta;
      ASSERT_OK(be->AdamWTensors(tensors, 6e-4f, 0.9f, 0.95f, 1e-8f, step * 5, 0.5f, delta));
    }
  }
  ASSERT_EQ(gpu_delta.size(), sizes.size());
  ASSERT_EQ(cpu_delta.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<float> after = Gpu(p2[i]);
    double want = 0.0;
    for (int64_t j = 0; j < sizes[i]; ++j) {
      const double d = static_cast<double>(params_before[i][static_cast<size_t>(j)] - after[static_cast<size_t>(j)]);
      want += d * d;
    }
    SCOPED_TRACE("delta of tensor " + std::to_string(i));
    if (sizes[i] == 0) {
      EXPECT_EQ(gpu_delta[i], 0.0);
      EXPECT_EQ(cpu_delta[i], 0.0);
      continue;
    }
    EXPECT_GT(want, 0.0);
    EXPECT_NEAR(gpu_delta[i], want, 1e-12 * want);
    EXPECT_NEAR(cpu_delta[i], want, 1e-12 * want);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i) + " of " + std::to_string(sizes[i]));
    ExpectBits("gpu param", Gpu(p1[i]), Gpu(p2[i]));
    ExpectBits("gpu m", Gpu(m1[i]), Gpu(m2[i]));
    ExpectBits("gpu v", Gpu(v1[i]), Gpu(v2[i]));
    ExpectBits("cpu vs gpu param", Cpu(p2[i]), Gpu(p2[i]));
  }
  // A null pointer names the tensor and changes nothing before it.
  std::vector<AdamWTensor> bad = {AdamWTensor{p2[0].g(), g[0].g(), m2[0].g(), v2[0].g(), 1, 0.0f},
                                  AdamWTensor{nullptr, g[1].g(), m2[1].g(), v2[1].g(), 5, 0.0f}};
  const std::vector<float> before = Gpu(p2[0]);
  const Status s = gpu_->AdamWTensors(bad, 6e-4f, 0.9f, 0.95f, 1e-8f, 9, 0.5f, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor 1"), std::string::npos) << s.message();
  ExpectBits("untouched after a refused call", before, Gpu(p2[0]));
}

TEST_F(NnCudaTest, ReductionsMatchInDouble) {
  const std::vector<int64_t> sizes = {0, 1, 1000, 65536, 65537, 300001};
  std::vector<Dual> a, b;
  std::vector<Span> sa_c, sa_g, sb_c, sb_g;
  for (size_t i = 0; i < sizes.size(); ++i) {
    a.push_back(Floats(Normal(std::max<int64_t>(1, sizes[i]), 10 + i)));
    b.push_back(Floats(Normal(std::max<int64_t>(1, sizes[i]), 20 + i)));
    sa_c.push_back(Span{a.back().c(), sizes[i]});
    sa_g.push_back(Span{a.back().g(), sizes[i]});
    sb_c.push_back(Span{b.back().c(), sizes[i]});
    sb_g.push_back(Span{b.back().g(), sizes[i]});
  }
  std::vector<double> c, g;
  // Double sums of fp32 terms in different orders: ~1e-16 relative of the sum of
  // magnitudes; 1e-12 of that leaves room for cancellation.
  auto expect = [&](const char* what, const std::vector<double>& scale) {
    ASSERT_EQ(c.size(), g.size());
    for (size_t i = 0; i < c.size(); ++i)
      EXPECT_NEAR(c[i], g[i], 1e-12 * scale[i] + 1e-300) << what << " span " << i;
  };
  std::vector<double> magnitude;
  ASSERT_OK(cpu_->SumSquares(sa_c, &c));
  ASSERT_OK(gpu_->SumSquares(sa_g, &g));
  magnitude = c;
  expect("sum of squares", magnitude);
  ASSERT_OK(cpu_->Sums(sa_c, &c));
  ASSERT_OK(gpu_->Sums(sa_g, &g));
  expect("sums", magnitude);
  ASSERT_OK(cpu_->Dots(sa_c, sb_c, &c));
  ASSERT_OK(gpu_->Dots(sa_g, sb_g, &g));
  expect("dots", magnitude);
  EXPECT_EQ(g[0], 0.0);
}

// ============================================================================
// Quantization
// ============================================================================

TEST_F(NnCudaTest, QuantizeDequantizeIsBitExact) {
  const int64_t rows = 96, cols = 160;
  std::vector<float> host = WithOutliers(rows * cols, 31);
  host[5] = std::numeric_limits<float>::quiet_NaN();  // one NaN block in MX, NaN tensor in NVFP4 / FP8
  Dual x = Floats(host), out = Zeros(rows * cols);
  std::vector<std::pair<std::string, OperandFormat>> formats;
  const QuantFormat all[] = {QuantFormat::kMxfp8E4M3, QuantFormat::kMxfp8E5M2, QuantFormat::kMxfp6E3M2,
                             QuantFormat::kMxfp6E2M3, QuantFormat::kMxfp4,     QuantFormat::kNvfp4,
                             QuantFormat::kFp8E4M3,   QuantFormat::kFp8E5M2,   QuantFormat::kBf16};
  for (QuantFormat f : all) {
    for (Rounding r : {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic}) {
      if (f == QuantFormat::kNvfp4 && r == Rounding::kNearestAway) continue;
      OperandFormat of = Quant(f, r);
      formats.push_back({std::string(QuantFormatName(f)) + " " + RoundingName(r), of});
    }
  }
  OperandFormat tiles = Quant(QuantFormat::kNvfp4);
  tiles.tile_16x16 = true;
  formats.push_back({"nvfp4 16x16", tiles});
  OperandFormat block16 = Quant(QuantFormat::kMxfp8E4M3);
  block16.mx_block = 16;
  block16.bump_exponent = true;
  formats.push_back({"mxfp8_e4m3 block 16 bump", block16});
  for (int nan = 0; nan < 2; ++nan) {
    std::vector<float> input = host;
    if (nan == 0) input[5] = 1.5f;
    Set(x, input);
    for (const auto& f : formats) {
      for (int axis = 0; axis < 2; ++axis) {
        const std::string what = f.first + " axis " + std::to_string(axis) + (nan ? " with NaN" : "");
        ASSERT_OK(cpu_->QuantizeDequantize(x.c(), rows, cols, axis, f.second, 99, out.c()));
        ASSERT_OK(gpu_->QuantizeDequantize(x.g(), rows, cols, axis, f.second, 99, out.g()));
        // The quantizers are bit-identical (cuda_quant_test): no tolerance.
        ExpectBits(what, Cpu(out), Gpu(out));
      }
    }
  }
  // In place (out == x) on both.
  Set(x, host);
  ASSERT_OK(cpu_->QuantizeDequantize(x.c(), rows, cols, 1, Quant(QuantFormat::kMxfp4), 5, x.c()));
  ASSERT_OK(gpu_->QuantizeDequantize(x.g(), rows, cols, 1, Quant(QuantFormat::kMxfp4), 5, x.g()));
  ExpectBits("mxfp4 in place", Cpu(x), Gpu(x));
}

// DeviceOutputs::out_without_tensor_scale: the output times the tensor scale is
// the reference's dequantized value, bit for bit, and the bf16 output is exact.
TEST_F(NnCudaTest, OutputWithoutTensorScaleTimesScaleIsReference) {
  const int64_t rows = 64, cols = 128, n = rows * cols;
  const std::vector<float> x = WithOutliers(n, 41);
  void *dx = nullptr, *dout = nullptr, *dscale = nullptr;
  ASSERT_OK(CudaMalloc(&dx, n * 4));
  ASSERT_OK(CudaMalloc(&dout, n * 4));
  ASSERT_OK(CudaMalloc(&dscale, 16));
  ASSERT_OK(CudaMemcpyToDevice(dx, x.data(), n * 4));
  for (int fmt = 0; fmt < 3; ++fmt) {
    for (DType out_type : {DType::kF32, DType::kBF16}) {
      DeviceOutputs o;
      o.out = dout;
      o.out_dtype = out_type;
      o.tensor_scale = static_cast<float*>(dscale);
      o.out_without_tensor_scale = true;
      std::vector<float> ref(n);
      std::string what;
      if (fmt == 0) {
        Nvfp4Options options;
        options.tile_16x16 = true;
        ASSERT_OK(Nvfp4QuantizeCuda(dx, DType::kF32, rows, cols, options, nullptr, o, nullptr));
        ASSERT_OK(Nvfp4QuantizeRef(x.data(), rows, cols, options, ref.data(), nullptr, nullptr, nullptr));
        what = "nvfp4";
      } else if (fmt == 1) {
        Nvfp4Options options;
        options.axis = 0;
        options.rht = true;
        options.rounding = Rounding::kStochastic;
        options.seed = 3;
        ASSERT_OK(Nvfp4QuantizeCuda(dx, DType::kF32, rows, cols, options, nullptr, o, nullptr));
        ASSERT_OK(Nvfp4QuantizeRef(x.data(), rows, cols, options, ref.data(), nullptr, nullptr, nullptr));
        what = "nvfp4 axis 0 rht sr";
      } else {
        ASSERT_OK(Fp8TensorQuantizeCuda(dx, DType::kF32, n, ElemFormat::kE5M2, Rounding::kNearestEven, 0, nullptr, o,
                                        nullptr));
        ASSERT_OK(Fp8TensorQuantizeRef(x.data(), n, ElemFormat::kE5M2, Rounding::kNearestEven, 0, ref.data(), nullptr,
                                       nullptr));
        what = "fp8 e5m2";
      }
      ASSERT_OK(CudaSynchronize());
      std::vector<float> got(n);
      if (out_type == DType::kF32) {
        ASSERT_OK(CudaMemcpyToHost(got.data(), dout, n * 4));
      } else {
        std::vector<uint16_t> bits(n);
        ASSERT_OK(CudaMemcpyToHost(bits.data(), dout, n * 2));
        for (int64_t i = 0; i < n; ++i) got[i] = Bf16ToFloat(bits[i]);
        what += " bf16";
      }
      float scale = 0.0f;
      ASSERT_OK(CudaMemcpyToHost(&scale, dscale, 4));
      for (float& v : got) v = v * scale;  // the reference's (q * sf) * S_dec, code * (1 / scale)
      ExpectBits(what + " out * tensor_scale", ref, got);
    }
  }
  CudaFree(dx);
  CudaFree(dout);
  CudaFree(dscale);
}

// ============================================================================
// Linear layer
// ============================================================================

struct LinearShape {
  int64_t rows, in, out;
};

TEST_F(NnCudaTest, LinearMatchesCpuForEveryScheme) {
  for (const LinearShape& shape : {LinearShape{512, 768, 1024}, LinearShape{100, 72, 40}}) {
    const int64_t rows = shape.rows, in = shape.in, out = shape.out;
    // The bias sits 16 bytes into its buffer, as in the models' packed parameters;
    // in the odd shape x starts 4 bytes in (not 16-byte aligned): the quantizers then
    // work on an aligned copy and the fp32 GEMM takes x as it is.
    const int64_t x_offset = rows % 16 == 0 ? 0 : 1;
    Dual x = Floats(WithOutliers(rows * in + x_offset, 51)), w = Floats(WithOutliers(out * in, 52, 0.05f)),
         bias = Floats(Normal(out + 4, 53)), dy = Floats(WithOutliers(rows * out, 54, 1e-3f));
    Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in), db = Zeros(out);
    const std::vector<float> dw0 = Normal(out * in, 55, 1e-3f), db0 = Normal(out, 56, 1e-3f);
    const bool mult16 = rows % 16 == 0 && in % 16 == 0 && out % 16 == 0;
    for (const Scheme& s : Schemes()) {
      if (s.needs_16 && !mult16) continue;
      const std::string what = s.name + " " + std::to_string(rows) + "x" + std::to_string(in) + "->" +
                               std::to_string(out);
      SCOPED_TRACE(what);
      std::printf("%s\n", what.c_str());
      LinearQuant q = s.q;
      q.seed = 0xABCDEF;
      q.stats_slot = 1;
      Set(dw, dw0);
      Set(db, db0);
      for (Backend* be : {cpu_.get(), gpu_.get()}) {
        const bool g = be == gpu_.get();
        auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
        ASSERT_OK(be->ResetOperandStats(2));
        ASSERT_OK(be->LinearForward(p(x) + x_offset, p(w), p(bias) + 4, nullptr, p(y), rows, in, out, q));
        ASSERT_OK(be->LinearBackward(p(x) + x_offset, p(w), p(dy), p(dx), p(dw), p(db), rows, in, out, q));
      }
      // Identical rounded operands and alpha, fp32 sums in another order: 1e-5 normwise.
      ExpectNormwise("y", Cpu(y), Gpu(y), 1e-5);
      ExpectNormwise("dx", Cpu(dx), Gpu(dx), 1e-5);
      ExpectNormwise("dw (+=)", Cpu(dw), Gpu(dw), 1e-5);
      ExpectNormwise("dbias (+=)", Cpu(db), Gpu(db), 1e-5);
      std::vector<OperandStats> sc, sg;
      ASSERT_OK(cpu_->ReadOperandStats(&sc));
      ASSERT_OK(gpu_->ReadOperandStats(&sg));
      ExpectStatsEqual(s.name, sc, sg);
      int64_t saturated = 0;
      for (const OperandStats& st : sg) saturated += st.saturated;
      std::printf("  stats equal (saturated elements over the roles: %lld)\n", static_cast<long long>(saturated));
    }
  }
}

// The residual in LinearForward, every scheme, with and without a bias, against
// the CPU's (acc + bias) + residual. The GPU adds the three terms in cuBLASLt's
// epilogue order, (alpha acc + residual) + bias: another order of an fp32 sum,
// so the GEMM tolerance, 1e-5 normwise. A residual scaled by alpha (the NVFP4 /
// FP8 decode scales) or dropped would be off by O(1). In the odd shape the
// residual starts 4 bytes in, so cuBLASLt reads C less aligned than it writes D.
TEST_F(NnCudaTest, LinearResidualMatchesCpu) {
  for (const LinearShape& shape : {LinearShape{512, 768, 1024}, LinearShape{100, 72, 40}}) {
    const int64_t rows = shape.rows, in = shape.in, out = shape.out;
    const int64_t offset = rows % 16 == 0 ? 0 : 1;
    Dual x = Floats(WithOutliers(rows * in + offset, 251)), w = Floats(WithOutliers(out * in, 252, 0.05f)),
         bias = Floats(Normal(out + 4, 253)), residual = Floats(Normal(rows * out + offset, 254));
    Dual y = Zeros(rows * out);
    const bool mult16 = rows % 16 == 0 && in % 16 == 0 && out % 16 == 0;
    for (const Scheme& s : Schemes()) {
      if (s.needs_16 && !mult16) continue;
      for (bool with_bias : {true, false}) {
        const std::string what = s.name + (with_bias ? " bias" : " no bias") + " " + std::to_string(rows) + "x" +
                                 std::to_string(in) + "->" + std::to_string(out);
        SCOPED_TRACE(what);
        std::printf("%s\n", what.c_str());
        LinearQuant q = s.q;
        q.seed = 0x5EED;
        for (Backend* be : {cpu_.get(), gpu_.get()}) {
          const bool g = be == gpu_.get();
          auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
          ASSERT_OK(be->Fill(p(y), rows * out, 7.0f));  // y is written, not added to
          ASSERT_OK(be->LinearForward(p(x) + offset, p(w), with_bias ? p(bias) + 4 : nullptr, p(residual) + offset,
                                      p(y), rows, in, out, q));
        }
        ExpectNormwise("y = (x.w^T + bias) + residual", Cpu(y), Gpu(y), 1e-5);
      }
    }
  }
  Dual x = Floats(Normal(32 * 32, 255)), w = Floats(Normal(32 * 32, 256)), y = Zeros(32 * 32);
  const Status refused = gpu_->LinearForward(x.g(), w.g(), nullptr, y.g(), y.g(), 32, 32, 32, LinearQuant{});
  EXPECT_FALSE(refused.ok());
  std::printf("  residual == y: %s\n", refused.message().c_str());
}

// What one GPU LinearBackward gives: its outputs and the operand statistics.
struct BackwardResult {
  std::vector<float> dx, dw, db;
  std::vector<OperandStats> stats;
};

// The schemes under which the CUDA backend sums dbias in the bf16 rounding of dy
// (the dgrad's, or the wgrad's when the dgrad's dy is not bf16 or there is no
// dx), each with a name; every other scheme sums it with ColumnSums.
std::vector<Scheme> FusedDbiasSchemes() {
  std::vector<Scheme> s;
  s.push_back({"bf16 (dy rounded once, reused by the wgrad)", AllRoles(Quant(QuantFormat::kBf16))});
  s.push_back({"bf16 nearest_away", AllRoles(Quant(QuantFormat::kBf16, Rounding::kNearestAway))});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
    q.role[R(Role::kDgradDy)].rounding = Rounding::kStochastic;
    q.role[R(Role::kWgradDy)].rounding = Rounding::kStochastic;
    s.push_back({"bf16, stochastic dy (rounded twice)", q});
  }
  {
    LinearQuant q;  // a bf16 dy beside an fp32 w: the rounding writes fp32 values
    q.role[R(Role::kDgradDy)] = Quant(QuantFormat::kBf16);
    s.push_back({"bf16 dgrad_dy, fp32 elsewhere", q});
  }
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));  // the wgrad's dy carries it
    q.role[R(Role::kWgradDy)] = Quant(QuantFormat::kBf16, Rounding::kStochastic);
    q.role[R(Role::kWgradX)] = Quant(QuantFormat::kBf16);
    s.push_back({"mxfp8 dgrad, bf16 wgrad", q});
  }
  // MX dgrad dy along rows carries dbias itself when out % 32 == 0 (the blocks are
  // whole warps); other widths take ColumnSums.
  s.push_back({"mxfp8_e4m3 nearest_away (the preset's rounding)",
               AllRoles(Quant(QuantFormat::kMxfp8E4M3, Rounding::kNearestAway))});
  s.push_back({"mxfp8_e5m2", AllRoles(Quant(QuantFormat::kMxfp8E5M2))});
  s.push_back({"mxfp4", AllRoles(Quant(QuantFormat::kMxfp4))});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp6E3M2, Rounding::kNearestAway));
    for (OperandFormat& f : q.role) f.bump_exponent = true;
    s.push_back({"mxfp6_e3m2 nearest_away, bump exponent", q});
  }
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp6E2M3));
    q.role[R(Role::kDgradDy)].rounding = Rounding::kStochastic;  // not fused: ColumnSums
    s.push_back({"mxfp6_e2m3, stochastic dgrad dy", q});
  }
  return s;
}

class NnCudaDbiasTest : public NnCudaTest {
 protected:
  // LinearBackward on the GPU from dw0 / db0 (db null: no dbias), with_dx false
  // passes no dx; statistics in slot 0.
  BackwardResult Backward(const Dual& x, const Dual& w, const Dual& dy, const std::vector<float>& dw0,
                          const std::vector<float>& db0, bool with_db, bool with_dx, int64_t rows, int64_t in,
                          int64_t out, LinearQuant q) {
    BackwardResult r;
    Dual dx = Zeros(rows * in), dw = Floats(dw0), db = Floats(db0);
    q.seed = 0xD1A5;
    q.stats_slot = 0;
    EXPECT_TRUE(gpu_->ResetOperandStats(1).ok());
    const Status s = gpu_->LinearBackward(x.g(), w.g(), dy.g(), with_dx ? dx.g() : nullptr, dw.g(),
                                          with_db ? db.g() : nullptr, rows, in, out, q);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(gpu_->ReadOperandStats(&r.stats).ok());
    r.dx = Gpu(dx);
    r.dw = Gpu(dw);
    r.db = Gpu(db);
    return r;
  }

  // For each fused scheme: dbias has the bits of the ColumnSums path (the fp32
  // scheme), and dx, dw and the statistics have the bits of the same scheme
  // without dbias (where dy is rounded by the plain bf16 quantizer).
  void ExpectFusedDbiasBits(const std::vector<float>& dy_host, int64_t rows, int64_t in, int64_t out) {
    Dual x = Floats(WithOutliers(rows * in, 261)), w = Floats(Normal(out * in, 262, 0.05f)), dy = Floats(dy_host);
    const std::vector<float> dw0 = Normal(out * in, 263, 1e-3f), db0 = Normal(out, 264, 1e-3f);
    const BackwardResult reference = Backward(x, w, dy, dw0, db0, true, true, rows, in, out, LinearQuant{});
    for (const Scheme& s : FusedDbiasSchemes()) {
      for (bool with_dx : {true, false}) {
        const std::string what = s.name + (with_dx ? "" : ", no dx") + ", rows " + std::to_string(rows) + ", out " +
                                 std::to_string(out);
        SCOPED_TRACE(what);
        std::printf("%s\n", what.c_str());
        const BackwardResult fused = Backward(x, w, dy, dw0, db0, true, with_dx, rows, in, out, s.q);
        const BackwardResult plain = Backward(x, w, dy, dw0, db0, false, with_dx, rows, in, out, s.q);
        ExpectBits("dbias vs ColumnSums", reference.db, fused.db);
        ExpectBits("dbias untouched without dbias", db0, plain.db);
        if (with_dx) ExpectBits("dx vs no dbias", plain.dx, fused.dx);
        ExpectBits("dw vs no dbias", plain.dw, fused.dw);
        ExpectStatsEqual(what, plain.stats, fused.stats);
      }
    }
  }
};

// dbias summed in the bf16 rounding pass of dy: the bits ColumnSums gives, for
// row counts that are not a multiple of the 64-row chunk or of the 8 rows a
// thread strides (and 8200 rows: 128 chunks of 65), and column counts that are
// not a multiple of 4 or of the 32 columns of a block; the rounded dy (seen
// through dx and dw) and the statistics are those of the plain bf16 quantizer.
TEST_F(NnCudaDbiasTest, LinearFusedDbiasIsBitIdenticalToColumnSums) {
  struct Shape {
    int64_t rows, in, out;
  };
  for (const Shape& k : {Shape{512, 64, 768}, Shape{100, 48, 37}, Shape{1000, 40, 771}, Shape{8200, 32, 70},
                         Shape{7, 16, 3}, Shape{1, 8, 5}, Shape{1000, 40, 96}, Shape{8200, 32, 64},
                         Shape{7, 16, 32}}) {
    ExpectFusedDbiasBits(WithOutliers(k.rows * k.out, 265, 1e-3f), k.rows, k.in, k.out);
  }
}

// Inf and NaN in dy: dbias has ColumnSums' bits (Inf with its sign, NaN where
// +Inf meets -Inf or a NaN, any NaN equal to any NaN) and the CPU's NaN-ness and
// infinities; the statistics' NaN blocks are those of the plain quantizer.
TEST_F(NnCudaDbiasTest, LinearFusedDbiasWithNonFiniteDy) {
  const int64_t rows = 300, in = 24, out = 45;
  std::vector<float> dyh = WithOutliers(rows * out, 271, 1e-3f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  dyh[5 * out + 0] = inf;                           // column 0: +Inf
  dyh[290 * out + 1] = -inf;                        // column 1: -Inf
  dyh[3 * out + 2] = inf;                           // column 2: +Inf - Inf = NaN
  dyh[200 * out + 2] = -inf;
  dyh[64 * out + 33] = nan;                         // column 33: NaN (second block of columns)
  dyh[299 * out + 44] = std::numeric_limits<float>::max();  // column 44: overflows to +Inf with the next
  dyh[298 * out + 44] = std::numeric_limits<float>::max();
  ExpectFusedDbiasBits(dyh, rows, in, out);
  {
    // The same values 64 columns wide, where MX dgrad dy carries dbias: a NaN
    // block, Inf blocks, and the overflowing column.
    const int64_t out64 = 64;
    std::vector<float> wide = WithOutliers(rows * out64, 274, 1e-3f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) wide[r * out64 + o] = dyh[r * out + o];
    }
    ExpectFusedDbiasBits(wide, rows, in, out64);
  }

  // Against the CPU: the same columns are NaN, the same are +-Inf.
  Dual x = Floats(Normal(rows * in, 272)), w = Floats(Normal(out * in, 273)), dy = Floats(dyh);
  Dual dx = Zeros(rows * in), dw = Zeros(out * in), db = Zeros(out);
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    ASSERT_OK(be->LinearBackward(p(x), p(w), p(dy), p(dx), p(dw), p(db), rows, in, out,
                                 AllRoles(Quant(QuantFormat::kBf16))));
  }
  const std::vector<float> c = Cpu(db), g = Gpu(db);
  int64_t nonfinite = 0;
  for (int64_t o = 0; o < out; ++o) {
    EXPECT_EQ(std::isnan(c[o]), std::isnan(g[o])) << "column " << o;
    if (std::isinf(c[o]) || std::isinf(g[o])) {
      EXPECT_EQ(c[o], g[o]) << "column " << o;
    }
    nonfinite += std::isfinite(g[o]) ? 0 : 1;
  }
  EXPECT_EQ(nonfinite, 5);
}

// A CUDA backend made while the environment variable `var` is `value` (the backend reads it once).
std::unique_ptr<Backend> BackendUnder(const char* var, const char* value) {
  std::unique_ptr<Backend> b;
  setenv(var, value, 1);
  const Status s = MakeCudaBackend(&b);
  unsetenv(var);
  EXPECT_TRUE(s.ok()) << s.message();
  return b;
}
// A CUDA backend with every fusion KEEL_CUDA_OFF names turned off: the kernels
// they replace, pass by pass.
std::unique_ptr<Backend> BackendWithout(const char* off) { return BackendUnder("KEEL_CUDA_OFF", off); }
std::unique_ptr<Backend> BackendWithoutMxTiles() { return BackendWithout("dy_one_pass,mx_cols_tiles"); }
// A CUDA backend with the experiments `on` turned on (KEEL_CUDA_ON).
std::unique_ptr<Backend> BackendWith(const char* on) { return BackendUnder("KEEL_CUDA_ON", on); }

// The calls of the parts of a profile named `part`.
int64_t Calls(const std::vector<OpTime>& profile, const std::string& part) {
  int64_t calls = 0;
  for (const OpTime& t : profile) {
    if (t.op.find(part) != std::string::npos) calls += t.calls;
  }
  return calls;
}

// Whether the profile of one call shows a part named `part`.
bool Ran(const std::vector<OpTime>& profile, const std::string& part) { return Calls(profile, part) > 0; }


// LayerNormBackward's one kernel for dx and the dgamma / dbeta partials against
// its two kernels (ln_backward_fused off), the same chunks of 32 rows: dx (added
// to a nonzero dx), dgamma and dbeta bit for bit, for widths of
// 128 .. 768 columns and row counts that leave a partial chunk or idle warps,
// with Inf and NaN in dy; a width that is not whole 128-column groups, or above
// 768, keeps the two kernels (the profile shows which ran).
TEST_F(NnCudaTest, LayerNormBackwardInOnePassGivesTheBitsOfTwoKernels) {
  std::unique_ptr<Backend> two = BackendWithout("ln_backward_fused");
  ASSERT_TRUE(two != nullptr);
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape& k : {Shape{16384, 768}, Shape{100, 128}, Shape{7, 1024}, Shape{2048, 384}, Shape{37, 800}}) {
    const int64_t rows = k.rows, cols = k.cols;
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    std::vector<float> dyh = WithOutliers(rows * cols, 301, 1e-2f);
    dyh[cols + 5] = std::numeric_limits<float>::infinity();
    if (rows > 3) dyh[3 * cols + 7] = std::numeric_limits<float>::quiet_NaN();
    Dual x = Floats(WithOutliers(rows * cols, 302)), gamma = Floats(Normal(cols, 303)), dy = Floats(dyh);
    std::vector<float> rstd_h = Normal(rows, 305, 0.3f);
    for (float& v : rstd_h) v = 1.0f + std::fabs(v);  // a row's 1 / std: positive
    Dual mean = Floats(Normal(rows, 304, 0.1f)), rstd = Floats(rstd_h);
    const std::vector<float> dx0 = Normal(rows * cols, 306);
    std::vector<float> r[2][3];
    std::vector<OpTime> profile;
    for (int b = 0; b < 2; ++b) {
      Backend* be = b == 0 ? gpu_.get() : two.get();
      Dual dx = Floats(dx0), dgamma = Floats(Normal(cols, 307)), dbeta = Floats(Normal(cols, 308));
      if (b == 0) ASSERT_OK(be->SetProfiling(true));
      ASSERT_OK(be->LayerNormBackward(x.g(), gamma.g(), mean.g(), rstd.g(), dy.g(), dx.g(), dgamma.g(), dbeta.g(), rows,
                                      cols));
      if (b == 0) {
        ASSERT_OK(be->TakeProfile(&profile));
        ASSERT_OK(be->SetProfiling(false));
      }
      ASSERT_OK(be->Sync());
      r[b][0] = Get(be, dx.g(), dx.bytes);
      r[b][1] = Get(be, dgamma.g(), dgamma.bytes);
      r[b][2] = Get(be, dbeta.g(), dbeta.bytes);
    }
    EXPECT_EQ(Ran(profile, "dx and parameters in one pass"), cols % 128 == 0 && cols <= 768);
    ExpectBits("dx", r[1][0], r[0][0]);
    ExpectBits("dgamma", r[1][1], r[0][1]);
    ExpectBits("dbeta", r[1][2], r[0][2]);
  }
}

TEST_F(NnCudaTest, KeelCudaOffRefusesAnUnknownName) {
  std::unique_ptr<Backend> b;
  setenv("KEEL_CUDA_OFF", "dy_one_pass,no_such_fusion", 1);
  const Status s = MakeCudaBackend(&b);
  unsetenv("KEEL_CUDA_OFF");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("KEEL_CUDA_OFF: unknown 'no_such_fusion' (allowed: a comma-separated list of "
                             "dy_one_pass, mx_cols_tiles, ln_backward_fused, mx_tiles_prefetch, held_weight, kept_heads)"),
            std::string::npos)
      << s.message();
}

// MX down columns by the tile kernel (QuantizeMxDownColumnsInTiles, which
// Quantize picks for block 32, nearest rounding, rows % 32 == 0, cols % 4 == 0)
// against MxColsKernel: the same bits, for every MX element format, both
// roundings, the bump rule, NaN and Inf blocks, widths that are not a multiple
// of 128 or 32, and many row chunks; other shapes and roundings keep MxColsKernel.
// The tile kernel with and without its loads a group ahead (mx_tiles_prefetch).
TEST_F(NnCudaTest, MxDownColumnsInTilesGivesTheQuantizersBits) {
  std::unique_ptr<Backend> reference = BackendWithoutMxTiles();
  ASSERT_TRUE(reference != nullptr);
  std::unique_ptr<Backend> no_prefetch = BackendWithout("mx_tiles_prefetch");  // the tile kernel one group at a time
  ASSERT_TRUE(no_prefetch != nullptr);
  std::vector<std::pair<std::string, OperandFormat>> formats;
  for (QuantFormat f : {QuantFormat::kMxfp8E4M3, QuantFormat::kMxfp8E5M2, QuantFormat::kMxfp6E3M2,
                        QuantFormat::kMxfp6E2M3, QuantFormat::kMxfp4}) {
    for (Rounding r : {Rounding::kNearestEven, Rounding::kNearestAway, Rounding::kStochastic}) {
      formats.push_back({std::string(QuantFormatName(f)) + " " + RoundingName(r), Quant(f, r)});
    }
  }
  OperandFormat bump = Quant(QuantFormat::kMxfp6E3M2, Rounding::kNearestAway);
  bump.bump_exponent = true;
  formats.push_back({"mxfp6_e3m2 nearest_away bump", bump});
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape& k : {Shape{32, 4}, Shape{64, 36}, Shape{96, 160}, Shape{8192, 768}, Shape{40, 64}}) {
    std::vector<float> host = WithOutliers(k.rows * k.cols, 291);
    host[(k.rows / 2) * k.cols + 1] = std::numeric_limits<float>::quiet_NaN();
    host[3 * k.cols + k.cols - 1] = std::numeric_limits<float>::infinity();
    host[k.cols] = 3.0e38f;
    Dual x = Floats(host), out = Zeros(k.rows * k.cols);
    for (const auto& f : formats) {
      const std::string what = f.first + ", " + std::to_string(k.rows) + " x " + std::to_string(k.cols);
      SCOPED_TRACE(what);
      ASSERT_OK(gpu_->SetProfiling(true));
      ASSERT_OK(gpu_->QuantizeDequantize(x.g(), k.rows, k.cols, 0, f.second, 7, out.g()));
      std::vector<OpTime> profile;
      ASSERT_OK(gpu_->TakeProfile(&profile));
      ASSERT_OK(gpu_->SetProfiling(false));
      const std::vector<float> tiles = Gpu(out);
      ASSERT_OK(no_prefetch->QuantizeDequantize(x.g(), k.rows, k.cols, 0, f.second, 7, out.g()));
      ASSERT_OK(no_prefetch->Sync());
      const std::vector<float> tiles_one_group = Get(no_prefetch.get(), out.g(), out.bytes);
      ASSERT_OK(reference->QuantizeDequantize(x.g(), k.rows, k.cols, 0, f.second, 7, out.g()));
      ASSERT_OK(reference->Sync());
      const std::vector<float> columns = Get(reference.get(), out.g(), out.bytes);
      ExpectBits("down columns", columns, tiles);
      ExpectBits("down columns, no prefetch", columns, tiles_one_group);
      EXPECT_EQ(Ran(profile, "mx down columns in tiles"), f.second.rounding != Rounding::kStochastic &&
                                                             k.rows % 32 == 0);
    }
  }
}

// LinearBackward's MX dy for both GEMMs in one read (the dgrad's along rows,
// the wgrad's down columns, dbias with them) against the two passes it replaces
// (BackendWithoutMxTiles): dx, dw, dbias and the statistics
// bit for bit, for every MX element format, both nearest roundings, the bump
// rule, a NaN block and Inf blocks in dy, partial 128-column blocks (out 96), and
// with and without dbias and dx. The profile shows which path ran: one pass
// where MxBothAxesInOnePass allows it, two passes otherwise (rows 96: chunks of
// 48 rows; a stochastic dgrad dy; mixed formats).
TEST_F(NnCudaTest, LinearDyInOnePassGivesTheBitsOfTwoPasses) {
  std::unique_ptr<Backend> two_pass = BackendWithoutMxTiles();
  ASSERT_TRUE(two_pass != nullptr);
  struct Case {
    std::string name;
    LinearQuant q;
    bool one_pass;  // where the shape allows it
  };
  std::vector<Case> cases;
  cases.push_back({"mxfp8_e4m3", AllRoles(Quant(QuantFormat::kMxfp8E4M3)), true});
  cases.push_back({"mxfp8_e4m3 nearest_away", AllRoles(Quant(QuantFormat::kMxfp8E4M3, Rounding::kNearestAway)), true});
  cases.push_back({"mxfp8_e5m2", AllRoles(Quant(QuantFormat::kMxfp8E5M2)), true});
  cases.push_back({"mxfp6_e2m3", AllRoles(Quant(QuantFormat::kMxfp6E2M3)), true});
  cases.push_back({"mxfp4 nearest_away", AllRoles(Quant(QuantFormat::kMxfp4, Rounding::kNearestAway)), true});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp6E3M2, Rounding::kNearestAway));
    for (OperandFormat& f : q.role) f.bump_exponent = true;
    cases.push_back({"mxfp6_e3m2 nearest_away, bump exponent", q, true});
  }
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
    q.role[R(Role::kWgradDy)] = Quant(QuantFormat::kMxfp8E5M2);
    cases.push_back({"dgrad dy e4m3, wgrad dy e5m2 (two passes)", q, false});
  }
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
    q.role[R(Role::kDgradDy)].rounding = Rounding::kStochastic;
    cases.push_back({"stochastic dgrad dy (two passes)", q, false});
  }
  struct Shape {
    int64_t rows, in, out;
  };
  for (const Shape& k : {Shape{512, 64, 768}, Shape{8192, 32, 96}, Shape{96, 32, 64}}) {
    const int64_t rows = k.rows, in = k.in, out = k.out;
    std::vector<float> dyh = WithOutliers(rows * out, 281, 1e-3f);
    const float inf = std::numeric_limits<float>::infinity();
    dyh[40 * out + 3] = std::numeric_limits<float>::quiet_NaN();  // a NaN block both ways
    dyh[70 * out + 35] = inf;                                      // Inf blocks
    dyh[71 * out + 36] = -inf;
    dyh[5 * out + 60] = 3.0e38f;                                   // saturates the narrow formats
    Dual x = Floats(WithOutliers(rows * in, 282)), w = Floats(Normal(out * in, 283, 0.05f)), dy = Floats(dyh);
    const std::vector<float> dw0 = Normal(out * in, 284, 1e-3f), db0 = Normal(out, 285, 1e-3f);
    // Whole 32-row blocks in every chunk of the column sums' split (64 rows a chunk, at most 128 chunks).
    const int64_t chunks = std::min<int64_t>(128, (rows + 63) / 64);
    const bool shape_allows = rows % 32 == 0 && ((rows + chunks - 1) / chunks) % 32 == 0;
    for (const Case& c : cases) {
      for (bool with_db : {true, false}) {
        for (bool with_dx : {true, false}) {
          const std::string what = c.name + ", rows " + std::to_string(rows) + ", out " + std::to_string(out) +
                                   (with_db ? "" : ", no dbias") + (with_dx ? "" : ", no dx");
          SCOPED_TRACE(what);
          BackwardResult r[2];
          std::vector<OpTime> profile;
          for (int b = 0; b < 2; ++b) {
            Backend* be = b == 0 ? gpu_.get() : two_pass.get();
            Dual dx = Zeros(rows * in), dw = Floats(dw0), db = Floats(db0);
            LinearQuant q = c.q;
            q.seed = 0x0E5A;
            q.stats_slot = 0;
            ASSERT_OK(be->ResetOperandStats(1));
            if (b == 0) ASSERT_OK(be->SetProfiling(true));
            ASSERT_OK(be->LinearBackward(x.g(), w.g(), dy.g(), with_dx ? dx.g() : nullptr, dw.g(),
                                         with_db ? db.g() : nullptr, rows, in, out, q));
            if (b == 0) {
              ASSERT_OK(be->TakeProfile(&profile));
              ASSERT_OK(be->SetProfiling(false));
            }
            ASSERT_OK(be->Sync());
            ASSERT_OK(be->ReadOperandStats(&r[b].stats));
            r[b].dx = Get(be, dx.g(), dx.bytes);
            r[b].dw = Get(be, dw.g(), dw.bytes);
            r[b].db = Get(be, db.g(), db.bytes);
          }
          EXPECT_EQ(Ran(profile, "quantize dy both ways"), c.one_pass && shape_allows && with_dx);
          if (with_dx) ExpectBits("dx", r[1].dx, r[0].dx);
          ExpectBits("dw", r[1].dw, r[0].dw);
          ExpectBits("dbias", r[1].db, r[0].db);
          ExpectStatsEqual(what, r[1].stats, r[0].stats);
        }
      }
    }
  }
}

// The head's chunks (Model::HeadAndLoss): with the weight held, each chunk's
// forward and backward read the quantized copies of w made for the first chunk
// (an MX w: the held forward and dgrad copies; a BF16 w: the forward's rounding,
// kept for the backward, serving every chunk's). Every output keeps the bits of
// quantizing w per chunk; w's two roles are counted once instead of once a chunk
// where the format can be held (nearest rounding, no per-tensor scale, no RHT),
// every call where it cannot, and every call under KEEL_CUDA_OFF=held_weight.
TEST_F(NnCudaTest, AHeldWeightIsQuantizedOnceWithTheBitsOfEveryChunk) {
  std::unique_ptr<Backend> not_held = BackendWithout("held_weight");
  ASSERT_TRUE(not_held != nullptr);
  struct Case {
    std::string name;
    LinearQuant q;
    bool held;
  };
  std::vector<Case> cases;
  cases.push_back({"mxfp8_e4m3", AllRoles(Quant(QuantFormat::kMxfp8E4M3)), true});
  cases.push_back({"mxfp4 nearest_away", AllRoles(Quant(QuantFormat::kMxfp4, Rounding::kNearestAway)), true});
  cases.push_back({"bf16 (w rounded by the first forward, kept for every chunk)", AllRoles(Quant(QuantFormat::kBf16)), true});
  cases.push_back({"nvfp4 recipe (per-tensor scale, RHT)", Nvfp4Recipe(), false});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
    q.role[R(Role::kFwdW)].rounding = Rounding::kStochastic;
    q.role[R(Role::kDgradW)].rounding = Rounding::kStochastic;
    cases.push_back({"mxfp8_e4m3, stochastic w", q, false});
  }
  const int64_t rows = 128, chunk = 32, in = 64, out = 96, chunks = rows / chunk;
  std::vector<float> wh = Normal(out * in, 293, 0.05f);
  wh[7 * in + 9] = 3.0e38f;  // saturates the narrow formats
  Dual x = Floats(WithOutliers(rows * in, 291)), w = Floats(wh), dy = Floats(WithOutliers(rows * out, 292, 1e-3f));
  const std::vector<float> dw0 = Normal(out * in, 294, 1e-3f);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // 0: no hold; 1: held; 2: held, on a backend with held_weight off.
    BackwardResult r[3];
    std::vector<float> y[3];
    for (int mode = 0; mode < 3; ++mode) {
      Backend* be = mode == 2 ? not_held.get() : gpu_.get();
      Dual yd = Zeros(rows * out), dx = Zeros(rows * in), dw = Floats(dw0);
      LinearQuant q = c.q;
      q.seed = 0x4E1D;
      q.stats_slot = 0;
      q.keep_slot = 0;  // as the models pass it: an MX or NVFP4 w is not kept for the backward, a BF16 one is
      ASSERT_OK(be->ResetOperandStats(1));
      if (mode > 0) ASSERT_OK(be->HoldWeight(w.g()));
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        ASSERT_OK(be->LinearForward(x.g() + r0 * in, w.g(), nullptr, nullptr, yd.g() + r0 * out, chunk, in, out, q));
        ASSERT_OK(be->LinearBackward(x.g() + r0 * in, w.g(), dy.g() + r0 * out, dx.g() + r0 * in, dw.g(), nullptr,
                                     chunk, in, out, q));
      }
      ASSERT_OK(be->HoldWeight(nullptr));
      ASSERT_OK(be->Sync());
      ASSERT_OK(be->ReadOperandStats(&r[mode].stats));
      y[mode] = Get(be, yd.g(), yd.bytes);
      r[mode].dx = Get(be, dx.g(), dx.bytes);
      r[mode].dw = Get(be, dw.g(), dw.bytes);
    }
    for (int mode = 1; mode < 3; ++mode) {
      SCOPED_TRACE(mode == 1 ? "held" : "held_weight off");
      ExpectBits("y", y[0], y[mode]);
      ExpectBits("dx", r[0].dx, r[mode].dx);
      ExpectBits("dw", r[0].dw, r[mode].dw);
    }
    ExpectStatsEqual("held_weight off", r[0].stats, r[2].stats);
    ASSERT_EQ(r[0].stats.size(), static_cast<size_t>(kRoleCount));
    ASSERT_EQ(r[1].stats.size(), static_cast<size_t>(kRoleCount));
    for (int role = 0; role < kRoleCount; ++role) {
      const OperandStats &each = r[0].stats[role], &held = r[1].stats[role];
      SCOPED_TRACE(RoleName(static_cast<Role>(role)));
      const bool once =
          c.held && (static_cast<Role>(role) == Role::kFwdW || static_cast<Role>(role) == Role::kDgradW);
      const int64_t times = once ? chunks : 1;
      EXPECT_EQ(each.elements, held.elements * times);
      EXPECT_EQ(each.saturated, held.saturated * times);
      EXPECT_EQ(each.blocks, held.blocks * times);
      EXPECT_EQ(each.nan_blocks, held.nan_blocks * times);
    }
    EXPECT_EQ(r[1].stats[R(Role::kFwdW)].elements, (c.held ? 1 : chunks) * out * in);
  }
}

// Chunks' forwards under a hold, then one backward over every row after the
// hold: the first chunk's forward rounds a BF16 w and keeps it (keep_slot), the
// later ones use that copy, and the backward takes it as an unheld backward
// does: the bits of rounding w per chunk; fwd_w counted once instead of once a
// chunk, dgrad_w once either way (the kept pair).
TEST_F(NnCudaTest, AHeldBf16WeightIsRoundedOnceForTheChunksAndKeptForTheBackward) {
  const int64_t rows = 128, chunk = 32, in = 64, out = 96, chunks = rows / chunk;
  Dual x = Floats(WithOutliers(rows * in, 295)), w = Floats(Normal(out * in, 296, 0.05f));
  Dual dy = Floats(WithOutliers(rows * out, 297, 1e-3f));
  const std::vector<float> dw0 = Normal(out * in, 298, 1e-3f);
  BackwardResult r[2];
  std::vector<float> y[2];
  for (int hold = 0; hold < 2; ++hold) {
    SCOPED_TRACE(hold ? "held" : "not held");
    Dual yd = Zeros(rows * out), dx = Zeros(rows * in), dw = Floats(dw0);
    LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
    q.stats_slot = 0;
    q.keep_slot = 0;
    ASSERT_OK(gpu_->ResetOperandStats(1));
    if (hold == 1) ASSERT_OK(gpu_->HoldWeight(w.g()));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      ASSERT_OK(gpu_->LinearForward(x.g() + r0 * in, w.g(), nullptr, nullptr, yd.g() + r0 * out, chunk, in, out, q));
    }
    ASSERT_OK(gpu_->HoldWeight(nullptr));
    ASSERT_OK(gpu_->LinearBackward(x.g(), w.g(), dy.g(), dx.g(), dw.g(), nullptr, rows, in, out, q));
    ASSERT_OK(gpu_->Sync());
    ASSERT_OK(gpu_->ReadOperandStats(&r[hold].stats));
    y[hold] = Get(gpu_.get(), yd.g(), yd.bytes);
    r[hold].dx = Get(gpu_.get(), dx.g(), dx.bytes);
    r[hold].dw = Get(gpu_.get(), dw.g(), dw.bytes);
  }
  ExpectBits("y", y[0], y[1]);
  ExpectBits("dx", r[0].dx, r[1].dx);
  ExpectBits("dw", r[0].dw, r[1].dw);
  ASSERT_EQ(r[0].stats.size(), static_cast<size_t>(kRoleCount));
  ASSERT_EQ(r[1].stats.size(), static_cast<size_t>(kRoleCount));
  for (int role = 0; role < kRoleCount; ++role) {
    SCOPED_TRACE(RoleName(static_cast<Role>(role)));
    const int64_t times = static_cast<Role>(role) == Role::kFwdW ? chunks : 1;
    EXPECT_EQ(r[0].stats[role].elements, r[1].stats[role].elements * times);
  }
  EXPECT_EQ(r[1].stats[R(Role::kFwdW)].elements, out * in);
  EXPECT_EQ(r[1].stats[R(Role::kDgradW)].elements, out * in);
}

// A BF16 w's kept copy that a backward took during a hold is not taken once
// the hold has ended: w may have changed (an optimizer step), so a backward
// after the hold rounds w afresh and gives the bits of the new w.
TEST_F(NnCudaTest, AHeldBf16WeightsCopyIsNotTakenAfterTheHold) {
  const int64_t rows = 64, in = 64, out = 96;
  Dual x = Floats(WithOutliers(rows * in, 301)), w = Floats(Normal(out * in, 302, 0.05f));
  Dual dy = Floats(WithOutliers(rows * out, 303, 1e-3f));
  const std::vector<float> w2 = Normal(out * in, 304, 0.05f);
  LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
  q.keep_slot = 0;
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  ASSERT_OK(gpu_->HoldWeight(w.g()));
  ASSERT_OK(gpu_->LinearForward(x.g(), w.g(), nullptr, nullptr, y.g(), rows, in, out, q));
  ASSERT_OK(gpu_->LinearBackward(x.g(), w.g(), dy.g(), dx.g(), dw.g(), nullptr, rows, in, out, q));
  ASSERT_OK(gpu_->HoldWeight(nullptr));
  Set(w, w2);  // the weight changes after the hold
  Dual dx_after = Zeros(rows * in), dw_after = Zeros(out * in);
  ASSERT_OK(gpu_->LinearBackward(x.g(), w.g(), dy.g(), dx_after.g(), dw_after.g(), nullptr, rows, in, out, q));
  // The reference: the same backward with nothing kept (keep_slot -1) on the new w.
  LinearQuant fresh = q;
  fresh.keep_slot = -1;
  Dual dx_ref = Zeros(rows * in), dw_ref = Zeros(out * in);
  ASSERT_OK(gpu_->LinearBackward(x.g(), w.g(), dy.g(), dx_ref.g(), dw_ref.g(), nullptr, rows, in, out, fresh));
  ASSERT_OK(gpu_->Sync());
  ExpectBits("dx after the hold", Gpu(dx_ref), Gpu(dx_after));
  EXPECT_NE(Gpu(dx), Gpu(dx_after));  // the old w's dx differs: the test can tell the two apart
}

// mx_keep_x (KEEL_CUDA_ON): the forward quantizes an MX x both ways in one read
// and keeps the wgrad's copy for the backward. y, dx, dw and every role's
// statistics (a NaN and a saturating value in x, so per-block counts matter)
// are those of quantizing x again in the backward, in the formats that allow
// it (one MX format both ways, nearest rounding); the forward runs "quantize x
// both ways" and the backward no "mx down columns in tiles" over x. Nothing is
// kept without a keep_slot, with x's two roles in different formats, or with a
// stochastic rounding; a second backward without a forward rounds x again.
TEST_F(NnCudaTest, MxKeptXGivesTheBitsAndStatsOfQuantizingAgain) {
  std::unique_ptr<Backend> keeping = BackendWith("mx_keep_x");
  ASSERT_TRUE(keeping != nullptr);
  EXPECT_NE(keeping->Describe().find("; KEEL_CUDA_ON=mx_keep_x"), std::string::npos) << keeping->Describe();
  EXPECT_EQ(gpu_->Describe().find("KEEL_CUDA_ON"), std::string::npos) << gpu_->Describe();
  struct Case {
    std::string name;
    LinearQuant q;
    bool kept;
    bool slot = true;  // keep_slot 0 (else -1: nothing may be kept)
  };
  std::vector<Case> cases;
  cases.push_back({"mxfp8_e4m3", AllRoles(Quant(QuantFormat::kMxfp8E4M3)), true});
  cases.push_back({"mxfp4 nearest_away", AllRoles(Quant(QuantFormat::kMxfp4, Rounding::kNearestAway)), true});
  cases.push_back({"mxfp6_e2m3", AllRoles(Quant(QuantFormat::kMxfp6E2M3)), true});
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
    q.role[R(Role::kWgradX)] = Quant(QuantFormat::kMxfp8E5M2);
    cases.push_back({"wgrad_x in E5M2 (formats apart)", q, false});
  }
  {
    LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
    q.role[R(Role::kWgradX)].rounding = Rounding::kStochastic;
    cases.push_back({"stochastic wgrad_x", q, false});
  }
  cases.push_back({"no keep_slot", AllRoles(Quant(QuantFormat::kMxfp8E4M3)), false, false});
  const int64_t rows = 128, in = 64, out = 96;
  std::vector<float> xh = WithOutliers(rows * in, 311);
  xh[5 * in + 7] = std::numeric_limits<float>::quiet_NaN();
  xh[9 * in + 40] = 3.0e38f;
  Dual x = Floats(xh), w = Floats(Normal(out * in, 312, 0.05f)), dy = Floats(WithOutliers(rows * out, 313, 1e-3f));
  const std::vector<float> dw0 = Normal(out * in, 314, 1e-3f);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    BackwardResult r[2];
    std::vector<float> y[2];
    std::vector<OpTime> profile;
    for (int b = 0; b < 2; ++b) {
      Backend* be = b == 0 ? gpu_.get() : keeping.get();
      Dual yd = Zeros(rows * out), dx = Zeros(rows * in), dw = Floats(dw0);
      LinearQuant q = c.q;
      q.seed = 0x5EED;
      q.stats_slot = 0;
      q.keep_slot = c.slot ? 0 : -1;
      ASSERT_OK(be->ResetOperandStats(1));
      if (b == 1) ASSERT_OK(be->SetProfiling(true));
      ASSERT_OK(be->LinearForward(x.g(), w.g(), nullptr, nullptr, yd.g(), rows, in, out, q));
      ASSERT_OK(be->LinearBackward(x.g(), w.g(), dy.g(), dx.g(), dw.g(), nullptr, rows, in, out, q));
      if (b == 1) {
        ASSERT_OK(be->TakeProfile(&profile));
        ASSERT_OK(be->SetProfiling(false));
      }
      ASSERT_OK(be->Sync());
      ASSERT_OK(be->ReadOperandStats(&r[b].stats));
      y[b] = Get(be, yd.g(), yd.bytes);
      r[b].dx = Get(be, dx.g(), dx.bytes);
      r[b].dw = Get(be, dw.g(), dw.bytes);
    }
    ExpectBits("y", y[0], y[1]);
    ExpectBits("dx", r[0].dx, r[1].dx);
    ExpectBits("dw", r[0].dw, r[1].dw);
    ExpectStatsEqual(c.name, r[0].stats, r[1].stats);
    EXPECT_EQ(Ran(profile, "quantize x both ways"), c.kept);
    // Down columns in tiles: w for the dgrad always, x for the wgrad unless it was kept (or is stochastic).
    const bool x_in_tiles = !c.kept && c.q.role[R(Role::kWgradX)].rounding != Rounding::kStochastic;
    EXPECT_EQ(Calls(profile, "mx down columns in tiles"), x_in_tiles ? 2 : 1);
    EXPECT_GT(r[0].stats[R(Role::kWgradX)].nan_blocks, 0);
  }
  // The kept copy serves one backward: a second one (no forward between) quantizes x again, the same bits.
  LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
  q.keep_slot = 0;
  Dual yd = Zeros(rows * out), dx1 = Zeros(rows * in), dw1 = Floats(dw0), dx2 = Zeros(rows * in), dw2 = Floats(dw0);
  ASSERT_OK(keeping->LinearForward(x.g(), w.g(), nullptr, nullptr, yd.g(), rows, in, out, q));
  ASSERT_OK(keeping->LinearBackward(x.g(), w.g(), dy.g(), dx1.g(), dw1.g(), nullptr, rows, in, out, q));
  std::vector<OpTime> again;
  ASSERT_OK(keeping->SetProfiling(true));
  ASSERT_OK(keeping->LinearBackward(x.g(), w.g(), dy.g(), dx2.g(), dw2.g(), nullptr, rows, in, out, q));
  ASSERT_OK(keeping->TakeProfile(&again));
  ASSERT_OK(keeping->SetProfiling(false));
  ASSERT_OK(keeping->Sync());
  EXPECT_EQ(Calls(again, "mx down columns in tiles"), 2);
  ExpectBits("dw of a second backward", Get(keeping.get(), dw1.g(), dw1.bytes), Get(keeping.get(), dw2.g(), dw2.bytes));
}

// cuBLASLt's GELU epilogue (issue 12: "GELU in the cuBLASLt epilogue where it
// pays"): over [-6, 6] it follows the tanh approximation, 0.5 x (1 + tanh(
// sqrt(2/pi) (x + 0.044715 x^3))), not Keel's exact GELU x Phi(x) (docs/
// numerics.md), which differs from it by up to about 5e-4 around |x| = 2: moving
// GELU into the epilogue would change the model. The closer form by RMS
// distance, with a margin; both distances printed.
TEST_F(NnCudaTest, CublasLtGeluEpilogueIsTheTanhApproximation) {
  const int n = 4096;
  std::vector<float> x(n), y;
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = -6.0f + 12.0f * static_cast<float>(i) / (n - 1);
  ASSERT_OK(CublasLtGeluEpilogue(x, &y));
  ASSERT_EQ(y.size(), x.size());
  double sq_tanh = 0, sq_erf = 0, max_tanh = 0, max_erf = 0, forms_apart = 0;
  for (int i = 0; i < n; ++i) {
    const double v = x[static_cast<size_t>(i)], got = y[static_cast<size_t>(i)];
    const double tanh_form = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    const double erf_form = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    sq_tanh += (got - tanh_form) * (got - tanh_form);
    sq_erf += (got - erf_form) * (got - erf_form);
    max_tanh = std::max(max_tanh, std::fabs(got - tanh_form));
    max_erf = std::max(max_erf, std::fabs(got - erf_form));
    forms_apart = std::max(forms_apart, std::fabs(tanh_form - erf_form));
  }
  const double rms_tanh = std::sqrt(sq_tanh / n), rms_erf = std::sqrt(sq_erf / n);
  std::printf("  cuBLASLt GELU epilogue against the tanh form: rms %.3g, max %.3g; against the erf form: rms %.3g, "
              "max %.3g (the two forms differ by up to %.3g)\n",
              rms_tanh, max_tanh, rms_erf, max_erf, forms_apart);
  EXPECT_LT(rms_tanh, 0.5 * rms_erf);
}

TEST_F(NnCudaTest, LinearStatsWithNonFiniteInputs) {
  const int64_t rows = 64, in = 96, out = 48;
  std::vector<float> xh = WithOutliers(rows * in, 61), dyh = WithOutliers(rows * out, 62);
  xh[3 * in + 40] = std::numeric_limits<float>::quiet_NaN();
  xh[17 * in + 5] = std::numeric_limits<float>::infinity();
  dyh[9 * out + 7] = -std::numeric_limits<float>::infinity();
  Dual x = Floats(xh), w = Floats(Normal(out * in, 63, 0.1f)), dy = Floats(dyh);
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  std::vector<LinearQuant> schemes = {AllRoles(Quant(QuantFormat::kMxfp8E4M3)), AllRoles(Quant(QuantFormat::kMxfp4)),
                                      Nvfp4Recipe(), AllRoles(Quant(QuantFormat::kFp8E4M3)),
                                      AllRoles(Quant(QuantFormat::kBf16))};
  for (Backend* be : {cpu_.get(), gpu_.get()}) ASSERT_OK(be->ResetOperandStats(static_cast<int>(schemes.size())));
  for (size_t i = 0; i < schemes.size(); ++i) {
    LinearQuant q = schemes[i];
    q.stats_slot = static_cast<int>(i);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->LinearForward(p(x), p(w), nullptr, nullptr, p(y), rows, in, out, q));
      ASSERT_OK(be->LinearBackward(p(x), p(w), p(dy), p(dx), p(dw), nullptr, rows, in, out, q));
      ASSERT_OK(be->LinearForward(p(x), p(w), nullptr, nullptr, p(y), rows, in, out, q));  // counts add up
    }
  }
  std::vector<OperandStats> sc, sg;
  ASSERT_OK(cpu_->ReadOperandStats(&sc));
  ASSERT_OK(gpu_->ReadOperandStats(&sg));
  ExpectStatsEqual("non-finite", sc, sg);
  int64_t nan_blocks = 0;
  for (const OperandStats& s : sg) nan_blocks += s.nan_blocks;
  EXPECT_GT(nan_blocks, 0);
}

// Outlier analytics (outliers.h) through real linear layers on both backends:
// channel maxima and every count bit for bit (max and integer sums do not
// depend on order; the NVFP4 rounding is quant_core's on both sides); the double
// power sums and map sums within 1e-12 relative (the same double terms summed in
// another order: K terms of relative rounding 2^-53 each, K <= 10^5 here); the
// kurtosis likewise. Shapes include a last NVFP4 block shorter than 16 (in = 100)
// and a tensor with NaN and Inf elements; two micro-batches add up.
TEST_F(NnCudaTest, OutlierAnalyticsMatchCpu) {
  const int64_t rows = 80, in = 100, out = 48;
  std::vector<float> xh = WithOutliers(rows * in, 71), dyh = WithOutliers(rows * out, 72, 0.01f);
  for (int64_t r = 0; r < rows; ++r) xh[r * in + 13] *= 50.0f;  // a hot input channel
  xh[7 * in + 99] = std::numeric_limits<float>::quiet_NaN();
  dyh[3 * out + 5] = std::numeric_limits<float>::infinity();
  Dual x = Floats(xh), w = Floats(Normal(out * in, 73, 0.1f)), dy = Floats(dyh);
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  LinearQuant q = AllRoles(Quant(QuantFormat::kMxfp8E4M3));
  q.analytics_slot = 1;
  std::vector<OperandOutliers> got[2];
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    ASSERT_OK(be->BeginOutlierAnalytics(2, true));
    for (int micro = 0; micro < 2; ++micro) {
      ASSERT_OK(be->LinearForward(p(x), p(w), nullptr, nullptr, p(y), rows, in, out, q));
      ASSERT_OK(be->LinearBackward(p(x), p(w), p(dy), p(dx), p(dw), nullptr, rows, in, out, q));
    }
    ASSERT_OK(be->ReadOutlierAnalytics(&got[g ? 1 : 0]));
  }
  const std::vector<OperandOutliers>& c = got[0];
  const std::vector<OperandOutliers>& g = got[1];
  ASSERT_EQ(c.size(), g.size());
  auto rel = [](double a, double b) { return std::fabs(a - b) / std::max(1e-300, std::max(std::fabs(a), std::fabs(b))); };
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string role = "slot " + std::to_string(i / kRoleCount) + " " + RoleName(static_cast<Role>(i % kRoleCount));
    EXPECT_EQ(c[i].calls, g[i].calls) << role;
    if (c[i].calls == 0) continue;
    EXPECT_EQ(c[i].sums.finite, g[i].sums.finite) << role;
    EXPECT_EQ(c[i].sums.nonfinite, g[i].sums.nonfinite) << role;
    EXPECT_EQ(c[i].sums.nonzero, g[i].sums.nonzero) << role;
    EXPECT_EQ(c[i].sums.flushed, g[i].sums.flushed) << role;
    EXPECT_LE(rel(c[i].sums.shift, g[i].sums.shift), 1e-12) << role;
    EXPECT_LE(rel(c[i].sums.s2, g[i].sums.s2), 1e-12) << role;
    EXPECT_LE(rel(c[i].sums.s4, g[i].sums.s4), 1e-12) << role;
    EXPECT_LE(rel(Kurtosis(c[i].sums), Kurtosis(g[i].sums)), 1e-10) << role;
    ExpectBits(role + " channel max", c[i].channel_max, g[i].channel_max);
    ASSERT_EQ(c[i].map_mean.size(), g[i].map_mean.size()) << role;
    for (size_t k = 0; k < c[i].map_mean.size(); ++k) {
      if (std::isnan(c[i].map_mean[k])) {
        EXPECT_TRUE(std::isnan(g[i].map_mean[k])) << role << " cell " << k;
        continue;
      }
      if (std::isinf(c[i].map_mean[k])) {  // a cell holding an Inf: Inf on both sides
        EXPECT_EQ(c[i].map_mean[k], g[i].map_mean[k]) << role << " cell " << k;
        continue;
      }
      EXPECT_LE(rel(c[i].map_mean[k], g[i].map_mean[k]), 1e-12) << role << " cell " << k;
    }
  }
  const OperandOutliers& fx = g[kRoleCount + R(Role::kFwdX)];
  EXPECT_EQ(fx.calls, 2);
  EXPECT_TRUE(std::isnan(fx.channel_max[99]));  // the NaN channel is the hottest
  EXPECT_EQ(Summarize(fx, 2).hot, (std::vector<int64_t>{99, 13}));
  EXPECT_GT(g[kRoleCount + R(Role::kDgradDy)].sums.flushed, 0);  // small gradients flush beside the outliers
}

// The outlier reductions on a bf16 tensor read in place (rows ld apart) give
// the bits of the fp32 reductions on its widened copy, at a small odd shape
// (partial NVFP4 blocks, map cells of unequal size) and at the one-piece lm_head
// dlogits layout (ld = 2 x padded); the CPU backend's agree to summation order;
// an ld under cols is refused.
TEST_F(NnCudaTest, OutlierReductionsReadBf16InPlaceWithTheWidenedBits) {
  struct Shape {
    int64_t rows, cols, ld;
  };
  for (const Shape sh : {Shape{300, 1000, 1000}, Shape{300, 1000, 1003}, Shape{1024, 50304, 2 * 50304}}) {
    const std::string what = std::to_string(sh.rows) + " x " + std::to_string(sh.cols) + " ld " + std::to_string(sh.ld);
    const bool large = sh.cols > 10000;
    std::vector<float> v = WithOutliers(sh.rows * sh.cols, 91, 0.01f);
    // A NaN makes the NVFP4 tensor amax (NaN-propagating, as the quantizer's)
    // NaN, and then no element counts as flushed: the first shape checks the
    // non-finite counts, the others the flushed ones.
    const bool poisoned = sh.ld == sh.cols && sh.cols < 10000;
    if (poisoned) {
      v[7 * sh.cols + 3] = std::numeric_limits<float>::quiet_NaN();
      v[11 * sh.cols + sh.cols - 1] = -std::numeric_limits<float>::infinity();
    }
    std::vector<uint16_t> bits(static_cast<size_t>(sh.rows * sh.ld), 0x7FC0u);  // NaN in the gaps: never read
    std::vector<float> wide(v.size());
    for (int64_t r = 0; r < sh.rows; ++r) {
      for (int64_t c = 0; c < sh.cols; ++c) {
        const uint16_t b = FloatToBf16(v[r * sh.cols + c], Rounding::kNearestEven, 0.0f);
        bits[r * sh.ld + c] = b;
        uint32_t u = static_cast<uint32_t>(b) << 16;
        std::memcpy(&wide[r * sh.cols + c], &u, sizeof(u));
      }
    }
    Dual bf = Make(bits.data(), bits.size() * sizeof(uint16_t)), fw = Floats(wide);
    const uint16_t* bg = static_cast<const uint16_t*>(bf.gpu);
    const uint16_t* bc = static_cast<const uint16_t*>(bf.cpu);
    for (int axis : {1, 0}) {
      const int64_t channels = axis == 1 ? sh.cols : sh.rows;
      Dual from_wide = Zeros(channels), in_place = Zeros(channels), cpu_bf16 = Zeros(channels);
      ASSERT_OK(gpu_->ChannelAbsMax(fw.g(), sh.rows, sh.cols, axis, from_wide.g()));
      ASSERT_OK(gpu_->ChannelAbsMaxBf16(bg, sh.ld, sh.rows, sh.cols, axis, in_place.g()));
      ExpectBits(what + " channel max axis " + std::to_string(axis), Gpu(from_wide), Gpu(in_place));
      if (large) continue;
      ASSERT_OK(cpu_->ChannelAbsMaxBf16(bc, sh.ld, sh.rows, sh.cols, axis, cpu_bf16.c()));
      ExpectBits(what + " cpu channel max axis " + std::to_string(axis), Cpu(cpu_bf16), Gpu(in_place));
    }
    for (int axis : {1, 0}) {
      const int64_t n = static_cast<int64_t>(sizeof(OutlierSums) / sizeof(float));
      Dual a = Zeros(n), b = Zeros(n), c = Zeros(n);
      ASSERT_OK(gpu_->AddOutlierSums(fw.g(), sh.rows, sh.cols, axis, reinterpret_cast<OutlierSums*>(a.g())));
      ASSERT_OK(gpu_->AddOutlierSumsBf16(bg, sh.ld, sh.rows, sh.cols, axis, reinterpret_cast<OutlierSums*>(b.g())));
      const std::vector<float> ga = Gpu(a), gb = Gpu(b);
      EXPECT_EQ(std::memcmp(ga.data(), gb.data(), sizeof(OutlierSums)), 0) << what << " sums axis " << axis;
      OutlierSums sa, sb;
      std::memcpy(&sa, ga.data(), sizeof(sa));
      std::memcpy(&sb, gb.data(), sizeof(sb));
      EXPECT_EQ(sb.nonfinite, poisoned ? 2 : 0) << what;
      if (poisoned) {
        EXPECT_EQ(sb.flushed, 0) << what;
      } else {
        EXPECT_GT(sb.flushed, 0) << what;
      }
      if (large) continue;
      ASSERT_OK(cpu_->AddOutlierSumsBf16(bc, sh.ld, sh.rows, sh.cols, axis, reinterpret_cast<OutlierSums*>(c.c())));
      const std::vector<float> cc = Cpu(c);
      OutlierSums sc;
      std::memcpy(&sc, cc.data(), sizeof(sc));
      EXPECT_EQ(sc.finite, sb.finite) << what;
      EXPECT_EQ(sc.nonzero, sb.nonzero) << what;
      EXPECT_EQ(sc.flushed, sb.flushed) << what;
      EXPECT_NEAR(sc.s2, sb.s2, 1e-12 * std::fabs(sc.s2)) << what;
      EXPECT_NEAR(sc.s4, sb.s4, 1e-12 * std::fabs(sc.s4)) << what;
    }
    const MapGrid grid = MapGridFor(sh.rows, sh.cols);
    const int64_t map_floats = 2 * grid.cells();
    Dual ma = Zeros(map_floats), mb = Zeros(map_floats);
    ASSERT_OK(gpu_->AddBlockAbsSums(fw.g(), sh.rows, sh.cols, grid, reinterpret_cast<double*>(ma.g())));
    ASSERT_OK(gpu_->AddBlockAbsSumsBf16(bg, sh.ld, sh.rows, sh.cols, grid, reinterpret_cast<double*>(mb.g())));
    ExpectBits(what + " map (as float words)", Gpu(ma), Gpu(mb));
  }
  Dual tiny = Zeros(64), out = Zeros(64);
  const Status refused = gpu_->ChannelAbsMaxBf16(static_cast<const uint16_t*>(tiny.gpu), 7, 4, 8, 1, out.g());
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("ld: 7 is not allowed; need >= cols (8)"), std::string::npos) << refused.message();
}

// A linear layer given x and dy in bf16 (x_bf16, dy_bf16, rows wider than the
// operand) analyses them where they lie: the same analytics as the CPU
// backend's, which widens them; no fp32 copy of either is made.
TEST_F(NnCudaTest, OutlierAnalyticsOfBf16OperandsMatchCpu) {
  const int64_t rows = 80, in = 100, out = 48, x_ld = 104, dy_ld = 50;
  std::vector<float> xh = WithOutliers(rows * in, 61), dyh = WithOutliers(rows * out, 62, 0.01f);
  for (int64_t r = 0; r < rows; ++r) xh[r * in + 13] *= 50.0f;
  std::vector<uint16_t> xb(static_cast<size_t>(rows * x_ld), 0), dyb(static_cast<size_t>(rows * dy_ld), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) xb[r * x_ld + c] = FloatToBf16(xh[r * in + c], Rounding::kNearestEven, 0.0f);
    for (int64_t c = 0; c < out; ++c) dyb[r * dy_ld + c] = FloatToBf16(dyh[r * out + c], Rounding::kNearestEven, 0.0f);
  }
  dyb[3 * dy_ld + 5] = 0x7F80u;  // +Inf
  Dual x = Floats(xh), w = Floats(Normal(out * in, 63, 0.1f)), dy = Floats(dyh);
  Dual x16 = Make(xb.data(), xb.size() * sizeof(uint16_t)), dy16 = Make(dyb.data(), dyb.size() * sizeof(uint16_t));
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  std::vector<OperandOutliers> got[2];
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
    q.analytics_slot = 0;
    q.x_bf16 = static_cast<const uint16_t*>(g ? x16.gpu : x16.cpu);
    q.x_bf16_ld = x_ld;
    q.dy_bf16 = static_cast<const uint16_t*>(g ? dy16.gpu : dy16.cpu);
    q.dy_bf16_ld = dy_ld;
    ASSERT_OK(be->BeginOutlierAnalytics(1, true));
    ASSERT_OK(be->LinearForward(p(x), p(w), nullptr, nullptr, p(y), rows, in, out, q));
    ASSERT_OK(be->LinearBackward(p(x), p(w), p(dy), p(dx), p(dw), nullptr, rows, in, out, q));
    ASSERT_OK(be->ReadOutlierAnalytics(&got[g ? 1 : 0]));
  }
  auto rel = [](double a, double b) { return std::fabs(a - b) / std::max(1e-300, std::max(std::fabs(a), std::fabs(b))); };
  for (const Role role : {Role::kFwdX, Role::kWgradX, Role::kDgradDy, Role::kWgradDy, Role::kFwdW}) {
    const OperandOutliers& c = got[0][R(role)];
    const OperandOutliers& g = got[1][R(role)];
    const std::string name = RoleName(role);
    ASSERT_EQ(c.calls, 1) << name;
    ASSERT_EQ(g.calls, 1) << name;
    EXPECT_EQ(c.sums.finite, g.sums.finite) << name;
    EXPECT_EQ(c.sums.nonfinite, g.sums.nonfinite) << name;
    EXPECT_EQ(c.sums.flushed, g.sums.flushed) << name;
    EXPECT_LE(rel(c.sums.s2, g.sums.s2), 1e-12) << name;
    EXPECT_LE(rel(c.sums.s4, g.sums.s4), 1e-12) << name;
    ExpectBits(name + " channel max", c.channel_max, g.channel_max);
  }
  EXPECT_EQ(got[1][R(Role::kDgradDy)].sums.nonfinite, 1);  // the Inf in the bf16 dy, not in the fp32 one
  EXPECT_EQ(got[1][R(Role::kFwdX)].channel_max[13], got[0][R(Role::kFwdX)].channel_max[13]);
}

// The per-channel max on a large tensor (GPT-2's lm_head dlogits shape) equals
// the reference bit for bit, both channel axes.
TEST_F(NnCudaTest, ChannelAbsMaxMatchesCpuOnALargeTensor) {
  const int64_t rows = 1024, cols = 50304;
  Dual x = Floats(WithOutliers(rows * cols, 74));
  for (int axis : {1, 0}) {
    const int64_t channels = axis == 1 ? cols : rows;
    Dual out = Zeros(channels);
    ASSERT_OK(cpu_->ChannelAbsMax(x.c(), rows, cols, axis, out.c()));
    ASSERT_OK(gpu_->ChannelAbsMax(x.g(), rows, cols, axis, out.g()));
    ExpectBits("channel max axis " + std::to_string(axis), Cpu(out), Gpu(out));
  }
}

// More counting quantizations before a read than the backend has counter pairs
// (1024 at the start): the pairs fold early and grow, the count the wgrad
// borrows from the dgrad's bf16 dy survives a fold between the two, a reset
// drops what was counted before it, and the totals still equal the CPU's.
TEST_F(NnCudaTest, LinearStatsSurviveManyCallsBetweenReads) {
  const int64_t rows = 64, in = 96, out = 48;
  std::vector<float> xh = WithOutliers(rows * in, 71);
  xh[5 * in + 3] = std::numeric_limits<float>::quiet_NaN();
  Dual x = Floats(xh), w = Floats(Normal(out * in, 72, 0.1f)), dy = Floats(WithOutliers(rows * out, 73));
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  const std::vector<LinearQuant> schemes = {AllRoles(Quant(QuantFormat::kBf16)), AllRoles(Quant(QuantFormat::kMxfp8E4M3)),
                                            Nvfp4Recipe(), AllRoles(Quant(QuantFormat::kFp8E4M3)),
                                            AllRoles(Quant(QuantFormat::kMxfp4))};
  auto run = [&](Backend* be, size_t scheme, bool backward) -> Status {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    LinearQuant q = schemes[scheme];
    q.stats_slot = static_cast<int>(scheme);
    KEEL_RETURN_IF_ERROR(be->LinearForward(p(x), p(w), nullptr, nullptr, p(y), rows, in, out, q));
    if (!backward) return Status::Ok();
    return be->LinearBackward(p(x), p(w), p(dy), p(dx), p(dw), nullptr, rows, in, out, q);
  };
  const int slots = static_cast<int>(schemes.size());
  // Counted, then dropped by the reset.
  ASSERT_OK(gpu_->ResetOperandStats(slots));
  for (int i = 0; i < 40; ++i) ASSERT_OK(run(gpu_.get(), i % schemes.size(), true));
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    ASSERT_OK(be->ResetOperandStats(slots));
    // bf16: a forward takes 2 pairs, a backward 3 (its wgrad borrows the dgrad's
    // dy count). After 3 forwards and 203 steps, 1023 pairs are in use when a
    // backward keeps its dy count: the next pair, its dgrad w's, folds first.
    for (int i = 0; i < 3; ++i) ASSERT_OK(run(be, 0, false));
    for (int i = 0; i < 250; ++i) ASSERT_OK(run(be, 0, true));
    // Then every scheme, past the grown room of 2048 pairs.
    for (int i = 0; i < 600; ++i) ASSERT_OK(run(be, i % schemes.size(), true));
  }
  std::vector<OperandStats> sc, sg;
  ASSERT_OK(cpu_->ReadOperandStats(&sc));
  ASSERT_OK(gpu_->ReadOperandStats(&sg));
  ExpectStatsEqual("many calls", sc, sg);
  EXPECT_EQ(sg[static_cast<size_t>(Role::kWgradDy)].elements, (250 + 120) * rows * out);  // slot 0: bf16
  EXPECT_EQ(sg[static_cast<size_t>(Role::kFwdX)].nan_blocks, 3 + 250 + 120);  // per tensor: one per call
  // A second read, with no call between, gives the same totals.
  std::vector<OperandStats> again;
  ASSERT_OK(gpu_->ReadOperandStats(&again));
  ExpectStatsEqual("read twice", sg, again);
}

// LinearQuant::keep_slot: the backward reuses the forward's BF16 roundings of x
// and w. The results and statistics are the bits of rounding again; the
// profile shows the backward rounding only dy; a different x, a stochastic
// role, or a statistics reset between the calls makes it round afresh.
TEST_F(NnCudaTest, KeptForwardOperandsGiveTheBitsOfRoundingAgain) {
  const int64_t rows = 64, in = 96, out = 48;
  std::vector<float> xh = WithOutliers(rows * in, 81);
  xh[5 * in + 3] = std::numeric_limits<float>::quiet_NaN();  // counted as a NaN block by fwd_x and wgrad_x
  std::vector<float> x2h = xh;
  x2h[7] = 3.0f;
  Dual x = Floats(xh), x2 = Floats(x2h), w = Floats(Normal(out * in, 82, 0.1f));
  Dual dy = Floats(WithOutliers(rows * out, 83));
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  struct Result {
    std::vector<float> y, dx, dw;
    std::vector<OperandStats> stats;
    int64_t backward_quantizations = 0;
  };
  // forward on x, backward on xb (x or x2), keep_slot as given; reset_between
  // drops the statistics pairs between the two calls.
  auto run = [&](const LinearQuant& base, int keep, const Dual& xb, bool reset_between) -> Result {
    LinearQuant q = base;
    q.stats_slot = 0;
    q.keep_slot = keep;
    Result r;
    Set(dw, std::vector<float>(static_cast<size_t>(out * in), 0.0f));
    EXPECT_OK(gpu_->ResetOperandStats(1));
    EXPECT_OK(gpu_->SetProfiling(true));
    EXPECT_OK(gpu_->LinearForward(x.g(), w.g(), nullptr, nullptr, y.g(), rows, in, out, q));
    if (reset_between) EXPECT_OK(gpu_->ResetOperandStats(1));
    EXPECT_OK(gpu_->LinearBackward(xb.g(), w.g(), dy.g(), dx.g(), dw.g(), nullptr, rows, in, out, q));
    std::vector<OpTime> times;
    EXPECT_OK(gpu_->TakeProfile(&times));
    EXPECT_OK(gpu_->SetProfiling(false));
    for (const OpTime& t : times) {
      if (t.op == "LinearBackward > quantize") r.backward_quantizations = t.calls;
    }
    EXPECT_OK(gpu_->ReadOperandStats(&r.stats));
    r.y = Gpu(y);
    r.dx = Gpu(dx);
    r.dw = Gpu(dw);
    return r;
  };
  auto same = [&](const std::string& what, const Result& a, const Result& b) {
    ExpectBits(what + " y", a.y, b.y);
    ExpectBits(what + " dx", a.dx, b.dx);
    ExpectBits(what + " dw", a.dw, b.dw);
    ExpectStatsEqual(what, a.stats, b.stats);
  };
  for (Rounding rounding : {Rounding::kNearestEven, Rounding::kNearestAway}) {
    const LinearQuant bf16 = AllRoles(Quant(QuantFormat::kBf16, rounding));
    const std::string name = RoundingName(rounding);
    const Result fresh = run(bf16, -1, x, false);
    const Result kept = run(bf16, 3, x, false);
    same(name + " kept", fresh, kept);
    // Fresh: dy once (the wgrad reuses it), w and x; kept: dy only.
    EXPECT_EQ(fresh.backward_quantizations, 3) << name;
    EXPECT_EQ(kept.backward_quantizations, 1) << name;
    EXPECT_EQ(kept.stats[R(Role::kWgradX)].nan_blocks, 1) << name;
    EXPECT_EQ(kept.stats[R(Role::kDgradW)].elements, out * in) << name;
    // Another x in the backward: rounded afresh, the bits of that x.
    same(name + " other x", run(bf16, -1, x2, false), run(bf16, 3, x2, false));
    EXPECT_EQ(run(bf16, 3, x2, false).backward_quantizations, 2) << name;  // dy and x; w is still kept
    // A statistics reset between: the backward rounds again and counts.
    const Result reset = run(bf16, 3, x, true);
    EXPECT_EQ(reset.backward_quantizations, 3) << name;
    ExpectStatsEqual(name + " reset", run(bf16, -1, x, true).stats, reset.stats);
  }
  // Stochastic BF16 draws other bits per role: nothing is kept.
  const LinearQuant sr = AllRoles(Quant(QuantFormat::kBf16, Rounding::kStochastic));
  const Result sr_kept = run(sr, 3, x, false);
  same("stochastic", run(sr, -1, x, false), sr_kept);
  EXPECT_EQ(sr_kept.backward_quantizations, 4);  // dgrad dy, w, wgrad dy, x
}

// DownloadMany gives what one Download per item gives, odd sizes and an empty
// item included, and refuses a null pointer.
TEST_F(NnCudaTest, DownloadManyEqualsDownloads) {
  const std::vector<float> a = Normal(1001, 91, 1.0f), b = Normal(3, 92, 1.0f);
  Dual da = Floats(a), db = Floats(b);
  std::vector<float> ga(a.size()), gb(b.size());
  double d = 0;
  void* dd = nullptr;
  ASSERT_OK(gpu_->Alloc(sizeof(double), &dd));
  const double value = 2.5;
  ASSERT_OK(gpu_->Upload(dd, &value, sizeof(value)));
  ASSERT_OK(gpu_->DownloadMany({{ga.data(), da.g(), ga.size() * sizeof(float)},
                                {nullptr, nullptr, 0},
                                {gb.data(), db.g(), 2 * sizeof(float)},
                                {&d, dd, sizeof(double)}}));
  ExpectBits("first", a, ga);
  EXPECT_EQ(gb[0], b[0]);
  EXPECT_EQ(gb[1], b[1]);
  EXPECT_EQ(gb[2], 0.0f);  // not part of the item
  EXPECT_EQ(d, 2.5);
  EXPECT_FALSE(gpu_->DownloadMany({{nullptr, da.g(), 4}}).ok());
  gpu_->Free(dd);
}

// CrossEntropyFusedBf16 on CUDA: CrossEntropyFused's losses and its gradient
// rounded to bf16, bit for bit, over logits (the one-read kernel) and into a separate buffer with a vocabulary too
// wide for shared memory; over logits with that vocabulary it is refused.
// Then the head's backward reading that bf16 dy gives the bits and statistics
// of the backward that rounds the fp32 dy, both with the cross-entropy's count
// and with a dy uploaded from elsewhere (counted by a pass of its own); and
// the same in row chunks (row0) into a separate buffer.
TEST_F(NnCudaTest, CrossEntropyBf16AndTheHeadBackwardMatchTheFp32Path) {
  auto as_u16 = [](Backend* be, const void* p, int64_t count) {
    std::vector<uint16_t> v(static_cast<size_t>(count));
    EXPECT_OK(be->Download(v.data(), p, v.size() * sizeof(uint16_t)));
    return v;
  };
  for (const int64_t padded : {int64_t{1008}, int64_t{60000}}) {
    const int64_t rows = 48, vocab = padded - 5;
    const float scale = 0.25f;
    std::vector<float> lh = Normal(rows * padded, 95, 3.0f);
    lh[7 * padded + 11] = std::numeric_limits<float>::quiet_NaN();  // one NaN row
    std::vector<int32_t> th = Tokens(rows, static_cast<int32_t>(vocab), 96);
    th[3] = -1;
    Dual logits = Floats(lh), targets = Ints(th), losses = Zeros(rows), ref_losses = Zeros(rows);
    Dual ref = Zeros(rows * padded);
    const bool in_place = padded == 1008;
    Dual sep = Zeros(rows * padded);  // rows x 2 padded bf16 when not in place
    uint16_t* dg = reinterpret_cast<uint16_t*>(in_place ? logits.g() : sep.g());
    const int64_t ld = 2 * padded;
    // The reference: this backend's fp32 CrossEntropyFused, rounded on the host
    // (the CPU's sums go in another order, so its last bits may differ).
    ASSERT_OK(gpu_->CrossEntropyFused(logits.g(), targets.gi(), ref_losses.g(), ref.g(), rows, padded, vocab, scale));
    ASSERT_OK(gpu_->CrossEntropyFusedBf16(logits.g(), targets.gi(), losses.g(), dg, ld, rows, padded, vocab, scale, 0));
    ExpectBits("ce bf16 losses", Gpu(ref_losses), Gpu(losses));
    const std::vector<float> rf = Gpu(ref);
    std::vector<uint16_t> bc(static_cast<size_t>(rows * ld));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < padded; ++c) bc[r * ld + c] = FloatToBf16(rf[r * padded + c], Rounding::kNearestEven, 0.0f);
    }
    const std::vector<uint16_t> bg = as_u16(gpu_.get(), dg, rows * ld);
    int64_t differ = 0, nan_c = 0, nan_g = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < padded; ++c) {
        const uint16_t a = bc[r * ld + c], b = bg[r * ld + c];
        const bool na = (a & 0x7FFF) > 0x7F80, nb = (b & 0x7FFF) > 0x7F80;  // NaN payloads may differ
        nan_c += na;
        nan_g += nb;
        differ += na != nb || (!na && a != b);
      }
    }
    EXPECT_EQ(differ, 0) << "padded " << padded;
    EXPECT_EQ(nan_c, nan_g);
    EXPECT_GT(nan_g, 0);
    if (!in_place) {
      EXPECT_FALSE(gpu_->CrossEntropyFusedBf16(logits.g(), targets.gi(), losses.g(),
                                               reinterpret_cast<uint16_t*>(logits.g()), ld, rows, padded, vocab, scale,
                                               0)
                       .ok());
      continue;
    }
    // The head's backward: fp32 dy (the bf16 values) against dy_bf16.
    const int64_t in = 64;
    std::vector<float> dyf(static_cast<size_t>(rows * padded));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < padded; ++c) dyf[r * padded + c] = Bf16ToFloat(bg[r * ld + c]);
    }
    Dual x = Floats(Normal(rows * in, 97, 1.0f)), w = Floats(Normal(padded * in, 98, 0.1f)), dy = Floats(dyf);
    Dual dx = Zeros(rows * in), dw = Zeros(padded * in);
    LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
    q.stats_slot = 0;
    auto backward = [&](const LinearQuant& qq, const float* dyp) {
      Set(dw, std::vector<float>(static_cast<size_t>(padded * in), 0.0f));
      std::vector<OperandStats> st;
      EXPECT_OK(gpu_->LinearBackward(x.g(), w.g(), dyp, dx.g(), dw.g(), nullptr, rows, in, padded, qq));
      EXPECT_OK(gpu_->ReadOperandStats(&st));
      return std::make_tuple(Gpu(dx), Gpu(dw), st);
    };
    ASSERT_OK(gpu_->ResetOperandStats(1));
    const auto [dx0, dw0, st0] = backward(q, dy.g());
    LinearQuant qb = q;
    qb.dy_bf16 = dg;
    qb.dy_bf16_ld = ld;
    // The cross-entropy's count: its pair went with the reset above, so run it again first.
    ASSERT_OK(gpu_->ResetOperandStats(1));
    Set(logits, lh);
    ASSERT_OK(gpu_->CrossEntropyFusedBf16(logits.g(), targets.gi(), losses.g(), dg, ld, rows, padded, vocab, scale, 0));
    const auto [dx1, dw1, st1] = backward(qb, nullptr);
    ExpectBits("head dx", dx0, dx1);
    ExpectBits("head dw", dw0, dw1);
    ExpectStatsEqual("head, cross-entropy's count", st0, st1);
    // A bf16 dy uploaded from elsewhere: counted by its own pass.
    Dual other = Zeros(rows * padded);
    ASSERT_OK(gpu_->Upload(other.g(), bg.data(), bg.size() * sizeof(uint16_t)));
    qb.dy_bf16 = reinterpret_cast<const uint16_t*>(other.g());
    ASSERT_OK(gpu_->ResetOperandStats(1));
    const auto [dx2, dw2, st2] = backward(qb, nullptr);
    ExpectBits("head dx (uploaded)", dx0, dx2);
    ExpectStatsEqual("head, counted", st0, st2);
    EXPECT_EQ(st2[R(Role::kDgradDy)].nan_blocks, 1);
    // In row chunks (row0, as Model::HeadAndLoss runs it): the chunks' rows of
    // logits into one separate dlogits (ld = padded), the same bits, and the
    // chunks' non-finite counts in the statistics of the first call.
    Dual whole = Zeros(rows * padded);  // rows x 2 padded bf16: room for ld = padded
    uint16_t* dw16 = reinterpret_cast<uint16_t*>(whole.g());
    ASSERT_OK(gpu_->ResetOperandStats(1));
    Set(logits, lh);
    const int64_t chunk = 5;  // the NaN row (7) is in the second chunk: only a merged count sees it
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      ASSERT_OK(gpu_->CrossEntropyFusedBf16(logits.g() + r0 * padded, targets.gi() + r0, losses.g() + r0, dw16, padded,
                                            n, padded, vocab, scale, r0));
    }
    ExpectBits("ce bf16 losses (chunks)", Gpu(ref_losses), Gpu(losses));
    const std::vector<uint16_t> bch = as_u16(gpu_.get(), dw16, rows * padded);
    int64_t chunk_differ = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < padded; ++c) {
        const uint16_t a = bg[r * ld + c], b = bch[r * padded + c];
        chunk_differ += ((a & 0x7FFF) > 0x7F80) != ((b & 0x7FFF) > 0x7F80) || ((a & 0x7FFF) <= 0x7F80 && a != b);
      }
    }
    EXPECT_EQ(chunk_differ, 0) << "padded " << padded;
    LinearQuant qc = q;
    qc.dy_bf16 = dw16;
    qc.dy_bf16_ld = padded;
    const auto [dx3, dw3, st3] = backward(qc, nullptr);
    ExpectBits("head dx (chunks)", dx0, dx3);
    ExpectBits("head dw (chunks)", dw0, dw3);
    ExpectStatsEqual("head, the chunks' count", st0, st3);
    // A later chunk without a first call on that buffer: its count is dropped,
    // and the reader counts the whole tensor itself (the same statistics).
    ASSERT_OK(gpu_->ResetOperandStats(1));
    Set(logits, lh);
    Dual lone = Zeros(rows * padded);
    uint16_t* lone16 = reinterpret_cast<uint16_t*>(lone.g());
    ASSERT_OK(gpu_->Upload(lone16, bch.data(), bch.size() * sizeof(uint16_t)));
    ASSERT_OK(gpu_->CrossEntropyFusedBf16(logits.g() + chunk * padded, targets.gi() + chunk, losses.g() + chunk,
                                          lone16, padded, rows - chunk, padded, vocab, scale, chunk));
    qc.dy_bf16 = lone16;
    const auto [dx4, dw4, st4] = backward(qc, nullptr);
    ExpectBits("head dx (lone chunk)", dx0, dx4);
    ExpectStatsEqual("head, counted after a lone chunk", st0, st4);
  }
}

// LayerNormForwardBf16 and GeluForwardBf16 write the bf16 rounding of their
// fp32 outputs, count its non-finite values, and a linear layer reading x from
// them (LinearQuant::x_bf16) gives the bits and statistics of the fp32 path.
TEST_F(NnCudaTest, ProducersWriteTheBf16XTheLinearReads) {
  auto as_u16 = [this](const void* p, int64_t count) {
    std::vector<uint16_t> v(static_cast<size_t>(count));
    EXPECT_OK(gpu_->Download(v.data(), p, v.size() * sizeof(uint16_t)));
    return v;
  };
  auto rounded = [](const std::vector<float>& f) {
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = FloatToBf16(f[i], Rounding::kNearestEven, 0.0f);
    return b;
  };
  const int64_t rows = 96, in = 256, out = 192;
  for (const int64_t cols : {in, in - 3}) {  // float4 rows and the scalar path
    std::vector<float> xh = Normal(rows * cols, 101, 2.0f);
    xh[cols * 5 + 2] = std::numeric_limits<float>::quiet_NaN();
    Dual x = Floats(xh), gamma = Floats(Normal(cols, 102, 1.0f)), beta = Floats(Normal(cols, 103, 0.1f));
    Dual y = Zeros(rows * cols), yb = Zeros(rows * cols), mean = Zeros(rows), rstd = Zeros(rows), mean2 = Zeros(rows),
         rstd2 = Zeros(rows);
    ASSERT_OK(gpu_->LayerNormForward(x.g(), gamma.g(), beta.g(), y.g(), mean.g(), rstd.g(), rows, cols, 1e-5f));
    ASSERT_OK(gpu_->LayerNormForwardBf16(x.g(), gamma.g(), beta.g(), reinterpret_cast<uint16_t*>(yb.g()), mean2.g(),
                                         rstd2.g(), rows, cols, 1e-5f));
    EXPECT_EQ(rounded(Gpu(y)), as_u16(yb.g(), rows * cols)) << "layernorm, cols " << cols;
    ExpectBits("layernorm mean", Gpu(mean), Gpu(mean2));
    ExpectBits("layernorm rstd", Gpu(rstd), Gpu(rstd2));
    const int64_t n = rows * cols;
    Dual g = Zeros(n), gb = Zeros(n);
    ASSERT_OK(gpu_->GeluForward(x.g(), g.g(), n));
    ASSERT_OK(gpu_->GeluForwardBf16(x.g(), reinterpret_cast<uint16_t*>(gb.g()), n));
    EXPECT_EQ(rounded(Gpu(g)), as_u16(gb.g(), n)) << "gelu, n " << n;
  }
  // A linear layer on GELU's output, x in fp32 against x_bf16 from the producer.
  std::vector<float> pre = Normal(rows * in, 104, 1.5f);
  pre[in * 7 + 9] = std::numeric_limits<float>::infinity();  // GELU(inf) = inf: one non-finite x
  Dual xp = Floats(pre), act = Zeros(rows * in), act_b = Zeros(rows * in);
  Dual w = Floats(Normal(out * in, 105, 0.1f)), b = Floats(Normal(out, 106, 0.1f)), dy = Floats(Normal(rows * out, 107));
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in), db = Zeros(out);
  uint16_t* act_bits = reinterpret_cast<uint16_t*>(act_b.g());
  ASSERT_OK(gpu_->GeluForward(xp.g(), act.g(), rows * in));
  LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
  q.stats_slot = 0;
  q.keep_slot = 0;
  auto pass = [&](const LinearQuant& qq, const float* xx) {
    Set(dw, std::vector<float>(static_cast<size_t>(out * in), 0.0f));
    Set(db, std::vector<float>(static_cast<size_t>(out), 0.0f));
    std::vector<OperandStats> st;
    EXPECT_OK(gpu_->LinearForward(xx, w.g(), b.g(), nullptr, y.g(), rows, in, out, qq));
    EXPECT_OK(gpu_->LinearBackward(xx, w.g(), dy.g(), dx.g(), dw.g(), db.g(), rows, in, out, qq));
    EXPECT_OK(gpu_->ReadOperandStats(&st));
    return std::make_tuple(Gpu(y), Gpu(dx), Gpu(dw), Gpu(db), st);
  };
  ASSERT_OK(gpu_->ResetOperandStats(1));
  const auto [y0, dx0, dw0, db0, st0] = pass(q, act.g());
  LinearQuant qb = q;
  qb.x_bf16 = act_bits;
  qb.x_bf16_ld = in;
  ASSERT_OK(gpu_->ResetOperandStats(1));
  ASSERT_OK(gpu_->GeluForwardBf16(xp.g(), act_bits, rows * in));  // counted by the producer
  const auto [y1, dx1, dw1, db1, st1] = pass(qb, nullptr);
  ExpectBits("x_bf16 y", y0, y1);
  ExpectBits("x_bf16 dx", dx0, dx1);
  ExpectBits("x_bf16 dw", dw0, dw1);
  ExpectBits("x_bf16 dbias", db0, db1);
  ExpectStatsEqual("x_bf16, the producer's count", st0, st1);
  EXPECT_EQ(st1[R(Role::kFwdX)].nan_blocks, 1);
  EXPECT_EQ(st1[R(Role::kWgradX)].nan_blocks, 1);
  // The producer's pair went with a reset: counted by a pass of its own.
  ASSERT_OK(gpu_->ResetOperandStats(1));
  const auto [y2, dx2, dw2, db2, st2] = pass(qb, nullptr);
  ExpectBits("x_bf16 y (counted)", y0, y2);
  ExpectStatsEqual("x_bf16, counted", st0, st2);
  // What the CPU refuses, refused.
  LinearQuant mx = qb;
  mx.role[R(Role::kFwdX)] = Quant(QuantFormat::kMxfp8E4M3);
  EXPECT_FALSE(gpu_->LinearForward(nullptr, w.g(), b.g(), nullptr, y.g(), rows, in, out, mx).ok());
  LinearQuant narrow = qb;
  narrow.x_bf16_ld = in - 1;
  EXPECT_FALSE(gpu_->LinearBackward(nullptr, w.g(), dy.g(), dx.g(), dw.g(), db.g(), rows, in, out, narrow).ok());
}

// GeluBackwardBf16 writes the rounding of GeluBackward's dx and sums the bias
// gradient as LinearBackward does: the layer's backward reading it gives the
// bits of the fp32 path.
// Widths 200 (four columns a thread, GeluGradBf16ColumnPartials4Kernel) and 198 (one).
TEST_F(NnCudaTest, GeluBackwardBf16GivesTheLinearsDyAndDbias) {
 for (const int64_t out : {int64_t{200}, int64_t{198}}) {
  SCOPED_TRACE("width " + std::to_string(out));
  const int64_t rows = 1000, in = 96;  // rows: several column chunks
  std::vector<float> pre = Normal(rows * out, 111, 1.5f);
  pre[out * 3 + 4] = std::numeric_limits<float>::quiet_NaN();
  Dual xp = Floats(pre), dact = Floats(Normal(rows * out, 112, 0.5f)), dy = Zeros(rows * out), dyb = Zeros(rows * out);
  Dual x = Floats(Normal(rows * in, 113)), w = Floats(Normal(out * in, 114, 0.1f));
  Dual dx = Zeros(rows * in), dw = Zeros(out * in), db = Zeros(out);
  LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
  q.stats_slot = 0;
  auto backward = [&](const LinearQuant& qq, const float* dyp, bool with_bias) {
    std::vector<OperandStats> st;
    EXPECT_OK(gpu_->LinearBackward(x.g(), w.g(), dyp, dx.g(), dw.g(), with_bias ? db.g() : nullptr, rows, in, out, qq));
    EXPECT_OK(gpu_->ReadOperandStats(&st));
    return std::make_tuple(Gpu(dx), Gpu(dw), Gpu(db), st);
  };
  Set(db, std::vector<float>(static_cast<size_t>(out), 0.5f));
  ASSERT_OK(gpu_->ResetOperandStats(1));
  ASSERT_OK(gpu_->GeluBackward(xp.g(), dact.g(), dy.g(), rows * out));
  const auto [dx0, dw0, db0, st0] = backward(q, dy.g(), true);
  uint16_t* bits = reinterpret_cast<uint16_t*>(dyb.g());
  Set(dw, std::vector<float>(static_cast<size_t>(out * in), 0.0f));
  Set(db, std::vector<float>(static_cast<size_t>(out), 0.5f));
  ASSERT_OK(gpu_->ResetOperandStats(1));
  ASSERT_OK(gpu_->GeluBackwardBf16(xp.g(), dact.g(), bits, rows, out, db.g()));
  std::vector<uint16_t> got(static_cast<size_t>(rows * out));
  ASSERT_OK(gpu_->Download(got.data(), bits, got.size() * sizeof(uint16_t)));
  const std::vector<float> dyf = Gpu(dy);
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != FloatToBf16(dyf[i], Rounding::kNearestEven, 0.0f);
  EXPECT_EQ(differ, 0);
  LinearQuant qb = q;
  qb.dy_bf16 = bits;
  qb.dy_bf16_ld = out;
  const auto [dx1, dw1, db1, st1] = backward(qb, nullptr, false);
  ExpectBits("gelu bf16 dx", dx0, dx1);
  ExpectBits("gelu bf16 dw", dw0, dw1);
  ExpectBits("gelu bf16 dbias", db0, db1);
  ExpectStatsEqual("gelu bf16, the producer's count", st0, st1);
  EXPECT_EQ(st1[R(Role::kDgradDy)].nan_blocks, 1);
 }
}

TEST_F(NnCudaTest, LinearRejectsWhatTheCpuRejects) {
  const int64_t rows = 32, in = 32, out = 32;
  Dual x = Floats(Normal(rows * in, 71)), w = Floats(Normal(out * in, 72)), y = Zeros(rows * out);
  LinearQuant rht_fwd = AllRoles(Quant(QuantFormat::kNvfp4));
  rht_fwd.role[R(Role::kFwdX)].rht = true;
  LinearQuant bad_slot;
  bad_slot.stats_slot = 5;
  ASSERT_OK(gpu_->ResetOperandStats(1));
  ASSERT_OK(cpu_->ResetOperandStats(1));
  for (const LinearQuant& q : {rht_fwd, bad_slot}) {
    const Status c = cpu_->LinearForward(x.c(), w.c(), nullptr, nullptr, y.c(), rows, in, out, q);
    const Status g = gpu_->LinearForward(x.g(), w.g(), nullptr, nullptr, y.g(), rows, in, out, q);
    EXPECT_FALSE(c.ok());
    EXPECT_FALSE(g.ok());
    std::printf("  cuda says: %s\n", g.message().c_str());
  }
  LinearQuant one_rht = AllRoles(Quant(QuantFormat::kNvfp4));
  one_rht.role[R(Role::kWgradX)].rht = true;
  Dual dw = Zeros(out * in), dy = Floats(Normal(rows * out, 73));
  EXPECT_FALSE(gpu_->LinearBackward(x.g(), w.g(), dy.g(), nullptr, dw.g(), nullptr, rows, in, out, one_rht).ok());
  // Bad Hot-Channel Patch requests are refused as the CPU refuses them, and
  // change nothing.
  LinearQuant hcp = AllRoles(Quant(QuantFormat::kNvfp4));
  hcp.hcp_wgrad_rows = 33;
  Status refused = gpu_->LinearBackward(x.g(), w.g(), dy.g(), nullptr, dw.g(), nullptr, rows, in, out, hcp);
  EXPECT_NE(refused.message().find("hcp_wgrad_rows: 33 is not allowed; need 0..32"), std::string::npos)
      << refused.message();
  hcp.hcp_wgrad_rows = 0;
  hcp.hcp_fwd.count = 2;  // no index, nothing to choose into
  refused = gpu_->LinearForward(x.g(), w.g(), nullptr, nullptr, y.g(), rows, in, out, hcp);
  EXPECT_NE(refused.message().find("hcp_fwd.index: null is not allowed with count 2"), std::string::npos)
      << refused.message();
  hcp.hcp_fwd.count = 33;
  refused = gpu_->LinearForward(x.g(), w.g(), nullptr, nullptr, y.g(), rows, in, out, hcp);
  EXPECT_NE(refused.message().find("hcp_fwd.count: 33 is not allowed; need 0..32"), std::string::npos)
      << refused.message();
  for (float v : Gpu(dw)) ASSERT_EQ(v, 0.0f);
}

// ---- Hot-Channel Patch (docs/hcp.md) ------------------------------------------------------

using nn_test::RelError;

// One NVFP4 layer's three GEMMs on CUDA, with and without the RHT on the wgrad
// roles (BF16 GEMMs: the patch folded into them), and with the x roles in fp32
// (fp32 GEMMs: the patch a second GEMM): the patch on every channel (k = K)
// gives the fp32 layer up to the BF16 patch columns; count 0 gives the
// unpatched bits; the scores agree with the CPU's; the chosen sets
// (choose_into) are the CPU's; and patched minus unpatched is the CPU's patch
// up to the BF16 columns.
TEST_F(NnCudaTest, HcpMatchesTheCpuReference) {
  const int64_t rows = 64, in = 128, out = 96;
  const std::vector<float> xs = nn_test::WithOutliers(rows * in, 11), ws = nn_test::WithOutliers(out * in, 12, 0.1f),
                           dys = nn_test::WithOutliers(rows * out, 13);
  Dual x = Floats(xs), w = Floats(ws), dy = Floats(dys);
  std::vector<int32_t> all(std::max(in, out));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  Dual every = Ints(all);
  Dual chosen = Ints(std::vector<int32_t>(16, -1));  // fwd 0..4, dgrad 8..12
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in);
  struct Result {
    std::vector<float> y, dx, dw;
  };
  // The layer on one backend; hot sets from `index` (backend memory) or chosen.
  auto run = [&](bool on_gpu, const LinearQuant& q) {
    Backend* b = on_gpu ? gpu_.get() : cpu_.get();
    auto p = [on_gpu](const Dual& d) { return on_gpu ? d.g() : d.c(); };
    Set(dw, std::vector<float>(out * in, 0.0f));
    EXPECT_OK(b->LinearForward(p(x), p(w), nullptr, nullptr, p(y), rows, in, out, q));
    EXPECT_OK(b->LinearBackward(p(x), p(w), p(dy), p(dx), p(dw), nullptr, rows, in, out, q));
    return on_gpu ? Result{Gpu(y), Gpu(dx), Gpu(dw)} : Result{Cpu(y), Cpu(dx), Cpu(dw)};
  };
  for (const int variant : {0, 1, 2}) {
    const bool rht = variant == 1, mixed = variant == 2;
    SCOPED_TRACE(rht ? "rht on the wgrad roles" : mixed ? "x roles fp32: fp32 GEMMs" : "no rht");
    LinearQuant plain = AllRoles(Quant(QuantFormat::kNvfp4));
    plain.role[R(Role::kWgradDy)].rht = rht;
    plain.role[R(Role::kWgradX)].rht = rht;
    if (mixed) {
      plain.role[R(Role::kFwdX)] = OperandFormat();
      plain.role[R(Role::kDgradDy)] = OperandFormat();
      plain.role[R(Role::kWgradX)] = OperandFormat();
    }
    const Result fp32 = run(false, LinearQuant());
    const Result g_plain = run(true, plain);

    LinearQuant none = plain;  // count 0: the plain bits
    none.hcp_fwd = HotChannels{every.gi(), 0};
    none.hcp_dgrad = HotChannels{every.gi(), 0};
    const Result g_none = run(true, none);
    ExpectBits("k = 0 y", g_plain.y, g_none.y);
    ExpectBits("k = 0 dx", g_plain.dx, g_none.dx);
    ExpectBits("k = 0 dw", g_plain.dw, g_none.dw);

    LinearQuant full = plain;  // k = K: the fp32 layer, up to the bf16 patch columns
    full.hcp_fwd = HotChannels{every.gi(), static_cast<int32_t>(in)};
    full.hcp_dgrad = HotChannels{every.gi(), static_cast<int32_t>(out)};
    full.hcp_wgrad_rows = static_cast<int32_t>(rows);
    const Result g_full = run(true, full);
    const double e_y = RelError(g_full.y, fp32.y), e_dx = RelError(g_full.dx, fp32.dx),
                 e_dw = RelError(g_full.dw, fp32.dw);
    std::printf("  k = K: relative error to fp32 y %.2e dx %.2e dw %.2e; NVFP4 alone y %.2e dx %.2e dw %.2e\n", e_y,
                e_dx, e_dw, RelError(g_plain.y, fp32.y), RelError(g_plain.dx, fp32.dx), RelError(g_plain.dw, fp32.dw));
    // bf16 columns: about 2^-9 of each residual product, against NVFP4's 1e-1.
    EXPECT_LT(e_y, 3e-3);
    EXPECT_LT(e_dx, 3e-3);
    EXPECT_LT(e_dw, 3e-3);
    EXPECT_GT(RelError(g_plain.y, fp32.y), 1e-2);

    // Scores against the CPU's.
    for (const Backend::HcpGemm gemm : {Backend::HcpGemm::kFwd, Backend::HcpGemm::kDgrad}) {
      const int64_t k_count = gemm == Backend::HcpGemm::kFwd ? in : out;
      Dual scores = Zeros(k_count);
      const Dual& a = gemm == Backend::HcpGemm::kFwd ? x : dy;
      ASSERT_OK(cpu_->HcpScores(gemm, a.c(), w.c(), rows, in, out, plain, scores.c()));
      ASSERT_OK(gpu_->HcpScores(gemm, a.g(), w.g(), rows, in, out, plain, scores.g()));
      ExpectElementwise(gemm == Backend::HcpGemm::kFwd ? "fwd scores" : "dgrad scores", Cpu(scores), Gpu(scores),
                        1e-5, 1e-9);
    }

    // Some channels, chosen by the call itself on both backends.
    LinearQuant some = plain;
    some.hcp_fwd = HotChannels{nullptr, 5, chosen.gi()};
    some.hcp_dgrad = HotChannels{nullptr, 5, chosen.gi() + 8};
    some.hcp_wgrad_rows = 6;
    LinearQuant some_cpu = some;
    some_cpu.hcp_fwd.choose_into = chosen.ci();
    some_cpu.hcp_dgrad.choose_into = chosen.ci() + 8;
    const Result g_some = run(true, some), c_some = run(false, some_cpu);
    const Result c_plain = run(false, plain);
    std::vector<int32_t> g_set(16), c_set(16);
    ASSERT_OK(gpu_->Download(g_set.data(), chosen.gi(), 16 * sizeof(int32_t)));
    ASSERT_OK(cpu_->Download(c_set.data(), chosen.ci(), 16 * sizeof(int32_t)));
    EXPECT_EQ(g_set, c_set) << "the hot sets CUDA chose";
    // The patch itself (patched minus plain) on each backend.
    for (auto [what, gp, g0, cp, c0] :
         {std::make_tuple("fwd patch", &g_some.y, &g_plain.y, &c_some.y, &c_plain.y),
          std::make_tuple("dgrad patch", &g_some.dx, &g_plain.dx, &c_some.dx, &c_plain.dx),
          std::make_tuple("wgrad patch", &g_some.dw, &g_plain.dw, &c_some.dw, &c_plain.dw)}) {
      std::vector<float> g_patch(gp->size()), c_patch(cp->size());
      for (size_t i = 0; i < g_patch.size(); ++i) {
        g_patch[i] = (*gp)[i] - (*g0)[i];
        c_patch[i] = (*cp)[i] - (*c0)[i];
      }
      ExpectNormwise(what, c_patch, g_patch, 2e-2);
      EXPECT_GT(RelError(c_patch, std::vector<float>(c_patch.size(), 0.0f)), 0.0) << what << " is not nothing";
    }
    // The set it chose, passed as index, gives the same bits again.
    LinearQuant given = plain;
    given.hcp_fwd = HotChannels{chosen.gi(), 5};
    given.hcp_dgrad = HotChannels{chosen.gi() + 8, 5};
    given.hcp_wgrad_rows = 6;
    const Result g_given = run(true, given);
    ExpectBits("chosen then given y", g_some.y, g_given.y);
    ExpectBits("chosen then given dx", g_some.dx, g_given.dx);
    ExpectBits("chosen then given dw", g_some.dw, g_given.dw);
  }
}

TEST_F(NnCudaTest, HcpTopKOrdersTiesByIndexAndNanFirst) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Dual scores = Floats({0.5f, 2.0f, nan, 2.0f, 1.0f, 3.0f, 2.0f});
  Dual top = Ints({-1, -1, -1, -1});
  ASSERT_OK(gpu_->HcpTopK(scores.g(), 7, 4, top.gi()));
  std::vector<int32_t> got(4);
  ASSERT_OK(gpu_->Download(got.data(), top.gi(), 4 * sizeof(int32_t)));
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3, 5}));
  // A larger set with many equal scores: the CPU's choice.
  std::vector<float> many(5000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<float>((i * 7919) % 13);
  Dual m = Floats(many);
  Dual idx = Ints(std::vector<int32_t>(700, -1));
  ASSERT_OK(cpu_->HcpTopK(m.c(), 5000, 700, idx.ci()));
  ASSERT_OK(gpu_->HcpTopK(m.g(), 5000, 700, idx.gi()));
  std::vector<int32_t> c(700), g(700);
  ASSERT_OK(cpu_->Download(c.data(), idx.ci(), 700 * sizeof(int32_t)));
  ASSERT_OK(gpu_->Download(g.data(), idx.gi(), 700 * sizeof(int32_t)));
  EXPECT_EQ(c, g);
  const Status s = gpu_->HcpTopK(scores.g(), 7, 8, top.gi());
  EXPECT_NE(s.message().find("k: 8 of count 7 is not allowed"), std::string::npos) << s.message();
}

// ============================================================================
// Layers
// ============================================================================

TEST_F(NnCudaTest, LayerNormMatchesCpu) {
  struct Case {
    int64_t rows, cols;
    bool beta;
  };
  for (const Case& k : {Case{512, 768, true}, Case{37, 100, false}, Case{64, 1023, true}}) {
    SCOPED_TRACE(std::to_string(k.rows) + "x" + std::to_string(k.cols));
    std::vector<float> xh = Normal(k.rows * k.cols, 81, 2.0f);
    for (float& v : xh) v += 0.7f;
    Dual x = Floats(xh), gamma = Floats(Normal(k.cols, 82)), beta = Floats(Normal(k.cols, 83)),
         y = Zeros(k.rows * k.cols), mean = Zeros(k.rows), rstd = Zeros(k.rows),
         dy = Floats(Normal(k.rows * k.cols, 84)), dx = Floats(Normal(k.rows * k.cols, 85)),
         dg = Floats(Normal(k.cols, 86)), db = Floats(Normal(k.cols, 87));
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->LayerNormForward(p(x), p(gamma), k.beta ? p(beta) : nullptr, p(y), p(mean), p(rstd), k.rows,
                                     k.cols, 1e-5f));
      ASSERT_OK(be->LayerNormBackward(p(x), p(gamma), p(mean), p(rstd), p(dy), p(dx), p(dg), k.beta ? p(db) : nullptr,
                                      k.rows, k.cols));
    }
    // Mean and variance are double sums on both sides, rounded once: equal or one
    // ulp apart, so y agrees to a few ulps of its terms.
    ExpectElementwise("layernorm mean", Cpu(mean), Gpu(mean), 1e-6, 1e-7);
    ExpectElementwise("layernorm rstd", Cpu(rstd), Gpu(rstd), 1e-6, 0.0);
    ExpectNormwise("layernorm y", Cpu(y), Gpu(y), 1e-6);
    ExpectNormwise("layernorm dx (+=)", Cpu(dx), Gpu(dx), 1e-5);
    // Column sums over the rows in another order.
    ExpectNormwise("layernorm dgamma (+=)", Cpu(dg), Gpu(dg), 1e-5);
    ExpectNormwise("layernorm dbeta (+=)", Cpu(db), Gpu(db), 1e-5);
  }
}

// AddLayerNormForward (the residual add fused into the LayerNorm after it)
// gives the bits of Add followed by LayerNormForward / LayerNormForwardBf16 on
// the GPU: the sum (written in place over y, or elsewhere), y or its bf16
// rounding, mean and rstd, and the bf16 output's non-finite count for the
// linear layer that reads it; the float4 and the scalar path.
TEST_F(NnCudaTest, AddLayerNormGivesTheBitsOfAddThenLayerNorm) {
  auto as_u16 = [this](const void* p, int64_t count) {
    std::vector<uint16_t> v(static_cast<size_t>(count));
    EXPECT_OK(gpu_->Download(v.data(), p, v.size() * sizeof(uint16_t)));
    return v;
  };
  const int64_t rows = 77;
  for (const int64_t cols : {int64_t{768}, int64_t{765}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const int64_t n = rows * cols;
    std::vector<float> yh = Normal(n, 111, 2.0f), rh = Normal(n, 112, 3.0f);
    yh[cols * 3 + 1] = std::numeric_limits<float>::infinity();  // one non-finite row
    Dual gamma = Floats(Normal(cols, 113)), beta = Floats(Normal(cols, 114, 0.1f)), res = Floats(rh);
    // The reference: Add, then each LayerNorm.
    Dual ref_sum = Floats(yh), ref_y = Zeros(n), ref_yb = Zeros(n), ref_mean = Zeros(rows), ref_rstd = Zeros(rows);
    ASSERT_OK(gpu_->Add(ref_sum.g(), res.g(), ref_sum.g(), n));
    ASSERT_OK(gpu_->LayerNormForward(ref_sum.g(), gamma.g(), beta.g(), ref_y.g(), ref_mean.g(), ref_rstd.g(), rows,
                                     cols, 1e-5f));
    ASSERT_OK(gpu_->LayerNormForwardBf16(ref_sum.g(), gamma.g(), beta.g(), reinterpret_cast<uint16_t*>(ref_yb.g()),
                                         ref_mean.g(), ref_rstd.g(), rows, cols, 1e-5f));
    for (const bool in_place : {true, false}) {
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(std::string(in_place ? "sum over y" : "sum apart") + (bf16 ? ", bf16" : ", fp32"));
        Dual y = Floats(yh), sum = Zeros(n), out = Zeros(n), mean = Zeros(rows), rstd = Zeros(rows);
        float* s = in_place ? y.g() : sum.g();
        ASSERT_OK(gpu_->AddLayerNormForward(y.g(), res.g(), s, gamma.g(), beta.g(), bf16 ? nullptr : out.g(),
                                            bf16 ? reinterpret_cast<uint16_t*>(out.g()) : nullptr, mean.g(), rstd.g(),
                                            rows, cols, 1e-5f));
        ExpectBits("sum", Gpu(ref_sum), in_place ? Gpu(y) : Gpu(sum));
        if (bf16) {
          EXPECT_EQ(as_u16(ref_yb.g(), n), as_u16(out.g(), n));
        } else {
          ExpectBits("y", Gpu(ref_y), Gpu(out));
        }
        ExpectBits("mean", Gpu(ref_mean), Gpu(mean));
        ExpectBits("rstd", Gpu(ref_rstd), Gpu(rstd));
      }
    }
    // The bf16 output's non-finite count reaches the statistics of the linear
    // layer that reads it, as LayerNormForwardBf16's does.
    const int64_t out_cols = 64;
    Dual w = Floats(Normal(out_cols * cols, 115, 0.1f)), lin = Zeros(rows * out_cols);
    Dual y = Floats(yh), xb = Zeros(n), mean = Zeros(rows), rstd = Zeros(rows);
    LinearQuant q = AllRoles(Quant(QuantFormat::kBf16));
    q.stats_slot = 0;
    q.x_bf16 = reinterpret_cast<const uint16_t*>(xb.g());
    q.x_bf16_ld = cols;
    std::vector<OperandStats> fused, apart;
    ASSERT_OK(gpu_->ResetOperandStats(1));
    ASSERT_OK(gpu_->LayerNormForwardBf16(ref_sum.g(), gamma.g(), beta.g(), reinterpret_cast<uint16_t*>(xb.g()),
                                         mean.g(), rstd.g(), rows, cols, 1e-5f));
    ASSERT_OK(gpu_->LinearForward(nullptr, w.g(), nullptr, nullptr, lin.g(), rows, cols, out_cols, q));
    ASSERT_OK(gpu_->ReadOperandStats(&apart));
    ASSERT_OK(gpu_->ResetOperandStats(1));
    ASSERT_OK(gpu_->AddLayerNormForward(y.g(), res.g(), y.g(), gamma.g(), beta.g(), nullptr,
                                        reinterpret_cast<uint16_t*>(xb.g()), mean.g(), rstd.g(), rows, cols, 1e-5f));
    ASSERT_OK(gpu_->LinearForward(nullptr, w.g(), nullptr, nullptr, lin.g(), rows, cols, out_cols, q));
    ASSERT_OK(gpu_->ReadOperandStats(&fused));
    ExpectStatsEqual("the producer's count", apart, fused);
    EXPECT_GT(fused[R(Role::kFwdX)].nan_blocks, 0);  // the row with the Inf
  }
  // Refusals: both outputs or neither, a sum over the residual.
  Dual a = Zeros(8), b = Zeros(8), g = Zeros(4), o = Zeros(8), m = Zeros(2), r = Zeros(2);
  EXPECT_FALSE(gpu_->AddLayerNormForward(a.g(), b.g(), a.g(), g.g(), nullptr, nullptr, nullptr, m.g(), r.g(), 2, 4,
                                         1e-5f).ok());
  EXPECT_FALSE(gpu_->AddLayerNormForward(a.g(), b.g(), b.g(), g.g(), nullptr, o.g(), nullptr, m.g(), r.g(), 2, 4,
                                         1e-5f).ok());
}

TEST_F(NnCudaTest, GeluAndSwigluMatchToLibmUlps) {
  const int64_t n = (1 << 18) + 1, rows = 300, h = 257;
  Dual x = Floats(Normal(n, 91, 3.0f)), dy = Floats(Normal(n, 92)), y = Zeros(n), dx = Zeros(n);
  Dual xs = Floats(Normal(rows * 2 * h, 93, 3.0f)), dys = Floats(Normal(rows * h, 94)), ys = Zeros(rows * h),
       dxs = Zeros(rows * 2 * h);
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    ASSERT_OK(be->GeluForward(p(x), p(y), n));
    ASSERT_OK(be->GeluBackward(p(x), p(dy), p(dx), n));
    ASSERT_OK(be->SwigluForward(p(xs), p(ys), rows, h));
    ASSERT_OK(be->SwigluBackward(p(xs), p(dys), p(dxs), rows, h));
  }
  // erff / expf differ by an ulp or two between CUDA and glibc: a few ulps of the
  // result. Where the formula cancels, an ulp of an O(1) term becomes an absolute
  // error: 1 + erf(x / sqrt 2) for x < -4 (CUDA's erff returns -1 where glibc's is an
  // ulp above: gelu -1.7e-7 against -0), Phi + x phi, and 1 + a (1 - s) near a =
  // -1.28 in silu'. Seen on the H200: up to 3.7e-7 on values of order 1; the floor
  // is 1e-6.
  ExpectElementwise("gelu y", Cpu(y), Gpu(y), 2e-6, 1e-6);
  ExpectElementwise("gelu dx", Cpu(dx), Gpu(dx), 2e-6, 1e-6);
  ExpectElementwise("swiglu y", Cpu(ys), Gpu(ys), 2e-6, 1e-6);
  ExpectElementwise("swiglu dx", Cpu(dxs), Gpu(dxs), 2e-6, 1e-6);
}

TEST_F(NnCudaTest, EmbeddingMatchesBitForBit) {
  const int64_t batch = 4, seq = 64, dim = 96, vocab = 50;
  Dual tokens = Ints(Tokens(batch * seq, vocab, 101)), wte = Floats(Normal(vocab * dim, 102)),
       wpe = Floats(Normal(seq * dim, 103)), out = Zeros(batch * seq * dim),
       dout = Floats(Normal(batch * seq * dim, 104)), dwte = Floats(Normal(vocab * dim, 105)),
       dwpe = Floats(Normal(seq * dim, 106));
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    ASSERT_OK(be->EmbeddingForward(g ? tokens.gi() : tokens.ci(), p(wte), p(wpe), p(out), batch, seq, dim));
    ASSERT_OK(be->EmbeddingBackward(g ? tokens.gi() : tokens.ci(), p(dout), p(dwte), p(dwpe), batch, seq, dim));
  }
  // The GPU adds each token's rows in position order, as the CPU does: bit for bit.
  ExpectBits("embedding out", Cpu(out), Gpu(out));
  ExpectBits("embedding dwte (+=)", Cpu(dwte), Gpu(dwte));
  ExpectBits("embedding dwpe (+=)", Cpu(dwpe), Gpu(dwpe));
}

TEST_F(NnCudaTest, RmsNormMatchesCpu) {
  struct Case {
    int64_t rows, cols;
  };
  // 768: the float4 forward; 100 and 1023: the scalar one (1023 also no multiple of 32).
  for (const Case& k : {Case{512, 768}, Case{37, 100}, Case{64, 1023}}) {
    SCOPED_TRACE(std::to_string(k.rows) + "x" + std::to_string(k.cols));
    std::vector<float> xh = Normal(k.rows * k.cols, 261, 2.0f);
    for (float& v : xh) v += 0.7f;
    Dual x = Floats(xh), gain = Floats(Normal(k.cols, 262)), y = Zeros(k.rows * k.cols), rstd = Zeros(k.rows),
         dy = Floats(Normal(k.rows * k.cols, 263)), dx = Floats(Normal(k.rows * k.cols, 264)),
         dg = Floats(Normal(k.cols, 265));
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->RmsNormForward(p(x), p(gain), p(y), p(rstd), k.rows, k.cols, 1e-5f));
      ASSERT_OK(be->RmsNormBackward(p(x), p(gain), p(rstd), p(dy), p(dx), p(dg), k.rows, k.cols));
    }
    // The mean square is a double sum on both sides (in another order), rounded
    // once to fp32: equal or an ulp apart, so rstd agrees to an ulp or two and y
    // to a few ulps of its terms, as LayerNorm's.
    ExpectElementwise("rmsnorm rstd", Cpu(rstd), Gpu(rstd), 1e-6, 0.0);
    ExpectNormwise("rmsnorm y", Cpu(y), Gpu(y), 1e-6);
    // dx: the row's mean(g * xhat) in double, then per-element fp32 (an ulp of
    // rstd moves every term); dgain: column sums over the rows in another order.
    ExpectNormwise("rmsnorm dx (+=)", Cpu(dx), Gpu(dx), 1e-5);
    ExpectNormwise("rmsnorm dgain (+=)", Cpu(dg), Gpu(dg), 1e-5);
  }
}

TEST_F(NnCudaTest, RopeMatchesBitForBit) {
  struct Case {
    int64_t batch, seq, heads, hd, ld;
  };
  // A llama qkv buffer (q and k: 2 x 12 heads of 64, rows of 3 x 768) and an odd
  // small shape (head size 6, rows with 7 untouched columns).
  for (const Case& k : {Case{4, 64, 24, 64, 3 * 768}, Case{3, 17, 5, 6, 37}}) {
    SCOPED_TRACE("heads " + std::to_string(k.heads) + ", hd " + std::to_string(k.hd));
    std::vector<float> cos, sin;
    RopeTables(10000.0, k.seq, k.hd, &cos, &sin);
    const int64_t n = k.batch * k.seq * k.ld;
    Dual c = Floats(cos), s = Floats(sin), x = Floats(Normal(n, 271)), y = Floats(Normal(n, 272)),
         in_place = Floats(Normal(n, 271)), dy = Floats(Normal(n, 273)), dx = Floats(Normal(n, 274));
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->RopeForward(p(x), p(y), p(c), p(s), k.batch, k.seq, k.heads, k.hd, k.ld));
      ASSERT_OK(be->RopeForward(p(in_place), p(in_place), p(c), p(s), k.batch, k.seq, k.heads, k.hd, k.ld));
      ASSERT_OK(be->RopeBackward(p(dy), p(dx), p(c), p(s), k.batch, k.seq, k.heads, k.hd, k.ld));
    }
    // Two fp32 products and a sum or difference per output from the same table
    // entries (RopeTables, made on the host), no fused multiply-add on either side:
    // the same bits. The columns past heads * hd keep their old values on both.
    ExpectBits("rope y", Cpu(y), Gpu(y));
    ExpectBits("rope in place", Cpu(in_place), Gpu(in_place));
    // In place rotates the same columns to the same bits as out of place.
    auto rotated = [&](const std::vector<float>& v) {
      std::vector<float> cols;
      for (int64_t r = 0; r < k.batch * k.seq; ++r) {
        cols.insert(cols.end(), v.begin() + r * k.ld, v.begin() + r * k.ld + k.heads * k.hd);
      }
      return cols;
    };
    ExpectBits("rope in place == out of place", rotated(Gpu(y)), rotated(Gpu(in_place)));
    ExpectBits("rope backward", Cpu(dx), Gpu(dx));
  }
}

TEST_F(NnCudaTest, EmbeddingWithoutPositionsMatchesBitForBit) {
  const int64_t batch = 4, seq = 64, dim = 96, vocab = 50;
  Dual tokens = Ints(Tokens(batch * seq, vocab, 281)), wte = Floats(Normal(vocab * dim, 282)),
       out = Zeros(batch * seq * dim), dout = Floats(Normal(batch * seq * dim, 283)),
       dwte = Floats(Normal(vocab * dim, 284));
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    ASSERT_OK(be->EmbeddingForward(g ? tokens.gi() : tokens.ci(), p(wte), nullptr, p(out), batch, seq, dim));
    ASSERT_OK(be->EmbeddingBackward(g ? tokens.gi() : tokens.ci(), p(dout), p(dwte), nullptr, batch, seq, dim));
  }
  // Rows copied, and each token's rows added in position order on both: bit for bit.
  ExpectBits("embedding out (no positions)", Cpu(out), Gpu(out));
  ExpectBits("embedding dwte (no positions)", Cpu(dwte), Gpu(dwte));
}

// Three shapes: head size 64 and 32 (the fused kernels; seq 100 leaves a partial
// tile) and 48 (the GEMM path for bf16 too); fp32 always takes the GEMM path.
TEST_F(NnCudaTest, AttentionMatchesCpu) {
  struct AttentionShape {
    int64_t batch, seq, heads, dim;
  };
  for (const AttentionShape& shape : {AttentionShape{2, 192, 4, 256}, AttentionShape{1, 100, 2, 64},
                                      AttentionShape{1, 70, 2, 96}}) {
    const int64_t batch = shape.batch, seq = shape.seq, heads = shape.heads, dim = shape.dim;
    Dual qkv = Floats(Normal(batch * seq * 3 * dim, 111)), out = Zeros(batch * seq * dim),
         stats = Zeros(batch * heads * seq * 2), dout = Floats(Normal(batch * seq * dim, 112)),
         dqkv = Zeros(batch * seq * 3 * dim);
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16 operands" : "fp32") + ", head size " + std::to_string(dim / heads) +
                   ", seq " + std::to_string(seq));
      std::printf("attention %s, batch %lld seq %lld heads %lld dim %lld\n", bf16 ? "bf16 operands" : "fp32",
                  static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(heads),
                  static_cast<long long>(dim));
      for (Backend* be : {cpu_.get(), gpu_.get()}) {
        const bool g = be == gpu_.get();
        auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
        ASSERT_OK(be->AttentionForward(p(qkv), p(out), p(stats), batch, seq, heads, dim, bf16));
        ASSERT_OK(be->AttentionBackward(p(qkv), p(out), p(stats), p(dout), p(dqkv), batch, seq, heads, dim, bf16));
      }
      // (m, 1 / l) per row: a max of fp32 dots summed in another order, and a sum
      // of exponentials (online on the fused path).
      ExpectNormwise("stats", Cpu(stats), Gpu(stats), 1e-5);
      const std::vector<float> co = Cpu(out), go = Gpu(out), cd = Cpu(dqkv), gd = Gpu(dqkv);
      if (!bf16) {
        ExpectNormwise("out", co, go, 1e-5);
        ExpectNormwise("dqkv", cd, gd, 1e-5);
      } else {
        // See the file comment: a probability or dS a hair from a bf16 rounding
        // boundary can round the other way on one side.
        for (const auto& t : {std::make_pair(std::string("out"), std::make_pair(&co, &go)),
                              std::make_pair(std::string("dqkv"), std::make_pair(&cd, &gd))}) {
          const std::vector<float>& c = *t.second.first;
          const std::vector<float>& g = *t.second.second;
          ExpectNormwise(t.first + " (all)", c, g, 4e-3);
          double max_ref = 0;
          for (float v : c) max_ref = std::max(max_ref, std::fabs(static_cast<double>(v)));
          int64_t far = 0;
          for (size_t i = 0; i < c.size(); ++i) far += std::fabs(static_cast<double>(g[i]) - c[i]) > 1e-5 * max_ref;
          EXPECT_LE(far, static_cast<int64_t>(c.size() / 100)) << t.first;
          std::printf("  %-44s %lld of %zu elements beyond 1e-5 normwise\n", (t.first + " (tight)").c_str(),
                      static_cast<long long>(far), c.size());
        }
      }
    }
  }
}

// flash_one_pass (KEEL_CUDA_ON): the fused forward's one walk over the keys keeps
// the two-pass stats bit for bit, and its output, whose P is rounded to bf16
// before it is normalized, stays within AttentionMatchesCpu's bf16 tolerance of
// the CPU reference (and differs from the two-pass output, or the switch did
// nothing). Head sizes 64 and 32, sequences with a partial last tile.
TEST_F(NnCudaTest, FlashOnePassForwardKeepsTheStatsAndTheTolerance) {
  std::unique_ptr<Backend> one_pass = BackendWith("flash_one_pass");
  ASSERT_TRUE(one_pass != nullptr);
  EXPECT_NE(one_pass->Describe().find("; KEEL_CUDA_ON=flash_one_pass"), std::string::npos) << one_pass->Describe();
  struct AttentionShape {
    int64_t batch, seq, heads, dim;
  };
  for (const AttentionShape& shape : {AttentionShape{2, 192, 4, 256}, AttentionShape{1, 100, 2, 64},
                                      AttentionShape{2, 300, 2, 128}}) {
    const int64_t batch = shape.batch, seq = shape.seq, heads = shape.heads, dim = shape.dim;
    SCOPED_TRACE("head size " + std::to_string(dim / heads) + ", seq " + std::to_string(seq));
    Dual qkv = Floats(Normal(batch * seq * 3 * dim, 121));
    Dual out_cpu = Zeros(batch * seq * dim), stats_cpu = Zeros(batch * heads * seq * 2);
    Dual out_two = Zeros(batch * seq * dim), stats_two = Zeros(batch * heads * seq * 2);
    Dual out_one = Zeros(batch * seq * dim), stats_one = Zeros(batch * heads * seq * 2);
    ASSERT_OK(cpu_->AttentionForward(qkv.c(), out_cpu.c(), stats_cpu.c(), batch, seq, heads, dim, true));
    ASSERT_OK(gpu_->AttentionForward(qkv.g(), out_two.g(), stats_two.g(), batch, seq, heads, dim, true));
    ASSERT_OK(one_pass->AttentionForward(qkv.g(), out_one.g(), stats_one.g(), batch, seq, heads, dim, true));
    ASSERT_OK(gpu_->Sync());
    ASSERT_OK(one_pass->Sync());
    ExpectBits("stats", Get(gpu_.get(), stats_two.g(), stats_two.bytes), Get(one_pass.get(), stats_one.g(), stats_one.bytes));
    const std::vector<float> c = Cpu(out_cpu), two = Gpu(out_two), one = Get(one_pass.get(), out_one.g(), out_one.bytes);
    ExpectNormwise("one pass against the CPU", c, one, 4e-3);
    EXPECT_NE(one, two);
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(c[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(one[i]) - two[i]));
    }
    std::printf("  one pass against two: largest difference %.3g (largest |out| %.3g)\n", max_diff, max_ref);
  }
}

// cudnn_attention and cudnn_attention_bwd (KEEL_CUDA_ON), each alone and both: where
// libcudnn.so.9 loads (the GPU machine; the test fails where it does not, since its point
// is to run it), the fused forward and / or backward run cuDNN's SDPA graphs. Against the
// CPU reference: out within 6e-3 normwise where cuDNN's forward computed it
// (AttentionMatchesCpu's bf16 tolerance, 4e-3, plus 2^-9, the largest relative error of
// the bf16 rounding cuDNN's O gets; cuDNN's forward also rounds P before it is normalized,
// as flash_one_pass does; session 41 measured 2.8e-3 to 4.5e-3, the largest at head size
// 32), else 4e-3; dqkv within 8e-3 where cuDNN's backward computed it (dQ, dK, dV rounded
// to bf16, and D from bf16 dout and O: session 41 measured 2.1e-3 to 3.4e-3 at head size
// 64 and 6.3e-3 at head size 32 behind Keel's forward), 6e-3 behind cuDNN's forward alone
// (its out), else 4e-3; the stats (lse, 1) with lse
// the CPU's m + log l within 1e-5 where cuDNN's forward ran. Two runs the same bits (the
// backward's deterministic variant); the kept-heads pair (how the gpt model calls it) the
// bits of the unkept one. Head size 64 at GPT-2's shape (batch 2) and a small one must run
// on cuDNN (the description says so); head size 32 with seq 100 may fall back, and the
// description must then say why.
TEST_F(NnCudaTest, CudnnAttentionMatchesCpu) {
  struct AttentionShape {
    int64_t batch, seq, heads, dim;
    bool must_run;
  };
  struct Mode {
    const char* on;
    bool forward, backward;
  };
  for (const Mode& m : {Mode{"cudnn_attention", true, false}, Mode{"cudnn_attention_bwd", false, true},
                        Mode{"cudnn_attention,cudnn_attention_bwd", true, true}}) {
    const std::string mode(m.on);
    const bool forward = m.forward, backward = m.backward;
    for (const AttentionShape& shape : {AttentionShape{2, 1024, 12, 768, true}, AttentionShape{2, 192, 4, 256, true},
                                        AttentionShape{1, 100, 2, 64, false}}) {
      const int64_t batch = shape.batch, seq = shape.seq, heads = shape.heads, dim = shape.dim;
      SCOPED_TRACE(mode + ", head size " + std::to_string(dim / heads) + ", seq " + std::to_string(seq));
      std::unique_ptr<Backend> cud = BackendWith(m.on);
      ASSERT_TRUE(cud != nullptr);
      ASSERT_EQ(cud->Describe().find("cudnn_attention unavailable"), std::string::npos) << cud->Describe();
      const int64_t rows = batch * heads * seq;
      Dual qkv = Floats(Normal(batch * seq * 3 * dim, 131)), dout = Floats(Normal(batch * seq * dim, 132));
      Dual out_cpu = Zeros(batch * seq * dim), stats_cpu = Zeros(rows * 2), dqkv_cpu = Zeros(batch * seq * 3 * dim);
      Dual out = Zeros(batch * seq * dim), stats = Zeros(rows * 2), dqkv = Zeros(batch * seq * 3 * dim);
      Dual out2 = Zeros(batch * seq * dim), stats2 = Zeros(rows * 2), dqkv2 = Zeros(batch * seq * 3 * dim);
      Dual kept = Zeros(batch * seq * 3 * dim / 2), out_k = Zeros(batch * seq * dim), stats_k = Zeros(rows * 2),
           dqkv_k = Zeros(batch * seq * 3 * dim);
      ASSERT_OK(cpu_->AttentionForward(qkv.c(), out_cpu.c(), stats_cpu.c(), batch, seq, heads, dim, true));
      ASSERT_OK(cpu_->AttentionBackward(qkv.c(), out_cpu.c(), stats_cpu.c(), dout.c(), dqkv_cpu.c(), batch, seq,
                                        heads, dim, true));
      ASSERT_OK(cud->AttentionForward(qkv.g(), out.g(), stats.g(), batch, seq, heads, dim, true));
      ASSERT_OK(cud->AttentionBackward(qkv.g(), out.g(), stats.g(), dout.g(), dqkv.g(), batch, seq, heads, dim, true));
      ASSERT_OK(cud->AttentionForward(qkv.g(), out2.g(), stats2.g(), batch, seq, heads, dim, true));
      ASSERT_OK(
          cud->AttentionBackward(qkv.g(), out2.g(), stats2.g(), dout.g(), dqkv2.g(), batch, seq, heads, dim, true));
      ASSERT_OK(cud->AttentionForwardKeep(qkv.g(), kept.g(), out_k.g(), stats_k.g(), batch, seq, heads, dim, true));
      ASSERT_OK(cud->AttentionBackwardKept(kept.g(), out_k.g(), stats_k.g(), dout.g(), dqkv_k.g(), batch, seq, heads,
                                           dim, true));
      ASSERT_OK(cud->Sync());
      const std::string said = cud->Describe();
      std::printf("  %s\n", said.c_str());
      const bool ran_forward = said.find("attention forward ran on cuDNN") != std::string::npos;
      const bool ran_backward = said.find("attention backward ran on cuDNN") != std::string::npos;
      EXPECT_FALSE(ran_forward && !forward) << said;
      EXPECT_FALSE(ran_backward && !backward) << said;
      if (shape.must_run) {
        ASSERT_EQ(ran_forward, forward) << said;
        ASSERT_EQ(ran_backward, backward) << said;
      } else if (ran_forward != forward || ran_backward != backward) {
        EXPECT_NE(said.find(" fell back to Keel's kernels ("), std::string::npos) << said;
      }
      auto get = [&](const Dual& d) { return Get(cud.get(), d.g(), d.bytes); };
      const std::vector<float> o = get(out), st = get(stats), cs = Cpu(stats_cpu), dq = get(dqkv);
      ExpectBits("out, run twice", o, get(out2));
      ExpectBits("stats, run twice", st, get(stats2));
      ExpectBits("dqkv, run twice", dq, get(dqkv2));
      ExpectBits("out, kept heads", o, get(out_k));
      ExpectBits("stats, kept heads", st, get(stats_k));
      ExpectBits("dqkv, kept heads", dq, get(dqkv_k));
      ExpectNormwise("out against the CPU", Cpu(out_cpu), o, ran_forward ? 6e-3 : 4e-3);
      ExpectNormwise("dqkv against the CPU", Cpu(dqkv_cpu), dq, ran_backward ? 8e-3 : ran_forward ? 6e-3 : 4e-3);
      if (ran_forward) {
        std::vector<float> lse_cpu(rows), lse(rows);
        int64_t not_one = 0;
        for (int64_t r = 0; r < rows; ++r) {
          lse_cpu[r] = cs[2 * r] - std::log(cs[2 * r + 1]);
          lse[r] = st[2 * r];
          not_one += st[2 * r + 1] != 1.0f;
        }
        ExpectNormwise("lse against the CPU's m + log l", lse_cpu, lse, 1e-5);
        EXPECT_EQ(not_one, 0);
      }
    }
  }
}

// AttentionForwardKeep / AttentionBackwardKept (the heads the forward packed, read again by the
// backward) against AttentionForward / AttentionBackward on the same qkv: out, stats and dqkv bit for
// bit, with qkv taken from dqkv's buffer and the backward then writing dqkv over it (how the gpt model
// uses the pair). Head sizes 64 and 32 are kept; 48 (no fused kernel), fp32 operands, a backend with
// KEEL_CUDA_OFF=kept_heads and the CPU backend keep nothing, and the calls say why.
TEST_F(NnCudaTest, AttentionKeptHeadsGiveTheBitsOfTheUnkeptPair) {
  struct AttentionShape {
    int64_t batch, seq, heads, dim;
  };
  for (const AttentionShape& shape : {AttentionShape{2, 192, 4, 256}, AttentionShape{1, 100, 2, 64}}) {
    const int64_t batch = shape.batch, seq = shape.seq, heads = shape.heads, dim = shape.dim;
    SCOPED_TRACE("head size " + std::to_string(dim / heads) + ", seq " + std::to_string(seq));
    ASSERT_TRUE(gpu_->KeepsAttentionHeads(dim / heads, true));
    const std::vector<float> qkv_h = Normal(batch * seq * 3 * dim, 121), dout_h = Normal(batch * seq * dim, 122);
    Dual qkv = Floats(qkv_h), dout = Floats(dout_h);
    Dual out0 = Zeros(batch * seq * dim), stats0 = Zeros(batch * heads * seq * 2), dqkv0 = Zeros(batch * seq * 3 * dim);
    ASSERT_OK(gpu_->AttentionForward(qkv.g(), out0.g(), stats0.g(), batch, seq, heads, dim, true));
    ASSERT_OK(gpu_->AttentionBackward(qkv.g(), out0.g(), stats0.g(), dout.g(), dqkv0.g(), batch, seq, heads, dim,
                                      true));
    // kept: 3 * batch * seq * dim bf16 values (half of qkv's floats), filled with NaN so that a head the
    // forward did not write shows.
    Dual kept = Floats(std::vector<float>(batch * seq * 3 * dim / 2, std::numeric_limits<float>::quiet_NaN()));
    Dual out1 = Zeros(batch * seq * dim), stats1 = Zeros(batch * heads * seq * 2), dqkv1 = Floats(qkv_h);
    ASSERT_OK(gpu_->AttentionForwardKeep(dqkv1.g(), kept.g(), out1.g(), stats1.g(), batch, seq, heads, dim, true));
    ASSERT_OK(gpu_->AttentionBackwardKept(kept.g(), out1.g(), stats1.g(), dout.g(), dqkv1.g(), batch, seq, heads,
                                          dim, true));
    ExpectBits("out", Gpu(out0), Gpu(out1));
    ExpectBits("stats", Gpu(stats0), Gpu(stats1));
    ExpectBits("dqkv", Gpu(dqkv0), Gpu(dqkv1));
  }
  EXPECT_FALSE(gpu_->KeepsAttentionHeads(48, true));
  EXPECT_FALSE(gpu_->KeepsAttentionHeads(64, false));
  EXPECT_FALSE(cpu_->KeepsAttentionHeads(64, true));
  std::unique_ptr<Backend> off = BackendWithout("kept_heads");
  ASSERT_TRUE(off != nullptr);
  EXPECT_FALSE(off->KeepsAttentionHeads(64, true));
  Dual qkv = Floats(Normal(1 * 70 * 3 * 96, 123)), kept = Zeros(1 * 70 * 3 * 96), out = Zeros(1 * 70 * 96),
       stats = Zeros(1 * 2 * 70 * 2);
  Status s = gpu_->AttentionForwardKeep(qkv.g(), kept.g(), out.g(), stats.g(), 1, 70, 2, 96, true);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("AttentionForwardKeep: head size 48 is not kept"), std::string::npos) << s.message();
  s = cpu_->AttentionForwardKeep(qkv.c(), kept.c(), out.c(), stats.c(), 1, 70, 2, 96, true);
  EXPECT_NE(s.message().find("not implemented by the cpu backend"), std::string::npos) << s.message();
}

// ---- Gated linear attention (GLA) -------------------------------------------------------

TEST_F(NnCudaTest, GlaGatesMatchToLibmUlps) {
  const int64_t n = (1 << 16) + 3, rows = 300, cols = 257, g_ld = 3 * 257;
  const float scale = 1.0f / 16.0f;
  Dual x = Floats(Normal(n, 271, 6.0f)), dy = Floats(Normal(n, 272)), y = Zeros(n), dx = Zeros(n);
  Dual xs = Floats(Normal(rows * cols, 273)), gs = Floats(Normal(rows * g_ld, 274, 3.0f)),
       dys = Floats(Normal(rows * cols, 275)), ys = Zeros(rows * cols), dxs = Zeros(rows * cols),
       dgs = Floats(std::vector<float>(rows * g_ld, 7.0f));
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool g = be == gpu_.get();
    auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
    ASSERT_OK(be->LogSigmoidForward(p(x), p(y), n, scale));
    ASSERT_OK(be->LogSigmoidBackward(p(x), p(dy), p(dx), n, scale));
    // g is the middle third of each row, as the gla model's g inside qkvg.
    ASSERT_OK(be->SiluGateForward(p(xs), p(gs) + cols, g_ld, p(ys), rows, cols));
    ASSERT_OK(be->SiluGateBackward(p(xs), p(gs) + cols, g_ld, p(dys), p(dxs), p(dgs) + cols, rows, cols));
  }
  // expf / log1pf differ by an ulp or two between CUDA and glibc: a few ulps of
  // the result, and near silu'(a)'s cancellation (a ~ -1.28) an ulp of an O(1)
  // term as an absolute error, as GeluAndSwigluMatchToLibmUlps allows.
  ExpectElementwise("logsigmoid y", Cpu(y), Gpu(y), 2e-6, 1e-7);
  ExpectElementwise("logsigmoid dx", Cpu(dx), Gpu(dx), 2e-6, 1e-7);
  ExpectElementwise("silu gate y", Cpu(ys), Gpu(ys), 2e-6, 1e-6);
  ExpectElementwise("silu gate dx", Cpu(dxs), Gpu(dxs), 2e-6, 1e-6);
  // dg's other columns keep their 7s on both (ExpectElementwise compares them too).
  const std::vector<float> dg_gpu = Gpu(dgs);
  EXPECT_EQ(dg_gpu[0], 7.0f);
  EXPECT_EQ(dg_gpu[2 * cols], 7.0f);
  ExpectElementwise("silu gate dg", Cpu(dgs), dg_gpu, 2e-6, 1e-6);
}

// The CUDA chunked recurrence against the CPU's sequential definition: several
// chunks with a short last one, value heads that fill one tile, two tiles (the
// second partial) and the largest key head (kGlaMaxKeyHead), moderate gates and
// gates so negative (-30 |N|) that a chunk's cumulative sums fall far below -88.
// qkv's rows carry extra columns (the gla model's g) that the backward must not
// touch. Tolerance: the two forms sum the same products in other orders (the
// chunked one splits each sum into inter- and intra-chunk parts and, in the
// backward, into value tiles), and expf differs by an ulp: errors of a few
// hundred fp32 ulps of the largest partial sums, normwise ~1e-6; dgk is a
// reverse cumulative sum of q dq - k dk over the sequence, whose terms cancel,
// so its normwise error can be a few times larger. Allowed: 2e-5 (out, dqkv) and
// 5e-5 (dgk). With gates of -30 |N| the chunked decays exp(B_t - B_s) carry an
// ulp of |B| ~ 1500 (1.2e-4) as relative error (GlaChunkedMatchesSequential in
// nn_cpu_test sees 9e-5 on the host): 3e-4 there. A wrong term (a missing decay,
// an off-by-one in the causal mask, a tile's part lost) is off by O(1e-1).
TEST_F(NnCudaTest, GlaMatchesCpu) {
  struct Case {
    int64_t batch, seq, heads, dk, dv;
    float gates;
  };
  for (const Case& k : {Case{2, 200, 2, 32, 64, 0.1f}, Case{1, 64, 4, 384, 160, 0.05f}, Case{1, 130, 1, 128, 64, 0.1f},
                        Case{2, 150, 2, 32, 64, 30.0f}}) {
    SCOPED_TRACE("batch " + std::to_string(k.batch) + ", seq " + std::to_string(k.seq) + ", heads " +
                 std::to_string(k.heads) + ", dk " + std::to_string(k.dk) + ", dv " + std::to_string(k.dv) +
                 ", gates " + std::to_string(k.gates));
    const int64_t rows = k.batch * k.seq, ld = 2 * k.dk + k.dv + 5;
    Dual qkv = Floats(Normal(rows * ld, 281)), gk = Floats(nn_test::LogGates(rows * k.dk, 282, k.gates)),
         out = Zeros(rows * k.dv), dout = Floats(Normal(rows * k.dv, 283)),
         dqkv = Floats(std::vector<float>(rows * ld, 7.0f)), dgk = Zeros(rows * k.dk);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->GlaForward(p(qkv), ld, p(gk), p(out), k.batch, k.seq, k.heads, k.dk, k.dv));
      ASSERT_OK(be->GlaBackward(p(qkv), ld, p(gk), p(dout), p(dqkv), p(dgk), k.batch, k.seq, k.heads, k.dk, k.dv));
    }
    const std::vector<float> dqkv_gpu = Gpu(dqkv);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 2 * k.dk + k.dv; c < ld; ++c) ASSERT_EQ(dqkv_gpu[r * ld + c], 7.0f) << r << ", " << c;
    }
    const bool steep = k.gates > 1.0f;
    ExpectNormwise("gla out", Cpu(out), Gpu(out), steep ? 3e-4 : 2e-5);
    ExpectNormwise("gla dqkv", Cpu(dqkv), dqkv_gpu, steep ? 3e-4 : 2e-5);
    ExpectNormwise("gla dgk", Cpu(dgk), Gpu(dgk), steep ? 3e-4 : 5e-5);
    // Deterministic: a second run gives the same bits.
    const std::vector<float> out1 = Gpu(out), dgk1 = Gpu(dgk);
    ASSERT_OK(gpu_->GlaForward(qkv.g(), ld, gk.g(), out.g(), k.batch, k.seq, k.heads, k.dk, k.dv));
    ASSERT_OK(gpu_->GlaBackward(qkv.g(), ld, gk.g(), dout.g(), dqkv.g(), dgk.g(), k.batch, k.seq, k.heads, k.dk,
                                k.dv));
    ExpectBits("gla out, second run", out1, Gpu(out));
    ExpectBits("gla dqkv, second run", dqkv_gpu, Gpu(dqkv));
    ExpectBits("gla dgk, second run", dgk1, Gpu(dgk));
  }
}

TEST_F(NnCudaTest, GlaRefusesAKeyHeadAboveTheLimit) {
  Dual buf = Zeros(4 * 1000);
  const Status s = gpu_->GlaForward(buf.g(), 400, buf.g(), buf.g(), 1, 2, 1, 130, 64);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("GlaForward: dk / heads: 130 is not allowed; need <= 128"), std::string::npos)
      << s.message();
}

TEST_F(NnCudaTest, CrossEntropyMatchesCpu) {
  struct Case {
    int64_t rows, padded, vocab;
  };
  for (const Case& k : {Case{64, 1024, 1000}, Case{33, 1001, 999}}) {
    SCOPED_TRACE(std::to_string(k.padded));
    std::vector<int32_t> th = Tokens(k.rows, static_cast<int32_t>(k.vocab), 121);
    th[3] = -1;
    th[10] = -100;
    std::vector<float> lh = Normal(k.rows * k.padded, 122, 3.0f);
    Dual logits = Floats(lh), targets = Ints(th), losses = Zeros(k.rows), dl = Zeros(k.rows * k.padded);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->CrossEntropyForward(p(logits), g ? targets.gi() : targets.ci(), p(losses), k.rows, k.padded,
                                        k.vocab));
      ASSERT_OK(be->CrossEntropyBackward(p(logits), g ? targets.gi() : targets.ci(), p(dl), k.rows, k.padded, k.vocab,
                                         1.0f / 64));
    }
    // The normaliser is a double sum on both sides (the GPU's with a running max):
    // the losses agree to a few fp32 ulps of logsumexp.
    ExpectElementwise("losses", Cpu(losses), Gpu(losses), 1e-6, 1e-6);
    // exp differs by an ulp; 1 / sum by an ulp.
    ExpectElementwise("dlogits", Cpu(dl), Gpu(dl), 1e-5, 1e-10);
    // In place (dlogits == logits) gives the same bits as out of place.
    const std::vector<float> separate = Gpu(dl);
    ASSERT_OK(gpu_->CrossEntropyBackward(logits.g(), targets.gi(), logits.g(), k.rows, k.padded, k.vocab, 1.0f / 64));
    ExpectBits("dlogits in place", separate, Gpu(logits));
  }
}

// CrossEntropyFused is CrossEntropyForward's losses and CrossEntropyBackward's
// dlogits, bit for bit (the same row helpers and reduction order), so it agrees
// with the CPU within CrossEntropyMatchesCpu's tolerances. Shapes: small ones
// (float4 rows; rows that cannot be read as float4), GPT-2's padded vocabulary
// (the row, 197 KB, fits the opt-in shared memory of an H100 or B200: the
// one-read kernel) and a row that does not fit (70000 fp32 = 273 KB: the
// kernel that reads global memory twice).
TEST_F(NnCudaTest, CrossEntropyFusedMatchesCpuAndUnfused) {
  struct Case {
    int64_t rows, padded, vocab;
  };
  const float scale = 1.0f / 48;
  for (const Case& k : {Case{64, 1024, 1000}, Case{33, 1001, 999}, Case{64, 50304, 50257}, Case{16, 70000, 69997},
                        Case{5, 70001, 70001}}) {
    SCOPED_TRACE(std::to_string(k.rows) + " x " + std::to_string(k.padded) + ", vocab " + std::to_string(k.vocab));
    std::printf("  rows %lld, padded_vocab %lld, vocab %lld\n", static_cast<long long>(k.rows),
                static_cast<long long>(k.padded), static_cast<long long>(k.vocab));
    std::vector<int32_t> th = Tokens(k.rows, static_cast<int32_t>(k.vocab), 151);
    th[3] = -1;
    th[k.rows - 1] = -100;
    th[1] = static_cast<int32_t>(k.vocab - 1);  // the last real column (a float4 holding padding, when vec)
    const std::vector<float> lh = Normal(k.rows * k.padded, 152, 3.0f);
    Dual logits = Floats(lh), in_place = Floats(lh), targets = Ints(th);
    Dual losses = Zeros(k.rows), dl = Zeros(k.rows * k.padded), fused_losses = Zeros(k.rows),
         fused_dl = Zeros(k.rows * k.padded), in_place_losses = Zeros(k.rows);
    // The unfused pair on both backends (the CPU's is the reference).
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto p = [&](const Dual& d) { return g ? d.g() : d.c(); };
      ASSERT_OK(be->CrossEntropyForward(p(logits), g ? targets.gi() : targets.ci(), p(losses), k.rows, k.padded,
                                        k.vocab));
      ASSERT_OK(be->CrossEntropyBackward(p(logits), g ? targets.gi() : targets.ci(), p(dl), k.rows, k.padded,
                                         k.vocab, scale));
    }
    ASSERT_OK(gpu_->Fill(fused_dl.g(), k.rows * k.padded, 7.0f));  // the padding and ignored rows must be written
    ASSERT_OK(gpu_->CrossEntropyFused(logits.g(), targets.gi(), fused_losses.g(), fused_dl.g(), k.rows, k.padded,
                                      k.vocab, scale));
    ASSERT_OK(gpu_->CrossEntropyFused(in_place.g(), targets.gi(), in_place_losses.g(), in_place.g(), k.rows,
                                      k.padded, k.vocab, scale));
    const std::vector<float> unfused_losses = Gpu(losses), unfused_dl = Gpu(dl);
    ExpectBits("fused losses vs unfused", unfused_losses, Gpu(fused_losses));
    ExpectBits("fused dlogits vs unfused", unfused_dl, Gpu(fused_dl));
    ExpectBits("fused in place losses vs unfused", unfused_losses, Gpu(in_place_losses));
    ExpectBits("fused in place dlogits vs unfused", unfused_dl, Gpu(in_place));
    // Tolerances of CrossEntropyMatchesCpu: the normaliser is a double sum on
    // both sides (the GPU's with a running max), so the losses agree to a few
    // fp32 ulps of logsumexp; exp and 1 / sum differ by an ulp each.
    ExpectElementwise("fused losses vs cpu", Cpu(losses), Gpu(fused_losses), 1e-6, 1e-6);
    ExpectElementwise("fused dlogits vs cpu", Cpu(dl), Gpu(fused_dl), 1e-5, 1e-10);
  }
}

// The fused op's other promises at a small shape: dlogits 16-byte misaligned
// where logits are aligned (the unfused ops then reduce in two orders; the fused
// op must still give both ops' bits), and rows with non-finite logits (no
// defined values, but the same as the unfused ops give).
TEST_F(NnCudaTest, CrossEntropyFusedMisalignedAndNonFinite) {
  const int64_t rows = 24, padded = 512, vocab = 509;
  const float scale = 0.5f;
  std::vector<int32_t> th = Tokens(rows, static_cast<int32_t>(vocab), 161);
  th[2] = -1;
  std::vector<float> lh = Normal(rows * padded, 162, 2.0f);
  lh[5 * padded + 17] = std::numeric_limits<float>::infinity();
  lh[6 * padded + 300] = std::numeric_limits<float>::quiet_NaN();
  lh[7 * padded + 0] = -std::numeric_limits<float>::infinity();
  lh[8 * padded + 511] = std::numeric_limits<float>::infinity();  // padding: must not count
  Dual logits = Floats(lh), targets = Ints(th), losses = Zeros(rows), fused_losses = Zeros(rows);
  Dual dl = Zeros(rows * padded + 1), fused_dl = Zeros(rows * padded + 1);
  for (int64_t offset : {0, 1}) {  // offset 1: dlogits 4 bytes past a 256-byte boundary
    SCOPED_TRACE(offset);
    ASSERT_OK(gpu_->CrossEntropyForward(logits.g(), targets.gi(), losses.g(), rows, padded, vocab));
    ASSERT_OK(gpu_->CrossEntropyBackward(logits.g(), targets.gi(), dl.g() + offset, rows, padded, vocab, scale));
    ASSERT_OK(gpu_->CrossEntropyFused(logits.g(), targets.gi(), fused_losses.g(), fused_dl.g() + offset, rows, padded,
                                      vocab, scale));
    ExpectBits("fused losses vs unfused", Gpu(losses), Gpu(fused_losses));
    ExpectBits("fused dlogits vs unfused", Gpu(dl), Gpu(fused_dl));
  }
  const std::vector<float> l = Gpu(losses);
  EXPECT_TRUE(std::isfinite(l[8])) << "an inf in the padding counted";
  EXPECT_TRUE(std::isnan(l[6])) << "a NaN logit did not reach the loss";
}

// ============================================================================
// Determinism
// ============================================================================

// The device memory figure sees an allocation of 256 MiB (the driver may round
// it up; nothing else runs on the GPU meanwhile).
TEST_F(NnCudaTest, DeviceMemoryInUseSeesAnAllocation) {
  int64_t before = 0, after = 0;
  ASSERT_TRUE(gpu_->DeviceMemoryInUse(&before));
  EXPECT_GT(before, 0);
  void* p = nullptr;
  ASSERT_OK(gpu_->Alloc(size_t{256} << 20, &p));
  ASSERT_TRUE(gpu_->DeviceMemoryInUse(&after));
  gpu_->Free(p);
  EXPECT_GE(after - before, int64_t{256} << 20) << "before " << before << ", after " << after;
  EXPECT_LE(after - before, int64_t{300} << 20) << "before " << before << ", after " << after;
}

TEST_F(NnCudaTest, RepeatedRunsGiveIdenticalBits) {
  const int64_t rows = 2048, in = 768, out = 3072;
  const int64_t batch = 2, seq = 512, heads = 12, dim = 768, vocab = 2000, padded = 2048;
  Dual x = Floats(WithOutliers(rows * in, 131)), w = Floats(WithOutliers(out * in, 132, 0.05f)),
       bias = Floats(Normal(out, 133)), dy = Floats(WithOutliers(rows * out, 134, 1e-3f));
  Dual qkv = Floats(Normal(batch * seq * 3 * dim, 135)), dout = Floats(Normal(batch * seq * dim, 136));
  Dual lnx = Floats(Normal(rows * in, 137)), gamma = Floats(Normal(in, 138));
  Dual tokens = Ints(Tokens(rows, 300, 139)), logits = Floats(Normal(rows * padded, 140, 2.0f));
  Dual targets = Ints(Tokens(rows, vocab, 141));
  // Outputs (GPU only).
  Dual y = Zeros(rows * out), dx = Zeros(rows * in), dw = Zeros(out * in), db = Zeros(out);
  Dual aout = Zeros(batch * seq * dim), astats = Zeros(batch * heads * seq * 2), dqkv = Zeros(batch * seq * 3 * dim);
  Dual lny = Zeros(rows * in), mean = Zeros(rows), rstd = Zeros(rows), lndx = Zeros(rows * in), dg = Zeros(in),
       dbeta = Zeros(in);
  Dual dwte = Zeros(300 * in), dwpe = Zeros(rows * in), losses = Zeros(rows), dl = Zeros(rows * padded);
  std::vector<Dual> outputs = {y, dx, dw, db, aout, astats, dqkv, lny, mean, rstd, lndx, dg, dbeta, dwte, dwpe, losses, dl};
  std::vector<std::vector<float>> first;
  std::vector<double> norms_first;
  for (int run = 0; run < 2; ++run) {
    for (const Dual& d : outputs) ASSERT_OK(gpu_->Fill(d.g(), static_cast<int64_t>(d.bytes / 4), 0.0f));
    ASSERT_OK(gpu_->ResetOperandStats(2));
    for (int k = 0; k < 2; ++k) {
      LinearQuant q = k == 0 ? Nvfp4Recipe() : AllRoles(Quant(QuantFormat::kMxfp8E4M3, Rounding::kStochastic));
      q.seed = 77;
      q.stats_slot = k;
      ASSERT_OK(gpu_->LinearForward(x.g(), w.g(), bias.g(), nullptr, y.g(), rows, in, out, q));
      ASSERT_OK(gpu_->LinearBackward(x.g(), w.g(), dy.g(), dx.g(), dw.g(), db.g(), rows, in, out, q));
    }
    ASSERT_OK(gpu_->AttentionForward(qkv.g(), aout.g(), astats.g(), batch, seq, heads, dim, true));
    ASSERT_OK(gpu_->AttentionBackward(qkv.g(), aout.g(), astats.g(), dout.g(), dqkv.g(), batch, seq, heads, dim,
                                      true));
    ASSERT_OK(gpu_->LayerNormForward(lnx.g(), gamma.g(), nullptr, lny.g(), mean.g(), rstd.g(), rows, in, 1e-5f));
    ASSERT_OK(gpu_->LayerNormBackward(lnx.g(), gamma.g(), mean.g(), rstd.g(), lny.g(), lndx.g(), dg.g(), dbeta.g(),
                                      rows, in));
    ASSERT_OK(gpu_->EmbeddingBackward(tokens.gi(), lnx.g(), dwte.g(), dwpe.g(), 1, rows, in));
    ASSERT_OK(gpu_->CrossEntropyForward(logits.g(), targets.gi(), losses.g(), rows, padded, vocab));
    ASSERT_OK(gpu_->CrossEntropyBackward(logits.g(), targets.gi(), dl.g(), rows, padded, vocab, 0.5f));
    std::vector<double> norms;
    ASSERT_OK(gpu_->SumSquares({Span{dw.g(), out * in}, Span{dqkv.g(), batch * seq * 3 * dim}}, &norms));
    std::vector<OperandStats> stats;
    ASSERT_OK(gpu_->ReadOperandStats(&stats));
    std::vector<std::vector<float>> got;
    for (const Dual& d : outputs) got.push_back(Gpu(d));
    if (run == 0) {
      first = got;
      norms_first = norms;
    } else {
      for (size_t i = 0; i < got.size(); ++i) ExpectBits("run 2 output " + std::to_string(i), first[i], got[i]);
      EXPECT_EQ(norms, norms_first);
    }
  }
}

// ============================================================================
// Timing (prints; no assertions beyond success)
// ============================================================================

double TimeMs(Backend* b, int iterations, const std::function<Status()>& body) {
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(body().ok());  // warm-up: plans, scratch
  EXPECT_TRUE(b->Sync().ok());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    const Status s = body();
    EXPECT_TRUE(s.ok()) << s.message();
  }
  EXPECT_TRUE(b->Sync().ok());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iterations;
}

TEST_F(NnCudaTest, TimingGpt2Shapes) {
  std::printf("device: %s\n", gpu_->Describe().c_str());
  const int64_t rows = 16384, in = 768, out = 3072;
  void *x, *w, *bias, *y, *dy, *dx, *dw, *db;
  for (auto pr : {std::make_pair(&x, rows * in), std::make_pair(&w, out * in), std::make_pair(&bias, out),
                  std::make_pair(&y, rows * out), std::make_pair(&dy, rows * out), std::make_pair(&dx, rows * in),
                  std::make_pair(&dw, out * in), std::make_pair(&db, out)}) {
    ASSERT_OK(gpu_->Alloc(pr.second * 4, pr.first));
    ASSERT_OK(gpu_->RandomNormal(static_cast<float*>(*pr.first), pr.second, 5, 0, 0.1f));
  }
  auto f = [](void* p) { return static_cast<float*>(p); };
  const double flops = 3.0 * 2.0 * rows * in * out;
  std::vector<std::pair<std::string, LinearQuant>> schemes = {
      {"fp32 (FP32 GEMM, no TF32)", LinearQuant{}},
      {"bf16", AllRoles(Quant(QuantFormat::kBf16))},
      {"mxfp8_e4m3", AllRoles(Quant(QuantFormat::kMxfp8E4M3))},
      {"nvfp4 recipe", Nvfp4Recipe()},
  };
  for (auto& s : schemes) {
    for (bool stats : {false, true}) {
      if (stats && s.first.rfind("fp32", 0) == 0) continue;
      LinearQuant q = s.second;
      q.stats_slot = stats ? 0 : -1;
      ASSERT_OK(gpu_->ResetOperandStats(1));
      const double fwd = TimeMs(gpu_.get(), 10, [&] { return gpu_->LinearForward(f(x), f(w), f(bias), nullptr, f(y), rows, in, out, q); });
      const double both = TimeMs(gpu_.get(), 10, [&] {
        Status st = gpu_->LinearForward(f(x), f(w), f(bias), nullptr, f(y), rows, in, out, q);
        if (!st.ok()) return st;
        return gpu_->LinearBackward(f(x), f(w), f(dy), f(dx), f(dw), f(db), rows, in, out, q);
      });
      std::printf("linear %lldx%lld->%lld %-28s%s fwd %.3f ms, fwd+bwd %.3f ms = %.1f TFLOP/s\n",
                  static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out),
                  s.first.c_str(), stats ? " +stats" : "", fwd, both, flops / (both * 1e-3) / 1e12);
    }
  }
  for (void* p : {x, w, bias, y, dy, dx, dw, db}) gpu_->Free(p);

  // Attention at GPT-2 124M, batch 16 x 1024.
  const int64_t batch = 16, seq = 1024, heads = 12, dim = 768;
  void *qkv, *aout, *stats, *dout, *dqkv;
  ASSERT_OK(gpu_->Alloc(batch * seq * 3 * dim * 4, &qkv));
  ASSERT_OK(gpu_->Alloc(batch * seq * dim * 4, &aout));
  ASSERT_OK(gpu_->Alloc(batch * heads * seq * 2 * 4, &stats));
  ASSERT_OK(gpu_->Alloc(batch * seq * dim * 4, &dout));
  ASSERT_OK(gpu_->Alloc(batch * seq * 3 * dim * 4, &dqkv));
  ASSERT_OK(gpu_->RandomNormal(f(qkv), batch * seq * 3 * dim, 6, 0, 1.0f));
  ASSERT_OK(gpu_->RandomNormal(f(dout), batch * seq * dim, 7, 0, 1.0f));
  // Six GEMMs of 2 * t * t * hd flops per (batch, head), counting the full squares.
  const double attn_flops = 6.0 * 2.0 * batch * heads * seq * seq * (dim / heads);
  for (bool bf16 : {true, false}) {
    const double fwd = TimeMs(gpu_.get(), 5, [&] {
      return gpu_->AttentionForward(f(qkv), f(aout), f(stats), batch, seq, heads, dim, bf16);
    });
    const double bwd = TimeMs(gpu_.get(), 5, [&] {
      return gpu_->AttentionBackward(f(qkv), f(aout), f(stats), f(dout), f(dqkv), batch, seq, heads, dim, bf16);
    });
    std::printf("attention b%lld t%lld h%lld d%lld %s: fwd %.3f ms, bwd %.3f ms (%.1f TFLOP/s counting full squares)\n",
                static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(heads),
                static_cast<long long>(dim), bf16 ? "bf16" : "fp32", fwd, bwd,
                attn_flops / ((fwd + bwd) * 1e-3) / 1e12);
  }
  for (void* p : {qkv, aout, stats, dout, dqkv}) gpu_->Free(p);

  // LayerNorm, GELU and cross-entropy at the same token count.
  const int64_t tokens = batch * seq, vocab = 50257, padded = 50304;
  void *a, *b, *g, *dg, *m, *r, *d, *logits, *targets, *losses;
  ASSERT_OK(gpu_->Alloc(tokens * 3072 * 4, &a));
  ASSERT_OK(gpu_->Alloc(tokens * 3072 * 4, &b));
  ASSERT_OK(gpu_->Alloc(tokens * 3072 * 4, &d));
  ASSERT_OK(gpu_->Alloc(768 * 4, &g));
  ASSERT_OK(gpu_->Alloc(2 * 768 * 4, &dg));
  ASSERT_OK(gpu_->Alloc(tokens * 4, &m));
  ASSERT_OK(gpu_->Alloc(tokens * 4, &r));
  ASSERT_OK(gpu_->RandomNormal(f(a), tokens * 3072, 8, 0, 1.0f));
  ASSERT_OK(gpu_->Fill(f(g), 768, 1.0f));
  const double ln_f = TimeMs(gpu_.get(), 10, [&] {
    return gpu_->LayerNormForward(f(a), f(g), f(g), f(b), f(m), f(r), tokens, 768, 1e-5f);
  });
  const double ln_b = TimeMs(gpu_.get(), 10, [&] {
    return gpu_->LayerNormBackward(f(a), f(g), f(m), f(r), f(b), f(d), f(dg), f(dg) + 768, tokens, 768);
  });
  const double gelu_f = TimeMs(gpu_.get(), 10, [&] { return gpu_->GeluForward(f(a), f(b), tokens * 3072); });
  const double gelu_b = TimeMs(gpu_.get(), 10, [&] { return gpu_->GeluBackward(f(a), f(b), f(d), tokens * 3072); });
  const double ln_bytes = tokens * 768 * 4.0;
  std::printf("layernorm %lldx768: fwd %.3f ms (%.0f GB/s), bwd %.3f ms\n", static_cast<long long>(tokens), ln_f,
              3 * ln_bytes / (ln_f * 1e-3) / 1e9, ln_b);
  std::printf("gelu %lldx3072: fwd %.3f ms (%.0f GB/s), bwd %.3f ms (%.0f GB/s)\n", static_cast<long long>(tokens),
              gelu_f, 2 * tokens * 3072 * 4.0 / (gelu_f * 1e-3) / 1e9, gelu_b,
              3 * tokens * 3072 * 4.0 / (gelu_b * 1e-3) / 1e9);
  for (void* p : {a, b, d}) gpu_->Free(p);
  ASSERT_OK(gpu_->Alloc(tokens * padded * 4, &logits));
  ASSERT_OK(gpu_->Alloc(tokens * 4, &targets));
  ASSERT_OK(gpu_->Alloc(tokens * 4, &losses));
  ASSERT_OK(gpu_->RandomNormal(f(logits), tokens * padded, 9, 0, 1.0f));
  const double ce_f = TimeMs(gpu_.get(), 5, [&] {
    return gpu_->CrossEntropyForward(f(logits), static_cast<int32_t*>(targets), f(losses), tokens, padded, vocab);
  });
  const double ce_b = TimeMs(gpu_.get(), 5, [&] {
    return gpu_->CrossEntropyBackward(f(logits), static_cast<int32_t*>(targets), f(logits), tokens, padded, vocab,
                                      1.0f / tokens);
  });
  const double ce_fused = TimeMs(gpu_.get(), 5, [&] {
    return gpu_->CrossEntropyFused(f(logits), static_cast<int32_t*>(targets), f(losses), f(logits), tokens, padded,
                                   vocab, 1.0f / tokens);
  });
  const double logit_bytes = tokens * padded * 4.0;
  std::printf("cross-entropy %lldx%lld: fwd %.3f ms (%.0f GB/s), bwd in place %.3f ms (%.0f GB/s)\n",
              static_cast<long long>(tokens), static_cast<long long>(padded), ce_f,
              logit_bytes / (ce_f * 1e-3) / 1e9, ce_b, 3 * logit_bytes / (ce_b * 1e-3) / 1e9);
  // Fused: one read and one write of the logits when the row fits in shared memory.
  std::printf("cross-entropy %lldx%lld: fused in place %.3f ms (%.0f GB/s) vs fwd + bwd %.3f ms\n",
              static_cast<long long>(tokens), static_cast<long long>(padded), ce_fused,
              2 * logit_bytes / (ce_fused * 1e-3) / 1e9, ce_f + ce_b);
  for (void* p : {g, dg, m, r, logits, targets, losses}) gpu_->Free(p);
}

}  // namespace
}  // namespace keel
