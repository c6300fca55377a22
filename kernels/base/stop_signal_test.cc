#include "kernels/base/stop_signal.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(StopSignalTest, SigtermAndSigintSetTheFlagInsteadOfEndingTheProcess) {
  std::atomic<bool>* stop = StopOnSignals();
  ASSERT_NE(stop, nullptr);
  EXPECT_FALSE(stop->load());
  ASSERT_EQ(raise(SIGTERM), 0);  // the default action would end this test binary
  EXPECT_TRUE(stop->load());
  stop->store(false);
  ASSERT_EQ(raise(SIGINT), 0);
  EXPECT_TRUE(stop->load());
  EXPECT_EQ(StopOnSignals(), stop);  // one flag per process
}

}  // namespace
}  // namespace keel
