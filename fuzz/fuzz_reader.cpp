// The whole reader through the C ABI, on the input as an in-memory file
// (a memfd): open, file info, every tensor's info, then read every tensor
// with and without TZ_READ_VERIFY_HASH; opened plainly, with "metadata_only",
// with a fixed exact key and with a password (cheap derivations only).
// Every failure must be a typed status; a read that succeeds fills the
// whole destination.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "tensorizer.h"

namespace {

// The key and password of the encrypted seeds (fuzz/make_seeds.py).
const uint8_t kKey[32] = {0x46, 0x55, 0x5a, 0x5a, 0x2d, 0x6b, 0x65, 0x79, 1, 2, 3, 4, 5, 6, 7, 8,
                          9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24};
const char kPassword[] = "fuzz password";

void check_status(int rc) {
  if (rc == TZ_E_INTERNAL || rc == TZ_E_NOMEM) fuzz_bug(tz_status_name(rc), tz_error_last());
  if (rc != TZ_OK && std::strlen(tz_error_last()) == 0) fuzz_bug("error without a message", tz_status_name(rc));
}

void exercise(const std::string& path, tz_options* opts) {
  tz_reader* r = nullptr;
  int rc = tz_reader_open(&r, path.c_str(), opts);
  check_status(rc);
  if (rc != TZ_OK) return;
  tz_file_info fi = TZ_FILE_INFO_INIT;
  check_status(tz_reader_file_info(&fi, r));
  uint64_t count = 0;
  check_status(tz_reader_tensor_count(&count, r));
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < count; ++i) {
    tz_tensor_info ti = TZ_TENSOR_INFO_INIT;
    rc = tz_reader_tensor_info(&ti, r, i);
    check_status(rc);
    if (rc != TZ_OK || ti.nbytes > kMaxTensorBytes) continue;
    for (uint32_t flags : {TZ_READ_NO_VERIFY_HASH, TZ_READ_VERIFY_HASH}) {
      buf.assign(size_t(ti.nbytes) + 1, 0xA5);
      rc = tz_reader_read(r, i, buf.data(), ti.nbytes, flags);
      check_status(rc);
      if (buf[size_t(ti.nbytes)] != 0xA5) fuzz_bug("tz_reader_read", "wrote past the destination");
    }
  }
  // All at once too, through the batch path.
  std::vector<std::vector<uint8_t>> dsts;
  std::vector<tz_read_request> reqs;
  for (uint64_t i = 0; i < count && i < 64; ++i) {
    tz_tensor_info ti = TZ_TENSOR_INFO_INIT;
    if (tz_reader_tensor_info(&ti, r, i) != TZ_OK || ti.nbytes > kMaxTensorBytes) continue;
    dsts.emplace_back(size_t(ti.nbytes));
    tz_read_request q = TZ_READ_REQUEST_INIT;
    q.index = i;
    q.dst = dsts.back().data();
    q.dst_size = ti.nbytes;
    reqs.push_back(q);
  }
  if (!reqs.empty()) {
    size_t failed = 0;
    check_status(tz_reader_read_batch(r, reqs.data(), reqs.size(), TZ_READ_VERIFY_HASH, 1, &failed));
  }
  tz_reader_free(r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  const int fd = memfd_create("fuzz_reader", MFD_CLOEXEC);
  if (fd < 0) fuzz_bug("memfd_create", std::strerror(errno));
  for (size_t off = 0; off < size;) {
    const ssize_t n = write(fd, data + off, size - off);
    if (n <= 0) fuzz_bug("write", std::strerror(errno));
    off += size_t(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  tz_options* opts = nullptr;
  tz_options_new(&opts);
  tz_options_set(opts, "num_threads", "1");
  // Only cheap derivations: the fuzzer looks for crashes, not for slow Argon2.
  tz_options_set(opts, "kdf_max_opslimit", "1");
  tz_options_set(opts, "kdf_max_memlimit", "8192");
  exercise(path, opts);

  tz_options_set(opts, "metadata_only", "1");
  exercise(path, opts);
  tz_options_set(opts, "metadata_only", "0");

  tz_key* key = nullptr;
  if (tz_key_new_from_bytes(&key, kKey, sizeof kKey) != TZ_OK) fuzz_bug("key", tz_error_last());
  tz_options_set_key(opts, key);
  exercise(path, opts);
  tz_key_free(key);

  if (tz_key_new_password(&key, kPassword, sizeof kPassword - 1) != TZ_OK) fuzz_bug("key", tz_error_last());
  tz_options_set_key(opts, key);
  exercise(path, opts);
  tz_key_free(key);

  tz_options_free(opts);
  close(fd);
  return 0;
}
