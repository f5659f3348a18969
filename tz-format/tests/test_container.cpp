#include <catch2/catch.hpp>

#include <cstring>

#include "tz/format/bytes.hpp"
#include "tz/format/container.hpp"
#include "tz/format/error.hpp"

using namespace tz::format;

namespace {
std::vector<uint8_t> header_bytes(uint32_t version, uint64_t flags, uint64_t count, uint64_t m) {
  FileHeader h;
  h.version = version;
  h.flags = flags;
  h.tensor_count = count;
  h.metadata_length = m;
  std::vector<uint8_t> b(kMetadataOffset);
  serialize_file_header(h, b.data());
  return b;
}
tz::Errc header_error(const std::vector<uint8_t>& b) {
  try {
    parse_file_header(b.data(), b.size());
  } catch (const tz::Error& e) {
    return e.code();
  }
  return tz::Errc::internal;
}
}  // namespace

TEST_CASE("file header round trip and flag rules") {
  const auto b = header_bytes(4, kFlagEncrypted, 3, kDefaultMetadataReserve);
  const FileHeader h = parse_file_header(b.data(), b.size());
  CHECK(h.version == 4);
  CHECK(h.flags == kFlagEncrypted);
  CHECK(h.has_crypt_info());
  CHECK(h.tensor_count == 3);
  // Flags are not serialized below version 4.
  CHECK(parse_file_header(header_bytes(3, kFlagEncrypted, 1, 8).data(), kMetadataOffset).flags == 0);
  CHECK(parse_file_header(header_bytes(3, 0, 1, 8).data(), kMetadataOffset).has_crypt_info());
}

TEST_CASE("file header errors") {
  auto b = header_bytes(1, 0, 1, 8);
  b[0] = 'X';
  CHECK(header_error(b) == tz::Errc::format);
  CHECK(header_error({}) == tz::Errc::format);
  b = header_bytes(1, 0, 1, 8);
  store_u32(b.data() + 5, 0);
  CHECK(header_error(b) == tz::Errc::version);
  store_u32(b.data() + 5, 6);
  CHECK(header_error(b) == tz::Errc::version);
  b = header_bytes(5, 4, 1, 8);
  CHECK(header_error(b) == tz::Errc::format);
  b = header_bytes(4, kFlagVersionedMetadata, 1, 8);
  CHECK(header_error(b) == tz::Errc::format);
  b = header_bytes(5, kFlagVersionedMetadata, 1, 8);
  CHECK(parse_file_header(b.data(), b.size()).versioned_metadata());
  b = header_bytes(1, 0, 1, 8);
  b[9 + 20] = 1;  // a high flag bit
  CHECK(header_error(b) == tz::Errc::format);
  for (size_t cut : {6, 20, 56, 70}) {
    auto t = header_bytes(1, 0, 1, 8);
    t.resize(cut);
    CHECK(header_error(t) == tz::Errc::truncated);
  }
}

TEST_CASE("a file shorter than its header is refused before any field past its end is read") {
  // Found by fuzz_file_header: 57-64 bytes passed the length check, and
  // tensor_count (bytes 57-64) was read past the buffer.
  const auto full = header_bytes(1, 0, 1, 8);
  for (size_t cut = 41; cut < kMetadataOffset; ++cut) {
    const std::vector<uint8_t> t(full.begin(), full.begin() + long(cut));  // exact size, for ASan
    try {
      parse_file_header(t.data(), t.size());
      FAIL("accepted " << cut << " bytes");
    } catch (const tz::Error& e) {
      CHECK(e.code() == tz::Errc::truncated);
      const std::string want = cut < kMetadataOffset - 8 ? "before reading a full header" : "the metadata length";
      CHECK(std::string(e.what()).find(want) != std::string::npos);
    }
  }
}

