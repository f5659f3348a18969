// Tests of the C ABI: round trips, byte-exact output, error codes, vectors.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "tensorizer.h"
#include "tz/format/hash.hpp"

using namespace tz_test;


TEST_CASE("version and status names") {
  // The library reports the version its header was generated with (CMake's project version).
  REQUIRE(std::string(tz_version()) == std::to_string(TZ_VERSION_MAJOR) + "." + std::to_string(TZ_VERSION_MINOR) +
                                           "." + std::to_string(TZ_VERSION_PATCH));
  REQUIRE(std::string(tz_status_name(TZ_E_HASH)) == "TZ_E_HASH");
  REQUIRE(std::string(tz_status_name(12345)) == "TZ_E_UNKNOWN");
}

// Expects `rc` to be TZ_E_INVALID_ARG with a message that names `what`.
static void check_rejected(int rc, const char* what) {
  CHECK(rc == TZ_E_INVALID_ARG);
  CHECK(std::string(tz_error_last()).find(what) != std::string::npos);
}

TEST_CASE("versioned structs: unknown versions are rejected, naming the struct") {
  const std::string path = temp_path("versions.tensors");
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  float data[2] = {1, 2};
  std::vector<uint64_t> shape{2};
  const std::string a = "a", b = "b";
  tz_tensor_desc d[2] = {desc(a, "<f4", 3, shape, data, sizeof data), desc(b, "<f4", 3, shape, data, sizeof data)};
  CHECK(d[0].version == TZ_TENSOR_DESC_VERSION);
  for (uint32_t bad : {0u, uint32_t(TZ_TENSOR_DESC_VERSION + 1)}) {
    d[0].version = bad;
    check_rejected(tz_writer_write(w, d, 2, 0), "tz_tensor_desc.version");
  }
  // A later element that differs from the first: the stride would be wrong.
  d[0].version = TZ_TENSOR_DESC_VERSION;
  d[1].version = 0;
  check_rejected(tz_writer_write(w, d, 2, 0), "tz_tensor_desc[1].version");
  d[1].version = TZ_TENSOR_DESC_VERSION;

  tz_writer_state st = TZ_WRITER_STATE_INIT;
  REQUIRE(tz_writer_state_get(&st, w) == TZ_OK);
  CHECK(st.tensor_count == 0);  // nothing of the rejected calls was written
  REQUIRE(tz_writer_write(w, d, 2, 0) == TZ_OK);
  st.version = 0;
  check_rejected(tz_writer_state_get(&st, w), "tz_writer_state");
  st.version = TZ_WRITER_STATE_VERSION + 1;
  check_rejected(tz_writer_state_get(&st, w), "tz_writer_state");
  st.version = TZ_WRITER_STATE_VERSION;
  REQUIRE(tz_writer_state_get(&st, w) == TZ_OK);
  CHECK(st.version == TZ_WRITER_STATE_VERSION);  // the library never changes it
  CHECK(st.tensor_count == 2);
  REQUIRE(tz_writer_close(w) == TZ_OK);
  tz_writer_free(w);

  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), nullptr) == TZ_OK);
  tz_file_info fi = TZ_FILE_INFO_INIT;
  fi.version = 0;
  check_rejected(tz_reader_file_info(&fi, r), "tz_file_info");
  CHECK(fi.tensor_count == 0);  // a rejected out-param is left alone
  fi.version = TZ_FILE_INFO_VERSION + 1;
  check_rejected(tz_reader_file_info(&fi, r), "tz_file_info");
  fi.version = TZ_FILE_INFO_VERSION;
  REQUIRE(tz_reader_file_info(&fi, r) == TZ_OK);
  CHECK(fi.version == TZ_FILE_INFO_VERSION);
  CHECK(fi.tensor_count == 2);

  tz_tensor_info info = TZ_TENSOR_INFO_INIT;
  info.version = 0;
  check_rejected(tz_reader_tensor_info(&info, r, 0), "tz_tensor_info");
  CHECK(info.name == nullptr);
  info.version = TZ_TENSOR_INFO_VERSION + 1;
  check_rejected(tz_reader_tensor_info(&info, r, 0), "tz_tensor_info");
  info.version = TZ_TENSOR_INFO_VERSION;
  REQUIRE(tz_reader_tensor_info(&info, r, 1) == TZ_OK);
  CHECK(info.version == TZ_TENSOR_INFO_VERSION);
  CHECK(std::string(reinterpret_cast<const char*>(info.name), info.name_len) == "b");

  float out0[2] = {}, out1[2] = {};
  tz_read_request reqs[2] = {TZ_READ_REQUEST_INIT, TZ_READ_REQUEST_INIT};
  reqs[0].index = 0;
  reqs[0].dst = out0;
  reqs[0].dst_size = sizeof out0;
  reqs[1].index = 1;
  reqs[1].dst = out1;
  reqs[1].dst_size = sizeof out1;
  reqs[0].version = TZ_READ_REQUEST_VERSION + 1;
  check_rejected(tz_reader_read_batch(r, reqs, 2, 0, 0, nullptr), "tz_read_request.version");
  reqs[0].version = TZ_READ_REQUEST_VERSION;
  reqs[1].version = 0;
  check_rejected(tz_reader_read_batch(r, reqs, 2, 0, 0, nullptr), "tz_read_request[1].version");
  CHECK(out1[0] == 0);  // nothing was read
  reqs[1].version = TZ_READ_REQUEST_VERSION;
  REQUIRE(tz_reader_read_batch(r, reqs, 2, TZ_READ_VERIFY_HASH, 0, nullptr) == TZ_OK);
  CHECK(std::memcmp(out1, data, sizeof data) == 0);
  tz_reader_free(r);
  std::remove(path.c_str());
}

