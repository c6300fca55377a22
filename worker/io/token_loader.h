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
// Memory: only the shard being read is held (2 bytes per token); Open streams
// every shard once to validate it and find max_token.
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
    int64_t shard = 0;   // index into shard_paths()
    int64_t offset = 0;  // token offset within that shard
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
  Position position_;
  int64_t loaded_shard_ = -1;     // index of the shard in tokens_, -1 for none
  std::vector<uint16_t> tokens_;  // the loaded shard
};

}  // namespace keel

#endif  // KEEL_WORKER_IO_TOKEN_LOADER_H_
