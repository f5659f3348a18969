#include "tz/io/s3.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <set>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>
#include <iterator>
#include <sstream>

#include "curl_options.hpp"
#include "retry.hpp"
#include "tz/format/error.hpp"

namespace tz::io {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), {});
  return true;
}

const std::string* lookup(const std::map<std::string, std::map<std::string, std::string>>& ini,
                          const std::string& section, const std::string& key) {
  const auto s = ini.find(section);
  if (s == ini.end()) return nullptr;
  const auto k = s->second.find(key);
  return k == s->second.end() ? nullptr : &k->second;
}

}  // namespace

std::map<std::string, std::map<std::string, std::string>> parse_ini(const std::string& text) {
  std::map<std::string, std::map<std::string, std::string>> out;
  std::string section;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = trim(t.substr(1, t.size() - 2));
      out[section];
      continue;
    }
    const auto eq = t.find_first_of("=:");
    if (eq == std::string::npos) continue;
    out[section][trim(t.substr(0, eq))] = trim(t.substr(eq + 1));
  }
  return out;
}

S3Target resolve_s3(const std::string& uri, const S3Options& o, bool for_write,
                    const std::function<const char*(const char*)>& env, const std::string& home) {
  const std::string scheme = "s3://";
  if (uri.compare(0, scheme.size(), scheme) != 0) fail(Errc::invalid_arg, "Not an s3:// URI");
  S3Target t;
  const std::string rest = uri.substr(scheme.size());
  const auto slash = rest.find('/');
  t.bucket = rest.substr(0, slash);
  t.key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (t.bucket.empty() || t.key.empty()) fail(Errc::invalid_arg, "An S3 URI needs a bucket and a key: s3://bucket/key");
  const auto getenv_str = [&](const char* name) -> std::string {
    const char* v = env(name);
    return v ? std::string(v) : std::string();
  };

  // Credentials and, with them, the s3cmd endpoint.
  std::string endpoint = o.endpoint;
  bool endpoint_trusted = false;  // from env or AWS config: plain http allowed
  std::optional<bool> force_http = o.force_http;
  bool have_creds = o.access_key_id && o.secret_access_key;
  if (have_creds) {
    t.credentials = {*o.access_key_id, *o.secret_access_key, o.session_token.value_or("")};
  } else {
    std::string text;
    const std::string path = o.config_path.empty() ? home + "/.s3cfg" : o.config_path;
    if (o.read_s3cmd_config && read_file(path, text)) {
      const auto ini = parse_ini(text);
      const std::string* ak = lookup(ini, "default", "access_key");
      const std::string* sk = lookup(ini, "default", "secret_key");
      std::string access = o.access_key_id.value_or(ak ? *ak : "");
      std::string secret = o.secret_access_key.value_or(sk ? *sk : "");
      if ((o.access_key_id || ak) && (o.secret_access_key || sk)) {
        have_creds = true;
        t.credentials = {access, secret, o.session_token.value_or("")};
        if (endpoint.empty()) {
          if (const std::string* hb = lookup(ini, "default", "host_base")) endpoint = *hb;
        }
        if (!force_http) {
          if (const std::string* https = lookup(ini, "default", "use_https")) {
            if (*https == "False") force_http = true;
            else if (*https == "True") force_http = false;
          }
        }
      }
    }
  }
  std::map<std::string, std::map<std::string, std::string>> aws_config;
  const std::string profile = getenv_str("AWS_PROFILE").empty() ? "default" : getenv_str("AWS_PROFILE");
  {
    std::string text;
    const std::string path =
        getenv_str("AWS_CONFIG_FILE").empty() ? home + "/.aws/config" : getenv_str("AWS_CONFIG_FILE");
    if (read_file(path, text)) aws_config = parse_ini(text);
  }
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;
  if (!have_creds) {
    const std::string ak = o.access_key_id.value_or(getenv_str("AWS_ACCESS_KEY_ID"));
    const std::string sk = o.secret_access_key.value_or(getenv_str("AWS_SECRET_ACCESS_KEY"));
    if (!ak.empty() && !sk.empty()) {
      have_creds = true;
      t.credentials = {ak, sk, o.session_token.value_or(getenv_str("AWS_SESSION_TOKEN"))};
    }
  }
  if (!have_creds) {
    std::string text;
    const std::string path = getenv_str("AWS_SHARED_CREDENTIALS_FILE").empty()
                                 ? home + "/.aws/credentials"
                                 : getenv_str("AWS_SHARED_CREDENTIALS_FILE");
    for (const auto& [ini, section] :
         {std::make_pair(read_file(path, text) ? parse_ini(text) : decltype(aws_config){}, profile),
          std::make_pair(aws_config, config_section)}) {
      const std::string* ak = lookup(ini, section, "aws_access_key_id");
      const std::string* sk = lookup(ini, section, "aws_secret_access_key");
      if (ak && sk) {
        const std::string* tok = lookup(ini, section, "aws_session_token");
        t.credentials = {*ak, *sk, tok ? *tok : ""};
        have_creds = true;
        break;
      }
    }
  }
  // Otherwise: anonymous (public buckets), requests go unsigned.

  // Endpoint.
  if (endpoint.empty()) {
    for (const char* var : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
      if (!getenv_str(var).empty()) {
        endpoint = getenv_str(var);
        endpoint_trusted = true;
        break;
      }
    }
  }
  if (endpoint.empty()) {
    const std::string* e = lookup(aws_config, config_section, "endpoint_url");
    if (e && !e->empty()) {
      endpoint = *e;
      endpoint_trusted = true;
    }
  }
  if (endpoint.empty()) endpoint = o.default_endpoint;
  if (endpoint.empty()) endpoint = for_write ? "object.ord1.coreweave.com" : "accel-object.ord1.coreweave.com";
  std::string ep_scheme = "https";
  std::string host = endpoint;
  const auto sep = endpoint.find("://");
  if (sep != std::string::npos) {
    ep_scheme = endpoint.substr(0, sep);
    host = endpoint.substr(sep + 3);
    if (ep_scheme == "http" && !force_http.value_or(false) && !endpoint_trusted) {
      fail(Errc::invalid_arg, "Non-HTTPS endpoint URLs are not allowed.");
    }
  }
  if (force_http.value_or(false)) ep_scheme = "http";
  while (!host.empty() && host.back() == '/') host.pop_back();

  // Region.
  t.region = o.region;
  if (t.region.empty()) t.region = getenv_str("AWS_REGION");
  if (t.region.empty()) t.region = getenv_str("AWS_DEFAULT_REGION");
  if (t.region.empty()) {
    const std::string* r = lookup(aws_config, config_section, "region");
    if (r) t.region = *r;
  }
  if (t.region.empty()) t.region = "us-east-1";

  // Addressing: virtual-hosted for CoreWeave's cwobject/cwlota hosts, as upstream; else path-style.
  bool virtual_hosted = host == "cwobject.com" || host == "cwlota.com";
  if (o.addressing == "virtual") virtual_hosted = true;
  else if (o.addressing == "path") virtual_hosted = false;
  else if (!o.addressing.empty()) fail(Errc::invalid_arg, "s3_addressing must be 'path' or 'virtual'");
  const std::string encoded_key = uri_encode(t.key, true);
  if (virtual_hosted) {
    t.host = t.bucket + "." + host;
    t.canonical_uri = "/" + encoded_key;
  } else {
    t.host = host;
    t.canonical_uri = "/" + uri_encode(t.bucket, false) + "/" + encoded_key;
  }
  t.url = ep_scheme + "://" + t.host + t.canonical_uri;
  return t;
}

