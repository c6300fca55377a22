// Data-parallel ranks on the CPU (issue 13): N trainers, each a rank of a real
// TCP communicator on loopback (one thread per rank here; keel-train --nproc
// runs them as processes, tests/ranks_e2e_test.sh), against one trainer with
// grad_accum x N.
//
// Tolerance: the ranks' gradients are summed in rank order after each rank's
// backward, where the one-rank run adds its micro-batches' gradients into the
// same buffer as it goes. Both are fp32 sums of the same terms, grouped
// differently wherever a kernel accumulates in pieces, so losses agree to a few
// fp32 ulps per step, growing slowly over steps; 1e-5 relative over 8 to 12
// steps leaves room for that and catches any mistake in which data or seed a
// rank uses (that moves the loss by 1e-3 or more). Where the sums group
// identically the runs agree bit for bit; the test prints which.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <thread>

#include "kernels/comm/tcp_comm.h"
#include "worker/engine/trainer.h"
#include "worker/io/file_util.h"
#include "worker/engine/fortunes_shards.h"
#include "worker/run/run_dir.h"

namespace keel {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

RunConfig Config(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  RunConfig c;
  Status s = ParseRunConfig(yaml, "test", overrides, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

std::string ProxyYaml(const std::string& run_dir) {
  return "model: {type: proxy, layers: 2, width: 32}\nbatch: 32\nsteps: 8\nseed: 11\nthreads: 1\n"
         "optimizer: {type: adam, lr: 0.003}\nprecision: mxfp8_e4m3\ncheck_every: 1\nrun_dir: " + run_dir + "\n";
}

// What one rank saw: its metrics per step and how its run ended.
struct RankResult {
  std::vector<StepMetrics> metrics;
  Status status;
  int64_t step = 0;
  bool sharded = false;
  std::vector<float> weights;  // after the run
};

// Runs `config` as `n` ranks (threads, real TCP), each calling `before` (when
// given: resume, ...) and then Train; `after_step` runs in each rank after
// every step.
std::vector<RankResult> RunRanks(const RunConfig& config, int n, const std::string& bootstrap,
                                 const std::function<Status(Trainer*)>& before = nullptr,
                                 const std::function<void(Trainer*, const StepMetrics&)>& after_step = nullptr) {
  std::remove(bootstrap.c_str());
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankResult& out = results[r];
      std::unique_ptr<Trainer> t;
      out.status = Trainer::Create(config, &t);
      if (!out.status.ok()) return;
      if (n > 1) {
        TcpCommOptions o;
        o.rank = r;
        o.size = n;
        o.bootstrap_path = bootstrap;
        o.timeout_s = 30;
        std::unique_ptr<Communicator> comm;
        out.status = MakeTcpComm(o, &comm);
        if (!out.status.ok()) return;
        out.status = t->SetCommunicator(std::move(comm));
        if (!out.status.ok()) return;
      }
      if (before) {
        out.status = before(t.get());
        if (!out.status.ok()) return;
      }
      Trainer* raw = t.get();
      out.status = t->Train(
          [&, raw](const StepMetrics& m) {
            out.metrics.push_back(m);
            if (after_step) after_step(raw, m);
          },
          false);
      out.step = t->step();
      out.sharded = t->sharded();
      out.weights.resize(static_cast<size_t>(t->model()->param_count()));
      const Status read = t->backend()->Download(out.weights.data(), t->model()->params(),
                                                 out.weights.size() * sizeof(float));
      if (out.status.ok()) out.status = read;
    });
  }
  for (std::thread& th : threads) th.join();
  return results;
}

std::vector<double> LossesOf(const RankResult& r) {
  std::vector<double> l;
  for (const StepMetrics& m : r.metrics) l.push_back(m.loss);
  return l;
}

// Every rank finished, and they all report the same bits for every step's
// loss and gradient norm (they computed them from the same reduced values).
void ExpectRanksAgree(const std::vector<RankResult>& ranks, size_t steps) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_TRUE(ranks[r].status.ok()) << "rank " << r << ": " << ranks[r].status.message();
    ASSERT_EQ(ranks[r].metrics.size(), steps) << "rank " << r;
    for (size_t i = 0; i < steps; ++i) {
      EXPECT_EQ(ranks[r].metrics[i].loss, ranks[0].metrics[i].loss) << "rank " << r << " step " << i + 1;
      EXPECT_EQ(ranks[r].metrics[i].grad_norm, ranks[0].metrics[i].grad_norm) << "rank " << r << " step " << i + 1;
    }
  }
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  bool exact = true;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << what << ", step " << i + 1;
    exact = exact && got[i] == want[i];
  }
  std::printf("%s: %zu steps, %s\n", what.c_str(), got.size(), exact ? "bit-identical losses" : "losses within 1e-5");
}

