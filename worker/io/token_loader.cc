// TokenLoader: shard discovery with glob(3), validation at Open, and llm.c's
// batch walk.
#include "worker/io/token_loader.h"

#include <glob.h>

#include <algorithm>
#include <climits>

#include "worker/io/token_shard.h"

namespace keel {

Status TokenLoader::Open(const std::string& pattern, int64_t batch, int64_t seq,
                         std::unique_ptr<TokenLoader>* out) {
  if (batch < 1 || seq < 1) {
    return Status::Error("token loader: batch " + std::to_string(batch) + " and seq " +
                         std::to_string(seq) + " must both be >= 1");
  }
  if (batch > (INT64_MAX - 1) / seq) {
    return Status::Error("token loader: batch " + std::to_string(batch) + " * seq " +
                         std::to_string(seq) + " overflows int64");
  }
  glob_t matches;
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  ::globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return Status::Error("token loader: no file matches the shard pattern '" + pattern + "'");
  }
  if (rc != 0) {
    return Status::Error("token loader: cannot expand the shard pattern '" + pattern +
                         "' (glob error " + std::to_string(rc) + ")");
  }
  std::sort(paths.begin(), paths.end());

  std::unique_ptr<TokenLoader> loader(new TokenLoader());
  loader->batch_ = batch;
  loader->seq_ = seq;
  const int64_t needed = batch * seq + 1;
  for (const std::string& path : paths) {
    int64_t count, shard_max;
    Status s = ScanTokenShard(path, &count, &shard_max);
    if (!s.ok()) return s;
    if (count < needed) {
      return Status::Error("token loader: shard " + path + " has " + std::to_string(count) +
                           " tokens, fewer than the " + std::to_string(needed) +
                           " one batch needs (batch " + std::to_string(batch) + " * seq " +
                           std::to_string(seq) + " + 1)");
    }
    loader->counts_.push_back(count);
    loader->total_tokens_ += count;
    loader->max_token_ = std::max(loader->max_token_, shard_max);
  }
  loader->paths_ = std::move(paths);
  *out = std::move(loader);
  return Status::Ok();
}

Status TokenLoader::Seek(const Position& position) {
  if (position.shard < 0 || position.shard >= num_shards()) {
    return Status::Error("token loader: seek shard " + std::to_string(position.shard) +
                         " is outside [0, " + std::to_string(num_shards()) + ")");
  }
  const int64_t count = counts_[static_cast<size_t>(position.shard)];
  if (position.offset < 0 || position.offset > count) {
    return Status::Error("token loader: seek offset " + std::to_string(position.offset) +
                         " is outside [0, " + std::to_string(count) + "], the token count of "
                         "shard " + std::to_string(position.shard) + " (" +
                         paths_[static_cast<size_t>(position.shard)] + ")");
  }
  if (position.epoch < 0) {
    return Status::Error("token loader: seek epoch " + std::to_string(position.epoch) +
                         " must be >= 0");
  }
  position_ = position;
  return Status::Ok();
}

Status TokenLoader::Next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  const int64_t n = batch_ * seq_;
  Position next = position_;
  if (next.offset + n + 1 > counts_[static_cast<size_t>(next.shard)]) {
    next.offset = 0;
    if (++next.shard == num_shards()) {
      next.shard = 0;
      ++next.epoch;
    }
  }
  if (next.shard != loaded_shard_) {
    const std::string& path = paths_[static_cast<size_t>(next.shard)];
    Status s = ReadTokenShard(path, &tokens_);
    if (!s.ok()) {
      loaded_shard_ = -1;
      return s;
    }
    if (static_cast<int64_t>(tokens_.size()) != counts_[static_cast<size_t>(next.shard)]) {
      loaded_shard_ = -1;
      return Status::Error("token loader: shard " + path + " now has " +
                           std::to_string(tokens_.size()) + " tokens, but had " +
                           std::to_string(counts_[static_cast<size_t>(next.shard)]) +
                           " when opened");
    }
    loaded_shard_ = next.shard;
  }
  inputs->resize(static_cast<size_t>(n));
  targets->resize(static_cast<size_t>(n));
  const uint16_t* window = tokens_.data() + next.offset;
  for (int64_t i = 0; i < n; ++i) {
    (*inputs)[static_cast<size_t>(i)] = window[i];
    (*targets)[static_cast<size_t>(i)] = window[i + 1];
  }
  next.offset += n;
  position_ = next;
  return Status::Ok();
}

}  // namespace keel
