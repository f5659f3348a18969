// HTTP source pieces that need no server; live servers are tested from
// tests/test_http.py (nginx, a fault-injecting proxy).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <set>

#include "tz/format/error.hpp"
#include "tz/io/http.hpp"

using namespace tz::io;

TEST_CASE("URLs in messages lose credentials and query strings") {
  CHECK(redact_url("https://host/a/b.tensors?X-Amz-Signature=abc") == "https://host/a/b.tensors");
  CHECK(redact_url("http://user:pw@host:8080/x#frag") == "http://host:8080/x");
  CHECK(redact_url("http://host/p@th") == "http://host/p@th");
}

TEST_CASE("the CA bundle is libcurl's default where it exists, else a known distribution path") {
  const std::vector<std::string> known = {"/rhel/ca-bundle.crt", "/suse/ca-bundle.pem"};
  auto only = [](std::set<std::string> present) {
    return [present](const std::string& p) { return present.count(p) > 0; };
  };
  CHECK(pick_ca_bundle("/debian/ca.crt", known, only({"/debian/ca.crt", "/rhel/ca-bundle.crt"})) ==
        "/debian/ca.crt");
  CHECK(pick_ca_bundle("/debian/ca.crt", known, only({"/suse/ca-bundle.pem"})) == "/suse/ca-bundle.pem");
  CHECK(pick_ca_bundle(nullptr, known, only({"/rhel/ca-bundle.crt"})) == "/rhel/ca-bundle.crt");
  CHECK(pick_ca_bundle("", known, only({})) == "");
  // This machine has a trust store, so the process-wide choice is a real file.
  CHECK(::access(system_ca_bundle().c_str(), R_OK) == 0);
}

TEST_CASE("a server that is not there fails within a bounded time with a clear error") {
  HttpOptions o;
  o.max_attempts = 3;
  o.backoff_ms = 10;
  o.connect_timeout_ms = 500;
  try {
    HttpSource s("http://127.0.0.1:9/nothing.tensors?token=secret", o);  // discard port: refused
    FAIL("expected an error");
  } catch (const tz::Error& e) {
    const std::string msg = e.what();
    CHECK(e.code() == tz::Errc::io);
    CHECK(msg.find("Giving up after 3") != std::string::npos);
    CHECK(msg.find("secret") == std::string::npos);
  }
}

TEST_CASE("a host name that does not resolve is tried twice, not max_attempts times") {
  HttpOptions o;
  o.backoff_ms = 1;
  o.max_attempts = 50;
  try {
    HttpSource s("http://no-such-host.invalid/x.tensors", o);  // .invalid never resolves (RFC 6761)
    FAIL("expected an error");
  } catch (const tz::Error& e) {
    const std::string msg = e.what();
    CHECK(e.code() == tz::Errc::io);
    CHECK(msg.find("Giving up after 2 failed attempts") != std::string::npos);
    CHECK(msg.find("cURL exit code 6") != std::string::npos);
  }
}

TEST_CASE("a streak of failures ends once it has lasted http_retry_timeout_ms") {
  HttpOptions o;
  o.backoff_ms = 20;
  o.max_attempts = 1000;  // never the limit here
  o.retry_timeout_ms = 300;
  try {
    HttpSource s("http://127.0.0.1:9/x.tensors", o);  // discard port: refused at once
    FAIL("expected an error");
  } catch (const tz::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("http_retry_timeout_ms 300") != std::string::npos);
    CHECK(msg.find("Giving up after 1000") == std::string::npos);
    CHECK(msg.find("cURL exit code 7") != std::string::npos);
  }
}

