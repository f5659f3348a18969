#pragma once
// Self-contained hash primitives used by the tensorizer format:
// CRC-32 (zlib/IEEE) and SHA-256, with runtime-dispatched x86 acceleration
// (PCLMULQDQ folding for CRC-32, SHA-NI for SHA-256) and portable fallbacks.
#include <array>
#include <cstddef>
#include <cstdint>

namespace tz::format {

// Standard CRC-32 (zlib/IEEE, reflected poly 0xEDB88320). crc32_update(0, p, n) == zlib crc32(0, p, n);
// chaining crc32_update(crc32_update(0,a,na), b, nb) == crc of a||b.
uint32_t crc32_update(uint32_t crc, const void* data, size_t len) noexcept;

// CRC of A||B given crc(A), crc(B) and len(B) (like zlib crc32_combine).
// O(log len_b).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) noexcept;

class Sha256 {
 public:
  Sha256() noexcept;
  void update(const void* data, size_t len) noexcept;
  std::array<uint8_t, 32> finish() noexcept;  // object may be reset() and reused
  void reset() noexcept;

 private:
  uint32_t state_[8];
  uint64_t total_len_;  // bytes hashed so far
  size_t buf_len_;      // bytes pending in buf_ (< 64)
  uint8_t buf_[64];
};

// Which implementation runtime dispatch picked, for benchmarks/logging: e.g. "sha-ni", "portable", "pclmul", "slice8".
const char* sha256_impl_name() noexcept;
const char* crc32_impl_name() noexcept;

}  // namespace tz::format
