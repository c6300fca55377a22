// The byte-level tokenizer and the text -> train/val shard preparation.
#include "worker/io/text_prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "worker/io/file_util.h"
#include "worker/io/token_shard.h"
#include "worker/io/utf8.h"

namespace keel {

std::vector<uint16_t> TokenizeBytes(const std::string& text) {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

Status DetokenizeBytes(const std::vector<uint16_t>& tokens, std::string* text) {
  std::string result(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= kByteVocabSize) {
      return Status::Error("token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                           ", outside the byte-level vocabulary [0, " +
                           std::to_string(kByteVocabSize) + ")");
    }
    result[i] = static_cast<char>(tokens[i]);
  }
  text->swap(result);
  return Status::Ok();
}

Status ParseTextTokenizer(const std::string& name, TextTokenizer* out) {
  if (name == "bytes") {
    *out = TextTokenizer::kBytes;
  } else if (name == "gpt2") {
    *out = TextTokenizer::kGpt2;
  } else {
    return Status::InvalidArgument("tokenizer is '" + name + "', expected bytes or gpt2");
  }
  return Status::Ok();
}

const char* TextTokenizerName(TextTokenizer tokenizer) {
  return tokenizer == TextTokenizer::kGpt2 ? "gpt2" : "bytes";
}

int TextTokenizerVocab(TextTokenizer tokenizer) {
  return tokenizer == TextTokenizer::kGpt2 ? kGpt2VocabSize : kByteVocabSize;
}

Status PrepareText(const std::string& in_path, const std::string& out_prefix,
                   double val_fraction, PrepareSummary* summary) {
  PrepareOptions options;
  options.val_fraction = val_fraction;
  return PrepareText(in_path, out_prefix, options, summary);
}

Status PrepareText(const std::string& in_path, const std::string& out_prefix,
                   const PrepareOptions& options, PrepareSummary* summary) {
  const double val_fraction = options.val_fraction;
  std::unique_ptr<Gpt2Bpe> bpe;
  if (options.tokenizer == TextTokenizer::kGpt2) {
    Status s = Gpt2Bpe::Load(options.bpe_dir, &bpe);
    if (!s.ok()) return s;
  }
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    return Status::Error("val_fraction is " + std::to_string(val_fraction) +
                         ", expected a value strictly between 0 and 1");
  }
  if (out_prefix.empty()) return Status::Error("out_prefix is empty, expected a path prefix");
  std::string text;
  Status s = ReadFile(in_path, &text);
  if (!s.ok()) return s;
  if (text.empty()) return Status::Error("text file " + in_path + " is empty: nothing to train on");
  size_t bad;
  if (!IsValidUtf8(text, &bad)) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned char>(text[bad]));
    return Status::Error("text file " + in_path + " is not valid UTF-8: byte offset " +
                         std::to_string(bad) + " (byte " + hex + ") does not start a valid "
                         "UTF-8 sequence");
  }

  const int64_t n = static_cast<int64_t>(text.size());
  const int64_t val_target = std::max<int64_t>(1, std::llround(val_fraction * n));
  const int64_t point = n - val_target;
  if (point < 1) {
    return Status::Error("text file " + in_path + " has " + std::to_string(n) +
                         " tokens, too few to give train and val at least 1 token each with "
                         "val_fraction " + std::to_string(val_fraction));
  }
  // The first line start at or after `point` that leaves val nonempty: a '\n'
  // at index point - 1 or later, not the last byte.
  int64_t cut = point;
  const size_t newline = text.find('\n', static_cast<size_t>(point - 1));
  if (newline != std::string::npos && static_cast<int64_t>(newline) + 1 < n) {
    cut = static_cast<int64_t>(newline) + 1;
  } else {
    // No line start there: keep multi-byte characters whole in one shard.
    while (cut < n && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;
    if (cut == n) {
      return Status::Error("text file " + in_path + ": the train/val cut at token " +
                           std::to_string(point) + " falls in the last character, leaving val "
                           "empty; use a larger val_fraction or a longer text");
    }
  }

  std::vector<uint16_t> tokens;
  int64_t train_tokens = cut;
  if (bpe != nullptr) {
    s = bpe->Encode(text.substr(0, cut), &tokens);
    if (!s.ok()) return s;
    train_tokens = static_cast<int64_t>(tokens.size());
    s = bpe->Encode(text.substr(cut), &tokens);
    if (!s.ok()) return s;
  } else {
    tokens = TokenizeBytes(text);
  }
  PrepareSummary result;
  result.total_tokens = static_cast<int64_t>(tokens.size());
  result.train_tokens = train_tokens;
  result.val_tokens = result.total_tokens - train_tokens;
  result.train_path = out_prefix + "_train.bin";
  result.val_path = out_prefix + "_val.bin";
  s = MakeDirs(DirName(out_prefix));
  if (!s.ok()) return s;
  s = WriteTokenShard(result.train_path, tokens.data(), result.train_tokens);
  if (!s.ok()) return s;
  s = WriteTokenShard(result.val_path, tokens.data() + train_tokens, result.val_tokens);
  if (!s.ok()) return s;
  *summary = result;
  return Status::Ok();
}

}  // namespace keel
