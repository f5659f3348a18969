#include "tz/io/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>

#include "tz/format/error.hpp"
#include "tz/io/http.hpp"
#include "tz/io/redis.hpp"
#include "tz/io/s3.hpp"

namespace tz::io {
namespace {

[[noreturn]] void os_fail(const std::string& what, const std::string& path, int err) {
  const Errc code = (err == ENOENT || err == ENOTDIR) ? Errc::not_found
                    : err == ENOMEM                  ? Errc::nomem
                                                     : Errc::io;
  fail(code, what + " '" + path + "': " + std::strerror(err));
}

constexpr size_t kDirectAlign = 4096;
constexpr size_t kMaxSyscall = size_t(1) << 30;  // Linux caps one transfer near 2 GiB

std::string strip_file_scheme(const std::string& uri) {
  if (uri.rfind("file://", 0) == 0) return uri.substr(7);
  return uri;
}

}  // namespace

FileSource::FileSource(const std::string& path, bool direct_io) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) os_fail("Cannot open", path, errno);
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    os_fail("Cannot stat", path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    fail(Errc::invalid_arg, "Is a directory: '" + path + "'");
  }
  size_ = uint64_t(st.st_size);
  if (direct_io) {
    // Falls back to buffered reads where the filesystem refuses O_DIRECT.
    direct_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  }
#ifdef POSIX_FADV_SEQUENTIAL
  posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
}

FileSource::~FileSource() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

void FileSource::read_at(uint64_t offset, void* dst, size_t len) {
  if (offset > size_ || len > size_ - offset) {
    fail(Errc::truncated, "File is truncated: '" + path_ + "' has " + std::to_string(size_) +
                              " bytes, a read needs bytes up to " + std::to_string(offset + len));
  }
  auto* out = static_cast<uint8_t*>(dst);
  if (direct_fd_ >= 0 && len >= (size_t(4) << 20)) {
    read_direct(offset, out, len);
  } else {
    read_buffered(offset, out, len);
  }
}

void FileSource::read_buffered(uint64_t offset, uint8_t* dst, size_t len) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::pread(fd_, dst + done, std::min(len - done, kMaxSyscall), off_t(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      os_fail("Read failed on", path_, errno);
    }
    if (n == 0) {
      fail(Errc::truncated, "File is truncated: unexpected end of '" + path_ + "' at offset " +
                                std::to_string(offset + done));
    }
    done += size_t(n);
  }
}

// O_DIRECT needs aligned offsets, lengths and buffers: the aligned middle of
// the destination is read directly, the unaligned edges through the cache.
void FileSource::read_direct(uint64_t offset, uint8_t* dst, size_t len) {
  const uint64_t end = offset + len;
  const uint64_t a = (offset + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  const uint64_t b = end / kDirectAlign * kDirectAlign;
  // The destination must be aligned where the file offset is.
  const uintptr_t dst_at_a = reinterpret_cast<uintptr_t>(dst) + (a - offset);
  if (dst_at_a % kDirectAlign != 0 || b <= a) {
    read_buffered(offset, dst, len);
    return;
  }
  if (a > offset) read_buffered(offset, dst, size_t(a - offset));
  uint64_t pos = a;
  while (pos < b) {
    const size_t want = size_t(std::min<uint64_t>(b - pos, kMaxSyscall));
    const ssize_t r = ::pread(direct_fd_, dst + (pos - offset), want, off_t(pos));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || uint64_t(r) % kDirectAlign != 0) {
      // Refused (EINVAL on some filesystems) or short: finish through the cache,
      // which reports real errors and truncation precisely.
      const uint64_t resume = r > 0 ? pos + uint64_t(r) / kDirectAlign * kDirectAlign : pos;
      read_buffered(resume, dst + (resume - offset), size_t(b - resume));
      pos = b;
      break;
    }
    pos += uint64_t(r);
  }
  if (end > b) read_buffered(b, dst + (b - offset), size_t(end - b));
}

namespace {

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// fsync of a directory, so a rename in it survives a power loss.
void sync_dir(const std::string& dir, const std::string& path) {
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) os_fail("Cannot open the folder of", path, errno);
  const int rc = ::fsync(d);
  const int err = errno;
  ::close(d);
  // Some filesystems cannot sync a directory; the rename itself is done.
  if (rc != 0 && err != EINVAL && err != EROFS) os_fail("Cannot sync the folder of", path, err);
}

}  // namespace

FileSink::FileSink(const std::string& path, bool durable) : path_(path), dest_(path), durable_(durable) {
  // A symbolic link keeps pointing where it did: its target is replaced.
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    if (char* real = ::realpath(path.c_str(), nullptr)) {
      dest_ = real;
      std::free(real);
    } else {
      dest_.clear();  // a dangling or unusual link (/proc/self/fd/N): written in place
    }
  }
  struct stat st {};
  const bool exists = !dest_.empty() && ::stat(dest_.c_str(), &st) == 0;
  if (!dest_.empty() && (!exists || S_ISREG(st.st_mode))) {
    // A unique name beside the destination (same filesystem, so the rename
    // is atomic); O_EXCL, so two savers never share a temporary file.
    const std::string dir = dir_of(dest_);
    const std::string base = dest_.substr(dest_.rfind('/') == std::string::npos ? 0 : dest_.rfind('/') + 1);
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      char suffix[48];
      std::snprintf(suffix, sizeof suffix, ".tz-%d-%llu", int(::getpid()),
                    static_cast<unsigned long long>(counter.fetch_add(1)));
      temp_ = dir + "/." + base + suffix;
      fd_ = ::open(temp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ >= 0) {
      // The new checkpoint keeps the permissions of the one it replaces.
      if (exists) (void)::fchmod(fd_, st.st_mode & 07777);
      return;
    }
    const int err = errno;
    temp_.clear();
    // A folder we may not create files in (but whose file we may rewrite):
    // in place, as before. Anything else is reported.
    if (!exists || (err != EACCES && err != EPERM && err != EROFS)) os_fail("Cannot create", path, err);
  }
  temp_.clear();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) os_fail("Cannot create", path, errno);
}