std::unique_ptr<Source> open_s3_source(const std::string& uri, const S3Options& options, const HttpOptions& http) {
  const char* home = std::getenv("HOME");
  const S3Target target = resolve_s3(
      uri, options, false, [](const char* name) { return std::getenv(name); }, home ? home : "");
  HttpOptions signed_http = http;
  if (!target.credentials.anonymous()) {
    signed_http.sign = [target] {
      SignedRequest r;
      r.method = "GET";
      r.host = target.host;
      r.canonical_uri = target.canonical_uri;
      return sigv4_headers(target.credentials, target.region, r, amz_date_now());
    };
  }
  return std::make_unique<HttpSource>(target.url, signed_http);
}

}  // namespace tz::io

// ---- Multipart upload sink ---------------------------------------------------

namespace tz::io {

namespace {

struct Response {
  long status = 0;
  std::string body;
  std::string etag;
};

size_t collect_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t collect_etag(char* data, size_t size, size_t n, void* user) {
  const size_t len = size * n;
  std::string line(data, len);
  if (line.size() > 5 && (line.compare(0, 5, "ETag:") == 0 || line.compare(0, 5, "etag:") == 0)) {
    *static_cast<std::string*>(user) = trim(line.substr(5));
  }
  return len;
}

std::string xml_value(const std::string& xml, const std::string& tag) {
  const auto a = xml.find("<" + tag + ">");
  if (a == std::string::npos) return "";
  const auto start = a + tag.size() + 2;
  const auto b = xml.find("</" + tag + ">", start);
  return b == std::string::npos ? "" : xml.substr(start, b - start);
}

// A multipart upload fed by positional writes. The first part (the file
// header and metadata index, which the writer patches until the end) is kept
// in memory and uploaded last; every other part is uploaded, on threads of
// its own, as soon as all its bytes have been written. Writers that write in
// file order (streaming() says so) keep only a few parts in memory.
class S3Sink final : public Sink {
 public:
  S3Sink(S3Target target, const HttpOptions& http, uint64_t part_size)
      : t_(std::move(target)), http_(http), part_size_(part_size) {
    if (part_size_ < (uint64_t(5) << 20)) fail(Errc::invalid_arg, "S3 part size must be at least 5 MiB");
    const Response r = call("POST", "uploads=", nullptr, 0);
    upload_id_ = xml_value(r.body, "UploadId");
    if (upload_id_.empty()) fail(Errc::io, "S3 did not start a multipart upload for " + describe());
  }

