// UTF-8 validation shared by the JSON parser and writer and the text
// tokenizer. Valid means RFC 3629: shortest-form sequences of 1 to 4 bytes
// encoding U+0000..U+10FFFF, no surrogates (U+D800..U+DFFF).
#ifndef KEEL_WORKER_IO_UTF8_H_
#define KEEL_WORKER_IO_UTF8_H_

#include <cstddef>
#include <string>

namespace keel {

// The length (1 to 4) of the valid UTF-8 sequence that starts at data[0] and
// fits in `size` bytes, or 0 when the bytes there are not valid UTF-8 (a stray
// continuation byte, an overlong form, a surrogate, a code point above
// U+10FFFF, or a sequence cut off by the end). Requires size >= 1.
size_t Utf8SequenceLength(const unsigned char* data, size_t size);

// True when all of text is valid UTF-8; otherwise false with *offset set to
// the byte offset of the first sequence that is not.
bool IsValidUtf8(const std::string& text, size_t* offset);

// Appends the UTF-8 encoding of code point `cp` (<= 0x10FFFF, not a surrogate).
void AppendUtf8(unsigned cp, std::string* out);

}  // namespace keel

#endif  // KEEL_WORKER_IO_UTF8_H_
