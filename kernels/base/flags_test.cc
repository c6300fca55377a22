#include "kernels/base/flags.h"

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

const char kUsage[] = "usage: prog [--count N] [--name S]\n";

struct Parsed {
  FlagsOutcome outcome;
  int64_t count = 7;
  std::string name = "default";
  std::vector<std::string> roots;
  bool quiet = false;
  std::string err, out;
};

Parsed Parse(std::vector<std::string> args) {
  Parsed p;
  CLI::App app("prog");
  app.add_option("--count", p.count)->check(IntFlag(1, 100));
  app.add_option("--name", p.name);
  app.add_option("--root", p.roots)->allow_extra_args(false);
  app.add_flag("--quiet", p.quiet);
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(&a[0]);
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  p.outcome = ParseFlags(app, "prog", kUsage, static_cast<int>(argv.size()), argv.data());
  p.out = testing::internal::GetCapturedStdout();
  p.err = testing::internal::GetCapturedStderr();
  return p;
}

TEST(FlagsTest, ValuesLandAndDefaultsStay) {
  Parsed p = Parse({"--count", "42", "--root", "a", "--quiet", "--root", "b"});
  EXPECT_TRUE(p.outcome.proceed) << p.err;
  EXPECT_EQ(p.count, 42);
  EXPECT_EQ(p.name, "default");
  EXPECT_EQ(p.roots, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(p.quiet);
  EXPECT_EQ(p.err, "");
}

TEST(FlagsTest, FlagErrorSaysProgramAndMessageAndReturnsTwo) {
  testing::internal::CaptureStderr();
  const int code = FlagError("prog", "--tls-cert and --tls-key go together");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: --tls-cert and --tls-key go together\n");
  EXPECT_EQ(code, 2);
}

TEST(FlagsTest, HelpPrintsTheUsageAndExitsZero) {
  Parsed p = Parse({"--count", "3", "--help"});
  EXPECT_FALSE(p.outcome.proceed);
  EXPECT_EQ(p.outcome.exit_code, 0);
  EXPECT_EQ(p.out, kUsage);
  // --help wins over a bad value on the same line.
  p = Parse({"--count", "0", "-h"});
  EXPECT_EQ(p.outcome.exit_code, 0);
  EXPECT_EQ(p.out, kUsage);
}

TEST(FlagsTest, AnIntegerOutsideItsRangeNamesFlagValueAndRange) {
  for (const char* bad : {"0", "101", "12x", "", "99999999999999999999999"}) {
    Parsed p = Parse({"--count", bad});
    EXPECT_FALSE(p.outcome.proceed) << bad;
    EXPECT_EQ(p.outcome.exit_code, 2);
    EXPECT_EQ(p.err, std::string("prog: --count: '") + bad + "' is not allowed (1 .. 100)\n");
    EXPECT_EQ(p.count, 7);
  }
}

TEST(FlagsTest, ASingleValuedFlagGivenTwiceTakesTheLastValue) {
  Parsed p = Parse({"--count", "3", "--name", "x", "--count", "9"});
  EXPECT_TRUE(p.outcome.proceed) << p.err;
  EXPECT_EQ(p.count, 9);
  EXPECT_EQ(p.name, "x");
}

TEST(FlagsTest, ARepeatableFlagTakesOneValueEachTime) {
  Parsed p = Parse({"--root", "a", "b"});
  EXPECT_EQ(p.outcome.exit_code, 2);
  EXPECT_EQ(p.err, "prog: unknown argument 'b' (see prog --help)\n");
}

TEST(FlagsTest, UnknownArgumentsAndMissingValuesAreUsageErrors) {
  Parsed p = Parse({"--quiet", "--colour", "red"});
  EXPECT_EQ(p.outcome.exit_code, 2);
  EXPECT_EQ(p.err, "prog: unknown argument '--colour' (see prog --help)\n");
  p = Parse({"--name"});
  EXPECT_FALSE(p.outcome.proceed);
  EXPECT_EQ(p.outcome.exit_code, 2);
  EXPECT_EQ(p.err, "prog: --name needs a value (see prog --help)\n");
}

// CLI11's two value mismatches, caught from a real parse, in Keel's words.
TEST(FlagsTest, ValueMismatchMessageNamesTheFlag) {
  auto mismatch_of = [](const std::vector<std::string>& reversed_args) {
    CLI::App app("prog");
    std::string name;
    bool watch = false;
    app.add_option("--name", name);
    app.add_flag("--watch", watch)->disable_flag_override();
    std::vector<std::string> args = reversed_args;
    try {
      app.parse(args);
    } catch (const CLI::ArgumentMismatch& e) {
      return ValueMismatchMessage(e);
    }
    return std::string("no mismatch");
  };
  EXPECT_EQ(mismatch_of({"--name"}), "--name needs a value");
  EXPECT_EQ(mismatch_of({"--watch=yes"}), "--watch takes no value");
}

}  // namespace
}  // namespace keel
