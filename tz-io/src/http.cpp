#include "tz/io/http.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include <unistd.h>

#include "curl_options.hpp"
#include "retry.hpp"
#include "tz/format/error.hpp"

namespace tz::io {

namespace {

void global_init() {
  static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) fail(Errc::io, "libcurl could not be initialised");
}

}  // namespace

// Where the bytes of one read go: a list of segments filled in order. It
// lives across attempts, so a retry resumes at the first byte not received.
struct HttpSource::Cursor {
  const Segment* segments;
  size_t count;
  const std::function<void(size_t)>* on_segment;
  size_t index = 0;   // current segment
  size_t filled = 0;  // bytes of it received

  Cursor(const Segment* s, size_t n, const std::function<void(size_t)>* cb) : segments(s), count(n), on_segment(cb) {
    skip_empty();
  }
  void skip_empty() {
    while (index < count && segments[index].len == 0) complete();
  }
  void complete() {
    const size_t done = index++;
    filled = 0;
    if (on_segment && *on_segment) (*on_segment)(done);
  }
  // Takes the next n bytes of the stream (the caller never passes more than remain).
  void write(const uint8_t* data, size_t n) {
    while (n > 0 && index < count) {
      const Segment& seg = segments[index];
      const size_t take = std::min(n, seg.len - filled);
      if (seg.dst) std::memcpy(static_cast<uint8_t*>(seg.dst) + filled, data, take);
      filled += take;
      data += take;
      n -= take;
      if (filled == seg.len) {
        complete();
        skip_empty();
      }
    }
  }
};

namespace {

// Per-attempt state shared with libcurl's callbacks.
struct Transfer {
  HttpSource* source = nullptr;
  std::string headers;  // of the current response, without its status line
  HttpSource::Cursor* cursor = nullptr;
  HttpSource::Stream* stream = nullptr;  // set: the bytes go to the open stream
  std::exception_ptr callback_error;  // thrown by on_segment; rethrown after the transfer
  size_t cap = 0;
  size_t received = 0;
  uint64_t expect_start = 0;
  long status = 0;
  bool range_ok = false;      // a 206 whose Content-Range starts where we asked
  bool whole_body = false;    // a 200: the server ignored Range (usable from offset 0)
  bool have_total = false;
  uint64_t total = 0;         // from "Content-Range: bytes a-b/total" or "bytes */total"
  bool mismatch = false;      // 206 for another range than asked
};

}  // namespace

// An open-ended response (the size probe's, or one a lazy load opened), kept
// open between reads. Its transfer runs on a thread of its own; between reads
// the body callback waits inside libcurl ("parked") until a reader hands it
// the next job, or the stream is closed.
struct HttpSource::Stream {
  std::mutex m;
  std::condition_variable cv;
  std::thread thread;
  Cursor unused{nullptr, 0, nullptr};  // the transfer's own cursor: the jobs' take its bytes
  // The job being served; NULL once it is complete (or the transfer is over).
  Cursor* cursor = nullptr;
  uint64_t skip = 0;     // bytes to drop before the job's first
  size_t want = 0;       // bytes the job takes
  size_t got = 0;        // of them delivered
  bool busy = false;     // a reader owns the current job
  bool closing = false;  // stop at the next chance; nobody takes it any more
  bool retired = false;  // replaced as the source's open response: stop after the current job
  bool ended = false;    // the transfer is over
  uint64_t pos = 0;      // object offset of the next byte
  // The object's size, from the response headers.
  bool sized = false;
  uint64_t total = 0;
  Attempt result;            // how the transfer ended, once it has
  std::exception_ptr error;  // thrown on the transfer's thread (by a job's on_segment)

  ~Stream() {
    close();
    if (thread.joinable()) thread.join();
  }

  // Free for a read starting at `offset`? The caller holds `m`.
  bool serves(uint64_t offset) const {
    return !busy && !closing && !retired && !ended && offset >= pos && offset - pos <= kMaxStreamSkip;
  }

  // Hands the transfer a job; the caller holds `m`.
  void install(Cursor& job, uint64_t skip_bytes, size_t n) {
    busy = true;
    cursor = &job;
    skip = skip_bytes;
    want = n;
    got = 0;
    cv.notify_all();
  }

