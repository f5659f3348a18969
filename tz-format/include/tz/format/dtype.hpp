#pragma once
// The dtype string of a tensor record: "<numpy typestr>" or
// "<numpy typestr>\0torch.<name>" for opaque dtypes (FORMAT.md §4.4).
#include <cstdint>
#include <string>
#include <string_view>

namespace tz::format {

struct DType {
  std::string text;        // the full string as stored
  char byte_order = '|';   // '<', '>', '|' or '=' ('=' is taken as little-endian)
  char kind = 0;           // numpy kind: b i u f c V
  uint32_t itemsize = 0;   // bytes per element
  bool opaque = false;     // kind 'V': raw bytes of a torch-only dtype
  std::string torch_name;  // name after "torch." when present, e.g. "bfloat16"

  // Elements need byte swapping on this (little-endian) host.
  bool needs_swap() const { return byte_order == '>' && itemsize > 1 && kind != 'b'; }
  // Width of one byte-swapped unit (complex numbers swap each half).
  uint32_t swap_unit() const { return kind == 'c' ? itemsize / 2 : itemsize; }
};

// Parses and validates a stored dtype string. Throws tz::Error(format).
DType parse_dtype(std::string_view text);

// Whether `name` (without "torch.") is a torch dtype name.
bool is_torch_dtype_name(std::string_view name);

}  // namespace tz::format