  ~S3Sink() override {
    if (!done_) {
      try {
        abort();
      } catch (...) {
      }
    }
    stop_uploads(true);
  }

  std::string describe() const override { return "s3://" + t_.bucket + "/" + t_.key; }
  bool streaming() const override { return true; }

  void set_rewritable_prefix(uint64_t end) override {
    std::lock_guard<std::mutex> lock(m_);
    if (!parts_.empty() || !etags_.empty() || in_flight_ > 0) {
      if (end > head_size_) fail(Errc::state, "The S3 head part cannot grow after data parts were written");
    }
    head_size_ = std::max(head_size_, (std::max(end, part_size_) + part_size_ - 1) / part_size_ * part_size_);
  }

  void write_at(uint64_t offset, const void* src, size_t len) override { put(offset, src, len, true); }

  void write_marker(uint64_t offset, const void* src, size_t len) override {
    // Not counted towards completing a part: the next write call overwrites it.
    std::lock_guard<std::mutex> lock(m_);
    marker_offset_ = offset;
    marker_.assign(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + len);
  }

  void reserve(uint64_t) override {}
  void truncate(uint64_t size) override {
    std::lock_guard<std::mutex> lock(m_);
    size_ = size;
  }

  void close() override {
    if (done_) return;
    try {
      if (!marker_.empty()) put(marker_offset_, marker_.data(), marker_.size(), false);
      // The remaining parts (holes read as zeros), then the head, then complete.
      std::vector<uint64_t> pending;
      {
        std::lock_guard<std::mutex> lock(m_);
        for (const auto& [k, part] : parts_) pending.push_back(k);
      }
      for (uint64_t k : pending) {
        std::vector<uint8_t> data;
        {
          std::lock_guard<std::mutex> lock(m_);
          data = std::move(parts_[k].data);
          parts_.erase(k);
        }
        const uint64_t start = head_size_ + (k - 2) * part_size_;
        if (start >= size_) continue;
        data.resize(size_t(std::min<uint64_t>(data.size(), size_ - start)));
        enqueue(k, std::move(data));
      }
      stop_uploads(false);
      head_.resize(size_t(std::min(head_size_, size_)));
      upload(1, head_);
      std::string xml = "<CompleteMultipartUpload>";
      for (const auto& [k, etag] : etags_) {
        xml += "<Part><PartNumber>" + std::to_string(k) + "</PartNumber><ETag>" + etag + "</ETag></Part>";
      }
      xml += "</CompleteMultipartUpload>";
      const Response r = call("POST", "uploadId=" + uri_encode(upload_id_, false), xml.data(), xml.size());
      if (r.body.find("<Error>") != std::string::npos) {
        fail(Errc::io, "S3 could not complete the upload of " + describe() + ": " + xml_value(r.body, "Message"));
      }
      done_ = true;
    } catch (...) {
      try {
        abort();
      } catch (...) {
      }
      throw;
    }
  }

