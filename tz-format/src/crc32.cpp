// CRC-32 (zlib / IEEE 802.3, reflected polynomial 0xEDB88320).
//
// Two implementations, chosen once at run time:
//   * "pclmul":  carry-less multiplication folding (4 x 128-bit lanes, i.e.
//                512 bits per iteration), x86 only, PCLMULQDQ + SSE4.1.
//   * "slice16": portable slicing-by-16 table lookup.
// crc32_combine uses multiplication by x^(8*len) mod P in GF(2)[x], with the
// power computed from a table of x^(2^k) mod P (O(log len)).
//
// All tables are constexpr (no dynamic initialisation at start-up).
#include "tz/format/hash.hpp"

#include "hash_internal.hpp"

#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define TZ_CRC32_X86 1
#include <immintrin.h>
#else
#define TZ_CRC32_X86 0
#endif

namespace tz::format {
namespace {

constexpr uint32_t kPolyRev = 0xEDB88320u;  // reflected x^32 + x^26 + ... + 1
constexpr uint64_t kPolyNormal = 0x104C11DB7ull;  // same polynomial, normal bit order, with x^32

// ---------------------------------------------------------------------------
// Tables for slicing-by-16.
// t[0][i] is the CRC register update for byte i; t[k][i] is the update for
// byte i followed by k zero bytes.
struct SliceTables {
  uint32_t t[16][256];
};

constexpr SliceTables make_slice_tables() {
  SliceTables s{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int b = 0; b < 8; ++b) c = (c & 1u) ? (c >> 1) ^ kPolyRev : (c >> 1);
    s.t[0][i] = c;
  }
  for (int k = 1; k < 16; ++k) {
    for (uint32_t i = 0; i < 256; ++i) {
      const uint32_t prev = s.t[k - 1][i];
      s.t[k][i] = (prev >> 8) ^ s.t[0][prev & 0xFFu];
    }
  }
  return s;
}

constexpr SliceTables kSlice = make_slice_tables();

inline uint32_t load_le32(const uint8_t* p) noexcept {
  // Assembled byte-wise so that it is endian-independent; compilers turn this
  // into a single load on little-endian targets.
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Updates the raw (already inverted) CRC register. No pre/post inversion.
uint32_t crc_raw_slice16(uint32_t c, const uint8_t* p, size_t n) noexcept {
  const auto& t = kSlice.t;
  while (n >= 16) {
    const uint32_t w0 = load_le32(p) ^ c;
    const uint32_t w1 = load_le32(p + 4);
    const uint32_t w2 = load_le32(p + 8);
    const uint32_t w3 = load_le32(p + 12);
    c = t[15][w0 & 0xFF] ^ t[14][(w0 >> 8) & 0xFF] ^ t[13][(w0 >> 16) & 0xFF] ^ t[12][w0 >> 24] ^
        t[11][w1 & 0xFF] ^ t[10][(w1 >> 8) & 0xFF] ^ t[9][(w1 >> 16) & 0xFF] ^ t[8][w1 >> 24] ^
        t[7][w2 & 0xFF] ^ t[6][(w2 >> 8) & 0xFF] ^ t[5][(w2 >> 16) & 0xFF] ^ t[4][w2 >> 24] ^
        t[3][w3 & 0xFF] ^ t[2][(w3 >> 8) & 0xFF] ^ t[1][(w3 >> 16) & 0xFF] ^ t[0][w3 >> 24];
    p += 16;
    n -= 16;
  }
  while (n--) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return c;
}

// ---------------------------------------------------------------------------
// GF(2)[x] / P arithmetic in the reflected representation used by the CRC
// register: bit 31 is the coefficient of x^0, bit 0 the coefficient of x^31.

constexpr uint32_t gf_mul_x(uint32_t v) noexcept {
  return (v & 1u) ? (v >> 1) ^ kPolyRev : (v >> 1);
}

// a * b mod P.
constexpr uint32_t gf_mulmod(uint32_t a, uint32_t b) noexcept {
  uint32_t prod = 0;
  for (int i = 0; i < 32; ++i) {
    // Branch-free: mask is all-ones when the coefficient of x^i in a is set.
    prod ^= b & (0u - ((a >> (31 - i)) & 1u));
    b = gf_mul_x(b);
  }
  return prod;
}

// x^(2^k) mod P for k = 0..66 (enough for 8 * len with len < 2^64).
struct X2nTable {
  uint32_t v[67];
};

constexpr X2nTable make_x2n_table() {
  X2nTable t{};
  t.v[0] = 1u << 30;  // x^1
  for (int k = 1; k < 67; ++k) t.v[k] = gf_mulmod(t.v[k - 1], t.v[k - 1]);
  return t;
}

constexpr X2nTable kX2n = make_x2n_table();

// x^(8 * len) mod P.
uint32_t x_pow_8n(uint64_t len) noexcept {
  uint32_t r = 1u << 31;  // x^0
  int k = 3;              // 8 * len = len << 3
  while (len != 0) {
    if (len & 1u) r = gf_mulmod(kX2n.v[k], r);
    len >>= 1;
    ++k;
  }
  return r;
}

#if TZ_CRC32_X86
// ---------------------------------------------------------------------------
// PCLMULQDQ folding.
//
// A 128-bit lane (little-endian load of 16 message bytes) represents, in the
// reflected domain, L * x^64 + H where L is the low quadword (earlier bytes).
// Moving it forward by D bits means multiplying by x^D mod P; with reflected
// carry-less multiplication that is lo(x) * K(x^(D+32)) ^ hi(x) * K(x^(D-32)),
// where K(x^n) is the 33-bit constant bitreflect32(x^n mod P) << 1. The fold
// keeps the running value congruent (mod P) to the message processed so far,
// so the CRC of the final 16-byte lane equals the CRC of everything folded.

constexpr uint64_t xpow_mod_normal(unsigned n) {
  uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (1ull << 32)) r ^= kPolyNormal;
  }
  return r;
}

