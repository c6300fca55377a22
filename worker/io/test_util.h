// Helpers shared by worker/io's tests.
#ifndef KEEL_WORKER_IO_TEST_UTIL_H_
#define KEEL_WORKER_IO_TEST_UTIL_H_

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "worker/io/file_util.h"

namespace keel {
namespace testing_util {

// A fresh, empty directory for the running test, under Bazel's TEST_TMPDIR
// (or /tmp outside Bazel).
inline std::string TestDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = std::string(root != nullptr ? root : "/tmp") + "/" +
                          info->test_suite_name() + "." + info->name();
  std::string unused;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  Status s = MakeDirs(dir);
  EXPECT_TRUE(s.ok()) << s.message();
  return dir;
}

// True when something (file or directory) exists at `path`.
inline bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// True when `text` contains every one of `parts`; for checking that an error
// message names the file, the field and the values.
inline ::testing::AssertionResult HasAll(const std::string& text,
                                         std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (text.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "\"" << text << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing_util
}  // namespace keel

#endif  // KEEL_WORKER_IO_TEST_UTIL_H_
