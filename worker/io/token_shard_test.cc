// Tests of llm.c token shards: the exact on-disk layout, round trips, and the
// refusals of files whose header or size is wrong.
#include "worker/io/token_shard.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "worker/io/file_util.h"
#include "worker/io/test_util.h"

namespace keel {
namespace {

using testing_util::HasAll;
using testing_util::TestDir;

// A shard built by hand, as llm.c's Python writer does: int32 header[256],
// then uint16 tokens (this host is little-endian, like the file).
std::string RawShard(int32_t magic, int32_t version, int32_t count,
                     const std::vector<uint16_t>& tokens) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

TEST(TokenShardTest, WriteProducesTheLlmcLayoutByteForByte) {
  const std::string path = TestDir() + "/s.bin";
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535};
  ASSERT_TRUE(WriteTokenShard(path, tokens.data(), 6).ok());
  std::string bytes;
  ASSERT_TRUE(ReadFile(path, &bytes).ok());
  ASSERT_EQ(bytes.size(), 1024u + 12u);
  // 20240520 = 0x0134D888, little-endian.
  EXPECT_EQ(bytes.substr(0, 12), std::string("\x88\xD8\x34\x01\x01\0\0\0\x06\0\0\0", 12));
  EXPECT_EQ(bytes.substr(12, 1012), std::string(1012, '\0'));
  EXPECT_EQ(bytes.substr(1024), std::string("\0\0\x01\0\xFF\0\0\x01\x50\xC4\xFF\xFF", 12));
  EXPECT_EQ(bytes, RawShard(20240520, 1, 6, tokens));
}

TEST(TokenShardTest, RoundTrip) {
  const std::string path = TestDir() + "/s.bin";
  std::vector<uint16_t> tokens(10007);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7919);
  ASSERT_TRUE(WriteTokenShard(path, tokens.data(), static_cast<int64_t>(tokens.size())).ok());
  int64_t count = -1;
  ASSERT_TRUE(ReadTokenShardHeader(path, &count).ok());
  EXPECT_EQ(count, 10007);
  std::vector<uint16_t> back;
  ASSERT_TRUE(ReadTokenShard(path, &back).ok());
  EXPECT_EQ(back, tokens);
}

TEST(TokenShardTest, EmptyShardRoundTrips) {
  const std::string path = TestDir() + "/s.bin";
  ASSERT_TRUE(WriteTokenShard(path, nullptr, 0).ok());
  std::vector<uint16_t> back = {1, 2};
  ASSERT_TRUE(ReadTokenShard(path, &back).ok());
  EXPECT_TRUE(back.empty());
  int64_t count = -1, max_token = 0;
  ASSERT_TRUE(ScanTokenShard(path, &count, &max_token).ok());
  EXPECT_EQ(count, 0);
  EXPECT_EQ(max_token, -1);
}

TEST(TokenShardTest, WriteRefusesCountsTheHeaderCannotHold) {
  const std::string path = TestDir() + "/s.bin";
  uint16_t t = 0;
  Status s = WriteTokenShard(path, &t, -1);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {path, "-1", "[0, 2147483647]"}));
  EXPECT_FALSE(WriteTokenShard(path, &t, int64_t{1} << 31).ok());
  EXPECT_FALSE(WriteTokenShard(path, nullptr, 3).ok());
}

// Writes `bytes` and expects both readers to refuse the file with a message
// containing `parts`, leaving the output vector alone.
void ExpectRefused(const std::string& path, const std::string& bytes,
                   std::initializer_list<std::string> parts) {
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  int64_t count = -7;
  Status s = ReadTokenShardHeader(path, &count);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), parts));
  EXPECT_EQ(count, -7);
  std::vector<uint16_t> tokens = {42};
  s = ReadTokenShard(path, &tokens);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), parts));
  EXPECT_EQ(tokens, std::vector<uint16_t>{42});
  int64_t max_token;
  EXPECT_FALSE(ScanTokenShard(path, &count, &max_token).ok());
}

TEST(TokenShardTest, RefusesBadMagic) {
  const std::string path = TestDir() + "/s.bin";
  ExpectRefused(path, RawShard(20240521, 1, 2, {1, 2}),
                {path, "magic", "is 20240521", "expected 20240520"});
}

TEST(TokenShardTest, RefusesBadVersion) {
  const std::string path = TestDir() + "/s.bin";
  ExpectRefused(path, RawShard(20240520, 2, 2, {1, 2}), {path, "version", "is 2", "expected 1"});
}

TEST(TokenShardTest, RefusesNegativeCount) {
  const std::string path = TestDir() + "/s.bin";
  ExpectRefused(path, RawShard(20240520, 1, -4, {}), {path, "count", "is -4", ">= 0"});
}

TEST(TokenShardTest, RefusesTruncatedTokens) {
  const std::string path = TestDir() + "/s.bin";
  std::string bytes = RawShard(20240520, 1, 3, {1, 2, 3});
  bytes.pop_back();
  ExpectRefused(path, bytes, {path, "file size is 1029 bytes", "expected 1030", "count 3",
                              "truncated"});
  // Header promises tokens, none present.
  ExpectRefused(path, RawShard(20240520, 1, 3, {}), {path, "1024 bytes", "expected 1030",
                                                     "truncated"});
}

TEST(TokenShardTest, RefusesTrailingBytes) {
  const std::string path = TestDir() + "/s.bin";
  ExpectRefused(path, RawShard(20240520, 1, 2, {1, 2, 3}),
                {path, "file size is 1030 bytes", "expected 1028", "trailing bytes"});
  ExpectRefused(path, RawShard(20240520, 1, 2, {1, 2}) + "x",
                {path, "1029", "expected 1028", "trailing bytes"});
}

TEST(TokenShardTest, RefusesFileShorterThanTheHeader) {
  const std::string path = TestDir() + "/s.bin";
  ExpectRefused(path, RawShard(20240520, 1, 0, {}).substr(0, 1000),
                {path, "1000 bytes", "1024-byte header"});
}

TEST(TokenShardTest, MissingFileIsNamed) {
  const std::string path = TestDir() + "/none.bin";
  int64_t count;
  Status s = ReadTokenShardHeader(path, &count);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {path}));
}

TEST(TokenShardTest, ScanFindsTheMaximumAcrossReadChunks) {
  const std::string path = TestDir() + "/s.bin";
  // More than one 2^21-token read chunk, the maximum in the second chunk.
  std::vector<uint16_t> tokens((size_t{1} << 21) + 5, 7);
  tokens[100] = 300;
  tokens.back() = 301;
  ASSERT_TRUE(WriteTokenShard(path, tokens.data(), static_cast<int64_t>(tokens.size())).ok());
  int64_t count = 0, max_token = 0;
  ASSERT_TRUE(ScanTokenShard(path, &count, &max_token).ok());
  EXPECT_EQ(count, static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(max_token, 301);
}

}  // namespace
}  // namespace keel