constexpr uint64_t reflect32(uint64_t v) {
  uint64_t r = 0;
  for (int i = 0; i < 32; ++i)
    if (v & (1ull << i)) r |= 1ull << (31 - i);
  return r;
}

constexpr uint64_t fold_const(unsigned n) { return reflect32(xpow_mod_normal(n)) << 1; }

constexpr uint64_t kFold512Lo = fold_const(512 + 32);  // 0x154442bd4
constexpr uint64_t kFold512Hi = fold_const(512 - 32);  // 0x1c6e41596
constexpr uint64_t kFold128Lo = fold_const(128 + 32);  // 0x1751997d0
constexpr uint64_t kFold128Hi = fold_const(128 - 32);  // 0x0ccaa009e
static_assert(kFold512Lo == 0x154442bd4ull, "fold constant");
static_assert(kFold512Hi == 0x1c6e41596ull, "fold constant");
static_assert(kFold128Lo == 0x1751997d0ull, "fold constant");
static_assert(kFold128Hi == 0x0ccaa009eull, "fold constant");

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k) noexcept {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_pclmul(uint32_t crc, const void* data,
                                                               size_t len) noexcept {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  // Short inputs: the folding setup and table finish are not worth it.
  if (len < 128) return ~crc_raw_slice16(~crc, p, len);

  const __m128i k512 = _mm_set_epi64x(static_cast<long long>(kFold512Hi),
                                      static_cast<long long>(kFold512Lo));
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kFold128Hi),
                                      static_cast<long long>(kFold128Lo));

  const __m128i* v = reinterpret_cast<const __m128i*>(p);
  // Initial register value is xor-ed into the first 32 message bits.
  __m128i x0 = _mm_xor_si128(_mm_loadu_si128(v + 0), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = _mm_loadu_si128(v + 1);
  __m128i x2 = _mm_loadu_si128(v + 2);
  __m128i x3 = _mm_loadu_si128(v + 3);
  p += 64;
  len -= 64;

  while (len >= 64) {
    v = reinterpret_cast<const __m128i*>(p);
    x0 = _mm_xor_si128(fold(x0, k512), _mm_loadu_si128(v + 0));
    x1 = _mm_xor_si128(fold(x1, k512), _mm_loadu_si128(v + 1));
    x2 = _mm_xor_si128(fold(x2, k512), _mm_loadu_si128(v + 2));
    x3 = _mm_xor_si128(fold(x3, k512), _mm_loadu_si128(v + 3));
    p += 64;
    len -= 64;
  }

  // Collapse the four lanes into one.
  __m128i x = _mm_xor_si128(fold(x0, k128), x1);
  x = _mm_xor_si128(fold(x, k128), x2);
  x = _mm_xor_si128(fold(x, k128), x3);

  while (len >= 16) {
    x = _mm_xor_si128(fold(x, k128), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    p += 16;
    len -= 16;
  }

  // The remaining 128-bit value is congruent to the whole message; finish it
  // (and the <16 byte tail) with the table code, starting from a zero register.
  alignas(16) uint8_t lane[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(lane), x);
  uint32_t c = crc_raw_slice16(0, lane, 16);
  c = crc_raw_slice16(c, p, len);
  return ~c;
}
#endif  // TZ_CRC32_X86

struct CrcImpl {
  detail::Crc32Fn fn;
  const char* name;
};

CrcImpl pick_crc_impl() noexcept {
#if TZ_CRC32_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1"))
    return {&crc32_pclmul, "pclmul"};
#endif
  return {&detail::crc32_portable, "slice16"};
}

const CrcImpl& crc_impl() noexcept {
  static const CrcImpl impl = pick_crc_impl();
  return impl;
}

}  // namespace

namespace detail {

uint32_t crc32_portable(uint32_t crc, const void* data, size_t len) noexcept {
  if (len == 0) return crc;
  return ~crc_raw_slice16(~crc, static_cast<const uint8_t*>(data), len);
}

Crc32Fn crc32_accel() noexcept {
#if TZ_CRC32_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1")) return &crc32_pclmul;
#endif
  return nullptr;
}

}  // namespace detail

uint32_t crc32_update(uint32_t crc, const void* data, size_t len) noexcept {
  if (len == 0) return crc;
  return crc_impl().fn(crc, data, len);
}

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) noexcept {
  // The pre/post inversions of crc(A) and crc(B) cancel out, leaving
  // crc(A||B) = crc(A) * x^(8*len_b) + crc(B)  (mod P).
  return gf_mulmod(x_pow_8n(len_b), crc_a) ^ crc_b;
}

const char* crc32_impl_name() noexcept { return crc_impl().name; }

}  // namespace tz::format
