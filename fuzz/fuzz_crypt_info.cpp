// crypt_info block parser (tz-format): a parsed block's contents lie inside it.
#include <vector>

#include "fuzz_common.hpp"
#include "tz/format/crypt_info.hpp"

using namespace tz::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  std::vector<uint8_t> bytes(data, data + size);
  try {
    const CryptInfo info = parse_crypt_info(bytes.data(), bytes.size());
    if (info.macs.size() * kMacBytes > size) fuzz_bug("crypt_info", "more MACs than the block holds");
    if (info.scheme == CipherScheme::parallel &&
        (info.chunk_size < kCryptChunkMinimum || info.chunk_size % kCryptChunkQuantum)) {
      fuzz_bug("crypt_info", "accepted an invalid chunk size");
    }
    for (const auto& k : info.kdf) {
      if (k.salt.size() > size) fuzz_bug("crypt_info", "salt longer than the block");
    }
  } catch (const tz::Error& e) {
    expect_typed(e);
  }
  return 0;
}
