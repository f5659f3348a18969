#include "tz/io/redis.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>

#include "tz/format/error.hpp"

namespace tz::io {

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(char(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Escapes glob characters so SCAN MATCH takes the prefix literally.
std::string glob_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

RedisLocation parse_redis_uri(const std::string& uri) {
  const std::string scheme = "redis://";
  if (uri.size() < scheme.size() || !std::equal(scheme.begin(), scheme.end(), uri.begin(),
                                                [](char want, char got) { return std::tolower(static_cast<unsigned char>(got)) == want; })) {
    fail(Errc::invalid_arg, "Not a redis:// URI");
  }
  RedisLocation loc;
  std::string rest = uri.substr(scheme.size());
  const auto slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash + 1);
  const auto at = authority.rfind('@');
  if (at != std::string::npos) {
    const std::string userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string::npos) {
      loc.password = percent_decode(userinfo);  // redis://password@host, as redis-py allows
    } else {
      loc.username = percent_decode(userinfo.substr(0, colon));
      loc.password = percent_decode(userinfo.substr(colon + 1));
    }
  }
  const auto colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    const std::string port = authority.substr(colon + 1);
    if (!all_digits(port) || port.size() > 5 || std::stoi(port) > 65535) {
      fail(Errc::invalid_arg, "Invalid port in redis URI");
    }
    loc.port = std::stoi(port);
    authority = authority.substr(0, colon);
  }
  if (!authority.empty()) loc.host = authority;
  const auto next = path.find('/');
  if (next != std::string::npos && all_digits(path.substr(0, next)) && next <= 6) {
    loc.db = std::stoi(path.substr(0, next));
    path = path.substr(next + 1);
  }
  loc.prefix = percent_decode(path);
  if (loc.prefix.empty()) fail(Errc::invalid_arg, "A redis:// URI needs a key prefix: redis://host[:port][/db]/prefix");
  return loc;
}

RedisSource::RedisSource(const std::string& uri, unsigned connect_timeout_ms)
    : loc_(parse_redis_uri(uri)), connect_timeout_ms_(connect_timeout_ms) {
  redisContext* c = connect();
  try {
    discover(c);
  } catch (...) {
    redisFree(c);
    throw;
  }
  release(c);
}

RedisSource::~RedisSource() {
  for (redisContext* c : pool_) redisFree(c);
}

std::string RedisSource::describe() const {
  return "redis://" + loc_.host + ":" + std::to_string(loc_.port) + "/" + std::to_string(loc_.db) + "/" +
         loc_.prefix;
}

redisContext* RedisSource::connect() const {
  timeval tv{long(connect_timeout_ms_ / 1000), long(connect_timeout_ms_ % 1000) * 1000};
  redisContext* c = redisConnectWithTimeout(loc_.host.c_str(), loc_.port, tv);
  if (c == nullptr) fail(Errc::nomem, "Cannot allocate a Redis connection");
  if (c->err) {
    const std::string why = c->errstr;
    redisFree(c);
    fail(Errc::io, "Cannot connect to " + describe() + ": " + why);
  }
  redisSetTimeout(c, timeval{60, 0});
  auto command = [&](const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(redisCommandArgv(c, int(argv.size()), argv.data(), lens.data())));
    if (!r || r->type == REDIS_REPLY_ERROR) {
      const std::string why = r ? std::string(r->str, r->len) : std::string(c->errstr);
      redisFree(c);
      // Never echo the password: name the step only.
      fail(Errc::io,
           (args[0] == "AUTH" ? "Redis authentication failed for " : "Redis " + args[0] + " failed for ") +
               describe() + ": " + why);
    }
  };
  if (!loc_.password.empty()) {
    if (loc_.username.empty()) command({"AUTH", loc_.password});
    else command({"AUTH", loc_.username, loc_.password});
  }
  if (loc_.db != 0) command({"SELECT", std::to_string(loc_.db)});
  return c;
}

void RedisSource::discover(redisContext* c) {
  const std::string pattern = glob_escape(loc_.prefix) + ":*";
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    const char* argv[] = {"SCAN", cursor.c_str(), "MATCH", pattern.c_str(), "COUNT", "1000"};
    const size_t lens[] = {4, cursor.size(), 5, pattern.size(), 5, 4};
    Reply r(static_cast<redisReply*>(redisCommandArgv(c, 6, argv, lens)));
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      fail(Errc::io, "Redis SCAN failed for " + describe() + ": " + (r && r->str ? r->str : c->errstr));
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* list = r->element[1];
    for (size_t i = 0; i < list->elements; ++i) keys.emplace_back(list->element[i]->str, list->element[i]->len);
  } while (cursor != "0");

  std::vector<Slice> slices;
  for (const auto& key : keys) {
    const auto colon = key.rfind(':');
    const std::string tail = key.substr(colon + 1);
    if (colon < loc_.prefix.size() || !all_digits(tail) || tail.size() > 19) continue;
    slices.push_back({std::stoull(tail), 0, key});
  }
  // STRLEN of every key, pipelined.
  for (const auto& s : slices) redisAppendCommand(c, "STRLEN %b", s.key.data(), s.key.size());
  for (auto& s : slices) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK) fail(Errc::io, "Redis STRLEN failed for " + describe() + ": " + c->errstr);
    Reply r(static_cast<redisReply*>(raw));
    if (r->type != REDIS_REPLY_INTEGER) fail(Errc::io, "Redis STRLEN gave no length for a key of " + describe());
    s.length = uint64_t(r->integer);
  }
  // Zero-length slices (empty and meta tensors' data) carry nothing.
  slices.erase(std::remove_if(slices.begin(), slices.end(), [](const Slice& s) { return s.length == 0; }),
               slices.end());
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) { return a.offset < b.offset; });
  if (slices.empty() || slices.front().offset != 0) {
    fail(Errc::not_found, "No tensorizer file under " + describe() + " (no '" + loc_.prefix + ":header:0' key)");
  }
  for (size_t i = 1; i < slices.size(); ++i) {
    if (slices[i].offset < slices[i - 1].offset + slices[i - 1].length) {
      fail(Errc::format, "Keys under " + describe() + " overlap at offset " + std::to_string(slices[i].offset));
    }
  }
  size_ = slices.back().offset + slices.back().length;
  slices_ = std::move(slices);
}

