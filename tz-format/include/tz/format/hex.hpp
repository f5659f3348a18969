#pragma once
// Lowercase hex of bytes, for digests in messages and signatures.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tz::format {

inline std::string to_hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

}  // namespace tz::format
