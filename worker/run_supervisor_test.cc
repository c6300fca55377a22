// RunSupervisor with the real keel-train (a data dependency): metrics lines and
// checkpoints are followed while it trains; a normal end, SIGTERM (checkpoint,
// exit 130) and kill -9 are each reported as what they were; resume continues.
#include "worker/run_supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace keel {
namespace {

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  return dir;
}

RunLaunch Launch(const std::string& dir, int steps) {
  RunLaunch l;
  l.run_id = "run-1";
  l.trainer = "worker/keel-train";  // runfiles path of the data dependency
  l.run_dir = dir;
  l.spec_yaml = "model: {type: proxy, layers: 1, width: 16}\nbatch: 32\nthreads: 1\ncheckpoint_every: 10\n"
                "steps: " + std::to_string(steps) + "\n";
  return l;
}

// Polls until the process exits (or 60 s), collecting everything it reported.
RunProgress Follow(RunSupervisor* s, int stop_after_metrics = -1, int signal = 0) {
  RunProgress all;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool signalled = false;
  while (std::chrono::steady_clock::now() < deadline) {
    RunProgress p;
    Status st = s->Poll(&p);
    EXPECT_TRUE(st.ok()) << st.message();
    all.metrics.insert(all.metrics.end(), p.metrics.begin(), p.metrics.end());
    all.checkpoints.insert(all.checkpoints.end(), p.checkpoints.begin(), p.checkpoints.end());
    if (!signalled && stop_after_metrics >= 0 && static_cast<int>(all.metrics.size()) >= stop_after_metrics) {
      EXPECT_TRUE(s->Signal(signal).ok());
      signalled = true;
    }
    if (p.exited) {
      all.exited = true;
      all.exit = p.exit;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return all;
}

TEST(RunSupervisorTest, FollowsMetricsAndCheckpointsToANormalExit) {
  std::unique_ptr<RunSupervisor> s;
  Status st = RunSupervisor::Start(Launch(FreshDir("sup_normal"), 30), &s);
  ASSERT_TRUE(st.ok()) << st.message();
  RunProgress p = Follow(s.get());
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 0) << p.exit.message();
  ASSERT_EQ(p.metrics.size(), 30u);
  for (size_t i = 0; i < p.metrics.size(); ++i) {
    EXPECT_EQ(p.metrics[i].step(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(p.metrics[i].run_id(), "run-1");
    EXPECT_GT(p.metrics[i].loss(), 0.0);
    EXPECT_NE(p.metrics[i].json().find("\"grad_norm\""), std::string::npos);
  }
  ASSERT_FALSE(p.checkpoints.empty());
  EXPECT_EQ(p.checkpoints.back().step(), 30);  // the final checkpoint
}

TEST(RunSupervisorTest, SigtermCheckpointsAndResumeContinues) {
  std::string dir = FreshDir("sup_term");
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(Launch(dir, 100000), &s).ok());
  RunProgress p = Follow(s.get(), 5, SIGTERM);
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 130) << p.exit.message();
  ASSERT_FALSE(p.checkpoints.empty());
  const v1::CheckpointNotice last = p.checkpoints.back();
  EXPECT_EQ(last.step(), p.metrics.back().step());
  // Resume from it for a few more steps.
  RunLaunch again = Launch(dir, static_cast<int>(last.step()) + 3);
  again.resume_checkpoint = last.path();
  std::unique_ptr<RunSupervisor> resumed;
  ASSERT_TRUE(RunSupervisor::Start(again, &resumed).ok());
  RunProgress q = Follow(resumed.get());
  ASSERT_TRUE(q.exited);
  EXPECT_EQ(q.exit.exit_code(), 0) << q.exit.message();
  ASSERT_FALSE(q.metrics.empty());
  EXPECT_EQ(q.metrics.back().step(), last.step() + 3);
}

TEST(RunSupervisorTest, KillNineIsReportedAsTheSignal) {
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(Launch(FreshDir("sup_kill"), 100000), &s).ok());
  RunProgress p = Follow(s.get(), 3, SIGKILL);
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), -1);
  EXPECT_EQ(p.exit.signal(), SIGKILL);
}

TEST(RunSupervisorTest, BadTrainerPathExitsWith127AndSaysSo) {
  RunLaunch l = Launch(FreshDir("sup_bad"), 5);
  l.trainer = "/nonexistent/keel-train";
  std::unique_ptr<RunSupervisor> s;
  ASSERT_TRUE(RunSupervisor::Start(l, &s).ok());
  RunProgress p = Follow(s.get());
  ASSERT_TRUE(p.exited);
  EXPECT_EQ(p.exit.exit_code(), 127);
  EXPECT_NE(p.exit.message().find("exec of the trainer failed"), std::string::npos) << p.exit.message();
}

}  // namespace
}  // namespace keel
