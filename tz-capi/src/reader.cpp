#include "reader.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "parallel.hpp"
#include "tz/crypto/secretbox.hpp"
#include "tz/format/bytes.hpp"
#include "tz/format/error.hpp"
#include "tz/format/hash.hpp"
#include "tz/format/hex.hpp"

namespace tz::core {

using namespace tz::format;

namespace {

constexpr uint64_t kChunk = uint64_t(16) << 20;       // unit of parallel reads
constexpr uint64_t kHashChunk = uint64_t(2) << 20;    // read-then-hash step, stays in L2/L3
constexpr uint64_t kHugePage = uint64_t(2) << 20;
constexpr const char* kNoDecryption = "Tensor is encrypted, but decryption was not requested";

// Asks for transparent huge pages on the untouched destination: one fault per
// 2 MiB instead of 512. Measured here: 1.3-1.5x faster fills when the memory
// is already backed by the hypervisor, but slower first touches in a VM whose
// host must back each 2 MiB page, so it is opt-in ("huge_pages").
void advise_huge_pages(void* dst, uint64_t len) {
#ifdef MADV_HUGEPAGE
  if (len < 2 * kHugePage) return;
  const auto p = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t begin = (p + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (p + len) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)dst;
  (void)len;
#endif
}

void swap_bytes(uint8_t* p, uint64_t len, uint32_t unit) {
  for (uint64_t i = 0; i + unit <= len; i += unit) std::reverse(p + i, p + i + unit);
}


}  // namespace

std::unique_ptr<Reader> Reader::open(const std::string& uri, const ReaderOptions& options) {
  io::SourceOptions so;
  so.direct_io = options.direct_io;
  so.http = options.http;
  so.s3 = options.s3;
  return std::make_unique<Reader>(io::open_source(uri, so), options);
}

Reader::Reader(std::unique_ptr<io::Source> source, const ReaderOptions& options)
    : source_(std::move(source)), options_(options) {
  const uint64_t size = source_->size();
  uint8_t head[kMetadataOffset];
  const size_t head_len = size_t(std::min<uint64_t>(size, kMetadataOffset));
  source_->read_at(0, head, head_len);
  header_ = parse_file_header(head, head_len);
  if (options_.key) {
    if (header_.version < kEncryptionVersion) {
      fail(Errc::crypto, "Tensor file version " + std::to_string(header_.version) +
                             " predates encryption, so it must not be encrypted, but decryption was requested");
    }
    if (!header_.has_crypt_info()) {
      fail(Errc::crypto, "Tensor file is not flagged as encrypted, but decryption was requested");
    }
    resolver_ = std::make_unique<crypto::KeyResolver>(options_.key, options_.kdf_limits);
  } else if (header_.has_crypt_info() && !options_.metadata_only) {
    fail(Errc::crypto, kNoDecryption);
  }
  if (header_.metadata_length > size - kMetadataOffset) {
    fail(Errc::truncated, "File is truncated: the metadata index declares " +
                              std::to_string(header_.metadata_length) + " bytes but the file has " +
                              std::to_string(size) + " bytes");
  }
  if (header_.tensor_count == 0 || header_.metadata_length == 0) {
    fail(Errc::format, "Tensor index in the file is empty");
  }
  std::vector<uint8_t> block(size_t(header_.metadata_length));
  source_->read_at(kMetadataOffset, block.data(), block.size());
  // A sparse source (Redis keys of a filtered to_redis) may lack trailing
  // tensors: their bounds are checked when they are read instead.
  entries_ = parse_metadata(header_, block.data(), block.size(), source_->sparse() ? UINT64_MAX / 4 : size);
  PathTrie trie;
  for (const auto& e : entries_) trie.insert(e.path);
  module_index_ = std::make_unique<std::atomic<int>[]>(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) module_index_[i].store(-1);
  header_once_ = std::make_unique<std::once_flag[]>(entries_.size());
  headers_.resize(entries_.size());
}

std::string Reader::tensor_label(size_t index) const { return display_path(entries_[index].path); }

Reader::Header Reader::parse_header(size_t index, std::vector<uint8_t> bytes) {
  const auto& e = entries_[index];
  Header h;
  h.bytes = std::move(bytes);
  h.parsed = parse_tensor_header(h.bytes.data(), h.bytes.size(), e.long_dims, header_.has_crypt_info());
  check_header_matches(h.parsed, e);
  if (h.parsed.crypt_info_size) {
    h.crypt = parse_crypt_info(h.bytes.data() + h.parsed.crypt_info_offset + 8, h.parsed.crypt_info_size - 8);
  }
  // FORMAT.md §6.6: which tensors must be (and can be) decrypted, and in which boxes.
  const bool decrypting = resolver_ != nullptr;
  if (e.data_length > 0 && decrypting && !h.crypt.encrypted()) {
    fail(Errc::crypto, "Tensor is not encrypted, but decryption was requested");
  }
  if (e.data_length > 0 && h.crypt.encrypted()) {
    if (h.crypt.cipher_chunks == 0) fail(Errc::crypto, "No known encryption method found in file");
    if (h.crypt.cipher_chunks > 1) fail(Errc::crypto, "Could not interpret encryption method of the file");
    const uint64_t macs = h.crypt.macs.size();
    if (h.crypt.scheme == CipherScheme::sequential || macs == 1) {
      h.box_size = e.data_length;  // one secretbox over all the data
    } else {
      const uint64_t boxes = (e.data_length + h.crypt.chunk_size - 1) / h.crypt.chunk_size;
      if (boxes != macs) {
        fail(Errc::crypto, "Number of nonces provided (" + std::to_string(macs) +
                               ") does not match the number of chunks (" + std::to_string(boxes) + ") of tensor '" +
                               tensor_label(index) + "'");
      }
      h.box_size = h.crypt.chunk_size;
    }
  }
  return h;
}

const Reader::Header& Reader::header(size_t index, std::vector<uint8_t>* bytes) {
  std::call_once(header_once_[index], [&] {
    std::vector<uint8_t> fetched;
    if (bytes) {
      fetched = std::move(*bytes);
    } else {
      fetched = read_header_bytes(index);
    }
    headers_[index] = std::make_unique<Header>(parse_header(index, std::move(fetched)));
    module_index_[index].store(headers_[index]->parsed.module_index, std::memory_order_release);
  });
  return *headers_[index];
}

std::vector<uint8_t> Reader::read_header_bytes(size_t index) {
  const auto& e = entries_[index];
  const uint64_t len = e.header_length();
  std::vector<uint8_t> out;
  if (!source_->sparse()) {
    // parse_metadata checked the header lies inside the file.
    out.resize(size_t(len));
    source_->read_at(e.header_offset, out.data(), out.size());
    return out;
  }
  // A sparse source's size does not bound the offsets, so the length is the
  // file's word alone: read in doubling steps, so what is allocated is never
  // more than twice what the source really holds (a missing part fails).
  constexpr uint64_t kFirstStep = 64 << 10;
  uint64_t have = 0;
  while (have < len) {
    const uint64_t step = std::min(len - have, std::max(kFirstStep, have));
    out.resize(size_t(have + step));
    source_->read_at(e.header_offset + have, out.data() + have, size_t(step));
    have += step;
  }
  return out;
}

const crypto::SecretBytes* Reader::key_for(const Header& h) {
  if (h.box_size == 0) return nullptr;
  if (!resolver_) fail(Errc::crypto, kNoDecryption);  // opened with metadata_only
  return &resolver_->key_for(h.crypt);
}

void Reader::decrypt_box(size_t index, const Header& h, const crypto::SecretBytes& key, uint8_t* box,
                         uint64_t box_index, size_t size) const {
  const Nonce nonce = crypto::nonce_add(h.crypt.nonce, box_index);
  if (!crypto::open_in_place(box, size, h.crypt.macs[size_t(box_index)], nonce, key)) {
    // One message for a wrong key and for altered data: the MAC cannot tell them apart.
    fail(Errc::crypto, "Tensor decryption failed for '" + tensor_label(index) +
                           "': the key is wrong or the encrypted data was altered");
  }
}

void Reader::load_headers(const uint64_t* indices, size_t count) {
  const size_t n = indices ? count : entries_.size();
  for (size_t k = 0; k < n; ++k) {
    const uint64_t i = indices ? indices[k] : k;
    if (i >= entries_.size()) fail(Errc::not_found, "Tensor index " + std::to_string(i) + " is out of range");
    header(size_t(i));
  }
}

// CRC32 and SHA-256 of a tensor: its header with zeroed hashes, then its data.
struct Reader::Hasher {
  uint32_t crc = 0;
  Sha256 sha;
  explicit Hasher(const Header& h) {
    const std::vector<uint8_t> hashed = hashable_header(h.bytes.data(), h.bytes.size(), h.parsed);
    update(hashed.data(), hashed.size());
  }
  void update(const void* p, size_t n) {
    crc = crc32_update(crc, p, n);
    sha.update(p, n);
  }
};

void Reader::check_hashes(size_t index, const Header& h, Hasher& hasher) const {
  const auto digest = hasher.sha.finish();
  check_hashes(index, h, hasher.crc, digest.data());
}

void Reader::check_hashes(size_t index, const Header& h, uint32_t crc, const uint8_t* sha) const {
  // A verified read verifies something or says it could not: a header that
  // stores no hash gives nothing to compare with.
  if (h.parsed.hashes.empty()) {
    fail(Errc::hash, "Tensor '" + tensor_label(index) +
                         "' cannot be verified: its header stores no hashes (verification was requested)");
  }
  for (const auto& he : h.parsed.hashes) {
    const uint8_t* stored = h.bytes.data() + he.value_offset;
    if (he.type == HashType::crc32) {
      const uint32_t expected = load_u32(stored);
      if (expected != crc) {
        fail(Errc::hash, "Tensor '" + tensor_label(index) + "' failed CRC32 verification. Expected " +
                             std::to_string(expected) + ", got " + std::to_string(crc) + ".");
      }
    } else if (std::memcmp(stored, sha, 32) != 0) {
      fail(Errc::hash, "Tensor '" + tensor_label(index) + "' failed SHA256 verification. Expected " +
                           to_hex(stored, 32) + ", got " + to_hex(sha, 32) + ".");
    }
  }
}

// Reads bytes [begin, end) of a tensor's data (box-aligned for encrypted
// data). `whole` units also check the header and verify hashes when asked.
void Reader::read_one(const ReadRequest& req, bool verify, uint64_t begin, uint64_t end, bool whole) {
  const size_t index = size_t(req.index);
  const auto& e = entries_[index];
  auto* dst = static_cast<uint8_t*>(req.dst);
  const Header& h = header(index);
  if (e.is_meta()) {
    // Meta tensors load as zeros; their hashes cover the header alone.
    if (whole || begin == 0) std::memset(dst, 0, size_t(e.nbytes));
    if (whole && verify) {
      Hasher hasher(h);
      check_hashes(index, h, hasher);
    }
    return;
  }
  const crypto::SecretBytes* key = key_for(h);
  if (whole && verify) {
    Hasher hasher(h);
    // Read, decrypt and hash one step at a time while it is still in cache.
    const uint64_t step = key ? h.box_size : kHashChunk;
    for (uint64_t off = 0; off < e.data_length; off += step) {
      const size_t n = size_t(std::min(step, e.data_length - off));
      source_->read_at(e.data_offset + off, dst + off, n);
      if (key) decrypt_box(index, h, *key, dst + off, off / step, n);
      hasher.update(dst + off, n);
    }
    check_hashes(index, h, hasher);
    if (e.dtype.needs_swap()) swap_bytes(dst, e.data_length, e.dtype.swap_unit());
    return;
  }
  if (end > begin) {
    if (key) {
      // Box by box, so each one is decrypted while it is still in cache.
      for (uint64_t off = begin; off < end; off += h.box_size) {
        const size_t n = size_t(std::min(h.box_size, end - off));
        source_->read_at(e.data_offset + off, dst + off, n);
        decrypt_box(index, h, *key, dst + off, off / h.box_size, n);
      }
    } else {
      source_->read_at(e.data_offset + begin, dst + begin, size_t(end - begin));
    }
    if (e.dtype.needs_swap()) swap_bytes(dst + begin, end - begin, e.dtype.swap_unit());
  }
}

void Reader::read_batch(const ReadRequest* reqs, size_t count, bool verify, unsigned threads,
                        size_t* failed) {
  for (size_t k = 0; k < count; ++k) {
    const auto& r = reqs[k];
    if (r.index >= entries_.size()) {
      if (failed) *failed = k;
      fail(Errc::not_found, "Tensor index " + std::to_string(r.index) + " is out of range");
    }
    const auto& e = entries_[size_t(r.index)];
    if (r.dst == nullptr && e.nbytes > 0) {
      if (failed) *failed = k;
      fail(Errc::invalid_arg, "Destination buffer is NULL");
    }
    if (r.dst_size < e.nbytes) {
      if (failed) *failed = k;
      fail(Errc::invalid_arg, "Destination buffer for tensor '" + tensor_label(size_t(r.index)) + "' holds " +
                                  std::to_string(r.dst_size) + " bytes, it needs " + std::to_string(e.nbytes));
    }
    // Checked before any read, so no destination receives ciphertext.
    if (e.data_length > 0 && header_.has_crypt_info() && !resolver_) {
      if (failed) *failed = k;
      fail(Errc::crypto, kNoDecryption);
    }
  }
  if (threads == 0) threads = options_.num_threads ? options_.num_threads : default_threads();
  if (source_->coalesce_reads()) {
    read_coalesced(reqs, count, verify, threads, failed);
    return;
  }
  if (header_.has_crypt_info()) {
    // Splitting encrypted data needs each tensor's box size: read those headers first.
    size_t failed_request = 0;
    try {
      parallel_for(count, threads, [&](size_t k) { header(size_t(reqs[k].index)); }, &failed_request);
    } catch (...) {
      if (failed) *failed = failed_request;
      throw;
    }
  }

  struct Unit {
    size_t request;
    uint64_t begin, end;
    bool whole;
  };
  std::vector<Unit> units;
  if (verify) {
    // Hashing is sequential per tensor: one unit per tensor, largest first so
    // the long ones start early and the threads finish together.
    for (size_t k = 0; k < count; ++k) units.push_back({k, 0, entries_[size_t(reqs[k].index)].data_length, true});
    std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.end > b.end; });
  } else {
    // Without hashing, big tensors are split so several threads share them.
    std::vector<size_t> order(count);
    for (size_t k = 0; k < count; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return entries_[size_t(reqs[a].index)].data_offset < entries_[size_t(reqs[b].index)].data_offset;
    });
    for (size_t k : order) {
      const size_t index = size_t(reqs[k].index);
      const uint64_t len = entries_[index].data_length;
      // Encrypted data splits only at secretbox boundaries.
      const uint64_t box = header_.has_crypt_info() ? header(index).box_size : 0;
      const uint64_t unit = box == 0 ? kChunk : std::max<uint64_t>(1, kChunk / box) * box;
      if (len <= unit) {
        units.push_back({k, 0, len, true});
        continue;
      }
      for (uint64_t off = 0; off < len; off += unit) units.push_back({k, off, std::min(len, off + unit), false});
    }
  }
  if (options_.huge_pages)
    for (size_t k = 0; k < count; ++k) advise_huge_pages(reqs[k].dst, entries_[size_t(reqs[k].index)].nbytes);
  size_t failed_unit = 0;
  try {
    parallel_for(units.size(), threads, [&](size_t u) {
      const Unit& unit = units[u];
      read_one(reqs[unit.request], verify, unit.begin, unit.end, unit.whole);
    }, &failed_unit);
  } catch (const Error& err) {
    const ReadRequest& r = reqs[units[failed_unit].request];
    if (failed) *failed = units[failed_unit].request;
    // Never leave bytes that failed authentication in the caller's buffer.
    if (err.code() == Errc::crypto && r.dst) std::memset(r.dst, 0, size_t(entries_[size_t(r.index)].nbytes));
    throw;
  } catch (...) {
    if (failed) *failed = units[failed_unit].request;
    throw;
  }
}