  // Waits for the job to end, then leaves the stream open for the next read
  // (`keep`) or stops it. Returns the bytes delivered.
  size_t finish_job(std::unique_lock<std::mutex>& lock, bool keep) {
    cv.wait(lock, [&] { return cursor == nullptr; });
    const size_t delivered = got;
    const std::exception_ptr failure = error;
    busy = false;
    if (!keep || ended || failure || retired) {
      closing = true;
      cv.notify_all();
    }
    lock.unlock();
    if (failure) std::rethrow_exception(failure);
    return delivered;
  }

  // Takes n body bytes; false stops the transfer.
  bool deliver(const Transfer& t, const uint8_t* data, size_t n) {
    std::unique_lock<std::mutex> lock(m);
    if (!sized && t.have_total) {
      sized = true;
      total = t.total;
    }
    while (n > 0) {
      if (cursor == nullptr) {
        cv.wait(lock, [&] { return cursor != nullptr || closing; });
        if (closing) return false;
      }
      if (skip > 0) {
        const size_t k = size_t(std::min<uint64_t>(skip, n));
        skip -= k;
        pos += k;
        data += k;
        n -= k;
        continue;
      }
      const size_t k = std::min(n, want - got);
      Cursor* job = cursor;
      lock.unlock();
      job->write(data, k);  // on_segment may throw: the transfer then ends with it
      lock.lock();
      got += k;
      pos += k;
      data += k;
      n -= k;
      if (got == want) {
        cursor = nullptr;
        cv.notify_all();
      }
    }
    return true;
  }

  // Takes it out of service: it stops now, or after the job a reader is on.
  void retire() {
    std::lock_guard<std::mutex> lock(m);
    retired = true;
    if (!busy) {
      closing = true;
      cv.notify_all();
    }
  }

  // Asks the transfer to stop; it ends at its next byte or progress call.
  void close() {
    std::lock_guard<std::mutex> lock(m);
    closing = true;
    cv.notify_all();
  }
};

namespace {

bool starts_with_ci(const char* p, size_t n, const char* prefix) {
  const size_t k = std::strlen(prefix);
  if (n < k) return false;
  for (size_t i = 0; i < k; ++i) {
    if (std::tolower(static_cast<unsigned char>(p[i])) != prefix[i]) return false;
  }
  return true;
}

// Header bytes kept per response: enough for any sane server, bounded for a hostile one.
constexpr size_t kMaxHeaderBlock = size_t(64) << 10;

size_t on_header(char* data, size_t size, size_t nitems, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * nitems;
  if (starts_with_ci(data, n, "http/")) {
    // A new response (after a redirect or a 100 Continue): start over.
    const char* sp = static_cast<const char*>(std::memchr(data, ' ', n));
    t->status = sp ? std::strtol(sp + 1, nullptr, 10) : 0;
    t->range_ok = t->whole_body = t->have_total = t->mismatch = false;
    t->headers.clear();
    return n;
  }
  if (n <= 2 && (n == 0 || data[0] == '\r' || data[0] == '\n')) {
    // The blank line ending a response's headers.
    t->source->record_headers(t->status, t->headers);
    return n;
  }
  if (t->headers.size() < kMaxHeaderBlock) t->headers.append(data, n);
  if (starts_with_ci(data, n, "content-range:")) {
    std::string v(data + 14, n - 14);
    const auto bytes = v.find("bytes");
    if (bytes != std::string::npos) {
      const char* p = v.c_str() + bytes + 5;
      while (*p == ' ') ++p;
      if (*p == '*') {
        ++p;
      } else {
        char* end = nullptr;
        const unsigned long long start = std::strtoull(p, &end, 10);
        if (end != p) {
          if (start == t->expect_start) t->range_ok = true;
          else t->mismatch = true;
        }
        p = end ? end : p;
        while (*p && *p != '/') ++p;
      }
      if (*p == '/') {
        char* end = nullptr;
        const unsigned long long total = std::strtoull(p + 1, &end, 10);
        if (end != p + 1) {
          t->have_total = true;
          t->total = total;
        }
      }
    }
  }
  return n;
}

size_t on_body(char* data, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * nmemb;
  if (t->status == 200 && t->expect_start == 0) t->whole_body = true;
  const bool usable = (t->status == 206 && t->range_ok) || t->whole_body;
  if (!usable) {
    // An error page, or a range we did not ask for: never copied anywhere.
    return (t->status >= 400 || t->status == 0) ? n : 0;
  }
  if (t->stream) {
    // A server ignoring Range would be refused later anyway: stop now.
    if (t->whole_body) return 0;
    try {
      if (!t->stream->deliver(*t, reinterpret_cast<const uint8_t*>(data), n)) return 0;
    } catch (...) {
      t->callback_error = std::current_exception();
      return 0;
    }
    t->received += n;
    return n;
  }
  const size_t take = std::min(n, t->cap - t->received);
  try {
    t->cursor->write(reinterpret_cast<const uint8_t*>(data), take);
  } catch (...) {
    // Never unwind through libcurl: stop the transfer and rethrow afterwards.
    t->callback_error = std::current_exception();
    return 0;
  }
  t->received += take;
  // More than asked (a server ignoring Range): stop once we have it all.
  return take == n ? n : 0;
}

// Lets a closing stream end while the server sends nothing.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* stream = static_cast<HttpSource::Stream*>(user);
  std::lock_guard<std::mutex> lock(stream->m);
  return stream->closing ? 1 : 0;
}


}  // namespace

