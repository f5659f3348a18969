#pragma once
// The one retry policy of every libcurl request loop in tz-io (ranged GETs,
// S3 uploads): what is worth retrying, how long to wait, and when to stop.
//
// Only failures that can pass are retried: connection and transfer errors,
// timeouts, 5xx, 408 and 429. A host name that does not resolve is retried
// once (a resolver hiccup) and then reported: a typo must not cost a user a
// minute of backoff. Any streak of failures in a row also ends after
// HttpOptions::max_attempts attempts or once it has lasted
// HttpOptions::retry_timeout_ms, whichever comes first; an attempt that
// delivered bytes ends the streak.
#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "tz/io/http.hpp"

namespace tz::io {

enum class Failure { permanent, transient, name_resolution };

inline Failure classify(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
      return Failure::name_resolution;
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
      return Failure::transient;
    default:
      return Failure::permanent;
  }
}

inline Failure classify_status(long status) {
  return status >= 500 || status == 408 || status == 429 ? Failure::transient : Failure::permanent;
}

// libcurl's description of `rc`, with the number the curl tool would exit
// with (the same codes), which is what users search for.
inline std::string describe_curl_error(CURLcode rc, const char* errbuf) {
  std::string s = curl_easy_strerror(rc);
  if (errbuf && errbuf[0]) s += std::string(": ") + errbuf;
  return s + " (cURL exit code " + std::to_string(int(rc)) + ")";
}

// Name resolution gets this many attempts in all.
constexpr unsigned kNameResolutionAttempts = 2;

class RetryStreak {
 public:
  explicit RetryStreak(const HttpOptions& o) : o_(o), delay_ms_(o.backoff_ms), jitter_(std::random_device{}()) {}

  // Records a failed attempt; true if another is worth making (after wait()).
  // When false, stop_reason() says why, for the error message.
  bool again(Failure f, bool made_progress) {
    const auto now = std::chrono::steady_clock::now();
    if (made_progress || failures_ == 0) {
      failures_ = 0;
      start_ = now;
      delay_ms_ = o_.backoff_ms;
    }
    ++failures_;
    if (f == Failure::permanent) return stop("");
    if (f == Failure::name_resolution && failures_ >= std::min(o_.max_attempts, kNameResolutionAttempts)) {
      return stop(counted());
    }
    if (failures_ >= o_.max_attempts) return stop(counted());
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(now - start_).count();
    if (uint64_t(spent) + delay_ms_ >= o_.retry_timeout_ms) {
      return stop(counted() + " in " + std::to_string(spent) + " ms (http_retry_timeout_ms " +
                  std::to_string(o_.retry_timeout_ms) + ")");
    }
    return true;
  }

  // Sleeps the current backoff (with up to 50% jitter) and doubles it, to 3 s at most.
  void wait() {
    const unsigned ms = delay_ms_ + unsigned(jitter_() % (delay_ms_ / 2 + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    delay_ms_ = std::min(delay_ms_ * 2, 3000u);
  }

  unsigned failures() const { return failures_; }
  // "" for a failure that is not retried at all.
  const std::string& stop_reason() const { return reason_; }

 private:
  std::string counted() const { return "Giving up after " + std::to_string(failures_) + " failed attempts"; }
  bool stop(std::string reason) {
    reason_ = std::move(reason);
    return false;
  }

  const HttpOptions& o_;
  unsigned failures_ = 0;
  unsigned delay_ms_;
  std::chrono::steady_clock::time_point start_{};
  std::minstd_rand jitter_;
  std::string reason_;
};

}  // namespace tz::io
