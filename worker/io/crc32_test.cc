// Tests of CRC-32 against published check values and a bitwise reference.
#include "worker/io/crc32.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

// The textbook bit-at-a-time CRC-32, independent of the tables.
uint32_t BitwiseCrc32(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

TEST(Crc32Test, CheckValues) {
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);  // the CRC catalogue's check value
  EXPECT_EQ(Crc32(0, "", 0), 0u);
  EXPECT_EQ(Crc32(0, nullptr, 0), 0u);
  const char* fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32(0, fox, std::strlen(fox)), 0x414FA339u);  // zlib.crc32 of this string
}

TEST(Crc32Test, MatchesBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(200);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; start + n <= data.size(); ++n) {
      ASSERT_EQ(Crc32(0, data.data() + start, n), BitwiseCrc32(data.data() + start, n))
          << "start " << start << " length " << n;
    }
  }
}

TEST(Crc32Test, IncrementalEqualsOneShot) {
  const std::string s = "safetensors data buffer, checksummed tensor by tensor";
  for (size_t split = 0; split <= s.size(); ++split) {
    EXPECT_EQ(Crc32(Crc32(0, s.data(), split), s.data() + split, s.size() - split),
              Crc32(0, s.data(), s.size()));
  }
}

}  // namespace
}  // namespace keel
