// Tests of the byte-level tokenizer and PrepareText: the shards decode back
// to the input, the split lands where the contract says, bad input is refused.
#include "worker/io/text_prepare.h"

#include <cmath>

#include <gtest/gtest.h>

#include "worker/io/file_util.h"
#include "worker/io/test_util.h"
#include "worker/io/token_shard.h"

namespace keel {
namespace {

using testing_util::Exists;
using testing_util::HasAll;
using testing_util::TestDir;

std::string Decode(const std::string& shard_path) {
  std::vector<uint16_t> tokens;
  Status s = ReadTokenShard(shard_path, &tokens);
  EXPECT_TRUE(s.ok()) << s.message();
  std::string text;
  s = DetokenizeBytes(tokens, &text);
  EXPECT_TRUE(s.ok()) << s.message();
  return text;
}

// Runs PrepareText on `text` and returns the decoded (train, val).
std::pair<std::string, std::string> Split(const std::string& text, double val_fraction,
                                          PrepareSummary* summary) {
  const std::string dir = TestDir();
  EXPECT_TRUE(WriteFileAtomic(dir + "/in.txt", text).ok());
  Status s = PrepareText(dir + "/in.txt", dir + "/out", val_fraction, summary);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return {};
  return {Decode(summary->train_path), Decode(summary->val_path)};
}

// Split must cut `text` into exactly `train` and `val`.
void ExpectCut(const std::string& text, double val_fraction, const std::string& train, const std::string& val) {
  PrepareSummary summary;
  const auto parts = Split(text, val_fraction, &summary);
  EXPECT_EQ(parts.first, train) << "cutting " << text;
  EXPECT_EQ(parts.second, val) << "cutting " << text;
}

TEST(TextPrepareTest, TokenizerMapsBytesToTheirValues) {
  const std::string text = "A\n\xC3\xA9\xFF";
  EXPECT_EQ(TokenizeBytes(text), (std::vector<uint16_t>{65, 10, 0xC3, 0xA9, 0xFF}));
  std::string back;
  ASSERT_TRUE(DetokenizeBytes(TokenizeBytes(text), &back).ok());
  EXPECT_EQ(back, text);
  EXPECT_EQ(kByteVocabSize, 256);
}

TEST(TextPrepareTest, DetokenizeRefusesIdsOutsideTheByteVocabulary) {
  std::string text = "unchanged";
  Status s = DetokenizeBytes({104, 105, 256}, &text);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"token 2", "256", "[0, 256)"}));
  EXPECT_EQ(text, "unchanged");
}

TEST(TextPrepareTest, ShardsDecodeBackToTheInputWithValAtALineStart) {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog.\n";
  }
  text += "A caf\xC3\xA9 at the end, no final newline";
  PrepareSummary summary;
  auto [train, val] = Split(text, kDefaultValFraction, &summary);
  EXPECT_EQ(train + val, text);
  EXPECT_EQ(summary.total_tokens, static_cast<int64_t>(text.size()));
  EXPECT_EQ(summary.train_tokens, static_cast<int64_t>(train.size()));
  EXPECT_EQ(summary.val_tokens, static_cast<int64_t>(val.size()));
  EXPECT_EQ(summary.train_tokens + summary.val_tokens, summary.total_tokens);
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train.back(), '\n');
  // About a tenth, at most one line more.
  const int64_t target = std::llround(0.1 * static_cast<double>(text.size()));
  EXPECT_LE(summary.val_tokens, target);
  EXPECT_GT(summary.val_tokens, target - 60);
  EXPECT_TRUE(HasAll(summary.train_path, {"/out_train.bin"}));
  EXPECT_TRUE(HasAll(summary.val_path, {"/out_val.bin"}));
}

TEST(TextPrepareTest, CutMovesForwardToTheNextLineStart) {
  PrepareSummary summary;
  // 20 bytes; 0.3 -> 6 val tokens -> point 14, a '\n'; val starts after it.
  auto parts = Split("aaaa\nbbbb\ncccc\ndddd\n", 0.3, &summary);
  EXPECT_EQ(parts.first, "aaaa\nbbbb\ncccc\n");
  EXPECT_EQ(parts.second, "dddd\n");
  EXPECT_EQ(summary.train_tokens, 15);
  EXPECT_EQ(summary.val_tokens, 5);
}

TEST(TextPrepareTest, CutAtALineStartStaysThere) {
  // 0.5 -> point 10, just after a '\n'.
  ExpectCut("aaaa\nbbbb\ncccc\ndddd\n", 0.5, "aaaa\nbbbb\n", "cccc\ndddd\n");
}

TEST(TextPrepareTest, WithoutALaterNewlineTheCutStaysAtThePoint) {
  ExpectCut("abcdefghij", 0.2, "abcdefgh", "ij");
  // The only later '\n' is the last byte: it would leave val empty.
  ExpectCut("abcdefghi\n", 0.2, "abcdefgh", "i\n");
}

TEST(TextPrepareTest, CutDoesNotSplitAMultiByteCharacter) {
  // a x6, then e-acute (2 bytes), then b: the point 7 is inside the e-acute.
  ExpectCut("aaaaaa\xC3\xA9" "b", 0.2, "aaaaaa\xC3\xA9", "b");
}

TEST(TextPrepareTest, SmallestInputGivesOneTokenEach) { ExpectCut("ab", 0.1, "a", "b"); }

