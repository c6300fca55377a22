// Checkpoint directory names (see checkpoint_dirs.h).
#include "worker/run/checkpoint_dirs.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "worker/io/file_util.h"

namespace keel {

std::string CheckpointDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::vector<std::string> names;
  if (!ListDir(root, &names).ok()) return out;
  for (const std::string& n : names) {
    if (n.size() != 13 || n.rfind("step_", 0) != 0) continue;
    if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) continue;
    out.emplace_back(std::atoll(n.c_str() + 5), n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace keel
