// Tests of safetensors reading and writing: round trips, the exact bytes of a
// tiny file, files from other tools, and every refusal the reader promises.
#include "worker/io/safetensors.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "worker/io/crc32.h"
#include "worker/io/file_util.h"
#include "worker/io/test_util.h"

namespace keel {
namespace {

using testing_util::Exists;
using testing_util::HasAll;
using testing_util::TestDir;

// A safetensors file built by hand: length, header (padded with spaces to a
// multiple of 8 when `pad`), data.
std::string MakeFile(const std::string& header, const std::string& data, bool pad = true) {
  std::string h = header;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  return bytes + h + data;
}

std::string FloatBytes(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Reads `path` expecting a refusal that mentions the path and `parts`, with
// the outputs untouched.
void ExpectRefused(const std::string& path, std::initializer_list<std::string> parts) {
  std::vector<Tensor> tensors(1);
  tensors[0].name = "sentinel";
  std::map<std::string, std::string> metadata = {{"sentinel", "1"}};
  Status s = ReadSafetensors(path, &tensors, &metadata);
  ASSERT_FALSE(s.ok()) << "accepted " << path;
  // Every way a file fails to read back is data loss, whatever the message says.
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << StatusCodeName(s.code()) << ": " << s.message();
  EXPECT_TRUE(HasAll(s.message(), {path})) << s.message();
  EXPECT_TRUE(HasAll(s.message(), parts));
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].name, "sentinel");
  EXPECT_EQ(metadata.size(), 1u);
}

void ExpectRefusedBytes(const std::string& bytes, std::initializer_list<std::string> parts) {
  const std::string path = TestDir() + "/bad.safetensors";
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  ExpectRefused(path, parts);
}

// Writes a valid file with three tensors and returns its bytes.
std::string ValidFile(const std::string& path) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8}, c = {9};
  Status s = WriteSafetensors(path, {{"a", {2, 3}, a.data()}, {"b", {2}, b.data()},
                                     {"c", {}, c.data()}},
                              {{"step", "10"}});
  EXPECT_TRUE(s.ok()) << s.message();
  std::string bytes;
  EXPECT_TRUE(ReadFile(path, &bytes).ok());
  return bytes;
}

