#pragma once
// The bytes save_child.cpp writes, so a test can tell whose file it reads.
#include <cstddef>
#include <cstdint>

namespace tz_test {
inline uint8_t fill_byte(unsigned seed, size_t tensor, size_t k) {
  return uint8_t(seed * 71 + tensor * 13 + k * 7 + (k >> 8));
}
}  // namespace tz_test
