// For the model tests: a model built the way keel-train builds it, from a run
// config whose model section is given inline, on the CPU backend.
#ifndef KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_
#define KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/nn.h"
#include "kernels/nn_cpu.h"
#include "worker/config/run_config.h"
#include "worker/engine/model.h"

namespace keel {

struct TestNet {
  RunConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// "model: MODEL_YAML" plus `rest` (other run-config lines) parsed, a 2-thread
// CPU backend (MakeTestNetOn: the given one), the model made; fails the test
// (ASSERT) when any step fails. Call it inside ASSERT_NO_FATAL_FAILURE.
inline void MakeTestNetOn(std::unique_ptr<Backend> backend, const std::string& model_yaml, const std::string& rest,
                          TestNet* net) {
  const Status parsed =
      ParseRunConfig("model: " + model_yaml + "\ndata: {train: unused.bin}\n" + rest, "test", {}, &net->config);
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  net->backend = std::move(backend);
  const Status made = MakeModel(net->config, net->backend.get(), &net->model);
  ASSERT_TRUE(made.ok()) << made.message();
}
inline void MakeTestNet(const std::string& model_yaml, const std::string& rest, TestNet* net) {
  std::unique_ptr<Backend> cpu;
  ASSERT_TRUE(MakeBackend("cpu", 2, &cpu).ok());
  MakeTestNetOn(std::move(cpu), model_yaml, rest, net);
}

// A CPU backend that keeps the attention's heads (Backend::KeepsAttentionHeads) for bf16 operands: `kept`
// holds q, k and v rounded to bf16 (nearest even; half of qkv's bytes, as nn.h allows), which the CPU's
// bf16-operand attention rounds them to anyway; the calls are counted.
class KeepingCpu : public CpuBackend {
 public:
  KeepingCpu() : CpuBackend(2) {}
  bool KeepsAttentionHeads(int64_t, bool bf16_operands) const override { return bf16_operands; }
  Status AttentionForwardKeep(const float* qkv, float* kept, float* out, float* stats, int64_t batch, int64_t seq,
                              int64_t heads, int64_t dim, bool bf16_operands) override {
    ++keeps;
    const int64_t n = batch * seq * 3 * dim;
    uint16_t* bits = reinterpret_cast<uint16_t*>(kept);
    for (int64_t i = 0; i < n; ++i) bits[i] = Bf16Bits(qkv[i]);
    Widen(kept, n);
    return AttentionForward(wide_.data(), out, stats, batch, seq, heads, dim, bf16_operands);
  }
  Status AttentionBackwardKept(const float* kept, const float* out, const float* stats, const float* dout,
                               float* dqkv, int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                               bool bf16_operands) override {
    ++kepts;
    Widen(kept, batch * seq * 3 * dim);
    return AttentionBackward(wide_.data(), out, stats, dout, dqkv, batch, seq, heads, dim, bf16_operands);
  }
  int keeps = 0, kepts = 0;

 private:
  static uint16_t Bf16Bits(float x) {  // nearest even (the values here are finite)
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
  void Widen(const float* kept, int64_t n) {
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(kept);
    wide_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(&wide_[static_cast<size_t>(i)], &u, sizeof(u));
    }
  }
  std::vector<float> wide_;
};


// How many of the buffers a model of `model_yaml` (as MakeTestNet) allocates
// are the size of all its parameters or larger, on a CPU backend that records
// every allocation.
inline void ParamSizedAllocations(const std::string& model_yaml, const std::string& rest, int* count) {
  class Recording : public CpuBackend {
   public:
    explicit Recording(std::vector<size_t>* sizes) : CpuBackend(1), sizes_(sizes) {}
    Status Alloc(size_t bytes, void** ptr) override {
      sizes_->push_back(bytes);
      return CpuBackend::Alloc(bytes, ptr);
    }

   private:
    std::vector<size_t>* sizes_;
  };
  RunConfig config;
  const Status parsed = ParseRunConfig("model: " + model_yaml + "\ndata: {train: unused.bin}\n" + rest, "test", {}, &config);
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  std::vector<size_t> sizes;
  Recording backend(&sizes);
  std::unique_ptr<Model> model;
  const Status made = MakeModel(config, &backend, &model);
  ASSERT_TRUE(made.ok()) << made.message();
  *count = 0;
  for (size_t s : sizes) *count += s >= static_cast<size_t>(model->param_count()) * sizeof(float);
}

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_