TEST_CASE("free functions accept NULL") {
  tz_reader_free(nullptr);
  tz_source_free(nullptr);
  tz_sink_free(nullptr);
  tz_writer_free(nullptr);
  tz_options_free(nullptr);
  tz_key_free(nullptr);
}

TEST_CASE("FORMAT.md worked example is written byte for byte") {
  const std::string path = temp_path("a1.tensors");
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  float data[6] = {0, 1, 2, 3, 4, 5};
  std::vector<uint64_t> shape{2, 3};
  const std::string name = "a";
  tz_tensor_desc d = desc(name, "<f4", 3, shape, data, sizeof data);
  REQUIRE(tz_writer_write(w, &d, 1, 0) == TZ_OK);
  tz_writer_state st = TZ_WRITER_STATE_INIT;
  REQUIRE(tz_writer_state_get(&st, w) == TZ_OK);
  CHECK(st.data_version == 1);
  CHECK(st.tensor_count == 1);
  CHECK(st.tensor_data_size == 24);
  REQUIRE(tz_writer_close(w) == TZ_OK);
  tz_writer_free(w);

  const auto bytes = slurp(path);
  REQUIRE(bytes.size() == 262327);
  // Spot checks from the hex dump in FORMAT.md §4.9.
  const uint8_t crc[4] = {0x2b, 0x57, 0xa4, 0x58};
  CHECK(std::memcmp(bytes.data() + 0x40049 + 8 + 2 + 1 + 2 + 1 + 1 + 3 + 1 + 8 + 2 + 1 + 2, crc, 4) == 0);
  const uint8_t sha_start[4] = {0xe8, 0xe3, 0xd0, 0x14};
  CHECK(std::memcmp(bytes.data() + 0x40049 + 38, sha_start, 4) == 0);
  tz::format::Sha256 whole;
  whole.update(bytes.data(), bytes.size());
  const auto digest = whole.finish();
  static const char* hexd = "0123456789abcdef";
  std::string hex;
  for (uint8_t c : digest) hex += {hexd[c >> 4], hexd[c & 15]};
  CHECK(hex == "668e9705131715375605e91e604d186cd362a73286f4c1d99d0e57834a2ab291");

  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), nullptr) == TZ_OK);
  uint64_t n = 0;
  REQUIRE(tz_reader_tensor_count(&n, r) == TZ_OK);
  REQUIRE(n == 1);
  tz_tensor_info info = TZ_TENSOR_INFO_INIT;
  REQUIRE(tz_reader_tensor_info(&info, r, 0) == TZ_OK);
  CHECK(info.module_index == -1);
  CHECK(info.nbytes == 24);
  CHECK(info.ndim == 2);
  CHECK(info.shape[1] == 3);
  CHECK(info.path_len == 1);
  CHECK(std::string(info.path[0].str, info.path[0].str_len) == "a");
  float out[6] = {};
  REQUIRE(tz_reader_read(r, 0, out, sizeof out, TZ_READ_VERIFY_HASH) == TZ_OK);
  CHECK(std::memcmp(out, data, sizeof data) == 0);
  REQUIRE(tz_reader_tensor_info(&info, r, 0) == TZ_OK);
  CHECK(info.module_index == 0);
  REQUIRE(tz_reader_verify_bytes(r, 0, data, sizeof data) == TZ_OK);
  data[0] = 9;
  CHECK(tz_reader_verify_bytes(r, 0, data, sizeof data) == TZ_E_HASH);
  CHECK(std::string(tz_error_last()).find("failed CRC32 verification") != std::string::npos);

  // The stored hashes, exactly as in the file (the same bytes as above).
  size_t count = 0;
  REQUIRE(tz_reader_tensor_hashes(nullptr, 0, &count, r, 0) == TZ_OK);
  REQUIRE(count == 2);
  tz_tensor_hash hashes[2] = {TZ_TENSOR_HASH_INIT, TZ_TENSOR_HASH_INIT};
  REQUIRE(tz_reader_tensor_hashes(hashes, 2, &count, r, 0) == TZ_OK);
  CHECK(hashes[0].type == TZ_HASH_CRC32);
  CHECK(hashes[0].length == 4);
  CHECK(std::memcmp(hashes[0].value, crc, 4) == 0);
  CHECK(hashes[1].type == TZ_HASH_SHA256);
  CHECK(hashes[1].length == 32);
  CHECK(std::memcmp(hashes[1].value, sha_start, 4) == 0);
  tz_tensor_hash one = TZ_TENSOR_HASH_INIT;
  REQUIRE(tz_reader_tensor_hashes(&one, 1, &count, r, 0) == TZ_OK);  // fewer than stored: count says all
  CHECK(count == 2);
  CHECK(one.type == TZ_HASH_CRC32);
  CHECK(tz_reader_tensor_hashes(&one, 1, &count, r, 1) == TZ_E_NOT_FOUND);
  CHECK(tz_reader_tensor_hashes(nullptr, 1, &count, r, 0) == TZ_E_INVALID_ARG);
  tz_tensor_hash unversioned{};
  CHECK(tz_reader_tensor_hashes(&unversioned, 1, &count, r, 0) == TZ_E_INVALID_ARG);
  tz_reader_free(r);
  std::remove(path.c_str());
}