  void abort() override {
    if (done_) return;
    done_ = true;
    stop_uploads(true);
    call("DELETE", "uploadId=" + uri_encode(upload_id_, false), nullptr, 0);
  }

 private:
  // Parts waiting for or in upload; writers wait beyond this, which bounds memory.
  static constexpr unsigned kMaxInFlight = 6;
  static constexpr unsigned kUploaders = 4;

  struct Job {
    uint64_t part;
    std::vector<uint8_t> data;
  };

  // Copies bytes into the head or into part buffers; queues a part once full.
  void put(uint64_t offset, const void* src, size_t len, bool counted) {
    auto* p = static_cast<const uint8_t*>(src);
    while (len > 0) {
      std::vector<uint8_t> ready;
      uint64_t ready_part = 0;
      size_t n;
      {
        std::lock_guard<std::mutex> lock(m_);
        if (upload_error_) std::rethrow_exception(upload_error_);
        if (head_size_ == 0) head_size_ = part_size_;
        if (offset < head_size_) {
          n = size_t(std::min<uint64_t>(len, head_size_ - offset));
          if (head_.size() < offset + n) head_.resize(size_t(offset + n), 0);
          std::memcpy(head_.data() + offset, p, n);
        } else {
          const uint64_t k = 2 + (offset - head_size_) / part_size_;
          const uint64_t start = head_size_ + (k - 2) * part_size_;
          n = size_t(std::min<uint64_t>(len, start + part_size_ - offset));
          if (etags_.count(int(k)) || queued_.count(k)) {
            fail(Errc::state, "Part " + std::to_string(k) + " of " + describe() + " was already uploaded");
          }
          Part& part = parts_[k];
          if (part.data.empty()) part.data = take_buffer();
          std::memcpy(part.data.data() + (offset - start), p, n);
          if (counted) part.filled += n;
          if (part.filled == part_size_) {
            ready = std::move(part.data);
            ready_part = k;
            parts_.erase(k);
          }
        }
      }
      if (ready_part) enqueue(ready_part, std::move(ready));
      offset += n;
      p += n;
      len -= n;
    }
  }

  // A zeroed part buffer, reusing one whose upload finished.
  std::vector<uint8_t> take_buffer() {
    if (spare_.empty()) return std::vector<uint8_t>(size_t(part_size_), 0);
    std::vector<uint8_t> b = std::move(spare_.back());
    spare_.pop_back();
    b.resize(size_t(part_size_));
    std::fill(b.begin(), b.end(), 0);
    return b;
  }

  void enqueue(uint64_t k, std::vector<uint8_t> data) {
    std::unique_lock<std::mutex> lock(m_);
    room_.wait(lock, [&] { return in_flight_ < kMaxInFlight || upload_error_; });
    if (upload_error_) std::rethrow_exception(upload_error_);
    if (uploaders_.size() < kUploaders && uploaders_.size() <= in_flight_) {
      uploaders_.emplace_back([this] { upload_loop(); });
    }
    queue_.push_back({k, std::move(data)});
    queued_.insert(k);
    ++in_flight_;
    work_.notify_one();
  }

