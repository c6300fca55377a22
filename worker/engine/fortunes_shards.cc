// Fortunes shards for the trainer's tests (see fortunes_shards.h).
#include "worker/engine/fortunes_shards.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "worker/io/text_prepare.h"

namespace keel {

void PrepareFortunes(const std::string& dir, const std::string& prefix) {
  std::string text;
  for (const char* name : {"literature", "wisdom", "science", "people"}) {
    std::ifstream in(std::string("/usr/share/games/fortunes/") + name);
    std::stringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  ASSERT_GT(text.size(), 100000u) << "install the Debian package 'fortunes' (scripts/install-deps)";
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(dir + "/in.txt", std::ios::binary) << text;
  PrepareSummary summary;
  ASSERT_TRUE(PrepareText(dir + "/in.txt", dir + "/" + prefix, 0.1, &summary).ok());
}

}  // namespace keel
