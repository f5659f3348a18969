// The reading engine with a source that asks for coalesced reads (as HTTP
// and S3 do), served from memory: same bytes as a local read, few requests,
// gaps skipped, failures attributed to the right tensor. Runs under the
// sanitizers, which the server tests do not.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../src/reader.hpp"
#include "../src/writer.hpp"
#include "helpers.hpp"
#include "tz/format/bytes.hpp"
#include "tz/format/error.hpp"
#include "tz/io/file.hpp"

namespace {

using tz::Errc;
using tz::Error;
using tz::core::ReadRequest;
using tz::core::Reader;
using tz::core::ReaderOptions;

// An object in memory that counts requests and can fail at one offset.
class MemorySource final : public tz::io::Source {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  void read_at(uint64_t offset, void* dst, size_t len) override {
    ++requests;
    check(offset, len);
    std::memcpy(dst, bytes_.data() + offset, len);
  }
  void read_scatter(uint64_t offset, const tz::io::Segment* segments, size_t count,
                    const std::function<void(size_t)>& on_segment, tz::io::NextRead next) override {
    ++requests;
    {
      std::lock_guard<std::mutex> lock(m_);
      spans.push_back(offset);
      nexts.push_back(next);
    }
    for (size_t i = 0; i < count; ++i) {
      check(offset, segments[i].len);
      if (segments[i].dst) std::memcpy(segments[i].dst, bytes_.data() + offset, segments[i].len);
      offset += segments[i].len;
      if (on_segment) on_segment(i);
    }
  }
  bool coalesce_reads() const override { return coalesce; }
  bool sparse() const override { return is_sparse; }
  std::string describe() const override { return "memory"; }

  bool coalesce = true;
  bool is_sparse = false;  // as a Redis key set: size() does not bound offsets

  std::atomic<unsigned> requests{0};
  std::vector<uint64_t> spans;
  std::vector<tz::io::NextRead> nexts;  // the hint of each scattered read
  uint64_t fail_at = UINT64_MAX;  // a read covering this offset fails as a dead server would

