#pragma once
// Redis source (hiredis): a tensorizer file stored as slices under
// "{prefix}:{name}:{offset}" keys, upstream's to_redis layout (FORMAT.md
// §8.9). The slices are found with SCAN, sized with STRLEN and read with
// binary-safe GETRANGE commands (pipelined), one pooled connection per
// concurrent reader.
// Zero-length slices are ignored, so empty and meta tensors read back.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "tz/io/source.hpp"

struct redisContext;

namespace tz::io {

struct RedisLocation {
  std::string host = "localhost";
  int port = 6379;
  int db = 0;
  std::string username, password;  // from the URI's user info
  std::string prefix;
};

// Parses redis://[[user]:password@]host[:port][/db]/prefix (a purely numeric
// first path segment followed by more path is the database number).
RedisLocation parse_redis_uri(const std::string& uri);

class RedisSource final : public Source {
 public:
  RedisSource(const std::string& uri, unsigned connect_timeout_ms);
  ~RedisSource() override;

  uint64_t size() const override { return size_; }
  void read_at(uint64_t offset, void* dst, size_t len) override;
  // Pipelined GETRANGEs on one connection, a bounded number of bytes ahead.
  void read_scatter(uint64_t offset, const Segment* segments, size_t count,
                    const std::function<void(size_t)>& on_segment, NextRead next) override;
  bool coalesce_reads() const override { return true; }
  std::string describe() const override;
  // to_redis stores only the tensors its filter kept.
  bool sparse() const override { return true; }

 private:
  struct Slice {
    uint64_t offset;
    uint64_t length;
    std::string key;
  };
  redisContext* connect() const;
  redisContext* acquire();
  void release(redisContext* c);
  void discover(redisContext* c);
  // One GETRANGE: `len` bytes of `slice` from `from`, into `dst`.
  struct Range {
    const Slice* slice;
    uint64_t from, len;
    uint8_t* dst;
  };
  // The GETRANGEs that read [offset, offset + len) into dst (throws if no key covers a byte).
  void plan(uint64_t offset, uint8_t* dst, uint64_t len, std::vector<Range>& out) const;
  void run(const std::vector<Range>& ranges, const std::function<void(size_t)>& on_range);

  RedisLocation loc_;
  unsigned connect_timeout_ms_;
  std::vector<Slice> slices_;  // sorted by offset, non-overlapping
  uint64_t size_ = 0;
  std::mutex pool_mutex_;
  std::vector<redisContext*> pool_;
};

}  // namespace tz::io
