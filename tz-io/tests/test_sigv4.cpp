// SigV4 known answers: AWS's documented GET Object example, and one computed
// with botocore for the header set our S3 source sends.
#include <catch2/catch.hpp>

#include <string>

#include "tz/io/sigv4.hpp"

using namespace tz::io;

namespace {
std::string find(const std::vector<std::string>& headers, const std::string& name) {
  for (const auto& h : headers) {
    if (h.rfind(name + ": ", 0) == 0) return h.substr(name.size() + 2);
  }
  return "";
}
}  // namespace

TEST_CASE("SigV4: AWS's GET Object example") {
  AwsCredentials c{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  SignedRequest r;
  r.method = "GET";
  r.host = "examplebucket.s3.amazonaws.com";
  r.canonical_uri = "/test.txt";
  r.payload_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  r.extra_signed = {{"range", "bytes=0-9"}};
  const auto h = sigv4_headers(c, "us-east-1", r, "20130524T000000Z");
  CHECK(find(h, "Authorization") ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  CHECK(find(h, "x-amz-date") == "20130524T000000Z");
}

TEST_CASE("SigV4: path-style request with a session token and an unsigned payload (botocore's answer)") {
  AwsCredentials c{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "TOKEN123"};
  SignedRequest r;
  r.method = "GET";
  r.host = "127.0.0.1:9000";
  r.canonical_uri = "/bucket/" + uri_encode("dir/a b.tensors", true);
  const auto h = sigv4_headers(c, "us-east-1", r, "20130524T000000Z");
  const std::string auth = find(h, "Authorization");
  CHECK(r.canonical_uri == "/bucket/dir/a%20b.tensors");
  CHECK(auth.find("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,") != std::string::npos);
  CHECK(auth.find("Signature=5fe61181f0aa81aa4202a534852e5ac6fc7720eeaf3f6c85427eede694f847c1") != std::string::npos);
  CHECK(find(h, "x-amz-security-token") == "TOKEN123");
}

TEST_CASE("URI encoding") {
  CHECK(uri_encode("a b/c~d_e.f-g", true) == "a%20b/c~d_e.f-g");
  CHECK(uri_encode("a/b", false) == "a%2Fb");
  CHECK(uri_encode("\xc3\xa9", true) == "%C3%A9");
}
