// The one door through which YAML that a user wrote (sweep files, run configs,
// keel-train --set values) reaches yaml-cpp. yaml-cpp accepts things Keel must
// not: duplicate keys (the first silently wins), several documents in one
// file (later ones silently ignored), arbitrary bytes; and the parser and
// everything that walks its nodes afterwards (emitter, Clone, our readers)
// recurse once per nesting level. LoadYamlStrict refuses all of that before a
// node reaches a reader, so every later recursion is bounded by
// kMaxYamlDepth.
//
// Every refusal is one line "source:line:col: what (allowed: ...)" with a
// 1-based position; problems of the whole file (its size) are reported at 1:1.
#ifndef KEEL_WORKER_IO_YAML_STRICT_H_
#define KEEL_WORKER_IO_YAML_STRICT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/base/status.h"

namespace YAML {
class Node;
struct Mark;
}  // namespace YAML

namespace keel {

// Larger files are refused before parsing. keeld's gRPC receive limit and the
// keel CLI's pre-send check use the same number.
constexpr size_t kMaxYamlBytes = size_t{4} << 20;  // 4 MiB
// Mappings and lists nested deeper are refused (a run config needs about 7).
constexpr int kMaxYamlDepth = 64;
// Nodes visited with every alias expanded where it is used: bounds the work of
// anything that walks or copies the tree ("billion laughs" documents).
constexpr int64_t kMaxYamlNodes = 1000000;

// "source:line:col: " for a yaml-cpp mark (0-based); 1:1 when the mark is unset.
std::string YamlWhere(const std::string& source, const YAML::Mark& mark);

// Error messages are line-oriented (a sweep's lists one error per line), yet
// they echo user values, which YAML lets span lines. OneLine writes a newline
// as "\n", a CR as "\r" and other control bytes as "\xNN".
std::string OneLine(const std::string& text);

// Checks text before any parser sees it: at most kMaxYamlBytes, valid UTF-8,
// no control characters other than tab, LF and CR (YAML's printable set).
Status CheckYamlText(const std::string& text, const std::string& source);

// Reads a YAML file for LoadYamlStrict, at most kMaxYamlBytes + 1 bytes of it,
// so that /dev/urandom or a huge file is refused without reading it all.
// Errors: "cannot read 'path': reason" (NotFound for a missing file, else
// Internal), or "path:1:1: size: ..." (InvalidArgument: the size and the
// limit) for a larger file; *text is then untouched.
Status ReadYamlFile(const std::string& path, std::string* text);

// Parses exactly one YAML document. Refuses, with the position of the problem:
// text that CheckYamlText refuses, invalid YAML, nesting deeper than
// kMaxYamlDepth, a second document, a mapping with the same key twice (at the
// second one: "path: duplicate key (first at line L)", path dotted from the
// root, "[i]" for list items), more than kMaxYamlNodes nodes with aliases
// expanded. Empty text gives a null node. Never throws; on error *out is
// untouched.
Status LoadYamlStrict(const std::string& text, const std::string& source, YAML::Node* out);

}  // namespace keel

#endif  // KEEL_WORKER_IO_YAML_STRICT_H_
