// LoadYamlStrict (see yaml_strict.h): a byte check, an event pass that bounds
// nesting and counts documents, yaml-cpp's loader, then a walk for duplicate
// keys and alias expansion.
#include "worker/io/yaml_strict.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <new>
#include <sstream>

#include "worker/io/utf8.h"

namespace keel {
namespace {

std::string Where(const std::string& source, int line, int column) {
  return source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
}

// A problem found by the event pass; thrown out of yaml-cpp's parser to stop it
// at once (the parser unwinds with RAII, as it does for its own exceptions).
struct StopParse {
  YAML::Mark mark;
  std::string what;
};

// Sees the parser's events before any node is built: the nesting depth of
// mappings and lists, and the start of a second document.
class ShapeCheck : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ == 2) {
      throw StopParse{mark, "document: a second YAML document starts at line " + std::to_string(mark.line + 1) +
                                " (allowed: one document per file; remove the '---' and what follows)"};
    }
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Enter(mark);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Enter(mark);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void Enter(const YAML::Mark& mark) {
    if (++depth_ > kMaxYamlDepth) {
      throw StopParse{mark, "nesting: more than " + std::to_string(kMaxYamlDepth) +
                                " levels of mappings and lists (allowed: at most " +
                                std::to_string(kMaxYamlDepth) + ")"};
    }
  }
  int documents_ = 0;
  int depth_ = 0;
};

std::string Join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

// Walks the loaded tree: duplicate keys, and depth and size with aliases
// expanded (an alias may point at a collection, even at one that contains it).
class Walker {
 public:
  explicit Walker(const std::string& source) : source_(source) {}

  Status Walk(const YAML::Node& node, const std::string& path, int depth) {
    if (++visits_ > kMaxYamlNodes) {
      return Status::InvalidArgument(YamlWhere(source_, node.Mark()) + (path.empty() ? "document" : path) +
                           ": more than " + std::to_string(kMaxYamlNodes) +
                           " nodes once aliases are expanded (allowed: at most " + std::to_string(kMaxYamlNodes) +
                           ")");
    }
    if (!node.IsMap() && !node.IsSequence()) return Status::Ok();
    // The event pass bounded the text's nesting; aliases can still nest a
    // collection inside itself, so the expanded tree is bounded here too.
    if (depth >= kMaxYamlDepth) {
      return Status::InvalidArgument(YamlWhere(source_, node.Mark()) + (path.empty() ? "document" : path) +
                           ": more than " + std::to_string(kMaxYamlDepth) +
                           " levels of mappings and lists with aliases expanded (allowed: at most " +
                           std::to_string(kMaxYamlDepth) + ")");
    }
    if (node.IsSequence()) {
      int index = 0;
      for (const YAML::Node& item : node) {
        KEEL_RETURN_IF_ERROR(Walk(item, path + "[" + std::to_string(index++) + "]", depth + 1));
      }
      return Status::Ok();
    }
    std::map<std::string, int> first_line;  // scalar key -> its 1-based line
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string key_path = path;
      if (it->first.IsScalar()) {
        const std::string& key = it->first.Scalar();
        key_path = Join(path, key);
        auto seen = first_line.emplace(key, it->first.Mark().line + 1);
        if (!seen.second) {
          return Status::InvalidArgument(YamlWhere(source_, it->first.Mark()) + key_path + ": duplicate key (first at line " +
                               std::to_string(seen.first->second) + ")");
        }
      } else {
        KEEL_RETURN_IF_ERROR(Walk(it->first, Join(path, "<key>"), depth + 1));
      }
      KEEL_RETURN_IF_ERROR(Walk(it->second, key_path, depth + 1));
    }
    return Status::Ok();
  }

 private:
  const std::string& source_;
  int64_t visits_ = 0;
};

std::string ParserMessage(const YAML::Exception& e) {
  if (!e.msg.empty()) return e.msg;
  const std::string what = e.what();
  return what.empty() ? "unreadable input" : what;
}

}  // namespace