TEST_CASE("batch round trip with structured names, meta, empty and opaque tensors") {
  const std::string path = temp_path("mixed.tensors");
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  std::vector<uint8_t> big(40u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 2654435761u >> 13);
  std::vector<uint64_t> big_shape{big.size()};
  std::vector<uint64_t> meta_shape{3, 4};
  std::vector<uint64_t> empty_shape{0, 4};
  std::vector<uint64_t> bf_shape{2};
  const uint16_t bf[2] = {0x3f80, 0xc000};
  const std::string n_big = "\x1e[\"model\",\"layer\",0,\"w\"]";
  const std::string n_meta = "meta", n_empty = "empty", n_bf = "bf";
  static const char bf_dtype[] = "<V2\0torch.bfloat16";
  std::vector<tz_tensor_desc> d{
      desc(n_big, "|u1", 3, big_shape, big.data(), big.size()),
      desc(n_meta, "<f4", 3, meta_shape, nullptr, 0),
      desc(n_empty, "<f2", 3, empty_shape, nullptr, 0),
      desc(n_bf, bf_dtype, sizeof bf_dtype - 1, bf_shape, bf, sizeof bf),
  };
  d[1].is_meta = 1;
  REQUIRE(tz_writer_write(w, d.data(), d.size(), 2) == TZ_OK);
  tz_writer_state st = TZ_WRITER_STATE_INIT;
  REQUIRE(tz_writer_state_get(&st, w) == TZ_OK);
  CHECK(st.data_version == 4);
  tz_writer_free(w);  // closes

  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), nullptr) == TZ_OK);
  tz_tensor_info info = TZ_TENSOR_INFO_INIT;
  REQUIRE(tz_reader_tensor_info(&info, r, 0) == TZ_OK);
  REQUIRE(info.path_len == 4);
  CHECK(info.path[2].is_index == 1);
  CHECK(info.path[2].index == 0);
  REQUIRE(tz_reader_tensor_info(&info, r, 1) == TZ_OK);
  CHECK(info.is_meta == 1);
  REQUIRE(tz_reader_tensor_info(&info, r, 3) == TZ_OK);
  CHECK(info.is_opaque == 1);
  CHECK(std::string(info.torch_dtype) == "bfloat16");

  std::vector<uint8_t> out_big(big.size());
  std::vector<float> out_meta(12, 7.0f);
  uint16_t out_bf[2] = {};
  const tz_read_request reqs[] = {
      {TZ_READ_REQUEST_VERSION, 0, out_big.data(), out_big.size()},
      {TZ_READ_REQUEST_VERSION, 1, out_meta.data(), out_meta.size() * 4},
      {TZ_READ_REQUEST_VERSION, 2, nullptr, 0},
      {TZ_READ_REQUEST_VERSION, 3, out_bf, sizeof out_bf},
  };
  for (uint32_t flags : {TZ_READ_VERIFY_HASH, TZ_READ_NO_VERIFY_HASH}) {
    size_t failed = 99;
    REQUIRE(tz_reader_read_batch(r, reqs, 4, flags, 3, &failed) == TZ_OK);
    CHECK(out_big == big);
    CHECK(out_meta == std::vector<float>(12, 0.0f));
    CHECK(out_bf[1] == 0xc000);
  }
  tz_reader_free(r);
  std::remove(path.c_str());
}

