#pragma once
// Key material for tensorizer encryption, on libsodium. Secrets (keys and
// passwords) live in sodium_malloc'd memory: guarded, locked in RAM where the
// OS allows it, and wiped when freed. They never appear in error messages.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "tz/format/crypt_info.hpp"

namespace tz::crypto {

inline constexpr size_t kKeyBytes = 32;

// Argon2id limits as libsodium defines them (checked against it at build time).
inline constexpr uint64_t kOpsLimitMin = 1, kOpsLimitInteractive = 2, kOpsLimitModerate = 3,
                          kOpsLimitSensitive = 4, kOpsLimitMax = 4294967295u;
inline constexpr uint64_t kMemLimitMin = 8192, kMemLimitInteractive = 67108864,
                          kMemLimitModerate = 268435456, kMemLimitSensitive = 1073741824,
                          kMemLimitMax = 4398046510080u;

// Initialises libsodium once; throws Errc::crypto if it cannot.
void ensure_sodium();

// Fixed-size secret buffer in guarded memory.
class SecretBytes {
 public:
  explicit SecretBytes(size_t size);
  SecretBytes(const void* data, size_t size);
  ~SecretBytes();
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

void random_bytes(void* out, size_t size);

// Argon2id13 through crypto_pwhash: a 32-byte key from a password.
std::unique_ptr<SecretBytes> derive_key(const uint8_t* password, size_t password_len,
                                        const format::KdfParams& params);

// What a tz_key handle holds. Immutable once built, so it is shared freely
// between options, readers and writers.
class KeyMaterial {
 public:
  // An exact 32-byte key.
  static std::shared_ptr<const KeyMaterial> from_key(const void* key, size_t len);
  static std::shared_ptr<const KeyMaterial> random();
  // Derives the key now; the parameters are stored with each encrypted tensor.
  // `salt` may be NULL for a random 16-byte salt.
  static std::shared_ptr<const KeyMaterial> derive(const void* password, size_t len, uint64_t opslimit,
                                                   uint64_t memlimit, const uint8_t* salt, size_t salt_len);
  // A password for reading: keys are derived with the parameters in the file.
  static std::shared_ptr<const KeyMaterial> password(const void* password, size_t len);

  bool has_key() const { return key_ != nullptr; }
  const SecretBytes& key() const;  // Errc::state for a password-only handle
  const std::optional<format::KdfParams>& kdf() const { return kdf_; }
  const SecretBytes* password_bytes() const { return password_.get(); }

 private:
  KeyMaterial() = default;
  std::unique_ptr<SecretBytes> key_;
  std::unique_ptr<SecretBytes> password_;
  std::optional<format::KdfParams> kdf_;
};

// Resolves the key for each encrypted tensor of one file, following
// upstream's rules (FORMAT.md §6.6 step 3). Derived keys are cached per set of
// parameters, so a file whose tensors share one salt pays for one derivation.
// Thread-safe.
class KeyResolver {
 public:
  struct Limits {
    uint64_t max_opslimit = 64;            // 16x SENSITIVE
    uint64_t max_memlimit = uint64_t(4) << 30;  // 4x SENSITIVE
    // Distinct derivations (parameter sets) one file may ask for: the caps
    // above bound one derivation, this bounds the whole load. Writers use
    // one set per file; a file giving each tensor its own salt would
    // otherwise cost a full Argon2 run per tensor.
    uint64_t max_derivations = 4;
  };
  KeyResolver(std::shared_ptr<const KeyMaterial> material, Limits limits);
  const SecretBytes& key_for(const format::CryptInfo& info);

 private:
  std::shared_ptr<const KeyMaterial> material_;
  Limits limits_;
  std::mutex mutex_;
  std::map<format::KdfParams, std::unique_ptr<SecretBytes>> derived_;
};

}  // namespace tz::crypto
