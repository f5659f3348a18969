#include "tz/format/crypt_info.hpp"

#include <string>
#include <tuple>

#include "tz/format/bytes.hpp"
#include "tz/format/error.hpp"

namespace tz::format {

namespace {

enum : uint16_t { kChunkKdf = 1, kChunkParallel = 2, kChunkSequential = 3 };
enum : uint16_t { kKdfPwhash = 1 };

KdfParams parse_kdf(ByteReader& r) {
  const uint16_t method = r.u16();
  if (method != kKdfPwhash) fail(Errc::crypto, "Malformed crypt_info block: unknown key derivation method " + std::to_string(method) + " in crypt_info");
  KdfParams k;
  k.opslimit = r.u64();
  k.memlimit = r.u64();
  k.alg = static_cast<int32_t>(r.u32());
  const uint16_t salt_len = r.u16();
  const uint8_t* salt = r.take(salt_len);
  k.salt.assign(salt, salt + salt_len);
  return k;
}

}  // namespace

bool KdfParams::operator<(const KdfParams& o) const {
  return std::tie(opslimit, memlimit, alg, salt) < std::tie(o.opslimit, o.memlimit, o.alg, o.salt);
}

CryptInfo parse_crypt_info(const uint8_t* body, size_t size) {
  ByteReader r(body, size, "crypt_info block", Errc::crypto);
  CryptInfo info;
  info.chunk_count = r.u16();
  for (size_t c = 0; c < info.chunk_count; ++c) {
    const uint64_t chunk_len = r.u64();
    if (chunk_len < 2 || chunk_len > r.remaining()) fail(Errc::crypto, "Malformed crypt_info block: a chunk length is out of range");
    ByteReader cr(r.take(size_t(chunk_len)), size_t(chunk_len), "crypt_info chunk", Errc::crypto);
    const uint16_t type = cr.u16();
    switch (type) {
      case kChunkKdf:
        info.kdf.push_back(parse_kdf(cr));
        break;
      case kChunkParallel: {
        ++info.cipher_chunks;
        info.scheme = CipherScheme::parallel;
        info.chunk_size = cr.u64();
        if (info.chunk_size % kCryptChunkQuantum != 0 || info.chunk_size < kCryptChunkMinimum) {
          fail(Errc::crypto, "Malformed crypt_info block: invalid encryption chunk size " + std::to_string(info.chunk_size) +
                                 " (must be a multiple of 64 and at least 1024)");
        }
        std::memcpy(info.nonce.data(), cr.take(kNonceBytes), kNonceBytes);
        const uint64_t macs = cr.u64();
        if (macs > cr.remaining() / kMacBytes) fail(Errc::crypto, "Malformed crypt_info block: the MAC count runs past its chunk");
        info.macs.resize(size_t(macs));
        for (auto& m : info.macs) std::memcpy(m.data(), cr.take(kMacBytes), kMacBytes);
        break;
      }
      case kChunkSequential:
        ++info.cipher_chunks;
        info.scheme = CipherScheme::sequential;
        std::memcpy(info.nonce.data(), cr.take(kNonceBytes), kNonceBytes);
        info.macs.resize(1);
        std::memcpy(info.macs[0].data(), cr.take(kMacBytes), kMacBytes);
        break;
      default:
        fail(Errc::crypto, "Malformed crypt_info block: unknown chunk type " + std::to_string(type));
    }
  }
  return info;
}

std::vector<uint8_t> build_crypt_info(const KdfParams* kdf, uint64_t chunk_size, const Nonce& nonce,
                                      size_t mac_count, size_t* mac_offset) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u16(kdf ? 2 : 1);
  if (kdf) {
    w.u64(2 + 2 + 8 + 8 + 4 + 2 + kdf->salt.size());
    w.u16(kChunkKdf);
    w.u16(kKdfPwhash);
    w.u64(kdf->opslimit);
    w.u64(kdf->memlimit);
    w.u32(static_cast<uint32_t>(kdf->alg));
    w.u16(uint16_t(kdf->salt.size()));
    w.bytes(kdf->salt.data(), kdf->salt.size());
  }
  w.u64(2 + 8 + kNonceBytes + 8 + kMacBytes * uint64_t(mac_count));
  w.u16(kChunkParallel);
  w.u64(chunk_size);
  w.bytes(nonce.data(), nonce.size());
  w.u64(mac_count);
  if (mac_offset) *mac_offset = out.size();
  w.zeros(kMacBytes * mac_count);
  return out;
}

std::vector<uint8_t> empty_crypt_info() { return {0, 0}; }

}  // namespace tz::format