FileSink::~FileSink() {
  if (fd_ < 0) return;
  ::close(fd_);
  if (!temp_.empty() && !published_) ::unlink(temp_.c_str());
}

void FileSink::publish() {
  if (fd_ < 0 || temp_.empty() || published_) return;
  // Data first, then the name: after a power loss the path holds the old
  // file or this complete one, never a name for unwritten blocks.
  if (durable_ && ::fdatasync(fd_) != 0) os_fail("Cannot sync", temp_, errno);
  if (::rename(temp_.c_str(), dest_.c_str()) != 0) os_fail("Cannot move the new file into place at", path_, errno);
  published_ = true;
  if (durable_) sync_dir(dir_of(dest_), path_);
}

void FileSink::abort() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  ::close(fd);
  // Never published: the previous file is still in place, untouched.
  if (!temp_.empty() && !published_) ::unlink(temp_.c_str());
}

void FileSink::write_at(uint64_t offset, const void* src, size_t len) {
  if (fd_ < 0) fail(Errc::state, "Write to a closed file '" + path_ + "'");
  const auto* in = static_cast<const uint8_t*>(src);
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::pwrite(fd_, in + done, std::min(len - done, kMaxSyscall), off_t(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      os_fail("Write failed on", path_, errno);
    }
    if (n == 0) fail(Errc::io, "Write failed on '" + path_ + "': no progress");
    done += size_t(n);
  }
}

void FileSink::reserve(uint64_t size) {
  if (fd_ < 0 || size <= reserved_) return;
  // Preallocation is an optimisation: filesystems without it still work, and
  // a real out-of-space condition surfaces on the write itself.
  const int rc = posix_fallocate(fd_, off_t(reserved_), off_t(size - reserved_));
  if (rc == ENOSPC) os_fail("Cannot reserve space for", path_, rc);
  reserved_ = size;
}

void FileSink::truncate(uint64_t size) {
  if (fd_ < 0) fail(Errc::state, "Truncate of a closed file '" + path_ + "'");
  if (::ftruncate(fd_, off_t(size)) != 0) os_fail("Cannot set the size of", path_, errno);
  reserved_ = std::min(reserved_, size);
}

void FileSink::close() {
  if (fd_ < 0) return;
  try {
    publish();  // a writer closed without a write call still replaces the file
    if (durable_ && ::fdatasync(fd_) != 0) os_fail("Cannot sync", path_, errno);
    if (!temp_.empty()) {
      // Two saves to one path: each writes its own file and the last rename
      // wins whole. The one replaced says so instead of reporting success.
      struct stat mine {}, there {};
      if (::fstat(fd_, &mine) == 0 &&
          (::stat(dest_.c_str(), &there) != 0 || mine.st_ino != there.st_ino || mine.st_dev != there.st_dev)) {
        fail(Errc::conflict, "'" + path_ + "' was replaced by another save while this one was written; "
                             "the other file is in place");
      }
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) os_fail("Close failed on", path_, errno);
}

void Source::read_scatter(uint64_t offset, const Segment* segments, size_t count,
                          const std::function<void(size_t)>& on_segment, NextRead) {
  for (size_t i = 0; i < count; ++i) {
    if (segments[i].dst && segments[i].len) read_at(offset, segments[i].dst, segments[i].len);
    offset += segments[i].len;
    if (on_segment) on_segment(i);
  }
}

std::unique_ptr<Source> open_source(const std::string& uri, const SourceOptions& options) {
  std::string scheme = uri.substr(0, std::min(uri.find("://"), uri.size()));
  for (auto& ch : scheme) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (uri.find("://") != std::string::npos && (scheme == "http" || scheme == "https")) {
    return std::make_unique<HttpSource>(uri, options.http ? *options.http : HttpOptions{});
  }
  if (uri.find("://") != std::string::npos && scheme == "s3") {
    return open_s3_source(uri, options.s3 ? *options.s3 : S3Options{}, options.http ? *options.http : HttpOptions{});
  }
  if (uri.find("://") != std::string::npos && scheme == "redis") {
    return std::make_unique<RedisSource>(uri, options.http ? options.http->connect_timeout_ms : 10000);
  }
  const auto scheme_end = uri.find("://");
  if (scheme_end != std::string::npos && uri.rfind("file://", 0) != 0) {
    fail(Errc::unsupported, "Unsupported URI scheme in '" + uri.substr(0, scheme_end + 3) +
                                "...': this build reads local files");
  }
  return std::make_unique<FileSource>(strip_file_scheme(uri), options.direct_io);
}

std::unique_ptr<Sink> open_sink(const std::string& uri, const SourceOptions& options) {
  if (uri.rfind("s3://", 0) == 0) {
    return open_s3_sink(uri, options.s3 ? *options.s3 : S3Options{}, options.http ? *options.http : HttpOptions{});
  }
  const auto scheme_end = uri.find("://");
  if (scheme_end != std::string::npos && uri.rfind("file://", 0) != 0) {
    fail(Errc::unsupported, "Unsupported URI scheme in '" + uri.substr(0, scheme_end + 3) +
                                "...': this build writes local files");
  }
  return std::make_unique<FileSink>(strip_file_scheme(uri), options.durable);
}

}  // namespace tz::io