std::string pick_ca_bundle(const char* curl_default, const std::vector<std::string>& candidates,
                           const std::function<bool(const std::string&)>& readable) {
  if (curl_default && *curl_default && readable(curl_default)) return curl_default;
  for (const auto& path : candidates) {
    if (readable(path)) return path;
  }
  return "";
}

const std::string& system_ca_bundle() {
  static const std::string bundle = [] {
    const char* compiled_in = nullptr;
#if LIBCURL_VERSION_NUM >= 0x075400  // CURLINFO_CAINFO: 7.84
    if (CURL* c = curl_easy_init()) {
      char* path = nullptr;
      if (curl_easy_getinfo(c, CURLINFO_CAINFO, &path) == CURLE_OK && path) {
        static std::string kept(path);
        compiled_in = kept.c_str();
      }
      curl_easy_cleanup(c);
    }
#endif
    // Debian/Ubuntu, Fedora/RHEL, openSUSE, older RHEL, RHEL's extracted
    // bundle, Alpine/macOS-style.
    const std::vector<std::string> known = {
        "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem",             "/etc/pki/tls/cacert.pem",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/cert.pem"};
    return pick_ca_bundle(compiled_in, known, [](const std::string& p) { return ::access(p.c_str(), R_OK) == 0; });
  }();
  return bundle;
}

std::string redact_url(const std::string& url) {
  std::string u = url.substr(0, url.find_first_of("?#"));
  const auto scheme = u.find("://");
  if (scheme != std::string::npos) {
    const auto host_start = scheme + 3;
    const auto path = u.find('/', host_start);
    const auto at = u.rfind('@', path == std::string::npos ? u.size() : path);
    if (at != std::string::npos && at >= host_start) u.erase(host_start, at + 1 - host_start);
  }
  return u;
}

struct HttpSource::Handle {
  CURL* curl = nullptr;
  char errbuf[CURL_ERROR_SIZE] = {0};
};

HttpSource::HttpSource(const std::string& url, const HttpOptions& options) : url_(url), options_(options) {
  global_init();
  for (const auto& h : options_.headers) {
    curl_slist* next = curl_slist_append(headers_, h.c_str());
    if (!next) throw std::bad_alloc();
    headers_ = next;
  }
  try {
    probe();
  } catch (...) {
    close_stream();
    for (Handle* h : pool_) {
      curl_easy_cleanup(h->curl);
      delete h;
    }
    curl_slist_free_all(headers_);
    throw;
  }
}

// Learns the size and fetches the start of the object (the file header and
// metadata index come from it without further round trips), on a response
// for the whole object that stays open for the reads after it.
void HttpSource::probe() {
  prefix_.resize(kPrefixBytes);
  const Segment first_bytes{prefix_.data(), prefix_.size()};
  Cursor cursor(&first_bytes, 1, nullptr);
  std::shared_ptr<Stream> s = start_stream(0, cursor, prefix_.size());
  {
    std::lock_guard<std::mutex> guard(stream_mutex_);
    stream_ = s;
  }
  std::unique_lock<std::mutex> lock(s->m);
  s->cv.wait(lock, [&] { return s->cursor == nullptr; });
  const size_t got = s->got;
  const bool sized = s->sized;
  const uint64_t total = s->total;
  const Attempt result = s->result;
  const bool ended = s->ended;
  const std::exception_ptr error = s->error;
  s->busy = false;
  lock.unlock();
  if (error) std::rethrow_exception(error);
  if (sized) {
    size_ = total;
    size_known_ = true;
  }
  const size_t want = sized ? size_t(std::min<uint64_t>(size_, prefix_.size())) : prefix_.size();
  if (got < want || (ended && !sized)) {
    // The stream failed early: ordinary requests take over (with retries and
    // error reports), from the byte where it stopped when the size is known.
    close_stream();
    if (sized) {
      fetch(got, cursor, want - got, false);
    } else {
      Cursor fresh(&first_bytes, 1, nullptr);
      const bool definite = !result.retryable && result.status >= 400 && result.status != 416;
      fetch(0, fresh, prefix_.size(), true, definite && got == 0 ? &result : nullptr);
    }
  }
  if (!size_known_) fail(Errc::io, "The server did not report the size of " + describe());
  prefix_.resize(size_t(std::min<uint64_t>(size_, prefix_.size())));
  last_end_.store(prefix_.size(), std::memory_order_relaxed);
  std::lock_guard<std::mutex> headers_lock(headers_mutex_);
  headers_recorded_ = true;  // response_headers() is read without a lock from now on
}

std::shared_ptr<HttpSource::Stream> HttpSource::start_stream(uint64_t offset, Cursor& cursor, size_t want) {
  auto s = std::make_shared<Stream>();
  s->pos = offset;
  s->install(cursor, 0, want);
  Handle* h = acquire();
  Stream* raw = s.get();  // the thread ends before the stream is destroyed
  try {
    s->thread = std::thread([this, raw, h, offset] {
      Attempt a;
      std::exception_ptr error;
      try {
        a = attempt(h, offset, raw->unused, kOpenEnded, false, raw);
      } catch (...) {
        error = std::current_exception();
      }
      release(h);
      std::lock_guard<std::mutex> lock(raw->m);
      raw->result = a;
      raw->error = error;
      raw->ended = true;
      raw->cursor = nullptr;
      raw->cv.notify_all();
    });
  } catch (...) {
    release(h);
    throw;
  }
  return s;
}

void HttpSource::close_stream() noexcept {
  std::shared_ptr<Stream> old;
  {
    std::lock_guard<std::mutex> guard(stream_mutex_);
    old = std::move(stream_);
  }
  // Destroying it stops and joins its transfer.
}

HttpSource::~HttpSource() {
  close_stream();
  for (Handle* h : pool_) {
    curl_easy_cleanup(h->curl);
    delete h;
  }
  curl_slist_free_all(headers_);
}

HttpSource::Handle* HttpSource::acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      Handle* h = pool_.back();
      pool_.pop_back();
      return h;
    }
  }
  auto h = std::make_unique<Handle>();
  h->curl = curl_easy_init();
  if (!h->curl) fail(Errc::nomem, "libcurl could not create a handle");
  CURL* c = h->curl;
  curl_easy_setopt(c, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->errbuf);
  apply_connection_options(c, options_);
  if (headers_) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers_);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  // Bigger receive chunks: fewer callbacks and system calls per byte.
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
  return h.release();
}

