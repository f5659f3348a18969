#include "tz/crypto/key.hpp"

#include <sodium.h>

#include <cstring>
#include <new>
#include <string>

#include "tz/format/error.hpp"

namespace tz::crypto {

static_assert(kKeyBytes == crypto_secretbox_KEYBYTES);
static_assert(format::kNonceBytes == crypto_secretbox_NONCEBYTES);
static_assert(format::kMacBytes == crypto_secretbox_MACBYTES);
static_assert(format::kSaltBytes == crypto_pwhash_SALTBYTES);
static_assert(format::kPwhashArgon2id13 == crypto_pwhash_ALG_ARGON2ID13);
static_assert(kOpsLimitMin == crypto_pwhash_argon2id_OPSLIMIT_MIN);
static_assert(kOpsLimitInteractive == crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE);
static_assert(kOpsLimitModerate == crypto_pwhash_argon2id_OPSLIMIT_MODERATE);
static_assert(kOpsLimitSensitive == crypto_pwhash_argon2id_OPSLIMIT_SENSITIVE);
static_assert(kMemLimitMin == crypto_pwhash_argon2id_MEMLIMIT_MIN);
static_assert(kMemLimitInteractive == crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE);
static_assert(kMemLimitModerate == crypto_pwhash_argon2id_MEMLIMIT_MODERATE);
static_assert(kMemLimitSensitive == crypto_pwhash_argon2id_MEMLIMIT_SENSITIVE);

void ensure_sodium() {
  static const int status = sodium_init();
  if (status < 0) fail(Errc::crypto, "libsodium could not be initialised");
}

SecretBytes::SecretBytes(size_t size) : size_(size) {
  ensure_sodium();
  // sodium_malloc places the buffer against a guard page and mlocks it when allowed.
  data_ = static_cast<uint8_t*>(sodium_malloc(size == 0 ? 1 : size));
  if (!data_) throw std::bad_alloc();
}

SecretBytes::SecretBytes(const void* data, size_t size) : SecretBytes(size) {
  if (size) std::memcpy(data_, data, size);
}

SecretBytes::~SecretBytes() { sodium_free(data_); }  // zeroes before unmapping

void random_bytes(void* out, size_t size) {
  ensure_sodium();
  randombytes_buf(out, size);
}

std::unique_ptr<SecretBytes> derive_key(const uint8_t* password, size_t password_len,
                                        const format::KdfParams& params) {
  if (params.alg != format::kPwhashArgon2id13) fail(Errc::crypto, "Unsupported pwhash algorithm");
  if (params.salt.size() != format::kSaltBytes) {
    fail(Errc::crypto, "Invalid salt size (" + std::to_string(params.salt.size()) + " bytes, expected 16)");
  }
  if (params.opslimit < kOpsLimitMin || params.opslimit > kOpsLimitMax || params.memlimit < kMemLimitMin ||
      params.memlimit > kMemLimitMax) {
    fail(Errc::crypto, "Key derivation parameters are out of range");
  }
  auto key = std::make_unique<SecretBytes>(kKeyBytes);
  if (crypto_pwhash(key->data(), kKeyBytes, reinterpret_cast<const char*>(password), password_len,
                    params.salt.data(), params.opslimit, size_t(params.memlimit), params.alg) != 0) {
    // libsodium fails here only when it cannot allocate memlimit bytes.
    fail(Errc::crypto, "Key derivation failed (could not allocate " + std::to_string(params.memlimit) + " bytes)");
  }
  return key;
}

std::shared_ptr<const KeyMaterial> KeyMaterial::from_key(const void* key, size_t len) {
  if (key == nullptr || len != kKeyBytes) {
    fail(Errc::invalid_arg, "Encryption keys must be exactly 32 bytes, got " + std::to_string(key ? len : 0));
  }
  std::shared_ptr<KeyMaterial> m(new KeyMaterial());
  m->key_ = std::make_unique<SecretBytes>(key, len);
  return m;
}

std::shared_ptr<const KeyMaterial> KeyMaterial::random() {
  std::shared_ptr<KeyMaterial> m(new KeyMaterial());
  m->key_ = std::make_unique<SecretBytes>(kKeyBytes);
  random_bytes(m->key_->data(), kKeyBytes);
  return m;
}

std::shared_ptr<const KeyMaterial> KeyMaterial::derive(const void* password, size_t len, uint64_t opslimit,
                                                       uint64_t memlimit, const uint8_t* salt, size_t salt_len) {
  if (password == nullptr || len == 0) fail(Errc::invalid_arg, "Source cannot be empty");
  if (salt != nullptr && salt_len != format::kSaltBytes) {
    fail(Errc::invalid_arg, "Invalid salt size (" + std::to_string(salt_len) + " bytes, expected 16)");
  }
  if (opslimit < kOpsLimitMin || opslimit > kOpsLimitMax) fail(Errc::invalid_arg, "opslimit is out of range");
  if (memlimit < kMemLimitMin || memlimit > kMemLimitMax) fail(Errc::invalid_arg, "memlimit is out of range");
  format::KdfParams params;
  params.opslimit = opslimit;
  params.memlimit = memlimit;
  params.salt.resize(format::kSaltBytes);
  if (salt) std::memcpy(params.salt.data(), salt, format::kSaltBytes);
  else random_bytes(params.salt.data(), format::kSaltBytes);
  std::shared_ptr<KeyMaterial> m(new KeyMaterial());
  m->key_ = derive_key(static_cast<const uint8_t*>(password), len, params);
  m->kdf_ = std::move(params);
  return m;
}

std::shared_ptr<const KeyMaterial> KeyMaterial::password(const void* password, size_t len) {
  if (password == nullptr || len == 0) fail(Errc::invalid_arg, "Source cannot be empty");
  std::shared_ptr<KeyMaterial> m(new KeyMaterial());
  m->password_ = std::make_unique<SecretBytes>(password, len);
  return m;
}

const SecretBytes& KeyMaterial::key() const {
  if (!key_) fail(Errc::state, "This key holds a password only; its key is derived when a file is read");
  return *key_;
}

KeyResolver::KeyResolver(std::shared_ptr<const KeyMaterial> material, Limits limits)
    : material_(std::move(material)), limits_(limits) {}

const SecretBytes& KeyResolver::key_for(const format::CryptInfo& info) {
  // An exact (or already derived) key decrypts everything, as upstream's from_key does.
  if (material_->has_key()) return material_->key();
  if (info.kdf.empty()) {
    fail(Errc::crypto,
         "Source string was provided, but the tensor was not originally encrypted using a source string "
         "(no key derivation parameters are stored); use the exact key instead");
  }
  if (info.kdf.size() > 1) fail(Errc::crypto, "Tensor has more than one key derivation chunk");
  const format::KdfParams& params = info.kdf.front();
  if (params.alg != format::kPwhashArgon2id13) fail(Errc::crypto, "Unsupported pwhash algorithm");
  if (params.opslimit > limits_.max_opslimit || params.memlimit > limits_.max_memlimit) {
    fail(Errc::limit, "The file asks for key derivation with opslimit " + std::to_string(params.opslimit) +
                          " and memlimit " + std::to_string(params.memlimit) + ", above this reader's limits (" +
                          std::to_string(limits_.max_opslimit) + ", " + std::to_string(limits_.max_memlimit) +
                          "); raise kdf_max_opslimit / kdf_max_memlimit to allow it");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = derived_.find(params);
  if (it == derived_.end()) {
    if (derived_.size() >= limits_.max_derivations) {
      fail(Errc::limit, "The file asks for more than " + std::to_string(limits_.max_derivations) +
                            " different key derivations (salts or parameters), above this reader's limit; "
                            "raise kdf_max_derivations to allow it");
    }
    const SecretBytes& pw = *material_->password_bytes();
    it = derived_.emplace(params, derive_key(pw.data(), pw.size(), params)).first;
  }
  return *it->second;
}

}  // namespace tz::crypto