// Expects PrepareText to refuse `text` with a message containing `parts` and
// to write no shard.
void ExpectRefused(const std::string& text, double val_fraction,
                   std::initializer_list<std::string> parts) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/in.txt", text).ok());
  PrepareSummary summary;
  summary.total_tokens = -5;
  Status s = PrepareText(dir + "/in.txt", dir + "/out", val_fraction, &summary);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), parts));
  EXPECT_EQ(summary.total_tokens, -5);
  EXPECT_FALSE(Exists(dir + "/out_train.bin"));
  EXPECT_FALSE(Exists(dir + "/out_val.bin"));
}

TEST(TextPrepareTest, RefusesInvalidUtf8WithTheByteOffset) {
  ExpectRefused("hello\xFFworld\n", 0.1, {"in.txt", "not valid UTF-8", "byte offset 5", "0xFF"});
  ExpectRefused("caf\xC3\xA9\n\xED\xA0\x80\n", 0.1, {"byte offset 6", "0xED"});  // surrogate
  ExpectRefused("ends mid-character \xE2\x82", 0.1, {"byte offset 19"});
}

TEST(TextPrepareTest, RefusesEmptyInput) { ExpectRefused("", 0.1, {"in.txt", "is empty"}); }

TEST(TextPrepareTest, RefusesInputTooShortForTwoShards) {
  ExpectRefused("a", 0.1, {"in.txt", "1 tokens", "at least 1 token each"});
  // The cut would fall inside the last character.
  ExpectRefused("a\xE2\x82\xAC", 0.5, {"in.txt", "last character"});
}

TEST(TextPrepareTest, RefusesValFractionOutsideZeroOne) {
  for (double f : {0.0, 1.0, -0.1, 1.5, std::nan("")}) {
    ExpectRefused("some text\nmore text\n", f, {"val_fraction", "strictly between 0 and 1"});
  }
}

TEST(TextPrepareTest, RefusesMissingInputNamingIt) {
  const std::string dir = TestDir();
  PrepareSummary summary;
  Status s = PrepareText(dir + "/missing.txt", dir + "/out", 0.1, &summary);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/missing.txt"}));
}

TEST(TextPrepareTest, CreatesTheOutputDirectory) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/in.txt", "one\ntwo\nthree\n").ok());
  PrepareSummary summary;
  Status s = PrepareText(dir + "/in.txt", dir + "/data/tiny/text", 0.3, &summary);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(summary.train_path, dir + "/data/tiny/text_train.bin");
  EXPECT_EQ(summary.val_path, dir + "/data/tiny/text_val.bin");
  EXPECT_EQ(Decode(summary.train_path) + Decode(summary.val_path), "one\ntwo\nthree\n");
}

TEST(TextPrepareTest, Gpt2ShardsHoldTheBpeIdsOfEachPartAndDecodeBack) {
  std::string text;
  for (int i = 0; i < 30; ++i) {
    text += "Line " + std::to_string(i) + ": it's the caf\xC3\xA9's  3,50 \xE2\x82\xAC price.\n";
  }
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/in.txt", text).ok());
  PrepareOptions options;
  options.tokenizer = TextTokenizer::kGpt2;
  PrepareSummary summary;
  Status s = PrepareText(dir + "/in.txt", dir + "/out", options, &summary);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Gpt2Bpe> bpe;
  ASSERT_TRUE(Gpt2Bpe::Load(kDefaultGpt2BpeDir, &bpe).ok());
  std::vector<uint16_t> train, val;
  ASSERT_TRUE(ReadTokenShard(summary.train_path, &train).ok());
  ASSERT_TRUE(ReadTokenShard(summary.val_path, &val).ok());
  EXPECT_EQ(static_cast<int64_t>(train.size()), summary.train_tokens);
  EXPECT_EQ(static_cast<int64_t>(val.size()), summary.val_tokens);
  EXPECT_EQ(summary.train_tokens + summary.val_tokens, summary.total_tokens);
  EXPECT_LT(summary.total_tokens, static_cast<int64_t>(text.size())) << "BPE merges bytes";
  std::string train_text, val_text;
  ASSERT_TRUE(bpe->Decode(train, &train_text).ok());
  ASSERT_TRUE(bpe->Decode(val, &val_text).ok());
  EXPECT_EQ(train_text + val_text, text);
  EXPECT_EQ(train_text.back(), '\n');
  // Each part is the BPE encoding of its own text.
  std::vector<uint16_t> want;
  ASSERT_TRUE(bpe->Encode(val_text, &want).ok());
  EXPECT_EQ(val, want);
  EXPECT_EQ(TextTokenizerVocab(TextTokenizer::kGpt2), 50257);
}

TEST(TextPrepareTest, Gpt2WithoutTheBpeFilesWritesNothingAndSaysHowToInstall) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/in.txt", "hello\nworld\n").ok());
  PrepareOptions options;
  options.tokenizer = TextTokenizer::kGpt2;
  options.bpe_dir = dir + "/no-bpe";
  PrepareSummary summary;
  Status s = PrepareText(dir + "/in.txt", dir + "/out", options, &summary);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/no-bpe/encoder.json", "scripts/install-deps"}));
  EXPECT_FALSE(Exists(dir + "/out_train.bin"));
}

TEST(TextPrepareTest, TokenizerNamesParseAndOthersAreRefused) {
  TextTokenizer t = TextTokenizer::kGpt2;
  ASSERT_TRUE(ParseTextTokenizer("bytes", &t).ok());
  EXPECT_EQ(t, TextTokenizer::kBytes);
  ASSERT_TRUE(ParseTextTokenizer("gpt2", &t).ok());
  EXPECT_EQ(t, TextTokenizer::kGpt2);
  Status s = ParseTextTokenizer("GPT-2", &t);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"tokenizer", "GPT-2", "bytes or gpt2"}));
  EXPECT_EQ(t, TextTokenizer::kGpt2);
}

}  // namespace
}  // namespace keel