 private:
  void check(uint64_t offset, size_t len) const {
    if (offset + len > bytes_.size()) tz::fail(Errc::truncated, "past the end");
    if (fail_at >= offset && fail_at < offset + len) tz::fail(Errc::io, "connection reset");
  }
  std::vector<uint8_t> bytes_;
  std::mutex m_;
};

struct Loaded {
  std::vector<std::vector<uint8_t>> data;
  std::vector<ReadRequest> requests;
};

Loaded prepare(Reader& r, const std::vector<uint64_t>& indices) {
  Loaded l;
  for (uint64_t i : indices) {
    const uint64_t n = r.entries()[size_t(i)].nbytes;
    l.data.emplace_back(size_t(n), uint8_t(0xEE));
  }
  for (size_t k = 0; k < indices.size(); ++k) {
    l.requests.push_back({indices[k], l.data[k].empty() ? nullptr : l.data[k].data(), l.data[k].size()});
  }
  return l;
}

std::vector<uint64_t> all_of(const Reader& r) {
  std::vector<uint64_t> v(r.entries().size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

// What a plain local read gives.
std::vector<std::vector<uint8_t>> local_read(const std::string& path, const ReaderOptions& options) {
  auto r = Reader::open(path, options);
  Loaded l = prepare(*r, all_of(*r));
  r->read_batch(l.requests.data(), l.requests.size(), false, 2, nullptr);
  return l.data;
}

std::unique_ptr<Reader> memory_reader(const std::vector<uint8_t>& bytes, MemorySource** source,
                                      const ReaderOptions& options = {}) {
  auto src = std::make_unique<MemorySource>(bytes);
  *source = src.get();
  return std::make_unique<Reader>(std::move(src), options);
}

// 40 tensors of 1 MiB, each filled with its index, written by the engine.
std::string write_many(const char* name) {
  const std::string path = tz_test::temp_path(name);
  auto w = tz::core::Writer::open(path, {});
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::string> names;
  std::vector<uint64_t> shape{1 << 20};
  std::vector<tz::core::TensorInput> in(40);
  for (size_t i = 0; i < in.size(); ++i) {
    data.emplace_back(size_t(1) << 20, uint8_t(i));
    names.push_back("t" + std::to_string(i));
  }
  for (size_t i = 0; i < in.size(); ++i) {
    in[i].name = names[i];
    in[i].dtype = "<u1";
    in[i].shape = shape.data();
    in[i].ndim = 1;
    in[i].data = data[i].data();
    in[i].data_size = data[i].size();
  }
  w->write(in.data(), in.size(), 2);
  w->close();
  return path;
}

}  // namespace

TEST_CASE("coalesced reads give the bytes a local read gives, for every vector") {
  for (const char* name : {"v1_plain", "v2_opaque", "v4_meta", "module", "structured", "big_plain"}) {
    const std::string path = std::string(TZ_VECTORS_DIR) + "/" + name + ".tensors";
    const auto expected = local_read(path, {});
    for (bool verify : {false, true}) {
      for (unsigned threads : {1u, 4u}) {
        MemorySource* src = nullptr;
        auto r = memory_reader(tz_test::slurp(path), &src);
        Loaded l = prepare(*r, all_of(*r));
        const unsigned before = src->requests;
        r->read_batch(l.requests.data(), l.requests.size(), verify, threads, nullptr);
        INFO(name << " verify=" << verify << " threads=" << threads);
        CHECK(l.data == expected);
        CHECK(src->requests - before == 1);  // small files: one request for everything
      }
    }
  }
}

TEST_CASE("encrypted tensors are decrypted after a coalesced read; a wrong key zeroes the buffer") {
  const std::string path = std::string(TZ_VECTORS_DIR) + "/big_enc.tensors";
  const uint8_t key[32] = {0xf6, 0x55, 0x7a, 0x6d, 0xfe, 0x75, 0xee, 0x06, 0x6b, 0x30, 0xfc,
                           0xd9, 0x11, 0xcb, 0x0d, 0xb5, 0xc6, 0x7d, 0xc4, 0xba, 0x0a, 0x18,
                           0xfe, 0x6e, 0x7c, 0xc7, 0x6b, 0x9d, 0x19, 0xc4, 0x31, 0x39};
  ReaderOptions good;
  good.key = tz::crypto::KeyMaterial::from_key(key, sizeof key);
  const auto expected = local_read(path, good);
  MemorySource* src = nullptr;
  auto r = memory_reader(tz_test::slurp(path), &src, good);
  Loaded l = prepare(*r, all_of(*r));
  r->read_batch(l.requests.data(), l.requests.size(), true, 2, nullptr);
  CHECK(l.data == expected);

  uint8_t wrong[32] = {0};
  ReaderOptions bad;
  bad.key = tz::crypto::KeyMaterial::from_key(wrong, sizeof wrong);
  auto r2 = memory_reader(tz_test::slurp(path), &src, bad);
  Loaded l2 = prepare(*r2, all_of(*r2));
  size_t failed = 99;
  try {
    r2->read_batch(l2.requests.data(), l2.requests.size(), false, 2, &failed);
    FAIL("a wrong key must fail");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::crypto);
  }
  CHECK(failed == 0);
  CHECK(l2.data[0] == std::vector<uint8_t>(l2.data[0].size(), 0));
}

TEST_CASE("a large load is split into about one request per thread, gaps are skipped") {
  const std::string path = write_many("many");
  const auto bytes = tz_test::slurp(path);
  const auto expected = local_read(path, {});
  MemorySource* src = nullptr;
  auto r = memory_reader(bytes, &src);
  Loaded l = prepare(*r, all_of(*r));
  const unsigned before = src->requests;
  r->read_batch(l.requests.data(), l.requests.size(), true, 4, nullptr);
  CHECK(l.data == expected);
  CHECK(src->requests - before == 4);  // 40 MiB on 4 threads: spans of about 10 MiB

  // Every other tensor: the 1 MiB holes between them are read (cheaper than a
  // request); leaving out 10 in a row starts a new request past the gap.
  std::vector<uint64_t> wanted;
  for (uint64_t i = 0; i < 40; ++i) {
    if (i < 10 || i >= 20) wanted.push_back(i);
  }
  auto r2 = memory_reader(bytes, &src);
  Loaded l2 = prepare(*r2, wanted);
  r2->read_batch(l2.requests.data(), l2.requests.size(), false, 1, nullptr);
  for (size_t k = 0; k < wanted.size(); ++k) CHECK(l2.data[k] == expected[size_t(wanted[k])]);
  REQUIRE(src->spans.size() == 2);
  CHECK(src->spans[1] == r2->entries()[20].header_offset);
  // Spans of a plan know where the next one starts; the last one's end is
  // where the next read (the next batch) likely starts.
  CHECK(src->nexts == std::vector<tz::io::NextRead>{tz::io::NextRead::elsewhere, tz::io::NextRead::follows_alongside});

  // One tensor at a time (a lazy load): each read is likely followed by the
  // next tensor, so a remote source may keep its response open.
  auto r3 = memory_reader(bytes, &src);
  for (uint64_t i = 0; i < 3; ++i) {
    Loaded one = prepare(*r3, {i});
    r3->read_batch(one.requests.data(), 1, false, 4, nullptr);
    CHECK(one.data[0] == expected[size_t(i)]);
  }
  CHECK(src->nexts == std::vector<tz::io::NextRead>(3, tz::io::NextRead::follows));
  std::remove(path.c_str());
}

TEST_CASE("failures inside a coalesced read name the tensor they hit") {
  const std::string path = write_many("fail");
  auto bytes = tz_test::slurp(path);
  {
    // One flipped data byte of tensor 17: a hash error for request 17.
    MemorySource* src = nullptr;
    auto probe = memory_reader(bytes, &src);
    const uint64_t at = probe->entries()[17].data_offset + 100;
    auto damaged = bytes;
    damaged[size_t(at)] ^= 1;
    auto r = memory_reader(damaged, &src);
    Loaded l = prepare(*r, all_of(*r));
    size_t failed = 0;
    try {
      r->read_batch(l.requests.data(), l.requests.size(), true, 3, &failed);
      FAIL("a damaged tensor must fail verification");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::hash);
      CHECK(std::string(e.what()).find("'t17'") != std::string::npos);
    }
    CHECK(failed == 17);
  }
  {
    // The source dies in the middle of tensor 30's data.
    MemorySource* src = nullptr;
    auto r = memory_reader(bytes, &src);
    src->fail_at = r->entries()[30].data_offset + 4096;
    Loaded l = prepare(*r, all_of(*r));
    size_t failed = 0;
    try {
      r->read_batch(l.requests.data(), l.requests.size(), false, 1, &failed);
      FAIL("a dead source must fail the read");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::io);
    }
    CHECK(failed == 0);  // one request covered every tensor: the first is named
  }
  std::remove(path.c_str());
}