void HttpSource::release(Handle* h) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.push_back(h);
}

void HttpSource::record_headers(long status, const std::string& block) {
  if (status != 200 && status != 206) return;  // redirects and errors: not the object's
  std::lock_guard<std::mutex> lock(headers_mutex_);
  if (headers_recorded_) return;
  headers_recorded_ = true;
  response_headers_ = block;
}

HttpSource::Attempt HttpSource::attempt(Handle* h, uint64_t offset, Cursor& cursor, size_t len, bool probe_size,
                                        Stream* stream) {
  Transfer t;
  t.source = this;
  t.cursor = &cursor;
  t.stream = stream;
  t.cap = len;
  t.expect_start = offset;
  const std::string range =
      std::to_string(offset) + "-" + (len == kOpenEnded ? std::string() : std::to_string(offset + len - 1));
  curl_easy_setopt(h->curl, CURLOPT_RANGE, range.c_str());
  // A parked stream must notice a close even while the server sends nothing.
  curl_easy_setopt(h->curl, CURLOPT_NOPROGRESS, stream ? 0L : 1L);
  curl_easy_setopt(h->curl, CURLOPT_XFERINFOFUNCTION, stream ? on_progress : nullptr);
  curl_easy_setopt(h->curl, CURLOPT_XFERINFODATA, stream);
  // Signed requests get their headers afresh each time.
  struct SlistDeleter {
    void operator()(curl_slist* l) const { curl_slist_free_all(l); }
  };
  std::unique_ptr<curl_slist, SlistDeleter> request_headers;
  if (options_.sign) {
    curl_slist* list = nullptr;
    std::vector<std::string> lines = options_.headers;
    for (auto& line : options_.sign()) lines.push_back(std::move(line));
    for (const auto& line : lines) {
      curl_slist* next = curl_slist_append(list, line.c_str());
      if (!next) {
        curl_slist_free_all(list);
        throw std::bad_alloc();
      }
      list = next;
    }
    request_headers.reset(list);
    curl_easy_setopt(h->curl, CURLOPT_HTTPHEADER, list);
  }
  curl_easy_setopt(h->curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &t);
  h->errbuf[0] = '\0';
  const CURLcode rc = curl_easy_perform(h->curl);
  if (t.callback_error) std::rethrow_exception(t.callback_error);

  Attempt a;
  a.status = t.status;
  const bool usable = (t.status == 206 && t.range_ok) || t.whole_body;
  a.received = usable ? t.received : 0;
  if (probe_size) {
    if (t.status == 416 && t.have_total && t.total == 0) {
      size_known_ = true;  // an empty object
      a.done = true;
      return a;
    }
    if (t.status == 206 && t.have_total) {
      size_ = t.total;
      size_known_ = true;
    }
  }
  if (t.whole_body) {
    a.error = "the server does not support range requests (it answered 200 to a ranged GET)";
    return a;
  }
  if (t.mismatch) {
    a.error = "the server answered a different range than requested";
    return a;
  }
  // A probe may ask for more than a small object holds.
  if (usable && (a.received == len || (probe_size && size_known_ && offset + a.received == size_))) {
    a.done = true;
    return a;
  }
  if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR) {
    const Failure kind = classify(rc);
    a.retryable = kind != Failure::permanent;
    a.name_resolution = kind == Failure::name_resolution;
    a.error = describe_curl_error(rc, h->errbuf);
    return a;
  }
  if (t.status >= 400 || (t.status != 206 && t.status != 200)) {
    a.retryable = classify_status(t.status) == Failure::transient;
    a.error = "HTTP status " + std::to_string(t.status);
    return a;
  }
  // 206 but the body ended early: resume from where it stopped.
  a.retryable = true;
  a.error = "the response ended after " + std::to_string(a.received) + " of " + std::to_string(len) + " bytes";
  return a;
}

