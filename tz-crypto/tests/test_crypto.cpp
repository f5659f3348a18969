#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "tz/crypto/key.hpp"
#include "tz/crypto/secretbox.hpp"
#include "tz/format/container.hpp"
#include "tz/format/error.hpp"
#include "tz/format/hash.hpp"
#include "tz/format/hex.hpp"

using namespace tz;
using namespace tz::crypto;

namespace {


std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(uint8_t(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<uint8_t> slurp(const std::string& name) {
  std::ifstream f(std::string(TZ_VECTORS_DIR) + "/" + name, std::ios::binary);
  REQUIRE(f.good());
  return {std::istreambuf_iterator<char>(f), {}};
}

// One tensor of an upstream-written encrypted vector: its crypt_info and ciphertext.
struct Found {
  format::CryptInfo info;
  std::vector<uint8_t> data;
};

Found find_tensor(const std::vector<uint8_t>& file, const std::string& name) {
  const auto header = format::parse_file_header(file.data(), file.size());
  const auto entries = format::parse_metadata(header, file.data() + format::kMetadataOffset,
                                              size_t(header.metadata_length), file.size());
  for (const auto& e : entries) {
    if (e.name != name) continue;
    const uint8_t* hb = file.data() + e.header_offset;
    const auto th = format::parse_tensor_header(hb, size_t(e.header_length()), e.long_dims, header.has_crypt_info());
    Found f;
    f.info = format::parse_crypt_info(hb + th.crypt_info_offset + 8, th.crypt_info_size - 8);
    f.data.assign(file.begin() + long(e.data_offset), file.begin() + long(e.data_offset + e.data_length));
    return f;
  }
  FAIL("tensor not found: " << name);
  return {};
}

std::string sha256_hex(const std::vector<uint8_t>& data) {
  format::Sha256 sha;
  sha.update(data.data(), data.size());
  const auto d = sha.finish();
  return format::to_hex(d.data(), d.size());
}

}  // namespace

TEST_CASE("Argon2id known answer (FORMAT.md 6.4)") {
  format::KdfParams p;
  p.opslimit = 1;
  p.memlimit = 8192;
  const char* salt = "0123456789abcdef";
  p.salt.assign(salt, salt + 16);
  const auto key = derive_key(reinterpret_cast<const uint8_t*>("hunter2"), 7, p);
  CHECK(format::to_hex(key->data(), key->size()) == "5f61a8c05708063a9a3a44fd63189f0169304a4e5cd1dbedbca1cb91c7d30494");
  auto m = KeyMaterial::derive("hunter2", 7, 1, 8192, reinterpret_cast<const uint8_t*>(salt), 16);
  CHECK(format::to_hex(m->key().data(), 32) == "5f61a8c05708063a9a3a44fd63189f0169304a4e5cd1dbedbca1cb91c7d30494");
  REQUIRE(m->kdf());
  CHECK(m->kdf()->salt == p.salt);
}

TEST_CASE("one chunk of an upstream file decrypts (known answer)") {
  const auto file = slurp("enc_random.tensors");
  Found b = find_tensor(file, "b");
  REQUIRE(b.info.scheme == format::CipherScheme::parallel);
  REQUIRE(b.info.macs.size() == 1);
  const auto key = unhex("f6557a6dfe75ee066b30fcd911cb0db5c67dc4ba0a18fe6e7cc76b9d19c43139");
  const SecretBytes k(key.data(), key.size());
  REQUIRE(open_in_place(b.data.data(), b.data.size(), b.info.macs[0], b.info.nonce, k));
  CHECK(sha256_hex(b.data) == "5e26489551d24313c76840257dd9f64901b5ce38f2c1a0a91dc483f060feba48");

  SECTION("sealing the plaintext again with the same nonce gives the stored bytes and MAC") {
    const Found again = find_tensor(file, "b");
    std::vector<uint8_t> out(b.data.size());
    format::Mac mac;
    seal(out.data(), mac, b.data.data(), b.data.size(), again.info.nonce, k);
    CHECK(out == again.data);
    CHECK(mac == again.info.macs[0]);
  }
  SECTION("a wrong key or a flipped bit fails and leaves the bytes alone") {
    Found c = find_tensor(file, "b");
    const auto before = c.data;
    auto bad = key;
    bad[0] ^= 1;
    const SecretBytes wrong(bad.data(), bad.size());
    CHECK_FALSE(open_in_place(c.data.data(), c.data.size(), c.info.macs[0], c.info.nonce, wrong));
    CHECK(c.data == before);
    c.data[3] ^= 0x10;
    CHECK_FALSE(open_in_place(c.data.data(), c.data.size(), c.info.macs[0], c.info.nonce, k));
  }
}

TEST_CASE("a password vector decrypts through the resolver's derived key") {
  const auto file = slurp("enc_password.tensors");
  Found w = find_tensor(file, "w");
  REQUIRE(w.info.kdf.size() == 1);
  const std::string pw = "tensorizer public vectors";
  KeyResolver resolver(KeyMaterial::password(pw.data(), pw.size()), {});
  const SecretBytes& k = resolver.key_for(w.info);
  CHECK(&resolver.key_for(w.info) == &k);  // cached
  REQUIRE(open_in_place(w.data.data(), w.data.size(), w.info.macs[0], w.info.nonce, k));
  CHECK(sha256_hex(w.data) == "53c1bf6b9fe9a22f6824d7eaf8bd46843d2bc8dd26b7391f2acd6c2b084dcb9b");
}

TEST_CASE("resolver rules") {
  format::CryptInfo plain_key_info;  // no KDF chunk
  const std::string pw = "pw";
  KeyResolver by_password(KeyMaterial::password(pw.data(), pw.size()), {});
  try {
    by_password.key_for(plain_key_info);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::crypto);
    CHECK(std::string(e.what()).find("Source string was provided") != std::string::npos);
  }
  format::CryptInfo costly;
  costly.kdf.push_back({1000, 8192, format::kPwhashArgon2id13, std::vector<uint8_t>(16)});
  try {
    by_password.key_for(costly);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::limit);
  }
  costly.kdf[0].opslimit = 1;
  costly.kdf[0].alg = 1;
  try {
    by_password.key_for(costly);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::crypto);
    CHECK(std::string(e.what()) == "Unsupported pwhash algorithm");
  }
}

