// The writer's inputs through the C ABI: names, dtypes, shapes, tensor types
// and module indices taken from the input, one write call per tensor, to a
// temporary file (optionally encrypted with a fixed key). A write call either
// fails with a typed status or is recorded; afterwards the file must load
// with verify_hash and give back exactly the tensors that were accepted.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "tensorizer.h"
#include "tz/format/dtype.hpp"

namespace {

const uint8_t kKey[32] = {0x46, 0x55, 0x5a, 0x5a, 0x2d, 0x6b, 0x65, 0x79, 1, 2, 3, 4, 5, 6, 7, 8,
                          9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24};

struct Input {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  std::string bytes(size_t len) {
    len = std::min(len, n);
    std::string s(reinterpret_cast<const char*>(p), len);
    p += len;
    n -= len;
    return s;
  }
};

struct Accepted {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  bool meta;
  std::vector<uint8_t> data;
  bool swap;
  uint32_t swap_unit;
};

void check_status(int rc) {
  if (rc == TZ_E_INTERNAL || rc == TZ_E_NOMEM) fuzz_bug(tz_status_name(rc), tz_error_last());
}

std::string tmp_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/tz_fuzz_writer." + std::to_string(getpid()) + ".tensors";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  Input in{data, size};
  const uint8_t mode = in.u8();
  const std::string path = tmp_path();
  tz_options* opts = nullptr;
  tz_options_new(&opts);
  tz_options_set(opts, "num_threads", "1");
  // Syncing each file to disk would cut the executions tenfold and test nothing here.
  tz_options_set(opts, "durable", "0");
  tz_key* key = nullptr;
  if (mode & 1) {
    tz_key_new_from_bytes(&key, kKey, sizeof kKey);
    tz_options_set_key(opts, key);
    tz_options_set(opts, "crypt_chunk_size", "1024");
  }
  tz_writer* w = nullptr;
  int rc = tz_writer_open(&w, path.c_str(), opts);
  if (rc != TZ_OK) fuzz_bug("tz_writer_open", tz_error_last());

  std::vector<Accepted> accepted;
  bool broken = false;
  while (!in.empty() && accepted.size() < 16 && !broken) {
    Accepted t;
    t.name = in.bytes(in.u8());
    t.dtype = in.bytes(in.u8() % 40);
    const uint8_t ndim = in.u8() % 6;
    uint64_t numel = 1;
    for (uint8_t d = 0; d < ndim; ++d) {
      const uint64_t dim = in.u8() % 17;
      t.shape.push_back(dim);
      numel *= dim;
    }
    const uint8_t kind = in.u8();
    t.meta = kind & 1;
    uint32_t itemsize = 0;
    try {
      const tz::format::DType dt = tz::format::parse_dtype(t.dtype);
      itemsize = dt.itemsize;
      t.swap = dt.needs_swap();
      t.swap_unit = dt.swap_unit();
    } catch (const tz::Error&) {
      itemsize = 1;  // the writer must reject the dtype; give it some bytes anyway
      t.swap = false;
    }
    const uint64_t nbytes = std::min<uint64_t>(numel * itemsize, 1 << 16);
    t.data.resize(size_t(nbytes));
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = uint8_t(i * 31 + kind);
    tz_tensor_desc desc = TZ_TENSOR_DESC_INIT;
    desc.name = reinterpret_cast<const uint8_t*>(t.name.data());
    desc.name_len = t.name.size();
    desc.dtype = t.dtype.data();
    desc.dtype_len = t.dtype.size();
    desc.ndim = ndim;
    desc.shape = t.shape.data();
    desc.module_index = (kind >> 1) & 3;
    desc.tensor_type = (kind >> 3) % 4;  // 3 is no tensor type
    desc.is_meta = t.meta;
    desc.data = t.data.data();
    desc.data_size = t.data.size();
    rc = tz_writer_write(w, &desc, 1, 1);
    check_status(rc);
    if (rc == TZ_OK) accepted.push_back(std::move(t));
    else if (rc != TZ_E_INVALID_ARG && rc != TZ_E_CONFLICT && rc != TZ_E_LIMIT) broken = true;
  }
  rc = tz_writer_close(w);
  check_status(rc);
  tz_writer_free(w);
  if (rc != TZ_OK) fuzz_bug("tz_writer_close", tz_error_last());

  // What was accepted must come back, verified, byte for byte.
  tz_options* ropts = nullptr;
  tz_options_new(&ropts);
  if (key) tz_options_set_key(ropts, key);
  tz_reader* r = nullptr;
  rc = tz_reader_open(&r, path.c_str(), ropts);
  if (accepted.empty()) {
    if (rc == TZ_OK) tz_reader_free(r);
  } else {
    if (rc != TZ_OK) fuzz_bug("reopen", tz_error_last());
    uint64_t count = 0;
    tz_reader_tensor_count(&count, r);
    if (count != accepted.size()) fuzz_bug("reopen", "tensor count differs from the accepted writes");
    for (uint64_t i = 0; i < count; ++i) {
      const Accepted& t = accepted[size_t(i)];
      tz_tensor_info ti = TZ_TENSOR_INFO_INIT;
      if (tz_reader_tensor_info(&ti, r, i) != TZ_OK) fuzz_bug("tensor_info", tz_error_last());
      if (std::string(reinterpret_cast<const char*>(ti.name), ti.name_len) != t.name ||
          std::string(ti.dtype, ti.dtype_len) != t.dtype || ti.ndim != t.shape.size() ||
          !std::equal(t.shape.begin(), t.shape.end(), ti.shape)) {
        fuzz_bug("tensor_info", "differs from what was written");
      }
      std::vector<uint8_t> got(size_t(ti.nbytes));
      if (tz_reader_read(r, i, got.data(), got.size(), TZ_READ_VERIFY_HASH) != TZ_OK) {
        fuzz_bug("verified read of a written tensor", tz_error_last());
      }
      std::vector<uint8_t> want = t.meta ? std::vector<uint8_t>(got.size(), 0) : t.data;
      if (t.swap && !t.meta) {
        for (size_t k = 0; k + t.swap_unit <= want.size(); k += t.swap_unit) {
          std::reverse(want.begin() + long(k), want.begin() + long(k + t.swap_unit));
        }
      }
      if (got != want) fuzz_bug("read back", "bytes differ from what was written");
    }
    tz_reader_free(r);
  }
  tz_key_free(key);
  tz_options_free(ropts);
  tz_options_free(opts);
  unlink(path.c_str());
  return 0;
}
