// Tests of CRC-32 against published check values, a bitwise reference and a
// checkpoint written by Keel's own CRC-32 code before zlib's replaced it.
#include "worker/io/crc32.h"

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/io/file_util.h"
#include "worker/io/safetensors.h"
#include "worker/io/test_util.h"

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

TEST(Crc32Test, ExtendingByNothingKeepsTheCrc) {
  EXPECT_EQ(Crc32(0x12345678u, nullptr, 0), 0x12345678u);
  EXPECT_EQ(Crc32(0xCBF43926u, "", 0), 0xCBF43926u);
}

// A safetensors file as WriteSafetensors wrote it with the slicing-by-8 CRC-32
// Keel had before zlib's (commit 555d55c): tensors w [2,3] and b [3], metadata
// step=1000, keel.crc32 3273218d of the 36-byte data buffer.
std::string OldCheckpoint() {
  const std::string length("\xa8\x00\x00\x00\x00\x00\x00\x00", 8);
  const std::string header =
      "{\"__metadata__\":{\"keel.crc32\":\"3273218d\",\"step\":\"1000\"},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,36]}} ";
  const std::string data(
      "\x00\x00\xc0\x3f\x00\x00\x10\xc0\x00\x00\x40\x40\xcd\xcc\xcc\x3d\x00\x00\x00\x80\x00\xe0\x7f\x47"
      "\x6f\x12\x83\x3a\x00\x00\xe0\x40\x00\x00\x08\xc1",
      36);
  return length + header + data;
}

TEST(Crc32Test, CheckpointWrittenByTheOldCodeStillVerifies) {
  const std::string dir = testing_util::TestDir();
  const std::string bytes = OldCheckpoint();
  ASSERT_EQ(bytes.size(), 212u);
  ASSERT_TRUE(WriteFileAtomic(dir + "/old.safetensors", bytes).ok());
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta;
  Status s = ReadSafetensors(dir + "/old.safetensors", &tensors, &meta);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "w");
  EXPECT_EQ(tensors[0].data, std::vector<float>({1.5f, -2.25f, 3.0f, 0.1f, -0.0f, 65504.0f}));
  EXPECT_EQ(tensors[1].data, std::vector<float>({1e-3f, 7.0f, -8.5f}));
  EXPECT_EQ(meta["keel.crc32"], "3273218d");
  EXPECT_EQ(Crc32(0, bytes.data() + 176, 36), 0x3273218Du);

  // The check is live: one flipped data byte is refused as corrupt.
  std::string flipped = bytes;
  flipped[200] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(dir + "/flipped.safetensors", flipped).ok());
  s = ReadSafetensors(dir + "/flipped.safetensors", &tensors, &meta);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(testing_util::HasAll(s.message(), {"flipped.safetensors", "corrupt", "3273218d"}));
}

}  // namespace
}  // namespace keel
