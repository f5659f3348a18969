// Encryption through the C ABI: round trips, upstream's vectors, tampering
// and key handling.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "tensorizer.h"
#include "tz/format/hash.hpp"
#include "tz/format/hex.hpp"

using namespace tz_test;

namespace {

const char* kVectorKeyHex = "f6557a6dfe75ee066b30fcd911cb0db5c67dc4ba0a18fe6e7cc76b9d19c43139";

std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(uint8_t(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

std::string sha256_hex(const void* p, size_t n) {
  tz::format::Sha256 sha;
  sha.update(p, n);
  const auto d = sha.finish();
  return tz::format::to_hex(d.data(), d.size());
}

struct Key {
  tz_key* k = nullptr;
  ~Key() { tz_key_free(k); }
};

struct Opts {
  tz_options* o = nullptr;
  Opts() { REQUIRE(tz_options_new(&o) == TZ_OK); }
  ~Opts() { tz_options_free(o); }
};

struct Reader {
  tz_reader* r = nullptr;
  ~Reader() { tz_reader_free(r); }
};

int open_with(Reader& r, const std::string& path, const tz_key* key) {
  Opts o;
  REQUIRE(tz_options_set_key(o.o, key) == TZ_OK);
  return tz_reader_open(&r.r, path.c_str(), o.o);
}

// Reads every tensor of an open reader; returns the status of the batch.
int read_all(tz_reader* r, std::vector<std::vector<uint8_t>>& out, uint32_t flags) {
  uint64_t n = 0;
  REQUIRE(tz_reader_tensor_count(&n, r) == TZ_OK);
  out.assign(size_t(n), {});
  std::vector<tz_read_request> reqs(static_cast<size_t>(n));
  for (uint64_t i = 0; i < n; ++i) {
    tz_tensor_info info = TZ_TENSOR_INFO_INIT;
    REQUIRE(tz_reader_tensor_info(&info, r, i) == TZ_OK);
    out[size_t(i)].assign(size_t(info.nbytes), 0xEE);
    reqs[size_t(i)] = {TZ_READ_REQUEST_VERSION, i, out[size_t(i)].data(), info.nbytes};
  }
  return tz_reader_read_batch(r, reqs.data(), reqs.size(), flags, 0, nullptr);
}

// Writes tensors of the given sizes (bytes, "|u1") with pattern data.
std::vector<std::vector<uint8_t>> write_sized(const std::string& path, const tz_key* key, const char* chunk_size,
                                              const std::vector<uint64_t>& sizes, bool with_meta) {
  Opts o;
  REQUIRE(tz_options_set_key(o.o, key) == TZ_OK);
  if (chunk_size) REQUIRE(tz_options_set(o.o, "crypt_chunk_size", chunk_size) == TZ_OK);
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), o.o) == TZ_OK);
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<uint64_t>> shapes;
  std::vector<std::string> names;
  for (size_t i = 0; i < sizes.size(); ++i) {
    data.emplace_back(size_t(sizes[i]));
    for (size_t b = 0; b < data.back().size(); ++b) data.back()[b] = uint8_t(b * 131 + i * 7 + (b >> 10));
    shapes.push_back({sizes[i]});
    names.push_back("t" + std::to_string(i));
  }
  std::vector<tz_tensor_desc> d;
  for (size_t i = 0; i < sizes.size(); ++i) d.push_back(desc(names[i], "|u1", 3, shapes[i], data[i].data(), sizes[i]));
  std::vector<uint64_t> meta_shape{4};
  const std::string meta_name = "meta";
  if (with_meta) {
    d.push_back(desc(meta_name, "<f4", 3, meta_shape, nullptr, 0));
    d.back().is_meta = 1;
    data.emplace_back(16, 0);
  }
  REQUIRE(tz_writer_write(w, d.data(), d.size(), 0) == TZ_OK);
  REQUIRE(tz_writer_close(w) == TZ_OK);
  tz_writer_free(w);
  return data;
}

}  // namespace

