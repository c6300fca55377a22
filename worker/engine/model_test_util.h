// For the model tests: a model built the way keel-train builds it, from a run
// config whose model section is given inline, on the CPU backend.
#ifndef KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_
#define KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kernels/nn.h"
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

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_MODEL_TEST_UTIL_H_
