// The C boundary: every entry point catches everything, maps it to a pinned
// status code and leaves a thread-local message for tz_error_last().
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "reader.hpp"
#include "tensorizer.h"
#include "tz/crypto/key.hpp"
#include "tz/io/http.hpp"
#include "tz/format/error.hpp"
#include "writer.hpp"

namespace {

thread_local std::string t_last_error;

int set_error(int code, const std::string& message) {
  t_last_error = message;
  return code;
}

// Runs `fn`, translating exceptions into status codes.
template <class Fn>
int guarded(Fn&& fn) noexcept {
  try {
    t_last_error.clear();
    fn();
    return TZ_OK;
  } catch (const tz::Error& e) {
    return set_error(static_cast<int>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return set_error(TZ_E_NOMEM, "Out of memory");
  } catch (const std::exception& e) {
    return set_error(TZ_E_INTERNAL, std::string("Internal error: ") + e.what());
  } catch (...) {
    return set_error(TZ_E_INTERNAL, "Internal error: unknown exception");
  }
}

void require(bool ok, const char* message) {
  if (!ok) tz::fail(tz::Errc::invalid_arg, message);
}

// The codes cross the boundary as plain ints (guarded casts them), so each
// tz::Errc must keep the value <tensorizer.h> pins for it.
static_assert(int(tz::Errc::invalid_arg) == TZ_E_INVALID_ARG, "tz::Errc::invalid_arg drifted");
static_assert(int(tz::Errc::io) == TZ_E_IO, "tz::Errc::io drifted");
static_assert(int(tz::Errc::not_found) == TZ_E_NOT_FOUND, "tz::Errc::not_found drifted");
static_assert(int(tz::Errc::format) == TZ_E_FORMAT, "tz::Errc::format drifted");
static_assert(int(tz::Errc::version) == TZ_E_VERSION, "tz::Errc::version drifted");
static_assert(int(tz::Errc::truncated) == TZ_E_TRUNCATED, "tz::Errc::truncated drifted");
static_assert(int(tz::Errc::hash) == TZ_E_HASH, "tz::Errc::hash drifted");
static_assert(int(tz::Errc::conflict) == TZ_E_CONFLICT, "tz::Errc::conflict drifted");
static_assert(int(tz::Errc::limit) == TZ_E_LIMIT, "tz::Errc::limit drifted");
static_assert(int(tz::Errc::crypto) == TZ_E_CRYPTO, "tz::Errc::crypto drifted");
static_assert(int(tz::Errc::unsupported) == TZ_E_UNSUPPORTED, "tz::Errc::unsupported drifted");
static_assert(int(tz::Errc::state) == TZ_E_STATE, "tz::Errc::state drifted");
static_assert(int(tz::Errc::nomem) == TZ_E_NOMEM, "tz::Errc::nomem drifted");
static_assert(int(tz::Errc::internal) == TZ_E_INTERNAL, "tz::Errc::internal drifted");

// Rejects a versioned struct whose `version` this build does not know: 0 (the
// caller forgot it) or newer than `known` (the caller was built against a
// newer header, so its struct may be larger than ours). Every struct has only
// version 1 today; a later version adds fields at the end, and the code that
// fills or reads them checks `version` first.
void check_version(uint32_t version, uint32_t known, const char* what, const char* macro) {
  if (version == 0 || version > known) {
    tz::fail(tz::Errc::invalid_arg, std::string(what) + ".version is " + std::to_string(version) +
                                        ": this library knows versions 1 to " + std::to_string(known) +
                                        " (initialise it with " + macro + ")");
  }
}

// The first element's version fixes the stride of a caller's array, so every
// element must carry that same version.
template <class T>
void check_array_version(const T* items, size_t count, uint32_t known, const char* what, const char* macro) {
  if (count == 0) return;
  check_version(items[0].version, known, what, macro);
  for (size_t k = 1; k < count; ++k) {
    if (items[k].version != items[0].version) {
      tz::fail(tz::Errc::invalid_arg, std::string(what) + "[" + std::to_string(k) + "].version is " +
                                          std::to_string(items[k].version) + " but element 0's is " +
                                          std::to_string(items[0].version) +
                                          ": all elements of an array must carry the same version");
    }
  }
}

unsigned parse_threads(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long n = std::strtoul(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || n < 1 || n > 1024) {
    tz::fail(tz::Errc::invalid_arg, "num_threads must be an integer from 1 to 1024");
  }
  return unsigned(n);
}

uint64_t parse_u64(const std::string& key, const std::string& v, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0 || n < lo || n > hi) {
    tz::fail(tz::Errc::invalid_arg, "option '" + key + "' must be an integer from " + std::to_string(lo) + " to " +
                                        std::to_string(hi));
  }
  return n;
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  tz::fail(tz::Errc::invalid_arg, "option '" + key + "' must be 0 or 1");
}

// Applies a remote-source option; false if `k` is not one.
bool apply_http_option(const std::shared_ptr<tz::io::HttpOptions>& http, const std::string& k, const std::string& v) {
  if (k.rfind("s3_", 0) == 0) return false;
  if (k == "tls_verify") http->verify_tls = parse_bool(k, v);
  else if (k == "ca_file") http->ca_file = v;
  else if (k == "ca_dir") http->ca_dir = v;
  else if (k == "http_headers") {
    // One "Name: value" per line.
    size_t start = 0;
    while (start <= v.size()) {
      const size_t end = std::min(v.find('\n', start), v.size());
      std::string line = v.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) http->headers.push_back(line);
      start = end + 1;
    }
  } else if (k == "http_max_attempts") http->max_attempts = unsigned(parse_u64(k, v, 1, 1000));
  else if (k == "http_backoff_ms") http->backoff_ms = unsigned(parse_u64(k, v, 1, 3600000));
  else if (k == "http_retry_timeout_ms") http->retry_timeout_ms = unsigned(parse_u64(k, v, 1, 86400000));
  else if (k == "http_connect_timeout_ms") http->connect_timeout_ms = unsigned(parse_u64(k, v, 1, 3600000));
  else if (k == "http_stall_timeout_ms") http->stall_timeout_ms = unsigned(parse_u64(k, v, 1, 3600000));
  else return false;
  return true;
}

