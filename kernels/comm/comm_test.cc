// The bootstrap file of comm.h: written atomically, waited for with a timeout.
#include "kernels/comm/comm.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

std::string NewTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = std::string(base ? base : "/tmp") + "/comm_test.XXXXXX";
  EXPECT_NE(::mkdtemp(&templ[0]), nullptr);
  return templ;
}

int FilesIn(const std::string& dir) {
  int n = 0;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = d ? ::readdir(d) : nullptr) n += e->d_name[0] != '.';
  if (d) ::closedir(d);
  return n;
}

TEST(BootstrapId, RoundTripsAndLeavesNoTemporaryFile) {
  const std::string dir = NewTempDir();
  const std::string path = dir + "/bootstrap";
  ASSERT_TRUE(WriteBootstrapId(path, "127.0.0.1:4242").ok());
  std::string id;
  Status s = WaitBootstrapId(path, 1.0, &id);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(id, "127.0.0.1:4242");
  EXPECT_EQ(FilesIn(dir), 1);  // the .tmp.<pid> file was renamed, not left

  // A second write replaces the first whole.
  ASSERT_TRUE(WriteBootstrapId(path, "h:1").ok());
  ASSERT_TRUE(WaitBootstrapId(path, 1.0, &id).ok());
  EXPECT_EQ(id, "h:1");
}

TEST(BootstrapId, WaitsForAFileWrittenLater) {
  const std::string path = NewTempDir() + "/bootstrap";
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    WriteBootstrapId(path, "later:7");
  });
  std::string id;
  Status s = WaitBootstrapId(path, 10.0, &id);
  writer.join();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(id, "later:7");
}

TEST(BootstrapId, TimesOutWithThePathAndTheTimeout) {
  const std::string path = NewTempDir() + "/never";
  std::string id = "unchanged";
  const auto start = Clock::now();
  Status s = WaitBootstrapId(path, 0.2, &id);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "no bootstrap id from rank 0 at " + path + " after 0.2 s");
  EXPECT_EQ(id, "unchanged");
  EXPECT_GE(elapsed, 0.2);
  EXPECT_LT(elapsed, 2.0);
}

TEST(BootstrapId, AnEmptyFileIsNotThereYet) {
  const std::string path = NewTempDir() + "/empty";
  std::ofstream(path).close();
  std::string id;
  EXPECT_EQ(WaitBootstrapId(path, 0.1, &id).code(), StatusCode::kUnavailable);
}

TEST(BootstrapId, RefusesAnEmptyPathOrId) {
  EXPECT_EQ(WriteBootstrapId("", "h:1").field(), "bootstrap_path");
  EXPECT_EQ(WriteBootstrapId(NewTempDir() + "/b", "").field(), "id");
}

TEST(BootstrapId, ReportsAnUnwritableDirectory) {
  Status s = WriteBootstrapId("/nonexistent-dir-for-comm-test/bootstrap", "h:1");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir-for-comm-test/bootstrap.tmp."), std::string::npos) << s.message();
}

TEST(BootstrapHex, RoundTripsEveryByteValue) {
  unsigned char bytes[256];
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<unsigned char>(i);
  const std::string text = BootstrapIdToHex(bytes, sizeof(bytes));
  ASSERT_EQ(text.size(), 512u);
  EXPECT_EQ(text.substr(0, 8), "00010203");
  EXPECT_EQ(text.substr(504), "fcfdfeff");
  unsigned char back[256] = {};
  ASSERT_TRUE(BootstrapIdFromHex("b", text, back, sizeof(back)).ok());
  EXPECT_EQ(std::memcmp(bytes, back, sizeof(bytes)), 0);
}

TEST(BootstrapHex, AcceptsUpperCase) {
  unsigned char b[2] = {};
  ASSERT_TRUE(BootstrapIdFromHex("b", "A0fF", b, 2).ok());
  EXPECT_EQ(b[0], 0xA0);
  EXPECT_EQ(b[1], 0xFF);
}

TEST(BootstrapHex, RefusesAWrongLengthNamingThePath) {
  unsigned char b[4] = {1, 2, 3, 4};
  // What a TCP rank 0 writes: an address, not an NCCL id.
  Status s = BootstrapIdFromHex("/run/bootstrap", "127.0.0.1:4242", b, sizeof(b));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bootstrap id at /run/bootstrap: 14 characters, not a hex id (allowed: exactly 8 hex digits)");
  EXPECT_EQ(b[0], 1);  // unchanged
}

TEST(BootstrapHex, RefusesANonHexCharacterLeavingTheOutputUnchanged) {
  unsigned char b[2] = {7, 7};
  Status s = BootstrapIdFromHex("p", "00g0", b, sizeof(b));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bootstrap id at p: character 2 is 'g', not a hex digit (allowed: exactly 4 hex digits)");
  EXPECT_EQ(b[0], 7);
  EXPECT_EQ(BootstrapIdFromHex("p", "000\n", b, sizeof(b)).message(),
            "bootstrap id at p: character 3 is byte 10, not a hex digit (allowed: exactly 4 hex digits)");
}

}  // namespace
}  // namespace keel
