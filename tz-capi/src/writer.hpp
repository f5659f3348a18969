#pragma once
// The writing engine behind tz_writer: lays out each write call's tensors,
// hashes and writes them on several threads, then patches the index, the
// end marker and the file header so the file is valid after every call.
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tz/crypto/key.hpp"
#include "tz/format/container.hpp"
#include "tz/format/crypt_info.hpp"
#include "tz/io/source.hpp"

namespace tz::core {

struct WriterOptions {
  unsigned num_threads = 0;  // 0: default_threads()
  std::shared_ptr<const crypto::KeyMaterial> key;  // encrypt every tensor with data when set
  uint64_t crypt_chunk_size = format::kCryptChunkSize;
  io::SourceOptions sink;  // remote destinations (s3://)
};

struct TensorInput {
  std::string_view name;  // encoded name bytes
  std::string_view dtype;
  const uint64_t* shape = nullptr;
  size_t ndim = 0;
  uint32_t module_index = 0;
  int32_t tensor_type = 2;
  bool is_meta = false;
  const void* data = nullptr;
  uint64_t data_size = 0;
};

class Writer {
 public:
  Writer(std::unique_ptr<io::Sink> sink, const WriterOptions& options);
  static std::unique_ptr<Writer> open(const std::string& uri, const WriterOptions& options);
  ~Writer();

  void write(const TensorInput* tensors, size_t count, unsigned threads);
  void close();
  bool closed() const { return closed_; }

  const format::FileHeader& file_header() const { return header_; }
  uint64_t end_offset() const { return pos_ + 8; }

 private:
  void write_file_header();

  std::unique_ptr<io::Sink> sink_;
  WriterOptions options_;
  format::FileHeader header_;
  uint64_t pos_ = 0;  // where the next record goes (= position of the end marker)
  std::vector<format::MetadataEntry> entries_;
  uint64_t metadata_used_ = 0;  // bytes of the index already written
  bool tagged_ = false;         // v5 metadata version tags in use
  format::PathTrie paths_;
  std::set<format::Nonce> used_nonces_;  // every box nonce of this file, as upstream refuses reuse
  bool closed_ = false;
  bool broken_ = false;
};

}  // namespace tz::core
