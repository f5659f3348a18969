// Redis URI parsing; live servers are tested from tests/test_redis.py.
#include <catch2/catch.hpp>

#include "tz/format/error.hpp"
#include "tz/io/redis.hpp"

using namespace tz::io;

TEST_CASE("redis URIs") {
  auto a = parse_redis_uri("redis://localhost/model");
  CHECK(a.host == "localhost");
  CHECK(a.port == 6379);
  CHECK(a.db == 0);
  CHECK(a.prefix == "model");
  auto b = parse_redis_uri("redis://:p%40ss@10.0.0.1:7000/3/team/model");
  CHECK(b.host == "10.0.0.1");
  CHECK(b.port == 7000);
  CHECK(b.db == 3);
  CHECK(b.password == "p@ss");
  CHECK(b.prefix == "team/model");
  auto c = parse_redis_uri("REDIS://user:pw@h:1/m");
  CHECK(c.username == "user");
  CHECK(c.password == "pw");
  CHECK_THROWS_AS(parse_redis_uri("redis://host/"), tz::Error);
  CHECK_THROWS_AS(parse_redis_uri("redis://host:99999/x"), tz::Error);
}
