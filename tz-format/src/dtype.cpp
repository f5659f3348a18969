#include "tz/format/dtype.hpp"

#include "tz/format/error.hpp"

namespace tz::format {
namespace {

// Every dtype name torch 2.x defines as an attribute of the torch module.
constexpr std::string_view kTorchDtypeNames[] = {
    "float32", "float", "float64", "double", "float16", "half", "bfloat16",
    "complex32", "chalf", "complex64", "cfloat", "complex128", "cdouble",
    "uint8", "int8", "int16", "short", "int32", "int", "int64", "long", "bool",
    "uint16", "uint32", "uint64",
    "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
    "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
};

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(char(c));
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

}  // namespace

bool is_torch_dtype_name(std::string_view name) {
  for (auto n : kTorchDtypeNames) {
    if (n == name) return true;
  }
  return false;
}

DType parse_dtype(std::string_view text) {
  DType dt;
  dt.text = std::string(text);
  const auto bad = [&](const std::string& why) {
    fail(Errc::format, "Invalid dtype '" + printable(text) + "': " + why);
  };
  std::string_view numpy_part = text;
  std::string_view torch_part;
  bool has_torch_part = false;
  if (auto sep = text.find('\0'); sep != std::string_view::npos) {
    numpy_part = text.substr(0, sep);
    torch_part = text.substr(sep + 1);
    has_torch_part = true;
    if (torch_part.find('\0') != std::string_view::npos) bad("multiple opaque dtype separators");
  }
  std::string_view s = numpy_part;
  if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
    dt.byte_order = s[0] == '=' ? '<' : s[0];
    s.remove_prefix(1);
  }
  if (s.empty()) bad("empty type");
  dt.kind = s[0];
  s.remove_prefix(1);
  if (s.empty() || s.size() > 3) bad("bad item size");
  uint32_t size = 0;
  for (char c : s) {
    if (c < '0' || c > '9') bad("bad item size");
    size = size * 10 + uint32_t(c - '0');
  }
  dt.itemsize = size;
  switch (dt.kind) {
    case 'b':
      if (size != 1) bad("bool must be 1 byte");
      break;
    case 'i':
    case 'u':
      if (size != 1 && size != 2 && size != 4 && size != 8) bad("unsupported integer width");
      break;
    case 'f':
      if (size != 2 && size != 4 && size != 8) bad("unsupported float width");
      break;
    case 'c':
      if (size != 8 && size != 16) bad("unsupported complex width");
      break;
    case 'V':
      if (size != 1 && size != 2 && size != 4 && size != 8) bad("unsupported opaque width");
      dt.opaque = true;
      break;
    default:
      bad("unsupported kind");
  }
  // Readers ignore the torch part of a native numpy dtype, as upstream does.
  if (has_torch_part && dt.opaque) {
    constexpr std::string_view prefix = "torch.";
    if (torch_part.substr(0, prefix.size()) != prefix ||
        !is_torch_dtype_name(torch_part.substr(prefix.size()))) {
      fail(Errc::format, "Invalid torch_dtype: '" + printable(torch_part) + "'");
    }
    dt.torch_name = std::string(torch_part.substr(prefix.size()));
  }
  if (dt.opaque && !has_torch_part) {
    fail(Errc::format,
         "Tried to decode a tensor stored as opaque data, but no torch dtype was specified");
  }
  return dt;
}

}  // namespace tz::format
