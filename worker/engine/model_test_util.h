// For the model tests: a model built the way keel-train builds it, from a run
// config whose model section is given inline, on the CPU backend.
#ifndef KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_
#define KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
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
// CPU backend, the model made; fails the test (ASSERT) when any step fails.
// Call it inside ASSERT_NO_FATAL_FAILURE.
inline void MakeTestNet(const std::string& model_yaml, const std::string& rest, TestNet* net) {
  const Status parsed =
      ParseRunConfig("model: " + model_yaml + "\ndata: {train: unused.bin}\n" + rest, "test", {}, &net->config);
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  ASSERT_TRUE(MakeBackend("cpu", 2, &net->backend).ok());
  const Status made = MakeModel(net->config, net->backend.get(), &net->model);
  ASSERT_TRUE(made.ok()) << made.message();
}

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
