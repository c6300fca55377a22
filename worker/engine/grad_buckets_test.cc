// Gradient buckets: the plan over the flat gradient, the order buckets start
// in, and the models' gradient-ready hooks that start them.
//
// The start order is observed on a real one-rank TCP communicator with bf16
// reductions: a one-rank bf16 all-reduce rounds its range in place, so the
// values show which buckets have started.
#include "worker/engine/grad_buckets.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/comm/tcp_comm.h"
#include "kernels/nn.h"
#include "worker/config/run_config.h"

namespace keel {
namespace {

// Tensors of these sizes laid out as Model::AddParam does (64-float aligned);
// *param_count as AllocateParams rounds it.
std::vector<ParamInfo> Layout(const std::vector<int64_t>& sizes, int64_t* param_count) {
  std::vector<ParamInfo> params;
  int64_t end = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamInfo p;
    p.name = "t" + std::to_string(i);
    p.count = sizes[i];
    p.shape = {sizes[i]};
    p.offset = (end + 63) / 64 * 64;
    end = p.offset + p.count;
    params.push_back(p);
  }
  *param_count = (end + 63) / 64 * 64;
  return params;
}

// The buckets tile [0, param_count) from the top down, each a run of whole
// tensors.
void ExpectTiles(const std::vector<GradBucket>& plan, int64_t param_count, int tensors) {
  ASSERT_FALSE(plan.empty());
  EXPECT_EQ(plan.front().end, param_count);
  EXPECT_EQ(plan.front().last_param, tensors - 1);
  EXPECT_EQ(plan.back().begin, 0);
  EXPECT_EQ(plan.back().first_param, 0);
  for (size_t b = 1; b < plan.size(); ++b) {
    EXPECT_EQ(plan[b].end, plan[b - 1].begin) << b;
    EXPECT_EQ(plan[b].last_param + 1, plan[b - 1].first_param) << b;
  }
}

TEST(GradBucketsTest, PlanGroupsSlotsFromTheLastTensorUpToTheCap) {
  int64_t count = 0;
  // Offsets 0, 64, 192, 5248, 5312; param_count 5632.
  const std::vector<ParamInfo> params = Layout({10, 100, 5000, 64, 300}, &count);
  ASSERT_EQ(count, 5632);
  const std::vector<GradBucket> plan = PlanGradBuckets(params, count, 1000 * sizeof(float));
  ASSERT_EQ(plan.size(), 3u);
  // t3 + t4 (384 floats with the padding); t2 alone (over the cap); t0 + t1.
  EXPECT_EQ(plan[0].begin, 5248);
  EXPECT_EQ(plan[0].end, 5632);
  EXPECT_EQ(plan[0].first_param, 3);
  EXPECT_EQ(plan[1].begin, 192);
  EXPECT_EQ(plan[1].end, 5248);
  EXPECT_EQ(plan[1].first_param, 2);
  EXPECT_EQ(plan[1].last_param, 2);
  EXPECT_EQ(plan[2].begin, 0);
  EXPECT_EQ(plan[2].end, 192);
  ExpectTiles(plan, count, 5);
  // A cap above everything: one bucket; below every tensor: one per tensor.
  const std::vector<GradBucket> one = PlanGradBuckets(params, count, 1e9);
  ASSERT_EQ(one.size(), 1u);
  ExpectTiles(one, count, 5);
  const std::vector<GradBucket> each = PlanGradBuckets(params, count, 1);
  ASSERT_EQ(each.size(), 5u);
  ExpectTiles(each, count, 5);
}

// Which of grads' elements a one-rank bf16 reduction has rounded: 1 for a
// rounded element, 0 for one still as written (the values are not bf16).
std::vector<int> Rounded(const std::vector<float>& grads, const std::vector<float>& original) {
  std::vector<int> out;
  for (size_t i = 0; i < grads.size(); ++i) out.push_back(grads[i] != original[i]);
  return out;
}

bool RangeIs(const std::vector<int>& rounded, int64_t begin, int64_t end, int value) {
  for (int64_t i = begin; i < end; ++i) {
    if (rounded[i] != value) return false;
  }
  return true;
}

TEST(GradBucketsTest, BucketsStartInOrderOnceTheirTensorsAreFinal) {
  int64_t count = 0;
  const std::vector<ParamInfo> params = Layout({10, 100, 5000, 64, 300}, &count);
  GradBuckets buckets(params, count, 1000 * sizeof(float));
  ASSERT_EQ(buckets.plan().size(), 3u);
  std::unique_ptr<Communicator> comm;
  TcpCommOptions options;  // one rank: local, bf16 rounds in place
  ASSERT_TRUE(MakeTcpComm(options, &comm).ok());
  std::vector<float> original(count);
  // Odd multiples of 2^-11 above 1: bf16 steps by 2^-7 there, so none is a bf16 value.
  for (int64_t i = 0; i < count; ++i) original[i] = 1.0f + static_cast<float>(2 * (i % 97) + 1) / 2048.0f;
  std::vector<float> grads = original;
  buckets.Begin(comm.get(), grads.data(), ReducePrecision::kBF16);

  ASSERT_TRUE(buckets.Ready(4).ok());  // bucket 0 still waits for t3
  ASSERT_TRUE(buckets.Ready(1).ok());  // bucket 2 still waits for t0
  ASSERT_TRUE(buckets.Ready(0).ok());  // bucket 2 complete, but buckets 0 and 1 have not started
  EXPECT_TRUE(RangeIs(Rounded(grads, original), 0, count, 0));
  ASSERT_TRUE(buckets.Ready(3).ok());  // bucket 0 complete: starts; bucket 1 waits for t2
  std::vector<int> rounded = Rounded(grads, original);
  EXPECT_TRUE(RangeIs(rounded, 5248, 5632, 1));
  EXPECT_TRUE(RangeIs(rounded, 0, 5248, 0));
  ASSERT_TRUE(buckets.Ready(2).ok());  // bucket 1 starts, and bucket 2 after it
  EXPECT_TRUE(RangeIs(Rounded(grads, original), 0, count, 1));
  EXPECT_EQ(buckets.started_early(), 3);

  // A tensor reported twice: the model's hooks are wrong.
  const Status twice = buckets.Ready(2);
  EXPECT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("reported t2's gradient final twice"), std::string::npos) << twice.message();
  ASSERT_TRUE(buckets.Flush().ok());  // nothing left
  double seconds = 0;
  ASSERT_TRUE(buckets.WaitAll(&seconds).ok());
  EXPECT_GE(seconds, 0.0);

