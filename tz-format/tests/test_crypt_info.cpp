#include <catch2/catch.hpp>

#include "tz/format/bytes.hpp"
#include "tz/format/crypt_info.hpp"
#include "tz/format/error.hpp"

using namespace tz::format;

namespace {
tz::Errc parse_error(const std::vector<uint8_t>& body) {
  try {
    parse_crypt_info(body.data(), body.size());
  } catch (const tz::Error& e) {
    return e.code();
  }
  return tz::Errc::internal;
}
}  // namespace

TEST_CASE("crypt_info with a KDF chunk round-trips and matches the observed layout") {
  KdfParams kdf;
  kdf.opslimit = 1;
  kdf.memlimit = 8192;
  kdf.salt.assign(16, 0xAB);
  Nonce nonce{};
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = uint8_t(i);
  size_t mac_offset = 0;
  auto body = build_crypt_info(&kdf, kCryptChunkSize, nonce, 3, &mac_offset);
  // u16 count, KDF chunk (8 + 42), cipher chunk (8 + 42 + 3*16).
  REQUIRE(body.size() == 2 + 50 + 50 + 48);
  REQUIRE(mac_offset == body.size() - 48);
  CHECK(load_u64(body.data() + 2) == 42);
  CHECK(load_u16(body.data() + 10) == 1);  // chunk type: key derivation
  body[mac_offset + 16] = 0x5A;            // second MAC
  const CryptInfo info = parse_crypt_info(body.data(), body.size());
  CHECK(info.chunk_count == 2);
  CHECK(info.cipher_chunks == 1);
  CHECK(info.scheme == CipherScheme::parallel);
  CHECK(info.chunk_size == kCryptChunkSize);
  CHECK(info.nonce == nonce);
  REQUIRE(info.macs.size() == 3);
  CHECK(info.macs[1][0] == 0x5A);
  REQUIRE(info.kdf.size() == 1);
  CHECK(info.kdf[0].opslimit == 1);
  CHECK(info.kdf[0].memlimit == 8192);
  CHECK(info.kdf[0].alg == kPwhashArgon2id13);
  CHECK(info.kdf[0].salt == kdf.salt);
}

TEST_CASE("random-key crypt_info is 60 + 16m bytes with its prefix") {
  const auto body = build_crypt_info(nullptr, kCryptChunkSize, Nonce{}, 1, nullptr);
  CHECK(8 + body.size() == 60 + 16);
  CHECK(parse_crypt_info(body.data(), body.size()).kdf.empty());
}

TEST_CASE("an empty crypt_info means the tensor is in the clear") {
  const auto body = empty_crypt_info();
  const CryptInfo info = parse_crypt_info(body.data(), body.size());
  CHECK_FALSE(info.encrypted());
  CHECK(info.scheme == CipherScheme::none);
}

TEST_CASE("sequential (type 3) crypt_info is read") {
  std::vector<uint8_t> body;
  ByteWriter w(body);
  w.u16(1);
  w.u64(2 + 24 + 16);
  w.u16(3);
  w.zeros(24 + 16);
  const CryptInfo info = parse_crypt_info(body.data(), body.size());
  CHECK(info.scheme == CipherScheme::sequential);
  CHECK(info.macs.size() == 1);
}

TEST_CASE("malformed crypt_info is a crypto error") {
  const auto good = build_crypt_info(nullptr, kCryptChunkSize, Nonce{}, 2, nullptr);
  SECTION("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) {
      std::vector<uint8_t> cut(good.begin(), good.begin() + long(n));
      CHECK(parse_error(cut) == tz::Errc::crypto);
    }
  }
  SECTION("chunk sizes") {
    for (uint64_t size : {uint64_t(0), uint64_t(960), uint64_t(1000), uint64_t(1024 + 32)}) {
      auto b = build_crypt_info(nullptr, size, Nonce{}, 1, nullptr);
      CHECK(parse_error(b) == tz::Errc::crypto);
    }
    auto ok = build_crypt_info(nullptr, 1024, Nonce{}, 1, nullptr);
    CHECK(parse_crypt_info(ok.data(), ok.size()).chunk_size == 1024);
  }
  SECTION("unknown chunk type and KDF method") {
    auto b = good;
    store_u16(b.data() + 10, 7);
    CHECK(parse_error(b) == tz::Errc::crypto);
    KdfParams kdf;
    kdf.salt.assign(16, 0);
    auto k = build_crypt_info(&kdf, kCryptChunkSize, Nonce{}, 1, nullptr);
    store_u16(k.data() + 12, 9);
    CHECK(parse_error(k) == tz::Errc::crypto);
  }
  SECTION("a MAC count beyond the chunk") {
    auto b = good;
    store_u64(b.data() + 2 + 8 + 2 + 8 + 24, uint64_t(1) << 60);
    CHECK(parse_error(b) == tz::Errc::crypto);
  }
  SECTION("a chunk length beyond the block") {
    auto b = good;
    store_u64(b.data() + 2, good.size());
    CHECK(parse_error(b) == tz::Errc::crypto);
  }
}
