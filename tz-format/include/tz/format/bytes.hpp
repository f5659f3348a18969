#pragma once
// Little-endian encoding helpers and a bounds-checked cursor for parsing
// untrusted bytes: every read is checked against the end of the buffer.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tz/format/error.hpp"

namespace tz::format {

inline uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline uint64_t load_u64(const uint8_t* p) {
  return uint64_t(load_u32(p)) | (uint64_t(load_u32(p + 4)) << 32);
}

inline void store_u16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline void store_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

// Appends little-endian values to a growing byte vector.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { uint8_t b[2]; store_u16(b, v); out_.insert(out_.end(), b, b + 2); }
  void u32(uint32_t v) { uint8_t b[4]; store_u32(b, v); out_.insert(out_.end(), b, b + 4); }
  void u64(uint64_t v) { uint8_t b[8]; store_u64(b, v); out_.insert(out_.end(), b, b + 8); }
  void bytes(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void zeros(size_t n) { out_.insert(out_.end(), n, 0); }
  size_t size() const { return out_.size(); }

 private:
  std::vector<uint8_t>& out_;
};

// Reads little-endian values from [data, data+size). Running past the end
// raises `overrun_code` with a message naming `what`.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, const char* what, Errc overrun_code = Errc::format)
      : data_(data), size_(size), what_(what), overrun_(overrun_code) {}

  uint8_t u8() { return *take(1); }
  uint16_t u16() { return load_u16(take(2)); }
  uint32_t u32() { return load_u32(take(4)); }
  uint64_t u64() { return load_u64(take(8)); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  const uint8_t* take(size_t n) {
    if (n > size_ - pos_) {
      fail(overrun_, std::string(what_) + ": needs " + std::to_string(n) + " more bytes at offset " +
                         std::to_string(pos_) + " but only " + std::to_string(size_ - pos_) +
                         " remain");
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  std::string_view str(size_t n) { return {reinterpret_cast<const char*>(take(n)), n}; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const char* what_;
  Errc overrun_;
};

}  // namespace tz::format
