#pragma once
// S3 objects (s3://bucket/key) read through the HTTP source with SigV4-signed
// ranged GETs. Credentials, endpoint and region are resolved as upstream
// tensorizer does (FORMAT.md §12.3): explicit values, then the s3cmd config
// ([default] of s3_config_path or ~/.s3cfg), then the AWS environment
// variables and shared credentials/config files, else anonymous access.
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tz/io/http.hpp"
#include "tz/io/sigv4.hpp"
#include "tz/io/source.hpp"

namespace tz::io {

struct S3Options {
  std::optional<std::string> access_key_id, secret_access_key, session_token;
  std::string endpoint;     // "host[:port]" or a URL; empty: resolve
  // The endpoint when nothing names one; empty: CoreWeave's, as upstream
  // (reads: accel-object.ord1.coreweave.com, writes: object.ord1.coreweave.com).
  std::string default_endpoint;
  std::string region;       // empty: resolve, else us-east-1
  std::string config_path;  // s3cmd config; empty: ~/.s3cfg
  bool read_s3cmd_config = true;  // false: no s3cmd config is read at all
  std::optional<bool> force_http;
  std::string addressing;   // "path", "virtual", or empty (by host)
  uint64_t part_size = uint64_t(16) << 20;  // multipart uploads (>= 5 MiB)
};

struct S3Target {
  std::string bucket, key;
  std::string url;   // https://endpoint/bucket/key (or virtual-hosted)
  std::string host;  // Host header as sent
  std::string canonical_uri;
  std::string region;
  AwsCredentials credentials;
};

// Reads "[section]" "key = value" files (s3cmd, AWS); comments start with # or ;.
std::map<std::string, std::map<std::string, std::string>> parse_ini(const std::string& text);

// Resolves where and how to reach `uri` (s3://bucket/key). `env` looks up
// environment variables (injectable for tests); `home` is the home folder.
S3Target resolve_s3(const std::string& uri, const S3Options& options, bool for_write,
                    const std::function<const char*(const char*)>& env, const std::string& home);

std::unique_ptr<Source> open_s3_source(const std::string& uri, const S3Options& options,
                                       const HttpOptions& http);

// A multipart upload fed by positional writes: each part is uploaded as soon
// as all its bytes have arrived, so a save streams without a temporary file;
// the leading part (file header and metadata index, patched until the end)
// is uploaded last, at close, which completes the upload. abort() (or a
// failed close) aborts it, leaving no object.
std::unique_ptr<Sink> open_s3_sink(const std::string& uri, const S3Options& options, const HttpOptions& http);

}  // namespace tz::io
