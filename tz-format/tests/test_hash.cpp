#include <catch2/catch.hpp>

#include "tz/format/hash.hpp"

#include "../src/hash_internal.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using tz::format::crc32_combine;
using tz::format::crc32_update;
using tz::format::Sha256;

std::string to_hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

std::array<uint8_t, 32> sha256_oneshot(const void* p, size_t n) {
  Sha256 h;
  h.update(p, n);
  return h.finish();
}

std::string sha256_hex(const std::string& s) { return to_hex(sha256_oneshot(s.data(), s.size())); }

// Reference SHA-256 driver over an explicit compression function; padding is
// done independently of tz::format::Sha256 so that both get cross-checked.
std::array<uint8_t, 32> sha256_with(tz::format::detail::Sha256BlocksFn blocks, const uint8_t* p,
                                    size_t n) {
  uint32_t st[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const size_t full = n / 64;
  if (full) blocks(st, p, full);
  std::vector<uint8_t> tail(p + full * 64, p + n);
  tail.push_back(0x80);
  while (tail.size() % 64 != 56) tail.push_back(0);
  const uint64_t bits = static_cast<uint64_t>(n) * 8;
  for (int i = 7; i >= 0; --i) tail.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  blocks(st, tail.data(), tail.size() / 64);
  std::array<uint8_t, 32> out{};
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(st[i] >> (24 - 8 * j));
  return out;
}

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// 1 MiB deterministic buffer: byte i = (uint32_t(i * 2654435761) >> 24).
std::vector<uint8_t> mib_buffer() {
  std::vector<uint8_t> v(1u << 20);
  for (uint32_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
  return v;
}

// Bitwise CRC-32, the slowest and most obviously correct form.
uint32_t crc32_bitwise(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

}  // namespace

TEST_CASE("impl names are reported", "[hash]") {
  const std::string sha = tz::format::sha256_impl_name();
  const std::string crc = tz::format::crc32_impl_name();
  CHECK((sha == "sha-ni" || sha == "portable"));
  CHECK((crc == "pclmul" || crc == "slice16"));
  CHECK((sha == "sha-ni") == (tz::format::detail::sha256_accel_blocks() != nullptr));
  CHECK((crc == "pclmul") == (tz::format::detail::crc32_accel() != nullptr));
}

TEST_CASE("sha256 known answers", "[hash][sha256]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
                   "nopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");

  const std::string million(1000000, 'a');
  const char* want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  CHECK(sha256_hex(million) == want);
  Sha256 h;
  for (int i = 0; i < 1000000; i += 1000) h.update(million.data() + i, 1000);
  CHECK(to_hex(h.finish()) == want);
  for (int i = 0; i < 1000000; ++i) h.update("a", 1);
  CHECK(to_hex(h.finish()) == want);

  // Every implementation, through the reference padding driver.
  const auto* m = reinterpret_cast<const uint8_t*>(million.data());
  CHECK(to_hex(sha256_with(&tz::format::detail::sha256_portable_blocks, m, million.size())) == want);
  if (auto accel = tz::format::detail::sha256_accel_blocks())
    CHECK(to_hex(sha256_with(accel, m, million.size())) == want);
}

TEST_CASE("sha256 padding boundaries", "[hash][sha256]") {
  // Lengths around the 55/56/64 byte padding edges, via both drivers.
  std::mt19937_64 rng(7);
  for (size_t n = 0; n <= 200; ++n) {
    const auto data = random_bytes(rng, n);
    const auto want = sha256_with(&tz::format::detail::sha256_portable_blocks, data.data(), n);
    REQUIRE(sha256_oneshot(data.data(), n) == want);
  }
}

TEST_CASE("sha256 reset and reuse", "[hash][sha256]") {
  Sha256 h;
  h.update("garbage", 7);
  h.reset();
  h.update("abc", 3);
  CHECK(to_hex(h.finish()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // finish() leaves the object ready for a new message.
  CHECK(to_hex(h.finish()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  h.update(nullptr, 0);
  h.update("abc", 3);
  CHECK(to_hex(h.finish()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("sha256 incremental equals one-shot", "[hash][sha256]") {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t n = rng() % 10001;
    const auto data = random_bytes(rng, n);
    const auto want = sha256_oneshot(data.data(), n);

    Sha256 h;
    size_t pos = 0;
    while (pos < n) {
      // Mix of tiny and large pieces.
      const size_t max_piece = (rng() & 1) ? 70 : n;
      const size_t piece = std::min<size_t>(n - pos, rng() % (max_piece + 1));
      h.update(data.data() + pos, piece);
      pos += piece;
    }
    REQUIRE(h.finish() == want);
    REQUIRE(sha256_with(&tz::format::detail::sha256_portable_blocks, data.data(), n) == want);
  }
}

TEST_CASE("sha256 accelerated vs portable blocks", "[hash][sha256]") {
  auto accel = tz::format::detail::sha256_accel_blocks();
  if (!accel) {
    WARN("no accelerated SHA-256 on this CPU/build; skipping");
    return;
  }
  std::mt19937_64 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t nblocks = rng() % 40;
    const size_t offset = rng() % 16;  // unaligned inputs
    const auto buf = random_bytes(rng, nblocks * 64 + offset);
    uint32_t s1[8], s2[8];
    for (int i = 0; i < 8; ++i) s1[i] = s2[i] = static_cast<uint32_t>(rng());
    tz::format::detail::sha256_portable_blocks(s1, buf.data() + offset, nblocks);
    accel(s2, buf.data() + offset, nblocks);
    REQUIRE(std::memcmp(s1, s2, sizeof(s1)) == 0);
  }
}

TEST_CASE("crc32 known answers", "[hash][crc32]") {
  CHECK(crc32_update(0, "", 0) == 0u);
  CHECK(crc32_update(0, nullptr, 0) == 0u);
  CHECK(crc32_update(0x12345678u, nullptr, 0) == 0x12345678u);
  CHECK(crc32_update(0, "123456789", 9) == 0xCBF43926u);
  CHECK(crc32_update(0, "The quick brown fox jumps over the lazy dog", 43) == 0x414FA339u);
  CHECK(tz::format::detail::crc32_portable(0, "123456789", 9) == 0xCBF43926u);
  if (auto accel = tz::format::detail::crc32_accel()) CHECK(accel(0, "123456789", 9) == 0xCBF43926u);
}

TEST_CASE("crc32 implementations agree on random data", "[hash][crc32]") {
  using tz::format::detail::crc32_portable;
  auto accel = tz::format::detail::crc32_accel();
  std::mt19937_64 rng(2024);
  const auto buf = random_bytes(rng, 10000 + 64);
  for (int iter = 0; iter < 2000; ++iter) {
    // Bias towards short lengths where the fold/tail code paths switch over.
    const size_t n = (iter % 2) ? rng() % 300 : rng() % 10001;
    const size_t offset = rng() % 64;
    const uint32_t init = (iter % 3) ? static_cast<uint32_t>(rng()) : 0u;
    const uint8_t* p = buf.data() + offset;
    const uint32_t want = crc32_bitwise(init, p, n);
    REQUIRE(crc32_portable(init, p, n) == want);
    REQUIRE(crc32_update(init, p, n) == want);
    if (accel) REQUIRE(accel(init, p, n) == want);
  }
}

TEST_CASE("crc32 incremental equals one-shot", "[hash][crc32]") {
  std::mt19937_64 rng(555);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t n = rng() % 10001;
    const auto data = random_bytes(rng, n);
    const uint32_t want = crc32_update(0, data.data(), n);
    uint32_t c = 0, cp = 0;
    size_t pos = 0;
    while (pos < n) {
      const size_t max_piece = (rng() & 1) ? 200 : n;
      const size_t piece = std::min<size_t>(n - pos, rng() % (max_piece + 1));
      c = crc32_update(c, data.data() + pos, piece);
      cp = tz::format::detail::crc32_portable(cp, data.data() + pos, piece);
      pos += piece;
    }
    REQUIRE(c == want);
    REQUIRE(cp == want);
  }
}

TEST_CASE("crc32 unaligned buffers", "[hash][crc32][sha256]") {
  std::mt19937_64 rng(31337);
  const auto src = random_bytes(rng, 4099);
  const uint32_t want_crc = crc32_update(0, src.data(), src.size());
  const auto want_sha = sha256_oneshot(src.data(), src.size());
  std::vector<uint8_t> buf(src.size() + 64);
  for (size_t off = 0; off < 64; ++off) {
    std::memcpy(buf.data() + off, src.data(), src.size());
    REQUIRE(crc32_update(0, buf.data() + off, src.size()) == want_crc);
    REQUIRE(sha256_oneshot(buf.data() + off, src.size()) == want_sha);
  }
}

TEST_CASE("crc32_combine", "[hash][crc32]") {
  std::mt19937_64 rng(4242);
  for (int iter = 0; iter < 500; ++iter) {
    const size_t n = rng() % 10001;
    const size_t split = n ? rng() % (n + 1) : 0;
    const auto data = random_bytes(rng, n);
    const uint32_t a = crc32_update(0, data.data(), split);
    const uint32_t b = crc32_update(0, data.data() + split, n - split);
    REQUIRE(crc32_combine(a, b, n - split) == crc32_update(0, data.data(), n));
  }
  // Degenerate lengths.
  CHECK(crc32_combine(0xDEADBEEFu, 0, 0) == 0xDEADBEEFu);
  CHECK(crc32_combine(0, 0xCBF43926u, 9) == 0xCBF43926u);

  // Large zero run computed directly vs combined.
  const std::vector<uint8_t> zeros(1u << 20, 0);
  const uint32_t head = crc32_update(0, "123456789", 9);
  const uint32_t z = crc32_update(0, zeros.data(), zeros.size());
  CHECK(crc32_combine(head, z, zeros.size()) == crc32_update(head, zeros.data(), zeros.size()));

  // Associativity with huge (never materialised) lengths.
  for (int iter = 0; iter < 200; ++iter) {
    const uint32_t a = static_cast<uint32_t>(rng()), b = static_cast<uint32_t>(rng()),
                   c = static_cast<uint32_t>(rng());
    const uint64_t lb = rng() >> (rng() % 64), lc = rng() >> (1 + rng() % 63);
    REQUIRE(crc32_combine(crc32_combine(a, b, lb), c, lc) == crc32_combine(a, crc32_combine(b, c, lc), lb + lc));
  }
}

TEST_CASE("1 MiB deterministic buffer matches python zlib/hashlib", "[hash][crc32][sha256]") {
  // Expected values from:
  //   b = bytes((((i*2654435761) & 0xFFFFFFFF) >> 24) for i in range(1<<20))
  //   zlib.crc32(b), hashlib.sha256(b).hexdigest()
  const auto buf = mib_buffer();
  const char* want_sha = "ca6073392ee71dbd1a2d356c3caa233f8f828ae17f8f8ba8570ee3491be128ab";
  const uint32_t want_crc = 0x158987c5u;

  CHECK(crc32_update(0, buf.data(), buf.size()) == want_crc);
  CHECK(tz::format::detail::crc32_portable(0, buf.data(), buf.size()) == want_crc);
  if (auto accel = tz::format::detail::crc32_accel()) CHECK(accel(0, buf.data(), buf.size()) == want_crc);

  // zlib.crc32(b[:12345]) == 0x6665b130, zlib.crc32(b[12345:]) == 0x103ad752
  CHECK(crc32_update(0, buf.data(), 12345) == 0x6665b130u);
  CHECK(crc32_update(0, buf.data() + 12345, buf.size() - 12345) == 0x103ad752u);
  CHECK(crc32_combine(0x6665b130u, 0x103ad752u, buf.size() - 12345) == want_crc);

  CHECK(to_hex(sha256_oneshot(buf.data(), buf.size())) == want_sha);
  CHECK(to_hex(sha256_with(&tz::format::detail::sha256_portable_blocks, buf.data(), buf.size())) == want_sha);
  if (auto accel = tz::format::detail::sha256_accel_blocks())
    CHECK(to_hex(sha256_with(accel, buf.data(), buf.size())) == want_sha);
}