int CountLines(const std::string& path) {
  std::string text;
  if (!ReadFile(path, &text).ok()) return -1;
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

TEST(RanksTest, TwoAndFourProxyRanksMatchOneRankWithGradAccum) {
  for (int n : {2, 4}) {
    const std::string dir = TempDir("proxy_ranks_" + std::to_string(n));
    const RunConfig one = Config(ProxyYaml(dir + "/one"), {"grad_accum=" + std::to_string(n)});
    const std::vector<RankResult> single = RunRanks(one, 1, "");
    ASSERT_TRUE(single[0].status.ok()) << single[0].status.message();
    // Six gradient buckets (see BucketedReductionGivesTheWeightsOfOneReductionBitForBit);
    // the other tests here run the default 25 MiB, one bucket for these models.
    const std::vector<RankResult> ranks =
        RunRanks(Config(ProxyYaml(dir + "/ranks"), {"dist.bucket_mb=0.016"}), n, dir + "/bootstrap");
    ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(ranks, 8));
    ExpectClose(LossesOf(ranks[0]), LossesOf(single[0]), "proxy, " + std::to_string(n) + " ranks vs grad_accum " +
                                                             std::to_string(n));
    // Operand counters cover the whole global batch.
    ASSERT_FALSE(ranks[0].metrics[0].operands.empty());
    // Rank 0 alone writes the run's files: one metrics line per step.
    EXPECT_EQ(CountLines(RunDir(dir + "/ranks").metrics()), 8);
    // Throughput counts every rank's samples: n ranks x batch per step.
    EXPECT_GT(ranks[0].metrics[0].tokens_per_s, 0.0);
    // Every rank's step time and time in collectives, on every rank's line.
    ASSERT_EQ(ranks[0].metrics[0].rank_step_seconds.size(), static_cast<size_t>(n));
    ASSERT_EQ(ranks[0].metrics[0].rank_comm_seconds.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_GT(ranks[0].metrics[0].rank_step_seconds[r], 0.0);
      EXPECT_GT(ranks[0].metrics[0].rank_comm_seconds[r], 0.0);
      EXPECT_LE(ranks[0].metrics[0].rank_comm_seconds[r], ranks[0].metrics[0].rank_step_seconds[r]);
    }
    EXPECT_TRUE(single[0].metrics[0].rank_step_seconds.empty());
  }
}

TEST(RanksTest, BfloatReductionStaysCloseToFp32) {
  const std::string dir = TempDir("proxy_bf16_reduce");
  const std::vector<RankResult> f32 = RunRanks(Config(ProxyYaml(dir + "/a")), 2, dir + "/b1");
  const std::vector<RankResult> bf16 = RunRanks(Config(ProxyYaml(dir + "/b"), {"dist.reduce=bf16"}), 2, dir + "/b2");
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(f32, 8));
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(bf16, 8));
  // bf16 gradients move the trajectory (so the option does something) but not far.
  EXPECT_NE(LossesOf(f32[0]), LossesOf(bf16[0]));
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(bf16[0].metrics[i].loss, f32[0].metrics[i].loss, 0.05 * f32[0].metrics[i].loss);
}

