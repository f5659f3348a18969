#pragma once
// Internal hooks of the hash implementations, exposed so that tests and
// benchmarks can exercise each implementation directly. Not a public API.
#include <cstddef>
#include <cstdint>

namespace tz::format::detail {

// Compresses `nblocks` consecutive 64-byte blocks into `state` (8 words, standard order a..h).
using Sha256BlocksFn = void (*)(uint32_t* state, const uint8_t* data, size_t nblocks) noexcept;

// Portable C++ SHA-256 compression.
void sha256_portable_blocks(uint32_t* state, const uint8_t* data, size_t nblocks) noexcept;
// SHA-NI compression, or nullptr when the build or CPU lacks it.
Sha256BlocksFn sha256_accel_blocks() noexcept;

// Same contract as tz::format::crc32_update.
using Crc32Fn = uint32_t (*)(uint32_t crc, const void* data, size_t len) noexcept;

// Portable slicing-by-16 table CRC-32.
uint32_t crc32_portable(uint32_t crc, const void* data, size_t len) noexcept;
// PCLMULQDQ folding CRC-32, or nullptr when the build or CPU lacks it.
Crc32Fn crc32_accel() noexcept;

}  // namespace tz::format::detail
