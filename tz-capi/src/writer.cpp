#include "writer.hpp"

#include <algorithm>
#include <cstring>

#include "parallel.hpp"
#include "tz/crypto/secretbox.hpp"
#include "tz/format/bytes.hpp"
#include "tz/format/error.hpp"
#include "tz/format/hash.hpp"

namespace tz::core {

using namespace tz::format;

namespace {

constexpr uint64_t kWriteChunk = uint64_t(4) << 20;  // hash then write, while still in cache
constexpr uint64_t kLongDim = uint64_t(1) << 32;

struct Planned {
  const TensorInput* in;
  MetadataEntry entry;
  BuiltHeader header;
  std::vector<uint8_t> crypt_info;  // block body, for encrypted files
  bool encrypted = false;
  Nonce nonce{};
  size_t mac_offset = 0;  // of the first MAC slot in header.bytes
};

// Hashes, encrypts and writes one tensor's data box by box, each box while
// it is in cache; MACs go into the header's crypt_info.
std::array<uint8_t, 32> write_encrypted(io::Sink& sink, Planned& p, const crypto::SecretBytes& key,
                                        uint64_t box_size, Sha256& sha) {
  const auto& e = p.entry;
  const auto* plain = static_cast<const uint8_t*>(p.in->data);
  std::unique_ptr<uint8_t[]> cipher(new uint8_t[size_t(std::min(box_size, e.data_length))]);
  for (uint64_t off = 0, box = 0; off < e.data_length; off += box_size, ++box) {
    const size_t n = size_t(std::min(box_size, e.data_length - off));
    sha.update(plain + off, n);
    Mac mac;
    crypto::seal(cipher.get(), mac, plain + off, n, crypto::nonce_add(p.nonce, box), key);
    std::memcpy(p.header.bytes.data() + p.mac_offset + box * kMacBytes, mac.data(), kMacBytes);
    sink.write_at(e.data_offset + off, cipher.get(), n);
  }
  return sha.finish();
}

}  // namespace

namespace {

// Checked before the destination is created, so bad options never truncate a file.
void check_options(const WriterOptions& options) {
  if (!options.key) return;
  if (!options.key->has_key()) {
    fail(Errc::invalid_arg, "A password key can only decrypt; derive a key (with its salt and limits) to encrypt");
  }
  if (options.crypt_chunk_size % kCryptChunkQuantum != 0 || options.crypt_chunk_size < kCryptChunkMinimum) {
    fail(Errc::invalid_arg, "crypt_chunk_size must be a multiple of 64 and at least 1024");
  }
}

}  // namespace

std::unique_ptr<Writer> Writer::open(const std::string& uri, const WriterOptions& options) {
  check_options(options);
  return std::make_unique<Writer>(io::open_sink(uri, options.sink), options);
}

Writer::Writer(std::unique_ptr<io::Sink> sink, const WriterOptions& options)
    : sink_(std::move(sink)), options_(options) {
  check_options(options_);
  if (options_.key) {
    // Set at construction, before any tensor, as upstream does; the flag is
    // serialized once the version reaches 4.
    header_.version = kEncryptionVersion;
    header_.flags |= kFlagEncrypted;
  }
  header_.metadata_length = kDefaultMetadataReserve;
  pos_ = kMetadataOffset + header_.metadata_length;
  // The reserve stays a hole until written: it reads as zeros, as upstream writes it.
  sink_->truncate(pos_);
  sink_->set_rewritable_prefix(pos_);
  write_file_header();
}

Writer::~Writer() = default;

void Writer::write_file_header() {
  uint8_t head[kMetadataOffset];
  serialize_file_header(header_, head);
  sink_->write_at(0, head, sizeof head);
}

void Writer::write(const TensorInput* tensors, size_t count, unsigned threads) {
  if (closed_) fail(Errc::state, "The writer is closed");
  if (broken_) fail(Errc::state, "An earlier write failed; the writer can no longer be used");
  if (count == 0) return;

  // 1. Validate everything before touching the file.
  std::vector<Planned> plan(count);
  uint32_t version = header_.version;
  bool need_tags = tagged_;
  for (size_t k = 0; k < count; ++k) {
    const TensorInput& t = tensors[k];
    Planned& p = plan[k];
    p.in = &t;
    auto& e = p.entry;
    const auto bad = [&](const std::string& why) { fail(Errc::invalid_arg, "Tensor " + std::to_string(k) + ": " + why); };
    if (t.name.empty()) bad("the empty name cannot be stored (readers cannot load it back)");
    if (t.name.size() > 0xFFFF) fail(Errc::limit, "Tensor name is longer than 65535 bytes");
    if (t.module_index > 0xFFFF) fail(Errc::limit, "Module index " + std::to_string(t.module_index) + " does not fit in 16 bits");
    if (t.tensor_type < 0 || t.tensor_type > 2) bad("invalid tensor type " + std::to_string(t.tensor_type));
    if (t.dtype.size() >= 256) bad("dtype name length should be less than 256");
    if (t.ndim > 255) bad("more than 255 dimensions");
    if (t.ndim > 0 && t.shape == nullptr) bad("shape is NULL");
    e.name = std::string(t.name);
    try {
      e.path = decode_path(e.name);
    } catch (const Error& err) {
      bad(err.what());
    }
    if (encode_path(e.path) != e.name) {
      bad("name is not in canonical form (a plain name may not start with 0x1E)");
    }
    e.type = TensorType(t.tensor_type);
    if (e.type != TensorType::state_dict && e.path.size() != 1) {
      bad("structured tensor paths are only allowed for STATE_DICT tensors");
    }
    try {
      e.dtype = parse_dtype(t.dtype);
    } catch (const Error& err) {
      bad(err.what());
    }
    e.shape.assign(t.shape, t.shape + t.ndim);
    e.numel = 1;
    for (uint64_t d : e.shape) {
      if (__builtin_mul_overflow(e.numel, d, &e.numel)) bad("shape is too large");
      if (d >= kLongDim) e.long_dims = true;
    }
    if (__builtin_mul_overflow(e.numel, uint64_t(e.dtype.itemsize), &e.nbytes)) bad("shape is too large");
    if (t.is_meta) {
      e.data_length = 0;
    } else {
      if (t.data_size != e.nbytes) {
        bad("data holds " + std::to_string(t.data_size) + " bytes, shape and dtype need " + std::to_string(e.nbytes));
      }
      if (e.nbytes > 0 && t.data == nullptr) bad("data is NULL");
      e.data_length = e.nbytes;
    }
    if (e.dtype.opaque) version = std::max(version, kOpaqueVersion);
    // Any meta tensor raises the version, even an empty one, as upstream does.
    if (t.is_meta) version = std::max(version, kMetaTensorVersion);
    if (e.long_dims) {
      version = std::max(version, kLongTensorVersion);
      need_tags = true;
    }
  }
  // Conflicts, within this call and with earlier calls; undone on failure.
  size_t inserted = 0;
  try {
    for (; inserted < count; ++inserted) paths_.insert(plan[inserted].entry.path);
  } catch (...) {
    for (size_t k = 0; k < inserted; ++k) paths_.erase(plan[k].entry.path);
    throw;
  }

  try {
    // 2. Lay out the index and the records.
    const bool retag = need_tags && !tagged_;
    uint64_t index_bytes = retag ? 0 : metadata_used_;
    std::vector<uint8_t> probe;
    if (retag) {
      for (const auto& e : entries_) {
        probe.clear();
        append_metadata_entry(probe, e, true);
        index_bytes += probe.size();
      }
    }
    for (const auto& p : plan) {
      probe.clear();
      append_metadata_entry(probe, p.entry, need_tags);
      index_bytes += probe.size();
    }
    if (index_bytes > header_.metadata_length) {
      if (header_.tensor_count != 0) fail(Errc::limit, "Metadata overflow");
      // Nothing written yet: grow the reserve to fit this call (readers honour any length).
      header_.metadata_length = (index_bytes + 4095) / 4096 * 4096;
      pos_ = kMetadataOffset + header_.metadata_length;
      sink_->set_rewritable_prefix(pos_);
    }
    uint64_t at = pos_;
    uint64_t data_total = 0;
    for (auto& p : plan) {
      auto& e = p.entry;
      HeaderSpec spec;
      spec.module_index = uint16_t(p.in->module_index);
      spec.type = e.type;
      spec.name = e.name;
      spec.dtype = e.dtype.text;
      spec.shape = e.shape.data();
      spec.ndim = e.shape.size();
      spec.long_dims = e.long_dims;
      spec.data_length = e.data_length;
      if (options_.key) {
        // Encrypted tensors carry SHA-256 only; tensors without data (meta,
        // empty) stay in the clear with an empty crypt_info and both hashes.
        p.encrypted = e.data_length > 0;
        if (p.encrypted) {
          const uint64_t boxes = (e.data_length + options_.crypt_chunk_size - 1) / options_.crypt_chunk_size;
          p.nonce = crypto::random_nonce();
          for (uint64_t b = 0; b < boxes; ++b) {
            if (!used_nonces_.insert(crypto::nonce_add(p.nonce, b)).second) fail(Errc::crypto, "Illegal nonce reuse");
          }
          const KdfParams* kdf = options_.key->kdf() ? &*options_.key->kdf() : nullptr;
          size_t mac_offset = 0;
          p.crypt_info = build_crypt_info(kdf, options_.crypt_chunk_size, p.nonce, size_t(boxes), &mac_offset);
          spec.crc32 = false;
          p.mac_offset = mac_offset;
        } else {
          p.crypt_info = empty_crypt_info();
        }
        spec.crypt_info = &p.crypt_info;
      }
      p.header = build_tensor_header(spec);
      if (p.encrypted) p.mac_offset += p.header.crypt_info_offset + 8;
      e.header_offset = at;
      e.data_offset = at + p.header.bytes.size();
      at = e.data_offset + e.data_length;
      data_total += e.data_length;
    }
    sink_->reserve(at + 8);

    // 3. Hash and write the records in parallel, largest first so the threads
    // finish together; in file order for a streaming sink, which uploads what
    // is complete and must not hold the rest.
    std::vector<size_t> order(count);
    for (size_t k = 0; k < count; ++k) order[k] = k;
    if (!sink_->streaming()) {
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return plan[a].entry.data_length > plan[b].entry.data_length;
      });
    }
    if (threads == 0) threads = options_.num_threads ? options_.num_threads : default_threads();
    parallel_for(count, threads, [&](size_t u) {
      Planned& p = plan[order[u]];
      const auto& e = p.entry;
      auto& hb = p.header.bytes;
      // Hashes cover the header with its crypt_info left out (hash slots are still zero).
      TensorHeader layout;
      layout.hashes = p.header.hashes;
      layout.crypt_info_offset = p.header.crypt_info_offset;
      layout.crypt_info_size = p.header.crypt_info_size;
      const std::vector<uint8_t> hashed = hashable_header(hb.data(), hb.size(), layout);
      uint32_t crc = crc32_update(0, hashed.data(), hashed.size());
      Sha256 sha;
      sha.update(hashed.data(), hashed.size());
      std::array<uint8_t, 32> digest;
      if (p.encrypted) {
        digest = write_encrypted(*sink_, p, options_.key->key(), options_.crypt_chunk_size, sha);
      } else {
        const auto* data = static_cast<const uint8_t*>(p.in->data);
        for (uint64_t off = 0; off < e.data_length; off += kWriteChunk) {
          const size_t n = size_t(std::min(kWriteChunk, e.data_length - off));
          crc = crc32_update(crc, data + off, n);
          sha.update(data + off, n);
          sink_->write_at(e.data_offset + off, data + off, n);
        }
        digest = sha.finish();
      }
      for (const auto& h : p.header.hashes) {
        if (h.type == HashType::crc32) store_u32(hb.data() + h.value_offset, crc);
        else std::memcpy(hb.data() + h.value_offset, digest.data(), 32);
      }
      sink_->write_at(e.header_offset, hb.data(), hb.size());
    });

