#include "tz/format/container.hpp"

#include <cstring>

#include "tz/format/bytes.hpp"
#include "tz/format/error.hpp"

namespace tz::format {
namespace {

// Multiplies with overflow detection.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

std::string printable_name(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  return "<" + std::to_string(s.size()) + " bytes of invalid UTF-8>";
}

}  // namespace

FileHeader parse_file_header(const uint8_t* data, size_t size) {
  if (size < 5 || std::memcmp(data, kMagic, 5) != 0) fail(Errc::format, "Not a tensorizer file");
  if (size < 9) fail(Errc::truncated, "File too small: ran out of data before reading the data version");
  FileHeader h;
  h.version = load_u32(data + 5);
  if (h.version < kMinDataVersion || h.version > kMaxDataVersion) {
    fail(Errc::version, "Unsupported version: this data stream uses tensorizer data version " +
                            std::to_string(h.version) +
                            ", which is not supported in this release of tensorizer.\n"
                            "Supported data versions: 1, 2, 3, 4, 5");
  }
  // Every field up to the metadata length M: the 32 flag bytes, tensor_size,
  // 8 unused bytes and tensor_count end at offset 65.
  if (size < kMetadataOffset - 8) fail(Errc::truncated, "File too small: ran out of data before reading a full header");
  const uint8_t* flags = data + 9;
  for (int i = 8; i < 32; ++i) {
    if (flags[i]) fail(Errc::format, "Unsupported feature flags: bits above 63 are set");
  }
  h.flags = load_u64(flags);
  if (h.flags & ~kKnownFlags) {
    fail(Errc::format, "Unsupported feature flags: 0x" + [&] {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(h.flags));
      return std::string(buf);
    }());
  }
  if (h.versioned_metadata() && h.version < kLongTensorVersion) {
    fail(Errc::format, "Invalid feature flag present in file header for a file with version " +
                           std::to_string(h.version));
  }
  h.tensor_size = load_u64(data + 41);
  h.tensor_count = load_u64(data + 57);
  if (size < kMetadataOffset) fail(Errc::truncated, "File too small: ran out of data before reading the metadata length");
  h.metadata_length = load_u64(data + 65);
  return h;
}

void serialize_file_header(const FileHeader& h, uint8_t out[kMetadataOffset]) {
  std::memset(out, 0, kMetadataOffset);
  std::memcpy(out, kMagic, 5);
  store_u32(out + 5, h.version);
  if (h.version >= kMetaTensorVersion) store_u64(out + 9, h.flags);
  store_u64(out + 41, h.tensor_size);
  store_u64(out + 57, h.tensor_count);
  store_u64(out + 65, h.metadata_length);
}

