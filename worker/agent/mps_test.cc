// StartMps / StopMps against a stand-in for nvidia-cuda-mps-control (a script
// that records how it was called; CI has no GPU and no MPS). On a GPU machine
// the real control runs instead (keel-worker --mps).
#include "worker/agent/mps.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "worker/io/file_util.h"
#include "worker/io/test_util.h"

namespace keel {
namespace {

// A control that appends "args=<its arguments> pipe=<CUDA_MPS_PIPE_DIRECTORY>
// log=<CUDA_MPS_LOG_DIRECTORY> stdin=<what it read>" to `record` and exits with `code`.
std::string FakeControl(const std::string& dir, const std::string& record, int code) {
  const std::string path = dir + "/nvidia-cuda-mps-control";
  const std::string script = "#!/bin/sh\nin=$(cat)\necho \"args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY "
                             "stdin=$in\" >> '" + record + "'\nexit " + std::to_string(code) + "\n";
  EXPECT_TRUE(WriteFileAtomic(path, script).ok());
  EXPECT_EQ(chmod(path.c_str(), 0755), 0);
  return path;
}

std::string Read(const std::string& path) {
  std::string s;
  EXPECT_TRUE(ReadFile(path, &s).ok()) << path;
  return s;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The daemon starts with -d and the worker's own pipe and log directories, which
// this process (and so every trainer it starts) then has in its environment;
// StopMps writes "quit" to the control once.
TEST(MpsTest, StartsTheDaemonInTheWorkDirAndQuitsIt) {
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  unsetenv("CUDA_MPS_LOG_DIRECTORY");
  const std::string dir = testing_util::TestDir(), record = dir + "/record.txt";
  const std::string control = FakeControl(dir, record, 0);
  MpsDaemon d;
  ASSERT_TRUE(StartMps(control, dir + "/wd", &d).ok());
  const std::string pipe = dir + "/wd/mps/pipe", log = dir + "/wd/mps/log";
  EXPECT_TRUE(d.started);
  EXPECT_TRUE(IsDir(pipe));
  EXPECT_TRUE(IsDir(log));
  ASSERT_NE(std::getenv("CUDA_MPS_PIPE_DIRECTORY"), nullptr);
  EXPECT_EQ(std::string(std::getenv("CUDA_MPS_PIPE_DIRECTORY")), pipe);
  EXPECT_EQ(std::string(std::getenv("CUDA_MPS_LOG_DIRECTORY")), log);
  EXPECT_EQ(Read(record), "args=-d pipe=" + pipe + " log=" + log + " stdin=\n");
  ASSERT_TRUE(StopMps(&d).ok());
  EXPECT_FALSE(d.started);
  EXPECT_EQ(Read(record), "args=-d pipe=" + pipe + " log=" + log + " stdin=\n" + "args= pipe=" + pipe + " log=" + log +
                              " stdin=quit\n");
  ASSERT_TRUE(StopMps(&d).ok());  // once only
  EXPECT_EQ(Read(record).find("quit"), Read(record).rfind("quit"));
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  unsetenv("CUDA_MPS_LOG_DIRECTORY");
}

// A control that fails, or none at that path: an error that names the command
// and what it returned, no daemon to stop, and the environment as it was.
TEST(MpsTest, AFailedStartSaysWhyAndLeavesTheEnvironment) {
  setenv("CUDA_MPS_PIPE_DIRECTORY", "/somewhere/else", 1);
  unsetenv("CUDA_MPS_LOG_DIRECTORY");
  const std::string dir = testing_util::TestDir(), record = dir + "/record.txt";
  MpsDaemon d;
  Status s = StartMps(FakeControl(dir, record, 3), dir + "/wd", &d);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("-d"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("exit status 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(dir + "/wd/mps/log/control.log"), std::string::npos) << s.message();
  EXPECT_FALSE(d.started);
  EXPECT_EQ(std::string(std::getenv("CUDA_MPS_PIPE_DIRECTORY")), "/somewhere/else");
  EXPECT_EQ(std::getenv("CUDA_MPS_LOG_DIRECTORY"), nullptr);

  s = StartMps(dir + "/no-such-control", dir + "/wd", &d);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not found or not executable"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--mps-control"), std::string::npos) << s.message();
  EXPECT_TRUE(StopMps(&d).ok());  // nothing started: nothing to quit
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
}

}  // namespace
}  // namespace keel