redisContext* RedisSource::acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      redisContext* c = pool_.back();
      pool_.pop_back();
      return c;
    }
  }
  return connect();
}

void RedisSource::release(redisContext* c) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.push_back(c);
}

void RedisSource::plan(uint64_t offset, uint8_t* dst, uint64_t len, std::vector<Range>& out) const {
  if (offset > size_ || len > size_ - offset) {
    fail(Errc::truncated, "No key of " + describe() + " covers offset " + std::to_string(std::max(offset, size_)) +
                              " (a tensor not stored there?)");
  }
  // The last slice starting at or before `offset`.
  auto it = std::upper_bound(slices_.begin(), slices_.end(), offset,
                             [](uint64_t off, const Slice& s) { return off < s.offset; });
  uint64_t pos = offset;
  const uint64_t end = offset + len;
  while (pos < end) {
    if (it == slices_.begin()) fail(Errc::truncated, "No key of " + describe() + " covers offset " + std::to_string(pos));
    const Slice& s = *std::prev(it);
    if (pos >= s.offset + s.length) {
      fail(Errc::truncated, "No key of " + describe() + " covers offset " + std::to_string(pos) +
                                " (a tensor not stored there?)");
    }
    const uint64_t n = std::min(end, s.offset + s.length) - pos;
    out.push_back({&s, pos - s.offset, n, dst + (pos - offset)});
    pos += n;
    if (pos < end && it != slices_.end() && pos >= it->offset) ++it;
  }
}

// Sends GETRANGEs ahead of the replies, at most kWindow bytes outstanding
// (the server buffers what is sent ahead), and copies each reply into place.
void RedisSource::run(const std::vector<Range>& ranges, const std::function<void(size_t)>& on_range) {
  constexpr uint64_t kWindow = uint64_t(32) << 20;
  redisContext* c = acquire();
  size_t sent = 0, received = 0;
  uint64_t outstanding = 0;
  try {
    while (received < ranges.size()) {
      while (sent < ranges.size() && (sent == received || outstanding + ranges[sent].len <= kWindow)) {
        const Range& r = ranges[sent++];
        const std::string from = std::to_string(r.from), to = std::to_string(r.from + r.len - 1);
        redisAppendCommand(c, "GETRANGE %b %s %s", r.slice->key.data(), r.slice->key.size(), from.c_str(), to.c_str());
        outstanding += r.len;
      }
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK) {
        fail(Errc::io, "Redis connection to " + describe() + " failed: " + c->errstr);
      }
      Reply reply(static_cast<redisReply*>(raw));
      const Range& r = ranges[received++];
      outstanding -= r.len;
      if (reply->type != REDIS_REPLY_STRING || uint64_t(reply->len) != r.len) {
        fail(Errc::truncated, "Key '" + r.slice->key + "' changed while being read");
      }
      std::memcpy(r.dst, reply->str, size_t(r.len));
      if (on_range) on_range(received - 1);
    }
  } catch (...) {
    // Replies may still be on their way: this connection cannot be reused.
    if (received == sent) release(c);
    else redisFree(c);
    throw;
  }
  release(c);
}

void RedisSource::read_at(uint64_t offset, void* dst, size_t len) {
  if (len == 0) return;
  std::vector<Range> ranges;
  plan(offset, static_cast<uint8_t*>(dst), len, ranges);
  run(ranges, nullptr);
}

void RedisSource::read_scatter(uint64_t offset, const Segment* segments, size_t count,
                               const std::function<void(size_t)>& on_segment, NextRead) {
  // Every range first, so a missing key fails before anything is sent.
  std::vector<Range> ranges;
  std::vector<size_t> ranges_before(count + 1, 0);  // ranges of segments [0, i)
  for (size_t i = 0; i < count; ++i) {
    if (segments[i].dst && segments[i].len) plan(offset, static_cast<uint8_t*>(segments[i].dst), segments[i].len, ranges);
    offset += segments[i].len;
    ranges_before[i + 1] = ranges.size();
  }
  // A segment is complete once all ranges up to its last have arrived.
  size_t next = 0;
  auto complete_up_to = [&](size_t ranges_done) {
    while (next < count && ranges_before[next + 1] <= ranges_done) {
      if (on_segment) on_segment(next);
      ++next;
    }
  };
  complete_up_to(0);
  run(ranges, [&](size_t r) { complete_up_to(r + 1); });
}

}  // namespace tz::io
