#include <catch2/catch.hpp>

#include "tz/format/dtype.hpp"
#include "tz/format/error.hpp"

using namespace tz::format;
using namespace std::string_literals;

namespace {
tz::Errc code_of(const std::string& s) {
  try {
    parse_dtype(s);
  } catch (const tz::Error& e) {
    return e.code();
  }
  return tz::Errc::internal;
}
}  // namespace

TEST_CASE("native dtype strings") {
  struct Case { const char* s; char kind; uint32_t size; };
  for (auto c : {Case{"<f2", 'f', 2}, Case{"<f4", 'f', 4}, Case{"<f8", 'f', 8}, Case{"<c8", 'c', 8},
                 Case{"<c16", 'c', 16}, Case{"|i1", 'i', 1}, Case{"<i2", 'i', 2}, Case{"<i4", 'i', 4},
                 Case{"<i8", 'i', 8}, Case{"|u1", 'u', 1}, Case{"<u2", 'u', 2}, Case{"<u4", 'u', 4},
                 Case{"<u8", 'u', 8}, Case{"|b1", 'b', 1}}) {
    const DType d = parse_dtype(c.s);
    CHECK(d.kind == c.kind);
    CHECK(d.itemsize == c.size);
    CHECK_FALSE(d.opaque);
    CHECK_FALSE(d.needs_swap());
  }
}

TEST_CASE("opaque dtype strings") {
  const DType bf = parse_dtype("<V2\0torch.bfloat16"s);
  CHECK(bf.opaque);
  CHECK(bf.itemsize == 2);
  CHECK(bf.torch_name == "bfloat16");
  CHECK(parse_dtype("<V4\0torch.complex32"s).itemsize == 4);
  CHECK(parse_dtype("|V1\0torch.float8_e4m3fn"s).torch_name == "float8_e4m3fn");
  CHECK(parse_dtype("<V2\0torch.uint16"s).opaque);
  // A torch suffix on a native type is accepted and ignored by readers.
  CHECK_FALSE(parse_dtype("<f4\0torch.float32"s).opaque);
  CHECK(parse_dtype("<f4\0torch.nonsense"s).itemsize == 4);
}

TEST_CASE("big-endian dtypes are swapped per unit") {
  CHECK(parse_dtype(">f4").needs_swap());
  CHECK(parse_dtype(">c8").swap_unit() == 4);
  CHECK_FALSE(parse_dtype("|u1").needs_swap());
}

TEST_CASE("invalid dtype strings") {
  CHECK(code_of("<V2") == tz::Errc::format);                              // opaque with no torch dtype
  CHECK(code_of("<V2\0torch.bfloat16\0x"s) == tz::Errc::format);          // two separators
  CHECK(code_of("<V2\0torch.nonsense"s) == tz::Errc::format);
  CHECK(code_of("<V2\0numpy.float16"s) == tz::Errc::format);
  CHECK(code_of("<V3\0torch.bfloat16"s) == tz::Errc::format);
  CHECK(code_of("") == tz::Errc::format);
  CHECK(code_of("<") == tz::Errc::format);
  CHECK(code_of("<x4") == tz::Errc::format);
  CHECK(code_of("<f3") == tz::Errc::format);
  CHECK(code_of("<f99999") == tz::Errc::format);
  CHECK(code_of("<O8") == tz::Errc::format);
}
