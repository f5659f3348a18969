#pragma once
// The crypt_info block of an encrypted file's tensor headers (FORMAT.md §6.5):
// how a tensor's data was encrypted and, for password keys, how the key was
// derived. Pure codec: no cryptography happens here.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace tz::format {

inline constexpr size_t kNonceBytes = 24;
inline constexpr size_t kMacBytes = 16;
inline constexpr size_t kSaltBytes = 16;
inline constexpr uint64_t kCryptChunkSize = uint64_t(2) << 20;  // what writers use
inline constexpr uint64_t kCryptChunkQuantum = 64;
inline constexpr uint64_t kCryptChunkMinimum = 1024;
inline constexpr int32_t kPwhashArgon2id13 = 2;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// Key-derivation chunk (type 1, method 1 = libsodium pwhash).
struct KdfParams {
  uint64_t opslimit = 0;
  uint64_t memlimit = 0;
  int32_t alg = kPwhashArgon2id13;
  std::vector<uint8_t> salt;

  bool operator<(const KdfParams& o) const;
};

enum class CipherScheme : uint8_t {
  none,        // no cipher chunk: the tensor is stored in the clear
  parallel,    // type 2: boxes of chunk_size with nonces N0, N0+1, ...
  sequential,  // type 3: one box over the whole data
};

struct CryptInfo {
  size_t chunk_count = 0;   // all chunks of the block, of any type
  size_t cipher_chunks = 0;  // chunks of type 2 or 3
  std::vector<KdfParams> kdf;
  CipherScheme scheme = CipherScheme::none;
  uint64_t chunk_size = 0;  // parallel only
  Nonce nonce{};
  std::vector<Mac> macs;

  bool encrypted() const { return chunk_count > 0; }
};

// Parses a block body (the bytes after its u64 length prefix). Malformed
// blocks, unknown chunk types or methods and invalid chunk sizes raise
// Errc::crypto: every fault in how a tensor is encrypted is a crypto error.
CryptInfo parse_crypt_info(const uint8_t* body, size_t size);

// Builds a block body for an encrypted tensor with `mac_count` zeroed MAC
// slots; `mac_offset` receives the offset of the first slot in the body.
std::vector<uint8_t> build_crypt_info(const KdfParams* kdf, uint64_t chunk_size, const Nonce& nonce,
                                      size_t mac_count, size_t* mac_offset);

// The block body of a tensor stored in the clear inside an encrypted file.
std::vector<uint8_t> empty_crypt_info();

}  // namespace tz::format
