// Tensor path decoding and the path trie (tz-format). The input is split at
// NUL bytes into names; each decoded path must re-encode to a name that
// decodes to the same path, and go into one trie (conflicts are typed
// errors); then each is looked up and erased.
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "tz/format/tensor_path.hpp"

using namespace tz::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<TensorPath> paths;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string_view::npos) end = all.size();
    try {
      TensorPath p = decode_path(all.substr(start, end - start));
      if (p.empty()) fuzz_bug("decode_path", "empty path");
      const std::string enc = encode_path(p);
      if (decode_path(enc) != p) fuzz_bug("encode_path", "round trip changed the path");
      display_path(p);
      paths.push_back(std::move(p));
    } catch (const tz::Error& e) {
      expect_typed(e);
    }
    start = end + 1;
  }
  PathTrie trie;
  std::vector<const TensorPath*> inserted;
  for (const auto& p : paths) {
    try {
      trie.insert(p);
      inserted.push_back(&p);
    } catch (const tz::Error& e) {
      if (e.code() != tz::Errc::conflict) fuzz_bug("PathTrie::insert", e.what());
    }
  }
  for (const auto* p : inserted) {
    if (!trie.contains(*p)) fuzz_bug("PathTrie", "inserted path not found");
    trie.erase(*p);
    if (trie.contains(*p)) fuzz_bug("PathTrie", "erased path still found");
  }
  return 0;
}