TEST_CASE("writer refuses bad input without changing the file") {
  const std::string path = temp_path("refuse.tensors");
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  float v = 1;
  std::vector<uint64_t> shape{1};
  const std::string a = "a", a_b = "\x1e[\"a\",\"b\"]", empty, rs = "\x1e[1]x", noncanon = "\x1e[\"a\"]";
  tz_tensor_desc d = desc(a, "<f4", 3, shape, &v, 4);
  REQUIRE(tz_writer_write(w, &d, 1, 0) == TZ_OK);
  CHECK(tz_writer_write(w, &d, 1, 0) == TZ_E_CONFLICT);
  tz_tensor_desc d2 = desc(a_b, "<f4", 3, shape, &v, 4);
  CHECK(tz_writer_write(w, &d2, 1, 0) == TZ_E_CONFLICT);
  tz_tensor_desc d3 = desc(empty, "<f4", 3, shape, &v, 4);
  CHECK(tz_writer_write(w, &d3, 1, 0) == TZ_E_INVALID_ARG);
  tz_tensor_desc d4 = desc(rs, "<f4", 3, shape, &v, 4);
  CHECK(tz_writer_write(w, &d4, 1, 0) == TZ_E_INVALID_ARG);
  tz_tensor_desc d5 = desc(noncanon, "<f4", 3, shape, &v, 4);
  CHECK(tz_writer_write(w, &d5, 1, 0) == TZ_E_INVALID_ARG);
  const std::string b = "b";
  tz_tensor_desc d6 = desc(b, "<f4", 3, shape, &v, 4);
  d6.module_index = 70000;
  CHECK(tz_writer_write(w, &d6, 1, 0) == TZ_E_LIMIT);
  tz_tensor_desc d7 = desc(b, "<f4", 3, shape, &v, 3);
  CHECK(tz_writer_write(w, &d7, 1, 0) == TZ_E_INVALID_ARG);
  // The refused calls left "b" free and the file at one tensor.
  tz_tensor_desc d8 = desc(b, "<f4", 3, shape, &v, 4);
  REQUIRE(tz_writer_write(w, &d8, 1, 0) == TZ_OK);
  tz_writer_state st = TZ_WRITER_STATE_INIT;
  REQUIRE(tz_writer_state_get(&st, w) == TZ_OK);
  CHECK(st.tensor_count == 2);
  tz_writer_free(w);
  std::remove(path.c_str());
}

TEST_CASE("metadata larger than the standard reserve works on the first write call") {
  const std::string path = temp_path("bigmeta.tensors");
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  const size_t count = 2000;
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) names.push_back("n" + std::to_string(i) + std::string(200, 'x'));
  std::vector<uint64_t> shape{1};
  float v = 2;
  std::vector<tz_tensor_desc> d;
  for (auto& n : names) d.push_back(desc(n, "<f4", 3, shape, &v, 4));
  REQUIRE(tz_writer_write(w, d.data(), d.size(), 0) == TZ_OK);
  const std::string late = "late" + std::string(200, 'y');
  std::vector<tz_tensor_desc> more;
  std::vector<std::string> more_names;
  for (int i = 0; i < 200; ++i) more_names.push_back(late + std::to_string(i));
  for (auto& n : more_names) more.push_back(desc(n, "<f4", 3, shape, &v, 4));
  CHECK(tz_writer_write(w, more.data(), more.size(), 0) == TZ_E_LIMIT);
  CHECK(std::string(tz_error_last()) == "Metadata overflow");
  tz_writer_free(w);

  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), nullptr) == TZ_OK);
  tz_file_info fi = TZ_FILE_INFO_INIT;
  REQUIRE(tz_reader_file_info(&fi, r) == TZ_OK);
  CHECK(fi.tensor_count == count);
  CHECK(fi.metadata_length > 262144);
  float out = 0;
  REQUIRE(tz_reader_read(r, count - 1, &out, 4, TZ_READ_VERIFY_HASH) == TZ_OK);
  CHECK(out == 2);
  tz_reader_free(r);
  std::remove(path.c_str());
}

