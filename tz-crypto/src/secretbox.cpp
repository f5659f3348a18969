#include "tz/crypto/secretbox.hpp"

#include <sodium.h>

#include "tz/format/error.hpp"

namespace tz::crypto {

format::Nonce nonce_add(const format::Nonce& nonce, uint64_t i) {
  format::Nonce out = nonce;
  unsigned carry = 0;
  for (size_t b = 0; b < out.size(); ++b) {
    const unsigned sum = unsigned(out[b]) + unsigned(i & 0xFF) + carry;
    out[b] = uint8_t(sum);
    carry = sum >> 8;
    i >>= 8;
  }
  return out;
}

format::Nonce random_nonce() {
  format::Nonce n;
  random_bytes(n.data(), n.size());
  return n;
}

void seal(uint8_t* out, format::Mac& mac, const uint8_t* in, size_t size, const format::Nonce& nonce,
          const SecretBytes& key) {
  if (crypto_secretbox_detached(out, mac.data(), in, size, nonce.data(), key.data()) != 0) {
    fail(Errc::crypto, "Encryption failed");
  }
}

bool open_in_place(uint8_t* data, size_t size, const format::Mac& mac, const format::Nonce& nonce,
                   const SecretBytes& key) {
  return crypto_secretbox_open_detached(data, data, mac.data(), size, nonce.data(), key.data()) == 0;
}

}  // namespace tz::crypto
