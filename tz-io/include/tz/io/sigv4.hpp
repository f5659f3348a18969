#pragma once
// AWS Signature Version 4 for S3 requests (header-based, unsigned payload).
// Pure functions: the caller supplies the time, so results are testable.
#include <string>
#include <utility>
#include <vector>

namespace tz::io {

struct AwsCredentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // optional (temporary credentials)
  bool anonymous() const { return access_key.empty() && secret_key.empty(); }
};

// RFC 3986 percent-encoding of everything but unreserved characters
// (and '/' when `keep_slash`), as SigV4 canonical URIs and queries need.
std::string uri_encode(const std::string& s, bool keep_slash);

struct SignedRequest {
  std::string method;           // "GET", "PUT", ...
  std::string host;             // the Host header exactly as sent ("host[:port]")
  std::string canonical_uri;    // already encoded path, e.g. "/bucket/key%20name"
  std::string canonical_query;  // sorted, encoded "a=1&b=2" ("" if none)
  std::string payload_hash = "UNSIGNED-PAYLOAD";
  // More headers to sign (lowercase name, value), e.g. {"range", "bytes=0-9"};
  // the caller sends them itself.
  std::vector<std::pair<std::string, std::string>> extra_signed;
};

// Header lines ("Name: value") to send: x-amz-date, x-amz-content-sha256,
// x-amz-security-token (if any) and Authorization. `amz_date` is
// "YYYYMMDDTHHMMSSZ" (UTC).
std::vector<std::string> sigv4_headers(const AwsCredentials& creds, const std::string& region,
                                       const SignedRequest& request, const std::string& amz_date);

// The current UTC time as "YYYYMMDDTHHMMSSZ".
std::string amz_date_now();

std::string hex_sha256(const std::string& data);

}  // namespace tz::io
