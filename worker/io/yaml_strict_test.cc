// Tests of the strict YAML loader: what yaml-cpp accepts and Keel refuses,
// and that every refusal carries "source:line:col: ".
#include "worker/io/yaml_strict.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <fstream>

namespace keel {
namespace {

std::string Refusal(const std::string& text) {
  YAML::Node node;
  Status s = LoadYamlStrict(text, "f.yaml", &node);
  EXPECT_FALSE(s.ok()) << text.substr(0, 200);
  return s.message();
}

TEST(YamlStrictTest, LoadsOneDocumentWithItsPositions) {
  YAML::Node node;
  ASSERT_TRUE(LoadYamlStrict("a: 1\nb:\n  c: [x, y]\n", "f.yaml", &node).ok());
  EXPECT_EQ(node["b"]["c"][1].as<std::string>(), "y");
  EXPECT_EQ(node["b"]["c"].Mark().line, 2);
}

TEST(YamlStrictTest, EmptyTextAndAnExplicitDocumentStartAreOneDocument) {
  YAML::Node node;
  ASSERT_TRUE(LoadYamlStrict("", "f.yaml", &node).ok());
  EXPECT_TRUE(node.IsNull());
  ASSERT_TRUE(LoadYamlStrict("---\na: 1\n...\n", "f.yaml", &node).ok());
  EXPECT_EQ(node["a"].as<int>(), 1);
}

TEST(YamlStrictTest, DuplicateKeyIsRefusedAtTheSecondNamingTheFirstLine) {
  EXPECT_EQ(Refusal("a: 1\nb:\n  c: 1\n  d: 2\n  c: 3\n"), "f.yaml:5:3: b.c: duplicate key (first at line 3)");
  EXPECT_EQ(Refusal("name: x\nname: y\n"), "f.yaml:2:1: name: duplicate key (first at line 1)");
  EXPECT_EQ(Refusal("rules:\n  - {name: a, do: [stop], do: [skip_step]}\n"),
            "f.yaml:2:27: rules[0].do: duplicate key (first at line 2)");
}

TEST(YamlStrictTest, SecondDocumentIsRefusedNamingItsLine) {
  EXPECT_EQ(Refusal("a: 1\n---\nb: 2\n"),
            "f.yaml:2:1: document: a second YAML document starts at line 2 (allowed: one document per file; "
            "remove the '---' and what follows)");
  EXPECT_NE(Refusal("a: 1\n---\n").find("f.yaml:2:1: document: a second"), std::string::npos);
}

// yaml-cpp 0.7 (Debian 12) stops its own recursion at 2000 levels with the
// message "bad file"; Keel stops at kMaxYamlDepth and says why.
TEST(YamlStrictTest, HundredThousandDeepNestingIsRefusedWithAPosition) {
  std::string flow(100000, '[');
  const std::string refusal = Refusal(flow);
  EXPECT_EQ(refusal.substr(0, 9), "f.yaml:1:");
  EXPECT_NE(refusal.find(": nesting: more than 64 levels of mappings and lists (allowed: at most 64)"),
            std::string::npos);
  std::string block;
  for (int i = 0; i < 100000; ++i) block += "- ";
  EXPECT_NE(Refusal(block + "x\n").find("f.yaml:1:"), std::string::npos);
  std::string maps;
  for (int i = 0; i < 100000; ++i) maps += "{a: ";
  EXPECT_NE(Refusal(maps).find("nesting: more than 64"), std::string::npos);
}

TEST(YamlStrictTest, NestingUpToTheLimitIsAccepted) {
  YAML::Node node;
  std::string text = std::string(kMaxYamlDepth, '[') + std::string(kMaxYamlDepth, ']');
  EXPECT_TRUE(LoadYamlStrict(text, "f.yaml", &node).ok());
  text = "[" + text + "]";
  EXPECT_FALSE(LoadYamlStrict(text, "f.yaml", &node).ok());
}

TEST(YamlStrictTest, AliasesCannotNestACollectionInItselfOrExplode) {
  EXPECT_NE(Refusal("a: &x [*x]\n").find("levels of mappings and lists with aliases expanded"), std::string::npos);
  // "Billion laughs": nine levels of ten aliases each are 10^9 nodes expanded.
  std::string bomb = "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    std::string prev = "*l" + std::to_string(i - 1);
    bomb += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [" + prev;
    for (int k = 1; k < 10; ++k) bomb += ", " + prev;
    bomb += "]\n";
  }
  EXPECT_NE(Refusal(bomb).find("nodes once aliases are expanded (allowed: at most 1000000)"), std::string::npos);
}

TEST(YamlStrictTest, NulAndInvalidUtf8AndControlBytesAreNotText) {
  EXPECT_EQ(Refusal(std::string("a: 1\nb: x\0y\n", 12)),
            "f.yaml:2:5: not a text file: byte 0x00 at line 2 col 5 (allowed: UTF-8 text without control "
            "characters other than tab, CR, LF)");
  EXPECT_NE(Refusal("a: \xff\n").find("f.yaml:1:4: not a text file: byte 0xFF at line 1 col 4"), std::string::npos);
  EXPECT_NE(Refusal("a: \x1b[31m\n").find("byte 0x1B"), std::string::npos);
  EXPECT_NE(Refusal("a: \xc2\x80\n").find("byte 0xC2"), std::string::npos);  // U+0080, a C1 control
  // Columns count characters, not bytes.
  EXPECT_NE(Refusal("a: \xc3\xa9\x01\n").find("f.yaml:1:5:"), std::string::npos);
  YAML::Node node;
  EXPECT_TRUE(LoadYamlStrict("a: \"caf\xc3\xa9\"\r\nb:\t1\n", "f.yaml", &node).ok());
}

TEST(YamlStrictTest, TooLargeTextIsRefusedAtOneOneWithSizeAndLimit) {
  std::string text(kMaxYamlBytes + 1, '#');
  EXPECT_EQ(Refusal(text), "f.yaml:1:1: size: 4194305 bytes is more than the limit of 4194304 bytes (allowed: at most 4 MiB)");
}

TEST(YamlStrictTest, InvalidYamlHasANonEmptyReasonAndPosition) {
  EXPECT_EQ(Refusal("a: [1, 2\n").substr(0, 7), "f.yaml:");
  EXPECT_NE(Refusal("a: [1, 2\n").find("invalid YAML: "), std::string::npos);
  EXPECT_NE(Refusal("a: *nowhere\n").find("invalid YAML: "), std::string::npos);
}

TEST(YamlStrictTest, ReadYamlFileStopsAtTheLimitAndNamesTheSize) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/big.yaml";
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(50u << 20, 'a');
  }
  std::string text = "unchanged";
  Status s = ReadYamlFile(path, &text);
  EXPECT_EQ(s.message(), path + ":1:1: size: 52428800 bytes is more than the limit of 4194304 bytes (allowed: at most 4 MiB)");
  EXPECT_EQ(text, "unchanged");
  std::remove(path.c_str());
  EXPECT_NE(ReadYamlFile(path, &text).message().find("cannot read '" + path + "': "), std::string::npos);
  // A device that never ends is read only up to the limit.
  EXPECT_NE(ReadYamlFile("/dev/zero", &text).message().find("/dev/zero:1:1: size: more than 4194304 bytes"),
            std::string::npos);
}

}  // namespace
}  // namespace keel
