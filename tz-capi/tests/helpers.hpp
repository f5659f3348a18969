#pragma once
// Small helpers shared by the C ABI test files.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tensorizer.h"

namespace tz_test {

inline std::string temp_path(const char* name) {
  return std::string("/tmp/tz_capi_test_") + std::to_string(::getpid()) + "_" + name;
}

inline std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

inline void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline tz_tensor_desc desc(const std::string& name, const char* dtype, size_t dtype_len, std::vector<uint64_t>& shape,
                           const void* data, uint64_t size) {
  tz_tensor_desc d = TZ_TENSOR_DESC_INIT;
  d.name = reinterpret_cast<const uint8_t*>(name.data());
  d.name_len = name.size();
  d.dtype = dtype;
  d.dtype_len = dtype_len;
  d.ndim = uint32_t(shape.size());
  d.shape = shape.data();
  d.tensor_type = TZ_TENSOR_STATE_DICT;
  d.data = data;
  d.data_size = size;
  return d;
}

}  // namespace tz_test