void HttpSource::fetch(uint64_t offset, Cursor& cursor, size_t len, bool probe_size, const Attempt* first) {
  RetryStreak retry(options_);
  while (len > 0) {
    Attempt a;
    if (first) {
      a = *first;
      first = nullptr;
    } else {
      Handle* h = acquire();
      try {
        a = attempt(h, offset, cursor, len, probe_size);
      } catch (...) {
        release(h);
        throw;
      }
      release(h);
    }
    if (a.done) return;
    offset += a.received;
    len -= a.received;
    // A probe cut short resumes for the object's remaining bytes only.
    if (size_known_ && offset + len > size_) len = size_t(size_ > offset ? size_ - offset : 0);
    if (len == 0) return;
    probe_size = probe_size && a.received == 0;
    const Failure kind = !a.retryable ? Failure::permanent
                         : a.name_resolution ? Failure::name_resolution
                                             : Failure::transient;
    // Progress ends the streak: only failures in a row give up.
    if (!retry.again(kind, a.received > 0)) {
      const std::string where = " (GET " + redact_url(url_) + ")";
      if (kind != Failure::permanent) fail(Errc::io, retry.stop_reason() + ": " + a.error + where);
      if (a.status == 404 || a.status == 410) fail(Errc::not_found, "Not found: HTTP " + std::to_string(a.status) + where);
      if (a.status == 401 || a.status == 403) {
        fail(Errc::io, "Access denied: HTTP " + std::to_string(a.status) + where);
      }
      if (a.status == 416 && probe_size) fail(Errc::truncated, "Empty or unreadable object" + where);
      fail(Errc::io, a.error + where);
    }
    retry.wait();
  }
}