TEST_CASE("encrypted round trip across box boundaries, with meta and empty tensors") {
  const std::string path = temp_path("enc_rt.tensors");
  Key key;
  REQUIRE(tz_key_new_random(&key.k) == TZ_OK);
  // With 1 KiB boxes: exactly one box, one byte over, several, empty, and one
  // large enough (20 MiB) that reads split it between threads.
  const std::vector<uint64_t> sizes{1024, 1025, 5 * 1024 + 3, 0, 7, uint64_t(20) << 20};
  const auto expected = write_sized(path, key.k, "1024", sizes, true);

  Reader r;
  REQUIRE(open_with(r, path, key.k) == TZ_OK);
  tz_file_info fi = TZ_FILE_INFO_INIT;
  REQUIRE(tz_reader_file_info(&fi, r.r) == TZ_OK);
  CHECK(fi.data_version == 4);  // a meta tensor in an encrypted file: v4 with the flag
  CHECK(fi.flags == 1);
  CHECK(fi.encrypted == 1);
  for (uint32_t flags : {TZ_READ_VERIFY_HASH, TZ_READ_NO_VERIFY_HASH}) {
    std::vector<std::vector<uint8_t>> got;
    REQUIRE(read_all(r.r, got, flags) == TZ_OK);
    CHECK(got == expected);
  }
  // Header sizes: encrypted tensors carry SHA-256 only and 60 + 16m bytes of crypt_info.
  tz_tensor_info info = TZ_TENSOR_INFO_INIT;
  REQUIRE(tz_reader_tensor_info(&info, r.r, 1) == TZ_OK);  // 1025 bytes: 2 boxes
  const uint64_t fixed = 8 + 2 + 1 + 2 + 2 + 1 + 3 + 1 + 4 + 2 + 1 + 34 + 8;
  CHECK(info.data_offset - info.header_offset == fixed + 60 + 2 * 16);
  REQUIRE(tz_reader_tensor_info(&info, r.r, 3) == TZ_OK);  // empty: in the clear, both hashes
  CHECK(info.data_offset - info.header_offset == fixed + 6 + 10);
  std::remove(path.c_str());
}

