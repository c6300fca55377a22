// Runs the keel-quant binary as users and outside checks do: its outputs must be
// the CPU reference's, byte for byte, and bad input must give a one-line error,
// a non-zero exit and no output file.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/quantizer.h"

namespace keel {
namespace {

std::string Binary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/keel/kernels/keel-quant";
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name;
}

struct RunResult {
  int exit_code;
  std::string stderr_text;
};

RunResult KeelQuant(const std::string& args) {
  std::string err = TempPath("stderr.txt");
  std::string command = Binary() + " " + args + " 2>" + err;
  int status = std::system(command.c_str());
  std::ifstream in(err);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteFloats(const std::string& path, const std::vector<float>& x) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(x.data()), x.size() * 4);
}

std::vector<float> Input(int64_t n) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  x[7] *= 1000.0f;
  x[40] = 0.0f;
  return x;
}

struct Flags {
  std::string format, extra;
  QuantRequest request;
};

TEST(KeelQuantTest, OutputsAreTheCpuReferenceByteForByte) {
  const int64_t rows = 32, cols = 48;
  std::vector<float> x = Input(rows * cols);
  const std::string in = TempPath("x.f32"), out = TempPath("y.f32"), packed = TempPath("y.bin");
  WriteFloats(in, x);
  std::vector<Flags> cases;
  for (const char* name : {"mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4",
                           "nvfp4", "fp8_e4m3", "fp8_e5m2", "bf16"}) {
    Flags f;
    f.format = name;
    ASSERT_TRUE(ParseQuantFormat(name, &f.request.format));
    cases.push_back(f);
  }
  Flags away = cases[0];
  away.extra = "--rounding nearest_away --axis 0 --block 16";
  away.request.rounding = Rounding::kNearestAway;
  away.request.axis = 0;
  away.request.block = 16;
  cases.push_back(away);
  Flags sr = cases[4];
  sr.extra = "--rounding stochastic --seed 99";
  sr.request.rounding = Rounding::kStochastic;
  sr.request.seed = 99;
  cases.push_back(sr);
  Flags tile = cases[5];
  tile.extra = "--tile 16x16 --rht --rounding stochastic --seed 5";
  tile.request.tile_16x16 = true;
  tile.request.rht = true;
  tile.request.rounding = Rounding::kStochastic;
  tile.request.seed = 5;
  cases.push_back(tile);
  for (Flags& f : cases) {
    SCOPED_TRACE(f.format + " " + f.extra);
    std::remove(out.c_str());
    std::remove(packed.c_str());
    RunResult run = KeelQuant("--format " + f.format + " --rows 32 --cols 48 --in " + in + " --out " + out +
                        " --packed-out " + packed + " " + f.extra);
    ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
    f.request.rows = rows;
    f.request.cols = cols;
    QuantResult expected;
    ASSERT_TRUE(QuantizeCpu(f.request, x.data(), &expected).ok());
    std::vector<uint8_t> got = ReadBytes(out);
    ASSERT_EQ(got.size(), x.size() * 4);
    EXPECT_EQ(std::memcmp(got.data(), expected.out.data(), got.size()), 0);
    EXPECT_EQ(ReadBytes(packed), expected.PackedFile());
  }
}

TEST(KeelQuantTest, MxDefaultsToNearestEven) {
  // E2M1 block with amax 6: 2.5 is a tie (2 or 3); the default picks 2.
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;
  x[1] = 2.5f;
  const std::string in = TempPath("tie.f32"), out = TempPath("tie_out.f32");
  WriteFloats(in, x);
  ASSERT_EQ(KeelQuant("--format mxfp4 --rows 1 --cols 32 --in " + in + " --out " + out).exit_code, 0);
  std::vector<uint8_t> bytes = ReadBytes(out);
  float y1;
  std::memcpy(&y1, bytes.data() + 4, 4);
  EXPECT_EQ(y1, 2.0f);
  ASSERT_EQ(KeelQuant("--format=mxfp4 --rows=1 --cols=32 --in=" + in + " --out=" + out +
                      " --rounding=nearest_away").exit_code, 0);
  bytes = ReadBytes(out);
  std::memcpy(&y1, bytes.data() + 4, 4);
  EXPECT_EQ(y1, 3.0f);
}