TEST(RanksTest, TwoGptRanksMatchOneRankWithGradAccumTwo) {
  const std::string dir = TempDir("gpt_ranks");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "t"));
  const std::string yaml = "model: {type: gpt, layers: 2, width: 32, heads: 2, context: 32, vocab: 256}\n"
                           "data: {train: " + dir + "/t_train.bin}\nbatch: 4\nseq: 32\nsteps: 8\nthreads: 1\n"
                           "precision: mxfp8_e4m3\nprobe_every: 4\ncheck_every: 1\n"
                           "optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}\n";
  const std::vector<RankResult> single = RunRanks(Config(yaml + "run_dir: " + dir + "/one\n", {"grad_accum=2"}), 1, "");
  ASSERT_TRUE(single[0].status.ok()) << single[0].status.message();
  const std::vector<RankResult> ranks = RunRanks(Config(yaml + "run_dir: " + dir + "/two\n"), 2, dir + "/bootstrap");
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(ranks, 8));
  ExpectClose(LossesOf(ranks[0]), LossesOf(single[0]), "gpt, 2 ranks vs grad_accum 2");
  // The gradient-bias probe under ranks measures the global batch's gradient.
  ASSERT_TRUE(ranks[0].metrics[3].probed);
  EXPECT_NEAR(ranks[0].metrics[3].probe.cosine, single[0].metrics[3].probe.cosine, 1e-5);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gradient buckets: the gradient all-reduced in buckets started during the
// backward gives the weights one all-reduce after it gives, bit for bit, for 2
// and 4 ranks. For 2 ranks that holds for any reduction (x_0 + x_1 is
// commutative); for 4 it holds because the TCP communicator sums each element
// on its own, ((x_0 + x_1) + x_2) + x_3 in rank order, whatever chunk or
// bucket the element travels in: bucket boundaries cannot change a bit. (NCCL
// does not promise that: its order may depend on a collective's size.)
TEST(RanksTest, BucketedReductionGivesTheWeightsOfOneReductionBitForBit) {
  // 0.016 MiB = 4194 floats: the proxy's two blocks (slots of 64, 64, 4096,
  // 4096 and 64 floats each) in six buckets, from the top: fc2 (w, b); fc1.w
  // and ln.bias; ln.weight and block 0's fc2.bias; fc2.weight; fc1.weight and
  // ln.bias; ln.weight.
  for (const std::string reduce : {"fp32", "bf16"}) {
    for (int n : {2, 4}) {
      if (reduce == "bf16" && n == 4) continue;
      const std::string tag = reduce + "_" + std::to_string(n);
      const std::string dir = TempDir("proxy_buckets_" + tag);
      const std::vector<std::string> common = {"dist.reduce=" + reduce};
      std::vector<std::string> one = common, bucketed = common;
      one.push_back("dist.bucket_mb=0");
      bucketed.push_back("dist.bucket_mb=0.016");
      const std::vector<RankResult> a = RunRanks(Config(ProxyYaml(dir + "/one"), one), n, dir + "/b1");
      const std::vector<RankResult> b = RunRanks(Config(ProxyYaml(dir + "/buckets"), bucketed), n, dir + "/b2");
      ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(a, 8));
      ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(b, 8));
      EXPECT_EQ(LossesOf(b[0]), LossesOf(a[0])) << tag;
      for (int r = 0; r < n; ++r) EXPECT_TRUE(SameBits(b[r].weights, a[0].weights)) << tag << ", rank " << r;
      const StepMetrics& first = b[0].metrics[0];
      EXPECT_EQ(a[0].metrics[0].grad_buckets, 0) << "bucket_mb 0: one reduction";
      EXPECT_EQ(first.grad_buckets, 6) << tag;
      // Every tensor is reported during the backward, so every bucket started before it ended.
      EXPECT_EQ(first.grad_buckets_early, first.grad_buckets) << tag;
      ASSERT_EQ(first.rank_comm_exposed_seconds.size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_GT(first.rank_comm_seconds[r], 0.0) << tag;
        EXPECT_GE(first.rank_comm_exposed_seconds[r], 0.0) << tag;
        EXPECT_LE(first.rank_comm_exposed_seconds[r], first.rank_step_seconds[r]) << tag;
        // One reduction after the backward: all of it is waited for.
        EXPECT_EQ(a[0].metrics[0].rank_comm_exposed_seconds[r], a[0].metrics[0].rank_comm_seconds[r]) << tag;
      }
    }
  }
}