  void upload_loop() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      work_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        upload(job.part, job.data);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !upload_error_) upload_error_ = error;
      if (spare_.size() < kMaxInFlight) spare_.push_back(std::move(job.data));
      --in_flight_;
      room_.notify_all();
    }
  }

  // Waits for the queued uploads (or drops them) and joins the uploaders.
  void stop_uploads(bool discard) {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (discard) {
        in_flight_ -= unsigned(queue_.size());
        queue_.clear();
      }
      stopping_ = true;
      threads.swap(uploaders_);
    }
    work_.notify_all();
    for (auto& t : threads) t.join();
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = false;
    if (upload_error_ && !discard) std::rethrow_exception(upload_error_);
  }

  void upload(uint64_t k, const std::vector<uint8_t>& data) {
    const std::string query = "partNumber=" + std::to_string(k) + "&uploadId=" + uri_encode(upload_id_, false);
    const Response r = call("PUT", query, data.data(), data.size());
    if (r.etag.empty()) fail(Errc::io, "S3 returned no ETag for part " + std::to_string(k) + " of " + describe());
    std::lock_guard<std::mutex> lock(m_);
    etags_[int(k)] = r.etag;
  }

  // One signed request with a body, retried on transient failures.
  Response call(const std::string& method, const std::string& query, const void* body, size_t body_len) {
    RetryStreak retry(http_);
    for (;;) {
      Response r;
      CURL* c = curl_easy_init();
      if (!c) fail(Errc::nomem, "libcurl could not create a handle");
      struct Cleanup {
        CURL* c;
        curl_slist* h = nullptr;
        ~Cleanup() {
          curl_slist_free_all(h);
          curl_easy_cleanup(c);
        }
      } cleanup{c};
      const std::string url = t_.url + "?" + query;
      curl_easy_setopt(c, CURLOPT_URL, url.c_str());
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
      apply_connection_options(c, http_);
      if (method != "DELETE") {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body_len ? body : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body_len));
      }
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect_body);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
      curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, collect_etag);
      curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.etag);
      std::vector<std::string> lines = http_.headers;
      lines.push_back("Expect:");  // no 100-continue round trip
      // Not curl's default form encoding, which servers may try to parse.
      lines.push_back(method == "PUT" ? "Content-Type: application/octet-stream" : "Content-Type: application/xml");
      if (!t_.credentials.anonymous()) {
        SignedRequest sr;
        sr.method = method;
        sr.host = t_.host;
        sr.canonical_uri = t_.canonical_uri;
        sr.canonical_query = query;
        for (auto& h : sigv4_headers(t_.credentials, t_.region, sr, amz_date_now())) lines.push_back(std::move(h));
      }
      for (const auto& line : lines) {
        curl_slist* next = curl_slist_append(cleanup.h, line.c_str());
        if (!next) throw std::bad_alloc();
        cleanup.h = next;
      }
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, cleanup.h);
      const CURLcode rc = curl_easy_perform(c);
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
      if (rc == CURLE_OK && r.status >= 200 && r.status < 300) return r;
      const Failure kind = rc != CURLE_OK ? classify(rc) : classify_status(r.status);
      if (!retry.again(kind, false)) {
        const std::string where = " (" + method + " " + describe() + ")";
        const std::string why = rc != CURLE_OK ? describe_curl_error(rc, nullptr)
                                               : "HTTP " + std::to_string(r.status) + " " +
                                                     xml_value(r.body, "Code") + " " + xml_value(r.body, "Message");
        const std::string gave_up = retry.stop_reason().empty() ? "" : retry.stop_reason() + ": ";
        if (r.status == 404) fail(Errc::not_found, "Not found: " + why + where);
        if (r.status == 401 || r.status == 403) fail(Errc::io, "Access denied: " + why + where);
        fail(Errc::io, "S3 request failed: " + gave_up + why + where);
      }
      retry.wait();
    }
  }

  struct Part {
    std::vector<uint8_t> data;
    uint64_t filled = 0;
  };

  S3Target t_;
  HttpOptions http_;
  uint64_t part_size_;
  std::string upload_id_;
  std::mutex m_;
  uint64_t head_size_ = 0;
  std::vector<uint8_t> head_;
  std::map<uint64_t, Part> parts_;
  std::map<int, std::string> etags_;
  std::deque<Job> queue_;
  std::set<uint64_t> queued_;  // parts handed to the uploaders
  std::vector<std::thread> uploaders_;
  std::vector<std::vector<uint8_t>> spare_;
  std::condition_variable work_, room_;
  unsigned in_flight_ = 0;
  bool stopping_ = false;
  std::exception_ptr upload_error_;
  uint64_t size_ = 0;
  uint64_t marker_offset_ = 0;
  std::vector<uint8_t> marker_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Sink> open_s3_sink(const std::string& uri, const S3Options& options, const HttpOptions& http) {
  const char* home = std::getenv("HOME");
  S3Target target = resolve_s3(
      uri, options, true, [](const char* name) { return std::getenv(name); }, home ? home : "");
  return std::make_unique<S3Sink>(std::move(target), http, options.part_size);
}

}  // namespace tz::io
