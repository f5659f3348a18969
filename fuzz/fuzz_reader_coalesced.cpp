// The reading engine's coalesced path (used for remote sources: HTTP, S3),
// fed from an in-memory source, against the same engine reading the same
// bytes one tensor at a time: both must agree on success, and on the bytes
// of every tensor read. The same file is also read as a sparse source
// (Redis), whose offsets are only checked when read.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../tz-capi/src/reader.hpp"
#include "fuzz_common.hpp"
#include "tz/crypto/key.hpp"

namespace {

using tz::core::Reader;
using tz::core::ReaderOptions;
using tz::core::ReadRequest;

const uint8_t kKey[32] = {0x46, 0x55, 0x5a, 0x5a, 0x2d, 0x6b, 0x65, 0x79, 1, 2, 3, 4, 5, 6, 7, 8,
                          9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24};

class MemorySource final : public tz::io::Source {
 public:
  MemorySource(const uint8_t* data, size_t size, bool coalesce, bool sparse)
      : bytes_(data, data + size), coalesce_(coalesce), sparse_(sparse) {}
  uint64_t size() const override { return bytes_.size(); }
  void read_at(uint64_t offset, void* dst, size_t len) override {
    check(offset, len);
    if (len) std::memcpy(dst, bytes_.data() + offset, len);
  }
  void read_scatter(uint64_t offset, const tz::io::Segment* segments, size_t count,
                    const std::function<void(size_t)>& on_segment, tz::io::NextRead) override {
    for (size_t i = 0; i < count; ++i) {
      check(offset, segments[i].len);
      if (segments[i].dst && segments[i].len) std::memcpy(segments[i].dst, bytes_.data() + offset, segments[i].len);
      offset += segments[i].len;
      if (on_segment) on_segment(i);
    }
  }
  bool coalesce_reads() const override { return coalesce_; }
  bool sparse() const override { return sparse_; }
  std::string describe() const override { return "memory"; }

 private:
  void check(uint64_t offset, size_t len) const {
    if (offset > bytes_.size() || len > bytes_.size() - offset) tz::fail(tz::Errc::truncated, "past the end");
  }
  std::vector<uint8_t> bytes_;
  bool coalesce_, sparse_;
};

struct Outcome {
  bool opened = false;
  bool ok = false;
  tz::Errc code{};
  std::vector<std::vector<uint8_t>> data;
};

Outcome load(const uint8_t* data, size_t size, bool coalesce, bool sparse, bool verify, bool key) {
  Outcome out;
  ReaderOptions o;
  o.num_threads = 1;
  if (key) o.key = tz::crypto::KeyMaterial::from_key(kKey, sizeof kKey);
  std::unique_ptr<Reader> r;
  try {
    r = std::make_unique<Reader>(std::make_unique<MemorySource>(data, size, coalesce, sparse), o);
  } catch (const tz::Error& e) {
    expect_typed(e);
    return out;
  }
  out.opened = true;
  std::vector<ReadRequest> reqs;
  for (size_t i = 0; i < r->entries().size(); ++i) {
    const uint64_t n = r->entries()[i].nbytes;
    if (n > kMaxTensorBytes) continue;
    out.data.emplace_back(size_t(n), 0xA5);
  }
  size_t k = 0;
  for (size_t i = 0; i < r->entries().size(); ++i) {
    if (r->entries()[i].nbytes > kMaxTensorBytes) continue;
    reqs.push_back({i, out.data[k].data(), out.data[k].size()});
    ++k;
  }
  try {
    size_t failed = 0;
    r->read_batch(reqs.data(), reqs.size(), verify, 1, &failed);
    if (!reqs.empty() && failed >= reqs.size()) fuzz_bug("read_batch", "failed index out of range");
    out.ok = true;
  } catch (const tz::Error& e) {
    expect_typed(e);
    out.code = e.code();
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  for (bool key : {false, true}) {
    for (bool verify : {false, true}) {
      const Outcome plain = load(data, size, false, false, verify, key);
      const Outcome coalesced = load(data, size, true, false, verify, key);
      if (plain.opened != coalesced.opened) fuzz_bug("coalesced", "open differs from a plain source");
      if (plain.ok != coalesced.ok) {
        fuzz_bug("coalesced", plain.ok ? "failed where the plain path succeeds"
                                       : "succeeded where the plain path fails");
      }
      if (plain.ok && plain.data != coalesced.data) fuzz_bug("coalesced", "bytes differ from the plain path");
      load(data, size, true, true, verify, key);
    }
  }
  return 0;
}