TEST(RanksTest, BucketedGptRanksGiveTheWeightsOfOneReductionBitForBit) {
  const std::string dir = TempDir("gpt_buckets");
  ASSERT_NO_FATAL_FAILURE(PrepareFortunes(dir, "t"));
  // QK-LayerNorm: the hooks of its gains too; 0.02 MiB buckets: several per block.
  const std::string yaml = "model: {type: gpt, layers: 2, width: 32, heads: 2, context: 32, vocab: 256, "
                           "qk_layernorm: true}\n"
                           "data: {train: " + dir + "/t_train.bin}\nbatch: 4\nseq: 32\nsteps: 6\nthreads: 1\n"
                           "precision: mxfp8_e4m3\ncheck_every: 1\ngrad_accum: 2\n"
                           "optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}\n";
  const std::vector<RankResult> a =
      RunRanks(Config(yaml + "run_dir: " + dir + "/one\n", {"dist.bucket_mb=0"}), 2, dir + "/b1");
  const std::vector<RankResult> b =
      RunRanks(Config(yaml + "run_dir: " + dir + "/buckets\n", {"dist.bucket_mb=0.02"}), 2, dir + "/b2");
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(a, 6));
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(b, 6));
  EXPECT_EQ(LossesOf(b[0]), LossesOf(a[0]));
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(SameBits(b[r].weights, a[0].weights)) << "rank " << r;
  EXPECT_GT(b[0].metrics[0].grad_buckets, 3);
  EXPECT_EQ(b[0].metrics[0].grad_buckets_early, b[0].metrics[0].grad_buckets);
}

// A command (rollback two steps and switch to bf16) written after step 5 reaches
// every rank before the same step, and the run continues as the one-rank run
// given the same command does.
TEST(RanksTest, SwitchAndRollbackApplyToEveryRankAtTheSameStep) {
  const std::string dir = TempDir("proxy_rollback");
  auto command_after_5 = [](Trainer* t, const StepMetrics& m) {
    if (t->rank() != 0 || m.step != 5 || m.scheme == "bf16") return;  // once: step 5 comes again in bf16
    const std::string commands = RunDir(t->config().run_dir).commands();
    ASSERT_TRUE(MakeDirs(commands).ok());
    ASSERT_TRUE(WriteFileAtomic(commands + "/0001.json",
                                "{\"kind\": \"rollback\", \"steps\": 2, \"precision\": \"bf16\", \"reason\": \"test\"}")
                    .ok());
  };
  const std::vector<std::string> every2 = {"checkpoint_every=2", "steps=10"};
  std::vector<std::string> accum = every2;
  accum.push_back("grad_accum=2");
  const std::vector<RankResult> single = RunRanks(Config(ProxyYaml(dir + "/one"), accum), 1, "", nullptr, command_after_5);
  ASSERT_TRUE(single[0].status.ok()) << single[0].status.message();
  const std::vector<RankResult> ranks =
      RunRanks(Config(ProxyYaml(dir + "/two"), every2), 2, dir + "/bootstrap", nullptr, command_after_5);
  // Steps 1-5; the rollback's target is step 3, whose newest checkpoint at or
  // before it is step 2's (checkpoint_every 2); then steps 3-10 in bf16.
  ASSERT_TRUE(ranks[0].status.ok()) << ranks[0].status.message();
  ASSERT_TRUE(ranks[1].status.ok()) << ranks[1].status.message();
  ASSERT_EQ(ranks[0].metrics.size(), single[0].metrics.size());
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(ranks, single[0].metrics.size()));
  std::vector<std::string> schemes;
  for (const StepMetrics& m : ranks[1].metrics) schemes.push_back(m.scheme);
  EXPECT_EQ(schemes.front(), "mxfp8_e4m3");
  EXPECT_EQ(schemes.back(), "bf16");
  EXPECT_EQ(ranks[1].metrics[5].step, 3);  // rolled back to the checkpoint of step 2: the next step is 3
  ExpectClose(LossesOf(ranks[0]), LossesOf(single[0]), "proxy with a rollback and a switch, 2 ranks vs grad_accum 2");
  // Rank 0 recorded the rollback once.
  std::string events;
  ASSERT_TRUE(ReadFile(RunDir(dir + "/two").events(), &events).ok());
  EXPECT_EQ(CountLines(RunDir(dir + "/two").events()), 2) << events;  // rollback, switch_precision
}