std::string YamlWhere(const std::string& source, const YAML::Mark& mark) {
  if (mark.line < 0 || mark.column < 0) return Where(source, 1, 1);
  return Where(source, mark.line + 1, mark.column + 1);
}

std::string OneLine(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out;
}

Status CheckYamlText(const std::string& text, const std::string& source) {
  if (text.size() > kMaxYamlBytes) {
    return Status::InvalidArgument(Where(source, 1, 1) + "size: " + std::to_string(text.size()) +
                         " bytes is more than the limit of " + std::to_string(kMaxYamlBytes) +
                         " bytes (allowed: at most 4 MiB)");
  }
  const unsigned char* data = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  int line = 1, column = 1;  // of the character at pos; columns count characters
  for (size_t pos = 0; pos < size; ++column) {
    const unsigned char c = data[pos];
    size_t length = 1;
    bool bad;
    if (c < 0x80) {
      bad = (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
    } else {
      length = Utf8SequenceLength(data + pos, size - pos);
      // C1 controls U+0080..U+009F (C2 80..C2 9F) are not printable in YAML, except NEL (U+0085).
      bad = length == 0 || (c == 0xC2 && data[pos + 1] < 0xA0 && data[pos + 1] != 0x85);
    }
    if (bad) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02X", c);
      return Status::InvalidArgument(Where(source, line, column) + "not a text file: byte " + byte + " at line " +
                           std::to_string(line) + " col " + std::to_string(column) +
                           " (allowed: UTF-8 text without control characters other than tab, CR, LF)");
    }
    if (c == '\n') {
      ++line;
      column = 0;
    }
    pos += length;
  }
  return Status::Ok();
}

Status ReadYamlFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const std::string message = "cannot read '" + path + "': " + std::strerror(errno);
    return errno == ENOENT ? Status::NotFound(message) : Status::Error(message);
  }
  std::string data(kMaxYamlBytes + 1, '\0');
  in.read(&data[0], static_cast<std::streamsize>(data.size()));
  if (in.bad()) return Status::Error("cannot read '" + path + "': " + std::strerror(errno));
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > kMaxYamlBytes) {
    struct stat st;
    const bool sized = stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    return Status::InvalidArgument(Where(path, 1, 1) + "size: " +
                         (sized ? std::to_string(st.st_size) : "more than " + std::to_string(kMaxYamlBytes)) +
                         " bytes is more than the limit of " + std::to_string(kMaxYamlBytes) +
                         " bytes (allowed: at most 4 MiB)");
  }
  *text = std::move(data);
  return Status::Ok();
}

Status LoadYamlStrict(const std::string& text, const std::string& source, YAML::Node* out) {
  KEEL_RETURN_IF_ERROR(CheckYamlText(text, source));
  YAML::Node root;
  try {
    {
      std::istringstream in(text);
      YAML::Parser parser(in);
      ShapeCheck shape;
      while (parser.HandleNextDocument(shape)) {
      }
    }
    root = YAML::Load(text);
  } catch (const StopParse& stop) {
    return Status::InvalidArgument(YamlWhere(source, stop.mark) + stop.what);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own guard (2000 levels) says only "bad file".
    return Status::InvalidArgument(YamlWhere(source, e.mark) + "nesting: more than " + std::to_string(kMaxYamlDepth) +
                         " levels (allowed: at most " + std::to_string(kMaxYamlDepth) + ")");
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(YamlWhere(source, e.mark) + "invalid YAML: " + ParserMessage(e));
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument(Where(source, 1, 1) + "invalid YAML: out of memory while parsing");
  } catch (const std::exception& e) {
    return Status::InvalidArgument(Where(source, 1, 1) + "invalid YAML: " + (*e.what() ? e.what() : "unreadable input"));
  }
  Walker walker(source);
  KEEL_RETURN_IF_ERROR(walker.Walk(root, "", 0));
  *out = root;
  return Status::Ok();
}

}  // namespace keel
