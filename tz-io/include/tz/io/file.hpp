#pragma once
// Local files: positional reads and writes with pread/pwrite, retried until
// complete, so short transfers never pass silently.
#include <string>

#include "tz/io/source.hpp"

namespace tz::io {

class FileSource final : public Source {
 public:
  FileSource(const std::string& path, bool direct_io);
  ~FileSource() override;
  uint64_t size() const override { return size_; }
  void read_at(uint64_t offset, void* dst, size_t len) override;
  std::string describe() const override { return path_; }

 private:
  void read_buffered(uint64_t offset, uint8_t* dst, size_t len);
  void read_direct(uint64_t offset, uint8_t* dst, size_t len);
  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;  // O_DIRECT descriptor for large aligned reads, or -1
  uint64_t size_ = 0;
};

class FileSink final : public Sink {
 public:
  explicit FileSink(const std::string& path);
  ~FileSink() override;
  void write_at(uint64_t offset, const void* src, size_t len) override;
  void reserve(uint64_t size) override;
  void truncate(uint64_t size) override;
  void close() override;
  std::string describe() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t reserved_ = 0;
};

}  // namespace tz::io