TEST_CASE("files of data versions 1-3 cannot hold meta tensors") {
  // A zero data length for a non-empty tensor means "meta" from version 4
  // on; before that it is damage, and must not load as zeros.
  for (uint32_t version : {1u, 2u, 3u, 4u}) {
    MetadataEntry e;
    e.name = "w";
    e.dtype = parse_dtype("<f4");
    e.shape = {4};
    e.header_offset = kMetadataOffset + 64;
    e.data_offset = e.header_offset + 64;
    e.data_length = 0;
    std::vector<uint8_t> block;
    append_metadata_entry(block, e, false);
    block.resize(64);
    FileHeader h;
    h.version = version;
    h.tensor_count = 1;
    h.metadata_length = 64;
    const uint64_t file_size = e.data_offset + 16;
    if (version < kMetaTensorVersion) {
      try {
        parse_metadata(h, block.data(), block.size(), file_size);
        FAIL("a meta tensor in a version " << version << " file was accepted");
      } catch (const tz::Error& err) {
        CHECK(err.code() == tz::Errc::format);
        CHECK(std::string(err.what()).find("cannot hold meta tensors") != std::string::npos);
      }
    } else {
      CHECK(parse_metadata(h, block.data(), block.size(), file_size).at(0).is_meta());
    }
  }
}

TEST_CASE("metadata entries round trip, tagged and untagged") {
  MetadataEntry e;
  e.name = "x.w";
  e.path = decode_path(e.name);
  e.type = TensorType::param;
  e.dtype = parse_dtype("<f4");
  e.shape = {2, 3};
  e.numel = 6;
  e.nbytes = 24;
  e.header_offset = kMetadataOffset + 256;
  e.data_offset = e.header_offset + 100;
  e.data_length = 24;
  for (bool tagged : {false, true}) {
    std::vector<uint8_t> block;
    append_metadata_entry(block, e, tagged);
    block.resize(256);
    FileHeader h;
    h.version = tagged ? 5 : 1;
    h.flags = tagged ? kFlagVersionedMetadata : 0;
    h.tensor_count = 1;
    h.metadata_length = 256;
    const auto parsed = parse_metadata(h, block.data(), block.size(), 10000);
    REQUIRE(parsed.size() == 1);
    CHECK(parsed[0].name == "x.w");
    CHECK(parsed[0].shape == e.shape);
    CHECK(parsed[0].nbytes == 24);
    // Offsets past the end of the file are truncation.
    CHECK_THROWS_AS(parse_metadata(h, block.data(), block.size(), e.data_offset + 10), tz::Error);
  }
}

TEST_CASE("tensor header build and parse agree; hashed bytes zero the values") {
  const uint64_t shape[] = {2, 3};
  HeaderSpec s;
  s.module_index = 7;
  s.type = TensorType::buffer;
  s.name = "a";
  s.dtype = "<f4";
  s.shape = shape;
  s.ndim = 2;
  s.data_length = 24;
  BuiltHeader b = build_tensor_header(s);
  CHECK(b.bytes.size() == 78);  // FORMAT.md §4.9
  std::memset(b.bytes.data() + b.hashes[0].value_offset, 0xAA, 4);
  const TensorHeader h = parse_tensor_header(b.bytes.data(), b.bytes.size(), false, false);
  CHECK(h.module_index == 7);
  CHECK(h.type == TensorType::buffer);
  CHECK(h.shape == std::vector<uint64_t>{2, 3});
  CHECK(h.data_length == 24);
  REQUIRE(h.hashes.size() == 2);
  const auto hashed = hashable_header(b.bytes.data(), b.bytes.size(), h);
  CHECK(hashed.size() == b.bytes.size());
  CHECK(hashed[h.hashes[0].value_offset] == 0);

  // A length that disagrees with the buffer, and an unknown hash type, are errors.
  auto bad = b.bytes;
  store_u64(bad.data(), 77);
  CHECK_THROWS_AS(parse_tensor_header(bad.data(), bad.size(), false, false), tz::Error);
  bad = b.bytes;
  bad[b.hashes[0].value_offset - 2] = 9;
  CHECK_THROWS_AS(parse_tensor_header(bad.data(), bad.size(), false, false), tz::Error);
  // Structured names are only valid on STATE_DICT records.
  s.name = "\x1e[\"a\",0]";
  b = build_tensor_header(s);
  CHECK_THROWS_AS(parse_tensor_header(b.bytes.data(), b.bytes.size(), false, false), tz::Error);
}
