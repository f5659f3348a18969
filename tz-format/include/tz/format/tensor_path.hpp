#pragma once
// Tensor paths (FORMAT.md §4.3): a non-empty sequence of string keys and
// non-negative list indices. A single string is stored as its raw UTF-8
// bytes; anything else as 0x1E followed by a compact ASCII JSON array.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tz::format {

struct PathComponent {
  bool is_index = false;
  uint64_t index = 0;
  std::string str;  // UTF-8

  static PathComponent key(std::string s) { return {false, 0, std::move(s)}; }
  static PathComponent idx(uint64_t i) { return {true, i, {}}; }
  bool operator==(const PathComponent& o) const {
    return is_index == o.is_index && (is_index ? index == o.index : str == o.str);
  }
};

using TensorPath = std::vector<PathComponent>;

constexpr uint8_t kJsonSeqMarker = 0x1E;

// Decodes stored name bytes into a path. Throws tz::Error(format) for invalid
// UTF-8, malformed JSON-seq, empty names and disallowed element types.
TensorPath decode_path(std::string_view bytes);

// Encodes a path the way upstream writes it.
std::string encode_path(const TensorPath& path);

// Human-readable form for messages: the plain string, or the JSON array.
std::string display_path(const TensorPath& path);

// True if `bytes` is valid UTF-8 (no surrogates, no overlongs).
bool is_valid_utf8(std::string_view bytes);

// Detects conflicting paths: duplicates, a path that is both a leaf and a
// prefix of another, and a level mixing string and integer keys.
class PathTrie {
 public:
  PathTrie();
  ~PathTrie();
  PathTrie(PathTrie&&) noexcept;
  PathTrie& operator=(PathTrie&&) noexcept;
  // Throws tz::Error(conflict) and leaves the trie unchanged on conflict.
  void insert(const TensorPath& path);
  bool contains(const TensorPath& path) const;
  // Removes a leaf inserted before (and branches left empty); no-op if absent.
  void erase(const TensorPath& path);

 private:
  struct Node;
  std::unique_ptr<Node> root_;
};

}  // namespace tz::format
