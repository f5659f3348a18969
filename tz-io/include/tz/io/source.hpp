#pragma once
// Byte sources and sinks. A Source serves positional reads of a fixed-size
// object (a local file, an HTTP(S) URL; S3 and Redis later); a Sink takes
// positional writes. Implementations must allow concurrent read_at/write_at
// calls from several threads.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tz::io {

// One piece of a scattered read: `len` bytes go to `dst`, or are skipped
// when `dst` is NULL.
struct Segment {
  void* dst;
  size_t len;
};

// Where a caller expects its next read to start, after a scattered read.
// `follows`: at the end of this one (a lazy load going through a file in
// order), so a remote source may keep its response open for it.
// `follows_alongside`: the same, but other reads of the caller run at the
// same time, and an idle open response may be about to serve one of them.
enum class NextRead { elsewhere, follows, follows_alongside };

class Source {
 public:
  virtual ~Source() = default;
  // Total size in bytes.
  virtual uint64_t size() const = 0;
  // Reads exactly `len` bytes at `offset` into `dst`, or throws tz::Error
  // (truncated if the object ends first, io for OS errors). Thread-safe.
  virtual void read_at(uint64_t offset, void* dst, size_t len) = 0;
  // Where the bytes come from, for error messages (no secrets).
  virtual std::string describe() const = 0;
  // Reads the consecutive bytes starting at `offset` into `count` segments,
  // in order; `on_segment(i)` (if set) runs as soon as segment i is complete,
  // on the calling thread, and may throw to stop the read. Sources that pay
  // per request serve the whole range with one request.
  virtual void read_scatter(uint64_t offset, const Segment* segments, size_t count,
                            const std::function<void(size_t)>& on_segment, NextRead next);
  // True when each request costs a round trip or more (HTTP, S3): readers
  // then merge neighbouring tensors into few large requests.
  virtual bool coalesce_reads() const { return false; }
  // True if parts of the object may be missing (reads of them fail with
  // Errc::truncated), so size() does not bound the offsets a file names.
  virtual bool sparse() const { return false; }
  // The header lines ("Name: value\r\n" each) of the response that opened
  // the source, for sources that have one (HTTP, S3); empty otherwise.
  // Fixed once the source is constructed.
  virtual const std::string& response_headers() const {
    static const std::string none;
    return none;
  }
};

class Sink {
 public:
  virtual ~Sink() = default;
  // Writes exactly `len` bytes at `offset`, or throws tz::Error(io). Thread-safe.
  virtual void write_at(uint64_t offset, const void* src, size_t len) = 0;
  // Hints that the object will grow to at least `size` bytes.
  virtual void reserve(uint64_t size) = 0;
  // Sets the final size (drops anything past it).
  virtual void truncate(uint64_t size) = 0;
  // Flushes and releases the object; further writes fail.
  virtual void close() = 0;
  virtual std::string describe() const = 0;
  // Bytes below `end` (the file header and metadata index) may be written
  // again; every other byte is written once, except end markers.
  virtual void set_rewritable_prefix(uint64_t end) { (void)end; }
  // Writes an end marker, which the next write call overwrites.
  virtual void write_marker(uint64_t offset, const void* src, size_t len) { write_at(offset, src, len); }
  // True when the sink sends data on as soon as a region is complete (an S3
  // multipart upload): writers then write in file order to keep it moving.
  virtual bool streaming() const { return false; }
  // Gives up after a failed save: a sink that can (S3) leaves no object behind.
  virtual void abort() { close(); }
  // The object is complete and valid (a writer's write call finished). A
  // sink writing beside its destination (a local file replacing another)
  // moves it into place the first time; later writes go on in place.
  virtual void publish() {}
};

struct HttpOptions;
struct S3Options;

struct SourceOptions {
  bool direct_io = false;
  // Local sinks: close() makes the file and its directory entry durable
  // (fdatasync, then fsync of the directory) before it returns.
  bool durable = true;
  std::shared_ptr<const HttpOptions> http;  // NULL: defaults
  std::shared_ptr<const S3Options> s3;      // NULL: resolve everything
};

// Opens a source by URI: a local path, a file:// URI, http(s)://, redis://
// or s3://.
std::unique_ptr<Source> open_source(const std::string& uri, const SourceOptions& options = {});
// Creates (truncating) a sink by URI: a local path, a file:// URI, or s3://
// (a multipart upload, completed on close).
std::unique_ptr<Sink> open_sink(const std::string& uri, const SourceOptions& options = {});

}  // namespace tz::io