std::vector<MetadataEntry> parse_metadata(const FileHeader& header, const uint8_t* block,
                                          size_t block_size, uint64_t file_size) {
  if (header.tensor_count == 0 || header.metadata_length == 0) {
    fail(Errc::format, "Tensor index in the file is empty");
  }
  // The smallest entry is 2+1+1+1+1+24 = 30 bytes (1-byte name, 1-byte dtype, scalar),
  // so a count the block cannot hold is rejected before reserving anything.
  const uint64_t min_entry = header.versioned_metadata() ? 34 : 30;
  if (header.tensor_count > block_size / min_entry) {
    fail(Errc::format, "Tensor count " + std::to_string(header.tensor_count) +
                           " does not fit in a metadata index of " + std::to_string(block_size) + " bytes");
  }
  const uint64_t data_start = kMetadataOffset + header.metadata_length;
  std::vector<MetadataEntry> entries;
  entries.reserve(size_t(header.tensor_count));
  ByteReader r(block, block_size, "metadata index");
  for (uint64_t i = 0; i < header.tensor_count; ++i) {
    MetadataEntry e;
    if (header.versioned_metadata()) {
      const uint32_t tag = r.u32();
      if (tag != 1 && tag != kLongTensorVersion) {
        fail(Errc::format, "Unsupported version: metadata version " + std::to_string(tag) +
                               " of entry " + std::to_string(i) + " (supported: 1, 5)");
      }
      e.long_dims = tag == kLongTensorVersion;
    }
    const uint16_t name_len = r.u16();
    e.name = std::string(r.str(name_len));
    const uint8_t type = r.u8();
    if (type > 2) fail(Errc::format, "Invalid tensor type " + std::to_string(type) + " in metadata entry " + std::to_string(i));
    e.type = TensorType(type);
    const uint8_t dtype_len = r.u8();
    e.dtype = parse_dtype(r.str(dtype_len));
    const uint8_t ndim = r.u8();
    e.shape.resize(ndim);
    e.numel = 1;
    for (auto& d : e.shape) {
      d = e.long_dims ? r.u64() : r.u32();
      if (mul_overflows(e.numel, d, e.numel)) fail(Errc::format, "Tensor shape is too large in metadata entry " + std::to_string(i));
    }
    if (mul_overflows(e.numel, e.dtype.itemsize, e.nbytes)) {
      fail(Errc::format, "Tensor size overflows in metadata entry " + std::to_string(i));
    }
    e.header_offset = r.u64();
    e.data_offset = r.u64();
    e.data_length = r.u64();
    e.path = decode_path(e.name);

    const std::string who = "tensor '" + printable_name(e.name) + "'";
    if (e.header_offset < data_start || e.data_offset <= e.header_offset ||
        e.header_length() < 8 + 2 + 1 + 2 + 1 + 1 + 2 + 1 + 8) {
      fail(Errc::format, "Invalid offsets for " + who + " in the metadata index");
    }
    // Meta tensors (no data stored) exist from data version 4 on: an older
    // file with a zero data length for a non-empty tensor was altered, and
    // must not load as zeros.
    if (e.is_meta() && header.version < kMetaTensorVersion) {
      fail(Errc::format, "Data length 0 of " + who + " (" + std::to_string(e.nbytes) +
                             " bytes) in a file of data version " + std::to_string(header.version) +
                             ", which cannot hold meta tensors");
    }
    if (e.data_length != 0 && e.data_length != e.nbytes) {
      fail(Errc::format, "Data length " + std::to_string(e.data_length) + " of " + who +
                             " does not match its shape and dtype (" + std::to_string(e.nbytes) + " bytes)");
    }
    if (e.data_offset > file_size || e.data_length > file_size - e.data_offset) {
      fail(Errc::truncated, "File is truncated: " + who + " needs bytes up to offset " +
                                std::to_string(e.data_offset + (e.data_length > file_size ? 0 : e.data_length)) +
                                " but the file has " + std::to_string(file_size) + " bytes");
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

void append_metadata_entry(std::vector<uint8_t>& out, const MetadataEntry& e, bool tagged) {
  ByteWriter w(out);
  if (tagged) w.u32(e.long_dims ? kLongTensorVersion : 1);
  w.u16(uint16_t(e.name.size()));
  w.bytes(e.name.data(), e.name.size());
  w.u8(uint8_t(e.type));
  w.u8(uint8_t(e.dtype.text.size()));
  w.bytes(e.dtype.text.data(), e.dtype.text.size());
  w.u8(uint8_t(e.shape.size()));
  for (uint64_t d : e.shape) {
    if (e.long_dims) w.u64(d);
    else w.u32(uint32_t(d));
  }
  w.u64(e.header_offset);
  w.u64(e.data_offset);
  w.u64(e.data_length);
}

TensorHeader parse_tensor_header(const uint8_t* bytes, size_t size, bool long_dims, bool has_crypt_info) {
  ByteReader r(bytes, size, "tensor header");
  TensorHeader h;
  const uint64_t declared = r.u64();
  if (declared != size) {
    fail(Errc::format, "Tensor header length " + std::to_string(declared) +
                           " does not match the metadata index (" + std::to_string(size) + ")");
  }
  if (size < 8 + 8) fail(Errc::format, "Tensor header is too short");
  h.module_index = r.u16();
  const uint8_t type = r.u8();
  if (type > 2) fail(Errc::format, "Invalid tensor type " + std::to_string(type) + " in tensor header");
  h.type = TensorType(type);
  h.name = std::string(r.str(r.u16()));
  if (h.type != TensorType::state_dict && !h.name.empty() && uint8_t(h.name[0]) == kJsonSeqMarker) {
    fail(Errc::format, "Cannot deserialize structured tensor paths from non-state-dicts");
  }
  h.dtype = std::string(r.str(r.u8()));
  h.shape.resize(r.u8());
  for (auto& d : h.shape) d = long_dims ? r.u64() : r.u32();
  const uint16_t hash_section = r.u16();
  const size_t hash_start = r.pos();
  ByteReader hr(r.take(hash_section), hash_section, "tensor hash section");
  if (hash_section > 0) {
    const uint8_t count = hr.u8();
    for (uint8_t k = 0; k < count; ++k) {
      const uint8_t t = hr.u8();
      const uint8_t len = hr.u8();
      if (t > 1) fail(Errc::format, "Unknown hash type " + std::to_string(t) + " in tensor header");
      if ((t == 0 && len != 4) || (t == 1 && len != 32)) {
        fail(Errc::format, "Invalid hash length " + std::to_string(len) + " in tensor header");
      }
      h.hashes.push_back({HashType(t), hash_start + hr.pos(), len});
      hr.take(len);
    }
  }
  if (has_crypt_info) {
    h.crypt_info_offset = r.pos();
    const uint64_t crypt_len = r.u64();
    if (crypt_len > r.remaining()) fail(Errc::crypto, "Malformed crypt_info block: it runs past the tensor header");
    r.take(size_t(crypt_len));
    h.crypt_info_size = 8 + size_t(crypt_len);
  }
  if (r.remaining() < 8) fail(Errc::format, "Tensor header has no room for its data length");
  h.data_length = static_cast<int64_t>(load_u64(bytes + size - 8));
  if (h.data_length < 0) fail(Errc::format, "Negative data length in tensor header");
  return h;
}

void check_header_matches(const TensorHeader& h, const MetadataEntry& e) {
  const auto mismatch = [&](const char* field) {
    fail(Errc::format, std::string("Tensor header of '") + printable_name(e.name) +
                           "' disagrees with the metadata index (" + field + ")");
  };
  if (h.name != e.name) mismatch("name");
  if (h.type != e.type) mismatch("tensor type");
  if (h.dtype != e.dtype.text) mismatch("dtype");
  if (h.shape != e.shape) mismatch("shape");
  if (uint64_t(h.data_length) != e.data_length) mismatch("data length");
}

std::vector<uint8_t> hashable_header(const uint8_t* bytes, size_t size, const TensorHeader& h) {
  std::vector<uint8_t> out;
  out.reserve(size);
  if (h.crypt_info_size) {
    out.insert(out.end(), bytes, bytes + h.crypt_info_offset);
    out.insert(out.end(), bytes + h.crypt_info_offset + h.crypt_info_size, bytes + size);
  } else {
    out.assign(bytes, bytes + size);
  }
  for (const auto& he : h.hashes) {
    // Hash values precede any crypt_info block, so their offsets are unchanged.
    std::memset(out.data() + he.value_offset, 0, he.value_length);
  }
  return out;
}

BuiltHeader build_tensor_header(const HeaderSpec& s) {
  BuiltHeader b;
  auto& out = b.bytes;
  ByteWriter w(out);
  w.u64(0);  // H, patched below
  w.u16(s.module_index);
  w.u8(uint8_t(s.type));
  w.u16(uint16_t(s.name.size()));
  w.bytes(s.name.data(), s.name.size());
  w.u8(uint8_t(s.dtype.size()));
  w.bytes(s.dtype.data(), s.dtype.size());
  w.u8(uint8_t(s.ndim));
  for (size_t i = 0; i < s.ndim; ++i) {
    if (s.long_dims) w.u64(s.shape[i]);
    else w.u32(uint32_t(s.shape[i]));
  }
  const uint8_t count = uint8_t((s.crc32 ? 1 : 0) + (s.sha256 ? 1 : 0));
  w.u16(uint16_t(1 + (s.crc32 ? 6 : 0) + (s.sha256 ? 34 : 0)));
  w.u8(count);
  if (s.crc32) {
    w.u8(uint8_t(HashType::crc32));
    w.u8(4);
    b.hashes.push_back({HashType::crc32, out.size(), 4});
    w.zeros(4);
  }
  if (s.sha256) {
    w.u8(uint8_t(HashType::sha256));
    w.u8(32);
    b.hashes.push_back({HashType::sha256, out.size(), 32});
    w.zeros(32);
  }
  if (s.crypt_info) {
    b.crypt_info_offset = out.size();
    w.u64(s.crypt_info->size());
    w.bytes(s.crypt_info->data(), s.crypt_info->size());
    b.crypt_info_size = 8 + s.crypt_info->size();
  }
  w.u64(s.data_length);
  store_u64(out.data(), out.size());
  return b;
}

}  // namespace tz::format