TEST_CASE("the number of key derivations of one load is capped") {
  // One salt per tensor would otherwise cost one Argon2 run per tensor.
  const std::string pw = "pw";
  KeyResolver::Limits limits;
  limits.max_derivations = 2;
  KeyResolver resolver(KeyMaterial::password(pw.data(), pw.size()), limits);
  auto info_with_salt = [](uint8_t s) {
    format::CryptInfo info;
    info.kdf.push_back({1, 8192, format::kPwhashArgon2id13, std::vector<uint8_t>(16, s)});
    return info;
  };
  const SecretBytes& k1 = resolver.key_for(info_with_salt(1));
  resolver.key_for(info_with_salt(2));
  CHECK(&resolver.key_for(info_with_salt(1)) == &k1);  // already derived: no new cost
  try {
    resolver.key_for(info_with_salt(3));
    FAIL("a third derivation was allowed");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::limit);
    CHECK(std::string(e.what()).find("kdf_max_derivations") != std::string::npos);
  }
  CHECK(KeyResolver::Limits{}.max_derivations == 4);
}

TEST_CASE("nonces count up as little-endian integers with carries") {
  format::Nonce n{};
  n[0] = 0xFF;
  n[1] = 0xFF;
  const auto m = nonce_add(n, 1);
  CHECK(m[0] == 0);
  CHECK(m[1] == 0);
  CHECK(m[2] == 1);
  format::Nonce all{};
  all.fill(0xFF);
  CHECK(nonce_add(all, 1) == format::Nonce{});  // wraps like sodium_increment
  format::Nonce z{};
  const auto big = nonce_add(z, 0x0102030405060708ull);
  CHECK(big[0] == 8);
  CHECK(big[7] == 1);
  CHECK(big[8] == 0);
}

TEST_CASE("key handles validate their input and never echo it") {
  const std::string secret = "s3cret-key-material-that-is-32b!";
  REQUIRE(secret.size() == 32);
  CHECK(KeyMaterial::from_key(secret.data(), 32)->has_key());
  try {
    KeyMaterial::from_key(secret.data(), 31);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_arg);
    CHECK(std::string(e.what()).find("s3cret") == std::string::npos);
  }
  CHECK_THROWS_AS(KeyMaterial::password("", 0), Error);
  CHECK_THROWS_AS(KeyMaterial::derive("pw", 2, 0, 8192, nullptr, 0), Error);
  CHECK_THROWS_AS(KeyMaterial::derive("pw", 2, 1, 100, nullptr, 0), Error);
  CHECK_THROWS_AS(KeyMaterial::derive("pw", 2, 1, 8192, reinterpret_cast<const uint8_t*>("short"), 5), Error);
  const auto r1 = KeyMaterial::random(), r2 = KeyMaterial::random();
  CHECK(std::memcmp(r1->key().data(), r2->key().data(), 32) != 0);
  CHECK_THROWS_AS(KeyMaterial::password("pw", 2)->key(), Error);
}
