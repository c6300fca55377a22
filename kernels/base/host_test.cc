#include "kernels/base/host.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(base ? base : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(HostTest, CpuModelIsTheFirstModelNameLine) {
  const std::string path = WriteFile("cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\n"
                                                "model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
                                                "processor\t: 1\nmodel name\t: Another CPU\n");
  EXPECT_EQ(CpuModel(path), "Intel(R) Xeon(R) CPU @ 2.20GHz");
}

TEST(HostTest, CpuModelIsUnknownWithoutAModelNameLineOrAFile) {
  // An ARM kernel's cpuinfo has no "model name" line.
  EXPECT_EQ(CpuModel(WriteFile("cpuinfo_arm", "processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n")),
            "unknown CPU");
  EXPECT_EQ(CpuModel(WriteFile("cpuinfo_empty_name", "model name\t:\n")), "unknown CPU");
  EXPECT_EQ(CpuModel("/nonexistent/cpuinfo"), "unknown CPU");
}

TEST(HostTest, FreeLoopbackPortCanBeListenedOn) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  ASSERT_LE(port, 65535);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "port " << port;
  EXPECT_EQ(listen(fd, 1), 0);
  close(fd);
}

TEST(HostTest, HostAddressesAreIpLiteralsOrNamesWithoutAPort) {
  for (const std::string& ok :
       std::vector<std::string>{"127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "node-7.cluster", "vm"}) {
    EXPECT_TRUE(IsHostAddress(ok)) << ok;
  }
  for (const std::string& bad :
       std::vector<std::string>{"", "10.0.0.1:7000", "[::1]", "a b", "-h", "host/x", std::string(254, 'a')}) {
    EXPECT_FALSE(IsHostAddress(bad)) << bad;
  }
  EXPECT_TRUE(IsWildcardAddress("0.0.0.0"));
  EXPECT_TRUE(IsWildcardAddress("::"));
  EXPECT_FALSE(IsWildcardAddress("127.0.0.1"));
}

TEST(HostTest, LocalAddressTowardIsTheSourceAddressOfTheRoute) {
  EXPECT_EQ(LocalAddressToward("127.0.0.1:7070"), "127.0.0.1");
  EXPECT_EQ(LocalAddressToward("127.0.0.2:7070"), "127.0.0.1");  // the whole of 127/8 is lo, whose address is 127.0.0.1
  EXPECT_EQ(LocalAddressToward("no port"), "");
  EXPECT_EQ(LocalAddressToward("host.invalid:7070"), "");  // .invalid never resolves (RFC 6761)
}

}  // namespace
}  // namespace keel