TEST_CASE("hostile files give typed errors") {
  const std::string good = temp_path("good.tensors");
  {
    tz_writer* w = nullptr;
    REQUIRE(tz_writer_open(&w, good.c_str(), nullptr) == TZ_OK);
    std::vector<float> v(100, 1.5f);
    std::vector<uint64_t> shape{100};
    const std::string name = "w";
    tz_tensor_desc d = desc(name, "<f4", 3, shape, v.data(), 400);
    REQUIRE(tz_writer_write(w, &d, 1, 0) == TZ_OK);
    tz_writer_free(w);
  }
  const auto bytes = slurp(good);
  const std::string bad = temp_path("bad.tensors");
  auto open_status = [&](const std::vector<uint8_t>& b) {
    spit(bad, b);
    tz_reader* r = nullptr;
    int rc = tz_reader_open(&r, bad.c_str(), nullptr);
    if (rc == TZ_OK) {
      std::vector<float> out(100);
      rc = tz_reader_read(r, 0, out.data(), 400, TZ_READ_VERIFY_HASH);
      tz_reader_free(r);
    }
    return rc;
  };
  CHECK(open_status(bytes) == TZ_OK);
  // Every truncation point fails with a typed error, never a crash or success.
  for (size_t cut : {size_t(0), size_t(3), size_t(8), size_t(40), size_t(70), size_t(80), size_t(262217),
                     size_t(262230), bytes.size() - 9, bytes.size() - 100}) {
    std::vector<uint8_t> t(bytes.begin(), bytes.begin() + long(cut));
    const int rc = open_status(t);
    INFO("cut at " << cut);
    CHECK(rc != TZ_OK);
    CHECK((rc == TZ_E_FORMAT || rc == TZ_E_TRUNCATED));
  }
  auto patched = [&](size_t off, uint8_t value) {
    auto b = bytes;
    b[off] = value;
    return b;
  };
  CHECK(open_status(patched(0, 'X')) == TZ_E_FORMAT);
  CHECK(open_status(patched(5, 0)) == TZ_E_VERSION);
  CHECK(open_status(patched(5, 6)) == TZ_E_VERSION);
  CHECK(open_status(patched(9, 4)) == TZ_E_FORMAT);
  CHECK(open_status(patched(9, 2)) == TZ_E_FORMAT);         // versioned metadata needs v5
  CHECK(open_status(patched(57, 0)) == TZ_E_FORMAT);        // empty index
  CHECK(open_status(patched(64, 0x40)) == TZ_E_FORMAT);     // absurd count
  CHECK(open_status(patched(72, 0x10)) == TZ_E_TRUNCATED);  // metadata length past the end
  CHECK(open_status(patched(bytes.size() - 9, 0x55)) == TZ_E_HASH);
  std::remove(good.c_str());
  std::remove(bad.c_str());
}

#ifdef TZ_VECTORS_DIR
TEST_CASE("upstream vectors open and verify") {
  for (const char* name : {"v1_plain", "v2_opaque", "v4_meta", "module", "structured", "big_plain"}) {
    const std::string path = std::string(TZ_VECTORS_DIR) + "/" + name + ".tensors";
    tz_reader* r = nullptr;
    INFO(name);
    REQUIRE(tz_reader_open(&r, path.c_str(), nullptr) == TZ_OK);
    uint64_t n = 0;
    REQUIRE(tz_reader_tensor_count(&n, r) == TZ_OK);
    std::vector<std::vector<uint8_t>> bufs(n);
    std::vector<tz_read_request> reqs(n);
    for (uint64_t i = 0; i < n; ++i) {
      tz_tensor_info info = TZ_TENSOR_INFO_INIT;
      REQUIRE(tz_reader_tensor_info(&info, r, i) == TZ_OK);
      bufs[i].resize(info.nbytes);
      reqs[i] = {TZ_READ_REQUEST_VERSION, i, bufs[i].data(), info.nbytes};
    }
    REQUIRE(tz_reader_read_batch(r, reqs.data(), n, TZ_READ_VERIFY_HASH, 0, nullptr) == TZ_OK);
    tz_reader_free(r);
  }
  for (const char* name : {"enc_random", "enc_password"}) {
    const std::string path = std::string(TZ_VECTORS_DIR) + "/" + name + ".tensors";
    tz_reader* r = nullptr;
    CHECK(tz_reader_open(&r, path.c_str(), nullptr) == TZ_E_CRYPTO);
    CHECK(r == nullptr);
  }
}
#endif

