// llm.c token shards (the .bin files of llm.c's dev/data scripts).
//
// Layout, all little-endian:
//   header: 256 int32 = 1024 bytes
//     [0] magic   = 20240520
//     [1] version = 1          (uint16 tokens)
//     [2] count   = number of tokens, 0 <= count <= INT32_MAX
//     [3..255]    = 0 (ignored on read)
//   tokens: `count` uint16
// So a valid file is exactly 1024 + 2 * count bytes.
#ifndef KEEL_WORKER_IO_TOKEN_SHARD_H_
#define KEEL_WORKER_IO_TOKEN_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

constexpr int32_t kTokenShardMagic = 20240520;
constexpr int32_t kTokenShardVersion = 1;
constexpr int kTokenShardHeaderInts = 256;
constexpr int64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;

// Writes `count` tokens (tokens may be null when count is 0) to `path`
// atomically (path.tmp, fsync, rename). Refuses a count outside
// [0, INT32_MAX], which the header cannot hold.
Status WriteTokenShard(const std::string& path, const uint16_t* tokens, int64_t count);

// Reads and validates the header and the file size without reading the
// tokens: *count is the header's token count. Refused, with an error naming
// the file, the field, the value found and the value expected: a file shorter
// than the header, a wrong magic or version, a negative count, and a file size
// other than 1024 + 2 * count (truncated or trailing bytes).
Status ReadTokenShardHeader(const std::string& path, int64_t* count);

// Validates like ReadTokenShardHeader, then reads all tokens into *tokens
// (replacing its contents; unchanged on error).
Status ReadTokenShard(const std::string& path, std::vector<uint16_t>* tokens);

// Validates like ReadTokenShardHeader and streams the tokens (a few MB at a
// time, never the whole shard) to find the largest token id: *max_token is
// -1 for an empty shard.
Status ScanTokenShard(const std::string& path, int64_t* count, int64_t* max_token);

}  // namespace keel

#endif  // KEEL_WORKER_IO_TOKEN_SHARD_H_
