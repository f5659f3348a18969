#pragma once
// Connection settings shared by every libcurl handle of tz-io: timeouts,
// stall detection and TLS verification from HttpOptions.
#include <curl/curl.h>

#include <algorithm>

#include "tz/io/http.hpp"

namespace tz::io {

inline void apply_connection_options(CURL* c, const HttpOptions& o) {
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, long(o.connect_timeout_ms));
  // A stall (under 1 byte/s for this long) ends the attempt, which is then retried.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, long(o.stall_timeout_ms / 1000)));
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, o.verify_tls ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, o.verify_tls ? 2L : 0L);
  const std::string& ca_file = o.ca_file.empty() ? system_ca_bundle() : o.ca_file;
  if (!ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca_file.c_str());
  if (!o.ca_dir.empty()) curl_easy_setopt(c, CURLOPT_CAPATH, o.ca_dir.c_str());
}

}  // namespace tz::io