// Applies an S3 option; false if `k` is not one.
bool apply_s3_option(const std::shared_ptr<tz::io::S3Options>& s3, const std::string& k, const std::string& v) {
  if (k == "s3_access_key_id") s3->access_key_id = v;
  else if (k == "s3_secret_access_key") s3->secret_access_key = v;
  else if (k == "s3_session_token") s3->session_token = v;
  else if (k == "s3_endpoint") s3->endpoint = v;
  else if (k == "s3_default_endpoint") s3->default_endpoint = v;
  else if (k == "s3_region") s3->region = v;
  else if (k == "s3_config_path") {
    s3->config_path = v;
    s3->read_s3cmd_config = !v.empty();  // "": the caller has dealt with it
  }
  else if (k == "s3_force_http") s3->force_http = parse_bool(k, v);
  else if (k == "s3_addressing") s3->addressing = v;
  else if (k == "s3_part_size") s3->part_size = parse_u64(k, v, uint64_t(5) << 20, uint64_t(5) << 30);
  else return false;
  return true;
}

// Applies a reader option; false if `k` is not one.
bool apply_reader_option(tz::core::ReaderOptions& o, const std::string& k, const std::string& v) {
  if (k == "num_threads") o.num_threads = parse_threads(v);
  else if (k == "verify_hash") o.verify_hash = parse_bool(k, v);
  else if (k == "direct_io") o.direct_io = parse_bool(k, v);
  else if (k == "huge_pages") o.huge_pages = parse_bool(k, v);
  else if (k == "metadata_only") o.metadata_only = parse_bool(k, v);
  else if (k == "kdf_max_opslimit") o.kdf_limits.max_opslimit = parse_u64(k, v, 1, TZ_OPSLIMIT_MAX);
  else if (k == "kdf_max_memlimit") o.kdf_limits.max_memlimit = parse_u64(k, v, TZ_MEMLIMIT_MIN, TZ_MEMLIMIT_MAX);
  else if (k == "kdf_max_derivations") o.kdf_limits.max_derivations = parse_u64(k, v, 1, UINT32_MAX);
  else return false;
  return true;
}