// Each bad invocation: exit code, a word the one-line message must contain.
struct Bad {
  std::string args;
  int exit_code;
  std::string must_mention;
};

TEST(KeelQuantTest, BadInputGivesOneLineErrorAndNoOutput) {
  const std::string in = TempPath("bad.f32"), out = TempPath("bad_out.f32");
  WriteFloats(in, std::vector<float>(12, 1.0f));  // 48 bytes: 3 x 4 or 1 x 12
  const std::string io = " --in " + in + " --out " + out;
  const Bad cases[] = {
      {"--format mxfp8_e4m3 --rows 3 --cols 5" + io, 2, "--in"},          // 48 bytes != 60
      {"--format mxfp9 --rows 3 --cols 4" + io, 2, "--format"},
      {"--format mxfp8_e4m3 --rows 0 --cols 4" + io, 2, "--rows"},
      {"--format mxfp8_e4m3 --rows 3 --cols x" + io, 2, "--cols"},
      {"--format mxfp8_e4m3 --rows 3 --cols 4 --axis 2" + io, 2, "--axis"},
      {"--format mxfp8_e4m3 --rows 3 --cols 4 --block 0" + io, 2, "--block"},
      {"--format mxfp8_e4m3 --rows 3 --cols 4 --rounding up" + io, 2, "--rounding"},
      {"--format nvfp4 --rows 3 --cols 4" + io, 2, "16"},                  // 1x16 does not divide 4
      {"--format nvfp4 --rows 1 --cols 12 --tile 16x16" + io, 2, "16"},
      {"--format nvfp4 --rows 1 --cols 12 --tile 4x4" + io, 2, "--tile"},
      {"--format nvfp4 --rows 3 --cols 4 --block 16" + io, 2, "--block"},
      {"--format mxfp4 --rows 3 --cols 4 --rht" + io, 2, "--rht"},
      {"--format mxfp4 --rows 3 --cols 4 --tile 16x16" + io, 2, "--tile"},
      {"--format nvfp4 --rows 1 --cols 12 --rounding nearest_away" + io, 2, "nearest_away"},
      {"--format bf16 --rows 3 --cols 4 --device tpu" + io, 2, "--device"},
      {"--format bf16 --rows 3 --cols 4 --frobnicate" + io, 2, "--frobnicate"},
      {"--format bf16 --rows 3 --cols 4 --in /nonexistent/x.f32 --out " + out, 2, "--in"},
      {"--format bf16 --rows 3 --cols 4 --in " + in, 2, "--out"},
      {"--format bf16 --rows 3 --cols 4 --seed -1" + io, 2, "--seed"},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.args);
    std::remove(out.c_str());
    RunResult run = KeelQuant(bad.args);
    EXPECT_EQ(run.exit_code, bad.exit_code);
    EXPECT_FALSE(Exists(out));
    EXPECT_NE(run.stderr_text.find(bad.must_mention), std::string::npos) << run.stderr_text;
    // One line: the message ends with the only newline.
    EXPECT_EQ(run.stderr_text.find('\n'), run.stderr_text.size() - 1) << run.stderr_text;
  }
  // An existing output is left untouched by a failing run.
  { std::ofstream keep(out); keep << "keep"; }
  EXPECT_NE(KeelQuant("--format mxfp9 --rows 3 --cols 4" + io).exit_code, 0);
  EXPECT_EQ(ReadBytes(out), std::vector<uint8_t>({'k', 'e', 'e', 'p'}));
}

TEST(KeelQuantTest, HelpDocumentsEveryFlag) {
  std::string path = TempPath("help.txt");
  ASSERT_EQ(std::system((Binary() + " --help >" + path).c_str()), 0);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* flag : {"--format", "--rows", "--cols", "--in", "--out", "--axis", "--block",
                           "--rounding", "--seed", "--tile", "--rht", "--device", "--packed-out"}) {
    EXPECT_NE(text.find(flag), std::string::npos) << flag;
  }
  for (const char* name : {"mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "nvfp4",
                           "fp8_e4m3", "fp8_e5m2", "bf16"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace keel
