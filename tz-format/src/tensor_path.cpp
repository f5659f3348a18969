#include "tz/format/tensor_path.hpp"

#include <cstring>

#include "tz/format/error.hpp"

namespace tz::format {
namespace {

[[noreturn]] void bad_path(const std::string& why) { fail(Errc::format, "Invalid tensor path: " + why); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Decodes one UTF-8 code point at s[i]; returns false if malformed.
bool next_code_point(std::string_view s, size_t& i, uint32_t& cp) {
  const auto b0 = uint8_t(s[i]);
  int extra;
  uint32_t min;
  if (b0 < 0x80) { cp = b0; ++i; return true; }
  if ((b0 & 0xE0) == 0xC0) { extra = 1; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { extra = 2; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { extra = 3; cp = b0 & 0x07; min = 0x10000; }
  else return false;
  if (s.size() - i <= size_t(extra)) return false;
  for (int k = 1; k <= extra; ++k) {
    const auto b = uint8_t(s[i + k]);
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  i += size_t(extra) + 1;
  return true;
}

// A strict JSON parser for exactly what a tensor path may hold: one array of
// strings and non-negative integers (true/false count as 1/0, as upstream's
// Python reader accepts them).
class JsonPathParser {
 public:
  explicit JsonPathParser(std::string_view s) : s_(s) {}

  TensorPath parse() {
    TensorPath out;
    skip_ws();
    expect('[');
    skip_ws();
    if (peek() == ']') bad_path("empty JSON array");
    for (;;) {
      skip_ws();
      out.push_back(element());
      skip_ws();
      const char c = get();
      if (c == ']') break;
      if (c != ',') bad_path("expected ',' or ']' in JSON array");
    }
    skip_ws();
    if (pos_ != s_.size()) bad_path("trailing data after JSON array");
    return out;
  }

 private:
  char peek() const {
    if (pos_ >= s_.size()) bad_path("unexpected end of JSON");
    return s_[pos_];
  }
  char get() {
    const char c = peek();
    ++pos_;
    return c;
  }
  void expect(char c) {
    if (get() != c) bad_path(std::string("expected '") + c + "' in JSON");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool consume_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) { pos_ += w.size(); return true; }
    return false;
  }

  PathComponent element() {
    const char c = peek();
    if (c == '"') return PathComponent::key(string());
    if (c >= '0' && c <= '9') return PathComponent::idx(integer());
    if (consume_word("true")) return PathComponent::idx(1);
    if (consume_word("false")) return PathComponent::idx(0);
    if (c == '-') bad_path("negative list index");
    if (consume_word("null")) bad_path("null is not a valid path component");
    bad_path("path components must be strings or non-negative integers");
  }

  uint64_t integer() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t d = uint64_t(s_[pos_] - '0');
      if (v > (UINT64_MAX - d) / 10) bad_path("list index too large");
      v = v * 10 + d;
      ++pos_;
    }
    if (pos_ - start > 1 && s_[start] == '0') bad_path("invalid JSON number (leading zero)");
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
      bad_path("list indices must be integers");
    }
    return v;
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = get();
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else bad_path("invalid \\u escape");
    }
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      const auto c = uint8_t(get());
      if (c == '"') return out;
      if (c < 0x20) bad_path("control character in JSON string");
      if (c != '\\') {
        if (c < 0x80) { out.push_back(char(c)); continue; }
        size_t i = pos_ - 1;
        uint32_t cp;
        if (!next_code_point(s_, i, cp)) bad_path("invalid UTF-8 in JSON string");
        out.append(s_.substr(pos_ - 1, i - (pos_ - 1)));
        pos_ = i;
        continue;
      }
      const char e = get();
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!consume_word("\\u")) bad_path("unpaired surrogate in JSON string");
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) bad_path("unpaired surrogate in JSON string");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            bad_path("unpaired surrogate in JSON string");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          bad_path("invalid escape in JSON string");
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

void append_json_string(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  const auto u_escape = [&](uint32_t unit) {
    out += "\\u";
    for (int sh = 12; sh >= 0; sh -= 4) out.push_back(hex[(unit >> sh) & 15]);
  };
  out.push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    if (!next_code_point(s, i, cp)) fail(Errc::invalid_arg, "tensor path component is not valid UTF-8");
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp >= 0x20 && cp < 0x7F) {
      out.push_back(char(cp));
    } else if (cp < 0x10000) {
      u_escape(cp);
    } else {
      const uint32_t v = cp - 0x10000;
      u_escape(0xD800 + (v >> 10));
      u_escape(0xDC00 + (v & 0x3FF));
    }
  }
  out.push_back('"');
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  size_t i = 0;
  uint32_t cp;
  while (i < bytes.size()) {
    if (!next_code_point(bytes, i, cp)) return false;
  }
  return true;
}

TensorPath decode_path(std::string_view bytes) {
  if (bytes.empty()) fail(Errc::format, "Invalid empty tensor path");
  if (uint8_t(bytes[0]) != kJsonSeqMarker) {
    if (!is_valid_utf8(bytes)) fail(Errc::format, "Invalid tensor path: name is not valid UTF-8");
    return {PathComponent::key(std::string(bytes))};
  }
  if (bytes.size() < 3 || bytes[1] != '[' || bytes.back() != ']') {
    fail(Errc::format, "Invalid tensor path: non-array json-seq");
  }
  if (bytes.find('\n') != std::string_view::npos || bytes.find('\r') != std::string_view::npos) {
    fail(Errc::format, "Invalid tensor path: Illegal newline in json-seq");
  }
  return JsonPathParser(bytes.substr(1)).parse();
}

