// Tests of the file helpers: atomic writes, ranges, directories.
#include "worker/io/file_util.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "worker/io/test_util.h"

namespace keel {
namespace {

using testing_util::Exists;
using testing_util::HasAll;
using testing_util::TestDir;

TEST(FileUtilTest, WriteAtomicThenReadGivesTheBytesAndLeavesNoTmp) {
  const std::string path = TestDir() + "/f";
  const std::string bytes("a\0b\xff" "cd", 6);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  std::string got;
  ASSERT_TRUE(ReadFile(path, &got).ok());
  EXPECT_EQ(got, bytes);
  EXPECT_FALSE(Exists(path + ".tmp"));
  int64_t size = -1;
  ASSERT_TRUE(FileSize(path, &size).ok());
  EXPECT_EQ(size, 6);
}

TEST(FileUtilTest, WriteAtomicConcatenatesPiecesAndReplacesTheOldFile) {
  const std::string path = TestDir() + "/f";
  ASSERT_TRUE(WriteFileAtomic(path, std::string(100, 'x')).ok());
  const std::string a = "head", b = "", c = "tail";
  ASSERT_TRUE(WriteFileAtomic(path, {ByteSpan{a.data(), a.size()}, ByteSpan{b.data(), 0},
                                     ByteSpan{c.data(), c.size()}})
                  .ok());
  std::string got;
  ASSERT_TRUE(ReadFile(path, &got).ok());
  EXPECT_EQ(got, "headtail");
}

TEST(FileUtilTest, WriteAtomicIntoMissingDirectoryFailsNamingTheTmpFile) {
  const std::string path = TestDir() + "/no/such/dir/f";
  Status s = WriteFileAtomic(path, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {path + ".tmp"}));
}

TEST(FileUtilTest, ReadMissingFileNamesIt) {
  const std::string path = TestDir() + "/missing";
  std::string got = "unchanged";
  Status s = ReadFile(path, &got);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(HasAll(s.message(), {path, "No such file"}));
}

TEST(FileUtilTest, ReadRangeReadsTheRangeAndRefusesPastTheEnd) {
  const std::string path = TestDir() + "/f";
  ASSERT_TRUE(WriteFileAtomic(path, "0123456789").ok());
  char buf[4];
  ASSERT_TRUE(ReadFileRange(path, 3, 4, buf).ok());
  EXPECT_EQ(std::string(buf, 4), "3456");
  Status s = ReadFileRange(path, 8, 4, buf);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {path, "[8, 12)", "ends at byte 10"}));
}

TEST(FileUtilTest, MakeDirsCreatesParentsAcceptsExistingAndRefusesAFile) {
  const std::string root = TestDir();
  ASSERT_TRUE(MakeDirs(root + "/a/b/c").ok());
  EXPECT_TRUE(Exists(root + "/a/b/c"));
  EXPECT_TRUE(MakeDirs(root + "/a/b/c").ok());
  EXPECT_TRUE(MakeDirs(root + "/a/b/").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/file", "x").ok());
  Status s = MakeDirs(root + "/file");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasAll(s.message(), {root + "/file", "not a directory"}));
  EXPECT_FALSE(MakeDirs(root + "/file/sub").ok());
}

TEST(FileUtilTest, ListDirIsSortedWithoutDotEntries) {
  const std::string root = TestDir();
  for (const char* name : {"b", "a", "c.bin"}) {
    ASSERT_TRUE(WriteFileAtomic(root + "/" + name, "").ok());
  }
  ASSERT_TRUE(MakeDirs(root + "/d").ok());
  std::vector<std::string> names;
  ASSERT_TRUE(ListDir(root, &names).ok());
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c.bin", "d"}));
  EXPECT_FALSE(ListDir(root + "/missing", &names).ok());
}

TEST(FileUtilTest, DirName) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
  EXPECT_EQ(DirName("/x/y"), "/x");
}

TEST(FileUtilTest, AbsolutePathJoinsTheCurrentDirectoryToARelativePath) {
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(AbsolutePath("runs/a"), std::string(cwd) + "/runs/a");
  EXPECT_EQ(AbsolutePath("/srv/data"), "/srv/data");
  EXPECT_EQ(AbsolutePath(""), "");
}

}  // namespace
}  // namespace keel