// The same rollback under a policy whose snapshots live in memory (rank 0
// holds them; the others take its state by broadcast), with the optimizer
// sharded (ZeRO-1: the moments gathered for each snapshot) and not: every rank
// goes back to step 2's snapshot (no checkpoint is on disk), and the run is the
// one-rank run's.
TEST(RanksTest, ARollbackFromThePolicysMemorySnapshotsReachesEveryRank) {
  const std::string dir = TempDir("proxy_memory_rollback");
  auto command_after_5 = [](Trainer* t, const StepMetrics& m) {
    if (t->rank() != 0 || m.step != 5 || m.scheme == "bf16") return;
    const std::string commands = RunDir(t->config().run_dir).commands();
    ASSERT_TRUE(MakeDirs(commands).ok());
    ASSERT_TRUE(WriteFileAtomic(commands + "/0001.json",
                                "{\"kind\": \"rollback\", \"steps\": 2, \"precision\": \"bf16\", \"reason\": \"test\"}")
                    .ok());
  };
  const std::string policy = "policy:\n  snapshots: {every: 2, keep: 4}\n  rules:\n    - {when: nonfinite, do: [stop]}\n";
  const std::vector<RankResult> single =
      RunRanks(Config(ProxyYaml(dir + "/one") + policy, {"steps=10", "grad_accum=2"}), 1, "", nullptr, command_after_5);
  ASSERT_TRUE(single[0].status.ok()) << single[0].status.message();
  for (const char* shard : {"false", "true"}) {
    const std::string run = dir + "/two_" + shard;
    const std::vector<RankResult> ranks =
        RunRanks(Config(ProxyYaml(run) + policy, {"steps=10", std::string("optimizer.shard=") + shard}), 2,
                 dir + "/bootstrap_" + shard, nullptr, command_after_5);
    ASSERT_TRUE(ranks[0].status.ok()) << ranks[0].status.message();
    ASSERT_TRUE(ranks[1].status.ok()) << ranks[1].status.message();
    ASSERT_EQ(ranks[0].metrics.size(), single[0].metrics.size()) << shard;
    ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(ranks, single[0].metrics.size()));
    EXPECT_EQ(ranks[1].metrics[5].step, 3) << shard;  // back to step 2's snapshot: the next step is 3
    EXPECT_EQ(ranks[1].metrics.back().scheme, "bf16") << shard;
    ExpectClose(LossesOf(ranks[0]), LossesOf(single[0]), std::string("memory snapshots, 2 ranks, shard ") + shard);
    std::string events;
    ASSERT_TRUE(ReadFile(RunDir(run).events(), &events).ok());
    EXPECT_NE(events.find("\"checkpoint\":\"memory snapshot of step 2\""), std::string::npos) << events;
  }
}

// 2 ranks x grad_accum 2 for 4 steps, then 1 rank (taking 4 micro-batches) for
// 4, then 4 ranks (1 each) for 4: the global batch never changes, and the run
// ends where an uninterrupted one-rank grad_accum 4 run does.
TEST(RanksTest, ResumeWithAnotherRankCountKeepsTheGlobalBatch) {
  const std::string dir = TempDir("proxy_resume_ranks");
  const RunConfig whole = Config(ProxyYaml(dir + "/whole"), {"grad_accum=4", "steps=12"});
  const std::vector<RankResult> expected = RunRanks(whole, 1, "");
  ASSERT_TRUE(expected[0].status.ok()) << expected[0].status.message();
  const std::string run = dir + "/run";
  const std::vector<RankResult> first = RunRanks(Config(ProxyYaml(run), {"grad_accum=2", "steps=4"}), 2, dir + "/b1");
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(first, 4));
  auto resume = [](Trainer* t) { return t->Resume("latest"); };
  const std::vector<RankResult> second = RunRanks(Config(ProxyYaml(run), {"steps=8"}), 1, "", resume);
  ASSERT_TRUE(second[0].status.ok()) << second[0].status.message();
  ASSERT_EQ(second[0].metrics.size(), 4u);
  const std::vector<RankResult> third = RunRanks(Config(ProxyYaml(run), {"steps=12"}), 4, dir + "/b3", resume);
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(third, 4));
  std::vector<double> got = LossesOf(first[0]);
  for (const auto* part : {&second[0], &third[0]}) {
    for (double l : LossesOf(*part)) got.push_back(l);
  }
  ExpectClose(got, LossesOf(expected[0]), "proxy 2 -> 1 -> 4 ranks vs one rank with grad_accum 4");
}