// Applies a writer option; false if `k` is not one.
bool apply_writer_option(tz::core::WriterOptions& o, const std::string& k, const std::string& v) {
  if (k == "num_threads") o.num_threads = parse_threads(v);
  else if (k == "crypt_chunk_size") o.crypt_chunk_size = parse_u64(k, v, 1024, uint64_t(1) << 40);
  else return false;
  return true;
}

}  // namespace

struct tz_options {
  std::map<std::string, std::string> values;
  std::shared_ptr<const tz::crypto::KeyMaterial> key;
};

struct tz_key {
  std::shared_ptr<const tz::crypto::KeyMaterial> material;
};

struct tz_reader {
  std::unique_ptr<tz::core::Reader> impl;
  // Borrowed views handed out through tz_tensor_info, built once.
  std::vector<std::vector<tz_path_component>> paths;
};

struct tz_writer {
  std::unique_ptr<tz::core::Writer> impl;
};

struct tz_source {
  std::unique_ptr<tz::io::Source> impl;
};

struct tz_sink {
  std::unique_ptr<tz::io::Sink> impl;
  uint64_t end = 0;  // end of the data written
  bool closed = false;
};

// Remote-storage options (HTTP, TLS, S3) from `opts`; other keys go to
// `other`, which returns false for keys that do not apply to `what`.
static tz::io::SourceOptions remote_options(const tz_options* opts, const char* what,
                                            const std::function<bool(const std::string&, const std::string&)>& other) {
  tz::io::SourceOptions so;
  auto http = std::make_shared<tz::io::HttpOptions>();
  auto s3 = std::make_shared<tz::io::S3Options>();
  so.http = http;
  so.s3 = s3;
  if (opts) {
    for (const auto& [k, v] : opts->values) {
      if (apply_http_option(http, k, v) || apply_s3_option(s3, k, v) || other(k, v)) continue;
      tz::fail(tz::Errc::invalid_arg, "Option '" + k + "' does not apply to " + what);
    }
  }
  return so;
}

