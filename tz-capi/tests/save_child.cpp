// Saves a checkpoint for the save tests (test_capi_save.cpp), which kill it
// or race two of it: save_child PATH SEED COUNT BYTES writes COUNT tensors of
// BYTES bytes, one write call each, filled by fill_byte(SEED, i, k), then
// closes. Exit 0: saved; 3: replaced by another save (TZ_E_CONFLICT at
// close); 1: anything else.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "save_pattern.hpp"
#include "tensorizer.h"

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const char* path = argv[1];
  const unsigned seed = unsigned(std::atoi(argv[2]));
  const size_t count = size_t(std::atol(argv[3]));
  const size_t bytes = size_t(std::atol(argv[4]));
  tz_options* opts = nullptr;
  tz_options_new(&opts);
  tz_options_set(opts, "num_threads", "1");
  tz_writer* w = nullptr;
  if (tz_writer_open(&w, path, opts) != TZ_OK) {
    std::fprintf(stderr, "open: %s\n", tz_error_last());
    return 1;
  }
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < bytes; ++k) data[k] = tz_test::fill_byte(seed, i, k);
    const std::string name = "t" + std::to_string(i);
    uint64_t shape[1] = {bytes};
    tz_tensor_desc d = TZ_TENSOR_DESC_INIT;
    d.name = reinterpret_cast<const uint8_t*>(name.data());
    d.name_len = name.size();
    d.dtype = "|u1";
    d.dtype_len = 3;
    d.ndim = 1;
    d.shape = shape;
    d.tensor_type = TZ_TENSOR_STATE_DICT;
    d.data = data.data();
    d.data_size = bytes;
    if (tz_writer_write(w, &d, 1, 1) != TZ_OK) {
      std::fprintf(stderr, "write: %s\n", tz_error_last());
      return 1;
    }
  }
  const int rc = tz_writer_close(w);
  tz_writer_free(w);
  tz_options_free(opts);
  if (rc == TZ_E_CONFLICT) return 3;
  if (rc != TZ_OK) {
    std::fprintf(stderr, "close: %s\n", tz_error_last());
    return 1;
  }
  return 0;
}
