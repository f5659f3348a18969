#pragma once
// File header, metadata index and per-tensor headers of the |TZR| container
// (FORMAT.md §1-§5, §7, §9). Pure codec: parses and builds bytes, no I/O.
// Every parser treats its input as hostile and checks each length against
// the bytes it was given and the size of the file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tz/format/dtype.hpp"
#include "tz/format/tensor_path.hpp"

namespace tz::format {

inline constexpr uint8_t kMagic[5] = {'|', 'T', 'Z', 'R', '|'};
inline constexpr uint64_t kMetadataOffset = 73;  // magic + 60-byte header + u64 M
inline constexpr uint64_t kDefaultMetadataReserve = 262144;
inline constexpr uint32_t kMinDataVersion = 1;
inline constexpr uint32_t kMaxDataVersion = 5;
inline constexpr uint32_t kOpaqueVersion = 2;
inline constexpr uint32_t kEncryptionVersion = 3;
inline constexpr uint32_t kMetaTensorVersion = 4;
inline constexpr uint32_t kLongTensorVersion = 5;
inline constexpr uint64_t kFlagEncrypted = 1;
inline constexpr uint64_t kFlagVersionedMetadata = 2;
inline constexpr uint64_t kKnownFlags = kFlagEncrypted | kFlagVersionedMetadata;

enum class TensorType : uint8_t { param = 0, buffer = 1, state_dict = 2 };
enum class HashType : uint8_t { crc32 = 0, sha256 = 1 };

struct FileHeader {
  uint32_t version = kMinDataVersion;
  uint64_t flags = 0;        // feature flags (only bits 0-1 are defined)
  uint64_t tensor_size = 0;  // Σ data bytes written
  uint64_t tensor_count = 0;
  uint64_t metadata_length = kDefaultMetadataReserve;

  // Tensor headers carry crypt_info blocks (FORMAT.md §2.2).
  bool has_crypt_info() const {
    return version == kEncryptionVersion || (version >= kMetaTensorVersion && (flags & kFlagEncrypted));
  }
  bool versioned_metadata() const { return (flags & kFlagVersionedMetadata) != 0; }
};

// Parses the first kMetadataOffset bytes (fewer if the file is shorter).
// Errors: not a tensorizer file / unsupported version / truncated / bad flags.
FileHeader parse_file_header(const uint8_t* data, size_t size);
// Serializes magic + header + M (kMetadataOffset bytes). Flags are written
// only for versions >= 4, as upstream does.
void serialize_file_header(const FileHeader& header, uint8_t out[kMetadataOffset]);

struct MetadataEntry {
  std::string name;  // stored name bytes
  TensorPath path;
  TensorType type = TensorType::state_dict;
  DType dtype;
  std::vector<uint64_t> shape;
  bool long_dims = false;  // v5 tag 5: dims stored as u64
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_length = 0;
  uint64_t numel = 0;
  uint64_t nbytes = 0;  // numel * itemsize

  bool is_meta() const { return data_length == 0 && nbytes > 0; }
  uint64_t header_length() const { return data_offset - header_offset; }
};

// Parses `header.tensor_count` entries from the metadata block and checks
// every offset and length against `file_size`.
std::vector<MetadataEntry> parse_metadata(const FileHeader& header, const uint8_t* block,
                                          size_t block_size, uint64_t file_size);

// Appends one metadata entry; `tagged` prepends the v5 u32 version tag.
void append_metadata_entry(std::vector<uint8_t>& out, const MetadataEntry& entry, bool tagged);

struct HashEntry {
  HashType type;
  size_t value_offset;  // offset of the value inside the header bytes
  size_t value_length;
};

struct TensorHeader {
  uint16_t module_index = 0;
  TensorType type = TensorType::state_dict;
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<HashEntry> hashes;
  size_t crypt_info_offset = 0;  // offset of the u64 length prefix; 0 if absent
  size_t crypt_info_size = 0;    // whole block including its prefix
  int64_t data_length = 0;
};

// Parses a complete tensor header (`bytes` holds all H bytes, starting with
// the u64 H itself).
TensorHeader parse_tensor_header(const uint8_t* bytes, size_t size, bool long_dims,
                                 bool has_crypt_info);

// Checks a parsed header against its metadata entry.
void check_header_matches(const TensorHeader& header, const MetadataEntry& entry);

// The bytes hashed for a tensor's header: all H bytes with hash values zeroed
// and the crypt_info block left out (FORMAT.md §4.6).
std::vector<uint8_t> hashable_header(const uint8_t* bytes, size_t size, const TensorHeader& header);

struct HeaderSpec {
  uint16_t module_index = 0;
  TensorType type = TensorType::state_dict;
  std::string_view name;
  std::string_view dtype;
  const uint64_t* shape = nullptr;
  size_t ndim = 0;
  bool long_dims = false;
  bool crc32 = true;
  bool sha256 = true;
  const std::vector<uint8_t>* crypt_info = nullptr;  // block body (without u64 prefix)
  uint64_t data_length = 0;
};

struct BuiltHeader {
  std::vector<uint8_t> bytes;
  std::vector<HashEntry> hashes;  // value slots, zero-filled
  size_t crypt_info_offset = 0;
  size_t crypt_info_size = 0;
};

BuiltHeader build_tensor_header(const HeaderSpec& spec);

}  // namespace tz::format
