// Reading and writing llm.c token shards. The tokens are copied to and from
// disk as raw uint16 (little-endian hosts only, checked below); the header is
// encoded byte by byte.
#include "worker/io/token_shard.h"

#include <algorithm>
#include <climits>

#include "worker/io/file_util.h"

namespace keel {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards store little-endian uint16 tokens copied as raw memory");

int32_t LoadLe32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 |
                              static_cast<uint32_t>(p[3]) << 24);
}

void StoreLe32(int32_t value, unsigned char* p) {
  const uint32_t v = static_cast<uint32_t>(value);
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
  p[2] = static_cast<unsigned char>(v >> 16);
  p[3] = static_cast<unsigned char>(v >> 24);
}

Status ShardError(const std::string& path, const std::string& what) {
  return Status::Error("token shard " + path + ": " + what);
}

}  // namespace

Status WriteTokenShard(const std::string& path, const uint16_t* tokens, int64_t count) {
  if (count < 0 || count > INT32_MAX) {
    return ShardError(path, "token count " + std::to_string(count) +
                                " is outside what the header holds, [0, " +
                                std::to_string(INT32_MAX) + "]");
  }
  if (tokens == nullptr && count > 0) {
    return ShardError(path, "tokens is null but count is " + std::to_string(count));
  }
  unsigned char header[kTokenShardHeaderBytes] = {};
  StoreLe32(kTokenShardMagic, header);
  StoreLe32(kTokenShardVersion, header + 4);
  StoreLe32(static_cast<int32_t>(count), header + 8);
  return WriteFileAtomic(path, {ByteSpan{header, sizeof(header)},
                                ByteSpan{tokens, static_cast<size_t>(count) * sizeof(uint16_t)}});
}

Status ReadTokenShardHeader(const std::string& path, int64_t* count) {
  int64_t file_size;
  Status s = FileSize(path, &file_size);
  if (!s.ok()) return s;
  if (file_size < kTokenShardHeaderBytes) {
    return ShardError(path, "file size is " + std::to_string(file_size) +
                                " bytes, shorter than the " +
                                std::to_string(kTokenShardHeaderBytes) + "-byte header");
  }
  unsigned char header[12];
  s = ReadFileRange(path, 0, sizeof(header), header);
  if (!s.ok()) return s;
  const int32_t magic = LoadLe32(header);
  const int32_t version = LoadLe32(header + 4);
  const int32_t n = LoadLe32(header + 8);
  if (magic != kTokenShardMagic) {
    return ShardError(path, "header magic (int32 0) is " + std::to_string(magic) +
                                ", expected " + std::to_string(kTokenShardMagic) +
                                " (not an llm.c token shard)");
  }
  if (version != kTokenShardVersion) {
    return ShardError(path, "header version (int32 1) is " + std::to_string(version) +
                                ", expected " + std::to_string(kTokenShardVersion) +
                                " (uint16 tokens)");
  }
  if (n < 0) {
    return ShardError(path, "header token count (int32 2) is " + std::to_string(n) +
                                ", expected >= 0");
  }
  const int64_t expected = kTokenShardHeaderBytes + 2 * static_cast<int64_t>(n);
  if (file_size != expected) {
    const char* what = file_size < expected ? "truncated" : "trailing bytes after the tokens";
    return ShardError(path, "file size is " + std::to_string(file_size) +
                                " bytes, expected " + std::to_string(expected) +
                                " (1024-byte header + 2 * token count " + std::to_string(n) +
                                "): " + what);
  }
  *count = n;
  return Status::Ok();
}

Status ReadTokenShard(const std::string& path, std::vector<uint16_t>* tokens) {
  int64_t count;
  Status s = ReadTokenShardHeader(path, &count);
  if (!s.ok()) return s;
  std::vector<uint16_t> result(static_cast<size_t>(count));
  s = ReadFileRange(path, kTokenShardHeaderBytes, count * 2, result.data());
  if (!s.ok()) return s;
  tokens->swap(result);
  return Status::Ok();
}

Status ScanTokenShard(const std::string& path, int64_t* count, int64_t* max_token) {
  int64_t n;
  Status s = ReadTokenShardHeader(path, &n);
  if (!s.ok()) return s;
  constexpr int64_t kChunkTokens = int64_t{1} << 21;  // 4 MB
  std::vector<uint16_t> chunk(static_cast<size_t>(std::min(n, kChunkTokens)));
  int64_t max_seen = -1;
  for (int64_t done = 0; done < n;) {
    const int64_t take = std::min(n - done, kChunkTokens);
    s = ReadFileRange(path, kTokenShardHeaderBytes + 2 * done, 2 * take, chunk.data());
    if (!s.ok()) return s;
    const uint16_t chunk_max = *std::max_element(chunk.begin(), chunk.begin() + take);
    max_seen = std::max<int64_t>(max_seen, chunk_max);
    done += take;
  }
  *count = n;
  *max_token = max_seen;
  return Status::Ok();
}

}  // namespace keel