TEST_CASE("upstream's encrypted vectors decrypt to their manifest") {
  const std::string dir = TZ_VECTORS_DIR;
  const auto raw = unhex(kVectorKeyHex);
  Key key;
  REQUIRE(tz_key_new_from_bytes(&key.k, raw.data(), raw.size()) == TZ_OK);
  Key pw;
  const std::string password = "tensorizer public vectors";
  REQUIRE(tz_key_new_password(&pw.k, password.data(), password.size()) == TZ_OK);
  struct Case {
    const char* file;
    const tz_key* key;
    std::vector<std::string> sha;
  };
  const Case cases[] = {
      {"enc_random.tensors", key.k,
       {"5e26489551d24313c76840257dd9f64901b5ce38f2c1a0a91dc483f060feba48",
        "5f6e85e324f9cab0aa4b6ef60b697b62ba86509e7d329e7b95cad44039db7eb7"}},
      {"enc_password.tensors", pw.k, {"53c1bf6b9fe9a22f6824d7eaf8bd46843d2bc8dd26b7391f2acd6c2b084dcb9b"}},
      {"big_enc.tensors", key.k, {"8ace1b37a6c26428208b08af64b4bf65be3d30cddee0c5c434d2afd10e02dd55"}},
  };
  for (const auto& c : cases) {
    INFO(c.file);
    Reader r;
    REQUIRE(open_with(r, dir + "/" + c.file, c.key) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    REQUIRE(read_all(r.r, got, TZ_READ_VERIFY_HASH) == TZ_OK);
    std::vector<std::string> sha;
    for (const auto& t : got) sha.push_back(sha256_hex(t.data(), t.size()));
    std::sort(sha.begin(), sha.end());
    auto want = c.sha;
    std::sort(want.begin(), want.end());
    CHECK(sha == want);
  }
}

TEST_CASE("wrong keys and altered data fail with one crypto error and no data") {
  const std::string path = temp_path("enc_bad.tensors");
  const auto raw = unhex(kVectorKeyHex);
  Key key;
  REQUIRE(tz_key_new_from_bytes(&key.k, raw.data(), raw.size()) == TZ_OK);
  write_sized(path, key.k, "1024", {4096}, false);
  const auto good = slurp(path);

  Reader probe;
  REQUIRE(open_with(probe, path, key.k) == TZ_OK);
  tz_tensor_info info = TZ_TENSOR_INFO_INIT;
  REQUIRE(tz_reader_tensor_info(&info, probe.r, 0) == TZ_OK);
  const size_t data_at = size_t(info.data_offset);
  const size_t mac0 = data_at - 8 - 4 * 16;  // the four MACs end right before the data length

  auto expect_crypto_failure = [&](const std::vector<uint8_t>& bytes, const tz_key* k) {
    spit(path, bytes);
    Reader r;
    REQUIRE(open_with(r, path, k) == TZ_OK);
    for (uint32_t flags : {TZ_READ_VERIFY_HASH, TZ_READ_NO_VERIFY_HASH}) {
      std::vector<std::vector<uint8_t>> got;
      CHECK(read_all(r.r, got, flags) == TZ_E_CRYPTO);
      const std::string msg = tz_error_last();
      CHECK(msg.find("decryption failed") != std::string::npos);
      CHECK(msg.find("f6557a6d") == std::string::npos);
      CHECK(got[0] == std::vector<uint8_t>(4096, 0));  // nothing unauthenticated is handed back
    }
  };
  SECTION("wrong key") {
    auto bad = raw;
    bad[31] ^= 0x80;
    Key wrong;
    REQUIRE(tz_key_new_from_bytes(&wrong.k, bad.data(), bad.size()) == TZ_OK);
    expect_crypto_failure(good, wrong.k);
  }
  SECTION("one flipped ciphertext bit") {
    auto bytes = good;
    bytes[data_at + 3000] ^= 0x04;
    expect_crypto_failure(bytes, key.k);
  }
  SECTION("two MACs swapped") {
    auto bytes = good;
    std::swap_ranges(bytes.begin() + long(mac0), bytes.begin() + long(mac0 + 16), bytes.begin() + long(mac0 + 16));
    expect_crypto_failure(bytes, key.k);
  }
  SECTION("two boxes swapped") {
    auto bytes = good;
    std::swap_ranges(bytes.begin() + long(data_at), bytes.begin() + long(data_at + 1024),
                     bytes.begin() + long(data_at + 1024));
    expect_crypto_failure(bytes, key.k);
  }
  SECTION("a truncated crypt_info block") {
    auto bytes = good;
    const size_t crypt_at = size_t(info.header_offset) + 8 + 2 + 1 + 2 + 2 + 1 + 3 + 1 + 4 + 2 + 1 + 34;
    bytes[crypt_at] = uint8_t(bytes[crypt_at] - 16);  // claims one MAC fewer than it holds
    spit(path, bytes);
    Reader r;
    REQUIRE(open_with(r, path, key.k) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    CHECK(read_all(r.r, got, 0) == TZ_E_CRYPTO);
  }
  std::remove(path.c_str());
}

TEST_CASE("passwords: derive, read back, and upstream's mismatch rules") {
  const std::string path = temp_path("enc_pw.tensors");
  const std::string password = "hunter2";
  const uint8_t salt[16] = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'};
  Key derived;
  REQUIRE(tz_key_new_derived(&derived.k, password.data(), password.size(), TZ_OPSLIMIT_MIN, TZ_MEMLIMIT_MIN, salt,
                             16) == TZ_OK);
  uint8_t kb[32], sb[16];
  REQUIRE(tz_key_get_bytes(kb, sizeof kb, derived.k) == TZ_OK);
  CHECK(sha256_hex(kb, 0).size() == 64);
  CHECK(unhex("5f61a8c05708063a9a3a44fd63189f0169304a4e5cd1dbedbca1cb91c7d30494") == std::vector<uint8_t>(kb, kb + 32));
  REQUIRE(tz_key_get_salt(sb, sizeof sb, derived.k) == TZ_OK);
  CHECK(std::memcmp(sb, salt, 16) == 0);
  const auto expected = write_sized(path, derived.k, nullptr, {100, 3000}, false);

  Key pw;
  REQUIRE(tz_key_new_password(&pw.k, password.data(), password.size()) == TZ_OK);
  CHECK(tz_key_get_bytes(kb, sizeof kb, pw.k) == TZ_E_STATE);
  CHECK(tz_key_get_salt(sb, sizeof sb, pw.k) == TZ_E_NOT_FOUND);
  {
    Reader r;
    REQUIRE(open_with(r, path, pw.k) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    REQUIRE(read_all(r.r, got, TZ_READ_VERIFY_HASH) == TZ_OK);
    CHECK(got == expected);
  }
  {
    // The derived key itself reads the file too, like upstream's from_key.
    Reader r;
    REQUIRE(open_with(r, path, derived.k) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    REQUIRE(read_all(r.r, got, 0) == TZ_OK);
    CHECK(got == expected);
  }
  {
    Key wrong;
    REQUIRE(tz_key_new_password(&wrong.k, "hunter3", 7) == TZ_OK);
    Reader r;
    REQUIRE(open_with(r, path, wrong.k) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    CHECK(read_all(r.r, got, 0) == TZ_E_CRYPTO);
    CHECK(std::string(tz_error_last()).find("hunter") == std::string::npos);
  }
  {
    // A file that asks for more work than the reader allows is refused, not derived.
    Opts o;
    REQUIRE(tz_options_set_key(o.o, pw.k) == TZ_OK);
    REQUIRE(tz_options_set(o.o, "kdf_max_memlimit", "8192") == TZ_OK);
    const std::string costly = temp_path("enc_costly.tensors");
    Key heavy;
    REQUIRE(tz_key_new_derived(&heavy.k, password.data(), password.size(), 1, 16384, nullptr, 0) == TZ_OK);
    write_sized(costly, heavy.k, nullptr, {10}, false);
    Reader r;
    REQUIRE(tz_reader_open(&r.r, costly.c_str(), o.o) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    CHECK(read_all(r.r, got, 0) == TZ_E_LIMIT);
    std::remove(costly.c_str());
  }
  {
    // A password on a file encrypted with a plain key.
    const std::string plain_key_file = temp_path("enc_plainkey.tensors");
    Key random;
    REQUIRE(tz_key_new_random(&random.k) == TZ_OK);
    write_sized(plain_key_file, random.k, nullptr, {10}, false);
    Reader r;
    REQUIRE(open_with(r, plain_key_file, pw.k) == TZ_OK);
    std::vector<std::vector<uint8_t>> got;
    CHECK(read_all(r.r, got, 0) == TZ_E_CRYPTO);
    CHECK(std::string(tz_error_last()).find("Source string was provided") != std::string::npos);
    std::remove(plain_key_file.c_str());
  }
  {
    // Writers need a key, not just a password.
    Opts o;
    REQUIRE(tz_options_set_key(o.o, pw.k) == TZ_OK);
    tz_writer* w = nullptr;
    // ...and refusing one leaves an existing file alone.
    const std::string existing = temp_path("existing.tensors");
    spit(existing, {1, 2, 3});
    CHECK(tz_writer_open(&w, existing.c_str(), o.o) == TZ_E_INVALID_ARG);
    CHECK(w == nullptr);
    CHECK(slurp(existing) == std::vector<uint8_t>{1, 2, 3});
    std::remove(existing.c_str());
  }
  std::remove(path.c_str());
}

TEST_CASE("file-level mismatches between keys and files") {
  const std::string dir = TZ_VECTORS_DIR;
  Key key;
  REQUIRE(tz_key_new_random(&key.k) == TZ_OK);
  {
    Reader r;
    CHECK(open_with(r, dir + "/v1_plain.tensors", key.k) == TZ_E_CRYPTO);
    CHECK(std::string(tz_error_last()).find("predates encryption") != std::string::npos);
  }
  {
    Reader r;
    CHECK(open_with(r, dir + "/v4_meta.tensors", key.k) == TZ_E_CRYPTO);
    CHECK(std::string(tz_error_last()).find("not flagged as encrypted") != std::string::npos);
  }
  {
    Reader r;
    CHECK(tz_reader_open(&r.r, (dir + "/enc_random.tensors").c_str(), nullptr) == TZ_E_CRYPTO);
    CHECK(std::string(tz_error_last()) == "Tensor is encrypted, but decryption was not requested");
  }
}

TEST_CASE("metadata_only lists an encrypted file without a key and reads none of its data") {
  const std::string path = temp_path("meta_only.tensors");
  Key key;
  REQUIRE(tz_key_new_random(&key.k) == TZ_OK);
  write_sized(path, key.k, nullptr, {5000, 0}, true);
  Opts o;
  REQUIRE(tz_options_set(o.o, "metadata_only", "1") == TZ_OK);
  Reader r;
  REQUIRE(tz_reader_open(&r.r, path.c_str(), o.o) == TZ_OK);
  tz_file_info file = TZ_FILE_INFO_INIT;
  REQUIRE(tz_reader_file_info(&file, r.r) == TZ_OK);
  CHECK(file.encrypted == 1);
  uint64_t n = 0;
  REQUIRE(tz_reader_tensor_count(&n, r.r) == TZ_OK);
  REQUIRE(n == 3);
  tz_tensor_info info = TZ_TENSOR_INFO_INIT;
  REQUIRE(tz_reader_tensor_info(&info, r.r, 0) == TZ_OK);
  CHECK(info.nbytes == 5000);
  // Tensor headers are in the clear, so loading them needs no key.
  CHECK(tz_reader_load_headers(r.r, nullptr, 0) == TZ_OK);

  std::vector<uint8_t> dst(5000, 0xEE);
  CHECK(tz_reader_read(r.r, 0, dst.data(), dst.size(), 0) == TZ_E_CRYPTO);
  CHECK(std::string(tz_error_last()) == "Tensor is encrypted, but decryption was not requested");
  CHECK(std::all_of(dst.begin(), dst.end(), [](uint8_t b) { return b == 0xEE; }));
  // Tensors without data (empty, meta) hold no ciphertext: they still read.
  uint8_t none = 0;
  CHECK(tz_reader_read(r.r, 1, &none, 0, 0) == TZ_OK);
  std::vector<uint8_t> zeros(16, 0xEE);
  CHECK(tz_reader_read(r.r, 2, zeros.data(), zeros.size(), TZ_READ_VERIFY_HASH) == TZ_OK);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](uint8_t b) { return b == 0; }));
  std::remove(path.c_str());
}

TEST_CASE("key handles check their arguments") {
  tz_key* k = nullptr;
  const uint8_t bytes[33] = {0};
  CHECK(tz_key_new_from_bytes(&k, bytes, 31) == TZ_E_INVALID_ARG);
  CHECK(tz_key_new_from_bytes(&k, bytes, 33) == TZ_E_INVALID_ARG);
  CHECK(tz_key_new_password(&k, "", 0) == TZ_E_INVALID_ARG);
  CHECK(tz_key_new_derived(&k, "pw", 2, 0, TZ_MEMLIMIT_MIN, nullptr, 0) == TZ_E_INVALID_ARG);
  CHECK(tz_key_new_derived(&k, "pw", 2, 1, 1024, nullptr, 0) == TZ_E_INVALID_ARG);
  CHECK(tz_key_new_derived(&k, "pw", 2, 1, TZ_MEMLIMIT_MIN, bytes, 15) == TZ_E_INVALID_ARG);
  CHECK(k == nullptr);
  REQUIRE(tz_key_new_from_bytes(&k, bytes, 32) == TZ_OK);
  uint8_t out[32];
  CHECK(tz_key_get_bytes(out, 31, k) == TZ_E_INVALID_ARG);
  tz_key_free(k);
  tz_key_free(nullptr);
  tz_options* o = nullptr;
  REQUIRE(tz_options_new(&o) == TZ_OK);
  CHECK(tz_options_set(o, "crypt_chunk_size", "1000") == TZ_E_INVALID_ARG);
  CHECK(tz_options_set(o, "crypt_chunk_size", "1040") == TZ_OK);  // range-checked here, the quantum at open
  tz_writer* w = nullptr;
  REQUIRE(tz_key_new_random(&k) == TZ_OK);
  REQUIRE(tz_options_set_key(o, k) == TZ_OK);
  tz_key_free(k);  // options keep their own reference
  const std::string never = temp_path("bad_chunk.tensors");
  CHECK(tz_writer_open(&w, never.c_str(), o) == TZ_E_INVALID_ARG);
  CHECK(slurp(never).empty());
  CHECK(access(never.c_str(), F_OK) != 0);  // not even created
  tz_options_free(o);
}
