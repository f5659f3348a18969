#pragma once
// Typed errors shared by every tz component. The numeric values are the
// pinned TZ_E_* codes of <tensorizer.h>, so the C boundary maps them 1:1.
#include <stdexcept>
#include <string>

namespace tz {

enum class Errc : int {
  invalid_arg = -1,
  io = -2,
  not_found = -3,
  format = -4,
  version = -5,
  truncated = -6,
  hash = -7,
  conflict = -8,
  limit = -9,
  crypto = -10,
  unsupported = -11,
  state = -12,
  nomem = -13,
  internal = -99,
};

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

[[noreturn]] inline void fail(Errc code, const std::string& message) { throw Error(code, message); }

}  // namespace tz
