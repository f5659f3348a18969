#include "tz/io/sigv4.hpp"

#include <array>
#include <cstdint>
#include <ctime>
#include <map>

#include "tz/format/hash.hpp"
#include "tz/format/hex.hpp"

namespace tz::io {

namespace {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t n) {
  format::Sha256 h;
  h.update(data, n);
  return h.finish();
}

Digest hmac_sha256(const std::string& key, const std::string& message) {
  std::array<uint8_t, 64> block{};
  if (key.size() > block.size()) {
    const Digest d = sha256(key.data(), key.size());
    std::copy(d.begin(), d.end(), block.begin());
  } else {
    std::copy(key.begin(), key.end(), block.begin());
  }
  std::array<uint8_t, 64> ipad, opad;
  for (size_t i = 0; i < 64; ++i) {
    ipad[i] = block[i] ^ 0x36;
    opad[i] = block[i] ^ 0x5c;
  }
  format::Sha256 inner;
  inner.update(ipad.data(), ipad.size());
  inner.update(message.data(), message.size());
  const Digest ih = inner.finish();
  format::Sha256 outer;
  outer.update(opad.data(), opad.size());
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

std::string as_key(const Digest& d) { return std::string(d.begin(), d.end()); }


}  // namespace

std::string hex_sha256(const std::string& data) {
  const Digest d = sha256(data.data(), data.size());
  return format::to_hex(d.data(), d.size());
}

std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                            c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(char(c));
    } else {
      out.push_back('%');
      out.push_back(digits[c >> 4]);
      out.push_back(digits[c & 15]);
    }
  }
  return out;
}

std::vector<std::string> sigv4_headers(const AwsCredentials& creds, const std::string& region,
                                       const SignedRequest& r, const std::string& amz_date) {
  const std::string date = amz_date.substr(0, 8);
  std::map<std::string, std::string> signed_map(r.extra_signed.begin(), r.extra_signed.end());
  signed_map["host"] = r.host;
  signed_map["x-amz-content-sha256"] = r.payload_hash;
  signed_map["x-amz-date"] = amz_date;
  if (!creds.session_token.empty()) signed_map["x-amz-security-token"] = creds.session_token;
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : signed_map) {
    canonical_headers += name + ":" + value + "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + name;
  }
  const std::string canonical_request = r.method + "\n" + r.canonical_uri + "\n" + r.canonical_query + "\n" +
                                        canonical_headers + "\n" + signed_headers + "\n" + r.payload_hash;
  const std::string scope = date + "/" + region + "/s3/aws4_request";
  const std::string string_to_sign =
      "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + hex_sha256(canonical_request);
  const Digest k_date = hmac_sha256("AWS4" + creds.secret_key, date);
  const Digest k_region = hmac_sha256(as_key(k_date), region);
  const Digest k_service = hmac_sha256(as_key(k_region), "s3");
  const Digest k_signing = hmac_sha256(as_key(k_service), "aws4_request");
  const Digest signature = hmac_sha256(as_key(k_signing), string_to_sign);

  std::vector<std::string> headers;
  headers.push_back("x-amz-date: " + amz_date);
  headers.push_back("x-amz-content-sha256: " + r.payload_hash);
  if (!creds.session_token.empty()) headers.push_back("x-amz-security-token: " + creds.session_token);
  headers.push_back("Authorization: AWS4-HMAC-SHA256 Credential=" + creds.access_key + "/" + scope +
                    ", SignedHeaders=" + signed_headers + ", Signature=" + format::to_hex(signature.data(), signature.size()));
  return headers;
}

std::string amz_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[17];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

}  // namespace tz::io
