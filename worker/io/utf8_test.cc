// Tests of UTF-8 validation against the boundary cases of RFC 3629.
#include "worker/io/utf8.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

size_t Length(const std::string& s) {
  return Utf8SequenceLength(reinterpret_cast<const unsigned char*>(s.data()), s.size());
}

TEST(Utf8Test, ValidSequencesAtEachLengthAndBoundary) {
  EXPECT_EQ(Length("A"), 1u);
  EXPECT_EQ(Length(std::string(1, '\0')), 1u);
  EXPECT_EQ(Length("\xC2\x80"), 2u);          // U+0080
  EXPECT_EQ(Length("\xDF\xBF"), 2u);          // U+07FF
  EXPECT_EQ(Length("\xE0\xA0\x80"), 3u);      // U+0800
  EXPECT_EQ(Length("\xED\x9F\xBF"), 3u);      // U+D7FF
  EXPECT_EQ(Length("\xEE\x80\x80"), 3u);      // U+E000
  EXPECT_EQ(Length("\xEF\xBF\xBF"), 3u);      // U+FFFF
  EXPECT_EQ(Length("\xF0\x90\x80\x80"), 4u);  // U+10000
  EXPECT_EQ(Length("\xF4\x8F\xBF\xBF"), 4u);  // U+10FFFF
}

TEST(Utf8Test, InvalidSequencesAreRefused) {
  EXPECT_EQ(Length("\x80"), 0u);              // stray continuation
  EXPECT_EQ(Length("\xC0\x80"), 0u);          // overlong NUL
  EXPECT_EQ(Length("\xC1\xBF"), 0u);          // overlong
  EXPECT_EQ(Length("\xE0\x9F\xBF"), 0u);      // overlong U+07FF
  EXPECT_EQ(Length("\xED\xA0\x80"), 0u);      // surrogate U+D800
  EXPECT_EQ(Length("\xF0\x8F\xBF\xBF"), 0u);  // overlong U+FFFF
  EXPECT_EQ(Length("\xF4\x90\x80\x80"), 0u);  // U+110000
  EXPECT_EQ(Length("\xF5\x80\x80\x80"), 0u);
  EXPECT_EQ(Length("\xFF"), 0u);
  EXPECT_EQ(Length("\xC3"), 0u);              // cut off
  EXPECT_EQ(Length("\xE2\x82"), 0u);          // cut off
  EXPECT_EQ(Length("\xC3\x41"), 0u);          // bad continuation
  EXPECT_EQ(Length("\xE2\x82\x41"), 0u);
}

TEST(Utf8Test, IsValidUtf8ReportsTheFirstBadOffset) {
  size_t offset = 99;
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE2\x82\xAC", &offset));
  EXPECT_TRUE(IsValidUtf8("", &offset));
  EXPECT_FALSE(IsValidUtf8("ab\xC3\xA9x\xE9y\xFF", &offset));
  EXPECT_EQ(offset, 5u);
  EXPECT_FALSE(IsValidUtf8("abc\xE2\x82", &offset));
  EXPECT_EQ(offset, 3u);
}

TEST(Utf8Test, AppendUtf8EncodesEachLength) {
  std::string s;
  for (unsigned cp : {0x41u, 0xE9u, 0x20ACu, 0x1F600u}) AppendUtf8(cp, &s);
  EXPECT_EQ(s, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  size_t offset;
  EXPECT_TRUE(IsValidUtf8(s, &offset));
}

}  // namespace
}  // namespace keel
