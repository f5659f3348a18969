#pragma once
// The reading engine behind tz_reader: validates a file's header and index
// up front, then reads tensors straight into caller memory on several
// threads, verifying hashes while the bytes are still in cache.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tz/crypto/key.hpp"
#include "tz/format/container.hpp"
#include "tz/format/crypt_info.hpp"
#include "tz/io/http.hpp"
#include "tz/io/s3.hpp"
#include "tz/io/source.hpp"

namespace tz::core {

struct ReaderOptions {
  unsigned num_threads = 0;  // 0: default_threads()
  bool verify_hash = false;
  bool direct_io = false;
  bool huge_pages = false;  // advise transparent huge pages for destinations
  // Open an encrypted file without a key to list its tensors; reading
  // encrypted data then fails with Errc::crypto.
  bool metadata_only = false;
  std::shared_ptr<const crypto::KeyMaterial> key;  // decryption requested when set
  std::shared_ptr<const io::HttpOptions> http;     // for http(s):// and s3:// sources
  std::shared_ptr<const io::S3Options> s3;         // for s3:// sources
  crypto::KeyResolver::Limits kdf_limits;
};

struct ReadRequest {
  uint64_t index;
  void* dst;
  uint64_t dst_size;
};

class Reader {
 public:
  Reader(std::unique_ptr<io::Source> source, const ReaderOptions& options);
  static std::unique_ptr<Reader> open(const std::string& uri, const ReaderOptions& options);

  const format::FileHeader& file_header() const { return header_; }
  uint64_t file_size() const { return source_->size(); }
  const std::vector<format::MetadataEntry>& entries() const { return entries_; }
  const ReaderOptions& options() const { return options_; }
  // Module index from the tensor header, or -1 if it has not been read yet.
  int module_index(size_t i) const { return module_index_[i].load(std::memory_order_acquire); }

  void load_headers(const uint64_t* indices, size_t count);
  void read_batch(const ReadRequest* requests, size_t count, bool verify, unsigned threads,
                  size_t* failed);
  void verify_bytes(size_t index, const void* data, uint64_t size);
  struct StoredHash {
    format::HashType type;
    std::vector<uint8_t> value;  // as stored in the tensor header
  };
  // The hashes tensor `index`'s header stores (its header is read if needed).
  std::vector<StoredHash> stored_hashes(size_t index);

 private:
  struct Header {
    std::vector<uint8_t> bytes;
    format::TensorHeader parsed;
    format::CryptInfo crypt;
    uint64_t box_size = 0;  // encrypted data: bytes per secretbox (0: stored in the clear)
  };
  // Reads, parses and validates a tensor header once; later calls share it.
  // `bytes`, when given, are the header's bytes already fetched.
  const Header& header(size_t index, std::vector<uint8_t>* bytes = nullptr);
  Header parse_header(size_t index, std::vector<uint8_t> bytes);
  std::vector<uint8_t> read_header_bytes(size_t index);
  void read_coalesced(const ReadRequest* requests, size_t count, bool verify, unsigned threads, size_t* failed);
  void finish_tensor(const ReadRequest& req, bool verify, std::vector<uint8_t>* header_bytes);
  const crypto::SecretBytes* key_for(const Header& h);
  void decrypt_box(size_t index, const Header& h, const crypto::SecretBytes& key, uint8_t* box, uint64_t box_index,
                   size_t size) const;
  void read_one(const ReadRequest& req, bool verify, uint64_t begin, uint64_t end, bool whole);
  struct Hasher;
  void check_hashes(size_t index, const Header& h, Hasher& hasher) const;
  void check_hashes(size_t index, const Header& h, uint32_t crc, const uint8_t* sha) const;
  std::string tensor_label(size_t index) const;

  std::unique_ptr<io::Source> source_;
  ReaderOptions options_;
  format::FileHeader header_;
  std::vector<format::MetadataEntry> entries_;
  std::unique_ptr<std::atomic<int>[]> module_index_;
  std::unique_ptr<std::once_flag[]> header_once_;
  std::vector<std::unique_ptr<Header>> headers_;
  std::unique_ptr<crypto::KeyResolver> resolver_;
};

}  // namespace tz::core
