// Tests of run-config input hardening: the strict YAML loader behind
// ParseRunConfig and --set, run names that must stay inside runs/, and model
// sizes that cannot fit any GPU.
#include "worker/config/run_config.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>

namespace keel {
namespace {

Status Parse(const std::string& text, std::vector<std::string> overrides = {}) {
  RunConfig config;
  return ParseRunConfig(text, "r.yaml", overrides, &config);
}

TEST(RunConfigStatusTest, EveryRefusalIsAnInvalidArgument) {
  // keeld maps the code to gRPC's INVALID_ARGUMENT; no caller reads the text.
  for (const char* bad : {"model: {type: proxy, width: 0}\n", "precision: mxfp9\n", "a: 1\na: 2\n", "steps: [\n",
                          "batch: 256\n---\nbatch: 1\n", "name: ../x\n"}) {
    Status s = Parse(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad << " -> " << s.message();
  }
  Status s = Parse("batch: 8\n", {"optimizer.lr=[1, 2"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
}

TEST(RunConfigStrictTest, DuplicateKeysAreRefusedAtTheSecond) {
  EXPECT_EQ(Parse("steps: 10\nbatch: 8\nsteps: 20\n").message(), "r.yaml:3:1: steps: duplicate key (first at line 1)");
  EXPECT_EQ(Parse("model:\n  width: 64\n  width: 128\n").message(),
            "r.yaml:3:3: model.width: duplicate key (first at line 2)");
  EXPECT_EQ(Parse("policy:\n  rules:\n    - {name: a, when: nonfinite, when: loss_ratio, do: [stop]}\n").message(),
            "r.yaml:3:34: policy.rules[0].when: duplicate key (first at line 3)");
}

TEST(RunConfigStrictTest, SecondDocumentIsRefused) {
  EXPECT_NE(Parse("steps: 10\n---\nsteps: 20\n").message().find("r.yaml:2:1: document: a second YAML document"),
            std::string::npos);
}

TEST(RunConfigStrictTest, SetValuesGoThroughTheStrictLoader) {
  Status s = Parse("steps: 10\n", {"optimizer={lr: 1e-3, lr: 2e-3}"});
  EXPECT_EQ(s.message(), "--set optimizer:1:12: lr: duplicate key (first at line 1)");
  s = Parse("steps: 10\n", {"model=" + std::string(100000, '[')});
  EXPECT_NE(s.message().find("nesting: more than 64 levels"), std::string::npos) << s.message();
}

TEST(RunConfigStrictTest, BinaryGarbageAndHugeTextHaveAReasonAndAPosition) {
  std::string garbage = "steps: 1\n";
  for (int i = 0; i < 256; ++i) garbage += static_cast<char>(255 - i);
  EXPECT_EQ(Parse(garbage).message(), "r.yaml:2:1: not a text file: byte 0xFF at line 2 col 1 (allowed: UTF-8 text "
                                      "without control characters other than tab, CR, LF)");
  EXPECT_EQ(Parse(std::string(5u << 20, ' ')).message(),
            "r.yaml:1:1: size: 5242880 bytes is more than the limit of 4194304 bytes (allowed: at most 4 MiB)");
}

// The default run directory is runs/<name>: a name with ".." or "/" would put
// keel-train's output elsewhere.
TEST(RunConfigNameTest, NamesThatLeaveRunsDirAreRefused) {
  const std::string allowed = " (allowed: [A-Za-z0-9_.-]+, at most 128 characters, not starting with '.')";
  EXPECT_EQ(Parse("name: ../../etc\n").message(), "r.yaml:1:7: name: '../../etc' is not allowed: it starts with '.'" + allowed);
  EXPECT_EQ(Parse("name: '..'\n").message(), "r.yaml:1:7: name: '..' is not allowed: it starts with '.'" + allowed);
  EXPECT_EQ(Parse("name: a/b\n").message(), "r.yaml:1:7: name: 'a/b' is not allowed: '/' at offset 1" + allowed);
  EXPECT_EQ(Parse("name: \"a\\nb\"\n").message(), "r.yaml:1:7: name: 'a\\nb' is not allowed: byte 0x0A at offset 1" + allowed);
  EXPECT_EQ(Parse("name: ''\n").message(), "r.yaml:1:7: name: an empty name is not allowed" + allowed);
  EXPECT_EQ(Parse("name: " + std::string(129, 'n') + "\n").message(),
            "r.yaml:1:7: name: a name of 129 characters is not allowed: too long" + allowed);
  EXPECT_NE(Parse("steps: 1\n", {"name=../x"}).message().find("name: '../x' is not allowed"), std::string::npos);
  RunConfig config;
  ASSERT_TRUE(ParseRunConfig("name: run-1.a_B\n", "r.yaml", {}, &config).ok());
  EXPECT_EQ(config.run_dir, "runs/run-1.a_B");
  ASSERT_TRUE(ParseRunConfig("name: " + std::string(128, 'n') + "\n", "r.yaml", {}, &config).ok());
}

TEST(RunConfigModelSizeTest, ParameterCountsMatchTheModels) {
  RunConfig config;
  ASSERT_TRUE(ParseRunConfig("model: {type: proxy, layers: 2, width: 64}\n", "r.yaml", {}, &config).ok());
  EXPECT_EQ(ModelParameterCount(config.model), 2 * (8 * 64 * 64 + 3 * 64));
  // GPT-2 124M with the vocabulary padded to 50304: llm.c's 124,475,904.
  std::ifstream in("examples/gpt2_124m.yaml");
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_FALSE(text.str().empty()) << "examples/gpt2_124m.yaml not found";
  Status s = ParseRunConfig(text.str(), "examples/gpt2_124m.yaml", {"data.train=x.bin"}, &config);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ModelParameterCount(config.model), 124475904);
}

TEST(RunConfigModelSizeTest, ModelsBeyondTheStateLimitAreRefusedWithTheEstimate) {
  Status s = Parse("model: {type: gpt, width: 65536, layers: 1024, heads: 16}\ndata: {train: x.bin}\n");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().substr(0, 21), "r.yaml:1:27: model.wi") << s.message();
  EXPECT_NE(s.message().find("model.width: 65536 with model.layers 1024 (gpt) gives "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("more than the limit of 256 GiB (allowed: at most 17179869184 parameters)"),
            std::string::npos)
      << s.message();
  s = Parse("model: {type: proxy, width: 65536, layers: 1024}\n");
  EXPECT_NE(s.message().find("(proxy) gives 35184573415424 parameters, a training state of 524291.0 GiB"),
            std::string::npos)
      << s.message();
  // The largest inputs every field allows still count without overflow.
  ModelConfig m;
  m.type = "gpt";
  m.width = 1 << 16;
  m.layers = 1024;
  m.heads = 1;
  m.context = 1 << 20;
  m.padded_vocab = 1 << 20;
  m.mlp = "swiglu";
  m.mlp_hidden = 1 << 20;
  m.qk_layernorm = true;
  EXPECT_GT(ModelParameterCount(m), int64_t{1} << 40);
  // GPT-2 350M (24 x 1024) fits.
  EXPECT_TRUE(Parse("model: {type: gpt, width: 1024, layers: 24, heads: 16}\ndata: {train: x.bin}\n").ok());
}

TEST(RunConfigModelSizeTest, EveryExampleRunConfigStillParses) {
  for (const char* name : {"gpt2_124m", "gpt_fortunes_cpu", "proxy_cpu", "proxy_mxfp8_e4m3",
                           "proxy_mxfp8_e4m3_policy", "proxy_mxfp8_e4m3_policy_tuned"}) {
    const std::string path = std::string("examples/") + name + ".yaml";
    RunConfig config;
    Status s = LoadRunConfig(path, {"data.train=x.bin"}, &config);
    EXPECT_TRUE(s.ok()) << path << ": " << s.message();
  }
}

}  // namespace
}  // namespace keel