TEST(SafetensorsTest, RoundTripKeepsNamesShapesBitsAndMetadata) {
  const std::string path = TestDir() + "/model.safetensors";
  std::vector<float> scalar = {3.5f};
  std::vector<float> matrix(12);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = 0.1f * static_cast<float>(i) - 0.5f;
  std::vector<float> cube(2 * 3 * 4);
  for (size_t i = 0; i < cube.size(); ++i) cube[i] = std::ldexp(1.0f, static_cast<int>(i) - 12);
  cube[0] = -0.0f;
  cube[1] = std::numeric_limits<float>::quiet_NaN();
  cube[2] = -std::numeric_limits<float>::infinity();
  cube[3] = std::numeric_limits<float>::denorm_min();
  const std::vector<TensorRef> refs = {
      {"transformer.h.0.attn.c_attn.weight", {3, 4}, matrix.data()},
      {"scale", {}, scalar.data()},
      {"cube", {2, 3, 4}, cube.data()},
      {"empty", {0, 5}, nullptr},
  };
  const std::map<std::string, std::string> metadata = {
      {"keel.step", "1200"}, {"keel.scheme", "mxfp8_e4m3"}, {"note", "quote \" and \xC3\xA9"}};
  ASSERT_TRUE(WriteSafetensors(path, refs, metadata).ok());

  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta;
  Status s = ReadSafetensors(path, &tensors, &meta);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors[0].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(tensors[0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(SameBits(tensors[0].data, matrix));
  EXPECT_EQ(tensors[1].name, "scale");
  EXPECT_TRUE(tensors[1].shape.empty());
  EXPECT_TRUE(SameBits(tensors[1].data, scalar));
  EXPECT_EQ(tensors[2].name, "cube");
  EXPECT_EQ(tensors[2].shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(SameBits(tensors[2].data, cube));
  EXPECT_EQ(tensors[3].name, "empty");
  EXPECT_EQ(tensors[3].shape, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(tensors[3].data.empty());
  ASSERT_EQ(meta.size(), 4u);
  EXPECT_EQ(meta["keel.step"], "1200");
  EXPECT_EQ(meta["keel.scheme"], "mxfp8_e4m3");
  EXPECT_EQ(meta["note"], "quote \" and \xC3\xA9");
  EXPECT_EQ(meta["keel.crc32"].size(), 8u);
  EXPECT_FALSE(Exists(path + ".tmp"));
}

TEST(SafetensorsTest, TinyFileIsExactlyTheDocumentedBytes) {
  const std::string path = TestDir() + "/tiny.safetensors";
  const std::vector<float> w = {1.0f, -2.0f}, s = {0.5f};
  ASSERT_TRUE(WriteSafetensors(path, {{"w", {2}, w.data()}, {"s", {}, s.data()}},
                               {{"format", "pt"}})
                  .ok());
  std::string bytes;
  ASSERT_TRUE(ReadFile(path, &bytes).ok());
  // 0x332b058b is zlib.crc32 of the 12 data bytes (computed with Python).
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\",\"keel.crc32\":\"332b058b\"},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]}}";
  ASSERT_EQ(header.size(), 162u);
  const std::string expected = std::string("\xA8\0\0\0\0\0\0\0", 8) + header + "      " +
                               std::string("\0\0\x80\x3f\0\0\0\xc0\0\0\0\x3f", 12);
  EXPECT_EQ(bytes.size(), 8u + 168u + 12u);
  EXPECT_EQ(bytes, expected);
}

TEST(SafetensorsTest, HeaderLengthIsAMultipleOfEightForEveryNameLength) {
  const std::string dir = TestDir();
  const float x = 1;
  for (int len = 1; len <= 9; ++len) {
    const std::string path = dir + "/f" + std::to_string(len);
    ASSERT_TRUE(WriteSafetensors(path, {{std::string(len, 'n'), {1}, &x}}, {}).ok());
    std::string bytes;
    ASSERT_TRUE(ReadFile(path, &bytes).ok());
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 4);
    std::vector<Tensor> tensors;
    std::map<std::string, std::string> meta;
    ASSERT_TRUE(ReadSafetensors(path, &tensors, &meta).ok());
  }
}

TEST(SafetensorsTest, FilesFromOtherToolsWithoutCrcAreReadInOffsetOrder) {
  // Listed out of offset order, whitespace in the header, no padding, no
  // metadata: as other writers may produce.
  const std::string bytes = MakeFile(
      "{ \"b\": {\"dtype\": \"F32\", \"shape\": [1, 2], \"data_offsets\": [4, 12]},\n"
      "  \"a\": {\"data_offsets\": [0, 4], \"shape\": [], \"dtype\": \"F32\"} }",
      FloatBytes({1.5f, 2.5f, 3.5f}), /*pad=*/false);
  const std::string path = TestDir() + "/other.safetensors";
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta = {{"stale", "x"}};
  Status s = ReadSafetensors(path, &tensors, &meta);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "a");
  EXPECT_EQ(tensors[0].data, (std::vector<float>{1.5f}));
  EXPECT_EQ(tensors[1].name, "b");
  EXPECT_EQ(tensors[1].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tensors[1].data, (std::vector<float>{2.5f, 3.5f}));
  EXPECT_TRUE(meta.empty());
}

TEST(SafetensorsTest, CallerCrcIsReplacedAndMetadataSurvivesARewrite) {
  const std::string dir = TestDir();
  const float x[2] = {1, 2};
  ASSERT_TRUE(
      WriteSafetensors(dir + "/a", {{"x", {2}, x}}, {{"keel.crc32", "deadbeef"}}).ok());
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(ReadSafetensors(dir + "/a", &tensors, &meta).ok());
  char want[9];
  std::snprintf(want, sizeof(want), "%08x", Crc32(0, x, sizeof(x)));
  EXPECT_EQ(meta["keel.crc32"], want);
  // Load, change the data, save with the loaded metadata: still consistent.
  tensors[0].data[1] = 3;
  ASSERT_TRUE(WriteSafetensors(dir + "/b", {{"x", {2}, tensors[0].data.data()}}, meta).ok());
  ASSERT_TRUE(ReadSafetensors(dir + "/b", &tensors, &meta).ok());
  EXPECT_EQ(tensors[0].data, (std::vector<float>{1, 3}));
}

TEST(SafetensorsTest, RefusesTruncatedFilesAtEveryKindOfCut) {
  const std::string dir = TestDir();
  const std::string bytes = ValidFile(dir + "/good.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(bytes.size(), 8 + n + 36);
  struct Cut {
    size_t size;
    std::vector<std::string> parts;
  };
  const Cut cuts[] = {
      {0, {"0 bytes", "shorter than the 8-byte header length"}},
      {5, {"5 bytes", "shorter than the 8-byte header length"}},
      {8, {"header length " + std::to_string(n), "larger than the 0 bytes", "truncated"}},
      {8 + n / 2, {"header length", "truncated"}},
      {8 + n - 1, {"header length", "truncated"}},
      {8 + n, {"tensor 'a'", "runs past the end of the 0-byte data buffer", "truncated"}},
      {8 + n + 10, {"tensor 'a'", "10-byte data buffer", "truncated"}},
      {8 + n + 24, {"tensor 'b'", "24-byte data buffer", "truncated"}},
      {bytes.size() - 1, {"tensor 'c'", "35-byte data buffer", "truncated"}},
  };
  for (const Cut& cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut.size));
    const std::string path = dir + "/cut" + std::to_string(cut.size);
    ASSERT_TRUE(WriteFileAtomic(path, bytes.substr(0, cut.size)).ok());
    std::vector<Tensor> tensors;
    std::map<std::string, std::string> meta;
    Status s = ReadSafetensors(path, &tensors, &meta);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(HasAll(s.message(), {path}));
    for (const std::string& part : cut.parts) EXPECT_TRUE(HasAll(s.message(), {part}));
  }
}

TEST(SafetensorsTest, RefusesAFlippedDataByteAsCorrupt) {
  const std::string dir = TestDir();
  std::string bytes = ValidFile(dir + "/good.safetensors");
  for (size_t from_end : {1, 17, 36}) {
    std::string bad = bytes;
    bad[bad.size() - from_end] ^= 0x01;
    const std::string path = dir + "/flip" + std::to_string(from_end);
    ASSERT_TRUE(WriteFileAtomic(path, bad).ok());
    ExpectRefused(path, {"corrupt", "keel.crc32 is", "data buffer's CRC-32 is"});
  }
}

TEST(SafetensorsTest, RefusesAMalformedCrc) {
  const std::string data = FloatBytes({1});
  ExpectRefusedBytes(
      MakeFile("{\"__metadata__\":{\"keel.crc32\":\"xyz\"},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               data),
      {"keel.crc32 is \"xyz\"", "8 hex digits"});
}

TEST(SafetensorsTest, RefusesDtypesOtherThanF32) {
  ExpectRefusedBytes(
      MakeFile("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
               std::string(4, '\0')),
      {"tensor 'a'", "dtype \"F16\"", "only dtype allowed is \"F32\""});
  ExpectRefusedBytes(
      MakeFile("{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}",
               std::string(4, '\0')),
      {"dtype 32", "\"F32\""});
}

// One F32 tensor 'a' with the given shape and data_offsets, as header JSON.
std::string TensorA(const std::string& shape, const std::string& offsets) {
  return "{\"a\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}}";
}

TEST(SafetensorsTest, RefusesBadOffsets) {
  const std::string data8(8, '\0');
  struct Case {
    std::string header;
    std::initializer_list<std::string> parts;
  };
  const Case cases[] = {
      // Overlap.
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       {"tensor 'b'", "[4, 8]", "overlaps tensor 'a'", "ends at 8"}},
      // Gap.
      {TensorA("[1]", "[4,8]"), {"tensor 'a'", "leaves bytes [0, 4)", "contiguous"}},
      // begin > end.
      {TensorA("[0]", "[8,4]"), {"tensor 'a'", "data_offsets [8,4]", "0 <= begin <= end"}},
      // Negative, fractional, wrong arity.
      {TensorA("[1]", "[-4,0]"), {"data_offsets [-4,0]"}},
      {TensorA("[1]", "[0,4.5]"), {"data_offsets [0,4.5]"}},
      {TensorA("[1]", "[0]"), {"data_offsets [0]"}},
      // Shape disagreeing with the offsets.
      {TensorA("[3]", "[0,8]"), {"tensor 'a'", "shape [3]", "12 bytes", "span 8 bytes"}},
      // Offsets past the end of the data (out of range).
      {TensorA("[4]", "[0,16]"), {"tensor 'a'", "[0, 16]", "8-byte data buffer"}},
      // Data beyond the last tensor.
      {TensorA("[1]", "[0,4]"), {"data buffer is 8 bytes", "cover 4", "4 trailing bytes"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    ExpectRefusedBytes(MakeFile(c.header, data8), c.parts);
  }
}

TEST(SafetensorsTest, RefusesBadShapesAndEntries) {
  const std::string data4(4, '\0');
  const std::string f32 = "\"dtype\":\"F32\",";
  ExpectRefusedBytes(MakeFile(TensorA("[-1]", "[0,4]"), data4),
                     {"shape [-1]", "non-negative integers"});
  ExpectRefusedBytes(MakeFile(TensorA("\"1\"", "[0,4]"), data4), {"shape \"1\""});
  ExpectRefusedBytes(MakeFile(TensorA("[4611686018427387904,4]", "[0,4]"), data4),
                     {"element count overflows"});
  ExpectRefusedBytes(MakeFile("{\"a\":{" + f32 + "\"data_offsets\":[0,4]}}", data4),
                     {"tensor 'a' lacks shape"});
  ExpectRefusedBytes(
      MakeFile("{\"a\":{" + f32 + "\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", data4),
      {"key 'extra'", "dtype, shape, data_offsets"});
  ExpectRefusedBytes(MakeFile("{\"a\":[1]}", data4), {"tensor 'a'", "expected an object"});
  ExpectRefusedBytes(MakeFile("{\"__metadata__\":{\"k\":1}}", ""),
                     {"__metadata__ key 'k'", "expected a string"});
  ExpectRefusedBytes(MakeFile("{\"__metadata__\":[]}", ""), {"__metadata__ is not an object"});
  ExpectRefusedBytes(MakeFile("[]", ""), {"not a JSON object"});
}

TEST(SafetensorsTest, RefusesUnparsableHeaderJson) {
  ExpectRefusedBytes(MakeFile("{\"a\":{\"dtype\" \"F32\"}}", ""),
                     {"not valid JSON", "at byte 14", "expected ':'", "found '\"'"});
  // A NUL-padded header (not spaces) is not JSON either.
  ExpectRefusedBytes(MakeFile(std::string("{}\0\0\0\0\0\0", 8), "", false), {"not valid JSON"});
}

TEST(SafetensorsTest, RefusesHugeHeaderLengths) {
  std::string huge(8, '\0');
  for (uint64_t n : {uint64_t{100000001}, ~uint64_t{0}}) {
    for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>(n >> (8 * i));
    ExpectRefusedBytes(huge + "{}", {"header length " + std::to_string(n),
                                     "above the limit of 100000000 bytes"});
  }
  // Within the limit but longer than the file.
  ExpectRefusedBytes(std::string("\x00\x10\0\0\0\0\0\0{}", 10),
                     {"header length 4096", "larger than the 2 bytes"});
}

TEST(SafetensorsTest, AcceptsAnEmptyFileOfTensors) {
  const std::string path = TestDir() + "/none.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  std::vector<Tensor> tensors(3);
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(ReadSafetensors(path, &tensors, &meta).ok());
  EXPECT_TRUE(tensors.empty());
  EXPECT_EQ(meta["keel.crc32"], "00000000");
}

TEST(SafetensorsTest, WriterRefusesBadTensorsAndWritesNothing) {
  const std::string dir = TestDir();
  const std::string path = dir + "/w.safetensors";
  const float x[4] = {1, 2, 3, 4};
  struct Case {
    std::vector<TensorRef> tensors;
    std::string part;
  };
  const Case cases[] = {
      {{{"", {1}, x}}, "empty name"},
      {{{"a", {1}, x}, {"a", {1}, x}}, "used by an earlier tensor"},
      {{{"__metadata__", {1}, x}}, "reserved"},
      {{{"a", {2, -1}, x}}, "shape [2,-1]"},
      {{{"a", {4}, nullptr}}, "data is null for 4 elements"},
      {{{"a\xFF", {1}, x}}, "not valid UTF-8"},
  };
  for (const Case& c : cases) {
    Status s = WriteSafetensors(path, c.tensors, {});
    ASSERT_FALSE(s.ok()) << c.part;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.part;  // the caller's tensors, not the disk
    EXPECT_TRUE(HasAll(s.message(), {path, c.part}));
    EXPECT_FALSE(Exists(path));
  }
  Status s = WriteSafetensors(path, {{"a", {1}, x}}, {{"k", "bad \xFF"}});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"metadata key 'k'", "not valid UTF-8"}));
}

}  // namespace
}  // namespace keel