// Everything after a tensor's bytes have arrived in its destination:
// header checks, decryption in place, hash verification, byte order.
void Reader::finish_tensor(const ReadRequest& req, bool verify, std::vector<uint8_t>* header_bytes) {
  const size_t index = size_t(req.index);
  const auto& e = entries_[index];
  auto* dst = static_cast<uint8_t*>(req.dst);
  const Header& h = header(index, header_bytes);
  if (e.is_meta()) {
    std::memset(dst, 0, size_t(e.nbytes));
    if (verify) {
      Hasher hasher(h);
      check_hashes(index, h, hasher);
    }
    return;
  }
  if (const crypto::SecretBytes* key = key_for(h)) {
    try {
      for (uint64_t off = 0; off < e.data_length; off += h.box_size) {
        decrypt_box(index, h, *key, dst + off, off / h.box_size, size_t(std::min(h.box_size, e.data_length - off)));
      }
    } catch (...) {
      // Never leave bytes that failed authentication in the caller's buffer.
      std::memset(dst, 0, size_t(e.nbytes));
      throw;
    }
  }
  if (verify) {
    Hasher hasher(h);
    hasher.update(dst, size_t(e.data_length));
    check_hashes(index, h, hasher);
  }
  if (e.dtype.needs_swap()) swap_bytes(dst, e.data_length, e.dtype.swap_unit());
}

