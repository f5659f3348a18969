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

// A local file written so that its path never holds a partial file: a
// regular file (or a new one) is written beside the destination under a
// unique temporary name (O_EXCL), and renamed over it by publish() or
// close(), so until then the path keeps its previous file. Other targets
// (devices, FIFOs, an unwritable directory) are written in place.
class FileSink final : public Sink {
 public:
  explicit FileSink(const std::string& path, bool durable = true);
  ~FileSink() override;
  void write_at(uint64_t offset, const void* src, size_t len) override;
  void reserve(uint64_t size) override;
  void truncate(uint64_t size) override;
  void close() override;
  void abort() override;
  void publish() override;
  std::string describe() const override { return path_; }
  // The file being written: the temporary one until published, else path.
  const std::string& writing_path() const { return temp_.empty() || published_ ? dest_ : temp_; }

 private:
  std::string path_;  // as given, for messages
  std::string dest_;  // what is replaced: path, or the target of a symbolic link
  std::string temp_;  // beside dest_; empty when writing in place
  bool published_ = false;
  bool durable_ = true;
  int fd_ = -1;
  uint64_t reserved_ = 0;
};

}  // namespace tz::io