  // A backward that reports nothing: Flush starts every bucket, none early.
  grads = original;
  buckets.Begin(comm.get(), grads.data(), ReducePrecision::kBF16);
  ASSERT_TRUE(buckets.Flush().ok());
  EXPECT_EQ(buckets.started_early(), 0);
  ASSERT_TRUE(buckets.WaitAll(&seconds).ok());
  EXPECT_TRUE(RangeIs(Rounded(grads, original), 0, count, 1));
}

// ---- The models' hooks ---------------------------------------------------------------------

struct Net {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  RunConfig config;
};

void MakeNet(const std::string& yaml, Net* net) {
  ASSERT_TRUE(ParseRunConfig(yaml, "test", {}, &net->config).ok());
  ASSERT_TRUE(MakeBackend("cpu", 1, &net->backend).ok());
  ASSERT_TRUE(MakeModel(net->config, net->backend.get(), &net->model).ok());
  ASSERT_TRUE(net->model->Init(7).ok());
}

Batch BatchFor(const Net& net) {
  Batch b;
  b.data_seed = 99;
  const int64_t tokens = static_cast<int64_t>(net.config.batch) * net.config.seq;
  for (int64_t i = 0; i < tokens; ++i) {
    b.inputs.push_back(static_cast<int32_t>((i * 37 + 5) % net.config.model.vocab));
    b.targets.push_back(static_cast<int32_t>((i * 53 + 11) % net.config.model.vocab));
  }
  return b;
}

std::vector<float> Download(Backend* b, const float* p, int64_t count) {
  std::vector<float> host(count);
  EXPECT_TRUE(b->Download(host.data(), p, count * sizeof(float)).ok());
  return host;
}

