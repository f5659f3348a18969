#pragma once
// HTTP(S) source on libcurl: ranged GETs straight into the caller's memory
// (one request may fill many scattered buffers),
// one pooled connection per concurrent reader, redirects followed, TLS
// verified by default. Transient failures (connection reset or cut
// mid-body, stalls, timeouts, 5xx, 408, 429) are retried with backoff,
// resuming from the first byte not yet received; other 4xx fail at once.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tz/io/source.hpp"

struct curl_slist;

namespace tz::io {

struct HttpOptions {
  bool verify_tls = true;
  std::string ca_file;                // PEM bundle to trust instead of the system's
  std::string ca_dir;                 // hashed CA directory
  std::vector<std::string> headers;   // "Name: value", sent with every request
  unsigned max_attempts = 8;          // per range, counting the first
  unsigned connect_timeout_ms = 10000;
  unsigned stall_timeout_ms = 20000;  // no byte for this long: retry
  unsigned backoff_ms = 100;          // first retry delay; doubles, capped at 3 s
  unsigned retry_timeout_ms = 30000;  // a streak of failures in a row ends after this long
  // Per-request headers (e.g. an S3 signature, which carries the time).
  std::function<std::vector<std::string>()> sign;
};

// The CA bundle to trust when the caller names none: libcurl's compiled-in
// default when that file exists, else the first existing well-known bundle
// of the common distributions. A wheel vendors a libcurl built on Debian,
// whose default path other distributions lack. "" when none exists (libcurl
// then falls back to its CA directory, if any).
std::string pick_ca_bundle(const char* curl_default, const std::vector<std::string>& candidates,
                           const std::function<bool(const std::string&)>& readable);
// pick_ca_bundle for this process (computed once).
const std::string& system_ca_bundle();

// The URL as it may appear in messages: without user info and query string
// (pre-signed URLs carry credentials there).
std::string redact_url(const std::string& url);

class HttpSource final : public Source {
 public:
  HttpSource(const std::string& url, const HttpOptions& options);
  ~HttpSource() override;

  uint64_t size() const override { return size_; }
  void read_at(uint64_t offset, void* dst, size_t len) override;
  void read_scatter(uint64_t offset, const Segment* segments, size_t count,
                    const std::function<void(size_t)>& on_segment, NextRead next) override;
  bool coalesce_reads() const override { return true; }
  std::string describe() const override { return redact_url(url_); }
  const std::string& response_headers() const override { return response_headers_; }
  // Keeps the header block of the first successful response (the probe's).
  void record_headers(long status, const std::string& block);

  struct Cursor;  // where a transfer's bytes go (defined in http.cpp)
  struct Stream;  // an open-ended response kept open between reads (defined in http.cpp)

 private:
  struct Handle;
  Handle* acquire();
  void release(Handle* h);
  // One attempt at [offset, offset + len): returns the bytes received (the
  // prefix that arrived intact) and whether a retry may help.
  struct Attempt {
    size_t received = 0;
    bool done = false;
    bool retryable = false;
    bool name_resolution = false;  // the host name did not resolve (see retry.hpp)
    std::string error;
    long status = 0;
  };
  // `len` kOpenEnded asks for everything from `offset` on; `stream` then
  // takes the bytes instead of `cursor`.
  Attempt attempt(Handle* h, uint64_t offset, Cursor& cursor, size_t len, bool probe_size,
                  Stream* stream = nullptr);
  // `first`: the outcome of an attempt already made for this range.
  void fetch(uint64_t offset, Cursor& cursor, size_t len, bool probe_size, const Attempt* first = nullptr);
  // When a read that the open response cannot serve may start a new one
  // (an open-ended range) in its place.
  enum class Opening {
    never,
    instead_of_busy,  // only if the current one is busy or over (never an idle one)
    instead_of_any,
  };
  // Serves what the probe fetched from memory, then what an open response
  // can, then requests the rest. `keep`: leave the response open afterwards.
  void fetch_after_prefix(uint64_t offset, Cursor& cursor, size_t len, bool keep, Opening open);
  void probe();
  // Starts an open-ended response at `offset` on a thread of its own; its
  // first job delivers `want` bytes to `cursor`.
  std::shared_ptr<Stream> start_stream(uint64_t offset, Cursor& cursor, size_t want);
  // Serves the start of a read from the open response when it stands at most
  // kMaxStreamSkip bytes before `offset`, or from a new one that takes its
  // place as `open` allows; returns the bytes delivered.
  size_t read_from_stream(uint64_t offset, Cursor& cursor, size_t len, bool keep, Opening open);
  void close_stream() noexcept;

  static constexpr size_t kPrefixBytes = size_t(1) << 20;
  static constexpr size_t kOpenEnded = SIZE_MAX;
  // Skipping this much on the stream is cheaper than a new request (the
  // same gap at which readers start a new request).
  static constexpr uint64_t kMaxStreamSkip = uint64_t(1) << 20;

  std::string url_;
  HttpOptions options_;
  std::vector<uint8_t> prefix_;  // the object's first bytes, fetched by the size probe
  uint64_t size_ = 0;
  bool size_known_ = false;
  std::mutex pool_mutex_;
  std::vector<Handle*> pool_;
  ::curl_slist* headers_ = nullptr;
  std::mutex stream_mutex_;
  std::shared_ptr<Stream> stream_;  // the open response, if any
  // Where the last read ended: reads that go on forward may open a response
  // for what follows; reads going back use closed ranges (no read-ahead).
  std::atomic<uint64_t> last_end_{0};
  std::mutex headers_mutex_;
  bool headers_recorded_ = false;  // set once: later responses never change them
  std::string response_headers_;
};

}  // namespace tz::io
