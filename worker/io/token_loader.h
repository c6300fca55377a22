// TokenLoader: batches of (input, next-token target) windows over a sequence
// of llm.c token shards, in llm.c's DataLoader order (no shuffling, so two
// loaders over the same shards give the same batches).
//
// Order: the shards are taken in sorted path order. Each Next reads B*T+1
// consecutive tokens starting at the current position, returns the first B*T
// as inputs and the last B*T as targets (row b of the batch is tokens
// [offset + b*T, offset + b*T + T) and targets shifted by one), and advances
// the offset by B*T. When fewer than B*T+1 tokens remain in the shard, Next
// first moves to offset 0 of the next shard; after the last shard it wraps to
// the first and the epoch increments. The tail of each shard that is too
// short for a batch is skipped, as in llm.c.
//
// Shuffled order (Shuffle(seed), the run config's data.shuffle): the shards are
// cut into samples of seq+1 tokens that overlap by one (sample i starts at
// token i*seq; a shard of n tokens has (n-1)/seq of them). Each epoch visits
// the shards in a permutation drawn from (seed, epoch), and each shard's
// samples in a permutation drawn from (seed, epoch, shard); row b of a batch is
// the next sample. When fewer than `batch` samples remain in a shard, Next
// moves to the next shard of the epoch's order. The permutations are
// Fisher-Yates over SplitMix64, so they are the same on every machine, and
// they do not depend on the batch size.
//
// Memory: only the shard being read is held (2 bytes per token; in shuffled
// order 8 bytes per sample more); Open streams every shard once to validate it
// and find max_token.
#ifndef KEEL_WORKER_IO_TOKEN_LOADER_H_
#define KEEL_WORKER_IO_TOKEN_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

class TokenLoader {
 public:
  // Where the next batch starts. A trainer saves it in a checkpoint and
  // restores it with Seek.
  struct Position {
    int64_t shard = 0;   // index into shard_paths() (shuffled: into the epoch's shard order)
    int64_t offset = 0;  // token offset within that shard (shuffled: samples read x seq)
    int64_t epoch = 0;   // completed passes over all shards
    bool operator==(const Position& o) const {
      return shard == o.shard && offset == o.offset && epoch == o.epoch;
    }
  };

  // `pattern` is a file path or a glob(3) pattern ("data/fineweb_train_*.bin").
  // Refused: batch or seq < 1 (or batch*seq overflowing), a pattern that
  // matches no file (the error names the pattern), any shard that fails
  // ReadTokenShardHeader's checks, and a shard with fewer than batch*seq+1
  // tokens (the error names the shard, its size and the size needed).
  static Status Open(const std::string& pattern, int64_t batch, int64_t seq,
                     std::unique_ptr<TokenLoader>* out);

  // Fills *inputs and *targets with batch*seq tokens each (resizing them) and
  // advances the position. Fails only when reading a shard fails (it changed
  // or vanished since Open); the position is then unchanged.
  Status Next(std::vector<int32_t>* inputs, std::vector<int32_t>* targets);

  // Switches to the shuffled order drawn from `seed`, from the current
  // position on (call it after Open, before the first Next; a checkpoint's
  // position is then restored with Seek as usual).
  void Shuffle(uint64_t seed);
  bool shuffled() const { return shuffle_; }

  Position position() const { return position_; }
  // Sets the position: shard in [0, num_shards()), offset in
  // [0, tokens in that shard], epoch >= 0; anything else is refused and
  // changes nothing. Seek(p) then Next gives what an uninterrupted loader
  // gives at p, whatever the batch size used before.
  Status Seek(const Position& position);

  // The largest token id in all shards (-1 if there are none); check it
  // against the model's vocabulary before training.
  int64_t max_token() const { return max_token_; }
  // Tokens in all shards together.
  int64_t total_tokens() const { return total_tokens_; }
  int64_t num_shards() const { return static_cast<int64_t>(paths_.size()); }
  const std::vector<std::string>& shard_paths() const { return paths_; }
  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }

 private:
  TokenLoader() = default;

  int64_t batch_ = 0;
  int64_t seq_ = 0;
  std::vector<std::string> paths_;
  std::vector<int64_t> counts_;  // tokens per shard, from Open
  int64_t max_token_ = -1;
  int64_t total_tokens_ = 0;
  // Makes shard `index` the one in tokens_ (reading it unless it is already).
  Status Load(int64_t index);
  // The shard that position (epoch, k) reads: k itself in llm.c's order.
  int64_t ShardAt(int64_t epoch, int64_t k);

  Position position_;
  int64_t loaded_shard_ = -1;     // index of the shard in tokens_, -1 for none
  std::vector<uint16_t> tokens_;  // the loaded shard

  bool shuffle_ = false;
  uint64_t seed_ = 0;
  int64_t order_epoch_ = -1;             // the epoch shard_order_ is for
  std::vector<int64_t> shard_order_;     // that epoch's shard permutation
  int64_t samples_epoch_ = -1;           // the (epoch, shard) samples_ is for
  int64_t samples_shard_ = -1;
  std::vector<int64_t> samples_;         // that shard's sample permutation
};

}  // namespace keel

#endif  // KEEL_WORKER_IO_TOKEN_LOADER_H_