namespace {

// One tensor "t" of 4 floats (1, 2, 3, 4), written by the engine; returns the
// file's bytes.
std::vector<uint8_t> write_one(const char* name, bool meta = false) {
  const std::string path = tz_test::temp_path(name);
  auto w = tz::core::Writer::open(path, {});
  const float v[4] = {1, 2, 3, 4};
  std::vector<uint64_t> shape{4};
  tz::core::TensorInput in;
  in.name = "t";
  in.dtype = "<f4";
  in.shape = shape.data();
  in.ndim = 1;
  in.is_meta = meta;
  in.data = v;
  in.data_size = sizeof v;
  w->write(&in, 1, 1);
  w->close();
  auto bytes = tz_test::slurp(path);
  ::unlink(path.c_str());
  return bytes;
}

Errc read_error(const std::vector<uint8_t>& bytes, bool coalesce, bool sparse, bool verify) {
  auto src = std::make_unique<MemorySource>(bytes);
  src->coalesce = coalesce;
  src->is_sparse = sparse;
  try {
    Reader r(std::move(src), {});
    Loaded l = prepare(r, all_of(r));
    r.read_batch(l.requests.data(), l.requests.size(), verify, 1, nullptr);
  } catch (const Error& e) {
    INFO(e.what());
    return e.code();
  }
  return Errc::internal;  // no error
}

}  // namespace

TEST_CASE("a sparse source never allocates a header the file sizes before its bytes exist") {
  // Issue 15 (fixed before our fuzz runs; a crafted input replays it from
  // fuzz/regressions/reader_coalesced/): on a sparse source (Redis) the file
  // size bounds no offset, so a data offset of 2^50 made a 2^50-byte header
  // buffer before anything was read.
  auto bytes = write_one("sparse_header");
  const uint64_t entry_end = 73 + 2 + 1 + 1 + 1 + 3 + 1 + 4 + 24;  // "t", "<f4", one u32 dim
  REQUIRE(tz::format::load_u64(bytes.data() + entry_end - 8) == 16);  // data length where expected
  tz::format::store_u64(bytes.data() + entry_end - 16, uint64_t(1) << 50);  // data offset
  for (bool coalesce : {false, true}) {
    INFO("coalesce=" << coalesce);
    CHECK(read_error(bytes, coalesce, true, false) == Errc::truncated);
  }
}

TEST_CASE("a verified read verifies something or fails") {
  // A header storing no hash: nothing to verify against.
  auto bytes = write_one("no_hashes");
  const uint64_t header = tz::format::load_u64(bytes.data() + 73 + 2 + 1 + 1 + 1 + 3 + 1 + 4);
  const uint64_t count_at = header + 8 + 2 + 1 + 2 + 1 + 1 + 3 + 1 + 4 + 2;
  REQUIRE(bytes[count_at] == 2);  // CRC32 and SHA-256
  bytes[count_at] = 0;
  for (bool coalesce : {false, true}) {
    INFO("coalesce=" << coalesce);
    CHECK(read_error(bytes, coalesce, false, false) == Errc::internal);  // unverified: loads
    CHECK(read_error(bytes, coalesce, false, true) == Errc::hash);
  }
  // A meta tensor's hashes cover its header: an altered header fails.
  auto meta = write_one("meta_hashes", true);
  for (bool coalesce : {false, true}) CHECK(read_error(meta, coalesce, false, true) == Errc::internal);
  const uint64_t meta_header = tz::format::load_u64(meta.data() + 73 + 2 + 1 + 1 + 1 + 3 + 1 + 4);
  meta[meta_header + 8] ^= 1;  // module index
  for (bool coalesce : {false, true}) {
    INFO("coalesce=" << coalesce);
    CHECK(read_error(meta, coalesce, false, false) == Errc::internal);
    CHECK(read_error(meta, coalesce, false, true) == Errc::hash);
  }
}