void HttpSource::read_at(uint64_t offset, void* dst, size_t len) {
  if (len == 0) return;
  if (offset > size_ || len > size_ - offset) {
    fail(Errc::truncated, "Read past the end of " + describe() + " (" + std::to_string(size_) + " bytes)");
  }
  const Segment segment{dst, len};
  Cursor cursor(&segment, 1, nullptr);
  last_end_.store(offset + len, std::memory_order_relaxed);
  // Small sequential reads (a header, the metadata index) go on from here.
  fetch_after_prefix(offset, cursor, len, true, Opening::never);
}

void HttpSource::read_scatter(uint64_t offset, const Segment* segments, size_t count,
                              const std::function<void(size_t)>& on_segment, NextRead next) {
  uint64_t len = 0;
  for (size_t i = 0; i < count; ++i) len += segments[i].len;
  if (offset > size_ || len > size_ - offset) {
    fail(Errc::truncated, "Read past the end of " + describe() + " (" + std::to_string(size_) + " bytes)");
  }
  Cursor cursor(segments, count, &on_segment);
  // A reader's run of tensors in a larger plan is followed by other requests;
  // a lazy load's next tensor usually follows this one. Only a read that goes
  // on forward opens a response for what follows: one read backwards, with
  // an open-ended range, would fetch bytes nobody asked for.
  const bool follows = next != NextRead::elsewhere;
  const bool forward = offset >= last_end_.exchange(offset + len, std::memory_order_relaxed);
  const Opening open = !follows || !forward           ? Opening::never
                       : next == NextRead::follows ? Opening::instead_of_any
                                                   : Opening::instead_of_busy;
  fetch_after_prefix(offset, cursor, size_t(len), follows, open);
}

void HttpSource::fetch_after_prefix(uint64_t offset, Cursor& cursor, size_t len, bool keep, Opening open) {
  if (offset < prefix_.size()) {
    const size_t n = std::min(len, size_t(prefix_.size() - offset));
    cursor.write(prefix_.data() + offset, n);
    offset += n;
    len -= n;
  }
  if (len > 0) {
    const size_t got = read_from_stream(offset, cursor, len, keep, open);
    offset += got;
    len -= got;
  }
  if (len > 0) fetch(offset, cursor, len, false);
}

size_t HttpSource::read_from_stream(uint64_t offset, Cursor& cursor, size_t len, bool keep, Opening open) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> guard(stream_mutex_);
    s = stream_;
  }
  if (s) {
    std::unique_lock<std::mutex> lock(s->m);
    if (s->serves(offset)) {
      s->install(cursor, offset - s->pos, len);
      return s->finish_job(lock, keep);
    }
    const bool idle = !s->busy && !s->closing && !s->retired && !s->ended;
    if (idle && open == Opening::instead_of_busy) return 0;  // another read may be about to take it
  }
  if (open == Opening::never) return 0;
  // A new response from `offset` takes the place of the current one, which
  // stops now, or once the reader it serves (another part of this load) is done.
  std::shared_ptr<Stream> fresh;
  {
    std::lock_guard<std::mutex> guard(stream_mutex_);
    if (stream_ != s) return 0;  // another reader replaced it meanwhile
    fresh = start_stream(offset, cursor, len);
    stream_ = fresh;
  }
  if (s) s->retire();
  s.reset();  // the last owner joins its transfer
  std::unique_lock<std::mutex> lock(fresh->m);
  return fresh->finish_job(lock, keep);
}

}  // namespace tz::io