// Remote sources pay a round trip (S3: a signature, a server-side lookup) per
// request, so tensors are read in file order as a few large ranged requests,
// about one per thread, each scattered straight into the destinations with
// the headers into small buffers. A tensor is finished (decrypted, verified)
// on the thread that receives its last byte, while the transfer goes on.
void Reader::read_coalesced(const ReadRequest* reqs, size_t count, bool verify, unsigned threads,
                            size_t* failed) {
  constexpr uint64_t kMaxGap = uint64_t(1) << 20;   // skipped bytes a request may carry
  constexpr uint64_t kMinSpan = uint64_t(8) << 20;  // smaller requests cost more than they overlap

  struct Piece {
    uint64_t offset, len;
    uint8_t* dst;  // NULL: not wanted
    size_t request;
  };
  std::vector<size_t> order(count);
  for (size_t k = 0; k < count; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries_[size_t(reqs[a].index)].header_offset < entries_[size_t(reqs[b].index)].header_offset;
  });
  std::vector<std::vector<uint8_t>> header_bytes(count);
  std::unique_ptr<std::atomic<uint64_t>[]> pending(new std::atomic<uint64_t>[count]);
  std::vector<Piece> pieces;
  uint64_t total = 0;
  // A sparse source's size does not bound a header's length: those headers
  // are read on their own first (read_header_bytes), never into a buffer
  // sized by the file before the bytes exist.
  const bool own_headers = source_->sparse();
  if (own_headers) {
    size_t failed_request = 0;
    try {
      parallel_for(count, threads, [&](size_t k) { header(size_t(reqs[k].index)); }, &failed_request);
    } catch (...) {
      if (failed) *failed = failed_request;
      throw;
    }
  }
  for (size_t k : order) {
    const auto& e = entries_[size_t(reqs[k].index)];
    uint64_t wanted = 0;
    if (!own_headers) {
      header_bytes[k].resize(size_t(e.header_length()));
      pieces.push_back({e.header_offset, e.header_length(), header_bytes[k].data(), k});
      wanted = e.header_length();
    }
    // Meta tensors are zero-filled, whatever bytes their data length names.
    if (!e.is_meta()) {
      auto* dst = static_cast<uint8_t*>(reqs[k].dst);
      // Pieces of kChunk bytes let a large tensor be shared between requests.
      for (uint64_t off = 0; off < e.data_length; off += kChunk) {
        pieces.push_back({e.data_offset + off, std::min(kChunk, e.data_length - off), dst + off, k});
      }
      wanted += e.data_length;
    }
    pending[k].store(wanted, std::memory_order_relaxed);
    total += wanted;
  }

  // Spans of consecutive pieces, about total / threads bytes each.
  const uint64_t target = std::max(kMinSpan, (total + threads - 1) / threads);
  struct Span {
    uint64_t offset = 0;
    std::vector<io::Segment> segments;
    std::vector<size_t> piece_of;  // segment -> piece, SIZE_MAX for a gap
  };
  std::vector<Span> spans;
  uint64_t span_end = 0, span_bytes = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Piece& piece = pieces[p];
    const bool fresh = spans.empty() || piece.offset < span_end || piece.offset - span_end > kMaxGap ||
                       span_bytes >= target;
    if (fresh) {
      spans.emplace_back();
      spans.back().offset = piece.offset;
      span_end = piece.offset;
      span_bytes = 0;
    }
    Span& span = spans.back();
    if (piece.offset > span_end) {
      span.segments.push_back({nullptr, size_t(piece.offset - span_end)});
      span.piece_of.push_back(SIZE_MAX);
    }
    span.segments.push_back({piece.dst, size_t(piece.len)});
    span.piece_of.push_back(p);
    span_end = piece.offset + piece.len;
    span_bytes += piece.len;
  }

  std::mutex failure_mutex;
  size_t failed_request = SIZE_MAX;
  auto finish = [&](size_t k) {
    try {
      finish_tensor(reqs[k], verify, &header_bytes[k]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (failed_request == SIZE_MAX) failed_request = k;
      throw;
    }
  };
  // Requests with no bytes to transfer (meta tensors whose header was read
  // already) are finished here: no segment will complete them.
  for (size_t k : order) {
    if (pending[k].load(std::memory_order_relaxed) != 0) continue;
    try {
      finish(k);
    } catch (...) {
      if (failed) *failed = k;
      throw;
    }
  }
  if (spans.empty()) return;
  // The next read (a lazy load's next tensor, the next batch) likely starts
  // where the last span ends; the other spans know where the next one starts.
  auto next_after = [&](size_t s) {
    if (s + 1 < spans.size()) return io::NextRead::elsewhere;
    return spans.size() == 1 ? io::NextRead::follows : io::NextRead::follows_alongside;
  };
  size_t failed_span = 0;
  try {
    parallel_for(spans.size(), std::min<size_t>(threads, spans.size()), [&](size_t s) {
      const Span& span = spans[s];
      source_->read_scatter(span.offset, span.segments.data(), span.segments.size(), [&](size_t seg) {
        const size_t p = span.piece_of[seg];
        if (p == SIZE_MAX) return;
        const Piece& piece = pieces[p];
        if (pending[piece.request].fetch_sub(piece.len, std::memory_order_acq_rel) == piece.len) finish(piece.request);
      }, next_after(s));
    }, &failed_span);
  } catch (...) {
    if (failed) {
      size_t first_piece = 0;
      for (size_t p : spans[failed_span].piece_of) {
        if (p != SIZE_MAX) {
          first_piece = p;
          break;
        }
      }
      *failed = failed_request != SIZE_MAX ? failed_request : pieces[first_piece].request;
    }
    throw;
  }
}

void Reader::verify_bytes(size_t index, const void* data, uint64_t size) {
  if (index >= entries_.size()) fail(Errc::not_found, "Tensor index " + std::to_string(index) + " is out of range");
  const auto& e = entries_[index];
  const Header& h = header(index);
  Hasher hasher(h);
  // Meta tensors are hashed over their header only (data length 0).
  const uint64_t n = e.is_meta() ? 0 : size;
  if (n > 0 && data == nullptr) fail(Errc::invalid_arg, "data is NULL");
  if (n > 0) hasher.update(data, size_t(n));
  check_hashes(index, h, hasher);
}

std::vector<Reader::StoredHash> Reader::stored_hashes(size_t index) {
  if (index >= entries_.size()) fail(Errc::not_found, "Tensor index " + std::to_string(index) + " is out of range");
  const Header& h = header(index);
  std::vector<StoredHash> out;
  for (const auto& e : h.parsed.hashes) {
    const uint8_t* v = h.bytes.data() + e.value_offset;  // the parser checked it lies inside
    out.push_back({e.type, std::vector<uint8_t>(v, v + e.value_length)});
  }
  return out;
}

}  // namespace tz::core
