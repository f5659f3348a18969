#pragma once
// Shared by the fuzz targets. Each target defines LLVMFuzzerTestOneInput; it
// is linked either with libFuzzer (clang, `make fuzz-build`) or with
// replay_main.cpp, which runs it over files so the regression inputs are
// replayed by ctest in every build, clang or not.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tz/format/error.hpp"

// Inputs above this size are skipped: the interesting structure is in the
// first bytes, and larger inputs only slow the search.
inline constexpr size_t kMaxInput = size_t(1) << 20;
// Tensors whose in-memory size exceeds this are not read: a file may declare
// any size for a meta tensor, and the harness, not the library, would pay.
inline constexpr uint64_t kMaxTensorBytes = uint64_t(4) << 20;

// A finding: stops the run the way a sanitizer would, so libFuzzer keeps the input.
[[noreturn]] inline void fuzz_bug(const char* what, const char* detail) {
  std::fprintf(stderr, "FUZZ BUG: %s: %s\n", what, detail ? detail : "");
  std::abort();
}

// Hostile input must end in a typed error: anything else (internal, out of
// memory from a small input) is a bug.
inline void expect_typed(const tz::Error& e) {
  if (e.code() == tz::Errc::internal || e.code() == tz::Errc::nomem) fuzz_bug("untyped error", e.what());
}