TEST_CASE("reader options") {
  tz_options* o = nullptr;
  REQUIRE(tz_options_new(&o) == TZ_OK);
  CHECK(tz_options_set(o, "num_threads", "0") == TZ_E_INVALID_ARG);
  CHECK(tz_options_set(o, "no_such_option", "1") == TZ_E_INVALID_ARG);
  CHECK(tz_options_set(o, "huge_pages", "maybe") == TZ_E_INVALID_ARG);
  REQUIRE(tz_options_set(o, "num_threads", "3") == TZ_OK);
  REQUIRE(tz_options_set(o, "huge_pages", "1") == TZ_OK);
  REQUIRE(tz_options_set(o, "direct_io", "1") == TZ_OK);
  REQUIRE(tz_options_set(o, "verify_hash", "1") == TZ_OK);
  const std::string path = temp_path("opts.tensors");
  std::vector<uint8_t> data(8u << 20, 7);
  std::vector<uint64_t> shape{data.size()};
  const std::string name = "big";
  tz_writer* w = nullptr;
  CHECK(tz_writer_open(&w, path.c_str(), o) == TZ_E_INVALID_ARG);  // reader-only keys
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  tz_tensor_desc d = desc(name, "|u1", 3, shape, data.data(), data.size());
  REQUIRE(tz_writer_write(w, &d, 1, 0) == TZ_OK);
  tz_writer_free(w);
  tz_reader* r = nullptr;
  REQUIRE(tz_reader_open(&r, path.c_str(), o) == TZ_OK);
  tz_options_free(o);  // the reader keeps no reference to the options
  std::vector<uint8_t> out(data.size() + 4096);
  // Unaligned destination: O_DIRECT falls back to cached reads for it.
  REQUIRE(tz_reader_read(r, 0, out.data() + 1, data.size(), 0) == TZ_OK);
  CHECK(std::equal(data.begin(), data.end(), out.begin() + 1));
  tz_reader_free(r);
  std::remove(path.c_str());
}

TEST_CASE("an empty meta tensor raises the data version to 4, as upstream") {
  const std::string path = temp_path("emptymeta.tensors");
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  std::vector<uint64_t> shape{0, 3};
  const std::string name = "m";
  tz_tensor_desc d = desc(name, "<f4", 3, shape, nullptr, 0);
  d.is_meta = 1;
  REQUIRE(tz_writer_write(w, &d, 1, 0) == TZ_OK);
  tz_writer_state st = TZ_WRITER_STATE_INIT;
  REQUIRE(tz_writer_state_get(&st, w) == TZ_OK);
  CHECK(st.data_version == 4);
  tz_writer_free(w);
  std::remove(path.c_str());
}

TEST_CASE("raw sources: size, exact reads, the end, and no response headers for files") {
  const std::string path = temp_path("raw_source.bin");
  std::vector<uint8_t> bytes(70000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7 + (i >> 9));
  spit(path, bytes);
  tz_source* src = nullptr;
  REQUIRE(tz_source_open(&src, path.c_str(), nullptr) == TZ_OK);
  uint64_t size = 0;
  REQUIRE(tz_source_size(&size, src) == TZ_OK);
  CHECK(size == bytes.size());
  std::vector<uint8_t> got(1000);
  REQUIRE(tz_source_read(src, 65000, got.data(), got.size()) == TZ_OK);
  CHECK(std::equal(got.begin(), got.end(), bytes.begin() + 65000));
  CHECK(tz_source_read(src, 69500, got.data(), got.size()) == TZ_E_TRUNCATED);
  const char* headers = nullptr;
  size_t headers_len = 99;
  REQUIRE(tz_source_response_headers(&headers, &headers_len, src) == TZ_OK);
  CHECK(headers != nullptr);
  CHECK(headers_len == 0);
  CHECK(tz_source_response_headers(nullptr, &headers_len, src) == TZ_E_INVALID_ARG);
  tz_source_free(src);
  std::remove(path.c_str());
}
