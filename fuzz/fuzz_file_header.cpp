// File header and metadata index parsers (tz-format), fed the first bytes of
// a file: parse_file_header, then parse_metadata over the index block as far
// as the input holds it, then the path trie the reader builds from it.
#include <algorithm>

#include "fuzz_common.hpp"
#include "tz/format/container.hpp"

using namespace tz::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  try {
    const FileHeader h = parse_file_header(data, size);
    if (size < kMetadataOffset) fuzz_bug("file header", "accepted a header shorter than 73 bytes");
    const size_t block = size_t(std::min<uint64_t>(h.metadata_length, size - kMetadataOffset));
    const auto entries = parse_metadata(h, data + kMetadataOffset, block, size);
    if (entries.size() != h.tensor_count) fuzz_bug("metadata", "entry count differs from the header's");
    PathTrie trie;
    for (const auto& e : entries) {
      if (e.data_offset > size || e.data_length > size - e.data_offset) fuzz_bug("metadata", "data past the file");
      trie.insert(e.path);
    }
  } catch (const tz::Error& e) {
    expect_typed(e);
  }
  return 0;
}
