// Damaged files through the C ABI: thousands of seeded mutations of the
// vectors (bit flips, extreme integers written over length and offset fields,
// truncations, cut-out ranges), aimed at the structures a reader parses. Each
// must open and read cleanly or fail with a negative code and a message; run
// under ASan/UBSan in CI, so an out-of-bounds access fails the test too.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "tensorizer.h"

namespace {

// Where a reader's structures lie in an intact file: the file header and
// metadata index, then each tensor's header.
struct Regions {
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end)
};

Regions structure_of(const std::string& path, const std::vector<uint8_t>& bytes, const tz_options* opts) {
  Regions out;
  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), opts) == TZ_OK);
  tz_file_info fi = TZ_FILE_INFO_INIT;
  REQUIRE(tz_reader_file_info(&fi, r) == TZ_OK);
  // Upstream reserves room in the metadata block; its zero padding after the
  // entries is not worth most of the mutations.
  uint64_t used = 73 + fi.metadata_length;
  while (used > 73 && bytes[size_t(used - 1)] == 0) --used;
  out.spans.push_back({0, std::min<uint64_t>(used + 16, 73 + fi.metadata_length)});
  for (uint64_t i = 0; i < fi.tensor_count; ++i) {
    tz_tensor_info ti = TZ_TENSOR_INFO_INIT;
    REQUIRE(tz_reader_tensor_info(&ti, r, i) == TZ_OK);
    out.spans.push_back({ti.header_offset, ti.data_offset});
  }
  tz_reader_free(r);
  return out;
}

void put_le(std::vector<uint8_t>& b, size_t at, uint64_t v, size_t width) {
  for (size_t k = 0; k < width && at + k < b.size(); ++k) b[at + k] = uint8_t(v >> (8 * k));
}

std::vector<uint8_t> mutate(const std::vector<uint8_t>& in, const Regions& regions, std::mt19937_64& rng) {
  std::vector<uint8_t> b = in;
  // Mostly inside a parsed structure; sometimes anywhere (tensor data).
  size_t at;
  if (rng() % 5 != 0) {
    const auto& [lo, hi] = regions.spans[rng() % regions.spans.size()];
    at = size_t(lo + rng() % std::max<uint64_t>(1, hi - lo));
  } else {
    at = size_t(rng() % b.size());
  }
  at = std::min(at, b.size() - 1);
  const uint64_t extremes[] = {0,          1,           0xFF,       0xFFFF,          0xFFFFFFFFull,
                               1ull << 32, 1ull << 62,  ~0ull,      ~0ull >> 1,      uint64_t(b.size()),
                               uint64_t(b.size()) + 1,  uint64_t(b.size()) - 1};
  switch (rng() % 6) {
    case 0:  // one bit
      b[at] ^= uint8_t(1u << (rng() % 8));
      break;
    case 1:  // an extreme value over a u64 field
      put_le(b, at, extremes[rng() % std::size(extremes)], 8);
      break;
    case 2:  // ... a u32 field
      put_le(b, at, extremes[rng() % std::size(extremes)], 4);
      break;
    case 3:  // ... a u16 field or a byte
      put_le(b, at, extremes[rng() % std::size(extremes)], 1 + rng() % 2);
      break;
    case 4:  // truncated
      b.resize(at);
      break;
    default:  // a range cut out, so everything after it shifts
      b.erase(b.begin() + ptrdiff_t(at), b.begin() + ptrdiff_t(std::min(b.size(), at + 1 + rng() % 64)));
      break;
  }
  return b;
}

// Opens and reads everything; returns the status of the first failure (or TZ_OK).
int open_and_read_all(const std::string& path, const tz_options* opts, uint64_t file_size) {
  tz_reader* r = nullptr;
  int rc = tz_reader_open(&r, path.c_str(), opts);
  if (rc != TZ_OK) return rc;
  uint64_t count = 0;
  rc = tz_reader_tensor_count(&count, r);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<tz_read_request> requests;
  for (uint64_t i = 0; rc == TZ_OK && i < count; ++i) {
    tz_tensor_info ti = TZ_TENSOR_INFO_INIT;
    rc = tz_reader_tensor_info(&ti, r, i);
    if (rc != TZ_OK) break;
    // What a caller would allocate: bounded by the file for stored tensors.
    if (!ti.is_meta) CHECK(ti.nbytes <= file_size);
    if (ti.nbytes > (uint64_t(64) << 20)) continue;  // a meta tensor's zeros: not the point here
    buffers.emplace_back(size_t(ti.nbytes));
    requests.push_back({TZ_READ_REQUEST_VERSION, i, buffers.back().empty() ? nullptr : buffers.back().data(), ti.nbytes});
  }
  if (rc == TZ_OK) {
    for (size_t k = 0; k < requests.size(); ++k) requests[k].dst = buffers[k].empty() ? nullptr : buffers[k].data();
    size_t failed = 0;
    rc = tz_reader_read_batch(r, requests.data(), requests.size(), TZ_READ_VERIFY_HASH, 2, &failed);
  }
  tz_reader_free(r);
  return rc;
}

}  // namespace

TEST_CASE("mutated files open and read cleanly or fail with a code and a message") {
  const std::string dir = TZ_VECTORS_DIR;
  tz_key* key = nullptr;
  {
    uint8_t raw[32];
    const char* hex = "f6557a6dfe75ee066b30fcd911cb0db5c67dc4ba0a18fe6e7cc76b9d19c43139";
    for (size_t i = 0; i < 32; ++i) raw[i] = uint8_t(std::stoul(std::string(hex + 2 * i, 2), nullptr, 16));
    REQUIRE(tz_key_new_from_bytes(&key, raw, sizeof raw) == TZ_OK);
  }
  tz_options* enc = nullptr;
  REQUIRE(tz_options_new(&enc) == TZ_OK);
  REQUIRE(tz_options_set_key(enc, key) == TZ_OK);

  struct Case {
    const char* file;
    const tz_options* opts;
  };
  const Case cases[] = {{"v1_plain.tensors", nullptr},  {"v2_opaque.tensors", nullptr},
                        {"v4_meta.tensors", nullptr},   {"module.tensors", nullptr},
                        {"structured.tensors", nullptr}, {"enc_random.tensors", enc}};
  const std::string path = tz_test::temp_path("mutated.tensors");
  std::mt19937_64 rng(20261122);
  size_t failures = 0, survivals = 0;
  for (const Case& c : cases) {
    const std::string src = dir + "/" + c.file;
    const auto intact = tz_test::slurp(src);
    REQUIRE(open_and_read_all(src, c.opts, intact.size()) == TZ_OK);
    const Regions regions = structure_of(src, intact, c.opts);
    for (int i = 0; i < 400; ++i) {
      const auto bytes = mutate(intact, regions, rng);
      tz_test::spit(path, bytes);
      const int rc = open_and_read_all(path, c.opts, bytes.size());
      if (rc == TZ_OK) {
        ++survivals;  // e.g. a flipped bit in unused padding, or in a name
        continue;
      }
      ++failures;
      INFO(c.file << " mutation " << i << ": " << tz_status_name(rc) << " " << tz_error_last());
      CHECK(rc < 0);
      CHECK(rc != TZ_E_INTERNAL);
      CHECK(std::strlen(tz_error_last()) > 0);
    }
  }
  // Most mutations of parsed structures must be caught.
  CHECK(failures > survivals);
  std::remove(path.c_str());
  tz_options_free(enc);
  tz_key_free(key);
}
