#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include "tz/format/error.hpp"
#include "tz/io/file.hpp"

using namespace tz::io;

namespace {
std::string temp_path(const char* name) {
  return std::string("/tmp/tz_io_test_") + std::to_string(::getpid()) + "_" + name;
}
}  // namespace

TEST_CASE("sink then source round trip, positional and concurrent-safe") {
  const std::string p = temp_path("rt");
  std::vector<uint8_t> data(9u << 20);
  std::iota(data.begin(), data.end(), uint8_t(0));
  {
    auto sink = open_sink(p);
    sink->reserve(data.size());
    sink->write_at(4096, data.data() + 4096, data.size() - 4096);
    sink->write_at(0, data.data(), 4096);
    sink->truncate(data.size());
    sink->close();
    CHECK_THROWS_AS(sink->write_at(0, data.data(), 1), tz::Error);
  }
  for (bool direct : {false, true}) {
    SourceOptions options;
    options.direct_io = direct;
    auto src = open_source("file://" + p, options);
    REQUIRE(src->size() == data.size());
    std::vector<uint8_t> out(data.size());
    src->read_at(0, out.data(), out.size());
    CHECK(out == data);
    std::vector<uint8_t> part(5u << 20);
    src->read_at(12345, part.data(), part.size());
    CHECK(std::equal(part.begin(), part.end(), data.begin() + 12345));
  }
  std::remove(p.c_str());
}

TEST_CASE("short reads are errors, not zeros") {
  const std::string p = temp_path("short");
  {
    auto sink = open_sink(p);
    const uint8_t b[10] = {1};
    sink->write_at(0, b, 10);
    sink->close();
  }
  auto src = open_source(p);
  uint8_t out[20];
  try {
    src->read_at(5, out, 10);
    FAIL("expected an error");
  } catch (const tz::Error& e) {
    CHECK(e.code() == tz::Errc::truncated);
  }
  std::remove(p.c_str());
}

TEST_CASE("missing files and unsupported schemes") {
  try {
    open_source("/nonexistent/dir/file.tensors");
    FAIL("expected an error");
  } catch (const tz::Error& e) {
    CHECK(e.code() == tz::Errc::not_found);
  }
  try {
    open_source("gopher://example/x");
    FAIL("expected an error");
  } catch (const tz::Error& e) {
    CHECK(e.code() == tz::Errc::unsupported);
  }
}
