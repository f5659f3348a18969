#pragma once
// XSalsa20-Poly1305 secretbox (libsodium, detached MACs) over the chunks of
// one tensor, and the little-endian nonce arithmetic that numbers them.
#include <cstddef>
#include <cstdint>

#include "tz/crypto/key.hpp"
#include "tz/format/crypt_info.hpp"

namespace tz::crypto {

// nonce + i, the nonce read as a little-endian 192-bit integer (wraps).
format::Nonce nonce_add(const format::Nonce& nonce, uint64_t i);

format::Nonce random_nonce();

// Encrypts `size` bytes from `in` to `out` (which may equal `in`).
void seal(uint8_t* out, format::Mac& mac, const uint8_t* in, size_t size, const format::Nonce& nonce,
          const SecretBytes& key);

// Authenticates and decrypts in place. Returns false, leaving `data`
// untouched, when the MAC does not match.
[[nodiscard]] bool open_in_place(uint8_t* data, size_t size, const format::Mac& mac, const format::Nonce& nonce,
                                 const SecretBytes& key);

}  // namespace tz::crypto
