// Tensor header parser (tz-format): the first input byte picks long dims and
// whether a crypt_info block is present; the rest is the header's bytes.
// A parsed header must rebuild to a header that parses the same.
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "tz/format/container.hpp"
#include "tz/format/crypt_info.hpp"

using namespace tz::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return 0;
  const bool long_dims = data[0] & 1, crypt = data[0] & 2;
  // An exact-size copy, so reads past the header are reported.
  std::vector<uint8_t> bytes(data + 1, data + size);
  try {
    const TensorHeader h = parse_tensor_header(bytes.data(), bytes.size(), long_dims, crypt);
    for (const auto& he : h.hashes) {
      if (he.value_offset + he.value_length > bytes.size()) fuzz_bug("tensor header", "hash value past the header");
    }
    if (h.crypt_info_size && h.crypt_info_offset + h.crypt_info_size > bytes.size()) {
      fuzz_bug("tensor header", "crypt_info past the header");
    }
    const std::vector<uint8_t> hashed = hashable_header(bytes.data(), bytes.size(), h);
    if (hashed.size() != bytes.size() - h.crypt_info_size) fuzz_bug("tensor header", "hashable header size");
    std::vector<uint8_t> ci;
    if (h.crypt_info_size) {
      const uint8_t* body = bytes.data() + h.crypt_info_offset + 8;
      ci.assign(body, body + h.crypt_info_size - 8);
      try {
        parse_crypt_info(ci.data(), ci.size());
      } catch (const tz::Error& e) {
        expect_typed(e);
      }
    }
    HeaderSpec spec;
    spec.module_index = h.module_index;
    spec.type = h.type;
    spec.name = h.name;
    spec.dtype = h.dtype;
    spec.shape = h.shape.data();
    spec.ndim = h.shape.size();
    spec.long_dims = long_dims;
    spec.crypt_info = crypt ? &ci : nullptr;
    spec.data_length = uint64_t(h.data_length);
    if (h.name.size() <= 0xFFFF && h.dtype.size() <= 0xFF && h.shape.size() <= 0xFF) {
      const BuiltHeader b = build_tensor_header(spec);
      const TensorHeader again = parse_tensor_header(b.bytes.data(), b.bytes.size(), long_dims, crypt);
      if (again.name != h.name || again.dtype != h.dtype || again.shape != h.shape ||
          again.data_length != h.data_length || again.module_index != h.module_index) {
        fuzz_bug("tensor header", "rebuilt header parses differently");
      }
    }
  } catch (const tz::Error& e) {
    expect_typed(e);
  }
  return 0;
}