std::string encode_path(const TensorPath& path) {
  if (path.empty()) fail(Errc::invalid_arg, "tensor path is empty");
  if (path.size() == 1 && !path[0].is_index) {
    if (path[0].str.empty() || uint8_t(path[0].str[0]) == kJsonSeqMarker) {
      fail(Errc::invalid_arg, "a tensor name may not be empty or start with 0x1E: readers could not load it back");
    }
    if (!is_valid_utf8(path[0].str)) fail(Errc::invalid_arg, "tensor name is not valid UTF-8");
    return path[0].str;
  }
  std::string out;
  out.push_back(char(kJsonSeqMarker));
  out.push_back('[');
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out.push_back(',');
    if (path[i].is_index) out += std::to_string(path[i].index);
    else append_json_string(out, path[i].str);
  }
  out.push_back(']');
  return out;
}

std::string display_path(const TensorPath& path) {
  if (path.size() == 1 && !path[0].is_index) return path[0].str;
  std::string s = encode_path(path);
  return s.substr(1);
}

struct PathTrie::Node {
  bool leaf = false;
  std::map<std::string, std::unique_ptr<Node>> keys;
  std::map<uint64_t, std::unique_ptr<Node>> indices;
  bool empty() const { return keys.empty() && indices.empty(); }
  ~Node();

 private:
  void detach_children(std::vector<std::unique_ptr<Node>>& out) {
    for (auto& kv : keys) out.push_back(std::move(kv.second));
    for (auto& kv : indices) out.push_back(std::move(kv.second));
    keys.clear();
    indices.clear();
  }
};

// A file controls the depth of the trie (a structured name can hold tens of
// thousands of components), so nodes are freed from a work list, never by
// the recursion unique_ptr would do: each node is detached from its parent
// and emptied before it is destroyed.
PathTrie::Node::~Node() {
  std::vector<std::unique_ptr<Node>> work;
  detach_children(work);
  while (!work.empty()) {
    std::unique_ptr<Node> n = std::move(work.back());
    work.pop_back();
    n->detach_children(work);
  }  // n, now childless, is freed here
}

PathTrie::PathTrie() : root_(std::make_unique<Node>()) {}
PathTrie::~PathTrie() = default;
PathTrie::PathTrie(PathTrie&&) noexcept = default;
PathTrie& PathTrie::operator=(PathTrie&&) noexcept = default;

void PathTrie::insert(const TensorPath& path) {
  const auto conflict = [&](const char* why) {
    fail(Errc::conflict, std::string("Conflicting tensor paths: ") + display_path(path) + " (" + why + ")");
  };
  // First pass: check without modifying, so a conflict leaves the trie as it was.
  const Node* n = root_.get();
  for (const auto& c : path) {
    if (n->leaf) conflict("a prefix of it is already a tensor");
    if (c.is_index ? !n->keys.empty() : !n->indices.empty()) conflict("mixes string keys and list indices");
    const Node* next = nullptr;
    if (c.is_index) {
      auto it = n->indices.find(c.index);
      if (it != n->indices.end()) next = it->second.get();
    } else {
      auto it = n->keys.find(c.str);
      if (it != n->keys.end()) next = it->second.get();
    }
    if (!next) { n = nullptr; break; }
    n = next;
  }
  if (n) {
    if (n->leaf) conflict("duplicate name");
    conflict("it is a prefix of another tensor's path");
  }
  Node* m = root_.get();
  for (const auto& c : path) {
    auto& slot = c.is_index ? m->indices[c.index] : m->keys[c.str];
    if (!slot) slot = std::make_unique<Node>();
    m = slot.get();
  }
  m->leaf = true;
}

bool PathTrie::contains(const TensorPath& path) const {
  const Node* n = root_.get();
  for (const auto& c : path) {
    if (c.is_index) {
      auto it = n->indices.find(c.index);
      if (it == n->indices.end()) return false;
      n = it->second.get();
    } else {
      auto it = n->keys.find(c.str);
      if (it == n->keys.end()) return false;
      n = it->second.get();
    }
  }
  return n->leaf;
}

void PathTrie::erase(const TensorPath& path) {
  // Walk down remembering the nodes, then prune bottom-up while they are empty.
  std::vector<std::pair<Node*, const PathComponent*>> trail;
  Node* n = root_.get();
  for (const auto& c : path) {
    Node* next = nullptr;
    if (c.is_index) {
      auto it = n->indices.find(c.index);
      if (it != n->indices.end()) next = it->second.get();
    } else {
      auto it = n->keys.find(c.str);
      if (it != n->keys.end()) next = it->second.get();
    }
    if (!next) return;
    trail.emplace_back(n, &c);
    n = next;
  }
  if (!n->leaf) return;
  n->leaf = false;
  for (auto it = trail.rbegin(); it != trail.rend(); ++it) {
    Node* parent = it->first;
    const PathComponent& c = *it->second;
    Node* child = c.is_index ? parent->indices[c.index].get() : parent->keys[c.str].get();
    if (child->leaf || !child->empty()) break;
    if (c.is_index) parent->indices.erase(c.index);
    else parent->keys.erase(c.str);
  }
}

}  // namespace tz::format
