// TokenLoader: shard discovery with glob(3), validation at Open, and llm.c's
// batch walk.
#include "worker/io/token_loader.h"

#include <glob.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "kernels/base/splitmix64.h"
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

namespace {

// 0, 1, ..., n-1 in the Fisher-Yates order drawn from `seed`.
void Permutation(int64_t n, uint64_t seed, std::vector<int64_t>* out) {
  out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*out)[static_cast<size_t>(i)] = i;
  SplitMix64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap((*out)[static_cast<size_t>(i)], (*out)[static_cast<size_t>(j)]);
  }
}

// The seeds of an epoch's shard order and of a shard's sample order.
uint64_t StreamSeed(uint64_t seed, int64_t epoch, int64_t shard) {
  SplitMix64 mix(seed ^ 0x5EED0F0DA7A0ull);
  uint64_t s = mix.Next() ^ static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull;
  s = SplitMix64(s).Next() ^ static_cast<uint64_t>(shard + 1) * 0x8CB92BA72F3D8DD7ull;
  return SplitMix64(s).Next();
}

}  // namespace

void TokenLoader::Shuffle(uint64_t seed) {
  shuffle_ = true;
  seed_ = seed;
  order_epoch_ = samples_epoch_ = samples_shard_ = -1;
}

int64_t TokenLoader::ShardAt(int64_t epoch, int64_t k) {
  if (!shuffle_) return k;
  if (order_epoch_ != epoch) {
    Permutation(num_shards(), StreamSeed(seed_, epoch, -1), &shard_order_);
    order_epoch_ = epoch;
  }
  return shard_order_[static_cast<size_t>(k)];
}

Status TokenLoader::Seek(const Position& position) {
  if (position.shard < 0 || position.shard >= num_shards()) {
    return Status::Error("token loader: seek shard " + std::to_string(position.shard) +
                         " is outside [0, " + std::to_string(num_shards()) + ")");
  }
  if (position.epoch < 0) {
    return Status::Error("token loader: seek epoch " + std::to_string(position.epoch) +
                         " must be >= 0");
  }
  const int64_t shard = ShardAt(position.epoch, position.shard);
  const int64_t count = counts_[static_cast<size_t>(shard)];
  if (position.offset < 0 || position.offset > count) {
    return Status::Error("token loader: seek offset " + std::to_string(position.offset) +
                         " is outside [0, " + std::to_string(count) + "], the token count of "
                         "shard " + std::to_string(shard) + " (" +
                         paths_[static_cast<size_t>(shard)] + ")");
  }
  if (shuffle_ && position.offset % seq_ != 0) {
    return Status::Error("token loader: seek offset " + std::to_string(position.offset) +
                         " is not a multiple of seq " + std::to_string(seq_) +
                         " (in shuffled order the offset counts whole samples; was the position "
                         "saved by a run without data.shuffle?)");
  }
  position_ = position;
  return Status::Ok();
}

Status TokenLoader::Load(int64_t index) {
  if (index == loaded_shard_) return Status::Ok();
  const std::string& path = paths_[static_cast<size_t>(index)];
  Status s = ReadTokenShard(path, &tokens_);
  if (!s.ok()) {
    loaded_shard_ = -1;
    return s;
  }
  if (static_cast<int64_t>(tokens_.size()) != counts_[static_cast<size_t>(index)]) {
    loaded_shard_ = -1;
    return Status::Error("token loader: shard " + path + " now has " + std::to_string(tokens_.size()) +
                         " tokens, but had " + std::to_string(counts_[static_cast<size_t>(index)]) +
                         " when opened");
  }
  loaded_shard_ = index;
  return Status::Ok();
}

// Both orders walk the same way: a shard has room for the next batch when its
// last row's seq+1 tokens end inside it (in shuffled order the offset is a
// multiple of seq, so that is the same as `batch` more samples); otherwise the
// next shard of the epoch's order, and after the last one the next epoch. Row b
// then starts at offset + b*seq (llm.c's order) or at the start of the
// (offset/seq + b)-th sample of the shard's permutation (shuffled).
Status TokenLoader::Next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  const int64_t n = batch_ * seq_;
  Position next = position_;
  int64_t shard = ShardAt(next.epoch, next.shard);
  if (next.offset + n + 1 > counts_[static_cast<size_t>(shard)]) {
    next.offset = 0;
    if (++next.shard == num_shards()) {
      next.shard = 0;
      ++next.epoch;
    }
    shard = ShardAt(next.epoch, next.shard);
  }
  KEEL_RETURN_IF_ERROR(Load(shard));
  if (shuffle_ && (samples_epoch_ != next.epoch || samples_shard_ != shard)) {
    Permutation((counts_[static_cast<size_t>(shard)] - 1) / seq_, StreamSeed(seed_, next.epoch, shard), &samples_);
    samples_epoch_ = next.epoch;
    samples_shard_ = shard;
  }
  inputs->resize(static_cast<size_t>(n));
  targets->resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t start =
        shuffle_ ? samples_[static_cast<size_t>(next.offset / seq_ + b)] * seq_ : next.offset + b * seq_;
    const uint16_t* window = tokens_.data() + start;
    for (int64_t i = 0; i < seq_; ++i) {
      (*inputs)[static_cast<size_t>(b * seq_ + i)] = window[i];
      (*targets)[static_cast<size_t>(b * seq_ + i)] = window[i + 1];
    }
  }
  next.offset += n;
  position_ = next;
  return Status::Ok();
}

}  // namespace keel