    // 4. Index, end marker, header: only now does the file include this call.
    std::vector<uint8_t> index;
    if (retag) {
      for (const auto& e : entries_) append_metadata_entry(index, e, true);
    }
    for (const auto& p : plan) append_metadata_entry(index, p.entry, need_tags);
    const uint64_t index_at = kMetadataOffset + (retag ? 0 : metadata_used_);
    sink_->write_at(index_at, index.data(), index.size());
    const uint8_t end_marker[8] = {0};
    sink_->write_marker(at, end_marker, 8);

    for (auto& p : plan) entries_.push_back(std::move(p.entry));
    metadata_used_ = index_bytes;
    tagged_ = need_tags;
    header_.version = version;
    if (tagged_) header_.flags |= kFlagVersionedMetadata;
    header_.tensor_count += count;
    header_.tensor_size += data_total;
    pos_ = at;
    write_file_header();
    // Complete and valid: a file replacing another takes its place now.
    sink_->publish();
  } catch (...) {
    // The file header still describes the previous, complete state; the paths
    // of this call are free again. After an I/O failure the file may hold
    // partial records past that state, so further writes are refused.
    for (size_t k = 0; k < count; ++k) paths_.erase(plan[k].entry.path);
    if (header_.tensor_count == 0) {
      header_.metadata_length = kDefaultMetadataReserve;
      pos_ = kMetadataOffset + header_.metadata_length;
    }
    try {
      throw;
    } catch (const Error& err) {
      if (err.code() != Errc::limit) broken_ = true;
      throw;
    } catch (...) {
      broken_ = true;
      throw;
    }
  }
}

void Writer::close() {
  if (closed_) return;
  closed_ = true;
  if (!broken_) {
    const uint64_t end = pos_ + 8;
    const uint8_t end_marker[8] = {0};
    sink_->write_marker(pos_, end_marker, 8);
    write_file_header();
    // Trim any preallocation past the end marker.
    sink_->truncate(end);
    sink_->close();
  } else {
    sink_->abort();
  }
}

}  // namespace tz::core