// One backward with hooks: every tensor is reported once; its gradient when
// reported is its final one (nothing writes it later: a bucket reduced then
// would be right); when a tensor of block l is reported, no tensor of an
// earlier block has a gradient yet (the hook comes during the backward, layer
// by layer, not at its end); and the hooks change nothing computed.
void CheckHooks(const std::string& yaml) {
  Net net;
  ASSERT_NO_FATAL_FAILURE(MakeNet(yaml, &net));
  Backend* b = net.backend.get();
  Model* model = net.model.get();
  const std::vector<ParamInfo>& params = model->param_info();
  const int64_t count = model->param_count();
  void* mem = nullptr;
  ASSERT_TRUE(b->Alloc(count * sizeof(float), &mem).ok());
  float* grads = static_cast<float*>(mem);
  PrecisionScheme scheme;
  ASSERT_TRUE(SchemeFromPreset("mxfp8_e4m3", &scheme).ok());
  const Batch batch = BatchFor(net);

  std::vector<int> reports(params.size(), 0);
  std::vector<std::vector<float>> at_report(params.size());
  std::vector<std::string> problems;
  GradientReady ready = [&](int index) {
    ++reports[index];
    at_report[index] = Download(b, grads + params[index].offset, params[index].count);
    const int block = params[index].block;
    for (size_t j = 0; j < params.size(); ++j) {
      if (block < 0 || params[j].block < 0 || params[j].block >= block) continue;
      for (float x : Download(b, grads + params[j].offset, params[j].count)) {
        if (x != 0.0f) {
          problems.push_back(params[index].name + " was reported after " + params[j].name + " was written");
          break;
        }
      }
    }
    return Status::Ok();
  };
  ASSERT_TRUE(b->Fill(grads, count, 0.0f).ok());
  double loss = 0;
  ASSERT_TRUE(model->ForwardBackward(batch, scheme, 123, 0.5f, false, grads, &loss, ready).ok());
  const std::vector<float> with_hooks = Download(b, grads, count);
  EXPECT_TRUE(problems.empty()) << problems.front();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(reports[i], 1) << params[i].name;
    const std::vector<float> final_grad(with_hooks.begin() + params[i].offset,
                                        with_hooks.begin() + params[i].offset + params[i].count);
    EXPECT_EQ(std::memcmp(at_report[i].data(), final_grad.data(), final_grad.size() * sizeof(float)), 0)
        << params[i].name << " was written after it was reported final";
  }

  ASSERT_TRUE(b->Fill(grads, count, 0.0f).ok());
  double plain_loss = 0;
  ASSERT_TRUE(model->ForwardBackward(batch, scheme, 123, 0.5f, false, grads, &plain_loss, nullptr).ok());
  const std::vector<float> without = Download(b, grads, count);
  EXPECT_EQ(std::memcmp(&loss, &plain_loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(with_hooks.data(), without.data(), count * sizeof(float)), 0);
  b->Free(grads);
}

TEST(GradBucketsTest, ProxyReportsEachTensorOnceAfterItsLastWrite) {
  CheckHooks("model: {type: proxy, layers: 3, width: 32}\nbatch: 16\n");
}

TEST(GradBucketsTest, GptReportsEachTensorOnceAfterItsLastWrite) {
  const std::string gpt = "model: {type: gpt, layers: 3, width: 32, heads: 2, context: 16, vocab: 256";
  const std::string rest = "}\ndata: {train: unused.bin}\nbatch: 2\nseq: 16\n";
  CheckHooks(gpt + rest);                                                 // biases, GELU
  CheckHooks(gpt + ", qk_layernorm: true, mlp: swiglu" + rest);           // QK-LN's gains too
  CheckHooks(gpt + ", qk_layernorm: true, bias: false" + rest);           // absent tensors skipped
}

TEST(GradBucketsTest, LlamaReportsEachTensorOnceAfterItsLastWrite) {
  CheckHooks("model: {type: llama, layers: 3, width: 32, heads: 2, context: 16, vocab: 256}\n"
             "data: {train: unused.bin}\nbatch: 2\nseq: 16\n");
}

// gla: the gate's bias and the output norm's gain too, and x's two paths
// (qkvg and the gate) both finished before the block's input norm.
TEST(GradBucketsTest, GlaReportsEachTensorOnceAfterItsLastWrite) {
  CheckHooks("model: {type: gla, layers: 3, width: 32, heads: 2, context: 16, vocab: 256}\n"
             "data: {train: unused.bin}\nbatch: 2\nseq: 16\n");
}

}  // namespace
}  // namespace keel