TEST(RanksTest, ResumeRefusesARankCountThatCannotSplitTheGlobalBatch) {
  const std::string dir = TempDir("proxy_resume_split");
  const std::vector<RankResult> first = RunRanks(Config(ProxyYaml(dir + "/run"), {"steps=2"}), 2, dir + "/b1");
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(first, 2));
  auto resume = [](Trainer* t) { return t->Resume("latest"); };
  const std::vector<RankResult> three = RunRanks(Config(ProxyYaml(dir + "/run"), {"steps=4"}), 3, dir + "/b2", resume);
  for (const RankResult& r : three) {
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.message();
    EXPECT_NE(r.status.message().find("global batch is 2 micro-batches per step, which 3 ranks cannot split"),
              std::string::npos)
        << r.status.message();
  }
}

// ZeRO-1: each rank keeps the moments of its shard and updates only it, then
// the ranks gather the weights; the run is the unsharded one (the grouping of
// the gradient norm's sums differs: within 1e-5). Its checkpoints keep today's
// format (the moments gathered whole), so it resumes on one rank.
TEST(RanksTest, ShardedOptimizerMatchesTheUnshardedRunAndResumesOnOneRank) {
  const std::string dir = TempDir("proxy_zero1");
  for (int n : {2, 3}) {
    const std::string tag = std::to_string(n);
    const std::vector<RankResult> plain = RunRanks(Config(ProxyYaml(dir + "/plain" + tag)), n, dir + "/b1" + tag);
    const std::vector<RankResult> sharded =
        RunRanks(Config(ProxyYaml(dir + "/shard" + tag), {"optimizer.shard=true", "probe_every=3"}), n, dir + "/b2" + tag);
    ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(plain, 8));
    ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(sharded, 8));
    ExpectClose(LossesOf(sharded[0]), LossesOf(plain[0]), "proxy, " + tag + " ranks, optimizer.shard vs not");
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(sharded[r].sharded) << r;
      EXPECT_FALSE(plain[r].sharded) << r;
    }
    ASSERT_TRUE(sharded[0].metrics[2].probed);
  }
  const RunConfig whole = Config(ProxyYaml(dir + "/whole"), {"grad_accum=2", "steps=8"});
  const std::vector<RankResult> expected = RunRanks(whole, 1, "");
  ASSERT_TRUE(expected[0].status.ok()) << expected[0].status.message();
  const std::string run = dir + "/run";
  const std::vector<RankResult> first =
      RunRanks(Config(ProxyYaml(run), {"optimizer.shard=true", "steps=4"}), 2, dir + "/b3");
  ASSERT_NO_FATAL_FAILURE(ExpectRanksAgree(first, 4));
  auto resume = [](Trainer* t) { return t->Resume("latest"); };
  const std::vector<RankResult> second = RunRanks(Config(ProxyYaml(run), {"steps=8"}), 1, "", resume);
  ASSERT_TRUE(second[0].status.ok()) << second[0].status.message();
  std::vector<double> got = LossesOf(first[0]);
  for (double l : LossesOf(second[0])) got.push_back(l);
  ExpectClose(got, LossesOf(expected[0]), "proxy 2 sharded ranks -> 1 rank vs one rank with grad_accum 2");
}

// A rank whose weights drift from the others' is caught by the hash check of
// the same step: a rank_mismatch event and a failed run on every rank.
TEST(RanksTest, RanksWithDifferentWeightsFailTheRun) {
  const std::string dir = TempDir("proxy_mismatch");
  auto corrupt_rank1 = [](Trainer* t, const StepMetrics& m) {
    if (t->rank() != 1 || m.step != 3) return;
    const float bad = 123.0f;
    ASSERT_TRUE(t->backend()->Upload(t->model()->params(), &bad, sizeof(bad)).ok());
  };
  const std::vector<RankResult> ranks =
      RunRanks(Config(ProxyYaml(dir + "/run")), 2, dir + "/bootstrap", nullptr, corrupt_rank1);
  for (const RankResult& r : ranks) {
    EXPECT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find("ranks hold different weights after step 3"), std::string::npos)
        << r.status.message();
  }
  std::string events;
  ASSERT_TRUE(ReadFile(RunDir(dir + "/run").events(), &events).ok());
  EXPECT_NE(events.find("\"kind\":\"rank_mismatch\""), std::string::npos) << events;
}

}  // namespace
}  // namespace keel