extern "C" {

#define TZ_STR2(x) #x
#define TZ_STR(x) TZ_STR2(x)
const char* tz_version(void) {
  return TZ_STR(TZ_VERSION_MAJOR) "." TZ_STR(TZ_VERSION_MINOR) "." TZ_STR(TZ_VERSION_PATCH);
}

const char* tz_error_last(void) { return t_last_error.c_str(); }

const char* tz_status_name(int status) {
  switch (status) {
    case TZ_OK: return "TZ_OK";
    case TZ_E_INVALID_ARG: return "TZ_E_INVALID_ARG";
    case TZ_E_IO: return "TZ_E_IO";
    case TZ_E_NOT_FOUND: return "TZ_E_NOT_FOUND";
    case TZ_E_FORMAT: return "TZ_E_FORMAT";
    case TZ_E_VERSION: return "TZ_E_VERSION";
    case TZ_E_TRUNCATED: return "TZ_E_TRUNCATED";
    case TZ_E_HASH: return "TZ_E_HASH";
    case TZ_E_CONFLICT: return "TZ_E_CONFLICT";
    case TZ_E_LIMIT: return "TZ_E_LIMIT";
    case TZ_E_CRYPTO: return "TZ_E_CRYPTO";
    case TZ_E_UNSUPPORTED: return "TZ_E_UNSUPPORTED";
    case TZ_E_STATE: return "TZ_E_STATE";
    case TZ_E_NOMEM: return "TZ_E_NOMEM";
    case TZ_E_INTERNAL: return "TZ_E_INTERNAL";
    default: return "TZ_E_UNKNOWN";
  }
}

int tz_options_new(tz_options** out) {
  return guarded([&] {
    require(out != nullptr, "out is NULL");
    *out = new tz_options();
  });
}

int tz_options_set(tz_options* opts, const char* key, const char* value) {
  return guarded([&] {
    require(opts && key && value, "opts, key and value must not be NULL");
    const std::string k(key), v(value);
    // Checked now by the code that applies it at open, on scratch settings, so
    // a key and its checks are written once.
    tz::core::ReaderOptions reader;
    tz::core::WriterOptions writer;
    const bool known = apply_http_option(std::make_shared<tz::io::HttpOptions>(), k, v) ||
                       apply_s3_option(std::make_shared<tz::io::S3Options>(), k, v) ||
                       apply_reader_option(reader, k, v) || apply_writer_option(writer, k, v);
    if (!known) tz::fail(tz::Errc::invalid_arg, "Unknown option '" + k + "'");
    opts->values[k] = v;
  });
}

void tz_options_free(tz_options* opts) { delete opts; }

int tz_options_set_key(tz_options* opts, const tz_key* key) {
  return guarded([&] {
    require(opts != nullptr, "opts is NULL");
    opts->key = key ? key->material : nullptr;
  });
}

static int new_key(tz_key** out, const std::function<std::shared_ptr<const tz::crypto::KeyMaterial>()>& make) {
  return guarded([&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    auto k = std::make_unique<tz_key>();
    k->material = make();
    *out = k.release();
  });
}

int tz_key_new_random(tz_key** out) {
  return new_key(out, [] { return tz::crypto::KeyMaterial::random(); });
}

int tz_key_new_from_bytes(tz_key** out, const void* key, size_t key_len) {
  return new_key(out, [&] { return tz::crypto::KeyMaterial::from_key(key, key_len); });
}

int tz_key_new_derived(tz_key** out, const void* password, size_t password_len, uint64_t opslimit, uint64_t memlimit,
                       const uint8_t* salt, size_t salt_len) {
  return new_key(out, [&] {
    return tz::crypto::KeyMaterial::derive(password, password_len, opslimit, memlimit, salt, salt_len);
  });
}

int tz_key_new_password(tz_key** out, const void* password, size_t password_len) {
  return new_key(out, [&] { return tz::crypto::KeyMaterial::password(password, password_len); });
}

int tz_key_get_bytes(uint8_t* out, size_t cap, const tz_key* key) {
  return guarded([&] {
    require(out && key, "out and key must not be NULL");
    require(cap >= TZ_KEY_BYTES, "the output buffer must hold TZ_KEY_BYTES bytes");
    std::memcpy(out, key->material->key().data(), TZ_KEY_BYTES);
  });
}

int tz_key_get_salt(uint8_t* out, size_t cap, const tz_key* key) {
  return guarded([&] {
    require(out && key, "out and key must not be NULL");
    require(cap >= TZ_SALT_BYTES, "the output buffer must hold TZ_SALT_BYTES bytes");
    const auto& kdf = key->material->kdf();
    if (!kdf) tz::fail(tz::Errc::not_found, "This key was not derived from a password, so it has no salt");
    std::memcpy(out, kdf->salt.data(), TZ_SALT_BYTES);
  });
}

void tz_key_free(tz_key* key) { delete key; }

int tz_reader_open(tz_reader** out, const char* uri, const tz_options* opts) {
  return guarded([&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    require(uri != nullptr, "uri is NULL");
    tz::core::ReaderOptions o;
    const tz::io::SourceOptions so = remote_options(
        opts, "readers", [&](const std::string& k, const std::string& v) { return apply_reader_option(o, k, v); });
    o.http = so.http;
    o.s3 = so.s3;
    if (opts) o.key = opts->key;
    auto r = std::make_unique<tz_reader>();
    r->impl = tz::core::Reader::open(uri, o);
    const auto& entries = r->impl->entries();
    r->paths.resize(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      for (const auto& c : entries[i].path) {
        r->paths[i].push_back({c.is_index ? 1 : 0, c.index, c.is_index ? nullptr : c.str.data(),
                               c.is_index ? 0 : c.str.size()});
      }
    }
    *out = r.release();
  });
}

void tz_reader_free(tz_reader* reader) { delete reader; }

int tz_reader_file_info(tz_file_info* out, const tz_reader* reader) {
  return guarded([&] {
    require(out && reader, "out and reader must not be NULL");
    check_version(out->version, TZ_FILE_INFO_VERSION, "tz_file_info", "TZ_FILE_INFO_INIT");
    const auto& h = reader->impl->file_header();
    out->data_version = h.version;
    out->flags = uint32_t(h.flags);
    out->tensor_count = h.tensor_count;
    out->tensor_data_size = h.tensor_size;
    out->metadata_length = h.metadata_length;
    out->file_size = reader->impl->file_size();
    out->encrypted = h.has_crypt_info() ? 1 : 0;
  });
}

int tz_reader_tensor_count(uint64_t* out, const tz_reader* reader) {
  return guarded([&] {
    require(out && reader, "out and reader must not be NULL");
    *out = reader->impl->entries().size();
  });
}

int tz_reader_tensor_info(tz_tensor_info* out, tz_reader* reader, uint64_t index) {
  return guarded([&] {
    require(out && reader, "out and reader must not be NULL");
    check_version(out->version, TZ_TENSOR_INFO_VERSION, "tz_tensor_info", "TZ_TENSOR_INFO_INIT");
    const auto& entries = reader->impl->entries();
    if (index >= entries.size()) tz::fail(tz::Errc::not_found, "Tensor index " + std::to_string(index) + " is out of range");
    const auto& e = entries[size_t(index)];
    out->name = reinterpret_cast<const uint8_t*>(e.name.data());
    out->name_len = e.name.size();
    out->dtype = e.dtype.text.data();
    out->dtype_len = e.dtype.text.size();
    out->ndim = uint32_t(e.shape.size());
    out->shape = e.shape.data();
    out->tensor_type = int32_t(e.type);
    out->module_index = reader->impl->module_index(size_t(index));
    out->header_offset = e.header_offset;
    out->data_offset = e.data_offset;
    out->data_length = e.data_length;
    out->nbytes = e.nbytes;
    out->itemsize = e.dtype.itemsize;
    out->is_meta = e.is_meta() ? 1 : 0;
    out->is_opaque = e.dtype.opaque ? 1 : 0;
    out->torch_dtype = e.dtype.torch_name.empty() ? nullptr : e.dtype.torch_name.c_str();
    out->path_len = reader->paths[size_t(index)].size();
    out->path = reader->paths[size_t(index)].data();
  });
}

int tz_reader_load_headers(tz_reader* reader, const uint64_t* indices, size_t count) {
  return guarded([&] {
    require(reader != nullptr, "reader is NULL");
    reader->impl->load_headers(indices, count);
  });
}

static bool want_verify(const tz_reader* reader, uint32_t flags) {
  if (flags & TZ_READ_VERIFY_HASH) return true;
  if (flags & TZ_READ_NO_VERIFY_HASH) return false;
  return reader->impl->options().verify_hash;
}

int tz_reader_read(tz_reader* reader, uint64_t index, void* dst, uint64_t dst_size, uint32_t flags) {
  return guarded([&] {
    require(reader != nullptr, "reader is NULL");
    const tz::core::ReadRequest req{index, dst, dst_size};
    reader->impl->read_batch(&req, 1, want_verify(reader, flags), 1, nullptr);
  });
}

int tz_reader_read_batch(tz_reader* reader, const tz_read_request* requests, size_t count, uint32_t flags,
                         uint32_t num_threads, size_t* failed) {
  return guarded([&] {
    require(reader != nullptr, "reader is NULL");
    require(requests != nullptr || count == 0, "requests is NULL");
    check_array_version(requests, count, TZ_READ_REQUEST_VERSION, "tz_read_request", "TZ_READ_REQUEST_INIT");
    std::vector<tz::core::ReadRequest> reqs(count);
    for (size_t k = 0; k < count; ++k) reqs[k] = {requests[k].index, requests[k].dst, requests[k].dst_size};
    reader->impl->read_batch(reqs.data(), count, want_verify(reader, flags), num_threads, failed);
  });
}

int tz_reader_verify_bytes(tz_reader* reader, uint64_t index, const void* data, uint64_t size) {
  return guarded([&] {
    require(reader != nullptr, "reader is NULL");
    reader->impl->verify_bytes(size_t(index), data, size);
  });
}

int tz_reader_tensor_hashes(tz_tensor_hash* out, size_t cap, size_t* count, tz_reader* reader, uint64_t index) {
  return guarded([&] {
    require(reader != nullptr, "reader is NULL");
    require(count != nullptr, "count is NULL");
    require(out != nullptr || cap == 0, "out is NULL");
    check_array_version(out, cap, TZ_TENSOR_HASH_VERSION, "tz_tensor_hash", "TZ_TENSOR_HASH_INIT");
    const auto hashes = reader->impl->stored_hashes(size_t(index));
    for (size_t k = 0; k < hashes.size() && k < cap; ++k) {
      const auto& h = hashes[k];
      // The parser admits only CRC32 and SHA-256 values, which fit.
      if (h.value.size() > TZ_TENSOR_HASH_MAX_BYTES) tz::fail(tz::Errc::internal, "stored hash longer than expected");
      out[k].type = uint32_t(h.type);
      out[k].length = uint32_t(h.value.size());
      std::memcpy(out[k].value, h.value.data(), h.value.size());
    }
    *count = hashes.size();
  });
}

int tz_source_open(tz_source** out, const char* uri, const tz_options* opts) {
  return guarded([&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    require(uri != nullptr, "uri is NULL");
    bool direct_io = false;
    tz::io::SourceOptions so = remote_options(opts, "sources", [&](const std::string& k, const std::string& v) {
      if (k != "direct_io") return false;
      direct_io = parse_bool(k, v);
      return true;
    });
    so.direct_io = direct_io;
    auto s = std::make_unique<tz_source>();
    s->impl = tz::io::open_source(uri, so);
    *out = s.release();
  });
}

int tz_source_size(uint64_t* out, const tz_source* source) {
  return guarded([&] {
    require(out && source, "out and source must not be NULL");
    *out = source->impl->size();
  });
}

int tz_source_response_headers(const char** out, size_t* out_len, const tz_source* source) {
  return guarded([&] {
    require(out && out_len && source, "out, out_len and source must not be NULL");
    const std::string& headers = source->impl->response_headers();
    *out = headers.c_str();
    *out_len = headers.size();
  });
}

int tz_source_read(tz_source* source, uint64_t offset, void* dst, size_t len) {
  return guarded([&] {
    require(source != nullptr, "source is NULL");
    require(dst != nullptr || len == 0, "dst is NULL");
    const uint64_t size = source->impl->size();
    if (offset > size || len > size - offset) {
      tz::fail(tz::Errc::truncated, "Read of " + std::to_string(len) + " bytes at " + std::to_string(offset) +
                                        " runs past the end (" + std::to_string(size) + " bytes)");
    }
    source->impl->read_at(offset, dst, len);
  });
}

void tz_source_free(tz_source* source) { delete source; }

int tz_sink_open(tz_sink** out, const char* uri, const tz_options* opts) {
  return guarded([&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    require(uri != nullptr, "uri is NULL");
    const tz::io::SourceOptions so =
        remote_options(opts, "sinks", [](const std::string&, const std::string&) { return false; });
    auto sink = std::make_unique<tz_sink>();
    sink->impl = tz::io::open_sink(uri, so);
    *out = sink.release();
  });
}

int tz_sink_write(tz_sink* sink, uint64_t offset, const void* src, size_t len) {
  return guarded([&] {
    require(sink != nullptr, "sink is NULL");
    require(src != nullptr || len == 0, "src is NULL");
    if (sink->closed) tz::fail(tz::Errc::state, "The sink is closed");
    sink->impl->write_at(offset, src, len);
    sink->end = std::max(sink->end, offset + len);
  });
}

int tz_sink_close(tz_sink* sink) {
  return guarded([&] {
    require(sink != nullptr, "sink is NULL");
    if (sink->closed) return;
    sink->closed = true;
    sink->impl->truncate(sink->end);
    sink->impl->close();
  });
}

void tz_sink_free(tz_sink* sink) {
  if (!sink) return;
  if (!sink->closed) {
    try {
      sink->impl->abort();
    } catch (...) {
      // Documented: errors while aborting are dropped.
    }
  }
  delete sink;
}

int tz_writer_open(tz_writer** out, const char* uri, const tz_options* opts) {
  return guarded([&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    require(uri != nullptr, "uri is NULL");
    tz::core::WriterOptions o;
    bool durable = true;
    o.sink = remote_options(opts, "writers", [&](const std::string& k, const std::string& v) {
      if (k == "durable") {
        durable = parse_bool(k, v);
        return true;
      }
      return apply_writer_option(o, k, v);
    });
    o.sink.durable = durable;
    if (opts) o.key = opts->key;
    auto w = std::make_unique<tz_writer>();
    w->impl = tz::core::Writer::open(uri, o);
    *out = w.release();
  });
}

int tz_writer_write(tz_writer* writer, const tz_tensor_desc* tensors, size_t count, uint32_t num_threads) {
  return guarded([&] {
    require(writer != nullptr, "writer is NULL");
    require(tensors != nullptr || count == 0, "tensors is NULL");
    check_array_version(tensors, count, TZ_TENSOR_DESC_VERSION, "tz_tensor_desc", "TZ_TENSOR_DESC_INIT");
    std::vector<tz::core::TensorInput> in(count);
    for (size_t k = 0; k < count; ++k) {
      const auto& d = tensors[k];
      require(d.name != nullptr || d.name_len == 0, "tensor name is NULL");
      require(d.dtype != nullptr, "tensor dtype is NULL");
      in[k].name = std::string_view(reinterpret_cast<const char*>(d.name), d.name_len);
      in[k].dtype = std::string_view(d.dtype, d.dtype_len);
      in[k].shape = d.shape;
      in[k].ndim = d.ndim;
      in[k].module_index = d.module_index;
      in[k].tensor_type = d.tensor_type;
      in[k].is_meta = d.is_meta != 0;
      in[k].data = d.data;
      in[k].data_size = d.data_size;
    }
    writer->impl->write(in.data(), count, num_threads);
  });
}

int tz_writer_state_get(tz_writer_state* out, const tz_writer* writer) {
  return guarded([&] {
    require(out && writer, "out and writer must not be NULL");
    check_version(out->version, TZ_WRITER_STATE_VERSION, "tz_writer_state", "TZ_WRITER_STATE_INIT");
    const auto& h = writer->impl->file_header();
    out->data_version = h.version;
    out->tensor_count = h.tensor_count;
    out->tensor_data_size = h.tensor_size;
    out->file_size = writer->impl->end_offset();
  });
}

int tz_writer_close(tz_writer* writer) {
  return guarded([&] {
    require(writer != nullptr, "writer is NULL");
    writer->impl->close();
  });
}

void tz_writer_free(tz_writer* writer) {
  if (!writer) return;
  try {
    writer->impl->close();
  } catch (...) {
    // Documented: errors on this implicit close are dropped.
  }
  delete writer;
}

int tz_path_encode(uint8_t* out, size_t cap, size_t* out_len, const tz_path_component* path, size_t path_len) {
  return guarded([&] {
    require(out_len != nullptr, "out_len is NULL");
    require(path != nullptr && path_len > 0, "path must have at least one component");
    tz::format::TensorPath p;
    for (size_t i = 0; i < path_len; ++i) {
      if (path[i].is_index) {
        p.push_back(tz::format::PathComponent::idx(path[i].index));
      } else {
        require(path[i].str != nullptr || path[i].str_len == 0, "path component string is NULL");
        p.push_back(tz::format::PathComponent::key(std::string(path[i].str, path[i].str_len)));
      }
    }
    const std::string encoded = tz::format::encode_path(p);
    *out_len = encoded.size();
    if (out && cap > 0) std::memcpy(out, encoded.data(), std::min(cap, encoded.size()));
    if (cap > 0 && cap < encoded.size()) tz::fail(tz::Errc::invalid_arg, "output buffer too small");
  });
}

}  // extern "C"
